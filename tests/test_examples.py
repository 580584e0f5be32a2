"""Each example in examples/ runs end to end in quick mode."""

import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from keras_group_lasso.datasets import DatasetNotFoundError, load_dataset

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Each example is a subprocess that imports the whole stack: in a run of scripts/test.sh each runs once, on one
# of its backends (they take turns: conftest.py); everything they call is tested on every backend by the other
# modules. pytest called alone runs them all on its backend.
pytestmark = pytest.mark.turns


def run_example(name, *args, cwd):
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--quick", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_quickstart_digits(tmp_path):
    out = run_example("quickstart_digits.py", cwd=tmp_path)
    assert "test accuracy after thresholding" in out
    assert "SparsityReport" in out
    assert "pruned model:" in out


def test_fashion_mnist_monitor(tmp_path):
    try:
        load_dataset("fashion-mnist")
    except DatasetNotFoundError:
        pytest.skip("Fashion-MNIST files are not installed")
    log_dir = tmp_path / "tb"
    out = run_example("fashion_mnist_monitor.py", "--log-dir", str(log_dir), cwd=tmp_path)
    assert "epoch 2: sparsity" in out
    assert any(p.name.startswith("events.out.tfevents") for p in log_dir.rglob("*"))


def test_prune_and_export(tmp_path):
    target = tmp_path / "export"
    out = run_example("prune_and_export.py", "--out", str(target), cwd=tmp_path)
    assert "loaded model: test accuracy" in out
    assert (target / "manifest.json").is_file() and (target / "model.keras").is_file()
    if keras.backend.backend() == "tensorflow":  # SavedModel export needs the TensorFlow backend
        assert (target / "saved_model" / "saved_model.pb").is_file()
    gap = float(out.rsplit("original ", 1)[1].split()[0])
    assert gap <= 1e-5


def test_cnn_digits(tmp_path):
    out = run_example("cnn_digits.py", cwd=tmp_path)
    assert "SparsityReport" in out and "FLOPs:" in out
    gap = float(out.split("largest output difference vs the thresholded model: ")[1].split()[0])
    assert gap <= 1e-5


def test_residual_digits(tmp_path):
    out = run_example("residual_digits.py", cwd=tmp_path)
    assert "SparsityReport" in out and "pixels read:" in out
    gap = float(out.split("largest output difference vs the thresholded model: ")[1].split()[0])
    assert gap <= 1e-5


def test_sklearn_feature_selection(tmp_path):
    out = run_example("sklearn_feature_selection.py", cwd=tmp_path)
    assert "pipeline test accuracy" in out and "<= 30 pixels" in out

"""The command line, through keras_group_lasso.cli.main."""

import json
import os

import keras
import numpy as np
import pytest

from keras_group_lasso.cli import main

# ----------------------------------------------------------------------------- prune


def _save_sparse_model(path):
    """10 -> 6 -> 3 with input features 0, 3 and 7 and hidden unit 2 dead."""
    rng = np.random.default_rng(0)
    model = keras.Sequential(
        [
            keras.Input((10,)),
            keras.layers.Dense(6, activation="relu", name="hidden"),
            keras.layers.Dense(3, name="output"),
        ]
    )
    w1 = rng.normal(size=(10, 6)).astype("float32")
    w2 = rng.normal(size=(6, 3)).astype("float32")
    w1[[0, 3, 7]] = 0.0
    w2[2] = 1e-4
    model.get_layer("hidden").set_weights([w1, np.ones(6, "float32")])
    model.get_layer("output").set_weights([w2, np.zeros(3, "float32")])
    model.save(path)
    return model


@pytest.mark.quick
def test_prune_writes_the_export_and_prints_the_table(tmp_path, capsys):
    _save_sparse_model(tmp_path / "m.keras")
    out = tmp_path / "out"
    code = main(["prune", str(tmp_path / "m.keras"), str(out), "--formats", "keras", "--threshold", "1e-3"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "SparsityReport" in captured.out
    assert "kept    7 of 10 input features" in captured.out
    assert "layers  10-6-3 -> 7-5-3" in captured.out
    assert str(out / "model.keras") in captured.out
    assert sorted(os.listdir(out)) == ["manifest.json", "model.keras"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kept_features"] == [1, 2, 4, 5, 6, 8, 9]
    assert manifest["inputs"] == "original"
    assert manifest["params_after"] < manifest["params_before"]


def test_prune_selected_inputs(tmp_path, capsys):
    _save_sparse_model(tmp_path / "m.keras")
    code = main(
        ["prune", str(tmp_path / "m.keras"), str(tmp_path / "out"), "--inputs", "selected", "--formats", "keras"]
    )
    assert code == 0, capsys.readouterr().err
    small = keras.saving.load_model(tmp_path / "out" / "model.keras")
    assert tuple(small.inputs[0].shape) == (None, 7)


def _assert_failed(code, capsys, *fragments):
    captured = capsys.readouterr()
    assert code != 0
    assert captured.err.startswith("keras-group-lasso prune: error: ")
    for fragment in fragments:
        assert fragment in captured.err
    return captured


def test_prune_missing_file(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["prune", str(tmp_path / "nope.keras"), str(out)])
    _assert_failed(code, capsys, "no such model file", "nope.keras")
    assert not out.exists()


def test_prune_corrupt_file(tmp_path, capsys):
    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"this is not a zip archive")
    out = tmp_path / "out"
    code = main(["prune", str(bad), str(out)])
    _assert_failed(code, capsys, "cannot load", "bad.keras")
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["bad.keras"]


def test_prune_unsupported_model(tmp_path, capsys):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="d1")(inputs)
    outputs = keras.layers.Dense(2, name="d2")(keras.layers.Flatten()(keras.layers.Reshape((2, 2), name="residual")(hidden)))
    keras.Model(inputs, outputs).save(tmp_path / "res.keras")
    out = tmp_path / "out"
    code = main(["prune", str(tmp_path / "res.keras"), str(out), "--formats", "keras"])
    _assert_failed(code, capsys, "residual")
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["res.keras"]


def test_prune_writes_next_to_the_users_files_and_refuses_an_earlier_export(tmp_path, capsys):
    _save_sparse_model(tmp_path / "m.keras")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code = main(["prune", str(tmp_path / "m.keras"), str(out), "--formats", "keras"])
    assert code == 0, capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["manifest.json", "model.keras", "notes.txt"]
    before = (out / "model.keras").read_bytes()
    code = main(["prune", str(tmp_path / "m.keras"), str(out), "--formats", "keras"])
    _assert_failed(code, capsys, "without an earlier export", "(it holds 'model.keras', 'manifest.json';", "overwrite")
    assert (out / "model.keras").read_bytes() == before
    code = main(["prune", str(tmp_path / "m.keras"), str(out), "--formats", "keras", "--overwrite"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"replaced{out / 'model.keras'}\n        {out / 'manifest.json'}\n" in captured.out
    assert sorted(os.listdir(out)) == ["manifest.json", "model.keras", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_prune_overwrite_keeps_the_input_model_and_the_users_files_in_out_dir(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _save_sparse_model(out / "trained.keras")
    trained = (out / "trained.keras").read_bytes()
    (out / "data").mkdir()
    (out / "data" / "x.csv").write_text("1,2\n")
    assert main(["prune", str(out / "trained.keras"), str(out), "--formats", "keras"]) == 0
    code = main(["prune", str(out / "trained.keras"), str(out), "--formats", "keras", "--overwrite",
                 "--threshold", "0"])
    assert code == 0, capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["data", "manifest.json", "model.keras", "trained.keras"]
    assert (out / "trained.keras").read_bytes() == trained
    assert (out / "data" / "x.csv").read_text() == "1,2\n"
    assert json.loads((out / "manifest.json").read_text())["threshold"] == 0.0


def test_prune_refuses_to_overwrite_its_own_input(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _save_sparse_model(out / "model.keras")
    trained = (out / "model.keras").read_bytes()
    code = main(["prune", str(out / "model.keras"), str(out), "--formats", "saved_model", "--overwrite"])
    _assert_failed(code, capsys, f"MODEL {str(out / 'model.keras')!r} is", "which --overwrite would replace")
    assert os.listdir(out) == ["model.keras"]
    assert (out / "model.keras").read_bytes() == trained


@pytest.mark.parametrize("content", ["empty", "truncated", "random"])
def test_prune_a_file_that_is_not_a_keras_archive_says_so(tmp_path, capsys, content):
    model = tmp_path / "m.keras"
    _save_sparse_model(model)
    data = model.read_bytes()
    model.write_bytes({"empty": b"", "truncated": data[: len(data) // 2],
                       "random": np.random.default_rng(0).bytes(len(data))}[content])
    out = tmp_path / "out"
    code = main(["prune", str(model), str(out), "--formats", "keras"])
    captured = _assert_failed(
        code, capsys, f"cannot load {str(model)!r}: it is not a readable .keras archive", "BadZipFile: "
    )
    assert "not found" not in captured.err
    assert not out.exists()


def test_prune_a_zip_without_a_keras_config_says_so(tmp_path, capsys):
    import zipfile

    with zipfile.ZipFile(tmp_path / "m.keras", "w") as archive:
        archive.writestr("notes.txt", "not a model")
    code = main(["prune", str(tmp_path / "m.keras"), str(tmp_path / "out")])
    _assert_failed(code, capsys, "it is not a readable .keras archive", "a zip archive without config.json")


@pytest.mark.quick
def test_prune_bad_threshold(tmp_path, capsys):
    _save_sparse_model(tmp_path / "m.keras")
    for value, shown in (("-1", "-1.0"), ("nan", "nan"), ("inf", "inf")):  # a usage error, before the model loads
        code = main(["prune", str(tmp_path / "absent.keras"), str(tmp_path / "out"), "--threshold", value])
        assert code == 2
        assert capsys.readouterr().err == (
            f"keras-group-lasso prune: error: argument `--threshold` must be a finite number >= 0; received {shown}.\n")
    assert not (tmp_path / "out").exists()


def test_prune_representative_data_only_with_the_formats_checked_on_it(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((4, 10), "float32"))
    code = main(["prune", str(tmp_path / "absent.keras"), str(tmp_path / "out"), "--formats", "keras", "tflite",
                 "--representative", str(tmp_path / "x.npy")])
    assert code == 2
    assert capsys.readouterr().err == (
        "keras-group-lasso prune: error: argument `--representative` must be given only with --formats onnx or "
        f"tflite-int8 (the formats checked on it); --formats is keras tflite; received {str(tmp_path / 'x.npy')!r}.\n")
    assert not (tmp_path / "out").exists()


def test_prune_round_to_and_fold_batchnorm(tmp_path, capsys):
    _save_sparse_model(tmp_path / "m.keras")
    code = main(["prune", str(tmp_path / "m.keras"), str(tmp_path / "out"), "--formats", "keras", "--round-to", "3",
                 "--fold-batchnorm"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "layers  10-6-3 -> 7-6-3" in captured.out  # 5 live hidden units, 6 kept
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["round_to"] == 3 and manifest["folded_batchnorms"] == {}  # no BatchNormalization here
    with pytest.raises(SystemExit) as exited:  # refused before the model loads, as a usage error
        main(["prune", str(tmp_path / "m.keras"), str(tmp_path / "bad"), "--round-to", "0"])
    assert exited.value.code == 2
    assert "argument --round-to: must be an integer >= 1; received '0'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_prune_bad_choice_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["prune", "m.keras", str(tmp_path / "out"), "--inputs", "all"])
    assert info.value.code == 2
    assert "invalid choice: 'all'" in capsys.readouterr().err


def test_prune_a_model_without_a_live_path_names_the_model_not_the_threshold(tmp_path, capsys):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"), keras.layers.Dense(2)])
    model.get_layer("hidden").set_weights([np.zeros((4, 3), "float32"), np.ones(3, "float32")])
    model.save(tmp_path / "dead.keras")
    out = tmp_path / "out"
    code = main(["prune", str(tmp_path / "dead.keras"), str(out), "--threshold", "0", "--formats", "keras"])
    captured = _assert_failed(
        code, capsys, "argument `model` must be a model with a path of non-zero weights", "every kernel weight of 'hidden' is 0"
    )
    assert "argument `threshold`" not in captured.err
    assert not out.exists()


def test_prune_a_diverged_model_says_its_weights_are_not_finite(tmp_path, capsys):
    model = _save_sparse_model(tmp_path / "m.keras")
    w1, b1 = model.get_layer("hidden").get_weights()
    w1[5, 1] = np.nan
    model.get_layer("hidden").set_weights([w1, b1])
    model.save(tmp_path / "nan.keras")
    code = main(["prune", str(tmp_path / "nan.keras"), str(tmp_path / "out"), "--formats", "keras"])
    _assert_failed(code, capsys, "the weights of the model are not finite", "hidden/kernel (1 NaN of 60 values)")
    assert not (tmp_path / "out").exists()


def test_prune_a_file_with_unregistered_objects_names_them_briefly(tmp_path, capsys, monkeypatch):
    registered = keras.saving.get_custom_objects()

    @keras.saving.register_keras_serializable(package="elsewhere")
    class Twice(keras.regularizers.Regularizer):
        def __call__(self, x):
            return 2.0 * keras.ops.sum(x)

        def get_config(self):
            return {}

    @keras.saving.register_keras_serializable(package="keras_group_lasso")
    class FutureLasso(keras.regularizers.Regularizer):
        def __call__(self, x):
            return keras.ops.sum(x)

        def get_config(self):
            return {}

    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2, kernel_regularizer=Twice(), bias_regularizer=FutureLasso())]
    )
    model.save(tmp_path / "custom.keras")
    # As in a process that never defined them: a newer release's penalty, another package's object.
    monkeypatch.delitem(registered, "elsewhere>Twice")
    monkeypatch.delitem(registered, "keras_group_lasso>FutureLasso")
    code = main(["prune", str(tmp_path / "custom.keras"), str(tmp_path / "out")])
    captured = _assert_failed(code, capsys, f"cannot load {str(tmp_path / 'custom.keras')!r} as a Keras model: ")
    assert "has no keras_group_lasso>FutureLasso: install the version that saved the file." in captured.err
    assert "The file uses custom objects that are not registered: elsewhere>Twice;" in captured.err
    assert len(captured.err) < 1500  # not Keras's whole config, repeated at every level


# ----------------------------------------------------------------------------- demo


@pytest.mark.quick
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--epochs", "0"], "argument `--epochs` must be an integer >= 1; received 0."),
        (["--factor", "-1"], "argument `--factor` must be a finite number >= 0; received -1.0."),
        (["--threshold", "nan"], "argument `--threshold` must be a finite number >= 0; received nan."),
        (["--seed", "-1"], "argument `--seed` must be an integer in [0, 4294967295]; received -1."),
        (["--seed", "4294967296"], "argument `--seed` must be an integer in [0, 4294967295]; received 4294967296."),
    ],
)
def test_demo_bad_arguments_fail_before_any_work_without_a_traceback(argv, message, capsys, monkeypatch):
    from keras_group_lasso import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("nothing may be loaded"))
    assert main(["demo"] + argv) == 2
    captured = capsys.readouterr()
    assert captured.err == f"keras-group-lasso demo: error: {message}\n"
    assert captured.out == ""


def test_demo_run_validates_its_arguments_first(monkeypatch):
    from keras_group_lasso import InvalidParameterError, datasets, demo

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("nothing may be loaded"))
    with pytest.raises(InvalidParameterError) as info:
        demo.run(epochs=10, threshold=None)
    assert str(info.value) == "demo: argument `threshold` must be a finite number >= 0; received None."


def test_demo_failure_after_training_is_one_line(capsys, monkeypatch):
    from keras_group_lasso import NonFiniteError, demo

    def diverged(**kwargs):
        raise NonFiniteError("sparsity_report: the weights of the model are not finite ...")

    monkeypatch.setattr(demo, "run", diverged)
    assert main(["demo", "--epochs", "1"]) == 1
    assert capsys.readouterr().err == (
        "keras-group-lasso demo: error: sparsity_report: the weights of the model are not finite ...\n"
    )


# ----------------------------------------------------------------------------- help and usage errors

# Runs cli.main on each argv of sys.argv[2] in a fresh interpreter and prints, as JSON, each exit status,
# stdout and stderr, and which heavy modules were imported before the first command and after the last.
_RUN_COMMANDS = r"""
import contextlib, io, json, sys

HEAVY = ("keras", "keras_group_lasso", "numpy", "tensorflow", "jax", "torch")

def imported():
    return sorted(name for name in HEAVY if name in sys.modules)

if sys.argv[1] == "package":
    from keras_group_lasso import cli  # what the keras-group-lasso command imports
else:  # cli.py on its own, without the package around it
    import importlib.util
    spec = importlib.util.spec_from_file_location("cli_on_its_own", sys.argv[1])
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
before = imported()
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps({"before": before, "after": imported(), "results": results}))
"""

# argv, exit status, what stdout or stderr holds
_USAGE = [
    (["--help"], 0, "usage: keras-group-lasso [-h] {demo,prune,bench} ..."),
    (["demo", "--help"], 0, "--epochs EPOCHS"),
    (["prune", "--help"], 0, "usage: keras-group-lasso prune [-h]"),
    (["bench", "--help"], 0, "{digits,fashion-mnist,peers,all}"),
    ([], 2, "keras-group-lasso: error: the following arguments are required: command"),
    (["train"], 2, "keras-group-lasso: error: argument command: invalid choice: 'train'"),
    (["demo", "--epochs", "ten"], 2, "keras-group-lasso demo: error: argument --epochs: invalid int value: 'ten'"),
    (["demo", "--factor", "strong"], 2, "argument --factor: invalid float value: 'strong'"),
    (["prune", "m.keras"], 2, "keras-group-lasso prune: error: the following arguments are required: OUT_DIR"),
    (["prune", "m.keras", "out", "--inputs", "all"], 2, "argument --inputs: invalid choice: 'all'"),
    (["prune", "m.keras", "out", "--round-to", "1.5"], 2,
     "argument --round-to: must be an integer >= 1; received '1.5'"),
    (["bench", "cifar"], 2, "keras-group-lasso bench: error: argument name: invalid choice: 'cifar'"),
    (["bench", "digits", "--seeds", "0"], 2, "keras-group-lasso bench: error: argument --seeds: must be an integer >= 1; received '0'"),
]


def _run_commands(source):
    import subprocess
    import sys

    argvs = [argv for argv, _, _ in _USAGE]
    done = subprocess.run(
        [sys.executable, "-c", _RUN_COMMANDS, source, json.dumps(argvs)],
        capture_output=True, text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for (argv, status, fragment), (code, out, err) in zip(_USAGE, report["results"]):
        assert code == status, (argv, code, out, err)
        assert fragment in (out if status == 0 else err), (argv, out, err)
        assert "Traceback" not in err, (argv, err)
    return report


@pytest.mark.quick
def test_help_and_usage_errors_need_only_the_standard_library():
    """cli.py, loaded on its own: --help and every usage error run without Keras, a backend or numpy."""
    import keras_group_lasso.cli

    report = _run_commands(keras_group_lasso.cli.__file__)
    assert report["before"] == []
    assert report["after"] == []


def test_the_command_answers_help_and_usage_errors_without_importing_more():
    """Through the package, as the keras-group-lasso command runs: the package's __init__ imports its
    names lazily, so neither importing the command nor --help and usage errors import Keras, a backend or numpy."""
    report = _run_commands("package")
    assert report["before"] == ["keras_group_lasso"]
    assert report["after"] == report["before"]

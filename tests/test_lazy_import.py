"""`import keras_group_lasso` is lazy, and the package's Keras objects are still registered in time.

The package imports its public names on first access (PEP 562). Its serializable objects must still be
known to Keras when a .keras file is loaded, whichever of Keras and the package is imported first: each
check runs in a fresh interpreter, where nothing was imported before.
"""

import importlib
import json
import os
import subprocess
import sys

import keras
import pytest

import keras_group_lasso

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("keras", "tensorflow", "jax", "torch", "numpy")


def _python(code, *args):
    """Run ``code`` in a fresh interpreter on this backend; its last line of stdout, parsed as JSON."""
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_IMPORT_THEN_USE = r"""
import json, sys

HEAVY = json.loads(sys.argv[1])
import keras_group_lasso
import keras_group_lasso.cli
report = {
    "after_import": sorted(name for name in HEAVY if name in sys.modules),
    "version": keras_group_lasso.__version__,
    "dir": dir(keras_group_lasso),
}
prune_model = keras_group_lasso.prune_model  # first access imports Keras and the surgery
import keras, numpy as np

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"), keras.layers.Dense(2)])
kernel, bias = model.get_layer("hidden").get_weights()
kernel[:, 1] = 0.0
model.get_layer("hidden").set_weights([kernel, bias])
small = prune_model(model, threshold=0.0)
report["hidden_units"] = int(small.get_layer("hidden").get_weights()[0].shape[1])
report["registered"] = keras.saving.get_registered_object("keras_group_lasso>GroupLasso") is not None
print(json.dumps(report))
"""


@pytest.mark.turns  # a fresh process that imports no backend: the same on every one
def test_import_needs_no_keras_backend_or_numpy_and_names_resolve_on_first_access():
    report = _python(_IMPORT_THEN_USE, json.dumps(HEAVY))
    assert report["after_import"] == []
    assert report["version"] == keras_group_lasso.__version__
    assert set(keras_group_lasso.__all__) <= set(report["dir"])
    assert report["hidden_units"] == 2
    assert report["registered"]


@pytest.mark.parametrize("name", keras_group_lasso.__all__)
def test_every_public_name_is_the_object_of_its_module(name):
    value = getattr(keras_group_lasso, name)
    if name == "__version__":
        assert isinstance(value, str)
        return
    module = importlib.import_module(f"keras_group_lasso.{keras_group_lasso._EXPORTS[name]}")
    assert value is getattr(module, name)


def test_star_import_and_unknown_names():
    namespace = {}
    exec("from keras_group_lasso import *", namespace)
    assert {name for name in keras_group_lasso.__all__} <= set(namespace)
    assert keras_group_lasso.analysis is importlib.import_module("keras_group_lasso.analysis")
    with pytest.raises(AttributeError, match="no_such_name"):
        keras_group_lasso.no_such_name



@pytest.mark.parametrize("package", ["budget", "costs", "graph", "sklearn", "surgery"])
def test_every_subpackage_star_import_gives_its_public_names(package):
    namespace = {}
    exec(f"from keras_group_lasso.{package} import *", namespace)
    module = importlib.import_module(f"keras_group_lasso.{package}")
    assert module.__all__ and set(module.__all__) <= set(namespace)


_LOAD = r"""
import json, sys

{imports}
import keras

model = keras.saving.load_model(sys.argv[1])
regularizer = model.get_layer("hidden").kernel_regularizer
print(json.dumps({{"class": type(regularizer).__module__ + "." + type(regularizer).__name__,
                  "factor": float(regularizer.factor)}}))
"""


@pytest.fixture(scope="module")
def saved_with_group_lasso(tmp_path_factory):
    path = tmp_path_factory.mktemp("lazy") / "group_lasso.keras"
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, name="hidden", kernel_regularizer=keras_group_lasso.GroupLasso(1e-3)),
            keras.layers.Dense(2, name="output"),
        ]
    )
    model.save(path)
    return path


@pytest.mark.turns  # the import orders take turns over the backends (a fresh process each)
@pytest.mark.parametrize(
    "imports",
    [
        "import keras\nimport keras_group_lasso",
        "import keras_group_lasso\nimport keras",
        # Keras is first imported by a module of the package, halfway through that module's import.
        "from keras_group_lasso.analysis import sparsity_report",
        "import keras_group_lasso.cli",
    ],
    ids=["keras-first", "package-first", "submodule-imports-keras", "cli"],
)
def test_a_saved_package_regularizer_loads_after_a_plain_import(saved_with_group_lasso, imports):
    report = _python(_LOAD.format(imports=imports), saved_with_group_lasso)
    assert report == {"class": "keras_group_lasso.regularizers.GroupLasso", "factor": pytest.approx(1e-3)}


def test_the_prune_command_loads_a_model_that_holds_package_objects(saved_with_group_lasso, tmp_path):
    out = tmp_path / "out"
    code = (
        "import json, sys\n"
        "from keras_group_lasso.cli import main\n"
        "status = main(['prune', sys.argv[1], sys.argv[2], '--formats', 'keras'])\n"
        "print(json.dumps(status))\n"
    )
    assert _python(code, saved_with_group_lasso, out) == 0
    assert sorted(os.listdir(out)) == ["manifest.json", "model.keras"]
    assert tuple(keras.saving.load_model(out / "model.keras").outputs[0].shape) == (None, 2)

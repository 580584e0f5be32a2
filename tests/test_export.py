"""export_pruned: every format reloads and matches the thresholded original; atomic writes; errors."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

import keras_group_lasso
from keras_group_lasso import InvalidParameterError, add_group_sparsity, apply_threshold, export_pruned, prune_model
from keras_group_lasso import export as export_module
from keras_group_lasso.surgery import UnsupportedModelError

THRESHOLD = 1e-3
N_FEATURES = 10
DEAD_FEATURES = (0, 3, 7)


def _sparse_model(seed=0):
    """10 -> 6 -> 4 -> 3 with dead features 0, 3, 7, dead hidden units and sub-threshold noise."""
    rng = np.random.default_rng(seed)
    model = keras.Sequential(
        [
            keras.Input((N_FEATURES,)),
            keras.layers.Dense(6, activation="relu", name="hidden_1"),
            keras.layers.Dense(4, activation="tanh", name="hidden_2"),
            keras.layers.Dense(3, name="output"),
        ]
    )
    w1 = rng.normal(size=(N_FEATURES, 6)).astype("float32")
    w2 = rng.normal(size=(6, 4)).astype("float32")
    w3 = rng.normal(size=(4, 3)).astype("float32")
    w1[list(DEAD_FEATURES)] = rng.uniform(-THRESHOLD, THRESHOLD, (len(DEAD_FEATURES), 6))
    w2[[1, 4]] = 0.0  # hidden_1 units 1 and 4 have no outgoing weight
    w3[2] = 5e-4  # hidden_2 unit 2 only below the threshold
    model.get_layer("hidden_1").set_weights([w1, rng.normal(size=6).astype("float32")])
    model.get_layer("hidden_2").set_weights([w2, rng.normal(size=4).astype("float32")])
    model.get_layer("output").set_weights([w3, rng.normal(size=3).astype("float32")])
    return model


def _thresholded(model, threshold=THRESHOLD):
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    apply_threshold(clone, threshold)
    for layer in clone.layers:
        if isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()  # set_weights leaves its cached mean and variance behind
    return clone


def _x(n=17, seed=1):
    return np.random.default_rng(seed).normal(size=(n, N_FEATURES)).astype("float32")


def _tflite_outputs(path, x):
    tf = pytest.importorskip("tensorflow")
    with warnings.catch_warnings():
        # TF 2.21 warns that tf.lite.Interpreter moves to the ai_edge_litert package.
        warnings.filterwarnings("ignore", message=r"(?s).*tf.lite.Interpreter is deprecated")
        interpreter = tf.lite.Interpreter(model_path=path)
    inp = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(inp["index"], list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(inp["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


@pytest.fixture(scope="module")
def full_export(tmp_path_factory):
    pytest.importorskip("tensorflow", reason="SavedModel and TFLite need TensorFlow")
    model = _sparse_model()
    weights_before = [w.copy() for w in model.get_weights()]
    directory = tmp_path_factory.mktemp("export") / "digits"
    result = export_pruned(
        model, directory, threshold=THRESHOLD, formats=("saved_model", "keras", "tflite")
    )
    return model, weights_before, directory, result


def test_every_format_reloads_with_the_thresholded_outputs(full_export):
    import tensorflow as tf

    model, _, directory, result = full_export
    x = _x()
    expected = keras.ops.convert_to_numpy(_thresholded(model)(x))

    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    _, inputs = served.structured_input_signature
    assert list(inputs) == ["features"]
    assert inputs["features"].shape.as_list() == [None, N_FEATURES]
    assert inputs["features"].dtype == tf.float32
    np.testing.assert_allclose(served(features=tf.constant(x))["output_0"].numpy(), expected, atol=1e-5)

    reloaded = keras.saving.load_model(result.paths["keras"], safe_mode=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x)), expected, atol=1e-5)

    np.testing.assert_allclose(_tflite_outputs(result.paths["tflite"], x), expected, atol=1e-5)

    assert sorted(os.listdir(directory)) == ["manifest.json", "model.keras", "model.tflite", "saved_model"]
    assert not [n for n in os.listdir(directory.parent) if n.startswith(".")]  # no leftovers


def test_manifest(full_export):
    _, _, directory, result = full_export
    with open(directory / "manifest.json") as f:
        manifest = json.load(f)
    assert manifest == result.manifest
    report = result.report
    assert manifest["package_version"] == keras_group_lasso.__version__
    assert manifest["threshold"] == THRESHOLD
    assert manifest["inputs"] == "original"
    assert manifest["n_features"] == N_FEATURES
    assert manifest["kept_features"] == [i for i in range(N_FEATURES) if i not in DEAD_FEATURES]
    assert manifest["kept_features"] == list(report.selected_features)
    assert manifest["layer_sizes_before"] == [10, 6, 4, 3]
    assert manifest["layer_sizes_after"] == [7, 4, 3, 3]
    assert manifest["params_before"] == report.params_before
    assert manifest["params_after"] == report.params_after
    assert manifest["params_after"] < manifest["params_before"]
    reloaded = keras.saving.load_model(result.paths["keras"])
    assert manifest["exported_model_params"] == reloaded.count_params()
    assert manifest["params_after"] <= manifest["exported_model_params"] < manifest["params_before"]
    assert manifest["formats"] == {
        "saved_model": "saved_model",
        "keras": "model.keras",
        "tflite": "model.tflite",
    }
    assert manifest["serving"]["input_shape"] == [None, N_FEATURES]
    assert result.directory == str(directory)


def test_users_model_is_not_changed(full_export):
    model, weights_before, _, _ = full_export
    for before, after in zip(weights_before, model.get_weights()):
        np.testing.assert_array_equal(before, after)


def test_selected_inputs_take_only_the_kept_features(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="SavedModel needs TensorFlow")
    model = _sparse_model()
    result = export_pruned(model, tmp_path / "out", inputs="selected")
    kept = result.manifest["kept_features"]
    assert result.manifest["inputs"] == "selected"
    assert result.manifest["serving"]["input_shape"] == [None, len(kept)]
    x = _x()
    expected = keras.ops.convert_to_numpy(_thresholded(model)(x))
    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    got = served(features=tf.constant(x[:, kept]))["output_0"].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    reloaded = keras.saving.load_model(result.paths["keras"])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x[:, kept])), expected, atol=1e-5)


def test_a_process_that_is_not_the_chief_writes_nothing_and_gets_the_chiefs_result(tmp_path, monkeypatch):
    model = _sparse_model()
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    other = export_pruned(model, tmp_path / "out", formats=("keras",))
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    chief = export_pruned(model, tmp_path / "out", formats=("keras",))
    assert sorted(os.listdir(tmp_path / "out")) == ["manifest.json", "model.keras"]
    assert other.paths == chief.paths and other.directory == chief.directory
    with open(chief.paths["manifest"]) as f:
        assert json.load(f) == chief.manifest
    # the sizes of the files are known to the process that wrote them
    assert other.manifest == {key: value for key, value in chief.manifest.items() if key != "file_sizes"}


def test_image_input_with_few_kept_features(tmp_path):
    # Few survivors: surgery selects them with a frozen 0/1 Dense instead of keeping zero rows,
    # a plain matmul that SavedModel and TFLite export on both backends.
    tf = pytest.importorskip("tensorflow", reason="SavedModel and TFLite need TensorFlow")
    rng = np.random.default_rng(3)
    model = keras.Sequential(
        [keras.Input((4, 6)), keras.layers.Flatten(), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)]
    )
    kernel, bias = model.layers[1].get_weights()
    keep = np.zeros(24, bool)
    keep[[7, 16]] = True
    kernel[~keep] = 0.0
    model.layers[1].set_weights([kernel, bias])
    assert [layer.name for layer in prune_model(model).layers if not layer.trainable] == ["select_features"]
    result = export_pruned(model, tmp_path / "out", formats=("saved_model", "tflite", "keras"))
    assert result.manifest["kept_features"] == [7, 16]
    assert result.manifest["serving"]["input_shape"] == [None, 4, 6]
    x = rng.normal(size=(6, 4, 6)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(x))
    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    np.testing.assert_allclose(served(features=tf.constant(x))["output_0"].numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(_tflite_outputs(result.paths["tflite"], x), expected, atol=1e-5)
    reloaded = keras.saving.load_model(result.paths["keras"], safe_mode=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x)), expected, atol=1e-5)


def test_missing_tensorflow_is_a_clear_error(tmp_path, monkeypatch):
    model = _sparse_model()
    with monkeypatch.context() as patch:
        # A None entry in sys.modules makes `import tensorflow` fail, as on a JAX-only install.
        patch.setitem(sys.modules, "tensorflow", None)
        with pytest.raises(ImportError, match=r"the 'saved_model' format needs TensorFlow installed"):
            export_pruned(model, tmp_path / "sm", formats=("saved_model", "keras"))
    assert not (tmp_path / "sm").exists()


@pytest.mark.skipif(
    keras.backend.backend() == "tensorflow", reason="the TensorFlow backend needs TensorFlow itself"
)
def test_keras_format_needs_no_tensorflow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    result = export_pruned(_sparse_model(), tmp_path / "k", formats="keras")
    assert sorted(os.listdir(tmp_path / "k")) == ["manifest.json", "model.keras"]
    assert "serving" not in result.manifest


@pytest.mark.quick
def test_keras_format_alone(tmp_path):
    model = _sparse_model()
    result = export_pruned(model, tmp_path / "k", formats="keras")
    assert sorted(os.listdir(tmp_path / "k")) == ["manifest.json", "model.keras"]
    assert set(result.paths) == {"keras", "manifest"}
    assert "serving" not in result.manifest
    expected = keras.ops.convert_to_numpy(_thresholded(model)(_x()))
    reloaded = keras.saving.load_model(result.paths["keras"], safe_mode=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(_x())), expected, atol=1e-5)



# ----------------------------------------------------------------------------- plain Keras

PLAIN = textwrap.dedent(
    """
    import json, os, sys, warnings
    sys.modules["keras_group_lasso"] = None  # any attempt to import the package fails
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import keras
    import tensorflow as tf

    def close(got, case, tag):
        expected = np.load(os.path.join(case, "expected.npy"))
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5, err_msg=f"{case} {tag}")

    done = []
    for case in sorted(json.loads(sys.argv[1])):
        x = np.load(os.path.join(case, "x.npy"))
        close(keras.ops.convert_to_numpy(keras.saving.load_model(os.path.join(case, "pruned.keras"))(x)), case, "pruned")
        export = os.path.join(case, "export")
        if not os.path.isdir(export):
            continue
        close(keras.ops.convert_to_numpy(keras.saving.load_model(os.path.join(export, "model.keras"))(x)), case, "keras")
        serve = tf.saved_model.load(os.path.join(export, "saved_model")).signatures["serving_default"]
        close(serve(features=tf.constant(x))["output_0"].numpy(), case, "saved_model")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            interpreter = tf.lite.Interpreter(model_path=os.path.join(export, "model.tflite"))
        index = interpreter.get_input_details()[0]["index"]
        interpreter.resize_tensor_input(index, list(x.shape))
        interpreter.allocate_tensors()
        interpreter.set_tensor(index, x)
        interpreter.invoke()
        close(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), case, "tflite")
        done.append(os.path.basename(case))
    assert not [n for n, module in sys.modules.items() if n.startswith("keras_group_lasso") and module is not None]
    print("CHECKED", " ".join(done))
    """
)


def _few_features_image_model(seed=4):
    """(4, 6) images, 2 of 24 pixels kept: surgery selects them with a frozen 0/1 Dense."""
    rng = np.random.default_rng(seed)
    model = keras.Sequential(
        [keras.Input((4, 6)), keras.layers.Flatten(), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)]
    )
    kernel, bias = model.layers[1].get_weights()
    kernel[[i for i in range(24) if i not in (7, 16)]] = 0.0
    model.layers[1].set_weights([kernel, rng.normal(size=5).astype("float32")])
    return model


def _normalized_nested_model(seed=5):
    """Normalization at the input, then a nested Sequential block, then the output layer."""
    rng = np.random.default_rng(seed)
    norm = keras.layers.Normalization()
    norm.adapt(rng.normal(3.0, 2.0, size=(50, N_FEATURES)).astype("float32"))
    block = keras.Sequential([keras.layers.Dense(6, activation="relu"), keras.layers.Dropout(0.1)], name="block")
    inputs = keras.Input((N_FEATURES,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(block(norm(inputs))))
    kernel, bias = block.layers[0].get_weights()
    kernel[list(DEAD_FEATURES)] = 0.0
    block.layers[0].set_weights([kernel, bias])
    return model


def _residual_model(seed=6):
    """A shortcut from the input: features 0, 3, 7 are read by no layer, so they go from the whole stream."""
    rng = np.random.default_rng(seed)
    inputs = keras.Input((N_FEATURES,), name="features")
    g = keras.layers.Dense(4, activation="relu", name="g_in")(inputs)
    g = keras.layers.Dense(N_FEATURES, name="g_out")(g)
    x = keras.layers.Add(name="shortcut")([inputs, g])
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(x))
    for name, dead_axis in (("g_in", 0), ("g_out", 1), ("out", 0)):
        layer = model.get_layer(name)
        kernel = rng.normal(size=layer.kernel.shape).astype("float32")
        if dead_axis == 0:
            kernel[list(DEAD_FEATURES)] = 0.0
        else:
            kernel[:, list(DEAD_FEATURES)] = 0.0
        layer.set_weights([kernel, rng.normal(size=layer.bias.shape).astype("float32")])
    return model


def test_every_artifact_loads_and_runs_with_plain_keras(tmp_path, full_export):
    # A serving environment with Keras and TensorFlow but without this package.
    pytest.importorskip("tensorflow", reason="SavedModel and TFLite need TensorFlow")
    cases = {  # name: (model, x, inputs, with this package's penalties on every Dense layer)
        "mlp": (_sparse_model(), _x(), "original", False),
        "mlp_penalised": (_sparse_model(), _x(), "original", True),
        "mlp_selected": (_sparse_model(), _x(), "selected", True),
        "image_few_kept": (_few_features_image_model(), np.random.default_rng(2).normal(size=(5, 4, 6)).astype("float32"), "original", False),
        "normalized_nested": (_normalized_nested_model(), np.random.default_rng(3).normal(3.0, 2.0, size=(6, N_FEATURES)).astype("float32"), "original", True),
        "residual": (_residual_model(), _x(), "original", True),
    }
    if keras.backend.backend() != "tensorflow":
        # On JAX and PyTorch the serving formats are written by a TensorFlow process of their own from the pruned
        # model (each export starts one): the model kinds are the TensorFlow leg's to check; here, the hand-over
        # of a plain, a penalised with selected inputs and a nested normalized model.
        cases = {name: cases[name] for name in ("mlp", "mlp_selected", "normalized_nested")}
    directories = []
    for name, (model, x, inputs, penalised) in cases.items():
        if penalised:  # not carried into the artifacts: they load without this package
            model = add_group_sparsity(model, 1e-3)
        case = tmp_path / name
        case.mkdir()
        expected = keras.ops.convert_to_numpy(_thresholded(model)(x))
        small = prune_model(model, THRESHOLD, inputs=inputs)
        if inputs == "selected":
            x = x[:, list(small.kept_features)]
        np.save(case / "x.npy", x)
        np.save(case / "expected.npy", expected)
        small.save(str(case / "pruned.keras"))
        if name == "mlp":  # the module's export (full_export) is of this model, to these formats: not made twice
            shutil.copytree(full_export[2], case / "export")
        else:
            export_pruned(model, case / "export", inputs=inputs, formats=("saved_model", "keras", "tflite"))
        directories.append(str(case))
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["KERAS_BACKEND"] = keras.backend.backend()
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(directories)],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    checked = [line for line in done.stdout.splitlines() if line.startswith("CHECKED")]
    assert checked and set(checked[0].split()[1:]) == set(cases)


# ----------------------------------------------------------------------------- directories


def _tree(directory):
    """{relative path: bytes or None for a directory} of everything under ``directory``."""
    tree = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            tree[os.path.relpath(os.path.join(root, name), directory)] = None
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                tree[os.path.relpath(os.path.join(root, name), directory)] = f.read()
    return tree


def _users_files(target):
    """A directory holding a user's own files, among them a trained model."""
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    (target / "data").mkdir()
    (target / "data" / "x.csv").write_text("1,2\n")
    _sparse_model(seed=3).save(target / "trained.keras")
    return _tree(target)


def test_writes_next_to_the_users_files_and_refuses_an_earlier_export_without_overwrite(tmp_path):
    model = _sparse_model()
    target = tmp_path / "out"
    users = _users_files(target)
    result = export_pruned(model, target, formats=("keras",))
    assert sorted(os.listdir(target)) == ["data", "keep.txt", "manifest.json", "model.keras", "trained.keras"]
    assert result.replaced == () and result.removed == ()
    before = _tree(target)
    with pytest.raises(InvalidParameterError) as info:
        export_pruned(model, target, formats=("saved_model",))
    assert str(info.value) == (
        "export_pruned: argument `directory` must be a directory without an earlier export "
        f"(it holds 'model.keras', 'manifest.json'; pass overwrite=True to replace them); received {target!r}."
    )
    assert _tree(target) == before
    assert {k: v for k, v in before.items() if k in users} == users
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("name", ["model.keras", "manifest.json", "model.tflite", "saved_model"])
def test_any_artifact_name_is_refused_without_overwrite(tmp_path, name):
    target = tmp_path / "out"
    target.mkdir()
    (target / name).write_text("someone's")
    with pytest.raises(InvalidParameterError, match=f"without an earlier export \\(it holds '{name}';"):
        export_pruned(_sparse_model(), target, formats=("keras",))
    assert os.listdir(target) == [name]


def test_overwrite_replaces_only_the_artifacts_and_keeps_every_other_file(tmp_path):
    target = tmp_path / "out"
    users = _users_files(target)
    export_pruned(_sparse_model(), target, formats=("keras",))
    result = export_pruned(_sparse_model(seed=1), target, threshold=0.0, formats=("keras",), overwrite=True)
    after = _tree(target)
    assert {k: v for k, v in after.items() if k in users} == users  # the user's files, byte for byte
    assert sorted(set(after) - set(users)) == ["manifest.json", "model.keras"]  # no staging left behind
    assert result.replaced == (str(target / "model.keras"), str(target / "manifest.json"))
    assert result.removed == ()
    with open(target / "manifest.json") as f:
        assert json.load(f) == result.manifest and result.manifest["threshold"] == 0.0
    reloaded = keras.saving.load_model(target / "model.keras")
    small = prune_model(_sparse_model(seed=1), 0.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(_x())), keras.ops.convert_to_numpy(small(_x())),
                               atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_overwrite_removes_the_stale_artifacts_the_earlier_manifest_records(tmp_path):
    pytest.importorskip("tensorflow", reason="SavedModel needs TensorFlow")
    target = tmp_path / "out"
    users = _users_files(target)
    export_pruned(_sparse_model(), target, formats=("saved_model", "keras"))
    result = export_pruned(_sparse_model(), target, formats=("keras",), overwrite=True)
    assert result.replaced == (str(target / "model.keras"), str(target / "manifest.json"))
    assert result.removed == (str(target / "saved_model"),)
    assert sorted(set(_tree(target)) - set(users)) == ["manifest.json", "model.keras"]
    assert result.manifest["formats"] == {"keras": "model.keras"}


def test_overwrite_warns_about_artifact_names_no_earlier_manifest_records(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.keras").write_text("someone's model")
    (target / "model.tflite").write_text("someone's flatbuffer")
    with pytest.warns(UserWarning) as record:
        result = export_pruned(_sparse_model(), target, formats=("keras",), overwrite=True)
    messages = sorted(str(w.message) for w in record if str(w.message).startswith("export_pruned:"))
    assert messages == [
        f"export_pruned: left {str(target / 'model.tflite')!r} in place: this export did not write it and no "
        "manifest.json of an earlier export records it, so the new manifest.json does not describe it.",
        f"export_pruned: replaced {str(target / 'model.keras')!r}, which no manifest.json of an earlier export "
        "records (overwrite=True replaces every artifact this export writes).",
    ]
    assert result.replaced == (str(target / "model.keras"),) and result.removed == ()
    assert (target / "model.tflite").read_text() == "someone's flatbuffer"
    assert sorted(os.listdir(target)) == ["manifest.json", "model.keras", "model.tflite"]


def test_artifacts_are_built_apart_and_the_manifest_comes_last(tmp_path, monkeypatch):
    target = tmp_path / "out"
    export_pruned(_sparse_model(), target, formats=("keras",))
    earlier = _tree(target)
    seen = {}
    write_manifest, rename = export_module._write_manifest_file, os.rename

    def spying_write(path, manifest):
        seen["while writing"] = _tree(target)
        write_manifest(path, manifest)

    def spying_rename(source, destination):
        if os.fspath(destination) == str(target / "model.keras"):  # the new model goes into place
            seen["model placed"] = os.listdir(target)
        rename(source, destination)

    monkeypatch.setattr(export_module, "_write_manifest_file", spying_write)
    monkeypatch.setattr(export_module.os, "rename", spying_rename)
    export_pruned(_sparse_model(seed=1), target, formats=("keras",), overwrite=True)
    new = sorted(k for k in seen["while writing"] if k not in earlier)
    assert {k: v for k, v in seen["while writing"].items() if k in earlier} == earlier  # untouched until all is built
    assert len(new) == 2 and new[0].startswith(".keras_group_lasso.partial-")  # built apart, in a staging directory
    assert new[1] == os.path.join(new[0], "model.keras")
    assert "manifest.json" not in seen["model placed"]  # no manifest while the artifacts are swapped
    assert sorted(os.listdir(target)) == ["manifest.json", "model.keras"]


def _rename_failing_once_into(path, monkeypatch, always=False):
    rename, failed = os.rename, []

    def failing_rename(source, destination):
        if os.fspath(destination) == str(path) and (always or not failed):
            failed.append(source)
            raise OSError("disk full")
        rename(source, destination)

    monkeypatch.setattr(export_module.os, "rename", failing_rename)


def test_a_failure_while_replacing_puts_the_earlier_export_back(tmp_path, monkeypatch):
    target = tmp_path / "out"
    users = _users_files(target)
    export_pruned(_sparse_model(), target, formats=("keras",))
    earlier = _tree(target)
    _rename_failing_once_into(target / "model.keras", monkeypatch)  # after the earlier model went aside
    with pytest.raises(OSError, match="disk full"):
        export_pruned(_sparse_model(seed=1), target, formats=("keras",), overwrite=True)
    assert _tree(target) == earlier
    assert {k: v for k, v in earlier.items() if k in users} == users


def test_a_failure_to_put_the_earlier_export_back_keeps_it_and_says_where(tmp_path, monkeypatch):
    target = tmp_path / "out"
    export_pruned(_sparse_model(), target, formats=("keras",))
    earlier = _tree(target)
    _rename_failing_once_into(target / "model.keras", monkeypatch, always=True)
    with pytest.raises(OSError, match=r"putting the earlier ones back failed too .*; the earlier ones are in '(.*)'$") \
            as info:
        export_pruned(_sparse_model(seed=1), target, formats=("keras",), overwrite=True)
    aside = re.search(r"the earlier ones are in '(.*)'$", str(info.value)).group(1)
    assert sorted(os.listdir(aside)) == ["manifest.json", "model.keras"]
    for name in os.listdir(aside):
        with open(os.path.join(aside, name), "rb") as f:
            assert f.read() == earlier[name]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027], ids=oct)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_permissions_follow_the_umask(tmp_path, umask, existing):
    target = tmp_path / "out"
    if existing:
        target.mkdir(mode=0o751)
        os.chmod(target, 0o751)  # the user's choice, kept
    old = os.umask(umask)
    try:
        export_pruned(_sparse_model(), target, formats=("keras",))
        export_pruned(_sparse_model(), target, formats=("keras",), overwrite=True)
    finally:
        os.umask(old)
    modes = {os.path.relpath(os.path.join(root, name), tmp_path): os.stat(os.path.join(root, name)).st_mode & 0o777
             for root, dirs, files in os.walk(tmp_path) for name in dirs + files}
    assert modes == {
        "out": 0o751 if existing else 0o777 & ~umask,
        os.path.join("out", "manifest.json"): 0o666 & ~umask,
        os.path.join("out", "model.keras"): 0o666 & ~umask,
    }


def test_serving_formats_follow_the_umask(tmp_path):
    pytest.importorskip("tensorflow", reason="SavedModel and TFLite need TensorFlow")
    old = os.umask(0o027)
    try:
        export_pruned(_sparse_model(), tmp_path / "out", formats=("saved_model", "tflite"))
    finally:
        os.umask(old)
    for root, dirs, files in os.walk(tmp_path / "out"):
        for name in dirs:
            assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o750, name
        for name in files:
            assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o640, name
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o750


def test_an_existing_empty_directory_is_used(tmp_path):
    (tmp_path / "out").mkdir()
    export_pruned(_sparse_model(), tmp_path / "out", formats=("keras",))
    assert sorted(os.listdir(tmp_path / "out")) == ["manifest.json", "model.keras"]


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "_write_manifest_file", broken)
    with pytest.raises(OSError, match="disk full"):
        export_pruned(_sparse_model(), tmp_path / "out", formats=("keras",))
    assert os.listdir(tmp_path) == []


def test_a_failure_while_overwriting_keeps_the_old_export(tmp_path, monkeypatch):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("previous export")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "_write_manifest_file", broken)
    with pytest.raises(OSError):
        export_pruned(_sparse_model(), target, formats=("keras",), overwrite=True)
    assert os.listdir(tmp_path) == ["out"]
    assert os.listdir(target) == ["old.txt"]


def test_residual_model_loses_its_dead_features_everywhere():
    model = _residual_model()
    small = prune_model(model, THRESHOLD, inputs="selected")
    assert small.kept_features == tuple(i for i in range(N_FEATURES) if i not in DEAD_FEATURES)
    assert small.get_layer("g_out").kernel.shape == (4, N_FEATURES - len(DEAD_FEATURES))
    assert small.get_layer("out").kernel.shape == (N_FEATURES - len(DEAD_FEATURES), 3)
    x = _x()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x[:, list(small.kept_features)])),
                               keras.ops.convert_to_numpy(_thresholded(model)(x)), rtol=1e-5, atol=1e-5)
    original = prune_model(model, THRESHOLD)  # the input keeps its shape: the kept features are picked before the Add
    assert original.inputs[0].shape == (None, N_FEATURES)
    assert "select_features" in [layer.name for layer in original.layers]


def test_unsupported_model_writes_nothing(tmp_path):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="d1")(inputs)
    outputs = keras.layers.Dense(2, name="d2")(keras.layers.Flatten()(keras.layers.Reshape((2, 2), name="rs")(hidden)))
    model = keras.Model(inputs, outputs)
    with pytest.raises(UnsupportedModelError):
        export_pruned(model, tmp_path / "out", formats=("keras",))
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- arguments


@pytest.mark.quick
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"threshold": -1.0},
            "export_pruned: argument `threshold` must be a finite number >= 0; received -1.0.",
        ),
        (
            {"formats": ("pdf",)},
            "export_pruned: argument `formats` must be a non-empty sequence of distinct names from "
            "'saved_model', 'keras', 'tflite', 'onnx', 'tflite-int8'; received ('pdf',).",
        ),
        (
            {"formats": ()},
            "export_pruned: argument `formats` must be a non-empty sequence of distinct names from "
            "'saved_model', 'keras', 'tflite', 'onnx', 'tflite-int8'; received ().",
        ),
        (
            {"formats": ("keras", "keras")},
            "export_pruned: argument `formats` must be a non-empty sequence of distinct names from "
            "'saved_model', 'keras', 'tflite', 'onnx', 'tflite-int8'; received ('keras', 'keras').",
        ),
        (  # a dict or set would be read by its keys, its values ignored
            {"formats": {"keras": True, "saved_model": False}},
            "export_pruned: argument `formats` must be a non-empty sequence of distinct names from "
            "'saved_model', 'keras', 'tflite', 'onnx', 'tflite-int8'; received {'keras': True, 'saved_model': False}.",
        ),
        (
            {"formats": {"keras"}},
            "export_pruned: argument `formats` must be a non-empty sequence of distinct names from "
            "'saved_model', 'keras', 'tflite', 'onnx', 'tflite-int8'; received {'keras'}.",
        ),
        (
            {"inputs": "all"},
            "export_pruned: argument `inputs` must be one of 'original', 'selected'; received 'all'.",
        ),
        (
            {"overwrite": "yes"},
            "export_pruned: argument `overwrite` must be a bool; received 'yes'.",
        ),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(InvalidParameterError) as info:
        export_pruned(_sparse_model(), tmp_path / "out", **kwargs)
    assert str(info.value) == message
    assert os.listdir(tmp_path) == []


def test_bad_model_and_directory(tmp_path):
    with pytest.raises(InvalidParameterError) as info:
        export_pruned("model.keras", tmp_path / "out")
    assert str(info.value) == "export_pruned: argument `model` must be a keras.Model; received 'model.keras'."
    with pytest.raises(InvalidParameterError) as info:
        export_pruned(_sparse_model(), 3)
    assert str(info.value) == (
        "export_pruned: argument `directory` must be a non-empty path (str or os.PathLike); received 3."
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidParameterError, match="must be a directory path, not an existing file"):
        export_pruned(_sparse_model(), tmp_path / "file")
    for below in ("sub", "sub/deeper"):  # os.makedirs would raise FileExistsError / NotADirectoryError
        with pytest.raises(InvalidParameterError) as info:
            export_pruned(_sparse_model(), tmp_path / "file" / below)
        assert str(info.value) == (
            "export_pruned: argument `directory` must be a path below folders only, not below a file; received "
            f"{str(tmp_path / 'file' / below)!r} ({str(tmp_path / 'file')!r} is a file).")
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="only the PyTorch backend writes the SavedModel in a TensorFlow child process")
def test_a_failing_tensorflow_child_is_an_error_and_writes_nothing(tmp_path, monkeypatch):
    from keras_group_lasso import export as export_module

    def failing_child(command, **kwargs):
        assert kwargs["env"]["KERAS_BACKEND"] == "tensorflow"
        return subprocess.CompletedProcess(command, 3, stdout="", stderr="Traceback ...\nValueError: boom")

    monkeypatch.setattr(export_module.subprocess, "run", failing_child)
    with pytest.raises(RuntimeError, match=r"(?s)TensorFlow-backend process.*exit status 3.*ValueError: boom"):
        export_pruned(_sparse_model(), tmp_path / "out", formats=("saved_model", "keras"))
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path) == []  # no staging directory left behind


def test_a_model_with_several_inputs_exports_every_format_with_one_named_argument_per_input(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="SavedModel needs TensorFlow")
    from test_tabular import tabular

    rng = np.random.default_rng(0)
    model = tabular(rng, 4, [5, 6], [2, 3], [6])
    kernel, bias = model.get_layer("h0").get_weights()
    kernel[[1, 3]] = 0.0
    kernel[4:6] = 0.0  # nobody reads cat0
    model.get_layer("h0").set_weights([kernel, bias])
    result = export_pruned(model, tmp_path / "out", inputs="selected", formats=("saved_model", "keras", "tflite"))
    serving = result.manifest["serving"]
    assert [(i["name"], i["shape"], i["dtype"]) for i in serving["inputs"]] == [
        ("numeric", [None, 2], "float32"), ("cat1", [None, 1], "int32")]
    assert [(i["name"], i["kept"]) for i in result.manifest["model_inputs"]] == [
        ("numeric", True), ("cat0", False), ("cat1", True)]
    numeric = rng.normal(size=(5, 4)).astype("float32")
    column = rng.integers(0, 6, (5, 1)).astype("int32")
    expected = keras.ops.convert_to_numpy(_thresholded(model)([numeric, np.zeros((5, 1), "int32"), column]))
    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    got = served(numeric=tf.constant(numeric[:, [0, 2]]), cat1=tf.constant(column))["output_0"].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    interpreter = tf.lite.Interpreter(model_path=result.paths["tflite"])
    runner = interpreter.get_signature_runner("serving_default")
    got = runner(numeric=numeric[:, [0, 2]], cat1=column)["output_0"]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_a_branching_model_with_dropout_serves_its_whole_graph(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="SavedModel needs TensorFlow")
    inputs = keras.Input((6,))
    a = keras.layers.Dropout(0.5)(keras.layers.Dense(5, activation="relu", name="a")(inputs))
    b = keras.layers.Dense(5, name="b")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(keras.layers.Add()([a, b])))
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    result = export_pruned(model, tmp_path / "out", formats=("saved_model",))
    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    want = keras.ops.convert_to_numpy(_thresholded(model)(x, training=False))
    np.testing.assert_allclose(served(features=tf.constant(x))["output_0"].numpy(), want, atol=1e-5)


@keras.saving.register_keras_serializable(package="test_export")
class _ResidualBlock(keras.layers.Layer):
    """A user's own block (rebuilt as its class by ``prune_model``), defined in a module another process imports."""

    def __init__(self, units, width, **kwargs):
        super().__init__(**kwargs)
        self.units, self.width = units, width
        self.inner = keras.layers.Dense(units, activation="relu")
        self.outer = keras.layers.Dense(width)

    def call(self, x):
        return x + self.outer(self.inner(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units, "width": self.width}


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the serving formats come from a TensorFlow-backend "
                    "process on PyTorch only (and ONNX and int8 on JAX)")
def test_a_model_with_a_users_own_block_exports_its_serving_formats_from_another_process(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="SavedModel needs TensorFlow")
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(2)(_ResidualBlock(8, 6, name="block")(keras.layers.Dense(6)(inputs))))
    kernel, bias = model.get_layer("block").outer.get_weights()
    kernel[4:] = 0.0
    model.get_layer("block").outer.set_weights([kernel, bias])
    result = export_pruned(model, tmp_path / "out", formats=("saved_model", "keras", "tflite"))
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    expected = keras.ops.convert_to_numpy(_thresholded(model)(x))
    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    np.testing.assert_allclose(served(features=tf.constant(x))["output_0"].numpy(), expected, atol=1e-5)
    loaded = keras.saving.load_model(result.paths["keras"])  # the .keras file keeps the user's class
    assert isinstance(loaded.get_layer("block"), _ResidualBlock) and loaded.get_layer("block").units == 4


def test_a_failed_export_leaves_no_folder_it_made(tmp_path, monkeypatch):
    def fail_to_build(*args, **kwargs):
        raise RuntimeError("the build failed")

    monkeypatch.setattr(export_module, "_build", fail_to_build)
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError, match="the build failed"):
        export_pruned(_sparse_model(), tmp_path / "kept" / "new" / "deeper" / "out", formats=("keras",))
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_a_model_with_dict_outputs_names_them_in_the_manifest_and_is_refused_for_onnx(tmp_path):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5, activation="relu")(inputs)
    model = keras.Model(inputs, {"b": keras.layers.Dense(3, name="b")(hidden),
                                 "a": keras.layers.Dense(2, name="a")(hidden)})
    result = export_pruned(model, tmp_path / "out", formats=("keras",))
    assert "serving" not in result.manifest
    if keras.backend.backend() == "tensorflow":
        served = export_pruned(model, tmp_path / "served", formats=("saved_model",)).manifest["serving"]
        assert (served["output"], served["outputs"]) == ("a", ["a", "b"])
    with pytest.raises(InvalidParameterError, match=re.escape(
            "export_pruned: argument `formats` must be formats without 'onnx' for a model whose outputs are a dict "
            "(they are checked output by output against a list; the other formats take a dict); received "
            "('onnx',) for a model with outputs a, b.")):
        export_pruned(model, tmp_path / "onnx", formats=("onnx",))
    assert sorted(os.listdir(tmp_path)) == (["out", "served"] if keras.backend.backend() == "tensorflow" else ["out"])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="on JAX and PyTorch the converter runs in a TensorFlow process of its own")
def test_a_converter_error_is_a_runtime_error_naming_the_file_and_the_command_says_it_in_one_message(
        tmp_path, monkeypatch, capsys):
    import tensorflow as tf

    from keras_group_lasso.cli import main

    class ConverterError(Exception):  # TensorFlow Lite's own kind derives from Exception only
        pass

    class Failing:
        def convert(self):
            raise ConverterError("<unknown>:0: error: 'tf.Op' op is neither a custom op nor a flex op\n" * 20)

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", lambda *args, **kwargs: Failing())
    with pytest.raises(RuntimeError) as info:
        export_pruned(_sparse_model(), tmp_path / "out", formats=("saved_model", "tflite"))
    said = str(info.value)
    assert said.startswith("export_pruned: TensorFlow Lite could not convert the pruned model to model.tflite "
                           "(ConverterError): <unknown>:0: error: 'tf.Op' op is neither")
    assert said.endswith("... (8 more lines)") and isinstance(info.value.__cause__, ConverterError)
    assert os.listdir(tmp_path) == []
    _sparse_model().save(tmp_path / "m.keras")
    assert main(["prune", str(tmp_path / "m.keras"), str(tmp_path / "out"), "--formats", "tflite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("keras-group-lasso prune: error: export_pruned: TensorFlow Lite could not convert")
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="on JAX and PyTorch the converter runs in a TensorFlow process of its own")
def test_a_recurrent_layer_over_sequences_of_unknown_length_keeps_tensorflow_ops_in_tflite_and_says_so(tmp_path):
    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.LSTM(3)(inputs)))
    with pytest.warns(UserWarning, match=r"keeps TensorFlow ops for its recurrent layers .*\(SELECT_TF_OPS\)"):
        result = export_pruned(model, tmp_path / "out", formats=("saved_model", "tflite"))
    assert os.path.getsize(result.paths["tflite"]) > 0

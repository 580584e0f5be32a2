"""export_pruned's deployment formats: ONNX checked in ONNX Runtime, full-integer TFLite measured; the CLI."""

import json
import os
import sys
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import InvalidParameterError, export_pruned, prune_model
from keras_group_lasso import export as export_module
from keras_group_lasso.cli import main

tf = pytest.importorskip("tensorflow", reason="ONNX and TFLite are converted by TensorFlow")
onnxruntime = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytest.importorskip("tf2onnx", reason="the onnx extra is not installed")

THRESHOLD = 1e-3
# The checks run in the calling process on every backend; on JAX and PyTorch each export also starts a
# TensorFlow process to convert, so the tests that only add another way to fail run on TensorFlow.
SAME_ON_EVERY_BACKEND = "the same code on every backend; covered on TensorFlow, where no child process is started"
DEAD_FEATURES = (0, 3, 7)


def _mlp():
    """10 -> 8 -> 3 classifier with input features 0, 3 and 7 and hidden units 1 and 5 dead."""
    rng = np.random.default_rng(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(3, activation="softmax", name="output")])
    w1 = rng.normal(size=(10, 8)).astype("float32")
    w1[list(DEAD_FEATURES)] = 0.0
    w2 = rng.normal(size=(8, 3)).astype("float32")
    w2[[1, 5]] = 0.0
    model.get_layer("hidden").set_weights([w1, rng.normal(size=8).astype("float32") * 0.1])
    model.get_layer("output").set_weights([w2, np.zeros(3, "float32")])
    return model


def _cnn():
    """12x12x1 -> conv 4 -> pool -> conv 6 -> global pool -> 5, with filters 1 and 2 of the first conv dead."""
    keras.utils.set_random_seed(1)  # a module fixture builds it, before the per-test seeding
    model = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(4, 3, activation="relu", name="c1"),
                              keras.layers.MaxPooling2D(), keras.layers.Conv2D(6, 3, activation="relu", name="c2"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5, name="out")])
    kernel, bias = model.get_layer("c2").get_weights()
    kernel[:, :, [1, 2], :] = 0.0
    model.get_layer("c2").set_weights([kernel, bias])
    return model


def _pruned_outputs(model, x):
    return keras.ops.convert_to_numpy(prune_model(model, THRESHOLD)(x))


def _onnx_outputs(path, x):
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [node.name for node in session.get_inputs()] == ["features"]
    return session.run(None, {"features": x})[0]


def _int8_outputs(path, x):
    """Run the int8 TFLite file on float ``x``: quantize the inputs, dequantize the outputs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*tf.lite.Interpreter is deprecated")
        interpreter = tf.lite.Interpreter(model_path=path)
    runner = interpreter.get_signature_runner("serving_default")
    inp, out = runner.get_input_details()["features"], runner.get_output_details()["output_0"]
    assert inp["dtype"] == np.int8 and out["dtype"] == np.int8  # integer in and out: whole-integer model
    scale, zero_point = inp["quantization"]
    q = np.clip(np.round(x / scale) + zero_point, -128, 127).astype(np.int8)
    got = runner(features=q)["output_0"]
    scale, zero_point = out["quantization"]
    return (got.astype("float64") - zero_point) * scale


@pytest.fixture(scope="module")
def mlp_export(tmp_path_factory):
    model = _mlp()
    x = np.random.default_rng(2).normal(size=(64, 10)).astype("float32")
    directory = tmp_path_factory.mktemp("deploy") / "mlp"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_pruned(model, directory, threshold=THRESHOLD, representative_data=x,
                               formats=("keras", "tflite", "onnx", "tflite-int8"))
    return model, x, directory, result, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def cnn_export(tmp_path_factory):
    """The CNN, with its representative data as an iterable of batches and the int8 warning made to fire."""
    model = _cnn()
    x = np.random.default_rng(3).normal(size=(48, 12, 12, 1)).astype("float32")
    directory = tmp_path_factory.mktemp("deploy") / "cnn"
    batches = (x[i:i + 16] for i in range(0, len(x), 16))
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(export_module, "INT8_MEAN_ERROR_WARNING", 0.0)  # any error at all warns
        result = export_pruned(model, directory, threshold=THRESHOLD, representative_data=batches,
                               formats=("onnx", "tflite-int8"))
    return model, x, directory, result, [str(w.message) for w in caught]


# ----------------------------------------------------------------------------- ONNX


@pytest.mark.parametrize("which", ["mlp", "cnn"])
def test_onnx_gives_the_pruned_models_outputs(which, mlp_export, cnn_export):
    model, x, _, result, _ = {"mlp": mlp_export, "cnn": cnn_export}[which]
    fresh = np.random.default_rng(9).normal(size=(7,) + x.shape[1:]).astype("float32")
    np.testing.assert_allclose(_onnx_outputs(result.paths["onnx"], fresh), _pruned_outputs(model, fresh),
                               atol=1e-5)
    record = result.manifest["onnx"]
    assert record["opset"] == export_module.ONNX_OPSET
    assert (record["inputs"], record["outputs"]) == (["features"], ["output_0"])
    assert record["checked_rows"] == len(x)  # the representative data, all of it
    assert 0.0 <= record["max_abs_error"] <= record["tolerance"]


def test_onnx_is_checked_on_generated_inputs_without_representative_data(tmp_path, mlp_export):
    if keras.backend.backend() != "tensorflow":
        pytest.skip(SAME_ON_EVERY_BACKEND)
    result = export_pruned(_mlp(), tmp_path / "out", threshold=THRESHOLD, formats=("onnx",))
    assert result.manifest["onnx"]["checked_rows"] == 8
    assert sorted(os.listdir(tmp_path / "out")) == ["manifest.json", "model.onnx"]


def _token_model(rows):
    """Token ids (5 of them, int32) -> an embedding of ``rows`` rows -> 6 -> 3."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((5,), dtype="int32")
    hidden = keras.layers.Dense(6, activation="relu")(keras.layers.Flatten()(keras.layers.Embedding(rows, 4)(tokens)))
    return keras.Model(tokens, keras.layers.Dense(3)(hidden))


def test_an_integer_input_is_checked_on_indices_its_embedding_holds(tmp_path):
    # One row in the table: the generated check inputs must be index 0 (floats cast to int reached -1 and 1,
    # and ONNX Runtime refused the file of a model it runs well).
    if keras.backend.backend() != "tensorflow":
        pytest.skip(SAME_ON_EVERY_BACKEND)
    result = export_pruned(_token_model(1), tmp_path / "out", formats=("onnx",))
    assert result.manifest["onnx"]["checked_rows"] == 8
    assert result.manifest["onnx"]["max_abs_error"] <= result.manifest["onnx"]["tolerance"]
    ids = np.zeros((2, 5), "float32")  # the serving signature of a one-input model takes float32 and casts
    np.testing.assert_allclose(_onnx_outputs(result.paths["onnx"], ids), _pruned_outputs(_token_model(1), ids),
                               atol=1e-5)


def test_data_onnx_runtime_cannot_run_is_an_error_naming_the_file_and_nothing_is_written(tmp_path):
    if keras.backend.backend() != "tensorflow":
        pytest.skip(SAME_ON_EVERY_BACKEND)
    ids = np.full((4, 5), 7, "int32")  # past the 3 rows of the embedding's table
    with pytest.raises(RuntimeError, match=r"^export_pruned: model.onnx does not run in ONNX Runtime on 4 rows of "
                       r"the representative data \(features: float32 \(4, 5\)\): .*indices.*; nothing was written$"):
        export_pruned(_token_model(3), tmp_path / "out", formats=("onnx",), representative_data=ids)
    assert os.listdir(tmp_path) == []


def test_an_onnx_file_that_does_not_match_is_an_error_and_nothing_is_written(tmp_path, monkeypatch):
    if keras.backend.backend() != "tensorflow":
        pytest.skip(SAME_ON_EVERY_BACKEND)
    monkeypatch.setattr(export_module, "ONNX_TOLERANCE", -1.0)  # nothing passes
    with pytest.raises(RuntimeError, match=r"^export_pruned: model.onnx does not give the pruned Keras model's "
                       r"outputs in ONNX Runtime: max \|onnx - keras\| = \S+ on 8 rows, over the tolerance -1 "
                       r"\(-1 x max\(1, max \|keras\|\)\); nothing was written$"):
        export_pruned(_mlp(), tmp_path / "out", formats=("onnx",))
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- int8


@pytest.mark.parametrize("which", ["mlp", "cnn"])
def test_int8_error_is_measured_and_reported(which, mlp_export, cnn_export):
    model, x, _, result, _ = {"mlp": mlp_export, "cnn": cnn_export}[which]
    record = result.manifest["tflite_int8"]
    measured = record["error_on_representative_data"]
    want = _pruned_outputs(model, x).astype("float64")
    got = _int8_outputs(result.paths["tflite-int8"], x)
    error = np.abs(got - want)
    scale = np.abs(want).max()
    assert measured["rows"] == len(x)
    np.testing.assert_allclose(measured["output_scale"], scale, rtol=1e-5)
    np.testing.assert_allclose(measured["max_relative_error"], error.max() / scale, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(measured["mean_relative_error"], error.mean() / scale, rtol=1e-3, atol=1e-6)
    assert measured["mean_relative_error"] < export_module.INT8_MEAN_ERROR_WARNING  # int8 is close here
    agreement = np.mean(np.argmax(got, 1) == np.argmax(want, 1))
    assert measured["argmax_agreement"] == pytest.approx(agreement)
    assert record["inputs"]["features"]["dtype"] == "int8"
    assert record["outputs"]["output_0"]["dtype"] == "int8"
    assert record["warn_above_mean_relative_error"] == {"mlp": 0.05, "cnn": 0.0}[which]  # 0 made the CNN's warn
    assert record["warn_below_argmax_agreement"] == 0.95


def test_an_int8_model_close_to_the_float_one_does_not_warn(mlp_export):
    assert not [m for m in mlp_export[4] if m.startswith("export_pruned")]


def test_an_int8_error_past_the_threshold_warns(cnn_export):
    measured = cnn_export[3].manifest["tflite_int8"]["error_on_representative_data"]
    ours = [m for m in cnn_export[4] if m.startswith("export_pruned")]
    assert ours == [
        ("export_pruned: the int8 model is far from the float one on the representative data: mean |int8 - float| "
        f"= {measured['mean_relative_error']:.1%} of the output scale (warns above 0%), argmax agreement "
        f"{measured['argmax_agreement']:.1%} (warns below 95%); give more representative data, or serve the "
        "float model.tflite")
    ]


# ----------------------------------------------------------------------------- files and manifest


def test_manifest_records_every_file_with_its_size(mlp_export, cnn_export):
    for _, _, directory, result, _ in (mlp_export, cnn_export):
        with open(directory / "manifest.json") as f:
            assert json.load(f) == result.manifest
        names = sorted(result.manifest["formats"].values())
        assert sorted(os.listdir(directory)) == sorted(names + ["manifest.json"])  # no hidden leftovers
        assert result.manifest["file_sizes"] == {name: os.path.getsize(directory / name) for name in names}
    assert mlp_export[3].manifest["formats"] == {
        "keras": "model.keras", "tflite": "model.tflite", "onnx": "model.onnx", "tflite-int8": "model_int8.tflite"}
    assert set(mlp_export[3].paths) == {"keras", "tflite", "onnx", "tflite-int8", "manifest"}


# ----------------------------------------------------------------------------- bad input

RECEIVED_SHAPE = "array of the exported model's inputs, shape (n, 10), or an iterable of such batches"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"formats": ("tflite-int8",)},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            "array of the exported model's inputs, a list or dict of arrays (one per input) or an iterable of "
            "such batches; received None."),
        ),
        (
            {"formats": ("keras",), "representative_data": np.zeros((4, 10), "float32")},
            ("export_pruned: argument `representative_data` must be None unless formats holds 'tflite-int8' or "
            "'onnx'; received an array of shape (4, 10)."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": np.zeros((4, 7), "float32")},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an array of shape (4, 7)."),
        ),
        (
            {"formats": ("onnx",), "representative_data": np.zeros((4, 10, 1), "float32")},
            ("export_pruned: argument `representative_data` must be a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an array of shape (4, 10, 1)."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": np.zeros((0, 10), "float32")},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an array of shape (0, 10)."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": np.full((2, 10), np.nan, "float32")},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an array of shape (2, 10)."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": [np.zeros((4, 10), "float32"),
                                                                  np.zeros((4, 9), "float32")]},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an iterable whose batch 1 is "
            "an array of shape (4, 9)."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": iter([])},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an empty iterable."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": "x.npy"},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received a str."),
        ),
        (
            {"formats": ("tflite-int8",), "representative_data": {"pixels": np.zeros((4, 10), "float32")}},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received a dict of 'pixels': an "
            "array of shape (4, 10)."),
        ),
        (  # finite as float64, infinite as the float32 the model takes (the converter crashed on it)
            {"formats": ("tflite-int8",), "representative_data": np.full((2, 10), 1e300)},
            ("export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received values that are not finite as "
            "float32 (|x| up to 1e+300)."),
        ),
        (  # a cast would drop the imaginary part
            {"formats": ("onnx",), "representative_data": np.ones((2, 10), "complex64")},
            ("export_pruned: argument `representative_data` must be a NumPy "
            f"{RECEIVED_SHAPE}, of finite numbers and at least one row; received an array of shape (2, 10)."),
        ),
    ],
    ids=["missing", "unused", "features", "rank", "empty", "nan", "batch", "no-batch", "str", "dict-name",
         "float32-overflow", "complex"],
)
def test_bad_representative_data(tmp_path, kwargs, message):
    with pytest.raises(InvalidParameterError) as info:
        export_pruned(_mlp(), tmp_path / "out", **kwargs)
    assert str(info.value) == message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("missing", ["tf2onnx", "onnxruntime", "onnx"])
def test_missing_onnx_tools_name_the_extra(tmp_path, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` fails, as without the extra
    with pytest.raises(ImportError) as info:
        export_pruned(_mlp(), tmp_path / "out", formats=("onnx", "keras"))
    assert str(info.value) == (
        f"export_pruned: the 'onnx' format needs onnx, onnxruntime and tf2onnx installed (missing: {missing}); "
        'install them with `pip install "keras-group-lasso[onnx]"`.'
    )
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- command line


def test_cli_writes_onnx_and_int8_from_a_npy_file(tmp_path, capsys):
    if keras.backend.backend() != "tensorflow":
        pytest.skip(SAME_ON_EVERY_BACKEND)
    _mlp().save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", np.random.default_rng(4).normal(size=(32, 10)).astype("float32"))
    out = tmp_path / "out"
    code = main(["prune", str(tmp_path / "m.keras"), str(out), "--formats", "onnx", "tflite-int8",
                 "--representative", str(tmp_path / "x.npy")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(os.listdir(out)) == ["manifest.json", "model.onnx", "model_int8.tflite"]
    for name, size in manifest["file_sizes"].items():
        assert f"{out / name}  ({size} bytes)" in captured.out
    assert manifest["onnx"]["checked_rows"] == 32
    measured = manifest["tflite_int8"]["error_on_representative_data"]
    assert (f"int8    mean |int8 - float| {measured['mean_relative_error']:.2%}, max "
            f"{measured['max_relative_error']:.2%} of the output scale on 32 rows, argmax agreement "
            f"{measured['argmax_agreement']:.2%}") in captured.out


def test_cli_int8_without_representative_data_is_an_error(tmp_path, capsys):
    _mlp().save(tmp_path / "m.keras")
    code = main(["prune", str(tmp_path / "m.keras"), str(tmp_path / "out"), "--formats", "tflite-int8"])
    assert code == 2  # a usage error, before the model loads
    assert capsys.readouterr().err == (
        "keras-group-lasso prune: error: argument `--representative` must be given with --formats tflite-int8: a "
        ".npy or .npz file of the exported model's inputs to calibrate on; received None.\n"
    )
    assert not (tmp_path / "out").exists()


def test_cli_unreadable_representative_file_is_an_error(tmp_path, capsys):
    _mlp().save(tmp_path / "m.keras")
    (tmp_path / "x.npy").write_text("not an array")
    code = main(["prune", str(tmp_path / "m.keras"), str(tmp_path / "out"), "--formats", "tflite-int8",
                 "--representative", str(tmp_path / "x.npy")])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"keras-group-lasso prune: error: cannot read --representative {str(tmp_path / 'x.npy')!r}: ")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- several inputs


def test_a_model_with_several_inputs_takes_its_data_by_input_name(tmp_path):
    from test_tabular import tabular

    rng = np.random.default_rng(0)
    model = tabular(rng, 4, [5, 6], [2, 3], [6])
    kernel, bias = model.get_layer("h0").get_weights()
    kernel[[1, 3]] = 0.0
    kernel[4:6] = 0.0  # nobody reads cat0
    model.get_layer("h0").set_weights([kernel, bias])
    data = {"numeric": rng.normal(size=(40, 4)).astype("float32"),
            "cat0": rng.integers(0, 5, (40, 1)).astype("int32"),  # an input the selected model drops: ignored
            "cat1": rng.integers(0, 6, (40, 1)).astype("int32")}
    result = export_pruned(model, tmp_path / "out", inputs="selected", formats=("onnx", "tflite-int8"),
                           representative_data={**data, "numeric": data["numeric"][:, [0, 2]]})
    assert result.manifest["onnx"]["inputs"] == ["numeric", "cat1"]
    session = onnxruntime.InferenceSession(result.paths["onnx"], providers=["CPUExecutionProvider"])
    got = session.run(["output_0"], {"numeric": data["numeric"][:, [0, 2]], "cat1": data["cat1"]})[0]
    small = prune_model(model, THRESHOLD, inputs="selected")
    want = keras.ops.convert_to_numpy(small([data["numeric"][:, [0, 2]], data["cat1"]]))
    np.testing.assert_allclose(got, want, atol=1e-5)
    record = result.manifest["tflite_int8"]
    assert [(name, q["dtype"]) for name, q in record["inputs"].items()] == [("numeric", "int8"), ("cat1", "int32")]
    assert record["error_on_representative_data"]["mean_relative_error"] < 0.05


def test_a_model_with_several_inputs_refuses_a_list_of_the_wrong_length(tmp_path):
    from test_tabular import tabular

    model = tabular(np.random.default_rng(0), 4, [5, 6], [2, 3], [6])
    with pytest.raises(InvalidParameterError) as info:
        export_pruned(model, tmp_path / "out", formats=("tflite-int8",),
                      representative_data=[np.zeros((4, 4), "float32"), np.zeros((4, 1), "int32")])
    assert str(info.value) == (
        "export_pruned: argument `representative_data` must be given for the 'tflite-int8' format: a list of "
        "arrays, one per input of the exported model in the order numeric (n, 4), cat0 (n, 1), cat1 (n, 1), or a "
        "dict of them by input name, or an iterable of such batches, of finite numbers and at least one row; "
        "received a list of 2 items (an array of shape (4, 4), an array of shape (4, 1))."
    )
    assert os.listdir(tmp_path) == []

"""Surgery: the pruned model computes what the thresholded original computes, output for output."""

import json

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from keras_group_lasso import (
    InvalidParameterError,
    SparseGroupLasso,
    UnsupportedModelError,
    apply_threshold,
    plan_pruning,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.analysis import dense_layers, get_layer
from keras_group_lasso.surgery import SelectFeatures
from _examples import examples

saved_model_export_in_process = pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="Keras writes a SavedModel from PyTorch only through torch_xla "
    "(export_pruned converts in a TensorFlow process there: tests/test_export.py)",
)
T = 1e-3
_ZEROS = {"kernel_initializer": "zeros"}  # every weight is set; avoids compiling random inits per shape on JAX


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _weights(model):
    return [w.copy() for w in model.get_weights()]


def _thresholded(model):
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    _refresh_normalization(clone)
    apply_threshold(clone, T)
    return clone


def _refresh_normalization(model):
    # set_weights leaves a Normalization's cached mean and variance behind its variables.
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            _refresh_normalization(layer)
        elif isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()


def _assert_same_outputs(model, small, x, inputs="original"):
    expected = _numpy(_thresholded(model)(x, training=False))
    if inputs == "selected":
        x = x.reshape(len(x), -1)[:, list(small.kept_features)]
    got = _numpy(small(x, training=False))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _mlp(kernels, biases, activation="relu", between=None, functional=False):
    inp = keras.Input((kernels[0].shape[0],), name="features")
    layers = []
    for i, k in enumerate(kernels):
        last = i == len(kernels) - 1
        layers.append(keras.layers.Dense(k.shape[1], activation=None if last else activation, name=f"d{i}", **_ZEROS))
        if not last and between:
            layers.append(between())
    if functional:
        x = inp
        for layer in layers:
            x = layer(x)
        model = keras.Model(inp, x, name="mlp")
    else:
        model = keras.Sequential([inp] + layers, name="mlp")
    for i, (k, b) in enumerate(zip(kernels, biases)):
        model.get_layer(f"d{i}").set_weights([np.asarray(k, "float32"), np.asarray(b, "float32")])
    return model


# ----------------------------------------------------------------------------- known answers


@pytest.mark.quick
def test_known_mlp_sizes_weights_and_attributes():
    rng = np.random.default_rng(0)
    w0 = rng.uniform(0.5, 1.0, (5, 4))
    w1 = rng.uniform(0.5, 1.0, (4, 3))
    w2 = rng.uniform(0.5, 1.0, (3, 2))
    w0[[1, 3]] = 5e-4  # features 1 and 3: only sub-threshold weights
    w1[2] = 0.0  # d0 unit 2 unused
    w2[0] = 0.0  # d1 unit 0 unused
    model = _mlp([w0, w1, w2], [np.full(4, 0.1), np.full(3, 0.2), np.full(2, 0.3)])
    before = _weights(model)
    small = prune_model(model, threshold=T)

    assert isinstance(small, keras.Sequential)
    assert small.name == "mlp"
    assert small.kept_features == (0, 2, 4)
    assert small.pruning_report == sparsity_report(model, T)
    # 3 of 5 features kept: the first Dense keeps zero rows for the other 2 (no gather).
    assert [layer.name for layer in small.layers] == ["d0", "d1", "d2"]
    assert [small.get_layer(f"d{i}").units for i in range(3)] == [3, 2, 2]
    expected_kernel = w0[:, [0, 1, 3]].astype("float32")
    expected_kernel[[1, 3]] = 0.0
    np.testing.assert_array_equal(small.get_layer("d0").get_weights()[0], expected_kernel)
    np.testing.assert_array_equal(small.get_layer("d1").get_weights()[1], np.full(2, 0.2, "float32"))
    assert small.get_layer("d0").activation is model.get_layer("d0").activation
    _assert_same_outputs(model, small, rng.normal(size=(9, 5)).astype("float32"))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # the user's model is not even thresholded

    selected = prune_model(model, threshold=T, inputs="selected")
    assert selected.inputs[0].shape == (None, 3)
    assert [layer.name for layer in selected.layers] == ["d0", "d1", "d2"]
    np.testing.assert_array_equal(selected.get_layer("d0").get_weights()[0], w0[[0, 2, 4]][:, [0, 1, 3]].astype("float32"))
    _assert_same_outputs(model, selected, rng.normal(size=(9, 5)).astype("float32"), "selected")


def test_constant_unit_is_folded_into_the_next_bias():
    # d0 unit 1 has no incoming weight: it outputs relu(b) = 0.7 whatever the input.
    w0 = np.array([[1.0, 0.0], [2.0, 0.0]])
    w1 = np.array([[1.0], [3.0]])
    model = _mlp([w0, w1], [np.array([0.1, 0.7]), np.array([0.5])])
    small = prune_model(model, threshold=T)
    assert small.get_layer("d0").units == 1
    kernel, bias = small.get_layer("d1").get_weights()
    np.testing.assert_allclose(kernel, [[1.0]])
    np.testing.assert_allclose(bias, [0.5 + 3.0 * 0.7], rtol=1e-6)
    assert small.pruning_plan.dense[0].folded_units == (1,)
    _assert_same_outputs(model, small, np.random.default_rng(0).normal(size=(6, 2)).astype("float32"))


def test_constant_unit_through_batchnorm_and_a_layer_without_bias():
    inp = keras.Input((3,))
    x = keras.layers.Dense(3, activation="tanh", name="d0", **_ZEROS)(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Dense(2, use_bias=False, activation="sigmoid", name="d1", **_ZEROS)(x)
    out = keras.layers.Dense(2, name="d2", **_ZEROS)(x)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(3, 3))
    w0[:, 0] = 0.0  # constant unit, but d1 has no bias to fold it into: it stays
    model.get_layer("d0").set_weights([w0, rng.normal(size=3)])
    model.get_layer("bn").set_weights([rng.uniform(0.5, 2, 3), rng.normal(size=3), rng.normal(size=3), rng.uniform(0.5, 2, 3)])
    w1 = rng.normal(size=(3, 2))
    w1[:, 1] = 0.0  # constant sigmoid(0) = 0.5 (d1 has no bias), folded into d2's bias
    model.get_layer("d1").set_weights([w1])
    model.get_layer("d2").set_weights([rng.normal(size=(2, 2)), rng.normal(size=2)])
    small = prune_model(model, threshold=T)
    assert small.pruning_report.layer_sizes == (3, 3, 1)
    assert small.get_layer("d1").use_bias is False
    _assert_same_outputs(model, small, rng.normal(size=(7, 3)).astype("float32"))


def test_batchnorm_before_the_first_dense_is_sliced_by_feature():
    inp = keras.Input((4,))
    x = keras.layers.BatchNormalization(name="bn_in")(inp)
    out = keras.layers.Dense(2, name="d0", **_ZEROS)(x)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(2)
    model.get_layer("bn_in").set_weights([rng.uniform(0.5, 2, 4), rng.normal(size=4), rng.normal(size=4), rng.uniform(0.5, 2, 4)])
    w = rng.normal(size=(4, 2))
    w[1] = 0.0
    model.get_layer("d0").set_weights([w, rng.normal(size=2)])
    for inputs in ("original", "selected"):
        small = prune_model(model, threshold=T, inputs=inputs)
        assert small.get_layer("bn_in").get_weights()[0].shape == ((3,) if inputs == "selected" else (4,))
        _assert_same_outputs(model, small, rng.normal(size=(5, 4)).astype("float32"), inputs)


def test_image_input_through_flatten():
    model = keras.Sequential(
        [
            keras.Input((3, 4)),
            keras.layers.Activation("relu", name="pre"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(3, activation="elu", name="d0", **_ZEROS),
            keras.layers.Dense(2, name="d1", **_ZEROS),
        ]
    )
    rng = np.random.default_rng(3)
    w = rng.normal(size=(12, 3))
    w[[0, 4, 11]] = 0.0
    model.get_layer("d0").set_weights([w, rng.normal(size=3)])
    model.get_layer("d1").set_weights([rng.normal(size=(3, 2)), rng.normal(size=2)])
    x = rng.normal(size=(6, 3, 4)).astype("float32")
    small = prune_model(model, threshold=T)
    assert small.inputs[0].shape == (None, 3, 4)
    assert [layer.name for layer in small.layers] == ["pre", "flat", "d0", "d1"]
    _assert_same_outputs(model, small, x)
    selected = prune_model(model, threshold=T, inputs="selected")
    assert selected.inputs[0].shape == (None, 9)
    _assert_same_outputs(model, selected, x, "selected")


def _few_features_model(image=False):
    """24 features of which 2 survive: inputs="original" selects them with a frozen 0/1 Dense."""
    rng = np.random.default_rng(7)
    w0 = np.zeros((24, 3))
    w0[[5, 17]] = rng.normal(size=(2, 3))
    layers = [keras.layers.Flatten(name="flat")] if image else []
    layers += [
        keras.layers.Dense(3, activation="relu", name="d0", **_ZEROS),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Dense(2, name="d1", **_ZEROS),
    ]
    model = keras.Sequential([keras.Input((4, 6) if image else (24,))] + layers)
    model.get_layer("d0").set_weights([w0, rng.normal(size=3)])
    model.get_layer("bn").set_weights([rng.uniform(0.5, 2, 3), rng.normal(size=3), rng.normal(size=3), rng.uniform(0.5, 2, 3)])
    model.get_layer("d1").set_weights([rng.normal(size=(3, 2)), rng.normal(size=2)])
    return model


@pytest.mark.parametrize("image", [False, True])
def test_few_surviving_features_are_selected_by_a_frozen_dense(image):
    model = _few_features_model(image)
    small = prune_model(model, threshold=T)
    names = [layer.name for layer in small.layers]
    assert names == (["flat"] if image else []) + ["select_features", "d0", "bn", "d1"]
    select = small.get_layer("select_features")
    assert type(select) is keras.layers.Dense
    assert not select.trainable and not select.use_bias and select.activation is keras.activations.linear
    expected = np.zeros((24, 2), "float32")
    expected[[5, 17], [0, 1]] = 1.0
    np.testing.assert_array_equal(select.get_weights()[0], expected)
    assert small.get_layer("d0").get_weights()[0].shape == (2, 3)
    assert all(tuple(w.shape) != (24, 2) for w in small.trainable_weights)
    x = np.random.default_rng(0).normal(size=(5, 4, 6) if image else (5, 24)).astype("float32")
    _assert_same_outputs(model, small, x)
    # exact for finite inputs: the kept features pass unchanged, whatever their size
    flat = x.reshape(5, -1).copy()
    flat[:, 5], flat[:, 0], flat[:, 17] = 3e38, -3e38, 1.2345678e-30
    np.testing.assert_array_equal(_numpy(select(flat)), flat[:, [5, 17]])


def test_many_surviving_features_keep_zero_rows_instead():
    # 24 -> 3 units: selecting costs k * (24 + 3) multiply-adds, zero rows 24 * 3 = 72; k = 3 keeps rows.
    rng = np.random.default_rng(8)
    w0 = np.zeros((24, 3))
    w0[[1, 2, 3]] = rng.normal(size=(3, 3))
    model = _mlp([w0, rng.normal(size=(3, 2))], [rng.normal(size=3), rng.normal(size=2)])
    small = prune_model(model, T)
    assert [layer.name for layer in small.layers] == ["d0", "d1"]
    assert small.get_layer("d0").get_weights()[0].shape == (24, 3)
    _assert_same_outputs(model, small, rng.normal(size=(4, 24)).astype("float32"))


def test_keeps_dtype_policy_use_bias_and_names_and_drops_only_this_packages_penalties():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                3,
                activation="relu",
                kernel_regularizer=SparseGroupLasso(1e-3),
                bias_regularizer=keras.regularizers.L2(1e-2),
                activity_regularizer=keras.regularizers.L1(1e-3),
                name="a",
                dtype="mixed_float16",
                **_ZEROS,
            ),
            keras.layers.Dense(2, use_bias=False, name="b", **_ZEROS),
        ]
    )
    rng = np.random.default_rng(4)
    w = rng.normal(size=(4, 3))
    w[2] = 0.0
    model.get_layer("a").set_weights([w, rng.normal(size=3)])
    model.get_layer("b").set_weights([rng.normal(size=(3, 2))])
    small = prune_model(model, threshold=T)
    a, b = small.get_layer("a"), small.get_layer("b")
    assert a.dtype_policy.name == "mixed_float16"
    assert a.compute_dtype == "float16" and a.kernel.dtype == "float32"
    # a plain-Keras model: this package's penalty is left out, Keras's own are kept
    assert a.kernel_regularizer is None
    assert isinstance(a.bias_regularizer, keras.regularizers.L2) and a.bias_regularizer.l2 == pytest.approx(1e-2)
    assert isinstance(a.activity_regularizer, keras.regularizers.L1)
    assert model.get_layer("a").kernel_regularizer == SparseGroupLasso(1e-3)  # the user's model keeps it
    assert b.use_bias is False and b.dtype_policy.name == "float32"
    x = rng.normal(size=(5, 4)).astype("float32")
    expected = _numpy(_thresholded(model)(x)).astype("float32")
    np.testing.assert_allclose(_numpy(small(x)).astype("float32"), expected, atol=1e-2)


def test_plan_matches_report_and_is_json():
    rng = np.random.default_rng(5)
    w0 = rng.normal(size=(6, 4))
    w0[0] = 0.0
    w1 = rng.normal(size=(4, 2))
    w1[3] = 0.0
    model = _mlp([w0, w1], [rng.normal(size=4), rng.normal(size=2)], functional=True)
    plan = plan_pruning(model, T)
    report = sparsity_report(model, T)
    assert plan.layer_sizes_after == report.layer_sizes == (5, 3)
    assert plan.params_after == report.params_after == (5 + 1) * 3 + (3 + 1) * 2
    assert plan.kept_features == report.selected_features == (1, 2, 3, 4, 5)
    assert plan.dense[1].kept_inputs == (0, 1, 2)
    d = plan.to_dict()
    assert json.loads(json.dumps(d)) == d
    small = prune_model(model, T, inputs="selected")
    assert small.get_layer("d0").count_params() + small.get_layer("d1").count_params() == plan.params_after


# ----------------------------------------------------------------------------- input preprocessing


def _preprocessed(pre, shape=(6,), flatten_after=False, functional=False, seed=9):
    """``pre`` (a list of layers) at the input, then Dense 4 -> Dense 2; features 1 and 4 are dead."""
    rng = np.random.default_rng(seed)
    layers = list(pre) + ([keras.layers.Flatten(name="flat")] if flatten_after else [])
    layers += [keras.layers.Dense(4, activation="tanh", name="d0", **_ZEROS), keras.layers.Dense(2, name="d1", **_ZEROS)]
    inp = keras.Input(shape, name="features")
    if functional:
        x = inp
        for layer in layers:
            x = layer(x)
        model = keras.Model(inp, x, name="pre")
    else:
        model = keras.Sequential([inp] + layers, name="pre")
    n = int(np.prod(shape))
    w = rng.normal(size=(n, 4))
    w[[1, 4]] = rng.uniform(-T, T, (2, 4))
    model.get_layer("d0").set_weights([w, rng.normal(size=4)])
    model.get_layer("d1").set_weights([rng.normal(size=(4, 2)), rng.normal(size=2)])
    return model


def _adapted(layer, shape, seed=0):
    data = np.random.default_rng(seed).normal(3.0, 2.0, size=(32,) + shape).astype("float32")
    data *= np.random.default_rng(seed + 1).uniform(0.1, 10.0, size=shape).astype("float32")
    layer.adapt(data)
    return layer


@pytest.mark.parametrize(
    "make",
    [
        lambda: [_adapted(keras.layers.Normalization(name="norm"), (6,))],
        lambda: [keras.layers.Normalization(mean=np.arange(6.0), variance=np.arange(1.0, 7.0), name="norm")],
        lambda: [keras.layers.Normalization(axis=None, mean=2.0, variance=3.0, name="norm")],
        lambda: [keras.layers.Normalization(mean=[1.0, 2, 3, 4, 5, 6], variance=[2.0] * 6, invert=True, name="norm")],
        lambda: [keras.layers.Rescaling(1 / 255.0, offset=-0.5, name="scale")],
        lambda: [keras.layers.Rescaling(np.linspace(0.5, 3.0, 6).astype("float32"), offset=[1.0, 0, 0, 2, 0, 3], name="scale")],
        lambda: [keras.layers.Rescaling(2.0, name="scale"), _adapted(keras.layers.Normalization(name="norm"), (6,)), keras.layers.Dropout(0.3)],
    ],
)
@pytest.mark.parametrize("functional", [False, True])
def test_normalization_and_rescaling_at_the_input(make, functional):
    model = _preprocessed(make(), functional=functional)
    before = _weights(model)
    x = np.random.default_rng(10).normal(2.0, 3.0, size=(7, 6)).astype("float32")
    original = prune_model(model, T)
    assert [layer.name for layer in original.layers] == [layer.name for layer in model.layers]
    _assert_same_outputs(model, original, x)
    selected = prune_model(model, T, inputs="selected")
    assert selected.kept_features == (0, 2, 3, 5)
    _assert_same_outputs(model, selected, x, "selected")
    for layer in selected.layers:
        if isinstance(layer, keras.layers.Normalization):
            assert tuple(np.shape(layer.mean)) == (1, 4)
        if isinstance(layer, keras.layers.Rescaling) and np.ndim(layer.scale):
            assert np.shape(layer.scale) == (4,)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("axis", [-1, (1, 2), 1, None])
@pytest.mark.parametrize("inputs", ["original", "selected"])
def test_normalization_of_an_image_before_flatten(axis, inputs):
    # (3, 4) images: the statistics are per column, per pixel, per row or one scalar; Flatten
    # then gives 12 features, each with its own broadcast mean and variance.
    norm = _adapted(keras.layers.Normalization(axis=axis, name="norm"), (3, 4), seed=2)
    scale = keras.layers.Rescaling(np.array([1.0, 2.0, 0.5, 4.0], "float32"), name="scale")
    model = _preprocessed([norm, scale], shape=(3, 4), flatten_after=True)
    small = prune_model(model, T, inputs=inputs)
    x = np.random.default_rng(11).normal(3.0, 2.0, size=(6, 3, 4)).astype("float32")
    _assert_same_outputs(model, small, x, inputs)
    if inputs == "selected":
        assert small.inputs[0].shape == (None, 10)
        assert [layer.name for layer in small.layers] == ["norm", "scale", "d0", "d1"]


def test_normalization_before_the_selection_runs_on_every_feature():
    # Few survivors: the selection sits right before the first Dense, after the preprocessing.
    rng = np.random.default_rng(12)
    norm = _adapted(keras.layers.Normalization(name="norm"), (24,), seed=3)
    model = keras.Sequential(
        [keras.Input((24,)), norm, keras.layers.Dense(3, activation="relu", name="d0", **_ZEROS), keras.layers.Dense(2, name="d1", **_ZEROS)]
    )
    w0 = np.zeros((24, 3))
    w0[[2, 20]] = rng.normal(size=(2, 3))
    model.get_layer("d0").set_weights([w0, rng.normal(size=3)])
    model.get_layer("d1").set_weights([rng.normal(size=(3, 2)), rng.normal(size=2)])
    small = prune_model(model, T)
    assert [layer.name for layer in small.layers] == ["norm", "select_features", "d0", "d1"]
    _assert_same_outputs(model, small, rng.normal(size=(5, 24)).astype("float32"))


def test_normalization_and_rescaling_between_dense_layers_are_sliced_per_unit():
    rng = np.random.default_rng(13)
    inp = keras.Input((5,))
    x = keras.layers.Dense(4, activation="relu", name="d0", **_ZEROS)(inp)
    x = keras.layers.Normalization(name="norm")(x)
    x = keras.layers.Rescaling(np.array([1.0, 2.0, 3.0, 4.0], "float32"), offset=0.5, name="scale")(x)
    out = keras.layers.Dense(2, name="d1", **_ZEROS)(x)
    model = keras.Model(inp, out)
    w0 = rng.normal(size=(5, 4))
    w0[:, 1] = 0.0  # constant unit: relu(b) normalized and rescaled, folded into d1's bias
    w1 = rng.normal(size=(4, 2))
    w1[3] = 0.0  # unused unit
    model.get_layer("d0").set_weights([w0, rng.normal(size=4)])
    model.get_layer("norm").set_weights([rng.normal(size=4), rng.uniform(0.5, 2.0, 4), np.array(10)])
    _refresh_normalization(model)
    model.get_layer("d1").set_weights([w1, rng.normal(size=2)])
    small = prune_model(model, T)
    assert small.pruning_report.layer_sizes == (5, 2)
    np.testing.assert_array_equal(small.get_layer("scale").scale, [1.0, 3.0])
    _assert_same_outputs(model, small, rng.normal(size=(6, 5)).astype("float32"))


def test_rescaling_per_feature_under_channels_first_is_refused():
    previous = keras.config.image_data_format()
    keras.config.set_image_data_format("channels_first")
    try:
        model = _preprocessed([keras.layers.Rescaling([1.0] * 6, name="scale")])
        with pytest.raises(UnsupportedModelError) as info:
            prune_model(model, T)
    finally:
        keras.config.set_image_data_format(previous)
    assert str(info.value).startswith(
        "prune_model: cannot prune layer 'scale' (Rescaling): a Rescaling with a non-scalar scale or offset under channels_first."
    )


# ----------------------------------------------------------------------------- nested models


def _block(kind, layers, input_shape=None):
    if kind == "sequential":
        return keras.Sequential(layers, name="block")
    inp = keras.Input(input_shape, name="block_input")
    x = inp
    for layer in layers:
        x = layer(x)
    return keras.Model(inp, x, name="block")


@pytest.mark.parametrize("outer", ["sequential", "functional"])
@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_nested_block_is_pruned_as_part_of_the_chain(outer, kind):
    rng = np.random.default_rng(14)
    head = _block(kind, [keras.layers.Rescaling(0.5, name="scale"), keras.layers.Dense(5, activation="relu", name="d0", **_ZEROS), keras.layers.Dropout(0.2, name="drop")], (6,))
    inner = _block(kind, [keras.layers.Dense(4, activation="tanh", name="d1", **_ZEROS), keras.layers.BatchNormalization(name="bn")], (5,))
    inner.name = "inner"
    last = keras.layers.Dense(2, name="d2", **_ZEROS)
    if outer == "sequential":
        model = keras.Sequential([keras.Input((6,)), head, inner, last], name="outer")
    else:
        inp = keras.Input((6,), name="features")
        model = keras.Model(inp, last(inner(head(inp))), name="outer")
    w0 = rng.normal(size=(6, 5))
    w0[2] = 0.0
    w1 = rng.normal(size=(5, 4))
    w1[:, 0] = 0.0  # constant unit
    w1[3] = 0.0  # d0 unit 3 unused
    analysis_names = ("block/d0", "inner/d1", "d2")
    for name, weights in zip(analysis_names, ([w0, rng.normal(size=5)], [w1, rng.normal(size=4)], [rng.normal(size=(4, 2)), rng.normal(size=2)])):
        get_layer(model, name).set_weights(weights)
    get_layer(model, "inner/bn").set_weights([rng.uniform(0.5, 2, 4), rng.normal(size=4), rng.normal(size=4), rng.uniform(0.5, 2, 4)])
    before = _weights(model)

    report = sparsity_report(model, T)
    assert tuple(layer.name for layer in report.layers) == analysis_names
    assert [layer.role for layer in report.layers] == ["input", "hidden", "hidden"]
    assert report.layer_sizes == (5, 4, 3)
    x = rng.normal(size=(7, 6)).astype("float32")
    for inputs in ("original", "selected"):
        small = prune_model(model, T, inputs=inputs)
        names = [layer.name for layer in small.layers if not isinstance(layer, keras.layers.InputLayer)]
        assert names == ["scale", "d0", "drop", "d1", "bn", "d2"]
        assert isinstance(small, keras.Sequential) == (outer == "sequential")
        _assert_same_outputs(model, small, x, inputs)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_nested_functional_block_that_is_the_output_is_opened():
    # Keras numbers a nested functional model's call 1 in output_layers, 0 where a layer reads it.
    inner_input = keras.Input((3,))
    h = keras.layers.Dense(4, activation="relu", name="hidden")(inner_input)
    block = keras.Model(inner_input, keras.layers.Dense(2, name="out")(h), name="block")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, block(inputs))
    kernel, bias = model.get_layer("block").get_layer("hidden").get_weights()
    kernel[:, 1] = 0.0
    model.get_layer("block").get_layer("hidden").set_weights([kernel, bias])
    report = sparsity_report(model, T)
    assert [layer.name for layer in report.layers] == ["block/hidden", "block/out"]
    small = prune_model(model, T)
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    np.testing.assert_allclose(small.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-5)


def test_nested_layer_names_that_clash_are_qualified():
    inner = keras.Sequential([keras.layers.Dense(3, name="d", **_ZEROS)], name="block")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d", **_ZEROS), inner, keras.layers.Dense(2, name="out", **_ZEROS)])
    rng = np.random.default_rng(15)
    for w in model.weights:
        w.assign(rng.normal(size=tuple(w.shape)))
    assert dense_layers(model)[1] is inner.layers[0]
    small = prune_model(model, T)
    assert [layer.name for layer in small.layers] == ["d", "block_d", "out"]
    _assert_same_outputs(model, small, rng.normal(size=(3, 4)).astype("float32"))


# ----------------------------------------------------------------------------- saving


def _sparse_mlp():
    rng = np.random.default_rng(6)
    w0 = rng.normal(size=(6, 5))
    w0[[1, 4]] = 0.0
    w0[:, 3] = 0.0  # a constant unit
    w1 = rng.normal(size=(5, 3))
    w1[0] = 0.0
    return _mlp([w0, w1, rng.normal(size=(3, 2))], [rng.normal(size=5), rng.normal(size=3), rng.normal(size=2)])


@pytest.mark.quick
@pytest.mark.parametrize("inputs", ["original", "selected", "gather"])
def test_keras_file_round_trip_without_custom_objects(tmp_path, inputs):
    if inputs == "gather":
        small = prune_model(_few_features_model(), T)
    else:
        small = prune_model(_sparse_mlp(), T, inputs=inputs)
    path = str(tmp_path / "small.keras")
    small.save(path)
    loaded = keras.saving.load_model(path)
    x = np.random.default_rng(0).normal(size=(4, small.inputs[0].shape[1])).astype("float32")
    np.testing.assert_array_equal(_numpy(loaded(x)), _numpy(small(x)))
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in small.layers]


@saved_model_export_in_process
@pytest.mark.parametrize("make", [_sparse_mlp, _few_features_model])
def test_saved_model_export(tmp_path, make):
    tf = pytest.importorskip("tensorflow")
    small = prune_model(make(), T)
    small.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "sm"))
    x = np.random.default_rng(0).normal(size=(4, small.inputs[0].shape[1])).astype("float32")
    np.testing.assert_allclose(served.serve(x).numpy(), _numpy(small(x)), atol=1e-6)


def test_select_features_layer_still_loads_for_files_saved_before():
    layer = SelectFeatures([2, 0])
    np.testing.assert_array_equal(_numpy(layer(np.array([[1.0, 2.0, 3.0]], "float32"))), [[3.0, 1.0]])
    clone = SelectFeatures.from_config(layer.get_config())
    assert clone.indices == (2, 0)
    for bad in ([], [1, 1], [-1], [0.5], "ab"):
        with pytest.raises(InvalidParameterError) as info:
            SelectFeatures(bad)
        assert str(info.value) == (
            "SelectFeatures: argument `indices` must be a non-empty sequence of distinct integers >= 0; "
            f"received {bad!r}."
        )


# ----------------------------------------------------------------------------- refusals


def _residual():
    inp = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="d1")(inp)
    out = keras.layers.Dense(2, name="d2")(keras.layers.Add(name="residual")([inp, hidden]))
    return keras.Model(inp, out)


def _concat():
    inp = keras.Input((4,))
    a = keras.layers.Dense(3, name="a")(inp)
    b = keras.layers.Dense(3, name="b")(inp)
    out = keras.layers.Dense(2)(keras.layers.Concatenate(name="cat")([a, b]))
    return keras.Model(inp, out)


def _shared():
    shared = keras.layers.Dense(4, name="twice")
    inp = keras.Input((4,))
    return keras.Model(inp, keras.layers.Dense(2)(shared(shared(inp))))


def _two_outputs():
    inp = keras.Input((4,))
    h = keras.layers.Dense(4, name="trunk")(inp)
    return keras.Model(inp, [keras.layers.Dense(2)(h), keras.layers.Dense(1)(h)])


def _nested_twice():
    inner = keras.Sequential([keras.layers.Dense(4, name="d")], name="inner")
    inp = keras.Input((4,))
    return keras.Model(inp, keras.layers.Dense(2)(inner(inner(inp))))


def _seq(*middle):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d0"), *middle, keras.layers.Dense(2, name="out")])


@pytest.mark.quick
@pytest.mark.parametrize("make", [_residual, _concat, _two_outputs, lambda: _seq(keras.layers.Softmax(name="soft")),
                                  _shared],
                         ids=["residual", "concat", "two_outputs", "hidden_softmax", "shared"])
def test_branching_models_are_pruned_exactly(make):
    model = make()
    rng = np.random.default_rng(5)
    for layer in dense_layers(model):
        kernel, bias = layer.get_weights()
        kernel = rng.normal(size=kernel.shape) * (rng.random(kernel.shape[0]) > 0.3)[:, None]
        kernel[:, rng.random(kernel.shape[1]) < 0.3] = 0.0
        layer.set_weights([kernel, rng.normal(size=bias.shape) * (rng.random(bias.shape) < 0.5)])
    small = prune_model(model, T)
    x = rng.normal(size=(8, 4)).astype("float32")
    want = keras.tree.flatten(_thresholded(model)(x, training=False))
    got = keras.tree.flatten(small(x, training=False))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(_numpy(a), _numpy(b), rtol=1e-5, atol=1e-5)
    # (a frozen 0/1 selection in front of a shared layer is not counted: it holds no parameter to train)
    trainable = sum(int(np.prod(w.shape)) for w in small.trainable_weights)
    assert trainable <= model.count_params()


@pytest.mark.quick
@pytest.mark.parametrize(
    "make, name, cls",
    [
        (lambda: _seq(keras.layers.Reshape((2, 2), name="rs"), keras.layers.Flatten()), "rs", "Reshape"),
        (_nested_twice, "inner", "Sequential"),
        (lambda: _seq(keras.Sequential([keras.layers.Reshape((2, 2), name="rs"), keras.layers.Flatten()], name="inner")),
         "inner/rs", "Reshape"),
        (
            lambda: keras.Sequential([keras.Input((3, 4), batch_size=2), keras.layers.LSTM(4, stateful=True, name="lstm"),
                                      keras.layers.Dense(2)]),
            "lstm",
            "LSTM",
        ),
        (
            lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax", name="mix"), keras.layers.Dense(2)]),
            "mix",
            "Dense",
        ),
    ],
)
def test_unsupported_models_raise_naming_the_layer(make, name, cls):
    model = make()
    before = _weights(model)
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert str(info.value).startswith(f"prune_model: cannot prune layer '{name}' ({cls}): ")
    assert str(info.value).endswith("The supported layers are listed under 'Supported layers' in the README (and "
                                    "in keras_group_lasso.surgery.SUPPORTED); teach a layer of your own with "
                                    "keras_group_lasso.graph.register_layer.")
    assert len(str(info.value).splitlines()) <= 3 and "Sequential or functional models" in info.value.supported
    assert info.value.layer_name == name and info.value.layer_class == cls
    assert isinstance(info.value, ValueError)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(UnsupportedModelError):
        plan_pruning(model, T)


def test_everything_pruned_is_a_clear_error():
    model = _mlp([np.full((3, 2), 1e-4), np.ones((2, 1))], [np.zeros(2), np.zeros(1)])
    with pytest.raises(InvalidParameterError) as info:
        prune_model(model, T)
    assert str(info.value).startswith("prune_model: argument `threshold` must be small enough to leave a path")
    assert str(info.value).endswith("at threshold 0, 3 of 3 features reach it); received 0.001.")


_NO_PATH = (
    "{owner}: argument `model` must be a model with a path of non-zero weights from an input feature to the "
    "output (in this one {cause}, so no input feature reaches its output at any threshold, which is a constant "
    "or, after a masked recurrent layer, depends on the sequence lengths only: there is nothing to prune to); "
    "received <{model}, built=True>."
)


@pytest.mark.parametrize("threshold", [0.0, T])
@pytest.mark.parametrize("owner", ["prune_model", "plan_pruning"])
def test_a_model_without_a_live_path_is_blamed_not_the_threshold(owner, threshold):
    call = prune_model if owner == "prune_model" else plan_pruning
    dead_first = _mlp([np.zeros((3, 2)), np.ones((2, 1))], [np.ones(2), np.zeros(1)])
    with pytest.raises(InvalidParameterError) as info:
        call(dead_first, threshold)
    assert str(info.value) == _NO_PATH.format(owner=owner, cause="every kernel weight of 'd0' is 0",
                                              model="Sequential name=mlp")
    # Feature paths reach unit 0 of d0 only, and only unit 1 reaches the output.
    broken_chain = _mlp([np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[0.0], [1.0]])], [np.zeros(2), np.zeros(1)])
    with pytest.raises(InvalidParameterError) as info:
        call(broken_chain, threshold)
    assert str(info.value) == _NO_PATH.format(
        owner=owner, cause="each path of non-zero weights from an input feature stops before the output",
        model="Sequential name=mlp")


def test_a_masked_recurrent_layer_without_weights_is_refused_as_reading_the_lengths_only():
    # all-zero kernels: the LSTM's state moves with its bias at each unmasked step, so its output depends on the
    # sequence lengths (the mask) and on no token
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(20, 4, mask_zero=True, name="emb")(tokens)
    model = keras.Model(tokens, keras.layers.Dense(2, name="out")(keras.layers.LSTM(3, name="lstm")(embedded)),
                        name="masked")
    lstm = model.get_layer("lstm")
    lstm.set_weights([np.zeros_like(w) for w in lstm.get_weights()[:2]] + [np.full(12, 0.3, "float32")])
    short, long = np.array([[5, 6, 0, 0]]), np.array([[5, 6, 7, 0]])
    assert not np.allclose(keras.ops.convert_to_numpy(model(short)), keras.ops.convert_to_numpy(model(long)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(short)),
                               keras.ops.convert_to_numpy(model(np.array([[9, 3, 0, 0]]))), atol=1e-6)
    with pytest.raises(InvalidParameterError) as info:
        prune_model(model)
    assert str(info.value) == _NO_PATH.format(owner="prune_model", cause="every kernel weight of 'lstm' is 0",
                                              model="Functional name=masked")


def test_bad_arguments():
    model = _sparse_mlp()
    with pytest.raises(InvalidParameterError) as info:
        prune_model(model, T, inputs="all")
    assert str(info.value) == "prune_model: argument `inputs` must be one of 'original', 'selected'; received 'all'."
    with pytest.raises(InvalidParameterError) as info:
        prune_model(model, -1.0)
    assert str(info.value) == "prune_model: argument `threshold` must be a finite number >= 0; received -1.0."
    with pytest.raises(InvalidParameterError) as info:
        prune_model([model])
    assert str(info.value).startswith("prune_model: argument `model` must be a keras.Model; received [")


def test_every_layer_with_per_unit_weights_in_the_registry_has_a_slicer():
    from keras_group_lasso.graph import registry

    for layer_class in (keras.layers.BatchNormalization, keras.layers.PReLU, keras.layers.Normalization,
                        keras.layers.Rescaling, keras.layers.DepthwiseConv2D, keras.layers.DepthwiseConv1D):
        assert registry.rule_of(layer_class.__new__(layer_class)).slicer is not None, layer_class


# ----------------------------------------------------------------------------- property


_BETWEEN = [
    None,
    lambda: keras.layers.BatchNormalization(),
    lambda: keras.layers.Dropout(0.5),
    lambda: keras.layers.Activation("tanh"),
    lambda: keras.layers.LeakyReLU(0.2),
    lambda: keras.layers.PReLU(),
    lambda: keras.layers.Normalization(),
    lambda: keras.layers.Rescaling(0.5, offset=0.25),
]

# Input preprocessing, given the per-sample shape it sees and a random generator.
_PREPROCESS = [
    None,
    lambda shape, rng: keras.layers.Normalization(),  # statistics set with the other weights
    lambda shape, rng: keras.layers.Normalization(axis=None),
    lambda shape, rng: keras.layers.Normalization(axis=tuple(range(1, len(shape) + 1))),
    lambda shape, rng: keras.layers.Normalization(
        mean=rng.normal(size=shape[-1]), variance=rng.uniform(0.5, 2.0, shape[-1]), invert=bool(rng.integers(2))
    ),
    lambda shape, rng: keras.layers.Rescaling(1 / 255.0, offset=-1.0),
    lambda shape, rng: keras.layers.Rescaling(rng.uniform(0.5, 2.0, shape[-1]).astype("float32"), offset=rng.normal()),
]


@st.composite
def _architectures(draw):
    n_hidden = draw(st.integers(1, 4))
    sizes = [draw(st.integers(2, 7))] + [draw(st.integers(1, 6)) for _ in range(n_hidden)] + [draw(st.integers(1, 3))]
    functional = draw(st.booleans())
    return {
        "sizes": sizes,
        "activations": [draw(st.sampled_from(["relu", "tanh", "sigmoid", "linear", "elu"])) for _ in range(n_hidden)],
        "between": [draw(st.integers(0, len(_BETWEEN) - 1)) for _ in range(n_hidden)],
        "use_bias": [draw(st.booleans()) or draw(st.booleans()) for _ in range(n_hidden + 1)],
        "functional": functional,
        "image": draw(st.booleans()),
        "preprocess": draw(st.integers(0, len(_PREPROCESS) - 1)),
        "preprocess_after_flatten": draw(st.booleans()),
        # a nested block: layers [start, stop) of the chain, Sequential or (in a functional model) functional
        "nest": draw(st.none() | st.tuples(st.integers(0, 99), st.integers(0, 99))),
        "block": draw(st.sampled_from(["sequential", "functional"] if functional else ["sequential"])),
        "inputs": draw(st.sampled_from(["original", "selected"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _random_model(arch):
    rng = np.random.default_rng(arch["seed"])
    sizes = arch["sizes"]
    n_features = sizes[0]
    image = arch["image"] and n_features % 2 == 0
    shape = (2, n_features // 2) if image else (n_features,)
    layers = [keras.layers.Flatten()] if image else []
    if _PREPROCESS[arch["preprocess"]] is not None:
        after = arch["preprocess_after_flatten"] or not image
        layer = _PREPROCESS[arch["preprocess"]]((n_features,) if after else shape, rng)
        layers.insert(len(layers) if after else 0, layer)
    for i, units in enumerate(sizes[1:]):
        last = i == len(sizes) - 2
        layers.append(
            keras.layers.Dense(
                units,
                activation=None if last else arch["activations"][i],
                use_bias=arch["use_bias"][i],
                name=f"d{i}",
                **_ZEROS,
            )
        )
        if not last and _BETWEEN[arch["between"][i]] is not None:
            layers.append(_BETWEEN[arch["between"][i]]())
    start, stop = len(layers), len(layers)
    if arch["nest"] is not None:
        start = arch["nest"][0] % len(layers)
        stop = start + 1 + arch["nest"][1] % (len(layers) - start)
    inp = keras.Input(shape)
    if arch["functional"]:
        x = inp
        for layer in layers[:start]:
            x = layer(x)
        if start < stop:
            if arch["block"] == "functional":
                block_input = keras.Input(tuple(x.shape[1:]))
                y = block_input
                for layer in layers[start:stop]:
                    y = layer(y)
                x = keras.Model(block_input, y, name="block")(x)
            else:
                x = keras.Sequential(layers[start:stop], name="block")(x)
        for layer in layers[stop:]:
            x = layer(x)
        model = keras.Model(inp, x)
    else:
        block = [keras.Sequential(layers[start:stop], name="block")] if start < stop else []
        model = keras.Sequential([inp] + layers[:start] + block + layers[stop:])
    weights = []
    for variable in model.weights:
        shape_ = tuple(variable.shape)
        path = variable.path
        if "int" in str(variable.dtype):
            w = np.zeros(shape_)  # Normalization's count
        elif "variance" in path or "gamma" in path:
            w = rng.uniform(0.5, 2.0, shape_)
        elif "kernel" in path:
            w = rng.normal(size=shape_) * (rng.random(shape_) < 0.8)
            w[rng.random(shape_[0]) < 0.3] = rng.uniform(-T, T)  # dead rows (sub-threshold noise)
            w[:, rng.random(shape_[1]) < 0.2] = 0.0  # constant units
        else:
            w = rng.normal(size=shape_)
        weights.append(w.astype(variable.dtype))
    model.set_weights(weights)
    _refresh_normalization(model)
    return model, shape


# 30 architectures on TensorFlow and PyTorch, 15 on JAX (tests/_examples.py).
@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=_architectures())
# Selected features of a 2x1 image normalized before Flatten (axis -1): the pruned model's flat input needs the
# statistics per element even when every feature stays.
@example(arch={"sizes": [2, 2, 1, 1], "activations": ["relu", "relu"], "between": [0, 0],
               "use_bias": [True, True, True], "functional": False, "image": True, "preprocess": 1,
               "preprocess_after_flatten": False, "nest": None, "block": "sequential", "inputs": "selected",
               "seed": 1})
def test_pruned_model_equals_thresholded_original(arch):
    model, shape = _random_model(arch)
    before = _weights(model)
    report = sparsity_report(model, T)
    if not report.selected_features:
        with pytest.raises(InvalidParameterError):
            prune_model(model, T, inputs=arch["inputs"])
        return
    small = prune_model(model, T, inputs=arch["inputs"])
    x = np.random.default_rng(arch["seed"] + 1).normal(size=(5,) + shape).astype("float32")
    _assert_same_outputs(model, small, x, arch["inputs"])
    dense = [layer for layer in small.layers if type(layer) is keras.layers.Dense and layer.trainable]
    assert (len(small.kept_features),) + tuple(d.units for d in dense[:-1]) == report.layer_sizes
    n, k, u = report.n_features, len(report.selected_features), dense[0].units
    selects = [layer for layer in small.layers if not layer.trainable]
    assert len(selects) == (arch["inputs"] == "original" and k < n and k * (n + u) < n * u)
    extra = 0
    if arch["inputs"] == "original" and not selects:  # zero rows for the dropped features
        extra = (n - k) * u
    assert sum(d.count_params() for d in dense) == report.params_after + extra
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_pruned_layers_keep_the_users_initializers_in_their_config():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_initializer="he_normal", name="a"),
                              keras.layers.Dense(2, bias_initializer="ones", name="b")])
    small = prune_model(model, T)
    for name in ("a", "b"):
        assert small.get_layer(name).get_config()["kernel_initializer"] == model.get_layer(name).get_config()[
            "kernel_initializer"]
        assert small.get_layer(name).get_config()["bias_initializer"] == model.get_layer(name).get_config()[
            "bias_initializer"]

"""Surgery: the pruned model computes what the thresholded original computes, output for output."""

import json

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
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
from keras_group_lasso.surgery import SelectFeatures
from keras_group_lasso.surgery.slicers import SLICERS

requires_tensorflow_backend = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="SavedModel export needs the TensorFlow backend"
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
    apply_threshold(clone, T)
    return clone


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
    """24 features of which 2 survive: inputs="original" gathers them (SelectFeatures)."""
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
def test_few_surviving_features_are_gathered(image):
    model = _few_features_model(image)
    small = prune_model(model, threshold=T)
    names = [layer.name for layer in small.layers]
    assert names == (["flat"] if image else []) + ["select_features", "d0", "bn", "d1"]
    assert small.get_layer("select_features").indices == (5, 17)
    assert small.get_layer("d0").get_weights()[0].shape == (2, 3)
    x = np.random.default_rng(0).normal(size=(5, 4, 6) if image else (5, 24)).astype("float32")
    _assert_same_outputs(model, small, x)


def test_keeps_dtype_policy_use_bias_regularizers_and_names():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                3,
                activation="relu",
                kernel_regularizer=SparseGroupLasso(1e-3),
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
    assert a.kernel_regularizer == SparseGroupLasso(1e-3)
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


# ----------------------------------------------------------------------------- saving


def _sparse_mlp():
    rng = np.random.default_rng(6)
    w0 = rng.normal(size=(6, 5))
    w0[[1, 4]] = 0.0
    w0[:, 3] = 0.0  # a constant unit
    w1 = rng.normal(size=(5, 3))
    w1[0] = 0.0
    return _mlp([w0, w1, rng.normal(size=(3, 2))], [rng.normal(size=5), rng.normal(size=3), rng.normal(size=2)])


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


@requires_tensorflow_backend
@pytest.mark.parametrize("make", [_sparse_mlp, _few_features_model])
def test_saved_model_export(tmp_path, make):
    tf = pytest.importorskip("tensorflow")
    small = prune_model(make(), T)
    small.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "sm"))
    x = np.random.default_rng(0).normal(size=(4, small.inputs[0].shape[1])).astype("float32")
    np.testing.assert_allclose(served.serve(x).numpy(), _numpy(small(x)), atol=1e-6)


def test_select_features_layer():
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


class _Scale(keras.layers.Layer):
    def call(self, x):
        return 2.0 * x


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="sub")
        self.d0 = keras.layers.Dense(3)
        self.d1 = keras.layers.Dense(2)

    def call(self, x):
        return self.d1(self.d0(x))


def _subclassed():
    model = _Subclassed()
    model(np.zeros((1, 4), "float32"))
    return model


def _seq(*middle):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d0"), *middle, keras.layers.Dense(2, name="out")])


@pytest.mark.parametrize(
    "make, name, cls",
    [
        (_residual, "residual", "Add"),
        (_concat, "cat", "Concatenate"),
        (_shared, "twice", "Dense"),
        (_two_outputs, "trunk", "Dense"),
        (lambda: _seq(keras.layers.LayerNormalization(name="ln")), "ln", "LayerNormalization"),
        (lambda: _seq(_Scale(name="scale")), "scale", "_Scale"),
        (lambda: _seq(keras.layers.Softmax(name="soft")), "soft", "Softmax"),
        (lambda: _seq(keras.Sequential([keras.layers.Dense(4)], name="inner")), "inner", "Sequential"),
        (
            lambda: keras.Sequential([keras.Input((5, 5, 1)), keras.layers.Conv2D(2, 3, name="conv"), keras.layers.Flatten(), keras.layers.Dense(2)]),
            "conv",
            "Conv2D",
        ),
        (
            lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax", name="mix"), keras.layers.Dense(2)]),
            "mix",
            "Dense",
        ),
        (_subclassed, "sub", "_Subclassed"),
    ],
)
def test_unsupported_models_raise_naming_the_layer(make, name, cls):
    model = make()
    before = _weights(model)
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert str(info.value).startswith(f"prune_model: cannot prune layer '{name}' ({cls}): ")
    assert "Supported: Sequential or functional models" in str(info.value)
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
    "output (in this one {cause}, so its output is a constant at any threshold and there is nothing to prune "
    "to); received <Sequential name=mlp, built=True>."
)


@pytest.mark.parametrize("threshold", [0.0, T])
@pytest.mark.parametrize("owner", ["prune_model", "plan_pruning"])
def test_a_model_without_a_live_path_is_blamed_not_the_threshold(owner, threshold):
    call = prune_model if owner == "prune_model" else plan_pruning
    dead_first = _mlp([np.zeros((3, 2)), np.ones((2, 1))], [np.ones(2), np.zeros(1)])
    with pytest.raises(InvalidParameterError) as info:
        call(dead_first, threshold)
    assert str(info.value) == _NO_PATH.format(owner=owner, cause="every kernel weight of 'd0' is 0")
    # Feature paths reach unit 0 of d0 only, and only unit 1 reaches the output.
    broken_chain = _mlp([np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[0.0], [1.0]])], [np.zeros(2), np.zeros(1)])
    with pytest.raises(InvalidParameterError) as info:
        call(broken_chain, threshold)
    assert str(info.value) == _NO_PATH.format(
        owner=owner, cause="each path of non-zero weights from an input feature stops before the output"
    )


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


def test_every_per_unit_layer_the_analysis_accepts_has_a_slicer():
    from keras_group_lasso import analysis

    assert set(analysis._ELEMENTWISE_LAYERS + analysis._PER_UNIT_WEIGHTED) <= set(SLICERS)


# ----------------------------------------------------------------------------- property


_BETWEEN = [
    None,
    lambda: keras.layers.BatchNormalization(),
    lambda: keras.layers.Dropout(0.5),
    lambda: keras.layers.Activation("tanh"),
    lambda: keras.layers.LeakyReLU(0.2),
    lambda: keras.layers.PReLU(),
]


@st.composite
def _architectures(draw):
    n_hidden = draw(st.integers(1, 4))
    sizes = [draw(st.integers(2, 7))] + [draw(st.integers(1, 6)) for _ in range(n_hidden)] + [draw(st.integers(1, 3))]
    return {
        "sizes": sizes,
        "activations": [draw(st.sampled_from(["relu", "tanh", "sigmoid", "linear", "elu"])) for _ in range(n_hidden)],
        "between": [draw(st.integers(0, len(_BETWEEN) - 1)) for _ in range(n_hidden)],
        "use_bias": [draw(st.booleans()) or draw(st.booleans()) for _ in range(n_hidden + 1)],
        "functional": draw(st.booleans()),
        "image": draw(st.booleans()),
        "inputs": draw(st.sampled_from(["original", "selected"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _random_model(arch):
    rng = np.random.default_rng(arch["seed"])
    sizes = arch["sizes"]
    n_features = sizes[0]
    image = arch["image"] and n_features % 2 == 0
    layers = [keras.layers.Flatten()] if image else []
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
    inp = keras.Input((2, n_features // 2) if image else (n_features,))
    if arch["functional"]:
        x = inp
        for layer in layers:
            x = layer(x)
        model = keras.Model(inp, x)
    else:
        model = keras.Sequential([inp] + layers)
    weights = []
    for variable in model.weights:
        shape = tuple(variable.shape)
        path = variable.path
        if "variance" in path or "gamma" in path:
            w = rng.uniform(0.5, 2.0, shape)
        elif "kernel" in path:
            w = rng.normal(size=shape) * (rng.random(shape) < 0.8)
            w[rng.random(shape[0]) < 0.3] = rng.uniform(-T, T)  # dead rows (sub-threshold noise)
            w[:, rng.random(shape[1]) < 0.2] = 0.0  # constant units
        else:
            w = rng.normal(size=shape)
        weights.append(w.astype("float32"))
    model.set_weights(weights)
    return model, (2, n_features // 2) if image else (n_features,)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=_architectures())
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
    dense = [layer for layer in small.layers if type(layer) is keras.layers.Dense]
    assert (len(small.kept_features),) + tuple(d.units for d in dense[:-1]) == report.layer_sizes
    extra = 0
    if arch["inputs"] == "original":  # zero rows for the dropped features
        extra = (report.n_features - len(report.selected_features)) * dense[0].units
    assert sum(d.count_params() for d in dense) == report.params_after + extra
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)

"""analysis: the fixed point of dead units, the report's numbers, apply_threshold, errors."""

import json
import re
import sys

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_group_lasso import (
    InvalidParameterError,
    NonFiniteError,
    SparsityReport,
    apply_threshold,
    plan_pruning,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.analysis import (
    LayerSparsity,
    image_shape,
    input_feature_strength,
    is_zero,
    layer_group_norms,
    unit_masks,
)

T = 1e-3


def _chain(kernels, biases=None, activation="relu", functional=False, input_shape=None, use_bias=True):
    """A Dense chain with the given kernels (the last layer is linear)."""
    n_in = kernels[0].shape[0]
    inp = keras.Input(input_shape or (n_in,), name="features")
    layers = [keras.layers.Flatten()] if input_shape is not None and len(input_shape) > 1 else []
    for i, k in enumerate(kernels):
        last = i == len(kernels) - 1
        bias = use_bias if not isinstance(use_bias, (list, tuple)) else use_bias[i]
        layers.append(
            keras.layers.Dense(
                k.shape[1],
                activation=None if last else activation,
                use_bias=bias,
                name=f"d{i}",
                kernel_initializer="zeros",  # overwritten; avoids compiling a random init per shape on JAX
            )
        )
    if functional:
        x = inp
        for layer in layers:
            x = layer(x)
        model = keras.Model(inp, x)
    else:
        model = keras.Sequential([inp] + layers)
    for i, k in enumerate(kernels):
        layer = model.get_layer(f"d{i}")
        weights = [k.astype("float32")]
        if layer.use_bias:
            b = np.full(k.shape[1], 0.5) if biases is None else biases[i]
            weights.append(np.asarray(b, dtype="float32"))
        layer.set_weights(weights)
    return model


def _ones(*shape):
    return np.ones(shape, dtype="float32")


# ----------------------------------------------------------------------------- known answers


@pytest.mark.quick
def test_report_known_answer():
    w0, w1, w2 = _ones(6, 4), _ones(4, 3), _ones(3, 2)
    w0[[0, 3]] = 0.0  # features 0 and 3 unused
    w0[1, 2] = 5e-4  # below the threshold: zero
    w1[1] = 0.0  # hidden unit 1 of d0 unused
    w2[2] = 0.0  # hidden unit 2 of d1 unused
    model = _chain([w0, w1, w2])
    report = sparsity_report(model, threshold=T)

    assert report.threshold == T
    assert report.n_features == 6
    assert report.selected_features == (1, 2, 4, 5)
    assert report.layer_sizes == (4, 3, 2)
    assert report.original_layer_sizes == (6, 4, 3)
    assert report.live_neurons == 5
    assert report.total_weights == 24 + 12 + 6
    assert report.zero_weights == 9 + 3 + 2
    assert report.sparsity == pytest.approx(14 / 42)
    assert report.params_before == (24 + 4) + (12 + 3) + (6 + 2)
    assert report.params_after == (4 * 3 + 3) + (3 * 2 + 2) + (2 * 2 + 2)
    assert report.uninterpreted_layers == ()
    assert (report.flops_before, report.flops_after) == (24 + 12 + 6, 12 + 6 + 4)
    assert report.layers == (
        LayerSparsity("d0", "input", 24, 9, 9 / 24, 6, 4, 4, 3, 0, False, "Dense", 24, 4 * 3, inputs_alive=4),
        LayerSparsity("d1", "hidden", 12, 3, 3 / 12, 4, 3, 3, 2, 0, False, "Dense", 12, 3 * 2, inputs_alive=3),
        LayerSparsity("d2", "hidden", 6, 2, 2 / 6, 3, 2, 2, 2, 0, True, "Dense", 6, 2 * 2, inputs_alive=2),
    )


def test_fixed_point_dead_units_propagate_backwards():
    # d1 unit 0 is dead (zero outgoing row). d0 unit 3 only feeds d1 unit 0,
    # so it is dead too, and feature 5 only feeds d0 unit 3: not selected.
    w0, w1, w2 = np.zeros((6, 4), "float32"), np.zeros((4, 3), "float32"), _ones(3, 2)
    w0[:5, :3] = 1.0
    w0[5, 3] = 1.0
    w1[:3, :] = 1.0
    w1[3, 0] = 1.0
    w2[0] = 0.0
    report = sparsity_report(_chain([w0, w1, w2]), threshold=T)
    assert report.selected_features == (0, 1, 2, 3, 4)
    assert report.layer_sizes == (5, 3, 2)
    assert [layer.units_alive for layer in report.layers] == [3, 2, 2]
    # groups_alive is the raw row count, before the fixed point.
    assert [layer.groups_alive for layer in report.layers] == [6, 4, 2]


def test_constant_units_are_removed_and_propagate_forwards():
    # d0 unit 2 has an all-zero incoming column: it outputs relu(bias), a constant.
    # d1 unit 1 is fed only by that constant unit: constant too.
    w0, w1, w2 = _ones(3, 3), _ones(3, 2), _ones(2, 2)
    w0[:, 2] = 0.0
    w1[:, 1] = 0.0
    w1[2, 1] = 1.0
    model = _chain([w0, w1, w2])
    report = sparsity_report(model, threshold=T)
    assert [layer.constant_units for layer in report.layers] == [1, 1, 0]
    assert report.layer_sizes == (3, 2, 1)
    masks = unit_masks(model, threshold=T)
    np.testing.assert_array_equal(masks.units["d0"], [True, True, False])
    np.testing.assert_array_equal(masks.units["d1"], [True, False])
    np.testing.assert_array_equal(masks.folded["d0"], [False, False, True])
    np.testing.assert_array_equal(masks.folded["d1"], [False, True])
    np.testing.assert_array_equal(masks.inputs["d2"], [True, False])


def test_constant_unit_is_kept_when_next_layer_has_no_bias():
    w0, w1 = _ones(3, 2), _ones(2, 2)
    w0[:, 1] = 0.0
    model = _chain([w0, w1], use_bias=[True, False])
    report = sparsity_report(model, threshold=T)
    assert report.layers[0].constant_units == 1
    assert report.layer_sizes == (3, 2)  # nowhere to fold relu(b): the unit stays
    assert not unit_masks(model, T).folded["d0"].any()


def test_threshold_boundary_counts_as_zero_and_apply_threshold_agrees():
    w0, w1 = _ones(2, 2), _ones(2, 1)
    w0[0, 0] = 1e-3  # exactly the threshold: zero (|w| <= threshold)
    w0[0, 1] = -1e-3
    w0[1, 0] = 2e-3
    model = _chain([w0, w1])
    before = [w.copy() for w in model.get_weights()]
    report = sparsity_report(model, threshold=1e-3)
    assert report.layers[0].zero_weights == 2
    assert report.selected_features == (1,)
    # The report never changes the model.
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)

    assert apply_threshold(model, threshold=1e-3) == 2
    kernel = model.get_layer("d0").get_weights()[0]
    np.testing.assert_array_equal(kernel, np.array([[0.0, 0.0], [2e-3, 1.0]], "float32"))
    # Afterwards the zeros are stored: a threshold of 0 sees the same thing.
    assert sparsity_report(model, threshold=0.0) == dataclass_replace(report, threshold=0.0)
    assert apply_threshold(model, threshold=1e-3) == 0


def dataclass_replace(report, **changes):
    import dataclasses

    return dataclasses.replace(report, **changes)


def test_apply_threshold_zeroes_biases_too():
    model = _chain([_ones(2, 2), _ones(2, 1)], biases=[np.array([5e-4, 1.0]), np.array([-2e-4])])
    assert apply_threshold(model, 1e-3) == 2
    np.testing.assert_array_equal(model.get_layer("d0").get_weights()[1], [0.0, 1.0])
    np.testing.assert_array_equal(model.get_layer("d1").get_weights()[1], [0.0])


def test_apply_threshold_refuses_a_threshold_that_leaves_the_output_a_constant_and_changes_nothing():
    model = _chain([_ones(2, 2), _ones(2, 1)], biases=[np.array([5e-4, 1.0]), np.array([-2e-4])])
    before = model.get_weights()
    with pytest.raises(InvalidParameterError, match=re.escape(
            "apply_threshold: argument `threshold` must be small enough to leave a path of weights above it from an "
            "input feature to the output (at this threshold every input feature is pruned and no input feature "
            "reaches the output; at threshold 0, 2 of 2 features reach it); received 1000.0.")):
        apply_threshold(model, 1e3)  # 1e3 typed for 1e-3
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    # a model whose output is a constant already is thresholded as asked: nothing is lost that was not
    dead = _chain([np.zeros((2, 2)), _ones(2, 1)], biases=[np.array([5e-4, 1.0]), np.array([-2e-4])])
    assert apply_threshold(dead, 1e-3) == 2


def test_per_unit_layers_between_dense_layers_are_seen_through():
    inp = keras.Input((5,))
    x = keras.layers.Dense(4, name="d0")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("tanh")(x)
    x = keras.layers.Dropout(0.3)(x)
    x = keras.layers.LeakyReLU()(x)
    out = keras.layers.Dense(2, activation="softmax", name="d1")(x)
    model = keras.Model(inp, out)
    w1 = model.get_layer("d1").get_weights()
    w1[0][2] = 0.0
    model.get_layer("d1").set_weights(w1)
    report = sparsity_report(model, threshold=T)
    assert report.uninterpreted_layers == ()
    assert report.layer_sizes == (5, 3)
    assert report.layers[1].is_output


def test_image_input_through_flatten():
    w0 = _ones(12, 3)
    w0[[0, 5]] = 0.0
    model = _chain([w0, _ones(3, 2)], input_shape=(3, 4))
    report = sparsity_report(model, threshold=T)
    assert report.n_features == 12
    assert report.selected_features == tuple(i for i in range(12) if i not in (0, 5))
    assert report.layers[0].role == "input"
    assert image_shape(model) == (3, 4)


@pytest.mark.parametrize("shape, expected", [((64,), (8, 8)), ((10,), None), ((4, 5, 2), (4, 5, 2))])
def test_image_shape(shape, expected):
    model = keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(2)])
    assert image_shape(model) == expected


def test_feature_strength_and_group_norms_match_numpy(rng):
    kernels = [rng.normal(size=(7, 4)).astype("float32"), rng.normal(size=(4, 3)).astype("float32")]
    model = _chain(kernels, functional=True)
    np.testing.assert_allclose(input_feature_strength(model), np.linalg.norm(kernels[0], axis=1), rtol=1e-6)
    norms = layer_group_norms(model)
    assert list(norms) == ["d0", "d1"]
    for k, name in zip(kernels, norms):
        np.testing.assert_allclose(norms[name], np.linalg.norm(k, axis=1), rtol=1e-6)


# ----------------------------------------------------------------------------- str / dict


@pytest.mark.quick
def test_str_and_to_dict():
    w0 = _ones(4, 3)
    w0[0] = 0.0
    report = sparsity_report(_chain([w0, _ones(3, 2)]), threshold=T)
    text = str(report)
    assert "selected features: 3/4" in text
    assert "layer sizes:       4-3 -> 3-3" in text
    assert "d0" in text and "d1" in text and "output" in text
    d = report.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["selected_features"] == [1, 2, 3]
    assert d["layers"][0]["name"] == "d0"
    assert isinstance(report, SparsityReport)
    with pytest.raises(AttributeError):
        report.sparsity = 0.5  # frozen


# ----------------------------------------------------------------------------- unsupported models


def _uninterpreted(model):
    return sparsity_report(model, threshold=T).uninterpreted_layers


def test_uninterpreted_layers_are_named():
    inp = keras.Input((6,))
    a = keras.layers.Dense(4, name="a")(inp)
    b = keras.layers.Dense(4, name="b")(inp)
    s = keras.layers.Dot(axes=1, name="dot")([a, b])
    out = keras.layers.Dense(2, name="out")(s)
    assert "dot (Dot)" in _uninterpreted(keras.Model(inp, out))
    # a merge of coupled units is understood
    out = keras.layers.Dense(2, name="out")(keras.layers.Add(name="sum")([a, b]))
    assert _uninterpreted(keras.Model(inp, out)) == ()

    norm = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4), keras.layers.LayerNormalization(name="ln"), keras.layers.Dense(2)]
    )
    assert _uninterpreted(norm) == ()  # its channels all stay
    reshaped = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Reshape((2, 2), name="rs"),
                                 keras.layers.Flatten(), keras.layers.Dense(2)])
    assert _uninterpreted(reshaped) == ("rs (Reshape)",)

    cnn = keras.Sequential(
        [keras.Input((5, 5, 1)), keras.layers.Conv2D(2, 3, name="conv"), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    report = sparsity_report(cnn, threshold=T)  # a chain of a convolution and a Dense head: understood
    assert report.uninterpreted_layers == ()
    assert report.n_features == 1 and report.selected_features == (0,)  # the input channel
    assert [layer.role for layer in report.layers] == ["input", "hidden"]
    assert report.layers[0].flops_before == 3 * 3 * 9 * 1 * 2 and report.layers[1].flops_before == 9 * 2 * 2

    softmax_hidden = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, activation="softmax", name="soft"), keras.layers.Dense(2)]
    )
    assert _uninterpreted(softmax_hidden) == ("soft (Dense)",)

    shared = keras.layers.Dense(6, name="shared")
    inp = keras.Input((6,))
    out = keras.layers.Dense(2)(shared(shared(inp)))
    assert _uninterpreted(keras.Model(inp, out)) == ()  # a shared layer: its calls share its units


def test_a_subclassed_model_built_on_data_is_read_through_its_traced_call():
    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.d0 = keras.layers.Dense(3)
            self.d1 = keras.layers.Dense(2)

        def call(self, x):
            return self.d1(self.d0(x))

    model = Net()
    model(np.zeros((1, 4), "float32"))
    report = sparsity_report(model, threshold=T)
    assert report.uninterpreted_layers == ()
    assert [row.name for row in report.layers] == [model.d0.name, model.d1.name]


# ----------------------------------------------------------------------------- errors


@pytest.mark.quick
@pytest.mark.parametrize(
    "threshold, message",
    [
        (-1.0, "sparsity_report: argument `threshold` must be a finite number >= 0; received -1.0."),
        (float("nan"), "sparsity_report: argument `threshold` must be a finite number >= 0; received nan."),
        ("0.1", "sparsity_report: argument `threshold` must be a finite number >= 0; received '0.1'."),
    ],
)
def test_bad_threshold(threshold, message):
    model = _chain([_ones(2, 2), _ones(2, 1)])
    with pytest.raises(InvalidParameterError) as info:
        sparsity_report(model, threshold=threshold)
    assert str(info.value) == message


def test_bad_model():
    with pytest.raises(InvalidParameterError) as info:
        sparsity_report("model")
    assert str(info.value) == "sparsity_report: argument `model` must be a keras.Model; received 'model'."
    no_dense = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.1)])
    with pytest.raises(InvalidParameterError, match=r"apply_threshold: argument `model` must be a model with at least one Dense or convolution layer"):
        apply_threshold(no_dense)
    with pytest.raises(InvalidParameterError, match=r"unit_masks: argument `model` must be a built keras.Model"):
        unit_masks(keras.Sequential([keras.layers.Dense(2)]))


THRESHOLD_FUNCTIONS = {
    "sparsity_report": sparsity_report,
    "unit_masks": unit_masks,
    "apply_threshold": apply_threshold,
    "prune_model": prune_model,
    "plan_pruning": plan_pruning,
}


@pytest.mark.parametrize("name", sorted(THRESHOLD_FUNCTIONS))
def test_threshold_none_is_refused_like_any_bad_threshold(name):
    model = _chain([_ones(2, 2), _ones(2, 1)])
    with pytest.raises(InvalidParameterError) as info:
        THRESHOLD_FUNCTIONS[name](model, threshold=None)
    assert str(info.value) == f"{name}: argument `threshold` must be a finite number >= 0; received None."


def _diverged_model():
    w0 = np.array([[1.0, 5e-4], [np.nan, 2.0], [np.nan, 1.0]], "float32")
    model = _chain([w0, _ones(2, 1)], biases=[np.array([0.5, np.inf]), np.array([np.nan])])
    return model


@pytest.mark.parametrize("name", sorted(THRESHOLD_FUNCTIONS))
def test_non_finite_weights_are_named_instead_of_counted_as_zeros(name):
    model = _diverged_model()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(NonFiniteError) as info:
        THRESHOLD_FUNCTIONS[name](model, threshold=1e-3)
    assert str(info.value) == (
        f"{name}: the weights of the model are not finite, so no weight can be counted as zero or kept: "
        "d0/kernel (2 NaN of 6 values), d0/bias (1 inf of 2 values), d1/bias (1 NaN of 1 value). "
        "The training diverged: scale the inputs (e.g. a keras.layers.Normalization layer or scikit-learn's "
        "StandardScaler) or lower the learning rate, then train again."
    )
    assert info.value.names == ("d0/kernel", "d0/bias", "d1/bias")
    assert isinstance(info.value, ValueError)
    # Nothing was changed, not even the finite weight below the threshold (apply_threshold included).
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)


def test_non_finite_weights_in_a_layer_without_bias_are_found():
    w1 = _ones(2, 1)
    w1[1, 0] = -np.inf
    model = _chain([_ones(3, 2), w1], use_bias=[True, False])
    with pytest.raises(NonFiniteError, match=r"sparsity_report: .* kept: d1/kernel \(1 inf of 2 values\)\. "):
        sparsity_report(model)


def test_raw_strengths_still_show_non_finite_weights():
    # No threshold, no counting: the raw norms show the NaN as it is.
    model = _diverged_model()
    assert np.isnan(input_feature_strength(model)[1:]).all()
    assert np.isnan(layer_group_norms(model)["d0"][1:]).all()


def test_is_zero():
    np.testing.assert_array_equal(is_zero(np.array([0.0, -1e-3, 1.5e-3]), 1e-3), [True, True, False])


# ----------------------------------------------------------------------------- property: fixed point


def _reference_sizes(kernels, t):
    """The fixed point by brute force: remove one unit at a time until nothing changes."""
    a = [np.abs(k) > t for k in kernels]
    n_layers = len(a)
    alive = [np.ones(k.shape[0], bool) for k in a] + [np.ones(a[-1].shape[1], bool)]
    # varying: feature vary; a unit varies when a varying input reaches it.
    varying = [np.ones(a[0].shape[0], bool)]
    for k in a:
        varying.append(np.array([any(varying[-1][i] and k[i, j] for i in range(k.shape[0])) for j in range(k.shape[1])]))
    changed = True
    while changed:
        changed = False
        for level in range(n_layers):  # level 0: features, level l: units of layer l-1
            for i in range(len(alive[level])):
                if not alive[level][i]:
                    continue
                used = any(a[level][i, j] and alive[level + 1][j] for j in range(a[level].shape[1]))
                if not used or (level > 0 and not varying[level][i]):
                    alive[level][i] = False
                    changed = True
    return tuple(int(m.sum()) for m in alive[:-1])


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=5),
    density=st.floats(0.1, 0.9),
    seed=st.integers(0, 2**16),
)
def test_layer_sizes_equal_brute_force_fixed_point(sizes, density, seed):
    rng = np.random.default_rng(seed)
    kernels = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        k = rng.uniform(0.01, 1.0, (n_in, n_out)) * (rng.random((n_in, n_out)) < density)
        kernels.append(k.astype("float32"))
    model = _chain(kernels)
    report = sparsity_report(model, threshold=T)
    assert report.layer_sizes == _reference_sizes(kernels, T)
    assert report.zero_weights == sum(int((k == 0).sum()) for k in kernels)


def test_a_model_without_input_features_has_penalty_zero_and_a_sensible_report():
    from keras_group_lasso import GroupLasso, SparseGroupLasso

    model = keras.Sequential(
        [
            keras.Input((0,)),
            keras.layers.Dense(3, kernel_regularizer=GroupLasso(0.1), bias_regularizer=SparseGroupLasso(0.1), name="d0"),
            keras.layers.Dense(2, kernel_regularizer=GroupLasso(0.1), name="d1"),
        ]
    )
    losses = [float(keras.ops.convert_to_numpy(loss)) for loss in model.losses]
    assert losses[:2] == [0.0, 0.0] and np.isfinite(losses[2])
    report = sparsity_report(model, threshold=T)
    assert report.n_features == 0 and report.selected_features == ()
    assert report.layers[0].weights == 0 and report.layers[0].sparsity == 0.0
    assert report.layer_sizes == (0, 0) and report.original_layer_sizes == (0, 3)


def test_the_report_draws_each_layer_s_width_before_and_after():
    import matplotlib

    matplotlib.use("Agg")
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(2, name="out")])
    kernel = np.ones((5, 4))
    kernel[[1, 3]] = 0.0  # features 1 and 3 go
    out = np.ones((4, 2))
    out[2] = 0.0  # hidden unit 2 goes
    model.get_layer("hidden").set_weights([kernel, np.zeros(4)])
    model.get_layer("out").set_weights([out, np.zeros(2)])
    report = sparsity_report(model)
    ax = report.plot()
    dense, alive = ax.containers
    assert [bar.get_height() for bar in dense] == [5, 4, 2]
    assert [bar.get_height() for bar in alive] == [3, 3, 2]
    assert [text.get_text() for text in ax.texts] == ["3/5", "3/4", "2/2"]
    matplotlib.pyplot.close(ax.figure)


def test_drawing_the_report_without_matplotlib_says_how_to_install_it(monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"keras-group-lasso\[plot\]"):
        sparsity_report(model).plot()

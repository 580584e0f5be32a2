"""Convolutional networks: channel groups, the report's channels and FLOPs, and exact surgery.

The property test builds random CNN chains (convolution types, kernel sizes,
strides, padding, BatchNormalization, pooling, zero padding, Flatten or global
pooling heads), kills and freezes random channels, and checks that the pruned
model computes what the thresholded original computes.
"""

from functools import partial

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_group_lasso import (
    InvalidParameterError,
    UnsupportedModelError,
    Proximal,
    add_group_sparsity,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.analysis import unit_masks
from keras_group_lasso.graph import registry
from keras_group_lasso.groups import GroupView
from keras_group_lasso.graph.build import model_graph
from _examples import examples

T = 1e-3
L = keras.layers


def thresholded_copy(model):
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    apply_threshold(copy, T)
    return copy


def outputs(model, x):
    """Every output of ``model`` on ``x`` (inference mode), float64."""
    return [np.asarray(keras.ops.convert_to_numpy(y), np.float64) for y in keras.tree.flatten(model(x, training=False))]


def thresholded_outputs(model, x, read=outputs):
    """``read(thresholded_copy(model), x)`` without the copy: the model's own kernels are thresholded for the call
    and all its weights put back exactly after (a copy costs what building the model costs, tracing included)."""
    weights = model.get_weights()
    try:
        apply_threshold(model, T)
        return read(model, x)
    finally:
        model.set_weights(weights)


def assert_same_outputs(small, model, x):
    """``small`` computes what the thresholded ``model`` computes, to 1e-5 of the output scale."""
    want = thresholded_outputs(model, x)
    got = outputs(small, x)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        scale = max(1.0, float(np.max(np.abs(b))))
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


def assert_rounded(model, x, round_to, report, flops=True, fold_batchnorm=False):
    """``prune_model(..., round_to=round_to, fold_batchnorm=...)``: the same outputs, and each hidden layer (but
    one that makes input features) keeps a multiple of ``round_to`` units, all of them, or none; at least its
    live ones; a merged BatchNormalization is gone and the layer it went into is there."""
    rounded = prune_model(model, T, round_to=round_to, fold_batchnorm=fold_batchnorm)
    assert_same_outputs(rounded, model, x)
    names = {layer.name for layer in rounded.layers}
    assert fold_batchnorm or not rounded.folded_batchnorms
    for bn, into in rounded.folded_batchnorms.items():
        assert bn not in names and into in names and type(model.get_layer(bn)) is L.BatchNormalization
    plan = rounded.pruning_plan
    assert plan.round_to == round_to and plan.to_dict()["round_to"] == round_to
    graph = model_graph(model)
    live = {layer.name: layer.units_alive for layer in report.layers}
    for layer in plan.dense:
        assert layer.units_after >= live[layer.name]
        if layer.is_output or graph.node(layer.name).out_ids.min() < graph.n_features:
            continue
        assert layer.units_after % round_to == 0 or layer.units_after == layer.units_before, layer
    assert rounded.pruning_report.flops_after >= report.flops_after
    if flops:  # the input stays as it is: the pruned model costs what its report says
        assert sparsity_report(rounded, 0.0).flops_before == rounded.pruning_report.flops_after


def randomize_batchnorm(model, rng):
    """BatchNormalization layers with random statistics, scale and offset (a non-zero beta is a trap)."""
    for layer in model.layers:
        if type(layer) is L.BatchNormalization:
            shape = layer.moving_mean.shape
            draws = {"gamma": rng.uniform(0.5, 1.5, shape), "beta": rng.normal(size=shape),
                     "moving_mean": rng.normal(size=shape), "moving_variance": rng.uniform(0.5, 2.0, shape)}
            layer.set_weights([draws[variable.name] for variable in layer.weights])  # without scale or center: fewer


def _separable(layer):
    return len(registry.units_rule(layer).kernels(layer)) > 1


def kill_channels(model, rng, dead=0.3, constant=0.2):
    """Zero random input-channel groups, and all incoming weights of random units (constants)."""
    graph = model_graph(model)
    for node in graph.units:
        layer = graph.layers[node.name]
        weights = layer.get_weights()
        kernel = weights[0]
        view = GroupView().units(kernel, node.in_units).copy()
        view[:, rng.random(node.in_units) < dead, :] = 0.0  # dead inputs of this layer
        view[np.abs(view) < 0.05] *= 1e-4  # some weights below the threshold
        if _separable(layer):
            pointwise = weights[1]
            pointwise[..., np.all(view == 0, axis=(0, 2)), :] = 0.0  # a dead depthwise channel reaches nothing
            if not node.is_output:
                pointwise[..., rng.random(node.out_units) < constant] = 0.0  # units that output act(b)
            weights[1] = pointwise
        elif not node.is_output:
            view[:, :, rng.random(node.out_units) < constant] = 0.0  # units that output act(b)
        weights[0] = view.reshape(kernel.shape)
        if len(weights) > (2 if _separable(layer) else 1):
            bias = weights[-1]
            bias[:] = rng.normal(size=bias.shape) * (rng.random(bias.shape) < 0.7)
            weights[-1] = bias
        layer.set_weights(weights)
    randomize_batchnorm(model, rng)


ACTIVATIONS = ["relu", "tanh", "linear", "sigmoid"]


@st.composite
def cnns(draw):
    dims = draw(st.sampled_from([1, 2]))
    size = draw(st.integers(6, 9))
    channels = draw(st.integers(1, 3))
    shape = (size,) * dims + (channels,)
    conv = L.Conv1D if dims == 1 else L.Conv2D
    separable = L.SeparableConv1D if dims == 1 else L.SeparableConv2D
    depthwise = L.DepthwiseConv1D if dims == 1 else L.DepthwiseConv2D
    pool = draw(st.sampled_from([L.MaxPooling1D, L.AveragePooling1D] if dims == 1
                                else [L.MaxPooling2D, L.AveragePooling2D]))
    padding_layer = L.ZeroPadding1D if dims == 1 else L.ZeroPadding2D
    layers = [partial(keras.Input, shape)]
    spatial = size
    for block in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["conv", "conv", "separable", "depthwise"]))
        kernel = draw(st.integers(1, 3))
        padding = draw(st.sampled_from(["valid", "same"]))
        if padding == "valid" and spatial - kernel + 1 < 2:
            padding = "same"
        activation = draw(st.sampled_from(ACTIVATIONS))
        filters = draw(st.integers(2, 6))
        if kind == "depthwise":
            layers.append(partial(depthwise, kernel, padding=padding, activation=activation))
            if padding == "valid":
                spatial = spatial - kernel + 1  # the depthwise layer shrinks the map; the 1x1 conv after it does not
            kind = "conv"
            kernel = 1
        make = conv if kind == "conv" else separable
        layers.append(partial(make, filters, kernel, padding=padding, activation=activation))
        if padding == "valid":
            spatial = spatial - kernel + 1
        if draw(st.booleans()):
            layers.append(L.BatchNormalization)
        if draw(st.booleans()) and spatial >= 4:
            pool_padding = draw(st.sampled_from(["valid", "same"]))
            layers.append(partial(pool, 2, padding=pool_padding))
            spatial = spatial // 2 if pool_padding == "valid" else -(-spatial // 2)
        if draw(st.booleans()):
            layers.append(partial(padding_layer, 1))
            spatial += 2
    head = draw(st.sampled_from(["flatten", "gap", "gmp"]))
    layers.append({"flatten": L.Flatten, "gap": (L.GlobalAveragePooling1D if dims == 1 else L.GlobalAveragePooling2D),
                   "gmp": (L.GlobalMaxPooling1D if dims == 1 else L.GlobalMaxPooling2D)}[head])
    if draw(st.booleans()):
        layers.append(partial(L.Dense, draw(st.integers(2, 6)), activation=draw(st.sampled_from(ACTIVATIONS))))
        if draw(st.booleans()):
            layers.append(L.BatchNormalization)
    layers.append(partial(L.Dense, 3, activation=draw(st.sampled_from(["linear", "softmax"]))))
    seed = draw(st.integers(0, 10_000))
    return layers, seed


# 20 random CNNs on TensorFlow and PyTorch, 10 on JAX (tests/_examples.py).
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cnns())
def test_pruned_cnn_equals_thresholded_original(case):
    makers, seed = case
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([make() for make in makers])
    rng = np.random.default_rng(seed)
    kill_channels(model, rng)
    x = rng.normal(size=(5,) + tuple(model.inputs[0].shape[1:])).astype("float32")
    before = [w.copy() for w in model.get_weights()]
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ()
    if not unit_masks(model, T).live_path:  # every path is dead: a clear error, nothing to prune to
        with pytest.raises(InvalidParameterError, match="path of"):
            prune_model(model, T)
        return
    small = prune_model(model, T)
    assert_same_outputs(small, model, x)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # the model is not changed
    # The pruned model has the reported sizes. A sequence's channels are features: the report counts the
    # selected ones, what the model that takes only them (inputs="selected") has; an image keeps its channels.
    sequence = len(model.inputs[0].shape) == 3
    sized = prune_model(model, T, inputs="selected") if sequence else small
    first = len(report.selected_features) if sequence else report.layers[0].groups
    assert [node.in_units for node in model_graph(sized).units] == [first] + [
        layer.units_alive for layer in report.layers[:-1]]
    assert [node.out_units for node in model_graph(sized).units] == [layer.units_alive for layer in report.layers]
    assert sparsity_report(sized, 0.0).flops_before == report.flops_after
    assert_rounded(model, x, (2, 3, 4)[seed % 3], report, flops=not sequence, fold_batchnorm=seed % 2 == 0)


def vgg(channels=(8, 16), dense=32, classes=10, batchnorm=True):
    layers = [keras.Input((28, 28, 1))]
    for c in channels:
        layers.append(L.Conv2D(c, 3, padding="same"))
        if batchnorm:
            layers.append(L.BatchNormalization())
        layers += [L.ReLU(), L.MaxPooling2D()]
    layers += [L.Flatten(), L.Dense(dense, activation="relu"), L.Dense(classes, activation="softmax")]
    return keras.Sequential(layers)


def test_depthwise_convolutions_count_their_window_per_channel_kept_in_the_flops():
    """A depthwise convolution's multiply-adds (its window at every output position, per channel) are in the FLOPs:
    before, after (at the channels that stay), in the pruned model's count, and in what one channel costs."""
    from keras_group_lasso.costs import unit_costs
    from keras_group_lasso.graph import model_graph

    model = keras.Sequential([keras.Input((12, 12, 3)), L.Conv2D(6, 1, use_bias=False, name="expand"),
                              L.DepthwiseConv2D(3, strides=2, padding="same", name="dw"), L.ReLU(),
                              L.Conv2D(4, 1, name="project"), L.GlobalAveragePooling2D(), L.Dense(2, name="head")])
    dead = [1, 4]  # channels of the expansion nobody reads: the depthwise window over them goes too
    kernel = model.get_layer("project").get_weights()
    kernel[0][:, :, dead, :] = 0.0
    model.get_layer("project").set_weights(kernel)
    report = sparsity_report(model, T)
    dense_units = 12 * 12 * 3 * 6 + 6 * 6 * 6 * 4 + 4 * 2
    assert report.per_channel == (("dw (DepthwiseConv2D)", 6 * 6 * 9 * 6, 6 * 6 * 9 * 4),)
    assert report.flops_before == dense_units + 6 * 6 * 9 * 6
    assert report.flops_after == 12 * 12 * 3 * 4 + 6 * 6 * 4 * 4 + 4 * 2 + 6 * 6 * 9 * 4
    assert "of which per channel: 1,944 -> 1,296 in 1 depthwise layers" in str(report)
    assert report.to_dict()["per_channel"] == [["dw (DepthwiseConv2D)", 1944, 1296]]
    small = prune_model(model, T)
    assert sparsity_report(small, T).flops_before == report.flops_after
    graph = model_graph(model)
    each = unit_costs(graph, "flops")[int(graph.node("expand").out_ids[0])]
    assert each == pytest.approx(12 * 12 * 3 + 6 * 6 * 9 + 6 * 6 * 4)  # made, slid over, read


def test_add_group_sparsity_gives_channel_groups_to_the_cnn():
    sparse = add_group_sparsity(vgg(), 1e-4)
    convs = [layer for layer in sparse.layers if type(layer) is L.Conv2D]
    dense = [layer for layer in sparse.layers if type(layer) is L.Dense]
    assert convs[0].kernel_regularizer.role == "input" and convs[1].kernel_regularizer.role == "hidden"
    assert convs[1].kernel_regularizer.channels is None
    assert dense[0].kernel_regularizer.channels == 16  # Flatten of a (7, 7, 16) map: whole channels
    assert dense[1].kernel_regularizer.channels is None


def test_report_counts_live_channels_and_flops():
    model = vgg(channels=(4, 6), dense=5, classes=3, batchnorm=False)
    conv2 = model.layers[3]
    kernel = conv2.get_weights()
    kernel[0][..., [1, 3], :] = 0.0  # channels 1 and 3 of the first convolution are read by nobody
    conv2.set_weights(kernel)
    report = sparsity_report(model, T)
    first, second, head, out = report.layers
    assert (first.units, first.units_alive) == (4, 2)
    assert (second.groups, second.groups_alive) == (4, 2)
    assert first.flops_before == 28 * 28 * 9 * 1 * 4 and first.flops_after == 28 * 28 * 9 * 1 * 2
    assert second.flops_before == 14 * 14 * 9 * 4 * 6 and second.flops_after == 14 * 14 * 9 * 2 * 6
    assert head.flops_before == 7 * 7 * 6 * 5
    assert report.flops_before == sum(layer.flops_before for layer in report.layers)
    assert "FLOPs:" in str(report)
    small = prune_model(model, T)
    assert small.layers[0].filters == 2
    assert_same_outputs(small, model, np.random.default_rng(0).normal(size=(2, 28, 28, 1)).astype("float32"))


def test_constant_channel_before_same_padding_is_kept_unless_it_is_zero():
    def model_with(bias):
        model = keras.Sequential([keras.Input((6, 6, 1)), L.Conv2D(2, 3, padding="same", name="a"),
                                  L.Conv2D(2, 3, padding="same", name="b"), L.Flatten(), L.Dense(2)])
        kernel, b = model.layers[0].get_weights()
        kernel[..., 1] = 0.0  # channel 1 of "a" is the constant relu(bias)
        model.layers[0].set_weights([kernel, np.array([0.5, bias], np.float32)])
        return model

    x = np.random.default_rng(1).normal(size=(3, 6, 6, 1)).astype("float32")
    nonzero = model_with(2.0)  # constant 2.0: "b" sees zeros at the border, not 2.0 -> keep it
    assert sparsity_report(nonzero, T).layers[0].units_alive == 2
    assert_same_outputs(prune_model(nonzero, T), nonzero, x)
    zero = model_with(0.0)  # constant 0: padding changes nothing -> removed
    assert sparsity_report(zero, T).layers[0].units_alive == 1
    assert_same_outputs(prune_model(zero, T), zero, x)


@pytest.mark.quick
def test_constant_channel_is_folded_into_a_valid_convolution_and_a_dense_head():
    model = keras.Sequential([keras.Input((6, 6, 1)), L.Conv2D(3, 3, activation="relu", name="a"),
                              L.BatchNormalization(), L.Conv2D(2, 2, name="b"), L.Flatten(), L.Dense(2)])
    rng = np.random.default_rng(2)
    kill = model.layers[0].get_weights()
    kill[0][..., 2] = 0.0
    kill[1][:] = [0.1, 0.2, 0.7]
    model.layers[0].set_weights(kill)
    bn = model.layers[1]
    bn.set_weights([rng.uniform(0.5, 1.5, 3), rng.normal(size=3), rng.normal(size=3), rng.uniform(0.5, 2, 3)])
    report = sparsity_report(model, T)
    assert report.layers[0].constant_units == 1 and report.layers[0].units_alive == 2
    small = prune_model(model, T)
    assert small.get_layer("a").filters == 2 and small.get_layer("b").kernel.shape[-2] == 2
    assert_same_outputs(small, model, rng.normal(size=(3, 6, 6, 1)).astype("float32"))


@pytest.mark.parametrize("proximal", [False, True])
def test_group_sparse_training_of_a_small_cnn_prunes_exactly(proximal):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 28, 28, 1)).astype("float32")
    y = (x[:, 10:18, 10:18, 0].mean(axis=(1, 2)) > 0).astype("int32")
    model = add_group_sparsity(vgg(channels=(6, 8), dense=12, classes=2), 3e-3 if proximal else 2e-2)
    optimizer = Proximal(keras.optimizers.SGD(0.05, momentum=0.9)) if proximal else keras.optimizers.Adam(3e-3)
    model.compile(optimizer, "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    report = sparsity_report(model, T)
    assert report.flops_after <= report.flops_before and report.uninterpreted_layers == ()
    small = prune_model(model, T)  # trained weights (BatchNormalization statistics included): still exact
    assert_same_outputs(small, model, x[:8])


class ChannelScale(keras.layers.Layer):
    """A user's per-channel layer: y = x * scale[c]."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return x * self.scale

    def compute_output_shape(self, input_shape):
        return input_shape


def test_a_registered_per_channel_layer_is_sliced_and_pruned_exactly():
    def model():
        m = keras.Sequential([keras.Input((6, 6, 2)), L.Conv2D(4, 3, name="a"), ChannelScale(name="scale"),
                              L.Conv2D(3, 3, name="b"), L.Flatten(), L.Dense(2)])
        m.get_layer("scale").set_weights([np.array([0.5, 2.0, -1.0, 3.0], np.float32)])
        kernel = m.get_layer("b").get_weights()
        kernel[0][..., 1, :] = 0.0  # channel 1 of "a" is read by nobody
        m.get_layer("b").set_weights(kernel)
        return m

    # Unregistered, it is recognized by what it computes (x times one weight per channel) ...
    m = model()
    small = prune_model(m, T)
    np.testing.assert_array_equal(small.get_layer("scale").get_weights()[0], [0.5, -1.0, 3.0])
    assert_same_outputs(small, m, np.random.default_rng(0).normal(size=(2, 6, 6, 2)).astype("float32"))
    # ... and a registered rule, with the user's own slicer, takes precedence.
    rule = registry.register_layer(ChannelScale, slicer=lambda layer, kept: (layer.get_config(),
                                                                          [layer.get_weights()[0][kept]]))
    try:
        assert rule.kind == "per_unit" and "ChannelScale" in registry.supported_text()
        m = model()
        small = prune_model(m, T)
        np.testing.assert_array_equal(small.get_layer("scale").get_weights()[0], [0.5, -1.0, 3.0])
        assert_same_outputs(small, m, np.random.default_rng(0).normal(size=(2, 6, 6, 2)).astype("float32"))
    finally:
        registry.unregister_layer(ChannelScale)
    with pytest.raises(InvalidParameterError, match=r"register_layer: argument `cls` must be a "
                                                    r"keras.layers.Layer subclass or a LayerRule instance; received 3\."):
        registry.register_layer(3)


def _thirteen_and_five():
    """conv1 with 13 of 16 channels read, conv2 with 5 of 16 channels that vary (the others constant)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 2)), L.Conv2D(16, 3, padding="same", name="conv1"),
                              L.BatchNormalization(), L.ReLU(), L.Conv2D(16, 3, padding="valid", name="conv2"),
                              L.ReLU(), L.GlobalAveragePooling2D(), L.Dense(3, name="out")])
    randomize_batchnorm(model, np.random.default_rng(0))
    kernel, bias = model.get_layer("conv2").get_weights()
    kernel[:, :, 13:, :] = 0.0  # nothing reads conv1's channels 13-15
    constant = [0, 2, 3, 5, 7, 8, 9, 11, 12, 14, 15]
    kernel[..., constant] = 0.0  # these output relu(b) everywhere: folded into the Dense bias
    model.get_layer("conv2").set_weights([kernel, np.linspace(-1, 1, 16).astype("float32")])
    return model


def test_round_to_keeps_a_multiple_of_units_per_layer_with_the_same_outputs():
    model = _thirteen_and_five()
    x = np.random.default_rng(1).normal(size=(4, 8, 8, 2)).astype("float32")
    exact = prune_model(model, T)
    assert exact.pruning_plan.layer_sizes_after == (2, 13, 5)
    assert exact.get_layer("conv2").get_weights()[0].shape == (3, 3, 13, 5)
    rounded = prune_model(model, T, round_to=8)
    plan = rounded.pruning_plan
    assert plan.layer_sizes_after == (2, 16, 8) and plan.round_to == 8
    assert rounded.pruning_report.layer_sizes == (2, 16, 8)
    # conv2 keeps its 5 varying channels and the 3 lowest constant ones (which now are computed, not folded)
    conv2 = {layer.name: layer for layer in plan.dense}["conv2"]
    assert conv2.kept_units == (0, 1, 2, 3, 4, 6, 10, 13)
    assert rounded.get_layer("conv2").get_weights()[0].shape == (3, 3, 16, 8)
    assert_same_outputs(rounded, model, x)
    assert_same_outputs(prune_model(model, T, round_to=3), model, x)
    assert prune_model(model, T, round_to=3).pruning_plan.layer_sizes_after == (2, 15, 6)
    # the report of the model itself is not rounded
    assert sparsity_report(model, T).layer_sizes == (2, 13, 5)


def test_round_to_rounds_a_residual_stream_once():
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 1))
    stem = L.Conv2D(16, 3, padding="same", name="stem")(inp)
    y = L.Conv2D(4, 3, padding="same", activation="relu", name="inner")(stem)
    y = L.Conv2D(16, 3, padding="same", name="back")(y)
    x = L.Add(name="add")([stem, y])
    model = keras.Model(inp, L.Dense(2, name="out")(L.GlobalAveragePooling2D()(x)))
    for name in ("inner", "out"):  # stream channels 10-15: no layer reads them
        weights = model.get_layer(name).get_weights()
        weights[0][..., 10:, :] = 0.0
        model.get_layer(name).set_weights(weights)
    assert prune_model(model, T).pruning_plan.layer_sizes_after == (1, 10, 4, 10)
    rounded = prune_model(model, T, round_to=8)
    assert rounded.pruning_plan.layer_sizes_after == (1, 16, 8 // 2, 16)  # inner: 4 of 4, all it has
    x = np.random.default_rng(0).normal(size=(3, 6, 6, 1)).astype("float32")
    assert_same_outputs(rounded, model, x)


def test_fold_batchnorm_merges_a_batchnorm_into_the_layer_it_follows(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 2))
    a = L.BatchNormalization(name="bn_a")(L.Conv2D(6, 3, use_bias=False, name="a")(inp))
    b = L.Conv2D(6, 3, activation="relu", name="b")(L.ReLU()(a))
    b = L.BatchNormalization(name="bn_b")(b)  # after an activation: kept
    c = L.Conv2D(6, 1, name="c")(b)
    c = L.Add()([c, L.BatchNormalization(name="bn_c")(c)])  # c has another reader: kept
    s = L.BatchNormalization(name="bn_s", center=False)(L.SeparableConv2D(4, 3, padding="same", name="s")(c))
    model = keras.Model(inp, L.Dense(3, name="out")(L.GlobalAveragePooling2D()(s)))
    rng = np.random.default_rng(0)
    randomize_batchnorm(model, rng)
    kernel = model.get_layer("b").get_weights()
    kernel[0][..., 2, :] = 0.0  # a dead channel of a: bn_a is sliced, then merged
    model.get_layer("b").set_weights(kernel)
    x = rng.normal(size=(4, 8, 8, 2)).astype("float32")

    small = prune_model(model, T, fold_batchnorm=True)
    assert small.folded_batchnorms == {"bn_a": "a", "bn_s": "s"}
    names = [layer.name for layer in small.layers]
    assert "bn_a" not in names and "bn_s" not in names and "bn_b" in names and "bn_c" in names
    assert small.get_layer("a").use_bias and small.get_layer("a").get_weights()[0].shape == (3, 3, 2, 5)
    assert_same_outputs(small, model, x)
    small.save(tmp_path / "folded.keras")
    loaded = keras.saving.load_model(tmp_path / "folded.keras")
    np.testing.assert_allclose(outputs(loaded, x)[0], outputs(small, x)[0], rtol=0, atol=1e-6)
    assert prune_model(model, T).folded_batchnorms == {}
    with pytest.raises(InvalidParameterError) as info:
        prune_model(model, T, fold_batchnorm="yes")
    assert str(info.value) == "prune_model: argument `fold_batchnorm` must be a bool; received 'yes'."


@pytest.mark.parametrize("value", [0, -8, 2.5, True, "8", None])
def test_round_to_must_be_a_positive_integer(value, tmp_path):
    from keras_group_lasso import export_pruned, plan_pruning

    model = _thirteen_and_five()
    for owner, call in (("prune_model", lambda: prune_model(model, T, round_to=value)),
                        ("plan_pruning", lambda: plan_pruning(model, T, round_to=value)),
                        ("export_pruned", lambda: export_pruned(model, tmp_path / "x", round_to=value))):
        with pytest.raises(InvalidParameterError) as info:
            call()
        assert str(info.value) == f"{owner}: argument `round_to` must be an integer >= 1; received {value!r}."


def test_refusals_name_the_layer_and_carry_what_the_registry_supports():
    first = keras.Sequential([keras.Input((4, 6, 6)), L.Conv2D(4, 3, data_format="channels_first", name="g"),
                              L.Flatten(), L.Dense(2)])
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(first, T)
    message = str(info.value)
    assert message.startswith("prune_model: cannot prune layer 'g' (Conv2D): a convolution with "
                              "data_format='channels_first'.")
    assert "layers that make units: " + ", ".join(registry.supported_of("units")) in info.value.supported
    assert message.endswith(registry.WHAT_TO_DO) and len(message.splitlines()) == 2
    assert "Conv2DTranspose" in registry.supported_of("units")
    many = keras.Sequential([keras.Input((6, 6, 2)), L.DepthwiseConv2D(3, depth_multiplier=2, name="dw"),
                             L.Flatten(), L.Dense(2)])
    with pytest.raises(UnsupportedModelError, match=r"'dw' \(DepthwiseConv2D\): a DepthwiseConv with depth_multiplier > 1"):
        prune_model(many, T)

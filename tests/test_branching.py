"""Residual and branching networks: coupled units, found by the graph and pruned exactly."""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_group_lasso import prune_model, sparsity_report
from keras_group_lasso.analysis import unit_masks
from keras_group_lasso.graph import model_graph, registry
from test_cnn import assert_rounded, assert_same_outputs, outputs, randomize_batchnorm, thresholded_outputs
from _examples import examples

L = keras.layers
T = 1e-3
MERGES = [L.Add, L.Subtract, L.Average, L.Maximum, L.Minimum, L.Multiply]
ACTIVATIONS = ["relu", "tanh", "linear", "sigmoid"]


def kill_units(model, rng, dead=0.3, constant=0.25, dead_layer=0.15):
    """Zero random input groups and all incoming weights of random units (of whole layers, sometimes:
    a dead block), with random biases."""
    graph = model_graph(model)
    for node in graph.units:
        layer = graph.layers[node.name]
        weights = layer.get_weights()
        group_view = registry.units_rule(layer).view_of(layer)
        view = group_view.units(weights[0], node.in_units).copy()
        view[:, rng.random(node.in_units) < dead, :] = 0.0
        view[np.abs(view) < 0.05] *= 1e-4  # below the threshold
        if not node.is_output:
            view[:, :, rng.random(node.out_units) < constant] = 0.0  # these output act(b) everywhere
            if rng.random() < dead_layer:
                view[:] = 0.0  # every unit outputs act(b): a constant branch when nothing else feeds it
        weights[0] = group_view.kernel(view, weights[0].shape)
        if len(weights) > 1:
            weights[1] = rng.normal(size=weights[1].shape) * (rng.random(weights[1].shape) < 0.7)
        layer.set_weights(weights)
    randomize_batchnorm(model, rng)


@st.composite
def branching(draw):
    """A random functional model: a stream of width ``w`` through residual, projection, concatenation
    and gating blocks (Dense for flat inputs, convolutions for maps), with BatchNormalization."""
    image = draw(st.booleans())
    if image:
        spatial = draw(st.integers(5, 7))
        width = draw(st.integers(1, 3))
        shape = (spatial, spatial, width)
    else:
        width = draw(st.integers(2, 6))
        shape = (width,)
    blocks = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["identity", "projection", "concat", "merge", "input_shortcut", "split"]))
        blocks.append(dict(
            kind=kind,
            merge=draw(st.sampled_from(MERGES)),
            units=draw(st.integers(2, 5)),
            activation=draw(st.sampled_from(ACTIVATIONS)),
            batchnorm=draw(st.booleans()),
            kernel=draw(st.integers(1, 3)),
            relu_after=draw(st.booleans()),
        ))
    head = draw(st.sampled_from(["flatten", "gap"])) if image else "none"
    outputs = draw(st.sampled_from([1, 1, 2]))
    return shape, image, blocks, head, outputs, draw(st.integers(0, 10_000))


def build(shape, image, blocks, head, n_outputs):
    inp = keras.Input(shape, name="features")
    x = inp
    width = shape[-1]

    def make(units, block, kernel=None, activation=None):
        activation = block["activation"] if activation is None else activation
        if image:
            return L.Conv2D(units, kernel or block["kernel"], padding="same", activation=activation)
        return L.Dense(units, activation=activation)

    def norm(y, block):
        return L.BatchNormalization()(y) if block["batchnorm"] else y

    for block in blocks:
        kind = block["kind"]
        if kind == "input_shortcut" and x is not inp:
            kind = "identity"
        if kind in ("identity", "input_shortcut"):  # x + f(x), the stream keeps its width
            y = norm(make(block["units"], block)(x), block)
            y = make(width, block)(y)
            x = block["merge"]()([x, y]) if block["merge"] is not L.Subtract else L.Subtract()([x, y])
        elif kind == "projection":  # proj(x) + f(x): a new width
            y = norm(make(block["units"], block)(x), block)
            y = make(block["units"], block)(y)
            shortcut = make(block["units"], block, kernel=1, activation="linear")(x)
            x = L.Add()([shortcut, y])
            width = block["units"]
        elif kind == "concat":  # [f(x), g(x)] or [x, f(x)]
            a = norm(make(block["units"], block)(x), block)
            b = make(2, block)(x) if block["batchnorm"] else x
            x = L.Concatenate()([a, b])
            width = block["units"] + (2 if block["batchnorm"] else width)
        elif kind == "split" and width >= 2:  # [f(x[..., :k]), x[..., k:]]: keras.ops.split, or a slice
            at = 1 + block["units"] % (width - 1)
            a, b = keras.ops.split(x, [at], axis=-1)
            if block["relu_after"]:
                b = x[..., at:]
            a = norm(make(block["units"], block)(a), block)
            x = L.Concatenate()([a, b])
            width = block["units"] + width - at
        else:  # a gate: x * sigmoid(f(x)), or another merge of two branches
            gate = make(width, block, activation="sigmoid")(x)
            x = block["merge"]()([norm(x, block), gate])
        if block["relu_after"]:
            x = L.ReLU()(x)
    if head == "flatten":
        x = L.Flatten()(x)
    elif head == "gap":
        x = L.GlobalAveragePooling2D()(x)
    outs = [L.Dense(3, name=f"out{i}")(x) for i in range(n_outputs)]
    return keras.Model(inp, outs if n_outputs > 1 else outs[0])


# 20 random graphs on TensorFlow and PyTorch, 10 on JAX (tests/_examples.py).
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(branching())
def test_pruned_branching_model_equals_thresholded_original(case):
    shape, image, blocks, head, n_outputs, seed = case
    keras.utils.set_random_seed(seed)
    model = build(shape, image, blocks, head, n_outputs)
    rng = np.random.default_rng(seed)
    kill_units(model, rng)
    before = [w.copy() for w in model.get_weights()]
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ()
    masks = unit_masks(model, T)
    if not masks.live_path:
        return
    small = prune_model(model, T)
    x = rng.normal(size=(4,) + shape).astype("float32")
    assert_same_outputs(small, model, x)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # the model is not changed
    if image:  # the input channels all stay: the pruned model costs what the report says
        assert sparsity_report(small, 0.0).flops_before == report.flops_after
        assert small.count_params() <= model.count_params()
        assert_rounded(model, x, (2, 3, 4)[seed % 3], report, fold_batchnorm=seed % 2 == 0)
    else:  # with the input reduced to the selected features, too
        selected = prune_model(model, T, inputs="selected")
        xs = x[:, list(selected.kept_features)]
        for a, b in zip(outputs(selected, xs), thresholded_outputs(model, x)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.max(np.abs(b)))))
        assert sparsity_report(selected, 0.0).flops_before == report.flops_after
        assert selected.count_params() <= model.count_params()
        assert_rounded(model, x, (2, 3, 4)[seed % 3], report, flops=False, fold_batchnorm=seed % 2 == 0)


def _residual_mlp():
    inp = keras.Input((4,), name="features")
    h = L.Dense(3, activation="relu", name="inner")(inp)
    h = L.Dense(4, name="back")(h)
    x = L.Add(name="add")([inp, h])
    return keras.Model(inp, L.Dense(2, name="out")(x))


def test_a_unit_of_a_residual_stream_goes_only_when_no_layer_reads_it():
    model = _residual_mlp()
    inner = np.ones((4, 3), "float32")
    back = np.ones((3, 4), "float32")
    out = np.ones((4, 2), "float32")
    inner[3] = 0.0  # feature 3 is not read by 'inner' ...
    back[:, 3] = 0.0  # ... nor made by 'back' ...
    out[3] = 0.0  # ... nor read by 'out': the coupled unit 3 goes everywhere
    out[2] = 0.0  # unit 2 is read by 'inner' only: it stays in 'back' and the input
    model.get_layer("inner").set_weights([inner, np.zeros(3, "float32")])
    model.get_layer("back").set_weights([back, np.zeros(4, "float32")])
    model.get_layer("out").set_weights([out, np.zeros(2, "float32")])
    masks = unit_masks(model, T)
    np.testing.assert_array_equal(masks.features, [True, True, True, False])
    np.testing.assert_array_equal(masks.units["back"], [True, True, True, False])
    np.testing.assert_array_equal(masks.inputs["out"], [True, True, True, False])
    small = prune_model(model, T)
    assert small.get_layer("back").kernel.shape == (3, 3)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    assert_same_outputs(small, model, x)
    selected = prune_model(model, T, inputs="selected")
    assert selected.inputs[0].shape == (None, 3)


def test_constant_operand_of_a_merge_keeps_its_channel_when_the_other_varies():
    model = _residual_mlp()
    rng = np.random.default_rng(1)
    back = rng.normal(size=(3, 4)).astype("float32")
    back[:, 1] = 0.0  # 'back' unit 1 is constant (its bias), the input's feature 1 varies
    model.get_layer("inner").set_weights([rng.normal(size=(4, 3)), rng.normal(size=3)])
    model.get_layer("back").set_weights([back, rng.normal(size=4)])
    model.get_layer("out").set_weights([rng.normal(size=(4, 2)), rng.normal(size=2)])
    masks = unit_masks(model, T)
    assert masks.constant["back"][1] and masks.units["back"][1]
    assert_same_outputs(prune_model(model, T), model, rng.normal(size=(5, 4)).astype("float32"))


def _dead_branch(model, name, rng):
    """Zero every incoming weight of ``name``, with a random bias: the layer outputs a constant."""
    layer = model.get_layer(name)
    weights = layer.get_weights()
    weights[0] = np.zeros_like(weights[0])
    if len(weights) > 1:
        weights[1] = rng.normal(size=weights[1].shape).astype("float32")
    layer.set_weights(weights)


@pytest.mark.parametrize("merge", [L.Add, L.Subtract, L.Average, L.Multiply])
@pytest.mark.parametrize("constant_first", [False, True])
def test_a_constant_operand_leaves_with_its_branch_and_the_merge_adds_its_value(merge, constant_first, tmp_path):
    inp = keras.Input((4,), name="features")
    h = L.Dense(3, activation="relu", name="inner")(inp)
    h = L.BatchNormalization(name="norm")(h)
    h = L.Dense(4, activation="tanh", name="back")(h)
    other = L.Dense(4, name="other")(inp)
    x = merge(name="merge")([h, other] if constant_first else [other, h])
    model = keras.Model(inp, L.Dense(2, name="out")(x))
    rng = np.random.default_rng(3)
    for layer in model.layers:
        if layer.weights:
            layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()])
    randomize_batchnorm(model, rng)
    _dead_branch(model, "back", rng)  # 'back' outputs tanh(b): 'inner' and 'norm' feed nothing else
    masks = unit_masks(model, T)
    fold = masks.merge_folds["merge"]
    assert fold.dropped == ((True, False) if constant_first else (False, True))
    assert masks.detached == {"inner", "norm", "back"}
    assert not masks.units["back"].any() and not masks.inputs["inner"].any()
    small = prune_model(model, T)
    plan = small.pruning_plan
    assert plan.folded_merges == {"merge": ("back",)} and set(plan.removed_layers) == {"inner", "norm", "back"}
    assert plan.to_dict()["folded_merges"] == {"merge": ["back"]}
    names = {layer.name for layer in small.layers}
    assert not names & {"inner", "norm", "back"}
    assert isinstance(small.get_layer("merge"), L.Rescaling)  # the merge of one operand is its scale and offset
    x = rng.normal(size=(6, 4)).astype("float32")
    assert_same_outputs(small, model, x)
    report = sparsity_report(model, T)
    assert report.flops_after == sparsity_report(small, 0.0).flops_before == 4 * 4 + 4 * 2
    small.save(tmp_path / "small.keras")  # plain Keras layers only
    again = keras.saving.load_model(tmp_path / "small.keras")
    np.testing.assert_array_equal(outputs(again, x)[0], outputs(small, x)[0])
    assert unit_masks(small, 0.0).merge_folds == {}  # nothing left to fold: pruning again changes nothing
    assert_same_outputs(prune_model(small, 0.0), small, x)


def test_a_merge_that_is_not_affine_keeps_its_constant_operand():
    inp = keras.Input((4,), name="features")
    h = L.Dense(4, name="back")(L.Dense(3, activation="relu", name="inner")(inp))
    x = L.Maximum(name="merge")([inp, h])
    model = keras.Model(inp, L.Dense(2, name="out")(x))
    rng = np.random.default_rng(0)
    _dead_branch(model, "back", rng)
    masks = unit_masks(model, T)
    assert masks.merge_folds == {} and masks.detached == frozenset()
    assert masks.units["back"].all()  # max(x, c) needs c: the constant channel stays
    assert_same_outputs(prune_model(model, T), model, rng.normal(size=(5, 4)).astype("float32"))


def test_a_dead_residual_block_of_a_cnn_goes_whole():
    inp = keras.Input((6, 6, 3), name="image")
    stem = L.Conv2D(4, 3, padding="same", activation="relu", name="stem")(inp)
    h = L.Conv2D(5, 3, padding="same", name="conv_a")(stem)
    h = L.BatchNormalization(name="bn_a")(h)
    h = L.ReLU(name="relu_a")(h)
    h = L.Conv2D(4, 3, padding="same", name="conv_b")(h)
    h = L.BatchNormalization(name="bn_b")(h)
    x = L.ReLU(name="after")(L.Add(name="add")([stem, h]))
    model = keras.Model(inp, L.Dense(3, name="out")(L.GlobalAveragePooling2D(name="gap")(x)))
    rng = np.random.default_rng(1)
    randomize_batchnorm(model, rng)
    _dead_branch(model, "conv_b", rng)  # zero padding or not, a zero kernel outputs its bias everywhere
    masks = unit_masks(model, T)
    assert masks.detached == {"conv_a", "bn_a", "relu_a", "conv_b", "bn_b"}
    small = prune_model(model, T)
    assert {"conv_a", "conv_b", "bn_a", "bn_b"}.isdisjoint(layer.name for layer in small.layers)
    assert_same_outputs(small, model, rng.normal(size=(2, 6, 6, 3)).astype("float32"))
    report = sparsity_report(model, T)
    assert report.flops_after == sparsity_report(small, 0.0).flops_before < report.flops_before / 3


def test_a_rescaling_with_one_value_per_channel_between_convolutions_is_sliced_per_channel():
    inp = keras.Input((5, 5, 2), name="image")
    h = L.Conv2D(4, 3, padding="same", name="conv")(inp)
    h = L.Rescaling(np.array([1.0, 2.0, 3.0, 4.0], "float32"), np.array([0.1, 0.2, 0.3, 0.4], "float32"),
                    name="scale")(h)
    model = keras.Model(inp, L.Dense(3, name="out")(L.Flatten()(h)))
    rng = np.random.default_rng(2)
    kernel, bias = model.get_layer("conv").get_weights()
    kernel[..., 1] = 0.0  # channel 1 varies no more
    model.get_layer("conv").set_weights([kernel, bias])
    weights = model.get_layer("out").get_weights()
    weights[0][2::4] = 0.0  # and nothing reads channel 2
    model.get_layer("out").set_weights(weights)
    small = prune_model(model, T)
    config = small.get_layer("scale").get_config()
    np.testing.assert_allclose(config["scale"], [1.0, 4.0])
    np.testing.assert_allclose(config["offset"], [0.1, 0.4])
    assert_same_outputs(small, model, rng.normal(size=(3, 5, 5, 2)).astype("float32"))


def test_merges_with_broadcasting_are_refused_naming_the_layer():
    inp = keras.Input((4,))
    a = L.Dense(4, name="a")(inp)
    b = L.Dense(1, name="b")(inp)
    model = keras.Model(inp, L.Dense(2)(L.Multiply(name="gate")([a, b])))
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ("gate (Multiply)",)
    with pytest.raises(ValueError, match=r"cannot prune layer 'gate' \(Multiply\): a merge of tensors of shapes \(4,\), \(1,\) that do not broadcast"):
        prune_model(model, T)


def _resnet(classes=3):
    inp = keras.Input((6, 6, 2), name="image")
    x = L.Conv2D(4, 3, padding="same", name="stem")(inp)
    y = L.ReLU()(L.BatchNormalization(name="bn1")(L.Conv2D(4, 3, padding="same", name="c1")(x)))
    y = L.BatchNormalization(name="bn2")(L.Conv2D(4, 3, padding="same", name="c2")(y))
    x = L.ReLU()(L.Add(name="identity")([x, y]))
    y = L.ReLU()(L.Conv2D(6, 3, strides=2, padding="same", name="c3")(x))
    y = L.Conv2D(6, 3, padding="same", name="c4")(y)
    shortcut = L.Conv2D(6, 1, strides=2, name="projection")(x)
    x = L.ReLU()(L.Add(name="projected")([shortcut, y]))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(classes, activation="softmax", name="out")(x))


def test_a_group_sparse_resnet_trains_saves_reports_and_prunes(tmp_path):
    from keras_group_lasso import (
        CoupledGroupLasso, GroupSparseModel, HiddenGroupLasso, InputGroupLasso, Proximal, SparsityMonitor,
        add_group_sparsity, coupled_groups,
    )

    model = add_group_sparsity(_resnet(), 2e-3)
    assert isinstance(model, GroupSparseModel)
    assert isinstance(model.get_layer("stem").kernel.regularizer, InputGroupLasso)
    assert isinstance(model.get_layer("c2").kernel.regularizer, HiddenGroupLasso)  # reads c1 alone
    # the first stream's channels are read by c1 and by the projection and c3 of the next block: one group each
    for name in ("c1", "c3", "projection"):
        assert isinstance(model.get_layer(name).kernel.regularizer, CoupledGroupLasso)
    assert {g.readers for g in coupled_groups(model)} >= {(("c1", c), ("c3", c), ("projection", c)) for c in range(4)}
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 3, 32)
    model.compile(optimizer=Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), loss="sparse_categorical_crossentropy")
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[SparsityMonitor(threshold=T)])
    assert len(history.history["flops"]) == 3 and history.history["flops"][-1] <= 1.0
    path = tmp_path / "resnet.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.get_layer("c1").kernel.regularizer, CoupledGroupLasso)
    report = sparsity_report(loaded, T)
    assert report.uninterpreted_layers == () and report.flops_before == sparsity_report(model, T).flops_before
    small = prune_model(loaded, T)
    assert_same_outputs(small, loaded, x[:4])


def test_report_counts_a_residual_channel_once_and_shows_each_stream():
    model = _residual_mlp()
    inner = np.ones((4, 3), "float32")
    back = np.ones((3, 4), "float32")
    out = np.ones((4, 2), "float32")
    inner[3], back[:, 3], out[3] = 0.0, 0.0, 0.0  # unit 3 of the stream goes
    model.get_layer("inner").set_weights([inner, np.zeros(3, "float32")])
    model.get_layer("back").set_weights([back, np.zeros(4, "float32")])
    model.get_layer("out").set_weights([out, np.zeros(2, "float32")])
    report = sparsity_report(model, T)
    # the stream's channels are input features (a shortcut from the input): not hidden neurons
    assert report.neurons == 3 and report.live_neurons == 3
    (stream,) = report.streams
    assert (stream.name, stream.merges, stream.makers, stream.channels, stream.channels_alive) == (
        "add", ("add",), ("<input>", "back"), 4, 3)
    assert "stream add: 3/4 channels (made by <input>, back)" in str(report)
    assert report.to_dict()["streams"][0]["channels_alive"] == 3


def test_a_channel_made_by_two_layers_is_one_neuron():
    inp = keras.Input((3,))
    h = L.Dense(4, name="h")(inp)
    f = L.Dense(4, name="f")(L.Dense(2, activation="relu", name="f_in")(h))
    out = L.Dense(2, name="out")(L.Add(name="res")([h, f]))
    report = sparsity_report(keras.Model(inp, out), T)
    assert report.neurons == 4 + 2 and report.live_neurons == 6  # h and f make the same 4 channels
    assert [s.makers for s in report.streams] == [("h", "f")]


@pytest.mark.quick
def test_the_parts_of_a_split_of_the_channels_lose_what_they_lose_each(tmp_path):
    # CSPNet's cross-stage block: keras.ops.split into equal parts, one through a convolution, all concatenated;
    # and a slice x[..., a:b] of the same channels. Each part keeps its own live channels, so the parts of the
    # pruned model are no longer equal: it slices them where the original split them.
    inp = keras.Input((6, 6, 3))
    x = L.Conv2D(9, 3, padding="same", name="expand")(inp)
    a, b, c = keras.ops.split(x, 3, axis=-1)
    a = L.Conv2D(4, 1, name="through")(a)
    d = L.Conv2D(2, 1, name="sliced")(x[..., 2:5])
    y = L.Concatenate(name="joined")([a, b, c, d])
    model = keras.Model(inp, L.Conv2D(2, 1, name="out")(y))
    kernel, bias = model.get_layer("expand").get_weights()
    kernel[..., [1, 3, 4, 8]] = 0.0  # dead channels: one of a, two of b (also read by the slice), one of c
    model.get_layer("expand").set_weights([kernel, bias * 0.0])
    rng = np.random.default_rng(0)
    x_in = rng.normal(size=(2, 6, 6, 3)).astype("float32")
    small = prune_model(model, T)
    assert_same_outputs(small, model, x_in)
    assert small.get_layer("expand").get_config()["filters"] == 5
    assert small.get_layer("through").get_weights()[0].shape[2] == 2
    assert small.get_layer("sliced").get_weights()[0].shape[2] == 1  # of 2:5, channel 2 alone is live
    assert [step.kind for step in small.pruning_plan.steps].count("slice_channels") == 4
    path = tmp_path / "split.keras"
    small.save(path)
    again = keras.saving.load_model(path)  # plain Keras: the slices are keras.ops
    np.testing.assert_allclose(outputs(again, x_in)[0], outputs(small, x_in)[0], rtol=0, atol=1e-6)


def test_a_flattened_map_concatenated_with_a_vector_is_refused_with_what_is_read():
    from keras_group_lasso import UnsupportedModelError

    L = keras.layers
    image, numbers = keras.Input((6, 6, 1), name="image"), keras.Input((5,), name="numbers")
    flat = L.Flatten()(L.Conv2D(4, 3, name="conv")(image))
    refused = keras.Model([image, numbers], L.Dense(2)(L.Dense(6)(L.Concatenate(name="join")([flat, numbers]))))
    with pytest.raises(UnsupportedModelError, match=r"cannot prune layer 'join' \(Concatenate\): a Concatenate of "
                       r"flattened maps or of the input's elements \(what is read: a Dense after the Flatten, or "
                       r"global pooling in its place, before the Concatenate\)"):
        prune_model(refused, T)
    # what the message says is read
    rng = np.random.default_rng(0)
    for head in (lambda: L.Dense(3, name="after")(L.Flatten()(L.Conv2D(4, 3, name="conv")(image))),
                 lambda: L.GlobalAveragePooling2D()(L.Conv2D(4, 3, name="conv")(image))):
        model = keras.Model([image, numbers], L.Dense(2)(L.Dense(6)(L.Concatenate()([head(), numbers]))))
        kernel, bias = model.get_layer("conv").get_weights()
        kernel[..., 1] = 0.0
        model.get_layer("conv").set_weights([kernel, bias])
        x = [rng.normal(size=(3, 6, 6, 1)).astype("float32"), rng.normal(size=(3, 5)).astype("float32")]
        assert_same_outputs(prune_model(model, T), model, x)

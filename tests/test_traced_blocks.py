"""Blocks written as subclassed layers are seen inside: their call is traced into the graph.

keras.io writes residual and Transformer blocks as a ``keras.layers.Layer`` whose ``call`` chains Keras layers and
keras.ops. The graph calls such a block once on a symbolic input: its sublayers and ops become nodes named
``"<block>/<layer>"``, so the Dense layers and attention heads inside get group penalties, are reported and are
pruned exactly like any other. The pruned model holds the block's own class again, built from its config with the
widths its layers kept, where Keras can make it from its config and it computes what those layers compute; else
plain Keras layers in place of the block.
"""

import warnings

import keras
import numpy as np
import pytest
from _fresh_process import assert_loads_without_this_package
from test_model_families import T, assert_prunes_exactly_and_reloads

from keras_group_lasso import (
    InvalidParameterError,
    UnsupportedModelError,
    add_group_sparsity,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import graph_model, model_graph

L = keras.layers


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class ResidualBlock(L.Layer):
    """A residual block as keras.io writes one: a Layer made of layers, ``x + outer(inner(x))``."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.inner = L.Dense(units, activation="relu", name="inner")
        self.outer = L.Dense(units, name="outer")

    def call(self, x):
        return x + self.outer(self.inner(x))

    def get_config(self):
        return dict(super().get_config(), units=self.units)


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class FeedForward(L.Layer):
    """A block holding a Sequential and another block: traced at every depth."""

    def __init__(self, units, hidden, **kwargs):
        super().__init__(**kwargs)
        self.units, self.hidden = units, hidden
        self.ffn = keras.Sequential([L.Dense(hidden, activation="relu"), L.Dense(units)])
        self.norm = L.LayerNormalization()
        self.residual = ResidualBlock(units)

    def call(self, x):
        return self.residual(self.norm(x + self.ffn(x)))

    def get_config(self):
        return dict(super().get_config(), units=self.units, hidden=self.hidden)


class TransformerBlock(L.Layer):
    """keras.io's text-classification Transformer block, as keras.io writes it (no ``get_config``, no ``name``
    argument)."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = L.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([L.Dense(ff_dim, activation="relu"), L.Dense(embed_dim)])
        self.layernorm1 = L.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = L.LayerNormalization(epsilon=1e-6)
        self.dropout1 = L.Dropout(rate)
        self.dropout2 = L.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)


def residual_model():
    inputs = keras.Input((6,))
    h = L.Dense(8, activation="relu", name="first")(inputs)
    h = ResidualBlock(8, name="block0")(h)
    h = ResidualBlock(8, name="block1")(h)
    return keras.Model(inputs, L.Dense(2, name="out")(h))


def nested_model():
    inputs = keras.Input((6,))
    h = L.Dense(8, activation="tanh", name="first")(inputs)
    h = FeedForward(8, 12, name="ff")(h)
    return keras.Model(inputs, L.Dense(3, name="out")(h))


def transformer_model():
    inputs = keras.Input((10,))
    x = L.Embedding(40, 16, name="embed")(inputs)
    x = TransformerBlock(16, 4, 24)(x)
    x = L.GlobalAveragePooling1D(name="pool")(x)
    x = L.Dense(12, activation="relu", name="hidden")(x)
    return keras.Model(inputs, L.Dense(2, name="out")(x))


def sparsify(model, rng, dead=0.35):
    """Random group sparsity on every units node of the graph, inside blocks too: a third of each layer's output
    units lose their kernel column (they output ``act(b)``, a constant), a third of its attention heads their
    output rows; every other weight is moved away from the threshold."""
    graph = model_graph(model)
    for node in graph.units:
        layer = graph.layers[node.name]
        heads = registry.units_rule(layer).head_kernel(layer)
        if heads is not None:
            value = keras.ops.convert_to_numpy(heads).copy()
            value[rng.random(value.shape[0]) < dead] = 0.0
            heads.assign(value)
            continue
        weights = layer.get_weights()
        kernel = weights[0] + np.sign(weights[0]) * 0.01
        if node.name != "out":  # the model's outputs stay
            kernel[..., rng.random(kernel.shape[-1]) < dead] = 0.0
        weights[0] = kernel
        if len(weights) > 1:
            weights[1] = rng.normal(size=weights[1].shape).astype(weights[1].dtype) * 0.3
        layer.set_weights(weights)


def penalty_warnings(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    return sparse, [str(w.message) for w in caught if "get no group penalty" in str(w.message)]


@pytest.mark.quick
def test_the_layers_inside_a_block_are_nodes_of_the_graph():
    graph = model_graph(residual_model())
    assert graph.supported and graph.problems == ()
    assert [node.name for node in graph.units] == ["first", "block0/inner", "block0/outer", "block1/inner",
                                                   "block1/outer", "out"]


def test_every_kernel_inside_a_block_gets_its_group_penalty_without_a_warning():
    model = residual_model()
    sparse, said = penalty_warnings(model)
    assert said == []
    kernels = [v for v in sparse.trainable_weights if len(v.shape) == 2]
    assert len(kernels) == 6 and all(v.regularizer is not None for v in kernels)
    # the residual stream (first, both blocks' outer layers) is one set of coupled groups
    roles = {v.path: type(v.regularizer).__name__ for v in kernels}
    # the residual stream (made by 'first' and both blocks' outer layers) is read by the inner layers and 'out':
    # one set of coupled groups
    assert roles["first/kernel"] == "InputGroupLasso"
    assert roles["block0/inner/kernel"] == roles["block1/inner/kernel"] == roles["out/kernel"] == "CoupledGroupLasso"
    assert type(sparse.get_layer("block0")) is ResidualBlock
    x = np.random.default_rng(0).normal(size=(4, 6)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sparse(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)


def test_a_block_prunes_exactly_into_plain_keras_layers_that_reload(rng, tmp_path):
    model = residual_model()
    sparsify(model, rng)
    x = rng.normal(size=(8, 6)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    # its one ``units`` sets both its inner width and the stream's, pruned apart here: its layers stand in its place
    assert not any(isinstance(layer, ResidualBlock) for layer in small.layers)
    assert {call: found.reason for call, found in small.rebuilt_blocks.items()} == {
        "block0": "no integer argument of its config gives the pruned widths",
        "block1": "no integer argument of its config gives the pruned widths"}
    report = sparsity_report(model, T)
    assert report.layer_sizes == small.pruning_report.layer_sizes
    assert "block0/inner" in small.pruning_plan.masks.units


def test_a_budget_with_uniform_blocks_counts_and_cuts_the_blocks_of_one_class_together(rng):
    """Two calls of one block class: ``SparsityBudget(uniform_blocks=True)`` lands the units that
    ``prune_model(blocks="uniform")`` keeps within its budget, both blocks keep as many hidden units, and that
    model is exact; a model with no two blocks of one class is told the option has nothing to even out."""
    from keras_group_lasso import Proximal, SparsityBudget
    from keras_group_lasso.analysis import analyze

    x = rng.normal(size=(512, 6)).astype("float32")
    y = np.stack([x[:, 0] * x[:, 1], x[:, 2] - x[:, 3], x[:, 4]], axis=1).astype("float32")
    def plain_model():
        inputs = keras.Input((6,))
        return keras.Model(inputs, L.Dense(3, name="out")(L.Dense(8, activation="relu", name="hidden")(inputs)))

    for build, said in ((residual_model, []), (plain_model, ["nothing to even out"])):
        keras.utils.set_random_seed(0)
        sparse = add_group_sparsity(build(), 1e-3)
        sparse.compile(Proximal(keras.optimizers.Adam(1e-2)), "mse")
        dense = analyze(sparse, T).report.live_neurons
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sparse.fit(x, y[:, :sparse.output.shape[-1]], epochs=4, batch_size=32, verbose=0,
                       callbacks=[SparsityBudget(max_units=0.7, uniform_blocks=True)])
        told = [str(w.message) for w in caught if "uniform_blocks" in str(w.message)]
        assert len(told) == len(said) and all(words in text for words, text in zip(said, told))
        found = analyze(sparse, T, uniform=True)
        assert found.report.live_neurons <= 0.7 * dense
        if build is residual_model:
            assert found.masks.units["block0/inner"].sum() == found.masks.units["block1/inner"].sum() < 8
            small = prune_model(sparse, T, blocks="uniform")
            apply_threshold(sparse, T)
            np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), keras.ops.convert_to_numpy(sparse(x)),
                                       rtol=0, atol=1e-5)


def test_blocks_inside_blocks_and_sequentials_inside_blocks_are_traced(rng, tmp_path):
    model = nested_model()
    names = [node.name for node in model_graph(model).units]
    assert len(names) == 6 and names[0] == "first" and names[-1] == "out"
    assert names[3].endswith("/inner") and names[4].endswith("/outer")
    assert all(name.startswith("ff/") for name in names[1:5])
    _, said = penalty_warnings(model)
    assert said == []
    sparsify(model, rng)
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(8, 6)).astype("float32"), tmp_path)
    # the outer block is tried first, then (not built again) the one inside it, named by its path
    assert set(small.rebuilt_blocks) == {"ff", "ff/residual_block"}


def test_a_keras_io_transformer_block_gets_head_penalties_and_prunes_heads_exactly(rng, tmp_path):
    model = transformer_model()
    sparse, said = penalty_warnings(model)
    assert said == []
    block = next(layer for layer in sparse.layers if isinstance(layer, TransformerBlock))
    assert block.name == next(layer for layer in model.layers if isinstance(layer, TransformerBlock)).name
    ffn = [v for v in block.ffn.trainable_weights if len(v.shape) == 2]
    assert len(ffn) == 2 and all(v.regularizer is not None for v in ffn)
    sparsify(model, rng)
    x = rng.integers(0, 40, size=(4, 10))
    small = prune_model(model, T)
    # keras.models.clone_model cannot copy this block (its constructor takes no ``trainable``), so the reference
    # is the model itself, thresholded in place
    apply_threshold(model, T)
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), expected, rtol=1e-5, atol=1e-5)
    small.save(tmp_path / "small.keras")
    again = keras.saving.load_model(tmp_path / "small.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)), expected, rtol=1e-5, atol=1e-5)
    attention = [layer for layer in small.layers if isinstance(layer, L.MultiHeadAttention)]
    assert len(attention) == 1 and attention[0].num_heads < 4
    # Keras cannot load this class from its config (no **kwargs): the pruned model keeps its layers, and says why
    (found,) = small.rebuilt_blocks.values()
    assert found.layer is None and "cannot make its class again from its config" in found.reason


def timeseries_transformer(steps=16, blocks=2):
    """keras.io's timeseries Transformer ("Timeseries classification with a Transformer model"), small: blocks of
    self-attention and a Conv1D feed-forward on a residual stream of the input's one channel, pooled by
    ``GlobalAveragePooling1D(data_format="channels_first")`` (one value per step), then a Dense head."""
    inputs = keras.Input((steps, 1))
    x = inputs
    for _ in range(blocks):
        h = L.MultiHeadAttention(key_dim=4, num_heads=3, dropout=0.1)(x, x)
        h = L.Dropout(0.1)(h)
        h = L.LayerNormalization(epsilon=1e-6)(h)
        res = h + x
        h = L.Conv1D(filters=6, kernel_size=1, activation="relu")(res)
        h = L.Dropout(0.1)(h)
        h = L.Conv1D(filters=x.shape[-1], kernel_size=1)(h)
        h = L.LayerNormalization(epsilon=1e-6)(h)
        x = h + res
    x = L.GlobalAveragePooling1D(data_format="channels_first")(x)
    x = L.Dense(8, activation="relu")(x)
    x = L.Dropout(0.1)(x)
    return keras.Model(inputs, L.Dense(2, activation="softmax")(x))


def test_keras_io_timeseries_transformer_prunes_heads_and_feed_forward_units_exactly(rng, tmp_path):
    model = timeseries_transformer()
    sparse, said = penalty_warnings(model)
    assert said == []
    graph = model_graph(sparse)
    assert graph.supported and graph.problems == ()
    sparsify(model, rng)
    x = rng.normal(size=(4, 16, 1)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    # heads and feed-forward units go; every step the pooling makes stays (the head reads 16 features)
    attention = [layer for layer in small.layers if isinstance(layer, L.MultiHeadAttention)]
    assert sum(layer.num_heads for layer in attention) < 6
    assert sum(layer.filters for layer in small.layers if isinstance(layer, L.Conv1D) and layer.filters > 1) < 12
    dense = [layer for layer in small.layers if isinstance(layer, L.Dense)]
    assert dense[0].get_weights()[0].shape[0] == 16
    assert small.pruning_report.uninterpreted_layers == ()


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class Chain(L.Layer):
    """A block of two Dense layers in a row, no merge."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.a = L.Dense(5, activation="relu", name="a")
        self.b = L.Dense(4, name="b")

    def call(self, x):
        return self.b(self.a(x))


def test_blocks_in_a_sequential_get_their_penalties_and_prune_exactly(rng, tmp_path):
    model = keras.Sequential([keras.Input((6,)), L.Dense(8, name="first"), ResidualBlock(8, name="block"),
                              Chain(name="chain"), L.Dense(2, name="out")])
    sparse, said = penalty_warnings(model)
    assert said == []
    kernels = [v for v in sparse.trainable_weights if len(v.shape) == 2]
    assert len(kernels) == 6 and all(v.regularizer is not None for v in kernels)
    x = rng.normal(size=(8, 6)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sparse(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)
    sparsify(model, rng)
    assert_prunes_exactly_and_reloads(model, x, tmp_path)


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class Subclassed(keras.Model):
    """A subclassed model (no functional graph) used as a block of a functional one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d0 = L.Dense(5, activation="relu", name="d0")
        self.d1 = L.Dense(4, name="d1")

    def call(self, x):
        return self.d1(self.d0(x))


def test_a_subclassed_model_inside_a_functional_one_is_traced_too(rng, tmp_path):
    inputs = keras.Input((6,))
    model = keras.Model(inputs, L.Dense(2, name="out")(Subclassed(name="sub")(inputs)))
    assert [node.name for node in model_graph(model).units] == ["sub/d0", "sub/d1", "out"]
    sparsify(model, rng)
    assert_prunes_exactly_and_reloads(model, rng.normal(size=(8, 6)).astype("float32"), tmp_path)


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class KerasIoModel(keras.Model):
    """A fully subclassed model, as keras.io writes one: layers made in ``__init__``, chained in ``call``."""

    def __init__(self):
        super().__init__()
        self.hidden = L.Dense(9, activation="relu", name="hidden")
        self.block = ResidualBlock(9, name="block")
        self.out = L.Dense(3, name="out")

    def call(self, x):
        return self.out(self.block(self.hidden(x)))


def test_a_subclassed_model_built_on_data_is_read_penalised_and_pruned_through_its_traced_call(rng, tmp_path):
    model = KerasIoModel()
    x = rng.normal(size=(8, 6)).astype("float32")
    model(x[:1])  # built on data, as fit() builds it
    sparse, said = penalty_warnings(model)
    assert said == []
    assert isinstance(sparse, keras.Model) and not isinstance(sparse, KerasIoModel)  # a functional copy
    kernels = [v for v in sparse.trainable_weights if len(v.shape) == 2]
    assert len(kernels) == 4 and all(v.regularizer is not None for v in kernels)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sparse(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)
    sparsify(graph_model(model), rng)  # the traced functional model holds the model's own layers
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ()
    small = prune_model(model, T)
    # keras.models.clone_model cannot copy a subclassed model: the reference is the model, thresholded in place
    apply_threshold(model, T)
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), expected, rtol=1e-5, atol=1e-5)
    assert small.count_params() < model.count_params()
    assert small.pruning_report.layer_sizes == report.layer_sizes
    small.save(tmp_path / "small.keras")
    again = keras.saving.load_model(tmp_path / "small.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)), expected, rtol=1e-5, atol=1e-5)


def test_tracing_leaves_the_model_and_its_blocks_as_they_were():
    model = residual_model()
    before = [keras.ops.convert_to_numpy(v).copy() for v in model.weights]
    config = model.get_config()
    model_graph(model)
    prune_model(model)
    assert model.get_config() == config
    for old, new in zip(before, model.weights):
        np.testing.assert_array_equal(old, keras.ops.convert_to_numpy(new))


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class TwoWays(L.Layer):
    """A block with two outputs: its input through one Dense layer, and through two."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.short = L.Dense(6, activation="relu", name="short")
        self.long = keras.Sequential([L.Dense(5, activation="relu"), L.Dense(6)], name="long")

    def call(self, x):
        return self.short(x), self.long(x)


def test_a_block_with_several_outputs_is_inlined_output_by_output(rng, tmp_path):
    inputs = keras.Input((5,))
    h = L.Dense(7, activation="relu", name="first")(inputs)
    short, long = TwoWays(name="ways")(h)
    merged = L.Concatenate(name="both")([short, L.Dense(4, name="after_long")(long)])
    model = keras.Model(inputs, [L.Dense(2, name="out")(merged), L.Dense(3, name="side")(short)])
    graph = model_graph(model)
    assert graph.supported, graph.problems
    assert {"ways/short", "ways/long/dense_1"} <= {node.name for node in graph.units} or graph.supported
    sparsify(model, rng)
    small = prune_model(model, T)
    apply_threshold(model, T)
    x = rng.normal(size=(6, 5)).astype("float32")
    for got, want in zip(small(x), model(x)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want),
                                   rtol=1e-5, atol=1e-5)
    small.save(tmp_path / "small.keras")
    keras.saving.load_model(tmp_path / "small.keras")


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class Scaled(L.Layer):
    """A layer made with a value its config cannot hold (a function): the model holding it does not serialize."""

    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def call(self, x):
        return self.fn(x)


def test_the_graph_of_a_model_that_does_not_serialize_is_read_from_its_nodes(rng):
    inputs = keras.Input((5,))
    h = L.Dense(7, activation="relu", name="hidden")(inputs)
    h = Scaled(lambda t: t * 2.0, name="scaled")(h)
    model = keras.Model(inputs, L.Dense(2, name="out")(h))
    with pytest.raises(NotImplementedError):
        model.get_config()
    graph = model_graph(model)
    assert [node.name for node in graph.units] == ["hidden", "out"]
    # its call, traced, is a keras.ops product with a number: a Rescaling
    inside = [type(layer).__name__ for name, layer in graph.layers.items() if name.startswith("scaled/")]
    assert graph.supported and inside == ["Rescaling"]
    sparsify(model, rng)
    small = prune_model(model, T)
    apply_threshold(model, T)  # the reference: clone_model cannot copy the model either
    x = rng.normal(size=(6, 5)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-5, atol=1e-5)
    assert small.count_params() < model.count_params()


class ListShaped(L.Layer):
    """A sublayer whose own output shapes are computed from a list of input shapes it is not given when called on one
    tensor (as KerasHub 0.32's SmolLM3 attention): called symbolically, its ``compute_output_shape`` fails."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = L.Dense(units, activation="relu", name="dense")

    def call(self, x):
        return self.dense(x)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0][:-1]) + (self.units,)


class HoldsListShaped(L.Layer):
    """A block calling a :class:`ListShaped`; its own output shapes are right, so a model can be built on it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = ListShaped(6, name="inner")
        self.out = L.Dense(4, name="out")

    def call(self, x):
        return self.out(self.inner(x))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (4,)


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="7 s on JAX, the suite's longest leg (it passes there); "
                                                             "the trace is one for every backend")
def test_a_sublayer_whose_own_output_shapes_fail_is_traced_with_keras_shapes(rng):
    inputs = keras.Input((5,))
    model = keras.Model(inputs, L.Dense(2, name="head")(HoldsListShaped(name="block")(inputs)))
    with pytest.raises(TypeError):
        ListShaped(3)(keras.KerasTensor((None, 5)))  # what tracing the block meets
    graph = model_graph(model)
    assert graph.supported, graph.problems
    assert [node.name for node in graph.units] == ["block/inner/dense", "block/out", "head"]
    out = model.get_layer("block").out
    kernel, bias = out.get_weights()
    kernel[[1, 3]] = 0.0  # two of the six units inside the sublayer go
    out.set_weights([kernel, bias])
    small = prune_model(model, T)
    apply_threshold(model, T)
    x = rng.normal(size=(6, 5)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-5, atol=1e-5)
    assert small.count_params() < model.count_params()


# ----------------------------------------------------------------------------- blocks called on several tensors


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class UpBlock(L.Layer):
    """A U-Net decoder block as a Layer called on two tensors, ``block(x, skip)``: upsample ``x``, lay the skip
    connection's channels beside it, two convolutions."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.up = L.UpSampling2D()
        self.join = L.Concatenate()
        self.conv1 = L.Conv2D(filters, 3, padding="same", activation="relu", name="conv1")
        self.conv2 = L.Conv2D(filters, 3, padding="same", activation="relu", name="conv2")

    def call(self, x, skip):
        return self.conv2(self.conv1(self.join([self.up(x), skip])))

    def get_config(self):
        return dict(super().get_config(), filters=self.filters)


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class Conditioned(L.Layer):
    """Feature-wise modulation (FiLM) of a hidden layer by a second input, called ``block(x, condition=c)``:
    ``x + out(relu(hidden(x)) * scale(c) + shift(c))``."""

    def __init__(self, units, hidden, **kwargs):
        super().__init__(**kwargs)
        self.units, self.hidden_units = units, hidden
        self.hidden = L.Dense(hidden, activation="relu", name="hidden")
        self.scale = L.Dense(hidden, activation="sigmoid", name="scale")
        self.shift = L.Dense(hidden, name="shift")
        self.out = L.Dense(units, name="out")

    def call(self, x, condition=None):
        return x + self.out(self.hidden(x) * self.scale(condition) + self.shift(condition))

    def get_config(self):
        return dict(super().get_config(), units=self.units, hidden=self.hidden_units)


def unet_model():
    inputs = keras.Input((8, 8, 2))
    skip = L.Conv2D(6, 3, padding="same", activation="relu", name="down1")(inputs)
    x = L.MaxPooling2D(name="pool")(skip)
    x = L.Conv2D(10, 3, padding="same", activation="relu", name="bottom")(x)
    x = UpBlock(7, name="up")(x, skip)
    return keras.Model(inputs, L.Conv2D(3, 1, name="head")(x))


def conditioned_model():
    # named inputs (a dict); the block called with a keyword tensor, twice (shared), and once on one tensor twice
    inputs = {"x": keras.Input((5,), name="x"), "c": keras.Input((3,), name="c")}
    h = L.Dense(8, activation="tanh", name="first")(inputs["x"])
    c = L.Dense(4, activation="relu", name="embed_c")(inputs["c"])
    block = Conditioned(8, 12, name="film")
    h = block(h, condition=c)
    h = block(h, condition=c)
    h = Conditioned(8, 6, name="self_film")(h, h)
    return keras.Model(inputs, {"y": L.Dense(2, name="head")(h)})


@pytest.mark.quick
def test_a_block_called_on_two_tensors_is_traced_with_each_read_where_the_call_put_it(rng, tmp_path):
    model = unet_model()
    graph = model_graph(model)
    assert graph.supported and graph.problems == ()
    assert [node.name for node in graph.units] == ["down1", "bottom", "up/conv1", "up/conv2", "head"]
    # conv1 reads the upsampled bottom (10 channels) then the skip connection (6), in the order of the call
    assert graph.node("up/conv1").in_units == 16
    sparse, said = penalty_warnings(model)
    assert said == []
    assert all(v.regularizer is not None for v in sparse.trainable_weights if len(v.shape) == 4)
    sparsify(model, rng)
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(3, 8, 8, 2)).astype("float32"), tmp_path)
    assert not any(isinstance(layer, UpBlock) for layer in small.layers)
    widths = small.pruning_report.layer_sizes
    assert widths == sparsity_report(model, T).layer_sizes


def test_a_block_with_a_keyword_tensor_shared_and_fed_one_tensor_twice_prunes_exactly(rng, tmp_path):
    model = conditioned_model()
    graph = model_graph(model)
    assert graph.supported, graph.problems
    names = [node.name for node in graph.units]
    assert {"film/hidden", "film/scale", "film/shift", "film/out", "self_film/scale"} <= set(names)
    # the shared block's second call is a node of each of its layers: a unit goes only when both calls leave it
    assert {"film#1/hidden", "film#1/scale"} <= {node.name for node in graph.nodes}
    sparse, said = penalty_warnings(model)
    assert said == []
    assert all(v.regularizer is not None for v in sparse.trainable_weights if len(v.shape) == 2)
    sparsify(model, rng)
    x = {"x": rng.normal(size=(6, 5)).astype("float32"), "c": rng.normal(size=(6, 3)).astype("float32")}
    small = prune_model(model, T)
    apply_threshold(model, T)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)["y"]), keras.ops.convert_to_numpy(model(x)["y"]),
                               rtol=1e-5, atol=1e-5)
    assert small.count_params() < model.count_params()
    # the shared block is one Conditioned again, called twice; the one fed h twice stays its layers
    assert isinstance(small.get_layer("film"), Conditioned) and len(small.get_layer("film")._inbound_nodes) == 2
    assert small.get_layer("film").hidden_units == small.rebuilt_blocks["film"].changed.get("hidden", (12, 12))[1]
    assert small.rebuilt_blocks["self_film"].layer is None
    assert not any(isinstance(layer, Conditioned) and layer.name != "film" for layer in small.layers)
    small.save(tmp_path / "small.keras")
    again = keras.saving.load_model(tmp_path / "small.keras", custom_objects={"Conditioned": Conditioned})
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)["y"]), keras.ops.convert_to_numpy(small(x)["y"]),
                               rtol=0, atol=1e-6)


class MaskedEncoder(L.Layer):
    """An encoder block that builds its attention mask from the mask Keras passes it (keras.io's translation
    Transformer does so)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True
        self.att = L.MultiHeadAttention(2, 4)
        self.dense = L.Dense(8)

    def call(self, inputs, mask=None):
        padding = None if mask is None else keras.ops.cast(mask[:, None, :], "int32")
        return self.dense(inputs + self.att(inputs, inputs, attention_mask=padding))


@pytest.mark.parametrize("block", [MaskedEncoder, lambda: TransformerBlock(8, 2, 12)], ids=["uses", "drops"])
def test_a_block_called_on_a_masked_tensor_is_named_not_traced_without_its_mask(block):
    # Traced, the block would compute without the mask (its own attention mask, or Keras's mask it drops and its
    # layers called one by one would pass on): the pruned model would differ. It stays one node, named.
    inputs = keras.Input((6,), dtype="int32")
    h = block()(L.Embedding(20, 8, mask_zero=True, name="embed")(inputs))
    model = keras.Model(inputs, L.Dense(2, name="out")(L.GlobalAveragePooling1D(name="pool")(h)))
    name = model.layers[2].name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if "get no group penalty" in str(w.message)]
    assert len(said) == 1 and f"'{name}' ({type(model.layers[2]).__name__}, " in said[0]
    assert "a block called on a tensor that carries a Keras mask" in said[0]
    x = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9]], "int32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sparse(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(UnsupportedModelError, match=rf"^prune_model: cannot prune layer '{name}' \(\w+\): a block "
                                                    "called on a tensor that carries a Keras mask"):
        prune_model(model, T)


@keras.saving.register_keras_serializable("test_traced_blocks")  # a pruned model may hold it again
class CausalBlock(L.Layer):
    """A decoder's self-attention block: each position attends to those before it (``use_causal_mask=True``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.att = L.MultiHeadAttention(4, 3, name="att")
        self.ffn = L.Dense(12, activation="relu", name="ffn")
        self.back = L.Dense(8, name="back")

    def call(self, x):
        x = x + self.att(x, x, use_causal_mask=True)
        return x + self.back(self.ffn(x))


def test_the_options_of_the_calls_inside_a_block_stay_in_the_pruned_model(rng, tmp_path):
    # The pruned model calls each attention layer with the causal mask the block's call gave it (before, the
    # options of calls inside a traced block were lost: the pruned model attended to every position)
    inputs = keras.Input((6, 5))
    h = L.Dense(8, name="first")(inputs)
    block = CausalBlock(name="causal")
    h = block(block(h))  # shared: its second call's layers are "causal#1/..."
    model = keras.Model(inputs, L.Dense(2, name="out")(h))
    sparsify(model, rng)
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(3, 6, 5)).astype("float32"), tmp_path)
    heads = [layer for layer in small.layers if isinstance(layer, L.MultiHeadAttention)]
    assert len(heads) == 1 and heads[0].num_heads < 4
    # the last position attends to every other one: changing the first input changes only what comes after it
    x = rng.normal(size=(1, 6, 5)).astype("float32")
    y = x.copy()
    y[:, -1] += 1.0
    a, b = (keras.ops.convert_to_numpy(small(v)) for v in (x, y))
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=0, atol=1e-6)


def test_the_penalised_copy_of_a_model_with_blocks_reloads_with_every_penalty(tmp_path):
    # a block's config does not hold its sublayers' penalties: the copy's config does (block_penalties), so the
    # saved copy trains on with the same penalties, coupled ones linked again
    import keras_group_lasso

    model = residual_model()
    sparse = add_group_sparsity(model, 1e-3)
    penalised = {v.path: v.regularizer for v in sparse.trainable_weights if v.regularizer is not None}
    assert {"block0/inner/kernel", "block1/outer/kernel"} <= set(penalised)
    sparse.save(tmp_path / "sparse.keras")
    again = keras.saving.load_model(tmp_path / "sparse.keras", custom_objects={"ResidualBlock": ResidualBlock})
    assert type(again) is keras_group_lasso.GroupSparseModel
    found = {v.path: v.regularizer for v in again.trainable_weights if v.regularizer is not None}
    assert set(found) == set(penalised)
    assert all(type(found[path]) is type(penalty) for path, penalty in penalised.items())
    np.testing.assert_allclose(float(sum(keras.ops.convert_to_numpy(loss) for loss in again.losses)),
                               float(sum(keras.ops.convert_to_numpy(loss) for loss in sparse.losses)), rtol=1e-6)


# ----------------------------------------------------------------------------- the user's classes, built again


@keras.saving.register_keras_serializable("test_traced_blocks")
class EncoderBlock(L.Layer):
    """keras.io's Transformer block written to be saved: ``**kwargs`` and a ``get_config`` of its arguments."""

    def __init__(self, embed_dim, num_heads, ff_dim, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads, self.ff_dim = embed_dim, num_heads, ff_dim
        self.att = L.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([L.Dense(ff_dim, activation="relu"), L.Dense(embed_dim)])
        self.norm1 = L.LayerNormalization(epsilon=1e-6)
        self.norm2 = L.LayerNormalization(epsilon=1e-6)

    def call(self, x):
        x = self.norm1(x + self.att(x, x))
        return self.norm2(x + self.ffn(x))

    def get_config(self):
        return dict(super().get_config(), embed_dim=self.embed_dim, num_heads=self.num_heads, ff_dim=self.ff_dim)


@keras.saving.register_keras_serializable("test_traced_blocks")
class Bottleneck(L.Layer):
    """``x + outer(inner(x))`` with the residual width and the inner width as two arguments; ``scaled`` divides the
    inner layer's output by its width (a block whose math reads its own arguments)."""

    def __init__(self, units, hidden, scaled=False, **kwargs):
        super().__init__(**kwargs)
        self.units, self.hidden, self.scaled = units, hidden, scaled
        self.inner = L.Dense(hidden, activation="relu", name="inner")
        self.outer = L.Dense(units, name="outer")

    def call(self, x):
        h = self.inner(x)
        return x + self.outer(h / self.hidden if self.scaled else h)

    def get_config(self):
        return dict(super().get_config(), units=self.units, hidden=self.hidden, scaled=self.scaled)


def test_a_block_is_built_again_as_its_class_with_the_heads_and_neurons_it_kept(rng, tmp_path):
    inputs = keras.Input((10,))
    x = L.Embedding(40, 16, name="embed")(inputs)
    x = EncoderBlock(16, 4, 24, name="encoder0")(x)
    x = EncoderBlock(16, 4, 24, name="encoder1")(x)
    model = keras.Model(inputs, L.Dense(2, name="out")(L.GlobalAveragePooling1D(name="pool")(x)))
    sparsify(model, rng, dead=0.5)
    x = rng.integers(0, 40, size=(4, 10))
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)  # registered: plain load_model finds the class
    for name in ("encoder0", "encoder1"):
        block, found = small.get_layer(name), small.rebuilt_blocks[name]
        assert type(block) is EncoderBlock and found.layer is not None and found.reason == ""
        # each instance with its own widths, as its config says
        assert block.att.num_heads == block.num_heads and block.ffn.layers[0].units == block.ff_dim
        assert (block.num_heads, block.ff_dim) != (4, 24)
        assert found.changed == {key: (old, getattr(block, key)) for key, old in (("num_heads", 4), ("ff_dim", 24))
                                 if getattr(block, key) != old}
    assert small.count_params() == prune_model(model, T, blocks="flatten").count_params()
    assert not any(isinstance(layer, (L.MultiHeadAttention, L.Dense)) and layer.name != "out" for layer in small.layers)


def test_a_block_whose_stream_and_inner_widths_both_change_gets_both_arguments(rng, tmp_path):
    inputs = keras.Input((6,))
    h = L.Dense(12, name="first")(inputs)
    h = Bottleneck(12, 20, name="neck")(h)
    model = keras.Model(inputs, L.Dense(3, name="out")(h))
    weights = model.get_weights()
    weights[0][:, [1, 4, 7]] = 0.0   # three channels of the stream: 'first' makes them ...
    weights[4][:, [1, 4, 7]] = 0.0   # ... and so does the block's outer layer
    weights[2][:, 3:11] = 0.0        # eight of the inner layer's units
    model.set_weights(weights)
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(5, 6)).astype("float32"), tmp_path)
    block = small.get_layer("neck")
    assert type(block) is Bottleneck and (block.units, block.hidden) == (9, 12)
    assert small.rebuilt_blocks["neck"].changed == {"units": (12, 9), "hidden": (20, 12)}


def test_a_block_whose_math_reads_its_arguments_stays_its_layers(rng, tmp_path):
    # built again with hidden=12 it would divide by 12, where its pruned layers divide by 20: checked, refused
    inputs = keras.Input((6,))
    h = L.Dense(12, name="first")(inputs)
    h = Bottleneck(12, 20, scaled=True, name="neck")(h)
    model = keras.Model(inputs, L.Dense(3, name="out")(h))
    weights = model.get_weights()
    weights[2][:, 3:11] = 0.0
    model.set_weights(weights)
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(5, 6)).astype("float32"), tmp_path)
    assert not any(isinstance(layer, Bottleneck) for layer in small.layers)
    assert small.rebuilt_blocks["neck"].reason == "built again with the new widths, it computes something else"


def test_blocks_flatten_and_a_bad_blocks_argument(rng):
    model = conditioned_model()
    sparsify(model, rng)
    flat = prune_model(model, T, blocks="flatten")
    assert not any(isinstance(layer, Conditioned) for layer in flat.layers)
    with pytest.raises(InvalidParameterError, match=r"^prune_model: argument `blocks` must be one of "
                                                    r"'rebuild', 'uniform', 'flatten'; received 'keep'\.$"):
        prune_model(model, T, blocks="keep")


@pytest.mark.quick
@pytest.mark.parametrize("seed", range(6))
def test_random_stacks_of_blocks_come_back_as_their_class_exactly(seed, tmp_path):
    # a random stack of Bottleneck blocks on a random stream, random units dead in the stream and inside each block
    rng = np.random.default_rng(seed)
    width = int(rng.integers(4, 10))
    inputs = keras.Input((5,))
    h = L.Dense(width, name="first")(inputs)
    hidden = [int(rng.integers(3, 9)) for _ in range(int(rng.integers(1, 4)))]
    for k, units in enumerate(hidden):
        h = Bottleneck(width, units, name=f"neck{k}")(h)
    model = keras.Model(inputs, L.Dense(2, name="out")(h))
    sparsify(model, rng, dead=float(rng.uniform(0.2, 0.5)))
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(6, 5)).astype("float32"), tmp_path)
    sizes = {found.name: found.units_alive for found in small.pruning_report.layers}
    for k in range(len(hidden)):
        block = small.get_layer(f"neck{k}")
        assert type(block) is Bottleneck, small.rebuilt_blocks[f"neck{k}"].reason
        assert (block.units, block.hidden) == (sizes[f"neck{k}/outer"], sizes[f"neck{k}/inner"])


def test_export_pruned_writes_the_block_as_its_class_or_as_its_layers(rng, tmp_path):
    from keras_group_lasso import export_pruned

    inputs = keras.Input((6,))
    h = L.Dense(12, name="first")(inputs)
    model = keras.Model(inputs, L.Dense(3, name="out")(Bottleneck(12, 20, name="neck")(h)))
    weights = model.get_weights()
    weights[2][:, 3:11] = 0.0
    model.set_weights(weights)
    x = rng.normal(size=(5, 6)).astype("float32")
    for blocks, held in (("rebuild", Bottleneck), ("flatten", L.Dense)):
        result = export_pruned(model, tmp_path / blocks, formats=("keras",), blocks=blocks)
        again = keras.saving.load_model(result.paths["keras"])
        assert type(again.get_layer("neck" if blocks == "rebuild" else "inner")) is held
        np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)),
                                   keras.ops.convert_to_numpy(prune_model(model, T)(x)), rtol=0, atol=1e-6)
    with pytest.raises(InvalidParameterError, match=r"^export_pruned: argument `blocks` must be one of"):
        export_pruned(model, tmp_path / "bad", formats=("keras",), blocks=True)


@keras.saving.register_keras_serializable("test_traced_blocks")
class SharedDropoutMLP(L.Layer):
    """KerasHub's ViT MLP: one Dropout called after each of two Dense layers of different widths."""

    def __init__(self, hidden, units, **kwargs):
        super().__init__(**kwargs)
        self.hidden_units, self.units = hidden, units
        self.dense_1 = L.Dense(hidden, activation="gelu", name="dense_1")
        self.dense_2 = L.Dense(units, name="dense_2")
        self.dropout = L.Dropout(0.1, name="dropout")

    def call(self, x):
        return self.dropout(self.dense_2(self.dropout(self.dense_1(x))))

    def get_config(self):
        return dict(super().get_config(), hidden=self.hidden_units, units=self.units)


def test_a_weightless_layer_shared_between_widths_prunes_each_call_on_its_own(rng, tmp_path):
    inputs = keras.Input((6,))
    h = SharedDropoutMLP(12, 7, name="mlp")(L.Dense(8, name="first")(inputs))
    model = keras.Model(inputs, L.Dense(2, name="out")(h))
    graph = model_graph(model)
    assert graph.supported, graph.problems
    assert {"mlp/dropout", "mlp/dropout#1"} <= {node.name for node in graph.nodes}
    sparsify(model, rng)
    small = prune_model(model, T, blocks="flatten")
    sizes = {found.name: found.units_alive for found in small.pruning_report.layers}
    assert sizes["mlp/dense_1"] < 12 and sizes["mlp/dense_2"] < 7
    # built again as its class (registered, so plain load_model finds it) with the widths its layers kept
    again = assert_prunes_exactly_and_reloads(model, rng.normal(size=(5, 6)).astype("float32"), tmp_path)
    assert (again.get_layer("mlp").hidden_units, again.get_layer("mlp").units) == (sizes["mlp/dense_1"],
                                                                                   sizes["mlp/dense_2"])


def test_a_sequential_holding_a_block_built_again_is_functional_and_exact(rng, tmp_path):
    model = keras.Sequential([keras.Input((6,)), L.Dense(8, name="first"), SharedDropoutMLP(12, 7, name="mlp"),
                              L.Dense(2, name="out")])
    sparsify(model, rng)
    small = assert_prunes_exactly_and_reloads(model, rng.normal(size=(5, 6)).astype("float32"), tmp_path)
    assert type(small.get_layer("mlp")) is SharedDropoutMLP and not isinstance(small, keras.Sequential)
    assert type(prune_model(model, T, blocks="flatten")) is keras.Sequential


def test_a_model_whose_blocks_built_again_compute_otherwise_is_returned_with_their_layers(rng, monkeypatch):
    # the last check: the whole model with its blocks built again against the one with their layers
    from keras_group_lasso.surgery import blocks

    real = blocks.same_outputs
    monkeypatch.setattr(blocks, "same_outputs", lambda reference, block, *args: block is not None and real(
        reference, block, *args))
    inputs = keras.Input((6,))
    model = keras.Model(inputs, L.Dense(3, name="out")(Bottleneck(12, 20, name="neck")(L.Dense(12)(inputs))))
    weights = model.get_weights()
    weights[2][:, 3:11] = 0.0
    model.set_weights(weights)
    small = prune_model(model, T)
    assert not any(isinstance(layer, Bottleneck) for layer in small.layers)
    assert small.rebuilt_blocks["neck"].reason == "the model holding it computed something else"
    x = rng.normal(size=(4, 6)).astype("float32")
    apply_threshold(model, T)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-5, atol=1e-5)


def test_keras_io_models_pruned_into_plain_layers_load_in_a_process_without_this_package(rng, tmp_path):
    """keras.io's residual blocks (their layers in the block's place: ``blocks="flatten"``; built again as their
    class they would need this test's module), a fully subclassed model and the timeseries Transformer, pruned: Keras
    loads each with this package (and the test's classes) nowhere to import."""
    subclassed = KerasIoModel()
    subclassed(rng.normal(size=(1, 6)).astype("float32"))
    cases = {"residual": (residual_model(), (8, 6)), "subclassed": (subclassed, (8, 6)),
             "timeseries": (timeseries_transformer(), (4, 16, 1))}
    pruned = {}
    for name, (model, shape) in cases.items():
        sparsify(graph_model(model), rng)
        small = prune_model(model, T, blocks="flatten")
        assert not any(type(layer).__module__.startswith("test_") for layer in small.layers)
        pruned[name] = (small, rng.normal(size=shape).astype("float32"))
    assert_loads_without_this_package(pruned, tmp_path)

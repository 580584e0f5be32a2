"""Tensors no input reaches are constants of the graph: positions from ``keras.ops.arange`` and what they feed.

keras.io's text-classification Transformer computes positions in its ``TokenAndPositionEmbedding`` block
(``keras.ops.arange``) and calls a position ``Embedding`` on them; written functionally, the positions are a table
computed once and added to the token embeddings. Either way the sub-graph that no input reaches is a constant of the
graph: the ``Add`` where it meets the token embeddings couples its channels with the residual stream's, the position
Embedding is a layer of the graph like any other (sliced to the channels that stay), and the pruned model computes
the positions itself with plain Keras layers and keras.ops, so that it loads without this package.
"""

import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from test_model_families import T
from test_traced_blocks import TransformerBlock, sparsify

from keras_group_lasso import (
    add_group_sparsity,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import model_graph

L = keras.layers
ops = keras.ops
VOCAB, MAXLEN, EMBED, HEADS, FF = 50, 16, 8, 2, 16


class TokenAndPositionEmbedding(L.Layer):
    """keras.io's block, as keras.io writes it: positions from ``keras.ops.arange`` read by an Embedding."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = L.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = L.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def keras_io_model():
    """keras.io's text classification with a Transformer, as keras.io writes it (the output layer named)."""
    inputs = L.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, EMBED)(inputs)
    x = TransformerBlock(EMBED, HEADS, FF)(x)
    x = L.GlobalAveragePooling1D()(x)
    x = L.Dropout(0.1)(x)
    x = L.Dense(20, activation="relu")(x)
    x = L.Dropout(0.1)(x)
    outputs = L.Dense(2, activation="softmax", name="out")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def functional_model():
    """The same classifier written functionally: the positions are computed once, added inside the graph."""
    inputs = L.Input(shape=(MAXLEN,))
    positions = L.Embedding(MAXLEN, EMBED, name="positions")(ops.arange(MAXLEN))
    x = L.Embedding(VOCAB, EMBED, name="tokens")(inputs) + positions
    x = TransformerBlock(EMBED, HEADS, FF)(x)
    x = L.GlobalAveragePooling1D()(x)
    x = L.Dropout(0.1)(x)
    x = L.Dense(20, activation="relu")(x)
    x = L.Dropout(0.1)(x)
    return keras.Model(inputs, L.Dense(2, activation="softmax", name="out")(x))


def tokens(rng, n=6):
    return rng.integers(0, VOCAB, size=(n, MAXLEN)).astype("float32")


def penalised_without_a_warning(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if "add_group_sparsity" in str(w.message)]
    assert said == []
    dense = [layer for layer in _all_layers(sparse) if isinstance(layer, L.Dense)]
    assert len(dense) == 4 and all(layer.kernel.regularizer is not None for layer in dense)
    assert len(sparse.head_penalties) == 1  # the attention heads' groups
    return sparse


def _all_layers(model):
    return list(model._flatten_layers(include_self=False))


def out(model, x):
    return np.asarray(ops.convert_to_numpy(model(x, training=False)), np.float64)


def assert_prunes_exactly(model, x, tmp_path):
    """``prune_model`` gives a smaller model computing what the thresholded model computes, to 1e-5 of the output
    scale, that reloads with plain Keras. The reference is the model thresholded in place (clone_model cannot copy
    keras.io's blocks: their constructors take no ``trainable``)."""
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ()
    small = prune_model(model, T)
    before = model.count_params()
    apply_threshold(model, T)
    want = out(model, x)
    got = out(small, x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))
    assert small.count_params() < before
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.saving.load_model(path)
    np.testing.assert_allclose(out(again, x), got, rtol=0, atol=1e-6)
    return small


def test_keras_ios_transformer_is_penalised_and_pruned_exactly_with_its_position_embedding(rng, tmp_path):
    model = keras_io_model()
    graph = model_graph(model)
    assert graph.supported and graph.problems == ()
    assert [node.kind for node in graph.nodes].count("constant") == 1
    embeddings = [node.name for node in graph.units if isinstance(graph.layers[node.name], L.Embedding)]
    assert len(embeddings) == 2 and all(name.startswith("token_and_position_embedding/") for name in embeddings)
    sparse = penalised_without_a_warning(model)
    x = tokens(rng)
    np.testing.assert_allclose(out(sparse, x), out(model, x), rtol=1e-6, atol=1e-6)
    sparsify(model, rng)
    small = assert_prunes_exactly(model, x, tmp_path)
    # the positions are computed by the pruned model itself: its position Embedding reads 16 positions
    assert sorted(layer.input_dim for layer in small.layers if isinstance(layer, L.Embedding)) == [MAXLEN, VOCAB]
    assert not any(isinstance(layer, (TokenAndPositionEmbedding, TransformerBlock)) for layer in small.layers)


def test_the_pruned_keras_io_transformer_loads_in_a_process_without_this_package(rng, tmp_path):
    model = keras_io_model()
    sparsify(model, rng)
    small = prune_model(model, T)
    x = tokens(rng)
    small.save(tmp_path / "small.keras")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", out(small, x))
    script = textwrap.dedent(f"""
        import sys
        import keras, numpy as np
        small = keras.saving.load_model({str(tmp_path / "small.keras")!r})
        assert "keras_group_lasso" not in sys.modules
        got = keras.ops.convert_to_numpy(small(np.load({str(tmp_path / "x.npy")!r}), training=False))
        np.testing.assert_allclose(got, np.load({str(tmp_path / "want.npy")!r}), rtol=0, atol=1e-6)
        print("loaded")
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "loaded" in result.stdout


def test_the_functional_transformer_with_arange_positions_is_penalised_and_pruned_exactly(rng, tmp_path):
    model = functional_model()
    graph = model_graph(model)
    assert graph.supported and graph.problems == ()
    (constant,) = [node for node in graph.nodes if node.kind == "constant"]
    assert graph.layers[constant.name].value.shape == (MAXLEN, EMBED) and constant.ids.size == EMBED
    # the Add couples the token embedding's channels with the constant's
    tokens_node = graph.node("tokens")
    assert np.array_equal(constant.ids, tokens_node.out_ids)
    sparse = penalised_without_a_warning(model)
    x = tokens(rng)
    np.testing.assert_allclose(out(sparse, x), out(model, x), rtol=1e-6, atol=1e-6)
    sparsify(model, rng)
    assert_prunes_exactly(model, x, tmp_path)


def test_the_pruned_keras_io_transformer_has_fewer_heads_and_feed_forward_neurons(rng, tmp_path):
    model = keras_io_model()
    graph = model_graph(model)
    attention = next(graph.layers[n.name] for n in graph.units if isinstance(graph.layers[n.name], L.MultiHeadAttention))
    heads = registry.units_rule(attention).head_kernel(attention)
    value = ops.convert_to_numpy(heads).copy()
    value[0] = 0.0  # the first head writes nothing
    heads.assign(value)
    block = next(layer for layer in model.layers if isinstance(layer, TransformerBlock))
    inner = block.ffn.layers[0]
    kernel, bias = inner.get_weights()
    kernel[:, :6] = 0.0  # six feed-forward neurons read nothing: relu(b), folded into the next bias
    inner.set_weights([kernel, bias])
    small = assert_prunes_exactly(model, tokens(rng), tmp_path)
    (mha,) = [layer for layer in small.layers if isinstance(layer, L.MultiHeadAttention)]
    assert mha.num_heads == HEADS - 1
    widths = sorted(layer.units for layer in small.layers if isinstance(layer, L.Dense))
    assert widths == [2, EMBED, FF - 6, 20]


class PositionsOnly(L.Layer):
    """Token and position embeddings added, then a Dense layer: nothing normalizes the stream, so its channels go."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = L.Embedding(VOCAB, EMBED)
        self.pos_emb = L.Embedding(MAXLEN, EMBED)

    def call(self, x):
        return self.token_emb(x) + self.pos_emb(ops.arange(ops.shape(x)[-1]))


def _drop_stream_channels(model, reader, channels):
    """The units layer ``reader`` no longer reads the stream's ``channels`` (their rows are zero)."""
    layer = model_graph(model).layers[reader]
    kernel, bias = layer.get_weights()
    kernel[channels, :] = 0.0
    layer.set_weights([kernel, bias])


@pytest.mark.parametrize("written", ["block", "functional"])
def test_the_constant_loses_the_channels_the_stream_loses(rng, tmp_path, written):
    inputs = L.Input(shape=(MAXLEN,))
    if written == "block":
        x = PositionsOnly(name="embed")(inputs)
    else:
        x = L.Embedding(VOCAB, EMBED, name="tokens")(inputs) + L.Embedding(MAXLEN, EMBED)(ops.arange(MAXLEN))
    x = L.Dense(12, activation="relu", name="hidden")(x)
    model = keras.Model(inputs, L.Dense(2, name="out")(L.GlobalAveragePooling1D()(x)))
    _drop_stream_channels(model, "hidden", [1, 4, 6])
    small = assert_prunes_exactly(model, tokens(rng), tmp_path)
    assert small.get_layer("hidden").kernel.shape[0] == EMBED - 3
    # the constant keeps the stream's channels (the table), or all its positions (the positions an Embedding reads)
    (step,) = [step for step in small.pruning_plan.steps if step.kind == "new_constant"]
    assert step.entries == ((0, 2, 3, 5, 7) if written == "functional" else tuple(range(MAXLEN)))
    if written == "block":  # the position Embedding, sliced to the kept columns, computes the positions
        tables = sorted(tuple(layer.embeddings.shape) for layer in small.layers if isinstance(layer, L.Embedding))
        assert tables == [(MAXLEN, EMBED - 3), (VOCAB, EMBED - 3)]


def test_the_pruned_transformer_reads_back_as_the_same_graph_and_prunes_again(rng, tmp_path):
    """The pruned model computes its positions from ``zeros_like(sum(x)) + positions``: read back, that is the same
    constant, so the pruned model is penalised again (no warning) and pruned again exactly."""
    model = keras_io_model()
    sparsify(model, rng)
    small = prune_model(model, T)
    graph = model_graph(small)
    assert graph.supported and graph.problems == ()
    (constant,) = [node for node in graph.nodes if node.kind == "constant"]
    np.testing.assert_array_equal(graph.layers[constant.name].value, np.arange(MAXLEN)[None, :])
    penalised_without_a_warning(small)
    x = tokens(rng)
    again = prune_model(small, T)
    np.testing.assert_allclose(out(again, x), out(small, x), rtol=0, atol=1e-5)


def test_tracing_a_block_with_positions_leaves_its_layers_as_they_were():
    """The sublayers of a block are called on symbolic stand-ins of the constants only while its call is traced:
    afterwards they are of their own class again and hold nothing new; the model computes what it did."""
    model = keras_io_model()
    block = next(layer for layer in model.layers if isinstance(layer, TokenAndPositionEmbedding))
    x = np.arange(2 * MAXLEN, dtype="float32").reshape(2, MAXLEN) % VOCAB
    before = out(model, x)
    model_graph(model)
    assert type(block.pos_emb) is L.Embedding and type(block.token_emb) is L.Embedding
    assert "_constant_catcher" not in vars(block.pos_emb)
    np.testing.assert_array_equal(out(model, x), before)

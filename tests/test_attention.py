"""Attention: MultiHeadAttention heads as units, and the Transformer block around them.

A head whose slice of the output kernel is zero adds nothing; surgery builds
the layer with fewer heads. Every surgery is compared output-for-output with
the thresholded original, and the pruned model loads with plain Keras.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    HiddenGroupLasso,
    InvalidParameterError,
    Proximal,
    SparsityMonitor,
    UnsupportedModelError,
    add_group_sparsity,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.groups import GroupView
from _examples import examples
from test_cnn import thresholded_copy
from test_sequences import assert_exact, assert_reloads_plain, kill_rows

T = 1e-3
L = keras.layers
BACKEND = keras.backend.backend()


def attention(rng, width):
    heads = int(rng.integers(1, 5))
    key_dim = int(rng.integers(2, 5))
    # Keras 3.15 on JAX computes attention with a fused kernel that needs value_dim == key_dim.
    value_dim = key_dim if BACKEND == "jax" else int(rng.integers(2, 5))
    return L.MultiHeadAttention(heads, key_dim, value_dim=value_dim, output_shape=None if rng.random() < 0.7
                                else width)


def transformer_block(rng, x, width, causal):
    a = attention(rng, width)(x, x, use_causal_mask=causal) if causal else attention(rng, width)(x, x)
    x = L.LayerNormalization()(L.Add()([x, a]))
    f = L.Dense(int(rng.integers(4, 12)), activation="gelu")(x)
    f = L.Dense(width)(L.Dropout(0.1)(f))
    return L.LayerNormalization()(L.Add()([x, f]))


def random_transformer(rng):
    steps, width = int(rng.integers(3, 6)), int(rng.integers(4, 9))
    if rng.random() < 0.4:
        inp = keras.Input((steps,), dtype="int32")
        x = L.Embedding(10, width, mask_zero=bool(rng.random() < 0.5))(inp)
        data = rng.integers(1, 10, size=(5, steps)).astype("int32")
        data[:, -1] = 0
    else:
        inp = keras.Input((steps, int(rng.integers(3, 7))))
        x = L.Dense(width)(inp)
        data = rng.normal(size=(5,) + tuple(inp.shape[1:])).astype("float32")
    causal = bool(rng.random() < 0.3)
    for _ in range(int(rng.integers(1, 3))):
        x = transformer_block(rng, x, width, causal)
    out = L.Dense(3)(L.GlobalAveragePooling1D()(x))
    return keras.Model(inp, out), data


def kill_heads(model, rng, dead=0.4):
    for layer in model.layers:
        if isinstance(layer, L.MultiHeadAttention):
            weights = layer.get_weights()
            output = weights[-2] if layer.get_config()["use_bias"] else weights[-1]
            heads = (rng.random(output.shape[0]) < dead) & (np.arange(output.shape[0]) > 0)
            output[heads] = 0.0
            layer.set_weights(weights)


@pytest.mark.parametrize("seed", range(examples(8)))  # JAX: a third of them (each compiles its shapes op by op)
def test_random_transformers_prune_heads_exactly_and_reload(seed, tmp_path):
    rng = np.random.default_rng(300 + seed)
    model, x = random_transformer(rng)
    kill_rows(model, rng, dead=0.3)
    kill_heads(model, rng)
    report = sparsity_report(model, T)
    small = prune_model(model, T)
    assert_exact(small, model, x)
    assert_reloads_plain(small, x, tmp_path)
    rows = {row.name: row for row in report.layers}
    for layer in model.layers:
        if isinstance(layer, L.MultiHeadAttention):
            kept = small.get_layer(layer.name).get_config()["num_heads"]
            assert rows[layer.name].heads == layer.get_config()["num_heads"]
            assert rows[layer.name].heads_alive == kept <= layer.get_config()["num_heads"]
            assert f"heads of {layer.name}: {kept}/" in str(report)
    if x.dtype != np.int32:  # the report counts the parameters of the model with the selected features only
        small = prune_model(model, T, inputs="selected")
        assert_exact(small, model, x, x[..., list(small.kept_features)])
    assert report.params_after == sum(layer.count_params() for layer in small.layers
                                      if registry.units_rule(layer) is not None)


@pytest.mark.quick
def test_a_dead_head_leaves_and_the_causal_mask_stays(tmp_path):
    inp = keras.Input((5, 6))
    mha = L.MultiHeadAttention(3, 2)
    out = L.Dense(2)(L.Flatten()(mha(inp, inp, use_causal_mask=True)))
    model = keras.Model(inp, out)
    weights = mha.get_weights()
    weights[6][1] = 0.0  # head 1's output slice
    mha.set_weights(weights)
    small = prune_model(model, T)
    assert small.get_layer(mha.name).get_config()["num_heads"] == 2
    x = np.random.default_rng(0).normal(size=(4, 5, 6)).astype("float32")
    assert_exact(small, model, x)
    changed = x.copy()
    changed[:, -1] += 1.0  # a causal model's first steps do not see the last one
    first = lambda m, v: np.asarray(keras.ops.convert_to_numpy(m.layers[1](v, v, use_causal_mask=True)))[:, 0]  # noqa: E731
    np.testing.assert_allclose(first(small, x), first(small, changed), atol=1e-6)
    assert_reloads_plain(small, x, tmp_path)


def test_head_penalties_train_to_exact_zero_heads_and_are_saved(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6, 8)).astype("float32")
    y = (x[:, :, 0].mean(axis=1) > 0).astype("int32")
    inp = keras.Input((6, 8))
    h = transformer_block(np.random.default_rng(1), L.Dense(8)(inp), 8, False)
    model = keras.Model(inp, L.Dense(2, activation="softmax")(L.GlobalAveragePooling1D()(h)))
    sparse = add_group_sparsity(model, 1e-2)
    mha = next(layer for layer in sparse.layers if isinstance(layer, L.MultiHeadAttention))
    penalty = sparse.head_penalties[mha.name]
    assert isinstance(penalty, HiddenGroupLasso) and penalty.axis == 0
    heads = mha.get_config()["num_heads"]
    assert penalty.group_shape(tuple(mha.weights[6].shape))[1] == heads  # one group per head
    sparse.compile(Proximal(keras.optimizers.Adam(2e-2)), "sparse_categorical_crossentropy")
    history = sparse.fit(x, y, epochs=6, batch_size=64, verbose=0, callbacks=[SparsityMonitor()])
    output = keras.ops.convert_to_numpy(mha.weights[6])
    zero_heads = int(np.sum(np.all(output.reshape(heads, -1) == 0.0, axis=1)))
    report = sparsity_report(sparse, T)
    row = next(r for r in report.layers if r.name == mha.name)
    assert row.heads_alive == max(heads - zero_heads, 1)
    assert history.history["flops"][-1] == pytest.approx(report.flops_ratio)
    assert history.history["live_heads"][-1] == row.heads_alive  # the monitor counts the live heads
    path = tmp_path / "sparse.keras"
    sparse.save(path)
    again = keras.saving.load_model(path)
    assert isinstance(again.head_penalties[mha.name], HiddenGroupLasso)
    assert again.get_layer(mha.name).weights[6].regularizer is again.head_penalties[mha.name]
    small = prune_model(sparse, T)
    assert_exact(small, sparse, x[:8])


def test_group_view_of_heads():
    view = GroupView(axis=0)
    kernel = np.arange(24.0).reshape(3, 2, 4)
    assert view.shape(kernel.shape) == (1, 3, 8)
    assert np.array_equal(view.kernel(view.units(kernel, 3), kernel.shape), kernel)
    np.testing.assert_allclose(view.norms(kernel, 3), np.linalg.norm(kernel.reshape(3, -1), axis=1), rtol=1e-6)
    with pytest.raises(InvalidParameterError, match="axis"):
        HiddenGroupLasso(1e-3, axis=1)


def _seq2seq(form, seed):
    """A tiny encoder-decoder: the decoder's queries read the encoder's outputs through cross-attention (given
    positionally, by keyword in another order, or with a key of its own), a feed-forward head after it."""
    keras.utils.set_random_seed(seed)
    source, target = keras.Input((6, 8), name="source"), keras.Input((5, 7), name="target")
    encoded = L.Dense(16, activation="relu", name="encoder")(source)
    keys = L.Dense(12, activation="relu", name="keys")(source)
    decoded = L.Dense(10, activation="relu", name="decoder")(target)
    mha = L.MultiHeadAttention(2, 4, name="cross")
    mask = keras.ops.ones((1, 5, 6), dtype="bool")  # a constant mask given as a tensor: a side argument
    if form == "positional":
        attended = mha(decoded, encoded)
    elif form == "keywords":
        attended = mha(value=encoded, query=decoded, attention_mask=mask)
    else:
        attended = mha(decoded, encoded, keys)
    hidden = L.Dense(12, activation="relu", name="hidden")(L.Concatenate()([attended, decoded]))
    return keras.Model([source, target], L.Dense(3, name="out")(hidden))


@pytest.mark.quick
@pytest.mark.parametrize("form", ["positional", "keywords", "own_key"])
def test_cross_attention_is_kept_whole_and_the_layers_around_it_prune_exactly(form, rng, tmp_path):
    with pytest.warns(UserWarning, match="'cross' read two tensors .* are kept whole"):
        model = add_group_sparsity(_seq2seq(form, int(rng.integers(1000))), 1e-3)
    penalised = {v.path for v in model.weights if getattr(v, "regularizer", None) is not None}
    assert penalised and not any(path.startswith("cross/") for path in penalised)  # kept whole: no penalty
    kill_rows(model, rng)
    report = sparsity_report(model, T)
    (whole,) = [(name, channels) for name, channels in report.kept_whole if name.startswith("cross")]
    assert whole[1] == 10 + 16 + (12 if form == "own_key" else 0)  # every channel it reads stays
    x = [rng.normal(size=(4, 6, 8)).astype("float32"), rng.normal(size=(4, 5, 7)).astype("float32")]
    small = prune_model(model, T)
    assert small.count_params() < model.count_params()
    assert small.get_layer("cross").get_config()["num_heads"] == 2
    assert_exact(small, model, x)
    assert_reloads_plain(small, x, tmp_path)


def test_cross_attention_called_twice_or_in_other_roles_is_refused_by_name():
    query, context = keras.Input((4, 6)), keras.Input((5, 6))
    mha = L.MultiHeadAttention(2, 3, name="cross")
    twice = keras.Model([query, context], L.Concatenate()([mha(query, context), mha(query, query)]))
    with pytest.raises(UnsupportedModelError, match="'cross' .*a layer reading 2 tensors"):
        prune_model(twice, T)
    # called once here, but in another model first with its tensors in other roles: which is which is not known
    other = L.MultiHeadAttention(2, 3, name="other")
    keras.Model([query, context], other(value=query, query=context))
    again = keras.Model([query, context], L.Dense(2)(other(query, context)))
    with pytest.raises(UnsupportedModelError, match="'other' .*whose calls give its tensors in different roles"):
        prune_model(again, T)


def test_a_recurrent_attention_model_exports_to_every_format(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="SavedModel and TFLite need TensorFlow")
    from keras_group_lasso import export_pruned

    inputs = keras.Input((6, 4))
    x = L.Bidirectional(L.LSTM(5, return_sequences=True))(inputs)
    mha = L.MultiHeadAttention(2, 5)
    x = L.LayerNormalization()(L.Add()([x, mha(x, x)]))
    model = keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(x)))
    weights = mha.get_weights()
    weights[6][0] = 0.0  # head 0 adds nothing
    mha.set_weights(weights)
    # Served unrolled over its 6 steps: TFLite's own ops, no TensorFlow ops left in model.tflite.
    if BACKEND == "jax":  # its SavedModel carries the layers' dropout seed state, which TFLite refuses
        with pytest.raises(ValueError, match="KERAS_BACKEND=tensorflow"):
            export_pruned(model, tmp_path / "tflite", formats=("tflite",))
        result = export_pruned(model, tmp_path / "out", formats=("saved_model", "keras"))
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = export_pruned(model, tmp_path / "out", formats=("saved_model", "keras", "tflite"))
        assert not [w for w in caught if "Flex" in str(w.message)]
    x = np.random.default_rng(0).normal(size=(3, 6, 4)).astype("float32")
    expected = np.asarray(keras.ops.convert_to_numpy(thresholded_copy(model)(x)))
    served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
    np.testing.assert_allclose(served(features=tf.constant(x))["output_0"].numpy(), expected, atol=1e-5)
    if "tflite" in result.paths:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(?s).*tf.lite.Interpreter is deprecated")
            interpreter = tf.lite.Interpreter(model_path=result.paths["tflite"])
        got = interpreter.get_signature_runner("serving_default")(features=x)["output_0"]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert result.manifest["params_after"] < result.manifest["params_before"]


def test_key_and_value_dimensions_that_add_nothing_leave_every_head(tmp_path):
    key_dim, value_dim = (6, 6) if BACKEND == "jax" else (6, 5)
    inputs = keras.Input((5, 8))
    mha = L.MultiHeadAttention(3, key_dim, value_dim=value_dim, name="attention")
    model = keras.Model(inputs, L.Dense(2)(L.Flatten()(mha(inputs, inputs))))
    weights = mha.get_weights()  # query, its bias, key, its bias, value, its bias, output, its bias
    for head, role, dims in ((0, 0, [1, 4]), (1, 0, [0]), (1, 2, [2, 3]), (2, 2, [3, 5])):
        weights[role][:, head, dims] = 0.0  # a query or key column and its bias: q_j * k_j adds nothing
        weights[role + 1][head, dims] = 0.0
    weights[6][:, [1, 3]] = 0.0  # value dimensions 1 and 3 reach no output in any head
    mha.set_weights(weights)
    small = prune_model(model, T)
    config = small.get_layer("attention").get_config()
    # Every head keeps 4 key dimensions (the most live ones in a head: 6 - 2); the query is scaled by
    # sqrt(4 / 6) for Keras's 1 / sqrt(key_dim).
    want = (3, 4, 4) if BACKEND == "jax" else (3, 4, 3)
    assert (config["num_heads"], config["key_dim"], config["value_dim"]) == want
    x = np.random.default_rng(0).normal(size=(4, 5, 8)).astype("float32")
    assert_exact(small, model, x)
    assert_reloads_plain(small, x, tmp_path)
    assert sparsity_report(model, T).params_after == sum(layer.count_params() for layer in small.layers
                                                         if registry.units_rule(layer) is not None)

"""Recurrent networks: SimpleRNN, GRU and LSTM (also inside Bidirectional), with masks and Embedding inputs.

Input groups are rows of the input kernel (every gate), hidden units are rows
of the recurrent kernel plus what the next layer reads. Every surgery is
compared output-for-output with the thresholded original, and the pruned
model is saved and loaded with plain Keras.
"""

import json
import zipfile

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    HiddenGroupLasso,
    InputGroupLasso,
    Proximal,
    SparsityMonitor,
    UnsupportedModelError,
    add_group_sparsity,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import model_graph
from _examples import examples
from test_cnn import thresholded_outputs

T = 1e-3
L = keras.layers
RECURRENT = {"SimpleRNN": L.SimpleRNN, "GRU": L.GRU, "LSTM": L.LSTM}


def outputs(model, x):
    return np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), np.float64)


def assert_exact(small, model, x, small_x=None):
    """``small`` on ``small_x`` (default ``x``) computes what the thresholded ``model`` computes on ``x``."""
    want = thresholded_outputs(model, x, outputs)
    got = outputs(small, x if small_x is None else small_x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def assert_reloads_plain(small, x, tmp_path):
    path = tmp_path / "small.keras"
    small.save(path)
    with zipfile.ZipFile(path) as archive:
        config = archive.read("config.json").decode()
    assert "keras_group_lasso" not in config  # plain Keras loads it
    json.loads(config)
    again = keras.saving.load_model(path)
    np.testing.assert_allclose(outputs(again, x), outputs(small, x), rtol=0, atol=1e-6)


def kill_rows(model, rng, dead=0.35, tiny=0.05):
    """Zero random rows (groups) of every kernel and recurrent kernel, and random columns of Embeddings;
    entries below ``tiny`` go below the threshold. Biases are random."""
    graph = model_graph(model)
    for node in graph.units:
        layer = graph.layers[node.name]
        new = []
        for w in layer.get_weights():
            w = np.array(w)
            if isinstance(layer, L.Embedding):
                w[:, (rng.random(w.shape[1]) < dead) & (np.arange(w.shape[1]) > 0)] = 0.0
            elif w.ndim == 2:  # one row stays: a path from the input to the output is left
                w[(rng.random(w.shape[0]) < dead) & (np.arange(w.shape[0]) != rng.integers(w.shape[0]))] = 0.0
                w[np.abs(w) < tiny] *= 1e-4
            else:
                w = rng.normal(size=w.shape).astype(w.dtype)
            new.append(w)
        layer.set_weights(new)


def recurrent(rng, units, return_sequences):
    kind = rng.choice(sorted(RECURRENT))
    kwargs = dict(return_sequences=return_sequences)
    if kind == "GRU":
        kwargs["reset_after"] = bool(rng.random() < 0.5)
    if rng.random() < 0.2:
        kwargs["use_bias"] = False
    mode = rng.choice(["none", "concat", "concat", "sum", "ave", "mul"])
    if mode == "none":
        return RECURRENT[kind](units, go_backwards=bool(rng.random() < 0.3), **kwargs)
    return L.Bidirectional(RECURRENT[kind](units, **kwargs), merge_mode=str(mode))


def random_sequence_model(rng):
    """``(model, x, float_input)``: a random recurrent model and a batch for it."""
    steps = int(rng.integers(4, 7))
    tokens = rng.random() < 0.35
    if tokens:
        inp = keras.Input((steps,), dtype="int32")
        x = L.Embedding(12, int(rng.integers(3, 6)), mask_zero=bool(rng.random() < 0.5))(inp)
        data = rng.integers(0, 12, size=(6, steps)).astype("int32")
        data[:, -1] = 0  # a padded step
    else:
        channels = int(rng.integers(3, 7))
        inp = keras.Input((steps, channels))
        x = inp
        data = rng.normal(size=(6, steps, channels)).astype("float32")
        if rng.random() < 0.4:
            x = L.Masking(0.0)(x)
            data[:, -1, :] = 0.0  # a masked step
    blocks = int(rng.integers(1, 3))
    for block in range(blocks):
        last = block == blocks - 1
        sequences = not last or rng.random() < 0.5
        x = recurrent(rng, int(rng.integers(3, 7)), sequences)(x)
        if sequences and rng.random() < 0.4:
            x = L.Dense(int(rng.integers(3, 6)), activation="tanh")(x)  # per step
        if last and sequences:
            x = (L.GlobalAveragePooling1D() if rng.random() < 0.5 else L.Flatten())(x)
    out = L.Dense(3)(x)
    return keras.Model(inp, out), data, not tokens


@pytest.mark.parametrize("seed", range(examples(10)))  # JAX: a third of them (each compiles its shapes op by op)
def test_random_recurrent_models_prune_exactly_and_reload(seed, tmp_path):
    rng = np.random.default_rng(100 + seed)
    model, x, float_input = random_sequence_model(rng)
    kill_rows(model, rng)
    before = [np.array(w) for w in model.get_weights()]
    small = prune_model(model, T)
    assert_exact(small, model, x)
    assert_reloads_plain(small, x, tmp_path)
    report = sparsity_report(model, T)
    if float_input:  # a sequence's channels are its features: "selected" takes the kept ones at every step
        selected = prune_model(model, T, inputs="selected")
        kept = list(selected.kept_features)
        assert kept == list(report.selected_features)
        assert tuple(selected.input.shape[1:]) == x.shape[1:-1] + (len(kept),)
        assert_exact(selected, model, x, x[..., kept])
        small = selected
    # The report counts the parameters of the layers that make units: what the pruned model has.
    assert report.params_after == sum(layer.count_params() for layer in small.layers
                                      if registry.units_rule(layer) is not None)
    for a, b in zip(model.get_weights(), before):  # the user's model is never changed
        np.testing.assert_array_equal(a, b)


def test_a_unit_with_no_incoming_weights_is_not_a_constant():
    """All of a unit's gate columns zero: its state still evolves over time, so it stays while it is read."""
    inp = keras.Input((6, 3))
    lstm = L.LSTM(4, return_sequences=True)
    out = L.Dense(2)(lstm(inp))
    model = keras.Model(inp, out)
    kernel, recurrent_kernel, bias = lstm.get_weights()
    columns = np.arange(4) * 4 + 1  # unit 1 in every gate
    kernel[:, columns] = 0.0
    recurrent_kernel[:, columns] = 0.0
    bias[columns] = [0.5, 1.0, 0.7, 0.3]
    lstm.set_weights([kernel, recurrent_kernel, bias])
    x = np.random.default_rng(0).normal(size=(3, 6, 3)).astype("float32")
    steps = outputs(keras.Model(inp, lstm.output), x)[:, :, 1]
    assert np.ptp(steps, axis=1).min() > 1e-3  # it varies over time
    report = sparsity_report(model, T)
    assert report.layers[0].units_alive == 4 and report.layers[0].constant_units == 0
    small = prune_model(model, T)
    assert small.layers[1].units == 4
    assert_exact(small, model, x)


@pytest.mark.quick
def test_a_unit_read_only_through_the_recurrence_stays():
    """Unit j: its row of the next kernel is zero. It goes only when its recurrent row is zero too."""
    inp = keras.Input((5, 3))
    gru = L.GRU(4)
    out = L.Dense(2)(gru(inp))
    model = keras.Model(inp, out)
    kernel, recurrent_kernel, bias = gru.get_weights()
    recurrent_kernel[3] = 0.0  # unit 3 feeds no unit
    head = model.layers[-1]
    w, b = head.get_weights()
    w[[2, 3]] = 0.0  # units 2 and 3 are read by nobody outside the layer
    head.set_weights([w, b])
    gru.set_weights([kernel, recurrent_kernel, bias])
    small = prune_model(model, T)
    assert small.layers[1].units == 3  # unit 2 still feeds the others; unit 3 goes
    report = sparsity_report(model, T)
    assert report.layers[0].units_alive == 3 and report.layer_sizes == (3, 3)
    assert_exact(small, model, np.random.default_rng(1).normal(size=(4, 5, 3)).astype("float32"))


def test_bidirectional_concat_keeps_the_same_width_in_both_directions():
    inp = keras.Input((5, 4))
    bi = L.Bidirectional(L.LSTM(5, return_sequences=True))
    out = L.Dense(2)(L.GlobalAveragePooling1D()(bi(inp)))
    model = keras.Model(inp, out)
    head = model.layers[-1]
    w, b = head.get_weights()
    w[[0, 1, 2, 5]] = 0.0  # forward units 0-2 and backward unit 0 are not read ...
    head.set_weights([w, b])
    weights = bi.get_weights()
    for k in (1, 4):  # ... and feed nobody
        weights[k][[0, 1, 2]] = 0.0
    bi.set_weights(weights)
    small = prune_model(model, T)
    new = small.layers[1]
    assert new.forward_layer.units == new.backward_layer.units == 4  # 2 live forward + 2 kept as the backward's 4
    row = sparsity_report(model, T).layers[0]
    assert row.units_alive == 8
    assert row.flops_before == 2 * 5 * 4 * (4 + 5) * 5  # both directions, 5 steps, 4 gates
    assert row.flops_after == 2 * 5 * 4 * (4 + 4) * 4
    assert_exact(small, model, np.random.default_rng(2).normal(size=(3, 5, 4)).astype("float32"))


def test_penalties_proximal_training_and_surgery_on_a_recurrent_model(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8, 6)).astype("float32")
    y = (x[:, :, 0].mean(axis=1) + x[:, :, 1].mean(axis=1) > 0).astype("int32")  # 2 informative channels
    inp = keras.Input((8, 6))
    h = L.Bidirectional(L.GRU(8, return_sequences=True))(inp)
    h = L.LSTM(6)(h)
    model = keras.Model(inp, L.Dense(2, activation="softmax")(h))
    sparse = add_group_sparsity(model, 3e-3)
    bi, lstm = sparse.layers[1], sparse.layers[2]
    for direction in (bi.forward_layer, bi.backward_layer):
        assert isinstance(direction.kernel_regularizer, InputGroupLasso)  # rows: the input's channels
        assert isinstance(direction.recurrent_regularizer, HiddenGroupLasso)  # rows: its own units
    assert isinstance(lstm.kernel_regularizer, HiddenGroupLasso)
    assert isinstance(lstm.recurrent_regularizer, HiddenGroupLasso)
    again = keras.Model.from_config(sparse.get_config())  # the penalties are in the config
    assert isinstance(again.layers[1].forward_layer.recurrent_regularizer, HiddenGroupLasso)
    sparse.compile(Proximal(keras.optimizers.Adam(1e-2)), "sparse_categorical_crossentropy")
    monitor = SparsityMonitor()
    history = sparse.fit(x, y, epochs=4, batch_size=64, verbose=0, callbacks=[monitor])
    assert history.history["live_neurons"][-1] == sparsity_report(sparse, T).live_neurons  # the monitor's count
    assert history.history["selected_features"][-1] <= 6
    recurrent = keras.ops.convert_to_numpy(lstm.cell.recurrent_kernel)
    assert np.any(np.all(recurrent == 0.0, axis=1))  # whole rows (units) are exactly zero
    report = sparsity_report(sparse, T)
    assert report.live_neurons < 16 + 6
    small = prune_model(sparse, T)
    assert_exact(small, sparse, x[:16])
    assert_reloads_plain(small, x[:16], tmp_path)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda inp: L.LSTM(3, return_state=True)(inp)[0], "return_state=True"),
        (lambda inp: L.GRU(3, activation="softmax")(inp), "activation is not elementwise"),
    ],
)
def test_refused_recurrent_layers_name_the_layer(make, reason):
    inp = keras.Input((4, 3))
    model = keras.Model(inp, L.Dense(2)(make(inp)))
    with pytest.raises(UnsupportedModelError, match=reason):
        prune_model(model, T)

"""The latency table (costs/latency.py) and ``SparsityBudget(max_latency=...)``.

Timings are noisy on a shared machine: the tests check the table's structure and properties (positive,
monotone, exact at the dense widths, a round trip), and steer with a hand-made table where the outcome must
be exact. The speed-ups themselves are measured in ``benchmarks/latency_budget.py``.
"""

import glob
import itertools
import math
import os
import re
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    InvalidParameterError,
    LatencyTable,
    Proximal,
    SparsityBudget,
    SparsityMonitor,
    add_group_sparsity,
    sparsity_report,
)
from keras_group_lasso.analysis import analyze
from keras_group_lasso.costs import current_device


def small_cnn(name="cnn", filters=(8, 16), units=16):
    layers = [keras.Input((12, 12, 1))]
    for k, count in enumerate(filters, start=1):
        layers += [keras.layers.Conv2D(count, 3, padding="same", activation="relu", name=f"conv{k}"),
                   keras.layers.MaxPooling2D()]
    layers += [keras.layers.Flatten(), keras.layers.Dense(units, activation="relu", name="dense"),
               keras.layers.Dense(3, name="logits")]
    return keras.Sequential(layers, name=name)


@pytest.fixture(scope="module")
def table():
    keras.utils.set_random_seed(0)
    return LatencyTable.measure(small_cnn(), batch_size=16, repeats=3)


def grids(table_):
    return table_.to_dict()["batches"][str(table_.batch_sizes[0])]["layers"]


# ----------------------------------------------------------------------------- the table


def test_table_holds_a_grid_per_layer(table):
    assert table.layers == {"conv1": (1, 8), "conv2": (8, 16), "dense": (16, 16), "logits": (16, 3)}
    assert table.batch_sizes == (16,)
    assert table.backend == keras.backend.backend()
    assert table.device and table.measure_seconds > 0
    found = grids(table)
    # ceil(f * dense) for f in (1/8, 1/2, 1) and one unit; the input channel of conv1 and the outputs of logits
    # stay.
    assert found["conv1"]["in"] == [1] and found["conv1"]["out"] == [1, 4, 8]
    assert found["conv2"]["in"] == [1, 4, 8] and found["conv2"]["out"] == [1, 2, 8, 16]
    assert found["dense"]["in"] == [1, 2, 8, 16] and found["dense"]["out"] == [1, 2, 8, 16]
    assert found["logits"]["out"] == [3]
    for entry in found.values():
        seconds = np.asarray(entry["seconds"])
        assert seconds.shape == (len(entry["in"]), len(entry["out"]))
        assert np.all(seconds > 0)
        assert np.all(np.diff(seconds, axis=0) >= 0) and np.all(np.diff(seconds, axis=1) >= 0)


def test_each_layer_is_timed_with_the_per_channel_layers_after_it(monkeypatch):
    # conv1's BatchNormalization and ReLU read it alone: timed with it. conv2's output branches (a residual add
    # reads it and conv3 does), so nothing is timed with it; the add and what follows count in the rest.
    inputs = keras.Input((8, 8, 2))
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU(name="relu1")(x)
    y = keras.layers.Conv2D(4, 3, padding="same", name="conv2")(x)
    z = keras.layers.Conv2D(4, 3, padding="same", name="conv3")(y)
    x = keras.layers.Add(name="add")([y, z])
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(2, name="logits")(keras.layers.Dropout(0.5, name="drop")(x))
    model = keras.Model(inputs, outputs, name="branchy")
    from keras_group_lasso.costs import timing as cost

    timed, compiled = [], cost._compiled

    def recording(obj, is_model):
        timed.append([type(layer).__name__ for layer in getattr(obj, "layers", [])])
        return compiled(obj, is_model)

    monkeypatch.setattr(cost, "_compiled", recording)
    table = LatencyTable.measure(model, batch_size=4, repeats=1)
    assert table.segments == {"conv1": ("bn1", "relu1"), "conv2": (), "conv3": (), "logits": ()}
    # conv1 is timed with its BatchNormalization and ReLU at each of its 3 output widths; conv2 alone (in a model).
    assert sum(names[1:] == ["Conv2D", "BatchNormalization", "ReLU"] for names in timed) == 3
    assert ["InputLayer", "Conv2D"] in timed
    assert "timed with" in table.to_text() and "bn1, relu1" in table.to_text()
    assert LatencyTable.from_dict(table.to_dict()).segments == table.segments
    entry = table.to_dict()["batches"]["4"]
    assert 0.0 < entry["call"] and entry["rest"] >= 0.0


def _record_timers(monkeypatch):
    """``[("built" | "sampled", timer id), ...]`` of every _Timer as LatencyTable.measure builds and samples it."""
    from keras_group_lasso.costs import timing as cost

    events, init, sample = [], cost._Timer.__init__, cost._Timer.sample

    def recording_init(timer, call, x):
        init(timer, call, x)
        events.append(("built", id(timer)))

    def recording_sample(timer):
        events.append(("sampled", id(timer)))
        sample(timer)

    monkeypatch.setattr(cost._Timer, "__init__", recording_init)
    monkeypatch.setattr(cost._Timer, "sample", recording_sample)
    return events


def _small_mlp():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="hidden"),
                             keras.layers.Dense(2, name="out")], name="small")


def test_every_timed_call_is_sampled_in_interleaved_rounds(monkeypatch):
    # All calls are compiled first, then sampled round by round (each once per round, the order rotating), so a
    # slow spell of the machine slows one sample of many calls and never every sample of one.
    events = _record_timers(monkeypatch)
    table = LatencyTable.measure(_small_mlp(), batch_size=8, repeats=3)
    points = sum(len(e["in"]) * len(e["out"]) for e in grids(table).values())
    timers = 3 + points  # the dense model, the fixed cost of a call, the narrow model, every grid point
    built = [t for kind, t in events if kind == "built"]
    sampled = [t for kind, t in events if kind == "sampled"]
    assert len(set(built)) == len(built) == timers and len(sampled) == 3 * timers
    assert events[:timers] == [("built", t) for t in built]  # every call built before the first sample
    first = sampled[:timers]
    assert sorted(first) == sorted(built)
    assert sampled == first + first[1:] + first[:1] + first[2:] + first[:2]


def test_a_large_grid_is_sampled_in_parts_that_fit_in_memory(monkeypatch):
    # With room for one layer's inputs at a time, each layer's grid is sampled (with the dense model, the fixed
    # cost and the narrow model in every part) and released before the next is built; the table is the same kind.
    from keras_group_lasso.costs import timing as cost

    monkeypatch.setattr(cost, "_HELD_BYTES", 0)
    events = _record_timers(monkeypatch)
    table = LatencyTable.measure(_small_mlp(), batch_size=8, repeats=2)
    kinds = [kind for kind, _ in events]
    sizes = [len(e["in"]) * len(e["out"]) for e in grids(table).values()]
    # built: 3 fixed + the first layer's grid; sampled twice with the 3; then the second layer's grid likewise.
    expected = (["built"] * (3 + sizes[0]) + ["sampled"] * 2 * (3 + sizes[0])
                + ["built"] * sizes[1] + ["sampled"] * 2 * (3 + sizes[1]))
    assert kinds == expected
    assert table.predict() == pytest.approx(table.dense_seconds())
    for entry in grids(table).values():
        assert np.all(np.asarray(entry["seconds"]) > 0)


def test_a_chain_that_cannot_be_rebuilt_is_dropped_with_a_warning(monkeypatch):
    from keras_group_lasso.costs import timing as cost

    inputs = keras.Input((8, 8, 2))
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(x), name="chain")
    layer_timer = cost._layer_timer

    def failing(layer, rule, weights, node, shape, width_in, width_out, batch, after=(), inputs=None):
        if after and width_out == 2:
            raise ValueError("cannot rebuild")
        return layer_timer(layer, rule, weights, node, shape, width_in, width_out, batch, after, inputs)

    monkeypatch.setattr(cost, "_layer_timer", failing)
    with pytest.warns(RuntimeWarning, match=r"layer 'conv1' is timed alone: the layers after it \(bn1\)") as said:
        table = LatencyTable.measure(model, batch_size=4, repeats=1)
    assert {w.filename for w in said if "timed alone" in str(w.message)} == {__file__}  # the caller's line
    assert table.segments["conv1"] == ()
    assert np.all(np.asarray(grids(table)["conv1"]["seconds"]) > 0)

    def out_of_memory(*args, **kwargs):
        raise MemoryError("no room")

    monkeypatch.setattr(cost, "_layer_timer", out_of_memory)
    with pytest.raises(MemoryError):  # never mistaken for a layer that cannot be rebuilt
        LatencyTable.measure(model, batch_size=4, repeats=1)


def test_models_are_timed_side_by_side():
    small, wide = _small_mlp(), keras.Sequential([keras.Input((6,)), keras.layers.Dense(512),
                                                  keras.layers.Dense(2)], name="wide")
    times = LatencyTable.time_models([small, wide], batch_size=8, repeats=2)
    assert len(times) == 2 and all(t > 0 for t in times)
    for bad in ([], [small, "model"], small):
        with pytest.raises(InvalidParameterError,
                           match="LatencyTable: argument `models` must be a non-empty list of keras.Model"):
            LatencyTable.time_models(bad)


def test_one_unit_is_a_measured_point_so_a_layer_cut_below_an_eighth_is_not_priced_at_an_eighth(table):
    scale = table.to_dict()["batches"]["16"]["scale"]
    for name in ("conv2", "dense"):
        entry = grids(table)[name]
        one_unit = scale * entry["seconds"][0][0]
        assert entry["in"][0] == entry["out"][0] == 1
        assert table.layer_seconds(name, 1, 1) == pytest.approx(one_unit)
        assert table.layer_seconds(name, 0, 0) == pytest.approx(one_unit)  # a dead layer: the floor, one unit
        # Between one unit and an eighth of the width the time is interpolated, not the eighth's.
        eighth = entry["out"][1]
        assert table.layer_seconds(name, 1, 1) <= table.layer_seconds(name, 1, (1 + eighth) / 2)
        assert table.layer_seconds(name, 1, (1 + eighth) / 2) <= table.layer_seconds(name, 1, eighth)


def test_interpolation_is_positive_and_monotone(table):
    for name, (dense_in, dense_out) in table.layers.items():
        ins = sorted({1, max(1, dense_in // 3), dense_in // 2 or 1, dense_in})
        outs = sorted({1, max(1, dense_out // 3), dense_out // 2 or 1, dense_out})
        values = np.array([[table.layer_seconds(name, i, o) for o in outs] for i in ins])
        assert np.all(values > 0)
        assert np.all(np.diff(values, axis=0) >= 0) and np.all(np.diff(values, axis=1) >= 0), values
        # Between two grid points the time lies between theirs.
        entry = grids(table)[name]
        if len(entry["out"]) > 1:
            lo, hi = entry["out"][0], entry["out"][1]
            mid = table.layer_seconds(name, dense_in, (lo + hi) / 2)
            assert table.layer_seconds(name, dense_in, lo) <= mid <= table.layer_seconds(name, dense_in, hi)


def test_dense_widths_predict_the_dense_model(table):
    dense = table.predict()
    assert dense == pytest.approx(table.dense_seconds())
    assert dense == pytest.approx(table.rest_seconds() + sum(table.layer_seconds(n, *w)
                                                             for n, w in table.layers.items()))
    assert table.rest_seconds() >= 0
    model = small_cnn()
    assert table.predict(sparsity_report(model)) == pytest.approx(dense)
    assert table.predict(analyze(model)) == pytest.approx(dense)
    smaller = {"conv1": (1, 2), "conv2": (2, 4), "dense": (4, 4), "logits": (4, 3)}
    # Measured on a busy machine, a narrow grid point may time no faster than the dense one (the grid is then
    # flat there): narrower never predicts more. Strictly less where the times grow with the widths.
    assert table.predict(smaller) <= dense and table.speedup(smaller) >= 1.0
    for name, (i, o) in table.layers.items():
        assert table.predict({name: (max(1, i // 2), max(1, o // 2))}) <= dense
    made = bilinear_table(model, batch_size=16)
    assert made.predict(smaller) < made.predict() and made.speedup(smaller) > 1.0


def test_rest_shrinks_with_the_activations(table):
    # The rest (pooling, activations, the call) is timed on the model at the smallest grid widths too, built by
    # prune_model, and counts between that and its full-width time in proportion to the hidden activations.
    assert table.narrow_widths == {"conv1": (1, 1), "conv2": (1, 2), "dense": (2, 2), "logits": (2, 3)}
    assert table.positions == {"conv1": 144, "conv2": 36, "dense": 1}
    entry = table.to_dict()["batches"]["16"]
    assert 0.0 <= entry["rest_narrow"] <= entry["rest"] and entry["narrow"] > 0
    sizes = [table.predict({"conv1": (1, o), "conv2": (o, 2 * o), "dense": (2 * o, 2 * o), "logits": (2 * o, 3)})
             for o in (1, 2, 4, 8)]
    assert sizes == sorted(sizes) and sizes[-1] <= table.predict()


def test_prediction_is_near_a_direct_measurement(table):
    # A loose factor: on a busy machine whole stretches of calls run tens of times slower (threads waiting for
    # a core), so a table and a measurement taken apart may disagree; up to three tries, each measuring both.
    narrow = small_cnn(filters=(2, 4), units=4)
    widths = {"conv1": (1, 2), "conv2": (2, 4), "dense": (4, 4), "logits": (4, 3)}
    tries = []
    for attempt in range(3):
        fresh = table if attempt == 0 else LatencyTable.measure(small_cnn(), batch_size=16, repeats=3)
        tries.append((fresh.predict(widths), LatencyTable.time_model(narrow, batch_size=16, repeats=3)))
        if tries[-1][0] / 10 < tries[-1][1] < tries[-1][0] * 10:
            break
    else:
        pytest.fail(f"(predicted, measured) seconds: {tries}")


def test_save_load_round_trip(table, tmp_path):
    path = tmp_path / "latency.json"
    table.save(path)
    loaded = LatencyTable.load(path, model=small_cnn())
    assert loaded == table
    assert loaded.predict({"conv2": (3, 5)}) == table.predict({"conv2": (3, 5)})
    assert repr(loaded) == (f"LatencyTable(model='cnn', layers=4, batch_sizes=[16], backend="
                            f"{keras.backend.backend()!r}, device={table.device!r})")
    text = table.to_text()
    assert text.splitlines()[0].startswith(f"LatencyTable of model 'cnn' on {keras.backend.backend()}, ")
    assert "batch 16: dense model" in text
    assert all(name in text for name in table.layers)
    assert str(table) == text


# ----------------------------------------------------------------------------- bad input


def test_errors_of_the_table(table, tmp_path):
    table.save(tmp_path / "t.json")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `batch_size` must be a batch size the latency table was measured at (16); "
            "received 64.")):
        table.predict(batch_size=64)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `structure` must be widths of layer 'conv2' within (0..8, 0..16); "
            "received (9, 16).")):
        table.predict({"conv2": (9, 16)})
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `structure` must be widths of the layers of model 'cnn' (conv1, conv2, dense, "
            "logits); received a layer named 'conv9'.")):
        table.predict({"conv9": (1, 1)})
    other = small_cnn(name="other", filters=(8, 12))
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `path` must be a latency table measured for this model (layers conv1 1->8, "
            "conv2 8->12, dense 12->16, logits 16->3); received LatencyTable(model='cnn', layers=4, ")):
        LatencyTable.load(tmp_path / "t.json", model=other)
    for bad in (0, -1, (), True):
        with pytest.raises(InvalidParameterError, match=re.escape(
                "LatencyTable: argument `batch_size` must be an integer >= 1 or a tuple of them;")):
            LatencyTable.measure(other, batch_size=bad)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `grid` must be a non-empty sequence of fractions in (0, 1]; received (0.0, 0.5).")):
        LatencyTable.measure(other, grid=(0.0, 0.5))
    # a bool is not a fraction, though float(True) is 1.0; nor is a string, though float("0.5") is 0.5
    for bad in ([True], (0.5, np.True_), ["0.5"], "1", None):
        with pytest.raises(InvalidParameterError, match=re.escape(
                "LatencyTable: argument `grid` must be a non-empty sequence of fractions in (0, 1]; "
                f"received {bad!r}.")):
            LatencyTable.measure(other, grid=bad)
    # the table's own checks name the argument of the call (a direct call: `model`)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `model` must be a model of the layers this table was measured for (conv1 1->8, "
            "conv2 8->16, dense 16->16, logits 16->3); received model 'other' (layers conv1 1->8, conv2 8->12, "
            "dense 12->16, logits 16->3).")):
        table.check_model(other)
    for bad in (None, "cnn"):
        with pytest.raises(InvalidParameterError, match=re.escape(
                f"LatencyTable: argument `model` must be a keras.Model; received {bad!r}.")):
            table.check_model(bad)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `model` must be a keras.Model; received 'cnn'.")):
        LatencyTable.load(tmp_path / "t.json", model="cnn")  # None: no check, the default
    for bad in (None, 5):
        for call in (table.save, LatencyTable.load):
            with pytest.raises(InvalidParameterError, match=re.escape(
                    f"LatencyTable: argument `path` must be a file name (str or os.PathLike); received {bad!r}.")):
                call(bad)
    with pytest.raises(InvalidParameterError, match=re.escape(
            f"LatencyTable: argument `path` must be the name of a file to write the table to; received "
            f"{os.fspath(tmp_path)!r} (a directory).")):
        table.save(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["t.json"]  # nothing else written
    variable = keras.Sequential([keras.Input((None, 4)), keras.layers.Dense(3)])
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `model` must be a model whose inputs have a fixed size (a latency is measured "
            "on inputs of one shape); received a model with input shape (None, None, 4).")):
        LatencyTable.measure(variable)


BUDGET_CONSTRAINT = ("a float in (0, 1] (a fraction of the dense model's measured time) or a pair (seconds > 0, "
                     "batch size) (a time per batch of that size)")


@pytest.mark.parametrize("bad", [0, 0.0, -0.2, 1.5, True, "0.2", (0, 256), (-1.0, 256), (0.01, 0), (0.01, 2.5)])
def test_bad_max_latency(bad):
    with pytest.raises(InvalidParameterError, match=re.escape(
            f"SparsityBudget: argument `max_latency` must be {BUDGET_CONSTRAINT}; received {bad!r}.")):
        SparsityBudget(max_latency=bad)


def test_bad_latency_table_arguments(table):
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityBudget: argument `max_latency` must be a time at a batch size the latency table was measured "
            "at (16); received (0.01, 64).")):
        SparsityBudget(max_latency=(0.01, 64), latency_table=table)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityBudget: argument `latency_table` must be None or a LatencyTable; received 'table.json'.")):
        SparsityBudget(max_latency=0.5, latency_table="table.json")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityBudget: argument `latency_table` must be None without max_latency (the table serves a latency "
            "budget); received LatencyTable(")):
        SparsityBudget(max_flops=0.5, latency_table=table)


def test_a_table_of_another_model_fails_when_fit_starts(table):
    x = np.zeros((8, 12, 12, 1), "float32")
    y = np.zeros((8,), "int32")
    model = add_group_sparsity(small_cnn(filters=(8, 12)), 1e-3)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityBudget: argument `latency_table` must be a latency table measured for this model (layers "
            "conv1 1->8, conv2 8->12, dense 12->16, logits 16->3); received LatencyTable(model='cnn', layers=4, ")):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[SparsityBudget(max_latency=0.5, latency_table=table)])


# ----------------------------------------------------------------------------- steering


def bilinear_table(model, batch_size=256, per_mac=1e-9, rest=1e-4, costlier=None):
    """A hand-made table: each layer costs ``per_mac`` per multiply-add of a sample at every grid point.

    ``costlier``: ``{layer name: factor}``, layers whose multiply-adds cost ``factor`` times more.
    """
    found = analyze(model)
    layers, widths = {}, {}
    for node in found.graph.units:
        share = found.graph.node_flops(node.name) / (node.in_units * node.out_units)
        share *= (costlier or {}).get(node.name, 1.0)
        ins = sorted({1, node.in_units})
        outs = sorted({1, node.out_units})
        layers[node.name] = {"in": ins, "out": outs,
                             "seconds": [[batch_size * per_mac * share * i * o for o in outs] for i in ins]}
        widths[node.name] = (node.in_units, node.out_units)
    total = sum(entry["seconds"][-1][-1] for entry in layers.values())
    return LatencyTable(model.name, widths, {batch_size: {"model": total + rest, "rest": rest, "layers": layers}},
                        keras.backend.backend(), "hand-made")


def digits(n=1024):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x[:n] / 16.0).astype("float32"), y[:n].astype("int32")


def digits_mlp():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu", name="h1"),
                              keras.layers.Dense(32, activation="relu", name="h2"),
                              keras.layers.Dense(10, name="out")], name="digits_mlp")
    return add_group_sparsity(model, 1e-3)


def fit_digits(model, budget, optimizer, epochs=5, n=1024):
    x, y = digits(n)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        history = model.fit(x, y, epochs=epochs, batch_size=128, verbose=0, callbacks=[budget])
    return history, model.evaluate(x, y, verbose=0)[1]


@pytest.mark.parametrize("optimizer", ["proximal", "adam"])
def test_latency_budget_steers_to_the_target(optimizer):
    model = digits_mlp()
    table = bilinear_table(model)
    budget = SparsityBudget(max_latency=0.3, latency_table=table, latency_check=False)
    opt = (Proximal(keras.optimizers.SGD(0.1, momentum=0.9)) if optimizer == "proximal"
           else keras.optimizers.Adam(1e-2))
    history, accuracy = fit_digits(model, budget, opt)
    predicted = table.predict(analyze(model, 1e-3))
    assert predicted <= 0.3 * table.predict() * (1 + 1e-6)
    assert history.history["budget_latency"][-1] == pytest.approx(predicted, rel=1e-5)
    # The strength was steered (the cuts along the schedule did most of the way, so it eased), and a latency
    # budget serves both entries.
    for entry in ("budget_multiplier_hidden", "budget_multiplier_input"):
        searching = history.history[entry][:-2]  # the last two epochs settle (multiplier 0)
        assert any(0.0 < value != 1.0 for value in searching), searching
    assert accuracy > 0.5
    assert budget.latency is None  # latency_check=False


def test_latency_with_other_limits_and_rounding():
    model = digits_mlp()
    table = bilinear_table(model)
    budget = SparsityBudget(max_features=40, max_latency=(0.5 * table.predict(), 256), latency_table=table,
                            round_to=4)
    fit_digits(model, budget, Proximal(keras.optimizers.SGD(0.1, momentum=0.9)))
    report = sparsity_report(model, 1e-3)
    assert report.n_selected_features <= 40
    assert table.predict(analyze(model, 1e-3)) <= 0.5 * table.predict() * (1 + 1e-6)
    assert all(after % 4 == 0 or after == model.get_layer(name).units for name, (_, after) in budget.rounded.items())
    assert budget.latency is None  # a table of another device: the pruned model is not timed here


def test_table_measured_when_fit_starts_and_the_pruned_model_timed():
    model = digits_mlp()
    budget = SparsityBudget(max_latency=(1.0, 128), settle=0.5)
    history, _ = fit_digits(model, budget, Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), epochs=2, n=256)
    assert isinstance(budget.latency_table, LatencyTable)
    assert budget.latency_table.batch_sizes == (128,)
    assert budget.latency_table.layers == {"h1": (64, 64), "h2": (64, 32), "out": (32, 10)}
    result = budget.latency
    assert set(result) == {"batch_size", "predicted", "measured", "dense_predicted", "dense_measured",
                           "predicted_speedup", "measured_speedup", "budget"}
    assert result["batch_size"] == 128 and result["budget"] == pytest.approx(result["dense_predicted"])
    assert all(result[key] > 0 for key in ("predicted", "measured", "dense_measured"))
    assert result["predicted"] <= result["dense_predicted"] * (1 + 1e-6)
    assert len(history.history["budget_latency"]) == 2


def test_state_keeps_the_latency_across_a_round_trip():
    from keras_group_lasso.budget.state import BudgetState

    state = BudgetState().started_from([1.0, 1.0]).replace(
        last_sizes={"features": 3, "units": 4, "params": 5, "flops": 6, "latency": 0.0125})
    again = BudgetState.from_values(state.values())
    assert again == state and again.last_sizes["latency"] == pytest.approx(0.0125)
    for combo in itertools.product([None], [{"features": 1, "units": 2, "params": 3, "flops": 4}]):
        old = BudgetState().replace(last_sizes=combo[1])  # a state without a latency counts 0
        assert BudgetState.from_values(old.values()).last_sizes["latency"] == 0.0


# ----------------------------------------------------------------------------- the report and the monitor


def test_report_with_a_table_holds_the_predicted_latency(table):
    model = small_cnn()
    dense = sparsity_report(model, latency_table=table)
    assert dense.latency_before == pytest.approx(table.predict())
    assert dense.latency_after == pytest.approx(dense.latency_before) and dense.latency_speedup == pytest.approx(1.0)
    assert dense.latency_batch_size == 16
    conv2 = model.get_layer("conv2")
    kernel, bias = conv2.get_weights()
    kernel[..., 4:] = 0.0  # conv2 keeps 4 of its 16 channels; dense then reads 4
    conv2.set_weights([kernel, bias * 0.0])
    report = sparsity_report(model, latency_table=table)
    assert report.latency_after == pytest.approx(table.predict(analyze(model)))
    # A measured table is monotone in the widths; on a busy machine two widths may time the same.
    assert report.latency_after <= report.latency_before
    assert report.latency_speedup == pytest.approx(report.latency_before / report.latency_after) and \
        report.latency_speedup >= 1.0
    line = [line for line in str(report).splitlines() if line.lstrip().startswith("latency:")]
    assert line == [f"  latency:           {1e3 * report.latency_before:.3f} ms -> {1e3 * report.latency_after:.3f} ms "
                    f"per batch of 16 (predicted by the latency table, {report.latency_speedup:.2f}x faster)"]
    assert report.to_dict()["latency_after"] == report.latency_after
    plain = sparsity_report(model)
    assert plain.latency_before is plain.latency_after is plain.latency_speedup is None
    assert "latency" not in str(plain)


def test_report_refuses_a_table_of_another_model(table):
    other = small_cnn(name="other", filters=(8, 12))
    with pytest.raises(InvalidParameterError, match=re.escape(
            "sparsity_report: argument `latency_table` must be a latency table measured for this model (layers "
            "conv1 1->8, conv2 8->12, dense 12->16, logits 16->3); received LatencyTable(model='cnn', layers=4, ")):
        sparsity_report(other, latency_table=table)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "sparsity_report: argument `latency_table` must be None or a LatencyTable; received 'table.json'.")):
        sparsity_report(other, latency_table="table.json")
    two = LatencyTable.from_dict(dict(table.to_dict(), batches={"16": table.to_dict()["batches"]["16"],
                                                                "32": table.to_dict()["batches"]["16"]}))
    with pytest.raises(InvalidParameterError, match=re.escape(
            "sparsity_report: argument `latency_table` must be a LatencyTable of one batch size; received "
            "LatencyTable(model='cnn', layers=4, batch_sizes=[16, 32], ")):
        sparsity_report(small_cnn(), latency_table=two)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityMonitor: argument `latency_table` must be a LatencyTable of one batch size; received ")):
        SparsityMonitor(latency_table=two)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityMonitor: argument `latency_table` must be None or a LatencyTable; received 3.")):
        SparsityMonitor(latency_table=3)


def _latency_events(log_dir):
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    found = {}
    for path in glob.glob(f"{log_dir}/**/events.out.tfevents.*", recursive=True):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.tag.startswith("latency/"):
                    found.setdefault(value.tag, []).append(float(tensor_util.make_ndarray(value.tensor)))
    return found


def test_monitor_logs_the_predicted_latency(table, tmp_path):
    x = np.random.default_rng(0).standard_normal((32, 12, 12, 1)).astype("float32")
    y = np.zeros((32,), "int32")
    model = add_group_sparsity(small_cnn(), 1e-3)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    log_dir = tmp_path / "logs" if keras.backend.backend() == "tensorflow" else None
    monitor = SparsityMonitor(latency_table=table, log_dir=log_dir)
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[monitor])
    report = monitor.last_report
    assert history.history["latency"][-1] == pytest.approx(table.predict(analyze(model)))
    assert history.history["latency"][-1] == pytest.approx(report.latency_after)
    assert history.history["latency_speedup"][-1] == pytest.approx(report.latency_speedup)
    assert len(history.history["latency_speedup"]) == 2
    if log_dir is not None:
        events = _latency_events(log_dir)
        assert events["latency/predicted"] == pytest.approx(history.history["latency"], rel=1e-6)
        assert events["latency/speedup"] == pytest.approx(history.history["latency_speedup"], rel=1e-6)
    # Without a table of its own the monitor reports with the latency budget's, while that budget steers fit.
    model = digits_mlp()
    hand_made = bilinear_table(model)
    monitor = SparsityMonitor()
    budget = SparsityBudget(max_latency=0.5, latency_table=hand_made, latency_check=False)
    x, y = digits(256)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        history = model.fit(x, y, epochs=2, batch_size=128, verbose=0, callbacks=[budget, monitor])
    assert history.history["latency"][-1] == pytest.approx(hand_made.predict(analyze(model)))
    assert history.history["latency_speedup"][-1] == pytest.approx(hand_made.speedup(analyze(model)))
    assert monitor.last_report.latency_batch_size == 256
    history = model.fit(x, y, epochs=1, batch_size=128, verbose=0, callbacks=[monitor])  # the budget is gone
    assert "latency" not in history.history and monitor.last_report.latency_after is None

    class Fails(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("stopped")

    # A budgeted fit that ends by an exception (no on_train_end) leaves nothing to a later fit's monitor ...
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="stopped"):
        warnings.simplefilter("ignore", RuntimeWarning)
        model.fit(x, y, epochs=1, batch_size=128, verbose=0, callbacks=[
            SparsityBudget(max_latency=0.5, latency_table=hand_made, latency_check=False), Fails()])
    history = model.fit(x, y, epochs=1, batch_size=128, verbose=0, callbacks=[monitor])
    assert "latency" not in history.history
    # ... and a monitor before the budget in the list still reports with the budget's table.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        history = model.fit(x, y, epochs=1, batch_size=128, verbose=0, callbacks=[
            monitor, SparsityBudget(max_latency=0.5, latency_table=hand_made, latency_check=False)])
    # (logged before the budget's end of the epoch changed the weights: the structure the epoch trained)
    assert 0 < history.history["latency"][-1] <= hand_made.predict(None)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityMonitor: argument `latency_table` must be a latency table measured for this model (layers "
            "h1 64->64, h2 64->32, out 32->10); received LatencyTable(model='cnn', ")):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[SparsityMonitor(latency_table=table)])


# ----------------------------------------------------------------------------- groups weighted by measured time


def effective_strengths(model):
    """``{layer: factor * sqrt(|g|)}``: the weight each Dense layer's penalty gives one of its groups."""
    return {layer.name: layer.kernel_regularizer.factor * math.sqrt(layer.units)
            for layer in model.layers if isinstance(layer.kernel_regularizer, keras.regularizers.Regularizer)}


def test_latency_group_weights_follow_the_measured_cost():
    model = digits_mlp()  # 64 -> h1 64 -> h2 32 -> out 10
    # A table proportional to the multiply-adds weighs the groups as group_weight="flops" does.
    flops = add_group_sparsity(model, 1e-3, penalty="group", group_weight="flops")
    proportional = add_group_sparsity(model, 1e-3, penalty="group", group_weight="latency",
                                      latency_table=bilinear_table(model))
    assert effective_strengths(proportional) == pytest.approx(effective_strengths(flops), rel=1e-6)
    # A group is a unit; it costs what making it and reading it cost. h1 costlier: the input features (read by
    # h1) weigh more than h2's units (read by out); h2 costlier: the other way round.
    h1 = effective_strengths(add_group_sparsity(model, 1e-3, penalty="group", group_weight="latency",
                                                latency_table=bilinear_table(model, costlier={"h1": 50.0})))
    h2 = effective_strengths(add_group_sparsity(model, 1e-3, penalty="group", group_weight="latency",
                                                latency_table=bilinear_table(model, costlier={"h2": 50.0})))
    assert h1["h1"] > h1["out"] and h2["h1"] < h2["out"]
    assert h1["h2"] > h1["out"] and h2["h2"] > h2["h1"]  # h1's units are made by h1 and read by h2
    # A measured table: every group keeps a penalty (a layer whose time does not grow with width gets a floor).
    measured = LatencyTable.measure(model, batch_size=32, repeats=1, grid=(0.5,))
    weighted = add_group_sparsity(model, 1e-3, group_weight="latency", latency_table=measured)
    assert all(value > 0 for value in effective_strengths(weighted).values())


def test_bad_group_weight_arguments(table):
    model = small_cnn()
    with pytest.raises(InvalidParameterError, match=re.escape(
            "add_group_sparsity: argument `latency_table` must be a LatencyTable of the model with "
            "group_weight='latency' (it weighs the groups); received None.")):
        add_group_sparsity(model, group_weight="latency")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "add_group_sparsity: argument `latency_table` must be None with group_weight='flops' (a table weighs "
            "the groups with group_weight='latency'); received LatencyTable(model='cnn', ")):
        add_group_sparsity(model, group_weight="flops", latency_table=table)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "add_group_sparsity: argument `latency_table` must be None with group_weight='size' (a table weighs "
            "the groups with group_weight='latency'); received LatencyTable(model='cnn', ")):
        add_group_sparsity(model, latency_table=table)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "add_group_sparsity: argument `latency_table` must be None or a LatencyTable; received 'table.json'.")):
        add_group_sparsity(model, group_weight="latency", latency_table="table.json")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "add_group_sparsity: argument `latency_table` must be a latency table measured for this model (layers "
            "conv1 1->8, conv2 8->12, dense 12->16, logits 16->3); received LatencyTable(model='cnn', ")):
        add_group_sparsity(small_cnn(name="other", filters=(8, 12)), group_weight="latency", latency_table=table)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "add_group_sparsity: argument `group_weight` must be one of 'size', 'flops', 'latency'; received "
            "'time'.")):
        add_group_sparsity(model, group_weight="time", latency_table=table)


def test_latency_group_weights_save_and_load(table, tmp_path):
    model = add_group_sparsity(small_cnn(), 1e-3, group_weight="latency", latency_table=table)
    path = tmp_path / "weighted.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    for name in table.layers:
        assert loaded.get_layer(name).kernel_regularizer.get_config() == \
            model.get_layer(name).kernel_regularizer.get_config()
    x = np.random.default_rng(0).standard_normal((4, 12, 12, 1)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)
    assert float(keras.ops.convert_to_numpy(sum(loaded.losses))) == pytest.approx(
        float(keras.ops.convert_to_numpy(sum(model.losses))), rel=1e-6)


def _dead_first_units(model, name, count):
    layer = model.get_layer(name)
    for weight, index in ((layer.kernel, (Ellipsis, slice(0, count))), (layer.bias, slice(0, count))):
        value = keras.ops.convert_to_numpy(weight).copy()
        value[index] = 0.0
        weight.assign(value)


def test_a_report_and_an_analysis_predict_the_same_time(table):
    """A unit whose weights are all zero feeds nothing: the layer after it is timed without that input whether the
    table reads the report (its ``inputs_alive``) or the analysis (its masks), though the rows it feeds are not
    zero (``groups_alive`` counts them)."""
    model = small_cnn()
    _dead_first_units(model, "conv2", 5)
    report = sparsity_report(model, latency_table=table)
    row = {r.name: r for r in report.layers}["dense"]
    assert row.groups == row.groups_alive == 16 and row.inputs_alive == 11
    found = analyze(model, 1e-3)
    assert table.widths_of(report) == table.widths_of(found)
    assert table.predict(report) == pytest.approx(report.latency_after) == pytest.approx(table.predict(found))


def test_the_rest_of_a_partly_dead_model_is_timed_on_a_narrow_copy(rng):
    """The narrow copy that times the rest keeps the first units of each layer at values of its own: a trained
    model whose first units are dead is timed as the dense one is, with no warning."""
    model = small_cnn()
    _dead_first_units(model, "conv1", 4)
    _dead_first_units(model, "dense", 8)
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.weights]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "the rest ... counts as a fixed time" would be one
        measured = LatencyTable.measure(model, batch_size=4, repeats=1, grid=(0.5,))
    assert measured.narrow_widths == {"conv1": (1, 4), "conv2": (4, 8), "dense": (8, 8), "logits": (8, 3)}
    assert measured.to_dict()["batches"]["4"]["narrow"] > 0
    for weight, value in zip(model.weights, before):  # the model is left as it was
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), value)


def test_the_device_names_the_processor_or_the_accelerator():
    device = current_device()
    assert device.startswith(("CPU (", "GPU (", "TPU ("))
    if device.startswith("CPU (") and os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                 if line.lower().startswith("model name")]
        assert not names or " ".join(names[0].split()) in device

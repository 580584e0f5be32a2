"""What a budget needs to resume exactly is kept with the model, and what it cannot reach is said before training.

* a latency table the budget measured is kept in the model's state (saved with its weights): a resumed ``fit``
  counts with the same table, not one measured again on a machine that is busier now;
* a latency budget below the narrowest model's predicted time is refused when ``fit`` starts, naming that floor;
* a model saved while a cut's BatchNormalization statistics renew gets each layer's own momentum back when it is
  loaded (and a resumed ``fit`` ends with it);
* a frozen layer (``trainable=False``) is never written by the budget's cut;
* the state is named variables, and a model saved when it was one vector of 16 values loads and resumes.
"""

import os
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    InvalidParameterError,
    LatencyTable,
    add_group_sparsity,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.budget.state import BudgetState
from keras_group_lasso.costs import current_device
from keras_group_lasso.costs.latency import FORMAT
from keras_group_lasso.declared import BUDGET_VARIABLES, declared_penalties
from keras_group_lasso.graph import model_graph
from test_budget import penalty_paced
from test_nothing_lost import EPOCHS, Interrupt, assert_same, budget, data, outcome, stop_at, train, uninterrupted
from test_nothing_lost import build as build_again

BATCH = 256


def build(kind="add_group_sparsity"):
    """The model a new process builds: the same layer names every time (a latency table knows layers by name)."""
    keras.backend.clear_session()
    return build_again(kind)


def made_up_table(model, layer_ms=1.0, rest_ms=0.1, first_layer=1.0):
    """A latency table of ``model`` on this backend and device, with times that depend on the widths only.

    A layer ``(in, out)`` takes ``layer_ms * in * out / (dense in * dense out)`` (times ``first_layer`` for the
    first one) plus a fixed 0.05 ms; the rest of the model ``rest_ms``.
    """
    layers, grids = {}, {}
    units = model_graph(model).units
    for index, node in enumerate(units):
        layers[node.name] = [node.in_units, node.out_units]
        ins = [1, node.in_units] if node.in_units > 1 else [1]
        outs = [node.out_units] if node.is_output else ([1, node.out_units] if node.out_units > 1 else [1])
        scale = layer_ms * (first_layer if index == 0 else 1.0) / (node.in_units * node.out_units)
        grids[node.name] = {"in": ins, "out": outs,
                            "seconds": [[1e-3 * (0.05 + scale * i * o) for o in outs] for i in ins]}
    total = sum(g["seconds"][-1][-1] for g in grids.values())
    return LatencyTable.from_dict({
        "format": FORMAT, "model": model.name, "layers": layers,
        "backend": keras.backend.backend(), "device": current_device(), "grid": [0.5, 1.0],
        "batches": {str(BATCH): {"model": total + 1e-3 * rest_ms, "rest": 1e-3 * rest_ms, "scale": 1.0,
                                 "layers": grids}}})


@pytest.fixture
def noisy_machine(monkeypatch):
    """``LatencyTable.measure`` that gives another table at every call (the first layer dearer each time), as a
    machine busy with other work at one time and not at another would."""
    calls = []

    def measure(cls, model, batch_size=BATCH, **kwargs):
        calls.append(model.name)
        return made_up_table(model, first_layer=1.0 + 4.0 * (len(calls) - 1))

    monkeypatch.setattr(LatencyTable, "measure", classmethod(measure))
    return calls


_REFERENCE = {}


def latency_reference(noisy_machine):
    """``(outcome, table)`` of the uninterrupted training under ``latency_budget`` (trained once per backend run)."""
    if not _REFERENCE:
        budget, model = latency_budget(), build()
        train(model, [budget])
        assert noisy_machine == [model.name]
        _REFERENCE["value"] = outcome(model), budget.latency_table
    noisy_machine.clear()
    return _REFERENCE["value"]


def latency_budget():
    return penalty_paced(max_latency=0.75, settle=0.3, latency_check=False)


@pytest.mark.turns  # 4 cases over the backends (the resume of every budget is tested on each in test_nothing_lost)
@pytest.mark.parametrize("interrupt", [3, 8], ids=["searching", "settling"])
@pytest.mark.parametrize("budget_first", [True, False], ids=["budget first", "backup first"])
def test_a_resumed_latency_budget_counts_with_the_table_it_measured_first(tmp_path, noisy_machine, interrupt,
                                                                          budget_first):
    want, first_table = latency_reference(noisy_machine)

    def callbacks(budget, *extra):
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        return ([budget, backup] if budget_first else [backup, budget]) + list(extra)

    with pytest.raises(Interrupt):
        train(build(), callbacks(latency_budget(), stop_at(interrupt)))
    resumed, budget = build(), latency_budget()  # a new process: nothing survives but the backup
    train(resumed, callbacks(budget))
    assert budget.latency_table == first_table
    assert_same(outcome(resumed), want)
    # The budget that started after the restore measured nothing; one that started before it measured a table
    # and then counted with the restored one.
    assert len(noisy_machine) == (2 if budget_first else 1)


def test_a_later_fit_uses_the_table_the_model_keeps_and_a_given_table_wins(noisy_machine):
    model = build()
    first = latency_budget()
    train(model, [first])
    second = latency_budget()
    train(model, [second])
    assert noisy_machine == [model.name] and second.latency_table == first.latency_table
    given = made_up_table(model, layer_ms=2.0)
    third = penalty_paced(max_latency=0.75, settle=0.3, latency_table=given, latency_check=False)
    train(model, [third])
    assert third.latency_table is given and len(noisy_machine) == 1


@pytest.mark.parametrize("max_latency", [0.6, 1e-6, (1e-4, BATCH)])
def test_a_latency_budget_below_the_narrowest_model_is_refused_before_the_first_step(max_latency):
    model = build()
    # The rest of the model takes most of the time: one unit per layer is still 0.93 of the dense model.
    table = made_up_table(model, layer_ms=0.05, rest_ms=1.2)
    before = [np.array(w) for w in model.get_weights()]
    x, y = data()
    budget = penalty_paced(max_latency=max_latency, latency_table=table)
    with pytest.raises(InvalidParameterError, match=r"SparsityBudget: argument `max_latency` must be a time the "
                                                    r"model can reach: its narrowest form .* is predicted to take "
                                                    r"1\.\d+ ms at batch 256, 0\.9\d+ of the dense model"):
        model.fit(x, y, epochs=2, batch_size=64, verbose=0, callbacks=[budget])
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)  # not one step was taken


def test_a_measured_table_refuses_an_impossible_budget_too():
    model = build()
    x, y = data()
    with pytest.raises(InvalidParameterError, match="narrowest form"):
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[penalty_paced(max_latency=1e-6)])


def test_a_model_saved_while_its_statistics_renew_loads_with_its_own_momentum(tmp_path):
    path = str(tmp_path / "epoch{epoch:02d}.keras")
    checkpoint = keras.callbacks.ModelCheckpoint(path, save_freq="epoch")
    with pytest.raises(Interrupt):
        train(build("batch normalization"), [budget(), checkpoint, stop_at(9)])
    saved = str(tmp_path / "epoch09.keras")  # written at the end of epoch 8, inside the settling part
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = keras.saving.load_model(saved)
    assert loaded.layers[1].momentum == 0.99
    pruned = prune_model(loaded)
    assert [layer.momentum for layer in pruned.layers if isinstance(layer, keras.layers.BatchNormalization)] == [0.99]
    train(loaded, [budget()], initial_epoch=9)
    assert loaded.layers[1].momentum == 0.99
    assert_same(outcome(loaded), uninterrupted("batch normalization"))


def test_the_cut_never_writes_a_frozen_layer_and_says_why_the_budget_is_missed():
    keras.utils.set_random_seed(0)
    model = add_group_sparsity(keras.Sequential([
        keras.Input((12,)), keras.layers.Dense(8, activation="relu", name="frozen"),
        keras.layers.Dense(6, activation="relu", name="hidden"), keras.layers.Dense(1, activation="sigmoid")]), 1e-6)
    model.get_layer("frozen").trainable = False
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy")
    frozen = [np.array(w) for w in model.get_layer("frozen").get_weights()]
    x, y = data()
    with pytest.warns(RuntimeWarning, match=r"frozen layers \(trainable=False: frozen\)"):
        model.fit(x, y, epochs=EPOCHS, batch_size=64, shuffle=False, verbose=0,
                  callbacks=[penalty_paced(max_features=4, max_units=10, settle=0.3)])
    for a, b in zip(model.get_layer("frozen").get_weights(), frozen):
        np.testing.assert_array_equal(a, b)
    report = sparsity_report(model)
    assert report.n_selected_features == 12 and report.live_neurons <= 10  # the hidden layer gave what it could


def test_the_state_is_named_variables_and_a_model_saved_with_the_16_value_vector_resumes():
    model = build()
    train(model, [budget()])
    names = [v.name for v in model.group_penalty_state.weights]
    assert [name for name in names if name.startswith("budget_")] == [f"budget_{n}" for n in BUDGET_VARIABLES]
    # Saved at the end of epoch 3 (of a search of 7) by the code that kept the state as one vector of 16 values.
    legacy = os.path.join(os.path.dirname(__file__), "data", "budget_state_16_values.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = keras.saving.load_model(legacy)
    declared = declared_penalties(loaded)
    assert BudgetState.from_values(declared.budget_values()) == BudgetState(
        started=True, initial=(1.0, 1.0), reached=(1.0, 1.0), cut=3, decided=3,
        last_sizes={"features": 9.0, "units": 8.0, "params": 89.0, "flops": 80.0, "latency": 0.0})
    assert declared.multiplier_values() == pytest.approx([0.9792721, 1.0])
    train(loaded, [budget()], initial_epoch=3)
    assert sparsity_report(loaded).n_selected_features <= 4
    if keras.backend.backend() == "tensorflow":  # where the file was trained: the uninterrupted run's weights
        assert_same(outcome(loaded), uninterrupted())

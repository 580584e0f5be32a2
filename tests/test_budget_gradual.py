"""The budget's default pace: a size is all the user gives.

``SparsityBudget(max_...)`` with nothing else cuts the weakest groups along its
schedule as training goes, reaches the budget when the last third of the epochs
begins, lands between 0.8 and 1.0 of it, cuts a small share of the groups at
any one check and takes no layer below its least width.
"""

import inspect
import math
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (Proximal, SparsityBudget, add_group_sparsity, apply_threshold, prune_model,
                               sparsity_report)
from keras_group_lasso.budget.cutting import SMALL_CUT
from keras_group_lasso.budget.settings import LEAST_WIDTH, WARM_UP
from keras_group_lasso.budget.cut import fixed_units, group_loads, penalised_kernels, ranked_groups
from keras_group_lasso.costs import unit_costs
from keras_group_lasso.declared import group_sparse_penalties
from keras_group_lasso.graph import model_graph

EPOCHS = 6
# Epochs of search (the first half by default): the budget holds from the end of this one on.
REACHED = math.ceil((1 - inspect.signature(SparsityBudget).parameters["settle"].default) * EPOCHS)


def data(rng, n=320, features=16, informative=4):
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, :informative].sum(axis=1) > 0).astype("float32")
    return x, y


def mlp(features=16, hidden=(16, 16)):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((features,))] + [keras.layers.Dense(h, activation="relu") for h in hidden]
    return add_group_sparsity(keras.Sequential(layers + [keras.layers.Dense(1, activation="sigmoid")]))


def fit(model, x, y, budget, optimizer=None, epochs=EPOCHS):
    model.compile(optimizer or Proximal(keras.optimizers.Adam(1e-2)), "binary_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, epochs=epochs, batch_size=32, verbose=0, callbacks=[budget])
    return history.history, [str(w.message) for w in caught if "SparsityBudget" in str(w.message)]


def groups_of(model):
    """Prunable groups: the rows of every penalised kernel."""
    return sum(int(v.regularizer.group_shape(tuple(v.shape))[-2]) for v in penalised_kernels(model))


SIZE = {"features": "n_selected_features", "units": "live_neurons", "params": "params_after", "flops": "flops_after"}
DENSE = {"features": "n_features", "units": "neurons", "params": "params_before", "flops": "flops_before"}


@pytest.mark.turns  # one size per backend (every other gradual-pace test runs on each)
@pytest.mark.parametrize("kind, fraction, optimizer", [
    ("units", 0.5, "proximal"), ("params", 0.25, "adam"), ("flops", 0.25, "proximal")])
def test_a_size_is_all_you_give(rng, kind, fraction, optimizer):
    x, y = data(rng)
    model = mlp()
    budget = SparsityBudget(**{f"max_{kind}": fraction})
    dense = getattr(sparsity_report(model), DENSE[kind])
    history, _ = fit(model, x, y, budget, None if optimizer == "proximal" else keras.optimizers.Adam(1e-2))
    limit = math.floor(fraction * dense)
    sizes = history[f"budget_{kind}"]
    # Within the budget from the end of the search on, and not far below it.
    assert all(size <= limit for size in sizes[REACHED - 1:]), sizes
    assert 0.8 * limit <= getattr(sparsity_report(model), SIZE[kind]) <= limit
    # Steps along the way rather than one cut at the end: the sizes shrink over the searching epochs, no single
    # check cuts more than a tenth of the groups (one group is 2 % of this network's 48), and the cut when the
    # search ends (each check takes its share of what is left of the way) no more than SMALL_CUT of them.
    assert sizes[0] > sizes[REACHED - 2] > sizes[REACHED - 1]
    assert budget.cuts and max(groups for _, groups in budget.cuts) <= 0.1 * groups_of(model), budget.cuts
    assert sum(groups for when, groups in budget.cuts if when >= REACHED) <= SMALL_CUT * groups_of(model), budget.cuts
    assert history["budget_multiplier_hidden"][REACHED:] == [0.0] * (EPOCHS - REACHED)
    # Surgery stays exact (against the model with its weights at or below the threshold set to zero).
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    apply_threshold(reference, 1e-3)
    np.testing.assert_allclose(prune_model(model).predict(x, verbose=0), reference.predict(x, verbose=0), atol=1e-5)


def test_the_cuts_follow_the_schedule_after_a_warm_up(rng):
    x, y = data(rng)
    model = mlp()
    budget = SparsityBudget(max_units=0.5)
    history, _ = fit(model, x, y, budget)
    # Nothing is cut in the warm-up (the first third of the search, here an epoch and a third), then
    # the live units follow the line from the dense count to the budget at the end of the search.
    first = min(when for when, _ in budget.cuts)
    assert first >= WARM_UP * REACHED
    dense, limit = 32, 16
    for epoch in range(REACHED):
        progress = (epoch + 1 - WARM_UP * REACHED) / (REACHED - WARM_UP * REACHED)
        assert history["budget_units"][epoch] <= limit + (dense - limit) * (1 - progress) + 1e-6
    assert all(when <= REACHED for when, _ in budget.cuts)


def test_no_layer_goes_below_its_least_width(rng):
    # Half the units asked for: a layer keeps at least LEAST_WIDTH of half of its units (min_width="auto"),
    # however weak its groups.
    x, y = data(rng)
    model = mlp(hidden=(16, 16, 16))
    budget = SparsityBudget(max_units=0.5)
    fit(model, x, y, budget)
    live = sparsity_report(model).layer_sizes[1:-1]
    # Three layers of 16 narrowed alike to half their units keep 24 of 48: the budget, so the share is one half.
    assert budget.least_width == pytest.approx(LEAST_WIDTH * 0.5)
    assert min(live) >= math.ceil(budget.least_width * 16), live
    for _, _, penalty in group_sparse_penalties(model):  # the spared groups are for the fit only
        assert penalty.spared == 0


def stream_model():
    """A Transformer-like block: a stream through LayerNormalization (its 16 channels cannot narrow), a feed-forward
    block of 64 neurons beside it."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 4))
    stream = keras.layers.LayerNormalization()(keras.layers.Dense(16)(inputs))
    inner = keras.layers.Dense(64, activation="relu")(stream)
    stream = keras.layers.LayerNormalization()(keras.layers.Add()([stream, keras.layers.Dense(16)(inner)]))
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.GlobalAveragePooling1D()(stream))
    return add_group_sparsity(keras.Model(inputs, outputs))


def test_a_group_whose_unit_cannot_go_is_cut_last():
    # The stream's channels stay (LayerNormalization reads them): a zero row of the feed-forward block's first
    # kernel (a stream channel it reads) frees nothing, so the cut ranks those rows after every other group.
    model = stream_model()
    graph = model_graph(model)
    loads = group_loads(graph, model, [(unit_costs(graph, "flops"), 1.0)], fixed_units(graph))
    reads_stream = {v.path for v in penalised_kernels(model) if v.shape == (16, 64) or v.shape == (16, 1)}
    assert reads_stream and all(not np.any(loads[path]) for path in reads_stream)
    assert all(np.all(load > 0) for path, load in loads.items() if path not in reads_stream)
    ranked, variables = ranked_groups(model, {"input", "hidden"}, loads=loads)
    last = [variables[rows[0][0]].path in reads_stream for _, rows, _ in ranked]
    assert any(last) and last == sorted(last)  # every such group after every other one


def test_least_widths_come_from_what_can_narrow(rng):
    # The stream's channels stay, so the feed-forward neurons must go further than sqrt(f) of them for half the
    # FLOPs: least widths of 0.9 sqrt(0.5) held them above the budget until the final cut. Measured on the graph,
    # the least width lets the budget be met along the schedule, with small cuts.
    x = rng.normal(size=(512, 8, 4)).astype("float32")
    y = (x[:, :, 0].mean(axis=1) > 0).astype("float32")
    model = stream_model()
    budget = SparsityBudget(max_flops=0.5)
    history, warned = fit(model, x, y, budget)
    assert budget.least_width < 0.8 * LEAST_WIDTH * math.sqrt(0.5)
    report = sparsity_report(model)
    assert 0.8 * 0.5 <= report.flops_after / report.flops_before <= 0.5
    assert all(size <= 0.5 * report.flops_before for size in history["budget_flops"][REACHED - 1:])
    assert max(groups for _, groups in budget.cuts) <= 0.1 * groups_of(model), budget.cuts
    assert not warned, warned
    # The least width reads the model's shape, not its weights: a resumed fit (some groups at zero) finds the same.
    again = SparsityBudget(max_flops=0.5)
    fit(model, x, y, again, epochs=1)
    assert again.least_width == budget.least_width


def test_a_least_width_is_given_up_rather_than_the_budget(rng):
    # Every layer at its least width is still over a budget that is only met by cutting below it: the budget
    # holds.
    x, y = data(rng)
    model = mlp()
    budget = SparsityBudget(max_units=4, min_width=0.4)
    fit(model, x, y, budget)
    assert sparsity_report(model).live_neurons <= 4


def fit_digits_cnn(stages, budget, factor=1e-3):
    """A small CNN on 512 DIGITS images (8x8): a same-padded 3x3 ReLU convolution of each width in ``stages``
    (``"pool"``: a 2x2 max-pooling), global average pooling and a softmax; penalised at ``factor`` and trained
    under ``budget`` with ``Proximal(Adam(1e-2))`` for ``EPOCHS``."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).reshape(-1, 8, 8, 1).astype("float32")[:512]
    keras.utils.set_random_seed(0)
    layers = [keras.Input((8, 8, 1))]
    for stage in stages:
        layers.append(keras.layers.MaxPooling2D() if stage == "pool" else
                      keras.layers.Conv2D(stage, 3, padding="same", activation="relu"))
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")]
    model = add_group_sparsity(keras.Sequential(layers), factor)
    model.compile(Proximal(keras.optimizers.Adam(1e-2)), "sparse_categorical_crossentropy")
    model.fit(x, y[:512], epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[budget])
    return model


def test_a_cnn_lands_on_a_quarter_of_its_flops_without_a_stem_of_one_channel():
    # The first convolution works at full resolution: each of its channels frees the most multiply-adds, and a
    # cut weighing that alone would empty it first. Every convolution keeps its least width (on layers this
    # narrow, widths rounded up to whole units can make the least widths cost more than the budget: the budget
    # then comes first).
    budget = SparsityBudget(max_flops=0.25)
    model = fit_digits_cnn([16, 32, "pool", 32], budget)
    report = sparsity_report(model)
    assert 0.8 * 0.25 <= report.flops_after / report.flops_before <= 0.25
    assert LEAST_WIDTH * 0.45 <= budget.least_width <= LEAST_WIDTH * 0.5  # about sqrt(f): every layer narrows
    least = [math.ceil(budget.least_width * units) for units in (16, 32, 32)]
    assert all(live >= low for live, low in zip(report.layer_sizes[1:4], least)), report.layer_sizes



def test_no_cut_takes_a_residual_stream_below_its_least_width():
    # A residual stream's channels are coupled groups, read by every layer on the stream: a kernel's floor keeps
    # the coupled groups of its strongest rows out of every cut (MobileNetV2-style streams of 16 channels had
    # ended 2 wide).
    from keras_group_lasso.budget import cut

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    stream = keras.layers.Conv2D(16, 3, padding="same", name="stem")(inputs)
    inner = keras.layers.Conv2D(32, 1, activation="relu", name="expand")(stream)
    stream = keras.layers.Add()([stream, keras.layers.Conv2D(16, 1, name="project")(inner)])
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(stream))
    model = add_group_sparsity(keras.Model(inputs, outputs))
    expand = model.get_layer("expand").kernel
    strongest = np.argsort(-np.square(keras.ops.convert_to_numpy(expand)).sum(axis=(0, 1, 3)), kind="stable")[:8]
    keys = {expand.regularizer.coupled[row] for row in strongest}
    entries, variables = cut.ranked_groups(model, {"hidden"})
    offered = {row for _, rows, _ in entries for index, row in rows if variables[index].path == expand.path}
    assert offered & set(strongest.tolist())  # without a floor the cut may take them
    entries, variables = cut.ranked_groups(model, {"hidden"}, floors={expand.path: 8})
    offered = {row for _, rows, _ in entries for index, row in rows if variables[index].path == expand.path}
    assert not offered & set(strongest.tolist()) and len(keys) == 8
    assert len(offered) == 16 - 8  # the other channels of the stream can still go


@pytest.mark.parametrize("optimizer", ["proximal", "adam"])
def test_groups_cut_inside_an_epoch_stay_at_zero_and_trace_nothing_again(rng, optimizer):
    # Up to eight checks an epoch cut groups. Every penalised kernel holds its cut groups through a mask that the
    # compiled step reads as it runs (Proximal's variables on every backend, the constraint's own on TensorFlow
    # and PyTorch): the budget traces the step again only when fit begins (the masks, the spared groups) and when
    # it ends (the kernels' own constraints back). On JAX with another optimizer a step holds the mask it was
    # traced with: it is traced again at the end of an epoch that cut, and the groups cut in between are held
    # at zero after every batch.
    x, y = data(rng)
    model = mlp()
    model.compile(Proximal(keras.optimizers.Adam(1e-2)) if optimizer == "proximal" else keras.optimizers.Adam(1e-2),
                  "binary_crossentropy")
    traces, trace = [], model.make_train_function

    def counted(force=False):
        traces.append(force)
        return trace(force)

    model.make_train_function = counted
    budget = SparsityBudget(max_units=0.25)
    held, lost = set(), []

    class Watch(keras.callbacks.Callback):
        """At every batch: each group zero just after a check that cut is still zero (a check holds them all)."""

        def __init__(self):
            super().__init__()
            self.cuts = 0

        def on_train_batch_begin(self, batch, logs=None):
            zero = {(v.path, int(row)) for v in penalised_kernels(self.model)
                    for row in np.flatnonzero(np.all(keras.ops.convert_to_numpy(v) == 0, axis=-1))}
            lost.extend(held - zero)
            if len(budget.cuts) > self.cuts:
                self.cuts = len(budget.cuts)
                held.update(zero)

    model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[budget, Watch()])
    within = [when for when, _ in budget.cuts if when != int(when)]
    assert len(within) > EPOCHS  # several cuts inside epochs
    forced = sum(traces)  # fit makes its step once (force=False); the budget asks for each trace again
    if optimizer == "proximal" or keras.backend.backend() != "jax":
        assert forced == 2, traces
    else:
        assert 2 < forced <= EPOCHS + 2, traces
    assert held and not lost
    assert sparsity_report(model).live_neurons <= 0.25 * 32


def test_a_flop_budget_cuts_about_as_many_groups_at_each_check():
    # FLOPs go as the square of the widths: a schedule even in FLOPs would cut twice as many groups per check at
    # its end as at its start, where each frees twice as much. The schedule is even in width instead, and each
    # check after the warm-up closes its share of the groups still to go. The strength is too weak to remove
    # anything by itself: the cuts do all of it.
    budget = SparsityBudget(max_flops=0.1, min_width=0)
    model = fit_digits_cnn([32, 32], budget, factor=1e-6)
    report = sparsity_report(model)
    assert 0.8 * 0.1 <= report.flops_after / report.flops_before <= 0.1
    counts = [groups for _, groups in budget.cuts]
    half = len(counts) // 2
    assert len(counts) >= 8 and sum(counts[half:]) <= 1.5 * sum(counts[:half]), budget.cuts
    assert max(counts) <= 0.1 * groups_of(model), budget.cuts  # 16 checks share about two thirds of the 65
    assert sum(groups for when, groups in budget.cuts if when >= REACHED) <= SMALL_CUT * groups_of(model)

import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    GroupSparseSequential,
    InputGroupLasso,
    InvalidParameterError,
    Proximal,
    SparsityBudget,
    add_group_sparsity,
    apply_threshold,
    prune_model,
    set_penalty_multiplier,
    sparsity_report,
)
from keras_group_lasso.budget import schedule


#: The budget's earlier pace: the steered penalties remove the groups, a cut when settling begins (the last fifth)
#: catches what they left over, the strength steered at epoch ends, no least width per layer.
PENALTY = dict(pace="penalty", settle=0.2, update_freq="epoch", min_width=0.0)


def penalty_paced(**kwargs):
    """A :class:`SparsityBudget` at the penalty pace (``kwargs`` over :data:`PENALTY`)."""
    return SparsityBudget(**{**PENALTY, **kwargs})


def data(rng, n=512, features=12, informative=3):
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, :informative].sum(axis=1) > 0).astype("float32")
    return x, y


def mlp(features=12, hidden=(8,), factor=1e-3):
    layers = [keras.Input((features,))]
    layers += [keras.layers.Dense(h, activation="relu") for h in hidden]
    layers += [keras.layers.Dense(1, activation="sigmoid")]
    return add_group_sparsity(keras.Sequential(layers), factor)


def fit(model, x, y, budget, epochs=10, optimizer=None):
    optimizer = optimizer or Proximal(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer, "binary_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callbacks = budget if isinstance(budget, list) else [budget]
        history = model.fit(x, y, epochs=epochs, batch_size=32, verbose=0, callbacks=callbacks)
    cuts = [w for w in caught if "SparsityBudget" in str(w.message)]
    return history, cuts


def assert_surgery_exact(model, x):
    """The pruned model's outputs equal the thresholded original's."""
    small = prune_model(model, 1e-3)
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    apply_threshold(reference, 1e-3)
    np.testing.assert_allclose(small.predict(x, verbose=0), reference.predict(x, verbose=0), atol=1e-5)


@pytest.mark.parametrize("optimizer", [pytest.param("proximal", marks=pytest.mark.quick), "adam"])
def test_training_ends_within_a_feature_budget(rng, optimizer):
    x, y = data(rng)
    model = mlp()
    opt = Proximal(keras.optimizers.SGD(0.1, momentum=0.9)) if optimizer == "proximal" else keras.optimizers.Adam()
    history, _ = fit(model, x, y, penalty_paced(max_features=4), epochs=12, optimizer=opt)
    report = sparsity_report(model, 1e-3)
    assert 1 <= report.n_selected_features <= 4
    assert len(set(range(3)) & set(report.selected_features)) >= 2  # the informative columns stay, mostly
    assert history.history["budget_features"][-1] == report.n_selected_features
    for key in ("budget_multiplier_input", "budget_multiplier_hidden", "budget_phase", "budget_over", "budget_cut"):
        assert len(history.history[key]) == 12
    # Only the input groups' strength was steered; at the latest the last fifth (3 epochs) trains without
    # the penalties (earlier when the model is within the budget near the end of the schedule). Each epoch's
    # logs hold the strength that epoch trained with.
    start = history.history["budget_multiplier_hidden"].index(0.0)
    assert 4 <= start <= 9
    assert history.history["budget_multiplier_hidden"] == [1.0] * start + [0.0] * (12 - start)
    assert history.history["budget_multiplier_input"][start:] == [0.0] * (12 - start)
    assert max(history.history["budget_multiplier_input"]) > 1.0
    # The model keeps the strength the search reached.
    reached = keras.ops.convert_to_numpy(model.penalty_multiplier).tolist()
    assert reached == pytest.approx([history.history["budget_multiplier_input"][start - 1], 1.0])


def test_settling_keeps_the_structure_it_starts_with(rng):
    # Strong penalties keep removing features under Proximal; once settling begins nothing goes or comes back.
    x, y = data(rng)
    model = mlp(factor=3e-3)
    history, _ = fit(model, x, y, penalty_paced(max_features=8, settle=0.5), epochs=6)
    sizes = history.history["budget_features"]
    assert sizes[2] <= 8 and sizes[2:] == [sizes[2]] * 4
    kernel = keras.ops.convert_to_numpy(model.layers[0].kernel)
    assert np.sum(np.all(kernel == 0.0, axis=1)) == 12 - sizes[2]
    assert model.layers[0].kernel.constraint is None


def test_settling_begins_once_within_the_budget_near_the_end_of_the_schedule(rng):
    # A strong start reaches the budget before the searching part ends (epoch 8 of 10): the structure
    # is fixed at the first epoch that is within the budget while the schedule is within 5 % of it.
    x, y = data(rng)
    model = mlp(factor=1e-2)
    history, cuts = fit(model, x, y, penalty_paced(max_features=8, schedule_power=3.0), epochs=10)
    sizes = history.history["budget_features"]
    multipliers = history.history["budget_multiplier_input"]

    def near(epoch):  # 12 features to a budget of 8 along (1 - progress) ** 3, progress (epoch + 1) / 8
        return 4 * (1 - (epoch + 1) / 8) ** 3 <= 0.05 * 8

    start = multipliers.index(0.0)  # the first settling epoch's logs carry multiplier 0
    assert start == next(e for e in range(10) if sizes[e] <= 8 and near(e)) and start < 7
    assert multipliers[start:] == [0.0] * (10 - start) and sizes[start:] == [sizes[start]] * (10 - start)
    assert not cuts


def test_a_model_far_below_its_budget_when_settling_begins_is_said(rng):
    x, y = data(rng)
    model = mlp(factor=3e-2)  # so strong that every input group is gone after the first epoch
    history, warned = fit(model, x, y, penalty_paced(max_features=6), epochs=10)
    assert history.history["budget_features"][-1] < 3
    assert len(warned) == 1 and "far below its budget: features" in str(warned[0].message)
    assert "(budget 6)" in str(warned[0].message)


@pytest.mark.parametrize("power", [1.0, 3.0])
def test_the_schedule_follows_its_power(power):
    budget = penalty_paced(max_features=10, schedule_power=power)
    budget.dense, budget.limits = {"features": 50}, {"features": 10}
    plan = budget.plan
    assert (plan.dense, plan.limits, plan.power, plan.gradual) == ({"features": 50}, {"features": 10}, power, False)
    for progress in (0.0, 0.25, 0.5, 1.0):
        way = schedule.targets(plan.dense, plan.limits, progress, plan.power)
        assert way["features"] == pytest.approx(10 + 40 * (1 - progress) ** power)


def test_the_cut_removes_the_fewest_groups_and_lands_on_the_budget(rng):
    x, y = data(rng)
    model = mlp(factor=1e-6)  # too weak to select anything in one epoch
    history, cuts = fit(model, x, y, penalty_paced(max_features=5, settle=0.0), epochs=1)
    assert len(cuts) == 1 and "7 of its weakest groups were set to zero" in str(cuts[0].message)
    assert sparsity_report(model, 1e-3).n_selected_features == 5  # each input group is one feature: exactly the budget
    assert history.history["budget_phase"] == [2]
    assert history.history["budget_cut"] == [7]


@pytest.mark.parametrize("optimizer", ["adam", "proximal"])
def test_cut_groups_stay_at_zero_until_fit_ends(rng, optimizer):
    x, y = data(rng)
    model = mlp(factor=1e-6)  # too weak to select anything: the cut does it, after epoch 2 of 4
    inner = keras.optimizers.Adam(0.01)
    opt = inner if optimizer == "adam" else Proximal(inner)
    history, _ = fit(model, x, y, penalty_paced(max_features=5, settle=0.5), epochs=4, optimizer=opt)
    # The data gradient of a cut row is not zero, yet nothing grows back: no later epoch cuts again.
    assert history.history["budget_cut"] == [0, 7, 0, 0]
    kernel = model.layers[0].kernel
    value = keras.ops.convert_to_numpy(kernel)
    cut = np.flatnonzero(np.all(value == 0.0, axis=1))
    assert len(cut) == 7 and sparsity_report(model, 1e-3).n_selected_features == 5
    # fit ends with the kernel's own constraint, and the next fit traces its step without the cut's.
    assert kernel.constraint is None
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert np.any(keras.ops.convert_to_numpy(kernel)[cut] != 0.0)


def test_a_kernels_own_constraint_applies_under_the_cut(rng):
    x, y = data(rng)
    rows_at_most_half = keras.constraints.MaxNorm(0.5, axis=1)
    layers = [keras.Input((12,)), keras.layers.Dense(8, activation="relu", kernel_constraint=rows_at_most_half),
              keras.layers.Dense(1, activation="sigmoid")]
    model = add_group_sparsity(keras.Sequential(layers), 1e-6)
    fit(model, x, y, penalty_paced(max_features=5, settle=0.5), epochs=4, optimizer=keras.optimizers.Adam(0.05))
    kernel = model.layers[0].kernel
    value = keras.ops.convert_to_numpy(kernel)
    assert np.sum(np.all(value == 0.0, axis=1)) == 7
    assert np.all(np.linalg.norm(value, axis=1) <= 0.5 + 1e-5)  # MaxNorm over each row held throughout
    assert isinstance(kernel.constraint, keras.constraints.MaxNorm)


def test_a_training_stopped_early_still_ends_within_the_budget(rng):
    x, y = data(rng)
    model = mlp(factor=1e-6)
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=0)  # stops after epoch 2
    history, cuts = fit(model, x, y, [penalty_paced(max_features=6), stop], epochs=20)
    assert len(history.history["loss"]) == 2
    assert any("at the end of training" in str(w.message) for w in cuts)
    assert sparsity_report(model, 1e-3).n_selected_features == 6


def test_fractions_units_params_and_flops_budgets_hold_and_surgery_stays_exact(rng):
    x, y = data(rng)
    model = mlp(hidden=(10, 6))
    dense = sparsity_report(model, 1e-3)
    fit(model, x, y, penalty_paced(max_units=6, max_params=0.5), epochs=6)
    report = sparsity_report(model, 1e-3)
    assert report.live_neurons <= 6
    assert report.params_after <= int(0.5 * dense.params_before)

    images = rng.normal(size=(64, 8, 8, 2)).astype("float32")
    labels = (images[..., 0].mean(axis=(1, 2)) > 0).astype("float32")
    cnn = add_group_sparsity(keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1, activation="sigmoid"),
    ]), 1e-3, input_factor=0.0)
    before = sparsity_report(cnn, 1e-3).flops_before
    fit(cnn, images, labels, penalty_paced(max_flops=0.25), epochs=3)
    assert sparsity_report(cnn, 1e-3).flops_after <= before // 4
    assert_surgery_exact(cnn, images)


def test_round_to_lands_every_hidden_width_on_a_multiple_within_the_budget(rng):
    x, y = data(rng)
    model = mlp(hidden=(24, 20))
    dense = sparsity_report(model, 1e-3)
    budget = penalty_paced(max_params=0.3, round_to=8)
    history, _ = fit(model, x, y, budget, epochs=10)
    report = sparsity_report(model, 1e-3)
    assert report.params_after <= int(0.3 * dense.params_before)
    assert budget.rounded and all(after % 8 == 0 for _, after in budget.rounded.values())
    assert all(width % 8 == 0 for width in report.layer_sizes[1:])
    assert history.history["budget_params"][-1] == report.params_after  # the logs count the rounded model

    images = rng.normal(size=(64, 8, 8, 2)).astype("float32")
    labels = (images[..., 0].mean(axis=(1, 2)) > 0).astype("float32")
    cnn = add_group_sparsity(keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(12, 3, padding="same"), keras.layers.BatchNormalization(),
        keras.layers.ReLU(), keras.layers.Conv2D(12, 3, padding="same", activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(1, activation="sigmoid"),
    ]), 1e-3, input_factor=0.0)
    before = sparsity_report(cnn, 1e-3).flops_before
    budget = penalty_paced(max_flops=0.3, round_to=4)
    fit(cnn, images, labels, budget, epochs=4)
    report = sparsity_report(cnn, 1e-3)
    assert report.flops_after <= int(0.3 * before)
    assert all(layer.units_alive % 4 == 0 or layer.units_alive < 4 for layer in report.layers if not layer.is_output)
    assert_surgery_exact(cnn, images)


def test_a_width_the_rounding_plans_counts_the_depthwise_window_of_each_unit_it_adds_or_removes(rng):
    """The sizes a rounding plans (``sizes_with``) are those the model has once the widths are written: the
    multiply-adds of a depthwise convolution over the units that go or come included."""
    from keras_group_lasso.analysis import analyze
    from keras_group_lasso.budget import rounding
    from keras_group_lasso.budget.measure import Meter

    model = add_group_sparsity(keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Conv2D(12, 1, name="expand"),
        keras.layers.DepthwiseConv2D(3, padding="same", name="dw"), keras.layers.ReLU(),
        keras.layers.Conv2D(4, 1, name="project"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2, name="head")]), 1e-3)
    for width in (8, 5):
        found = analyze(model, 1e-3)
        layer = {found.name: found for found in rounding.roundable_layers(found)}["expand"]
        layer.width = width
        planned = rounding.sizes_with(found, Meter(model, 1e-3).of(found.report), {"expand": layer})
        rounding.apply_width(layer, 1e-3, rng)
        report = sparsity_report(model, 1e-3)
        assert report.per_channel[0][2] == 8 * 8 * 9 * width
        assert planned["flops"] == report.flops_after and planned["params"] == report.params_after


def test_round_to_cuts_a_model_over_its_budget_in_whole_blocks(rng):
    x, y = data(rng)
    model = mlp(hidden=(24, 20), factor=1e-6)  # too weak to remove anything: the settling cut does it all
    budget = penalty_paced(max_units=24, round_to=8, settle=0.5)
    history, cuts = fit(model, x, y, budget, epochs=2)
    sizes = sparsity_report(model, 1e-3).layer_sizes[1:]
    assert sum(sizes) <= 24 and all(width % 8 == 0 for width in sizes)
    assert len(cuts) == 1 and f"{44 - sum(sizes)} live units went, in blocks of 8" in str(cuts[0].message)
    assert history.history["budget_phase"] == [2, 2]
    assert history.history["budget_cut"][0] == 44 - sum(sizes)


@pytest.mark.parametrize("fraction", [0.15, 0.2])
def test_round_to_lands_each_layer_at_its_width_when_neighbours_grow_and_shrink(rng, fraction):
    def block(filters):
        return [keras.layers.Conv2D(filters, 3, padding="same"), keras.layers.BatchNormalization(),
                keras.layers.ReLU()]

    model = add_group_sparsity(keras.Sequential(
        [keras.Input((16, 16, 1)), *block(32), *block(32), keras.layers.MaxPooling2D(), *block(64), *block(64),
         keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
         keras.layers.Dense(10)]), 1e-4, input_factor=0.0, group_weight="flops")
    for layer in model.layers:  # 70 % of every layer's units cut (their rows in the next layer at zero)
        penalty = getattr(getattr(layer, "kernel", None), "regularizer", None)
        if penalty is not None and not isinstance(penalty, InputGroupLasso):
            value = keras.ops.convert_to_numpy(layer.kernel).copy()
            view = value.reshape(penalty.group_shape(value.shape))
            view[..., rng.choice(view.shape[-2], int(0.7 * view.shape[-2]), replace=False), :] = 0.0
            layer.kernel.assign(value)
    model.compile("sgd", "mse")
    budget = penalty_paced(max_flops=fraction, round_to=16, settle=0.5)
    budget.set_model(model)
    budget.params = {"epochs": 2}
    budget.on_train_begin()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        budget.on_epoch_end(0, {})  # settling begins: the widths are rounded
    grown = [name for name, (before, after) in budget.rounded.items() if after > before]
    shrunk = [name for name, (before, after) in budget.rounded.items() if after < before]
    assert grown and shrunk
    report = sparsity_report(model, 1e-3)
    alive = {layer.name: layer.units_alive for layer in report.layers}
    assert {name: alive[name] for name in budget.rounded} == {name: after for name, (_, after) in
                                                               budget.rounded.items()}
    assert report.flops_after <= int(fraction * report.flops_before)
    budget.on_train_end()


def test_round_to_grows_a_narrow_layer_into_dead_units_that_then_train(rng):
    x, y = data(rng)
    model = mlp(hidden=(16, 12), factor=1e-9)  # too weak to change the structure set below
    def leave_three(model):  # 3 of the first layer's 16 units: no weight in or out, no bias, so none comes back
        for variable, where in ((model.layers[0].kernel, np.s_[:, 3:]), (model.layers[0].bias, np.s_[3:]),
                                (model.layers[1].kernel, np.s_[3:])):
            value = keras.ops.convert_to_numpy(variable).copy()
            value[where] = 0.0
            variable.assign(value)

    leave_three(model)
    first = model.layers[1].kernel  # its rows are the first layer's units
    budget = penalty_paced(max_units=28, round_to=8, settle=0.5)
    grown_at = []  # the rows right after the budget grew the layer (a callback after the budget's)
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: grown_at.append(keras.ops.convert_to_numpy(first).copy()))
    history, _ = fit(model, x, y, [budget, record], epochs=2)
    assert budget.rounded == {model.layers[0].name: (3, 8)}  # the 12-unit layer keeps all its units
    assert sparsity_report(model, 1e-3).layer_sizes[1:] == (8, 12)
    assert history.history["budget_units"] == [20, 20]  # counted after the rounding
    rows = np.abs(keras.ops.convert_to_numpy(first)).max(axis=1)
    grown = np.flatnonzero(rows > 1e-3)
    assert len(grown) == 8 and set(range(3)) <= set(grown)
    assert np.all(np.abs(grown_at[0][grown[3:]]).max(axis=1) > 1e-3)  # re-initialized, not zero
    assert not np.allclose(grown_at[0][grown[3:]], keras.ops.convert_to_numpy(first)[grown[3:]])  # and trained

    late = mlp(hidden=(16, 12), factor=1e-9)
    leave_three(late)
    budget = penalty_paced(max_units=24, round_to=8, settle=0.0)  # settling at the last epoch: nothing to train
    fit(late, x, y, budget, epochs=2)
    assert budget.rounded == {}
    assert sparsity_report(late, 1e-3).layer_sizes[1:] == (3, 12)


def test_the_compiled_step_reads_the_multiplier_without_recompiling(rng):
    x, y = data(rng, n=32)
    model = mlp()
    model.compile(keras.optimizers.SGD(0.0), "binary_crossentropy")
    penalty = sum(float(v.regularizer(v)) for v in model.weights if v.regularizer is not None)
    first = model.train_on_batch(x, y)
    set_penalty_multiplier(model, 3.0)
    np.testing.assert_allclose(model.train_on_batch(x, y) - first, 2.0 * penalty, rtol=1e-4)
    set_penalty_multiplier(model, input=0.0, hidden=0.0)
    np.testing.assert_allclose(first - model.train_on_batch(x, y), penalty, rtol=1e-4)


def test_proximal_steps_with_the_multiplied_strength(rng):
    x, y = data(rng, n=32)
    scaled, reference = mlp(factor=1e-2), mlp(factor=3e-2)
    reference.set_weights(scaled.get_weights())
    scaled.compile(Proximal(keras.optimizers.SGD(0.1)), "binary_crossentropy")
    reference.compile(Proximal(keras.optimizers.SGD(0.1)), "binary_crossentropy")
    scaled.train_on_batch(x, y)  # builds the optimizer
    reference.train_on_batch(x, y)
    reference.set_weights(scaled.get_weights())
    set_penalty_multiplier(scaled, 3.0)
    for _ in range(3):
        scaled.train_on_batch(x, y)
        reference.train_on_batch(x, y)
    for a, b in zip(scaled.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert keras.ops.convert_to_numpy(scaled.penalty_multiplier).tolist() == [3.0, 3.0]


def test_the_multiplier_saves_and_a_resumed_budget_starts_from_it(rng, tmp_path):
    x, y = data(rng)
    model = mlp()
    history, _ = fit(model, x, y, penalty_paced(max_features=4, settle=0.5), epochs=4)
    reached = keras.ops.convert_to_numpy(model.penalty_multiplier).tolist()
    assert reached[0] == pytest.approx(history.history["budget_multiplier_input"][0])  # the last searching epoch
    path = tmp_path / "budget.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, GroupSparseSequential)
    assert keras.ops.convert_to_numpy(loaded.penalty_multiplier).tolist() == reached
    budget = penalty_paced(max_features=4)
    loaded.fit(x, y, epochs=1, verbose=0, callbacks=[budget])
    assert budget.initial == reached
    assert sparsity_report(loaded, 1e-3).n_selected_features <= 4


@pytest.mark.quick
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "argument `max_features` must be a budget"),
        ({"max_features": True}, "argument `max_features` must be an int >= 1 .* received True"),
        ({"max_units": -1}, "argument `max_units` must be an int >= 1 .* received -1"),
        ({"max_params": 1.5}, r"argument `max_params` must be an int >= 1 \(a count\) or a float in \(0, 1\]"),
        ({"max_flops": "10"}, "argument `max_flops` must be .* received '10'"),
        ({"max_features": 3, "settle": 1.0}, r"argument `settle` must be a fraction in \[0, 1\); received 1.0"),
        ({"max_features": 3, "settle": -0.1}, r"argument `settle` must be a fraction in \[0, 1\); received -0.1"),
        ({"max_features": 3, "settle": "1/2"}, r"argument `settle` must be a fraction in \[0, 1\); received '1/2'"),
        ({"max_features": 3, "max_strength": 0.5},
         "argument `max_strength` must be a finite number >= 1; received 0.5"),
        # the whole range in the first message, not ">= 0" first and ">= 1" after
        ({"max_features": 3, "max_strength": -1}, "argument `max_strength` must be a finite number >= 1; received -1"),
        ({"max_features": 3, "max_strength": float("inf")}, "argument `max_strength` must be .* received inf"),
        ({"max_features": 3, "threshold": -1}, "argument `threshold` must be a finite number >= 0"),
        ({"max_features": 3, "schedule_power": 0},
         "argument `schedule_power` must be a finite number > 0; received 0"),
        ({"max_features": 3, "schedule_power": -1},
         "argument `schedule_power` must be a finite number > 0; received -1"),
        ({"max_features": 3, "schedule_power": True}, "argument `schedule_power` must be .* received True"),
        ({"max_features": 3, "round_to": 0}, "argument `round_to` must be an integer >= 1; received 0"),
        ({"max_features": 3, "round_to": 2.0}, "argument `round_to` must be an integer >= 1; received 2.0"),
        ({"max_features": 3, "update_freq": "step"},
         r"argument `update_freq` must be 'auto', 'epoch', 'batch' or an integer >= 1 \(batches between checks\); "
         "received 'step'"),
        ({"max_features": 3, "update_freq": 0}, "argument `update_freq` must be .* received 0"),
        ({"max_features": 3, "update_freq": 2.0}, "argument `update_freq` must be .* received 2.0"),
        ({"max_features": 3, "update_freq": True}, "argument `update_freq` must be .* received True"),
        ({"max_features": 3, "spare_block": 1}, "argument `spare_block` must be True or False; received 1"),
        ({"max_features": 3, "spare_block": True},
         r"argument `spare_block` must be False with round_to=1 \(it spares a block of round_to units\); "
         "received True"),
        ({"max_features": 3, "uniform_blocks": "yes"},
         "argument `uniform_blocks` must be True or False; received 'yes'"),
        ({"max_features": 3, "pace": "fast"}, "argument `pace` must be 'gradual' or 'penalty'; received 'fast'"),
        ({"max_features": 3, "min_width": 1.0}, r"argument `min_width` must be 'auto' or a fraction in \[0, 1\) of "
         "each layer's units; received 1.0"),
        ({"max_features": 3, "min_width": "half"}, "argument `min_width` must be .* received 'half'"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(InvalidParameterError, match="SparsityBudget: " + message):
        SparsityBudget(**kwargs)


def test_the_arguments_read_back_as_checked_and_cannot_be_changed_unchecked():
    budget = SparsityBudget(max_flops=0.25, update_freq="batch", min_width=0, settle=0.25)
    assert (budget.max_flops, budget.update_freq, budget.min_width, budget.settle) == (0.25, 1, 0.0, 0.25)
    assert budget.settings.budgets == {"features": None, "units": None, "params": None, "flops": 0.25}
    assert budget.settings.search_end(epochs=8) == 6 and budget.settings.checks_every(steps=40) == 1
    for name, value in (("settle", 2.0), ("max_latency", 0.5), ("settings", None)):
        with pytest.raises(AttributeError):
            setattr(budget, name, value)  # would skip the check: a new budget is the way
    assert budget.settle == 0.25 and budget.max_latency is None and budget.settings.settle == 0.25


def test_a_model_without_group_penalties_is_refused_by_name(rng):
    x, y = data(rng, n=32)
    plain = keras.Sequential([keras.Input((12,)), keras.layers.Dense(1, kernel_regularizer="l2")])
    plain.compile("sgd", "mse")
    with pytest.raises(InvalidParameterError, match="SparsityBudget: argument `model` must be a model whose layers "
                                                    "carry group penalties of keras_group_lasso"):
        plain.fit(x, y, verbose=0, callbacks=[penalty_paced(max_features=3)])
    weak = mlp(factor=0.0)
    weak.compile("sgd", "mse")
    with pytest.raises(InvalidParameterError, match="group penalties of factor > 0"):
        weak.fit(x, y, verbose=0, callbacks=[penalty_paced(max_features=3)])
    with pytest.raises(InvalidParameterError, match="set_penalty_multiplier: argument `value` must be a finite "
                                                    r"number >= 0 or None; received -1\.0"):
        set_penalty_multiplier(mlp(), -1)
    with pytest.raises(InvalidParameterError, match="set_penalty_multiplier: argument `model` must be a model whose "
                                                    "layers carry group penalties"):
        set_penalty_multiplier(plain, 2.0)


class _Recorder(keras.callbacks.Callback):
    """The multiplier variable after every batch, as the next train step will read it."""

    def __init__(self, budget):
        super().__init__()
        self.budget, self.seen, self.epoch_starts = budget, [], []

    def _value(self):
        if hasattr(self.model, "jax_state_sync"):
            self.model.jax_state_sync()
        return keras.ops.convert_to_numpy(self.model.penalty_multiplier).tolist()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_starts.append(self._value()[0])

    def on_train_batch_end(self, batch, logs=None):
        value = self._value()
        assert value == pytest.approx(self.budget.multiplier)  # what the budget set, not a stale state
        self.seen.append(value[0])


@pytest.mark.parametrize("update_freq, changes", [("epoch", []), (4, [3, 7, 11]), ("batch", list(range(1, 15)))])
def test_update_freq_steers_within_an_epoch_at_the_per_epoch_rates(rng, update_freq, changes):
    x, y = data(rng)  # 16 batches of 32 per epoch
    model = mlp(factor=1e-4)  # weak: nothing goes in the first epochs, the input multiplier keeps growing
    budget = penalty_paced(max_features=2, update_freq=update_freq)
    recorder = _Recorder(budget)
    history, _ = fit(model, x, y, [budget, recorder], epochs=3)
    first = recorder.seen[:16]  # after batch 1, ..., 16 of the first epoch
    # Checks after batches 4, 8, 12 (every batch) of 16 set new strengths; the epoch's end checks the last ones.
    assert [i for i in range(1, 16) if first[i] != first[i - 1]] == changes
    # The epoch's steps together move the multiplier by at most what the epoch's end alone would: the size
    # over its target there (12 features over 2 + 10 * (1 - 1/3), the schedule of 3 searching epochs).
    ends = history.history["budget_multiplier_input"]
    at_end = 12 / (2 + 10 * (2 / 3))
    if update_freq == "epoch":
        assert ends[0] == pytest.approx(at_end)
    else:
        assert 1.05 < ends[0] <= at_end + 1e-6
    assert recorder.epoch_starts[1] == pytest.approx(ends[0])  # the next epoch trains with it


def test_update_freq_without_a_known_epoch_length_counts_the_first_epoch(rng):
    tf = pytest.importorskip("tensorflow")
    x, y = data(rng)
    unknown = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(32)  # 16 batches
    model = mlp(factor=1e-4)
    model.compile(Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "binary_crossentropy")
    budget = penalty_paced(max_features=2, update_freq=4)
    recorder = _Recorder(budget)
    model.fit(unknown, epochs=3, verbose=0, shuffle=False, callbacks=[budget, recorder])
    first, second = recorder.seen[:16], recorder.seen[16:32]
    assert len(set(first)) == 1  # the first epoch is steered at its end only
    assert [i for i in range(1, 16) if second[i] != second[i - 1]] == [3, 7, 11]


@pytest.mark.parametrize("spare_block", [False, True])
def test_spare_block_keeps_a_block_of_trained_units_in_every_layer_through_the_search(rng, spare_block):
    x, y = data(rng)
    model = add_group_sparsity(keras.Sequential([
        keras.Input((12,)), keras.layers.Dense(24, activation="relu"), keras.layers.Dense(20, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]), 3e-2, input_factor=0.0, penalty="group")
    readers = [model.layers[1].kernel_regularizer, model.layers[2].kernel_regularizer]
    budget = penalty_paced(max_units=16, round_to=8, settle=0.3, spare_block=spare_block)
    searched, spared = [], []

    def record(epoch, logs):
        spared.append([p.spared for p in readers])
        if not budget.state.settling:  # an epoch of the search
            searched.append(sparsity_report(model, 1e-3).layer_sizes[1:3])

    fit(model, x, y, [budget, keras.callbacks.LambdaCallback(on_epoch_end=record)], epochs=6)
    assert searched
    if spare_block:
        assert budget.spared == {model.layers[0].name: 8, model.layers[1].name: 8}
        assert spared == [[8, 8]] * 6
        assert all(min(sizes) >= 8 for sizes in searched)  # the penalties never empty a block
        assert sparsity_report(model, 1e-3).layer_sizes[1:3] == (8, 8)
    else:
        assert budget.spared == {} and spared == [[0, 0]] * 6
        assert min(min(sizes) for sizes in searched) < 8  # the same penalties do without it
    assert [p.spared for p in readers] == [0, 0]
    # The next fit traces its step again, with nothing spared: a strong penalty empties the hidden layers.
    set_penalty_multiplier(model, 1e4)
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert sparsity_report(model, 1e-3).layer_sizes[1:3] == (0, 0)


def test_round_to_says_when_blocks_cannot_meet_the_budget_and_single_groups_are_cut(rng):
    x, y = data(rng)
    model = mlp(hidden=(24, 20), factor=1e-6)  # too weak to remove anything: the settling cut does it all
    budget = penalty_paced(max_units=6, round_to=8, settle=0.5)  # one block of 8 is already more than 6
    _, cuts = fit(model, x, y, budget, epochs=2)
    sizes = sparsity_report(model, 1e-3).layer_sizes[1:]
    assert sum(sizes) <= 6
    assert len(cuts) == 1 and "widths in blocks of 8 (round_to) could not meet it, so " in str(cuts[0].message)
    assert "of its weakest groups were set to zero" in str(cuts[0].message)


# ----------------------------------------------------------------------------- what the cut frees


@pytest.mark.quick
def test_unit_costs_of_each_budget_kind():
    from keras_group_lasso.costs import unit_costs
    from keras_group_lasso.graph import model_graph

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, use_bias=False, name="hidden"),
                              keras.layers.Dense(2, name="out")])
    graph = model_graph(model)
    inputs, hidden, outputs = range(4), graph.node("hidden").out_ids, graph.node("out").out_ids
    # hidden: 12 multiply-adds, 12 parameters (no bias); out: 6 multiply-adds, 6 + 2 parameters.
    expected = {"flops": (12 / 4, 12 / 3 + 6 / 3, 6 / 2), "params": (12 / 4, 12 / 3 + 6 / 3, 8 / 2),
                "units": (0, 1, 0), "features": (1, 0, 0)}
    for kind, (each_input, each_hidden, each_output) in expected.items():
        cost = unit_costs(graph, kind)
        assert [cost[int(u)] for u in inputs] == pytest.approx([each_input] * 4), kind
        assert [cost[int(u)] for u in hidden] == pytest.approx([each_hidden] * 3), kind
        assert [cost.get(int(u), 0.0) for u in outputs] == pytest.approx([each_output] * 2), kind
    # At live widths (2 of the 4 inputs read, 1 hidden unit left): what one more unit costs there.
    cost = unit_costs(graph, "flops", widths={"hidden": (2, 1), "out": (1, 2)})
    assert cost[0] == pytest.approx(1.0) and cost[int(hidden[0])] == pytest.approx(2 / 1 + 2 / 1)


def test_the_cut_ranks_groups_by_weakness_per_share_of_the_budget():
    from keras_group_lasso.budget import cut
    from keras_group_lasso.costs import unit_costs
    from keras_group_lasso.graph import model_graph

    # conv_b's groups are conv_a's channels (made on a 16x16 map, read on a 4x4 one), the head's groups are conv_b's
    # channels (made on the 4x4 map): per share of a FLOP budget a group of conv_b frees 9 times more. The weak
    # group of the head is the weaker (0.4 of its layer's median against 0.5), so it ranks first on weakness alone
    # and second per share of the budget.
    model = add_group_sparsity(keras.Sequential([
        keras.Input((16, 16, 2)), keras.layers.Conv2D(4, 3, padding="same", name="conv_a"),
        keras.layers.MaxPooling2D(4), keras.layers.Conv2D(4, 3, padding="same", name="conv_b"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1, name="head")]), 1e-3)
    model.get_layer("conv_b").kernel.assign(np.ones((3, 3, 4, 4)) * np.array([1, 0.5, 1, 1])[:, None])
    model.get_layer("head").kernel.assign(np.ones((4, 1)) * np.array([1, 0.4, 1, 1])[:, None])
    graph = model_graph(model)
    loads = cut.group_loads(graph, model, [(unit_costs(graph, "flops"), 1000.0)])
    paths = {name: model.get_layer(name).kernel.path for name in ("conv_a", "conv_b", "head")}
    make_a, read_b, make_b, read_head = 16 * 16 * 9 * 2, 4 * 4 * 9 * 4, 4 * 4 * 9 * 4, 1
    assert loads[paths["conv_b"]] == pytest.approx([(make_a + read_b) / 1000.0] * 4)
    assert loads[paths["head"]] == pytest.approx([(make_b + read_head) / 1000.0] * 4)
    assert loads[paths["conv_a"]] == pytest.approx([16 * 16 * 9 * 4 / 1000.0] * 2)  # the input channels

    def weakest(ranked, variables):
        (index, row), = ranked[0][1]
        return variables[index].path, row

    plain, variables = cut.ranked_groups(model, {"hidden"})
    assert weakest(plain, variables) == (paths["head"], 1)
    ranked, variables = cut.ranked_groups(model, {"hidden"}, loads=loads)
    assert weakest(ranked, variables) == (paths["conv_b"], 1)
    assert [round(score, 6) for score, _, _ in ranked] == sorted(round(score, 6) for score, _, _ in ranked)


def _two_layers_of_eight():
    """``(model, strengths, kernel paths, loads)``: b's groups (a's units) as strong as ``strengths``, the head's (b's
    units) in reverse, b's groups freeing ten times more of the budget."""
    model = add_group_sparsity(keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(8, name="a"), keras.layers.Dense(8, name="b"),
        keras.layers.Dense(1, name="head")]), 1e-3)
    strengths = np.array([3, 1, 8, 5, 2, 7, 4, 6], dtype="float32")
    model.get_layer("b").kernel.assign(np.ones((8, 8)) * strengths[:, None])
    model.get_layer("head").kernel.assign(np.ones((8, 1)) * strengths[::-1, None])
    paths = {name: model.get_layer(name).kernel.path for name in ("b", "head")}
    return model, strengths, paths, {paths["b"]: np.full(8, 10.0), paths["head"]: np.full(8, 1.0)}


def test_the_last_groups_of_a_layer_are_the_dearest_so_a_cut_does_not_leave_it_one_unit_wide():
    from keras_group_lasso.budget import cut

    # b's groups (a's units) free ten times more of the budget than the head's (b's units), and within each layer
    # the groups are as weak as 1, 2, ..., 8. Per share of the budget alone every group of b but its strongest
    # would go before any of the head's; the j-th weakest of n groups scores n / (n - j) times, so the cut
    # spreads over both layers, and within a layer it still takes the weakest first.
    model, strengths, paths, loads = _two_layers_of_eight()
    ranked, variables = cut.ranked_groups(model, {"hidden"}, loads=loads)
    first = [(variables[index].path, row) for _, ((index, row),), _ in ranked[:7]]
    from_b = [row for path, row in first if path == paths["b"]]
    from_head = [row for path, row in first if path == paths["head"]]
    # b's j-th weakest scores (j + 1) / 4.5 / 10 * 8 / (8 - j), the head's (j + 1) / 4.5 * 8 / (8 - j): b's five
    # weakest, the head's weakest (0.22), then b's sixth (0.36, before the head's second, 0.51). Without the factor
    # all 7 would be b's, leaving it one unit.
    assert len(from_b) == 6 and len(from_head) == 1
    assert from_b == [int(r) for r in np.argsort(strengths)[:len(from_b)]]
    assert from_head == [int(r) for r in np.argsort(strengths[::-1])[:len(from_head)]]
    # The factor of the j-th weakest of n (a group already cut, scored -1, is the weakest).
    assert cut._depletion(np.array([0.3, 0.1, 0.2, -1.0])) == pytest.approx([4 / 1, 4 / 3, 4 / 2, 4 / 4])


def test_a_layer_above_its_ceiling_loses_its_weakest_groups_first():
    from keras_group_lasso.budget import cut

    # The same two layers: per share of the budget b's groups go first; with a ceiling of 5 live groups on the
    # head, its 3 weakest are ranked right after the groups at zero (FORCED), and a cut takes them whatever it needs.
    model, strengths, paths, loads = _two_layers_of_eight()
    head = np.ones((8, 1)) * strengths[::-1, None]
    head[0] = 0.0  # one group at zero already: it counts among the 8 - 5 to go
    model.get_layer("head").kernel.assign(head)
    dead = {(paths["head"], 0)}

    ranked, variables = cut.ranked_groups(model, {"hidden"}, dead, loads, ceilings={paths["head"]: 5})
    forced = [(variables[index].path, row) for score, ((index, row),), _ in ranked if score == cut.FORCED]
    live_order = [int(r) for r in np.argsort(strengths[::-1]) if r != 0]
    assert sorted(forced) == sorted((paths["head"], row) for row in live_order[:2])  # 7 live, 5 kept: 2 weakest
    assert [score for score, _, _ in ranked[:3]] == [-1.0, cut.FORCED, cut.FORCED]  # after the one at zero
    # A ceiling above the live groups forces nothing.
    ranked, _ = cut.ranked_groups(model, {"hidden"}, dead, loads, ceilings={paths["head"]: 7})
    assert all(score != cut.FORCED for score, _, _ in ranked)


def test_input_features_keep_their_own_score_and_hidden_units_pay_for_what_is_left():
    from keras_group_lasso.budget import cut

    # A feature is selected or not, so input groups score their weakness alone (rms over the kernel's median);
    # a hidden group's score is that times n / (n - j), j its rank among its kernel's n groups.
    model = add_group_sparsity(keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(1, name="head")]), 1e-3)
    model.get_layer("a").kernel.assign(np.ones((6, 4)) * np.arange(1, 7)[:, None] * 0.01)
    model.get_layer("head").kernel.assign(np.array([[3.0], [1.0], [4.0], [2.0]]))
    features, _ = cut.ranked_groups(model, {"input"})
    assert [score for score, _, _ in features] == pytest.approx(np.arange(1, 6) / 3.5)
    units, _ = cut.ranked_groups(model, {"hidden"})
    assert [parts[0][1] for _, parts, _ in units] == [1, 3, 0]  # the strongest (row 2) is never offered
    assert [score for score, _, _ in units] == pytest.approx([1 / 2.5 * 4 / 4, 2 / 2.5 * 4 / 3, 3 / 2.5 * 4 / 2])


def _cut_with_batch_normalization(rng, epochs=4, settle=0.5):
    """A model whose BatchNormalization follows a layer that loses inputs to a cut at the end of epoch 2 of 4."""
    x, y = data(rng)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(8, activation="relu", name="a")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(keras.layers.Dense(6, name="b")(h))
    model = add_group_sparsity(keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(
        keras.layers.ReLU()(h))), 1e-6)  # too weak to remove anything: the cut does it
    momenta = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            momenta.append(model.get_layer("bn").momentum)

    history, warned = fit(model, x, y, [penalty_paced(max_units=5, settle=settle), Record()], epochs=epochs,
                          optimizer=Proximal(keras.optimizers.SGD(0.05, momentum=0.9)))
    # How far the moving statistics are from those of what the layer reads now (in its standard deviations).
    seen = keras.Model(model.inputs, model.get_layer("b").output).predict(x, verbose=0)
    bn = model.get_layer("bn")
    mean_error = np.abs(keras.ops.convert_to_numpy(bn.moving_mean) - seen.mean(0)) / seen.std(0)
    variance_error = np.abs(keras.ops.convert_to_numpy(bn.moving_variance) / seen.var(0) - 1)
    return history, warned, momenta, bn, float(mean_error.max()), float(variance_error.max())


def test_batch_normalization_forgets_what_it_averaged_before_a_cut(rng, monkeypatch):
    from keras_group_lasso.budget import renewal

    history, _, momenta, bn, mean_error, variance_error = _cut_with_batch_normalization(rng)
    assert history.history["budget_cut"][1] > 0
    # 2 epochs of 16 steps are left after the cut: momentum 0.01 ** (1 / 32), then the layer's own again.
    assert momenta == pytest.approx([0.99] + [0.01 ** (1 / 32)] * 3) and bn.momentum == 0.99
    assert mean_error < 0.3 and variance_error < 0.5
    # Averaged on with its own momentum, the layer would still carry 0.99 ** 32 = 72 % of the old statistics.
    monkeypatch.setattr(renewal, "STALE_SHARE", 1.0)
    _, _, momenta, _, mean_error, variance_error = _cut_with_batch_normalization(np.random.default_rng(0))
    assert momenta == [0.99] * 4 and (mean_error > 0.5 or variance_error > 1.0)


def test_a_cut_with_no_step_left_says_that_batch_normalization_statistics_predate_it(rng):
    history, warned, momenta, _, _, _ = _cut_with_batch_normalization(rng, epochs=1, settle=0.0)
    assert history.history["budget_cut"][0] > 0
    assert momenta == [0.99]
    assert any("BatchNormalization statistics were gathered before the cut" in str(w.message) for w in warned)


def test_no_cut_leaves_a_kernel_all_zero_not_even_through_a_residual_stream():
    from keras_group_lasso.budget import cut
    from keras_group_lasso.regularizers import CoupledGroupLasso

    # The stream (conv_a's channels, added to conv_b's) is read by conv_b, conv_c and the head: its channels are
    # coupled groups of all three. conv_c reads nothing else, so if every coupled group went, conv_c's kernel
    # would be all zero and the model would have no path to the output.
    inputs = keras.Input((8, 8, 2))
    a = keras.layers.Conv2D(4, 3, padding="same", name="conv_a")(inputs)
    b = keras.layers.Conv2D(4, 3, padding="same", name="conv_b")(a)
    stream = keras.layers.Add(name="add")([a, b])
    c = keras.layers.Conv2D(3, 1, name="conv_c")(stream)
    outputs = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling2D()(c))
    model = add_group_sparsity(keras.Model(inputs, outputs), 1e-3)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if layer.weights:
            layer.kernel.assign(rng.uniform(0.1, 1.0, tuple(layer.kernel.shape)))
    coupled = [v for v in model.weights if isinstance(getattr(v, "regularizer", None), CoupledGroupLasso)]
    assert coupled, "the residual stream's channels are coupled groups"
    ranked, variables = cut.ranked_groups(model, {"input", "hidden"})
    cut_rows = {(variables[index].path, row) for _, parts, _ in ranked for index, row in parts}
    for variable in variables:
        rows = variable.regularizer.group_shape(tuple(variable.shape))[-2]
        assert any((variable.path, row) not in cut_rows for row in range(rows)), variable.path
    # conv_c's strongest group is a stream channel: that coupled group is never offered to the cut.
    kernel = model.get_layer("conv_c").kernel
    strongest = int(np.argmax(np.abs(np.asarray(kernel)).reshape(-1, 4, 3).sum(axis=(0, 2))))
    assert (kernel.path, strongest) not in cut_rows


def test_a_fraction_that_leaves_no_group_is_refused_when_fit_starts(rng):
    x, y = data(rng, n=64)
    model = mlp()
    model.compile("sgd", "binary_crossentropy")
    with pytest.raises(InvalidParameterError, match=r"^SparsityBudget: argument `max_features` must be a fraction that "
                       r"leaves at least one of the model's 12 selected input features \(the strongest group of every "
                       r"layer stays\); received 0.05\.$"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[SparsityBudget(max_features=0.05)])
    with pytest.raises(InvalidParameterError, match="argument `max_units` must be a fraction that leaves at least one "
                                                    "of the model's 8 live hidden units"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[SparsityBudget(max_units=0.1)])


def _grown_back(model, live, out_scale=None):
    """``model``'s hidden layer with only its first ``live`` units alive (the others zero in and out)."""
    hidden, out = model.get_layer("hidden"), model.get_layer("out")
    value = keras.ops.convert_to_numpy(hidden.kernel).copy()
    value[:, live:] = 0.0
    hidden.kernel.assign(value)
    value = keras.ops.convert_to_numpy(out.kernel).copy()
    value[live:] = 0.0
    if out_scale is not None:
        value[:live] = out_scale
    out.kernel.assign(value)
    return hidden, out


def test_units_that_rounding_grows_back_are_all_live_however_small_the_draw(rng):
    """A grown unit's new weights are drawn small (a tenth of the live ones, at least 4x the threshold); a group of
    one weight (a row of a one-output layer) drawn under the threshold would be dead at once: none is."""
    from keras_group_lasso.analysis import analyze
    from keras_group_lasso.budget import rounding

    model = add_group_sparsity(keras.Sequential([keras.Input((12,)), keras.layers.Dense(64, name="hidden"),
                                                 keras.layers.Dense(1, name="out")]), 1e-3)
    hidden, out = _grown_back(model, 8, out_scale=0.005)  # the least scale: 4e-3, a draw under 1e-3 one in five
    layer = {found.name: found for found in rounding.roundable_layers(analyze(model, 1e-3))}["hidden"]
    layer.width = 64
    back = rounding.apply_width(layer, 1e-3, np.random.default_rng(0))
    assert len(back) == 56
    assert np.all(np.abs(keras.ops.convert_to_numpy(out.kernel)).max(axis=1) > 1e-3)
    assert np.all(np.abs(keras.ops.convert_to_numpy(hidden.kernel)).max(axis=0) > 1e-3)
    assert sparsity_report(model, 1e-3).live_neurons == 64


def test_units_that_rounding_grows_back_train_on_with_the_gradual_pace(rng):
    """With the gradual pace every zero group is held at zero by a mask from the first epoch on; rounding that grows
    a layer back to all its units frees their rows again, so they train and the layer keeps its rounded width."""
    x, y = data(rng, n=256)
    keras.utils.set_random_seed(0)
    model = add_group_sparsity(keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu",
                                                                                           name="hidden"),
                                                 keras.layers.Dense(2, activation="softmax", name="out")]), 1e-4)
    _grown_back(model, 10)
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    budget = SparsityBudget(max_features=11, round_to=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[budget])
    assert budget.rounded == {"hidden": (10, 16)}
    assert sparsity_report(model, 1e-3).layer_sizes[1] == 16
    assert np.all(np.abs(keras.ops.convert_to_numpy(model.get_layer("out").kernel)).max(axis=1) > 0.0)


def test_batch_normalization_renews_its_statistics_after_a_cut_on_data_of_unknown_length(rng):
    """Without a batch hook (``update_freq="epoch"``) and with no step count from Keras (a dataset of unknown
    length), the steps of an epoch are counted from the optimizer: the cut's renewal lowers the momentum as it does
    on arrays, and the momentum is the layer's own again when ``fit`` ends."""
    import tensorflow as tf

    x, y = data(rng, n=256)
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, name="hidden")(inputs)
    hidden = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name="bn")(hidden))
    model = add_group_sparsity(keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden)), 1e-4)
    model.compile(keras.optimizers.SGD(0.05), "binary_crossentropy")
    budget = SparsityBudget(max_units=4, update_freq="epoch")
    momenta = []

    class Momentum(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            momenta.append(self.model.get_layer("bn").momentum)

    unknown = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).filter(lambda a, b: True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(unknown, epochs=4, verbose=0, callbacks=[budget, Momentum()])
    assert budget.state.cut > 0 and budget.cuts
    assert momenta[0] == 0.99 and min(momenta) < 0.9
    assert model.get_layer("bn").momentum == 0.99


def test_a_small_cut_with_no_epoch_left_after_it_is_said_in_a_warning(rng, caplog):
    """A cut of a few groups when settling begins is the gradual pace's last step (logged); the same cut when
    ``fit`` ends (stopped during the search) leaves no step to recover from it: a warning says so."""
    x, y = data(rng, n=128)
    model = mlp(hidden=(40,), factor=1e-7)  # too weak to remove anything by itself

    class StopAfterOne(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    budget = SparsityBudget(max_units=38)
    with caplog.at_level("INFO", logger="keras_group_lasso"):
        history, said = fit(model, x, y, [budget, StopAfterOne()], epochs=10)
    assert len(history.history["loss"]) == 1 and budget.cuts and sum(n for _, n in budget.cuts) <= 0.05 * 52
    assert sparsity_report(model, 1e-3).live_neurons <= 38
    assert [str(w.message) for w in said if "at the end of training the model was still over its budget" in
            str(w.message)], [str(w.message) for w in said]
    assert "when settling began" not in caplog.text


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX only: a compiled JAX step receives the model's "
                    "variables, which a plain Sequential does not count its penalties' state among")
def test_a_plain_sequential_is_refused_on_jax_and_left_as_it_was(rng, tmp_path):
    from keras_group_lasso import SparseGroupLasso

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_regularizer=SparseGroupLasso(1e-3)),
                              keras.layers.Dense(2)])
    before = len(model.weights)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    model.compile("sgd", "mse")
    for attempt in (lambda: set_penalty_multiplier(model, 2.0),
                    lambda: model.fit(x, y, verbose=0, callbacks=[SparsityBudget(max_units=2)])):
        with pytest.raises(InvalidParameterError, match="a Functional model or one made by add_group_sparsity, on "
                                                        "the JAX backend"):
            attempt()
        assert not hasattr(model, "group_penalty_state") and len(model.weights) == before
    model.save_weights(tmp_path / "plain.weights.h5")  # the layers' weights only
    fresh = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    fresh.load_weights(tmp_path / "plain.weights.h5")

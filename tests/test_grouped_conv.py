"""Grouped convolutions (``groups=g``, ResNeXt and RegNet blocks): penalties per channel, whole groups pruned.

Every surgery test compares the pruned model output-for-output with the
thresholded original (a copy: the user's model is never changed) and reloads
the pruned ``.keras`` with plain Keras.
"""

import json

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    HiddenGroupLasso,
    Proximal,
    add_group_sparsity,
    coupled_groups,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.groups import GroupView
from test_branching import kill_units
from test_model_families import T, assert_prunes_exactly_and_reloads, assert_same_outputs, assert_untouched, weights_of

L = keras.layers


def layer_of(report, name):
    (found,) = [layer for layer in report.layers if layer.name == name]
    return found


# ----------------------------------------------------------------------------- the group view


@pytest.mark.parametrize("groups,per_in,filters", [(2, 3, 4), (4, 1, 8), (3, 2, 9)])
def test_the_view_holds_each_channels_weights_into_its_own_group_in_the_row_unit_order_names(groups, per_in, filters,
                                                                                            rng):
    view = GroupView(conv_groups=groups)
    kernel = rng.normal(size=(3, 3, per_in, filters))
    channels, per_out = groups * per_in, filters // groups
    full = view.units(kernel, channels)
    assert full.shape == (9, channels, filters)
    np.testing.assert_array_equal(view.kernel(full, kernel.shape), kernel)
    rows = kernel.reshape(view.shape(kernel.shape))  # what a penalty and the proximal step see: a reshape only
    assert rows.shape == (9, channels, per_out)
    for row, channel in enumerate(view.unit_order(channels)):
        q = channel // per_in
        own = kernel[..., channel % per_in, q * per_out:(q + 1) * per_out].reshape(9, per_out)
        np.testing.assert_array_equal(rows[:, row, :], own)
        outside = np.delete(full[:, channel, :], np.arange(q * per_out, (q + 1) * per_out), axis=1)
        assert not outside.any()  # a channel reaches the filters of its own group only
    assert sorted(view.unit_order(channels)) == list(range(channels))
    np.testing.assert_allclose(view.norms(kernel, channels),
                               np.sqrt(np.sum(full ** 2, axis=(0, 2))), rtol=1e-6)


def test_a_penalty_on_a_grouped_kernel_is_the_sum_over_channels_and_round_trips(rng):
    kernel = rng.normal(size=(3, 3, 2, 6)).astype("float32")  # groups=3: 6 input channels, 2 filters per group
    penalty = HiddenGroupLasso(0.1, conv_groups=3)
    full = GroupView(conv_groups=3).units(kernel, 6)
    group_size = 9 * 2
    want = 0.1 * np.sqrt(group_size) * np.sum(np.sqrt(np.sum(full.astype(np.float64) ** 2, axis=(0, 2))))
    assert float(keras.ops.convert_to_numpy(penalty(kernel))) == pytest.approx(want, rel=1e-5)
    config = penalty.get_config()
    assert config["conv_groups"] == 3
    assert HiddenGroupLasso.from_config(json.loads(json.dumps(config))) == penalty
    with pytest.raises(ValueError, match=r"^HiddenGroupLasso: argument `conv_groups` must be a divisor of the filters "
                                         r"of the kernel \(the kernel has shape \(3, 3, 2, 5\)\); received 3\.$"):
        HiddenGroupLasso(0.1, conv_groups=3)(np.ones((3, 3, 2, 5), "float32"))
    with pytest.raises(ValueError, match=r"^HiddenGroupLasso: argument `conv_groups` must be None with channels or "
                                         r"axis set"):
        HiddenGroupLasso(0.1, conv_groups=2, axis=-1)


# ----------------------------------------------------------------------------- random grouped networks


def _block(x, rng, rank, width, name):
    """A ResNeXt-style bottleneck: 1x1 reduction, a grouped convolution, 1x1 expansion, maybe a residual."""
    conv = {1: L.Conv1D, 2: L.Conv2D}[rank]
    groups = int(rng.choice([2, 4]))
    per_group = int(rng.choice([1, 2, 3]))
    inner = groups * per_group * int(rng.choice([1, 2]))
    y = conv(inner, 1, name=f"{name}_reduce")(x)
    y = L.BatchNormalization(name=f"{name}_bn1")(y)
    y = L.ReLU()(y)
    filters = inner * int(rng.choice([1, 2])) if rng.random() < 0.5 else inner
    padding = str(rng.choice(["same", "valid"])) if rng.random() < 0.3 else "same"
    y = conv(filters, 3, padding=padding, groups=groups, name=f"{name}_grouped",
             use_bias=bool(rng.random() < 0.7))(y)
    y = L.BatchNormalization(name=f"{name}_bn2")(y)
    y = L.ReLU()(y)
    y = conv(width, 1, name=f"{name}_expand")(y)
    if padding == "same" and rng.random() < 0.6:
        y = L.Add(name=f"{name}_add")([x, y])
    return L.ReLU()(y)


def random_grouped_net(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.choice([1, 2]))
    width = int(rng.choice([4, 8]))
    inp = keras.Input((10,) * rank + (3,))
    x = {1: L.Conv1D, 2: L.Conv2D}[rank](width, 3, padding="same", name="stem")(inp)
    for b in range(int(rng.integers(1, 3))):
        x = _block(x, rng, rank, width, f"b{b}")
    x = {1: L.GlobalAveragePooling1D, 2: L.GlobalAveragePooling2D}[rank]()(x)
    return keras.Model(inp, L.Dense(3, name="out")(x)), rng


def kill_conv_groups(model, rng):
    """Zero every incoming weight of a whole convolution group's filters (they output their bias), sometimes."""
    for layer in model.layers:
        if getattr(layer, "groups", 1) > 1 and rng.random() < 0.7:
            weights = layer.get_weights()
            g, per_out = layer.groups, weights[0].shape[-1] // layer.groups
            q = int(rng.integers(g))
            weights[0][..., q * per_out:(q + 1) * per_out] = 0.0
            layer.set_weights(weights)


# JAX runs these op by op (about 6 s a network on two cores): three of the eight networks there.
@pytest.mark.parametrize("seed", range(3) if keras.backend.backend() == "jax" else range(8))
def test_random_grouped_networks_prune_exactly_and_reload(seed, tmp_path):
    model, rng = random_grouped_net(seed)
    kill_units(model, rng, dead=0.3, constant=0.2, dead_layer=0.0)
    kill_conv_groups(model, rng)
    x = rng.normal(size=(3,) + tuple(model.input.shape[1:])).astype("float32")
    before = weights_of(model)
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ()
    small = prune_model(model, T)
    assert_untouched(model, before)
    assert_same_outputs(small, model, x, rtol=1e-5)
    path = tmp_path / "small.keras"
    small.save(path)
    assert "keras_group_lasso" not in path.read_bytes().decode("latin-1")
    again = keras.saving.load_model(path)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)), keras.ops.convert_to_numpy(small(x)),
                               rtol=0, atol=1e-6)
    plans = {plan.name: plan for plan in small.pruning_plan.dense}
    for layer in model.layers:
        if getattr(layer, "groups", 1) > 1 and registry.makes_units(layer):  # not one group per channel
            # each group keeps as many inputs and filters as before
            new = small.get_layer(layer.name)
            assert plans[layer.name].params_after == new.count_params()
            assert new.kernel.shape[-2] == layer.kernel.shape[-2]
            assert new.filters // new.groups == layer.filters // layer.groups


def _resnext(groups=4, per_group=2):
    inp = keras.Input((6, 6, 4))
    x = L.Conv2D(groups * per_group, 1, name="reduce")(inp)
    x = L.ReLU()(x)
    x = L.Conv2D(groups * per_group, 3, padding="same", groups=groups, name="grouped")(x)
    x = L.ReLU()(x)
    x = L.Conv2D(4, 1, name="expand")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(2, name="out")(x))


def test_a_group_goes_when_all_of_it_goes_and_groups_shrinks_with_it(rng, tmp_path):
    model = _resnext()
    for layer in model.layers:
        if layer.weights:
            layer.set_weights([w + 0.5 * np.sign(w) for w in layer.get_weights()])  # no weight near the threshold
    expand = model.get_layer("expand")
    kernel, bias = expand.get_weights()
    kernel[..., 2:4, :] = 0.0  # nothing reads the filters of group 1: it goes, and the channels it read
    kernel[..., 4, :] = 0.0  # one filter of group 2 is dead: the group stays whole
    expand.set_weights([kernel, bias])
    grouped = model.get_layer("grouped")
    kernel, bias = grouped.get_weights()
    kernel[..., 0, 6] = 0.0  # a dead input channel of a kept group (3) stays
    grouped.set_weights([kernel, bias])
    x = rng.normal(size=(3, 6, 6, 4)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    new = small.get_layer("grouped")
    assert (new.groups, new.filters, tuple(new.kernel.shape)) == (3, 6, (3, 3, 2, 6))
    assert small.get_layer("reduce").filters == 6
    report = small.pruning_report
    assert layer_of(report, "grouped").units_alive == 6
    assert report.flops_after < report.flops_before


def test_a_group_whose_filters_are_constant_is_folded_and_goes(rng, tmp_path):
    model = _resnext(groups=2, per_group=2)
    grouped = model.get_layer("grouped")
    kernel, bias = grouped.get_weights()
    kernel[..., 0:2] = 0.0  # group 0's filters output relu(b) everywhere: folded into the 1x1 expansion's bias
    grouped.set_weights([kernel, rng.normal(size=bias.shape).astype("float32")])
    x = rng.normal(size=(3, 6, 6, 4)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert (small.get_layer("grouped").groups, small.get_layer("reduce").filters) == (1, 2)


def test_add_group_sparsity_and_the_proximal_step_zero_whole_channels_of_a_grouped_kernel(rng):
    model = add_group_sparsity(_resnext(groups=2, per_group=2), 1e-2)
    penalty = model.get_layer("grouped").kernel_regularizer
    assert penalty.conv_groups == 2 and isinstance(penalty, HiddenGroupLasso)
    layer = model.get_layer("grouped")
    kernel = rng.normal(size=(3, 3, 2, 4)).astype("float32")
    kernel[..., 1, 2:4] *= 1e-4  # input channel 3 (group 1, second channel): far below the step's threshold
    layer.set_weights([kernel, np.zeros(4, "float32")])
    x = rng.normal(size=(8, 6, 6, 4)).astype("float32")
    y = keras.ops.convert_to_numpy(model(x))
    model.compile(Proximal(keras.optimizers.SGD(0.5)), "mse")
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    after = keras.ops.convert_to_numpy(layer.kernel)
    assert np.all(after[..., 1, 2:4] == 0)  # channel 3's whole group, exactly
    assert np.all(np.any(after[..., 0, :] != 0, axis=(0, 1))) and np.any(after[..., 1, 0:2] != 0)
    report = sparsity_report(model, T)
    assert layer_of(report, "grouped").groups_alive == 3
    path_config = json.loads(json.dumps(model.get_config(), default=str))
    assert '"conv_groups": 2' in json.dumps(path_config)


def test_a_shared_rule_answers_for_each_configuration_of_a_convolution():
    plain, grouped, depthwise = L.Conv2D(8, 3), L.Conv2D(8, 3, groups=2), L.Conv2D(4, 3, groups=4)
    for layer in (plain, grouped, depthwise):
        layer.build((None, 8, 8, 4))
    assert registry.units_rule(plain).view_of(plain) == GroupView()
    assert registry.units_rule(grouped).view_of(grouped) == GroupView(conv_groups=2)
    assert registry.rule_of(depthwise).classify(depthwise) == ("per_unit", None)
    assert registry.rule_of(grouped).classify(grouped) == ("units", None)
    assert registry.units_rule(grouped).params(grouped, 9, 4, 8, True) == grouped.count_params()


def test_a_latency_table_times_a_grouped_convolution_at_whole_groups():
    from keras_group_lasso import LatencyTable

    model = _resnext(groups=8, per_group=2)  # 16 channels and filters: 2 of each per group
    table = LatencyTable.measure(model, batch_size=4, repeats=1)
    grid = table.to_dict()["batches"]["4"]["layers"]["grouped"]
    # Timed at whole groups (1/8 of 16 filters is one group of 2; half is 4 groups), its inputs going with them.
    assert (grid["in"], grid["out"]) == ([16], [2, 8, 16])
    assert table.layer_seconds("grouped", 4, 4) <= table.layer_seconds("grouped", 16, 16)


def test_a_channel_of_a_residual_stream_that_a_grouped_convolution_reads_is_one_coupled_group(rng):
    inp = keras.Input((6, 6, 8))
    x = L.Conv2D(8, 1, name="stem")(inp)
    y = L.Conv2D(8, 3, padding="same", groups=2, name="grouped")(x)
    z = L.Conv2D(4, 1, name="reader")(L.Add(name="add")([x, y]))
    model = add_group_sparsity(keras.Model(inp, L.Dense(2, name="out")(L.GlobalAveragePooling2D()(z))), 1e-2)
    grouped, reader = model.get_layer("grouped"), model.get_layer("reader")
    # The grouped kernel's group rows are in GroupView.unit_order: its coupled keys follow them.
    assert grouped.kernel_regularizer.coupled == (0, 4, 1, 5, 2, 6, 3, 7)
    # A channel's group: 9 positions x its group's 4 filters in the grouped kernel, 4 filters in the 1x1 reader.
    assert [group.size for group in coupled_groups(model)] == [40] * 8
    assert grouped.kernel_regularizer.scales == pytest.approx((1e-2 * np.sqrt(40),) * 8)
    assert tuple(reader.kernel_regularizer.coupled) == tuple(range(8))
    kernel = rng.normal(size=(3, 3, 4, 8)).astype("float32")
    kernel[..., 1, 4:8] *= 1e-4  # channel 5 (group 1, its second channel) in the grouped convolution ...
    grouped.set_weights([kernel, np.zeros(8, "float32")])
    weights = reader.get_weights()
    weights[0][..., 5, :] *= 1e-4  # ... and in the other reader of the stream: one coupled group, tiny
    reader.set_weights(weights)
    x = rng.normal(size=(8, 6, 6, 8)).astype("float32")
    y = keras.ops.convert_to_numpy(model(x))
    model.compile(Proximal(keras.optimizers.SGD(0.5)), "mse")
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    after = keras.ops.convert_to_numpy(grouped.kernel)
    assert np.all(after[..., 1, 4:8] == 0) and np.all(keras.ops.convert_to_numpy(reader.kernel)[..., 5, :] == 0)
    assert np.all(np.any(after[..., 1, 0:4] != 0, axis=(0, 1)))  # channel 1 (group 0) is another group: alive


@pytest.mark.parametrize("inputs", ["original", "selected"])
def test_a_grouped_convolution_reading_a_sequence_input_reads_only_its_kept_groups(inputs, rng):
    inp = keras.Input((10, 4))
    model = keras.Model(inp, L.Conv1D(3, 1, name="reader")(L.Conv1D(4, 3, padding="same", groups=2,
                                                                     name="grouped")(inp)))
    kernel, bias = model.get_layer("reader").get_weights()
    kernel[:, 2:4, :] = 0.0  # nothing reads convolution group 1: it goes, and so do the input channels 2 and 3
    model.get_layer("reader").set_weights([kernel, bias])
    small = prune_model(model, T, inputs=inputs)
    assert small.kept_features == (0, 1) and small.get_layer("grouped").groups == 1
    x = rng.normal(size=(3, 10, 4)).astype("float32")
    want = keras.ops.convert_to_numpy(model(x))
    got = keras.ops.convert_to_numpy(small(x if inputs == "original" else x[..., :2]))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)

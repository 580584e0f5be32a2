"""Models whose input has axes of unknown size (``keras.Input((None, 8))``, ``(None, None, 1)``).

What is dead, the report's units and parameters, and surgery do not depend on
the size: the pruned model must compute what the thresholded original
computes at any length or image size (checked at two). FLOPs do depend on
it: the report counts them per position of the variable axes and says so.
"""

import glob

import keras
import numpy as np
import pytest

from keras_group_lasso import SparsityMonitor, UnsupportedModelError, prune_model, sparsity_report
from keras_group_lasso.graph import registry
from test_cnn import thresholded_outputs

T = 1e-3
L = keras.layers


def _numpy(y):
    return np.asarray(keras.ops.convert_to_numpy(y), np.float64)


def _assert_same_outputs(small, model, x):
    want = thresholded_outputs(model, x, lambda m, v: _numpy(m(v, training=False)))
    got = _numpy(small(x, training=False))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))


def _kill(model, rng, dead_rows=(), dead_units=()):
    """Random weights; ``dead_rows`` / ``dead_units``: ``{layer: indices}`` of kernel groups / units set below T."""
    dead_rows, dead_units = dict(dead_rows), dict(dead_units)
    for layer in model.layers:
        weights = [rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()]
        if not weights or type(layer) not in (L.Dense, L.Conv1D, L.Conv2D, L.SeparableConv1D):
            if weights and type(layer) is L.BatchNormalization:
                weights[3] = np.abs(weights[3]) + 0.5  # a positive moving variance
            layer.set_weights(weights)
            continue
        kernel = weights[-2] if type(layer) is not L.SeparableConv1D else weights[1]
        kernel[..., list(dead_rows.get(layer.name, ())), :] *= 1e-4  # |w| <= T: zero after thresholding
        kernel[..., list(dead_units.get(layer.name, ()))] = 0.0
        layer.set_weights(weights)
    return model


def _dense_gap():
    return keras.Sequential([keras.Input((None, 8)), L.Dense(6, activation="relu", name="d0"),
                             L.GlobalAveragePooling1D(name="pool"), L.Dense(3, name="out")])


def _conv2d_gap():
    return keras.Sequential([keras.Input((None, None, 1)), L.Conv2D(6, 3, activation="relu", name="c0"),
                             L.GlobalAveragePooling2D(name="pool"), L.Dense(3, name="out")])


def _conv1d_gap():
    return keras.Sequential([keras.Input((None, 8)), L.Conv1D(6, 3, activation="relu", name="c0"),
                             L.GlobalMaxPooling1D(name="pool"), L.Dense(3, name="out")])


# The three models of the issue, each with groups killed: (build, dead rows, dead units, two input shapes).
_CASES = {
    "dense_gap": (_dense_gap, {"out": [1, 4]}, {"d0": [2]}, [(5, 8), (11, 8)]),
    "conv2d_gap": (_conv2d_gap, {"out": [0, 3]}, {"c0": [5]}, [(7, 9, 1), (12, 12, 1)]),
    "conv1d_gap": (_conv1d_gap, {"c0": [1, 6], "out": [2]}, {"c0": [0]}, [(5, 8), (11, 8)]),
}


def _killed(case, seed):
    """``(model of case with its dead groups, the rng, the input shapes to try)``."""
    build, rows, units, shapes = _CASES[case]
    rng = np.random.default_rng(seed)
    return _kill(build(), rng, rows, units), rng, shapes


@pytest.mark.parametrize("case", sorted(_CASES))
def test_pruned_model_equals_the_thresholded_original_at_two_sizes(case):
    model, rng, shapes = _killed(case, seed=1)
    small = prune_model(model, T)
    report = sparsity_report(model, T)
    assert tuple(small.inputs[0].shape) == tuple(model.inputs[0].shape)  # still any size
    assert small.pruning_report.layer_sizes == report.layer_sizes
    for shape in shapes:
        _assert_same_outputs(small, model, rng.normal(size=(4,) + shape).astype("float32"))


def test_dense_over_time_then_pooling_against_numpy():
    rng = np.random.default_rng(2)
    model = _kill(_dense_gap(), rng, {"out": [1, 4]}, {"d0": [2]})
    w0, b0 = model.get_layer("d0").get_weights()
    w1, b1 = model.get_layer("out").get_weights()
    w1 = np.where(np.abs(w1) <= T, 0.0, w1)
    small = prune_model(model, T)
    # d0 unit 2 makes relu(b0[2]) at every step (folded into out's bias); units 1 and 4 are never read.
    assert small.get_layer("d0").units == 3 and small.get_layer("out").kernel.shape == (3, 3)
    for length in (5, 11):
        x = rng.normal(size=(4, length, 8))
        want = np.maximum(x @ w0 + b0, 0.0).mean(axis=1) @ w1 + b1
        np.testing.assert_allclose(_numpy(small(x.astype("float32"))), want, rtol=0, atol=1e-4)


def test_report_counts_units_and_params_as_the_numpy_reference():
    rng = np.random.default_rng(3)
    model = _kill(_conv2d_gap(), rng, {"out": [0, 3]}, {"c0": [5]})
    report = sparsity_report(model, T)
    kernel = model.get_layer("c0").get_weights()[0]
    out = model.get_layer("out").get_weights()[0]
    read = np.any(np.abs(out) > T, axis=1)  # units of c0 that out reads
    varying = np.any(np.abs(kernel) > T, axis=(0, 1, 2))  # units of c0 with a non-zero weight
    kept = int(np.sum(read & varying))
    assert report.layer_sizes == (1, kept)
    assert report.params_after == 9 * 1 * kept + kept + kept * 3 + 3
    assert report.params_before == 9 * 6 + 6 + 6 * 3 + 3
    assert report.total_weights == kernel.size + out.size
    assert report.zero_weights == int(np.sum(np.abs(kernel) <= T) + np.sum(np.abs(out) <= T))


@pytest.mark.parametrize("case", sorted(_CASES))
def test_flops_are_per_position_and_scale_to_a_fixed_size(case):
    """A layer before pooling costs its output positions times what the report counts per position."""
    model, rng, shapes = _killed(case, seed=4)
    report = sparsity_report(model, T)
    assert report.flops_per_position
    assert [layer.flops_per_position for layer in report.layers] == [True, False]
    assert "per position of the variable (None) axes" in str(report)
    assert report.to_dict()["flops_per_position"] is True
    for shape in shapes:
        fixed = keras.Sequential([keras.Input(shape)] + [type(la).from_config(la.get_config()) for la in model.layers])
        fixed.set_weights(model.get_weights())
        fixed_report = sparsity_report(fixed, T)
        assert not fixed_report.flops_per_position
        first = fixed.layers[0]
        positions = int(np.prod(first.output.shape[1:-1]))
        for var, fix in zip(report.layers, fixed_report.layers):
            scale = positions if var.flops_per_position else 1
            assert (fix.flops_before, fix.flops_after) == (scale * var.flops_before, scale * var.flops_after)
        assert fixed_report.params_after == report.params_after
        assert fixed_report.layer_sizes == report.layer_sizes


def test_flops_per_position_count_the_known_axes_in_full():
    model = keras.Sequential([keras.Input((None, 12, 2)), L.Conv2D(4, 3, name="c0"), L.GlobalMaxPooling2D(),
                              L.Dense(3, name="out")])
    layer = sparsity_report(model, 0.0).layers[0]
    assert layer.flops_per_position and layer.flops_before == 10 * 9 * 2 * 4  # 10 columns, 3x3 window, 2 -> 4
    assert registry.variable_axes(model.layers[0].output.shape) == (1,)


def test_a_model_of_fixed_size_counts_flops_per_sample():
    model = keras.Sequential([keras.Input((6, 8)), L.Conv1D(4, 3, name="c0"), L.GlobalMaxPooling1D(),
                              L.Dense(3, name="out")])
    report = sparsity_report(model, 0.0)
    assert report.flops_per_position is False
    assert report.flops_before == 4 * 3 * 8 * 4 + 4 * 3
    assert "per position" not in str(report)


def test_residual_stream_and_concatenate_over_time():
    rng = np.random.default_rng(5)
    inp = keras.Input((None, 8))
    h = L.Conv1D(8, 3, padding="same", activation="relu", name="c0")(inp)
    h2 = L.Conv1D(8, 3, padding="same", name="c1")(h)
    stream = L.Add(name="add")([h, h2])
    side = L.Dense(4, name="side")(inp)
    joined = L.Concatenate(name="cat")([stream, side])
    joined = L.Rescaling(np.linspace(0.5, 2.0, 12).astype("float32"), offset=0.1, name="scale")(joined)
    out = L.Dense(3, name="out")(L.GlobalAveragePooling1D(name="pool")(joined))
    model = _kill(keras.Model(inp, out), rng, {"c1": [0, 2], "out": [0, 2, 9]}, {"c1": [5]})
    small = prune_model(model, T)
    report = sparsity_report(model, T)
    assert report.streams and report.streams[0].channels_alive < report.streams[0].channels
    assert small.count_params() < model.count_params()
    for length in (5, 11):
        _assert_same_outputs(small, model, rng.normal(size=(3, length, 8)).astype("float32"))


def test_batchnorm_folded_and_rounded_units_over_time():
    rng = np.random.default_rng(6)
    model = keras.Sequential([
        keras.Input((None, 8)), L.Conv1D(8, 3, padding="same", name="c0"), L.BatchNormalization(name="bn"),
        L.ReLU(), L.MaxPooling1D(2), L.SeparableConv1D(6, 3, padding="same", activation="relu", name="c1"),
        L.GlobalAveragePooling1D(), L.Dense(3, name="out"),
    ])
    model = _kill(model, rng, {"c1": [1, 4, 6], "out": [0]}, {"c0": [3]})
    for kwargs in ({}, {"round_to": 2}, {"fold_batchnorm": True}):
        small = prune_model(model, T, **kwargs)
        for length in (6, 13):
            _assert_same_outputs(small, model, rng.normal(size=(3, length, 8)).astype("float32"))


def test_flatten_of_a_variable_size_map_is_refused_naming_the_layer_and_axis():
    model = keras.Sequential([keras.Input((None, 8)), L.Conv1D(4, 3, name="c0"), L.Flatten(name="flat")])
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert info.value.layer_name == "flat" and info.value.layer_class == "Flatten"
    assert str(info.value).startswith(
        "prune_model: cannot prune layer 'flat' (Flatten): a Flatten of a map whose axis 1 has a variable size "
        "(None in its input shape (None, None, 4)); use global pooling, whose output does not depend on the size."
    )
    report = sparsity_report(model, T)  # the report still describes it, conservatively
    assert report.uninterpreted_layers == ("flat (Flatten)",)
    assert report.flops_per_position


def test_sparsity_monitor_logs_and_tensorboard_on_a_variable_length_model(tmp_path):
    pytest.importorskip("tensorflow", reason="TensorBoard writing needs TensorFlow")
    from tensorboard.backend.event_processing import event_file_loader

    rng = np.random.default_rng(7)
    model = _kill(_conv1d_gap(), rng, {"c0": [1, 6]}, {"c0": [0]})
    model.compile(optimizer="sgd", loss="mse")
    x = rng.normal(size=(32, 9, 8)).astype("float32")
    y = rng.normal(size=(32, 3)).astype("float32")
    monitor = SparsityMonitor(threshold=T, log_dir=tmp_path)
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[monitor])
    report = monitor.last_report
    assert report.flops_per_position
    assert history.history["flops"][-1] == pytest.approx(report.flops_ratio)
    assert history.history["live_neurons"][-1] == report.live_neurons
    tags = set()
    for path in glob.glob(f"{tmp_path}/**/events.out.tfevents.*", recursive=True):
        for event in event_file_loader.EventFileLoader(path).Load():
            tags.update(value.tag for value in event.summary.value)
    assert {"flops/after_per_position", "flops/ratio", "live_units/c0", "group_norms/c0"} <= tags
    assert "flops/after" not in tags and "input_feature_strength" not in tags


def test_a_flop_budget_counts_a_model_on_sequences_of_any_length_per_position(rng):
    """Every counted layer works per position (a per-token model, as a language model is): ``max_flops`` is a limit
    per position and lands; with a global pooling before its head some layers count per sample: refused, naming
    the argument."""
    from keras_group_lasso import InvalidParameterError, Proximal, SparsityBudget, add_group_sparsity

    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 6))
    hidden = L.Dense(24, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, L.Dense(3, name="out")(L.Dense(16, activation="relu", name="second")(hidden)))
    sparse = add_group_sparsity(model, 1e-3)
    sparse.compile(optimizer=Proximal(keras.optimizers.Adam(1e-2)), loss="mse")
    x = rng.normal(size=(256, 5, 6)).astype("float32")
    y = x[..., :3] * 2.0
    sparse.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[SparsityBudget(max_flops=0.5)])
    report = sparsity_report(sparse, T)
    assert report.flops_per_position and 0.4 <= report.flops_after / report.flops_before <= 0.5
    _assert_same_outputs(prune_model(sparse, T), sparse, x[:8, :3])

    pooled = keras.Model(inputs, L.Dense(3, name="head")(L.GlobalAveragePooling1D()(L.Dense(8, name="d")(inputs))))
    pooled = add_group_sparsity(pooled, 1e-3)
    pooled.compile(optimizer="adam", loss="mse")
    with pytest.raises(InvalidParameterError, match=r"SparsityBudget: argument `max_flops` must be None for a model "
                                                    r"with inputs of variable size whose layers are counted some per "
                                                    r"position and some per sample"):
        pooled.fit(x, y[:, 0], epochs=1, verbose=0, callbacks=[SparsityBudget(max_flops=0.5)])

"""Nothing in the package changes a user's model, except apply_threshold (whose name says so).

Every public function is run on a trained, compiled, group-sparse model with a
constraint and some exact zeros; afterwards its weights, the penalties and
constraints on its layers and variables, its trainable flags, its layers and
its compiled state (optimizer and its state, loss) must be exactly as before.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_group_lasso as kgl
from keras_group_lasso import analysis

BACKEND = keras.backend.backend()


def trained_model(kind="mlp"):
    keras.utils.set_random_seed(0)
    if kind == "mlp":
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(5, activation="relu", kernel_constraint=keras.constraints.MaxNorm(3.0)),
                keras.layers.Dropout(0.1),
                keras.layers.Dense(4, activation="relu"),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )
        x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    else:
        model = keras.Sequential(
            [
                keras.Input((6, 6, 1)),
                keras.layers.Conv2D(4, 3, padding="same", kernel_constraint=keras.constraints.MaxNorm(3.0)),
                keras.layers.BatchNormalization(),
                keras.layers.ReLU(),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )
        x = np.random.default_rng(0).normal(size=(64, 6, 6, 1)).astype("float32")
    model = kgl.add_group_sparsity(model, 1e-2)
    model.compile(kgl.Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "sparse_categorical_crossentropy")
    y = (x.reshape(64, -1)[:, 0] > 0).astype("int32")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    if kind == "mlp":
        kernel = ops.convert_to_numpy(model.layers[0].kernel).copy()
        kernel[4:] = 0.0  # two dead input features, so surgery has something to cut
        model.layers[0].kernel.assign(kernel)
    else:
        kernel = ops.convert_to_numpy(model.layers[0].kernel).copy()
        kernel[..., 1] = 0.0  # a constant channel, folded or kept by surgery
        model.layers[0].kernel.assign(kernel)
    return model, x


def snapshot(model):
    layers = []
    for layer in model.layers:
        layers.append(
            (
                layer.name,
                type(layer),
                layer.trainable,
                {key: getattr(layer, key, None) for key in ("kernel_regularizer", "bias_regularizer",
                                                            "kernel_constraint", "bias_constraint",
                                                            "activity_regularizer")},
            )
        )
    variables = [
        (v.path, v.trainable, v.regularizer, v.constraint, np.array(ops.convert_to_numpy(v)))
        for v in model.weights
    ]
    optimizer = model.optimizer
    optimizer_state = [np.array(ops.convert_to_numpy(v)) for v in optimizer.variables]
    return {
        "layers": layers,
        "variables": variables,
        "compiled": (model.compiled, optimizer, type(optimizer), model.loss, len(optimizer_state)),
        "optimizer_state": optimizer_state,
        "trainable_count": len(model.trainable_variables),
    }


def assert_same(before, after):
    assert after["layers"] == before["layers"]
    assert after["compiled"] == before["compiled"]
    assert after["trainable_count"] == before["trainable_count"]
    assert len(after["variables"]) == len(before["variables"])
    for (path, trainable, reg, con, value), (path2, trainable2, reg2, con2, value2) in zip(
        before["variables"], after["variables"]
    ):
        assert (path2, trainable2) == (path, trainable)
        assert reg2 is reg and con2 is con, path
        np.testing.assert_array_equal(value2, value, err_msg=path)
    for a, b in zip(before["optimizer_state"], after["optimizer_state"]):
        np.testing.assert_array_equal(a, b)


def run_export(model, x, tmp_path):
    formats = ("keras", "saved_model") if BACKEND == "tensorflow" else ("keras",)
    return kgl.export_pruned(model, tmp_path / "export", formats=formats)


PUBLIC = {
    "sparsity_report": lambda m, x, tmp: kgl.sparsity_report(m, 1e-3),
    "unit_masks": lambda m, x, tmp: analysis.unit_masks(m, 1e-3),
    "plan_pruning": lambda m, x, tmp: kgl.plan_pruning(m, 1e-3),
    "prune_model": lambda m, x, tmp: kgl.prune_model(m, 1e-3),
    "prune_model_selected": lambda m, x, tmp: kgl.prune_model(m, 1e-3, inputs="selected"),
    "export_pruned": run_export,
    "add_group_sparsity": lambda m, x, tmp: kgl.add_group_sparsity(m, 1e-3),
    "input_feature_strength": lambda m, x, tmp: analysis.input_feature_strength(m),
    "layer_group_norms": lambda m, x, tmp: analysis.layer_group_norms(m),
    "image_shape": lambda m, x, tmp: analysis.image_shape(m),
    "Proximal.build_on_another_optimizer": lambda m, x, tmp: kgl.Proximal(keras.optimizers.Adam()).build(
        m.trainable_variables
    ),
    "SparsityMonitor": lambda m, x, tmp: kgl.SparsityMonitor(log_dir=str(tmp / "logs")).set_model(m)
    or m.predict(x, verbose=0),
    "SparsityMonitor.on_epoch_end": lambda m, x, tmp: monitor_epoch(m, tmp),
}


def monitor_epoch(model, tmp):
    monitor = kgl.SparsityMonitor(log_dir=str(tmp / "logs"))
    monitor.set_model(model)
    monitor.on_train_begin({})
    logs = {"loss": 1.0}
    monitor.on_epoch_end(0, logs)
    monitor.on_train_end({})
    assert "sparsity" in logs


@pytest.mark.turns  # 26 cases alike: each function and model on one backend (they copy and compare numpy values)
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_function_leaves_the_model_as_it_was(name, kind, tmp_path):
    model, x = trained_model(kind)
    before = snapshot(model)
    outputs = model.predict(x, verbose=0)
    PUBLIC[name](model, x, tmp_path)
    assert_same(before, snapshot(model))
    np.testing.assert_array_equal(model.predict(x, verbose=0), outputs)


def test_apply_threshold_changes_weights_only():
    model, x = trained_model()
    before = snapshot(model)
    changed = kgl.apply_threshold(model, 0.05)
    after = snapshot(model)
    assert changed > 0
    assert after["layers"] == before["layers"] and after["compiled"] == before["compiled"]
    for (path, _, reg, con, value), (_, _, reg2, con2, value2) in zip(before["variables"], after["variables"]):
        assert reg2 is reg and con2 is con
        kept = np.abs(value) > 0.05
        np.testing.assert_array_equal(value2[kept], value[kept], err_msg=path)
        assert np.all(value2[~kept] == 0.0), path  # every variable here is a Dense kernel or bias


@pytest.fixture
def writes(monkeypatch):
    """The variables assigned to while the test runs (every backend's variable assigns through
    ``keras.Variable.assign``)."""
    written = []
    assign = keras.Variable.assign

    def recording(variable, value):
        written.append(variable)
        return assign(variable, value)

    monkeypatch.setattr(keras.Variable, "assign", recording)
    return written


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_a_latency_table_times_narrow_copies_without_writing_into_the_model(kind, writes):
    model, x = trained_model(kind)
    before = snapshot(model)
    writes.clear()  # training wrote; from here on nothing may
    table = kgl.LatencyTable.measure(model, batch_size=4, grid=(0.5,), repeats=1)
    own = {id(v) for v in model.weights}
    assert not [v.path for v in writes if id(v) in own]  # not even for a moment (its narrow copies have their own)
    assert table.narrow_widths  # the narrow copy was built and timed
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_an_analysis_of_given_values_is_that_of_the_model_holding_them(kind, writes):
    model, _ = trained_model(kind)
    rng = np.random.default_rng(1)
    values = {}
    for layer in model.layers[:1]:  # the first layer: half its units (or channels) at zero, in given values
        kernel = np.array(ops.convert_to_numpy(layer.kernel))
        kernel[..., rng.permutation(kernel.shape[-1])[: kernel.shape[-1] // 2]] = 0.0
        values[layer.kernel.path] = kernel
    before = snapshot(model)
    writes.clear()
    found = analysis.analyze(model, 1e-3, values=values)
    assert not {id(v) for v in model.weights} & {id(v) for v in writes}
    assert_same(before, snapshot(model))
    holding = keras.models.clone_model(model)
    holding.set_weights(model.get_weights())
    holding.layers[0].kernel.assign(values[model.layers[0].kernel.path])
    expected = analysis.analyze(holding, 1e-3)
    assert found.report.layer_sizes == expected.report.layer_sizes
    assert found.report.layer_sizes != analysis.analyze(model, 1e-3).report.layer_sizes
    assert (found.report.params_after, found.report.flops_after) == (
        expected.report.params_after, expected.report.flops_after)
    for name, masks in expected.masks.units.items():
        np.testing.assert_array_equal(found.masks.units[name], masks, err_msg=name)

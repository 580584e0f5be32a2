"""Functional models with named inputs and outputs (dicts): read, penalised, pruned exactly, still named."""

import keras
import numpy as np

from keras_group_lasso import add_group_sparsity, prune_model, sparsity_report

L = keras.layers
T = 0.0  # exact zeros only: the pruned model then has the outputs of the model itself


def tabular():
    """A tabular model as keras.io writes one: a dict of named inputs, a dict of named outputs."""
    keras.utils.set_random_seed(0)
    inputs = {"numeric": keras.Input((4,), name="numeric"), "extra": keras.Input((3,), name="extra")}
    h = L.Dense(8, activation="relu", name="hidden")(L.Concatenate()([inputs["numeric"], inputs["extra"]]))
    outputs = {"score": L.Dense(1, name="score")(h), "kind": L.Dense(3, activation="softmax", name="kind")(h)}
    return keras.Model(inputs, outputs)


def batch(rows=6):
    rng = np.random.default_rng(0)
    return {"numeric": rng.normal(size=(rows, 4)).astype("float32"),
            "extra": rng.normal(size=(rows, 3)).astype("float32")}


def numpy_outputs(model, x):
    return {key: keras.ops.convert_to_numpy(value) for key, value in model(x).items()}


def test_a_model_with_named_inputs_and_outputs_prunes_exactly_and_stays_named(tmp_path):
    sparse = add_group_sparsity(tabular(), 1e-3)
    kernel = keras.ops.convert_to_numpy(sparse.get_layer("hidden").kernel).copy()
    kernel[[1, 5]] = 0.0  # a feature of each input
    kernel[:, [2, 6]] = 0.0  # two hidden units
    sparse.get_layer("hidden").kernel.assign(kernel)
    report = sparsity_report(sparse, T)
    assert (report.n_selected_features, report.live_neurons) == (5, 6)
    small = prune_model(sparse, T)
    x = batch()
    want, got = numpy_outputs(sparse, x), numpy_outputs(small, x)
    assert sorted(got) == ["kind", "score"]
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
    assert isinstance(small.input, dict) and sorted(small.input) == ["extra", "numeric"]
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.saving.load_model(path)
    for key, value in numpy_outputs(again, x).items():
        np.testing.assert_allclose(value, want[key], rtol=1e-5, atol=1e-6)

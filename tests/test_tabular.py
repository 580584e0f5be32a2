"""Several inputs, Embeddings and text models: feature selection across inputs, exact surgery.

The usual tabular model: numeric columns (one input, normalized) and one
integer input per categorical column read by an ``Embedding``, concatenated,
then Dense layers. Its features are numbered input after input; a
categorical column goes when every output dimension of its Embedding goes.
Every surgery is compared output-for-output with the thresholded original.
"""

import keras
import numpy as np
import pytest

from keras_group_lasso import Proximal, add_group_sparsity, prune_model, sparsity_report
from test_model_families import assert_untouched, outputs, thresholded_outputs, weights_of

T = 1e-3
L = keras.layers


def tabular(rng, n_numeric, vocabularies, dims, hidden):
    """Numeric columns + one Embedding per categorical column, concatenated, then Dense layers."""
    numeric = keras.Input((n_numeric,), name="numeric")
    columns = [keras.Input((1,), dtype="int32", name=f"cat{i}") for i in range(len(vocabularies))]
    parts = [L.Normalization(mean=rng.normal(size=n_numeric).tolist(), variance=rng.uniform(0.5, 2, n_numeric).tolist(),
                             name="scale")(numeric)]
    for i, (column, size, dim) in enumerate(zip(columns, vocabularies, dims)):
        embedded = L.Embedding(size, dim, name=f"emb{i}")(column)
        parts.append(L.Flatten(name=f"flat{i}")(embedded) if i % 2 else L.Reshape((dim,), name=f"flat{i}")(embedded))
    x = L.Concatenate(name="columns")(parts)
    for j, width in enumerate(hidden):
        x = L.Dense(width, activation=["relu", "tanh"][j % 2], name=f"h{j}")(x)
    return keras.Model([numeric] + columns, L.Dense(3, name="out")(x))


def data(model, rng, n=16):
    return [rng.normal(size=(n,) + tuple(t.shape[1:])).astype("float32") if "float" in str(t.dtype)
            else rng.integers(0, model.get_layer(f"emb{int(t.name[3:])}").input_dim, size=(n, 1)).astype("int32")
            for t in model.inputs]


def kill(model, rng, dead_columns):
    """Random dead rows and constant units; the rows of the Embeddings of ``dead_columns`` all zero."""
    first = model.get_layer("h0")
    kernel, bias = first.get_weights()
    kernel[rng.random(kernel.shape[0]) < 0.25] = 0.0
    start = model.get_layer("numeric").output.shape[-1]
    for i, layer in enumerate(layer for layer in model.layers if isinstance(layer, L.Embedding)):
        dim = layer.output_dim
        if i in dead_columns:
            kernel[start : start + dim] = 0.0
        table = layer.get_weights()[0]
        table[:, rng.random(dim) < 0.3] = 0.0  # columns of zeros: dimensions that output 0
        layer.set_weights([table])
        start += dim
    kernel[:, rng.random(kernel.shape[1]) < 0.2] = 0.0  # constant units act(b), folded
    first.set_weights([kernel, rng.normal(size=bias.shape).astype("float32")])


def assert_exact(small, model, xs, keep=None):
    want = thresholded_outputs(model, xs, outputs)
    got = outputs(small, xs if keep is None else keep(xs))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.max(np.abs(b)))))


@pytest.mark.parametrize("seed", range(6))
def test_random_tabular_models_select_features_across_inputs_and_prune_exactly(seed, tmp_path):
    rng = np.random.default_rng(seed)
    n_cat = int(rng.integers(1, 4))
    model = tabular(rng, int(rng.integers(2, 7)), rng.integers(3, 9, n_cat).tolist(), rng.integers(1, 5, n_cat).tolist(),
                    rng.integers(3, 9, int(rng.integers(1, 3))).tolist())
    dead = {int(rng.integers(n_cat))} if n_cat > 1 else set()
    kill(model, rng, dead)
    before = weights_of(model)
    xs = data(model, rng)
    report = sparsity_report(model, T)
    assert [found.name for found in report.inputs] == [t.name for t in model.inputs]
    assert sum(found.n_features for found in report.inputs) == report.n_features
    for i in dead:
        assert not report.inputs[1 + i].kept  # the column whose Embedding nobody reads
    small = prune_model(model, T)  # a drop-in replacement: the same inputs
    assert [tuple(t.shape) for t in small.inputs] == [tuple(t.shape) for t in model.inputs]
    assert_exact(small, model, xs)
    selected = prune_model(model, T, inputs="selected")
    kept = [found for found in report.inputs if found.kept]
    assert selected.kept_inputs == tuple(found.name for found in kept)
    assert len(selected.inputs) == len(kept)

    def keep(xs):
        out = []
        for found, x in zip(report.inputs, xs):
            if found.kept:
                out.append(x[:, list(found.selected_features)] if found.name == "numeric" else x)
        return out

    assert_exact(selected, model, xs, keep)
    path = tmp_path / "small.keras"
    selected.save(path)
    again = keras.saving.load_model(path)  # plain Keras
    np.testing.assert_allclose(outputs(again, keep(xs))[0], outputs(selected, keep(xs))[0], rtol=0, atol=1e-6)
    assert_untouched(model, before)


def test_the_report_names_the_inputs_and_columns_that_survive():
    rng = np.random.default_rng(0)
    model = tabular(rng, 4, [5, 6], [2, 3], [6])
    kernel, bias = model.get_layer("h0").get_weights()
    kernel[[1, 3]] = 0.0  # numeric columns 1 and 3
    kernel[4:6] = 0.0  # cat0's two dimensions: nobody reads cat0
    model.get_layer("h0").set_weights([kernel, bias])
    report = sparsity_report(model, T)
    assert [(f.name, f.n_features, f.selected_features, f.first) for f in report.inputs] == [
        ("numeric", 4, (0, 2), 0), ("cat0", 1, (), 4), ("cat1", 1, (0,), 5)]
    assert report.selected_features == (0, 2, 5)
    text = str(report)
    assert "input numeric: 2/4 features" in text and "input cat0: 0/1 features (nothing reads it)" in text
    assert report.to_dict()["inputs"][2] == {"name": "cat1", "n_features": 1, "selected_features": [0], "first": 5,
                                             "mask": False}


def test_group_penalties_and_proximal_training_drop_noise_columns_and_categories():
    rng = np.random.default_rng(1)
    n = 512
    numeric = rng.normal(size=(n, 6)).astype("float32")
    informative = rng.integers(0, 4, (n, 1)).astype("int32")
    noise = rng.integers(0, 5, (n, 1)).astype("int32")
    y = (numeric[:, 0] - numeric[:, 1] + (informative[:, 0] % 2) > 0).astype("int32")
    model = tabular(rng, 6, [4, 5], [3, 3], [12])
    sparse = add_group_sparsity(model, 3e-3)
    assert sparse.get_layer("h0").kernel_regularizer is not None
    assert sparse.get_layer("emb0").embeddings_regularizer is None  # its units are pruned through h0's groups
    sparse.compile(Proximal(keras.optimizers.Adam(0.02)), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sparse.fit([numeric, informative, noise], y, epochs=30, batch_size=64, verbose=0)
    report = sparsity_report(sparse, T)
    kept = {found.name: found.selected_features for found in report.inputs}
    assert {0, 1} <= set(kept["numeric"]) and len(kept["numeric"]) < 6
    assert kept["cat0"] == (0,)
    small = prune_model(sparse, T, inputs="selected")
    xs = [numeric[:8], informative[:8], noise[:8]]
    keep = lambda xs: [x[:, list(f.selected_features)] if f.name == "numeric" else x  # noqa: E731
                       for f, x in zip(report.inputs, xs) if f.kept]
    assert_exact(small, sparse, xs, keep)


def test_a_conv1d_text_model_prunes_embedding_dimensions_exactly(tmp_path):
    rng = np.random.default_rng(2)
    tokens = keras.Input((12,), dtype="int32")
    x = L.Embedding(30, 8, mask_zero=False, name="emb")(tokens)
    x = L.Conv1D(10, 3, activation="relu", name="conv")(x)
    x = L.GlobalMaxPooling1D()(x)
    model = keras.Model(tokens, L.Dense(2, name="out")(x))
    kernel, bias = model.get_layer("conv").get_weights()
    kernel[:, [1, 5], :] = 0.0  # embedding dimensions 1 and 5 are read by nobody
    kernel[..., [2, 7]] = 0.0  # two channels output act(b)
    model.get_layer("conv").set_weights([kernel, rng.normal(size=bias.shape).astype("float32")])
    xs = rng.integers(0, 30, (4, 12)).astype("int32")
    small = prune_model(model, T)
    assert small.get_layer("emb").output_dim == 6 and small.get_layer("conv").filters == 8
    assert small.pruning_report.selected_features == tuple(range(12))  # token positions all stay
    assert_exact(small, model, xs)
    small.save(tmp_path / "text.keras")
    again = keras.saving.load_model(tmp_path / "text.keras")
    np.testing.assert_allclose(outputs(again, xs)[0], outputs(small, xs)[0], rtol=0, atol=1e-6)


def test_a_first_dense_reading_numeric_and_embedded_columns_holds_input_groups_and_a_budget_meets_max_features():
    from keras_group_lasso import SparsityBudget
    from keras_group_lasso.analysis import dense_roles

    rng = np.random.default_rng(3)
    model = tabular(rng, 6, [5], [3], [16])
    # Its rows are numeric columns and the dimensions that stand for cat0: input groups, input_factor's strength.
    assert dense_roles(model) == {"emb0": "input", "h0": "input", "out": "hidden"}
    sparse = add_group_sparsity(model, 1e-4, input_factor=1e-2)
    assert type(sparse.get_layer("h0").kernel_regularizer).__name__ == "InputGroupLasso"
    assert sparse.get_layer("h0").kernel_regularizer.factor == 1e-2
    numeric = rng.normal(size=(1024, 6)).astype("float32")
    column = rng.integers(0, 5, (1024, 1)).astype("int32")
    sparse.compile(Proximal(keras.optimizers.Adam(0.01)), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = sparse.fit([numeric, column], (numeric[:, 0] > 0).astype("int32"), epochs=10, batch_size=128,
                         verbose=0, callbacks=[SparsityBudget(max_features=2)])
    assert history.history["budget_features"][-1] <= 2
    assert sparsity_report(sparse, T).n_selected_features <= 2

"""A model penalised in part is said before training, and a refusal is short: the culprit, why, what to do.

A layer whose computation the graph cannot read (a layer with weights and math of its own that no rule
describes; a block made of layers is traced, see test_traced_blocks.py) gets no group penalty from ``add_group_sparsity``: its units keep their size,
a budget cannot reach into it and ``prune_model`` refuses the model. That is said when the penalties are put on,
naming each such layer, not after training.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    InvalidParameterError,
    SparsityBudget,
    UnsupportedModelError,
    add_group_sparsity,
    apply_threshold,
    prune_model,
)
from keras_group_lasso.graph import registry

L = keras.layers


class GatedDense(L.Layer):
    """A layer with weights and math of its own (no sublayers): ``(x W) * sigmoid(x G)``. Its call is not made of
    layers the graph knows, so it needs a rule of its own."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel")
        self.gate = self.add_weight(shape=(input_shape[-1], self.units), name="gate")

    def call(self, x):
        return keras.ops.matmul(x, self.kernel) * keras.ops.sigmoid(keras.ops.matmul(x, self.gate))

    def get_config(self):
        return dict(super().get_config(), units=self.units)


def with_blocks(blocks=1):
    inputs = keras.Input((8,))
    h = L.Dense(8, activation="relu", name="first")(inputs)
    for index in range(blocks):
        h = GatedDense(8, name=f"block{index}")(h)
    return keras.Model(inputs, L.Dense(1, activation="sigmoid", name="out")(h))


def test_add_group_sparsity_names_each_layer_it_cannot_penalise_before_any_training():
    with pytest.warns(UserWarning) as caught:
        sparse = add_group_sparsity(with_blocks(2), 1e-3)
    messages = [str(w.message) for w in caught if "get no group penalty" in str(w.message)]
    assert messages == [
        ("add_group_sparsity: the kernels of 2 layers whose computation cannot be read: 'block0' (GatedDense, "
        "2 kernels: a layer with weights of its own ('kernel'), whose math needs a rule), 'block1' (GatedDense, 2 "
        "kernels: a layer with weights of its own ('kernel'), whose math needs a rule) get no group penalty: their "
        "units keep their size, a budget counts them as they are, and "
        f"prune_model refuses the model. {registry.WHAT_TO_DO}")]
    bare = [v.path for v in sparse.trainable_weights if len(v.shape) == 2 and v.regularizer is None]
    assert sorted(bare) == sorted(v.path for name in ("block0", "block1")
                                  for v in sparse.get_layer(name).trainable_weights if len(v.shape) == 2)


def test_a_model_it_reads_whole_gets_no_such_warning():
    inputs = keras.Input((8,))
    h = L.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, L.Dense(1)(L.Add()([h, L.Dense(8)(h)])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_group_sparsity(model, 1e-3)
    assert not [w for w in caught if "get no group penalty" in str(w.message)]


def test_a_refusal_is_at_most_three_lines():
    model = with_blocks(5)
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model)
    lines = str(info.value).splitlines()
    assert lines == [
        ("prune_model: cannot prune layer 'block0' (GatedDense): a layer with weights of its own ('kernel'), whose "
         "math needs a rule."),
        ("Also not supported: 'block1' (GatedDense): a layer with weights of its own ('kernel'), whose math needs a "
         "rule, 'block2' (GatedDense): a layer with weights of its own ('kernel'), whose math needs a rule, 'block3' "
         "(GatedDense): a layer with weights of its own ('kernel'), whose math needs a rule and 1 more layer."),
        registry.WHAT_TO_DO,
    ]
    assert len(info.value.others) == 4 and "Dense" in info.value.supported


def test_a_budget_that_cannot_be_met_names_the_layers_it_cannot_reach():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = add_group_sparsity(with_blocks(1), 1e-3)
    model.compile(keras.optimizers.SGD(0.05), "binary_crossentropy")
    with pytest.warns(RuntimeWarning, match=r"the budget cannot be met: .* and the kernels of 1 layer whose "
                                            r"computation cannot be read: 'block0' \(GatedDense, 2 kernels"):
        model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=[SparsityBudget(max_params=0.1, settle=0.4)])


def test_a_sequential_with_a_layer_not_registered_for_serialization_is_copied():
    model = keras.Sequential([keras.Input((8,)), L.Dense(8), GatedDense(8, name="block"), L.Dense(1)])
    with pytest.warns(UserWarning, match="'block' \\(GatedDense, 2 kernels"):
        sparse = add_group_sparsity(model, 1e-3)
    x = np.random.default_rng(0).normal(size=(4, 8)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sparse(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)
    assert isinstance(sparse.get_layer("block"), GatedDense)


def test_a_model_surgery_cannot_rebuild_is_said_when_the_penalties_go_on_not_after_training():
    # a pooling of the channels that keeps its axis: one value per position on a last axis of size 1, which no
    # rule reads (without keepdims it is keras.io's timeseries Transformer's, tests/test_traced_blocks.py)
    inputs = keras.Input((12, 3))
    h = L.Conv1D(6, 1, activation="relu", name="ff")(inputs)
    h = L.GlobalAveragePooling1D(data_format="channels_first", keepdims=True, name="pool")(h)
    h = L.Flatten()(h)
    model = keras.Model(inputs, L.Dense(2, name="out")(h))
    with pytest.warns(UserWarning) as caught:
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if "prune_model cannot rebuild" in str(w.message)]
    assert said == [
        "add_group_sparsity: every kernel gets its group penalty, but prune_model cannot rebuild this model: 'pool' "
        "(GlobalAveragePooling1D): a global pooling with data_format='channels_first' and keepdims=True. Training, "
        "sparsity_report "
        f"and apply_threshold work; prune_model refuses until it can read those layers. {registry.WHAT_TO_DO}"]
    assert all(v.regularizer is not None for v in sparse.trainable_weights if len(v.shape) >= 2)
    with pytest.raises(UnsupportedModelError, match="cannot prune layer 'pool'"):
        prune_model(model)


def test_a_slice_of_the_positions_prunes_and_a_strided_slice_of_the_channels_is_named():
    # a slice of the positions (BERT's pooler reads x[:, 0, :]) passes every unit; one that takes every other
    # channel is named before any training
    inputs = keras.Input((6, 8))
    h = L.Dense(8, name="hidden")(inputs)
    model = keras.Model(inputs, [L.Dense(1, name="out")(h[:, :4]), L.Dense(2, name="first")(h[:, 0, :])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_group_sparsity(model, 1e-3)
    assert not [w for w in caught if "add_group_sparsity" in str(w.message)]
    kernel = model.get_layer("hidden").kernel
    kernel.assign(keras.ops.convert_to_numpy(kernel) * np.array([1, 0, 1, 1, 0, 1, 1, 1], "float32"))
    small = prune_model(model, 1e-3)
    assert small.get_layer("hidden").units == 6
    apply_threshold(model, 1e-3)  # the reference: the thresholded original
    x = np.random.default_rng(0).normal(size=(3, 6, 8)).astype("float32")
    for got, want in zip(small(x), model(x)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), rtol=1e-5,
                                   atol=1e-6)
    strided = keras.Model(inputs, L.Dense(1, name="out")(h[:, :4, ::2]))
    with pytest.warns(UserWarning, match=r"prune_model cannot rebuild this model: 'get_item_\d+' \(keras.ops.GetItem\): "
                                         r"a slice x\[\.\.\.\] that is not of the positions alone"):
        sparse = add_group_sparsity(strided, 1e-3)
    assert all(v.regularizer is not None for v in sparse.trainable_weights if len(v.shape) == 2)


class ScoredDense(L.Layer):
    """A block that returns its output and something else: ``None`` (as KerasHub's DeiT encoder blocks, ``(y,
    None)``) or a value that is no tensor."""

    def __init__(self, other=None, **kwargs):
        super().__init__(**kwargs)
        self.dense = L.Dense(4)
        self.other = other

    def call(self, x):
        return self.dense(x), self.other


class ScoringEncoder(L.Layer):
    """A block whose call reads a block returning its output and ``other``: with ``None`` it traces (the node
    records the tensor); with a string no node can hold it, so it does not."""

    def __init__(self, other=None, **kwargs):
        super().__init__(**kwargs)
        self.inner = ScoredDense(other)

    def call(self, x):
        y, _ = self.inner(x)
        return y


def test_a_block_that_returns_none_beside_its_output_is_traced_and_prunes_exactly(rng, tmp_path):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, L.Dense(1, name="out")(ScoringEncoder(name="encoder")(inputs)))
    sparse = add_group_sparsity(model, 1e-3)
    assert sparse.get_layer("encoder").inner.dense.kernel_regularizer is not None
    kernel = model.get_layer("encoder").inner.dense.kernel
    value = keras.ops.convert_to_numpy(kernel).copy()
    value[:, [0, 2]] = 0.0  # two of its four units dead
    kernel.assign(value)
    small = prune_model(model)
    x = rng.normal(size=(5, 4)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-5, atol=1e-6)
    assert small.pruning_report.params_after < small.pruning_report.params_before


def test_a_block_that_does_not_trace_is_named_with_its_error_and_a_model_of_only_such_blocks_is_refused():
    reason = "a block whose call does not run on symbolic inputs ("  # then the backend's own error
    inputs = keras.Input((4,))
    with pytest.warns(UserWarning) as caught:
        add_group_sparsity(keras.Model(inputs, L.Dense(1, name="out")(ScoringEncoder("none", name="encoder")(inputs))),
                           1e-3)
    said = [str(w.message) for w in caught if "get no group penalty" in str(w.message)]
    assert len(said) == 1 and f"'encoder' (ScoringEncoder, 1 kernel: {reason}" in said[0]
    with pytest.raises(InvalidParameterError) as info:
        add_group_sparsity(keras.Model(inputs, ScoringEncoder("none", name="encoder")(inputs)), 1e-3)
    assert str(info.value).startswith(
        "add_group_sparsity: argument `model` must be a model with at least one Dense or convolution layer (the "
        "layers group penalties go on); the copy would have no penalty; its kernels are inside 1 layer whose "
        f"computation cannot be read: 'encoder' (ScoringEncoder, 1 kernel: {reason}")


def test_a_model_whose_only_readable_layer_takes_no_penalty_is_refused():
    # An Embedding makes units but takes no group penalty; the block after it does not trace (as KerasHub 0.32's
    # SmolLM3 decoders did before their attention was read): the copy would carry no penalty at all, so
    # add_group_sparsity refuses it and names the block.
    tokens = keras.Input((6,), dtype="int32")
    hidden = ScoringEncoder("none", name="encoder")(L.Embedding(20, 4, name="embedding")(tokens))
    with pytest.raises(InvalidParameterError, match=r"the copy would have no penalty; its kernels are inside 1 layer "
                                                    r"whose computation cannot be read: 'encoder' \(ScoringEncoder"):
        add_group_sparsity(keras.Model(tokens, hidden), 1e-3)

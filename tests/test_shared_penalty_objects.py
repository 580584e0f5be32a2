"""One regularizer object on many layers and many models: each weight keeps its role, each model its strength.

Keras users write ``reg = SparseGroupLasso(1e-3)`` once and pass it to every
layer (and to every model a factory builds). The role of a penalty (input or
hidden groups) belongs to the weight and its strength to the model, so a
model that declares its penalties gives each weight a copy of its own; the
object passed in is never changed.
"""

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    GroupSparseSequential,
    HiddenGroupLasso,
    Proximal,
    SparseGroupLasso,
    SparsityBudget,
    set_penalty_multiplier,
    sparsity_report,
)
from keras_group_lasso.declared import declared_penalties

ops = keras.ops


def mlp(penalties, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(10, activation="relu", kernel_regularizer=penalties[0], name="a")(inputs)
    h = keras.layers.Dense(8, activation="relu", kernel_regularizer=penalties[1], name="b")(h)
    outputs = keras.layers.Dense(1, activation="sigmoid", kernel_regularizer=penalties[2], name="c")(h)
    return keras.Model(inputs, outputs)


def penalty_values(model):
    """The value each layer's kernel penalty adds to the loss now."""
    return [float(ops.convert_to_numpy(model.get_layer(name).kernel.regularizer(model.get_layer(name).kernel)))
            for name in "abc"]


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 12)).astype("float32")
    return x, (x[:, :3].sum(axis=1) > 0).astype("float32")


def test_one_object_on_every_layer_is_steered_per_role():
    shared = SparseGroupLasso(1e-3)
    model = mlp([shared] * 3)
    plain = penalty_values(model)
    set_penalty_multiplier(model, input=10.0, hidden=0.0)
    values = penalty_values(model)
    np.testing.assert_allclose(values, [10 * plain[0], 0.0, 0.0], rtol=1e-6)
    regularizers = [model.get_layer(name).kernel.regularizer for name in "abc"]
    assert len({id(r) for r in regularizers}) == 3  # one object per weight
    assert all(r == shared for r in regularizers)  # the same penalty (config)
    # The layers' attributes (what get_config saves) and the variables carry the same object.
    assert all(model.get_layer(name).kernel_regularizer is r for name, r in zip("abc", regularizers))
    assert shared.declared is None  # the object passed in is left as it was
    assert float(ops.convert_to_numpy(shared(model.get_layer("a").kernel))) == pytest.approx(plain[0], rel=1e-6)


def test_one_object_on_kernel_and_bias_of_a_layer_gives_each_its_own():
    shared = HiddenGroupLasso(1e-3)
    inputs = keras.Input((4,))
    layer = keras.layers.Dense(3, kernel_regularizer=shared, bias_regularizer=shared)
    model = keras.Model(inputs, layer(inputs))
    set_penalty_multiplier(model, 2.0)
    assert layer.kernel.regularizer is not layer.bias.regularizer
    assert layer.kernel_regularizer is layer.kernel.regularizer and layer.bias_regularizer is layer.bias.regularizer


def test_a_layer_built_later_gets_its_own_object_too():
    shared = SparseGroupLasso(1e-3)
    # A GroupSparseSequential declares its penalties when it is made: here before its layers have weights.
    model = GroupSparseSequential([keras.layers.Dense(6, kernel_regularizer=shared, name="a"),
                                   keras.layers.Dense(2, kernel_regularizer=shared, name="b")])
    set_penalty_multiplier(model, 3.0)
    model.build((None, 5))
    a, b = model.get_layer("a"), model.get_layer("b")
    assert a.kernel.regularizer is a.kernel_regularizer and b.kernel.regularizer is b.kernel_regularizer
    assert a.kernel.regularizer is not b.kernel.regularizer and shared.declared is None
    expected = 3.0 * float(ops.convert_to_numpy(shared(b.kernel)))
    assert float(ops.convert_to_numpy(b.kernel.regularizer(b.kernel))) == pytest.approx(expected, rel=1e-6)


def test_one_object_in_two_models_keeps_their_strengths_apart():
    shared = SparseGroupLasso(1e-3)
    first, second = mlp([shared] * 3, seed=0), mlp([shared] * 3, seed=1)
    set_penalty_multiplier(first, 1.0)
    before = penalty_values(first)
    set_penalty_multiplier(second, 5.0)
    assert penalty_values(first) == before
    set_penalty_multiplier(first, 2.0)  # declared again: nothing is copied, the strength follows
    np.testing.assert_allclose(penalty_values(first), [2 * v for v in before], rtol=1e-6)
    plain = mlp([shared] * 3, seed=1)  # a third model that never declares: strength 1, not 5 or 2
    unscaled = [float(ops.convert_to_numpy(shared(plain.get_layer(n).kernel))) for n in "abc"]
    assert penalty_values(plain) == unscaled
    own = declared_penalties(first).penalties()
    assert all(p.declared is declared_penalties(first) for _, _, p in own)


@pytest.mark.parametrize("optimizer", ["sgd", "proximal"])
def test_a_budget_trains_the_shared_object_model_as_the_one_with_an_object_per_layer(optimizer):
    """The same seed and data: one object on every layer ends with the weights of one object per layer."""
    x, y = data()
    ends = []
    for penalties in ([SparseGroupLasso(2e-3)] * 3, [SparseGroupLasso(2e-3) for _ in range(3)]):
        model = mlp(penalties)
        sgd = keras.optimizers.SGD(0.1, momentum=0.9)
        model.compile(Proximal(sgd) if optimizer == "proximal" else sgd, "binary_crossentropy")
        budget = SparsityBudget(max_features=4, settle=0.3)
        model.fit(x, y, epochs=6, batch_size=32, shuffle=False, verbose=0, callbacks=[budget])
        ends.append(([np.array(w) for w in model.get_weights()], sparsity_report(model, 1e-3).layer_sizes))
    (shared_weights, shared_sizes), (own_weights, own_sizes) = ends
    assert shared_sizes == own_sizes and shared_sizes[0] <= 4
    for a, b in zip(shared_weights, own_weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_model_trained_before_it_declares_traces_its_step_again():
    """A compiled step holds the penalty objects it was traced with: declaring later must reach the next fit."""
    x, y = data()
    shared = SparseGroupLasso(1e-3)
    model = mlp([shared] * 3)
    model.compile(keras.optimizers.SGD(0.0), "binary_crossentropy")  # lr 0: the loss is the only signal
    model.fit(x, y, epochs=1, batch_size=128, verbose=0)
    base = model.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)["loss"]
    set_penalty_multiplier(model, 1e3)
    scaled = model.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)["loss"]
    plain = sum(penalty_values(mlp([shared] * 3)))  # the penalties at strength 1 (the same weights: seed 0, lr 0)
    assert scaled - base == pytest.approx((1e3 - 1.0) * plain, rel=1e-3)

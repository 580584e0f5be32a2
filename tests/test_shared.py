"""Shared layers: one layer called on several tensors (siamese encoders, a block applied twice).

A shared layer's units are the same in every call: a unit goes only when it
is dead in every call, and an input row only when no call needs it; the
pruned model calls one (smaller) layer as many times. Its weights and
parameters are counted once, its multiply-adds in every call.
"""

import keras
import numpy as np
import pytest

from keras_group_lasso import add_group_sparsity, prune_model, sparsity_report
from test_branching import kill_units
from test_model_families import assert_same_outputs, assert_untouched, outputs, randomize, weights_of

T = 1e-3
L = keras.layers


def siamese(calls=2):
    inputs = [keras.Input((6,), name=f"x{i}") for i in range(calls)]
    encoder = L.Dense(7, activation="tanh", name="enc")
    norm = L.BatchNormalization(name="bn")
    head = L.Dense(5, activation="relu", name="head")
    codes = [head(norm(encoder(x))) for x in inputs]
    return keras.Model(inputs, L.Dense(2, name="out")(L.Concatenate(name="codes")(codes)))


def shared_cnn():
    left, right = keras.Input((8, 8, 2), name="left"), keras.Input((8, 8, 2), name="right")
    conv = L.Conv2D(6, 3, padding="same", activation="relu", name="conv")
    pool = L.GlobalAveragePooling2D(name="pool")
    x = L.Subtract(name="difference")([pool(conv(left)), pool(conv(right))])
    return keras.Model([left, right], L.Dense(3, name="out")(x))


@pytest.mark.parametrize("make", [siamese, lambda: siamese(3), shared_cnn], ids=["siamese", "three_calls", "cnn"])
@pytest.mark.parametrize("seed", range(3))
def test_shared_layers_prune_exactly_and_stay_shared(make, seed, tmp_path):
    rng = np.random.default_rng(seed)
    model = make()
    randomize(model, rng, scale=0.5)
    kill_units(model, rng, dead=0.2, constant=0.3, dead_layer=0.0)
    before = weights_of(model)
    xs = [rng.normal(size=(4,) + tuple(t.shape[1:])).astype("float32") for t in model.inputs]
    small = prune_model(model, T)
    assert_same_outputs(small, model, xs, rtol=1e-5)
    names = [layer.name for layer in small.layers]
    assert len(names) == len(set(names)) and not any("#" in name for name in names)
    shared = [name for name in ("enc", "bn", "head", "conv") if name in names]
    assert all(len(small.get_layer(name)._inbound_nodes) == len(model.inputs) for name in shared)
    report = sparsity_report(model, T)
    assert [layer.name for layer in report.layers if "#" in layer.name] == []
    assert small.count_params() <= model.count_params()
    small.save(tmp_path / "small.keras")
    again = keras.saving.load_model(tmp_path / "small.keras")
    np.testing.assert_allclose(outputs(again, xs)[0], outputs(small, xs)[0], rtol=0, atol=1e-6)
    assert_untouched(model, before)


def test_a_unit_of_a_shared_layer_goes_only_when_dead_in_every_call():
    model = siamese()
    rng = np.random.default_rng(0)
    kill_units(model, rng, dead=0.0, constant=0.0, dead_layer=0.0)
    kernel, bias = model.get_layer("out").get_weights()
    kernel[[1, 3]] = 0.0  # head unit 1 unread in the first call, unit 3 in the first call only
    kernel[[5 + 1]] = 0.0  # head unit 1 unread in the second call too
    model.get_layer("out").set_weights([kernel, bias])
    small = prune_model(model, T)
    assert small.get_layer("head").units == 4  # unit 1 goes; unit 3 stays (the second call reads it)
    report = sparsity_report(model, T)
    head = {layer.name: layer for layer in report.layers}["head"]
    assert (head.units, head.units_alive) == (5, 4)
    # parameters once, multiply-adds in every call
    assert report.params_before == sum(int(np.prod(w.shape)) for name in ("enc", "head", "out")
                                       for w in model.get_layer(name).get_weights())
    assert head.flops_before == 2 * 7 * 5


def test_add_group_sparsity_gives_a_shared_layer_one_penalty_and_it_trains():
    model = add_group_sparsity(siamese(), 1e-3)
    assert type(model.get_layer("enc").kernel_regularizer).__name__ == "InputGroupLasso"
    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    model.compile("adam", "mse")
    model.fit([x, x[::-1]], np.zeros((64, 2), "float32"), epochs=1, verbose=0)
    assert_same_outputs(prune_model(model, T), model, [x[:4], x[4:8]], rtol=1e-5)

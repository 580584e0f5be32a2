"""EinsumDense as a Dense on the last axis (``"abc,cd->abd"``), the form of the feed-forward layers of KerasHub's
Transformers: penalised, reported and pruned like a Dense layer; other equations are refused by name."""

import warnings

import keras
import numpy as np
import pytest
from test_branching import kill_units
from test_model_families import assert_prunes_exactly_and_reloads

from keras_group_lasso import InvalidParameterError, add_group_sparsity, prune_model, sparsity_report
from keras_group_lasso.graph import model_graph, registry

L = keras.layers


def gated_feed_forward(steps=5, width=6, hidden=10):
    """A gated feed-forward block as Gemma and Llama write it, ``down(act(gate(x)) * up(x))`` with EinsumDense, on
    a residual stream, then a pooled EinsumDense head of two axes (``"ab,bc->ac"``)."""
    inp = keras.Input((steps, width))
    gate = L.EinsumDense("btd,df->btf", output_shape=(None, hidden), activation="gelu", name="gate")(inp)
    up = L.EinsumDense("btd,df->btf", output_shape=(None, hidden), bias_axes="f", name="up")(inp)
    h = L.Multiply(name="gated")([gate, up])
    h = L.EinsumDense("btf,fd->btd", output_shape=(None, width), bias_axes="d", name="down")(h)
    x = L.Add(name="residual")([inp, h])
    x = L.GlobalAveragePooling1D()(x)
    x = L.EinsumDense("ab,bc->ac", output_shape=8, bias_axes="c", activation="relu", name="head")(x)
    return keras.Model(inp, L.EinsumDense("ab,bc->ac", output_shape=3, name="out")(x))


@pytest.mark.parametrize("seed", [pytest.param(0, marks=pytest.mark.quick), 1, 2])
def test_a_gated_feed_forward_of_einsum_dense_layers_prunes_exactly(seed, tmp_path):
    keras.utils.set_random_seed(seed)
    model = gated_feed_forward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # every kernel gets its penalty, and nothing is refused
        sparse = add_group_sparsity(model, 1e-3)
    assert all(layer.kernel_regularizer is not None for layer in sparse.layers if isinstance(layer, L.EinsumDense))
    graph = model_graph(model)
    assert graph.supported and [node.name for node in graph.units] == ["gate", "up", "down", "head", "out"]
    # a neuron of the gated layer goes from gate, up and down together: the Multiply couples gate's and up's
    assert np.array_equal(graph.node("gate").out_ids, graph.node("up").out_ids)
    rng = np.random.default_rng(seed)
    kill_units(model, rng, dead=0.3, constant=0.3, dead_layer=0.0)
    x = rng.normal(size=(4, 5, 6)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    report = sparsity_report(model, 1e-3)
    sizes = {layer.name: int(layer.kernel.shape[-1]) for layer in small.layers if isinstance(layer, L.EinsumDense)}
    assert sizes["gate"] == sizes["up"] == small.get_layer("down").kernel.shape[0]
    assert sizes["gate"] < 10 or sizes["head"] < 8
    assert report.uninterpreted_layers == ()
    assert all(type(layer) is L.EinsumDense for layer in small.layers if "EinsumDense" in type(layer).__name__)


def test_an_einsum_dense_into_heads_is_refused_by_name():
    inp = keras.Input((5, 6))
    q = L.EinsumDense("btd,dnh->btnh", output_shape=(5, 2, 3), name="query")(inp)
    model = keras.Model(inp, L.Dense(2, name="out")(L.Flatten()(q)))
    with pytest.raises(InvalidParameterError, match=r"layer 'query' \(EinsumDense\) is an EinsumDense with equation"):
        add_group_sparsity(model, 1e-3)  # before any training, not a model penalised in part
    reason = registry.rule_of(model.get_layer("query")).refusal(model.get_layer("query"))
    assert reason == ("an EinsumDense with equation 'btd,dnh->btnh' (only a Dense on the last axis, such as "
                      "'abc,cd->abd', is supported)")
    with pytest.raises(Exception, match="query"):
        prune_model(model)


@pytest.mark.parametrize("equation, expected", [
    ("ab,bc->ac", ("b", "c")), ("abc,cd->abd", ("c", "d")), ("...b,bc->...c", ("b", "c")),
    ("btd,df->btf", ("d", "f")), ("abc,cd->bad", None), ("abc,cde->abde", None), ("abc,dc->abd", None),
    ("ab,bc->abc", None), ("abc,cd->ad", None), ("not an equation", None),
])
def test_which_equations_are_a_dense_on_the_last_axis(equation, expected):
    assert registry.dense_equation(equation) == expected

"""The Keras model as a graph of layers and the units (channels) that flow between them."""

from keras_group_lasso.graph.build import ModelGraph, UnitsNode, model_graph
from keras_group_lasso.graph.registry import (
    KernelUnitsRule,
    Kind,
    LayerRule,
    UnitsRule,
    register_layer,
    rule_of,
    supported_text,
    unregister_layer,
)
from keras_group_lasso.graph.rules.shape import WholeRule
from keras_group_lasso.graph.rules.units import (
    UnitsCost,
    UnitsGraph,
    UnitsPenalties,
    UnitsSlicing,
)

__all__ = [
    "Kind",
    "KernelUnitsRule",
    "LayerRule",
    "UnitsRule",
    "UnitsGraph",
    "UnitsPenalties",
    "UnitsSlicing",
    "UnitsCost",
    "WholeRule",
    "ModelGraph",
    "UnitsNode",
    "model_graph",
    "register_layer",
    "unregister_layer",
    "rule_of",
    "supported_text",
]

"""The Keras model as a graph of layers and the units (channels) that flow between them."""

from keras_group_lasso.graph.registry import LayerRule, register_layer, rule_of, supported_text

__all__ = ["LayerRule", "register_layer", "rule_of", "supported_text"]

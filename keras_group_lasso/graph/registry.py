"""One table of the layer classes that analysis and surgery understand: one rule class per layer kind.

Every layer class the package can see through has one :class:`LayerRule`
(matched by exact class: a subclass may compute anything). A rule knows its
layer's *kind* (how units flow through it), why a configuration is refused,
how a constant channel passes through it, and how surgery slices it; a
:class:`UnitsRule` (a layer that makes units) also knows its kernels, their
:class:`~keras_group_lasso.groups.GroupView`, which input unit reaches which
output unit, its multiply-adds and parameters. The graph
(:mod:`keras_group_lasso.graph.build`), the masks, the report, the penalties
and surgery ask the rule; nothing outside this table and the rules asks for a
layer's class. The rule classes live in :mod:`keras_group_lasso.graph.rules`,
one module per family of layers, each with the rules of its Keras layers
(``builtin_rules()``); this module is the table: :func:`register_layer` adds a
user's own layer (a per-channel layer by its slicer, a units layer by its
kernels, or any :class:`LayerRule` subclass instance), :func:`rule_of` finds
a layer's rule.

Kinds:

* ``"units"``: makes new units (Dense, Conv1D/2D/3D, SeparableConv1D/2D,
  Conv1D/2D/3DTranspose). Its kernel seen as ``(positions, in_units,
  out_units)`` (:meth:`UnitsRule.units_view`): the slice ``[:, i, :]`` is the
  group of input unit ``i``, all its outgoing weights, the paper's group.
* ``"per_unit"``: acts on each channel on its own (activations, Dropout,
  BatchNormalization, pooling, padding, DepthwiseConv with
  ``depth_multiplier=1``): a channel can be removed across it.
* ``"per_element"``: input preprocessing with one value per element
  (Normalization, Rescaling): before the first units layer, or between
  Dense layers; a Rescaling with one value per channel anywhere (surgery
  puts one after a merge whose constant operand it removed).
* ``"flatten"``, ``"global_pool"``: change the spatial shape; channel ``c`` of
  a ``(..., C)`` map becomes the features ``c, C + c, 2C + c, ...`` (Flatten)
  or feature ``c`` (global pooling); a Reshape that only adds or removes axes
  of size 1 (``(1, 1, C) <-> (C,)``) is a Flatten of one position.
* ``"merge"``: combines tensors of the same shape element by element (Add,
  Subtract, Average, Maximum, Minimum, Multiply): channel ``c`` of every
  operand and of the output is one unit, kept or removed together.
* ``"concat"``: Concatenate on the last axis: the output's channels are the
  operands' channels, one after the other.
* ``"tail"``: an activation that mixes units, such as softmax: every unit it
  reads is kept.
* ``"input"``: the model's input.
* ``"constant"``: a tensor that no model input reaches (positions from
  ``keras.ops.arange``, a table added to every example): a
  :class:`ConstantValue` node of the graph; the layers it feeds are nodes
  like any other, and the merge where it meets the input's path couples its
  channels with that path's.

A constant channel (a unit whose incoming weights are all zero outputs
``act(b)`` everywhere) is removed and its value folded into the next units
layer's bias where that is exact. The rule of each layer says how a constant
passes: ``"call"`` (evaluated by the layer itself in inference mode),
``"identity"`` (pooling, cropping: the same constant), ``"zero_only"``
(zero padding makes the border 0, so only a constant 0 stays constant), or
``None`` (the channel is treated as varying afterwards).
"""


import keras

from keras_group_lasso._validation import fail
from keras_group_lasso.graph.rules import attention, channels, merge, recurrent, shape, units
from keras_group_lasso.graph.rules.base import (
    CONSTANTS,
    ELEMENTWISE_ACTIVATIONS,
    KINDS,
    InputRule,
    Kind,
    LayerRule,
    call_activation,
    call_on_constants,
    config_is_read,
    keep_config,
    layer_config,
    layer_from_config,
    output_shape,
    threshold_array,
    variable_axes,
)
from keras_group_lasso.graph.rules.channels import PerElementRule, TailRule
from keras_group_lasso.graph.rules.merge import MergeRule
from keras_group_lasso.graph.rules.operations import (
    constant_array,
    is_constant_value,
    operation_layer,
    operation_name,
    reads_no_values,
)
from keras_group_lasso.graph.rules.recognized import recognize
from keras_group_lasso.graph.rules.shape import (
    AlibiAttentionRule,
    ChannelSlice,
    ChannelSliceRule,
    ConstantRule,
    ConstantValue,
    FlattenRule,
    GlobalPoolRule,
    MaskedLMHeadRule,
    PositionBiasAttentionRule,
    ShapeListAttentionRule,
    ReverseCall,
    ReverseCallRule,
    WholeAttentionRule,
    WholeRule,
    is_constant_array,
    is_reverse_call,
    split_slices,
)
from keras_group_lasso.graph.rules.units import KernelUnitsRule, UnitsRule, dense_equation

__all__ = [
    "Kind",
    "LayerRule",
    "UnitsRule",
    "KernelUnitsRule",
    "register_layer",
    "unregister_layer",
    "rule_of",
    "units_rule",
    "makes_units",
    "supported_text",
    "supported_markdown",
    "supported_of",
    "variable_axes",
    "output_shape",
    "operation_layer",
    "ConstantValue",
    "is_constant_array",
    "reads_no_values",
    "is_constant_value",
    "constant_array",
    "ELEMENTWISE_ACTIVATIONS",
    # read by the graph, masks and surgery through this module
    "MergeRule",
    "operation_name",
    "call_activation",
    "call_on_constants",
    "layer_config",
    "layer_from_config",
    "threshold_array",
    "split_slices",
    "dense_equation",
]


# ----------------------------------------------------------------------------- the table

_RULES = {}
_CHANGES = [0]  # bumped by every (un)registration: a cached graph from before is stale
_USER_KINDS = {"per_unit": LayerRule, "per_element": PerElementRule, "flatten": FlattenRule,
               "global_pool": GlobalPoolRule, "tail": TailRule, "whole": WholeRule}


def table_version():
    """A number that changes whenever the table changes."""
    return _CHANGES[0]


def register_layer(cls, kind="per_unit", *, slicer=None, constants="call", description=None, refusal=None,
                   kernels=None, width=None, biases=()):
    """Teach the analysis and surgery a layer class of your own.

    A class that acts on each channel on its own (``kind="per_unit"``, with a
    ``slicer`` when it has per-channel weights); a class that makes units from
    kernels of its own (``kind="units"``, with ``kernels`` and ``width``: see
    :class:`KernelUnitsRule` for what it must compute); one with weights and
    math of its own left as it is (``kind="whole"``); or a rule object, an
    instance of a :class:`LayerRule` subclass, whose methods say everything (a
    :class:`UnitsRule`'s, one small interface per concern).

    Args:
        cls: a ``keras.layers.Layer`` subclass (matched exactly, not its
            subclasses), or a :class:`LayerRule` instance (the other
            arguments are then not used).
        kind: ``"per_unit"`` (default), ``"units"``, ``"per_element"``,
            ``"flatten"``, ``"global_pool"``, ``"tail"`` or ``"whole"`` (a
            layer with weights and math of its own kept as it is: every unit
            it reads and makes stays, see :class:`WholeRule`).
        slicer: ``(layer, kept) -> (config, weights)``: the config and weights
            of the layer restricted to the channels ``kept`` (an int array);
            ``None`` if it has no per-channel weights (its config is copied).
            Not with ``kind="units"``.
        constants: ``"call"`` (a constant channel stays constant: surgery
            evaluates the layer on it), ``"identity"``, ``"zero_only"``, or
            ``None`` (a constant channel is treated as varying after it).
            Not used with ``kind="units"``.
        description: words for the list of supported layers (default: the class name).
        refusal: optional ``layer -> reason or None``.
        kernels: with ``kind="units"``, the attributes of its kernels
            ``(..., inputs, units)``, each taking its group penalty through the
            config key ``"<attribute>_regularizer"``; or ``{attribute: config
            key}``. The first is its main kernel.
        width: with ``kind="units"``, the config key of its number of units.
        biases: with ``kind="units"``, the attributes of its weights with one
            entry per unit (sliced with the units).

    Returns:
        The :class:`LayerRule` now in the table.

    Example:
        >>> class Scale(keras.layers.Layer):
        ...     def call(self, x):
        ...         return 2.0 * x
        >>> register_layer(Scale).kind
        <Kind.PER_UNIT: 'per_unit'>
        >>> unregister_layer(Scale)
    """
    if isinstance(cls, LayerRule):
        rule = cls
        if not (isinstance(rule.cls, type) and issubclass(rule.cls, keras.layers.Layer)):
            fail("register_layer", "cls", "a rule whose cls is a keras.layers.Layer subclass", rule.cls)
        return _add(rule)
    if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
        fail("register_layer", "cls", "a keras.layers.Layer subclass or a LayerRule instance", cls)
    if kind == Kind.UNITS:
        return _add(_kernel_units_rule(cls, kernels, width, biases, slicer, description, refusal))
    for name, value, unset in (("kernels", kernels, None), ("width", width, None), ("biases", biases, ())):
        if value != unset:
            fail("register_layer", name, 'given only with kind="units"', value)
    if kind not in _USER_KINDS:
        fail("register_layer", "kind", "one of " + ", ".join(repr(k) for k in _USER_KINDS)
             + " (a layer of another kind is registered as a LayerRule subclass instance)", kind)
    if kind == "whole":
        for name, value, default in (("slicer", slicer, None), ("constants", constants, "call")):
            if value != default:
                fail("register_layer", name, 'left out with kind="whole" (the layer is kept as it is)', value)
    if constants not in CONSTANTS and not callable(constants):
        fail("register_layer", "constants", "one of 'call', 'identity', 'zero_only', None", constants)
    if slicer is not None and not callable(slicer):
        fail("register_layer", "slicer", "a callable (layer, kept) -> (config, weights) or None", slicer)
    return _add(_USER_KINDS[kind](cls, description, slicer=slicer, constants=constants, refusal=refusal))


def _kernel_units_rule(cls, kernels, width, biases, slicer, description, refusal):
    """The :class:`KernelUnitsRule` of ``register_layer(cls, "units", ...)``, its arguments checked."""
    def names(value):
        return isinstance(value, str) or (isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value))

    if isinstance(kernels, dict) and kernels and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in kernels.items()):
        keys = dict(kernels)
    elif names(kernels) and kernels:
        keys = {attribute: f"{attribute}_regularizer" for attribute in ([kernels] if isinstance(kernels, str)
                                                                          else kernels)}
    else:
        fail("register_layer", "kernels", 'with kind="units", the attribute names of its kernels (a str, a list '
             "of str, or a dict of attribute to regularizer config key)", kernels)
    if not isinstance(width, str):
        fail("register_layer", "width", 'with kind="units", the config key of its number of units (a str)', width)
    if not names(biases):
        fail("register_layer", "biases", "the attribute names of its per-unit weights (a str or a list of str)",
             biases)
    biases = (biases,) if isinstance(biases, str) else tuple(biases)
    if "bias" in keys or "kernel" in list(keys)[1:]:
        fail("register_layer", "kernels", "kernel attributes other than 'bias' (a bias goes in `biases`), one "
             "named 'kernel' given first", kernels)
    if len(set(biases)) != len(biases) or set(biases) & set(keys):
        fail("register_layer", "biases", "distinct attribute names that are not kernels", biases)
    if slicer is not None:
        fail("register_layer", "slicer", 'None with kind="units" (its kernels say how to slice it)', slicer)
    return KernelUnitsRule(cls, keys, width, biases, description=description, refusal=refusal)


def _add(rule):
    _RULES[rule.cls] = rule
    _CHANGES[0] += 1
    return rule


def unregister_layer(cls):
    """Remove ``cls`` from the table (a class registered with :func:`register_layer`)."""
    _RULES.pop(cls, None)
    _CHANGES[0] += 1


#: Layer classes of other packages, by module and name (the package is not imported here): a rule for each
#: is added the first time a layer of the class is met.
_BY_NAME = {  # module.name: (kind, description, rule of the class)
    "keras_hub.src.layers.modeling.position_embedding.PositionEmbedding": (
        "per_unit", "PositionEmbedding (KerasHub; its output is its table, sliced by channel)",
        channels.position_embedding_rule),
    "keras_hub.src.layers.modeling.cached_multi_head_attention.CachedMultiHeadAttention": (
        "units", "CachedMultiHeadAttention (KerasHub; called without a cache; cross-attention kept whole)",
        attention.AttentionRule),
    "keras_hub.src.models.gemma.gemma_attention.CachedGemmaAttention": (
        "units", "CachedGemmaAttention (KerasHub Gemma; grouped-query heads pruned, called without a cache)",
        attention.GroupedQueryAttentionRule),
    "keras_hub.src.models.llama.llama_attention.LlamaAttention": (
        "units", "LlamaAttention (KerasHub Llama; heads kept whole, called without a cache)",
        attention.WholeHeadsAttentionRule),
    "keras_hub.src.models.llama.llama_layernorm.LlamaLayerNorm": (
        "tail", "LlamaLayerNorm (KerasHub Llama; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.models.mistral.mistral_attention.CachedMistralAttention": (
        "units", "CachedMistralAttention (KerasHub Mistral; heads kept whole, called without a cache)",
        attention.WholeHeadsAttentionRule),
    "keras_hub.src.models.mistral.mistral_layer_norm.MistralLayerNormalization": (
        "tail", "MistralLayerNormalization (KerasHub Mistral; its channels stay)",
        channels.LastAxisNormalizationRule),
    "keras_hub.src.models.qwen.qwen_attention.QwenAttention": (
        "units", "QwenAttention (KerasHub Qwen2; heads kept whole, called without a cache)",
        attention.WholeHeadsAttentionRule),
    "keras_hub.src.models.qwen.qwen_layernorm.QwenLayerNorm": (
        "tail", "QwenLayerNorm (KerasHub Qwen2; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.models.qwen3.qwen3_attention.Qwen3Attention": (
        "units", "Qwen3Attention (KerasHub Qwen3; grouped-query heads pruned, called without a cache)",
        attention.GroupedQueryAttentionRule),
    "keras_hub.src.models.qwen3.qwen3_layernorm.Qwen3LayerNorm": (
        "tail", "Qwen3LayerNorm (KerasHub Qwen3; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.models.phi3.phi3_attention.Phi3Attention": (
        "units", "Phi3Attention (KerasHub Phi-3; heads kept whole, called without a cache)",
        attention.WholeHeadsAttentionRule),
    "keras_hub.src.models.phi3.phi3_layernorm.Phi3LayerNorm": (
        "tail", "Phi3LayerNorm (KerasHub Phi-3; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.models.gemma3.gemma3_attention.CachedGemma3Attention": (
        "units", "CachedGemma3Attention (KerasHub Gemma3; grouped-query heads pruned, called without a cache)",
        attention.GroupedQueryAttentionRule),
    "keras_hub.src.models.gemma3.gemma3_layers.RMSNormalization": (
        "tail", "RMSNormalization (KerasHub Gemma3; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.models.gemma.rms_normalization.RMSNormalization": (
        "tail", "RMSNormalization (KerasHub Gemma; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.models.vit.vit_layers.ViTPatchingAndEmbedding": (
        "whole", "ViTPatchingAndEmbedding (KerasHub)", WholeRule),
    "keras_hub.src.models.deit.deit_layers.DeiTEmbeddings": (
        "whole", "DeiTEmbeddings (KerasHub DeiT)", WholeRule),
    "keras_hub.src.models.bloom.bloom_attention.BloomAttention": (
        "whole", "BloomAttention (KerasHub Bloom; heads kept whole)", WholeAttentionRule),
    "keras_hub.src.models.gpt_neo_x.gpt_neo_x_attention.GPTNeoXAttention": (
        "whole", "GPTNeoXAttention (KerasHub GPT-NeoX; heads kept whole)", WholeAttentionRule),
    "keras_hub.src.models.falcon.falcon_attention.FalconAttention": (
        "whole", "FalconAttention (KerasHub Falcon; heads kept whole)", AlibiAttentionRule),
    "keras_hub.src.models.smollm3.smollm3_layers.SmolLM3Attention": (
        "whole", "SmolLM3Attention (KerasHub SmolLM3; heads kept whole)", ShapeListAttentionRule),
    "keras_hub.src.models.t5.t5_multi_head_attention.T5MultiHeadAttention": (
        "whole", "T5MultiHeadAttention (KerasHub T5; heads kept whole, its position bias passed on)",
        PositionBiasAttentionRule),
    "keras_hub.src.models.t5.t5_layer_norm.T5LayerNorm": (
        "tail", "T5LayerNorm (KerasHub T5; its channels stay)", channels.LastAxisNormalizationRule),
    "keras_hub.src.layers.modeling.masked_lm_head.MaskedLMHead": (
        "whole", "MaskedLMHead (KerasHub; kept whole, its token table still the model's)", MaskedLMHeadRule),

}


def rule_of(layer):
    """The :class:`LayerRule` of ``layer``'s exact class; for a class not in the table, a rule recognized from
    what the layer computes (:func:`recognize`); else ``None``."""
    if isinstance(layer, ConstantValue):
        return _CONSTANT_RULE
    if isinstance(layer, ChannelSlice):
        return _SLICE_RULE
    if isinstance(layer, ReverseCall):
        return _REVERSE_RULE
    rule = _RULES.get(type(layer))
    if rule is None and f"{type(layer).__module__}.{type(layer).__qualname__}" in _BY_NAME:
        _, description, make = _BY_NAME[f"{type(layer).__module__}.{type(layer).__qualname__}"]
        rule = _add(make(type(layer), description))
    if rule is None and isinstance(layer, keras.layers.Layer):
        rule = recognize(layer)
    return rule.variant(layer) if rule is not None else None


def units_rule(layer):
    """The :class:`UnitsRule` of a layer that makes units, or ``None``."""
    rule = _RULES.get(type(layer))
    return rule.variant(layer) if isinstance(rule, UnitsRule) else None


def keeps_moving_statistics(layer):
    """Whether ``layer`` averages statistics over the training steps with a ``momentum`` (a BatchNormalization, on
    any axis, subclasses too): what a budget's cut makes stale."""
    return isinstance(layer, keras.layers.BatchNormalization)


def makes_units(layer):
    """``layer`` makes units in its configuration (a Dense or convolution; not a depthwise grouped convolution)."""
    rule = units_rule(layer)
    return rule is not None and rule.classify(layer)[0] != "per_unit"


def supported_of(kind):
    """The descriptions of the layers of one kind, in table order.

    Example:
        >>> "Dense" in supported_of("units")
        True
    """
    named = {description: rule_kind for rule_kind, description, _ in _BY_NAME.values()}
    return tuple(rule.description for rule in _RULES.values() if rule.kind == kind and rule.description not in named
                 ) + tuple(description for description, rule_kind in named.items() if rule_kind == kind) + tuple(
        rule.description for rule in (_REVERSE_RULE,) if rule.kind == kind)


#: What a refusal says to do (the list of supported layers is long: it is in the README, not in a message).
WHAT_TO_DO = ("The supported layers are listed under 'Supported layers' in the README (and in "
              "keras_group_lasso.surgery.SUPPORTED); teach a layer of your own with "
              "keras_group_lasso.graph.register_layer.")


def unread_text(unread, shown=3):
    """``unread`` (:meth:`ModelGraph.unread_kernels`) in words: the first ``shown`` layers, then how many more."""
    named = [f"'{name}' ({cls}, {kernels} kernel{'s' if kernels > 1 else ''}: {reason})"
             for name, cls, reason, kernels in unread[:shown]]
    more = len(unread) - shown
    layers = f"{len(unread)} layer{'s' if len(unread) > 1 else ''}"
    return f"{layers} whose computation cannot be read: " + ", ".join(named) + (
        f" and {more} more" if more > 0 else "")


def supported_text():
    """The supported layers, by kind, in words (for errors and the README)."""
    groups = {kind: supported_of(kind) for kind in KINDS if supported_of(kind)}
    titles = {
        "units": "layers that make units",
        "per_unit": "per-unit layers between them",
        "per_element": "per-element preprocessing (before the first of them, or between Dense layers)",
        "flatten": "reshaping",
        "global_pool": "global pooling",
        "merge": "merges of same-shape tensors or of a gate broadcast over a map's positions (their channels are "
                 "coupled)",
        "concat": "concatenation",
        "tail": "layers that mix units (every unit they read is kept)",
        "whole": "layers kept whole (every unit they read or make is kept)",
    }
    return "; ".join(f"{titles[k]}: {', '.join(groups[k])}" for k in KINDS if k in groups and k in titles)


def supported_markdown():
    """The supported layers as a Markdown table, one row per kind (the README's table is this text).

    Layers of other classes are recognized by what they compute (see
    :func:`recognize`) or refused by name; :func:`register_layer` adds one.

    Example:
        >>> supported_markdown().splitlines()[0]
        '| kind | what the analysis and surgery do | layers |'
    """
    what = {
        "units": "make units: their input groups are penalised, dead and constant units removed",
        "per_unit": "act on each channel on its own: sliced to the kept channels",
        "per_element": "input preprocessing, one value per element or channel: sliced with the kept features",
        "flatten": "reshape: a channel of a map becomes its features at every position",
        "global_pool": "global pooling: a channel of a map becomes one feature",
        "merge": "merge same-shape tensors or broadcast a gate over a map: their channels are one unit",
        "concat": "concatenate on the last axis: the operands' channels side by side",
        "tail": "mix the units they read: every one of them stays",
        "whole": "kept whole: every unit they read and every unit they make stays; copied with their weights",
    }
    groups = {kind: supported_of(kind) for kind in KINDS if supported_of(kind)}
    lines = ["| kind | what the analysis and surgery do | layers |", "|---|---|---|"]
    lines += [f"| {kind} | {what[kind]} | {', '.join(groups[kind])} |" for kind in KINDS if kind in groups
              and kind in what]
    return "\n".join(lines)



def _register_builtin():
    # The order of the families is the order of the supported layers' list.
    _add(InputRule(keras.layers.InputLayer, "the model's input"))
    for family in (units, recurrent, attention, channels, shape, merge):
        for rule in family.builtin_rules():
            _add(rule)


_register_builtin()
# Not in the table: no layer class of the user's is a constant, and the list of supported layers stays the layers'.
_CONSTANT_RULE = ConstantRule(ConstantValue, "a tensor no model input reaches")
_REVERSE_RULE = ReverseCallRule(ReverseCall, "ReversibleEmbedding called with reverse=True (kept whole)")
_SLICE_RULE = ChannelSliceRule(ChannelSlice, "x[..., a:b] and keras.ops.split on the last axis (channels)")

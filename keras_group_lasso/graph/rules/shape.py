"""Rules of layers and operations that move channels or positions: constants, channel slices, Flatten,
global pooling, padding, Reshape."""

import math

import keras
import numpy as np

from keras_group_lasso.graph.rules.base import (
    Kind,
    LayerRule,
    call_with_keras_shapes,
    call_without_none,
    operation_call,
    without_none,
)


class ConstantValue:
    """A tensor of the model that no input reaches, as a node of the graph: its value, the same for every input.

    Positions from ``keras.ops.arange`` (read by a position ``Embedding``),
    or a table that a functional model adds to its input's path. Its last
    axis holds its units, as any tensor's; it has no batch axis unless its
    value has one.

    Args:
        name: the node's name.
        value: the tensor's value (anything ``np.asarray`` takes; kept read-only).
    """

    trainable_weights = ()
    weights = ()

    def __init__(self, name, value):
        self.name = name
        self.value = np.array(value)
        self.value.setflags(write=False)
        self.output = keras.KerasTensor(self.value.shape, dtype=keras.backend.standardize_dtype(self.value.dtype))

    def __repr__(self):
        return f"ConstantValue({self.name!r}, shape={self.value.shape}, dtype={self.value.dtype})"


class ConstantRule(LayerRule):
    """A :class:`ConstantValue`: a tensor no model input reaches (it varies along its positions, not with the input)."""

    kind = Kind.CONSTANT
    constants = None


class ChannelSlice:
    """Entries ``start:stop`` of a tensor's last axis, as a node of the graph.

    ``x[..., a:b]`` in a model (a ``keras.ops`` ``GetItem`` that slices the
    channels only), and each output of ``keras.ops.split`` along the last axis
    (CSPNet's cross-stage halves): one node per output, so that the graph
    still follows one tensor per node. Its channels are the units of the
    tensor it reads, ``ids[start:stop]``; surgery slices the kept ones.

    Args:
        name: the node's name.
        start: the first entry it takes.
        stop: the entry after the last one it takes.
        width: entries of the last axis of the tensor it reads.
    """

    trainable_weights = ()
    weights = ()

    def __init__(self, name, start, stop, width):
        self.name, self.start, self.stop, self.width = name, int(start), int(stop), int(width)

    def __repr__(self):
        return f"ChannelSlice({self.name!r}, {self.start}:{self.stop} of {self.width})"


class ChannelSliceRule(LayerRule):
    """A :class:`ChannelSlice`: entries ``start:stop`` of the last axis; constants pass as they are."""

    kind = Kind.SLICE
    constants = "identity"


def channel_slice(name, key, shape):
    """The :class:`ChannelSlice` of ``x[key]`` on a tensor of ``shape`` (batch axis included) when ``key`` takes a
    contiguous range of the last axis and every entry of the others (``x[..., a:b]``, ``x[:, :, a:b]``), else
    ``None``. ``key`` as Keras serializes it (``__slice__`` and ``__ellipsis__`` entries) or as Python writes it."""
    def entry(item):
        if isinstance(item, dict) and item.get("class_name") == "__slice__":
            config = item["config"]
            return slice(config.get("start"), config.get("stop"), config.get("step"))
        if isinstance(item, dict) and item.get("class_name") == "__ellipsis__":
            return Ellipsis
        return item

    items = [entry(item) for item in (key if isinstance(key, (list, tuple)) else [key])]
    if not shape or shape[-1] is None or not all(isinstance(i, slice) or i is Ellipsis for i in items):
        return None
    items = _every_axis(items, len(shape), pad=False)
    if items is None or len(items) != len(shape) or any(i != slice(None) for i in items[:-1]):
        return None
    start, stop, step = items[-1].indices(int(shape[-1]))
    if step != 1 or stop <= start:
        return None
    return ChannelSlice(name, start, stop, int(shape[-1]))


def _every_axis(items, rank, pad):
    """The entries of a key ``x[items]`` with its ``...`` written out as whole slices (and, with ``pad``, whole
    slices for the axes after the last entry), or ``None`` for a key with several ``...``."""
    if items.count(Ellipsis) > 1:
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + [slice(None)] * (rank - len(items) + 1) + items[at + 1:]
    return items + [slice(None)] * (rank - len(items)) if pad else items


def split_slices(name, operation, shape):
    """One :class:`ChannelSlice` per output of a ``keras.ops.split`` along the last axis of a tensor of ``shape``
    (batch axis included), else ``None``."""
    axis = getattr(operation, "axis", None)
    if not shape or shape[-1] is None or not isinstance(axis, int) or axis % len(shape) != len(shape) - 1:
        return None
    width = int(shape[-1])
    sections = operation.indices_or_sections
    if isinstance(sections, (int, np.integer)):
        if sections < 1 or width % sections:
            return None
        bounds = [width // int(sections) * k for k in range(int(sections) + 1)]
    else:
        bounds = [0] + [min(max(int(i), 0), width) for i in sections] + [width]
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        return None
    return [ChannelSlice(f"{name}/@{k}" if k else name, a, b, width) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def is_constant_array(value):
    """``value`` is a concrete array of at least one axis (a numpy array or an eager tensor of the backend), not a
    symbolic tensor or a number: a constant operand of a call."""
    if isinstance(value, (keras.KerasTensor, bool, int, float, complex, str)):
        return False
    if not (isinstance(value, np.ndarray) or keras.ops.is_tensor(value)):
        return False
    try:
        return np.asarray(keras.ops.convert_to_numpy(value)).ndim >= 1
    except Exception:  # noqa: BLE001 - a tensor being traced (a jax tracer, a graph tensor) has no value
        return False

class FlattenRule(LayerRule):
    """``Flatten``: channel ``c`` of a ``(..., C)`` map becomes the features ``c, C + c, ...``."""

    kind = Kind.FLATTEN
    constants = "identity"

    def classify(self, layer):
        kind, reason = super().classify(layer)
        if reason is None and getattr(layer, "data_format", "channels_last") == "channels_first":
            try:
                rank = len(layer.input.shape)
            except Exception:  # noqa: BLE001 - unknown rank
                rank = 2
            if rank > 2:
                return Kind.OTHER, "a channels_first Flatten"
        return kind, reason


class GlobalPoolRule(LayerRule):
    """Global pooling: channel ``c`` of the map becomes feature ``c``."""

    kind = Kind.GLOBAL_POOL
    constants = "identity"

    def variant(self, layer):
        if getattr(layer, "data_format", "channels_last") == "channels_first":
            return _CHANNELS_FIRST_POOL
        return self


class ChannelsFirstPoolRule(LayerRule):
    """Global pooling with ``data_format="channels_first"`` of a channels-last tensor: it pools the channels.

    keras.io's timeseries Transformer ends its encoder so: on ``(batch,
    steps, channels)`` the mean over the last axis, one value per step. It
    reads every channel (each one enters every output, so all stay), and its
    outputs are the input's positions, which no layer makes: new units that
    all stay too. What follows (a Dense head) reads them as features.
    """

    kind = Kind.WHOLE
    constants = None
    #: It holds attention heads, which stay with it (said by ``add_group_sparsity``).
    holds_heads = False

    def refusal(self, layer):
        if getattr(layer, "keepdims", False):
            return "a global pooling with data_format='channels_first' and keepdims=True"
        return None

    def new_units(self, layer, flat):
        """``(units, None)``: how many units it makes, one per position of its input; ``(None, reason)``."""
        try:
            shape = tuple(layer.input.shape[1:])
        except Exception:  # noqa: BLE001 - an input of unknown shape
            shape = ()
        if flat or not shape or shape[0] is None:
            return None, ("a channels-first pooling of a flattened map, of the input's elements or of a map whose "
                          "first axis has a variable size")
        return int(shape[0]), None


class WholeRule(LayerRule):
    """A layer kept whole: it reads every channel of its input and makes new units, all of which stay.

    For a layer with weights and math of its own that the graph cannot see
    into (KerasHub's ``ViTPatchingAndEmbedding``: a patch convolution, a class
    token and position embeddings added): what it reads stays, what it makes
    stays, and surgery copies it with its weights. The layers around it are
    pruned as anywhere else. Its own weights take no group penalty and are not
    counted in the report's parameters and FLOPs (as a normalization's).
    """

    kind = Kind.WHOLE
    constants = None

    def new_units(self, layer, flat):
        """``(units, None)``: the size of its output's last axis; ``(None, reason)``."""
        try:  # the first call's output: a layer's width is the same at every call
            width = layer.output.shape[-1]
        except Exception:  # noqa: BLE001 - several outputs, or never called
            width = None
        if width is None:
            return None, "a layer kept whole with several outputs, or whose output's last axis has no known size"
        return int(width), None

class WholeAttentionRule(WholeRule):
    """An attention layer of its own class kept whole, every head with it (KerasHub's Bloom and GPT-NeoX attention:
    ALiBi or partial rotary positions, fused projections the graph does not read as heads): what it reads and makes
    stays, it is copied with its weights, and its ``attention_mask`` is a side tensor (computed again in the pruned
    model, or held by a block traced at fixed sizes, which is built again as itself). The layers around it (a
    decoder's feed-forward neurons) are pruned."""

    side_arguments = ("attention_mask",)
    holds_heads = True

    def call(self, layer, x, options=None):
        options = dict(options or {})
        if options.get("attention_mask") is None:
            # Called alone, without the mask its decoder computed (a block traced at probe sizes is then built again
            # as itself, in place of these calls): its class needs a mask, so every key is given.
            options["attention_mask"] = keras.ops.ones_like(keras.ops.einsum("btd,bsd->bts", x, x), dtype="bool")
        # GPT-NeoX's returns (outputs, cache) and its cache is None without one: the node holds the outputs
        return without_none(self._called(layer, (x,), options))

    def _called(self, layer, args, kwargs):
        return call_without_none(layer, type(layer).__call__, args, kwargs)


class ShapeListAttentionRule(WholeAttentionRule):
    """KerasHub SmolLM3's attention kept whole (as :class:`WholeAttentionRule`; grouped-query heads whose size is
    the width over their number, projections of its own). Its ``build`` and its output shapes expect a list of
    input shapes, the hidden states' first (KerasHub 0.32): a new copy is built from that list, and it is called
    with Keras's output shapes (:func:`~.base.call_with_keras_shapes`)."""

    def call(self, layer, x, options=None):
        if not layer.built:
            layer.build([tuple(x.shape)])
        return super().call(layer, x, options)

    def _called(self, layer, args, kwargs):
        return call_with_keras_shapes(layer, type(layer).__call__, args, kwargs)


class AlibiAttentionRule(WholeAttentionRule):
    """KerasHub Falcon's attention kept whole: as :class:`WholeAttentionRule`, and its ALiBi table (``alibi``, one
    bias per head and key position, computed by its decoder from the padding mask) a side tensor too."""

    side_arguments = ("alibi", "attention_mask")

    def call(self, layer, x, options=None):
        options = dict(options or {})
        if options.get("alibi") is None:  # called alone (see WholeAttentionRule.call): no bias, every key
            options["alibi"] = keras.ops.zeros_like(keras.ops.einsum("btd,bsd->bts", x, x))[:, None, :1, :]
        return super().call(layer, x, options)


class PositionBiasAttentionRule(WholeAttentionRule):
    """KerasHub T5's attention kept whole: as :class:`WholeAttentionRule`, with its ``mask`` and its
    ``position_bias`` side tensors. The first block of a stack computes the relative position bias (its own table,
    the mask folded in) and returns it beside its outputs; every later block of the stack is given it. That second
    output (``"<node>/@1"``) carries no units: the graph reads it as a side tensor of the later calls, and the pruned
    model takes it from the new first attention. A cross-attention is called on the encoder's output as
    ``key_value_states``: both streams it reads stay."""

    side_arguments = ("mask", "position_bias")
    side_outputs = True

    def new_units(self, layer, flat):
        return int(layer.hidden_dim), None

    def call(self, layer, x, options=None):
        options = dict(options or {})
        if isinstance(x, (list, tuple)):  # a cross-attention: the encoder's output as its keys and values
            x, options["key_value_states"] = x
        return without_none(call_without_none(layer, type(layer).__call__, (x,), options))


class MaskedLMHeadRule(WholeRule):
    """KerasHub's ``MaskedLMHead`` kept whole: it gathers the encoder's outputs at ``mask_positions`` (a side
    tensor: integer positions, no units), transforms them (a Dense and a LayerNormalization of its own) and gives
    one logit per token of the vocabulary from the token table it was given (tied). Every channel it reads stays;
    surgery copies it with its weights."""

    side_arguments = ("mask_positions",)

    def shared_sublayers(self, layer):
        return {"token_embedding": layer.token_embedding} if layer.token_embedding is not None else {}


class ReverseCall:
    """A ``ReversibleEmbedding`` called with ``reverse=True`` (a language model's logits from its token table), as
    a node of the graph: the layer's later call, kept whole (every channel it reads stays; its outputs, one per
    token of the vocabulary, are new units). Its weights are the layer's, counted at its forward call; its
    multiply-adds (``hidden * vocabulary`` per position) are not counted, as no layer kept whole is.

    Args:
        layer: the ``ReversibleEmbedding``.
    """

    trainable_weights = ()
    weights = ()

    def __init__(self, layer):
        self.layer = layer
        self.name = layer.name

    def __repr__(self):
        return f"ReverseCall({self.name!r})"


def is_reverse_call(layer, node):
    """``node`` (a serialized call of ``layer``) calls a ``ReversibleEmbedding`` with ``reverse=True``."""
    if type(layer).__name__ != "ReversibleEmbedding" or not isinstance(node, dict):
        return False
    args, kwargs = node.get("args", []), node.get("kwargs", {})
    return kwargs.get("reverse") is True or (len(args) > 1 and args[1] is True)


class ReverseCallRule(WholeRule):
    """A :class:`ReverseCall`: every channel it reads stays, and it makes one logit per token (the table's rows).
    Surgery calls the new embedding again with ``reverse=True`` (the same layer, so a tied table stays tied)."""

    def new_units(self, layer, flat):
        return int(layer.layer.input_dim), None

    def call(self, layer, x, options=None):
        """The new embedding on ``x`` with ``reverse=True`` (also where the model passed it by position)."""
        return layer(x, **dict(options or {}, reverse=True))


class PadRule(LayerRule):
    """``keras.ops.pad`` of the positions (not the batch or channels), with zeros or with ``-inf``.

    Zeros: a padded constant channel stays constant only when it is 0 (as
    ``ZeroPadding2D``). ``-inf`` (the border a max pool ignores, as ResNetV2
    in KerasHub pads before its first pool): a constant channel stays that
    constant wherever the result is finite, since only a max pool reads such
    a border without making it infinite.
    """

    def __init__(self, cls, description=None, value=0.0):
        super().__init__(cls, description)
        self.value = value

    def variant(self, layer):
        value = operation_call(layer).get("constant_values")
        return PadRule(self.cls, self.description, value=0.0 if value is None else value)

    def refusal(self, layer):
        widths = [tuple(w) for w in layer.pad_width]
        if layer.mode != "constant" or len(widths) < 3 or any(widths[i] != (0, 0) for i in (0, -1)):
            return (f"a keras.ops.pad with mode={layer.mode!r} and pad_width={widths} (only zero or -inf padding "
                    "of the positions, not of the batch or the channels, is supported)")
        if not isinstance(self.value, (int, float)) or (self.value != 0 and self.value != float("-inf")):
            return f"a keras.ops.pad with constant_values={self.value!r} (0 and -inf are supported)"
        return None

    @property
    def constants(self):
        return "identity" if self.value == float("-inf") else "zero_only"

    def slice(self, layer, kept):
        return layer.get_config(), []

    def call(self, layer, x, options=None):
        return layer(x, constant_values=None if self.value == 0 else self.value)


# ----------------------------------------------------------------------------- layers recognized by what they do

class PositionSliceRule(LayerRule):
    """``x[key]`` (a keras.ops ``GetItem``) that takes positions and keeps every channel (``x[:, 0, :]``, the first
    token that BERT's pooler reads): units pass as they are; surgery takes the same positions."""

    def __init__(self, cls, description=None, key=None):
        super().__init__(cls, description, constants="identity")
        self.key = key

    def variant(self, layer):
        try:
            key = layer._inbound_nodes[0].arguments.args[1]  # noqa: SLF001 - the key the model was built with
        except (AttributeError, IndexError):
            key = None
        return PositionSliceRule(self.cls, self.description, key=key)

    def refusal(self, layer):
        try:
            shape = tuple(layer._inbound_nodes[0].arguments.args[0].shape)  # noqa: SLF001
        except (AttributeError, IndexError):
            shape = ()
        if not positions_only(self.key, shape):
            return ("a slice x[...] that is not of the positions alone (it takes from the batch or the channels, or "
                    "the channels are a split of their own: x[..., a:b])")
        return None

    def slice(self, layer, kept):
        return layer.get_config(), []

    def call(self, layer, x, options=None):
        return layer(x, self.key)


def positions_only(key, shape):
    """``key`` indexes or slices the positions of a tensor of ``shape`` (batch axis included) and takes every
    entry of the batch axis and the last (channels): ``x[:, 0]``, ``x[:, 0, :]``, ``x[:, 1:4, ...]``."""
    # a model loaded from a file holds the key x[:, 0] as the list [slice, 0] (Keras writes tuples as lists)
    as_tuple = isinstance(key, tuple) or (isinstance(key, list) and any(isinstance(i, slice) or i is Ellipsis
                                                                          for i in key))
    items = list(key) if as_tuple else [key]
    if len(shape) < 3 or any(not (isinstance(i, (slice, int, np.integer)) or i is Ellipsis) for i in items):
        return False
    items = _every_axis(items, len(shape), pad=True)
    whole = slice(None)
    return (items is not None and len(items) == len(shape) and items[0] == whole and items[-1] == whole
            and any(i != whole for i in items[1:-1]))


def _known_shapes(layer):
    try:
        return tuple(layer.input.shape[1:]), tuple(layer.output.shape[1:])
    except Exception:  # noqa: BLE001 - no single input or output
        return None


def _reshape_refusal(layer):
    """A Reshape is a pass-through for units when it only adds or removes axes of size 1.

    ``(1, 1, C) -> (C,)`` (after ``GlobalAveragePooling2D(keepdims=True)``) or
    ``(C,) -> (1, 1, C)`` (before a 1x1 convolution): entry ``c`` of the
    last axis is the same unit before and after.
    """
    shapes = _known_shapes(layer)
    if shapes is None:
        return "a Reshape whose input or output shape is unknown"
    before, after = shapes
    if any(d is None for d in before + after):
        return f"a Reshape of {(None,) + before} to {(None,) + after} with axes of unknown size"
    if (not before or not after or before[-1] != after[-1]
            or math.prod(before[:-1]) != 1 or math.prod(after[:-1]) != 1):
        return (f"a Reshape of {(None,) + before} to {(None,) + after} (only a Reshape that adds or removes "
                "axes of size 1 and keeps the last axis, the units, is supported)")
    return None


def _reshape(layer, kept):
    """A Reshape of size-1 axes, to the kept units: the last entry of ``target_shape`` becomes ``len(kept)``."""
    config = layer.get_config()
    target = list(config["target_shape"])
    if target[-1] != -1:  # -1 is inferred: the kept units
        target[-1] = int(len(kept))
    config["target_shape"] = tuple(target)
    return config, []


_CHANNELS_FIRST_POOL = ChannelsFirstPoolRule(keras.layers.GlobalAveragePooling1D,
                                              "global pooling with data_format='channels_first' (every channel stays)")


def builtin_rules():
    """The rules of Keras's reshaping and pooling layers and of keras.ops' pad and position slices."""
    layers = keras.layers
    rules = [FlattenRule(layers.Flatten),
             # Adding or removing size-1 axes is a Flatten of a one-position map (or its inverse): units pass as
             # they are.
             FlattenRule(layers.Reshape, "Reshape (adding or removing axes of size 1)", slicer=_reshape,
                         refusal=_reshape_refusal)]
    rules += [GlobalPoolRule(getattr(layers, name))
              for name in ("GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D",
                           "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D")]
    x = keras.Input((2, 2, 1))
    pad = keras.Model(x, keras.ops.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])).operations[-1]
    item = keras.Model(x, x[:, 0]).operations[-1]
    return rules + [PadRule(type(pad), "keras.ops.pad (zeros or -inf, positions only)"),
                    PositionSliceRule(type(item), "x[:, i] and other slices of the positions alone (keras.ops)")]

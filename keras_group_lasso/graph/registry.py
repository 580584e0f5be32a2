"""One table of the layer classes that analysis and surgery understand: one rule class per layer kind.

Every layer class the package can see through has one :class:`LayerRule`
(matched by exact class: a subclass may compute anything). A rule knows its
layer's *kind* (how units flow through it), why a configuration is refused,
how a constant channel passes through it, and how surgery slices it; a
:class:`UnitsRule` (a layer that makes units) also knows its kernels, their
:class:`~keras_group_lasso.groups.GroupView`, which input unit reaches which
output unit, its multiply-adds and parameters. The graph
(:mod:`keras_group_lasso.graph.build`), the masks, the report, the penalties
and surgery ask the rule; nothing outside this module asks for a layer's
class. :func:`register_layer` adds a user's own layer (a per-channel layer by
its slicer, or any :class:`LayerRule` subclass instance).

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

import inspect
import math
import weakref

import keras
import numpy as np

from keras_group_lasso._validation import fail
from keras_group_lasso.groups import GroupView

__all__ = [
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
]

KINDS = ("units", "per_unit", "per_element", "flatten", "global_pool", "merge", "concat", "tail", "input",
         "constant")
CONSTANTS = ("call", "identity", "zero_only", None)

# Keras activations that act on each scalar on its own (softmax, log_softmax,
# sparsemax and glu mix units; a custom function is not trusted).
ELEMENTWISE_ACTIVATIONS = frozenset(
    {
        "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "sigmoid",
        "hard_sigmoid", "log_sigmoid", "sparse_sigmoid", "tanh", "hard_tanh", "tanh_shrink",
        "softplus", "softsign", "sparse_plus", "squareplus", "silu", "swish", "hard_silu",
        "hard_swish", "mish", "exponential", "hard_shrink", "soft_shrink",
    }
)
MIXES_UNITS = "a layer whose activation mixes units"
_UNSET = object()


def activation_is_elementwise(function):
    """``True`` for a Keras activation that acts on each scalar on its own."""
    try:
        name = keras.activations.serialize(function)
    except Exception:  # noqa: BLE001 - an unserializable function is simply unknown
        return False
    if isinstance(name, dict):  # a function registered for serialization by another package
        return name.get("config") in _ELEMENTWISE_REGISTERED
    return isinstance(name, str) and name in ELEMENTWISE_ACTIVATIONS


#: Elementwise activations other packages register for serialization (KerasHub's BERT uses the first).
_ELEMENTWISE_REGISTERED = frozenset({"keras_hub>gelu_approximate"})


def _numpy(variable):
    return np.asarray(keras.ops.convert_to_numpy(getattr(variable, "value", variable)))


def _call_arguments(layer):
    try:
        return inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return {}


def _dtype(layer):
    """The dtype ``layer`` reads in the model: its input's, else its compute dtype (a float64 model stays float64)."""
    try:
        dtype = keras.backend.standardize_dtype(layer.input.dtype)
    except Exception:  # noqa: BLE001 - a layer with no single input: its policy says
        dtype = getattr(layer, "compute_dtype", None) or keras.config.floatx()
    return dtype if "float" in str(dtype) else keras.config.floatx()


def call_on_constants(layer, values):
    """``layer`` (inference mode) on a one-position tensor holding ``values`` on its last axis.

    In the dtype the layer reads in the model, so that a constant folded from a
    float64 model is as exact as the model itself.
    """
    try:
        rank = len(layer.input.shape)
    except Exception:  # noqa: BLE001 - a layer seen on a flat vector
        rank = 2
    x = np.zeros((1,) * (rank - 1) + (values.size,), dtype=_dtype(layer))
    x.reshape(-1)[:] = values
    kwargs = {"training": False} if "training" in _call_arguments(layer) else {}
    out = layer(keras.ops.convert_to_tensor(x), **kwargs)
    return np.asarray(keras.ops.convert_to_numpy(out), dtype=np.float64).reshape(-1)[-values.size:]


def call_activation(layer, values):
    """``layer``'s own activation on pre-activations ``values`` (NaN stays NaN), in its compute dtype."""
    activation = getattr(layer, "activation", None)
    if activation is None:
        return values
    finite = np.where(np.isnan(values), 0.0, values)
    dtype = getattr(layer, "compute_dtype", None) or keras.config.floatx()
    out = np.asarray(keras.ops.convert_to_numpy(activation(keras.ops.convert_to_tensor(finite[None, :], dtype=dtype))),
                     dtype=np.float64)[0]
    return np.where(np.isnan(values), np.nan, out)


def threshold_array(values, threshold):
    """``values`` with every ``|w| <= threshold`` set to an exact 0 (a new array)."""
    values = np.asarray(values)
    return np.where(np.abs(values) <= threshold, np.zeros((), values.dtype), values)


# ----------------------------------------------------------------------------- the rule classes


def layer_config(layer):
    """``layer.get_config()``; for a layer whose constructor takes nothing of its own (``Identity``) but that was
    made with a value its automatic config cannot hold (a dtype policy object, as KerasHub passes), the config
    every layer has: its name, whether it trains, its dtype policy."""
    try:
        return layer.get_config()
    except NotImplementedError:
        own = set(inspect.signature(type(layer).__init__).parameters) - {"self", "name", "dtype", "trainable", "kwargs"}
        if own or not isinstance(layer, keras.layers.Layer):
            raise
        return {"name": layer.name, "trainable": layer.trainable,
                "dtype": keras.dtype_policies.serialize(layer.dtype_policy)}


class LayerRule:
    """How the package treats one layer class: the base of every rule, a per-unit layer by default.

    Args:
        cls: the layer class (matched exactly: a subclass may do anything).
        description: a few words for the list of supported layers (default: the class name).
        slicer: ``(layer, kept) -> (config, weights)`` for a layer with
            per-unit weights or config (``kept``: the channel indices that
            stay); ``None`` when it has none (its config is copied).
        constants: how a constant channel passes (see the module docstring);
            default: the class's.
        refusal: ``layer -> reason or None``, for configurations of the class
            that cannot be handled exactly (``None``: all are fine).

    Subclasses override the methods below; the attributes say what the
    layer is to the rest of the package.
    """

    kind = "per_unit"
    constants = "call"
    #: ``apply_threshold`` and surgery threshold its weights (its kernels and bias).
    thresholded = False
    #: The identity at inference (Dropout, noise): serving formats leave it out.
    inference_identity = False
    #: A BatchNormalization on the last axis: ``prune_model(fold_batchnorm=True)`` may merge it into a units layer.
    batchnorm = False
    #: Keyword arguments that take a tensor carrying no units (an attention mask): not read as units, and
    #: computed again from the model's inputs in the pruned model (``ModelGraph.side_tensors``).
    side_arguments = ()

    def __init__(self, cls, description=None, *, slicer=None, constants=_UNSET, refusal=None):
        self.cls = cls
        self.description = description or cls.__name__
        self.slicer = slicer
        if constants is not _UNSET:
            self.constants = constants
        self._refusal = refusal

    def __repr__(self):
        return f"{type(self).__name__}({self.cls.__name__})"

    def refusal(self, layer):
        """Why this configuration of the layer cannot be handled exactly, or ``None``."""
        return self._refusal(layer) if self._refusal is not None else None

    def variant(self, layer):
        """The rule of this configuration of the layer: itself, or another rule of the same class (a grouped
        convolution's)."""
        return self

    def classify(self, layer):
        """``(kind, reason)``: the graph kind of ``layer`` (``"other"`` with a reason when refused)."""
        reason = self.refusal(layer)
        return ("other", reason) if reason else (self.kind, None)

    @property
    def slices(self):
        """It has weights or config per unit, so surgery slices it (not a plain copy)."""
        return self.slicer is not None

    def slice(self, layer, kept):
        """``(config, weights)`` of ``layer`` restricted to the units ``kept`` (int indices)."""
        if self.slicer is None:
            return layer_config(layer), layer.get_weights()
        return self.slicer(layer, np.asarray(kept, dtype=int))

    def pass_constants(self, layer, values, threshold=0.0):
        """Constants ``values`` (NaN: not constant) after ``layer``; NaN where a constant stops being one."""
        how = self.constants
        if how == "identity":
            return values.copy()
        if how == "zero_only":
            return np.where(values == 0, 0.0, np.nan)
        if how is None:
            return np.full_like(values, np.nan)
        if callable(how):
            return np.asarray(how(layer, values, threshold), np.float64)
        if np.all(np.isnan(values)):
            return values.copy()
        out = call_on_constants(layer, np.where(np.isnan(values), 0.0, values))
        return np.where(np.isnan(values), np.nan, out)

    def thresholded_variables(self, layer):
        """The variables ``apply_threshold`` thresholds (none for most layers)."""
        return []

    def checked_weights(self, layer):
        """``{label: numpy}`` of the weights whose finiteness every report checks (thresholded layers)."""
        return {}

    def set_weights(self, layer, weights):
        """Put ``weights`` into a freshly built ``layer``."""
        layer.set_weights(weights)

    def call(self, layer, x, options=None):
        """Call ``layer`` on ``x`` as the model did (``options``: the call's keyword arguments that are not tensors)."""
        return layer(x, **(options or {}))

    def unit_groups(self, layer):
        """Index arrays of channels that are kept or removed together (a GroupNormalization's groups); ``[]``."""
        return []

    def serving_config(self, layer):
        """The config a serving export builds the layer from instead, or ``None`` (the layer as it is)."""
        return None


class InputRule(LayerRule):
    """The model's input."""

    kind = "input"


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

    kind = "constant"
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

    kind = "slice"
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


class ActivationRule(LayerRule):
    """``Activation``: per unit when elementwise; a softmax after the output layer is a tail."""

    def refusal(self, layer):
        return None if activation_is_elementwise(layer.activation) else "an activation that mixes units"

    def classify(self, layer):
        reason = self.refusal(layer)
        return ("activation_tail", reason) if reason else (self.kind, None)


class DropoutRule(LayerRule):
    """Dropout and noise layers: the identity at inference."""

    constants = "identity"
    inference_identity = True


class BatchNormRule(LayerRule):
    """BatchNormalization on the last axis: gamma, beta, moving mean and variance sliced per channel."""

    batchnorm = True


class DepthwiseRule(LayerRule):
    """DepthwiseConv with ``depth_multiplier=1``: one kernel slice and one bias per channel.

    A constant channel ``c`` stays constant: ``c * sum_p K[p, c] + b`` without
    padding; through zero padding only a pre-activation equal to the bias
    everywhere (an input constant of 0) passes.
    """

    thresholded = True

    def thresholded_variables(self, layer):
        return [layer.kernel] + ([layer.bias] if getattr(layer, "use_bias", False) and layer.bias is not None else [])

    def checked_weights(self, layer):
        labels = ("kernel", "bias")
        return {labels[i]: _numpy(v) for i, v in enumerate(self.thresholded_variables(layer))}

    def pass_constants(self, layer, values, threshold=0.0):
        return _depthwise_constants(layer, values, threshold)


def _depthwise_constants(layer, values, threshold):
    """One kernel slice per channel (``(k..., C, 1)`` or ``(k..., 1, C)``) on constant channels ``values``."""
    kernel = threshold_array(_numpy(layer.kernel), threshold)
    weights = layer.get_weights()
    bias = threshold_array(weights[1], threshold).astype(np.float64) if len(weights) > 1 else 0.0
    total = kernel.reshape(-1, values.size).astype(np.float64).sum(axis=0)
    out = values * total + bias
    if pads(layer):
        out = np.where(values == 0, bias + np.zeros_like(values), np.nan)
    out = np.where(np.isnan(values), np.nan, out)
    return call_activation(layer, out)


class PerElementRule(LayerRule):
    """Input preprocessing with one value per element (Normalization, Rescaling)."""

    kind = "per_element"

    def between_units(self, layer):
        """It may stand between units layers: one value per element of a flat vector."""
        try:
            return len(layer.input.shape) == 2
        except Exception:  # noqa: BLE001 - unknown rank
            return False


class NormalizationRule(PerElementRule):
    """``Normalization``: its mean and variance sliced to the kept elements."""

    def refusal(self, layer):
        return "a Normalization that is not built" if getattr(layer, "mean", None) is None else None

    def set_weights(self, layer, weights):
        # set_weights leaves Normalization's cached mean and variance at their initial
        # values; loading its variables (the saving API) also recomputes them.
        layer.load_own_variables({str(i): w for i, w in enumerate(weights)})

    def between_units(self, layer):
        """On a flat vector, or with one mean and variance per channel (``axis=-1``) on a map."""
        return super().between_units(layer) or _per_channel(layer.mean)

    def refresh(self, layer):
        """Recompute the cached statistics of a built layer from its variables (after ``set_weights``)."""
        if layer.weights:
            self.set_weights(layer, layer.get_weights())


class RescalingRule(PerElementRule):
    """``Rescaling``: scalars anywhere; one value per channel anywhere; one per element before a Flatten."""

    def refusal(self, layer):
        per_element = np.ndim(layer.scale) > 0 or np.ndim(layer.offset) > 0
        if per_element and keras.config.image_data_format() == "channels_first":
            return "a Rescaling with a non-scalar scale or offset under channels_first"
        return None

    def between_units(self, layer):
        if all(_per_channel(v) for v in (layer.scale, layer.offset)):
            return True
        return super().between_units(layer)


def _per_channel(values):
    # Broadcast against (batch, ..., channels), a value of shape (), (C,) or (1, ..., 1, C) is one per channel.
    shape = np.shape(keras.ops.convert_to_numpy(values)) if not isinstance(values, (int, float)) else ()
    return all(d == 1 for d in shape[:-1])


class FlattenRule(LayerRule):
    """``Flatten``: channel ``c`` of a ``(..., C)`` map becomes the features ``c, C + c, ...``."""

    kind = "flatten"
    constants = "identity"

    def classify(self, layer):
        kind, reason = super().classify(layer)
        if reason is None and getattr(layer, "data_format", "channels_last") == "channels_first":
            try:
                rank = len(layer.input.shape)
            except Exception:  # noqa: BLE001 - unknown rank
                rank = 2
            if rank > 2:
                return "other", "a channels_first Flatten"
        return kind, reason


class GlobalPoolRule(LayerRule):
    """Global pooling: channel ``c`` of the map becomes feature ``c``."""

    kind = "global_pool"
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

    kind = "mix"
    constants = None

    def refusal(self, layer):
        if getattr(layer, "keepdims", False):
            return "a global pooling with data_format='channels_first' and keepdims=True"
        return None


class TailRule(LayerRule):
    """A layer that mixes units (softmax): every unit it reads is kept."""

    kind = "tail"
    constants = None


class MixingNormalizationRule(TailRule):
    """Layer, RMS, group and unit normalization over the channels: every channel they normalize is kept.

    Their statistics are taken over the channels (all of them, or each group
    of them), so removing a channel, even an all-zero one, changes every
    other channel's output: the units they read all stay (and so does a
    residual stream they normalize). Units that no normalization reads
    (ConvNeXt's expansion units between its two pointwise Dense layers) are
    pruned as anywhere else.
    """

    def refusal(self, layer):
        axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        try:
            rank = len(layer.input.shape)
        except Exception:  # noqa: BLE001 - unknown rank
            return "a normalization whose input is unknown"
        if (rank - 1) not in {int(a) % rank for a in axis}:
            return "a normalization that does not normalize over the channels (last axis)"
        return None

    def slice(self, layer, kept):
        if np.asarray(kept).size != self._channels(layer):  # pragma: no cover - the masks keep them all
            raise RuntimeError(f"the channels that '{layer.name}' normalizes were to be sliced; please report this")
        return layer.get_config(), layer.get_weights()

    @staticmethod
    def _channels(layer):
        return int(layer.input.shape[-1])


class GroupNormRule(LayerRule):
    """``GroupNormalization`` (last axis): a group of channels stays or goes whole.

    Each group's mean and variance are its own, so when every channel of a
    group goes, the other groups' outputs do not change: the group leaves and
    ``groups`` shrinks with it. A channel of a kept group stays, even a
    constant one (removing it would change its group's statistics).
    """

    constants = None

    def refusal(self, layer):
        axis = layer.axis if isinstance(layer.axis, int) else None
        try:
            rank = len(layer.input.shape)
        except Exception:  # noqa: BLE001 - unknown rank
            return "a GroupNormalization whose input is unknown"
        if axis is None or axis % rank != rank - 1:
            return "a GroupNormalization over an axis other than the channels (last axis)"
        return None

    @property
    def slices(self):
        return True

    def _size(self, layer):
        channels = int(layer.input.shape[-1])
        groups = channels if layer.groups == -1 else int(layer.groups)
        return channels, groups, channels // groups

    def unit_groups(self, layer):
        """The channel indices of each group: kept or removed together."""
        channels, groups, size = self._size(layer)
        return [np.arange(g * size, (g + 1) * size) for g in range(groups)] if size > 1 else []

    def slice(self, layer, kept):
        kept = np.asarray(kept, dtype=int)
        _, groups, size = self._size(layer)
        if kept.size % size or np.any(np.bincount(kept // size, minlength=groups)[np.unique(kept // size)] != size):
            raise RuntimeError(  # pragma: no cover - the masks keep whole groups
                f"the channels of '{layer.name}' were to be cut inside a group; please report this")
        config = dict(layer.get_config(), groups=int(kept.size // size) if layer.groups != -1 else -1)
        return config, [w[kept] for w in layer.get_weights()]


_MERGE_OPS = {
    "Add": lambda values: np.sum(values, axis=0),
    "Subtract": lambda values: values[0] - values[1],
    "Average": lambda values: np.mean(values, axis=0),
    "Maximum": lambda values: np.max(values, axis=0),
    "Minimum": lambda values: np.min(values, axis=0),
    "Multiply": lambda values: np.prod(values, axis=0),
}


class MergeRule(LayerRule):
    """A merge of tensors element by element: channel ``c`` of every operand is one unit.

    Operands have one shape, or some broadcast over the others' positions (a
    squeeze-and-excite gate ``(1, 1, C)`` times a map ``(H, W, C)``): channel
    ``c`` of the gate scales channel ``c`` of the map. A gate channel that is
    a constant (its convolution is all zero: ``sigmoid(b)``) scales its
    channel, it does not remove it; it goes only with the channel.
    """

    kind = "merge"
    constants = None

    def __init__(self, cls, operation, description=None, **kwargs):
        super().__init__(cls, description, **kwargs)
        self.operation = operation

    def refusal(self, layer):
        return _merge_refusal(layer)

    def merge_constants(self, layer, operands):
        """The constants after the merge of ``operands`` (one array per operand; NaN: not constant)."""
        values = np.stack([np.asarray(v, np.float64) for v in operands])
        with np.errstate(invalid="ignore", over="ignore"):
            return _MERGE_OPS[self.operation](values)  # NaN in any operand stays NaN

    def fold(self, layer, operands):
        """``(dropped, scale, offset)`` when the merge can drop its constant operands, else ``None``.

        ``operands``: the constant of each operand's channels (NaN: it varies).
        When some operands are constant on every channel and at least one varies,
        the merge equals ``scale * merge(varying operands) + offset`` per channel
        (the varying ones merged by the same layer; one left passes as it is):
        ``Add``: ``1``, ``sum c``; ``Subtract``: ``1``, ``-c`` (or ``-1``, ``c`` when
        the first operand is the constant); ``Average`` of ``n`` with ``r``
        varying: ``r / n``, ``sum c / n``; ``Multiply``: ``prod c``, ``0``.
        ``Maximum`` / ``Minimum`` are not affine: ``None``. ``dropped``: one bool
        per operand; ``scale`` and ``offset`` are float64 per channel.
        """
        if self.operation in ("Maximum", "Minimum"):
            return None
        values = [np.asarray(v, np.float64) for v in operands]
        dropped = tuple(bool(np.isfinite(v).all()) for v in values)
        if not any(dropped) or all(dropped):
            return None
        smaller = broadcasts(layer)
        if smaller and all(small for small, d in zip(smaller, dropped) if not d):
            return None  # only a gate would stay: the output would lose the map's positions
        constants = [v for v, d in zip(values, dropped) if d]
        ones, zeros = np.ones_like(values[0]), np.zeros_like(values[0])
        if self.operation == "Add":
            return dropped, ones, np.sum(constants, axis=0)
        if self.operation == "Subtract":
            return (dropped, ones, -values[1]) if dropped[1] else (dropped, -ones, values[0])
        if self.operation == "Average":
            n = len(values)
            return dropped, ones * (n - len(constants)) / n, np.sum(constants, axis=0) / n
        return dropped, np.prod(constants, axis=0), zeros


class ConcatRule(LayerRule):
    """Concatenate on the last axis: the output's channels are the operands' channels, one after the other."""

    kind = "concat"
    constants = None

    def refusal(self, layer):
        return _concat_refusal(layer)


# ----------------------------------------------------------------------------- layers that make units


def _adapted(layer, noun="layer"):
    """Why a LoRA-enabled or quantized layer is refused (its kernel is not the weights it computes with)."""
    if getattr(layer, "lora_enabled", False):
        return f"a LoRA-enabled {noun}"
    if getattr(layer, "quantization_mode", None):
        return f"a quantized {noun}"
    return None


def pads(layer):
    """The layer pads its input with zeros (a constant is not constant at the border).

    A window of size 1 on every axis (a 1x1 convolution) pads nothing,
    whatever its ``padding`` and strides: ``"same"`` pads ``(ceil(n / s) - 1)
    * s + 1 - n <= 0`` entries, ``"causal"`` ``dilation * (1 - 1) = 0``.
    """
    if getattr(layer, "padding", "valid") not in ("same", "causal"):
        return False
    window = getattr(layer, "kernel_size", None)
    return not (window and all(int(k) == 1 for k in window))


class UnitsRule(LayerRule):
    """A layer that makes units: one kernel ``(..., in, out)`` (Dense, Conv1D/2D/3D) and an optional bias.

    The group of input unit ``i`` is the slice ``[..., i, :]`` of the kernel
    (:attr:`view`). Subclasses change the kernels (SeparableConv) or the axis
    of the groups (transposed convolutions).
    """

    kind = "units"
    thresholded = True
    #: ``prune_model(fold_batchnorm=True)`` may merge a BatchNormalization that follows it.
    merges_batchnorm = True
    #: A 0/1 selection Dense may go right before it to pick the kept input features.
    selects_rows = False
    #: Where the groups of its kernels lie.
    view = GroupView()
    #: A budget's ``round_to`` may re-initialize its columns: one kernel ``(..., in, out)``.
    rounds = True
    #: Its units stand for the input it reads (an Embedding's dimensions): a layer reading them has input groups.
    represents_input = False
    #: A unit whose incoming weights are all zero outputs a constant (not so for a recurrent layer).
    constant_outputs = True
    #: Surgery checks each copy it makes on random inputs (a layer declared with ``register_layer``).
    checks_copies = False

    def refusal(self, layer):
        reason = _adapted(layer)
        if reason is None and not activation_is_elementwise(layer.activation):
            return MIXES_UNITS
        return reason

    def classify(self, layer):
        reason = self.refusal(layer)
        if reason == MIXES_UNITS:
            return "units_mixing", reason  # fine as the output layer
        return ("other", reason) if reason else (self.kind, None)

    def mixes_units(self, layer):
        """Its activation mixes the units it makes (softmax): it may only be the output layer."""
        return not activation_is_elementwise(layer.activation)

    def kernels(self, layer):
        """``{role: variable}`` of its kernels: ``{"kernel": ...}`` (a SeparableConv: ``"kernel"``, ``"pointwise"``)."""
        return {"kernel": layer.kernel}

    def regularizer_attributes(self, layer):
        """The ``*_regularizer`` attributes that carry its group penalties, one per kernel."""
        return ("kernel_regularizer",)

    def own_unit_attributes(self, layer):
        """The ``*_regularizer`` attributes whose groups are the units the layer makes (a recurrent kernel's rows)."""
        return ()

    def penalty_layers(self, layer):
        """The layers that hold its penalties (a ``Bidirectional``: its two directions)."""
        return (layer,)

    def recurrence(self, layer, weights):
        """bool ``(out_units, out_units)``: unit ``j`` feeds unit ``k`` inside the layer; ``None``: no recurrence."""
        return None

    def paired_halves(self, layer):
        """The first and second half of its units must keep as many units each (a ``Bidirectional``)."""
        return False

    def view_of(self, layer):
        """The :class:`~keras_group_lasso.groups.GroupView` of its kernels (:attr:`view`, or one for this layer)."""
        return self.view

    def tied_units(self, layer):
        """``[(input unit indices, unit indices), ...]``: sets of its inputs and units that stay or go as one
        (a grouped convolution's groups); ``[]``."""
        return []

    def group_norms(self, layer, in_units):
        """The L2 norm of each input unit's group in its kernel, ``(in_units,)``."""
        return self.view_of(layer).norms(self.weights(layer)["kernel"], in_units)

    def group_size(self, layer, positions, out_units):
        """The weights in one input unit's group: ``positions * out_units`` (its row at every position)."""
        return positions * out_units

    def head_kernel(self, layer):
        """The variable whose groups are inner units of the layer (an attention layer's heads), or ``None``."""
        return None

    def inner_units(self, layer, weights, kept_out):
        """``(alive, total)`` of its inner units (an attention layer's heads), or ``None``."""
        return None

    def kept_cost(self, layer, positions, kept_in, kept_out, output_shape, has_bias, weights, kept_mask):
        """``(FLOPs, params)`` reading ``kept_in`` and making ``kept_out`` units (``weights``: thresholded)."""
        return (self.flops(layer, positions, kept_in, kept_out, output_shape),
                self.params(layer, positions, kept_in, kept_out, has_bias))

    def bias(self, layer):
        return layer.bias if getattr(layer, "use_bias", False) and layer.bias is not None else None

    def weights(self, layer, read=_numpy):
        """Its weights by role, numpy: ``{"kernel", ["pointwise",] "bias"}`` (``bias`` ``None`` without one).

        ``read(variable)`` gives a variable's value (by default the one it holds; the budget reads candidate
        values this way without writing them into the model)."""
        out = {role: read(variable) for role, variable in self.kernels(layer).items()}
        bias = self.bias(layer)
        out["bias"] = None if bias is None else read(bias)
        return out

    def thresholded_variables(self, layer):
        bias = self.bias(layer)
        return list(self.kernels(layer).values()) + ([bias] if bias is not None else [])

    def kernel_shape(self, layer):
        """``(kernel rows per input unit (its window), input units, output units)`` from the kernel's shape."""
        shape = tuple(int(d) for d in layer.kernel.shape)
        return math.prod(shape[:-2]), shape[-2], shape[-1]

    def out_units(self, layer):
        return self.kernel_shape(layer)[2]

    def unit_shape(self, layer, channels, positions):
        """``(in_units, positions)`` when it reads ``channels`` ids laid out ``positions`` times, else ``None``."""
        window, kernel_in, _ = self.kernel_shape(layer)
        if positions != 1 or kernel_in != channels:
            return None
        return channels, window

    def units_view(self, weights, in_units, layer=None):
        """The kernel (numpy, from :meth:`weights`) as ``(positions, in_units, out_units)`` (``layer``: the one
        whose :meth:`view_of` to use)."""
        view = self.view if layer is None else self.view_of(layer)
        return view.units(weights["kernel"], in_units)

    def connections(self, layer, weights, in_units):
        """bool ``(in_units, out_units)``: input unit ``i`` reaches output unit ``j`` through a non-zero weight."""
        return np.any(self.units_view(weights, in_units, layer) != 0, axis=0)

    def constant_contribution(self, layer, weights, in_units, values):
        """What constant input units add to every output unit's pre-activation, ``(out_units,)`` float64.

        ``values[i]`` is the constant of input unit ``i`` (0 for the others).
        Every output position sees every constant through the whole kernel:
        ``sum_i values[i] * sum_p K[p, i, :]`` (a layer that pads only ever
        gets constants of 0 here).
        """
        values = np.asarray(values, np.float64)
        if not values.any():  # the usual case: no constant input (skips a float64 copy of the kernel)
            return np.zeros(self.out_units(layer))
        return values @ self.units_view(weights, in_units, layer).astype(np.float64).sum(axis=0)

    def pads(self, layer):
        """A constant input is not constant at every output position (only a constant 0 passes)."""
        return pads(layer)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        """``(config, weights)`` keeping input units ``kept_in`` and output units ``kept_out``."""
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer.get_config()
        kernel = weights["kernel"]
        view = self.units_view(weights, in_units)[:, kept_in][:, :, kept_out]
        if kernel.ndim == 2:  # Dense, maybe after Flatten: rows p * C + c, p-major
            new_kernel = view.reshape(-1, kept_out.size)
        else:
            new_kernel = view.reshape(kernel.shape[:-2] + (kept_in.size, kept_out.size))
        config[self.width_key] = int(kept_out.size)
        return config, self._with_bias([np.ascontiguousarray(new_kernel)], weights, kept_out)

    width_key = "filters"

    def width_step(self, layer):
        """``None``: its input and output widths vary apart; else ``k``: it makes a multiple of ``k`` units and
        reads as many inputs as they need (a grouped convolution: ``k`` filters per group)."""
        return None

    def slice_widths(self, layer, weights, in_units, width_in, width_out):
        """``(config, weights, inputs read)`` of a copy making its first ``width_out`` units and reading its first
        ``width_in`` input units (with a :meth:`width_step`, those its units need): a latency table times it."""
        config, new = self.slice_units(layer, weights, in_units, np.arange(width_in), np.arange(width_out))
        return config, new, int(width_in)

    def _with_bias(self, new, weights, kept_out):
        if weights["bias"] is not None:
            new.append(np.ascontiguousarray(weights["bias"][kept_out]))
        return new

    def flops(self, layer, positions, in_units, out_units, output_shape):
        """Multiply-adds per sample reading ``in_units`` and making ``out_units``.

        ``positions`` is the first axis of :meth:`units_view` (kernel window,
        or the positions of a flattened map for a Dense layer): ``output
        positions * positions * in * out``. An output axis of unknown size
        (``None``, see :func:`variable_axes`) counts as 1: the result is then
        the cost per position of those axes.
        """
        return _spatial(output_shape) * positions * in_units * out_units

    def params(self, layer, positions, in_units, out_units, has_bias):
        """Parameters (kernels and bias) reading ``in_units`` and making ``out_units``."""
        return positions * in_units * out_units + (out_units if has_bias else 0)


def _spatial(shape):
    return math.prod(int(d) for d in shape[1:-1] if d is not None) if len(shape) > 2 else 1


class DenseRule(UnitsRule):
    """``Dense``: a kernel ``(in, out)``; after ``Flatten`` of a ``(..., C)`` map its rows are ``p * C + c``."""

    selects_rows = True
    width_key = "units"

    def refusal(self, layer):
        return _adapted(layer, "Dense layer") or super().refusal(layer)

    def unit_shape(self, layer, channels, positions):
        _, kernel_in, _ = self.kernel_shape(layer)
        if kernel_in != channels * positions:
            return None
        return channels, positions


class KernelUnitsRule(UnitsRule):
    """A layer of your own that makes units from kernels ``(..., inputs, units)``: what
    ``register_layer(cls, "units", kernels=..., width=...)`` puts in the table.

    The rule is exact for a layer that computes this way: each kernel ``K`` (a
    Dense's ``(inputs, units)``, a convolution's ``(window..., inputs,
    units)``) enters its call only as a contraction of the input's channels (its
    last axis) with ``K``'s ``inputs`` axis (``x @ K``, ``conv(x, K)``), and unit
    ``j`` of its output reads the input only through ``K[..., j]`` of every
    kernel and entry ``j`` of each of its ``biases`` (whatever elementwise math
    follows: a gate, an activation). Its config's ``width`` entry is its number
    of units, and every weight it holds is one of those kernels or biases. Input
    unit ``i``'s group is ``K[..., i, :]`` of every kernel; each kernel takes the
    group penalty through its regularizer argument (a config key). A unit it
    makes is never taken for a constant (its math is the layer's own): a unit
    goes when nothing reads it, an input unit when its rows of every kernel are
    zero. Surgery checks each copy it makes against the layer on random inputs
    (:attr:`checks_copies`).

    Args:
        cls: the layer class.
        kernels: ``{attribute: regularizer config key}`` of its kernels, the
            first one the layer's main kernel.
        width: the config key of its number of units.
        biases: attributes of its weights with one entry per unit.
        description: words for the list of supported layers.
        refusal: optional ``layer -> reason or None``.
    """

    selects_rows = True  # x @ K on the last axis: a selection of its input rows may go before it
    #: Surgery checks each copy it makes against the layer (the math is the user's, declared, not known).
    checks_copies = True
    merges_batchnorm = False
    rounds = False
    constant_outputs = False

    def __init__(self, cls, kernels, width, biases=(), description=None, refusal=None):
        super().__init__(cls, description, refusal=refusal)
        self.kernel_keys = dict(kernels)
        self.width_key = width
        self.biases = tuple(biases)
        attributes = list(self.kernel_keys)
        self.roles = {"kernel": attributes[0], **{attribute: attribute for attribute in attributes[1:]}}

    def refusal(self, layer):
        config = layer_config(layer)
        missing = [key for key in (self.width_key, *self.kernel_keys.values()) if key not in config]
        if missing:
            return (f"a layer whose config has no {', '.join(repr(key) for key in missing)} (the width and the "
                    "kernels' regularizer arguments named in register_layer)")
        found = {attribute: getattr(layer, attribute, None) for attribute in (*self.kernel_keys, *self.biases)}
        absent = [attribute for attribute, variable in found.items() if not isinstance(variable, keras.Variable)]
        if absent:
            return f"a layer without the weights {', '.join(repr(a) for a in absent)} named in register_layer"
        shapes = {tuple(int(d) for d in found[attribute].shape) for attribute in self.kernel_keys}
        if len(shapes) != 1 or len(next(iter(shapes))) < 2:
            return f"a layer whose kernels are not all of one shape (..., inputs, units): {sorted(shapes)}"
        units = next(iter(shapes))[-1]
        if config[self.width_key] != units:
            return (f"a layer whose config's {self.width_key!r} is {config[self.width_key]!r} while its kernels "
                    f"make {units} units")
        wrong = [a for a in self.biases if tuple(int(d) for d in found[a].shape) != (units,)]
        if wrong:
            return f"a layer whose biases {', '.join(repr(a) for a in wrong)} are not one entry per unit ({units},)"
        declared = {id(variable) for variable in found.values()}
        other = [variable.name for variable in layer.weights if id(variable) not in declared]
        if other:
            return f"a layer holding weights that register_layer does not name: {', '.join(repr(n) for n in other)}"
        return super(UnitsRule, self).refusal(layer)

    def mixes_units(self, layer):
        return False

    def kernels(self, layer):
        return {role: getattr(layer, attribute) for role, attribute in self.roles.items()}

    def regularizer_attributes(self, layer):
        return tuple(self.kernel_keys.values())

    def bias(self, layer):
        return None

    def weights(self, layer, read=_numpy):
        out = {role: read(variable) for role, variable in self.kernels(layer).items()}
        out.update({f"per_unit/{attribute}": read(getattr(layer, attribute)) for attribute in self.biases})
        out["bias"] = None
        return out

    def thresholded_variables(self, layer):
        return list(self.kernels(layer).values()) + [getattr(layer, attribute) for attribute in self.biases]

    def kernel_shape(self, layer):
        shape = tuple(int(d) for d in self.kernels(layer)["kernel"].shape)
        return math.prod(shape[:-2]), shape[-2], shape[-1]

    def group_norms(self, layer, in_units):
        """The L2 norm of each input unit's group: its rows in every kernel together."""
        weights = self.weights(layer)
        return np.sqrt(sum(np.square(self.view.norms(weights[role], in_units)) for role in self.roles))

    def connections(self, layer, weights, in_units):
        return np.any([self.view.units(weights[role], in_units) != 0 for role in self.roles], axis=(0, 1))

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer_config(layer)
        config[self.width_key] = int(kept_out.size)
        by_variable = {id(getattr(layer, attribute)): weights[role] for role, attribute in self.roles.items()}
        by_variable.update({id(getattr(layer, attribute)): weights[f"per_unit/{attribute}"] for attribute in self.biases})
        new = []
        for variable in layer.weights:  # the order the layer builds them in
            value = by_variable[id(variable)]
            value = value[..., kept_in, :][..., kept_out] if value.ndim >= 2 else value[kept_out]
            new.append(np.ascontiguousarray(value))
        return config, new

    def flops(self, layer, positions, in_units, out_units, output_shape):
        return _spatial(output_shape) * positions * in_units * out_units * len(self.roles)

    def params(self, layer, positions, in_units, out_units, has_bias):
        return (positions * in_units * len(self.roles) + len(self.biases)) * out_units


def dense_equation(equation):
    """``(input letter, output letter)`` of an einsum equation that is a Dense layer on the last axis, else
    ``None``: a kernel of two axes ``(in, out)``, the input's last axis ``in``, the output the input's other axes in
    the same order then ``out`` (``"ab,bc->ac"``, ``"abc,cd->abd"``, ``"...b,bc->...c"``)."""
    try:
        operands, output = str(equation).replace(" ", "").split("->")
        inputs, kernel = operands.split(",")
    except ValueError:
        return None
    if len(kernel) != 2 or not inputs or not output:
        return None
    k_in, k_out = kernel
    if k_in == k_out or inputs[-1] != k_in or output[-1] != k_out or inputs[:-1] != output[:-1]:
        return None
    if k_in in output or k_out in inputs:
        return None
    return k_in, k_out


class EinsumDenseRule(UnitsRule):
    """``EinsumDense`` whose equation is a Dense on the last axis (``"abc,cd->abd"``): a kernel ``(in, out)`` and
    a bias on the output axis, or none. (Heads and other equations: not yet; refused by name.)"""

    merges_batchnorm = False
    width_key = "output_shape"

    def refusal(self, layer):
        reason = _adapted(layer, "EinsumDense layer")
        if reason:
            return reason
        letters = dense_equation(layer.equation)
        if letters is None:
            return (f"an EinsumDense with equation {layer.equation!r} (only a Dense on the last axis, such as "
                    "'abc,cd->abd', is supported)")
        if layer.bias_axes not in (None, "", letters[1]):
            return f"an EinsumDense with bias_axes={layer.bias_axes!r} (a bias on the output axis or none)"
        return super().refusal(layer)

    def bias(self, layer):
        return getattr(layer, "bias", None)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        config, new = super().slice_units(layer, weights, in_units, kept_in, kept_out)
        shape = layer.get_config()["output_shape"]  # its last entry is the units, the others stay
        width = config["output_shape"]
        config["output_shape"] = width if isinstance(shape, int) else tuple(shape)[:-1] + (width,)
        return config, new


class ConvRule(UnitsRule):
    """``Conv1D/2D/3D`` (channels_last, ``groups=1``): a kernel ``(k..., in, out)``.

    A convolution with as many groups as input and output channels
    (``groups == filters == C``, ConvNeXt's depthwise convolution) is a
    per-unit layer, as ``DepthwiseConv`` is: kernel ``(k..., 1, C)``, one slice
    and one bias per channel.
    """

    def depthwise(self, layer):
        """``groups`` equals the input and output channels: each channel is filtered on its own."""
        groups = getattr(layer, "groups", 1)
        try:
            shape = tuple(int(d) for d in layer.kernel.shape)
        except Exception:  # noqa: BLE001 - not built
            return False
        return groups > 1 and shape[-2] == 1 and shape[-1] == groups

    def variant(self, layer):
        if getattr(layer, "groups", 1) in (1, None) or self.depthwise(layer):
            return self
        grouped = self.__dict__.get("_grouped")
        if grouped is None:
            grouped = self._grouped = GroupedConvRule(self.cls, self.description)
        return grouped

    def refusal(self, layer):
        if self.depthwise(layer):
            return _depthwise_refusal(layer)
        return _conv_refusal(layer) or super().refusal(layer)

    def classify(self, layer):
        if self.depthwise(layer):
            reason = self.refusal(layer)
            return ("other", reason) if reason else ("per_unit", None)
        return super().classify(layer)

    @property
    def slices(self):
        return True

    def slice(self, layer, kept):
        kept = np.asarray(kept, dtype=int)
        weights = layer.get_weights()
        config = dict(layer.get_config(), filters=int(kept.size), groups=int(kept.size))
        return config, [weights[0][..., kept]] + ([weights[1][kept]] if len(weights) > 1 else [])

    def pass_constants(self, layer, values, threshold=0.0):
        return _depthwise_constants(layer, values, threshold)

    def checked_weights(self, layer):
        labels = ("kernel", "bias")
        return {labels[i]: _numpy(v) for i, v in enumerate(self.thresholded_variables(layer))}


class GroupedConvRule(ConvRule):
    """``Conv1D/2D/3D`` with ``groups=g`` (``1 < g``, not one group per channel; ResNeXt, RegNet): a kernel
    ``(k..., C / g, F)``.

    Input channel ``c`` reaches only the ``F / g`` filters of its convolution
    group ``c // (C / g)`` (:class:`~keras_group_lasso.groups.GroupView` with
    ``conv_groups=g``: the penalties see each channel's own weights). Every
    group keeps as many inputs and filters as the others, so a convolution
    group goes only when all of it goes: its ``C / g`` input channels and its
    ``F / g`` filters, and ``groups`` shrinks with it. A channel of a kept
    group stays, even a dead or constant one (its zero weights change nothing).
    """

    rounds = False

    def variant(self, layer):
        return self

    def refusal(self, layer):
        return _conv_refusal(layer) or UnitsRule.refusal(self, layer)

    def classify(self, layer):
        return UnitsRule.classify(self, layer)

    def view_of(self, layer):
        return GroupView(conv_groups=int(layer.groups))

    def kernel_shape(self, layer):
        shape = tuple(int(d) for d in layer.kernel.shape)
        return math.prod(shape[:-2]), shape[-2] * int(layer.groups), shape[-1]

    def _sizes(self, layer):
        """``(groups, input channels per group, filters per group)``."""
        _, channels, filters = self.kernel_shape(layer)
        groups = int(layer.groups)
        return groups, channels // groups, filters // groups

    def tied_units(self, layer):
        groups, per_in, per_out = self._sizes(layer)
        return [(np.arange(q * per_in, (q + 1) * per_in), np.arange(q * per_out, (q + 1) * per_out))
                for q in range(groups)]

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        groups, per_in, per_out = self._sizes(layer)
        kept = np.unique(kept_out // per_out)
        whole = (np.array_equal(kept_out, (kept[:, None] * per_out + np.arange(per_out)).reshape(-1))
                 and np.array_equal(kept_in, (kept[:, None] * per_in + np.arange(per_in)).reshape(-1)))
        if not whole:
            raise RuntimeError(  # pragma: no cover - the masks keep whole convolution groups
                f"the channels of '{layer.name}' were to be cut inside a convolution group; please report this")
        config = dict(layer.get_config(), filters=int(kept_out.size), groups=int(kept.size))
        kernel = weights["kernel"][..., kept_out]
        return config, self._with_bias([np.ascontiguousarray(kernel)], weights, kept_out)

    def width_step(self, layer):
        return self._sizes(layer)[2]

    def slice_widths(self, layer, weights, in_units, width_in, width_out):
        """Whole convolution groups: as many as ``width_out`` filters make, reading their groups' inputs."""
        groups, per_in, per_out = self._sizes(layer)
        kept = min(groups, max(1, width_out // per_out))
        config, new = self.slice_units(layer, weights, in_units, np.arange(kept * per_in), np.arange(kept * per_out))
        return config, new, kept * per_in

    def group_size(self, layer, positions, out_units):
        return positions * out_units // int(layer.groups)

    def _kept_groups(self, layer, in_units, out_units):
        groups, per_in, per_out = self._sizes(layer)
        return max(1, -(-int(in_units) // per_in), -(-int(out_units) // per_out))

    def flops(self, layer, positions, in_units, out_units, output_shape):
        # Each filter reads the input channels of its own group only.
        return _spatial(output_shape) * positions * in_units * out_units // self._kept_groups(layer, in_units,
                                                                                              out_units)

    def params(self, layer, positions, in_units, out_units, has_bias):
        return (positions * in_units * out_units // self._kept_groups(layer, in_units, out_units)
                + (out_units if has_bias else 0))


def _conv_refusal(layer):
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        return "a convolution with data_format='channels_first'"
    return None


class SeparableConvRule(ConvRule):
    """``SeparableConv1D/2D`` (``depth_multiplier=1``): a depthwise ``(k..., C, 1)`` then a pointwise ``(1.., C, out)``.

    Input channel ``c``'s outgoing weights are ``depthwise[..., c, :]`` and
    ``pointwise[..., c, :]``: both kernels carry a penalty on the same groups.
    """

    def refusal(self, layer):
        if getattr(layer, "depth_multiplier", 1) != 1:
            return "a SeparableConv with depth_multiplier > 1"
        return super().refusal(layer)

    def variant(self, layer):
        return self

    def kernels(self, layer):
        return {"kernel": layer.depthwise_kernel, "pointwise": layer.pointwise_kernel}

    rounds = False

    def regularizer_attributes(self, layer):
        return ("depthwise_regularizer", "pointwise_regularizer")

    def kernel_shape(self, layer):
        depthwise = tuple(int(d) for d in layer.depthwise_kernel.shape)
        return math.prod(depthwise[:-2]), depthwise[-2], int(layer.pointwise_kernel.shape[-1])

    def connections(self, layer, weights, in_units):
        depthwise = self.units_view(weights, in_units)  # (positions, C, m)
        pointwise = weights["pointwise"].reshape(int(in_units), -1, weights["pointwise"].shape[-1])  # (C, m, out)
        live = np.any(depthwise != 0, axis=0)  # (C, m)
        return np.einsum("cm,cmo->co", live.astype(np.int64), (pointwise != 0).astype(np.int64)) > 0

    def constant_contribution(self, layer, weights, in_units, values):
        values = np.asarray(values, np.float64)
        if not values.any():
            return np.zeros(self.out_units(layer))
        depthwise = self.units_view(weights, in_units).astype(np.float64).sum(axis=0)  # (C, m)
        pointwise = weights["pointwise"].reshape(-1, weights["pointwise"].shape[-1]).astype(np.float64)
        return (values[:, None] * depthwise).reshape(-1) @ pointwise

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer.get_config()
        config["filters"] = int(kept_out.size)
        depthwise = weights["kernel"][..., kept_in, :]
        m = depthwise.shape[-1]
        rows = (kept_in[:, None] * m + np.arange(m)[None, :]).reshape(-1)
        pointwise = weights["pointwise"][..., rows, :][..., kept_out]
        new = [np.ascontiguousarray(depthwise), np.ascontiguousarray(pointwise)]
        return config, self._with_bias(new, weights, kept_out)

    def flops(self, layer, positions, in_units, out_units, output_shape):
        return _spatial(output_shape) * (positions * in_units + in_units * out_units)

    def params(self, layer, positions, in_units, out_units, has_bias):
        return positions * in_units + in_units * out_units + (out_units if has_bias else 0)


class ConvTransposeRule(ConvRule):
    """``Conv1D/2D/3DTranspose``: a kernel ``(k..., out, in)``, the axes the other way round from ``Conv``.

    Input unit ``i``'s group is ``kernel[..., :, i]`` (:class:`GroupView` with
    ``axis=-1``). Each input position spreads over a window of output
    positions, so the border and the stride pattern see different numbers of
    kernel taps: a constant input is not constant in the output, and only a
    constant 0 is folded (as through zero padding).
    """

    view = GroupView(axis=-1)
    merges_batchnorm = False
    rounds = False

    def variant(self, layer):
        return self

    def kernel_shape(self, layer):
        shape = tuple(int(d) for d in layer.kernel.shape)
        return math.prod(shape[:-2]), shape[-1], shape[-2]

    def pads(self, layer):
        return True

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer.get_config()
        config["filters"] = int(kept_out.size)
        kernel = weights["kernel"][..., kept_out, :][..., kept_in]
        return config, self._with_bias([np.ascontiguousarray(kernel)], weights, kept_out)

    def flops(self, layer, positions, in_units, out_units, output_shape):
        # Every input position meets the whole window once.
        try:
            shape = tuple(layer.input.shape)
        except Exception:  # noqa: BLE001 - seen outside a graph: the output's positions bound it
            shape = tuple(output_shape)
        return _spatial(shape) * positions * in_units * out_units


class EmbeddingRule(UnitsRule):
    """``Embedding``: its output dimensions are units; it reads integer indices, not values.

    Column ``j`` of the table ``(input_dim, output_dim)`` is unit ``j`` at
    every position of its input; each input position (a categorical column of
    a tabular input) reaches every unit whose column is not all zero. A unit
    that nobody reads leaves the table (and every reader); a column of zeros
    outputs 0 everywhere (a constant). An input column goes when every unit of
    its Embedding goes. Its table carries no group penalty of its own (its
    units are pruned through the groups of the layers that read them).
    """

    merges_batchnorm = False
    rounds = False
    represents_input = True
    width_key = "output_dim"

    def refusal(self, layer):
        return _adapted(layer)

    def mixes_units(self, layer):
        return False

    def kernels(self, layer):
        return {"kernel": layer.embeddings}

    def regularizer_attributes(self, layer):
        return ()

    def bias(self, layer):
        return None

    def kernel_shape(self, layer):
        vocabulary, dims = (int(d) for d in layer.embeddings.shape)
        return vocabulary, 1, dims

    def unit_shape(self, layer, channels, positions):
        if positions != 1:
            return None
        return channels, int(layer.embeddings.shape[0])

    def connections(self, layer, weights, in_units):
        live = np.any(weights["kernel"] != 0, axis=0)
        return np.broadcast_to(live, (int(in_units), live.size)).copy()

    def constant_contribution(self, layer, weights, in_units, values):
        return np.zeros(weights["kernel"].shape[-1])

    def pads(self, layer):
        return False

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        if np.asarray(kept_in).size != in_units:  # pragma: no cover - an index read by a kept unit stays
            raise RuntimeError(f"the indices that '{layer.name}' reads were to be sliced; please report this")
        kept_out = np.asarray(kept_out, dtype=int)
        config = dict(layer.get_config(), output_dim=int(kept_out.size))
        return config, [np.ascontiguousarray(weights["kernel"][:, kept_out])]

    def flops(self, layer, positions, in_units, out_units, output_shape):
        return 0  # a lookup: no multiply-adds

    def params(self, layer, positions, in_units, out_units, has_bias):
        return positions * out_units


class ReversibleEmbeddingRule(EmbeddingRule):
    """``ReversibleEmbedding`` called forward (indices to vectors), as an ``Embedding``: its output dimensions are
    units. Its table is also the output projection when the layer is called with ``reverse=True`` (a language
    model's logits): that use is refused by name. Without tied weights, the rows of the reverse projection go
    with the columns of the table."""

    def refusal(self, layer):
        reason = _adapted(layer)
        if reason:
            return reason
        for node in getattr(layer, "_inbound_nodes", ()):
            args, kwargs = node.arguments.args, node.arguments.kwargs
            if kwargs.get("reverse") is True or (len(args) > 1 and args[1] is True):
                return ("a ReversibleEmbedding also called with reverse=True (its table is the output projection "
                        "too)")
        return None

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        config, new = super().slice_units(layer, weights, in_units, kept_in, kept_out)
        reverse = getattr(layer, "reverse_embeddings", None)
        if reverse is not None:
            new.append(np.ascontiguousarray(_numpy(reverse)[np.asarray(kept_out, dtype=int), :]))
        return config, new


class SequenceRule(UnitsRule):
    """The base of the recurrent and attention rules: layers whose units carry state over a sequence.

    A unit they make is never a constant (a recurrent unit's state evolves
    over time even with all incoming weights zero; an attention output mixes
    the positions), so nothing is folded into their biases and only a
    constant 0 of their input is removed. They read the channels of a
    sequence (one position of their kernel), and their activations act on
    each unit on its own.
    """

    merges_batchnorm = False
    rounds = False
    constant_outputs = False

    def classify(self, layer):
        reason = self.refusal(layer)
        return ("other", reason) if reason else (self.kind, None)

    def mixes_units(self, layer):
        return False

    def unit_shape(self, layer, channels, positions):
        if positions != 1 or self.kernel_shape(layer)[1] != channels:
            return None
        return channels, 1

    def constant_contribution(self, layer, weights, in_units, values):
        if np.any(np.asarray(values) != 0):  # pragma: no cover - pads() lets only constants of 0 through
            raise RuntimeError(f"a constant was to be folded into '{layer.name}'; please report this")
        return np.zeros(self.kernel_shape(layer)[2])

    def pads(self, layer):
        return True


class RecurrentRule(SequenceRule):
    """``SimpleRNN``, ``GRU``, ``LSTM``: input groups over its features and hidden units with a recurrence.

    Its kernel ``(in, G * units)`` holds ``G`` gates side by side (1 for
    SimpleRNN, 3 for GRU, 4 for LSTM; column ``g * units + j`` is gate ``g``
    of unit ``j``): row ``i`` (every gate) is input feature ``i``'s group, at
    every time step. Row ``j`` of the recurrent kernel ``(units, G * units)``
    is hidden unit ``j``'s group inside the layer (:meth:`recurrence`); with
    what the next layer reads of it (every step with ``return_sequences``,
    the last one otherwise) it is all of the unit's outgoing weights. A unit
    that neither a reader nor a kept unit's recurrence reads goes: its gate
    columns leave both kernels and the bias (both biases of a GRU with
    ``reset_after``). A unit is never a constant (its state evolves over time
    even with all incoming weights zero), and only a constant 0 of its input
    is removed (a constant input would have to go into every gate's bias,
    which is exact but not done).
    """

    width_key = "units"

    def __init__(self, cls, gates, description=None, **kwargs):
        super().__init__(cls, description, **kwargs)
        self.gates = int(gates)

    def refusal(self, layer):
        reason = _adapted(layer)
        if reason:
            return reason
        if layer.stateful:
            return "a stateful recurrent layer (its state carries over between batches)"
        if layer.return_state:
            return "a recurrent layer with return_state=True (its states are outputs of their own)"
        for attribute in ("activation", "recurrent_activation"):
            function = getattr(layer.cell, attribute, None)
            if function is not None and not activation_is_elementwise(function):
                return f"a recurrent layer whose {attribute} is not elementwise"
        return None

    def kernels(self, layer):
        return {"kernel": layer.cell.kernel, "recurrent": layer.cell.recurrent_kernel}

    def own_unit_attributes(self, layer):
        return ("recurrent_regularizer",)

    def bias(self, layer):
        return layer.cell.bias if layer.cell.use_bias else None

    def kernel_shape(self, layer):
        rows, columns = (int(d) for d in layer.cell.kernel.shape)
        return 1, rows, columns // self.gates

    def units_view(self, weights, in_units, layer=None):
        """The kernel as ``(gates, in_units, units)``: gate ``g``'s weights from input ``i`` into unit ``j``."""
        kernel = weights["kernel"]
        return np.moveaxis(kernel.reshape(kernel.shape[0], self.gates, -1), 1, 0)

    def recurrence(self, layer, weights):
        """bool ``(units, units)``: hidden unit ``j`` reaches unit ``k`` through a non-zero recurrent weight."""
        recurrent = weights["recurrent"]
        return np.any(recurrent.reshape(recurrent.shape[0], self.gates, -1) != 0, axis=1)

    def columns(self, units, kept_out):
        """The kernel columns of the units ``kept_out`` in every gate (gate-major)."""
        return (np.arange(self.gates)[:, None] * units + np.asarray(kept_out, dtype=int)[None, :]).reshape(-1)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        columns = self.columns(weights["recurrent"].shape[0], kept_out)
        new = [np.ascontiguousarray(weights["kernel"][kept_in][:, columns]),
               np.ascontiguousarray(weights["recurrent"][kept_out][:, columns])]
        if weights["bias"] is not None:
            new.append(np.ascontiguousarray(weights["bias"][..., columns]))
        return dict(layer.get_config(), units=int(kept_out.size)), new

    def serving_config(self, layer):
        """Unrolled over a sequence of known length: the same computation without a loop (TFLite's own ops)."""
        if layer.unroll or self._steps(layer, None) is None:
            return None
        return dict(layer.get_config(), unroll=True)

    def _steps(self, layer, unknown=1):
        try:
            steps = layer.input.shape[1]
        except Exception:  # noqa: BLE001 - a layer with no single input
            return unknown
        return unknown if steps is None else int(steps)

    def flops(self, layer, positions, in_units, out_units, output_shape):
        """``steps * G * (in + units) * units`` multiply-adds (a sequence of unknown length: per step)."""
        return self._steps(layer) * self.gates * (in_units + out_units) * out_units

    def params(self, layer, positions, in_units, out_units, has_bias):
        biases = 2 if getattr(layer.cell, "reset_after", False) else 1
        return self.gates * out_units * (in_units + out_units + (biases if has_bias else 0))


class BidirectionalRule(SequenceRule):
    """``Bidirectional`` around a SimpleRNN, GRU or LSTM: forward and backward units.

    With ``merge_mode="concat"`` the output holds the forward units, then the
    backward ones: separate units, each with its own groups. Keras builds both
    directions with the same width, so where one direction keeps more units
    than the other, dead units of the other one stay (their outgoing weights
    are zero: the outputs do not change). With ``"sum"``, ``"ave"`` or
    ``"mul"`` forward unit ``j`` and backward unit ``j`` are one output unit,
    kept or removed together.
    """

    _DIRECTIONS = ("forward", "backward")

    def _inner(self, layer):
        return _RULES.get(type(layer.forward_layer))

    def _layers(self, layer):
        return layer.forward_layer, layer.backward_layer

    def penalty_layers(self, layer):
        return self._layers(layer)

    def penalty_config_keys(self, layer):
        """The keys of its config that hold the configs of :meth:`penalty_layers`."""
        return ("layer", "backward_layer")

    def serving_config(self, layer):
        inner = self._inner(layer)
        if layer.forward_layer.unroll or inner._steps(layer, None) is None:
            return None
        config = layer.get_config()
        for key in self.penalty_config_keys(layer):
            config[key] = {k: v for k, v in config[key].items() if k != "build_config"}
            config[key]["config"] = dict(config[key]["config"], unroll=True)
        return config

    def refusal(self, layer):
        inner = self._inner(layer)
        if not isinstance(inner, RecurrentRule) or type(layer.backward_layer) is not type(layer.forward_layer):
            return "a Bidirectional wrapper of a layer other than SimpleRNN, GRU or LSTM"
        if layer.merge_mode not in ("concat", "sum", "ave", "mul"):
            return f"a Bidirectional layer with merge_mode={layer.merge_mode!r} (two outputs)"
        return inner.refusal(layer.forward_layer) or inner.refusal(layer.backward_layer)

    def _concat(self, layer):
        return layer.merge_mode == "concat"

    def kernels(self, layer):
        inner = self._inner(layer)
        out = {}
        for direction, sub in zip(self._DIRECTIONS, self._layers(layer)):
            for role, variable in inner.kernels(sub).items():
                out[f"{direction}_{role}"] = variable
        return out

    def regularizer_attributes(self, layer):
        return ("kernel_regularizer",)

    def own_unit_attributes(self, layer):
        return ("recurrent_regularizer",)

    def bias(self, layer):
        return None

    def weights(self, layer, read=_numpy):
        out = {role: read(variable) for role, variable in self.kernels(layer).items()}
        inner = self._inner(layer)
        for direction, sub in zip(self._DIRECTIONS, self._layers(layer)):
            bias = inner.bias(sub)
            out[f"{direction}_bias"] = None if bias is None else read(bias)
        out["bias"] = None
        return out

    def thresholded_variables(self, layer):
        inner = self._inner(layer)
        return [v for sub in self._layers(layer) for v in inner.thresholded_variables(sub)]

    def _direction(self, weights, direction):
        return {role.split("_", 1)[1]: value for role, value in weights.items() if role.startswith(direction + "_")}

    def kernel_shape(self, layer):
        _, rows, units = self._inner(layer).kernel_shape(layer.forward_layer)
        return 1, rows, units * (2 if self._concat(layer) else 1)

    def unit_shape(self, layer, channels, positions):
        return self._inner(layer).unit_shape(layer.forward_layer, channels, positions)

    def connections(self, layer, weights, in_units):
        inner = self._inner(layer)
        forward, backward = (inner.connections(layer.forward_layer, self._direction(weights, d), in_units)
                             for d in self._DIRECTIONS)
        return np.concatenate([forward, backward], axis=1) if self._concat(layer) else forward | backward

    def recurrence(self, layer, weights):
        inner = self._inner(layer)
        forward, backward = (inner.recurrence(layer.forward_layer, self._direction(weights, d))
                             for d in self._DIRECTIONS)
        if not self._concat(layer):
            return forward | backward
        units = forward.shape[0]
        out = np.zeros((2 * units, 2 * units), dtype=bool)
        out[:units, :units], out[units:, units:] = forward, backward
        return out

    def paired_halves(self, layer):
        """Its output's two halves must keep as many units each (Keras builds both directions alike)."""
        return self._concat(layer)

    def group_norms(self, layer, in_units):
        weights = self.weights(layer)
        norms = [GroupView().norms(weights[f"{d}_kernel"], in_units) for d in self._DIRECTIONS]
        return np.sqrt(norms[0] ** 2 + norms[1] ** 2)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        inner = self._inner(layer)
        kept_out = np.asarray(kept_out, dtype=int)
        units = self._inner(layer).kernel_shape(layer.forward_layer)[2]
        if self._concat(layer):
            kept = (kept_out[kept_out < units], kept_out[kept_out >= units] - units)
            if kept[0].size != kept[1].size:  # pragma: no cover - the masks keep as many in each direction
                raise RuntimeError(f"the two directions of '{layer.name}' keep different widths; please report this")
        else:
            kept = (kept_out, kept_out)
        config = layer.get_config()
        new = []
        for key, direction, sub, keep in zip(("layer", "backward_layer"), self._DIRECTIONS, self._layers(layer), kept):
            sub_config, sub_weights = inner.slice_units(sub, self._direction(weights, direction), in_units, kept_in,
                                                        keep)
            # Built when called (its serialized build_config holds the old input width).
            config[key] = {k: v for k, v in config[key].items() if k != "build_config"}
            config[key]["config"] = sub_config
            new += sub_weights
        return config, new

    def flops(self, layer, positions, in_units, out_units, output_shape):
        per_direction = out_units // 2 if self._concat(layer) else out_units
        inner = self._inner(layer)
        # The sequence length from the wrapper (the layers it holds are not called in the model's graph).
        return 2 * inner._steps(layer) * inner.gates * (in_units + per_direction) * per_direction

    def params(self, layer, positions, in_units, out_units, has_bias):
        per_direction = out_units // 2 if self._concat(layer) else out_units
        has_bias = self._inner(layer).bias(layer.forward_layer) is not None
        return 2 * self._inner(layer).params(layer.forward_layer, positions, in_units, per_direction, has_bias)


_ATTENTION_PARTS = ("query", "key", "value", "attention_output")


def _attention_variables(layer):
    """``{role: variable}`` of a MultiHeadAttention: ``query``, ``key``, ``value``, ``output`` and their biases."""
    found = {}
    for variable in layer.weights:
        part, kind = variable.path.split("/")[-2:]
        if part in _ATTENTION_PARTS:
            role = "output" if part == "attention_output" else part
            found[role if kind == "kernel" else f"{role}_bias"] = variable
    return found


class AttentionRule(SequenceRule):
    """``MultiHeadAttention`` (self-attention: query, key and value read one tensor): heads are its inner units.

    The group of head ``h`` is its slice ``[h, :, :]`` of the output kernel
    ``(heads, value_dim, out)`` (``GroupView(axis=0)``): a head whose slice is
    zero adds nothing to the output (each head's softmax is its own), so its
    query, key, value and output slices go and the layer is built with fewer
    heads. Input unit ``i`` reaches the output through its rows of the query,
    key and value kernels ``(in, heads, dim)`` into live heads; an output unit
    whose output-kernel column is zero is never a constant to fold (only a
    constant 0 of its input is removed). Inside the kept heads, key and value
    dimensions that add nothing go too (:meth:`kept_shape`).
    """

    width_key = "output_shape"
    #: Group view of its head kernel (the output kernel).
    head_view = GroupView(axis=0)
    side_arguments = ("query_mask", "value_mask", "key_mask", "attention_mask")

    def refusal(self, layer):
        reason = _adapted(layer)
        if reason:
            return reason
        if getattr(layer, "_use_gate", False) or layer.get_config().get("use_gate"):
            return "a MultiHeadAttention with use_gate=True"
        config = layer.get_config()
        if tuple(config.get("attention_axes") or (1,)) != (1,):
            return "a MultiHeadAttention over axes other than the sequence (attention_axes=(1,))"
        output_shape = config.get("output_shape")
        if output_shape is not None and len(tuple(np.atleast_1d(output_shape))) != 1:
            return "a MultiHeadAttention whose output_shape has several axes"
        try:
            variables = _attention_variables(layer)
        except Exception:  # noqa: BLE001 - not built
            variables = {}
        if not {"query", "key", "value", "output"} <= set(variables):
            return "a MultiHeadAttention that is not built"
        return None

    def kernels(self, layer):
        variables = _attention_variables(layer)
        return {role: variables[role] for role in ("query", "key", "value", "output")}

    def regularizer_attributes(self, layer):
        return ()

    def head_kernel(self, layer):
        """The variable whose groups are its heads (the output kernel)."""
        return _attention_variables(layer)["output"]

    def bias(self, layer):
        return _attention_variables(layer).get("output_bias")

    def weights(self, layer, read=_numpy):
        return {role: read(variable) for role, variable in _attention_variables(layer).items()} | {
            "bias": None if self.bias(layer) is None else read(self.bias(layer))}

    def thresholded_variables(self, layer):
        return list(_attention_variables(layer).values())

    def kernel_shape(self, layer):
        variables = _attention_variables(layer)
        return 1, int(variables["query"].shape[0]), int(variables["output"].shape[-1])

    def live_heads(self, weights, kept_out=None):
        """bool ``(heads,)``: heads with a non-zero output weight (into the units ``kept_out``, default all)."""
        output = weights["output"]
        if kept_out is not None:
            output = output[..., np.asarray(kept_out, dtype=int)]
        return np.any(output.reshape(output.shape[0], -1) != 0, axis=1)

    def units_view(self, weights, in_units, layer=None):
        """``(3, in_units, heads)``: input ``i``'s query, key and value weights into each head (any non-zero)."""
        return np.stack([np.any(weights[role] != 0, axis=-1) for role in ("query", "key", "value")]).astype(float)

    def connections(self, layer, weights, in_units):
        reads = np.any(self.units_view(weights, in_units) != 0, axis=0)  # (in, heads)
        writes = np.any(weights["output"] != 0, axis=1)  # (heads, out)
        return (reads.astype(np.int64) @ writes.astype(np.int64)) > 0

    def group_norms(self, layer, in_units):
        weights = self.weights(layer)
        squares = sum(np.sum(np.square(weights[role].astype(np.float32)), axis=(1, 2))
                      for role in ("query", "key", "value"))
        return np.sqrt(squares)

    def kept_shape(self, weights, kept_out):
        """``(heads, key dims, value dims)`` that stay: the live heads, and for each the key and value
        dimensions it keeps (as many in every head: Keras gives all heads one ``key_dim`` and one ``value_dim``).

        Value dimension ``j`` of head ``h`` adds nothing when its output rows ``[h, j, :]`` are zero; key
        dimension ``j`` adds nothing to the scores when its query column (and bias) or its key column (and
        bias) is zero. A head keeps its live dimensions and, where another head keeps more, some dead ones.
        Where ``key_dim == value_dim`` (Keras on JAX needs it) both stay equal.
        """
        kept_out = np.asarray(kept_out, dtype=int)
        heads = np.flatnonzero(self.live_heads(weights, kept_out))
        if heads.size == 0:  # a layer has at least one head: one whose output weights are zero adds nothing
            heads = np.arange(1)

        def live(role):
            column = np.any(weights[role] != 0, axis=0)  # (heads, dim)
            bias = weights.get(f"{role}_bias")
            return column if bias is None else column | (bias != 0)

        key_live = live("query") & live("key")
        value_live = np.any(weights["output"][..., kept_out] != 0, axis=-1)  # (heads, value_dim)
        key_dim, value_dim = key_live.shape[1], value_live.shape[1]
        new_key = max(1, int(key_live[heads].sum(axis=1).max()))
        new_value = max(1, int(value_live[heads].sum(axis=1).max()))
        if key_dim == value_dim:
            new_key = new_value = max(new_key, new_value)

        def dims(mask, count):  # live dimensions first, then dead ones, in index order
            return [np.sort(np.argsort(~mask[h], kind="stable")[:count]) for h in heads]

        return heads, dims(key_live, new_key), dims(value_live, new_value)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        heads, key_dims, value_dims = self.kept_shape(weights, kept_out)
        # Keras scales the query by 1 / sqrt(key_dim): fewer key dimensions need the query scaled back.
        scale = math.sqrt(key_dims[0].size / weights["query"].shape[-1])

        def pick(array, dims):  # array (..., heads, dim) -> the kept heads and their dims
            return np.stack([array[..., h, d] for h, d in zip(heads, dims)], axis=-2)

        new = []
        for role, dims, factor in (("query", key_dims, scale), ("key", key_dims, 1.0), ("value", value_dims, 1.0)):
            kernel = pick(weights[role][kept_in], dims)
            new.append(np.ascontiguousarray(kernel * np.asarray(factor, kernel.dtype) if factor != 1.0 else kernel))
            bias = weights.get(f"{role}_bias")
            if bias is not None:
                bias = pick(bias, dims)
                new.append(np.ascontiguousarray(bias * np.asarray(factor, bias.dtype) if factor != 1.0 else bias))
        output = np.stack([weights["output"][h][d] for h, d in zip(heads, value_dims)])
        new.append(np.ascontiguousarray(output[..., kept_out]))
        if weights["bias"] is not None:
            new.append(np.ascontiguousarray(weights["bias"][kept_out]))
        config = dict(layer.get_config(), num_heads=int(heads.size), key_dim=int(key_dims[0].size),
                      value_dim=int(value_dims[0].size), output_shape=int(kept_out.size))
        return config, new

    def call(self, layer, x, options=None):
        """Call ``layer`` as the model did: on ``x`` as query and value, with the same keyword options."""
        return layer(x, x, **(options or {}))

    def _sizes(self, layer):
        variables = _attention_variables(layer)
        heads, key_dim = (int(d) for d in variables["query"].shape[1:])
        value_dim = int(variables["value"].shape[-1])
        try:
            steps = layer.input[0].shape[1] if isinstance(layer.input, (list, tuple)) else layer.input.shape[1]
        except Exception:  # noqa: BLE001 - a layer with several calls or none
            steps = None
        return heads, key_dim, value_dim, 1 if steps is None else int(steps)

    def flops(self, layer, positions, in_units, out_units, output_shape, heads=None, key_dim=None, value_dim=None):
        """``T * in * H * (2 kd + vd)`` (projections) ``+ T^2 * H * (kd + vd)`` (scores, weighted values)
        ``+ T * H * vd * out`` (output) multiply-adds per sample, ``T`` its sequence length."""
        total, full_key, full_value, steps = self._sizes(layer)
        heads = total if heads is None else heads
        key_dim = full_key if key_dim is None else key_dim
        value_dim = full_value if value_dim is None else value_dim
        return (steps * in_units * heads * (2 * key_dim + value_dim) + steps * steps * heads * (key_dim + value_dim)
                + steps * heads * value_dim * out_units)

    def params(self, layer, positions, in_units, out_units, has_bias, heads=None, key_dim=None, value_dim=None):
        total, full_key, full_value, _ = self._sizes(layer)
        heads = total if heads is None else heads
        key_dim = full_key if key_dim is None else key_dim
        value_dim = full_value if value_dim is None else value_dim
        biases = _attention_variables(layer).get("query_bias") is not None
        return (in_units * heads * (2 * key_dim + value_dim) + (heads * (2 * key_dim + value_dim) if biases else 0)
                + heads * value_dim * out_units + (out_units if has_bias else 0))

    def inner_units(self, layer, weights, kept_out):
        """``(live heads, heads)`` with the units ``kept_out`` kept."""
        heads, _, _ = self.kept_shape(weights, kept_out)
        return int(heads.size), int(weights["output"].shape[0])

    def kept_cost(self, layer, positions, kept_in, kept_out, output_shape, has_bias, weights, kept_mask):
        heads, key_dims, value_dims = self.kept_shape(weights, np.flatnonzero(kept_mask))
        shape = dict(heads=int(heads.size), key_dim=int(key_dims[0].size), value_dim=int(value_dims[0].size))
        return (self.flops(layer, positions, kept_in, kept_out, output_shape, **shape),
                self.params(layer, positions, kept_in, kept_out, has_bias, **shape))


# ----------------------------------------------------------------------------- keras.ops operations

_SCALAR_OPERATIONS = {}


def _scalar_operations():
    """``{operation class: name}`` of the keras.ops arithmetic a Rescaling can stand for (found once, symbolically)."""
    if not _SCALAR_OPERATIONS:
        x = keras.Input((1,))
        for name, function in (("add", keras.ops.add), ("subtract", keras.ops.subtract),
                               ("multiply", keras.ops.multiply), ("divide", keras.ops.true_divide)):
            _SCALAR_OPERATIONS[type(keras.Model(x, function(x, 2.0)).operations[-1])] = name
    return _SCALAR_OPERATIONS


# The keras.ops activations an ``Activation`` layer computes alike: the op's class name, the activation's name.
_UNARY_ACTIVATIONS = {
    "Relu": "relu", "Relu6": "relu6", "Sigmoid": "sigmoid", "Tanh": "tanh", "Silu": "silu",
    "HardSigmoid": "hard_sigmoid", "HardSilu": "hard_silu", "Softplus": "softplus", "Softsign": "softsign",
    "Mish": "mish", "Selu": "selu", "Exp": "exponential",
}
_GLOBAL_POOLS = {3: "GlobalAveragePooling1D", 4: "GlobalAveragePooling2D", 5: "GlobalAveragePooling3D"}
_OPERATION_CALLS = weakref.WeakKeyDictionary()


def operation_name(operation):
    """The class name of a keras.ops operation of Keras itself (``"Split"``), else ``None``."""
    cls = type(operation)
    return cls.__name__ if cls.__module__.startswith("keras.") else None



def _tensor_arguments(inbound_nodes):
    """``(args, kwargs, shape, dtype)`` of an operation's one call on one tensor (its first argument), or ``None``."""
    if not inbound_nodes or len(inbound_nodes) != 1 or not isinstance(inbound_nodes[0], dict):
        return None
    args, kwargs = inbound_nodes[0].get("args", []), inbound_nodes[0].get("kwargs", {})
    if len(args) != 1 or not (isinstance(args[0], dict) and args[0].get("class_name") == "__keras_tensor__"):
        return None
    config = args[0]["config"]
    return args, kwargs, tuple(config["shape"]), config.get("dtype")


def _one_tensor_layer(operation, inbound_nodes):
    """The layer for a keras.ops call on one tensor: an activation (``ops.sigmoid(x)``) or a mean over every
    position (``ops.mean(x, axis=(1, 2), keepdims=True)``, squeeze-and-excitation's pooling)."""
    name = operation_name(operation)
    called = _tensor_arguments(inbound_nodes)
    if name is None or called is None:
        return None
    _, kwargs, shape, dtype = called
    if kwargs:
        return None
    if name in _UNARY_ACTIVATIONS:
        layer = keras.layers.Activation(_UNARY_ACTIVATIONS[name], name=operation.name, dtype=dtype)
    elif name == "Gelu" and getattr(operation, "approximate", None) is False:
        layer = keras.layers.Activation("gelu", name=operation.name, dtype=dtype)
    elif name == "Mean" and len(shape) in _GLOBAL_POOLS and operation.axis is not None:
        axes = sorted(a % len(shape) for a in operation.axis)
        if axes != list(range(1, len(shape) - 1)):
            return None
        layer = getattr(keras.layers, _GLOBAL_POOLS[len(shape)])(keepdims=bool(operation.keepdims),
                                                                 name=operation.name, dtype=dtype)
    else:
        return None
    layer(keras.KerasTensor(shape, dtype=dtype))
    return layer


def is_constant_value(argument):
    """A serialized call argument is a constant array (``__tensor__`` or ``__numpy__``, of at least one axis)."""
    return (isinstance(argument, dict) and argument.get("class_name") in ("__tensor__", "__numpy__")
            and np.asarray(argument["config"]["value"]).ndim >= 1)


def constant_array(argument):
    """The numpy value of a serialized constant array (:func:`is_constant_value`), in its dtype where numpy has it."""
    config = argument["config"]
    try:
        return np.asarray(config["value"], dtype=config.get("dtype"))
    except TypeError:  # a dtype numpy does not know (bfloat16): the values as they are
        return np.asarray(config["value"])


def _operand_shape(argument):
    """``(shape, dtype)`` of a serialized tensor argument (a symbolic tensor or a constant array), else ``None``."""
    if isinstance(argument, dict) and argument.get("class_name") == "__keras_tensor__":
        return tuple(argument["config"]["shape"]), argument["config"].get("dtype")
    if is_constant_value(argument):
        return tuple(np.asarray(argument["config"]["value"]).shape), argument["config"].get("dtype")
    return None


# keras.ops operations whose result depends on their operand's shape only, not on its values.
_SHAPE_ONLY = ("ZerosLike", "OnesLike")


def reads_no_values(operation):
    """A keras.ops operation whose result depends on its operand's shape only (``zeros_like``, ``ones_like``):
    with that shape known, a constant whatever the input."""
    return operation_name(operation) in _SHAPE_ONLY


def operation_call(operation):
    """The keyword arguments (not tensors) a keras.ops operation of the model was called with (``{}``)."""
    return _OPERATION_CALLS.get(operation, {})


def operation_layer(operation, inbound_nodes):
    """The Keras layer that computes what a keras.ops arithmetic operation computes, or ``None``.

    Of two tensors, ``x + y``, ``x - y``, ``x * y``: ``Add``, ``Subtract``,
    ``Multiply`` (one may be a constant array, such as positions computed when
    the model was built: a :class:`ConstantValue` of the graph; an operand
    with fewer axes takes leading axes of size 1, as keras.ops broadcasts
    it). Of one tensor and one number, a ``Rescaling``:

    ``x + c``, ``c + x``: ``Rescaling(1, c)``; ``x - c``: ``(1, -c)``; ``c -
    x``: ``(-1, c)``; ``x * c``, ``c * x``: ``(c, 0)``; ``x / c``: ``(1 / c,
    0)`` (the one that rounds differently, by at most one unit in the last
    place). ``inbound_nodes`` is the operation's entry in the functional
    config (its call arguments). The layer is called on a symbolic tensor of
    the operation's input shape, so it has an input like any layer of the model.
    """
    if operation is None:
        return None
    if inbound_nodes and len(inbound_nodes) == 1 and isinstance(inbound_nodes[0], dict):
        try:
            _OPERATION_CALLS[operation] = dict(inbound_nodes[0].get("kwargs") or {})
        except TypeError:  # pragma: no cover - not weak-referenceable
            pass
    layer = _one_tensor_layer(operation, inbound_nodes)
    if layer is not None:
        return layer
    if operation_name(operation) == "GetItem" and inbound_nodes and len(inbound_nodes) == 1:
        args = inbound_nodes[0].get("args", [])
        shape = _operand_shape(args[0]) if len(args) == 2 else None
        return channel_slice(operation.name, args[1], shape[0]) if shape is not None else None
    name = _scalar_operations().get(type(operation))
    if name is None or not inbound_nodes or len(inbound_nodes) != 1:
        return None
    args, kwargs = inbound_nodes[0].get("args", []), inbound_nodes[0].get("kwargs", {})
    tensors = [isinstance(a, dict) and a.get("class_name") == "__keras_tensor__" for a in args]
    if kwargs or len(args) != 2 or not any(tensors):
        return None
    shapes = [_operand_shape(a) for a in args]
    if all(shape is not None for shape in shapes):
        # Two tensors (``inputs + x``, a residual connection; or positions, a constant, added to the input's
        # path): the merge layer, on the operands' shapes with leading axes of size 1 where one has fewer (as
        # keras.ops broadcasts), so that it merges channel by channel as the operation does.
        merge = {"add": keras.layers.Add, "subtract": keras.layers.Subtract, "multiply": keras.layers.Multiply}.get(name)
        if merge is None:
            return None
        rank = max(len(shape) for shape, _ in shapes)
        layer = merge(name=operation.name, dtype=args[tensors.index(True)]["config"].get("dtype"))
        layer([keras.KerasTensor((1,) * (rank - len(shape)) + shape, dtype=dtype) for shape, dtype in shapes])
        return layer
    first = tensors[0]
    tensor, number = (args[0], args[1]) if first else (args[1], args[0])
    dtype = tensor["config"].get("dtype")
    if isinstance(number, bool) or not isinstance(number, (int, float)) or "float" not in str(dtype):
        return None
    number = float(number)
    if name == "add":
        scale, offset = 1.0, number
    elif name == "subtract":
        scale, offset = (1.0, -number) if first else (-1.0, number)
    elif name == "multiply":
        scale, offset = number, 0.0
    elif first and number != 0:
        scale, offset = 1.0 / number, 0.0
    else:
        return None
    layer = keras.layers.Rescaling(scale=scale, offset=offset, name=operation.name, dtype=dtype)
    layer(keras.KerasTensor(tuple(tensor["config"]["shape"]), dtype=dtype))
    return layer


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

_RECOGNIZED = weakref.WeakKeyDictionary()


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
    items = list(key) if isinstance(key, tuple) else [key]
    if len(shape) < 3 or any(not (isinstance(i, (slice, int, np.integer)) or i is Ellipsis) for i in items):
        return False
    items = _every_axis(items, len(shape), pad=True)
    whole = slice(None)
    return (items is not None and len(items) == len(shape) and items[0] == whole and items[-1] == whole
            and any(i != whole for i in items[1:-1]))


class IdentityRule(LayerRule):
    """A layer of a class not in the table that is the identity at inference (stochastic depth, drop path)."""

    constants = "identity"
    inference_identity = True


class ChannelScaleRule(LayerRule):
    """A layer of a class not in the table that multiplies each channel by its own weight (ConvNeXt's layer scale).

    Sliced by taking the kept entries of its one weight and giving every
    integer of its config equal to the channel count the kept count instead
    (``projection_dim``); :func:`recognize` checked that this rebuilds it.
    """

    def slice(self, layer, kept):
        kept = np.asarray(kept, dtype=int)
        return _rescaled_config(layer, int(kept.size)), [layer.get_weights()[0][kept]]


class LinearMergeRule(MergeRule):
    """A layer of a class not in the table that sums its operands with fixed weights: ``sum_k c_k * x_k``.

    InceptionResNetV2's ``CustomScaleLayer`` (``x + scale * residual``).
    Recognized per layer (its weights ``c_k`` are read off random inputs), so
    one rule object holds one layer's weights.
    """

    def __init__(self, cls, coefficients):
        super().__init__(cls, "Linear", f"{cls.__name__} (a weighted sum of its operands)")
        self.coefficients = tuple(float(c) for c in coefficients)

    def merge_constants(self, layer, operands):
        values = np.stack([np.asarray(v, np.float64) for v in operands])
        return np.tensordot(np.asarray(self.coefficients), values, axes=1)  # NaN in any operand stays NaN

    def fold(self, layer, operands):
        values = [np.asarray(v, np.float64) for v in operands]
        dropped = tuple(bool(np.isfinite(v).all()) for v in values)
        if dropped.count(False) != 1:  # the layer's weights are per operand: exactly one may stay
            return None
        smaller = broadcasts(layer)
        if smaller and all(small for small, d in zip(smaller, dropped) if not d):
            return None
        kept = dropped.index(False)
        offset = sum(c * v for c, v, d in zip(self.coefficients, values, dropped) if d)
        return dropped, np.full_like(values[kept], self.coefficients[kept]), np.asarray(offset, np.float64)


def _linear_coefficients(layer):
    """``(c_1, ..., c_n)`` when the weightless ``layer`` of ``n`` same-shape operands computes ``sum_k c_k x_k``."""
    shapes = [tuple(t.shape) for t in layer.input]
    if len(set(shapes)) != 1 or tuple(layer.output.shape) != shapes[0] or layer.get_weights():
        return None
    shape = tuple(2 if d is None else int(d) for d in shapes[0])
    rng = np.random.default_rng(0)
    dtype = _dtype(layer)
    xs = [(rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(dtype) for _ in shapes]

    def call(values):
        return np.asarray(keras.ops.convert_to_numpy(layer([keras.ops.convert_to_tensor(v) for v in values])),
                          np.float64)

    coefficients = []
    for k, x in enumerate(xs):
        alone = [x if j == k else np.zeros_like(x) for j in range(len(xs))]
        out = call(alone)
        ratio = out.reshape(-1)[np.argmax(np.abs(x))] / float(x.reshape(-1)[np.argmax(np.abs(x))])
        if not np.allclose(out, ratio * x, rtol=1e-6, atol=0):
            return None
        coefficients.append(ratio)
    want = sum(c * x.astype(np.float64) for c, x in zip(coefficients, xs))
    return coefficients if np.allclose(call(xs), want, rtol=1e-5, atol=1e-6 * np.max(np.abs(want))) else None


def _rescaled_config(layer, channels):
    count = int(layer.input.shape[-1])
    return {key: (channels if type(value) is int and value == count else value)
            for key, value in layer.get_config().items()}


def _probe(layer, shape, seed):
    """A random input of ``shape`` (unknown sizes: 3; magnitudes 1e-3 to 1e3, both signs, some zeros) in the
    layer's dtype, and what the layer makes of it."""
    shape = (2,) + tuple(3 if d is None else int(d) for d in shape[1:])
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4, size=shape) * (rng.random(shape) > 0.1)
    x = x.astype(_dtype(layer))
    kwargs = {"training": False} if "training" in _call_arguments(layer) else {}
    return x, np.asarray(keras.ops.convert_to_numpy(layer(keras.ops.convert_to_tensor(x), **kwargs)))


def recognize(layer):
    """A rule for a layer whose class is not in the table, from what it computes on random inputs, or ``None``.

    Three kinds are recognized, each checked on random inputs of the
    layer's input shape, in inference mode: a layer without weights whose
    output equals its input exactly (:class:`IdentityRule`), a layer whose
    one weight ``w`` has one entry per channel and whose output is ``x * w``
    (:class:`ChannelScaleRule`; its config, with the channel count replaced by
    a smaller one, must rebuild it and compute the same on the kept channels),
    and a layer without weights of several same-shape operands whose output
    is a fixed weighted sum of them (:class:`LinearMergeRule`). Anything else
    stays unsupported, named in the error. The random inputs span magnitudes
    from 1e-3 to 1e3; a layer that behaves otherwise only beyond them (a clip
    at 1e6) would be mistaken: register a rule for such a layer.
    """
    if layer in _RECOGNIZED:
        return _RECOGNIZED[layer]
    rule = None
    try:
        rule = _recognize(layer)
    except Exception:  # noqa: BLE001 - a layer that cannot be probed is not recognized
        rule = None
    _RECOGNIZED[layer] = rule
    return rule


def _recognize(layer):
    if isinstance(layer.input, (list, tuple)):
        coefficients = _linear_coefficients(layer) if len(layer.input) > 1 else None
        return LinearMergeRule(type(layer), coefficients) if coefficients else None
    shape = tuple(layer.input.shape)
    if tuple(layer.output.shape) != shape or not shape or shape[-1] is None:
        return None
    weights = layer.get_weights()
    if not weights:
        for seed in (0, 1):
            x, y = _probe(layer, shape, seed)
            if y.shape != x.shape or not np.array_equal(x, y):
                return None
        return IdentityRule(type(layer), f"{type(layer).__name__} (the identity at inference)")
    channels = int(shape[-1])
    if len(weights) != 1 or weights[0].shape != (channels,) or channels < 2:
        return None
    scale = weights[0]
    for seed in (0, 1):
        x, y = _probe(layer, shape, seed)
        if y.shape != x.shape or not np.allclose(y, x * scale, rtol=1e-6, atol=0):
            return None
    kept = np.arange(channels - 1)
    new = type(layer).from_config(_rescaled_config(layer, kept.size))
    x, y = _probe(layer, shape, 2)
    out = new(keras.ops.convert_to_tensor(x[..., kept]))
    if [tuple(w.shape) for w in new.get_weights()] != [(kept.size,)]:
        return None
    new.set_weights([scale[kept]])
    out = np.asarray(keras.ops.convert_to_numpy(new(keras.ops.convert_to_tensor(x[..., kept]))))
    if not np.allclose(out, y[..., kept], rtol=1e-6, atol=0):
        return None
    return ChannelScaleRule(type(layer), f"{type(layer).__name__} (one scale per channel)")


# ----------------------------------------------------------------------------- the table

_RULES = {}
_CHANGES = [0]  # bumped by every (un)registration: a cached graph from before is stale
_USER_KINDS = {"per_unit": LayerRule, "per_element": PerElementRule, "flatten": FlattenRule,
               "global_pool": GlobalPoolRule, "tail": TailRule}


def table_version():
    """A number that changes whenever the table changes."""
    return _CHANGES[0]


def register_layer(cls, kind="per_unit", *, slicer=None, constants="call", description=None, refusal=None,
                   kernels=None, width=None, biases=()):
    """Teach the analysis and surgery a layer class of your own.

    A class that acts on each channel on its own (``kind="per_unit"``, with a
    ``slicer`` when it has per-channel weights); a class that makes units from
    kernels of its own (``kind="units"``, with ``kernels`` and ``width``: see
    :class:`KernelUnitsRule` for what it must compute); or a rule object, an
    instance of a :class:`LayerRule` subclass, whose methods say everything.

    Args:
        cls: a ``keras.layers.Layer`` subclass (matched exactly, not its
            subclasses), or a :class:`LayerRule` instance (the other
            arguments are then not used).
        kind: ``"per_unit"`` (default), ``"units"``, ``"per_element"``,
            ``"flatten"``, ``"global_pool"`` or ``"tail"``.
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
        'per_unit'
        >>> unregister_layer(Scale)
    """
    if isinstance(cls, LayerRule):
        rule = cls
        if not (isinstance(rule.cls, type) and issubclass(rule.cls, keras.layers.Layer)):
            fail("register_layer", "cls", "a rule whose cls is a keras.layers.Layer subclass", rule.cls)
        return _add(rule)
    if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
        fail("register_layer", "cls", "a keras.layers.Layer subclass or a LayerRule instance", cls)
    if kind == "units":
        return _add(_kernel_units_rule(cls, kernels, width, biases, slicer, description, refusal))
    for name, value, unset in (("kernels", kernels, None), ("width", width, None), ("biases", biases, ())):
        if value != unset:
            fail("register_layer", name, 'given only with kind="units"', value)
    if kind not in _USER_KINDS:
        fail("register_layer", "kind", "one of " + ", ".join(repr(k) for k in _USER_KINDS)
             + " (a layer of another kind is registered as a LayerRule subclass instance)", kind)
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


def _position_table(layer, kept):
    """KerasHub's ``PositionEmbedding``: its table ``(positions, channels)`` sliced by channel."""
    return layer.get_config(), [w[:, kept] for w in layer.get_weights()]


def _position_refusal(layer):
    for node in getattr(layer, "_inbound_nodes", ()):
        kwargs = node.arguments.kwargs
        if kwargs.get("positions") is not None or not isinstance(kwargs.get("start_index", 0), int):
            return "a PositionEmbedding called with positions or a start index given as tensors"
    return None


#: Layer classes of other packages, by module and name (the package is not imported here): a rule for each
#: is added the first time a layer of the class is met.
_BY_NAME = {  # module.name: (kind, description, rule of the class)
    "keras_hub.src.layers.modeling.position_embedding.PositionEmbedding": (
        "per_unit", "PositionEmbedding (KerasHub; its output is its table, sliced by channel)",
        lambda cls, description: LayerRule(cls, description, slicer=_position_table, constants=None,
                                           refusal=_position_refusal)),
}


def rule_of(layer):
    """The :class:`LayerRule` of ``layer``'s exact class; for a class not in the table, a rule recognized from
    what the layer computes (:func:`recognize`); else ``None``."""
    if isinstance(layer, ConstantValue):
        return _CONSTANT_RULE
    if isinstance(layer, ChannelSlice):
        return _SLICE_RULE
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
                 ) + tuple(description for description, rule_kind in named.items() if rule_kind == kind)


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
    }
    groups = {kind: supported_of(kind) for kind in KINDS if supported_of(kind)}
    lines = ["| kind | what the analysis and surgery do | layers |", "|---|---|---|"]
    lines += [f"| {kind} | {what[kind]} | {', '.join(groups[kind])} |" for kind in KINDS if kind in groups
              and kind in what]
    return "\n".join(lines)


def output_shape(layer, out_units):
    """The layer's output shape, ``(None, out_units)`` for a layer inside a model the graph cannot see into."""
    try:
        return tuple(layer.output.shape)
    except Exception:  # noqa: BLE001 - Keras raises several types for a layer with no single output
        return (None, out_units)


def variable_axes(output_shape):
    """The axes of a units layer's output, between batch and units, whose size is not known (``None``).

    A model built on ``keras.Input((None, 8))`` or ``(None, None, 3)`` takes
    sequences or images of any size: a layer before global pooling then has
    output positions that depend on the input, and its multiply-adds are
    counted per position of those axes (:meth:`UnitsRule.flops`).

    Example:
        >>> variable_axes((None, None, 12, 4)), variable_axes((None, 5, 4)), variable_axes((None, 4))
        ((1,), (), ())
    """
    shape = tuple(output_shape)
    return tuple(axis for axis in range(1, len(shape) - 1) if shape[axis] is None)


# ----------------------------------------------------------------------------- per-unit slicers and refusals


def _depthwise_refusal(layer):
    """DepthwiseConv with ``depth_multiplier=1``, or a Conv with one group per channel."""
    if getattr(layer, "depth_multiplier", 1) not in (1, None):
        return "a DepthwiseConv with depth_multiplier > 1 (one channel makes several)"
    reason = _adapted(layer)
    if reason is None and not activation_is_elementwise(layer.activation):
        return MIXES_UNITS
    return reason or _conv_refusal(layer)


def _per_unit_vectors(layer, kept):
    """Every weight is one value per channel (BatchNormalization's gamma, beta, moving mean and variance)."""
    return layer.get_config(), [w[..., kept] for w in layer.get_weights()]


def _prelu(layer, kept):
    """PReLU's alpha, shared over the spatial axes: sliced on its channel axis unless shared there too."""
    channels = int(layer.input.shape[-1])
    weights = []
    for w in layer.get_weights():
        weights.append(w[..., kept] if w.shape[-1] == channels else w)
    return layer.get_config(), weights


def _prelu_refusal(layer):
    try:
        rank = len(layer.input.shape)
    except Exception:  # noqa: BLE001 - unknown: refuse to be safe
        return "a PReLU whose input is unknown"
    shared = set(a % rank for a in (layer.shared_axes or ()))
    if rank > 2 and not set(range(1, rank - 1)) <= shared:
        return "a PReLU with a different alpha per position (set shared_axes to the spatial axes)"
    return None


def _depthwise(layer, kept):
    """DepthwiseConv (depth_multiplier 1): kernel ``(k..., C, 1)`` and bias ``(C,)`` sliced by channel."""
    weights = layer.get_weights()
    out = [weights[0][..., kept, :]]
    if len(weights) > 1:
        out.append(weights[1][kept])
    return layer.get_config(), out


def _batchnorm_refusal(layer):
    axis = layer.axis if isinstance(layer.axis, int) else None
    try:
        rank = len(layer.input.shape)
    except Exception:  # noqa: BLE001
        rank = None
    if axis is None or (axis != -1 and (rank is None or axis != rank - 1)):
        return "a BatchNormalization not on the last axis"
    return None


def _per_element(values, shape):
    """``values`` broadcast as Keras broadcasts them against a ``(batch, *shape)`` input, flattened."""
    values = np.asarray(keras.ops.convert_to_numpy(values))
    return np.broadcast_to(values, (1,) + tuple(shape)).reshape(-1)


def _input_shape(layer):
    # An axis of unknown size (None) counts as 1: only values that are the same at every position
    # along it (one per channel) reach a slicer there (one per element is refused on such a map).
    return tuple(1 if d is None else int(d) for d in layer.input.shape[1:])


def _normalization(layer, kept):
    """Normalization's mean and variance, one value per element of its input, sliced to ``kept``.

    ``y = (x - mean) / max(sqrt(variance), eps)`` (or its inverse) with the
    statistics broadcast over the input, whatever ``axis`` was: the kept
    elements keep their own statistics, so the map is unchanged on them. The
    result normalizes a flat vector of ``len(kept)`` values (``axis=-1``).
    """
    shape = _input_shape(layer)
    weights = layer.get_weights()
    if weights:  # adapted or loaded: the statistics are variables over the kept axes
        mean, variance = (np.reshape(w, np.shape(layer.mean)) for w in weights[:2])
    else:  # given to the constructor
        mean, variance = layer.mean, layer.variance
    mean = _per_element(mean, shape)[kept]
    variance = _per_element(variance, shape)[kept]
    config = layer.get_config()
    config.update(axis=-1, mean=None, variance=None)
    return config, [mean, variance, np.zeros((), "int64")]


def _rescaling(layer, kept):
    """Rescaling ``y = x * scale + offset``: scalars stay, per-element scale / offset are sliced to ``kept``.

    ``kept`` are entries of the input flattened (the input's elements) or
    channels of a map; a value per channel broadcast over the map gives
    channel ``c`` at flattened entry ``c``, so one slicing serves both.
    """
    if np.ndim(layer.scale) == 0 and np.ndim(layer.offset) == 0:
        return layer.get_config(), []
    shape = _input_shape(layer)
    config = layer.get_config()
    config["scale"] = _per_element(layer.scale, shape)[kept].tolist()
    config["offset"] = _per_element(layer.offset, shape)[kept].tolist()
    return config, []


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


def _shapes(layer):
    try:
        tensors = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        return [tuple(t.shape[1:]) for t in tensors]
    except Exception:  # noqa: BLE001 - unknown shapes: refuse
        return None


def _merge_refusal(layer):
    """Operands of one shape, or a squeeze-and-excite gate: operands that broadcast over the others' positions.

    Channel ``c`` of every operand is the same unit, so every operand has the
    same channels; an axis between batch and channels is the output's size or
    1 (the gate ``(1, 1, C)`` of a squeeze-and-excite block scales each
    channel of the ``(H, W, C)`` map by one value).
    """
    shapes = _shapes(layer)
    # A variable axis (None, e.g. time) is fine where every operand has it: the channels line up whatever
    # its size; an unknown channel count is not.
    if not shapes or any(not s or s[-1] is None for s in shapes):
        return "a merge whose operand shapes are unknown"
    if len(set(shapes)) == 1:
        return None
    full = _broadcast_shape(shapes)
    if full is None:
        return (f"a merge of tensors of shapes {', '.join(str(s) for s in shapes)} that do not broadcast channel "
                "by channel (only operands with the same channels, whose other axes are the output's or 1, are "
                "supported)")
    return None


def _broadcast_shape(shapes):
    """The output shape of operands that broadcast channel by channel (same rank and channels), else ``None``."""
    if len({len(s) for s in shapes}) != 1 or len({s[-1] for s in shapes}) != 1:
        return None
    full = []
    for sizes in zip(*shapes):
        # an axis of unknown size (None: a sequence's length after an EinsumDense) is the others' at run time
        big = {d for d in sizes if d != 1 and d is not None}
        if len(big) > 1:
            return None
        full.append(big.pop() if big else (None if None in sizes else 1))
    return tuple(full)


def broadcasts(layer):
    """bool per operand of a merge: it is smaller than the output (a gate broadcast over positions: an axis of
    size 1 where the output's is larger)."""
    shapes = _shapes(layer) or []
    full = _broadcast_shape(shapes) if shapes else None
    return tuple(full is not None and any(a == 1 and b != 1 for a, b in zip(s, full)) for s in shapes)


def _concat_refusal(layer):
    shapes = _shapes(layer)
    if not shapes:
        return "a Concatenate whose operand shapes are unknown"
    rank = len(shapes[0]) + 1
    if layer.axis % rank != rank - 1:
        return "a Concatenate on an axis other than the last (channels)"
    return None



def _register_builtin():
    L = keras.layers
    register_layer(InputRule(L.InputLayer, "the model's input"))
    register_layer(DenseRule(L.Dense))
    register_layer(EinsumDenseRule(L.EinsumDense, "EinsumDense (a Dense on the last axis: 'abc,cd->abd')"))
    for name in ("Conv1D", "Conv2D", "Conv3D"):
        register_layer(ConvRule(getattr(L, name), f"{name} (grouped too: whole groups pruned)"))
    for name in ("SeparableConv1D", "SeparableConv2D"):
        register_layer(SeparableConvRule(getattr(L, name)))
    for name in ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"):
        register_layer(ConvTransposeRule(getattr(L, name)))
    register_layer(EmbeddingRule(L.Embedding))
    if hasattr(L, "ReversibleEmbedding"):
        register_layer(ReversibleEmbeddingRule(L.ReversibleEmbedding, "ReversibleEmbedding (called forward)"))
    register_layer(RecurrentRule(L.SimpleRNN, 1))
    register_layer(RecurrentRule(L.GRU, 3))
    register_layer(RecurrentRule(L.LSTM, 4))
    register_layer(BidirectionalRule(L.Bidirectional, "Bidirectional (SimpleRNN, GRU, LSTM)"))
    register_layer(AttentionRule(L.MultiHeadAttention, "MultiHeadAttention (self-attention; heads pruned)"))
    for name in ("DepthwiseConv1D", "DepthwiseConv2D"):
        register_layer(DepthwiseRule(getattr(L, name), f"{name} (depth_multiplier=1)", slicer=_depthwise,
                                     refusal=_depthwise_refusal))
    for name in ("Dropout", "GaussianDropout", "GaussianNoise", "AlphaDropout"):
        register_layer(DropoutRule(getattr(L, name)))
    for name in ("SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "Identity"):
        register_layer(LayerRule(getattr(L, name), constants="identity"))
    for name in ("ReLU", "LeakyReLU", "ELU"):
        register_layer(LayerRule(getattr(L, name)))
    register_layer(ActivationRule(L.Activation, "Activation (elementwise)"))
    register_layer(BatchNormRule(L.BatchNormalization, "BatchNormalization (last axis)", slicer=_per_unit_vectors,
                                 refusal=_batchnorm_refusal))
    register_layer(LayerRule(L.PReLU, "PReLU (shared over positions)", slicer=_prelu, refusal=_prelu_refusal))
    for name in ("MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D",
                 "AveragePooling3D", "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D",
                 "UpSampling3D"):
        register_layer(LayerRule(getattr(L, name), constants="identity"))
    for name in ("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D"):
        register_layer(LayerRule(getattr(L, name), constants="zero_only"))
    register_layer(NormalizationRule(L.Normalization, slicer=_normalization))
    register_layer(RescalingRule(L.Rescaling, slicer=_rescaling))
    register_layer(FlattenRule(L.Flatten))
    # Adding or removing size-1 axes is a Flatten of a one-position map (or its inverse): units pass as they are.
    register_layer(FlattenRule(L.Reshape, "Reshape (adding or removing axes of size 1)", slicer=_reshape,
                               refusal=_reshape_refusal))
    for name in ("GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D",
                 "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D"):
        register_layer(GlobalPoolRule(getattr(L, name)))
    register_layer(TailRule(L.Softmax))
    register_layer(TailRule(L.Masking, "Masking (its mask reads every feature)"))
    register_layer(GroupNormRule(L.GroupNormalization, "GroupNormalization (whole groups kept or removed)"))
    for name in ("LayerNormalization", "RMSNormalization", "UnitNormalization"):
        if hasattr(L, name):
            register_layer(MixingNormalizationRule(getattr(L, name), f"{name} (its channels stay)"))
    for name in _MERGE_OPS:
        register_layer(MergeRule(getattr(L, name), name))
    register_layer(ConcatRule(L.Concatenate, "Concatenate (last axis)"))
    x = keras.Input((2, 2, 1))
    pad = keras.Model(x, keras.ops.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])).operations[-1]
    _add(PadRule(type(pad), "keras.ops.pad (zeros or -inf, positions only)"))
    item = keras.Model(x, x[:, 0]).operations[-1]
    _add(PositionSliceRule(type(item), "x[:, i] and other slices of the positions alone (keras.ops)"))


_register_builtin()
# Not in the table: no layer class of the user's is a constant, and the list of supported layers stays the layers'.
_CONSTANT_RULE = ConstantRule(ConstantValue, "a tensor no model input reaches")
_CHANNELS_FIRST_POOL = ChannelsFirstPoolRule(keras.layers.GlobalAveragePooling1D,
                                              "global pooling with data_format='channels_first' (every channel stays)")
_SLICE_RULE = ChannelSliceRule(ChannelSlice, "x[..., a:b] and keras.ops.split on the last axis (channels)")

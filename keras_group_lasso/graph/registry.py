"""One table of the layer classes that analysis and surgery understand.

Every layer class the package can see through has one :class:`LayerRule`: its
*kind*, how surgery slices it, how a constant channel passes through it, and
its multiply-adds. The graph (:mod:`keras_group_lasso.graph.build`), the masks
and report (:mod:`keras_group_lasso.analysis`), surgery and the error text
that lists what is supported all read this table, and
:func:`register_layer` adds a user's own per-channel layer to it.

Kinds:

* ``"units"``: makes new units (Dense, Conv1D/2D/3D, SeparableConv1D/2D). Its
  kernel seen as ``(positions, in_units, out_units)`` (:func:`kernel_view`):
  the slice ``[:, i, :]`` is the group of input unit ``i``, all its outgoing
  weights, the paper's group.
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

A constant channel (a unit whose incoming weights are all zero outputs
``act(b)`` everywhere) is removed and its value folded into the next units
layer's bias where that is exact. The rule of each layer says how a constant
passes: ``"call"`` (evaluated by the layer itself in inference mode),
``"identity"`` (pooling, cropping: the same constant), ``"zero_only"``
(zero padding makes the border 0, so only a constant 0 stays constant), or
``None`` (the channel is treated as varying afterwards).
"""

import dataclasses
import math

import keras
import numpy as np

__all__ = [
    "LayerRule",
    "register_layer",
    "unregister_layer",
    "rule_of",
    "supported_text",
    "supported_of",
    "kernel_view",
    "variable_axes",
    "ELEMENTWISE_ACTIVATIONS",
]

KINDS = ("units", "per_unit", "per_element", "flatten", "global_pool", "merge", "concat", "tail")
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


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """How the package treats one layer class.

    Attributes:
        cls: the layer class (matched exactly: a subclass may do anything).
        kind: one of ``"units"``, ``"per_unit"``, ``"flatten"``, ``"global_pool"``, ``"tail"``.
        description: a few words for the list of supported layers.
        slicer: ``(layer, kept) -> (config, weights)`` for a per-unit layer
            (``kept``: the channel indices that stay); ``None`` when the layer
            has no per-unit weights or config (its config is copied).
        constants: how a constant channel passes (see the module docstring).
        refusal: ``layer -> reason or None``, for configurations of the class
            that cannot be handled exactly (``None``: all are fine).
    """

    cls: type
    kind: str
    description: str
    slicer: object = None
    constants: object = "call"
    refusal: object = None


_RULES = {}
_CHANGES = [0]  # bumped by every (un)registration: a cached graph from before is stale


def table_version():
    """A number that changes whenever the table changes."""
    return _CHANGES[0]


def register_layer(cls, kind="per_unit", *, slicer=None, constants="call", description=None, refusal=None):
    """Teach the analysis and surgery a layer class of your own that acts on each channel on its own.

    Args:
        cls: a ``keras.layers.Layer`` subclass; matched exactly (not its subclasses).
        kind: ``"per_unit"`` (the one kind a user can add) or, for this
            package's own table, another kind.
        slicer: ``(layer, kept) -> (config, weights)``: the config and weights
            of the layer restricted to the channels ``kept`` (an int array);
            ``None`` if it has no per-channel weights (its config is copied).
        constants: ``"call"`` (a constant channel stays constant: surgery
            evaluates the layer on it), ``"identity"``, ``"zero_only"``, or
            ``None`` (a constant channel is treated as varying after it).
        description: words for the list of supported layers (default: the class name).
        refusal: optional ``layer -> reason or None``.

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
    from keras_group_lasso._validation import fail

    if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
        fail("register_layer", "cls", "a keras.layers.Layer subclass", cls)
    if kind not in KINDS:
        fail("register_layer", "kind", "one of " + ", ".join(repr(k) for k in KINDS), kind)
    if constants not in CONSTANTS:
        fail("register_layer", "constants", "one of 'call', 'identity', 'zero_only', None", constants)
    if slicer is not None and not callable(slicer):
        fail("register_layer", "slicer", "a callable (layer, kept) -> (config, weights) or None", slicer)
    rule = LayerRule(cls, kind, description or cls.__name__, slicer, constants, refusal)
    _RULES[cls] = rule
    _CHANGES[0] += 1
    return rule


def unregister_layer(cls):
    """Remove ``cls`` from the table (a class registered with :func:`register_layer`)."""
    _RULES.pop(cls, None)
    _CHANGES[0] += 1


def rule_of(layer):
    """The :class:`LayerRule` of ``layer``'s exact class, or ``None``."""
    return _RULES.get(type(layer))


def supported_of(kind):
    """The descriptions of the layers of one kind, in table order.

    Example:
        >>> "Dense" in supported_of("units")
        True
    """
    return tuple(rule.description for rule in _RULES.values() if rule.kind == kind)


def supported_text():
    """The supported layers, by kind, in words (for errors and the README)."""
    groups = {}
    for rule in _RULES.values():
        groups.setdefault(rule.kind, []).append(rule.description)
    titles = {
        "units": "layers that make units",
        "per_unit": "per-unit layers between them",
        "per_element": "per-element preprocessing (before the first of them, or between Dense layers)",
        "flatten": "reshaping",
        "global_pool": "global pooling",
        "merge": "merges of same-shape tensors (their channels are coupled)",
        "concat": "concatenation",
        "tail": "activations that mix units (every unit they read is kept)",
    }
    return "; ".join(f"{titles[k]}: {', '.join(groups[k])}" for k in KINDS if k in groups)


# ----------------------------------------------------------------------------- units layers


def kernel_view(kernel, in_units):
    """``kernel`` as ``(positions, in_units, out_units)``: ``[:, i, :]`` is input unit ``i``'s group.

    A Dense kernel ``(in, out)`` is ``(1, in, out)``; a convolution kernel
    ``(k..., C_in, C_out)`` is ``(prod(k), C_in, C_out)``; a Dense kernel after
    ``Flatten`` of a ``(..., C)`` map has rows ``p * C + c`` and is
    ``(positions, C, out)``.

    Example:
        >>> kernel_view(np.zeros((3, 3, 4, 8)), 4).shape
        (9, 4, 8)
    """
    kernel = np.asarray(kernel)
    in_units, out_units = int(in_units), kernel.shape[-1]
    positions = kernel.size // (in_units * out_units) if in_units * out_units else 1
    return kernel.reshape(positions, in_units, out_units)


def activation_is_elementwise(function):
    """``True`` for a Keras activation that acts on each scalar on its own."""
    try:
        name = keras.activations.serialize(function)
    except Exception:  # noqa: BLE001 - an unserializable function is simply unknown
        return False
    return isinstance(name, str) and name in ELEMENTWISE_ACTIVATIONS


def _conv_refusal(layer):
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        return "a convolution with data_format='channels_first'"
    if getattr(layer, "groups", 1) != 1:
        return "a grouped convolution (groups > 1)"
    if getattr(layer, "lora_enabled", False):
        return "a LoRA-enabled layer"
    if getattr(layer, "quantization_mode", None):
        return "a quantized layer"
    if not activation_is_elementwise(layer.activation):
        return "a layer whose activation mixes units"
    return None


def _dense_refusal(layer):
    if getattr(layer, "lora_enabled", False):
        return "a LoRA-enabled Dense layer"
    if getattr(layer, "quantization_mode", None):
        return "a quantized Dense layer"
    if not activation_is_elementwise(layer.activation):
        return "a layer whose activation mixes units"
    return None


def _depthwise_refusal(layer):
    if getattr(layer, "depth_multiplier", 1) != 1:
        return "a DepthwiseConv with depth_multiplier > 1 (one channel makes several)"
    return _conv_refusal(layer)


def _separable_refusal(layer):
    if getattr(layer, "depth_multiplier", 1) != 1:
        return "a SeparableConv with depth_multiplier > 1"
    return _conv_refusal(layer)


def units_weights(layer):
    """The thresholded weights of a units layer, by role: ``{"kernel", "pointwise", "bias"}`` (numpy)."""
    out = {}
    if type(layer).__name__.startswith("SeparableConv"):
        out["kernel"] = _numpy(layer.depthwise_kernel)
        out["pointwise"] = _numpy(layer.pointwise_kernel)
    else:
        out["kernel"] = _numpy(layer.kernel)
    out["bias"] = _numpy(layer.bias) if getattr(layer, "use_bias", False) and layer.bias is not None else None
    return out


def _numpy(variable):
    return np.asarray(keras.ops.convert_to_numpy(getattr(variable, "value", variable)))


def is_thresholded(layer):
    """``apply_threshold`` thresholds this layer's kernels and bias (Dense and every convolution)."""
    names = ("Dense", "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
             "SeparableConv2D")
    return any(type(layer) is getattr(keras.layers, n) for n in names)


def is_separable(layer):
    return type(layer).__name__.startswith("SeparableConv")


def same_padding(layer):
    """The layer pads its input with zeros (a constant is not constant at the border).

    A window of size 1 on every axis (a 1x1 convolution) pads nothing,
    whatever its ``padding`` and strides: ``"same"`` pads ``(ceil(n / s) - 1)
    * s + 1 - n <= 0`` entries, ``"causal"`` ``dilation * (1 - 1) = 0``.
    """
    if getattr(layer, "padding", "valid") not in ("same", "causal"):
        return False
    window = getattr(layer, "kernel_size", None)
    return not (window and all(int(k) == 1 for k in window))


def connections(layer, weights, in_units):
    """bool ``(in_units, out_units)``: input unit ``i`` reaches output unit ``j`` through a non-zero weight.

    ``weights`` are the thresholded weights (zeros are exact zeros).
    """
    if is_separable(layer):
        depthwise = kernel_view(weights["kernel"], in_units)  # (positions, C, m)
        pointwise = weights["pointwise"].reshape(int(in_units), -1, weights["pointwise"].shape[-1])  # (C, m, out)
        live = np.any(depthwise != 0, axis=0)  # (C, m)
        return np.einsum("cm,cmo->co", live.astype(np.int64), (pointwise != 0).astype(np.int64)) > 0
    return np.any(kernel_view(weights["kernel"], in_units) != 0, axis=0)


def constant_contribution(layer, weights, in_units, values):
    """What constant input units add to every output unit's pre-activation, ``(out_units,)`` float64.

    ``values[i]`` is the constant of input unit ``i`` (0 for the others). For
    a Dense layer (also after Flatten) and a convolution without padding every
    output position sees every constant through the whole kernel:
    ``sum_i values[i] * sum_p K[p, i, :]``. With zero padding only constants
    of exactly 0 are allowed (the caller checks); they add nothing.
    """
    values = np.asarray(values, np.float64)
    if is_separable(layer):
        depthwise = kernel_view(weights["kernel"], in_units).astype(np.float64).sum(axis=0)  # (C, m)
        pointwise = weights["pointwise"].reshape(-1, weights["pointwise"].shape[-1]).astype(np.float64)
        return (values[:, None] * depthwise).reshape(-1) @ pointwise
    return values @ kernel_view(weights["kernel"], in_units).astype(np.float64).sum(axis=0)


def slice_units(layer, weights, in_units, kept_in, kept_out):
    """``(config, weights)`` of a units layer keeping input units ``kept_in`` and output units ``kept_out``."""
    kept_in = np.asarray(kept_in, dtype=int)
    kept_out = np.asarray(kept_out, dtype=int)
    config = layer.get_config()
    kernel = weights["kernel"]
    if is_separable(layer):
        config["filters"] = int(kept_out.size)
        depthwise = kernel[..., kept_in, :]
        pointwise = weights["pointwise"]
        m = depthwise.shape[-1]
        rows = (kept_in[:, None] * m + np.arange(m)[None, :]).reshape(-1)
        pointwise = pointwise[..., rows, :][..., kept_out]
        new = [np.ascontiguousarray(depthwise), np.ascontiguousarray(pointwise)]
    else:
        view = kernel_view(kernel, in_units)[:, kept_in][:, :, kept_out]
        shape = kernel.shape[:-2] + (kept_in.size, kept_out.size) if kernel.ndim > 2 else None
        if kernel.ndim == 2:  # Dense, maybe after Flatten: rows p * C + c, p-major
            new_kernel = view.reshape(-1, kept_out.size)
        else:
            new_kernel = view.reshape(shape)
        new = [np.ascontiguousarray(new_kernel)]
        if "units" in config:
            config["units"] = int(kept_out.size)
        else:
            config["filters"] = int(kept_out.size)
    if weights["bias"] is not None:
        new.append(np.ascontiguousarray(weights["bias"][kept_out]))
    return config, new


def output_shape(layer, out_units):
    """The layer's output shape, ``(None, out_units)`` for a layer inside a model the graph cannot see into."""
    try:
        return tuple(layer.output.shape)
    except Exception:  # noqa: BLE001 - Keras raises several types for a layer with no single output
        return (None, out_units)


def node_flops(layer, node):
    """Multiply-adds per sample of the units node ``node`` (of ``layer``) with all its units.

    Per position of its output's variable axes when it has some (:func:`variable_axes`).
    """
    return units_flops(layer, node.positions, node.in_units, node.out_units, output_shape(layer, node.out_units))


def variable_axes(output_shape):
    """The axes of a units layer's output, between batch and units, whose size is not known (``None``).

    A model built on ``keras.Input((None, 8))`` or ``(None, None, 3)`` takes
    sequences or images of any size: a layer before global pooling then has
    output positions that depend on the input, and its multiply-adds are
    counted per position of those axes (:func:`units_flops`).

    Example:
        >>> variable_axes((None, None, 12, 4)), variable_axes((None, 5, 4)), variable_axes((None, 4))
        ((1,), (), ())
    """
    shape = tuple(output_shape)
    return tuple(axis for axis in range(1, len(shape) - 1) if shape[axis] is None)


def units_flops(layer, positions, in_units, out_units, output_shape):
    """Multiply-adds per sample of a units layer reading ``in_units`` and making ``out_units``.

    ``positions`` is the first axis of :func:`kernel_view` (kernel window, or
    the positions of a flattened map for a Dense layer), so a Dense layer
    costs ``positions * in * out`` and a convolution ``output positions *
    window * in * out``; a SeparableConv ``output positions * (window * in +
    in * out)``. An output axis of unknown size (``None``, see
    :func:`variable_axes`) counts as 1: the result is then the cost per
    position of those axes (the known axes counted in full).

    Example:
        >>> conv = keras.layers.Conv1D(4, 3)
        >>> units_flops(conv, 3, 8, 4, (None, 10, 4)), units_flops(conv, 3, 8, 4, (None, None, 4))
        (960, 96)
    """
    spatial = math.prod(int(d) for d in output_shape[1:-1] if d is not None) if len(output_shape) > 2 else 1
    if is_separable(layer):
        return spatial * (positions * in_units + in_units * out_units)
    return spatial * positions * in_units * out_units


def units_params(layer, positions, in_units, out_units, has_bias):
    """Parameters (kernels and bias) of a units layer reading ``in_units`` and making ``out_units``."""
    if is_separable(layer):
        kernel = positions * in_units + in_units * out_units
    else:
        kernel = positions * in_units * out_units
    return kernel + (out_units if has_bias else 0)


# ----------------------------------------------------------------------------- per-unit slicers


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


def _activation_refusal(layer):
    return None if activation_is_elementwise(layer.activation) else "an activation that mixes units"


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


def slice_layer(layer, kept):
    """``(config, weights)`` of a per-unit or per-element ``layer`` restricted to the units ``kept``."""
    rule = rule_of(layer)
    kept = np.asarray(kept, dtype=int)
    if rule is None or rule.slicer is None:
        return layer.get_config(), layer.get_weights()
    return rule.slicer(layer, kept)


# ----------------------------------------------------------------------------- merges

_MERGE_OPS = {
    keras.layers.Add: lambda values: np.sum(values, axis=0),
    keras.layers.Subtract: lambda values: values[0] - values[1],
    keras.layers.Average: lambda values: np.mean(values, axis=0),
    keras.layers.Maximum: lambda values: np.max(values, axis=0),
    keras.layers.Minimum: lambda values: np.min(values, axis=0),
    keras.layers.Multiply: lambda values: np.prod(values, axis=0),
}


def merge_constants(layer, operands):
    """The constants after a merge of ``operands`` (one array per operand; NaN: not constant)."""
    values = np.stack([np.asarray(v, np.float64) for v in operands])
    with np.errstate(invalid="ignore", over="ignore"):
        return _MERGE_OPS[type(layer)](values)  # NaN in any operand stays NaN


# Merges that are affine in each operand: a constant operand can leave as a scale and an offset.
_AFFINE_MERGES = (keras.layers.Add, keras.layers.Subtract, keras.layers.Average, keras.layers.Multiply)


def merge_fold(layer, operands):
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
    kind = type(layer)
    if kind not in _AFFINE_MERGES:
        return None
    values = [np.asarray(v, np.float64) for v in operands]
    dropped = tuple(bool(np.isfinite(v).all()) for v in values)
    if not any(dropped) or all(dropped):
        return None
    constants = [v for v, d in zip(values, dropped) if d]
    ones, zeros = np.ones_like(values[0]), np.zeros_like(values[0])
    if kind is keras.layers.Add:
        return dropped, ones, np.sum(constants, axis=0)
    if kind is keras.layers.Subtract:
        return (dropped, ones, -values[1]) if dropped[1] else (dropped, -ones, values[0])
    if kind is keras.layers.Average:
        n = len(values)
        return dropped, ones * (n - len(constants)) / n, np.sum(constants, axis=0) / n
    return dropped, np.prod(constants, axis=0), zeros


def _shapes(layer):
    try:
        tensors = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        return [tuple(t.shape[1:]) for t in tensors]
    except Exception:  # noqa: BLE001 - unknown shapes: refuse
        return None


def _merge_refusal(layer):
    shapes = _shapes(layer)
    # A variable axis (None, e.g. time) is fine where every operand has it: the channels line up whatever
    # its size; an unknown channel count is not.
    if not shapes or any(not s or s[-1] is None for s in shapes):
        return "a merge whose operand shapes are unknown"
    if len(set(shapes)) != 1:
        return (f"a merge of tensors of different shapes {', '.join(str(s) for s in shapes)} (broadcasting, as "
                "the gate of a squeeze-and-excite block does; only merges of same-shape tensors are supported)")
    return None


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
    for name in ("Conv1D", "Conv2D", "Conv3D"):
        register_layer(getattr(L, name), "units", description=name, refusal=_conv_refusal)
    for name in ("SeparableConv1D", "SeparableConv2D"):
        register_layer(getattr(L, name), "units", description=name, refusal=_separable_refusal)
    register_layer(L.Dense, "units", description="Dense", refusal=_dense_refusal)
    for name in ("DepthwiseConv1D", "DepthwiseConv2D"):
        register_layer(getattr(L, name), "per_unit", slicer=_depthwise, constants="call",
                       description=f"{name} (depth_multiplier=1)", refusal=_depthwise_refusal)
    for name in ("Dropout", "GaussianDropout", "GaussianNoise", "AlphaDropout", "SpatialDropout1D",
                 "SpatialDropout2D", "SpatialDropout3D", "Identity"):
        register_layer(getattr(L, name), "per_unit", constants="identity", description=name)
    for name in ("ReLU", "LeakyReLU", "ELU"):
        register_layer(getattr(L, name), "per_unit", constants="call", description=name)
    register_layer(L.Activation, "per_unit", constants="call",
                   description="Activation (elementwise)", refusal=_activation_refusal)
    register_layer(L.BatchNormalization, "per_unit", slicer=_per_unit_vectors, constants="call",
                   description="BatchNormalization (last axis)", refusal=_batchnorm_refusal)
    register_layer(L.PReLU, "per_unit", slicer=_prelu, constants="call",
                   description="PReLU (shared over positions)", refusal=_prelu_refusal)
    for name in ("MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D",
                 "AveragePooling3D", "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D",
                 "UpSampling3D"):
        register_layer(getattr(L, name), "per_unit", constants="identity", description=name)
    for name in ("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D"):
        register_layer(getattr(L, name), "per_unit", constants="zero_only", description=name)
    register_layer(L.Normalization, "per_element", slicer=_normalization, constants="call",
                   description="Normalization")
    register_layer(L.Rescaling, "per_element", slicer=_rescaling, constants="call", description="Rescaling")
    register_layer(L.Flatten, "flatten", constants="identity", description="Flatten")
    # Adding or removing size-1 axes is a Flatten of a one-position map (or its inverse): units pass as they are.
    register_layer(L.Reshape, "flatten", slicer=_reshape, constants="identity",
                   description="Reshape (adding or removing axes of size 1)", refusal=_reshape_refusal)
    for name in ("GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D",
                 "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D"):
        register_layer(getattr(L, name), "global_pool", constants="identity", description=name)
    register_layer(L.Softmax, "tail", constants=None, description="Softmax")
    for cls in _MERGE_OPS:
        register_layer(cls, "merge", constants=None, description=cls.__name__, refusal=_merge_refusal)
    register_layer(L.Concatenate, "concat", constants=None, description="Concatenate (last axis)",
                   refusal=_concat_refusal)


_register_builtin()

"""Layers of classes not in the table, recognized by what they compute: a weightless merge that is a linear
combination, a per-channel scale, an identity."""

import weakref

import keras
import numpy as np

from keras_group_lasso.graph.rules.base import LayerRule, call_arguments, layer_dtype
from keras_group_lasso.graph.rules.merge import MergeRule, broadcasts


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
    dtype = layer_dtype(layer)
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


class IdentityRule(LayerRule):
    """A layer of a class not in the table that is the identity at inference (stochastic depth, drop path)."""

    constants = "identity"
    inference_identity = True


_RECOGNIZED = weakref.WeakKeyDictionary()


def _probe(layer, shape, seed):
    """A random input of ``shape`` (unknown sizes: 3; magnitudes 1e-3 to 1e3, both signs, some zeros) in the
    layer's dtype, and what the layer makes of it."""
    shape = (2,) + tuple(3 if d is None else int(d) for d in shape[1:])
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4, size=shape) * (rng.random(shape) > 0.1)
    x = x.astype(layer_dtype(layer))
    kwargs = {"training": False} if "training" in call_arguments(layer) else {}
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


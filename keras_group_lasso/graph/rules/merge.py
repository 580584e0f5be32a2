"""Rules of merges: element-by-element merges, Concatenate, and the merges recognized by what they compute."""


import keras
import numpy as np

from keras_group_lasso.graph.rules.base import Kind, LayerRule

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

    kind = Kind.MERGE
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

    kind = Kind.CONCAT
    constants = None

    def refusal(self, layer):
        return _concat_refusal(layer)


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


def _shapes(layer):
    try:
        tensors = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        return [tuple(t.shape[1:]) for t in tensors]
    except Exception:  # noqa: BLE001 - unknown shapes: refuse
        return None


def builtin_rules():
    """The rules of Keras's merge layers."""
    layers = keras.layers
    return [*(MergeRule(getattr(layers, name), name) for name in _MERGE_OPS),
            ConcatRule(layers.Concatenate, "Concatenate (last axis)")]

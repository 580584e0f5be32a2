"""Widths in whole blocks (``round_to``): which layers may change width, what a width costs, and setting one.

A *roundable* layer is a Dense or convolution layer whose units one other
layer reads (outside a residual stream, through a plain group penalty): its
width can change without touching anything else. :func:`plan_widths` picks a
multiple of ``round_to`` for each within a budget (pure: it reads an analysis,
not the model); :func:`apply_width` writes one width into the model.
"""

import keras
import numpy as np

from keras_group_lasso import prox
from keras_group_lasso.budget import schedule
from keras_group_lasso.graph import registry
from keras_group_lasso.regularizers import CoupledGroupLasso, GroupSparseRegularizer

__all__ = ["Roundable", "roundable_layers", "rounded_up", "plan_widths", "width_choices", "sizes_with",
           "apply_width", "spare_blocks"]


def rounded_up(found, round_to, grow):
    """The roundable layers of ``found``, each at the multiple of ``round_to`` at or above its live units."""
    layers = roundable_layers(found)
    for layer in layers:
        layer.choices = width_choices(layer.units, layer.live, round_to, grow)
        above = [c for c in layer.choices if c >= layer.live and (c % round_to == 0 or c == layer.units)]
        layer.width = min(above) if above else max(layer.choices)
    return layers


def plan_widths(found, sizes, limits, round_to, grow, latency=None):
    """``(layers, sizes)``: each roundable layer's width (``layer.width``) within ``limits``, and the sizes then.

    Every layer starts at the multiple at or above its live units (or all its
    units), then, while the model is over its budget, the layer whose step
    down loses the least group strength per budget share goes a step down; a
    layer goes below ``round_to`` only when whole blocks cannot meet the
    budget. ``found``: an :class:`~keras_group_lasso.analysis.Analysis`;
    ``sizes``: its report's sizes; ``latency``: see :func:`sizes_with`.
    """
    layers = rounded_up(found, round_to, grow)
    if not layers:
        return [], dict(sizes)
    by_name = {layer.name: layer for layer in layers}

    def load(estimated):  # budgets' sum of size / limit: what a step down buys
        return sum(estimated[kind] / max(limit, 1) for kind, limit in limits.items())

    current = sizes_with(found, sizes, by_name, latency)
    for narrow in (False, True):
        while schedule.over(current, limits) > 1.0:
            best = None
            for layer in layers:
                lower = [c for c in layer.choices if c < layer.width
                         and (narrow or c % round_to == 0 or c == layer.units)]
                if not lower:
                    continue
                width, layer.width = layer.width, max(lower)
                smaller = sizes_with(found, sizes, by_name, latency)
                layer.width, lost = width, float(np.sum(layer.scores[max(lower):width]))
                gain = load(current) - load(smaller)
                if gain > 0 and (best is None or lost / gain < best[0]):
                    best = (lost / gain, layer, max(lower), smaller)
            if best is None:
                break
            _, layer, layer_width, current = best
            layer.width = layer_width
    return layers, current


class Roundable:
    """A layer whose units one other layer reads: its width can change without touching anything else.

    ``order``: its units, strongest first (live by outgoing group strength over
    the reader's median, then dead ones by incoming strength); ``scores`` the
    same order's strengths (0 for dead units); ``rows[j]``: the reader's group
    row of unit ``j``.
    """

    def __init__(self, name, layer, reader_name, reader, rows, live_mask, outgoing_rms, incoming_rms):
        self.name, self.layer, self.reader_name, self.reader = name, layer, reader_name, reader
        self.rows = rows
        self.units = int(live_mask.size)
        self.live = int(live_mask.sum())
        live_scale = float(np.median(outgoing_rms[live_mask])) if self.live else 1.0
        strength = np.where(live_mask, outgoing_rms / (live_scale or 1.0), 0.0)
        self.order = np.array(sorted(range(self.units), key=lambda j: (not live_mask[j], -strength[j],
                                                                       -incoming_rms[j], j)), dtype=int)
        self.scores = strength[self.order]
        self.choices, self.width = (), self.live


def roundable_layers(found):
    """The layers of ``found`` (an :class:`~keras_group_lasso.analysis.Analysis`) a rounding may resize.

    A Dense or convolution layer (not separable, not the output) each of
    whose units is made by it alone and read by one group row of one other
    layer, whose kernel has a plain (uncoupled) group penalty; units on a
    residual stream or read twice stay as they are, and so do frozen layers (``trainable=False``) and the
    units a frozen layer reads.
    """
    graph, masks = found.graph, found.masks
    makers, readers = {}, {}
    for node in graph.units:
        for unit in node.out_ids:
            makers.setdefault(int(unit), []).append(node.name)
        for row, unit in enumerate(node.in_ids):
            readers.setdefault(int(unit), []).append((node.name, row))
    streamed = {int(u) for stream in graph.streams for u in stream.ids}
    out = []
    for node in graph.units:
        layer = graph.layers[node.name]
        if node.is_output or not _one_plain_kernel(layer) or not layer.trainable:
            continue
        found_readers = [readers.get(int(u), []) for u in node.out_ids]
        if any(len(r) != 1 or len(makers[int(u)]) != 1 or int(u) in streamed
               for u, r in zip(node.out_ids, found_readers)):
            continue
        names = {r[0][0] for r in found_readers}
        if len(names) != 1:
            continue
        reader_name = names.pop()
        reader = graph.layers[reader_name]
        penalty = getattr(getattr(reader, "kernel", None), "regularizer", None)
        if (not _one_plain_kernel(reader) or not isinstance(penalty, GroupSparseRegularizer)
                or isinstance(penalty, CoupledGroupLasso) or not reader.trainable):
            continue
        if not np.any(masks.units[node.name]):
            continue
        rows = np.array([r[0][1] for r in found_readers], dtype=int)
        kernel = np.asarray(keras.ops.convert_to_numpy(reader.kernel), dtype=np.float64)
        view = kernel.reshape(penalty.group_shape(kernel.shape))
        outgoing = np.sqrt(np.mean(view ** 2, axis=prox.group_axes(view.shape)))[rows]
        own = np.asarray(keras.ops.convert_to_numpy(layer.kernel), dtype=np.float64)
        incoming = np.sqrt(np.mean(own.reshape(-1, own.shape[-1]) ** 2, axis=0))
        out.append(Roundable(node.name, layer, reader_name, reader, rows, np.asarray(masks.units[node.name]),
                              outgoing, incoming))
    return out


def _one_plain_kernel(layer):
    """One kernel ``(..., in, out)`` (not a SeparableConv's two, not a transposed convolution's ``(..., out, in)``)."""
    return registry.units_rule(layer).rounds


def width_choices(units, live, step, grow):
    """The widths a layer may take: multiples of ``step``, all its units, and its own width below ``step``."""
    choices = {c for c in range(step, units + 1, step)} | {units}
    if live < step or live == units:
        choices.add(live)
    if not grow:
        choices = {c for c in choices if c <= live}
    return sorted(c for c in choices if c >= 1)


def sizes_with(found, sizes, widths, latency=None):
    """``sizes`` with the layers in ``widths`` (name: :class:`Roundable`) at their ``width``.

    ``latency``: ``None``, or a function of ``{layer name: (input units, output units)}`` that gives the
    ``"latency"`` size (a :class:`~keras_group_lasso.LatencyTable`'s prediction).
    """
    graph, masks = found.graph, found.masks
    kept_in = {node.name: int(masks.inputs[node.name].sum()) for node in graph.units}
    kept_out = {node.name: int(masks.units[node.name].sum()) for node in graph.units}
    new_in, new_out = dict(kept_in), dict(kept_out)
    for name, layer in widths.items():
        new_out[name] = layer.width
        new_in[layer.reader_name] += layer.width - layer.live
    out = dict(sizes)
    per_channel = np.zeros(graph.n_ids)  # a depthwise convolution's window over each unit it reads
    for each, ids in graph.channel_costs().values():
        np.add.at(per_channel, ids, each)
    for node in graph.units:
        name = node.name
        if (new_in[name], new_out[name]) == (kept_in[name], kept_out[name]):
            continue
        if name in widths:
            out["flops"] += float(np.mean(per_channel[node.out_ids])) * (new_out[name] - kept_out[name])
        layer = graph.layers[name]
        rule = registry.units_rule(layer)
        shape = graph.output_shape(name, node.out_units)
        has_bias = getattr(layer, "bias", None) is not None
        for kind, count in (("flops", lambda i, o: rule.flops(layer, node.positions, i, o, shape)),
                            ("params", lambda i, o: rule.params(layer, node.positions, i, o, has_bias))):
            out[kind] += count(new_in[name], new_out[name]) - count(kept_in[name], kept_out[name])
        if not node.is_output:
            out["units"] += new_out[name] - kept_out[name]
    if latency is not None:
        out["latency"] = latency({node.name: (new_in[node.name], new_out[node.name]) for node in graph.units})
    return out


def apply_width(layer, threshold, rng):
    """Set ``layer`` to its ``width``: zero the reader rows of the units that go, re-initialize those that come.

    Returns the ``(variable path, row)`` of every group that comes back (no longer held at zero).
    """
    keep = set(int(j) for j in layer.order[:layer.width])
    kernel = layer.reader.kernel
    penalty = kernel.regularizer
    value = np.array(keras.ops.convert_to_numpy(kernel))
    view = value.reshape(penalty.group_shape(value.shape))
    own_value = np.array(keras.ops.convert_to_numpy(layer.layer.kernel))
    own = own_value.reshape(-1, own_value.shape[-1])
    live_rows = [int(layer.rows[j]) for j in keep if np.max(np.abs(view[..., layer.rows[j], :])) > threshold]
    out_scale = max(0.1 * _rms(view[..., live_rows, :]), 4.0 * threshold)
    live_cols = [j for j in keep if np.max(np.abs(own[:, j])) > threshold]
    in_scale = max(_rms(own[:, live_cols]), 4.0 * threshold)
    # A new column reads only the inputs that are live now: a zero input group stays zero (a unit cut
    # from the layer before must not come back through the weights of a unit that grows here).
    own_penalty = getattr(layer.layer.kernel, "regularizer", None)
    if isinstance(own_penalty, GroupSparseRegularizer):
        groups = own_value.reshape(own_penalty.group_shape(own_value.shape))
        alive = np.max(np.abs(groups), axis=prox.group_axes(groups.shape)) > threshold
        reads = np.broadcast_to(alive.reshape((1,) * (groups.ndim - 2) + (-1, 1)), groups.shape)
        reads = reads.reshape(own.shape)[:, 0]
    else:
        reads = np.ones(own.shape[0], dtype=bool)
    back = set()
    for j in range(layer.units):
        row = int(layer.rows[j])
        if j not in keep:
            view[..., row, :] = 0.0
            continue
        if np.max(np.abs(view[..., row, :])) <= threshold:
            view[..., row, :] = _drawn(rng, out_scale, view[..., row, :].shape, threshold)
            back.add((kernel.path, row))
        if np.max(np.abs(own[:, j])) <= threshold:
            own[:, j] = _drawn(rng, in_scale, own.shape[:1], threshold, reads)
    kernel.assign(value)
    layer.layer.kernel.assign(own_value)
    return back


def spare_blocks(found, round_to):
    """Keep the penalties off the ``round_to`` strongest units of each roundable layer; returns ``{name: round_to}``.

    The layers of ``found`` (an :class:`~keras_group_lasso.analysis.Analysis`) a rounding may resize, each spared
    in its reader's penalty where that reads this layer alone, for this ``fit``.
    """
    spared = {}
    for layer in roundable_layers(found):
        penalty = layer.reader.kernel.regularizer
        groups = penalty.group_shape(tuple(layer.reader.kernel.shape))[-2]
        if len(layer.rows) == groups and round_to < layer.units:  # the reader reads this layer alone
            penalty.spared = max(penalty.spared, round_to)
            spared[layer.name] = round_to
    return spared


def _drawn(rng, scale, shape, threshold, reads=None):
    """Normal weights of ``scale`` (zero where ``reads`` is False) whose largest magnitude is above ``threshold``
    (at least twice it), so that the unit they bring back counts as live: a group of one weight (the row of a
    one-output layer) would otherwise be drawn dead about one time in five at the least scale."""
    values = rng.normal(scale=scale, size=shape)
    allowed = np.ones(shape, dtype=bool) if reads is None else np.broadcast_to(reads, shape)
    values = np.where(allowed, values, 0.0)
    if allowed.any() and np.max(np.abs(values)) <= threshold:
        at = np.unravel_index(np.argmax(np.where(allowed, np.abs(values), -1.0)), shape)
        values[at] = (1.0 if values[at] >= 0 else -1.0) * 2.0 * threshold
    return values


def _rms(values):
    return float(np.sqrt(np.mean(values ** 2))) if values.size else 0.0

"""Which units survive: one fixed point over a :class:`~keras_group_lasso.graph.build.ModelGraph`.

On thresholded weights (a weight ``|w| <= threshold`` is an exact zero), over
the units of every tensor (:attr:`Node.ids`, coupled across merges):

* forward, *constants*: an input feature varies, and so does a constant
  tensor of the graph (positions: a value per position, not per channel).
  A unit that a layer makes is a constant when every input unit with a
  non-zero weight into it contributes a constant (a constant input unit does, unless this layer pads
  with zeros and the constant is not 0): it outputs ``act(b + sum_i c_i *
  sum_p K[p, i, :])`` everywhere. Constants pass through per-unit layers
  (zero padding stops all but 0) and merges (an operand that varies makes the
  result vary); a layer that mixes units (softmax) is constant only when
  everything it reads is. Apart from that, *depends*: which units an input
  feature reaches through non-zero weights (``live_path``: some output does).
* backward, *needed*: every unit of a model output and every unit read by a
  unit-mixing layer is needed; a unit is needed when a layer reads it through
  a non-zero weight into a needed unit and its constant cannot be added to
  that layer's bias (it varies, the layer has no bias, or the layer pads with
  zeros and the constant is not 0). Repeated to a fixed point. A unit that is
  not needed goes from every layer that makes it and every tensor it lives
  in; its constant is folded into its readers' biases
  (``b' = b + sum_i c_i * sum_p K[p, i, :]``). A layer whose needed units read
  only folded constants keeps one input unit (a layer cannot read nothing).

Between the two passes, *merge folds*: an operand of ``Add``, ``Subtract``,
``Average`` or ``Multiply`` that is constant on every channel leaves (the
merge then scales and offsets the others' merge, :meth:`registry.MergeRule.fold`),
and every node that reaches an output only through such operands is
*detached*: its units layers make none of the units they share with the
stream and keep none of their own.

An input feature is *selected* when it is needed; the channels of an input
map (a CNN's input) are all kept.
"""

import dataclasses

import numpy as np

from keras_group_lasso.graph import registry
from keras_group_lasso.graph.registry import threshold_array
from keras_group_lasso.graph.rules.base import Kind

__all__ = ["UnitMasks", "MergeFold", "compute_masks", "pass_constants", "needed_units", "threshold_array"]


@dataclasses.dataclass(frozen=True, eq=False)
class UnitMasks:
    """What survives, per units layer, at one threshold (read-only numpy arrays).

    Attributes:
        threshold: weights with ``|w| <= threshold`` count as zero.
        layer_names: the units layers, input to output.
        features: bool ``(n_features,)``, the selected input features (input units of the first layer).
        inputs: ``{name: bool (in_units,)}``, the kept input units of each layer.
        units: ``{name: bool (out_units,)}``, the kept units (all of the output layer's).
        constant: ``{name: bool (out_units,)}``, units whose output is a constant
            (no non-zero weight from a varying input).
        folded: ``{name: bool (out_units,)}``, constant units removed by surgery,
            their value added to the next layer's bias.
        fold_values: ``{name: float64 (out_units,)}``: the value of each folded
            unit as the next layer reads it (0 elsewhere).
        fold_in: ``{name: float64 (out_units,)}``: what the folded units of the
            layer before add to this layer's bias.
        connections: ``{name: bool (in_units, out_units)}``: non-zero paths.
        roles: ``{name: "input" | "hidden"}``.
        is_output: ``{name: bool}``.
        live_path: some input feature reaches the output through non-zero
            weights (otherwise the output is a constant).
        merge_folds: ``{merge name: MergeFold}``, merges that drop their
            constant operands (:meth:`registry.MergeRule.fold`).
        detached: names of the nodes whose every path to an output ends in a
            dropped operand: surgery builds none of them (their units layers
            keep no unit).
    """

    threshold: float
    layer_names: tuple
    features: np.ndarray
    inputs: dict
    units: dict
    constant: dict
    folded: dict
    fold_values: dict
    fold_in: dict
    connections: dict
    roles: dict
    is_output: dict
    live_path: bool = True
    merge_folds: dict = dataclasses.field(default_factory=dict)
    detached: frozenset = frozenset()


@dataclasses.dataclass(frozen=True, eq=False)
class MergeFold:
    """A merge whose operands that are constant on every channel leave: ``scale * merge(the others) + offset``.

    Attributes:
        name: the merge layer.
        dropped: one bool per operand, in call order: True for a constant operand that leaves.
        scale, offset: float64 per channel of the merge's output (read-only).
    """

    name: str
    dropped: tuple
    scale: np.ndarray
    offset: np.ndarray

    @property
    def is_identity(self):
        """``scale`` 1 and ``offset`` 0 everywhere: the kept operands' merge alone is the output."""
        return bool(np.all(self.scale == 1) and np.all(self.offset == 0))


def _readonly(array):
    array.setflags(write=False)
    return array


def pass_constants(layer, values, threshold=0.0):
    """Constants ``values`` (NaN: not constant) after ``layer``; NaN where a constant stops being one."""
    values = np.asarray(values, np.float64)
    rule = registry.rule_of(layer)
    if rule is None:
        return np.full_like(values, np.nan)
    return rule.pass_constants(layer, values, threshold)


def _entries_of(part):
    """The entries of its input's last axis that a :class:`~keras_group_lasso.graph.registry.ChannelSlice` takes."""
    return slice(part.start, part.stop)


def compute_masks(graph, weights, threshold, round_to=1, uniform=False):
    """The :class:`UnitMasks` of ``graph`` with the thresholded ``weights`` (``{name: UnitsRule.weights}``).

    ``round_to``: keep a multiple of it of the units each hidden layer makes
    (:func:`_round_up`); 1 keeps exactly the units the fixed point needs.
    ``uniform``: the layers at the same place of the calls of blocks of one
    class keep as many units each (:func:`_even_out`).
    """
    layers = graph.layers
    rules = {n.name: registry.units_rule(layers[n.name]) for n in graph.units}
    conn = {n.name: rules[n.name].connections(layers[n.name], weights[n.name], n.in_units) for n in graph.units}
    # A recurrent layer reads its own units: unit j is needed when it feeds a needed unit of the same layer.
    recur = {n.name: r for n in graph.units
             if (r := rules[n.name].recurrence(layers[n.name], weights[n.name])) is not None}
    if not graph.supported:
        return _all_kept(graph, conn, threshold)
    units = {n.name: n for n in graph.units}

    # Forward: the constant on every channel of every tensor (NaN: it varies), and whether it depends on the input.
    const, depends = {}, {}
    for node in graph.nodes:
        if node.kind == Kind.INPUT:
            depends[node.name] = np.ones(node.ids.size, dtype=bool)
        elif node.kind == Kind.CONSTANT:  # no input reaches it (positions)
            depends[node.name] = np.zeros(node.ids.size, dtype=bool)
        elif node.kind == Kind.UNITS:
            depends[node.name] = conn[node.name][depends[node.inputs[0]]].any(axis=0)
            while node.name in recur:  # what a unit that depends feeds through the recurrence depends too
                more = depends[node.name] | recur[node.name][depends[node.name]].any(axis=0)
                if np.array_equal(more, depends[node.name]):
                    break
                depends[node.name] = more
        elif node.kind == Kind.MERGE:
            depends[node.name] = np.any([depends[i] for i in node.inputs], axis=0)
        elif node.kind == Kind.CONCAT:
            depends[node.name] = np.concatenate([depends[i] for i in node.inputs])
        elif node.kind in (Kind.TAIL, Kind.WHOLE):
            depends[node.name] = np.full(node.ids.size, any(depends[i].any() for i in node.inputs))
        elif node.kind == Kind.SLICE:
            depends[node.name] = depends[node.inputs[0]][_entries_of(layers[node.name])]
        else:
            depends[node.name] = depends[node.inputs[0]].copy()
        # a constant varies along its positions: not one per channel
        if node.kind in (Kind.INPUT, Kind.CONSTANT, Kind.WHOLE):
            const[node.name] = np.full(node.ids.size, np.nan)
        elif node.kind == Kind.UNITS:
            const[node.name] = _units_constants(layers[node.name], units[node.name], weights[node.name],
                                                const[node.inputs[0]], conn[node.name])
        elif node.kind == Kind.MERGE:
            layer = layers[node.name]
            const[node.name] = registry.rule_of(layer).merge_constants(layer, [const[i] for i in node.inputs])
        elif node.kind == Kind.CONCAT:
            const[node.name] = np.concatenate([const[i] for i in node.inputs])
        elif node.kind == Kind.SLICE:
            const[node.name] = const[node.inputs[0]][_entries_of(layers[node.name])]
        elif node.kind == Kind.TAIL:  # mixes units: constant only when everything it reads is
            values = const[node.inputs[0]]
            const[node.name] = (np.full(values.size, np.nan) if np.isnan(values).any()
                                else registry.call_on_constants(layers[node.name], values))
        elif node.kind in (Kind.FLATTEN, Kind.GLOBAL_POOL) or node.elements:
            const[node.name] = const[node.inputs[0]].copy()
        else:
            const[node.name] = pass_constants(layers[node.name], const[node.inputs[0]], threshold)

    # A merge operand that is constant on every channel leaves as a scale and an offset; what only it
    # used is detached. Units are ids shared by the operands of a merge, so this is decided per node,
    # before the ids: a detached layer makes none of the units it shares with the stream.
    merge_folds = {}
    for node in graph.nodes:
        if node.kind == Kind.MERGE:
            layer = layers[node.name]
            fold = registry.rule_of(layer).fold(layer, [const[i] for i in node.inputs])
            if fold is not None:
                dropped, scale, offset = fold
                merge_folds[node.name] = MergeFold(node.name, dropped, _readonly(scale), _readonly(offset))
    detached = _detached(graph, merge_folds)

    # Backward: a unit is needed when a model output or a unit-mixing layer holds it, or a needed
    # unit reads it through a non-zero weight and its constant cannot be folded into that reader's bias.
    needed = np.zeros(graph.n_ids, dtype=bool)
    for name in graph.outputs:
        needed[graph.tensor(name).ids] = True
    for node in graph.nodes:
        if node.name in detached:
            continue
        if node.kind in (Kind.TAIL, Kind.WHOLE):
            for name in node.inputs:  # every tensor it reads (cross-attention reads two)
                needed[graph.tensor(name).ids] = True
        if node.kind == Kind.WHOLE:  # its outputs are positions: no layer makes or removes them
            needed[node.ids] = True
        if node.kind == Kind.UNITS and rules[node.name].mixes_units(layers[node.name]):
            needed[units[node.name].out_ids] = True
    feature_ids = graph.feature_ids
    needed[feature_ids[graph.kept_features_always]] = True  # the channels of an input map all stay
    live_path = any(depends[name].any() for name in graph.outputs)
    foldable = {n.name: _foldable(layers[n.name], weights[n.name], const[n.source]) for n in graph.units}
    # The calls of a shared layer share its bias: a constant can leave only when it is 0 in every call.
    for name, first in graph.calls.items():
        if name in foldable:
            zero = [np.isfinite(const[graph.node(n).source]) & (const[graph.node(n).source] == 0) for n in (first, name)]
            foldable[first] = foldable[first] & zero[0] & zero[1]
            foldable[name] = foldable[first]
    for name, first in graph.calls.items():  # a layer called three times: its first call settled last
        if name in foldable:
            foldable[name] = foldable[first]
    # Channels kept or removed together (a GroupNormalization's groups): one needed makes all of them needed.
    # A grouped convolution's groups: the input channels and filters of one convolution group, all or none.
    together = [node.ids[group] for node in graph.nodes
                if node.name not in detached and node.kind == Kind.PER_UNIT
                for group in registry.rule_of(layers[node.name]).unit_groups(layers[node.name])]
    together += [np.concatenate([node.in_ids[reads], node.out_ids[makes]]) for node in graph.units
                 if node.name not in detached for reads, makes in rules[node.name].tied_units(layers[node.name])]
    recur = _Ties(recur, together)
    _settle(graph, conn, foldable, needed, detached, live_path, recur)
    _pair_halves(graph, conn, foldable, needed, detached, live_path, recur)
    if round_to > 1:
        _round_up(graph, conn, foldable, needed, detached, live_path, round_to, recur)
        _pair_halves(graph, conn, foldable, needed, detached, live_path, recur)
    if uniform:  # until each pass keeps nothing more: pairing halves may widen one sibling again
        siblings = block_siblings(graph)
        while _even_out(graph, conn, foldable, needed, detached, live_path, recur, siblings):
            _pair_halves(graph, conn, foldable, needed, detached, live_path, recur)

    inputs, kept, constant, folded, fold_values, fold_in = {}, {}, {}, {}, {}, {}
    for node in graph.units:
        name = node.name
        source = const[node.source]
        inputs[name] = needed[node.in_ids] & (name not in detached)
        kept[name] = needed[node.out_ids] & (name not in detached)
        values = np.where(~inputs[name] & foldable[name], source, 0.0)
        fold_in[name] = rules[name].constant_contribution(layers[name], weights[name], node.in_units, values)
        out = const[name]
        constant[name] = np.isfinite(out)
        folded[name] = constant[name] & ~kept[name]
        fold_values[name] = np.where(folded[name], out, 0.0)
    features = needed[feature_ids]
    for d in (inputs, kept, constant, folded, fold_values, fold_in, conn):
        for value in d.values():
            _readonly(value)
    return UnitMasks(
        threshold=threshold,
        layer_names=tuple(n.name for n in graph.units),
        features=_readonly(np.array(features)),
        inputs=inputs,
        units=kept,
        constant=constant,
        folded=folded,
        fold_values=fold_values,
        fold_in=fold_in,
        connections=conn,
        roles={n.name: "input" if n.reads_input else "hidden" for n in graph.units},
        is_output={n.name: n.is_output for n in graph.units},
        live_path=bool(live_path),
        merge_folds=merge_folds,
        detached=detached,
    )


@dataclasses.dataclass(frozen=True)
class _Ties:
    """What else makes a unit needed: ``recurrence`` ``{units layer: bool (out, out)}`` (unit j feeds unit k
    inside a recurrent layer) and ``together``, id arrays that stay or go as one (a GroupNormalization's groups)."""

    recurrence: dict
    together: list


def _settle(graph, conn, foldable, needed, detached, live_path, recur=None):
    """The backward fixed point: mark (in place) every unit that a needed unit reads and cannot fold."""
    recur = recur or _Ties({}, [])
    changed = True
    while changed:
        changed = False
        for ids in recur.together:  # channels that stay together: one needed, all needed
            if needed[ids].any() and not needed[ids].all():
                needed[ids] = True
                changed = True
        for node in graph.units:
            out = needed[node.out_ids]
            if not out.any() or node.name in detached:
                continue
            if node.name in recur.recurrence:  # its own units that feed a needed one through the recurrence
                feeds = recur.recurrence[node.name][:, out].any(axis=1) & ~out
                if feeds.any():
                    needed[node.out_ids[feeds]] = True
                    out = needed[node.out_ids]
                    changed = True
            reads = conn[node.name][:, out].any(axis=1) & ~foldable[node.name]
            new = reads & ~needed[node.in_ids]
            if live_path and not reads.any() and not needed[node.in_ids].any() and node.in_units:
                # Everything it reads is folded, but a layer cannot read nothing: keep one unit
                # (its constant is then computed, not folded: the same outputs).
                new = np.arange(node.in_units) == 0
            if new.any():
                needed[node.in_ids[new]] = True
                changed = True


def _pair_halves(graph, conn, foldable, needed, detached, live_path, recur):
    """Keep (in place) as many units in both halves of a layer whose halves must be as wide (``Bidirectional``).

    The half that keeps fewer keeps some of its dead units too (those that
    make the fewest other units needed first): their outgoing weights are
    zero, so the outputs do not change.
    """
    changed = True
    while changed:
        changed = False
        for node in graph.units:
            if node.name in detached or not registry.units_rule(graph.layers[node.name]).paired_halves(
                    graph.layers[node.name]):
                continue
            half = node.out_units // 2
            ids = (node.out_ids[:half], node.out_ids[half:])
            counts = [int(needed[i].sum()) for i in ids]
            if counts[0] == counts[1]:
                continue
            short = 0 if counts[0] < counts[1] else 1
            offset = 0 if short == 0 else half
            dead = np.flatnonzero(~needed[ids[short]])
            reads = conn[node.name][:, offset + dead] & (~foldable[node.name] & ~needed[node.in_ids])[:, None]
            order = np.lexsort((dead, reads.sum(axis=0)))[: abs(counts[0] - counts[1])]
            needed[ids[short][dead[order]]] = True
            _settle(graph, conn, foldable, needed, detached, live_path, recur)
            changed = True


def _round_up(graph, conn, foldable, needed, detached, live_path, multiple, recur=None):
    """Keep (in place) more units so that each hidden layer makes a multiple of ``multiple`` of them.

    Hardware runs convolutions and matmuls fastest on channel counts that
    are multiples of 8 or 16; a layer left with 13 channels can be slower than
    one with 16. A unit kept this way is one the fixed point found dead: its
    weights stay as they are (zero outgoing weights, or a constant that is
    now computed instead of folded), so the outputs do not change. Among
    the dead units of a layer, those that make the fewest other units
    needed go first (then the lowest index). Units shared by several
    layers (a residual stream) are rounded once; a layer that keeps no
    unit, the output layer and input features are left as they are.
    """
    makers = _makers(graph, detached)
    changed = True
    while changed:
        changed = False
        for ids, nodes in makers.items():
            ids = np.asarray(ids)
            kept = int(needed[ids].sum())
            short = -kept % multiple
            if not kept or not short or kept == ids.size:
                continue
            _keep_dead(graph, conn, foldable, needed, detached, live_path, recur, ids, nodes, short)
            changed = True


def _makers(graph, detached):
    """``{unit ids: [units nodes making them]}`` of the hidden units a layer may keep more of."""
    makers = {}
    for node in graph.units:
        if node.is_output or node.name in detached or node.out_ids.min() < (graph.n_features or 0):
            continue
        makers.setdefault(tuple(int(i) for i in node.out_ids), []).append(node)
    return makers


def _keep_dead(graph, conn, foldable, needed, detached, live_path, recur, ids, nodes, count):
    """Keep ``count`` more of the dead units ``ids``: those that make the fewest other units needed first (then
    the lowest index); the fixed point settles again."""
    dead = np.flatnonzero(~needed[ids])
    cost = np.zeros(dead.size, dtype=np.int64)
    for node in nodes:
        reads = conn[node.name][:, dead] & (~foldable[node.name] & ~needed[node.in_ids])[:, None]
        cost += reads.sum(axis=0)
    order = np.lexsort((dead, cost))[:count]
    needed[ids[dead[order]]] = True
    _settle(graph, conn, foldable, needed, detached, live_path, recur)


def block_siblings(graph):
    """Lists of units nodes at the same place of the calls of blocks of one class (a model's repeated decoder
    blocks, also where some attend over a sliding window and others not): ``<call>/<path>`` for each call of the
    class, by ``<path>`` and width. A block inside another is matched by its innermost call."""
    calls = sorted(graph.blocks, key=len, reverse=True)  # the innermost call first
    found = {}
    for node in graph.units:
        call = next((c for c in calls if node.name.startswith(f"{c}/")), None)
        if call is not None:
            key = (type(graph.blocks[call].layer), node.name[len(call) + 1:], node.out_units)
            found.setdefault(key, []).append(node.name)
    return [names for names in found.values() if len(names) > 1]


def _even_out(graph, conn, foldable, needed, detached, live_path, recur, siblings):
    """Keep (in place) more units so that the layers at the same place of blocks of one class keep as many each
    (``siblings``, :func:`block_siblings`): the narrower ones keep some dead units (their outputs unchanged), so
    that every block can be its class again with one config (``prune_model(blocks="uniform")``). Whether it kept
    any."""
    makers = _makers(graph, detached)
    by_name = {node.name: (ids, nodes) for ids, nodes in makers.items() for node in nodes}
    kept_any, changed = False, True
    while changed:
        changed = False
        for names in siblings:
            found = [by_name[name] for name in names if name in by_name]
            if len(found) != len(names):
                continue
            counts = [int(needed[np.asarray(ids)].sum()) for ids, _ in found]
            for (ids, nodes), kept in zip(found, counts):
                if kept < max(counts):
                    _keep_dead(graph, conn, foldable, needed, detached, live_path, recur, np.asarray(ids), nodes,
                               max(counts) - kept)
                    changed = kept_any = True
    return kept_any


def _detached(graph, merge_folds):
    """Names of the nodes that reach the outputs only through operands that their merges drop."""
    used = set(graph.outputs)
    for node in reversed(graph.nodes):  # call order reversed: every reader comes before what it reads
        if node.name not in used:
            continue
        fold = merge_folds.get(node.name)
        for k, name in enumerate(node.inputs):
            if fold is None or not fold.dropped[k]:
                used.add(name)
    return frozenset(node.name for node in graph.nodes if node.name not in used and node.kind != Kind.INPUT)


def _units_constants(layer, node, weights, source, conn):
    """The constant of each unit a layer makes (NaN: it varies), given the constants it reads.

    An input unit contributes a constant when it is one and no zero padding
    of this layer changes it at the border (unless it is 0); an output unit is
    constant when every input unit with a non-zero weight into it contributes one.
    """
    rule = registry.units_rule(layer)
    if not rule.constant_outputs:
        return np.full(node.out_units, np.nan)
    contributes = np.isfinite(source) & (~np.bool_(rule.pads(layer)) | (source == 0))
    varies = conn[~contributes].any(axis=0)
    bias = weights["bias"]
    pre = np.zeros(node.out_units) if bias is None else bias.astype(np.float64)
    pre = pre + rule.constant_contribution(layer, weights, node.in_units, np.where(contributes, source, 0.0))
    if rule.mixes_units(layer):  # softmax: all or nothing
        return np.full(node.out_units, np.nan) if varies.any() else registry.call_activation(layer, pre)
    return registry.call_activation(layer, np.where(varies, np.nan, pre))


def _foldable(layer, weights, source):
    """bool per input unit: its constant can be added to this layer's bias (so the unit can go)."""
    finite = np.isfinite(source)
    if weights["bias"] is None or registry.units_rule(layer).pads(layer):
        return finite & (source == 0)
    return finite


def _all_kept(graph, conn, threshold):
    """Masks of a model the graph cannot follow: every unit of every layer kept (conservative)."""
    nodes = graph.units
    n = graph.n_features if graph.n_features is not None else nodes[0].in_units
    ones = {node.name: _readonly(np.ones(node.out_units, dtype=bool)) for node in nodes}
    none = {node.name: _readonly(np.zeros(node.out_units, dtype=bool)) for node in nodes}
    zeros = {node.name: _readonly(np.zeros(node.out_units)) for node in nodes}
    for value in conn.values():
        _readonly(value)
    readers = set(graph.input_readers)
    return UnitMasks(
        threshold=threshold,
        layer_names=tuple(node.name for node in nodes),
        features=_readonly(np.ones(int(n), dtype=bool)),
        inputs={node.name: _readonly(np.ones(node.in_units, dtype=bool)) for node in nodes},
        units=ones,
        constant=none,
        folded=none,
        fold_values=zeros,
        fold_in=zeros,
        connections=conn,
        roles={node.name: "input" if node.name in readers else "hidden" for node in nodes},
        is_output={node.name: False for node in nodes},
    )


def needed_units(graph, masks):
    """bool over the unit ids of ``graph`` (:attr:`Node.ids`): the units that stay, each coupled unit once."""
    needed = np.zeros(graph.n_ids, dtype=bool)
    needed[graph.feature_ids[masks.features | graph.kept_features_always]] = True
    for node in graph.units:
        needed[node.in_ids] |= masks.inputs[node.name]
        needed[node.out_ids] |= masks.units[node.name]
    # a constant that a layer kept whole reads (cross-attention's fixed mask) stays with it
    constants = {node.name: node.ids for node in graph.nodes if node.kind == Kind.CONSTANT}
    for node in graph.nodes:
        if node.kind == Kind.WHOLE and node.name not in masks.detached:
            for name in node.inputs:
                if name in constants:
                    needed[constants[name]] = True
    return needed

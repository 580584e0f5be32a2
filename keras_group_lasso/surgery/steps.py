"""The surgery as a list of typed steps, decided before any layer is built.

:func:`plan_steps` walks the graph once, in call order, and decides for every
node what the new model does with it: which input it takes, which constant it
computes (positions: :class:`NewConstant`), which node nothing
reads any more, which layer is sliced to which rows and units, where a 0/1
selection picks entries, which merge drops its constant operands, which later
call of a shared layer calls the new layer again. Each decision is one frozen
step; :func:`~keras_group_lasso.prune_model` applies them in order.

Every step writes one tensor of the new model, named by ``name`` (a node of the
graph, or ``<reader>/select...`` for a selection made for ``reader``), and
reads tensors written by the steps before it.
"""

import collections
import dataclasses
import typing
import warnings

import keras
import numpy as np

from keras_group_lasso.graph import Kind, registry
from keras_group_lasso.graph.masks import needed_units

__all__ = [
    "NewInput",
    "NewConstant",
    "Drop",
    "Alias",
    "SelectUnits",
    "SliceUnits",
    "SlicePerUnit",
    "SliceChannels",
    "Merge",
    "Concat",
    "FoldConstants",
    "CallShared",
    "plan_steps",
    "foldable_batchnorms",
]

# Why a node is dropped or aliased (the ``reason`` of :class:`Drop` and :class:`Alias`).
UNUSED_INPUT = "unused input"
DETACHED = "detached"
LOST = "lost"
BATCHNORM = "batchnorm"
FLAT = "already flat"
ONE_OPERAND = "one operand"


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


class _Step:
    kind: typing.ClassVar[str] = ""

    def to_dict(self):
        """A JSON-serializable dict: ``{"step": kind, field: value, ...}`` (tuples as lists)."""
        out = {"step": self.kind}
        for field in dataclasses.fields(self):
            out[field.name] = _plain(getattr(self, field.name))
        return out


@dataclasses.dataclass(frozen=True)
class NewInput(_Step):
    """An input of the new model.

    Attributes:
        name: the input's node name.
        shape: its shape without the batch axis.
        dtype: its dtype.
        features: indices of the input's own features it holds (all of them,
            or with ``inputs="selected"`` the kept ones).
    """

    kind: typing.ClassVar[str] = "new_input"
    name: str
    shape: tuple
    dtype: str
    features: tuple


@dataclasses.dataclass(frozen=True)
class NewConstant(_Step):
    """A tensor no model input reaches (positions from ``keras.ops.arange``), computed by the new model.

    Attributes:
        name: the constant's node (its value: the :class:`~keras_group_lasso.graph.registry.ConstantValue`
            of the graph).
        entries: indices of the entries of its last axis it keeps (the units that stay).
        lead: axes of size 1 put before its own: a constant without the batch axis takes as many as the merge
            where it meets the input's path broadcasts it with (as keras.ops does), so that the merge layer
            reads operands of one rank.
    """

    kind: typing.ClassVar[str] = "new_constant"
    name: str
    entries: tuple
    lead: int = 0


@dataclasses.dataclass(frozen=True)
class Drop(_Step):
    """A node the new model leaves out.

    Attributes:
        name: the node.
        reason: ``"unused input"`` (an input with no kept feature, with
            ``inputs="selected"``), ``"detached"`` (only a constant operand that
            its merge drops uses it) or ``"lost"`` (it reads a dropped node, or
            is a units layer that keeps no unit).
    """

    kind: typing.ClassVar[str] = "drop"
    name: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Alias(_Step):
    """A node whose tensor is another's.

    Attributes:
        name: the node.
        source: the tensor it stands for.
        reason: ``"batchnorm"`` (a BatchNormalization merged into ``source``,
            the layer before it), ``"already flat"`` (a Flatten of an input
            whose selected features are flat already) or ``"one operand"``
            (a merge or Concatenate with one operand left).
    """

    kind: typing.ClassVar[str] = "alias"
    name: str
    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class SelectUnits(_Step):
    """A frozen, bias-free Dense with a 0/1 kernel that picks entries of the last axis.

    Attributes:
        name: the tensor it writes (``<reader>/select`` or ``<reader>/select<k>`` for operand ``k``).
        source: the tensor it reads.
        kept: indices of the entries it keeps, in order.
        width: entries of ``source``'s last axis.
        reader: the node that reads the selection (the selection computes in its dtype policy).
    """

    kind: typing.ClassVar[str] = "select_units"
    name: str
    source: str
    kept: tuple
    width: int
    reader: str


@dataclasses.dataclass(frozen=True)
class SliceUnits(_Step):
    """A layer that makes units, sliced: :meth:`registry.UnitsRule.slice_units`.

    Attributes:
        name: the node.
        source: the tensor it reads.
        rows: indices of the input units it keeps (of all its input units).
        units: indices of the units it keeps.
        batchnorm: the BatchNormalization merged into it, or ``None``.
    """

    kind: typing.ClassVar[str] = "slice_units"
    name: str
    source: str
    rows: tuple
    units: tuple
    batchnorm: typing.Optional[str] = None


@dataclasses.dataclass(frozen=True)
class SlicePerUnit(_Step):
    """A layer with one weight (or none) per entry, sliced or copied: :meth:`registry.LayerRule.slice`.

    Attributes:
        name: the node.
        source: the tensor it reads.
        entries: indices of the entries of its last axis it keeps, or ``None``: copied as it is.
        threshold: its weights with ``|w| <= threshold`` are set to 0 (a
            DepthwiseConv), or ``None``.
        operands: the other tensors a layer kept whole reads, after ``source`` (cross-attention's value and key),
            or ``()``.
    """

    kind: typing.ClassVar[str] = "slice_per_unit"
    name: str
    source: str
    entries: typing.Optional[tuple] = None
    threshold: typing.Optional[float] = None
    operands: tuple = ()


@dataclasses.dataclass(frozen=True)
class SliceChannels(_Step):
    """``x[..., start:stop]``: the kept channels of a slice of the channels (an output of ``keras.ops.split``).

    Attributes:
        name: the node.
        source: the tensor it reads.
        start, stop: the entries of the new ``source``'s last axis it takes.
    """

    kind: typing.ClassVar[str] = "slice_channels"
    name: str
    source: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Merge(_Step):
    """A merge (``Add``, ``Multiply``, ...) of the operands left, each holding the same units.

    Attributes:
        name: the node.
        operands: the tensors it reads (selections where an operand holds more units).
    """

    kind: typing.ClassVar[str] = "merge"
    name: str
    operands: tuple


@dataclasses.dataclass(frozen=True)
class Concat(_Step):
    """A ``Concatenate`` of the operands that are left.

    Attributes:
        name: the node.
        operands: the tensors it reads.
    """

    kind: typing.ClassVar[str] = "concat"
    name: str
    operands: tuple


@dataclasses.dataclass(frozen=True)
class FoldConstants(_Step):
    """A ``Rescaling`` that puts back what a merge's dropped constant operands added: ``scale * x + offset``.

    Attributes:
        name: the merge.
        source: the tensor it reads (the merge of the operands left, or the one operand left).
        scale, offset: one float per kept channel.
        separate: the merge layer stays and this is a layer next to it
            (``<merge>_constants``); otherwise it takes the merge's name.
    """

    kind: typing.ClassVar[str] = "fold_constants"
    name: str
    source: str
    scale: tuple
    offset: tuple
    separate: bool


@dataclasses.dataclass(frozen=True)
class CallShared(_Step):
    """A later call of a shared layer: the new layer built for an earlier call, called again.

    Attributes:
        name: the node (the later call).
        source: the tensor it reads.
        layer: the node whose new layer it calls.
    """

    kind: typing.ClassVar[str] = "call_shared"
    name: str
    source: str
    layer: str


def _indices(mask):
    return tuple(int(i) for i in np.flatnonzero(mask))


def plan_steps(model, graph, masks, threshold, inputs="original", fold_batchnorm=False, owner="plan_pruning"):
    """The steps that build the pruned ``model``, in call order (see :class:`NewInput` ... :class:`CallShared`).

    Args:
        model: the model (its inputs' dtypes).
        graph, masks: its :class:`~keras_group_lasso.graph.build.ModelGraph` and
            :class:`~keras_group_lasso.graph.masks.UnitMasks`.
        threshold: the threshold of the masks (a DepthwiseConv's weights are thresholded).
        inputs, fold_batchnorm: as in :func:`~keras_group_lasso.prune_model`.
        owner: the public function that plans (named in errors).

    Returns:
        A tuple of frozen steps.
    """
    if fold_batchnorm:
        left = unfolded_batchnorms(graph, masks)
        if left:
            warnings.warn(
                f"{owner}: fold_batchnorm=True merges a BatchNormalization into the Dense or convolution layer right "
                f"before it; these stay layers: " + "; ".join(f"{name!r} ({why})" for name, why in left.items()),
                stacklevel=3)
    return _Planner(graph, masks, threshold, fold_batchnorm).run(model, inputs == "selected", owner)


class _Planner:
    """Walks the graph once, keeping which units each tensor of the new model holds (``present``)."""

    def __init__(self, graph, masks, threshold, fold_batchnorm):
        self.graph, self.masks, self.threshold = graph, masks, float(threshold)
        self.needed = needed_units(graph, masks)
        self.batchnorms = foldable_batchnorms(graph, masks) if fold_batchnorm else {}
        self.into = {units: bn for bn, units in self.batchnorms.items()}
        self.present = {}  # tensor -> bool over its node's ids: the units the new tensor holds
        self.sliced = {}  # node -> it holds elements of an input that "selected" slices (before its Flatten)
        self.absent = set()  # tensors the new model does not have
        self.ranks = {}  # rank of the new inputs and of the tensors that stand for them
        self.made = set()  # nodes for which a new layer is built
        self.steps = []
        self.readers = {}  # node -> the nodes that read it
        for node in graph.nodes:
            for name in node.inputs:
                self.readers.setdefault(name, []).append(node.name)
        self.side_inputs = set(graph.side_inputs())

    def run(self, model, selected, owner):
        graph = self.graph
        for found, source in zip(graph.inputs, model.inputs):
            self.new_input(found, source.dtype, selected)
        for node in graph.nodes:
            if node.name not in self.present:  # not an input
                self.node(node)
        for name in graph.outputs:
            if not self.present[name].all():  # pragma: no cover - the masks keep every output unit
                raise RuntimeError(f"{owner}: the output of '{name}' lost units; please report this")
        return tuple(self.steps)

    def new_input(self, found, dtype, selected):
        keep = self.needed[found.start : found.start + found.count].copy()
        # an input read as a mask (a side tensor of an attention layer) is taken whole
        self.sliced[found.name] = selected and (found.flat or found.sequence) and found.name not in self.side_inputs
        if self.sliced[found.name] and not keep.any():  # nothing reads this input: the new model does not take it
            self.drop(found.name, found.count, UNUSED_INPUT)
            return
        shape = tuple(found.shape)
        if self.sliced[found.name]:  # a flat vector of the selected features, or a sequence of the selected channels
            shape = (int(keep.sum()),) if found.flat else shape[:-1] + (int(keep.sum()),)
        self.present[found.name] = keep if self.sliced[found.name] else np.ones(found.count, bool)
        self.ranks[found.name] = len(shape) + 1
        self.steps.append(NewInput(found.name, shape, str(dtype), _indices(self.present[found.name])))

    def node(self, node):
        masks = self.masks
        self.sliced[node.name] = len(node.inputs) == 1 and self.sliced.get(node.inputs[0], False) and node.elements
        if node.name in masks.detached:  # only a constant operand that its merge drops uses it
            self.drop(node.name, node.ids.size, DETACHED)
            return
        if node.name in self.batchnorms:  # merged into the layer before it
            self.alias(node.name, node.inputs[0], BATCHNORM)
            return
        fold = masks.merge_folds.get(node.name)
        src = node.inputs if fold is None else tuple(n for n, d in zip(node.inputs, fold.dropped) if not d)
        missing = [name in self.absent for name in src]
        lost = all(missing) if node.kind == Kind.CONCAT else any(missing)  # Concatenate keeps its other operands
        if lost or (node.kind == Kind.UNITS and not masks.units[node.name].any()):
            # a branch that lost every unit: nothing reads it
            self.drop(node.name, node.ids.size, LOST)
            return
        if node.kind == Kind.CONSTANT:
            self.constant(node)
        elif node.kind == Kind.UNITS:
            self.units(node)
        elif node.kind == Kind.MERGE:
            self.merge(node, src, fold)
        elif node.kind == Kind.CONCAT:
            self.concat(node, src)
        elif node.kind == Kind.SLICE:
            self.slice_channels(node, src)
        elif node.kind == Kind.WHOLE:  # every channel it reads stays, and so does every output
            self.present[node.name] = np.ones(node.ids.size, bool)
            if self.call_shared(node, src[0]):  # a ReversibleEmbedding's logits: its new layer called again
                return
            self.made.add(node.name)
            # a Dense or convolution kept whole (cross-attention) is thresholded, as apply_threshold does it
            rule = registry.rule_of(self.graph.layers[node.name])
            self.steps.append(SlicePerUnit(node.name, src[0], threshold=self.threshold if rule.thresholded else None,
                                           operands=tuple(src[1:])))
        else:
            self.per_unit(node, src)

    def drop(self, name, size, reason):
        self.present[name] = np.zeros(size, bool)
        self.absent.add(name)
        self.steps.append(Drop(name, reason))

    def alias(self, name, source, reason):
        self.present[name] = self.present[source]
        if source in self.absent:
            self.absent.add(name)
        if source in self.ranks:
            self.ranks[name] = self.ranks[source]
        self.steps.append(Alias(name, source, reason))

    def select(self, slot, source, have, want, reader):
        """A selection of the units ``want`` from ``source`` (holding ``have``), for ``reader``; returns its tensor."""
        self.steps.append(SelectUnits(slot, source, _indices(want[have]), int(have.sum()), reader))
        self.present[slot] = have & want
        return slot

    def rank(self, name):
        """The rank of the new tensor of node ``name`` (the original's, but for the new inputs)."""
        if name in self.ranks:
            return self.ranks[name]
        return len(self.graph.output_shape(name))

    def call_shared(self, node, source):
        """A call of a shared layer whose new layer is built at another of its calls (the graph's order may put a
        later call first: T5's decoder embeds its tokens before its encoder): call it again (True), else False."""
        first = self.graph.layer_name(node.name)
        calls = [first, *(name for name, layer in self.graph.calls.items() if layer == first)]
        made = next((name for name in calls if name in self.made and name != node.name), None)
        if made is None:
            return False
        self.steps.append(CallShared(node.name, source, made))
        return True

    def units(self, node):
        graph, masks = self.graph, self.masks
        unode = graph.node(node.name)
        layer = graph.layers[node.name]
        source, have = unode.source, self.present[unode.source]
        rows = have
        want = masks.inputs[node.name]
        kept_out = masks.units[node.name]
        n, k, u = int(have.sum()), int((have & want).sum()), int(kept_out.sum())
        rule = registry.units_rule(layer)
        shared = node.name in graph.calls or node.name in graph.calls.values()
        # Selecting the kept inputs first costs fewer multiply-adds (k * (n + u) < n * u): right before the
        # Dense, after the input preprocessing (that Dense rounds its inputs as the selection does, e.g. TF32
        # matmuls on a GPU). Every call of a shared layer reads the same kept rows: each picks them from what
        # its input holds. A layer that reads its inputs in whole groups (a grouped convolution) reads only the
        # kept ones when its input holds others (an input with every channel, inputs="original").
        extra = (have & ~want).any()
        if ((k < n and unode.positions == 1 and rule.selects_rows and self.rank(source) == 2 and k * (n + u) < n * u
                and not shared) or ((shared or rule.tied_units(layer)) and extra)):
            source = self.select(f"{node.name}/select", source, have, want, node.name)
            rows = have & want
        self.present[node.name] = kept_out
        if self.call_shared(node, source):
            return
        self.made.add(node.name)
        self.steps.append(SliceUnits(node.name, source, _indices(rows), _indices(kept_out), self.into.get(node.name)))

    def constant(self, node):
        keep = self.needed[node.ids]
        if not keep.any():  # nothing reads it any more
            self.drop(node.name, node.ids.size, LOST)
            return
        self.present[node.name] = keep
        self.steps.append(NewConstant(node.name, _entries(keep, node), self.lead(node)))

    def lead(self, node):
        """Axes of size 1 the constant ``node`` takes first: as many as the first merge it reaches adds to it
        (the merge layer was read on its operands broadcast as keras.ops broadcasts them)."""
        stack, seen = [node.name], set()
        while stack:
            name = stack.pop(0)
            for reader in self.readers.get(name, ()):
                if reader in seen:
                    continue
                seen.add(reader)
                if self.graph.tensor(reader).kind != Kind.MERGE:
                    stack.append(reader)
                    continue
                try:
                    shapes = [tuple(tensor.shape) for tensor in self.graph.layers[reader].input]
                    rank = len(shapes[list(self.graph.tensor(reader).inputs).index(name)])
                except Exception:  # noqa: BLE001 - a merge called several times: operands of the model's ranks
                    return 0
                return max(0, rank - self.rank(name))
        return 0

    def merge(self, node, src, fold):
        want = self.needed[node.ids]
        operands = []
        for k, name in enumerate(src):
            if not np.array_equal(self.present[name], want):
                name = self.select(f"{node.name}/select{k}", name, self.present[name], want, node.name)
            operands.append(name)
        if len(operands) > 1:
            self.steps.append(Merge(node.name, tuple(operands)))
        if fold is not None and not fold.is_identity:
            # The merge's own name when it is gone, else a new one next to it.
            self.steps.append(FoldConstants(
                node.name, node.name if len(operands) > 1 else operands[0],
                tuple(float(v) for v in fold.scale[want]), tuple(float(v) for v in fold.offset[want]),
                separate=len(operands) > 1,
            ))
        elif len(operands) == 1:  # the other operands were constants: nothing left to merge
            self.alias(node.name, operands[0], ONE_OPERAND)
        self.present[node.name] = want

    def concat(self, node, src):
        operands = tuple(name for name in src if name not in self.absent)
        if len(operands) == 1:  # the other operands lost every unit
            self.alias(node.name, operands[0], ONE_OPERAND)
        else:
            self.steps.append(Concat(node.name, operands))
        self.present[node.name] = np.concatenate([self.present[name] for name in src])

    def slice_channels(self, node, src):
        (name,) = src
        part = self.graph.layers[node.name]
        have = self.present[name]
        keep = have[part.start:part.stop]
        if not keep.any():  # nothing reads the channels it takes any more
            self.drop(node.name, node.ids.size, LOST)
            return
        start = int(have[:part.start].sum())
        self.present[node.name] = keep
        self.steps.append(SliceChannels(node.name, name, start, start + int(keep.sum())))

    def per_unit(self, node, src):
        graph = self.graph
        (name,) = src
        layer = graph.layers[node.name]
        have = self.present[name]
        from_sliced = self.sliced.get(name, False) and graph.tensor(name).elements
        if node.kind == Kind.FLATTEN and from_sliced and len(layer.output.shape) == 2:
            self.alias(node.name, name, FLAT)  # the selected features are already flat
            return
        self.present[node.name] = have
        if self.call_shared(node, name):
            return
        rule = registry.rule_of(layer)
        # Fewer units, or the input's elements already flattened into the selected features: sliced.
        entries = None if have.all() and not from_sliced else _entries(have, graph.tensor(name))
        self.made.add(node.name)
        self.steps.append(SlicePerUnit(node.name, name, entries, self.threshold if rule.thresholded else None))


def foldable_batchnorms(graph, masks):
    """``{BatchNormalization name: units layer name}``: each that can be merged into the layer it reads.

    The units layer has no activation, nothing else reads it, and the
    BatchNormalization normalizes its last axis (its units).
    """
    return {name: source for name, (source, why) in _batchnorm_sources(graph, masks).items() if why is None}


def unfolded_batchnorms(graph, masks):
    """``{BatchNormalization name: why it stays a layer}`` for each that :func:`foldable_batchnorms` leaves."""
    return {name: why for name, (_, why) in _batchnorm_sources(graph, masks).items() if why is not None}


def _batchnorm_sources(graph, masks):
    """``{BatchNormalization name: (the layer it reads, None where it can be merged into it, else why not)}``."""
    readers = collections.Counter(name for node in graph.nodes for name in node.inputs)
    out = {}
    for node in graph.nodes:
        layer = graph.layers.get(node.name)
        rule = registry.rule_of(layer) if layer is not None else None
        if rule is None or not rule.batchnorm:
            continue
        if len(node.inputs) != 1:
            out[node.name] = (None, "it reads more than one tensor")
            continue
        (source,) = node.inputs
        maker = graph.layers.get(source)
        maker_rule = registry.units_rule(maker)
        if maker_rule is None or not registry.makes_units(maker) or not maker_rule.merges_batchnorm:
            out[node.name] = (source, f"it reads {source!r}, not a Dense or convolution layer")
        elif keras.activations.serialize(maker.activation) != "linear":
            out[node.name] = (source, f"{source!r} applies its activation "
                                      f"{keras.activations.serialize(maker.activation)!r} before it")
        elif readers[source] != 1 or source in graph.outputs:
            out[node.name] = (source, f"{source!r} is read elsewhere too")
        elif source in masks.detached or not masks.units[source].any():
            out[node.name] = (source, f"{source!r} keeps no unit")
        else:
            axis = layer.axis if isinstance(layer.axis, int) else (layer.axis[0] if len(layer.axis) == 1 else None)
            try:
                rank = len(maker.compute_output_shape(maker.input.shape))
            except Exception:  # noqa: BLE001 - no single input shape: it stays a layer of its own
                rank = None
            if rank is None or axis is None or axis % rank != rank - 1:
                out[node.name] = (source, f"it normalizes another axis than the units of {source!r}")
            else:
                out[node.name] = (source, None)
    return out


def _entries(have, node):
    """Indices of the kept entries of ``node``'s last axis (``have``: kept ids; repeated over its positions)."""
    kept = np.flatnonzero(have)
    if node.positions == 1:
        return tuple(int(i) for i in kept)
    return tuple(int(i) for i in (np.arange(node.positions)[:, None] * have.size + kept[None, :]).reshape(-1))

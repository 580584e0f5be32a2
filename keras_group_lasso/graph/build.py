"""A Keras model as a typed graph of layers and of the units that flow between them.

:func:`model_graph` reads a Sequential or functional model (nested blocks
inlined) and returns a frozen :class:`ModelGraph`: every layer as a
:class:`Node` in call order, each layer that makes units (Dense,
convolutions) as a :class:`UnitsNode`, and the units on the last axis of every
tensor. Every layer is classified by the one registry
(:mod:`keras_group_lasso.graph.registry`); what cannot be interpreted is
listed in ``problems`` with the reason, and ``supported`` says whether the
masks, the report and surgery can treat the model exactly.

Units: every entry of a tensor's last axis (a feature of the input, a neuron,
a channel of a feature map) carries a *unit id*. A layer that makes units
gives its outputs new ids; a per-unit layer (BatchNormalization, pooling, ...)
passes them on; ``Flatten`` of an ``(..., C)`` map repeats the ``C`` ids at
every position; ``Concatenate`` puts its operands' ids side by side; a merge
(``Add``, ``Multiply``, ...) makes channel ``c`` of all its operands one unit
(their ids are united). A unit is therefore *coupled* across every tensor it
lives in: it can go only when no layer reads it anywhere, and then every layer
that makes it drops it.
"""

import collections
import contextlib
import dataclasses
import inspect
import math
import threading
import types
import weakref

import keras
import numpy as np

from keras_group_lasso.graph import registry
from keras_group_lasso.graph.rules.base import (
    PROBE_SIZES,
    Kind,
    call_with_keras_shapes,
    call_without_none,
    mark_probe_sized,
    probe_sized,
    without_none,
)

__all__ = ["Node", "UnitsNode", "Stream", "ModelGraph", "model_graph", "flat_graph", "is_graph_model", "graph_model",
           "traced_block", "BlockCall", "block_arguments", "block_operands", "block_outputs", "fixed_sizes"]


def _frozen(values):
    array = np.asarray(values, dtype=np.int64)
    array.setflags(write=False)
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One layer of the model, with the units on its output's last axis.

    Attributes:
        name: the layer's name in the graph (``"block/name"`` inside a nested
            model); the model input is a node too (kind ``"input"``).
        kind: ``"input"`` or the layer's registry kind (``"units"``,
            ``"per_unit"``, ``"per_element"``, ``"flatten"``, ``"global_pool"``,
            ``"merge"``, ``"concat"``, ``"tail"``, ``"slice"``: entries of its
            input's last axis, ``"whole"``: reads every unit and makes new ones that
            all stay), or ``"constant"``: a tensor no input reaches (positions from ``keras.ops.arange``; its value is
            the :class:`~keras_group_lasso.graph.registry.ConstantValue` in ``layers``).
        inputs: the nodes it reads, in call order.
        ids: int array, the unit id of each channel of its output (after
            ``Flatten`` of an ``(..., C)`` map: of each of the ``C`` channels).
        positions: its output's last axis holds ``positions`` copies of
            ``ids`` (position-major, as ``Flatten`` lays a map out); else 1.
        elements: the model input's elements, before the ``Flatten`` that
            makes them features (``ids`` then number all elements).
    """

    name: str
    kind: str
    inputs: tuple
    ids: np.ndarray
    positions: int = 1
    elements: bool = False

    @property
    def width(self):
        """Entries of the output's last axis (``positions * len(ids)``; all elements for ``elements``)."""
        return int(self.positions * self.ids.size)


@dataclasses.dataclass(frozen=True, eq=False)
class UnitsNode:
    """One layer that makes units, and how it reads the units of its input.

    Attributes:
        name: the layer's name in the graph.
        source: the node it reads.
        in_units: units it reads (kernel groups).
        positions: kernel rows per input unit (:meth:`registry.UnitsRule.units_view`):
            a convolution's window; for a Dense layer after ``Flatten`` of an
            ``(..., C)`` map, the map's positions.
        out_units: units it makes.
        in_ids: int array ``(in_units,)``, the (coupled) unit id of each input unit.
        out_ids: int array ``(out_units,)``, the (coupled) unit id of each output unit.
        flattened: it reads a flattened map made by an earlier layer.
        reads_input: it reads the model input through per-feature layers
            only (its groups are input groups).
        is_output: every unit it makes reaches a model output (none is ever removed).
    """

    name: str
    source: str
    in_units: int
    positions: int
    out_units: int
    in_ids: np.ndarray
    out_ids: np.ndarray
    flattened: bool = False
    reads_input: bool = False
    is_output: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class Stream:
    """Units that merges couple: the channels of a residual stream, one unit each across all its tensors.

    Attributes:
        name: the first merge layer of the stream.
        merges: every merge layer whose output holds exactly these units.
        ids: int array, the unit ids of the stream's channels.
        makers: the units layers that make some of them, and ``"<input>"``
            when input features are among them (a shortcut from the input).
    """

    name: str
    merges: tuple
    ids: np.ndarray
    makers: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class InputFeatures:
    """One model input and the input features it holds.

    Attributes:
        name: the input's node name (``"<input>"`` for a Sequential).
        shape: its shape without the batch axis.
        dtype: its dtype (an integer input is read by an ``Embedding``).
        start: its features are the unit ids ``start .. start + count - 1``.
        count: how many features it holds.
        flat: its features can be selected one by one (a flat vector, or the
            elements of an input read through ``Flatten``); otherwise they
            are the channels of a map and all stay, except for a sequence.
        sequence: a sequence ``(steps, C)``: its features are its ``C``
            channels (the same at every step), selected as a flat vector's.
    """

    name: str
    shape: tuple
    dtype: str
    start: int
    count: int
    flat: bool
    sequence: bool = False

    @property
    def ids(self):
        """The unit ids of its features."""
        return np.arange(self.start, self.start + self.count)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelGraph:
    """The graph of a model, as the masks, the report and surgery read it.

    Attributes:
        model_name: the model's name.
        sequential: the model is a ``keras.Sequential``.
        input_name: the name of its input (functional, one input) or ``None``.
        input_shape: the input shape without the batch axis (one input; ``None`` for several).
        nodes: every :class:`Node`, in an order where each comes after what it reads
            (empty when the model is not supported).
        outputs: names of the nodes whose outputs are the model's outputs.
        units: one :class:`UnitsNode` per units layer, in that order.
        feature_shape: shape of the input features: ``(n,)`` when they are the
            elements of a flat vector (a flat input, or an input read through
            ``Flatten``), else the input shape (its channels are the features).
        flat_features: the input features are the elements of a flat vector
            (they can be selected one by one); otherwise they are the channels
            of the input's last axis, and all are kept. With several inputs:
            every input is flat (see :attr:`inputs` for each).
        n_features: the number of input features.
        n_ids: unit ids run from 0 to ``n_ids - 1``; the input features are ``0 .. n_features - 1``.
        layers: read-only ``{name: layer}`` of every node.
        all_units: names of every units layer found, also when the graph is not supported.
        input_readers: those of ``all_units`` that read the model input
            through per-feature layers only (their groups are input groups).
        flatten_channels: ``{units layer name: C}`` for layers that read a
            flattened ``(..., C)`` map produced by an earlier units layer.
        problems: ``((name, class name, reason), ...)`` of what is not understood.
        supported: the masks and surgery can treat the model exactly.
        streams: one :class:`Stream` per set of units coupled by merges.
        side_tensors: ``{node: {keyword: SideTensor}}``: tensors a call is given that carry no units (a
            ``MultiHeadAttention``'s ``attention_mask``), computed from the model's inputs by keras.ops calls
            that the pruned model makes again.
        blocks: ``{call name: BlockCall}``: each call of a block traced into the graph (a block of a block too):
            the nodes it reads and those of its outputs, so that surgery can build the block's class again.
    """

    model_name: str
    sequential: bool
    input_name: object
    input_shape: object
    nodes: tuple
    outputs: tuple
    units: tuple
    feature_shape: object
    n_features: object
    flat_features: bool
    n_ids: int
    layers: types.MappingProxyType
    all_units: tuple
    input_readers: tuple
    flatten_channels: types.MappingProxyType
    problems: tuple
    supported: bool
    streams: tuple = ()
    inputs: tuple = ()
    calls: types.MappingProxyType = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    call_shapes: types.MappingProxyType = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    side_tensors: types.MappingProxyType = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    blocks: types.MappingProxyType = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    def side_inputs(self):
        """Names of the model inputs that side tensors read (a padding mask): taken whole by a pruned model."""
        inputs = {found.name for found in self.inputs}  # not a layer's side output (T5's position bias)
        return tuple(dict.fromkeys(read for found in self.side_tensors.values() for side in found.values()
                                   for read in side.reads() if read in inputs))

    def unread_kernels(self):
        """``((name, class name, reason, kernels), ...)``: the layers it cannot read that hold trainable kernels.

        A layer whose computation the graph does not know (a subclassed block
        of layers, a layer of another library) gets no group penalty from
        :func:`~keras_group_lasso.add_group_sparsity`, keeps its size under a
        budget and stops surgery: what to say before any training.
        """
        found = []
        for name, cls, reason in self.problems:
            layer = self.layers.get(name)
            # a keras.ops operation (a slice, a split) holds no weights
            kernels = sum(1 for v in getattr(layer, "trainable_weights", ()) if len(v.shape) >= 2)
            if kernels:
                found.append((name, cls, reason, kernels))
        return tuple(found)

    def output_shape(self, name, units=None):
        """The output shape of node ``name`` (batch axis included), also for each call of a shared layer;
        ``(None, units)`` when it cannot be known."""
        layer = self.layers[name]
        shapes = self.call_shapes.get(name)
        if shapes:
            try:
                return tuple(layer.compute_output_shape(shapes[0] if len(shapes) == 1 else shapes))
            except Exception:  # noqa: BLE001 - a layer that cannot say
                return (None, units)
        return registry.output_shape(layer, units)

    def channel_costs(self):
        """``{node name: (multiply-adds per channel, unit ids)}`` of the nodes that cost multiply-adds per channel
        on their own (:meth:`LayerRule.channel_flops`: a depthwise convolution), each call of a layer counted."""
        found = self.__dict__.get("_channel_costs")  # the graph is frozen: computed once, on first use
        if found is None:
            found = {}
            for node in self.nodes:
                rule = registry.rule_of(self.layers[node.name]) if node.kind == Kind.PER_UNIT else None
                if rule is not None and rule.per_channel_flops:
                    each = rule.channel_flops(self.layers[node.name], self.output_shape(node.name, node.ids.size))
                    if each:
                        found[node.name] = (int(each), node.ids)
            self.__dict__["_channel_costs"] = found
        return found

    def node_flops(self, name):
        """Multiply-adds per sample of the units node ``name`` with all its units."""
        node, layer = self.node(name), self.layers[name]
        return registry.units_rule(layer).flops(layer, node.positions, node.in_units, node.out_units,
                                                self.output_shape(name, node.out_units))

    @property
    def feature_ids(self):
        """int ``(n_features,)``: the unit id of each input feature (features of inputs that a shared layer reads
        side by side are one unit)."""
        if not self.inputs:
            return np.arange(self.n_features or 0)
        return np.concatenate([self.tensor(found.name).ids for found in self.inputs])

    def layer_name(self, name):
        """The node of the first call of ``name``'s layer (``name`` itself unless it is a later call of a shared layer)."""
        return self.calls.get(name, name)

    @property
    def kept_features_always(self):
        """bool ``(n_features,)``: features that always stay (the channels of an input map)."""
        out = np.zeros(self.n_features or 0, dtype=bool)
        for found in self.inputs:
            if not found.flat and not found.sequence:
                out[found.start : found.start + found.count] = True
        if not self.inputs and not self.flat_features:
            out[:] = True
        return out

    def node(self, name):
        """The :class:`UnitsNode` called ``name``."""
        for node in self.units:
            if node.name == name:
                return node
        raise KeyError(name)

    def tensor(self, name):
        """The :class:`Node` called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def output_ids(self):
        """The unit ids of the model's outputs (a set of ints)."""
        return {int(unit) for name in self.outputs for unit in self.tensor(name).ids}

    def whole_readers(self):
        """``((node, ids), ...)``: the layers that mix the units they read (a ``LayerNormalization`` over the
        channels of a residual stream, a channels-first pooling, cross-attention), each with the unit ids of its
        inputs: every one of them stays while the layer does."""
        kinds = {node.name: node.kind for node in self.nodes}

        def channels(node):  # of every tensor it reads once, less a constant (a fixed attention mask)
            read = [self.tensor(name).ids for name in dict.fromkeys(node.inputs) if kinds[name] != Kind.CONSTANT]
            return np.concatenate(read) if read else np.zeros(0, dtype=int)

        return tuple((node, channels(node)) for node in self.nodes if node.kind in (Kind.TAIL, Kind.WHOLE)
                     and node.inputs)

    @property
    def first(self):
        """The first units layer that reads the model input (``None`` when there is none)."""
        for node in self.units:
            if node.reads_input:
                return node
        return self.units[0] if self.units else None


_CACHE = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _signature(model):
    ids = []

    def walk(parent):
        for layer in parent.layers:
            ids.append(id(layer))
            if isinstance(layer, keras.Model):
                walk(layer)

    walk(model)
    return tuple(ids) + (model.built, registry.table_version())


def model_graph(model):
    """The :class:`ModelGraph` of a built ``model`` (cached until its layers change).

    Example:
        >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, name="conv"),
        ...                           keras.layers.Flatten(), keras.layers.Dense(2, name="out")])
        >>> graph = model_graph(model)
        >>> [(n.name, n.in_units, n.positions, n.out_units) for n in graph.units]
        [('conv', 1, 9, 4), ('out', 4, 36, 2)]
    """
    signature = _signature(model)
    with _CACHE_LOCK:
        cached = _CACHE.get(model)
    if cached is not None and cached[0] == signature:
        return cached[1]
    graph = _model_graph(model, flat_graph(model))
    with _CACHE_LOCK:
        try:
            _CACHE[model] = (signature, graph)
        except TypeError:  # pragma: no cover - not weak-referenceable
            pass
    return graph


def _serialized_tensors(value):
    """The config of every ``__keras_tensor__`` inside a serialized call argument, in order."""
    found = []
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            found.append(value["config"])
        else:
            for item in value.values():
                found.extend(_serialized_tensors(item))
    elif isinstance(value, (list, tuple)):
        for item in value:
            found.extend(_serialized_tensors(item))
    return found


def _operands(value):
    """The tensor arguments of a serialized call, in order: ``("tensor", keras_history)`` for a tensor of the
    model, ``("constant", array)`` for a constant array (``__tensor__`` or ``__numpy__``: a tensor no input reaches,
    computed when the model was built)."""
    found = []
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            found.append(("tensor", tuple(value["config"]["keras_history"])))
        elif registry.is_constant_value(value):
            found.append(("constant", registry.constant_array(value)))
        else:
            for item in value.values():
                found.extend(_operands(item))
    elif isinstance(value, (list, tuple)):
        for item in value:
            found.extend(_operands(item))
    return found


def _keras_histories(value):
    """Every ``keras_history`` ``[name, node, tensor]`` inside a serialized call argument."""
    return [tuple(config["keras_history"]) for config in _serialized_tensors(value)]


def _tensor_shapes(value):
    """The shapes of the ``__keras_tensor__`` entries in a serialized call (batch axis included)."""
    return [tuple(config["shape"]) for config in _serialized_tensors(value)]


def _io_calls(entry):
    """``[(name, call index)]`` of the model's inputs or outputs.

    A single endpoint is serialized as ``[name, node, tensor]``; several as a
    list of those, or as a dict of them (named inputs or outputs), flattened
    in the order of ``keras.tree`` (sorted keys): the order of ``model.inputs``.
    """
    if isinstance(entry, dict):
        return [call for key in sorted(entry) for call in _io_calls(entry[key])]
    if entry and isinstance(entry[0], str):
        return [(entry[0], int(entry[1]) if len(entry) > 1 else 0, int(entry[2]) if len(entry) > 2 else 0)]
    return [call for e in entry for call in _io_calls(e)]


def _io_names(entry):
    return [name for name, _, _ in _io_calls(entry)]


def output_of(name, tensor):
    """The producer ``name`` of a tensor: the node itself for its first output, ``"<node>/@k"`` for output ``k``
    of a layer with several (a nested block's; ``/`` never occurs in a layer name)."""
    return f"{name}/@{tensor}" if tensor else name


def node_of(producer):
    """The node whose output ``producer`` is (see :func:`output_of`)."""
    return producer.split("/@")[0]


def is_side_output(name, layers):
    """``name`` is output ``k > 0`` of a node whose rule says its later outputs carry no units (T5's position
    bias, :class:`~.rules.shape.PositionBiasAttentionRule`): read only as a side tensor, or returned by a block."""
    if "/@" not in name or name in layers:
        return False
    layer = layers.get(node_of(name))
    return layer is not None and not is_operation(layer) and getattr(registry.rule_of(layer), "side_outputs", False)


def _multi_output_reads(order, layers, producers, consumers, output_names, problems):
    """Flag (in place) what still reads output ``k > 0`` of a node after the blocks are inlined, and point it at
    the node: the graph follows one output per node (a side output, :func:`is_side_output`, is followed as a side
    tensor: a block may return it)."""
    for name in order:
        if any("/@" in p and p not in layers for p in producers.get(name, [])):
            problems.append((name, "a layer reading a multi-output layer"))
            producers[name] = [p if p in layers else node_of(p) for p in producers[name]]
    for key in [k for k in consumers if "/@" in k and k not in layers]:
        consumers.setdefault(node_of(key), []).extend(consumers.pop(key))
    for i, name in enumerate(output_names):
        if is_side_output(name, layers):
            continue
        if "/@" in name and name not in layers:
            problems.append((node_of(name), "a model output that is one of several outputs of a layer"))
            output_names[i] = node_of(name)


def flat_graph(model):
    """``(order, layers, producers, consumers, inputs, outputs, problems)`` of the model's call graph.

    Built from ``Sequential.layers`` and the functional config's calls
    (:func:`graph_config`: Keras's serialization, or the model's own nodes). A
    nested Sequential or functional model, or a block of layers whose call is
    traced (:func:`traced_block`, called on any number of tensors, each input of
    the block reading the tensor its call put there), a nested model used on one
    input (any number of outputs), is inlined: its layers join the graph as ``"<block>/<layer>"`` (Keras forbids
    ``/`` in layer names, so these never clash), so the Dense layers inside it
    are seen, penalised and pruned like any other. A nested model that cannot
    be inlined stays one opaque node with the reason in ``problems``.

    A tensor that no model input reaches (positions from ``keras.ops.arange``,
    a table computed when the model was built and added to the input's path)
    is a node of its own, a :class:`~keras_group_lasso.graph.registry.ConstantValue`
    without producers; a keras.ops operation of constants only is one too,
    computed once. The layers such a constant feeds (a position ``Embedding``)
    are nodes like any other.
    """
    graph = _flat_graph(model)
    if graph is None:
        return None
    order, layers, producers, consumers, input_names, output_names, problems, shapes, sides, blocks = graph
    shared = {name for name, _ in problems}
    for block in list(order):
        layer = layers.get(block)
        if block in input_names or block in shared:
            continue
        if isinstance(layer, keras.Model) and is_graph_model(layer):
            inner = flat_graph(layer)
        else:
            traced = traced_block(layer)
            if traced is None:
                if isinstance(layer, keras.Model):
                    problems.append((block, "a nested subclassed model (no layer graph)"))
                continue
            inner = flat_graph(traced)
        reason = _inline_refusal(layer, inner, producers.get(block, []), traced=not isinstance(layer, keras.Model)
                                 or not is_graph_model(layer))
        if reason:
            problems.append((block, reason))
            continue
        operands = tuple(producers[block])
        ends = _inline(block, inner, order, layers, producers, consumers, output_names, problems, sides, blocks)
        if not isinstance(layer, keras.Model) or not is_graph_model(layer):
            blocks[block] = BlockCall(layer, operands, ends)
        shapes.update({f"{block}/{name}": shape for name, shape in inner[7].items()})
    _multi_output_reads(order, layers, producers, consumers, output_names, problems)
    if sides:  # what an inlined block's side tensors read, computed here; then nothing else reads it
        fixed = tuple(call for call, block in blocks.items() if fixed_sizes(block.layer))
        _complete_sides(sides, layers, producers, input_names, problems, fixed)
        read = dict(producers)
        _drop_mask_operations(order, layers, producers, consumers, output_names)
        _dropped_operands(blocks, order, layers, read, input_names)
    return order, layers, producers, consumers, input_names, output_names, problems, shapes, sides, blocks


def _dropped_operands(blocks, order, layers, producers, input_names):
    """Give (in place) each block call the side tensors of its operands that the graph dropped (read by its side
    tensors alone), computed from the inputs; ``producers`` as they were before the drop."""
    kept, operation_of = set(order) | set(input_names), _operation_of(layers)

    def leaf(name):
        return is_side_output(name, layers)

    for call, block in list(blocks.items()):
        found = []
        for name in block.operands:
            if name in kept or leaf(name):
                continue
            steps = _side_steps(name, operation_of, producers, input_names, leaf)
            if steps is not None:
                found.append((name, SideTensor(name, steps)))
        if found:
            blocks[call] = dataclasses.replace(block, sides=tuple(found))


_TRACED = weakref.WeakKeyDictionary()


def traced_block(layer):
    """A functional model of the layers and keras.ops that ``layer``'s ``call`` is made of, or ``None``.

    A layer (or subclassed model) that the registry does not know, built from
    sublayers, is called once through its own ``call`` on the arguments of
    its first call in the graph, each tensor among them (positional or
    keyword: ``block(x, skip)``, ``block(x, condition=c)``) a symbolic input
    of its shape, the other arguments as given (a subclassed model built on
    data: one input of the shape it was built for): every sublayer and keras.ops call inside it
    becomes a node, so the Dense layers and convolutions inside are seen,
    penalised and pruned like any other. The result is kept per layer (the
    sublayers record that one call); a block called several times is the
    same traced graph at each call, its sublayers shared between the calls. ``None`` where that tells nothing:
    a layer the registry knows (or recognizes by what it computes), one
    whose ``call`` fails on a symbolic input
    or returns its input, or one with weights of its own (a variable its sublayers do not hold: its math is its own and
    needs a rule, see :func:`~keras_group_lasso.graph.register_layer`).

    A sublayer the call runs on constants only (keras.io's position ``Embedding`` on ``keras.ops.arange``) is
    called on a symbolic input that stands for the constant (:class:`_ConstantCatcher`): an input of the
    functional model that the graph reads as a constant, not as a model input.
    """
    if layer is None or is_operation(layer) or registry.rule_of(layer) is not None:
        return None
    if layer in _TRACED:
        return _TRACED[layer]
    traced = _trace(layer)
    try:
        _TRACED[layer] = traced
    except TypeError:  # pragma: no cover - not weak-referenceable
        pass
    return traced


def graph_model(model):
    """``model`` when its graph can be read (Sequential, functional); for a subclassed model built on data (or
    with ``build``), the functional model of the layers its ``call`` runs (:func:`traced_block`), which computes
    what it computes with the same layers; else ``model`` (refused where it is used)."""
    if not isinstance(model, keras.Model) or is_graph_model(model):
        return model
    traced = traced_block(model)
    # constants computed in a subclassed model's own call are inputs of its traced model: not a drop-in copy
    return traced if traced is not None and traced not in _CONSTANT_INPUTS else model


def _input_spec(layer):
    """``(batch shape, dtype)`` of the one tensor ``layer`` was called on, or ``None``."""
    try:
        spec = layer.input
    except Exception:  # noqa: BLE001 - called several times, or never called on a symbolic tensor
        spec = None
    if isinstance(spec, keras.KerasTensor):
        return tuple(spec.shape), spec.dtype
    if spec is not None or not isinstance(layer, keras.Model) or not layer.built:
        return None
    # A subclassed model built on data (``model(x)``, ``fit``) or with ``build(shape)``: its input shape, any batch.
    shape = (layer.get_build_config() or {}).get("input_shape")
    if not isinstance(shape, (list, tuple)) or not shape or not all(d is None or isinstance(d, int) for d in shape):
        return None
    return (None,) + tuple(shape[1:]), getattr(layer, "input_dtype", None) or keras.config.floatx()


# {traced model: {name of an input that stands for a constant: its value}} (see _trace)
_CONSTANT_INPUTS = weakref.WeakKeyDictionary()
_CATCHING = {}  # layer class -> its subclass that catches calls on constants (see _ConstantCatcher)
_CATCHING_LOCK = threading.Lock()


class _ConstantCatcher:
    """While a block's call is traced, its sublayers called on constants only are called on symbolic inputs.

    keras.io computes positions in a block's ``call`` (``keras.ops.arange``) and calls a position ``Embedding``
    on them: called on a symbolic input, the block runs that Embedding on an eager tensor, which no node
    records. Each sublayer of the block takes, for the trace, a subclass of its own class whose ``__call__``
    replaces every constant array among its arguments by a ``keras.Input`` of that array's shape (recorded
    with its value), so the layer and all it feeds become nodes; its class is restored afterwards.
    """

    def __init__(self, block):
        self.sublayers = [sub for sub in block._flatten_layers(include_self=False, recursive=False)
                          if type(sub).__call__ is keras.layers.Layer.__call__]
        self.found = []  # (the keras.Input that stands for a constant, its value)

    def __enter__(self):
        swapped = []
        for sub in self.sublayers:
            try:
                sub.__class__ = _catching(type(sub))
            except Exception:  # noqa: BLE001 - a class whose instances cannot change class: traced as it is
                continue
            object.__setattr__(sub, "_constant_catcher", self)  # not an attribute Keras tracks
            swapped.append(sub)
        self.sublayers = swapped
        return self

    def __exit__(self, *exc):
        for sub in self.sublayers:
            sub.__class__ = type(sub).__mro__[1]
            if "_constant_catcher" in vars(sub):
                object.__delattr__(sub, "_constant_catcher")
        return False

    def replace(self, args, kwargs):
        """``(args, kwargs)`` with every constant array a symbolic input, when no argument is symbolic already."""
        flat = keras.tree.flatten((args, kwargs))
        if any(isinstance(v, keras.KerasTensor) for v in flat) or not any(registry.is_constant_array(v) for v in flat):
            return args, kwargs

        def symbolic(value):
            if not registry.is_constant_array(value):
                return value
            array = np.asarray(keras.ops.convert_to_numpy(value))
            tensor = keras.Input(batch_shape=array.shape, dtype=keras.backend.standardize_dtype(array.dtype))
            self.found.append((tensor, array))
            return tensor

        return keras.tree.map_structure(symbolic, (args, kwargs))


def _catching(cls):
    with _CATCHING_LOCK:
        if cls not in _CATCHING:
            def __call__(self, *args, **kwargs):
                catcher = vars(self).get("_constant_catcher")
                if catcher is None:
                    return cls.__call__(self, *args, **kwargs)
                args, kwargs = catcher.replace(args, kwargs)
                kwargs = _without_defaults(self, kwargs)
                try:
                    return cls.__call__(self, *args, **kwargs)
                except Exception as error:  # noqa: BLE001 - again without the None among its outputs, then with
                    try:  # Keras's own output shapes; else this error
                        return call_without_none(self, cls.__call__, args, kwargs)
                    except Exception:  # noqa: BLE001
                        pass
                    try:
                        return call_with_keras_shapes(self, cls.__call__, args, kwargs)
                    except Exception:  # noqa: BLE001
                        raise error from None

            _CATCHING[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})
        return _CATCHING[cls]


def _traced_outputs(y):
    """A traced call's outputs as the traced model's: less ``None`` entries (:func:`~.rules.base.without_none`) and
    less the constants at their end (KerasHub's ``DeiTEncoder`` returns empty arrays where it gathers no hidden
    states), which the graph that calls the block does not read as tensors it makes."""
    y = without_none(y)
    if not isinstance(y, (tuple, list)):
        return y
    kept = list(y)
    while len(kept) > 1 and registry.is_constant_array(kept[-1]):
        kept.pop()
    return y if len(kept) == len(y) else (kept[0] if len(kept) == 1 else type(y)(kept))


_KEPT_OUTPUTS = weakref.WeakKeyDictionary()  # traced block -> how many of its call's outputs the trace kept


def block_outputs(layer, outputs):
    """The outputs of a call of the traced block ``layer`` that its traced graph has, flat (``keras.tree`` order):
    less ``None`` entries and the constants at their end that the trace left out (:func:`_traced_outputs`)."""
    flat = [x for x in keras.tree.flatten(outputs) if x is not None]
    kept = _KEPT_OUTPUTS.get(layer)
    return flat if kept is None else flat[:kept]


def _without_defaults(layer, kwargs):
    """``kwargs`` less the keyword arguments given as ``None`` where ``None`` is the call's default: a layer called
    symbolically hands its keywords to ``compute_output_spec``, which may not take them (KerasHub's
    ``CachedMultiHeadAttention`` with ``cache=None``: a MultiHeadAttention's spec takes no cache)."""
    try:
        parameters = inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return kwargs
    return {key: value for key, value in kwargs.items()
            if not (value is None and key in parameters and parameters[key].default is None and key != "training")}


def _symbolic_call(layer):
    """``(args, kwargs, inputs)``: the arguments of ``layer``'s first call in a functional graph with each tensor
    (and each constant array) a new ``keras.Input`` of its shape, and those inputs in the order the graph lists
    the call's operands (:func:`_operands`: the positional arguments, then the keyword ones as given); ``None``
    where the layer has no such call.

    A call on a tensor that carries a Keras mask (after ``Embedding(mask_zero=True)`` or ``Masking``) is not
    traced (:data:`MASKED`): the block may build an attention mask from it, or drop it where its layers would
    pass it on, so its layers called one by one need not compute what it computed; it stays one node, named with
    that reason."""
    try:
        node = layer._inbound_nodes[0]  # noqa: SLF001 - the call Keras recorded, as it runs the graph itself
        args, kwargs = list(node.arguments.args), dict(node.arguments.kwargs)
    except (AttributeError, IndexError):
        return None
    if not node.arguments.keras_tensors:
        return None
    mask = kwargs.pop("mask", None)
    if mask is not None or any(getattr(t, "_keras_mask", None) is not None for t in node.arguments.keras_tensors):
        _UNTRACED[layer] = MASKED
        return None
    inputs = []

    def symbolic(value):
        if isinstance(value, keras.KerasTensor) or registry.is_constant_array(value):
            shape = tuple(value.shape)
            dtype = keras.backend.standardize_dtype(value.dtype)
            inputs.append(keras.Input(batch_shape=shape, dtype=dtype, name=f"{layer.name}_input{len(inputs)}"))
            return inputs[-1]
        if isinstance(value, dict):
            return {key: symbolic(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(symbolic(item) for item in value)
        return value

    args, kwargs = symbolic(args), symbolic(kwargs)
    if len(inputs) > 1 and type(layer).__module__.split(".")[0] == "keras":
        return None  # a layer of Keras's own on several tensors (Dot): its math is its own, named as it is
    return args, kwargs, inputs


#: Why a block called on a masked tensor stays one node (see :func:`_symbolic_call`).
MASKED = ("a block called on a tensor that carries a Keras mask (Embedding(mask_zero=True), Masking): its call is "
          "not traced, since its layers called one by one may pass or use the mask differently")
_UNTRACED = weakref.WeakKeyDictionary()  # block -> why it is not traced, where that is worth saying


def _trace(layer):
    call = _symbolic_call(layer)
    if call is None and layer in _UNTRACED:
        return None
    if call is None:  # a subclassed model built on data: one input of the shape it was built for
        spec = _input_spec(layer)
        if spec is None:
            return None
        x = keras.Input(batch_shape=spec[0], dtype=spec[1], name=f"{layer.name}_input")
        call = [x], {}, [x]
    try:
        traced, y, catcher, constants, call = _traced_call(layer, call)
    except Exception as error:  # noqa: BLE001 - a call that does not trace symbolically stays one node
        if layer.weights:  # a block of layers that cannot be seen into: why, in the refusal
            said = " ".join(str(error).split())
            _UNTRACED[layer] = (f"a block whose call does not run on symbolic inputs ({type(error).__name__}: "
                                f"{said[:160]}{'...' if len(said) > 160 else ''})")
        return None
    args, kwargs, inputs = call
    held = {id(v) for sub in traced.layers for v in sub.weights}
    own = [v for v in layer.weights if id(v) not in held]
    if own:
        named = next((key for key, value in vars(layer).items() if value is own[0] and not key.startswith("_")),
                     own[0].path.rsplit("/", 1)[-1])
        _UNTRACED[layer] = f"a layer with weights of its own ('{named}'), whose math needs a rule" + (
            "; Keras's Dense acts on the last axis of inputs of any rank: Dense(n) in place of "
            "TimeDistributed(Dense(n)) computes the same and is read"
            if isinstance(layer, keras.layers.TimeDistributed) and isinstance(layer.layer, keras.layers.Dense)
            else "")
        return None
    if any(y is x for x in inputs):
        return None
    if constants:
        _CONSTANT_INPUTS[traced] = {tensor._keras_history[0].name: value for tensor, value in catcher.found}
    _CALLS[layer] = (args, kwargs, inputs)
    return traced


_CALLS = weakref.WeakKeyDictionary()  # traced block -> (args, kwargs, inputs) of the call it was traced on


def _traced_call(layer, call):
    """``(traced model, outputs, catcher, constants, call)``: ``layer.call`` run on the symbolic ``call``; raises
    where it does not trace.

    A call that takes a size of its input as a number (KerasHub's causal mask, ``keras.ops.arange(ops.shape(x)[1])``;
    its rotary positions) fails on an axis of unknown size (``None``): it is traced again with each unknown axis at
    a probe size (:data:`PROBE_SIZES`). What it computes from those sizes alone (the mask, the positions) is then a
    constant of the traced graph, right at those sizes only: the graph reads the block's layers and units from it,
    and :func:`fixed_sizes` says so, so that the block is not run as its traced layers at other sizes.
    """
    try:
        return _call_on(layer, call)
    except Exception:  # noqa: BLE001 - retried below at probe sizes where an axis is unknown
        sized = _at_probe_sizes(layer, call)
        if sized is None:
            raise
    found = _call_on(layer, sized)
    # the blocks inside were called at the probe sizes too: their own traces hold constants at those sizes
    for held in [found[0], *layer._flatten_layers(include_self=False, recursive=True)]:
        mark_probe_sized(held)
    return found


_DEFERRING_LOCK = threading.RLock()


@contextlib.contextmanager
def _arrays_defer_to_symbolic_tensors():
    """On JAX, while a block is traced: a JAX array combined with a symbolic tensor by an operator
    (``causal_mask & keras.ops.cast(mask, "bool")``, as KerasHub's T5 and Falcon compute a mask from constants
    and an input) gives the symbolic result Keras computes, as on the other backends. A JAX array converts the
    other operand through its ``__jax_array__``, which a ``KerasTensor`` answers by raising; without it, the array
    returns ``NotImplemented`` and Python calls the tensor's own operator."""
    method = vars(keras.KerasTensor).get("__jax_array__")
    if keras.backend.backend() != "jax" or method is None:
        yield
        return
    with _DEFERRING_LOCK:
        delattr(keras.KerasTensor, "__jax_array__")
        try:
            yield
        finally:
            keras.KerasTensor.__jax_array__ = method


def _call_on(layer, call):
    args, kwargs, inputs = call
    with _ConstantCatcher(layer) as catcher, _arrays_defer_to_symbolic_tensors():
        returned = layer.call(*args, **kwargs)
    y = _traced_outputs(returned)
    if y is not returned:
        _KEPT_OUTPUTS[layer] = len(keras.tree.flatten(y))
    constants = [tensor for tensor, _ in catcher.found]
    ins = inputs + constants
    traced = keras.Model(ins if len(ins) > 1 else ins[0], y, name=layer.name)
    return traced, y, catcher, constants, call


def _at_probe_sizes(layer, call):
    """``call`` with every input of an axis of unknown size replaced by one of the probe size, or ``None``."""
    args, kwargs, inputs = call
    if not any(d is None for x in inputs for d in x.shape):
        return None
    batch, other = PROBE_SIZES
    given = {}
    for k, x in enumerate(inputs):
        shape = tuple((batch if axis == 0 else other) if d is None else d for axis, d in enumerate(x.shape))
        given[id(x)] = keras.Input(batch_shape=shape, dtype=x.dtype, name=f"{layer.name}_input{k}")

    return _swapped(args, given), _swapped(kwargs, given), [given[id(x)] for x in inputs]


def fixed_sizes(layer):
    """The traced block ``layer`` was traced at the probe sizes (:func:`_traced_call`): its traced graph holds
    constants right at those sizes only (a causal mask, rotary positions)."""
    traced = _TRACED.get(layer)
    return traced is not None and (probe_sized(traced) or probe_sized(layer))


def block_operands(layer):
    """The symbolic inputs the traced block ``layer`` was called on, one per operand of its calls."""
    return tuple(_CALLS[layer][2])


def block_arguments(layer, tensors):
    """``(args, kwargs)`` to call the traced block ``layer`` as the graph calls it, with ``tensors`` in place of
    its operands (in the order of :attr:`BlockCall.operands`)."""
    args, kwargs, inputs = _CALLS[layer]
    given = {id(x): tensor for x, tensor in zip(inputs, tensors, strict=True)}

    return _swapped(args, given), _swapped(kwargs, given)


def _swapped(value, given):
    """``value`` (a call's arguments, nested in dicts, lists and tuples) with each object whose ``id`` is a key of
    ``given`` replaced by its entry."""
    if id(value) in given:
        return given[id(value)]
    if isinstance(value, dict):
        return {key: _swapped(item, given) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_swapped(item, given) for item in value)
    return value


def is_graph_model(model):
    return isinstance(model, keras.Sequential) or any(cls.__name__ == "Functional" for cls in type(model).__mro__)


def _inline_refusal(model, inner, producers, traced):
    if inner is None:
        return "a nested subclassed model (no layer graph)"
    _, _, _, _, inputs, outputs, _, _, _, _ = inner
    # a traced block's inputs are its call's operands in the graph's order (_symbolic_call); a nested model's,
    # the entries of the list or dict it is called on, in keras.tree's order (_sorted_dicts)
    if len(inputs) != len(producers):
        return f"a nested model with {len(inputs)} inputs"
    if all(output in inputs for output in outputs):
        return "a nested model without layers"
    return None


def _inline(block, inner, order, layers, producers, consumers, output_names, problems, sides, blocks):
    """Replace the node ``block`` by the nodes of its own graph ``inner``, in place; the names of the nodes of its
    outputs, in order."""
    i_order, i_layers, i_producers, i_consumers, i_inputs, i_outputs, i_problems, _, i_sides, i_blocks = inner
    sources = dict(zip(i_inputs, producers[block]))  # input k of the block reads operand k of its call

    def qualified(name):
        return sources.get(name, f"{block}/{name}")

    names = [qualified(n) for n in i_order if n not in sources]
    at = order.index(block)
    order[at : at + 1] = names
    for name in i_order:
        if name in sources:
            continue
        layers[qualified(name)] = i_layers[name]
        producers[qualified(name)] = [qualified(p) for p in i_producers.get(name, [])]
        consumers[qualified(name)] = [qualified(c) for c in i_consumers.get(name, [])]
    # output k of the block (the producer "block" for k = 0, "block/@k" after) is the node of its k-th output
    ends = {output_of(block, k): qualified(output) for k, output in enumerate(i_outputs)}
    for end, last in ends.items():
        outer_consumers = consumers.pop(end, [])
        node = last if last in layers else node_of(last)  # a split's part is a node of its own
        consumers[node] = consumers.get(node, []) + outer_consumers
        for consumer in outer_consumers:
            producers[consumer] = [last if p == end else p for p in producers[consumer]]
    for i_input, source in sources.items():
        entry = consumers[source if source in consumers else node_of(source)]  # a side output: its node's
        at = entry.index(block)
        entry[at : at + 1] = [qualified(c) for c in i_consumers.get(i_input, [])]
    output_names[:] = [ends.get(o, o) for o in output_names]
    problems.extend((qualified(name), reason) for name, reason in i_problems)
    sides.update({qualified(name): {key: side.renamed(qualified) for key, side in found.items()}
                  for name, found in i_sides.items()})
    blocks.update({qualified(name): call.renamed(qualified) for name, call in i_blocks.items()})
    for name, call in blocks.items():  # a block called on this one's outputs reads their nodes now
        blocks[name] = call.renamed(lambda p: ends.get(p, p))
    del layers[block], producers[block]
    return tuple(ends.values())


def _flat_graph(model):
    """The call graph of ``model``'s own layers (a nested model is one node)."""
    problems = []
    if isinstance(model, keras.Sequential):
        layers = {layer.name: layer for layer in model.layers}
        order = [layer.name for layer in model.layers]
        producers = {name: ([order[i - 1]] if i else ["<input>"]) for i, name in enumerate(order)}
        consumers = {name: ([order[i + 1]] if i + 1 < len(order) else []) for i, name in enumerate(order)}
        consumers["<input>"] = order[:1]
        layers["<input>"] = None
        return ["<input>"] + order, layers, producers, consumers, ["<input>"], order[-1:], problems, {}, {}, {}

    try:
        config = graph_config(model)
        layer_configs = config["layers"]
        input_names = _io_names(config["input_layers"])
        output_names = _io_names(config["output_layers"])
    except Exception:  # noqa: BLE001 - a subclassed model has no readable graph
        return None
    layers = {layer.name: layer for layer in model.layers}
    taken = {layer_config["name"] for layer_config in layer_configs}

    def call_name(name, index):
        """The graph node of call ``index`` of layer ``name``: the name itself, then ``name#1``, ``name#2`` ..."""
        if not index:
            return name
        node = f"{name}#{index}"
        while node in taken and node not in calls:
            node += "#"
        calls[node] = name
        return node

    calls, shapes, arguments = {}, {}, {}  # shapes: the input shapes of every call of a shared layer
    side_ends = {}  # node -> {keyword: the node whose output the call gave it as a side tensor}
    operations = {}  # name -> the keras.ops operation of a node that is one
    order, producers, consumers = [], {}, {}
    for layer_config in layer_configs:
        name = layer_config["name"]
        if name not in layers:
            try:
                layers[name] = model.get_layer(name)
            except ValueError:  # a keras.ops call on a symbolic tensor (``x + 3.0``) is an operation, not a layer
                operation = _operations(model).get(name)
                operations[name] = operation
                # A number added to, subtracted from, or multiplying a tensor is a Rescaling (hard-sigmoid's
                # ``relu6(x + 3) / 6``): the graph sees, and surgery rebuilds, that layer.
                layers[name] = _operation_layer(operation, layer_config.get("inbound_nodes"))
        nodes = layer_config.get("inbound_nodes") or [None]
        # A layer called several times (shared) is one node per call: ``name``, ``name#1``, ...
        layer = layers[name]
        for index, node in enumerate(nodes):
            node_name = call_name(name, index)
            layers[node_name] = layer
            if registry.is_reverse_call(layer, node):  # a language model's logits from its token table
                layers[node_name] = registry.ReverseCall(layer)
            producers[node_name] = []
            node, side = _without_side(node, layer)  # a mask its rule names a side tensor (T5's), then any other
            node = _without_mask(node)
            if _is_functional(layer):  # a nested model's inputs are its dict's entries in sorted order
                node = _sorted_dicts(node)
            if side:  # an attention mask: not units, computed again in the pruned model (side_tensors below)
                side_ends[node_name] = {key: output_of(call_name(h[0], h[1]), h[2]) for key, h in side.items()}
            for k, (what, found) in enumerate(_operands(node)):
                if what == "tensor":
                    # output k > 0 of a layer: resolved when that layer is a block inlined below, flagged otherwise
                    producers[node_name].append(output_of(call_name(found[0], found[1]), found[2]))
                else:  # a constant operand (positions from keras.ops.arange, through an Embedding): a node of its own
                    leaf = f"{node_name}/constant{k}"
                    layers[leaf] = registry.ConstantValue(leaf, found)
                    order.append(leaf)
                    producers[leaf] = []
                    producers[node_name].append(leaf)
            parts = _split_parts(node_name, layer, node)
            if parts:  # keras.ops.split along the channels: one node per output (``split``, ``split/@1``, ...)
                for part in parts:
                    layers[part.name] = part
                    order.append(part.name)
                    producers[part.name] = list(producers[node_name])
                    consumers.setdefault(part.name, [])
                    for producer in producers[part.name]:
                        consumers.setdefault(producer, []).append(part.name)
                continue
            order.append(node_name)
            consumers.setdefault(node_name, [])
            arguments[node_name] = node
            if len(nodes) > 1:
                shapes[node_name] = _tensor_shapes(node)
            for producer in producers[node_name]:
                consumers.setdefault(producer, []).append(node_name)
    # Keras numbers the calls of a nested functional model from 1 in ``output_layers`` (its node 0 is its own
    # input-to-output node) but from 0 in the ``keras_history`` of the layers that read it.
    output_names = [output_of(call_name(name, index - 1 if index and _is_functional(layers.get(name)) else index),
                              tensor)
                    for name, index, tensor in _io_calls(config["output_layers"])]
    for name, value in _CONSTANT_INPUTS.get(model, {}).items():  # a traced block's constants: not inputs
        layers[name] = registry.ConstantValue(name, value)
        input_names.remove(name)
    _fold_constant_operations(order, layers, producers, consumers, arguments, operations)
    # A block traced at probe sizes computes its masks from constants right at those sizes: no side tensor (it is
    # built again as itself, see _complete_sides).
    sides = {} if probe_sized(model) else _side_tensors(side_ends, operations, producers, input_names, problems)
    _drop_mask_operations(order, layers, producers, consumers, output_names, operations)
    if calls and any(isinstance(layers.get(name), keras.Model) for name in calls.values()):
        for node_name, name in calls.items():
            if isinstance(layers.get(name), keras.Model):
                problems.append((name, "a nested model called several times (shared)"))
    return order, layers, producers, consumers, input_names, output_names, problems, shapes, sides, {}


def _operation_layer(operation, inbound_nodes):
    """The layer that stands for a keras.ops call (:func:`registry.operation_layer`), else the operation itself
    (refused by name): also where that layer cannot take the operands as the operation broadcasts them (a product
    with a table of one row per position, the same for every sample and head: rotary embeddings)."""
    try:
        layer = registry.operation_layer(operation, inbound_nodes)
    except ValueError:
        return operation
    return layer or operation


def _sorted_dicts(value):
    """A serialized call with every plain dict (named inputs) in sorted key order, as ``keras.tree`` flattens a
    functional model's inputs."""
    if isinstance(value, dict):
        keys = list(value) if "class_name" in value else sorted(value)  # a serialized object keeps its own order
        return {key: _sorted_dicts(value[key]) for key in keys}
    if isinstance(value, (list, tuple)):
        return type(value)(_sorted_dicts(item) for item in value)
    return value


def _without_side(node, layer):
    """``(call, {keyword: keras_history})``: a serialized call without the side tensors its layer's rule names
    (a ``MultiHeadAttention``'s ``attention_mask``), and where each of those came from."""
    rule = registry.rule_of(layer) if layer is not None and not is_operation(layer) else None
    keys = getattr(rule, "side_arguments", ())
    kwargs = node.get("kwargs") if isinstance(node, dict) else None
    if not keys or not isinstance(kwargs, dict):
        return node, {}
    args = node.get("args")
    if isinstance(args, list) and len(args) > 1:  # a side tensor passed by position (MaskedLMHead's mask_positions)
        names = _positional_parameters(layer)[:len(args)]
        moved = {name: value for name, value in zip(names, args) if name in keys}
        if moved:
            kept = [value for name, value in zip(names, args) if name not in moved] + args[len(names):]
            node = dict(node, args=kept, kwargs={**kwargs, **moved})
            kwargs = node["kwargs"]
    side = {}
    for key in keys:
        value = kwargs.get(key)
        if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
            side[key] = tuple(value["config"]["keras_history"])
    if not side:
        return node, {}
    return dict(node, kwargs={k: v for k, v in kwargs.items() if k not in side}), side


def _positional_parameters(layer):
    """The names of the arguments ``layer.call`` takes by position, in order (``[]`` where it cannot say)."""
    try:
        parameters = inspect.signature(layer.call).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [parameter.name for parameter in parameters if parameter.kind in kinds]


@dataclasses.dataclass(frozen=True)
class SideTensor:
    """A tensor a layer is called with that carries no units (an attention mask), as the keras.ops calls that
    compute it from the model's inputs: ``steps`` ``((node name, operation, names of what it reads), ...)`` in
    call order, ``end`` the name of the tensor (the last step, or an input itself). The pruned model computes it
    again from its own inputs."""

    end: str
    steps: tuple = ()

    def renamed(self, rename):
        return SideTensor(rename(self.end), tuple((rename(name), operation, tuple(rename(p) for p in reads))
                                                  for name, operation, reads in self.steps))

    def reads(self):
        """The names it reads that are not its own steps (the model inputs)."""
        own = {name for name, _, _ in self.steps}
        found = [p for _, _, reads in self.steps for p in reads if p not in own]
        return tuple(dict.fromkeys(found or ([] if self.end in own else [self.end])))

    def after(self, steps):
        """The same tensor with ``steps`` computed first (what it reads, computed in an enclosing graph)."""
        own = {name for name, _, _ in self.steps}
        return SideTensor(self.end, tuple(step for step in steps if step[0] not in own) + self.steps)


@dataclasses.dataclass(frozen=True)
class BlockCall:
    """A call of a block traced into the graph (:func:`traced_block`): ``layer`` called on the tensors of the
    nodes ``operands`` (in the order of its traced inputs, :func:`block_arguments`), its outputs the tensors of
    the nodes ``ends`` (in ``keras.tree``'s order of what its call returns)."""

    layer: object
    operands: tuple
    ends: tuple
    #: ``((operand, SideTensor), ...)``: the operands that only the block's side tensors read (T5's attention mask,
    #: ``padding_mask[:, None, :]``), which the graph drops: computed again from the inputs for the block's call
    sides: tuple = ()

    def renamed(self, rename):
        return BlockCall(self.layer, tuple(rename(p) for p in self.operands), tuple(rename(e) for e in self.ends),
                         tuple((rename(name), side.renamed(rename)) for name, side in self.sides))


def _side_steps(end, operation_of, producers, input_names, leaf=None):
    """The steps that compute ``end`` from ``input_names`` and the names where ``leaf(name)`` holds (the side
    outputs of layers the pruned model holds, :func:`is_side_output`; see :class:`SideTensor`), or ``None`` where
    something else than a keras.ops call of one node (``operation_of(name)``) is on the way."""
    steps, seen, stack = [], set(), [(end, False)]
    while stack:
        name, done = stack.pop()
        if done:
            steps.append((name, operation_of(name), tuple(producers.get(name, []))))
            continue
        if name in seen or name in input_names or (leaf is not None and leaf(name)):
            continue
        seen.add(name)
        operation = operation_of(name)
        if operation is None or len(getattr(operation, "_inbound_nodes", ())) != 1:
            return None
        stack.append((name, True))
        stack.extend((p, False) for p in reversed(producers.get(name, [])))
    return tuple(steps)


def _side_refusal(key):
    return (f"its {key} is computed from the layers' outputs (only keras.ops calls on the model's inputs are "
            "computed again in the pruned model)")


def _side_tensors(side_ends, operations, producers, input_names, problems):
    """``{node: {keyword: SideTensor}}`` of the side tensors of this graph's calls, computed back to its inputs
    (an enclosing graph carries on from there: :func:`_complete_sides`); one computed otherwise is a problem of
    its node."""
    found = {}
    for node_name, ends in side_ends.items():
        for key, end in ends.items():
            steps = _side_steps(end, operations.get, producers, input_names)
            if steps is None:
                problems.append((node_name, _side_refusal(key)))
            else:
                found.setdefault(node_name, {})[key] = SideTensor(end, steps)
    return found


def _complete_sides(sides, layers, producers, input_names, problems, fixed=()):
    """Carry (in place) each side tensor that reads an inlined block's input back to this graph's inputs.

    Inside a block traced at probe sizes (``fixed``, see :func:`fixed_sizes`) a side tensor (a causal mask) is
    computed from constants right at those sizes only: it is left out, and surgery builds such a block again as
    itself (which computes its masks), never from its layers."""
    operation_of = _operation_of(layers)

    def leaf(name):
        return is_side_output(name, layers)

    for node_name, found in sides.items():
        if any(node_name.startswith(f"{call}/") for call in fixed):
            found.clear()
            continue
        for key, side in list(found.items()):
            for read in side.reads():
                if read in input_names or leaf(read):
                    continue
                steps = _side_steps(read, operation_of, producers, input_names, leaf)
                if steps is None:
                    problems.append((node_name, _side_refusal(key)))
                    break
                side = side.after(steps)
            found[key] = side


def _operation_of(layers):
    """``name -> the keras.ops operation of that node``, ``None`` for a layer."""
    def operation_of(name):
        layer = layers.get(name)
        return layer if isinstance(layer, keras.Operation) and not isinstance(layer, keras.layers.Layer) else None

    return operation_of


def _split_parts(name, layer, call):
    """The :class:`~keras_group_lasso.graph.registry.ChannelSlice` of each output of a ``keras.ops.split`` of the
    channels called as ``call`` (serialized), else ``None``."""
    if not is_operation(layer) or registry.operation_name(layer) != "Split" or not isinstance(call, dict):
        return None
    shapes = _tensor_shapes(call.get("args", []))
    return registry.split_slices(name, layer, shapes[0]) if len(shapes) == 1 else None


def _fold_constant_operations(order, layers, producers, consumers, arguments, operations):
    """Make (in place) every keras.ops operation that no input reaches a constant, computed once.

    An operation of constants only (``positions * 2``), or one that reads only its operand's shape
    (``zeros_like``, :func:`registry.reads_no_values`) when that shape is known: the constant a pruned model
    computes its positions from (``zeros_like(sum(x)) + positions``) reads back as the constant it is.
    """
    for name in list(order):
        operation = operations.get(name)
        sources = producers.get(name, [])
        value = None if operation is None or name not in arguments else _constant_value(
            operation, arguments[name], [layers.get(s) for s in sources])
        if value is None:
            continue
        layers[name] = registry.ConstantValue(name, value)
        for source in sources:
            consumers[source] = [c for c in consumers.get(source, []) if c != name]
            if _is_constant(layers.get(source)) and not consumers[source]:
                order.remove(source)  # a constant only this one read
        producers[name] = []


def _constant_value(operation, call, sources):
    """The value of a keras.ops ``operation`` called as ``call`` (serialized) on ``sources``, when no input reaches
    it, else ``None``."""
    try:
        if registry.reads_no_values(operation):
            value = operation(*[np.zeros(shape, dtype) for shape, dtype in _argument_shapes(call)])
        elif sources and all(_is_constant(source) for source in sources):
            args, kwargs = _with_values(call, iter([source.value for source in sources]))
            value = operation(*args, **kwargs)
        else:
            return None
        return np.asarray(keras.ops.convert_to_numpy(value))
    except Exception:  # noqa: BLE001 - an operation that cannot be computed on its own stays (refused as such)
        return None


def _is_constant(layer):
    rule = registry.rule_of(layer) if layer is not None else None
    return rule is not None and rule.kind == Kind.CONSTANT


def _argument_shapes(call):
    """``[(shape, dtype)]`` of the tensors a serialized call reads; raises when one has a size not known."""
    found = []
    for config in _serialized_tensors(call):
        if any(d is None for d in config["shape"]):
            raise ValueError("a size that is not known")
        found.append((tuple(config["shape"]), config.get("dtype")))
    return found


def _with_values(call, values):
    """``(args, kwargs)`` of a serialized call, each tensor (``__keras_tensor__``) and constant array replaced by the
    next of ``values`` (in the order of :func:`_operands`)."""
    def replace(value):
        if isinstance(value, dict):
            if value.get("class_name") == "__keras_tensor__" or registry.is_constant_value(value):
                return next(values)
            return {key: replace(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(replace(item) for item in value)
        return value

    return list(replace(call.get("args", []))), dict(replace(call.get("kwargs", {})))


def graph_config(model):
    """The graph part of ``model``'s functional config: its layers by name, the calls between them, its inputs
    and outputs, in the form Keras serializes them.

    Keras's own serialization where it gives one. A ``Functional`` subclass (a KerasHub Backbone or Task, a
    model class of the user's own built on a functional graph) serializes its constructor's arguments instead,
    and a model holding a layer that cannot be serialized (one made with values its config cannot hold) fails
    to serialize: the graph of those is read from the nodes the model's layers were called at
    (:func:`_node_config`), the structure Keras itself runs the model through.
    """
    try:
        config = model.get_config()
    except Exception:  # noqa: BLE001 - a layer that does not serialize; the nodes still say the graph
        config = {}
    if "layers" in config or not _is_functional(model):
        return config
    return _node_config(model)


def _node_config(model):
    """The graph part of a functional config (see :func:`graph_config`), read from the model's nodes.

    A node is one call of a layer (or keras.ops operation); each tensor records the node that made it (its
    Keras history). Walking back from the outputs finds the calls that belong to this model; each layer's calls
    are numbered in order among those (a layer called in another model too keeps its own numbering here), as
    Keras numbers them when it saves the model.
    """
    def history(tensor):
        return tensor._keras_history  # (operation, node index, tensor index): the call that made the tensor

    used, order, stack = {}, [], [(t, False) for t in reversed(keras.tree.flatten(model.output))]
    while stack:  # depth first, iterative: deep models exceed Python's recursion limit
        tensor, expanded = stack.pop()
        operation, index, _ = history(tensor)
        key = (id(operation), index)
        if expanded:
            if key not in used:
                used[key] = (operation, index)
                order.append(key)
            continue
        if key in used:
            continue
        stack.append((tensor, True))
        node = operation._inbound_nodes[index]
        stack.extend((t, False) for t in reversed(node.arguments.keras_tensors) if (id(history(t)[0]),
                                                                                       history(t)[1]) not in used)
    calls = {}  # id(operation) -> its node indices used here, in order
    operations = {}
    for key in order:
        operation, index = used[key]
        calls.setdefault(id(operation), []).append(index)
        operations.setdefault(id(operation), operation)
    numbers = {(op_id, index): number for op_id, indices in calls.items()
               for number, index in enumerate(sorted(indices))}

    def serialized(value):
        if isinstance(value, keras.KerasTensor):
            operation, index, tensor_index = history(value)
            return {"class_name": "__keras_tensor__",
                    "config": {"shape": tuple(value.shape), "dtype": value.dtype,
                               "keras_history": [operation.name, numbers[(id(operation), index)], tensor_index]}}
        if registry.is_constant_array(value) or _is_number_tensor(value):  # no input reaches it: as Keras writes it
            array = np.asarray(keras.ops.convert_to_numpy(value))
            return {"class_name": "__tensor__",
                    "config": {"value": array, "dtype": keras.backend.standardize_dtype(array.dtype)}}
        return value

    layers = []
    for op_id, operation in operations.items():
        nodes = []
        for index in sorted(calls[op_id]):
            arguments = operation._inbound_nodes[index].arguments
            if not arguments.keras_tensors:
                continue  # an input layer's own node
            nodes.append({"args": keras.tree.map_structure(serialized, list(arguments.args)),
                          "kwargs": keras.tree.map_structure(serialized, dict(arguments.kwargs))})
        layers.append({"name": operation.name, "class_name": type(operation).__name__, "inbound_nodes": nodes})

    def endpoint(tensor):
        operation, index, tensor_index = history(tensor)
        # Keras numbers a nested functional model's calls from 1 in these entries (its node 0 is its own)
        number = numbers[(id(operation), index)] + (1 if _is_functional(operation) else 0)
        return [operation.name, number, tensor_index]

    return {"name": model.name, "layers": layers,
            "input_layers": keras.tree.map_structure(endpoint, model.input),
            "output_layers": keras.tree.map_structure(endpoint, model.output)}


def _is_number_tensor(value):
    """``value`` is a concrete tensor of no axes (``ops.cast(ops.sqrt(16), x.dtype)``, Gemma's embedding scale)."""
    if isinstance(value, keras.KerasTensor) or not keras.ops.is_tensor(value):
        return False
    try:
        return np.asarray(keras.ops.convert_to_numpy(value)).ndim == 0
    except Exception:  # noqa: BLE001 - a tensor being traced has no value
        return False


def _is_functional(layer):
    return isinstance(layer, keras.Model) and any(cls.__name__ == "Functional" for cls in type(layer).__mro__)


def _without_mask(node):
    """A serialized call without its ``mask`` argument: Keras computes a mask again wherever a layer is called
    on a masked tensor (an ``Embedding(mask_zero=True)``, ``Masking``), so the mask is not a tensor the graph
    follows."""
    if isinstance(node, dict) and isinstance(node.get("kwargs"), dict) and "mask" in node["kwargs"]:
        return dict(node, kwargs={k: v for k, v in node["kwargs"].items() if k != "mask"})
    return node or []


def _drop_mask_operations(order, layers, producers, consumers, output_names, operations=()):
    """Remove (in place) the keras.ops operations that nothing reads but a ``mask`` argument or a side tensor
    (``operations``: the graph's keras.ops calls by name, also those read as layers, ``x * y`` as ``Multiply``)."""
    changed = True
    while changed:
        changed = False
        for name in list(order):
            if consumers.get(name) or name in output_names or not (is_operation(layers.get(name))
                                                                   or name in operations):
                continue
            order.remove(name)
            for producer in producers.pop(name, []):
                if name in consumers.get(producer, []):
                    consumers[producer].remove(name)
            consumers.pop(name, None)
            changed = True


def _operations(model):
    """``{name: operation}`` of the keras.ops calls in a functional model's graph (not layers)."""
    try:
        found = model.operations
    except Exception:  # noqa: BLE001 - no graph of operations
        return {}
    return {op.name: op for op in found if not isinstance(op, keras.layers.Layer)}


def is_operation(layer):
    """``layer`` is a keras.ops operation of a functional graph (``x + 3.0``), not a Keras layer."""
    return layer is not None and not isinstance(layer, keras.layers.Layer)


def class_name(layer):
    """The class shown in messages: the layer's, or ``keras.ops.<Op>`` for an operation."""
    if isinstance(layer, registry.ReverseCall):
        return f"{type(layer.layer).__name__} (reverse=True)"
    return f"keras.ops.{type(layer).__name__}" if is_operation(layer) else type(layer).__name__


def _input_shape(layer):
    try:
        return tuple(layer.input.shape[1:])
    except Exception:  # noqa: BLE001
        return None


def _classify(name, layer, input_names):
    """``(kind, reason)``: ``input``, a registry kind, ``activation_tail``, ``units_mixing`` or ``other``."""
    if name in input_names:
        return "input", None
    if layer is None:
        return Kind.OTHER, "a layer that could not be found"
    if is_operation(layer) and registry.rule_of(layer) is not None:
        return registry.rule_of(layer).classify(layer)
    if is_operation(layer):
        return Kind.OTHER, ("a keras.ops operation called on a tensor inside the model, not a layer, and not one "
                         "of the operations surgery knows; write it as the layer that computes it: Activation or "
                         "Rescaling for a function of each element, GlobalMaxPooling or GlobalAveragePooling for a "
                         "max or mean over positions")
    rule = registry.rule_of(layer)
    if rule is None:
        if isinstance(layer, keras.Model):
            return Kind.OTHER, _UNTRACED.get(layer, "a nested model")
        return Kind.OTHER, _UNTRACED.get(layer, "a layer that surgery cannot interpret")
    return rule.classify(layer)


def _model_graph(model, flat):
    """The :class:`ModelGraph` of ``model`` from its flat call graph ``flat``.

    ``flat`` is ``(order, layers, producers, consumers, input_names,
    output_names, problems)`` with nested blocks inlined, or ``None`` for a
    subclassed model.
    """
    sequential = isinstance(model, keras.Sequential)
    try:
        input_shape = tuple(model.inputs[0].shape[1:]) if len(model.inputs) == 1 else None
    except (AttributeError, ValueError, TypeError):
        input_shape = None
    if flat is None:
        # A subclassed model: its units layers are known, their links are not.
        found = {layer.name: layer for layer in model.layers
                 if registry.rule_of(layer) is not None and registry.rule_of(layer).kind == Kind.UNITS}
        problems = ((model.name, type(model).__name__, "a subclassed model (no layer graph)"),)
        return _unsupported(model, sequential, None, input_shape, found, tuple(found), (), problems)
    order, layers, producers, consumers, input_names, output_names, flat_problems, shapes, sides, blocks = flat
    flagged = {}
    for name, reason in flat_problems:
        flagged.setdefault(name, reason)
    kinds = {}
    for name in order:
        kind, reason = _classify(name, layers.get(name), input_names)
        kinds[name] = kind
        if kind == Kind.OTHER:
            flagged.setdefault(name, reason)
    calls_of = collections.Counter(id(layers[name]) for name in order if layers.get(name) is not None)
    for name in order:  # a units layer reading two tensors (cross-attention): kept whole where its rule says how
        read = {p for p in producers.get(name, []) if kinds.get(p) != Kind.CONSTANT}  # a fixed mask is no stream
        # called once: the calls of a shared layer are one node kind (several are refused as reading 2 tensors)
        if (kinds[name] in (Kind.UNITS, Kind.UNITS_MIXING) and len(read) > 1 and calls_of[id(layers[name])] == 1
                and getattr(registry.rule_of(layers[name]), "new_units", None) is not None):
            kinds[name] = Kind.WHOLE
    calls = _shared_calls(order, layers, input_names)
    all_units = tuple(n for n in order if kinds[n] in ("units", "units_mixing"))
    input_readers = tuple(n for n in all_units if _reads_input(n, producers, kinds, input_names, layers))
    input_name = input_names[0] if len(input_names) == 1 and not sequential else None

    built = None
    if not flagged:
        if not all_units:
            flagged[model.name] = "a model without a layer that makes units (Dense or a convolution)"
        else:
            built = _units_graph(_topological(order, producers), layers, producers, consumers, kinds,
                                 input_names, output_names, _input_specs(model, input_names), input_readers,
                                 flagged, calls)
    problems = [
        (name, class_name(layers[name]) if layers.get(name) is not None else type(model).__name__, reason)
        for name, reason in flagged.items()
    ]
    # Layers first, then keras.ops operations, each in call order: an operation is mostly a detail of a
    # hand-written activation (hard-sigmoid's ``relu6(x + 3) / 6``); the refused layers say what the structure is.
    problems.sort(key=lambda item: (is_operation(layers.get(item[0])),
                                    order.index(item[0]) if item[0] in order else -1))
    if problems or built is None:
        return _unsupported(model, sequential, input_name, input_shape, layers, all_units, input_readers,
                            tuple(problems))
    nodes, units, inputs, n_ids, flatten_channels = built
    n_features = sum(found.count for found in inputs)
    flat_features = all(found.flat for found in inputs)
    streams = _streams(nodes, units, n_features)
    return ModelGraph(
        model_name=model.name,
        sequential=sequential,
        input_name=input_name,
        input_shape=input_shape,
        nodes=nodes,
        outputs=tuple(output_names),
        units=units,
        feature_shape=(n_features,) if flat_features or input_shape is None else input_shape,
        n_features=n_features,
        flat_features=flat_features,
        n_ids=n_ids,
        layers=types.MappingProxyType(dict(layers)),
        all_units=all_units,
        input_readers=input_readers,
        flatten_channels=types.MappingProxyType(flatten_channels),
        problems=(),
        supported=True,
        streams=streams,
        inputs=inputs,
        calls=types.MappingProxyType(calls),
        call_shapes=types.MappingProxyType(shapes),
        side_tensors=types.MappingProxyType(sides),
        blocks=types.MappingProxyType(blocks),
    )


def _unsupported(model, sequential, input_name, input_shape, layers, all_units, input_readers, problems):
    """A graph the masks cannot follow: every units layer on its own, all its units kept."""
    units = tuple(_isolated(name, layers[name], name in input_readers) for name in all_units)
    n_features = _n_features(input_shape) if input_shape is not None else None
    if n_features is None and units:
        n_features = units[0].in_units
    return ModelGraph(
        model_name=model.name,
        sequential=sequential,
        input_name=input_name,
        input_shape=input_shape,
        nodes=(),
        outputs=(),
        units=units,
        feature_shape=(n_features,) if n_features is not None else None,
        n_features=n_features,
        flat_features=True,
        n_ids=0,
        layers=types.MappingProxyType(dict(layers)),
        all_units=tuple(all_units),
        input_readers=tuple(input_readers),
        flatten_channels=types.MappingProxyType({}),
        problems=tuple(problems),
        supported=False,
    )


def _topological(order, producers):
    """``order`` rearranged so that every node comes after its producers (stable)."""
    placed, result = set(), []
    pending = list(order)
    while pending:
        rest = []
        for name in pending:
            if all(p in placed for p in producers.get(name, [])):
                placed.add(name)
                result.append(name)
            else:
                rest.append(name)
        if len(rest) == len(pending):  # pragma: no cover - a cycle cannot come from Keras
            result.extend(rest)
            break
        pending = rest
    return result


class _Ids:
    """Union-find over unit ids: coupled units end with one representative."""

    def __init__(self):
        self.parent = []

    def new(self, n):
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return np.arange(start, start + n)

    def find(self, i):
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a, b):
        ra, rb = self.find(int(a)), self.find(int(b))
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)  # the smaller id leads: input features stay features

    def canonical(self, ids):
        return _frozen([self.find(int(i)) for i in ids])


# Layers that pass each element of the input on unchanged in meaning, before the Flatten that makes them features.
def _passes_elements(kind, layer):
    if kind == Kind.PER_ELEMENT:
        return True
    if kind != Kind.PER_UNIT or registry.rule_of(layer).slices:
        return False
    try:  # an activation or dropout: same shape, each element on its own (pooling and padding change the shape)
        return tuple(layer.input.shape) == tuple(layer.output.shape)
    except Exception:  # noqa: BLE001 - unknown shapes
        return False


def _elements_mode(input_name, consumers, kinds, layers, input_shape):
    """The input's features are its elements: every path from it meets ``Flatten`` through element-wise layers."""
    if input_shape is None or len(input_shape) <= 1 or any(d is None for d in input_shape):
        return False
    stack, seen = [input_name], set()
    while stack:
        name = stack.pop()
        for consumer in consumers.get(name, []):
            if consumer in seen:
                continue
            seen.add(consumer)
            kind = kinds[consumer]
            if kind == Kind.FLATTEN:
                continue
            if not _passes_elements(kind, layers[consumer]):
                return False
            stack.append(consumer)
    return True


def _shared_calls(order, layers, input_names):
    """``{node: the node of its layer's first call}`` for every later call of a layer called several times."""
    first, calls = {}, {}
    for name in order:
        layer = layers.get(name)
        if layer is None or name in input_names:
            continue
        key = id(layer.layer if isinstance(layer, registry.ReverseCall) else layer)  # the logits call its layer
        if key in first:
            calls[name] = first[key]
        else:
            first[key] = name
    return calls


def _input_specs(model, input_names):
    """``[(name, shape, dtype)]`` of the model's inputs, in the order of ``input_names``."""
    out = []
    for name, tensor in zip(input_names, model.inputs):
        out.append((name, tuple(tensor.shape[1:]), keras.backend.standardize_dtype(tensor.dtype)))
    return out


def _units_graph(order, layers, producers, consumers, kinds, input_names, output_names, specs, input_readers,
                 flagged, calls):
    """``(nodes, units, inputs, n_ids, flatten_channels)``, or ``None`` (reasons in ``flagged``)."""
    ids = _Ids()
    info, inputs = {}, []
    if len(specs) != len(input_names):
        flagged.setdefault(input_names[0], "a model whose inputs could not be matched to its graph")
        return None
    for name, shape, dtype in specs:
        if tuple(shape) == (None,) and all(getattr(registry.units_rule(layers[c]), "represents_input", False)
                                           for c in consumers.get(name, [])):
            # token ids of any length, read by embeddings only (or a mask read aside): one feature, always kept
            inputs.append(InputFeatures(name, tuple(shape), dtype, len(ids.parent), 1, False))
            info[name] = dict(ids=ids.new(1), positions=1, elements=False)
            continue
        if not shape or shape[-1] is None:
            flagged[name] = "a model input of unknown size"
            return None
        elements = _elements_mode(name, consumers, kinds, layers, shape)
        count = _n_features(shape) if elements else int(shape[-1])
        inputs.append(InputFeatures(name, shape, dtype, len(ids.parent), count, bool(elements or len(shape) == 1),
                                    sequence=bool(not elements and len(shape) == 2)))
        info[name] = dict(ids=ids.new(count), positions=1, elements=elements)
    units_info = {}
    flatten_channels = {}
    for name in order:
        if name in info:
            continue
        kind = kinds[name]
        layer = layers[name]
        sources = producers.get(name, [])
        if kind == Kind.CONSTANT:  # a tensor no input reaches: the units on its last axis are its own
            shape = layer.value.shape
            if not shape:
                flagged.setdefault(name, "a constant scalar read by a layer (a constant has units on its last axis)")
                return None
            info[name] = {"ids": ids.new(int(shape[-1])), "positions": 1, "elements": False}
            continue
        if not sources or any(s not in info for s in sources):
            flagged.setdefault(name, "a layer that does not read the model input")
            return None
        # self-attention reads x as query and value
        if kind in (Kind.UNITS, Kind.UNITS_MIXING) and len(set(sources)) == 1:
            sources = sources[:1]
        src = [info[s] for s in sources]
        if kind not in (Kind.MERGE, Kind.CONCAT, Kind.WHOLE) and len(src) != 1:
            flagged.setdefault(name, f"a layer reading {len(src)} tensors")
            return None
        first = src[0]
        if kind in (Kind.UNITS, Kind.UNITS_MIXING):
            if first["elements"]:
                flagged.setdefault(name, "a layer that reads the input's elements before Flatten")
                return None
            shape = registry.units_rule(layer).unit_shape(layer, first["ids"].size, first["positions"])
            if shape is None:
                flagged.setdefault(name, "a layer whose input units could not be matched to its producer's")
                return None
            in_units, positions = shape
            out = ids.new(registry.units_rule(layer).out_units(layer))
            units_info[name] = dict(source=sources[0], in_units=in_units, positions=positions, in_ids=first["ids"],
                                    out_ids=out, flattened=first["positions"] > 1)
            if first["positions"] > 1:
                flatten_channels[name] = in_units
            info[name] = dict(ids=out, positions=1, elements=False)
        elif kind in (Kind.PER_UNIT, Kind.PER_ELEMENT, Kind.TAIL, Kind.ACTIVATION_TAIL, Kind.GLOBAL_POOL):
            if kind == Kind.PER_ELEMENT and not first["elements"] and not registry.rule_of(layer).between_units(layer):
                flagged.setdefault(name, "a Normalization, or a Rescaling with one value per element of a feature "
                                         "map (not one value per channel)")
                return None
            if kind == Kind.PER_UNIT and first["positions"] > 1 and registry.rule_of(layer).slices:
                flagged.setdefault(name, "a per-unit layer with weights on a flattened map (one weight per element, "
                                         "not per channel)")
                return None
            info[name] = dict(first, positions=1 if kind == Kind.GLOBAL_POOL else first["positions"])
        elif kind == Kind.FLATTEN:
            if first["elements"]:
                info[name] = dict(ids=first["ids"], positions=1, elements=False)
            else:
                shape = _input_shape(layer)
                variable = [axis + 1 for axis, d in enumerate(shape[:-1] if shape else ()) if d is None]
                if variable:  # how many features it makes depends on the input's size
                    flagged.setdefault(name, f"a Flatten of a map whose axis {variable[0]} has a variable size "
                                             f"(None in its input shape {(None,) + tuple(shape)}); use global "
                                             "pooling, whose output does not depend on the size")
                    return None
                spatial = math.prod(int(d) for d in shape[:-1]) if shape and len(shape) > 1 else 1
                info[name] = dict(ids=first["ids"], positions=first["positions"] * spatial, elements=False)
        elif kind == Kind.MERGE:
            if any(s["elements"] or s["positions"] != first["positions"] or s["ids"].size != first["ids"].size
                   for s in src):
                flagged.setdefault(name, "a merge of tensors whose units do not line up")
                return None
            for s in src[1:]:
                for a, b in zip(first["ids"], s["ids"]):
                    ids.union(a, b)
            info[name] = dict(first)
        elif kind == Kind.WHOLE:  # reads every channel; its outputs are new units (a channels-first pooling)
            new_units = getattr(registry.rule_of(layer), "new_units", None)
            if new_units is None:
                flagged.setdefault(name, "a rule of kind 'whole' without new_units (subclass WholeRule)")
                return None
            width, reason = new_units(layer, any(s["elements"] or s["positions"] != 1 for s in src))
            if width is None:
                flagged.setdefault(name, reason)
                return None
            info[name] = dict(ids=ids.new(width), positions=1, elements=False)
        elif kind == Kind.SLICE:
            if first["elements"] or first["positions"] != 1 or first["ids"].size != layer.width:
                flagged.setdefault(name, "a slice of the channels of a flattened map or of the input's elements")
                return None
            info[name] = dict(ids=first["ids"][layer.start:layer.stop], positions=1, elements=False)
        elif kind == Kind.CONCAT:
            if any(s["elements"] or s["positions"] != 1 for s in src):
                flagged.setdefault(name, "a Concatenate of flattened maps or of the input's elements (what is "
                                         "read: a Dense after the Flatten, or global pooling in its place, before "
                                         "the Concatenate)")
                return None
            info[name] = dict(ids=np.concatenate([s["ids"] for s in src]), positions=1, elements=False)
        else:  # pragma: no cover - every other kind is flagged by _classify
            flagged.setdefault(name, "a layer that surgery cannot interpret")
            return None
    for name in output_names:
        if info[name]["elements"]:
            flagged.setdefault(name, "a model output made of the input's elements")
            return None
    # Only the output layer may mix its units: nothing after it may make units.
    for name in order:
        if kinds[name] == "units_mixing" and _reaches_units(name, consumers, kinds):
            flagged.setdefault(name, "a hidden layer whose activation mixes units")
            return None
    # The calls of a shared layer share its kernel rows, columns and per-channel weights: row r (column j) of
    # every call is one unit, kept or removed together.
    for name, first in calls.items():
        if kinds[name] in ("per_unit", "activation_tail", "global_pool") and not getattr(layers[name], "weights", ()):
            continue  # nothing per channel to share (a Dropout called after two layers of different widths)
        pairs = [(info[first]["ids"], info[name]["ids"])]
        if isinstance(layers[name], registry.ReverseCall) and first in units_info and producers.get(name):
            # the logits read the channels the table's columns make: one unit each (they all stay)
            pairs = [(units_info[first]["out_ids"], info[producers[name][0]]["ids"])]
        elif first in units_info:
            pairs = [(units_info[first]["in_ids"], units_info[name]["in_ids"]),
                     (units_info[first]["out_ids"], units_info[name]["out_ids"])]
        elif kinds[name] not in ("merge", "concat") and len(producers.get(name, [])) == 1:
            pairs.append((info[producers[first][0]]["ids"], info[producers[name][0]]["ids"]))
        for a, b in pairs:
            if len(a) != len(b):
                flagged.setdefault(name, "a shared layer whose calls read different numbers of units")
                return None
            for i, j in zip(a, b):
                ids.union(i, j)
    output_ids = set()
    for name in output_names:
        output_ids.update(int(ids.find(int(i))) for i in info[name]["ids"])
    nodes = tuple(
        Node(name, "input" if name in input_names else ("tail" if kinds[name] in ("activation_tail",) else
                                                         ("units" if kinds[name] == "units_mixing" else kinds[name])),
             tuple(producers.get(name, [])), ids.canonical(info[name]["ids"]), int(info[name]["positions"]),
             bool(info[name]["elements"]))
        for name in order
    )
    readers = set(input_readers)
    units = []
    for name in order:
        if name not in units_info:
            continue
        u = units_info[name]
        out_ids = ids.canonical(u["out_ids"])
        units.append(UnitsNode(
            name=name, source=u["source"], in_units=int(u["in_units"]), positions=int(u["positions"]),
            out_units=int(out_ids.size), in_ids=ids.canonical(u["in_ids"]), out_ids=out_ids,
            flattened=bool(u["flattened"]), reads_input=name in readers,
            is_output=bool(out_ids.size) and all(int(i) in output_ids for i in out_ids),
        ))
    return nodes, tuple(units), tuple(inputs), len(ids.parent), flatten_channels


def _streams(nodes, units, n_features):
    """The :class:`Stream` of every set of units that merges couple, in call order."""
    found = {}
    for node in nodes:
        if node.kind != Kind.MERGE:
            continue
        key = tuple(int(i) for i in node.ids)
        if key in found:
            found[key][1].append(node.name)
        else:
            found[key] = (node.name, [node.name])
    streams = []
    for key, (name, merges) in found.items():
        ids = set(key)
        makers = (("<input>",) if any(i < n_features for i in key) else ()) + tuple(
            u.name for u in units if ids & set(int(i) for i in u.out_ids))
        streams.append(Stream(name, tuple(merges), _frozen(key), makers))
    return tuple(streams)


def _reaches_units(name, consumers, kinds):
    stack, seen = list(consumers.get(name, [])), set()
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        if kinds[cur] in ("units", "units_mixing"):
            return True
        stack.extend(consumers.get(cur, []))
    return False


# Layers that pass each input feature on unchanged in meaning (one value per feature).
_PASSES_FEATURES = ("per_unit", "per_element", "flatten", "slice")


def _reads_input(name, producers, kinds, input_names, layers):
    """The one definition of "a units layer that reads the model input": its groups are input groups.

    Walking back from it, every layer passes features through one by one
    (per-unit layers, Normalization, Rescaling, Flatten) or puts them side by
    side (Concatenate of several inputs), up to model inputs, or to an
    ``Embedding`` (its dimensions stand for the categorical column it reads:
    a tabular model's first Dense reads numeric columns and embedded ones).
    """
    stack, seen = list(producers.get(name, [])), set()
    if not stack:
        return False
    while stack:
        cur = stack.pop()
        if cur in seen or cur in input_names:
            continue
        seen.add(cur)
        rule = registry.units_rule(layers.get(cur)) if kinds.get(cur) == "units" else None
        if rule is not None and rule.represents_input:
            continue
        if kinds.get(cur) not in _PASSES_FEATURES + ("concat",):
            return False
        stack.extend(producers.get(cur, []))
    return True


def _isolated(name, layer, reads_input=False):
    positions, in_units, out_units = registry.units_rule(layer).kernel_shape(layer)
    return UnitsNode(name, None, in_units, positions, out_units, _frozen(np.arange(in_units)),
                     _frozen(np.arange(out_units)), reads_input=reads_input)


def _n_features(shape):
    if shape is None or any(d is None for d in shape):
        return None
    return int(math.prod(int(d) for d in shape)) if shape else 1

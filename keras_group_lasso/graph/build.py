"""A Keras model as a typed chain of layers and the units that flow between them.

:func:`model_graph` reads a Sequential or functional model (nested blocks
inlined) and returns a frozen :class:`ModelGraph`: the layers from the input
to the first layer that makes units (the *head*), each layer that makes units
(:class:`UnitsNode`: Dense, convolutions) with the per-unit layers after it,
and the layers after the output layer (the *tail*). Every layer is classified
by the one registry (:mod:`keras_group_lasso.graph.registry`); what cannot be
interpreted is listed in ``problems`` with the reason, and
``supported`` says whether the masks, the report and surgery can treat the
model exactly.

Units: a units layer reads ``in_units`` units of its producer (features of
the input, neurons, channels of a feature map), each through ``positions``
kernel rows (a convolution's window; for a Dense layer after ``Flatten`` of an
``(..., C)`` map, the map's positions), and makes ``out_units`` units.
"""

import dataclasses
import math
import threading
import types
import weakref

import keras

from keras_group_lasso.graph import registry

__all__ = ["UnitsNode", "ModelGraph", "model_graph", "flat_graph", "is_graph_model"]


@dataclasses.dataclass(frozen=True)
class UnitsNode:
    """One layer that makes units, with what lies around it.

    Attributes:
        name: the layer's name in the graph (``"block/name"`` inside a nested model).
        prev: the units layer it reads from, or ``None`` when it reads the model input.
        next: the units layer that reads it, or ``None`` for the output layer.
        between: the per-unit / reshaping layers after it, up to ``next`` (or the tail).
        in_units: units it reads (kernel groups).
        positions: kernel rows per input unit (:func:`registry.kernel_view`).
        out_units: units it makes.
        flattened: a ``Flatten`` lies between ``prev`` and this layer.
    """

    name: str
    prev: object
    next: object
    between: tuple
    in_units: int
    positions: int
    out_units: int
    flattened: bool = False

    @property
    def reads_input(self):
        return self.prev is None

    @property
    def is_output(self):
        return self.next is None


@dataclasses.dataclass(frozen=True)
class ModelGraph:
    """The chain of a model, as the masks, the report and surgery read it.

    Attributes:
        model_name: the model's name.
        sequential: the model is a ``keras.Sequential``.
        input_name: the name of its input (functional) or ``None``.
        input_shape: the input shape without the batch axis (single input).
        head: names of the layers from the input to the first units layer.
        units: one :class:`UnitsNode` per units layer, input to output
            (empty when the model is not a chain).
        tail: names of the layers after the output layer.
        feature_shape: shape of the input features: ``(n,)`` when the first
            units layer reads a flat vector (after ``Flatten`` for images),
            else the input shape (a convolution reads its last axis, channels).
        flat_features: the input features are the elements of a flat vector
            (they can be selected one by one); otherwise they are the channels
            of the input's last axis, and all are kept.
        n_features: the number of input units of the first units layer.
        layers: read-only ``{name: layer}`` of every node.
        all_units: names of every units layer found, also when the chain is broken.
        input_readers: those of ``all_units`` that read the model input
            through per-feature layers only (their groups are input groups).
        flatten_channels: ``{units layer name: C}`` for layers that read a
            flattened ``(..., C)`` map produced by an earlier units layer.
        problems: ``((name, class name, reason), ...)`` of what is not understood.
        supported: the masks and surgery can treat the model exactly.
    """

    model_name: str
    sequential: bool
    input_name: object
    input_shape: object
    head: tuple
    units: tuple
    tail: tuple
    feature_shape: object
    n_features: object
    flat_features: bool
    layers: types.MappingProxyType
    all_units: tuple
    input_readers: tuple
    flatten_channels: types.MappingProxyType
    problems: tuple
    supported: bool

    def node(self, name):
        """The :class:`UnitsNode` called ``name``."""
        for node in self.units:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def first(self):
        """The units layer that reads the model input (``None`` when unsupported)."""
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


def _keras_histories(value):
    """Every ``keras_history`` ``[name, node, tensor]`` inside a serialized call argument."""
    found = []
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            found.append(tuple(value["config"]["keras_history"]))
        else:
            for item in value.values():
                found.extend(_keras_histories(item))
    elif isinstance(value, (list, tuple)):
        for item in value:
            found.extend(_keras_histories(item))
    return found


def _io_names(entry):
    # A single endpoint is serialized as [name, node, tensor]; several as a list of those.
    if entry and isinstance(entry[0], str):
        return [entry[0]]
    return [e[0] for e in entry]


def flat_graph(model):
    """``(order, layers, producers, consumers, inputs, outputs, problems)`` of the model's call graph.

    Built from public information only: ``Sequential.layers`` and the
    functional ``get_config()`` (its ``inbound_nodes``). A nested Sequential or
    functional model used once as a block with one input and one output is
    inlined: its layers join the graph as ``"<block>/<layer>"`` (Keras forbids
    ``/`` in layer names, so these never clash), so the Dense layers inside it
    are seen, penalised and pruned like any other. A nested model that cannot
    be inlined stays one opaque node with the reason in ``problems``.
    """
    graph = _flat_graph(model)
    if graph is None:
        return None
    order, layers, producers, consumers, input_names, output_names, problems = graph
    shared = {name for name, _ in problems}
    for block in list(order):
        layer = layers.get(block)
        if block in input_names or not isinstance(layer, keras.Model) or block in shared:
            continue
        inner = flat_graph(layer) if is_graph_model(layer) else None
        reason = _inline_refusal(layer, inner, producers.get(block, []))
        if reason:
            problems.append((block, reason))
            continue
        _inline(block, inner, order, layers, producers, consumers, output_names, problems)
    return order, layers, producers, consumers, input_names, output_names, problems


def is_graph_model(model):
    return isinstance(model, keras.Sequential) or any(cls.__name__ == "Functional" for cls in type(model).__mro__)


def _inline_refusal(model, inner, producers):
    if inner is None:
        return "a nested subclassed model (no layer graph)"
    _, _, _, _, inputs, outputs, _ = inner
    if len(inputs) != 1 or len(outputs) != 1 or len(producers) != 1:
        return f"a nested model with {len(inputs)} inputs and {len(outputs)} outputs"
    if outputs[0] in inputs:
        return "a nested model without layers"
    return None


def _inline(block, inner, order, layers, producers, consumers, output_names, problems):
    """Replace the node ``block`` by the nodes of its own graph ``inner``, in place."""
    i_order, i_layers, i_producers, i_consumers, (i_input,), (i_output,), i_problems = inner
    (source,) = producers[block]

    def qualified(name):
        return source if name == i_input else f"{block}/{name}"

    names = [qualified(n) for n in i_order if n != i_input]
    at = order.index(block)
    order[at : at + 1] = names
    for name in i_order:
        if name == i_input:
            continue
        layers[qualified(name)] = i_layers[name]
        producers[qualified(name)] = [qualified(p) for p in i_producers.get(name, [])]
        consumers[qualified(name)] = [qualified(c) for c in i_consumers.get(name, [])]
    last = qualified(i_output)
    outer_consumers = consumers.pop(block, [])
    consumers[last] = consumers[last] + outer_consumers
    for consumer in outer_consumers:
        producers[consumer] = [last if p == block else p for p in producers[consumer]]
    entry = consumers[source]
    at = entry.index(block)
    entry[at : at + 1] = [qualified(c) for c in i_consumers.get(i_input, [])]
    output_names[:] = [last if o == block else o for o in output_names]
    problems.extend((qualified(name), reason) for name, reason in i_problems)
    del layers[block], producers[block]


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
        return ["<input>"] + order, layers, producers, consumers, ["<input>"], order[-1:], problems

    try:
        config = model.get_config()
        layer_configs = config["layers"]
        input_names = _io_names(config["input_layers"])
        output_names = _io_names(config["output_layers"])
    except Exception:  # noqa: BLE001 - a subclassed model has no readable graph
        return None
    layers = {layer.name: layer for layer in model.layers}
    order, producers, consumers = [], {}, {}
    for layer_config in layer_configs:
        name = layer_config["name"]
        order.append(name)
        consumers.setdefault(name, [])
        if name not in layers:
            try:
                layers[name] = model.get_layer(name)
            except ValueError:
                layers[name] = None
        nodes = layer_config.get("inbound_nodes") or []
        if len(nodes) > 1:
            problems.append((name, f"a layer called {len(nodes)} times (shared)"))
        histories = _keras_histories(nodes)
        if any(node_index or tensor_index for _, node_index, tensor_index in histories):
            problems.append((name, "a layer reading a shared or multi-output layer"))
        producers[name] = [h[0] for h in histories]
        for producer in producers[name]:
            consumers.setdefault(producer, []).append(name)
    return order, layers, producers, consumers, input_names, output_names, problems


def _rank(layer):
    try:
        return len(layer.input.shape)
    except Exception:  # noqa: BLE001 - unknown rank
        return None


def _input_shape(layer):
    try:
        return tuple(layer.input.shape[1:])
    except Exception:  # noqa: BLE001
        return None


def _per_element_refusal(layer):
    if type(layer) is keras.layers.Rescaling:
        import numpy as np

        per_element = np.ndim(layer.scale) > 0 or np.ndim(layer.offset) > 0
        if per_element and keras.config.image_data_format() == "channels_first":
            return "a Rescaling with a non-scalar scale or offset under channels_first"
        return None
    if getattr(layer, "mean", None) is None:
        return "a Normalization that is not built"
    return None


def _classify(name, layer, input_names):
    """``(kind, reason)``: ``input``, a registry kind, ``activation_tail``, ``units_mixing`` or ``other``."""
    if name in input_names or type(layer) is keras.layers.InputLayer:
        return "input", None
    if layer is None:
        return "other", "a layer that could not be found"
    rule = registry.rule_of(layer)
    if rule is None:
        if isinstance(layer, keras.Model):
            return "other", "a nested model"
        return "other", "a layer that surgery cannot interpret"
    if rule.kind == "per_element":
        reason = _per_element_refusal(layer)
        return ("other", reason) if reason else ("per_element", None)
    reason = rule.refusal(layer) if rule.refusal else None
    if reason:
        if type(layer) is keras.layers.Activation:
            return "activation_tail", reason  # fine after the output layer
        if rule.kind == "units" and reason == "a layer whose activation mixes units":
            return "units_mixing", reason  # fine as the output layer
        return "other", reason
    if rule.kind == "flatten" and getattr(layer, "data_format", "channels_last") == "channels_first":
        if (_rank(layer) or 2) > 2:
            return "other", "a channels_first Flatten"
    return rule.kind, None


_CONVS = tuple(
    getattr(keras.layers, n)
    for n in ("Conv1D", "Conv2D", "Conv3D", "SeparableConv1D", "SeparableConv2D")
)


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
                 if registry.rule_of(layer) is not None and registry.rule_of(layer).kind == "units"}
        units = tuple(_isolated(name, layer) for name, layer in found.items())
        n = _n_features(input_shape) if input_shape is not None else None
        if n is None and units:
            n = units[0].in_units
        return ModelGraph(
            model.name, sequential, None, input_shape, (), units, (), (n,) if n else None, n, True,
            types.MappingProxyType(found), tuple(found), (), types.MappingProxyType({}),
            ((model.name, type(model).__name__, "a subclassed model (no layer graph)"),), False,
        )
    order, layers, producers, consumers, input_names, output_names, flat_problems = flat
    flagged = {}
    for name, reason in flat_problems:
        flagged.setdefault(name, reason)
    kinds = {}
    for name in order:
        kind, reason = _classify(name, layers.get(name), input_names)
        kinds[name] = kind
        if kind == "other":
            flagged.setdefault(name, reason)
    all_units = tuple(n for n in order if kinds[n] in ("units", "units_mixing"))
    input_readers = tuple(n for n in all_units if _reads_input(n, producers, kinds, input_names))

    chain, chain_problem = _walk(order, consumers, input_names, output_names)
    head, units, tail, feature_shape, n_features, flatten_channels = (), (), (), None, None, {}
    if chain_problem:
        flagged.setdefault(*chain_problem)
    elif chain is not None:
        parsed = _parse_chain(chain, kinds, layers, input_shape, flagged)
        if parsed is not None:
            head, units, tail, feature_shape, n_features, flatten_channels = parsed
    problems = [
        (name, type(layers[name]).__name__ if layers.get(name) is not None else "?", reason)
        for name, reason in flagged.items()
    ]
    problems.sort(key=lambda item: order.index(item[0]) if item[0] in order else -1)
    supported = bool(units) and not problems
    if not problems and not units:
        reason = (
            f"a model with {len(input_names)} inputs and {len(output_names)} outputs"
            if len(input_names) != 1 or len(output_names) != 1
            else "a model without a layer that makes units (Dense or a convolution) on its path"
        )
        problems.append((model.name, type(model).__name__, reason))
    if problems:
        # Not one chain that the masks understand: every units layer on its own, all units kept.
        units = tuple(_isolated(name, layers[name]) for name in all_units)
        head, tail = (), ()
        first_layer = layers[all_units[0]] if all_units else None
        n_features = _n_features(input_shape) if input_shape is not None else None
        if first_layer is not None and n_features is None:
            n_features = units[0].in_units
        feature_shape = (n_features,) if n_features is not None else None
    input_name = input_names[0] if len(input_names) == 1 and not sequential else None
    return ModelGraph(
        model_name=model.name,
        sequential=sequential,
        input_name=input_name,
        input_shape=input_shape,
        head=tuple(head),
        units=tuple(units),
        tail=tuple(tail),
        feature_shape=feature_shape,
        n_features=n_features,
        flat_features=feature_shape is not None and len(feature_shape) == 1,
        layers=types.MappingProxyType(dict(layers)),
        all_units=all_units,
        input_readers=input_readers,
        flatten_channels=types.MappingProxyType(dict(flatten_channels)),
        problems=tuple(problems),
        supported=supported,
    )


# Layers that pass each input feature on unchanged in meaning (one value per feature).
_PASSES_FEATURES = ("per_unit", "per_element", "flatten")


def _reads_input(name, producers, kinds, input_names):
    """The one definition of "a units layer that reads the model input": its groups are input groups.

    Walking back from it, every layer has one producer and passes features
    through one by one (per-unit layers, Normalization, Rescaling, Flatten)
    up to a model input.
    """
    cur = name
    while True:
        found = producers.get(cur, [])
        if len(found) != 1:
            return False
        (cur,) = found
        if cur in input_names:
            return True
        if kinds.get(cur) not in _PASSES_FEATURES:
            return False


def _walk(order, consumers, input_names, output_names):
    """The node names from the input to the output, or ``(None, (name, reason))`` if not one chain."""
    if len(input_names) != 1:
        return None, None
    chain = [input_names[0]]
    while True:
        cons = consumers.get(chain[-1], [])
        if len(cons) > 1:
            return None, (chain[-1], f"a layer whose output feeds {len(cons)} layers")
        if chain[-1] in output_names and cons:
            return None, (chain[-1], f"a layer whose output feeds {len(cons) + 1} layers")
        if not cons:
            break
        chain.append(cons[0])
    if len(output_names) != 1 or chain[-1] != output_names[0] or set(chain) != set(order):
        return None, None
    return chain, None


def _parse_chain(chain, kinds, layers, input_shape, flagged):
    """Split the chain into head, units nodes and tail; record what does not fit in ``flagged``."""
    positions_of_units = [i for i, name in enumerate(chain) if kinds[name] in ("units", "units_mixing")]
    if not positions_of_units:
        return None
    for i in positions_of_units[:-1]:  # only the output layer may mix its units
        if kinds[chain[i]] == "units_mixing":
            flagged.setdefault(chain[i], "a hidden layer whose activation mixes units")
    first, last = positions_of_units[0], positions_of_units[-1]
    head = chain[1:first]
    tail = chain[last + 1 :]
    ok = True

    # The head: per-feature preprocessing. Features are the elements of the flattened input when a
    # Flatten lies in the head; otherwise the units of the input's last axis (channels).
    flat = any(kinds[n] == "flatten" for n in head) or (input_shape is not None and len(input_shape) == 1)
    seen_flatten = input_shape is not None and len(input_shape) == 1
    for name in head:
        kind = kinds[name]
        if kind == "flatten":
            seen_flatten = True
            continue
        if kind == "per_element":
            continue
        if kind == "per_unit":
            rule = registry.rule_of(layers[name])
            if flat and not seen_flatten and rule.slicer is not None:
                flagged.setdefault(name, "a per-unit layer with weights before Flatten (per channel, not per feature)")
                ok = False
            continue
        if kind not in ("other",):
            flagged.setdefault(name, "a layer that cannot sit between the input and the first layer that makes units")
        ok = False

    for name in tail:
        if kinds[name] not in ("per_unit", "tail", "activation_tail", "flatten", "global_pool"):
            if kinds[name] != "other":
                flagged.setdefault(name, "a layer after the output layer that changes its units")
            ok = False

    units = []
    feature_shape = input_shape
    channels = None  # units of the current tensor (None before the first units layer)
    spatial_positions = 1
    flatten_channels = {}
    prev = None
    flattened = False
    for k, i in enumerate(positions_of_units):
        name = chain[i]
        layer = layers[name]
        end = positions_of_units[k + 1] if k + 1 < len(positions_of_units) else len(chain)
        between = chain[i + 1 : end] if k + 1 < len(positions_of_units) else ()
        for b in between:
            if kinds[b] == "per_element" and not _per_element_between_ok(layers[b]):
                flagged.setdefault(b, "a Normalization or Rescaling with one value per element of a feature map "
                                      "between layers that make units (not one value per channel)")
                ok = False
                continue
            if kinds[b] not in ("per_unit", "per_element", "flatten", "global_pool"):
                if kinds[b] in ("tail", "activation_tail"):
                    flagged.setdefault(b, "an activation that mixes units between layers that make units")
                elif kinds[b] != "other":
                    flagged.setdefault(b, "a layer that cannot sit between two layers that make units")
                ok = False
        in_units, positions = _unit_shape(layer, channels, flat if prev is None else flattened,
                                          spatial_positions)
        if in_units is None:
            flagged.setdefault(name, "a layer whose input units could not be matched to its producer's")
            ok = False
            in_units, positions = 0, 0
        if prev is not None and flattened:
            flatten_channels[name] = channels
        out_units = _out_units(layer)
        nxt = chain[positions_of_units[k + 1]] if k + 1 < len(positions_of_units) else None
        units.append(UnitsNode(name, prev, nxt, tuple(between), in_units, positions, out_units,
                               flattened and prev is not None))
        # What the next units layer reads.
        channels = out_units
        flattened = False
        spatial_positions = 1
        for b in between:
            if kinds[b] == "flatten":
                shape = _input_shape(layers[b])
                if shape is not None and len(shape) > 1:
                    flattened = True
                    spatial_positions = math.prod(int(d) for d in shape[:-1])
            elif kinds[b] == "global_pool":
                flattened = False
        prev = name
    if not ok:
        return None
    n_features = units[0].in_units
    if flat:
        feature_shape = (n_features,)
    return head, units, tail, feature_shape, n_features, flatten_channels


def _isolated(name, layer):
    if registry.is_separable(layer):
        kernel = layer.depthwise_kernel
    else:
        kernel = layer.kernel
    in_units = int(kernel.shape[-2])
    positions = math.prod(int(d) for d in kernel.shape[:-2]) if len(kernel.shape) > 2 else 1
    return UnitsNode(name, None, None, (), in_units, positions, _out_units(layer))


def _per_element_between_ok(layer):
    import numpy as np

    if type(layer) is keras.layers.Rescaling and np.ndim(layer.scale) == 0 and np.ndim(layer.offset) == 0:
        return True
    return _rank(layer) == 2


def _n_features(shape):
    if shape is None or any(d is None for d in shape):
        return None
    return int(math.prod(int(d) for d in shape)) if shape else 1


def _out_units(layer):
    if registry.is_separable(layer):
        return int(layer.pointwise_kernel.shape[-1])
    return int(layer.kernel.shape[-1])


def _unit_shape(layer, channels, flattened, spatial_positions):
    """``(in_units, positions)`` of a units layer reading ``channels`` units (``None``: the input)."""
    if registry.is_separable(layer):
        kernel_in = int(layer.depthwise_kernel.shape[-2])
        window = math.prod(int(d) for d in layer.depthwise_kernel.shape[:-2])
    else:
        kernel_in = int(layer.kernel.shape[-2])
        window = math.prod(int(d) for d in layer.kernel.shape[:-2])
    if type(layer) is keras.layers.Dense:
        rank = _rank(layer)
        if rank is not None and rank > 2 and not _dense_on_last_axis_ok(layer):
            return None, None
        if channels is None:  # reads the input (or its flattened elements)
            return kernel_in, 1
        if flattened:
            if kernel_in != channels * spatial_positions:
                return None, None
            return channels, spatial_positions
        return (kernel_in, 1) if kernel_in == channels else (None, None)
    if channels is None:
        return kernel_in, window
    if flattened or kernel_in != channels:
        return None, None
    return kernel_in, window


def _dense_on_last_axis_ok(layer):
    # A Dense layer on a rank > 2 tensor acts on its last axis at every position, like a 1x1 convolution.
    return True

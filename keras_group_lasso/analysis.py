"""What a group-sparse network has left: weights -> masks -> a frozen :class:`SparsityReport`.

Nothing here changes a model except :func:`apply_threshold`, whose name says
so. Everything reads each weight once with numpy.

Vocabulary (the paper's): a Dense kernel ``W`` of shape ``(inputs, units)``
has one *group* per row ``W[i, :]`` (all outgoing weights of one input or
hidden unit). A weight is *zero* when ``|w| <= threshold``; the paper sets
weights "under 1e-3" to zero after training, and the two rules differ only for
weights exactly equal to the threshold. With ``threshold=0`` exactly the
stored zeros count.

Which units survive is decided in one place, :func:`unit_masks`, used by the
report, the :class:`~keras_group_lasso.callbacks.SparsityMonitor` callback and
the surgery in :mod:`keras_group_lasso.surgery`, so the reported sizes are the
sizes of the pruned model. For a chain of Dense layers (with per-unit layers
such as Dropout, activations or BatchNormalization in between) two passes
reach the fixed point:

* forward, *varying*: an input feature varies; a unit varies when some
  varying input reaches it through a non-zero weight. A unit that does not
  vary outputs a constant; surgery folds that constant into the next layer's
  bias and removes the unit (when the next layer has a bias: otherwise the
  unit is treated as varying and kept if it is used).
* backward, *kept*: every output unit is kept; a hidden unit is kept when it
  varies and has a non-zero weight into a kept unit of the next layer. An
  input feature is *selected* when it has a non-zero weight into a kept unit
  of the layer that reads the model input.

So a unit whose only non-zero outgoing weights reach removed units is removed
too, and a unit fed only by constant units is constant.
"""

import dataclasses
import math
import threading
import weakref

import keras
import numpy as np

from keras_group_lasso._validation import NonFiniteError, check_non_negative, fail

__all__ = [
    "SparsityReport",
    "LayerSparsity",
    "UnitMasks",
    "sparsity_report",
    "unit_masks",
    "apply_threshold",
    "input_feature_strength",
    "layer_group_norms",
    "image_shape",
    "dense_layers",
    "dense_roles",
    "input_dense_layers",
    "get_layer",
    "is_zero",
]


# ----------------------------------------------------------------------------- the one rule


def is_zero(weights, threshold):
    """Boolean array, ``|w| <= threshold``: the one definition of a zero weight.

    Example:
        >>> is_zero(np.array([0.0, -5e-4, 2e-3]), 1e-3)
        array([ True,  True, False])
    """
    return np.abs(weights) <= threshold


def _nonzero(weights, threshold):
    return np.abs(weights) > threshold


def _to_numpy(variable):
    # `.value` skips the Variable wrapper: about 2x faster on both backends.
    return np.asarray(keras.ops.convert_to_numpy(getattr(variable, "value", variable)))


# ----------------------------------------------------------------------------- layer kinds

# Layers applied unit by unit on a rank-2 tensor: they neither mix units nor
# change their number, so a unit can be removed across them. Exact types only:
# a subclass may do anything.
_ELEMENTWISE_LAYERS = (
    "Dropout",
    "GaussianDropout",
    "GaussianNoise",
    "AlphaDropout",
    "Identity",
    "ReLU",
    "LeakyReLU",
    "ELU",
)
# Per-unit layers with per-unit weights (sliced by surgery).
_PER_UNIT_WEIGHTED = ("BatchNormalization", "PReLU")
# Input preprocessing: an elementwise affine map whose parameters broadcast over the
# input (Normalization: (x - mean) / sqrt(variance); Rescaling: x * scale + offset).
# Any axis choice is one value per element, so it passes a feature (or a unit) through
# unchanged in position, before or after Flatten, and is sliced by surgery.
_AFFINE_LAYERS = ("Normalization", "Rescaling")

# Keras activations that act on each scalar on its own (softmax, log_softmax,
# sparsemax and glu mix units; a custom function is not trusted).
_ELEMENTWISE_ACTIVATIONS = frozenset(
    {
        "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "sigmoid",
        "hard_sigmoid", "log_sigmoid", "sparse_sigmoid", "tanh", "hard_tanh", "tanh_shrink",
        "softplus", "softsign", "sparse_plus", "squareplus", "silu", "swish", "hard_silu",
        "hard_swish", "mish", "exponential", "hard_shrink", "soft_shrink",
    }
)


def _activation_name(function):
    try:
        name = keras.activations.serialize(function)
    except Exception:  # noqa: BLE001 - an unserializable function is simply unknown
        return None
    return name if isinstance(name, str) else None


def _elementwise_activation(function):
    return _activation_name(function) in _ELEMENTWISE_ACTIVATIONS


def _layer_by_type(name):
    return getattr(keras.layers, name, None)


def _is_exact(layer, *class_names):
    return any(type(layer) is _layer_by_type(n) for n in class_names if _layer_by_type(n))


def _classify(layer):
    """``(kind, reason)`` of one layer; kind in input/dense/unit/flatten/tail/other."""
    if _is_exact(layer, "InputLayer"):
        return "input", None
    if _is_exact(layer, "Dense"):
        if getattr(layer, "lora_enabled", False):
            return "other", "a LoRA-enabled Dense layer"
        if getattr(layer, "quantization_mode", None):
            return "other", "a quantized Dense layer"
        return "dense", None
    if _is_exact(layer, *_ELEMENTWISE_LAYERS, *_PER_UNIT_WEIGHTED):
        if _is_exact(layer, "BatchNormalization") and getattr(layer, "axis", -1) not in (-1, 1):
            return "other", "a BatchNormalization not on the last axis"
        return "unit", None
    if _is_exact(layer, "Activation"):
        if _elementwise_activation(layer.activation):
            return "unit", None
        return "tail", "an activation that mixes units"
    if _is_exact(layer, "Softmax"):
        return "tail", "an activation that mixes units"
    if _is_exact(layer, "Flatten"):
        return "flatten", None
    if _is_exact(layer, *_AFFINE_LAYERS):
        reason = _affine_refusal(layer)
        return ("other", reason) if reason else ("affine", None)
    if isinstance(layer, keras.Model):
        return "other", "a nested model"
    return "other", "a layer that surgery cannot interpret"


def _affine_refusal(layer):
    """Why an exact Normalization / Rescaling cannot be sliced, or ``None``."""
    if _is_exact(layer, "Rescaling"):
        per_element = np.ndim(layer.scale) > 0 or np.ndim(layer.offset) > 0
        if per_element and keras.config.image_data_format() == "channels_first":
            # Rescaling reshapes a non-scalar scale to (C, 1, 1) there: not per feature.
            return "a Rescaling with a non-scalar scale or offset under channels_first"
        return None
    if getattr(layer, "mean", None) is None:
        return "a Normalization that is not built"
    return None


def _has_weights(layer):
    return bool(layer.weights)


# ----------------------------------------------------------------------------- the graph


@dataclasses.dataclass
class _Structure:
    """How the Dense layers of a model are linked; depends on the architecture, not the weights.

    Layer references are names, so the cached structure keeps no model alive.
    """

    signature: tuple
    dense: tuple  # Dense layer names ("block/name" inside a nested model), in graph order
    prev: dict  # dense name -> previous Dense name, "<input>" or None (unknown)
    next: dict  # dense name -> next Dense name, "<output>" or None (unknown)
    between: dict  # dense name -> names of the per-unit layers after it (up to next Dense)
    head: tuple  # layers from the model input to the first Dense (input path)
    tail: tuple  # layers after the output Dense
    input_shape: tuple  # non-batch shape of the model input (single input), else None
    input_name: str
    n_features: int
    uninterpreted: tuple  # ((name, class name, reason), ...)
    supported: bool
    sequential: bool
    all_dense: tuple = ()  # every Dense layer of the graph, also those surgery cannot interpret
    input_readers: tuple = ()  # those whose kernel rows are the input features


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
    return tuple(ids) + (model.built,)


def _structure(model):
    """The cached :class:`_Structure` of ``model`` (rebuilt when its layers change)."""
    signature = _signature(model)
    with _CACHE_LOCK:
        cached = _CACHE.get(model)
    if cached is not None and cached.signature == signature:
        return cached
    structure = _build_structure(model, signature)
    with _CACHE_LOCK:
        try:
            _CACHE[model] = structure
        except TypeError:  # pragma: no cover - not weak-referenceable
            pass
    return structure


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


def _graph(model):
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
        inner = _graph(layer) if _is_graph_model(layer) else None
        reason = _inline_refusal(layer, inner, producers.get(block, []))
        if reason:
            problems.append((block, reason))
            continue
        _inline(block, inner, order, layers, producers, consumers, output_names, problems)
    return order, layers, producers, consumers, input_names, output_names, problems


def _is_graph_model(model):
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


def _build_structure(model, signature):
    sequential = isinstance(model, keras.Sequential)
    uninterpreted = []
    input_shape = None
    input_name = None
    try:
        if len(model.inputs) == 1:
            input_shape = tuple(model.inputs[0].shape[1:])
    except (AttributeError, ValueError, TypeError):
        input_shape = None

    graph = _graph(model)
    if graph is None:
        # Subclassed model: the Dense layers are known, their links are not.
        dense = tuple(layer.name for layer in model.layers if _is_exact(layer, "Dense"))
        uninterpreted.append((model.name, type(model).__name__, "a subclassed model (no layer graph)"))
        n_features = _n_features(input_shape)
        return _Structure(
            signature, dense, {d: None for d in dense}, {d: None for d in dense}, {d: () for d in dense},
            (), (), input_shape, None, n_features, tuple(uninterpreted), False, sequential,
        )

    order, layers, producers, consumers, input_names, output_names, problems = graph
    input_name = input_names[0] if len(input_names) == 1 else None
    flagged = {}
    for name, reason in problems:
        flagged.setdefault(name, reason)

    kinds = {}
    for name in order:
        layer = layers.get(name)
        if name == "<input>" or name in input_names:
            kinds[name] = "input"
            continue
        if layer is None:
            kinds[name] = "other"
            flagged.setdefault(name, "a layer that could not be found")
            continue
        kind, reason = _classify(layer)
        kinds[name] = kind
        if kind == "other":
            flagged.setdefault(name, reason)
        elif kind == "dense":
            rank = _input_rank(layer)
            if rank is not None and rank != 2:
                kinds[name] = "other"
                flagged.setdefault(name, f"a Dense layer applied to a rank-{rank} tensor")
        elif kind == "flatten":
            if getattr(layer, "data_format", "channels_last") == "channels_first" and (
                _input_rank(layer) or 2
            ) > 2:
                kinds[name] = "other"
                flagged.setdefault(name, "a channels_first Flatten")

    dense = tuple(n for n in order if kinds[n] == "dense")

    def single_consumer(name):
        cons = consumers.get(name, [])
        if name in output_names:
            return None if cons else "<output>"
        if len(cons) != 1:
            return None
        return cons[0]

    # Forward walk from each Dense: through per-unit layers to the next Dense or the output.
    nxt, between, prev = {}, {}, {d: None for d in dense}
    tail = ()
    for d in dense:
        path, cur, seen_tail, target = [], d, None, None
        while True:
            if len(consumers.get(cur, [])) > 1 or (cur in output_names and consumers.get(cur)):
                flagged.setdefault(cur, f"a layer whose output feeds {len(consumers[cur])} layers")
                break
            c = single_consumer(cur)
            if c is None:
                break
            if c == "<output>":
                target = "<output>" if len(output_names) == 1 else None
                break
            kind = kinds[c]
            if kind == "dense":
                if seen_tail is not None:
                    flagged.setdefault(seen_tail, "an activation that mixes units between Dense layers")
                else:
                    target = c
                break
            if kind == "flatten" and (_input_rank(layers[c]) or 2) == 2:
                kind = "unit"  # Flatten of a rank-2 tensor is the identity
            if kind == "affine":
                kind = "unit"
            if kind == "tail":
                seen_tail = seen_tail or c
            elif kind != "unit":
                break
            path.append(c)
            cur = c
        nxt[d] = target
        between[d] = tuple(path)
        if target not in (None, "<output>"):
            prev[target] = d
        if target == "<output>":
            tail = tuple(path)

    # Forward walk from the model input to the first Dense (feature selection happens there).
    head = []
    first = None
    n_features = _n_features(input_shape)
    if input_name is not None and len(input_names) == 1:
        cur, ok = input_name, True
        rank = len(input_shape) + 1 if input_shape is not None else None
        while True:
            cons = consumers.get(cur, [])
            if len(cons) != 1 or cur in output_names:
                if len(cons) > 1:
                    flagged.setdefault(cur, f"a layer whose output feeds {len(cons)} layers")
                break
            c = cons[0]
            kind = kinds[c]
            if kind == "dense":
                first = c
                break
            if kind == "flatten":
                rank = 2
            elif kind == "affine":
                pass  # one value per element: sliced by feature at any rank
            elif kind != "unit":
                break
            elif rank is not None and rank > 2 and _has_weights(layers[c]):
                flagged.setdefault(c, "a per-unit layer with weights before Flatten (per channel, not per feature)")
                break
            head.append(c)
            cur = c
        if first is not None:
            if rank is not None and rank != 2:
                first = None
            else:
                prev[first] = "<input>"

    # A hidden Dense whose activation mixes units cannot lose units.
    for d in dense:
        if nxt[d] not in (None, "<output>") and not _elementwise_activation(layers[d].activation):
            flagged.setdefault(d, "a hidden Dense layer whose activation mixes units")
            prev[nxt[d]] = None
            nxt[d] = None

    # Layers after the output Dense that do something other than per-unit or final activations.
    uninterpreted = [
        (name, type(layers[name]).__name__ if layers.get(name) is not None else "?", reason)
        for name, reason in flagged.items()
    ]
    for name in order:
        if kinds[name] == "tail" and name not in flagged and name not in tail:
            uninterpreted.append((name, type(layers[name]).__name__, "an activation that mixes units"))
    uninterpreted.sort(key=lambda item: order.index(item[0]) if item[0] in order else -1)

    chain_ok = False
    if first is not None and not uninterpreted and len(input_names) == 1 and len(output_names) == 1:
        cur, count = first, 0
        while cur not in (None, "<output>"):
            count += 1
            last = cur
            cur = nxt[cur]
        chain_ok = cur == "<output>" and count == len(dense) and nxt.get(last) == "<output>"
        covered = {"<input>", input_name, *head, *dense, *tail}
        for d in dense:
            covered.update(between[d])
        chain_ok = chain_ok and set(order) <= covered
    all_dense = tuple(name for name in order if isinstance(layers.get(name), keras.layers.Dense))
    input_readers = tuple(name for name in all_dense if _reads_input(name, producers, kinds, input_names))

    if not uninterpreted and not chain_ok:
        if len(input_names) != 1 or len(output_names) != 1:
            reason = f"a model with {len(input_names)} inputs and {len(output_names)} outputs"
        else:
            reason = "a model whose Dense layers do not form one chain from input to output"
        uninterpreted.append((model.name, type(model).__name__, reason))

    return _Structure(
        signature=signature,
        dense=dense,
        prev=prev,
        next=nxt,
        between=between,
        head=tuple(head),
        tail=tail,
        input_shape=input_shape,
        input_name=input_name,
        n_features=n_features,
        uninterpreted=tuple(uninterpreted),
        supported=chain_ok,
        sequential=sequential,
        all_dense=all_dense,
        input_readers=input_readers,
    )


# Layers that pass each input feature on unchanged in meaning (one value per feature).
_PASSES_FEATURES = ("unit", "affine", "flatten")


def _reads_input(name, producers, kinds, input_names):
    """The one definition of "a Dense layer that reads the model input".

    Its kernel rows are the input features: walking back from it, every
    layer has one producer and passes features through one by one (per-unit
    layers, Normalization, Rescaling, Flatten) up to a model input.
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


def _input_rank(layer):
    try:
        return len(layer.input.shape)
    except Exception:  # noqa: BLE001 - unknown rank
        return None


def _n_features(input_shape):
    if input_shape is None or any(d is None for d in input_shape):
        return None
    return int(math.prod(input_shape)) if input_shape else 1


# ----------------------------------------------------------------------------- validation


_NO_THRESHOLD = object()  # for the functions without a threshold (None is a bad threshold)


def _check_model(owner, model, threshold=_NO_THRESHOLD):
    if threshold is _NO_THRESHOLD:
        threshold = None
    else:
        threshold = check_non_negative(owner, "threshold", threshold)
    if not isinstance(model, keras.Model):
        fail(owner, "model", "a keras.Model", model)
    if not model.built:
        fail(owner, "model", "a built keras.Model (give it an Input or call it on data first)", model)
    structure = _structure(model)
    if not structure.dense:
        fail(owner, "model", "a model with at least one Dense layer", model)
    return structure, threshold


def _layers_by_name(model, structure):
    return {name: get_layer(model, name) for name in structure.dense}


def get_layer(model, name):
    """The layer of ``model`` called ``name`` in the analysis: ``"block/layer"`` is inside a nested model.

    Names are the ones :func:`sparsity_report`, :func:`dense_layers` and the
    pruning plan use: a layer of a nested Sequential or functional block is
    named after the block, ``"<block>/<layer>"`` (recursively).

    Raises:
        ValueError: no such layer (Keras's own error from ``get_layer``).

    Example:
        >>> block = keras.Sequential([keras.layers.Dense(3, name="inner")], name="block")
        >>> model = keras.Sequential([keras.Input((4,)), block, keras.layers.Dense(2)])
        >>> get_layer(model, "block/inner").units
        3
    """
    layer = model
    for part in name.split("/"):
        layer = layer.get_layer(part)
    return layer


def dense_roles(model):
    """``{name: "input" | "hidden"}`` for every Dense layer of ``model``, in graph order.

    ``"input"``: the layer's kernel rows are the model's input features (the
    paper's *input groups*); ``"hidden"``: they are units of an earlier layer
    (hidden groups). A Dense layer reads the input when the layers between the
    model input and it only pass features through one by one (Dropout,
    elementwise activations, BatchNormalization, Normalization, Rescaling,
    Flatten, ...). This is the one definition the report's ``role``,
    :func:`~keras_group_lasso.add_group_sparsity` and surgery share.

    Layers inside a nested Sequential or functional block (used once, with
    one input and one output) are included, named ``"<block>/<layer>"`` (see
    :func:`get_layer`); a Dense layer inside a nested model the graph cannot
    see through (subclassed, shared, several inputs or outputs) is not.

    Raises:
        InvalidParameterError: ``model`` is not a built Sequential or functional ``keras.Model``.

    Example:
        >>> block = keras.Sequential([keras.layers.Dense(5, name="a")], name="block")
        >>> model = keras.Sequential([keras.Input((6,)), block, keras.layers.Dense(2, name="out")])
        >>> dense_roles(model)
        {'block/a': 'input', 'out': 'hidden'}
    """
    return _dense_roles("dense_roles", model)


def input_dense_layers(model):
    """Names of the Dense layers whose kernel rows are the model's input features, in graph order.

    The names with role ``"input"`` in :func:`dense_roles`.

    Raises:
        InvalidParameterError: ``model`` is not a built Sequential or functional ``keras.Model``.

    Example:
        >>> inputs = keras.Input((6,))
        >>> a = keras.layers.Dense(5, name="a")(inputs)
        >>> b = keras.layers.Dense(4, name="b")(keras.layers.Dropout(0.1)(inputs))
        >>> out = keras.layers.Dense(2, name="out")(keras.layers.Concatenate()([a, b]))
        >>> input_dense_layers(keras.Model(inputs, out))
        ['a', 'b']
    """
    return [name for name, role in _dense_roles("input_dense_layers", model).items() if role == "input"]


def _dense_roles(owner, model):
    if not isinstance(model, keras.Model) or not _is_graph_model(model):
        fail(owner, "model", "a Sequential or Functional keras.Model", model)
    if not model.built:
        fail(owner, "model", "a built keras.Model (give it an Input or call it on data first)", model)
    structure = _structure(model)
    return {name: ("input" if name in structure.input_readers else "hidden") for name in structure.all_dense}


def dense_layers(model):
    """The Dense layers of ``model`` in graph order (those every function here reads).

    Raises:
        InvalidParameterError: ``model`` is not a built ``keras.Model`` with a Dense layer.
    """
    structure, _ = _check_model("dense_layers", model)
    found = _layers_by_name(model, structure)
    return [found[name] for name in structure.dense]


# ----------------------------------------------------------------------------- masks


@dataclasses.dataclass(frozen=True, eq=False)
class UnitMasks:
    """What survives, per Dense layer, at one threshold (read-only numpy arrays).

    Attributes:
        threshold: weights with ``|w| <= threshold`` count as zero.
        layer_names: the Dense layer names, in graph order.
        features: bool ``(n_features,)``, the selected input features (all True
            when no Dense layer reads the model input directly).
        inputs: ``{name: bool (inputs,)}``, the kept rows of each kernel (the
            kept units of the layer before, the selected features, or all).
        units: ``{name: bool (units,)}``, the kept units (all True for an
            output layer, or a layer feeding something not interpreted).
        constant: ``{name: bool (units,)}``, units whose output is a constant
            (no non-zero weight from a varying input).
        folded: ``{name: bool (units,)}``, constant units that surgery removes
            and folds into the next layer's bias.
        roles: ``{name: "input" | "hidden"}``.
        is_output: ``{name: bool}``.
    """

    threshold: float
    layer_names: tuple
    features: np.ndarray
    inputs: dict
    units: dict
    constant: dict
    folded: dict
    roles: dict
    is_output: dict


def _readonly(array):
    array.setflags(write=False)
    return array


def _masks_from(structure, kernels, biases, threshold):
    nonzero = {name: _nonzero(kernels[name], threshold) for name in structure.dense}
    varying, const_raw = {}, {}
    # Forward pass, in graph order (a previous Dense always comes first).
    for name in structure.dense:
        a = nonzero[name]
        p = structure.prev[name]
        if p in (None, "<input>"):
            v = a.any(axis=0)
        else:
            v = a[varying[p]].any(axis=0)
        const_raw[name] = ~v
        n = structure.next[name]
        if n not in (None, "<output>") and biases[n] is None:
            v = np.ones_like(v)  # no bias to fold a constant into: keep treating it as varying
        varying[name] = v
    # Backward pass.
    kept = {}
    for name in reversed(structure.dense):
        n = structure.next[name]
        if n is None or n == "<output>":
            kept[name] = np.ones(kernels[name].shape[1], dtype=bool)
        else:
            kept[name] = varying[name] & nonzero[n][:, kept[n]].any(axis=1)
    inputs = {}
    features = None
    for name in structure.dense:
        p = structure.prev[name]
        if p is None:
            inputs[name] = np.ones(kernels[name].shape[0], dtype=bool)
        elif p == "<input>":
            features = nonzero[name][:, kept[name]].any(axis=1)
            inputs[name] = features
        else:
            inputs[name] = kept[p]
    if features is None:
        n = structure.n_features
        if n is None:
            n = kernels[structure.dense[0]].shape[0]
        features = np.ones(n, dtype=bool)
    folded = {}
    for name in structure.dense:
        n = structure.next[name]
        if n is None or n == "<output>":
            folded[name] = np.zeros_like(kept[name])
        else:
            folded[name] = ~varying[name]
    roles = {name: ("input" if name in structure.input_readers else "hidden") for name in structure.dense}
    outputs = {name: structure.next[name] == "<output>" for name in structure.dense}
    for d in (inputs, kept, const_raw, folded):
        for value in d.values():
            _readonly(value)
    return UnitMasks(
        threshold=threshold,
        layer_names=structure.dense,
        features=_readonly(features),
        inputs=inputs,
        units=kept,
        constant=const_raw,
        folded=folded,
        roles=roles,
        is_output=outputs,
    ), nonzero


def _read_weights(model, structure, owner):
    """``(layers, kernels, biases)`` as numpy; raises :class:`NonFiniteError` for NaN or inf weights.

    A NaN weight is neither zero nor alive (``|NaN| <= t`` is False, and so is
    ``|NaN| > t``), so every count made from it would be wrong: refuse it here,
    where every report, mask and pruning plan reads the weights.
    """
    layers = _layers_by_name(model, structure)
    kernels, biases = {}, {}
    broken = []
    for name in structure.dense:
        layer = layers[name]
        kernels[name] = _to_numpy(layer.kernel)
        biases[name] = _to_numpy(layer.bias) if layer.use_bias and layer.bias is not None else None
        for kind, values in (("kernel", kernels[name]), ("bias", biases[name])):
            if values is not None and not np.all(np.isfinite(values)):
                broken.append((f"{name}/{kind}", values))
    if broken:
        raise NonFiniteError(
            f"{owner}: the weights of the model are not finite, so no weight can be counted as zero or "
            "kept: "
            + ", ".join(f"{label} ({_non_finite_counts(values)})" for label, values in broken)
            + ". The training diverged: scale the inputs (e.g. a keras.layers.Normalization layer or "
            "scikit-learn's StandardScaler) or lower the learning rate, then train again.",
            names=[label for label, _ in broken],
        )
    return layers, kernels, biases


def _non_finite_counts(values):
    nan = int(np.count_nonzero(np.isnan(values)))
    inf = int(np.count_nonzero(np.isinf(values)))
    counts = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n]
    return " and ".join(counts) + f" of {values.size} value{'s' if values.size != 1 else ''}"


def unit_masks(model, threshold=1e-3):
    """Decide which input features and hidden units survive pruning at ``threshold``.

    The one place that decides what is dead (see the module docstring for the
    fixed point): the report counts these masks and surgery cuts them.

    Args:
        model: a built ``keras.Model`` with at least one Dense layer.
        threshold: finite number >= 0; weights with ``|w| <= threshold`` are zero.

    Returns:
        A :class:`UnitMasks`.

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``.
        NonFiniteError: a Dense kernel or bias holds NaN or inf (the message names them).

    Example:
        >>> masks = unit_masks(model, 1e-3)
        >>> masks.features.sum(), {k: v.sum() for k, v in masks.units.items()}
    """
    structure, threshold = _check_model("unit_masks", model, threshold)
    _, kernels, biases = _read_weights(model, structure, "unit_masks")
    masks, _ = _masks_from(structure, kernels, biases, threshold)
    return masks


# ----------------------------------------------------------------------------- the report


@dataclasses.dataclass(frozen=True)
class LayerSparsity:
    """Sparsity of one Dense layer at one threshold.

    Attributes:
        name: layer name.
        role: ``"input"`` (reads the model input) or ``"hidden"``.
        weights: kernel size ``inputs * units`` (biases are not counted).
        zero_weights: kernel weights with ``|w| <= threshold``.
        sparsity: ``zero_weights / weights``.
        groups: kernel rows (one group per input of the layer).
        groups_alive: rows with at least one ``|w| > threshold``.
        units: output units.
        units_alive: units kept by pruning (all of them for an output layer).
        constant_units: units with no non-zero weight from a varying input:
            they output a constant, which surgery folds into the next bias.
        is_output: the layer produces the model output.
    """

    name: str
    role: str
    weights: int
    zero_weights: int
    sparsity: float
    groups: int
    groups_alive: int
    units: int
    units_alive: int
    constant_units: int
    is_output: bool


@dataclasses.dataclass(frozen=True)
class SparsityReport:
    """What a group-sparse network has left at one threshold (plain Python values).

    Attributes:
        threshold: weights with ``|w| <= threshold`` count as zero.
        n_features: input features of the model (flattened).
        selected_features: indices of the input features that survive.
        layers: one :class:`LayerSparsity` per Dense layer, in graph order.
        layer_sizes: compact sizes, input layer included, output layer
            excluded (the paper's Table 3), e.g. ``(582, 45, 41, 61)``.
        original_layer_sizes: the same before pruning, e.g. ``(784, 400, 300, 100)``.
        total_weights: Dense kernel weights (connections; biases excluded, as in the paper).
        zero_weights: of those, how many have ``|w| <= threshold``.
        sparsity: ``zero_weights / total_weights``.
        live_neurons: hidden units kept, summed over the hidden layers.
        params_before: parameters (kernels and biases) of the Dense layers.
        params_after: the same after removing the dead features and units.
        uninterpreted_layers: ``"name (Class)"`` for each layer the analysis
            could not see through; when not empty the unit counts are
            conservative and :func:`~keras_group_lasso.prune_model` refuses the model.
    """

    threshold: float
    n_features: int
    selected_features: tuple
    layers: tuple
    layer_sizes: tuple
    original_layer_sizes: tuple
    total_weights: int
    zero_weights: int
    sparsity: float
    live_neurons: int
    params_before: int
    params_after: int
    uninterpreted_layers: tuple

    @property
    def n_selected_features(self):
        """``len(selected_features)``."""
        return len(self.selected_features)

    @property
    def compression(self):
        """``params_after / params_before`` (1.0 when nothing is removed)."""
        return self.params_after / self.params_before if self.params_before else 1.0

    def to_dict(self):
        """A JSON-serializable dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["selected_features"] = list(self.selected_features)
        out["layer_sizes"] = list(self.layer_sizes)
        out["original_layer_sizes"] = list(self.original_layer_sizes)
        out["uninterpreted_layers"] = list(self.uninterpreted_layers)
        out["layers"] = [dataclasses.asdict(layer) for layer in self.layers]
        return out

    def __str__(self):
        rows = [
            ("layer", "role", "weights", "zero", "sparsity", "groups alive", "units alive", "constant")
        ]
        for layer in self.layers:
            rows.append(
                (
                    layer.name,
                    ("input, output" if layer.role == "input" else "output") if layer.is_output else layer.role,
                    f"{layer.weights:,}",
                    f"{layer.zero_weights:,}",
                    f"{100 * layer.sparsity:.1f}%",
                    f"{layer.groups_alive}/{layer.groups}",
                    f"{layer.units_alive}/{layer.units}",
                    str(layer.constant_units),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"SparsityReport (|w| <= {self.threshold:g} counts as zero)"]
        for i, row in enumerate(rows):
            cells = [c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
            lines.append("  " + "  ".join(cells).rstrip())
        hidden = sum(self.original_layer_sizes[1:])
        lines += [
            f"  selected features: {len(self.selected_features)}/{self.n_features}",
            f"  live neurons:      {self.live_neurons}/{hidden}",
            "  layer sizes:       "
            + "-".join(map(str, self.original_layer_sizes))
            + " -> "
            + "-".join(map(str, self.layer_sizes)),
            f"  sparsity:          {100 * self.sparsity:.2f}% of {self.total_weights:,} kernel weights",
            f"  params:            {self.params_before:,} -> {self.params_after:,}"
            f" ({100 * self.compression:.1f}%)",
        ]
        if self.uninterpreted_layers:
            lines.append("  uninterpreted:     " + ", ".join(self.uninterpreted_layers))
        return "\n".join(lines)


def sparsity_report(model, threshold=1e-3):
    """Describe the sparsity of ``model``'s Dense layers at ``threshold`` (the model is not changed).

    ``sparsity = #{|w| <= threshold} / #weights`` over every Dense kernel (the
    paper's "percentage of zero weights with respect to the total number of
    connections"; biases excluded). Selected features, live neurons and
    layer sizes come from :func:`unit_masks`, so they equal the sizes
    :func:`~keras_group_lasso.prune_model` produces.

    Args:
        model: a built ``keras.Model`` with at least one Dense layer.
        threshold: finite number >= 0 (default ``1e-3``, the paper's).

    Returns:
        A frozen :class:`SparsityReport`; ``str(report)`` is a readable table,
        ``report.to_dict()`` is JSON-serializable.

    Raises:
        InvalidParameterError: ``threshold`` is negative, NaN, infinite or not
            a number; ``model`` is not a built ``keras.Model`` or has no Dense layer.
        NonFiniteError: a Dense kernel or bias holds NaN or inf (the message names them).

    Example:
        >>> report = sparsity_report(model, threshold=1e-3)
        >>> report.layer_sizes, f"{report.sparsity:.1%}"
        ((582, 45, 41, 61), '95.1%')
    """
    structure, threshold = _check_model("sparsity_report", model, threshold)
    _, kernels, biases = _read_weights(model, structure, "sparsity_report")
    masks, nonzero = _masks_from(structure, kernels, biases, threshold)
    return _report_from(structure, biases, masks, nonzero, threshold)


def _analyze(owner, model, threshold):
    """Everything at once, reading each weight once: ``(structure, layers, kernels, biases, masks, report)``."""
    structure, threshold = _check_model(owner, model, threshold)
    layers, kernels, biases = _read_weights(model, structure, owner)
    masks, nonzero = _masks_from(structure, kernels, biases, threshold)
    report = _report_from(structure, biases, masks, nonzero, threshold)
    return structure, layers, kernels, biases, masks, report


def _report_from(structure, biases, masks, nonzero, threshold):
    per_layer = []
    total = zero = params_before = params_after = live = 0
    for name in structure.dense:
        a = nonzero[name]
        n_in, n_units = a.shape
        nz = int(np.count_nonzero(a))
        kept_in = int(masks.inputs[name].sum())
        kept_out = int(masks.units[name].sum())
        has_bias = biases[name] is not None
        is_output = masks.is_output[name]
        per_layer.append(
            LayerSparsity(
                name=name,
                role=masks.roles[name],
                weights=int(a.size),
                zero_weights=int(a.size - nz),
                sparsity=float((a.size - nz) / a.size) if a.size else 0.0,
                groups=int(n_in),
                groups_alive=int(np.count_nonzero(a.any(axis=1))),
                units=int(n_units),
                units_alive=kept_out,
                constant_units=int(masks.constant[name].sum()),
                is_output=bool(is_output),
            )
        )
        total += a.size
        zero += a.size - nz
        params_before += a.size + (n_units if has_bias else 0)
        params_after += kept_in * kept_out + (kept_out if has_bias else 0)
        if not is_output:
            live += kept_out

    hidden = [layer for layer in per_layer if not layer.is_output]
    n_features = int(masks.features.size)
    report = SparsityReport(
        threshold=float(threshold),
        n_features=n_features,
        selected_features=tuple(int(i) for i in np.flatnonzero(masks.features)),
        layers=tuple(per_layer),
        layer_sizes=(int(masks.features.sum()),) + tuple(layer.units_alive for layer in hidden),
        original_layer_sizes=(n_features,) + tuple(layer.units for layer in hidden),
        total_weights=int(total),
        zero_weights=int(zero),
        sparsity=float(zero / total) if total else 0.0,
        live_neurons=int(live),
        params_before=int(params_before),
        params_after=int(params_after),
        uninterpreted_layers=tuple(f"{name} ({cls})" for name, cls, _ in structure.uninterpreted),
    )
    return report


# ----------------------------------------------------------------------------- in place


def apply_threshold(model, threshold=1e-3):
    """Set every Dense kernel and bias weight with ``|w| <= threshold`` to exactly 0, IN PLACE.

    The paper's final step ("all weights under 1e-3 in absolute value are set
    to 0"), with the same ``<=`` rule as :func:`sparsity_report`, so afterwards
    the report's zero weights are stored zeros. This is the one function here
    that changes the model; :func:`~keras_group_lasso.prune_model` does the
    same on a copy.

    Args:
        model: a built ``keras.Model`` with at least one Dense layer.
        threshold: finite number >= 0.

    Returns:
        The number of weights that were non-zero and are now 0.

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``.
        NonFiniteError: a Dense kernel or bias holds NaN or inf (the message names
            them); no weight is changed then.

    Example:
        >>> apply_threshold(model, 1e-3)
        41205
    """
    structure, threshold = _check_model("apply_threshold", model, threshold)
    # Every weight is read (and a NaN or inf refused) before any is changed.
    layers, kernels, biases = _read_weights(model, structure, "apply_threshold")
    changed = 0
    for name in structure.dense:
        layer = layers[name]
        for variable, values in ((layer.kernel, kernels[name]), (layer.bias, biases[name])):
            if values is None:
                continue
            cut = is_zero(values, threshold) & (values != 0)
            count = int(np.count_nonzero(cut))
            if count:
                variable.assign(np.where(cut, np.zeros((), values.dtype), values))
                changed += count
    return changed


# ----------------------------------------------------------------------------- for pictures


def input_feature_strength(model):
    """Per input feature, the L2 norm of its outgoing weights in the Dense layer reading the input.

    ``s_i = ||W[i, :]||_2`` of the first kernel (the paper's "overall strength
    of outgoing weights", Figs. 3 and 5). Raw weights, no threshold.

    Returns:
        float32 array ``(n_features,)``.

    Raises:
        InvalidParameterError: ``model`` has no Dense layer reading its input.

    Example:
        >>> input_feature_strength(model).reshape(28, 28)
    """
    structure, _ = _check_model("input_feature_strength", model)
    first = [name for name in structure.dense if structure.prev[name] == "<input>"]
    if not first:
        fail(
            "input_feature_strength",
            "model",
            "a model whose input is read by a Dense layer (through Flatten or per-unit layers only)",
            model,
        )
    kernel = _to_numpy(_layers_by_name(model, structure)[first[0]].kernel)
    return np.sqrt(np.sum(np.square(kernel.astype("float32")), axis=1))


def layer_group_norms(model):
    """``{Dense layer name: ||W[i, :]||_2 for each kernel row}`` (raw weights), in graph order.

    Example:
        >>> {name: norms.shape for name, norms in layer_group_norms(model).items()}
    """
    structure, _ = _check_model("layer_group_norms", model)
    layers = _layers_by_name(model, structure)
    out = {}
    for name in structure.dense:
        kernel = _to_numpy(layers[name].kernel).astype("float32")
        out[name] = np.sqrt(np.sum(np.square(kernel), axis=1))
    return out


def image_shape(model):
    """A shape to draw one value per input feature as an image, or ``None``.

    The model input's own shape when it has 2 or 3 dimensions (``(H, W)`` or
    ``(H, W, C)``, read through Flatten); a square ``(s, s)`` for a flat
    input of ``s * s > 1`` features (a guess: DIGITS' 64 -> 8x8, MNIST's
    784 -> 28x28); otherwise ``None``.

    Example:
        >>> image_shape(mnist_mlp)
        (28, 28)
    """
    structure, _ = _check_model("image_shape", model)
    shape = structure.input_shape
    if shape is None or any(d is None for d in shape):
        return None
    if len(shape) in (2, 3):
        return tuple(int(d) for d in shape)
    if len(shape) == 1 and shape[0] > 1:
        side = math.isqrt(int(shape[0]))
        if side * side == shape[0]:
            return (side, side)
    return None

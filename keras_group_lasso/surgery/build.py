"""Build the smaller model: threshold a copy of the weights, fold constant units, slice, rebuild."""

import collections

import keras
import numpy as np

from keras_group_lasso._validation import check_choice, check_positive_int, fail
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.masks import needed_units, threshold_array
from keras_group_lasso.surgery import plan as planning

__all__ = ["prune_model"]

_INPUTS = ("original", "selected")


def prune_model(model, threshold=1e-3, inputs="original", round_to=1, fold_batchnorm=False):
    """A new, physically smaller model that computes what ``model`` computes after thresholding.

    On any input, ``prune_model(model, t)(x)`` equals the output of ``model``
    after :func:`~keras_group_lasso.apply_threshold` ``(model, t)`` (up to
    float rounding, inference mode), but ``model`` itself is never changed:
    the surgery works on numpy copies of its weights. It

    * sets every Dense and convolution weight with ``|w| <= threshold`` to 0 (in the copy),
    * removes the input features, hidden units and constant units that
      :func:`~keras_group_lasso.analysis.unit_masks` finds dead (the same fixed
      point as :func:`~keras_group_lasso.sparsity_report`, so the new layer sizes
      are ``report.layer_sizes``); a constant unit's output, ``act(b)`` passed
      through the per-unit layers after it (BatchNormalization, ...), is added
      to the next layer's bias: ``b' = b + c[folded] @ W[folded, :]``,
    * slices the per-unit layers in between (BatchNormalization's gamma, beta,
      moving mean and variance; PReLU's alpha) and the input preprocessing
      before the first Dense (Normalization's mean and variance, a
      per-feature Rescaling) and copies the others, keeping names,
      activations, dtype policies and ``use_bias``.

    In a residual or branching model a unit lives in several tensors (every
    operand of an ``Add``, a ``Concatenate``'s slice): it goes from all of
    them, and from every layer that makes it, only when no layer reads it;
    a branch that loses every unit is left out. With ``inputs="original"``,
    where an operand that comes from the input still holds dropped features,
    a ``select_features`` layer (below) picks the kept ones before the merge.

    A model whose input has axes of unknown size (``keras.Input((None, 8))``,
    ``(None, None, 3)``: any length or image size) is pruned in the same way,
    since what is dead does not depend on the size; the result takes inputs
    of any size too. A ``Flatten`` of a map with such an axis is refused (the
    number of features it makes depends on the size).

    Output units are never removed. The result is a ``keras.Sequential`` when
    ``model`` is one, else a functional ``keras.Model``, uncompiled, with the
    attributes ``kept_features`` (tuple of input indices), ``pruning_report``
    (the :class:`~keras_group_lasso.SparsityReport` of ``model`` at
    ``threshold``), ``pruning_plan`` (the :class:`PruningPlan`) and
    ``folded_batchnorms`` (``{BatchNormalization name: the layer it was
    merged into}``, see ``fold_batchnorm``). Those attributes are not saved
    in a ``.keras`` file. The report and plan count parameters of the
    compact layers; with ``inputs="original"`` the first Dense may hold zero
    rows or be preceded by a selection layer (see ``inputs``).

    The result is built from Keras's own layers only, so it saves to a
    ``.keras`` file that plain Keras loads without this package: the
    penalties of this package (``GroupLasso``, ``InputGroupLasso``, ...) are
    not carried over (pass the result to
    :func:`~keras_group_lasso.add_group_sparsity` to train it further with
    them); other regularizers are kept. A nested Sequential or functional
    block is flattened into the graph: its layers keep their own names when
    those are unique in the result, else they are named ``<block>_<layer>``.

    Args:
        model: a built ``keras.Model`` (Sequential or functional, one input);
            see :class:`UnsupportedModelError` for what is refused.
        threshold: finite number >= 0 (default ``1e-3``, the paper's).
        inputs: ``"original"`` (default): the new model takes the original
            input (same shape), a drop-in replacement. Its first Dense keeps
            an all-zero row for each dropped feature, unless selecting the
            kept features first costs fewer multiply-adds
            (``k * (n + u) < n * u`` for ``k`` of ``n`` features kept and
            ``u`` units): then a non-trainable, bias-free Dense layer named
            ``select_features`` with a 0/1 kernel picks them, right before the
            first Dense (exact: each output is one input times 1 plus zeros).
            ``"selected"``: it takes only the kept features, a flat vector of
            ``len(kept_features)`` values in the order of ``kept_features``
            (a sequence input ``(steps, C)``: ``(steps, len(kept))``, the
            kept channels at every step).
        round_to: integer >= 1 (default 1: exactly the live units). Each
            hidden layer keeps a multiple of ``round_to`` of its units (or all
            of them): some units found dead are kept, with their weights, so
            the outputs are the same. Convolutions and matmuls run fastest on
            channel counts that are multiples of 8 or 16; a layer pruned to 13
            channels can be slower than the same layer with 16, so
            ``round_to=8`` gives a faster model at a few more FLOPs. Units
            shared by a residual stream are rounded once; input features and
            output units are left as they are. The plan and the report
            attached to the result count the units kept.
        fold_batchnorm: ``True`` merges each ``BatchNormalization`` (on the
            last axis) that directly follows a Dense or convolution layer
            without activation, and is all that reads it, into that layer
            (inference mode: ``K' = K * s``, ``b' = (b - mean) * s + beta``
            with ``s = gamma / sqrt(variance + epsilon)``): one layer and one
            pass over the data fewer, for a model meant for inference (its
            outputs equal the original's up to float rounding; training it
            further no longer normalizes batches). Default ``False``.

    Returns:
        The new ``keras.Model``.

    Raises:
        InvalidParameterError: for a bad ``threshold``, ``inputs`` or
            ``model``, or a threshold at which no input feature survives.
        UnsupportedModelError: the message names the first layer surgery
            cannot interpret, its class, and what is supported.

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> kernel = np.ones((4, 3), dtype="float32")
        >>> kernel[[1, 3], :] = 0.0   # input features 1 and 3 are dead
        >>> kernel[:, 2] = 0.0        # so is hidden unit 2
        >>> model.get_layer("hidden").set_weights([kernel, np.zeros(3, dtype="float32")])
        >>> small = prune_model(model, threshold=1e-3)
        >>> small.kept_features, small.pruning_report.layer_sizes
        ((0, 2), (2, 2))
        >>> model.count_params(), small.count_params()
        (23, 16)
        >>> x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
        >>> np.allclose(ops.convert_to_numpy(small(x)), ops.convert_to_numpy(model(x)), atol=1e-5)
        True
    """
    owner = "prune_model"
    inputs = check_choice(owner, "inputs", inputs, _INPUTS)
    round_to = check_positive_int(owner, "round_to", round_to)
    if not isinstance(fold_batchnorm, bool):
        fail(owner, "fold_batchnorm", "a bool", fold_batchnorm)
    plan = planning.build_plan(owner, model, threshold, round_to)
    result = plan.analysis
    graph = result.graph
    masks = result.masks
    layers = graph.layers
    weights = _folded(result)
    needed = needed_units(graph, masks)
    batchnorms = _foldable_batchnorms(graph, masks) if fold_batchnorm else {}
    into = {units: bn for bn, units in batchnorms.items()}

    input_names = [found.name for found in graph.inputs]
    reserved = tuple(name for name in input_names if not graph.sequential)
    names = _flat_names([node.name for node in graph.nodes if node.name not in input_names], reserved=reserved)
    taken = {*names.values(), *reserved}
    tensors, present, new_inputs = {}, {}, []
    sliced = {}  # node name -> it holds elements of an input that "selected" slices (before its Flatten)
    for found, source in zip(graph.inputs, model.inputs):
        keep = needed[found.start : found.start + found.count]
        sliced[found.name] = inputs == "selected" and (found.flat or found.sequence)
        if sliced[found.name] and not keep.any():  # nothing reads this input: the new model does not take it
            tensors[found.name], present[found.name] = None, np.zeros(found.count, bool)
            continue
        shape = tuple(found.shape)
        if sliced[found.name]:  # a flat vector of the selected features, or a sequence of the selected channels
            shape = (int(keep.sum()),) if found.flat else shape[:-1] + (int(keep.sum()),)
        inp = keras.Input(shape=shape, dtype=source.dtype, name=None if graph.sequential else found.name)
        tensors[found.name] = inp
        present[found.name] = keep if sliced[found.name] else np.ones(found.count, bool)
        new_inputs.append(inp)
    shape = tuple(new_inputs[0].shape[1:])
    source = model.inputs[0]
    built = []  # (new layer, weights), in call order
    initializers = {}  # id(new layer) -> the user's initializers, put back once it is built

    made = {}  # node name -> its new layer (the later calls of a shared layer call it again)

    options = _call_options(model)

    def call(layer, weights_, x, name=None):
        """Call the new ``layer`` on ``x`` as node ``name`` called its original (the original's rule: a layer
        recognized by what it computes is recognized on the original, which has been called)."""
        built.append((layer, weights_))
        if name is None:
            return layer(x)
        rule = registry.rule_of(layers[name])
        return rule.call(layer, x, options.get(name)) if rule is not None else layer(x)

    def select(x, have, want, like):
        """``x`` (rank 2, holding the units ``have``) reduced to the units ``want`` by a 0/1 Dense."""
        kept = np.flatnonzero(want[have])
        layer, w = _selection(kept, int(have.sum()), like, taken)
        return call(layer, w, x)

    for node in graph.nodes:
        if node.name in tensors:  # an input
            continue
        sliced[node.name] = len(node.inputs) == 1 and sliced.get(node.inputs[0], False) and node.elements
        layer = layers[node.name]
        if node.name in masks.detached:  # only a constant operand that its merge drops uses it
            tensors[node.name], present[node.name] = None, np.zeros(node.ids.size, bool)
            continue
        if node.name in batchnorms:  # merged into the layer before it
            tensors[node.name], present[node.name] = tensors[node.inputs[0]], present[node.inputs[0]]
            continue
        fold = masks.merge_folds.get(node.name)
        src = node.inputs if fold is None else tuple(n for n, d in zip(node.inputs, fold.dropped) if not d)
        missing = [tensors[name] is None for name in src]
        lost = all(missing) if node.kind == "concat" else any(missing)  # Concatenate keeps its other operands
        if lost or (node.kind == "units" and not masks.units[node.name].any()):
            # a branch that lost every unit: nothing reads it
            tensors[node.name], present[node.name] = None, np.zeros(node.ids.size, bool)
            continue
        if node.kind == "units":
            unode = graph.node(node.name)
            x, have = tensors[unode.source], present[unode.source]
            rows = have
            want = masks.inputs[node.name]
            kept_out = masks.units[node.name]
            n, k, u = int(have.sum()), int((have & want).sum()), int(kept_out.sum())
            rule = registry.units_rule(layer)
            shared = node.name in graph.calls or node.name in graph.calls.values()
            if (k < n and unode.positions == 1 and rule.selects_rows and len(x.shape) == 2 and k * (n + u) < n * u
                    and not shared):
                # Right before the Dense, after the input preprocessing: that Dense rounds its inputs as
                # the selection does (e.g. TF32 matmuls on a GPU).
                x = select(x, have, want, layer)
                rows = have & want
            elif shared and (have & ~want).any():
                # Every call of a shared layer reads the same kept rows: pick them from what this call's input holds.
                x = select(x, have, want, layer)
                rows = have & want
            config, new = rule.slice_units(layer, weights[node.name], unode.in_units, np.flatnonzero(rows),
                                           np.flatnonzero(kept_out))
            if node.name in into:
                config, new = _merge_batchnorm(config, new, layers[into[node.name]], np.flatnonzero(kept_out))
            out_present = kept_out
        elif node.kind == "merge":
            want = needed[node.ids]
            xs = []
            for name in src:
                x = tensors[name]
                if not np.array_equal(present[name], want):
                    x = select(x, present[name], want, layer)
                xs.append(x)
            if len(xs) > 1:
                config, new = layer.get_config(), layer.get_weights()
                config["name"] = names[node.name]
                new_layer, new = _new_layer(layer, config, new, initializers)
                y = call(new_layer, new, xs)
            else:  # the other operands were constants: nothing left to merge
                (y,) = xs
            if fold is not None and not fold.is_identity:
                # The merge's own name when it is gone, else a new one next to it.
                name = names[node.name] if len(xs) == 1 else _unique(f"{names[node.name]}_constants", taken)
                y = call(_constant_operands(layer, fold, want, name), [], y)
            tensors[node.name] = y
            present[node.name] = want
            continue
        elif node.kind == "concat":
            present[node.name] = np.concatenate([present[name] for name in src])
            operands = [tensors[name] for name in src if tensors[name] is not None]
            if len(operands) == 1:  # the other operands lost every unit
                tensors[node.name] = operands[0]
                continue
            config, new = layer.get_config(), layer.get_weights()
            config["name"] = names[node.name]
            new_layer, new = _new_layer(layer, config, new, initializers)
            tensors[node.name] = call(new_layer, new, operands)
            continue
        else:
            (name,) = src
            x, have = tensors[name], present[name]
            from_sliced = sliced.get(name, False) and graph.tensor(name).elements
            if node.kind == "flatten" and from_sliced and len(layer.output.shape) == 2:
                tensors[node.name], present[node.name] = x, have  # the selected features are already flat
                continue
            rule = registry.rule_of(layer)
            if have.all() and not from_sliced:
                config, new = layer.get_config(), layer.get_weights()
            else:  # fewer units, or the input's elements already flattened into the selected features
                config, new = rule.slice(layer, _entries(have, graph.tensor(name)))
            if rule.thresholded:  # a DepthwiseConv
                new = [threshold_array(w, plan.threshold) for w in new]
            out_present = have
        present[node.name] = out_present
        if graph.layer_name(node.name) in made:  # a later call of a shared layer: the same (new) layer
            shared_layer = made[graph.layer_name(node.name)]
            tensors[node.name] = registry.rule_of(layer).call(shared_layer, x, options.get(node.name))
            continue
        config["name"] = names[node.name]
        _drop_package_penalties(layer, config)
        new_layer, new = _new_layer(layer, config, new, initializers)
        made[node.name] = new_layer
        tensors[node.name] = call(new_layer, new, x, node.name)

    for name in graph.outputs:
        if not present[name].all():  # pragma: no cover - the masks keep every output unit
            raise RuntimeError(f"prune_model: the output of '{name}' lost units; please report this")
    outputs = [tensors[name] for name in graph.outputs]
    if graph.sequential:
        # Fresh layers: those above were called on a functional input already.
        fresh = []
        for layer, new in built:
            clone = type(layer).from_config(layer.get_config())
            if id(layer) in initializers:
                initializers[id(clone)] = initializers.pop(id(layer))
            fresh.append((clone, new))
        built = fresh
        small = keras.Sequential([keras.Input(shape=shape, dtype=source.dtype)] + [layer for layer, _ in built],
                                 name=model.name)
    else:
        small = keras.Model(new_inputs[0] if len(new_inputs) == 1 else new_inputs,
                            outputs[0] if len(outputs) == 1 else outputs, name=model.name)
    for layer, new in built:
        if new:
            _set_weights(layer, new)
        _restore_initializers(layer, initializers)

    small.kept_features = plan.kept_features
    small.kept_inputs = tuple(found.name for found in graph.inputs if tensors[found.name] is not None)
    small.folded_batchnorms = {names[bn]: names[units] for bn, units in batchnorms.items()}
    small.pruning_report = plan.report
    small.pruning_plan = plan
    return small


def _foldable_batchnorms(graph, masks):
    """``{BatchNormalization name: units layer name}``: each that can be merged into the layer it reads.

    The units layer has no activation, nothing else reads it, and the
    BatchNormalization normalizes its last axis (its units).
    """
    readers = collections.Counter(name for node in graph.nodes for name in node.inputs)
    out = {}
    for node in graph.nodes:
        layer = graph.layers.get(node.name)
        rule = registry.rule_of(layer) if layer is not None else None
        if rule is None or not rule.batchnorm or len(node.inputs) != 1:
            continue
        (source,) = node.inputs
        maker = graph.layers.get(source)
        maker_rule = registry.units_rule(maker)
        if (maker_rule is None or not registry.makes_units(maker) or not maker_rule.merges_batchnorm
                or keras.activations.serialize(maker.activation) != "linear"
                or readers[source] != 1 or source in graph.outputs or source in masks.detached
                or not masks.units[source].any()):
            continue
        axis = layer.axis if isinstance(layer.axis, int) else (layer.axis[0] if len(layer.axis) == 1 else None)
        try:
            rank = len(maker.compute_output_shape(maker.input.shape))
        except Exception:  # noqa: BLE001 - no single input shape: it stays a layer of its own
            continue
        if axis is None or axis % rank != rank - 1:
            continue
        out[node.name] = source
    return out


def _merge_batchnorm(config, weights, bn, kept):
    """``(config, weights)`` of a units layer (already sliced to the units ``kept``) with ``bn`` merged in."""
    def values(variable, default):
        return default if variable is None else np.asarray(keras.ops.convert_to_numpy(variable), np.float64)[kept]

    ones = np.ones(len(kept))
    gamma = values(bn.gamma if bn.scale else None, ones)
    beta = values(bn.beta if bn.center else None, 0 * ones)
    scale = gamma / np.sqrt(values(bn.moving_variance, ones) + bn.epsilon)
    mean = values(bn.moving_mean, 0 * ones)
    kernels = [np.asarray(w) for w in weights]
    has_bias = bool(config.get("use_bias", True))
    bias = kernels.pop().astype(np.float64) if has_bias else np.zeros(len(kept))
    last = kernels[-1]  # the kernel whose last axis holds the units (the pointwise one of a SeparableConv)
    kernels[-1] = (last.astype(np.float64) * scale).astype(last.dtype)
    config = dict(config, use_bias=True)
    return config, kernels + [((bias - mean) * scale + beta).astype(last.dtype)]


def _constant_operands(merge, fold, want, name):
    """A ``Rescaling`` that puts back what the dropped constant operands of ``merge`` added (kept channels only).

    ``scale * x + offset`` per channel with ``scale`` and ``offset`` of the
    :class:`~keras_group_lasso.graph.masks.MergeFold` (a plain Keras layer:
    the pruned model still loads without this package).
    """
    dtype = merge.dtype_policy.name if hasattr(merge, "dtype_policy") else None
    cast = np.dtype(merge.compute_dtype if hasattr(merge, "compute_dtype") else "float32")
    return keras.layers.Rescaling(
        scale=[float(v) for v in fold.scale[want].astype(cast)],
        offset=[float(v) for v in fold.offset[want].astype(cast)],
        name=name,
        dtype=dtype,
    )


def _entries(have, node):
    """Indices of the kept entries of ``node``'s last axis (``have``: kept ids; repeated over its positions)."""
    kept = np.flatnonzero(have)
    if node.positions == 1:
        return kept
    return (np.arange(node.positions)[:, None] * have.size + kept[None, :]).reshape(-1)


def _folded(result):
    """The thresholded weights of every units layer, with the folded constants added to its bias.

    A constant unit ``j`` (no non-zero weight from a varying input) outputs
    ``c_j`` everywhere (its activation of its bias, through the per-unit layers
    after it); the next layer reads it through all of its kernel rows, so
    ``b' = b + sum_j c_j * sum_p K[p, j, :]`` (:attr:`UnitMasks.fold_in`).
    """
    out = {}
    for name, w in result.weights.items():
        w = dict(w)
        fold = result.masks.fold_in[name]
        if w["bias"] is not None and np.any(fold != 0):
            w["bias"] = (w["bias"].astype("float64") + fold).astype(w["bias"].dtype)
        out[name] = w
    return out


def _new_layer(layer, config, weights, initializers):
    """``(new layer, weights)`` from ``config``; its variables start at zero, not at random values.

    The weights are set right after the model is built, so drawing random
    initial values is wasted work, and on JAX each draw compiles a random
    kernel per shape (seconds for a CNN). The layer keeps the user's
    initializers in its config (:func:`_restore_initializers`).
    """
    if not weights:
        return type(layer).from_config(config), weights
    originals = {key: value for key, value in config.items() if key.endswith("_initializer") and value is not None}
    config = dict(config, **{key: "zeros" for key in originals})
    new = type(layer).from_config(config)
    initializers[id(new)] = originals
    return new, weights


def _restore_initializers(layer, initializers):
    originals = initializers.pop(id(layer), None)
    if not originals:
        return
    for key, value in originals.items():
        # A recurrent layer's initializers are read-only properties of its cell's.
        for target in (layer, getattr(layer, "cell", None)):
            if target is not None and hasattr(target, key):
                try:
                    setattr(target, key, keras.initializers.get(value))
                    break
                except AttributeError:
                    continue


def _set_weights(layer, weights):
    rule = registry.rule_of(layer)
    if rule is None:  # the selection layer (a Dense) and merges: plain weights
        layer.set_weights(weights)
    else:
        rule.set_weights(layer, weights)


def _flat_names(steps, reserved=()):
    """A layer name per step: the layer's own name, or ``<block>_<layer>`` where that clashes."""
    own = {step: step.rsplit("/", 1)[-1] for step in steps}
    counts = collections.Counter(own.values())
    used = {name for name in reserved if name}
    names = {}
    for step in steps:
        name = own[step] if counts[own[step]] == 1 and own[step] not in used else step.replace("/", "_")
        names[step] = _unique(name, used)
    return names


def _unique(name, used):
    candidate, k = name, 0
    while candidate in used:
        k += 1
        candidate = f"{name}_{k}"
    used.add(candidate)
    return candidate


def _selection(kept, n, like, taken):
    """``(layer, weights)``: a frozen bias-free Dense whose 0/1 kernel picks the entries ``kept`` of ``n``, in order.

    Built-in Keras (loads anywhere, exports to SavedModel and TFLite as a
    matmul) and exact for finite inputs; it computes in the dtype policy of
    the layer ``like`` that reads the result, so the kept values reach that
    layer rounded as before.
    """
    kernel = np.zeros((n, len(kept)), dtype="float32")
    kernel[kept, np.arange(len(kept))] = 1.0
    name = _unique("select_features", taken)
    layer = keras.layers.Dense(
        len(kept), use_bias=False, trainable=False, name=name, dtype=like.dtype_policy,
        kernel_initializer="zeros",  # its 0/1 kernel is set right after; no random draw
    )
    return layer, [kernel]


def _call_options(model, prefix=""):
    """``{node name: {keyword: value}}``: the keyword arguments of each call that are not tensors
    (``use_causal_mask=True`` of an attention layer), from the model's config (nested blocks too)."""
    found = {}
    if not isinstance(model, keras.Model) or isinstance(model, keras.Sequential):
        return found
    try:
        configs = model.get_config()["layers"]
    except Exception:  # noqa: BLE001 - a model without a readable graph
        return found
    for layer_config in configs:
        name = layer_config["name"]
        for index, node in enumerate(layer_config.get("inbound_nodes") or []):
            kwargs = node.get("kwargs", {}) if isinstance(node, dict) else {}
            plain = {key: value for key, value in kwargs.items()
                     if key not in ("mask", "training") and isinstance(value, (bool, int, float, str))}
            if plain:
                found[f"{prefix}{name}" + (f"#{index}" if index else "")] = plain
        try:
            inner = model.get_layer(name)
        except ValueError:
            continue
        if isinstance(inner, keras.Model):
            found.update(_call_options(inner, f"{prefix}{name}/"))
    return found


def _drop_package_penalties(layer, config):
    """Leave out this package's regularizers, so that plain Keras loads the saved result."""
    package = __name__.split(".")[0]
    for key in config:
        if key.endswith("_regularizer"):
            value = getattr(layer, key, None)
            if value is not None and type(value).__module__.split(".")[0] == package:
                config[key] = None
    _drop_serialized_penalties(config, package)


def _drop_serialized_penalties(config, package):
    """The same inside the serialized layers a wrapper's config holds (``Bidirectional``'s two directions)."""
    for key, value in config.items():
        if not isinstance(value, dict):
            continue
        if key.endswith("_regularizer") and str(value.get("module", "")).split(".")[0] == package:
            config[key] = None
        else:
            _drop_serialized_penalties(value, package)

"""Build the smaller model: apply the steps of the plan to a thresholded copy of the weights, with constants folded."""

import collections
import copy
import re
import warnings

import keras
import numpy as np

from keras_group_lasso._validation import check_choice, check_positive_int, fail
from keras_group_lasso.graph import Kind, registry
from keras_group_lasso.graph.build import (
    block_arguments,
    block_operands,
    block_outputs,
    fixed_sizes,
    graph_config,
    graph_model,
    is_graph_model,
    node_of,
    output_of,
    traced_block,
)
from keras_group_lasso.graph.masks import threshold_array
from keras_group_lasso.surgery import blocks as blocks_module
from keras_group_lasso.surgery import plan as planning
from keras_group_lasso.surgery import steps

__all__ = ["prune_model"]

#: What a block traced into the graph becomes (``prune_model(blocks=)``).
BLOCKS = ("rebuild", "uniform", "flatten")


def prune_model(model, threshold=1e-3, inputs="original", round_to=1, fold_batchnorm=False, blocks="rebuild"):
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

    A tensor that no input reaches (keras.io's positions, ``keras.ops.arange``
    read by a position ``Embedding``) loses the channels of the residual stream
    it is added to, as every layer that makes them does; the new model
    computes it from its own input (``zeros_like(sum(x)) + positions``,
    keras.ops that plain Keras loads), so the layers it feeds stay layers of
    the new model, sliced, and train further.

    Output units are never removed. The result is a ``keras.Sequential`` when
    ``model`` is one (functional when a block in it merges tensors or is
    built again, below), else a functional ``keras.Model``, uncompiled, with the
    attributes ``kept_features`` (tuple of input indices), ``pruning_report``
    (the :class:`~keras_group_lasso.SparsityReport` of ``model`` at
    ``threshold``), ``pruning_plan`` (the :class:`PruningPlan`; its
    ``steps`` say what was built, node by node), ``folded_batchnorms``
    (``{BatchNormalization name: the layer it was merged into}``, see
    ``fold_batchnorm``) and ``rebuilt_blocks`` (``{block: Rebuilt}``, by
    the block's path in the graph, ``"block"`` or ``"outer/inner"``, with
    ``blocks="rebuild"``: ``.layer``, the block built again, or ``None``
    and ``.reason``; ``.changed``, ``{argument: (old, new)}``) and
    ``rebuilt_model`` (the model's own class again, below).
    Those attributes are not saved
    in a ``.keras`` file. The report and plan count parameters of the
    compact layers; with ``inputs="original"`` the first Dense may hold zero
    rows or be preceded by a selection layer (see ``inputs``).

    The result is built from Keras's own layers (and the model's own block
    classes, below), so it saves to a ``.keras`` file that plain Keras loads
    without this package: the
    penalties of this package (``GroupLasso``, ``InputGroupLasso``, ...) are
    not carried over (pass the result to
    :func:`~keras_group_lasso.add_group_sparsity` to train it further with
    them); other regularizers are kept. A nested Sequential or functional
    block is flattened into the graph: its layers keep their own names when
    those are unique in the result, else they are named ``<block>_<layer>``.

    A block written as a ``keras.layers.Layer`` (a residual or Transformer
    block, its call traced into the graph) is pruned through its layers. With ``blocks="rebuild"`` the result holds the
    block's own class again, built from its config with the widths its
    layers kept (keras.io's ``TransformerBlock(embed_dim, num_heads,
    ff_dim)`` with fewer ``num_heads`` and a smaller ``ff_dim``, each instance
    its own), when three things hold: Keras can make the class from its
    config (its constructor takes ``**kwargs`` and ``get_config`` returns its
    arguments, as Keras needs to load it), integer arguments of that config
    give exactly the pruned weights' shapes, and the block so built computes
    what its pruned layers compute (checked on random inputs). Otherwise,
    and always with ``blocks="flatten"``, the block's pruned layers stand in
    its place as plain Keras layers. A result holding the user's class loads
    where that class is known to Keras (registered with
    ``keras.saving.register_keras_serializable``, or passed in
    ``custom_objects``; a KerasHub class with keras_hub installed); plain
    layers load anywhere.

    A block whose call takes its input's length as a number (KerasHub's
    decoders, which compute a causal mask) is traced at fixed probe sizes and
    pruned only as itself, built again and checked against itself with
    thresholded weights; where that fails, or with ``blocks="flatten"``, the
    model is refused. A model of a class of its own whose config holds its
    constructor's arguments (a KerasHub Backbone) comes back as that class
    (``rebuilt_model`` True) when every block was built again with the same
    changes (each decoder with the same ``intermediate_dim``) and its config
    takes them: a ``GPT2Backbone`` that a ``GPT2CausalLM`` can hold again.

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
        blocks: ``"rebuild"`` (default): a block traced into the graph is
            its own class again where its config can say its new widths (see
            above); ``"uniform"``: as ``"rebuild"``, and the calls of blocks
            of one class keep as many units and heads each (the narrower
            ones keep some dead ones, outputs unchanged), so that a model of
            repeated blocks (a KerasHub Backbone or ``CausalLM``) is its
            class again, with one width per block kind, and ``generate``
            works; ``"flatten"``: its layers, plain Keras, which load
            without the block's code.

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
    inputs = check_choice(owner, "inputs", inputs, planning.INPUTS)
    round_to = check_positive_int(owner, "round_to", round_to)
    if not isinstance(fold_batchnorm, bool):
        fail(owner, "fold_batchnorm", "a bool", fold_batchnorm)
    blocks = check_choice(owner, "blocks", blocks, BLOCKS)
    return _pruned(owner, model, threshold, round_to, inputs, fold_batchnorm, blocks=blocks)


def prune_as_if(model, values, threshold=0.0, owner="prune_as_if"):
    """:func:`prune_model` of ``model`` as if the weights named in ``values`` (``{variable path: numpy array}``, the
    kernels and biases of units layers) held those values; ``model`` is not changed, not even for a moment.

    How a narrow copy of a model is made to be timed or weighed (a latency table, a budget's candidate cut).

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> kernel = np.ones((4, 3), dtype="float32")
        >>> kernel[:, 1:] = 0.0
        >>> small = prune_as_if(model, {model.get_layer("hidden").kernel.path: kernel})
        >>> small.get_layer("hidden").units, model.get_layer("hidden").units
        (1, 3)
    """
    return _pruned(owner, model, threshold, 1, "original", False, values)


def _pruned(owner, model, threshold, round_to, inputs, fold_batchnorm, values=None, blocks="flatten"):
    model = graph_model(model)  # a subclassed model: the functional model of the layers its call runs
    plan = planning.build_plan(owner, model, threshold, round_to, inputs=inputs, fold_batchnorm=fold_batchnorm,
                               values=values, uniform=blocks == "uniform")
    blocks = "rebuild" if blocks == "uniform" else blocks
    graph_blocks = plan.analysis.graph.blocks
    # A block traced at probe sizes (a KerasHub decoder: its causal mask from its input's length) is pruned only
    # as itself, built again from its config: its layers alone hold that mask at the probe sizes.
    fixed = {call: block for call, block in graph_blocks.items() if fixed_sizes(block.layer)}
    if fixed and blocks != "rebuild":
        call, block = next(iter(fixed.items()))
        raise planning.UnsupportedModelError(owner, call, type(block.layer).__name__, _FIXED + " (blocks='rebuild')")
    small, builder = _apply_steps(plan, model)
    rebuilt = _rebuilt_blocks(builder, threshold) if blocks == "rebuild" and graph_blocks else {}
    for call, block in fixed.items():
        found = rebuilt.get(call)
        if found is not None and found.layer is None and not any(
                call.startswith(f"{other}/") and rebuilt[other].layer is not None for other in rebuilt):
            raise planning.UnsupportedModelError(owner, call, type(block.layer).__name__,
                                                 f"{_FIXED}, which failed here: {found.reason}")
    replace = {call: found.layer for call, found in rebuilt.items() if found.layer is not None}
    if replace:  # built again, each of those blocks called in place of its layers
        plain = small
        small, builder = _apply_steps(plan, model, replace)
        # checked whole too: never a silent change (a model with a block traced at probe sizes has no plain
        # reference: each such block was checked against itself, thresholded)
        if not fixed and not blocks_module.same_outputs(plain, None, small, None):
            small = plain
            rebuilt = {call: blocks_module.Rebuilt(None, {}, "the model holding it computed something else")
                       if found.layer is not None else found for call, found in rebuilt.items()}
    again = _rebuilt_model(model, small, rebuilt) if replace else None
    small = again or small
    # one entry per block, by its path in the graph ("block", "outer/inner"): a shared block's later calls share it
    small.rebuilt_blocks = {call: found for call, found in rebuilt.items() if "#" not in call}
    small.rebuilt_model = again is not None
    small.kept_features = plan.kept_features
    small.kept_inputs = tuple(step.name for step in plan.steps if isinstance(step, steps.NewInput))
    small.folded_batchnorms = {
        builder.names[step.name]: builder.names[step.source]
        for step in plan.steps if isinstance(step, steps.Alias) and step.reason == steps.BATCHNORM
    }
    small.pruning_report = plan.report
    small.pruning_plan = plan
    return small


def _apply_steps(plan, model, replace=None):
    """``(new model, builder)``: the steps of ``plan`` applied; the calls of blocks in ``replace`` (``{call: new
    layer}``) made by calling the new layer on the block's operands once they are final, its own steps skipped."""
    builder = _Builder(plan, model, replace)
    blocks = plan.analysis.graph.blocks
    pending = dict(replace or {})
    last = {step.name: i for i, step in enumerate(plan.steps)}  # a merge's constants are folded by a second step

    def made_by(name, sides):
        """The index of the last step ``name`` needs (an operand computed again: what it reads; a side output:
        its node)."""
        if name in sides:
            return max((made_by(read, {}) for read in sides[name].reads()), default=-1)
        return last[name] if name in last else last[node_of(name)]

    for i, step in enumerate(plan.steps):
        if not any(step.name.startswith(f"{call}/") for call in replace or ()):
            getattr(builder, step.kind)(step)
        for call in [call for call in pending
                     if all(made_by(p, dict(blocks[call].sides)) <= i for p in blocks[call].operands)]:
            builder.call_block(blocks[call], pending.pop(call))
    return builder.model(), builder


#: Why a block traced at probe sizes is pruned only as itself (see :func:`~keras_group_lasso.graph.build.fixed_sizes`).
_FIXED = ("a block whose call takes its input's length as a number (a causal mask, rotary positions) is pruned only "
          "as itself, built again from its config with the widths its layers kept")


def _rebuilt_blocks(builder, threshold):
    """``{call: Rebuilt}`` for the calls of blocks traced into the graph, outermost first: the block's class built
    again with the widths of its pruned layers, where that computes what they compute (see
    :mod:`keras_group_lasso.surgery.blocks`)."""
    graph_blocks = builder.graph.blocks
    for layer, new in builder.built:  # a Sequential's model holds copies: the layers the tensors came from, too
        if new:
            _set_weights(layer, new)
    found, by_layer, probes = {}, {}, {}
    depth = {call: sum(call.startswith(f"{other}/") for other in graph_blocks) for call in graph_blocks}
    for call in sorted(graph_blocks, key=depth.get):
        if any(call.startswith(f"{other}/") and found[other].layer is not None for other in found):
            continue  # inside a block built again
        block = graph_blocks[call]
        if id(block.layer) in by_layer:  # a shared block: decided at its first call
            found[call] = by_layer[id(block.layer)]
            continue
        found[call] = by_layer[id(block.layer)] = _rebuilt_block(builder, call, block, probes, threshold)
    return found


def _rebuilt_block(builder, call, block, probes, threshold):
    tensors = builder.operands(block)
    ends = [builder.tensors.get(name) for name in block.ends]
    if any(x is None for x in tensors + ends) or len({id(x) for x in tensors}) != len(tensors):
        return blocks_module.Rebuilt(None, {}, "an input or output of the block is dropped or repeated")
    made = {}
    for name, new in builder.made.items():
        if name.startswith(f"{call}/"):
            made[id(builder.layers[name])] = new
    values = {}
    for layer in builder.graph.layers.values():
        new = made.get(id(layer))
        if new is not None:
            for j, variable in enumerate(layer.weights):
                values[id(variable)] = keras.ops.convert_to_numpy(new.weights[j])
    if any(id(variable) not in values for variable in block.layer.weights):
        return blocks_module.Rebuilt(None, {}, "a weight of the block is not held by a pruned layer of it")
    weights = [values[id(variable)] for variable in block.layer.weights]
    rebuilt = blocks_module.rebuilt_block(block.layer, weights, tensors, _unique(block.layer.name, builder.taken),
                                          probes)
    if rebuilt.layer is None:
        return rebuilt
    if fixed_sizes(block.layer):
        reference = _thresholded_block(block, tensors, threshold)
        if reference is None:
            return blocks_module.Rebuilt(None, {}, "its inputs lost channels (it is compared with itself, "
                                                   "thresholded, on inputs of its own widths)")
    else:
        try:
            reference = keras.Model(tensors if len(tensors) > 1 else tensors[0], ends if len(ends) > 1 else ends[0])
        except Exception:  # noqa: BLE001 - its layers read more than the block's operands
            return blocks_module.Rebuilt(None, {}, "its pruned layers read more than the block's inputs")
    if not blocks_module.same_outputs(reference, block.layer, rebuilt.layer, tensors):
        return blocks_module.Rebuilt(None, {}, "built again with the new widths, it computes something else")
    return rebuilt


def _rebuilt_model(model, small, rebuilt):
    """``model``'s own class again (a KerasHub Backbone or Task: a functional model whose config holds its
    constructor's arguments; for the penalised copy ``add_group_sparsity`` made of one, the class it copied), from
    its config with the widths every block changed alike, holding the weights of ``small``;
    ``None`` unless every block was built again with the same changes, the weights match ``small``'s by path and
    shape, and it computes what ``small`` computes (random inputs, 1e-5 of the output scale)."""
    if type(model).__module__.split(".")[0] == "keras" or not rebuilt:
        return None  # a model of Keras's own classes: the functional result is that already
    changes = [found.changed for found in rebuilt.values()]
    if any(found.layer is None for found in rebuilt.values()) or any(c != changes[0] for c in changes):
        return None
    # the class and config of the model that add_group_sparsity copied (a KerasHub Task whose penalised copy is a
    # GroupSparseModel; made again through Keras's deserialization, in safe mode, as a file's), else the model's own
    source = getattr(model, "source_model", None)
    try:
        config = copy.deepcopy(model.get_config()) if source is None else source.get("config")
    except Exception:  # noqa: BLE001 - a model whose config cannot be written
        return None
    if not isinstance(config, dict):
        return None
    widths = config
    backbone = config.get("backbone")
    if not all(key in config for key in changes[0]) and isinstance(backbone, dict) and isinstance(
            backbone.get("config"), dict):
        widths = backbone["config"]  # a Task (a CausalLM around its Backbone): the widths are its Backbone's
    if not changes[0] or any(widths.get(key) != old for key, (old, _) in changes[0].items()):
        return None
    widths.update({key: new for key, (_, new) in changes[0].items()})
    # a Task's preprocessor writes no vocabulary in its config (KerasHub keeps it as an asset): the same object
    # goes with the new Task
    preprocessor = getattr(model, "preprocessor", None) if "preprocessor" in config else None
    lost = isinstance(config.get("preprocessor"), dict) and preprocessor is None
    if "preprocessor" in config:
        config["preprocessor"] = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = type(model).from_config(config) if source is None else keras.saving.deserialize_keras_object(
                source)
            if preprocessor is not None:
                again.preprocessor = preprocessor
        values = _weights_by_path(again, small, model) or _weights_in_order(again, small)
        if values is None or any(tuple(v.shape) != tuple(w.shape) for v, w in zip(again.weights, values)):
            return None  # a layer was added (a feature selection, a folded constant) or removed
        again.set_weights([keras.ops.convert_to_numpy(w) for w in values])
    except Exception:  # noqa: BLE001 - a config its class refuses
        return None
    if not blocks_module.same_outputs(small, None, again, None):
        return None
    if lost:
        warnings.warn(
            f"prune_model: {type(again).__name__} is built again without the preprocessor its config names: the "
            f"model given holds none (a penalised copy loaded from a file or cloned does not keep it); give it back "
            "with `model.preprocessor = task.preprocessor` before prune_model, or set it on the result.",
            UserWarning,
            stacklevel=3,
        )
    return again


def _weights_in_order(model, small):
    """The weights of ``small`` in order, where the k-th of ``model`` and of ``small`` have paths that agree but
    for Keras's numbering of the layers it names (KerasHub T5's blocks hold unnamed normalizations,
    ``t5_layer_norm_88`` in one model and ``t5_layer_norm_206`` in the other, and two position tables of one path);
    ``None`` otherwise."""
    def unnumbered(path):
        return re.sub(r"_\d+(?=/|$)", "", path)

    def agree(a, b):  # also after the name of the nested model that held it (see _weights_by_path)
        return unnumbered(a.path) == unnumbered(b.path) or unnumbered(b.path).endswith(f"_{unnumbered(a.path)}")

    if len(model.weights) != len(small.weights) or not all(map(agree, model.weights, small.weights)):
        return None
    return list(small.weights)


def _weights_by_path(model, small, original=None):
    """The variables of ``small`` for the weights of ``model``, in order: the one of the same path, or of that
    path after the name of the nested model that held it (``gemma_backbone_token_embedding/embeddings`` for a
    Task's Backbone's ``token_embedding/embeddings``); ``None`` unless that pairs every weight of both once.

    With ``original`` (the model that was pruned), a weight of ``model`` that ``small`` lacks is the original's of
    that path: a layer no output reads, which surgery leaves out (a ``BertMaskedLM``'s Backbone's pooler)."""
    found, used = [], set()
    for variable in model.weights:
        candidates = _same_path(variable, small.weights)
        if not candidates and original is not None:
            unread = _same_path(variable, original.weights)
            if len(unread) == 1:
                found.append(unread[0])
                continue
        if len(candidates) != 1 or id(candidates[0]) in used:
            return None
        found.append(candidates[0])
        used.add(id(candidates[0]))
    return found if len(used) == len(small.weights) else None


def _same_path(variable, weights):
    same = [v for v in weights if v.path == variable.path]
    return same or [v for v in weights if v.path.endswith(f"_{variable.path}")]


def _thresholded_block(block, tensors, threshold):
    """A model calling a copy of the traced ``block``'s layer (from its config) with its weights thresholded as
    ``prune_model`` thresholds them, on operands shaped as ``tensors``; ``None`` where those are not the widths
    the block was built on."""
    layer = block.layer
    operands = block_operands(layer)  # as traced: at the probe sizes where a size was unknown
    if len(operands) != len(tensors) or any(
            len(x.shape) != len(y.shape) or (x.shape[-1] is not None and x.shape[-1] != y.shape[-1])
            for x, y in zip(tensors, operands)):
        return None
    shapes, dtypes = [tuple(x.shape) for x in tensors], [x.dtype for x in tensors]
    copy = blocks_module.built_block(layer, registry.layer_config(layer), shapes, dtypes)
    if copy is None:
        return None
    cut = _thresholded_ids(layer)
    copy.set_weights([threshold_array(keras.ops.convert_to_numpy(v), threshold) if id(v) in cut
                      else keras.ops.convert_to_numpy(v) for v in layer.weights])
    inputs = [keras.Input(batch_shape=shape, dtype=dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
    args, kwargs = block_arguments(layer, inputs)
    outputs = block_outputs(layer, copy(*args, **kwargs))
    return keras.Model(inputs if len(inputs) > 1 else inputs[0], outputs if len(outputs) > 1 else outputs[0])


def _thresholded_ids(layer):
    """The ``id``s of the variables inside ``layer`` that ``prune_model`` thresholds: those of the thresholded layers
    its graph reads, inside the blocks it traces into; not those inside a layer it keeps as it is (one kept whole,
    whose sublayers it never reads)."""
    cut = set()
    for sub in layer._flatten_layers(include_self=False, recursive=False):  # noqa: SLF001 - Keras's own walk
        rule = registry.rule_of(sub)
        if rule is None:
            cut |= _thresholded_ids(sub)
        elif rule.thresholded:
            cut |= {id(v) for v in rule.thresholded_variables(sub)}
    return cut


class _Builder:
    """Applies the steps of a :class:`PruningPlan`: one method per kind of step, each writes one tensor."""

    def __init__(self, plan, model, replace=None):
        result = plan.analysis
        graph = result.graph
        # A Sequential stays one unless a block traced into it merges tensors (a residual block): then functional.
        chain = not any(node.kind in (Kind.MERGE, Kind.CONCAT) for node in graph.nodes)
        self.model_name, self.dtype = model.name, model.inputs[0].dtype
        # ... and a block built again (whose own build may not build its layers, as keras.io writes blocks) is
        # called on a tensor, so that its layers are built: functional too
        self.sequential = graph.sequential and chain and not replace
        self.input_named = not graph.sequential  # a Sequential's input node is "<input>", not a name to keep
        # Named inputs and outputs (dicts) stay named: the new model takes and returns the same structures.
        self.structures = (None, None) if graph.sequential else (model.input, model.output)
        self.graph = graph
        self.layers, self.node, self.outputs = graph.layers, graph.node, graph.outputs
        self.weights = _folded(result)
        input_names = [found.name for found in graph.inputs]
        reserved = tuple(name for name in input_names if not graph.sequential)
        self.names = _flat_names([node.name for node in graph.nodes if node.name not in input_names],
                                 reserved=reserved)
        self.taken = {*self.names.values(), *reserved}
        self.options = _call_options(model)
        self.side = graph.side_tensors
        self.tensors = {}  # tensor name -> the new model's tensor (None: it has none)
        self.side_made = {}  # name of a side tensor's step -> its tensor in the new model
        self.inputs = []
        self.built = []  # (new layer, weights), in call order
        self.initializers = {}  # id(new layer) -> the user's initializers, put back once it is built
        self.made = {}  # node name -> its new layer (the later calls of a shared layer call it again)
        self.blocks = {}  # id(block built again) -> its copy in this model

    def new_input(self, step):
        inp = keras.Input(shape=step.shape, dtype=step.dtype, name=step.name if self.input_named else None)
        self.tensors[step.name] = inp
        self.inputs.append(inp)

    def new_constant(self, step):
        value = np.asarray(self.layers[step.name].value)[..., np.asarray(step.entries, dtype=np.intp)]
        self.tensors[step.name] = _constant_tensor(value.reshape((1,) * step.lead + value.shape), self.inputs[0])

    def drop(self, step):
        self.tensors[step.name] = None

    def alias(self, step):
        self.tensors[step.name] = self.tensors[step.source]

    def select_units(self, step):
        layer, w = _selection(np.asarray(step.kept, dtype=np.intp), step.width, self.layers[step.reader], self.taken)
        self.tensors[step.name] = self.call(layer, w, self.tensors[step.source])

    def slice_units(self, step):
        layer = self.layers[step.name]
        units = np.asarray(step.units, dtype=np.intp)
        rule, rows = registry.units_rule(layer), np.asarray(step.rows, dtype=np.intp)
        config, new = rule.slice_units(layer, self.weights[step.name], self.node(step.name).in_units, rows, units)
        if rule.checks_copies:
            _check_copy(step.name, layer, self.weights[step.name], self.node(step.name).in_units, rows, units,
                        (config, new), self.tensors[step.source])
        if step.batchnorm is not None:
            config, new = _merge_batchnorm(config, new, self.layers[step.batchnorm], units)
        self.make(step, config, new)

    def slice_per_unit(self, step):
        layer = self.layers[step.name]
        if step.entries is None:
            # a keras.ops operation (a pad) has a config and no weights
            config, new = registry.layer_config(layer), (layer.get_weights() if hasattr(layer, "get_weights") else [])
        else:
            config, new = registry.rule_of(layer).slice(layer, np.asarray(step.entries, dtype=np.intp))
        if step.threshold is not None:  # a DepthwiseConv
            new = [threshold_array(w, step.threshold) for w in new]
        self.make(step, config, new, [self.tensors[name] for name in (step.source, *step.operands)])

    def slice_channels(self, step):
        self.tensors[step.name] = self.tensors[step.source][..., step.start : step.stop]

    def merge(self, step):
        layer = self.layers[step.name]
        config = dict(registry.layer_config(layer), name=self.names[step.name])
        new_layer, new = _new_layer(layer, config, layer.get_weights(), self.initializers)
        self.tensors[step.name] = self.call(new_layer, new, [self.tensors[name] for name in step.operands])

    concat = merge

    def fold_constants(self, step):
        name = self.names[step.name]
        if step.separate:
            name = _unique(f"{name}_constants", self.taken)
        layer = _constant_operands(self.layers[step.name], step.scale, step.offset, name)
        self.tensors[step.name] = self.call(layer, [], self.tensors[step.source])

    def call_shared(self, step):
        rule = registry.rule_of(self.layers[step.name])
        self.tensors[step.name] = rule.call(self.made[step.layer], self.tensors[step.source],
                                            self.call_options(step.name))

    def call_block(self, block, layer):
        """Call ``layer`` (the block's class built again) on the block's operands; its outputs are the tensors of
        the block's ends."""
        args, kwargs = block_arguments(block.layer, self.operands(block))
        new = self.blocks.get(id(layer))
        if new is None:  # a fresh copy: the checked one was also called on inputs of its own
            new = self.blocks[id(layer)] = registry.layer_from_config(layer, registry.layer_config(layer))
            self.taken.add(new.name)
            with blocks_module.zero_initializers(new):
                outputs = block_outputs(block.layer, new(*args, **kwargs))
            self.built.append((new, layer.get_weights()))
            new.set_weights(layer.get_weights())
        else:
            outputs = block_outputs(block.layer, new(*args, **kwargs))
        for end, tensor in zip(block.ends, outputs, strict=True):
            self.tensors[end] = tensor

    def operands(self, block):
        """The new model's tensors of the operands of ``block`` (a :class:`BlockCall`), ``None`` for one it has
        not; an operand the graph dropped (read by the block's side tensors alone) computed again."""
        sides = dict(block.sides)
        return [self.side_tensor(sides[name]) if name in sides else self.tensors.get(name)
                for name in block.operands]

    def call_options(self, name):
        """The keyword arguments node ``name`` is called with: its options, and its side tensors (an attention
        mask) computed again from the new model's inputs."""
        options = dict(self.options.get(name) or {})
        for key, side in self.side.get(name, {}).items():
            options[key] = self.side_tensor(side)
        return options or None

    def side_tensor(self, side):
        """The new model's tensor of ``side`` (a :class:`SideTensor`), each of its steps computed once (a block
        built again is given the very tensors its pruned layers read)."""
        made = self.side_made
        for name, operation, reads in side.steps:
            if name not in made:
                made[name] = _call_again(operation, [made[p] if p in made else self.tensors[p] for p in reads])
        return made[side.end] if side.end in made else self.tensors[side.end]

    def make(self, step, config, new, operands=None):
        """Build the new layer of node ``step.name`` from ``(config, weights)`` and call it on ``step.source`` (or
        on the list ``operands``, when it reads several tensors)."""
        layer = self.layers[step.name]
        config["name"] = self.names[self.graph.layer_name(step.name)]  # a shared layer: its first call's name
        _drop_package_penalties(layer, config)
        tied = {}
        for attribute, shared in registry.rule_of(layer).shared_sublayers(layer).items():
            made = self.counterpart(shared)
            if made is not None:  # the new model's layer, tied as the original was (not a copy from the config)
                tied[attribute] = made
                config[attribute] = None
                new = self._tied_weights(layer, new, shared, made)
        new_layer, new = _new_layer(layer, config, new, self.initializers)
        for attribute, made in tied.items():
            setattr(new_layer, attribute, made)
        self.made[step.name] = new_layer
        x = operands if operands is not None and len(operands) > 1 else self.tensors[step.source]
        made = self.call(new_layer, new, x, step.name)
        if getattr(registry.rule_of(layer), "side_outputs", False) and isinstance(made, (tuple, list)):
            # outputs that carry no units (T5's position bias): side tensors of later calls, by their names
            made, *sides = made
            self.tensors.update({output_of(step.name, k): side for k, side in enumerate(sides, 1)})
        self.tensors[step.name] = made

    def _tied_weights(self, layer, weights, shared, made):
        """``weights`` (of ``layer``, in its order) with the entries of its sublayer ``shared`` replaced by those the
        new layer ``made`` gets (sliced, thresholded), so that setting ``layer``'s weights does not write the
        original's values back into the table both now hold."""
        own = next((values for built, values in self.built if built is made), None)
        places = [k for k, variable in enumerate(layer.weights) if any(variable is v for v in shared.weights)]
        if own is None or len(places) != len(own):
            return weights
        weights = list(weights)
        for k, value in zip(places, own):
            weights[k] = value
        return weights

    def counterpart(self, old):
        """The new model's layer for ``old``, a layer of the model being pruned that is a node of its graph; ``None``
        when the new model made none for it (a layer inside a block built again: a plain Keras file cannot load a
        layer that two other layers hold, so a layer tied to it there gets a copy of its own)."""
        return next((self.made[name] for name, layer in self.layers.items() if layer is old and name in self.made),
                    None)

    def call(self, layer, weights, x, name=None):
        """Call the new ``layer`` on ``x`` as node ``name`` called its original (the original's rule: a layer
        recognized by what it computes is recognized on the original, which has been called)."""
        self.built.append((layer, weights))
        if name is None:
            return layer(x)
        rule = registry.rule_of(self.layers[name])
        return rule.call(layer, x, self.call_options(name)) if rule is not None else layer(x)

    def model(self):
        """The new model, its weights set."""
        built = self.built
        if self.sequential:
            # Fresh layers: those above were called on a functional input already.
            fresh = []
            for layer, new in built:
                clone = registry.layer_from_config(layer, registry.layer_config(layer))
                if id(layer) in self.initializers:
                    self.initializers[id(clone)] = self.initializers.pop(id(layer))
                fresh.append((clone, new))
            built = fresh
            shape = tuple(self.inputs[0].shape[1:])
            small = keras.Sequential([keras.Input(shape=shape, dtype=self.dtype)] + [layer for layer, _ in built],
                                     name=self.model_name)
        else:
            outputs = [self.tensors[name] for name in self.outputs]
            small = keras.Model(_structured(self.inputs, self.structures[0]),
                                _structured(outputs, self.structures[1]), name=self.model_name)
        for layer, new in built:
            if new:
                _set_weights(layer, new)
            _restore_initializers(layer, self.initializers)
        return small


def _call_again(operation, tensors):
    """A new copy of the keras.ops ``operation`` called as it was, on ``tensors`` in place of the tensors it
    read (in the order the graph lists them)."""
    arguments = operation._inbound_nodes[0].arguments  # noqa: SLF001 - the call Keras recorded
    given = iter(tensors)

    def swap(value):
        if isinstance(value, keras.KerasTensor):
            return next(given)
        if isinstance(value, dict):
            return {key: swap(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(swap(item) for item in value)
        return value

    args, kwargs = swap(list(arguments.args)), swap(dict(arguments.kwargs))
    try:  # a name of its own: a block called several times computes its mask once per call
        config = {key: value for key, value in operation.get_config().items() if key != "name"}
        operation = type(operation).from_config(config)
    except Exception:  # noqa: BLE001 - an operation that does not rebuild from its config: called again itself
        pass
    return operation(*args, **kwargs)


def _constant_tensor(value, anchor):
    """A tensor of the new model that holds ``value`` whatever the input: ``zeros_like(sum(anchor)) + value``.

    The layers a constant feeds (a position ``Embedding``) stay layers of the
    new model, called on it, so it computes them itself and trains them
    further; the tensor is made from the model's input (``anchor``) so that
    it is part of the model's graph, by keras.ops operations that plain
    Keras saves and loads. ``zeros_like`` reads no value: an input holding
    NaN or infinity still gives ``value``.
    """
    dtype = keras.backend.standardize_dtype(value.dtype)
    zero = keras.ops.zeros_like(keras.ops.sum(anchor), dtype=dtype)
    return keras.ops.logical_or(zero, value) if dtype == "bool" else keras.ops.add(zero, value)  # a boolean mask


def _structured(tensors, structure):
    """``tensors`` (flat, in ``keras.tree`` order) packed as ``structure`` when it is a dict of as many; else
    the one tensor or the list."""
    if isinstance(structure, dict) and len(keras.tree.flatten(structure)) == len(tensors):
        return keras.tree.pack_sequence_as(structure, tensors)
    return tensors[0] if len(tensors) == 1 else tensors


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


def _constant_operands(merge, scale, offset, name):
    """A ``Rescaling`` that puts back what the dropped constant operands of ``merge`` added (kept channels only).

    ``scale * x + offset`` per channel (of a
    :class:`~keras_group_lasso.graph.masks.MergeFold`; a plain Keras layer:
    the pruned model still loads without this package).
    """
    dtype = merge.dtype_policy.name if hasattr(merge, "dtype_policy") else None
    cast = np.dtype(merge.compute_dtype if hasattr(merge, "compute_dtype") else "float32")
    return keras.layers.Rescaling(
        scale=[float(v) for v in np.asarray(scale, dtype=np.float64).astype(cast)],
        offset=[float(v) for v in np.asarray(offset, dtype=np.float64).astype(cast)],
        name=name,
        dtype=dtype,
    )


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
        return registry.layer_from_config(layer, config), weights
    originals = {key: value for key, value in config.items() if key.endswith("_initializer") and value is not None}
    config = dict(config, **{key: "zeros" for key in originals})
    new = registry.layer_from_config(layer, config)
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


def _flat_names(nodes, reserved=()):
    """A layer name per node: the layer's own name, or ``<block>_<layer>`` where that clashes."""
    own = {node: node.rsplit("/", 1)[-1] for node in nodes}
    counts = collections.Counter(own.values())
    used = {name for name in reserved if name}
    names = {}
    for node in nodes:
        name = own[node] if counts[own[node]] == 1 and own[node] not in used else node.replace("/", "_")
        names[node] = _unique(name, used)
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
        configs = graph_config(model)["layers"]
    except Exception:  # noqa: BLE001 - a model without a readable graph
        return found
    for layer_config in configs:
        name = layer_config["name"]
        nodes = layer_config.get("inbound_nodes") or []
        for index, node in enumerate(nodes):
            kwargs = node.get("kwargs", {}) if isinstance(node, dict) else {}
            plain = {key: value for key, value in kwargs.items()
                     if key not in ("mask", "training") and isinstance(value, (bool, int, float, str))}
            if plain:
                found[f"{prefix}{name}" + (f"#{index}" if index else "")] = plain
        try:
            inner = model.get_layer(name)
        except ValueError:
            continue
        if not isinstance(inner, keras.Model) or not is_graph_model(inner):
            inner = traced_block(inner)  # a block traced into the graph: its layers' options (a causal mask)
        if isinstance(inner, keras.Model):
            # the graph names the layers of a block's call k > 0 "<block>#k/<layer>"
            for index in range(max(1, len(nodes))):
                found.update(_call_options(inner, f"{prefix}{name}" + (f"#{index}" if index else "") + "/"))
    return found


def _check_copy(name, layer, weights, in_units, rows, units, copy, source):
    """A layer declared by its kernels (``register_layer(cls, "units", ...)``): its copy keeping input units ``rows``
    and units ``units`` must compute what the layer computes with its thresholded ``weights`` on inputs that are 0
    off ``rows`` (random, shaped as ``source``, the copy's input), to 1e-5 of the output's scale; else
    :class:`UnsupportedModelError`."""
    rule = registry.units_rule(layer)
    if len(rows) == in_units and len(units) == rule.out_units(layer):
        return  # the copy keeps every row and unit: it is the layer
    every = rule.slice_units(layer, weights, in_units, np.arange(in_units), np.arange(rule.out_units(layer)))
    x = blocks_module.random_values(tuple(source.shape), source.dtype, np.random.default_rng(0))
    whole = np.zeros(x.shape[:-1] + (in_units,), dtype=x.dtype)
    whole[..., rows] = x
    outputs = []
    for (config, values), inputs in ((every, whole), (copy, x)):
        config = dict(config)
        _drop_package_penalties(layer, config)
        made = type(layer).from_config(config)
        made(inputs, training=False)
        registry.rule_of(layer).set_weights(made, values)
        outputs.append(np.asarray(keras.ops.convert_to_numpy(made(inputs, training=False)), np.float64))
    want, got = outputs[0][..., units], outputs[1]
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    tolerance = 1e-5 if keras.backend.standardize_dtype(layer.compute_dtype) in ("float32", "float64") else 1e-2
    if want.shape != got.shape or not np.allclose(want, got, rtol=0.0, atol=tolerance * scale):
        gap = f"{float(np.max(np.abs(want - got))):.3g}" if want.shape == got.shape else "shapes differ"
        raise planning.UnsupportedModelError(
            "prune_model", name, type(layer).__name__,
            f"declared with register_layer(..., \"units\"), but its copy keeping {len(units)} of "
            f"{rule.out_units(layer)} units computes something else (largest difference {gap}): a kernel must "
            "enter its call only as x @ K, and unit j read only column j of each kernel and entry j of each bias")


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

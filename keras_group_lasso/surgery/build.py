"""Build the smaller model: threshold a copy of the weights, fold constant units, slice, rebuild."""

import collections

import keras
import numpy as np

from keras_group_lasso._validation import check_choice
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.masks import threshold_array
from keras_group_lasso.surgery import plan as planning

__all__ = ["prune_model"]

_INPUTS = ("original", "selected")


def prune_model(model, threshold=1e-3, inputs="original"):
    """A new, physically smaller model that computes what ``model`` computes after thresholding.

    On any input, ``prune_model(model, t)(x)`` equals the output of ``model``
    after :func:`~keras_group_lasso.apply_threshold` ``(model, t)`` (up to
    float rounding, inference mode), but ``model`` itself is never changed:
    the surgery works on numpy copies of its weights. It

    * sets every Dense weight with ``|w| <= threshold`` to 0 (in the copy),
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

    Output units are never removed. The result is a ``keras.Sequential`` when
    ``model`` is one, else a functional ``keras.Model``, uncompiled, with the
    attributes ``kept_features`` (tuple of input indices), ``pruning_report``
    (the :class:`~keras_group_lasso.SparsityReport` of ``model`` at
    ``threshold``) and ``pruning_plan`` (the :class:`PruningPlan`). Those
    attributes are not saved in a ``.keras`` file. The report and plan count
    parameters of the compact layers; with ``inputs="original"`` the first
    Dense may hold zero rows or be preceded by a selection layer (see
    ``inputs``).

    The result is built from Keras's own layers only, so it saves to a
    ``.keras`` file that plain Keras loads without this package: the
    penalties of this package (``GroupLasso``, ``InputGroupLasso``, ...) are
    not carried over (pass the result to
    :func:`~keras_group_lasso.add_group_sparsity` to train it further with
    them); other regularizers are kept. A nested Sequential or functional
    block is flattened into the chain: its layers keep their own names when
    those are unique in the result, else they are named ``<block>_<layer>``.

    Args:
        model: a built ``keras.Model`` (Sequential or functional) whose Dense
            layers form one chain; see :class:`UnsupportedModelError`.
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
            ``len(kept_features)`` values in the order of ``kept_features``.

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
    plan = planning.build_plan(owner, model, threshold)
    result = plan.analysis
    graph = result.graph
    layers = graph.layers
    weights = _folded(result)

    kept_features = np.asarray(plan.kept_features, dtype=int)
    layer_plans = {d.name: d for d in plan.dense}
    first = layer_plans[graph.first.name]
    # inputs="original": the dropped features either meet all-zero rows of the first Dense
    # (n * u multiply-adds) or are dropped by a 0/1 selection first (n * k + k * u).
    n, k, u = plan.n_features, len(kept_features), first.units_after
    select = (
        inputs == "original"
        and graph.flat_features
        and graph.first.positions == 1
        and k < n
        and k * (n + u) < n * u
    )
    sliced_features = inputs == "selected" and graph.flat_features
    names = _flat_names([step.name for step in plan.steps], reserved=(graph.input_name,))

    built = []  # (new layer, weights)
    initializers = {}  # id(new layer) -> the user's initializers, put back once it is built
    for step in plan.steps:
        layer = layers[step.name]
        if step.kind == "head":
            if sliced_features and type(layer) is keras.layers.Flatten:
                continue
            if sliced_features:
                config, new = registry.slice_layer(layer, kept_features)
            else:
                config, new = layer.get_config(), layer.get_weights()
            if registry.is_thresholded(layer):  # a DepthwiseConv on the input
                new = [threshold_array(w, plan.threshold) for w in new]
        elif step.kind == "units":
            d = layer_plans[step.name]
            node = graph.node(step.name)
            rows = d.kept_inputs
            if d is first and not sliced_features and not select:
                rows = tuple(range(d.inputs_before))
            if d is first and select:
                # Right before the first Dense, after the input preprocessing: that Dense
                # rounds its inputs as the selection does (e.g. TF32 matmuls on a GPU).
                built.append(_selection(kept_features, n, layer, {*names.values(), graph.input_name}))
            config, new = registry.slice_units(layer, weights[step.name], node.in_units, rows, d.kept_units)
        elif step.kind == "unit":
            config, new = registry.slice_layer(layer, layer_plans[step.dense].kept_units)
            if registry.is_thresholded(layer):
                new = [threshold_array(w, plan.threshold) for w in new]
        else:  # tail: after the output layer, whose units all stay
            config, new = layer.get_config(), layer.get_weights()
            if registry.is_thresholded(layer):
                new = [threshold_array(w, plan.threshold) for w in new]
        config["name"] = names[step.name]
        _drop_package_penalties(layer, config)
        built.append(_new_layer(layer, config, new, initializers))

    source = model.inputs[0]
    shape = (len(kept_features),) if sliced_features else tuple(plan.input_shape)
    if graph.sequential:
        inp = keras.Input(shape=shape, dtype=source.dtype)
        small = keras.Sequential([inp] + [layer for layer, _ in built], name=model.name)
    else:
        inp = keras.Input(shape=shape, dtype=source.dtype, name=graph.input_name)
        x = inp
        for layer, _ in built:
            x = layer(x)
        small = keras.Model(inp, x, name=model.name)
    for layer, new in built:
        if new:
            _set_weights(layer, new)
        _restore_initializers(layer, initializers)

    small.kept_features = plan.kept_features
    small.pruning_report = plan.report
    small.pruning_plan = plan
    return small


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
        if hasattr(layer, key):
            setattr(layer, key, keras.initializers.get(value))


def _set_weights(layer, weights):
    if type(layer) is keras.layers.Normalization:
        # set_weights leaves Normalization's cached mean and variance at their initial
        # values; loading its variables (the saving API) also recomputes them.
        layer.load_own_variables({str(i): w for i, w in enumerate(weights)})
    else:
        layer.set_weights(weights)


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


def _selection(kept_features, n_features, first, taken):
    """``(layer, weights)``: a frozen bias-free Dense whose 0/1 kernel picks the kept features, in order.

    Built-in Keras (loads anywhere, exports to SavedModel and TFLite as a
    matmul) and exact for finite inputs; it computes in the first Dense's
    dtype policy, so the kept values reach that Dense rounded as before.
    """
    kernel = np.zeros((n_features, len(kept_features)), dtype="float32")
    kernel[kept_features, np.arange(len(kept_features))] = 1.0
    name = _unique("select_features", set(taken))
    layer = keras.layers.Dense(
        len(kept_features), use_bias=False, trainable=False, name=name, dtype=first.dtype_policy,
        kernel_initializer="zeros",  # its 0/1 kernel is set right after; no random draw
    )
    return layer, [kernel]


def _drop_package_penalties(layer, config):
    """Leave out this package's regularizers, so that plain Keras loads the saved result."""
    for key in config:
        if key.endswith("_regularizer"):
            value = getattr(layer, key, None)
            if value is not None and type(value).__module__.split(".")[0] == __name__.split(".")[0]:
                config[key] = None

"""Build the smaller model: threshold a copy of the weights, fold constant units, slice, rebuild."""

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import check_choice
from keras_group_lasso.surgery import plan as planning
from keras_group_lasso.surgery.layers import SelectFeatures
from keras_group_lasso.surgery.slicers import slice_dense, slice_layer

__all__ = ["prune_model"]

_INPUTS = ("original", "selected")

# With inputs="original", gather the kept features (SelectFeatures) only when fewer than
# 1 / GATHER_BELOW of them survive; otherwise keep zero rows in the first Dense. Measured on
# CPU (1024 x 784 inputs, 45 units): gather + matmul was slower than the full matmul for
# 582 and 200 kept features and faster for 50, on TensorFlow and JAX.
GATHER_BELOW = 8


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
      moving mean and variance; PReLU's alpha) and copies the others, keeping
      names, activations, dtype policies, ``use_bias`` and regularizers.

    Output units are never removed. The result is a ``keras.Sequential`` when
    ``model`` is one, else a functional ``keras.Model``, uncompiled, with the
    attributes ``kept_features`` (tuple of input indices), ``pruning_report``
    (the :class:`~keras_group_lasso.SparsityReport` of ``model`` at
    ``threshold``) and ``pruning_plan`` (the :class:`PruningPlan`). Those
    attributes are not saved in a ``.keras`` file. The report and plan count
    parameters of the compact layers; with ``inputs="original"`` and zero rows
    kept (see ``inputs``) the first Dense holds ``(n_features - kept) * units``
    more.

    Args:
        model: a built ``keras.Model`` (Sequential or functional) whose Dense
            layers form one chain; see :class:`UnsupportedModelError`.
        threshold: finite number >= 0 (default ``1e-3``, the paper's).
        inputs: ``"original"`` (default): the new model takes the original
            input (same shape), a drop-in replacement. Its first Dense keeps
            an all-zero row for each dropped feature (faster than a gather),
            unless fewer than 1/8 of the features survive: then a
            :class:`SelectFeatures` layer gathers them first. ``"selected"``:
            it takes only the kept features, a flat vector of
            ``len(kept_features)`` values in the order of ``kept_features``.

    Returns:
        The new ``keras.Model``.

    Raises:
        InvalidParameterError: for a bad ``threshold``, ``inputs`` or
            ``model``, or a threshold at which no input feature survives.
        UnsupportedModelError: the message names the first layer surgery
            cannot interpret, its class, and what is supported.

    Example:
        >>> small = prune_model(model, threshold=1e-3)
        >>> small.pruning_report.layer_sizes, small.count_params()
        >>> np.allclose(small(x), model_after_apply_threshold(x), atol=1e-5)
        True
    """
    owner = "prune_model"
    inputs = check_choice(owner, "inputs", inputs, _INPUTS)
    plan, _, kernels, biases = planning._plan(owner, model, threshold)
    structure = analysis._structure(model)
    layers = {layer.name: layer for layer in model.layers}
    kernels, biases = _threshold_and_fold(plan, structure, layers, kernels, biases)

    kept_features = np.asarray(plan.kept_features, dtype=int)
    dense_by_name = {d.name: d for d in plan.dense}
    first_dense = next(d.name for d in plan.dense if structure.prev[d.name] == "<input>")
    # inputs="original": a gather of the kept features costs more than the matmul rows it
    # saves unless few features survive, so by default the first Dense keeps an all-zero
    # row per dropped feature (exact: those rows are below the threshold in every kept unit).
    gather = (
        inputs == "original"
        and len(kept_features) < plan.n_features
        and len(kept_features) * GATHER_BELOW < plan.n_features
    )
    sliced_inputs = inputs == "selected" or gather
    select_after = -1  # index in the head after which the kept features are gathered
    head = [s for s in plan.steps if s.kind == "head"]
    for i, step in enumerate(head):
        if type(layers[step.name]).__name__ == "Flatten" and (analysis._input_rank(layers[step.name]) or 2) > 2:
            select_after = i

    built = []  # (new layer, weights)
    if gather and select_after < 0:
        built.append((_select_layer(plan, layers), []))
    head_index = 0
    for step in plan.steps:
        layer = layers[step.name]
        if step.kind == "head":
            position, head_index = head_index, head_index + 1
            is_flatten = type(layer).__name__ == "Flatten"
            if inputs == "selected" and is_flatten:
                continue
            if not sliced_inputs or (gather and position <= select_after):
                config, weights = layer.get_config(), layer.get_weights()
            else:
                config, weights = slice_layer(layer, kept_features)
            built.append((type(layer).from_config(config), weights))
            if gather and position == select_after:
                built.append((_select_layer(plan, layers), []))
        elif step.kind == "dense":
            d = dense_by_name[step.name]
            rows = d.kept_inputs
            if step.name == first_dense and not sliced_inputs:
                rows = tuple(range(d.inputs_before))
            config, weights = slice_dense(layer, kernels[step.name], biases[step.name], rows, d.kept_units)
            built.append((type(layer).from_config(config), weights))
        elif step.kind == "unit":
            config, weights = slice_layer(layer, dense_by_name[step.dense].kept_units)
            built.append((type(layer).from_config(config), weights))
        else:  # tail: after the output layer, whose units all stay
            built.append((type(layer).from_config(layer.get_config()), layer.get_weights()))

    source = model.inputs[0]
    shape = tuple(plan.input_shape) if inputs == "original" else (len(kept_features),)
    if structure.sequential:
        inp = keras.Input(shape=shape, dtype=source.dtype)
        small = keras.Sequential([inp] + [layer for layer, _ in built], name=model.name)
    else:
        inp = keras.Input(shape=shape, dtype=source.dtype, name=structure.input_name)
        x = inp
        for layer, _ in built:
            x = layer(x)
        small = keras.Model(inp, x, name=model.name)
    for layer, weights in built:
        if weights:
            layer.set_weights(weights)

    small.kept_features = plan.kept_features
    small.pruning_report = plan.report
    small.pruning_plan = plan
    return small


def _select_layer(plan, layers):
    name, k = "select_features", 0
    while name in layers:
        k += 1
        name = f"select_features_{k}"
    return SelectFeatures(plan.kept_features, name=name)


def _threshold_and_fold(plan, structure, layers, kernels, biases):
    """Thresholded kernels and biases, with constant units folded into the next bias.

    A constant unit ``j`` of a layer (no non-zero weight from a varying input)
    has pre-activation ``b_j`` (its bias after its own fold), so its output is
    ``c_j = tail(act(b_j))`` (the per-unit layers after it, in inference mode),
    and the next layer gets ``b' = b + c[folded] @ W[folded, :]``.
    """
    t = plan.threshold
    masks = plan.masks
    new_kernels, new_biases, fold_in = {}, {}, {}
    for name in structure.dense:
        kernel = kernels[name]
        new_kernels[name] = np.where(analysis.is_zero(kernel, t), np.zeros((), kernel.dtype), kernel)
        bias = biases[name]
        if bias is not None:
            bias = np.where(analysis.is_zero(bias, t), np.zeros((), bias.dtype), bias)
        new_biases[name] = bias
    for name in structure.dense:
        bias = new_biases[name]
        if name in fold_in:
            bias = (bias.astype("float64") + fold_in[name]).astype(bias.dtype)
            new_biases[name] = bias
        folded = np.asarray(masks.folded[name])
        if not folded.any():
            continue
        nxt = structure.next[name]
        layer = layers[name]
        pre = bias if bias is not None else np.zeros(kernels[name].shape[1], kernels[name].dtype)
        constants = _constant_outputs(layer, pre, [layers[n] for n in structure.between[name]])
        fold_in[nxt] = constants[folded].astype("float64") @ new_kernels[nxt][folded].astype("float64")
    return new_kernels, new_biases


def _constant_outputs(layer, pre_activation, between):
    x = keras.ops.convert_to_tensor(pre_activation[None, :])
    x = layer.activation(x)
    for per_unit in between:
        x = per_unit(x, training=False)
    return np.asarray(keras.ops.convert_to_numpy(x), dtype="float64")[0]

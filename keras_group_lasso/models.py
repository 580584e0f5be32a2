"""Attach group-sparse penalties to an existing model."""

import keras

from keras_group_lasso._validation import check_choice, check_non_negative, fail
from keras_group_lasso.regularizers import (
    GroupLasso,
    HiddenGroupLasso,
    InputGroupLasso,
    SparseGroupLasso,
)

__all__ = ["add_group_sparsity", "input_dense_layers"]

_PENALTIES = ("sgl", "group")


def input_dense_layers(model):
    """Names of the Dense layers that read the model input (no Dense layer before them).

    Their kernel rows are the paper's *input groups*: one per input feature.

    Raises:
        InvalidParameterError: ``model`` is not a built Sequential or
            Functional ``keras.Model``.
    """
    _check_graph_model("input_dense_layers", model)
    names = []
    for layer in model.layers:
        if not isinstance(layer, keras.layers.Dense):
            continue
        try:
            upstream = keras.Model(model.inputs, layer.input)
        except Exception as error:  # shared layers have no single `input`
            raise ValueError(
                f"input_dense_layers: cannot tell what feeds layer {layer.name!r} "
                f"({type(layer).__name__}): {error}"
            ) from error
        if not any(isinstance(l, keras.layers.Dense) for l in upstream.layers):
            names.append(layer.name)
    return names


def _check_graph_model(owner, model):
    # Sequential and Functional models have a graph of layers to copy; a
    # subclassed model's `call` is opaque Python.
    graph = isinstance(model, keras.Sequential) or any(
        cls.__name__ == "Functional" for cls in type(model).__mro__
    )
    if not graph:
        fail(owner, "model", "a Sequential or Functional keras.Model", model)
    try:
        model.inputs
    except (AttributeError, ValueError):
        fail(owner, "model", "a built model with a known input (start it with keras.Input)", model)
    if not model.inputs:
        fail(owner, "model", "a built model with a known input (start it with keras.Input)", model)


def add_group_sparsity(model, factor=1e-3, *, l1=None, input_factor=None, penalty="sgl", bias=True):
    """Return a copy of ``model`` with group-sparse penalties on every Dense layer.

    Dense layers that read the model input get :class:`InputGroupLasso`
    (feature selection); every other Dense kernel gets
    :class:`HiddenGroupLasso` (neuron pruning); biases get bias groups. With
    ``penalty="sgl"`` (default) each term also has ``l1 * sum |w|``, the sparse
    group Lasso of the paper. Existing kernel/bias regularizers of Dense
    layers are replaced; other layers are copied as they are. Weights are
    copied; the original model is not changed. The copy is not compiled.

    Args:
        model: a built Sequential or Functional ``keras.Model``.
        factor: group strength ``lambda`` (finite, >= 0).
        l1: elementwise strength for ``penalty="sgl"``; ``None`` uses
            ``factor`` (the paper's choice). Ignored by ``penalty="group"``.
        input_factor: group strength for the input groups; ``None`` uses
            ``factor``. Lets feature selection be stronger or weaker than
            neuron pruning.
        penalty: ``"sgl"`` (sparse group Lasso) or ``"group"`` (group Lasso).
        bias: also penalize the biases (the paper's bias groups).

    Returns:
        A new, uncompiled ``keras.Model`` of the same class with the same weights.

    Raises:
        InvalidParameterError: bad arguments, or a model that is not
            Sequential/Functional (subclassed models have no graph to copy).

    Example:
        >>> sparse = add_group_sparsity(model, 1e-3)
        >>> sparse.compile("adam", "sparse_categorical_crossentropy")
    """
    owner = "add_group_sparsity"
    factor = check_non_negative(owner, "factor", factor)
    input_factor = check_non_negative(owner, "input_factor", input_factor, allow_none=True)
    input_factor = factor if input_factor is None else input_factor
    penalty = check_choice(owner, "penalty", penalty, _PENALTIES)
    if penalty == "sgl":
        l1 = factor if l1 is None else check_non_negative(owner, "l1", l1)
    else:
        l1 = 0.0
    if not isinstance(bias, bool):
        fail(owner, "bias", "True or False", bias)
    _check_graph_model(owner, model)
    readers = set(input_dense_layers(model))
    input_l1 = l1 if penalty == "sgl" else 0.0

    def clone(layer):
        config = layer.get_config()
        if isinstance(layer, keras.layers.Dense):
            if layer.name in readers:
                config["kernel_regularizer"] = InputGroupLasso(input_factor, l1=input_l1)
            else:
                config["kernel_regularizer"] = HiddenGroupLasso(factor, l1=l1)
            if bias and layer.use_bias:
                config["bias_regularizer"] = (
                    SparseGroupLasso(factor, l1=l1) if penalty == "sgl" else GroupLasso(factor)
                )
        return type(layer).from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy

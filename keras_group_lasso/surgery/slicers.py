"""How to slice each layer type: one entry per class, ``(layer, kept) -> (config, weights)``.

``kept`` is the index array of the units that stay on the axis the layer acts
on (the last one), or of the input features that stay (indices into the
flattened input) for a layer before the first Dense. Every class that
:mod:`keras_group_lasso.analysis` sees through has an entry here, and nothing
else does.
"""

import keras
import numpy as np

__all__ = ["SLICERS", "slice_layer", "slice_dense"]


def _unchanged(layer, kept):
    """Layers without per-unit weights (Dropout, activations, Flatten): copy the config."""
    return layer.get_config(), []


def _per_unit_vectors(layer, kept):
    """Every weight is one value per unit (BatchNormalization's gamma, beta, moving mean and variance)."""
    return layer.get_config(), [w[..., kept] for w in layer.get_weights()]


def _prelu(layer, kept):
    """PReLU's alpha is per unit, or shared (shape 1) along ``shared_axes``."""
    weights = []
    for w in layer.get_weights():
        units = _units_of(layer)
        weights.append(w[..., kept] if units is not None and w.shape[-1] == units else w)
    return layer.get_config(), weights


def _per_element(values, shape):
    """``values`` broadcast as Keras broadcasts them against a ``(batch, *shape)`` input, flattened."""
    values = np.asarray(keras.ops.convert_to_numpy(values))
    return np.broadcast_to(values, (1,) + tuple(shape)).reshape(-1)


def _input_shape(layer):
    return tuple(int(d) for d in layer.input.shape[1:])


def _normalization(layer, kept):
    """Normalization's mean and variance, one value per element of its input, sliced to ``kept``.

    ``y = (x - mean) / max(sqrt(variance), eps)`` (or its inverse) with the
    statistics broadcast over the input, whatever ``axis`` was: the kept
    elements keep their own statistics, so the map is unchanged on them. The
    result normalizes a flat vector of ``len(kept)`` values (``axis=-1``).
    """
    shape = _input_shape(layer)
    weights = layer.get_weights()
    if weights:  # adapted or loaded: the statistics are variables over the kept axes
        mean, variance = (np.reshape(w, np.shape(layer.mean)) for w in weights[:2])
    else:  # given to the constructor
        mean, variance = layer.mean, layer.variance
    mean = _per_element(mean, shape)[kept]
    variance = _per_element(variance, shape)[kept]
    config = layer.get_config()
    config.update(axis=-1, mean=None, variance=None)
    return config, [mean, variance, np.zeros((), "int64")]


def _rescaling(layer, kept):
    """Rescaling ``y = x * scale + offset``: scalars stay, per-element scale / offset are sliced to ``kept``."""
    if np.ndim(layer.scale) == 0 and np.ndim(layer.offset) == 0:
        return layer.get_config(), []
    shape = _input_shape(layer)
    config = layer.get_config()
    config["scale"] = _per_element(layer.scale, shape)[kept].tolist()
    config["offset"] = _per_element(layer.offset, shape)[kept].tolist()
    return config, []


def _units_of(layer):
    try:
        return int(layer.input.shape[-1])
    except Exception:  # noqa: BLE001 - unknown: do not slice
        return None


SLICERS = {
    "Dropout": _unchanged,
    "GaussianDropout": _unchanged,
    "GaussianNoise": _unchanged,
    "AlphaDropout": _unchanged,
    "Identity": _unchanged,
    "Activation": _unchanged,
    "ReLU": _unchanged,
    "LeakyReLU": _unchanged,
    "ELU": _unchanged,
    "Softmax": _unchanged,
    "Flatten": _unchanged,
    "BatchNormalization": _per_unit_vectors,
    "PReLU": _prelu,
    "Normalization": _normalization,
    "Rescaling": _rescaling,
}


def slice_layer(layer, kept):
    """``(config, weights)`` of ``layer`` restricted to the units ``kept`` (an int array)."""
    return SLICERS[type(layer).__name__](layer, np.asarray(kept, dtype=int))


def slice_dense(layer, kernel, bias, kept_inputs, kept_units):
    """``(config, weights)`` of a Dense layer keeping rows ``kept_inputs`` and units ``kept_units``.

    ``kernel`` and ``bias`` are the (already thresholded and folded) numpy values.
    """
    rows = np.asarray(kept_inputs, dtype=int)
    cols = np.asarray(kept_units, dtype=int)
    config = layer.get_config()
    config["units"] = int(cols.size)
    weights = [np.ascontiguousarray(kernel[np.ix_(rows, cols)])]
    if bias is not None:
        weights.append(np.ascontiguousarray(bias[cols]))
    return config, weights

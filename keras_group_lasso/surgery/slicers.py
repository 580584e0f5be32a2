"""How to slice each layer type: one entry per class, ``(layer, kept) -> (config, weights)``.

``kept`` is the index array of the units that stay on the axis the layer acts
on (the last one). Every class that :mod:`keras_group_lasso.analysis` sees
through between Dense layers has an entry here, and nothing else does.
"""

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

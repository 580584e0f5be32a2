"""keras-group-lasso: group sparse regularization for Keras 3.

Penalties that drive whole units of a network to zero (Scardapane et al.,
"Group Sparse Regularization for Deep Neural Networks", 2017), tools to see
the sparsity, and surgery that rebuilds a physically smaller model.

Importing the package is cheap: the public names below are imported from
their modules on first use (PEP 562), so ``import keras_group_lasso`` and the
``keras-group-lasso`` command's ``--help`` need neither Keras, a backend nor
numpy. The package's Keras-serializable objects (regularizers, the
``Proximal`` optimizer, the models, ``SelectFeatures``, ``PenaltyState``) are
still registered with Keras as soon as Keras is there, so that
``keras.saving.load_model`` finds them after a plain ``import keras_group_lasso``,
whichever of the two is imported first (how and why: ``keras_group_lasso._registration``).
"""

import importlib
import importlib.util

from keras_group_lasso import _registration

__version__ = "0.1.0"

# Each public name and the module (relative to the package) that defines it.
_EXPORTS = {
    "InvalidParameterError": "_validation",
    "NonFiniteError": "_validation",
    "SparsityReport": "analysis",
    "apply_threshold": "analysis",
    "sparsity_report": "analysis",
    "SparsityBudget": "budget",
    "LatencyTable": "costs",
    "is_chief": "_distributed",
    "SparsityMonitor": "callbacks",
    "export_pruned": "export",
    "GroupSparseModel": "models",
    "GroupSparseSequential": "models",
    "add_group_sparsity": "models",
    "coupled_groups": "models",
    "set_penalty_multiplier": "models",
    "Proximal": "optimizers",
    "CoupledGroupLasso": "regularizers",
    "GroupLasso": "regularizers",
    "HiddenGroupLasso": "regularizers",
    "InputGroupLasso": "regularizers",
    "SparseGroupLasso": "regularizers",
    "UnsupportedModelError": "surgery",
    "plan_pruning": "surgery",
    "prune_model": "surgery",
}

__all__ = [
    "__version__",
    "InvalidParameterError",
    "NonFiniteError",
    "GroupLasso",
    "SparseGroupLasso",
    "InputGroupLasso",
    "HiddenGroupLasso",
    "CoupledGroupLasso",
    "add_group_sparsity",
    "GroupSparseModel",
    "GroupSparseSequential",
    "set_penalty_multiplier",
    "coupled_groups",
    "sparsity_report",
    "SparsityReport",
    "apply_threshold",
    "prune_model",
    "plan_pruning",
    "UnsupportedModelError",
    "SparsityMonitor",
    "is_chief",
    "SparsityBudget",
    "LatencyTable",
    "export_pruned",
    "Proximal",
]


def __getattr__(name):
    """Import a public name (or a submodule) of the package on first access."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        _registration.register_if_keras_is_loaded()
        return value
    # `keras_group_lasso.analysis` and the like, which the package's imports used to bind as a side effect.
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


_registration.watch()

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
``keras.saving.load_model`` finds them after a plain ``import keras_group_lasso``:

* Keras imported first: the package registers them when it is imported.
* The package imported first: they are registered right after Keras is
  imported (or, when a module of the package is what imports Keras, right
  after that module), by a finder on ``sys.meta_path`` that watches for
  ``keras`` and removes itself once they are registered.
"""

import importlib
import importlib.util
import sys
import warnings

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

# The modules that register objects with keras.saving.register_keras_serializable when imported.
_REGISTERING = ("declared", "regularizers", "optimizers", "models", "surgery.layers")

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
        _register_if_keras_is_loaded()
        return value
    # `keras_group_lasso.analysis` and the like, which the package's imports used to bind as a side effect.
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


# ----------------------------------------------------------------------------- registration with Keras

_registered = False
_keras_pending = False  # Keras was imported while a module of the package was being imported
_depth = 0  # how many modules of the package are being imported (nested), while the finder watches


def _register():
    """Import the modules that register the package's objects with Keras; once, and only with Keras there."""
    global _registered
    if _registered:
        return
    _registered = True
    _unwatch()
    try:
        for module in _REGISTERING:
            importlib.import_module(f"{__name__}.{module}")
    except BaseException:
        _registered = False
        raise


def _register_if_keras_is_loaded():
    """Register on first access to a public name, in case Keras came in without the finder seeing it."""
    if not _registered and _depth == 0 and "keras" in sys.modules:
        _register()


def _register_after_import():
    """Register from inside an import statement: a failure is a warning, so that the import itself succeeds.

    Accessing the public name that failed to import raises the error itself.
    """
    try:
        _register()
    except Exception as error:
        warnings.warn(
            f"keras_group_lasso could not register its objects with Keras ({type(error).__name__}: {error}); "
            ".keras files that hold them will not load",
            RuntimeWarning,
            stacklevel=2,
        )


class _Loader:
    """Runs a module's own loader, then registers the package's objects once Keras and the package are loaded.

    For ``keras``: registers right after Keras is imported, unless a module of the package is being
    imported (it may be the one importing Keras, and the registering modules may need it whole): then
    registration waits until that outermost import of the package ends.
    """

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        global _depth, _keras_pending
        # The module sees (and keeps) its own loader, as if this one were not there.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        if self._name == "keras":
            self._loader.exec_module(module)
            if _depth == 0:
                _register_after_import()
            else:
                _keras_pending = True
            return
        _depth += 1
        try:
            self._loader.exec_module(module)
        finally:
            _depth -= 1
        if _depth == 0 and _keras_pending:
            _register_after_import()

    def __getattr__(self, name):  # get_code, get_source, get_resource_reader, ... of the module's own loader
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


class _WatchKeras:
    """Finds ``keras`` and the package's modules with the other finders and wraps their loaders in _Loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" and not fullname.startswith(__name__ + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, fullname)
        return spec


_finder = None


def _unwatch():
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None


if "keras" in sys.modules:
    _register()
else:
    _finder = _WatchKeras()
    sys.meta_path.insert(0, _finder)

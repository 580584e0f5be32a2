"""Registering the package's Keras-serializable objects with Keras, whichever of the two is imported first.

``import keras_group_lasso`` imports no module of its own (its public names load on first use, PEP 562), so
that the import and the ``keras-group-lasso`` command's ``--help`` need neither Keras, a backend nor numpy.
The package's serializable objects (penalties, ``Proximal``, the models, ``SelectFeatures``,
``PenaltyState``) must still be known to Keras before a ``.keras`` file that holds them is loaded, even when
the user imported the package and Keras and touched no public name. This module makes that so:

* Keras imported first: the package registers them when it is imported (:func:`watch`).
* The package imported first: they are registered right after Keras is imported (or, when a module of the
  package is what imports Keras, right after that module), by a finder on ``sys.meta_path`` that watches for
  ``keras`` and removes itself once they are registered.

Why a finder: Python offers no other hook that runs code when another package is imported, and Keras has no
entry point through which add-ons register their objects.
"""

import importlib
import sys
import warnings

PACKAGE = "keras_group_lasso"

# The modules that register objects with keras.saving.register_keras_serializable when imported.
REGISTERING = ("declared", "regularizers", "optimizers", "models", "surgery.layers")

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
        for module in REGISTERING:
            importlib.import_module(f"{PACKAGE}.{module}")
    except BaseException:
        _registered = False
        raise


def register_if_keras_is_loaded():
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
        if fullname != "keras" and not fullname.startswith(PACKAGE + "."):
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


def watch():
    """Register now when Keras is loaded; otherwise as soon as it is (the package's ``__init__`` calls this)."""
    global _finder
    if "keras" in sys.modules:
        _register()
    elif _finder is None:
        _finder = _WatchKeras()
        sys.meta_path.insert(0, _finder)

"""Export a pruned model: SavedModel, ``.keras``, TFLite, ONNX, int8 TFLite and a kept-feature manifest.

:func:`export_pruned` runs :func:`keras_group_lasso.surgery.prune_model` and
writes into one directory::

    <directory>/
      saved_model/    TensorFlow SavedModel, signature ``serving_default``
      model.keras     the pruned Keras model
      model.tflite    TFLite flatbuffer (only with ``"tflite"`` in ``formats``)
      model.onnx      ONNX model, checked in ONNX Runtime (only with ``"onnx"``)
      model_int8.tflite  full-integer TFLite (only with ``"tflite-int8"``)
      manifest.json   kept features, layer sizes and parameter counts before/after, file sizes, checks

Everything is built in a hidden staging directory and renamed into place, one
whole artifact at a time, so no artifact is ever half-written under its final
name and a failure leaves nothing partial behind. Only these names, and
the staging directories, are ever written, replaced or removed: other files in
the directory are never touched. Directories and files get the permissions of ``os.makedirs`` and
``open`` under the current umask (the SavedModel's too, which TensorFlow
writes with modes of its own).

An export killed half-way (``kill -9``, a crash) cannot clean up: it leaves its
staging directory, ``.keras_group_lasso.partial-XXXXXXXX`` inside the export
directory (or ``.<name>.partial-XXXXXXXX`` next to a new one), and, when it was
killed while it replaced the artifacts, no ``manifest.json`` and the earlier
artifacts in that staging directory. The next export into the directory, before
anything else, finishes what the killed one could not, with a warning naming
the staging directory and what was done:

* killed before any artifact was taken aside, or after its ``manifest.json``
  came in (its export is complete): the staging directory is removed;
* killed while it replaced the artifacts: the artifacts it had put in place are
  taken out, the earlier ones are put back (``manifest.json`` last) and the
  staging directory is removed, so the directory holds the earlier export
  again, as after a failure;
* an earlier artifact whose name is taken again by another file stays in the
  staging directory, which is kept (with the earlier ``manifest.json``).

A staging directory that another export is writing (it holds a lock on it) is
left alone; where the file system has no locks, every one counts as left by a
killed export.

TensorFlow is imported only for the SavedModel, TFLite, int8 TFLite and ONNX formats; onnx, onnxruntime and
tf2onnx (the ``onnx`` extra) only for ONNX. The serving formats load and run with TensorFlow, TFLite or ONNX
Runtime alone; ``model.keras`` loads with plain Keras, without this package, where the pruned model is made of
Keras's own layers (``blocks="flatten"``), and where the classes of the blocks it holds are registered otherwise.
"""

import dataclasses
import functools
import importlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import warnings

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): every staging directory found counts as left behind
    fcntl = None

import keras
import numpy as np

from keras_group_lasso import __version__, surgery
from keras_group_lasso._distributed import is_chief
from keras_group_lasso._validation import Described, check_choice, check_non_negative, check_positive_int, fail
from keras_group_lasso.graph import registry

__all__ = ["export_pruned", "ExportResult", "FORMATS", "ARTIFACTS"]

_OWNER = "export_pruned"
FORMATS = ("saved_model", "keras", "tflite", "onnx", "tflite-int8")
_FILENAMES = {
    "saved_model": "saved_model",
    "keras": "model.keras",
    "tflite": "model.tflite",
    "onnx": "model.onnx",
    "tflite-int8": "model_int8.tflite",
    "manifest": "manifest.json",
}
# Formats TensorFlow writes (all but "keras"); those converted by TensorFlow-backend code only.
_SERVING = ("saved_model", "tflite", "onnx", "tflite-int8")
_CONVERTED = ("onnx", "tflite-int8")
ONNX_OPSET = 17
# The ONNX file passes when max|onnx - keras| <= ONNX_TOLERANCE * max(1, max|keras|) on the check inputs.
ONNX_TOLERANCE = 1e-4
# The int8 model's mean absolute error, as a fraction of the float outputs' scale (max |output|), above which
# export_pruned warns; and, for an output of several columns, the argmax agreement below which it warns.
INT8_MEAN_ERROR_WARNING = 0.05
INT8_ARGMAX_WARNING = 0.95
_CHECK_ROWS = 1024  # the ONNX file is checked on at most this many rows of the representative data
_EXTRA = 'pip install "keras-group-lasso[onnx]"'
# The only names export_pruned writes, replaces or removes in its directory.
ARTIFACTS = tuple(_FILENAMES.values())
# The staging directory inside an existing export directory; ``.<name>.partial-`` next to a new one.
_STAGING_PREFIX = ".keras_group_lasso.partial-"
_ASIDE = ".replaced"  # in the staging directory: the earlier artifacts while they are replaced
SIGNATURE = "serving_default"
INPUT_NAME = "features"
MANIFEST_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What :func:`export_pruned` wrote.

    On a process that is not the chief, the same result as on the chief,
    except ``replaced`` and ``removed``, which are empty: it writes nothing.

    Attributes:
        directory: absolute path of the export directory.
        paths: absolute path of each written artifact, keyed by format
            (``"saved_model"``, ``"keras"``, ``"tflite"``, ``"onnx"``, ``"tflite-int8"``) and ``"manifest"``.
        manifest: the content of ``manifest.json``.
        report: the :class:`~keras_group_lasso.analysis.SparsityReport` the
            pruning was based on (``str(report)`` is the before/after table).
        replaced: absolute paths of the artifacts that were already there and
            were replaced by new ones (only with ``overwrite=True``).
        removed: absolute paths of the artifacts of an earlier export, in a
            format not written this time, that were removed (only with
            ``overwrite=True``; the earlier ``manifest.json`` records them).
    """

    directory: str
    paths: dict
    manifest: dict
    report: object
    replaced: tuple = ()
    removed: tuple = ()


def _check_formats(formats):
    if isinstance(formats, str):
        formats = (formats,)
    constraint = "a non-empty sequence of distinct names from " + ", ".join(
        repr(f) for f in FORMATS
    )
    if not isinstance(formats, (list, tuple)):  # a set or dict would be read by its keys, in no fixed order
        fail(_OWNER, "formats", constraint, formats)
    items = tuple(formats)
    if (
        not items
        or any(not isinstance(f, str) or f not in FORMATS for f in items)
        or len(set(items)) != len(items)
    ):
        fail(_OWNER, "formats", constraint, formats)
    return items


def _missing_directories(path):
    """The folders of ``path`` that do not exist, the deepest first (what ``os.makedirs(path)`` makes)."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _check_directory(directory, overwrite, contents=True):
    """The absolute target; with ``contents``, also what is there now, after dealing with what killed exports
    left (only the writing process looks: on a shared file system the chief may already have written it)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        fail(_OWNER, "directory", "a non-empty path (str or os.PathLike)", directory)
    target = os.path.abspath(os.fspath(directory))
    if contents:
        if os.path.lexists(target) and (not os.path.isdir(target) or os.path.islink(target)):
            fail(_OWNER, "directory", "a directory path, not an existing file or link", directory)
        above = _missing_directories(target)[-1:] or [target]
        parent = os.path.dirname(above[0])  # the deepest folder of the path that exists: it must be one
        if parent and os.path.lexists(parent) and not os.path.isdir(parent):
            fail(_OWNER, "directory", "a path below folders only, not below a file",
                 Described(f"{os.fspath(directory)!r} ({parent!r} is a file)"))
        _recover(target)
        if os.path.lexists(target) and not overwrite:
            _refuse_an_earlier_export(target, directory)
    return target


def _artifacts_in(target):
    """The names of :data:`ARTIFACTS` that exist in ``target``, in that order."""
    return [name for name in ARTIFACTS if os.path.lexists(os.path.join(target, name))]


def _refuse_an_earlier_export(target, directory):
    found = _artifacts_in(target)
    if found:
        fail(
            _OWNER,
            "directory",
            "a directory without an earlier export (it holds "
            + ", ".join(repr(name) for name in found)
            + "; pass overwrite=True to replace them)",
            directory,
        )


def _recorded_artifacts(target):
    """The artifact names that the ``manifest.json`` of an export in ``target`` records as written."""
    try:
        with open(os.path.join(target, _FILENAMES["manifest"]), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return set()
    if not isinstance(manifest, dict) or manifest.get("package") != "keras-group-lasso":
        return set()
    formats = manifest.get("formats")
    if not isinstance(formats, dict):
        return set()
    # Only names this package writes, whatever the file says: nothing else is ever removed.
    names = {_FILENAMES[f] for f, name in formats.items() if f in FORMATS and name == _FILENAMES[f]}
    return names | {_FILENAMES["manifest"]}


def _lock(path):
    """Lock the directory ``path`` for this process: ``(descriptor, held_elsewhere)``.

    The descriptor holds an exclusive advisory lock until it is closed (by the process or by its
    death); it is None when another process holds the lock or the file system has no locks.
    """
    if fcntl is None:
        return None, False
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:  # not readable under this umask: it cannot be locked
        return None, False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        return None, isinstance(error, BlockingIOError)  # otherwise a file system without locks
    return fd, False


def _leftovers(target):
    """The staging directories of earlier exports into ``target`` still there: inside and next to it."""
    parent, base = os.path.split(target)
    found = []
    for folder, prefix in ((target, _STAGING_PREFIX), (parent, f".{base}.partial-")):
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # no such directory
            continue
        for name in names:
            path = os.path.join(folder, name)
            if (name.startswith(prefix) and re.fullmatch("[0-9a-f]{8}", name[len(prefix):])
                    and os.path.isdir(path) and not os.path.islink(path)):
                found.append(path)
    return found


def _recover(target):
    """Deal with the staging directories that killed exports into ``target`` left (see the module docstring)."""
    for leftover in _leftovers(target):
        fd, busy = _lock(leftover)
        if busy:  # another export is writing it
            continue
        try:
            _recover_from(target, leftover)
        finally:
            if fd is not None:
                os.close(fd)


def _names(names):
    return ", ".join(repr(name) for name in names)


def _recover_from(target, leftover):
    """Put back the earlier artifacts ``leftover``, a killed export's staging directory, holds, then remove it."""
    aside = os.path.join(leftover, _ASIDE)
    taken = os.listdir(aside) if os.path.dirname(leftover) == target and os.path.isdir(aside) else []
    taken = [name for name in ARTIFACTS if name in taken]
    manifest = _FILENAMES["manifest"]
    if not taken:
        shutil.rmtree(leftover)
        warnings.warn(f"{_OWNER}: removed {leftover!r}, the staging directory of an interrupted export; it held "
                      "only new artifacts that export had not put in place.", stacklevel=5)
        return
    if os.path.lexists(os.path.join(target, manifest)):
        # Its manifest.json came last: that export is complete and what it took aside was replaced.
        shutil.rmtree(leftover)
        warnings.warn(f"{_OWNER}: removed {leftover!r}, the staging directory of an interrupted export that had "
                      "put all its artifacts in place; it held only the earlier artifacts they replaced.",
                      stacklevel=5)
        return
    # Killed while it replaced the artifacts. Each artifact of the killed export that is in place came in
    # after the earlier one of its name went aside, or where there was none: its own manifest.json (still
    # staged, it comes last) records it, and no staged copy of it is left.
    written = _recorded_artifacts(leftover)
    taken_out = []
    for name in ARTIFACTS:
        here = os.path.join(target, name)
        if (name in taken or name in written) and os.path.lexists(here) \
                and not os.path.lexists(os.path.join(leftover, name)):
            os.rename(here, os.path.join(leftover, name))
            taken_out.append(name)
    put_back = []
    for name in ARTIFACTS:
        here = os.path.join(target, name)
        if name in taken and name != manifest and not os.path.lexists(here):
            os.rename(os.path.join(aside, name), here)
            put_back.append(name)
    stuck = [name for name in ARTIFACTS if name in os.listdir(aside)]
    if stuck == [manifest]:  # the earlier export is whole again
        os.rename(os.path.join(aside, manifest), os.path.join(target, manifest))
        put_back.append(manifest)
        stuck = []
    if stuck:
        blocking = [name for name in stuck if os.path.lexists(os.path.join(target, name))]
        warnings.warn(f"{_OWNER}: left {leftover!r} in place: it holds the earlier {_names(stuck)} of {target!r}, "
                      f"taken aside by an interrupted export, and {target!r} now holds another "
                      f"{_names(blocking)}; move back what you need by hand.", stacklevel=5)
        return
    shutil.rmtree(leftover)
    warnings.warn(f"{_OWNER}: an export into {target!r} was interrupted while it replaced the artifacts there; put "
                  f"back the earlier {_names(put_back)} from its staging directory {leftover!r}"
                  + (f", took out its new {_names(taken_out)}" if taken_out else "")
                  + ", and removed that staging directory.", stacklevel=5)


def _import_tensorflow(formats):
    try:
        import tensorflow as tf
    except ImportError as error:
        needs = " and ".join(repr(f) for f in formats if f != "keras")
        raise ImportError(
            f"{_OWNER}: the {needs} format needs TensorFlow installed "
            "(e.g. `pip install tensorflow-cpu`); formats=('keras',) works without it."
        ) from error
    return tf


def _input_signature(tf, model):
    """One float32 ``INPUT_NAME`` tensor; a model with several inputs takes a list of them, each in its
    own dtype and under its own name (a categorical column is an integer)."""
    def spec(tensor, name):
        shape = [None] + list(tensor.shape[1:])
        dtype = tf.float32 if name == INPUT_NAME else tf.as_dtype(keras.backend.standardize_dtype(tensor.dtype))
        return tf.TensorSpec(shape, dtype, name=name)

    if len(model.inputs) == 1:
        return [spec(model.inputs[0], INPUT_NAME)]
    return [[spec(tensor, tensor.name) for tensor in model.inputs]]


def _serving_model(small):
    """``small`` with its training-only layers replaced by ``Identity`` (the same outputs at inference),
    sharing its other layers, whatever its graph."""
    # Layers that are the identity at inference (Dropout, noise) are left out of the serving formats: on
    # JAX their random seed state would be exported as a uint32 variable, which TFLite cannot convert.
    def training_only(layer):
        return getattr(registry.rule_of(layer), "inference_identity", False)

    def serving_config(layer):
        rule = registry.rule_of(layer)
        return None if rule is None else rule.serving_config(layer)

    if not any(training_only(layer) or serving_config(layer) for layer in small.layers):
        return small
    rebuilt = []

    def clone(layer):
        if training_only(layer):
            return keras.layers.Identity(name=layer.name)
        config = serving_config(layer)
        if config is None:
            return layer
        new = type(layer).from_config(config)
        rebuilt.append((layer, new))
        return new

    serving = keras.models.clone_model(small, clone_function=clone)
    for layer, new in rebuilt:
        new.set_weights(layer.get_weights())
    return serving


def _output_structure(small):
    """``small.output`` (a tensor, a list or a dict of them), or ``None`` for a model never called (one output)."""
    try:
        return small.output
    except (AttributeError, ValueError):  # a Sequential built without a call has one output
        return None


def _serving_output_names(small):
    """The names the serving signature returns ``small``'s outputs under: a dict's keys, else ``output_<i>``."""
    outputs = _output_structure(small)
    if isinstance(outputs, dict):
        return sorted(outputs)
    return [f"output_{i}" for i in range(len(outputs) if isinstance(outputs, (list, tuple)) else 1)]


def _write_saved_model(tf, model, path):
    model.export(
        path,
        format="tf_saved_model",
        verbose=False,
        input_signature=_input_signature(tf, model),
    )


def _convert(converter, name):
    """``converter.convert()``; an error of the converter's own kind (``ConverterError``, not a built-in one that
    callers catch) comes back as a ``RuntimeError`` that names the file, with the converter's first lines."""
    try:
        return converter.convert()
    except (ValueError, TypeError, RuntimeError, OSError, ImportError):
        raise
    except Exception as error:  # noqa: BLE001 - TensorFlow Lite's ConverterError derives from Exception only
        lines = str(error).strip().splitlines()
        said = "\n".join(lines[:12]) + (f"\n... ({len(lines) - 12} more lines)" if len(lines) > 12 else "")
        raise RuntimeError(f"export_pruned: TensorFlow Lite could not convert the pruned model to {name} "
                           f"({type(error).__name__}): {said}") from error


def _write_tflite(tf, saved_model_path, path):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_path, [SIGNATURE])
    try:
        flatbuffer = _convert(converter, os.path.basename(path))
    except RuntimeError as error:
        said = str(error.__cause__ or error)  # the converter's whole message
        if "seed_generator_state" in said:
            raise ValueError(
                "export_pruned: TFLite cannot hold the random-seed state (uint32) that recurrent and attention "
                "layers keep for their dropout, which a SavedModel written from the JAX backend carries; "
                "export the TFLite file with KERAS_BACKEND=tensorflow (the .keras file loads there)"
            ) from error
        if "tensor list" not in said.lower():
            raise
        # A recurrent layer over sequences of unknown length (it cannot be unrolled for serving) loops with
        # TensorFlow's tensor lists, which TFLite's own ops cannot express: those ops stay TensorFlow ops.
        warnings.warn(
            "export_pruned: model.tflite keeps TensorFlow ops for its recurrent layers over sequences of unknown "
            "length (SELECT_TF_OPS): an interpreter needs the Flex delegate (on Android the "
            "tensorflow-lite-select-tf-ops dependency)",
            UserWarning,
            stacklevel=2,
        )
        converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_path, [SIGNATURE])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
        converter._experimental_lower_tensor_list_ops = False  # what TensorFlow's error message asks for
        flatbuffer = _convert(converter, os.path.basename(path))
    with open(path, "wb") as f:
        f.write(flatbuffer)


def _write_serving_formats(tf, small, staging, formats, representative, flat=None):
    """SavedModel, TFLite, ONNX and int8 TFLite of ``small`` (those in ``formats``) into ``staging``.

    On TensorFlow all are written here. On PyTorch (no SavedModel without ``torch_xla``) a TensorFlow-backend
    child process writes them all. On JAX the SavedModel and float TFLite are written here (through
    ``jax2tf``), while ONNX and int8 TFLite, which need a graph of TensorFlow's own ops, come from the child.
    """
    saved_model = os.path.join(staging, _FILENAMES["saved_model"] if "saved_model" in formats else ".saved_model")
    targets = {f: os.path.join(staging, _FILENAMES[f]) for f in ("tflite",) + _CONVERTED if f in formats}
    converted = {f: path for f, path in targets.items() if f in _CONVERTED}
    backend = keras.backend.backend()
    if backend == "torch":
        _convert_in_tensorflow(small, staging, saved_model, targets, representative,
                               "the PyTorch backend cannot write a SavedModel without torch_xla", flat)
    else:
        if backend == "tensorflow" or "saved_model" in formats or "tflite" in formats:
            serving = _serving_model(small)
            _write_saved_model(tf, serving, saved_model)
            if "tflite" in targets:
                _write_tflite(tf, saved_model, targets["tflite"])
        if converted and backend == "tensorflow":
            _write_converted(tf, serving, saved_model, converted, representative)
        elif converted:
            source = os.path.join(staging, ".tf_saved_model")
            _convert_in_tensorflow(small, staging, source, converted, representative,
                                   "ONNX and int8 TFLite are converted from TensorFlow's own ops", flat)
            shutil.rmtree(source)
    if "saved_model" in formats:
        _follow_umask(saved_model, staging)
    elif os.path.lexists(saved_model):
        shutil.rmtree(saved_model)


def _follow_umask(path, made):
    """Give the directories in the tree ``path`` the mode of ``made``, a directory this process made, and its
    files that mode's read and write bits, the mode ``open`` gives: TensorFlow makes a SavedModel's
    directories 0755 whatever the umask."""
    directory_mode = stat.S_IMODE(os.stat(made).st_mode)
    # Bottom-up: a directory is listed before its own mode changes.
    for folder, _, files in os.walk(path, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), directory_mode & 0o666)
        os.chmod(folder, directory_mode)


#: Packages whose classes a fresh Keras process finds by itself (Keras imports them as it loads a file).
_LOADED_BY_KERAS = ("keras", "keras_hub", "keras_cv", "keras_nlp", "keras_group_lasso")


def _foreign_classes(model):
    """``{class: module}`` of ``model``'s layers (nested ones too) that a fresh process would not find by itself:
    a user's own blocks and layers."""
    found = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        module = type(layer).__module__
        if module.split(".")[0] not in _LOADED_BY_KERAS:
            found[type(layer)] = module
    return found


def _convert_in_tensorflow(small, staging, saved_model, targets, representative, why, flat=None):
    """The serving formats ``targets`` (format -> path) of ``small`` written by a TensorFlow-backend child process.

    The pruned model's ``.keras`` file loads on any backend: a child process with ``KERAS_BACKEND=tensorflow``
    loads it and writes the same files the TensorFlow backend writes. ``why`` says in an error why a child was
    needed. A model that holds a user's own block classes is given to the child as ``flat()`` (the same
    computation in plain layers) where that is plain; the modules of the classes left are imported there.

    Raises:
        RuntimeError: the child failed, or a class the child needs is defined in ``__main__`` (a script or a
            notebook), which another process cannot import.
    """
    foreign = _foreign_classes(small)
    if foreign and flat is not None:
        small = flat()
        foreign = _foreign_classes(small)
    in_main = sorted(cls.__qualname__ for cls, module in foreign.items() if module == "__main__")
    if in_main:
        raise RuntimeError(
            f"{_OWNER}: the {', '.join(repr(f) for f in targets)} files are written by a TensorFlow-backend process "
            f"({why}), which cannot load the class {', '.join(in_main)} of the pruned model: it is defined in "
            "__main__ (a script or a notebook); define it in a module that process can import")
    source = os.path.join(staging, ".pruned.keras")
    small.save(source)
    command = [sys.executable, "-m", "keras_group_lasso.export", source, saved_model]
    if foreign:
        command += ["--import", ",".join(sorted(set(foreign.values())))]
    for name, path in targets.items():
        command += [f"--{name}", path]
    data = None
    if representative is not None and "tflite-int8" in targets:
        data = os.path.join(staging, ".representative.npz")
        np.savez(data, *representative)
        command += ["--representative", data]
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if foreign:  # the modules of the user's classes, found as this process finds them
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    finally:
        os.remove(source)
        if data is not None:
            os.remove(data)
    if done.returncode != 0:
        written = ([] if os.path.basename(saved_model).startswith(".") else ["saved_model"]) + list(targets)
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(
            f"{_OWNER}: writing the {', '.join(repr(f) for f in written)} files in a "
            f"TensorFlow-backend process ({why}) failed with exit status {done.returncode}:\n{tail}"
        )


def _convert_main(argv):
    """``python -m keras_group_lasso.export MODEL.keras SAVED_MODEL [--tflite PATH] [--onnx PATH]
    [--tflite-int8 PATH --representative DATA.npz]`` (TensorFlow backend)."""
    import tensorflow as tf

    options = dict(zip(argv[2::2], argv[3::2]))
    for module in filter(None, options.get("--import", "").split(",")):  # the user's classes register themselves
        importlib.import_module(module)
    small = keras.saving.load_model(argv[0], compile=False)
    serving = _serving_model(small)
    _write_saved_model(tf, serving, argv[1])
    if "--tflite" in options:
        _write_tflite(tf, argv[1], options["--tflite"])
    representative = None
    if "--representative" in options:
        with np.load(options["--representative"], allow_pickle=False) as data:
            representative = [data[f"arr_{i}"] for i in range(len(data.files))]
    converted = {f: options[f"--{f}"] for f in _CONVERTED if f"--{f}" in options}
    _write_converted(tf, serving, argv[1], converted, representative)


def _import_onnx_tools():
    """Raise a clear ImportError unless onnx, onnxruntime and tf2onnx import."""
    missing = []
    for name in ("onnx", "onnxruntime", "tf2onnx"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(
            f"{_OWNER}: the 'onnx' format needs onnx, onnxruntime and tf2onnx installed (missing: "
            f"{', '.join(missing)}); install them with `{_EXTRA}`."
        )


def _write_converted(tf, serving, saved_model, targets, representative):
    """ONNX and full-integer TFLite of the SavedModel ``saved_model`` (of ``serving``) into ``targets``."""
    signature = tf.nest.flatten(_input_signature(tf, serving))
    if "onnx" in targets:
        import tf2onnx
        from tf2onnx import tf_loader

        # From the SavedModel's frozen signature, as `python -m tf2onnx.convert --saved-model` does: the
        # constants a layer keeps outside its variables (a Normalization's mean) are frozen in with them.
        logger, level = tf.get_logger(), tf.get_logger().level
        logger.setLevel("ERROR")  # tf2onnx freezes the graph with TensorFlow 1 functions, which say so
        try:
            graph_def, inputs, outputs, renames = tf_loader.from_saved_model(
                saved_model, None, None, tag="serve", signatures=[SIGNATURE], return_tensors_to_rename=True)
            with tf.Graph().as_default():
                tf2onnx.convert.from_graph_def(graph_def, input_names=inputs, output_names=outputs,
                                               opset=ONNX_OPSET, tensors_to_rename=renames,
                                               output_path=targets["onnx"])
        finally:
            logger.setLevel(level)
    if "tflite-int8" in targets:
        names = [spec.name for spec in signature]

        def rows():
            for i in range(len(representative[0])):
                yield {name: array[i:i + 1] for name, array in zip(names, representative)}

        converter = tf.lite.TFLiteConverter.from_saved_model(saved_model, [SIGNATURE])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = rows
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        with warnings.catch_warnings():
            # The calibration runs tf.lite.Interpreter, which TF 2.21 says moves to the ai_edge_litert package.
            warnings.filterwarnings("ignore", message=r"(?s).*tf.lite.Interpreter is deprecated")
            flatbuffer = _convert(converter, os.path.basename(targets["tflite-int8"]))
        with open(targets["tflite-int8"], "wb") as f:
            f.write(flatbuffer)


# ----------------------------------------------------------------------------- representative data


def _describe(value):
    """A short description of ``value`` for an error message (never all its numbers)."""
    if _is_array(value):
        return Described(f"an array of shape {tuple(np.shape(value))}")
    if isinstance(value, dict):
        return Described("a dict of " + ", ".join(
            f"{key!r}: {_describe(item)!r}" for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return Described(f"a {type(value).__name__} of {len(value)} items"
                         + (" (" + ", ".join(repr(_describe(item)) for item in value[:4]) + ")" if value else ""))
    if value is None:
        return None
    return Described(f"a {type(value).__name__}")


def _is_array(value):
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


def _data_constraint(small, formats):
    names = [tensor.name for tensor in small.inputs]
    shapes = ["(n, " + ", ".join("?" if d is None else str(d) for d in tensor.shape[1:]) + ")"
              for tensor in small.inputs]
    if len(names) == 1:
        what = f"a NumPy array of the exported model's inputs, shape {shapes[0].replace(', )', ')')}"
    else:
        what = ("a list of arrays, one per input of the exported model in the order "
                + ", ".join(f"{name} {shape}" for name, shape in zip(names, shapes))
                + ", or a dict of them by input name")
    need = "given for the 'tflite-int8' format: " if "tflite-int8" in formats else ""
    return f"{need}{what}, or an iterable of such batches, of finite numbers and at least one row"


def _representative(data, small, model, formats):
    """``data`` as one array per input of ``small`` (all batches joined), in its serving dtype.

    Raises:
        InvalidParameterError: naming ``representative_data`` and what was received.
    """
    constraint = _data_constraint(small, formats)
    names = [tensor.name for tensor in small.inputs]
    known = set(names) | {tensor.name for tensor in model.inputs}

    def inputs_of(batch):
        if isinstance(batch, dict):
            if not set(names) <= set(batch) or not set(batch) <= known:
                return None
            batch = [batch[name] for name in names]
        elif len(names) > 1 and isinstance(batch, (list, tuple)):
            if len(batch) != len(names):
                return None
        elif len(names) == 1 and _is_array(batch):
            batch = [batch]
        else:
            return None
        if not all(_is_array(item) for item in batch):
            return None
        return [np.asarray(item) for item in batch]

    arrays = inputs_of(data)
    if arrays is None:
        whole = len(names) > 1 and isinstance(data, (list, tuple)) and all(_is_array(item) for item in data)
        if whole or isinstance(data, (str, bytes, dict)) or _is_array(data) or not hasattr(data, "__iter__"):
            fail(_OWNER, "representative_data", constraint, _describe(data))
        batches = []
        for number, batch in enumerate(data):
            found = inputs_of(batch)
            if found is None or not _fits(found, small):
                what = _describe(batch)
                fail(_OWNER, "representative_data", constraint,
                     Described(f"an iterable whose batch {number} is {what!r}"))
            batches.append(found)
        if not batches:
            fail(_OWNER, "representative_data", constraint, Described("an empty iterable"))
        arrays = [np.concatenate(parts) for parts in zip(*batches)]
    if not _fits(arrays, small):
        fail(_OWNER, "representative_data", constraint, _describe(data))
    dtypes = ["float32"] if len(names) == 1 else [keras.backend.standardize_dtype(t.dtype) for t in small.inputs]
    with np.errstate(over="ignore"):
        cast = [array.astype(dtype) for array, dtype in zip(arrays, dtypes)]
    for given, array, dtype in zip(arrays, cast, dtypes):
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():  # finite, but not as float32
            fail(_OWNER, "representative_data", constraint,
                 Described(f"values that are not finite as {dtype} (|x| up to {float(np.max(np.abs(given))):.3g})"))
    return cast


def _fits(arrays, small):
    """Whether ``arrays`` (one per input of ``small``) have its shapes, rows, numbers, all finite."""
    rows = {len(array) if array.ndim else -1 for array in arrays}
    if len(rows) != 1 or rows == {0} or rows == {-1}:
        return False
    for array, tensor in zip(arrays, small.inputs):
        shape = tuple(tensor.shape)
        if array.ndim != len(shape) or any(d is not None and d != n for d, n in zip(shape[1:], array.shape[1:])):
            return False
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool) or np.iscomplexobj(array):
            return False
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            return False
    return True


def _check_inputs(small):
    """Inputs to check the ONNX file on when no representative data is given: 8 rows of N(0, 1) floats for a
    float input, zeros (a valid index for any embedding, however few its rows) for an integer one; in the serving
    signature's dtype (float32 for a model of one input, which casts inside); 3 steps for a length left open."""
    rng = np.random.default_rng(0)
    arrays = []
    for tensor in small.inputs:
        shape = (8,) + tuple(3 if d is None else d for d in tensor.shape[1:])
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        values = rng.normal(size=shape) if "float" in dtype else np.zeros(shape)
        arrays.append(values.astype("float32" if len(small.inputs) == 1 else dtype))
    return arrays


# ----------------------------------------------------------------------------- checks of what was written


def _reference(small, arrays):
    """The pruned Keras model's outputs on ``arrays``: a list of float64 arrays."""
    outputs = small.predict(arrays if len(arrays) > 1 else arrays[0], batch_size=256, verbose=0)
    return [np.asarray(out, dtype="float64") for out in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


def _check_onnx(path, small, names, arrays, checked_on_data=False):
    """Run ``path`` in ONNX Runtime on ``arrays`` and compare with the pruned model; the manifest's record.

    Raises:
        RuntimeError: if ONNX Runtime cannot run the file on ``arrays`` (an index out of range of an embedding, for
            instance), or if ``max|onnx - keras| > ONNX_TOLERANCE * max(1, max|keras|)``.
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = dict(zip(names, arrays))  # the SavedModel's argument names, in the model's order of inputs
    outputs = sorted((node.name for node in session.get_outputs()), key=_output_number)
    try:
        got = session.run(outputs, feeds)
    except Exception as error:  # noqa: BLE001 - ONNX Runtime's own error types, re-raised with the file named
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise RuntimeError(
            f"{_OWNER}: model.onnx does not run in ONNX Runtime on {len(arrays[0])} rows of "
            f"{'the representative data' if checked_on_data else 'generated inputs'} "
            f"({', '.join(f'{name}: {a.dtype} {tuple(a.shape)}' for name, a in feeds.items())}): {lines[0]}; "
            "nothing was written"
        ) from error
    want = _reference(small, arrays)
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        raise RuntimeError(
            f"{_OWNER}: model.onnx does not give the pruned Keras model's outputs in ONNX Runtime: outputs of shapes "
            f"{[tuple(g.shape) for g in got]} where Keras gives {[tuple(w.shape) for w in want]}; nothing was written"
        )
    error = max((float(np.max(np.abs(g - w))) if w.size else 0.0 for g, w in zip(got, want)), default=0.0)
    tolerance = ONNX_TOLERANCE * max(1.0, max((float(np.max(np.abs(w))) if w.size else 0.0 for w in want),
                                              default=0.0))
    if not error <= tolerance:
        raise RuntimeError(
            f"{_OWNER}: model.onnx does not give the pruned Keras model's outputs in ONNX Runtime: "
            f"max |onnx - keras| = {error:.3g} on {len(arrays[0])} rows, over the tolerance {tolerance:.3g} "
            f"({ONNX_TOLERANCE:g} x max(1, max |keras|)); nothing was written"
        )
    return {
        "opset": ONNX_OPSET,
        "inputs": list(names),
        "outputs": outputs,
        "checked_rows": len(arrays[0]),
        "max_abs_error": error,
        "tolerance": tolerance,
    }


def _tflite_interpreter(tf, path):
    with warnings.catch_warnings():
        # TF 2.21 warns that tf.lite.Interpreter moves to the ai_edge_litert package.
        warnings.filterwarnings("ignore", message=r"(?s).*tf.lite.Interpreter is deprecated")
        return tf.lite.Interpreter(model_path=path)


def _measure_int8(tf, path, small, arrays):
    """The int8 model's output error on the representative ``arrays``, against the pruned float model.

    Errors are relative to the float outputs' scale ``s = max |keras|``: ``max_relative_error =
    max|int8 - keras| / s`` and ``mean_relative_error = mean|int8 - keras| / s``; for an output of several
    columns also ``argmax_agreement``, the fraction of rows whose largest column is the same. Warns when
    ``mean_relative_error > INT8_MEAN_ERROR_WARNING`` or ``argmax_agreement < INT8_ARGMAX_WARNING``.
    """
    runner = _tflite_interpreter(tf, path).get_signature_runner(SIGNATURE)
    names = [spec.name for spec in tf.nest.flatten(_input_signature(tf, small))]
    inputs, outputs = runner.get_input_details(), runner.get_output_details()

    def quantization(details):
        scale, zero_point = details["quantization"]
        return {"dtype": np.dtype(details["dtype"]).name, "scale": float(scale), "zero_point": int(zero_point)}

    got = []
    for start in range(0, len(arrays[0]), 256):
        feeds = {}
        for name, array in zip(names, arrays):
            details = inputs[name]
            chunk = array[start:start + 256]
            if details["dtype"] == np.int8:
                scale, zero_point = details["quantization"]
                chunk = np.clip(np.round(chunk / scale) + zero_point, -128, 127)
            feeds[name] = chunk.astype(details["dtype"])
        result = runner(**feeds)
        got.append([_dequantized(result[key], outputs[key]) for key in sorted(result, key=_output_number)])
    got = [np.concatenate(parts) for parts in zip(*got)]
    want = _reference(small, arrays)
    scale = max(float(np.max(np.abs(w))) for w in want) or 1.0
    errors = np.concatenate([np.abs(g - w).ravel() for g, w in zip(got, want)])
    measured = {
        "rows": len(arrays[0]),
        "output_scale": scale,
        "max_abs_error": float(errors.max()),
        "mean_abs_error": float(errors.mean()),
        "max_relative_error": float(errors.max() / scale),
        "mean_relative_error": float(errors.mean() / scale),
    }
    if len(want) == 1 and want[0].ndim == 2 and want[0].shape[1] > 1:
        measured["argmax_agreement"] = float(np.mean(np.argmax(got[0], 1) == np.argmax(want[0], 1)))
    record = {
        "inputs": {name: quantization(inputs[name]) for name in names},
        "outputs": {key: quantization(outputs[key]) for key in sorted(outputs, key=_output_number)},
        "error_on_representative_data": measured,
        "warn_above_mean_relative_error": INT8_MEAN_ERROR_WARNING,
    }
    if "argmax_agreement" in measured:
        record["warn_below_argmax_agreement"] = INT8_ARGMAX_WARNING
    if measured["mean_relative_error"] > INT8_MEAN_ERROR_WARNING \
            or measured.get("argmax_agreement", 1.0) < INT8_ARGMAX_WARNING:
        agreement = measured.get("argmax_agreement")
        warnings.warn(
            f"{_OWNER}: the int8 model is far from the float one on the representative data: mean |int8 - float| "
            f"= {measured['mean_relative_error']:.1%} of the output scale (warns above "
            f"{INT8_MEAN_ERROR_WARNING:.0%})"
            + ("" if agreement is None else f", argmax agreement {agreement:.1%} (warns below "
               f"{INT8_ARGMAX_WARNING:.0%})")
            + "; give more representative data, or serve the float model.tflite",
            UserWarning,
            stacklevel=3,
        )
    return record


def _output_number(key):
    return int(key.rsplit("_", 1)[-1]) if key.rsplit("_", 1)[-1].isdigit() else 0


def _dequantized(values, details):
    if details["dtype"] == np.int8:
        scale, zero_point = details["quantization"]
        return (values.astype("float64") - zero_point) * scale
    return values.astype("float64")


def _size(path):
    """Bytes of the file ``path``, or of all files under the directory ``path``."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, files in os.walk(path) for name in files)


def _output_units(report):
    outputs = [layer.units for layer in report.layers if layer.is_output]
    return outputs[0] if len(outputs) == 1 else None


def _manifest(report, small, threshold, inputs, formats):
    out = _output_units(report)
    tail = [] if out is None else [int(out)]
    kept = [int(i) for i in small.kept_features]
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "package": "keras-group-lasso",
        "package_version": __version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "threshold": float(threshold),
        "inputs": inputs,
        "round_to": int(small.pruning_plan.round_to),
        "folded_batchnorms": dict(small.folded_batchnorms),
        "n_features": int(report.n_features),
        "kept_features": kept,
        "n_kept_features": len(kept),
        "layer_sizes_before": [int(s) for s in report.original_layer_sizes] + tail,
        "layer_sizes_after": [int(s) for s in report.layer_sizes] + tail,
        "params_before": int(report.params_before),
        "params_after": int(report.params_after),
        # What the exported model really holds: with inputs="original" surgery may keep
        # an all-zero first-layer row per dropped feature (faster than gathering them).
        "exported_model_params": int(small.count_params()),
        "formats": {f: _FILENAMES[f] for f in formats},
    }
    if set(formats) & set(_SERVING):
        shape = list(small.inputs[0].shape)
        shape[0] = None
        manifest["serving"] = {
            "signature": SIGNATURE,
            "input": INPUT_NAME,
            "input_shape": shape,
            "dtype": "float32",
        }
        if len(small.inputs) > 1:  # one named argument per input, in its own dtype
            manifest["serving"] = {
                "signature": SIGNATURE,
                "inputs": [{"name": t.name, "shape": [None] + list(t.shape[1:]),
                            "dtype": keras.backend.standardize_dtype(t.dtype)} for t in small.inputs],
            }
        names = _serving_output_names(small)
        manifest["serving"]["output"] = names[0]
        if len(names) > 1:  # every output of the signature, by the name it returns it under
            manifest["serving"]["outputs"] = names
    if len(small.inputs) > 1 or len(report.inputs) > 1:
        manifest["model_inputs"] = [
            {"name": found.name, "n_features": found.n_features, "kept_features": list(found.selected_features),
             "kept": found.name in getattr(small, "kept_inputs", ())} for found in report.inputs]
    return manifest


def _write_manifest_file(path, manifest):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


def _make_directory(parent, prefix):
    """A new directory ``parent/prefix<8 hex digits>`` with the mode ``os.makedirs`` gives under the umask,
    and a descriptor locking it (see :func:`_lock`): while it is open, no other export takes the
    directory for a killed export's leftover.

    ``tempfile.mkdtemp`` would make it 0700 whatever the umask, and the staging directory of a new
    export becomes the export directory itself.
    """
    for _ in range(100):
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        # Another export may take the new directory for a leftover before it is locked, and remove it.
        try:
            fd, busy = _lock(path)
        except FileNotFoundError:
            continue
        if busy or (fd is not None and not _is_directory_of(fd, path)):
            if fd is not None:
                os.close(fd)
            continue
        return path, fd
    raise FileExistsError(f"{_OWNER}: no free name {prefix}XXXXXXXX in {parent!r}")


def _is_directory_of(fd, path):
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


def _replace_artifacts(staging, target, written, overwrite, directory):
    """Rename the artifacts ``written`` (names) from ``staging`` into the existing ``target``.

    Returns ``(replaced, removed)``: the names of earlier artifacts replaced by new ones, and of
    earlier artifacts in a format not written this time that the earlier ``manifest.json`` records
    (those are removed, so that no stale artifact disagrees with the new manifest). Files that are not
    artifacts are never touched; an artifact the earlier manifest does not record and that is not
    written this time is left in place, with a warning.

    Each artifact is moved whole: the earlier one aside into ``staging/.replaced``, then the new one
    into place. ``manifest.json`` goes aside first and its new version comes last, so a directory that
    has a ``manifest.json`` always holds one complete export. If a rename fails, the renames done so
    far are undone and the error is raised; the earlier artifacts are deleted only after the last
    rename succeeded.
    """
    present = _artifacts_in(target)
    if present and not overwrite:  # written by someone else while this process pruned
        _refuse_an_earlier_export(target, directory)
    recorded = _recorded_artifacts(target)
    manifest = _FILENAMES["manifest"]
    replaced = [name for name in present if name in written]
    removed = [name for name in present if name not in written and name in recorded]
    unrecorded = [name for name in replaced if name not in recorded]
    left = [name for name in present if name not in written and name not in recorded]
    aside = os.path.join(staging, ".replaced")
    os.mkdir(aside)
    done = []

    def move(source, destination):
        os.rename(source, destination)
        done.append((source, destination))

    try:
        order = [manifest] + [name for name in ARTIFACTS if name != manifest]
        for name in order:
            if name in replaced or name in removed:
                move(os.path.join(target, name), os.path.join(aside, name))
            if name in written and name != manifest:
                move(os.path.join(staging, name), os.path.join(target, name))
        move(os.path.join(staging, manifest), os.path.join(target, manifest))
    except BaseException as error:
        try:
            for source, destination in reversed(done):
                os.rename(destination, source)
        except OSError as restore_error:
            raise OSError(
                f"{_OWNER}: replacing the artifacts in {target!r} failed ({error!r}) and putting the "
                f"earlier ones back failed too ({restore_error!r}); the earlier ones are in {aside!r}"
            ) from error
        raise
    for name in unrecorded:
        warnings.warn(
            f"{_OWNER}: replaced {os.path.join(target, name)!r}, which no manifest.json of an earlier "
            "export records (overwrite=True replaces every artifact this export writes).",
            stacklevel=3,
        )
    for name in left:
        warnings.warn(
            f"{_OWNER}: left {os.path.join(target, name)!r} in place: this export did not write it and "
            "no manifest.json of an earlier export records it, so the new manifest.json does not describe it.",
            stacklevel=3,
        )
    return replaced, removed


def export_pruned(
    model,
    directory,
    threshold=1e-3,
    formats=("saved_model", "keras"),
    inputs="original",
    overwrite=False,
    round_to=1,
    fold_batchnorm=False,
    representative_data=None,
    blocks="rebuild",
):
    """Prune ``model`` and write the smaller model plus a manifest to ``directory``.

    The pruned model is ``prune_model(model, threshold, inputs, round_to, fold_batchnorm, blocks)``: on any
    input ``x`` it gives the outputs of ``model`` with every ``|w| <= threshold``
    set to 0, with dead input features, dead hidden units and constant units
    removed. ``model`` itself is never changed.

    Formats:

    * ``"saved_model"``: ``<directory>/saved_model``, signature
      ``serving_default`` taking ``features``: float32 ``[None, d]`` (the original
      feature vector with ``inputs="original"``, the kept features with
      ``inputs="selected"``) and returning ``output_0``.
    * ``"keras"``: ``<directory>/model.keras`` (loads with
      ``keras.saving.load_model``, without this package: the pruned model
      holds no layer or penalty of ``keras_group_lasso``).
    * ``"tflite"``: ``<directory>/model.tflite``, converted from the SavedModel.
    * ``"onnx"``: ``<directory>/model.onnx`` (opset ``ONNX_OPSET`` = 17, converted by tf2onnx), with the
      SavedModel's input and output names (``features`` / ``output_0``). Once written it runs in ONNX
      Runtime on ``representative_data`` (its first 1024 rows) or, without it, on 8 rows of N(0, 1)
      floats (zeros for an integer input: an index into any embedding), and must give the pruned Keras
      model's outputs:
      ``max|onnx - keras| <= ONNX_TOLERANCE * max(1, max|keras|)`` (``ONNX_TOLERANCE = 1e-4``, float32
      rounding with room to spare); otherwise a RuntimeError and nothing is written.
    * ``"tflite-int8"``: ``<directory>/model_int8.tflite``, full-integer TFLite (int8 weights,
      activations, inputs and outputs; the input and output scales and zero points are in the
      manifest), calibrated on ``representative_data``. Its error on that data, against the pruned
      float model, is in the manifest (``max_relative_error`` and ``mean_relative_error``: |int8 -
      float| as a fraction of ``max|float|``; ``argmax_agreement`` for an output of several columns),
      with a warning when the mean error passes ``INT8_MEAN_ERROR_WARNING`` (5 %) or the argmax
      agreement falls below ``INT8_ARGMAX_WARNING`` (95 %).

    On the PyTorch backend (where Keras writes a SavedModel only through
    ``torch_xla``) the SavedModel and TFLite files are written by a child
    process with ``KERAS_BACKEND=tensorflow`` from the pruned ``.keras`` file:
    the same files, a few seconds more. On JAX the ONNX and int8 files come
    from that child too (they are converted from TensorFlow's own ops, not
    from the SavedModel ``jax2tf`` writes); the checks always run here,
    against the model of the calling backend.

    ``manifest.json`` holds the kept feature indices, layer sizes and parameter
    counts before/after (``params_before`` / ``params_after`` as in the report,
    Dense kernels and biases; ``exported_model_params`` as the exported Keras
    model counts them), ``round_to``, ``folded_batchnorms`` (BatchNormalization
    layers merged into the layer before them), the threshold, the formats and
    the package version; ``file_sizes``, the size in bytes of each artifact
    (of all files of ``saved_model/``); ``onnx`` and ``tflite_int8``, what
    their checks measured. A process that is not the chief writes nothing,
    so its manifest has none of these three.

    Every artifact is built in a hidden staging directory (next to a new
    ``directory``, inside an existing one) and renamed into place whole: no
    artifact is ever half-written under its final name, and a failure leaves
    the directory as it was. When artifacts are replaced, ``manifest.json``
    is taken away first and written back last, so a directory with a
    ``manifest.json`` always holds one complete export. Directories and files
    get the permissions ``os.makedirs`` and ``open`` give under the umask,
    the SavedModel's included.

    An export killed half-way (``kill -9``) leaves its staging directory
    behind, with the earlier artifacts in it when it was killed while it
    replaced them. Before anything else (whatever ``overwrite`` says), the
    next export into ``directory`` puts those earlier artifacts back and
    takes out the ones the killed export had put in place, so that
    ``directory`` holds the earlier export again, as after a failure; it
    removes staging directories that hold nothing else to keep (those of an
    export killed before it replaced anything, or after its ``manifest.json``
    came in). A warning names each staging directory and says what was done;
    one whose earlier artifacts cannot be put back (another file took their
    name) is kept. See the module docstring for the details.

    Args:
        model: a trained Sequential or Functional Keras model (see
            :func:`~keras_group_lasso.surgery.prune_model` for what is supported).
        directory: where to write; created if missing. It may hold other
            files (they are left as they are), but none of the artifact names
            (``saved_model``, ``model.keras``, ``model.tflite``, ``model.onnx``,
            ``model_int8.tflite``, ``manifest.json``) unless ``overwrite=True``. When training spans several
            processes, call this on every process: each prunes, only the
            chief (:func:`keras_group_lasso.is_chief`) checks and writes the
            directory, and every process gets the same result (a process that is not
            the chief without the manifest's ``file_sizes``, ``onnx`` and ``tflite_int8``).
        threshold: weights with ``|w| <= threshold`` count as zero.
        formats: names from ``("saved_model", "keras", "tflite", "onnx", "tflite-int8")``.
        inputs: ``"original"`` (the exported model takes the full feature
            vector) or ``"selected"`` (it takes only the kept features, in the
            order of ``manifest["kept_features"]``).
        overwrite: replace the artifacts of an earlier export in
            ``directory``: each artifact written this time replaces the one
            of the same name (a warning says so when no earlier
            ``manifest.json`` records it), and the artifacts the earlier
            ``manifest.json`` records in a format not written this time are
            removed. Nothing else in ``directory`` is touched. The result's
            ``replaced`` and ``removed`` list those paths.
        round_to: each hidden layer keeps a multiple of it of its units (see
            :func:`~keras_group_lasso.surgery.prune_model`; 8 often runs faster).
        fold_batchnorm: merge each BatchNormalization that follows a Dense or
            convolution layer into it (see :func:`~keras_group_lasso.surgery.prune_model`).
        representative_data: inputs of the exported model (the kept features only with
            ``inputs="selected"``): a NumPy array, a list of arrays (one per input, in order) or
            a dict of them by input name, or an iterable of such batches (without targets);
            a few hundred rows are enough. Needed for ``"tflite-int8"`` (calibration and its
            error), used for ``"onnx"`` (its check), refused otherwise.
        blocks: ``"rebuild"`` (default): a block of the model's own class comes back as that class with its
            new widths where its config can say them, so ``model.keras`` loads where the class is registered;
            ``"flatten"``: its layers, plain Keras, loading anywhere; ``"uniform"``: as ``"rebuild"``, with the
            blocks of one class kept as wide as each other (see :func:`~keras_group_lasso.surgery.prune_model`).

    Returns:
        :class:`ExportResult` with the absolute paths, the manifest, the report
        and the earlier artifacts replaced or removed.

    Raises:
        InvalidParameterError: for bad arguments or a ``directory`` that holds
            an artifact without ``overwrite=True``.
        keras_group_lasso.surgery.UnsupportedModelError: if the model cannot be
            pruned (nothing is written).
        ImportError: if a format needs TensorFlow and it is not installed, or
            ``"onnx"`` needs onnx, onnxruntime or tf2onnx (the message names the
            ``keras-group-lasso[onnx]`` extra).
        RuntimeError: if the TensorFlow child process fails (its error output is
            in the message), TensorFlow Lite cannot convert the pruned model (the
            converter's first lines in the message), or the ONNX file does not give
            the pruned model's outputs; nothing is written.

    Example:
        >>> import os, tempfile
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
        >>> kernel = np.ones((4, 3), dtype="float32")
        >>> kernel[[1, 3], :] = 0.0   # input features 1 and 3 are dead
        >>> model.layers[0].set_weights([kernel, np.zeros(3, dtype="float32")])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     result = export_pruned(model, os.path.join(tmp, "export"), formats=("keras",))
        ...     sorted(os.listdir(result.directory))
        ['manifest.json', 'model.keras']
        >>> result.manifest["kept_features"], result.manifest["layer_sizes_after"]
        ([0, 2], [2, 3, 2])
    """
    if not isinstance(model, keras.Model):
        fail(_OWNER, "model", "a keras.Model", model)
    threshold = check_non_negative(_OWNER, "threshold", threshold)
    formats = _check_formats(formats)
    inputs = check_choice(_OWNER, "inputs", inputs, ("original", "selected"))
    if not isinstance(overwrite, bool):
        fail(_OWNER, "overwrite", "a bool", overwrite)
    round_to = check_positive_int(_OWNER, "round_to", round_to)
    if not isinstance(fold_batchnorm, bool):
        fail(_OWNER, "fold_batchnorm", "a bool", fold_batchnorm)
    blocks = check_choice(_OWNER, "blocks", blocks, surgery.BLOCKS)
    if "tflite-int8" in formats and representative_data is None:
        fail(_OWNER, "representative_data", "given for the 'tflite-int8' format: a NumPy array of the exported "
             "model's inputs, a list or dict of arrays (one per input) or an iterable of such batches", None)
    if representative_data is not None and not set(formats) & set(_CONVERTED):
        fail(_OWNER, "representative_data", "None unless formats holds 'tflite-int8' or 'onnx'",
             _describe(representative_data))
    chief = is_chief()
    target = _check_directory(directory, overwrite, contents=chief)
    tf = _import_tensorflow(formats) if set(formats) - {"keras"} else None
    if "onnx" in formats:
        _import_onnx_tools()

    # Every process prunes (on JAX over several processes the model's arrays span them all, so the
    # surgery's computations are collective); only the chief writes.
    small = surgery.prune_model(model, threshold=threshold, inputs=inputs, round_to=round_to,
                                fold_batchnorm=fold_batchnorm, blocks=blocks)
    checked = [f for f in formats if f in _CONVERTED]
    if checked and isinstance(_output_structure(small), dict):
        fail(_OWNER, "formats", f"formats without {' and '.join(repr(f) for f in checked)} for a model whose outputs "
             "are a dict (they are checked output by output against a list; the other formats take a dict)",
             Described(f"{tuple(formats)!r} for a model with outputs {', '.join(sorted(small.output))}"))
    report = small.pruning_report
    representative = None
    if representative_data is not None:
        representative = _representative(representative_data, small, model, formats)
    paths = {f: os.path.join(target, _FILENAMES[f]) for f in formats}
    paths["manifest"] = os.path.join(target, _FILENAMES["manifest"])
    manifest = _manifest(report, small, threshold, inputs, formats)
    if not chief:
        return ExportResult(directory=target, paths=paths, manifest=manifest, report=report)

    written = [_FILENAMES[f] for f in formats] + [_FILENAMES["manifest"]]
    parent = os.path.dirname(target)
    made = _missing_directories(parent)
    os.makedirs(parent, exist_ok=True)
    new = not os.path.lexists(target)
    # A new export is built whole next to the target and renamed into place; into an existing
    # directory (perhaps a mount point) the artifacts are built inside it and renamed one by one.
    if new:
        staging, lock = _make_directory(parent, f".{os.path.basename(target)}.partial-")
    else:
        staging, lock = _make_directory(target, _STAGING_PREFIX)
    replaced = removed = ()
    try:
        try:
            flat = None if blocks == "flatten" else functools.partial(
                surgery.prune_model, model, threshold=threshold, inputs=inputs, round_to=round_to,
                fold_batchnorm=fold_batchnorm, blocks="flatten")
            _build(tf, small, staging, formats, representative, manifest, flat)
            _write_manifest_file(os.path.join(staging, _FILENAMES["manifest"]), manifest)
            if new:
                os.rename(staging, target)
            else:
                replaced, removed = _replace_artifacts(staging, target, written, overwrite, directory)
        except BaseException:
            _remove_staging(staging)
            for folder in made:  # the deepest first: the folders this export made, left as they were before it
                try:
                    os.rmdir(folder)
                except OSError:
                    break
            raise
        if not new:
            shutil.rmtree(staging, ignore_errors=True)  # with the earlier artifacts, now replaced
    finally:
        if lock is not None:
            os.close(lock)

    return ExportResult(
        directory=target,
        paths=paths,
        manifest=manifest,
        report=report,
        replaced=tuple(os.path.join(target, name) for name in replaced),
        removed=tuple(os.path.join(target, name) for name in removed),
    )


def _build(tf, small, staging, formats, representative, manifest, flat=None):
    """Write the artifacts of ``formats`` into ``staging``, check them, and record the checks and sizes in
    ``manifest`` (its file is written by the caller)."""
    if "keras" in formats:
        small.save(os.path.join(staging, _FILENAMES["keras"]))
    if set(formats) & set(_SERVING):
        _write_serving_formats(tf, small, staging, formats, representative, flat)
    _check_written(tf, small, staging, formats, representative, manifest)


def _check_written(tf, small, staging, formats, representative, manifest):
    """Check the ONNX file and measure the int8 one; record them and each artifact's size in ``manifest``."""
    if "onnx" in formats:
        arrays = _check_inputs(small) if representative is None else [a[:_CHECK_ROWS] for a in representative]
        names = [spec.name for spec in tf.nest.flatten(_input_signature(tf, small))]
        manifest["onnx"] = _check_onnx(os.path.join(staging, _FILENAMES["onnx"]), small, names, arrays,
                                       checked_on_data=representative is not None)
    if "tflite-int8" in formats:
        manifest["tflite_int8"] = _measure_int8(tf, os.path.join(staging, _FILENAMES["tflite-int8"]), small,
                                                representative)
    manifest["file_sizes"] = {_FILENAMES[f]: _size(os.path.join(staging, _FILENAMES[f])) for f in formats}


def _remove_staging(staging):
    """Remove a failed export's staging directory, unless it holds earlier artifacts not put back."""
    aside = os.path.join(staging, ".replaced")
    if os.path.isdir(aside) and os.listdir(aside):
        return
    shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    _convert_main(sys.argv[1:])

"""Export a pruned model: SavedModel, ``.keras``, TFLite and a kept-feature manifest.

:func:`export_pruned` runs :func:`keras_group_lasso.surgery.prune_model` and
writes into one directory::

    <directory>/
      saved_model/    TensorFlow SavedModel, signature ``serving_default``
      model.keras     the pruned Keras model
      model.tflite    TFLite flatbuffer (only with ``"tflite"`` in ``formats``)
      manifest.json   kept features, layer sizes and parameter counts before/after

Everything is built in a hidden staging directory and renamed into place, one
whole artifact at a time, so no artifact is ever half-written under its final
name and a failure leaves nothing partial behind. Only these four names, and
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

TensorFlow is imported only for the SavedModel and TFLite formats. The pruned
model is made of Keras's own layers, so every artifact loads and runs with
plain Keras / TensorFlow, without this package.
"""

import dataclasses
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

from keras_group_lasso import surgery
from keras_group_lasso._distributed import is_chief
from keras_group_lasso._validation import check_choice, check_non_negative, check_positive_int, fail
from keras_group_lasso.graph import registry

__all__ = ["export_pruned", "ExportResult", "FORMATS", "ARTIFACTS"]

_OWNER = "export_pruned"
FORMATS = ("saved_model", "keras", "tflite")
_FILENAMES = {
    "saved_model": "saved_model",
    "keras": "model.keras",
    "tflite": "model.tflite",
    "manifest": "manifest.json",
}
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
            (``"saved_model"``, ``"keras"``, ``"tflite"``) and ``"manifest"``.
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
    try:
        items = tuple(formats)
    except TypeError:
        fail(_OWNER, "formats", constraint, formats)
    if (
        not items
        or any(not isinstance(f, str) or f not in FORMATS for f in items)
        or len(set(items)) != len(items)
    ):
        fail(_OWNER, "formats", constraint, formats)
    return items


def _check_directory(directory, overwrite, contents=True):
    """The absolute target; with ``contents``, also what is there now, after dealing with what killed exports
    left (only the writing process looks: on a shared file system the chief may already have written it)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        fail(_OWNER, "directory", "a non-empty path (str or os.PathLike)", directory)
    target = os.path.abspath(os.fspath(directory))
    if contents:
        if os.path.lexists(target) and (not os.path.isdir(target) or os.path.islink(target)):
            fail(_OWNER, "directory", "a directory path, not an existing file or link", directory)
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


def _write_saved_model(tf, model, path):
    model.export(
        path,
        format="tf_saved_model",
        verbose=False,
        input_signature=_input_signature(tf, model),
    )


def _write_tflite(tf, saved_model_path, path):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_path, [SIGNATURE])
    try:
        flatbuffer = converter.convert()
    except Exception as error:  # noqa: BLE001 - the converter raises its own ConverterError
        if "seed_generator_state" in str(error):
            raise ValueError(
                "export_pruned: TFLite cannot hold the random-seed state (uint32) that recurrent and attention "
                "layers keep for their dropout, which a SavedModel written from the JAX backend carries; "
                "export the TFLite file with KERAS_BACKEND=tensorflow (the .keras file loads there)"
            ) from error
        if "tensor list" not in str(error).lower():
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
        flatbuffer = converter.convert()
    with open(path, "wb") as f:
        f.write(flatbuffer)


def _write_serving_formats(tf, small, staging, formats):
    """SavedModel (and TFLite, converted from it) of ``small`` into ``staging``."""
    saved_model = os.path.join(staging, _FILENAMES["saved_model"] if "saved_model" in formats else ".saved_model")
    tflite = os.path.join(staging, _FILENAMES["tflite"]) if "tflite" in formats else None
    if keras.backend.backend() == "torch":
        _convert_in_tensorflow(small, staging, saved_model, tflite)
    else:
        _write_saved_model(tf, _serving_model(small), saved_model)
        if tflite is not None:
            _write_tflite(tf, saved_model, tflite)
    if "saved_model" in formats:
        _follow_umask(saved_model, staging)
    else:
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


def _convert_in_tensorflow(small, staging, saved_model, tflite):
    """The serving formats of ``small`` written by a TensorFlow-backend child process.

    Keras on PyTorch writes a SavedModel only through ``torch_xla``. The pruned
    model is made of Keras's own layers, so its ``.keras`` file loads on any
    backend: a child process with ``KERAS_BACKEND=tensorflow`` loads it and
    writes the same SavedModel and TFLite files the other backends write.
    """
    source = os.path.join(staging, ".pruned.keras")
    small.save(source)
    command = [sys.executable, "-m", "keras_group_lasso.export", source, saved_model] + ([tflite] if tflite else [])
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    os.remove(source)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(
            f"{_OWNER}: writing the SavedModel in a TensorFlow-backend process (the PyTorch backend "
            f"cannot write one without torch_xla) failed with exit status {done.returncode}:\n{tail}"
        )


def _convert_main(argv):
    """``python -m keras_group_lasso.export MODEL.keras SAVED_MODEL [TFLITE]`` (TensorFlow backend)."""
    import tensorflow as tf

    small = keras.saving.load_model(argv[0], compile=False)
    _write_saved_model(tf, _serving_model(small), argv[1])
    if len(argv) > 2:
        _write_tflite(tf, argv[1], argv[2])


def _output_units(report):
    outputs = [layer.units for layer in report.layers if layer.is_output]
    return outputs[0] if len(outputs) == 1 else None


def _manifest(report, small, threshold, inputs, formats):
    from keras_group_lasso import __version__

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
    if "saved_model" in formats or "tflite" in formats:
        shape = list(small.inputs[0].shape)
        shape[0] = None
        manifest["serving"] = {
            "signature": SIGNATURE,
            "input": INPUT_NAME,
            "input_shape": shape,
            "dtype": "float32",
            "output": "output_0",
        }
        if len(small.inputs) > 1:  # one named argument per input, in its own dtype
            manifest["serving"] = {
                "signature": SIGNATURE,
                "inputs": [{"name": t.name, "shape": [None] + list(t.shape[1:]),
                            "dtype": keras.backend.standardize_dtype(t.dtype)} for t in small.inputs],
                "output": "output_0",
            }
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
):
    """Prune ``model`` and write the smaller model plus a manifest to ``directory``.

    The pruned model is ``prune_model(model, threshold, inputs, round_to, fold_batchnorm)``: on any
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

    On the PyTorch backend (where Keras writes a SavedModel only through
    ``torch_xla``) the SavedModel and TFLite files are written by a child
    process with ``KERAS_BACKEND=tensorflow`` from the pruned ``.keras`` file:
    the same files, a few seconds more.

    ``manifest.json`` holds the kept feature indices, layer sizes and parameter
    counts before/after (``params_before`` / ``params_after`` as in the report,
    Dense kernels and biases; ``exported_model_params`` as the exported Keras
    model counts them), ``round_to``, ``folded_batchnorms`` (BatchNormalization
    layers merged into the layer before them), the threshold, the formats and
    the package version.

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
            (``saved_model``, ``model.keras``, ``model.tflite``,
            ``manifest.json``) unless ``overwrite=True``. When training spans several
            processes, call this on every process: each prunes, only the
            chief (:func:`keras_group_lasso.is_chief`) checks and writes the
            directory, and every process gets the same result.
        threshold: weights with ``|w| <= threshold`` count as zero.
        formats: names from ``("saved_model", "keras", "tflite")``.
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

    Returns:
        :class:`ExportResult` with the absolute paths, the manifest, the report
        and the earlier artifacts replaced or removed.

    Raises:
        InvalidParameterError: for bad arguments or a ``directory`` that holds
            an artifact without ``overwrite=True``.
        keras_group_lasso.surgery.UnsupportedModelError: if the model cannot be
            pruned (nothing is written).
        ImportError: if a format needs TensorFlow and it is not installed.
        RuntimeError: on PyTorch, if the TensorFlow child process fails (its
            error output is in the message; nothing is written).

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
    chief = is_chief()
    target = _check_directory(directory, overwrite, contents=chief)
    tf = _import_tensorflow(formats) if set(formats) - {"keras"} else None

    # Every process prunes (on JAX over several processes the model's arrays span them all, so the
    # surgery's computations are collective); only the chief writes.
    small = surgery.prune_model(model, threshold=threshold, inputs=inputs, round_to=round_to,
                                fold_batchnorm=fold_batchnorm)
    report = small.pruning_report
    paths = {f: os.path.join(target, _FILENAMES[f]) for f in formats}
    paths["manifest"] = os.path.join(target, _FILENAMES["manifest"])
    manifest = _manifest(report, small, threshold, inputs, formats)
    if not chief:
        return ExportResult(directory=target, paths=paths, manifest=manifest, report=report)

    written = [_FILENAMES[f] for f in formats] + [_FILENAMES["manifest"]]
    parent = os.path.dirname(target)
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
            if "keras" in formats:
                small.save(os.path.join(staging, _FILENAMES["keras"]))
            if "saved_model" in formats or "tflite" in formats:
                _write_serving_formats(tf, small, staging, formats)
            _write_manifest_file(os.path.join(staging, _FILENAMES["manifest"]), manifest)
            if new:
                os.rename(staging, target)
            else:
                replaced, removed = _replace_artifacts(staging, target, written, overwrite, directory)
        except BaseException:
            _remove_staging(staging)
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


def _remove_staging(staging):
    """Remove a failed export's staging directory, unless it holds earlier artifacts not put back."""
    aside = os.path.join(staging, ".replaced")
    if os.path.isdir(aside) and os.listdir(aside):
        return
    shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    _convert_main(sys.argv[1:])

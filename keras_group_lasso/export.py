"""Export a pruned model: SavedModel, ``.keras``, TFLite and a kept-feature manifest.

:func:`export_pruned` runs :func:`keras_group_lasso.surgery.prune_model` and
writes into one directory::

    <directory>/
      saved_model/    TensorFlow SavedModel, signature ``serving_default``
      model.keras     the pruned Keras model
      model.tflite    TFLite flatbuffer (only with ``"tflite"`` in ``formats``)
      manifest.json   kept features, layer sizes and parameter counts before/after

Everything is built in a hidden temporary directory next to the target and
renamed into place at the end, so a failure leaves nothing partial behind.
TensorFlow is imported only for the SavedModel and TFLite formats. The pruned
model is made of Keras's own layers, so every artifact loads and runs with
plain Keras / TensorFlow, without this package.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import keras

from keras_group_lasso import surgery
from keras_group_lasso._distributed import is_chief
from keras_group_lasso._validation import check_choice, check_non_negative, check_positive_int, fail

__all__ = ["export_pruned", "ExportResult", "FORMATS"]

_OWNER = "export_pruned"
FORMATS = ("saved_model", "keras", "tflite")
_FILENAMES = {
    "saved_model": "saved_model",
    "keras": "model.keras",
    "tflite": "model.tflite",
    "manifest": "manifest.json",
}
SIGNATURE = "serving_default"
INPUT_NAME = "features"
MANIFEST_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What :func:`export_pruned` wrote.

    Attributes:
        directory: absolute path of the export directory.
        paths: absolute path of each written artifact, keyed by format
            (``"saved_model"``, ``"keras"``, ``"tflite"``) and ``"manifest"``.
        manifest: the content of ``manifest.json``.
        report: the :class:`~keras_group_lasso.analysis.SparsityReport` the
            pruning was based on (``str(report)`` is the before/after table).
    """

    directory: str
    paths: dict
    manifest: dict
    report: object


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
    """The absolute target; with ``contents``, also what is there now (only the writing process looks:
    on a shared file system the chief may already have written it)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        fail(_OWNER, "directory", "a non-empty path (str or os.PathLike)", directory)
    target = os.path.abspath(os.fspath(directory))
    if contents and os.path.lexists(target):
        if not os.path.isdir(target) or os.path.islink(target):
            fail(_OWNER, "directory", "a directory path, not an existing file or link", directory)
        if os.listdir(target) and not overwrite:
            fail(
                _OWNER,
                "directory",
                "a new or empty directory (pass overwrite=True to replace it)",
                directory,
            )
    return target


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


def _input_spec(tf, model):
    shape = list(model.inputs[0].shape)
    shape[0] = None
    return tf.TensorSpec(shape, tf.float32, name=INPUT_NAME)


# Layers that are the identity at inference. Left out of the serving formats: on JAX their
# random seed state would be exported as a uint32 variable, which TFLite cannot convert.
_TRAINING_ONLY = ("Dropout", "GaussianDropout", "GaussianNoise", "AlphaDropout")


def _serving_model(small):
    """``small`` without its training-only layers (the same outputs at inference), sharing its layers."""
    layers = [layer for layer in small.layers if not isinstance(layer, keras.layers.InputLayer)]
    training_only = tuple(getattr(keras.layers, name) for name in _TRAINING_ONLY)
    if not any(type(layer) in training_only for layer in layers):
        return small
    source = small.inputs[0]
    inputs = keras.Input(shape=tuple(source.shape[1:]), dtype=source.dtype)
    x = inputs
    for layer in layers:  # a pruned model is one chain
        if type(layer) not in training_only:
            x = layer(x)
    return keras.Model(inputs, x, name=small.name)


def _write_saved_model(tf, model, path):
    model.export(
        path,
        format="tf_saved_model",
        verbose=False,
        input_signature=[_input_spec(tf, model)],
    )


def _write_tflite(tf, saved_model_path, path):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_path, [SIGNATURE])
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
    if "saved_model" not in formats:
        shutil.rmtree(saved_model)


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
    return manifest


def _write_manifest_file(path, manifest):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


def _move_into_place(staging, target, parent):
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    # Move the old directory aside first, so the target is never half-replaced.
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
    os.rmdir(old)
    os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


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

    Args:
        model: a trained Sequential or Functional Keras model (see
            :func:`~keras_group_lasso.surgery.prune_model` for what is supported).
        directory: where to write; created if missing. It must not exist or
            be empty unless ``overwrite=True``. When training spans several
            processes, call this on every process: each prunes, only the
            chief (:func:`keras_group_lasso.is_chief`) checks and writes the
            directory, and every process gets the same result.
        threshold: weights with ``|w| <= threshold`` count as zero.
        formats: names from ``("saved_model", "keras", "tflite")``.
        inputs: ``"original"`` (the exported model takes the full feature
            vector) or ``"selected"`` (it takes only the kept features, in the
            order of ``manifest["kept_features"]``).
        overwrite: replace an existing non-empty ``directory``.
        round_to: each hidden layer keeps a multiple of it of its units (see
            :func:`~keras_group_lasso.surgery.prune_model`; 8 often runs faster).
        fold_batchnorm: merge each BatchNormalization that follows a Dense or
            convolution layer into it (see :func:`~keras_group_lasso.surgery.prune_model`).

    Returns:
        :class:`ExportResult` with the absolute paths, the manifest and the report.

    Raises:
        InvalidParameterError: for bad arguments or a non-empty ``directory``
            without ``overwrite=True``.
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
    if not chief:
        manifest = _manifest(report, small, threshold, inputs, formats)
        return ExportResult(directory=target, paths=paths, manifest=manifest, report=report)

    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-", dir=parent)
    try:
        if "keras" in formats:
            small.save(os.path.join(staging, _FILENAMES["keras"]))
        if "saved_model" in formats or "tflite" in formats:
            _write_serving_formats(tf, small, staging, formats)
        manifest = _manifest(report, small, threshold, inputs, formats)
        _write_manifest_file(os.path.join(staging, _FILENAMES["manifest"]), manifest)
        _move_into_place(staging, target, parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

    return ExportResult(directory=target, paths=paths, manifest=manifest, report=report)


if __name__ == "__main__":
    _convert_main(sys.argv[1:])

"""The per-epoch sparsity callback: watch the network shrink while it trains.

:class:`SparsityMonitor` reads the model's Dense weights at the end of an
epoch, describes them with :func:`keras_group_lasso.analysis.sparsity_report`
(the same definitions as the report and the surgery) and

* adds ``sparsity``, ``selected_features`` and ``live_neurons`` to the epoch's
  ``logs`` (the progress bar, ``History``, ``CSVLogger`` and a
  ``keras.callbacks.TensorBoard`` placed after it see them);
* with ``log_dir``, writes TensorBoard summaries: per-layer sparsity and live
  units, a histogram of each layer's group norms and, for image inputs, an
  image of each input feature's strength (the paper's Fig. 5 and 6).

TensorFlow is imported only when a summary is actually written, so the
callback runs on the JAX backend without TensorFlow as long as ``log_dir`` is
``None``.
"""

import importlib.util
import math
import os
import sys
import warnings

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._distributed import is_chief
from keras_group_lasso._validation import InvalidParameterError, NonFiniteError, check_non_negative, check_positive_int, fail
from keras_group_lasso.costs import LatencyTable
from keras_group_lasso.declared import declared_penalties

__all__ = ["SparsityMonitor"]

_OWNER = "SparsityMonitor"


def _tensorflow_installed():
    # A ``None`` entry in sys.modules means "imports of this name fail".
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"] is not None
    return importlib.util.find_spec("tensorflow") is not None


def _missing_tensorflow_error(log_dir):
    return ImportError(
        f"{_OWNER}: writing TensorBoard summaries (log_dir={log_dir!r}) needs TensorFlow "
        "installed (e.g. `pip install tensorflow-cpu`), also on the JAX backend. "
        "Pass log_dir=None to only add the values to the epoch's logs."
    )


def _check_log_dir(log_dir):
    """Refuse a ``log_dir`` that TensorFlow could not write into, before the first epoch."""
    if "://" in log_dir:  # gs://, s3://, hdfs://: only TensorFlow's file system can tell
        return
    path = os.path.abspath(log_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        fail(_OWNER, "log_dir", "a directory for the TensorBoard event files, not an existing file", log_dir)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        fail(_OWNER, "log_dir", f"a directory that can be created ({existing!r} is a file)", log_dir)
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(_OWNER, "log_dir", f"a writable directory ({existing!r} is not writable)", log_dir)


def _tf_summary(log_dir):
    try:
        import tensorflow as tf
    except ImportError as error:
        raise _missing_tensorflow_error(log_dir) from error
    return tf.summary


def feature_strength_image(strength, selected_features, shape):
    """Input feature strengths as a ``[1, H, W, 1]`` image with values in ``[0, 1]``.

    ``pixel = s_i / max_j s_j`` where ``s_i`` is feature ``i``'s outgoing-weight
    norm, and 0 for features that are not selected (so ignored borders are
    blank). Channels of an ``(H, W, C)`` input are merged by their L2 norm.

    Args:
        strength: per-feature strengths, shape ``(n_features,)``.
        selected_features: indices of the selected features.
        shape: ``(H, W)`` or ``(H, W, C)`` with ``H * W * C == n_features``.

    Returns:
        A float32 numpy array of shape ``(1, H, W, 1)``.

    Example:
        >>> feature_strength_image([0.5, 2.0, 1.0, 4.0], [1, 2, 3], (2, 2))[0, :, :, 0]
        array([[0.  , 0.5 ],
               [0.25, 1.  ]], dtype=float32)
    """
    strength = np.asarray(strength, dtype=np.float64).reshape(-1)
    mask = np.zeros(strength.shape, dtype=bool)
    mask[list(selected_features)] = True
    image = np.where(mask, strength, 0.0).reshape(shape)
    if image.ndim == 3:
        image = np.sqrt(np.sum(image**2, axis=-1))
    peak = image.max()
    if peak > 0:
        image = image / peak
    return image.astype(np.float32)[np.newaxis, :, :, np.newaxis]


class SparsityMonitor(keras.callbacks.Callback):
    """Report the network's group sparsity at the end of every ``every``-th epoch.

    With ``report = sparsity_report(model, threshold)`` it sets

    * ``logs["sparsity"] = report.sparsity`` (fraction of Dense weights with
      ``|w| <= threshold``),
    * ``logs["selected_features"] = len(report.selected_features)``,
    * ``logs["live_neurons"] = report.live_neurons`` (hidden units and
      channels alive),
    * ``logs["flops"] = report.flops_ratio`` (the fraction of the dense
      model's multiply-adds per sample that pruning at ``threshold`` would
      keep),
    * ``logs["live_heads"]``, for a model with attention layers: their live
      heads, all together,
    * with a latency table, ``logs["latency"]`` (the predicted time in
      **seconds** of one inference call of the pruned structure on a batch of
      the table's size) and ``logs["latency_speedup"]`` (the dense model's
      predicted time over it),

    and, with ``log_dir``, writes these TensorBoard summaries at step ``epoch``:
    scalars ``sparsity/total``, ``selected_features``, ``live_neurons``,
    ``flops/after`` (multiply-adds per sample), ``flops/ratio``,
    ``sparsity/<layer>``, ``live_units/stream/<merge>`` (live channels of a
    residual stream, each once), ``live_units/<layer>`` (neurons, or channels of a
    convolution), ``live_heads/<layer>`` (an attention layer's heads) and, with
    a latency table, ``latency/predicted`` (seconds) and ``latency/speedup``; histograms
    ``group_norms/<layer>`` (the L2 norm of each unit's outgoing weights); and,
    when the input is an image, the image ``input_feature_strength`` (see
    :func:`feature_strength_image`).

    A model whose input has axes of unknown size (``keras.Input((None, 8))``,
    ``(None, None, 1)``) is monitored like any other; its FLOPs are counted per
    position of those axes (``report.flops_per_position``, see
    :class:`~keras_group_lasso.analysis.SparsityReport`): ``logs["flops"]`` is
    the ratio of those counts, and the scalar ``flops/after`` is written as
    ``flops/after_per_position`` instead, so that it is not drawn next to
    counts per sample.

    On epochs that are not logged the keys are absent from ``logs``; a
    ``CSVLogger`` fixes its columns at the first epoch, so use ``every=1`` with it.

    When the weights are not finite (the training diverged), the callback does
    not stop the training and does not count NaN as zero: it warns once per
    training (a ``RuntimeWarning`` naming the weights), sets the four values
    to NaN, writes no summary for that epoch and sets ``last_report`` to
    ``None``. To stop such a training, add ``keras.callbacks.TerminateOnNaN()``.

    Args:
        threshold: weights with ``|w| <= threshold`` count as zero (the paper
            uses 1e-3).
        log_dir: directory for TensorBoard event files, or None for logs only.
            When training spans several processes only the chief writes
            (:func:`is_chief`); every process gets the logs.
            Writing needs TensorFlow installed (on any backend).
        every: report at the end of epochs ``every, 2 * every, ...``.
        latency_table: ``None`` or a :class:`~keras_group_lasso.LatencyTable`
            of the model at one batch size: the predicted latency is logged
            (table look-ups, nothing is timed) and kept in the report. With
            ``None``, the table of a :class:`~keras_group_lasso.SparsityBudget`
            with ``max_latency`` steering the same ``fit`` serves (at the
            budget's batch size); without either, no latency is logged.

    Attributes:
        last_report: the latest :class:`~keras_group_lasso.analysis.SparsityReport`
            (None before the first reported epoch, and after an epoch whose
            weights were not finite).

    Raises:
        InvalidParameterError: for a negative threshold, ``every`` that is not
            an integer >= 1, a ``log_dir`` that is not a path, is an existing
            file, or lies in a directory that cannot be written, a
            ``latency_table`` that is not a table of one batch size, or (when
            training starts) a model without a Dense layer or not the
            ``latency_table``'s model.
        ImportError: at construction if ``log_dir`` is set and TensorFlow is
            not installed.

    Examples:
        >>> import os, tempfile
        >>> from keras_group_lasso import Proximal, SparseGroupLasso
        >>> model = keras.Sequential([keras.Input((4,)),
        ...                           keras.layers.Dense(3, kernel_regularizer=SparseGroupLasso(0.05)),
        ...                           keras.layers.Dense(2, activation="softmax")])
        >>> model.compile(optimizer=Proximal(keras.optimizers.SGD(0.1, momentum=0.9)),
        ...               loss="sparse_categorical_crossentropy")
        >>> x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")   # only feature 0 matters
        >>> with tempfile.TemporaryDirectory() as log_dir:
        ...     monitor = SparsityMonitor(threshold=1e-3, log_dir=log_dir, every=5)
        ...     history = model.fit(x, y, epochs=20, batch_size=64, verbose=0, callbacks=[monitor])
        ...     os.listdir(log_dir)   # TensorBoard event file
        ['events.out.tfevents...']
        >>> history.history["selected_features"][-1], monitor.last_report.selected_features
        (1, (0,))
    """

    def __init__(self, threshold=1e-3, log_dir=None, every=1, latency_table=None):
        super().__init__()
        self.threshold = check_non_negative(_OWNER, "threshold", threshold)
        self.every = check_positive_int(_OWNER, "every", every)
        if latency_table is not None:
            if not isinstance(latency_table, LatencyTable):
                fail(_OWNER, "latency_table", "None or a LatencyTable", latency_table)
            if len(latency_table.batch_sizes) > 1:
                fail(_OWNER, "latency_table", "a LatencyTable of one batch size", latency_table)
        self.latency_table = latency_table
        if log_dir is not None:
            if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
                fail(_OWNER, "log_dir", "a non-empty path (str or os.PathLike) or None", log_dir)
            log_dir = os.fspath(log_dir)
            _check_log_dir(log_dir)
            if not _tensorflow_installed():
                raise _missing_tensorflow_error(log_dir)
        self.log_dir = log_dir
        self.last_report = None
        self._writer = None
        self._model_checked = False
        self._warned_non_finite = False

    def _check_model(self):
        try:
            analysis.dense_layers(self.model)
        except InvalidParameterError:
            fail(
                _OWNER,
                "model",
                "a keras.Model with at least one Dense or convolution layer (the layers whose sparsity it reports)",
                self.model,
            )
        if self.latency_table is not None:
            self.latency_table.check_model(self.model, owner=_OWNER, name="latency_table")
        self._model_checked = True

    def on_train_begin(self, logs=None):
        self._model_checked = False
        self._warned_non_finite = False
        declared = declared_penalties(self.model)
        if declared is not None:  # a fit that failed may have left a budget's table; a budget of this fit sets it again
            declared.training_latency = None
        # A Sequential without an Input is built by its first step (TensorFlow
        # backend): then the check waits for the end of the first epoch.
        if self.model.built:
            self._check_model()

    def on_epoch_end(self, epoch, logs=None):
        if not self._model_checked:
            self._check_model()
        if (epoch + 1) % self.every != 0:
            return
        try:
            found = analysis.analyze(self.model, threshold=self.threshold, owner="sparsity_report")
        except NonFiniteError as error:
            self._non_finite(epoch, error, logs)
            return
        report = self._with_latency(found)
        self.last_report = report
        if logs is not None:
            logs["sparsity"] = float(report.sparsity)
            logs["selected_features"] = len(report.selected_features)
            logs["live_neurons"] = int(report.live_neurons)
            logs["flops"] = float(report.flops_ratio)
            if any(layer.heads for layer in report.layers):  # attention layers: their live heads, all together
                logs["live_heads"] = int(sum(layer.heads_alive for layer in report.layers))
            if report.latency_after is not None:
                logs["latency"] = float(report.latency_after)
                logs["latency_speedup"] = float(report.latency_speedup)
        if self.log_dir is not None:
            self._write_summaries(report, epoch)

    def _serving_table(self):
        """``(latency table, batch size)``: its own, or a latency budget's in the same ``fit``; else ``None``."""
        if self.latency_table is not None:
            return self.latency_table, self.latency_table.batch_sizes[0]
        declared = declared_penalties(self.model)
        return None if declared is None else declared.training_latency

    def _with_latency(self, found):
        """The report of ``found``, with the predicted latency when a table serves (look-ups only)."""
        serving = self._serving_table()
        if serving is None:
            return found.report
        table, batch = serving
        return table.annotate(found, batch)

    def _has_heads(self):
        """Whether the model has attention layers (``live_heads`` is logged), read from its weights with the
        values that are not finite as zeros."""
        values = {w.path: np.nan_to_num(np.asarray(keras.ops.convert_to_numpy(w)), nan=0.0, posinf=0.0, neginf=0.0)
                  for w in self.model.weights if keras.backend.standardize_dtype(w.dtype).startswith("float")}
        try:
            found = analysis.analyze(self.model, threshold=self.threshold, owner="sparsity_report", values=values)
        except Exception:  # noqa: BLE001 - the epoch's other keys are NaN either way
            return False
        return any(layer.heads for layer in found.report.layers)

    def _non_finite(self, epoch, error, logs):
        self.last_report = None
        if logs is not None:
            latency = ("latency", "latency_speedup") if self._serving_table() is not None else ()
            heads = ("live_heads",) if self._has_heads() else ()  # every epoch logs the same keys
            for key in ("sparsity", "selected_features", "live_neurons", "flops") + latency + heads:
                logs[key] = float("nan")
        if not self._warned_non_finite:
            self._warned_non_finite = True
            warnings.warn(
                f"{_OWNER}: at the end of epoch {epoch + 1} the weights are not finite "
                f"({', '.join(error.names)}): sparsity, selected_features, live_neurons and flops are NaN "
                "while they stay so. The training diverged: scale the inputs or lower the learning "
                "rate; keras.callbacks.TerminateOnNaN() stops such a training.",
                RuntimeWarning,
                stacklevel=2,
            )

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write_summaries(self, report, step):
        if not is_chief():  # every process computes the same report; one writes it
            return
        summary = _tf_summary(self.log_dir)
        if self._writer is None:
            self._writer = summary.create_file_writer(self.log_dir)
        scalars = [
            ("sparsity/total", report.sparsity),
            ("selected_features", len(report.selected_features)),
            ("live_neurons", report.live_neurons),
            ("flops/after_per_position" if report.flops_per_position else "flops/after", report.flops_after),
            ("flops/ratio", report.flops_ratio),
        ]
        if report.latency_after is not None:
            scalars += [("latency/predicted", report.latency_after), ("latency/speedup", report.latency_speedup)]
        for layer in report.layers:
            scalars.append((f"sparsity/{layer.name}", layer.sparsity))
            scalars.append((f"live_units/{layer.name}", layer.units_alive))
            if layer.heads:
                scalars.append((f"live_heads/{layer.name}", layer.heads_alive))
        for stream in report.streams:  # a residual stream's channels, each counted once
            scalars.append((f"live_units/stream/{stream.name}", stream.channels_alive))
        norms = analysis.layer_group_norms(self.model)
        image_shape = analysis.image_shape(self.model)
        if image_shape is not None and math.prod(image_shape) != report.n_features:
            image_shape = None  # e.g. a Dense applied to the last axis of an unflattened input
        # Scalars and histograms go out as one protobuf built with numpy: the same
        # records as tf.summary.scalar / histogram, at a fraction of the cost
        # of running their eager TensorFlow ops one by one.
        from tensorboard.plugins.histogram.summary_v2 import histogram_pb
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        proto = scalar_pb(*scalars[0])
        for tag, value in scalars[1:]:
            proto.MergeFrom(scalar_pb(tag, np.float32(value)))
        for name, values in norms.items():
            proto.MergeFrom(histogram_pb(f"group_norms/{name}", np.asarray(values, np.float64)))
        with self._writer.as_default(step=step):
            summary.experimental.write_raw_pb(proto.SerializeToString(), step=step)
            if image_shape is not None:
                image = feature_strength_image(
                    analysis.input_feature_strength(self.model),
                    report.selected_features,
                    image_shape,
                )
                summary.image("input_feature_strength", image)
        self._writer.flush()

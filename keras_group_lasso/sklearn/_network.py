"""The Keras side of the estimators: build, train (fast on small data) and export an MLP.

Two costs dominate a small scikit-learn-sized fit, and this module removes both:

* Keras's per-epoch work. Training runs as *one* Keras epoch over an endless
  stream of fixed-size, reshuffled mini-batches, with ``steps_per_execution``
  set to one pass over the data (one step on PyTorch, where Keras allows no
  more); a callback sees every pass (loss history, early stopping, logging).
* Tracing / compiling the train step (about 1 s on TensorFlow and 2 s on JAX
  for a small MLP, more than the training itself on DIGITS). The penalty
  strengths are non-trainable variables read inside the compiled step (under
  proximal training, the strength multiplier that
  :class:`~keras_group_lasso.Proximal` reads), so one :class:`Network` trains
  at any strength: a regularization path compiles once for all its points.
  Between fits, an idle network of the same :class:`Spec` is taken from
  :data:`NETWORKS` (a :class:`NetworkPool`) rather than compiled again, so a
  ``GridSearchCV`` or a cross-validated path compiles once per shape. A fit
  sets its network's weights from its seed and zeroes its optimizer state,
  so two fits with the same seed give the same weights whether the network
  was new or not. The pool is the one process-wide object of this layer and
  holds nothing a result depends on; it is kept (not a network per fit)
  because compiling again cost scikit-learn's estimator checks 435 s instead
  of 89 s on JAX, about 2 s per fit.

The estimator never sees these training networks: after training, the weights
are copied into a plain ``keras.Sequential`` of Dense layers carrying this
package's penalties at the fitted strength (:func:`build_export_model`).

This module also holds the training recipe that ``fit`` and the path share
on plain arrays and values: the declared parameters (:data:`PARAMETER_CONSTRAINTS`),
the seeds, the held-out split, the network's :class:`Spec` and the score.
"""

import collections
import logging
import math
import numbers
import threading

import keras
import numpy as np
from keras import ops
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state

from keras_group_lasso._validation import NonFiniteError
from keras_group_lasso.analysis import sparsity_report
from keras_group_lasso.declared import link_penalty_multiplier
from keras_group_lasso.optimizers import Proximal
from keras_group_lasso.regularizers import (
    GroupLasso,
    HiddenGroupLasso,
    InputGroupLasso,
    SparseGroupLasso,
)
from keras_group_lasso.sklearn._constraints import Interval, ParameterError, StrOptions

logger = logging.getLogger("keras_group_lasso.sklearn")

PENALTIES = ("sgl", "group", "l1", "l2")
OPTIMIZERS = ("adam", "sgd")
TASKS = ("classification", "regression")
_SEED_MAX = 2**31 - 1

# Declared constraints of the parameters of the network and its training (see _constraints.py), shared by
# the estimators and the path function.
PARAMETER_CONSTRAINTS = {
    "hidden_layer_sizes": ["array-like", Interval(numbers.Integral, 1, None, closed="left")],
    "alpha": [Interval(numbers.Real, 0, None, closed="left")],
    "input_alpha": [Interval(numbers.Real, 0, None, closed="left"), None],
    "penalty": [StrOptions(set(PENALTIES))],
    "l1_ratio": [Interval(numbers.Real, 0, None, closed="left")],
    "optimizer": [StrOptions(set(OPTIMIZERS))],
    "learning_rate": [Interval(numbers.Real, 0, None, closed="neither")],
    "epochs": [Interval(numbers.Integral, 1, None, closed="left")],
    "batch_size": [StrOptions({"auto"}), Interval(numbers.Integral, 1, None, closed="left")],
    "threshold": [Interval(numbers.Real, 0, None, closed="left")],
    "proximal": ["boolean"],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(numbers.Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(numbers.Integral, 1, None, closed="left")],
    "tol": [Interval(numbers.Real, 0, None, closed="left")],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
}


def hidden_sizes(value, owner):
    """``hidden_layer_sizes`` as a tuple of ints; :class:`ParameterError` (named after ``owner``) if it is none."""
    sizes = [value] if isinstance(value, numbers.Integral) else value
    try:
        sizes = list(sizes)
    except TypeError:
        sizes = None
    if sizes is None or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise ParameterError(
            f"The 'hidden_layer_sizes' parameter of {owner} must be an int >= 1 or a sequence "
            f"of ints >= 1. Got {value!r} instead."
        )
    return tuple(int(s) for s in sizes)


def draw_seeds(random_state):
    """``(init, data, split)`` seeds drawn from ``random_state`` (anything ``check_random_state`` takes)."""
    rng = check_random_state(random_state)
    return [int(s) for s in rng.randint(0, _SEED_MAX, size=3)]


def holdout(x, y, fraction, seed, task):
    """``(x_train, x_val, y_train, y_val)``: ``fraction`` of the rows held out (stratified for classification)."""
    stratify = y if task == "classification" else None
    return train_test_split(x, y, test_size=fraction, random_state=seed, stratify=stratify)


def score_outputs(task, outputs, y):
    """Accuracy (classification, ``y`` class indices) or R² of network outputs; higher is better."""
    if task == "classification":
        return accuracy_score(y, outputs.argmax(axis=1))
    return r2_score(y, outputs)


def resolved_batch_size(batch_size):
    """The rows of a training step: ``batch_size``, with ``"auto"`` 200."""
    return 200 if batch_size == "auto" else int(batch_size)


def make_spec(task, hidden, n_features, n_outputs, n_train, *, penalty, l1_ratio, optimizer, proximal, batch_size):
    """The :class:`Spec` of the training network (``batch_size``: ``"auto"`` is 200)."""
    # Not clipped to the data: a step with more rows than samples takes
    # rows from consecutive reshuffled passes, and every small data set
    # then trains with the same batch shape.
    batch_size = resolved_batch_size(batch_size)
    return Spec(
        n_features=int(n_features),
        hidden=tuple(hidden),
        n_outputs=int(n_outputs),
        task=task,
        penalty=penalty,
        l1_ratio=float(l1_ratio),
        optimizer=optimizer,
        proximal=bool(proximal),
        batch_size=batch_size,
        steps_per_pass=-(-int(n_train) // batch_size),
    )


def check_finite(owner, task, learning_rate, monitor, weights, passes):
    """Raise :class:`~keras_group_lasso.NonFiniteError` when a training diverged.

    Diverged: a pass's loss was NaN or infinite (``monitor.diverged_at``), or
    a weight is not finite. As scikit-learn's MLP does, the message points at
    the usual cause, input data with large values.
    """
    names = [
        f"{'output' if i == len(weights) // 2 - 1 else f'hidden_{i + 1}'}/{kind}"
        for i in range(len(weights) // 2)
        for kind in ("kernel", "bias")
    ]
    broken = [name for name, w in zip(names, weights) if not np.all(np.isfinite(w))]
    if monitor.diverged_at is None and not broken:
        return
    found = []
    if monitor.diverged_at is not None:
        loss = monitor.loss[monitor.diverged_at - 1]
        found.append(f"the loss became {loss} at pass {monitor.diverged_at} of {passes} (training stopped there)")
    if broken:
        found.append(f"the weights are not finite ({', '.join(broken)})")
    targets = " and large targets" if task == "regression" else ""
    raise NonFiniteError(
        f"{owner}: the training diverged: {' and '.join(found)}. The input data may contain large values "
        f"and need to be preprocessed: scale the features{targets}, e.g. with "
        "sklearn.preprocessing.StandardScaler in a pipeline, or lower learning_rate "
        f"(now {learning_rate!r}).",
        names=broken,
    )


# ----------------------------------------------------------------------------- penalties


def layer_penalties(penalty, alpha, l1_ratio, position, input_alpha=None):
    """``(kernel_regularizer, bias_regularizer)`` of the Dense layer at ``position`` (0 reads the input).

    The paper's groups: the first kernel gets input groups (feature selection)
    with strength ``input_alpha`` (default ``alpha``), every later kernel hidden
    groups (neuron pruning), every bias bias groups, with strength ``alpha``;
    ``"sgl"`` adds ``strength * l1_ratio * sum |w|`` to each. ``"l1"`` / ``"l2"``
    are Keras's ``L1`` / ``L2`` with the same strengths on every kernel and bias.
    """
    alpha = float(alpha)
    kernel_alpha = alpha if position != 0 or input_alpha is None else float(input_alpha)
    if penalty in ("l1", "l2"):
        kind = keras.regularizers.L1 if penalty == "l1" else keras.regularizers.L2
        return kind(kernel_alpha), kind(alpha)
    ratio = l1_ratio if penalty == "sgl" else 0.0
    kind = InputGroupLasso if position == 0 else HiddenGroupLasso
    bias = SparseGroupLasso(alpha, l1=alpha * ratio) if penalty == "sgl" else GroupLasso(alpha)
    return kind(kernel_alpha, l1=kernel_alpha * ratio), bias


class _Scaled(keras.regularizers.Regularizer):
    """``alpha * penalty(x)`` with ``alpha`` a model variable, so changing it needs no retrace."""

    def __init__(self, penalty, strength):
        self.penalty = penalty
        self.strength = strength

    def __call__(self, x):
        value = self.penalty(x)
        return ops.cast(self.strength, value.dtype) * value

    def get_config(self):  # pragma: no cover - training networks are never saved
        return {}


class _PenaltyStrength(keras.layers.Layer):
    """First layer of a training network: owns the penalty strengths and the feature mask.

    ``alpha`` and ``input_alpha`` scale the penalties of subgradient training
    (and Keras's ``L1`` / ``L2``); ``multiplier`` is ``[input_alpha, alpha]``,
    the strength multiplier the group-sparse penalties of proximal training
    are linked to (:func:`keras_group_lasso.declared.link_penalty_multiplier`),
    which :class:`~keras_group_lasso.Proximal` keeps a copy of in its state.

    Its output is ``inputs * mask``: a feature whose mask entry is 0 reaches no
    weight, so its input group gets no data gradient (the regularization path
    keeps dropped features out this way). Owning the variables through a layer
    makes them model variables, which the JAX trainer passes into its jitted
    step (a variable outside the model would be frozen into the compiled
    function); on TensorFlow a variable is read afresh at every step anyway.
    """

    def build(self, input_shape):
        self.alpha = self.add_weight(shape=(), initializer="zeros", trainable=False, name="alpha")
        self.input_alpha = self.add_weight(shape=(), initializer="zeros", trainable=False, name="input_alpha")
        self.multiplier = self.add_weight(shape=(2,), initializer="zeros", trainable=False, name="multiplier")
        self.mask = self.add_weight(shape=(input_shape[-1],), initializer="ones", trainable=False, name="mask")
        super().build(input_shape)

    def call(self, inputs):
        return inputs * ops.cast(self.mask, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


# ----------------------------------------------------------------------------- networks


Spec = collections.namedtuple(
    "Spec",
    "n_features hidden n_outputs task penalty l1_ratio optimizer proximal batch_size steps_per_pass",
)
Spec.__doc__ = """Everything that fixes a compiled training network (its shapes, penalties and optimizer).

``proximal``: whether the network trains with :class:`~keras_group_lasso.Proximal`.
The penalty strengths are variables either way, so they are not part of the key.
"""


def _loss(task):
    return "sparse_categorical_crossentropy" if task == "classification" else "mean_squared_error"


def _output_activation(task):
    return "softmax" if task == "classification" else "linear"


def _make_optimizer(name, learning_rate, proximal):
    inner = keras.optimizers.Adam(learning_rate) if name == "adam" else keras.optimizers.SGD(learning_rate)
    if not proximal:
        return inner
    return Proximal(inner)


class Network:
    """A compiled training MLP for one :class:`Spec`, reusable across strengths and warm starts.

    Its owner (one ``fit``, one path) builds it, sets its weights, optimizer
    state, strengths and mask, trains it, and drops it.
    """

    def __init__(self, spec):
        self.spec = spec
        sizes = tuple(spec.hidden) + (spec.n_outputs,)
        self.strength = _PenaltyStrength(name="penalty_strength")
        self.strength.build((None, spec.n_features))
        # Penalties at strength 1, scaled by variables so that a new strength needs no retrace:
        # by the strength multiplier Proximal reads for its proximal steps, else by a wrapper.
        linked = spec.proximal and spec.penalty in ("sgl", "group")
        layers = [keras.Input((spec.n_features,)), self.strength]
        for position, units in enumerate(sizes):
            kernel_reg, bias_reg = layer_penalties(spec.penalty, 1.0, spec.l1_ratio, position)
            if not linked:
                strength = self.strength
                kernel_reg = _Scaled(kernel_reg, strength.input_alpha if position == 0 else strength.alpha)
                bias_reg = _Scaled(bias_reg, strength.alpha)
            last = position == len(sizes) - 1
            layers.append(
                keras.layers.Dense(
                    units,
                    activation=_output_activation(spec.task) if last else "relu",
                    kernel_regularizer=kernel_reg,
                    bias_regularizer=bias_reg,
                )
            )
        self.model = keras.Sequential(layers)
        if linked:
            link_penalty_multiplier(self.model, self.strength.multiplier)
        self.dense = [layer for layer in self.model.layers if isinstance(layer, keras.layers.Dense)]
        # Keras on PyTorch refuses steps_per_execution > 1: there the monitor
        # counts the batches of a pass itself.
        per_call = 1 if keras.backend.backend() == "torch" else spec.steps_per_pass
        self.calls_per_pass = spec.steps_per_pass // per_call
        self.model.compile(
            optimizer=_make_optimizer(spec.optimizer, 1e-3, spec.proximal),
            loss=_loss(spec.task),
            steps_per_execution=per_call,
        )

    def set_alpha(self, alpha, input_alpha=None):
        """Set the penalty strengths (``input_alpha`` defaults to ``alpha``)."""
        input_alpha = alpha if input_alpha is None else input_alpha
        self.strength.alpha.assign(float(alpha))
        self.strength.input_alpha.assign(float(input_alpha))
        self.strength.multiplier.assign(np.asarray([input_alpha, alpha], dtype="float32"))
        self._copy_multiplier()

    def _copy_multiplier(self):
        # Proximal's copy of the multiplier, once it is built (it copies the model's when it builds).
        own = getattr(self.model.optimizer, "penalty_multiplier", None)
        if own is not None:
            own.assign(np.asarray(ops.convert_to_numpy(self.strength.multiplier), dtype="float32"))

    def get_mask(self):
        """The current feature mask as a bool array."""
        return np.asarray(ops.convert_to_numpy(self.strength.mask)) > 0

    def set_mask(self, mask=None):
        """Let only the features where ``mask`` is True reach the network (``None``: all)."""
        value = np.ones(self.spec.n_features, "float32") if mask is None else np.asarray(mask, "float32")
        self.strength.mask.assign(value)

    def set_weights(self, weights):
        for value, variable in zip(weights, self._weight_variables()):
            variable.assign(value)

    def get_weights(self):
        return [np.array(ops.convert_to_numpy(v)) for v in self._weight_variables()]

    def _weight_variables(self):
        out = []
        for layer in self.dense:
            out += [layer.kernel, layer.bias]
        return out

    def optimizer_state(self):
        """The optimizer's state (step counter, moments) as arrays, for :meth:`set_optimizer_state`."""
        return [np.array(ops.convert_to_numpy(v)) for v in self.model.optimizer.variables]

    def set_optimizer_state(self, values):
        """Set back a state of :meth:`optimizer_state` (a refit between two points leaves none of its own)."""
        for variable, value in zip(self.model.optimizer.variables, values):
            variable.assign(value)

    def reset_optimizer(self, learning_rate):
        """Zero the optimizer's state (step counter, moments) as if it were new."""
        optimizer = self.model.optimizer
        for variable in optimizer.variables:
            variable.assign(np.zeros(variable.shape, dtype=variable.dtype))
        self._copy_multiplier()  # Proximal's copy of the strength multiplier is state, not a moment
        optimizer.learning_rate = float(learning_rate)

    def train(self, x, y, passes, seed, monitor, verbose=0):
        """``passes`` reshuffled passes over ``(x, y)`` as one Keras epoch; returns passes run."""
        spec = self.spec
        steps = passes * spec.steps_per_pass
        batches = _batches(x, y, spec.batch_size, steps, seed)
        self.model.stop_training = False
        self.model.fit(
            batches,
            epochs=1,
            steps_per_epoch=steps,
            callbacks=[monitor],
            verbose=verbose,
            shuffle=False,
        )
        return monitor.passes

    def predict(self, x):
        return forward(self.get_weights(), x, self.spec.task)


def forward(weights, x, task):
    """The MLP's output computed in numpy (float64) from ``[W1, b1, ..., WL, bL]``.

    ``relu`` hidden layers, then softmax (classification) or identity.
    Much cheaper than calling a Keras model eagerly on small inputs, and it
    does not depend on the backend.
    """
    h = np.asarray(x, dtype=np.float64)
    last = len(weights) // 2 - 1
    for k in range(last + 1):
        h = h @ np.asarray(weights[2 * k], dtype=np.float64) + np.asarray(weights[2 * k + 1], dtype=np.float64)
        if k < last:
            h = np.maximum(h, 0.0)
    if task == "classification":
        h = np.exp(h - h.max(axis=1, keepdims=True))
        h /= h.sum(axis=1, keepdims=True)
    return h


def predict_with(model, x, chunk=8192):
    """``model(x)`` in chunks as float64 numpy, without ``predict``'s per-call overhead or tracing."""
    if len(x) == 0:
        return np.zeros((0,) + tuple(model.outputs[0].shape[1:]), dtype=np.float64)
    out = [
        np.asarray(ops.convert_to_numpy(model(x[i : i + chunk], training=False)), dtype=np.float64)
        for i in range(0, len(x), chunk)
    ]
    return np.concatenate(out, axis=0)


_MAX_PRECOMPUTED_INDICES = 2**24


def _index_batches(n, batch_size, seed):
    """Endless row indices: consecutive permutations of ``range(n)`` cut into ``batch_size`` rows.

    Every batch has the same shape (so the compiled step is reused); a pass's
    last rows are completed with the first rows of the next permutation.
    """
    rng = np.random.default_rng(seed)
    order = np.empty(0, dtype=np.int64)
    while True:
        while len(order) < batch_size:
            order = np.concatenate([order, rng.permutation(n)])
        rows, order = order[:batch_size], order[batch_size:]
        yield rows


def _batches(x, y, batch_size, steps, seed):
    """``steps`` mini-batches of ``(x, y)`` for ``fit``: the same rows on every backend.

    On TensorFlow a ``tf.data`` pipeline that gathers precomputed indices (no
    Python in the loop, and much cheaper to set up than ``from_generator``);
    elsewhere, or when the index table would be large, a Python generator.
    """
    indices = _index_batches(len(x), batch_size, seed)
    if keras.backend.backend() == "tensorflow" and steps * batch_size <= _MAX_PRECOMPUTED_INDICES:
        import tensorflow as tf

        table = np.stack([next(indices) for _ in range(steps)]).astype(np.int32)
        xs, ys = tf.constant(x), tf.constant(y)
        return tf.data.Dataset.from_tensor_slices(table).map(lambda rows: (tf.gather(xs, rows), tf.gather(ys, rows)))

    def generate():
        for rows in indices:
            yield x[rows], y[rows]

    return generate()


def glorot_weights(spec, seed):
    """Glorot-uniform kernels and zero biases drawn with numpy: identical on every backend."""
    rng = np.random.default_rng(seed)
    sizes = (spec.n_features,) + tuple(spec.hidden) + (spec.n_outputs,)
    weights = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        weights.append(rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype("float32"))
        weights.append(np.zeros(fan_out, dtype="float32"))
    return weights


# ----------------------------------------------------------------------------- idle networks


class NetworkPool:
    """Idle compiled training networks by :class:`Spec`, reused by the next fit of the same shape.

    :meth:`acquire` gives an idle network of the spec (or a new one); :meth:`release` gives it back once its
    training ended without error; at most ``size`` idle networks are kept, the least recently used dropped
    first. A user of a network sets its weights, optimizer state, strengths and mask before training it.
    """

    def __init__(self, size=8):
        self.size = size
        self._lock = threading.Lock()
        self._idle = collections.OrderedDict()  # Spec -> [Network, ...], least recently used first

    def acquire(self, spec):
        """A training network for ``spec``: an idle one, or a new one."""
        with self._lock:
            networks = self._idle.get(spec)
            if networks:
                network = networks.pop()
                if not networks:
                    del self._idle[spec]
                return network
        return Network(spec)

    def release(self, network):
        """Give ``network`` back (the least recently used idle ones beyond ``size`` are dropped)."""
        with self._lock:
            self._idle.setdefault(network.spec, []).append(network)
            self._idle.move_to_end(network.spec)
            while sum(len(v) for v in self._idle.values()) > self.size:
                spec, networks = next(iter(self._idle.items()))
                networks.pop(0)
                if not networks:
                    del self._idle[spec]

    def clear(self):
        """Forget every idle network."""
        with self._lock:
            self._idle.clear()


#: The estimators' and the path's idle training networks.
NETWORKS = NetworkPool()


# ----------------------------------------------------------------------------- per pass


class PassMonitor(keras.callbacks.Callback):
    """Called once per pass over the data: loss history, validation score, early stopping.

    Keras reports the running mean loss of the epoch; with equal-size batches
    and one pass per execution, pass ``k``'s own mean is ``k m_k - (k-1) m_{k-1}``.
    A pass whose loss is NaN or infinite stops the training (nothing after it
    can recover) and is recorded in ``diverged_at``; the estimator then raises.

    Args:
        score: ``None`` or a function ``network -> validation score`` (higher is better).
        n_iter_no_change: stop after this many passes without a score better
            than the best by more than ``tol`` (only with ``score``).
        tol: the improvement that counts.
        verbose: log one line per pass at INFO level.
    """

    def __init__(self, network, score=None, n_iter_no_change=None, tol=0.0, verbose=0):
        super().__init__()
        self.network = network
        self.score = score
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.verbose = verbose
        self.passes = 0
        self._calls = 0
        self.diverged_at = None
        self.loss = []
        self.val_score = []
        self._mean = 0.0
        self._best = -np.inf
        self._stale = 0

    def on_train_batch_end(self, batch, logs=None):
        self._calls += 1
        if self._calls % self.network.calls_per_pass:
            return  # inside a pass (a backend that runs one step per call)
        self.passes += 1
        k = self.passes
        mean = float(logs["loss"]) if logs and "loss" in logs else float("nan")
        self.loss.append(k * mean - (k - 1) * self._mean)
        self._mean = mean
        message = f"pass {k}: loss {self.loss[-1]:.5f}"
        if logs and "loss" in logs and not math.isfinite(self.loss[-1]):
            # No score either: the outputs of non-finite weights are NaN.
            self.diverged_at = k
            self.model.stop_training = True
            if self.verbose:
                logger.info(message + " (not finite: training stopped)")
            return
        if self.score is not None:
            # On JAX the weights live outside the variables during `fit`; put
            # them back before reading them (Keras re-reads them next step).
            sync = getattr(self.model, "jax_state_sync", None)
            if sync is not None:
                sync()
            value = float(self.score(self.network))
            self.val_score.append(value)
            message += f", validation score {value:.5f}"
            if value > self._best + self.tol:
                self._best, self._stale = value, 0
            else:
                self._stale += 1
            if self.n_iter_no_change is not None and self._stale >= self.n_iter_no_change:
                self.model.stop_training = True
                message += " (early stop)"
        if self.verbose:
            logger.info(message)

    def history(self):
        out = {"loss": list(self.loss)}
        if self.score is not None:
            out["val_score"] = list(self.val_score)
        return out


# ----------------------------------------------------------------------------- export


def build_export_model(spec, alpha, input_alpha, weights, name="group_sparse_mlp"):
    """A plain ``keras.Sequential`` of Dense layers with the penalties at the given strengths and ``weights``.

    What the estimator exposes as ``model_``: saveable, prunable by
    :func:`keras_group_lasso.prune_model`, and compiled with the same loss and
    a fresh optimizer (wrapped in :class:`~keras_group_lasso.Proximal` when the
    estimator trains proximally) so it can be trained further.
    """
    sizes = tuple(spec.hidden) + (spec.n_outputs,)
    layers = [keras.Input((spec.n_features,))]
    for position, units in enumerate(sizes):
        kernel_reg, bias_reg = layer_penalties(spec.penalty, alpha, spec.l1_ratio, position, input_alpha)
        last = position == len(sizes) - 1
        layers.append(
            keras.layers.Dense(
                units,
                activation=_output_activation(spec.task) if last else "relu",
                kernel_regularizer=kernel_reg,
                bias_regularizer=bias_reg,
                name="output" if last else f"hidden_{position + 1}",
            )
        )
    model = keras.Sequential(layers, name=name)
    model.set_weights(weights)
    return model


class SparsityReader:
    """:func:`keras_group_lasso.sparsity_report` of MLPs of one :class:`Spec`'s shape, read on one scratch model.

    The scratch model is built on the first call and its weights replaced on
    the next ones, so a caller that reads many weight sets of one shape (the
    regularization path, at every point) builds it once. The caller owns the
    reader; nothing is kept once it is dropped.
    """

    def __init__(self, spec):
        self.spec = spec
        self._model = None

    def __call__(self, weights, threshold):
        if self._model is None:
            self._model = build_export_model(self.spec, 0.0, 0.0, weights, name="scratch")
        else:
            self._model.set_weights(weights)
        return sparsity_report(self._model, threshold)


def sparsity_of(spec, weights, threshold):
    """:func:`keras_group_lasso.sparsity_report` of an MLP of ``spec``'s shape with ``weights`` (one reading)."""
    return SparsityReader(spec)(weights, threshold)


def compile_export_model(model, spec, learning_rate):
    """Compile ``model`` like the training network (fresh optimizer state)."""
    model.compile(
        optimizer=_make_optimizer(spec.optimizer, learning_rate, spec.proximal),
        loss=_loss(spec.task),
    )
    # Built now, so a saved model_ holds every optimizer variable (and loads without a mismatch warning).
    model.optimizer.build(model.trainable_variables)

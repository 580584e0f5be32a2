"""Proximal training: the group-sparse penalties act through their proximal operator.

:class:`Proximal` wraps any Keras optimizer. After every update of the wrapped
optimizer it replaces each weight that carries a group-sparse penalty
(:class:`~keras_group_lasso.GroupLasso`, :class:`~keras_group_lasso.SparseGroupLasso`,
:class:`~keras_group_lasso.InputGroupLasso`, :class:`~keras_group_lasso.HiddenGroupLasso`)
by the penalty's proximal point, so whole groups become exactly ``0.0`` inside
the compiled train step, with no threshold to tune.

How the pieces fit (Keras 3, TensorFlow and JAX):

* The penalties stay declared on the layers. ``Keras`` stores each one on its
  variable (``variable.regularizer``), so :meth:`Proximal.build`, which Keras
  calls with the model's trainable variables, finds them without any helper.
* ``build`` then *takes over* these penalties: the variable's regularizer is
  replaced by a report-only twin whose value still enters the reported loss
  (``ops.stop_gradient``), so the loss curve is comparable with subgradient
  training, but which adds no gradient (with ``report_penalty=False`` its
  value is 0). The layer keeps its own penalty object
  (``layer.kernel_regularizer``), so saving and loading the model is unchanged.
  :meth:`Proximal.release` puts the original penalties back on the variables.
* The update is ``apply()`` of the wrapped optimizer followed by the proximal
  step. Like ``keras.optimizers.LossScaleOptimizer``, the wrapper delegates
  ``apply`` instead of re-implementing ``update_step``: the wrapped optimizer
  keeps its own step counter, learning-rate schedule, clipping and (AdamW)
  weight decay exactly as it would alone. On TensorFlow the proximal step runs
  through ``merge_call`` / ``extended.update`` like Keras's own weight decay,
  so it works under ``tf.distribute`` strategies; on JAX it runs inside the
  stateless, jitted train step.
* Keras builds the optimizer before tracing the train step on JAX and under a
  ``tf.distribute`` strategy. On TensorFlow without a strategy it builds it
  lazily, inside the first traced step, after the loss was already traced with
  the original penalties; in that trace (only) the penalties' gradients, which
  are known in closed form, are removed from the gradients before the update.
  In a custom training loop, call ``optimizer.build(model.trainable_variables)``
  before the first step.
"""

import math
import warnings

import keras
import numpy as np
from keras import ops

from keras_group_lasso import prox
from keras_group_lasso._validation import check_choice, fail
from keras_group_lasso.regularizers import GroupSparseRegularizer

__all__ = ["Proximal", "weighted_sparse_group_soft_threshold"]

_PACKAGE = "keras_group_lasso"
METRICS = ("auto", "optimizer", "euclidean")
# Lower bound on a metric entry: keeps lr * lambda / d finite if a user
# sets epsilon=0 and a coordinate never saw a gradient.
_MIN_PRECONDITIONER = 1e-12


def weighted_sparse_group_soft_threshold(x, weights, group_threshold, l1_threshold=0.0):
    """Sparse-group-Lasso proximal step in a diagonal metric ``d`` (the group part in its scalar form).

    Targets ``argmin_z 0.5 * sum_i d_i (z_i - x_i)^2 + a * sum_g sqrt(|g|) ||z_g||_2 + b * ||z||_1``
    with ``d = weights > 0``, ``a = group_threshold``, ``b = l1_threshold``:

    1. L1 part, exact: ``s_i = sign(x_i) * max(|x_i| - b / d_i, 0)``.
    2. Group part, ``c = a * sqrt(|g|)``: ``z_g = s_g * max(0, 1 - c / ||d * s_g||_2)``.

    Step 2 is the exact group proximal step in the group's own scalar metric
    ``d_g = ||d * s_g|| / ||s_g||``. Compared with the exact diagonal-metric
    operator (which needs a one-dimensional root search per group):

    * the zero test is the same, ``||d * s_g|| <= c`` (the exact optimality
      condition at ``z_g = 0``), so exactly the same groups become 0;
    * it is the same when ``d`` is constant inside each group;
    * a surviving group keeps the same balance at a fixed point of
      gradient step + proximal step: the data gradient on the group has norm
      ``a * sqrt(|g|) / step``; only its direction inside the group is weighted
      by ``d`` (``∝ d_i z_i`` instead of ``∝ z_i``).

    It costs one extra elementwise product over :func:`keras_group_lasso.prox.sparse_group_soft_threshold`
    (with ``d = 1`` it *is* that function). On a rank-1 tensor every scalar is
    a group and the result is exact: ``sign(x) * max(|x| - (a + b) / d, 0)``.

    Args:
        x: weight tensor of rank >= 1, groups along axis -2 (see :mod:`keras_group_lasso.prox`).
        weights: tensor of the shape of ``x``, the metric ``d > 0`` (values
            below 1e-12 are raised to 1e-12).
        group_threshold: ``a >= 0``.
        l1_threshold: ``b >= 0``.

    Returns:
        A tensor of the shape and dtype of ``x``.

    Example:
        >>> weighted_sparse_group_soft_threshold(w, adam_denominator, lr * factor, lr * l1)
    """
    x = ops.convert_to_tensor(x)
    d = ops.maximum(ops.cast(weights, x.dtype), _MIN_PRECONDITIONER)
    return _weighted_prox(x, d, group_threshold, l1_threshold)


def _weighted_prox(x, d, a, b, use_l1=True):
    """:func:`weighted_sparse_group_soft_threshold` with ``d`` already floored; ``use_l1=False`` skips ``b``.

    Works on ``q = d * x`` (gradient units), where both thresholds are plain
    soft thresholds, ``d * S_{b/d}(x) = S_b(d * x)``, and divides once at the end.
    """
    return ops.divide(_sgl_step(ops.multiply(d, x), a, b, use_l1), d)


def _sgl_step(x, a, b, use_l1=True):
    """``prox.sparse_group_soft_threshold(x, a, b)`` in few ops (it runs every step, op by op without XLA).

    ``S_t(x) = x - clip(x, -t, t)`` (exactly 0 inside); the group factor
    ``max(0, 1 - c / ||g||)`` with ``||g||^2`` floored at the dtype's smallest
    normal number, so an all-zero group, or one whose squares underflow, gets
    factor 0 (1 when ``c == 0``) without a ``where``.
    """
    dtype = x.dtype
    a = ops.cast(a, dtype)
    shape = tuple(x.shape)
    if len(shape) < 2:  # every scalar is a group: one soft threshold by a + b
        t = a + ops.cast(b, dtype) if use_l1 else a
        return x - ops.clip(x, -t, t)
    if use_l1:
        t = ops.cast(b, dtype)
        x = x - ops.clip(x, -t, t)
    c = a * math.sqrt(prox.group_size(shape))
    sq = ops.sum(ops.square(x), axis=prox.group_axes(shape), keepdims=True)
    tiny = float(np.finfo(keras.backend.standardize_dtype(dtype)).tiny)
    return x * ops.maximum(1.0 - c * ops.rsqrt(ops.maximum(sq, tiny)), 0.0)


def _penalty_gradient(regularizer, w):
    """Gradient of ``regularizer(w)`` as :func:`prox.group_sparse_penalty` defines it (0 at 0)."""
    w = ops.convert_to_tensor(w)
    shape = tuple(w.shape)
    axes = prox.group_axes(shape)
    if not axes:
        return (regularizer.factor + regularizer.l1) * ops.sign(w)
    grad = ops.zeros_like(w)
    if regularizer.factor:
        sq = ops.sum(ops.square(w), axis=axes, keepdims=True)
        positive = ops.greater(sq, 0)
        inv_norm = ops.where(positive, ops.rsqrt(ops.where(positive, sq, ops.ones_like(sq))), 0.0)
        grad = w * (regularizer.factor * math.sqrt(prox.group_size(shape)) * inv_norm)
    if regularizer.l1:
        grad = grad + regularizer.l1 * ops.sign(w)
    return grad


class _ReportedPenalty(keras.regularizers.Regularizer):
    """A group-sparse penalty taken over by :class:`Proximal`: same value (or 0), no gradient.

    Lives only on ``variable.regularizer`` while the optimizer owns the penalty;
    the layer's config keeps the original penalty, so it is never serialized.
    """

    def __init__(self, penalty, report=True):
        self.penalty = penalty
        self.report = report

    def __call__(self, x):
        if not self.report:
            return ops.zeros((), dtype="float32")
        return ops.stop_gradient(self.penalty(x))

    def get_config(self):
        return self.penalty.get_config()

    def __repr__(self):
        return f"reported({self.penalty!r})"


# The metric d of each Keras optimizer's own step, which is "lr * direction / d"
# once the direction (a gradient average) has settled. A Python float is a
# constant metric. Keras keeps the slot variables in per-class lists (not public
# API); they are read here and only here, and tests/test_optimizers.py checks
# every entry against the update the optimizer really makes.
def _sgd_d(opt, i, dtype):
    # Keras's velocity is v <- momentum * v - lr * g: a steady gradient moves
    # the weight by lr * g / (1 - momentum) per step (Nesterov too).
    return max(1.0 - float(opt.momentum), _MIN_PRECONDITIONER)


def _adam_d(opt, i, dtype):
    v = (opt._velocity_hats if opt.amsgrad else opt._velocities)[i]
    t = ops.cast(opt.iterations, dtype)
    correction = ops.sqrt(1.0 - ops.power(ops.cast(opt.beta_2, dtype), t))
    return (ops.sqrt(ops.cast(v, dtype)) + opt.epsilon) / correction


def _nadam_d(opt, i, dtype):
    t = ops.cast(opt.iterations, dtype)
    v_hat = ops.cast(opt._velocities[i], dtype) / (1.0 - ops.power(ops.cast(opt.beta_2, dtype), t))
    return ops.sqrt(v_hat) + opt.epsilon


def _adamax_d(opt, i, dtype):
    return ops.cast(opt._u[i], dtype) + opt.epsilon


def _rmsprop_d(opt, i, dtype):
    v = ops.cast(opt._velocities[i], dtype)
    if opt.centered:
        v = v - ops.square(ops.cast(opt._average_gradients[i], dtype))
    # Like SGD's, RMSprop's momentum accumulates lr * g / sqrt(v + eps) undamped.
    return ops.sqrt(v + opt.epsilon) * max(1.0 - float(opt.momentum), _MIN_PRECONDITIONER)


def _adagrad_d(opt, i, dtype):
    return ops.sqrt(ops.cast(opt._accumulators[i], dtype) + opt.epsilon)


def _metrics():
    opts = keras.optimizers
    # isinstance: AdamW (a subclass of Adam) shares Adam's d.
    return (
        (opts.SGD, _sgd_d),
        (opts.Nadam, _nadam_d),
        (opts.Adamax, _adamax_d),
        (opts.Adam, _adam_d),
        (opts.RMSprop, _rmsprop_d),
        (opts.Adagrad, _adagrad_d),
    )


def _find_metric(optimizer):
    for cls, fn in _metrics():
        if isinstance(optimizer, cls):
            return fn
    return None


@keras.saving.register_keras_serializable(package=_PACKAGE, name="Proximal")
class Proximal(keras.optimizers.Optimizer):
    """Proximal training: each update of ``optimizer`` is followed by the penalties' proximal step.

    For a weight ``w`` whose layer declares a group-sparse penalty
    ``P = factor * sum_g sqrt(|g|) ||w_g|| + l1 * ||w||_1``, one training step is::

        u = w + Δ                                   # the wrapped optimizer's update, data gradient only
        w <- argmin_z 0.5 * ||z - u||^2_H + P(z)    # H = diag(d) / lr

    With a constant ``d`` (SGD) this is :func:`keras_group_lasso.prox.sparse_group_soft_threshold`
    with thresholds ``lr * l1 / d`` and ``lr * factor / d``; otherwise
    :func:`weighted_sparse_group_soft_threshold`. A group becomes exactly 0.0
    when ``||d * u_g|| <= lr * factor * sqrt(|g|)`` (after the L1 part) and
    comes back only when the data pulls harder than the penalty.

    **The metric** ``d``. If ``H`` is the metric of the optimizer's own step
    (``Δ = -H^-1 * direction``), a fixed point ``w = prox_H(w - H^-1 ∇L)`` is
    exactly ``0 ∈ ∇L + ∂P``: the stationarity condition of ``loss + P`` that
    subgradient training aims at too, so λ keeps its meaning (the strength of
    the same objective) in both modes. ``metric="auto"`` uses that metric:

    * SGD: the step of a steady gradient is ``lr * g / (1 - momentum)``
      (Keras's velocity ``v <- momentum * v - lr * g``; Nesterov alike), so
      ``d = 1 - momentum`` and the thresholds are ``lr * λ / (1 - momentum)``;
      ``lr * λ`` without momentum. With the plain ``lr * λ`` (``metric="euclidean"``)
      momentum 0.9 would act like a penalty ten times weaker, ``0 ∈ ∇L + 0.1 λ ∂P``.
    * Adam, AdamW, Nadam, Adamax, RMSprop, Adagrad: the step is
      ``lr * direction / d`` with the optimizer's own preconditioner, read from
      its state (``d = (sqrt(v) + eps) / sqrt(1 - beta_2^t)`` for Adam and
      AdamW, ``sqrt(v + eps) * (1 - momentum)`` for RMSprop, ...): the weighted
      proximal step of Deleu & Bengio (2021, "Structured Sparsity Inducing
      Adaptive Optimizers for Deep Learning") and Yun et al. (2021, ProxGen).
      Its L1 part is exact; its group part, which has no closed form in a
      diagonal metric, is taken in each group's scalar metric
      ``||d * s_g|| / ||s_g||``: the exact zero test and the exact penalty
      balance of surviving groups (see :func:`weighted_sparse_group_soft_threshold`)
      at the cost of one Euclidean step — the exact operator, a root search per
      group, cost ~15× as much here for DIGITS results within seed noise of
      these. A zero group restarts only when the optimizer's averaged gradient
      beats the penalty, ``||m̂_g|| > λ sqrt(|g|)``, whatever the scale of
      ``v``. The Euclidean ``lr * λ`` after an Adam step would instead reach
      ``0 ∈ ∇L + d * ∂P``, a penalty shrunk by Adam's ``d ≈ |gradient|``:
      λ would need to be orders of magnitude larger.
    * Other optimizers (Lion, Adafactor, Ftrl, ...): the metric is not known;
      ``"auto"`` falls back to ``"euclidean"`` (thresholds ``lr * λ``) and warns.

    Where to start (DIGITS, ``benchmarks/results/proximal_digits.md``): SGD with
    momentum 0.9 (lr 0.1-0.2) or Adam (lr 3e-3 to 1e-2), λ from 3e-4 to 1.5e-3,
    the same λ as for subgradient training.

    Penalties other than this package's group-sparse ones (``keras.regularizers.L2``,
    ...) stay ordinary loss terms with their gradient.

    Args:
        optimizer: the ``keras.optimizers.Optimizer`` to wrap (not built yet;
            not a ``LossScaleOptimizer`` — that one wraps ``Proximal``; no
            ``use_ema``, whose averaged weights are never sparse; no
            ``gradient_accumulation_steps``), or a name/config that
            ``keras.optimizers.get`` resolves.
        metric: ``"auto"`` (default): ``"optimizer"`` when the wrapped
            optimizer is one of the above, else ``"euclidean"`` with a warning;
            ``"optimizer"``: the metric of the wrapped optimizer's step (an
            error for other optimizers); ``"euclidean"``: ``d = 1``, thresholds
            ``lr * λ`` whatever the optimizer (for comparisons).
        report_penalty: keep the penalties' value (without gradient) in the
            reported loss, as in subgradient training (default). ``False``
            skips computing it, one pass over the weights less per step.
        name: optimizer name.

    Raises:
        InvalidParameterError: for an unusable ``optimizer`` or ``metric``.

    Example:
        >>> model.compile(optimizer=Proximal(keras.optimizers.SGD(0.1, momentum=0.9)),
        ...               loss="sparse_categorical_crossentropy")
    """

    def __init__(self, optimizer, metric="auto", report_penalty=True, name=None, **kwargs):
        owner = type(self).__name__
        if kwargs:
            # Keras passes base-optimizer keywords when deserializing old configs;
            # ours never has them. Name the first one like any bad argument.
            key = sorted(kwargs)[0]
            fail(owner, key, "set on the wrapped optimizer, not on Proximal", kwargs[key])
        inner = _resolve_optimizer(owner, optimizer)
        metric = check_choice(owner, "metric", metric, METRICS)
        if not isinstance(report_penalty, bool):
            fail(owner, "report_penalty", "True or False", report_penalty)
        known = _find_metric(inner)
        if metric == "optimizer" and known is None:
            fail(
                owner,
                "metric",
                f"'euclidean' or 'auto' for an optimizer whose step metric is not known ({type(inner).__name__}); "
                "'optimizer' supports SGD, Adam, AdamW, Nadam, Adamax, RMSprop and Adagrad",
                metric,
            )
        if metric == "auto" and known is None:
            warnings.warn(
                f"Proximal: the step metric of {type(inner).__name__} is not known; the proximal "
                "step uses thresholds lr * lambda (metric='euclidean'), which may act much weaker "
                "than the same lambda in subgradient mode.",
                stacklevel=2,
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner
        self.metric = metric
        self.report_penalty = report_penalty
        self._metric = known if metric != "euclidean" else None
        self._penalties = ()

    @property
    def resolved_metric(self):
        """``"optimizer"`` or ``"euclidean"``: what ``metric="auto"`` chose."""
        return "euclidean" if self._metric is None else "optimizer"

    def build(self, variables):
        """Build the wrapped optimizer and take over the group-sparse penalties of ``variables``."""
        if self.built:
            return
        variables = list(variables)
        self.inner_optimizer.build(variables)
        super().build(variables)
        penalties = []
        for index, variable in enumerate(variables):
            penalty = getattr(variable, "regularizer", None)
            if isinstance(penalty, _ReportedPenalty):
                penalty = penalty.penalty
            if isinstance(penalty, GroupSparseRegularizer):
                penalties.append((index, penalty))
                variable.regularizer = _ReportedPenalty(penalty, self.report_penalty)
        self._penalties = tuple(penalties)

    def release(self):
        """Give the group-sparse penalties back to the variables (as ordinary loss terms).

        Call it before training the same model with another optimizer;
        otherwise those penalties stay report-only (value, no gradient).
        """
        for index, penalty in self._penalties:
            variable = self._trainable_variables[index]
            if isinstance(variable.regularizer, _ReportedPenalty):
                variable.regularizer = penalty

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def apply(self, grads, trainable_variables=None):
        """The wrapped optimizer's update, then the proximal step of every taken-over penalty."""
        grads = list(grads)
        if not grads:
            return
        built_here = False
        if not self.built:
            if trainable_variables is None:
                raise ValueError(
                    "Proximal: call `optimizer.build(trainable_variables)` or pass "
                    "`trainable_variables` to the first `apply`."
                )
            trainable_variables = list(trainable_variables)
            self.build(trainable_variables)
            built_here = True
        if built_here and self._penalties:
            # The loss of this step was traced before build() took the penalties
            # over, so the gradients still contain theirs: remove them.
            grads = self._without_penalty_gradients(grads, trainable_variables)
        learning_rate = ops.convert_to_tensor(self.inner_optimizer.learning_rate)
        self.inner_optimizer.apply(grads, trainable_variables)
        if self._penalties:
            self._apply_proximal_steps(learning_rate)

    def _without_penalty_gradients(self, grads, variables):
        scale = self.inner_optimizer.loss_scale_factor or 1.0
        scale = scale / _num_replicas()
        by_index = dict(self._penalties)
        out = []
        for index, (grad, variable) in enumerate(zip(grads, variables)):
            if grad is not None and index in by_index:
                grad = ops.convert_to_tensor(grad)
                penalty_grad = _penalty_gradient(by_index[index], ops.cast(variable, grad.dtype))
                grad = grad - scale * penalty_grad
            out.append(grad)
        return out

    def _proximal_point(self, index, penalty, value, learning_rate):
        """``prox`` of ``penalty`` at ``value`` (the weight after the wrapped update)."""
        value = ops.convert_to_tensor(value)
        dtype = value.dtype
        lr = ops.cast(learning_rate, dtype)
        d = 1.0 if self._metric is None else self._metric(self.inner_optimizer, index, dtype)
        if isinstance(d, float):  # a constant metric: the Euclidean closed form, thresholds lr * λ / d
            step = lr / d
            return _sgl_step(value, step * penalty.factor, step * penalty.l1, use_l1=bool(penalty.l1))
        d = ops.maximum(d, _MIN_PRECONDITIONER)
        return _weighted_prox(value, d, lr * penalty.factor, lr * penalty.l1, use_l1=bool(penalty.l1))

    def _apply_proximal_steps(self, learning_rate):
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            if context is None:  # cross-replica context: no merge needed
                self._distributed_proximal_steps(tf.distribute.get_strategy(), learning_rate)
            else:
                context.merge_call(self._distributed_proximal_steps, args=(learning_rate,))
            return
        for index, penalty in self._penalties:
            variable = self._trainable_variables[index]
            variable.assign(self._proximal_point(index, penalty, variable, learning_rate))

    def _distributed_proximal_steps(self, strategy, learning_rate):
        # Like Keras's own weight decay: one update per variable, on every replica.
        for index, penalty in self._penalties:

            def step(var, lr, index=index, penalty=penalty):
                return var.assign(self._proximal_point(index, penalty, var, lr))

            strategy.extended.update(
                self._trainable_variables[index].value, step, args=(learning_rate,), group=False
            )

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "metric": self.metric,
            "report_penalty": self.report_penalty,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)


def _num_replicas():
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def _resolve_optimizer(owner, optimizer):
    constraint = "a keras.optimizers.Optimizer (or a name keras.optimizers.get resolves)"
    if isinstance(optimizer, (str, dict)):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except (ValueError, TypeError):
            fail(owner, "optimizer", constraint, optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        fail(owner, "optimizer", constraint, optimizer)
    if isinstance(optimizer, Proximal):
        fail(owner, "optimizer", "an optimizer that is not already a Proximal", optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        fail(
            owner,
            "optimizer",
            "an optimizer that is not a LossScaleOptimizer (wrap Proximal in it instead)",
            optimizer,
        )
    if optimizer.built:
        fail(owner, "optimizer", "an optimizer that is not built yet", optimizer)
    if optimizer.use_ema:
        fail(
            owner,
            "optimizer",
            "an optimizer without use_ema (its averaged weights are never exactly sparse)",
            optimizer,
        )
    if optimizer.gradient_accumulation_steps:
        fail(owner, "optimizer", "an optimizer without gradient_accumulation_steps", optimizer)
    return optimizer

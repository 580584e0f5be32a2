"""Proximal training: the group-sparse penalties act through their proximal operator.

:class:`Proximal` wraps any Keras optimizer. After every update of the wrapped
optimizer it replaces each weight that carries a group-sparse penalty
(:class:`~keras_group_lasso.GroupLasso`, :class:`~keras_group_lasso.SparseGroupLasso`,
:class:`~keras_group_lasso.InputGroupLasso`, :class:`~keras_group_lasso.HiddenGroupLasso`)
by the penalty's proximal point, so whole groups become exactly ``0.0`` inside
the compiled train step, with no threshold to tune.

How the pieces fit (Keras 3; TensorFlow, JAX and PyTorch):

* The penalties stay declared on the layers, and stay theirs. Keras stores
  each one on its variable (``variable.regularizer``) and adds its value to the
  loss, so the reported loss is the same as in subgradient training. The
  optimizer only *reads* these declarations; it never changes a variable, a
  layer or a model. Compiling the same model with another optimizer later
  (directly, after ``load_model`` or on a ``clone_model``) trains it with the
  ordinary subgradients of the same penalties.
* A penalty declared by a model (:mod:`keras_group_lasso.declared`) that is
  compiled with a ``Proximal`` (also inside a ``LossScaleOptimizer``) adds its
  value to the loss without a gradient, since the proximal step applies it
  (no penalty gradient is computed only to be removed again). Otherwise (a
  model compiled with another optimizer or not compiled, penalties no model
  declared), a penalty gives its gradient too, and :meth:`Proximal.apply`
  asks the same declaration and removes that part, known in closed form
  (:func:`keras_group_lasso.prox.group_sparse_gradient`, the formula the
  penalties' own gradient uses). Either way the wrapped optimizer gets the
  data gradient, then each penalised weight is replaced by its proximal point. Like
  ``keras.optimizers.LossScaleOptimizer``, the wrapper delegates ``apply``
  instead of re-implementing ``update_step``: the wrapped optimizer keeps its
  own step counter, learning-rate schedule, clipping and (AdamW) weight decay
  exactly as it would alone. On TensorFlow the proximal step runs through
  ``merge_call`` / ``extended.update`` like Keras's own weight decay, so it
  works under ``tf.distribute`` strategies; on JAX it runs inside the
  stateless, jitted train step; on PyTorch right after the wrapped
  optimizer's in-place update.
* In a custom training loop, pass the gradient of ``loss + sum(model.losses)``
  (as Keras's own training loops do), whether or not the model is compiled
  with this ``Proximal``; under a ``tf.distribute`` strategy each
  replica adds ``sum(model.losses) / num_replicas_in_sync``, as Keras's
  losses do, so the replicas' gradients sum to the penalties' once.
* A ``Proximal`` instance belongs to the variables it was built with, like
  every Keras optimizer. Compiling it into a second model is refused with a
  clear error on TensorFlow and PyTorch (which pass the variables), and on JAX
  (which passes their values only) when the second model's variables differ
  in number or shape; give each model its own optimizer.
* Its variables are the wrapped optimizer's, the strength multiplier a JAX
  step reads, and one mask of kept groups per group-penalised kernel
  (:meth:`Proximal.kept_groups`, ones unless a
  :class:`~keras_group_lasso.SparsityBudget` holds cut groups at zero with
  it): the compiled step reads them as it runs on every backend, so a budget
  cuts and holds groups without tracing the step again. An optimizer state
  saved before these masks existed has fewer variables: Keras then does not
  restore it and says so.
"""

import math
import warnings

import keras
from keras import ops

from keras_group_lasso import prox
from keras_group_lasso._backend import torch_compiling
from keras_group_lasso._validation import check_choice, fail
from keras_group_lasso.regularizers import COUPLED_INDEX, CoupledGroupLasso, GroupSparseRegularizer

__all__ = ["Proximal", "weighted_sparse_group_soft_threshold"]

_PACKAGE = "keras_group_lasso"
METRICS = ("auto", "optimizer", "euclidean")
#: With ``jit_compile_step="auto"`` on PyTorch, the proximal step is compiled after this many eager steps (a
#: compilation costs a few seconds; the compiled step saves about a millisecond per step on a CPU).
COMPILE_AFTER_STEPS = 2000
_MIN_PRECONDITIONER = prox.MIN_METRIC
weighted_sparse_group_soft_threshold = prox.weighted_sparse_group_soft_threshold  # its home before 0.3


# The metric of each Keras optimizer's own step, which is "lr * direction / d"
# once the direction (a gradient average) has settled, as a pair (m, c): d = m / c
# with c a scalar (Adam's bias correction), so that a proximal step divides the
# small thresholds by c instead of the weight-sized m (one pass over the weights
# less, where ops run one by one). m is at least MIN_METRIC * c. A Python float m
# is a constant metric. ``step`` is a dict that lives for one optimizer step: the
# scalars every weight shares (c) are computed once per step, not once per weight
# (eager backends dispatch every op from Python). Keras keeps the slot variables
# in per-class lists (not public API); they are read here and only here, and
# tests/test_optimizers.py checks every entry against the update the optimizer
# really makes.
def _sgd_d(opt, i, dtype, step):
    # Keras's velocity is v <- momentum * v - lr * g: a steady gradient moves
    # the weight by lr * g / (1 - momentum) per step (Nesterov too).
    return max(1.0 - float(opt.momentum), _MIN_PRECONDITIONER), 1.0


def _floored(m, epsilon, c=1.0):
    # m >= epsilon already: the floor is a pass over the weights only when epsilon is below it.
    return m if float(epsilon) >= _MIN_PRECONDITIONER else ops.maximum(m, _MIN_PRECONDITIONER * c)


def _bias_correction(opt, dtype, step):
    key = ("bias_correction", dtype)
    if key not in step:
        t = ops.cast(opt.iterations, dtype)
        step[key] = ops.sqrt(1.0 - ops.power(ops.cast(opt.beta_2, dtype), t))
    return step[key]


def _adam_d(opt, i, dtype, step):
    v = (opt._velocity_hats if opt.amsgrad else opt._velocities)[i]
    c = _bias_correction(opt, dtype, step)
    return _floored(ops.sqrt(_cast(v, dtype)) + opt.epsilon, opt.epsilon, c), c


def _nadam_d(opt, i, dtype, step):
    # sqrt(v / c^2) + eps = (sqrt(v) + eps * c) / c
    c = _bias_correction(opt, dtype, step)
    return _floored(ops.sqrt(_cast(opt._velocities[i], dtype)) + opt.epsilon * c, opt.epsilon, c), c


def _adamax_d(opt, i, dtype, step):
    return _floored(_cast(opt._u[i], dtype) + opt.epsilon, opt.epsilon), 1.0


def _rmsprop_d(opt, i, dtype, step):
    v = _cast(opt._velocities[i], dtype)
    if opt.centered:
        v = v - ops.square(_cast(opt._average_gradients[i], dtype))
    # Like SGD's, RMSprop's momentum accumulates lr * g / sqrt(v + eps) undamped.
    d = ops.sqrt(v + opt.epsilon) * max(1.0 - float(opt.momentum), _MIN_PRECONDITIONER)
    return ops.maximum(d, _MIN_PRECONDITIONER), 1.0


def _adagrad_d(opt, i, dtype, step):
    return ops.maximum(ops.sqrt(_cast(opt._accumulators[i], dtype) + opt.epsilon), _MIN_PRECONDITIONER), 1.0


def _cast(x, dtype):
    """``x`` as a tensor of ``dtype``; no cast op where it already is one."""
    x = ops.convert_to_tensor(x)
    return x if keras.backend.standardize_dtype(x.dtype) == dtype else ops.cast(x, dtype)


def _reshaped(x, shape):
    """``x`` in ``shape``; no reshape op where it already has it."""
    return x if tuple(x.shape) == tuple(shape) else ops.reshape(x, shape)


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


def _find_metric_parts(optimizer):
    for cls, fn in _metrics():
        if isinstance(optimizer, cls):
            return fn
    return None


def _find_metric(optimizer):
    """The metric ``d`` itself, ``m / c`` (``None`` for an optimizer whose metric is not known)."""
    parts = _find_metric_parts(optimizer)
    if parts is None:
        return None

    def metric(opt, i, dtype):
        m, c = parts(opt, i, dtype, {})
        return m / c if isinstance(m, float) else m / ops.cast(c, dtype)

    return metric


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
        report_penalty: accepted for files saved by version 0.1; it has
            no effect. The penalties are the model's: their value is always
            part of the loss, and ``Proximal`` applies them by their proximal step.
        name: optimizer name.
        jit_compile_step: PyTorch backend, model compiled with
            ``jit_compile=False`` (Keras's default there): the proximal step
            runs op by op, each a separate dispatch. ``"auto"`` (default)
            compiles the step alone with ``torch.compile`` after
            ``COMPILE_AFTER_STEPS`` (2,000) eager steps, when the training is
            long enough to repay the few seconds compiling takes; ``True``
            from the first step; ``False`` never. Where compiling fails (no
            C++ compiler) the step stays eager, with a warning. No effect on
            TensorFlow and JAX (their training step is one graph already)
            nor inside a step that ``torch.compile`` traces as a whole.

    Raises:
        InvalidParameterError: for an unusable ``optimizer`` or ``metric``.

    Example:
        >>> from keras_group_lasso import SparseGroupLasso
        >>> model = keras.Sequential([keras.Input((4,)),
        ...                           keras.layers.Dense(3, kernel_regularizer=SparseGroupLasso(0.05)),
        ...                           keras.layers.Dense(2, activation="softmax")])
        >>> model.compile(optimizer=Proximal(keras.optimizers.SGD(0.1, momentum=0.9)),
        ...               loss="sparse_categorical_crossentropy")
        >>> x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")   # only feature 0 matters
        >>> _ = model.fit(x, y, epochs=20, batch_size=64, verbose=0)
        >>> kernel = ops.convert_to_numpy(model.layers[0].kernel)
        >>> (kernel == 0.0).all(axis=1)   # exactly zero rows: features 1 to 3 are out
        array([False,  True,  True,  True])
    """

    # Read by the group-sparse penalties when Keras adds them to the loss of a model
    # compiled with this optimizer: that loss needs their value, not their gradient.
    applies_group_penalties = True

    def __init__(self, optimizer, metric="auto", report_penalty=True, name=None, jit_compile_step="auto", **kwargs):
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
        if not report_penalty:
            warnings.warn(
                "Proximal: report_penalty=False has no effect: the penalties belong to the model, "
                "so their value is always part of the reported loss (Proximal applies them by "
                "their proximal step instead of their gradient).",
                stacklevel=2,
            )
        known = _find_metric_parts(inner)
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
        if not (isinstance(jit_compile_step, bool) or jit_compile_step == "auto"):
            fail(owner, "jit_compile_step", "'auto', True or False", jit_compile_step)
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner
        self.metric = metric
        self._metric = known if metric != "euclidean" else None
        self.jit_compile_step = jit_compile_step
        self._compiled_points = None  # None: not yet; False: never (eager), else the compiled function
        self._eager_steps = 0

    @property
    def resolved_metric(self):
        """``"optimizer"`` or ``"euclidean"``: what ``metric="auto"`` chose."""
        return "euclidean" if self._metric is None else "optimizer"

    def build(self, variables):
        """Build the wrapped optimizer for ``variables`` (the model is only read, never changed).

        Raises:
            ValueError: this ``Proximal`` was already built for other variables
                (it was compiled into another model).
        """
        variables = list(variables)
        if self.built:
            self._check_same_variables(variables)
            return
        self.inner_optimizer.build(variables)
        super().build(variables)
        # The strength multiplier of the penalties is the one their model declares; a compiled JAX
        # step passes the optimizer only its own variables and the trainable ones, so there this
        # variable holds the declared value, read afresh each time the trainer gathers the
        # optimizer's state (`variables`). Other backends read the declared variable itself.
        self.penalty_multiplier = self.add_variable((2,), initializer="ones", dtype="float32",
                                                    name="penalty_multiplier")
        self._refresh_multiplier()
        # One mask of kept groups per group-penalised kernel (1: the group trains, 0: held at zero), for a
        # constraint that holds cut groups at zero (SparsityBudget). Optimizer variables, so that a compiled
        # step reads them as it runs on every backend (a JAX step receives only its optimizer's and the
        # trainable variables): groups are held or released without tracing the step again.
        self._kept_groups = {}
        for variable in self._trainable_variables:
            penalty = getattr(variable, "regularizer", None)
            if isinstance(penalty, GroupSparseRegularizer) and len(variable.shape) >= 2:
                groups = penalty.group_shape(tuple(variable.shape))[-2]
                self._kept_groups[id(variable)] = self.add_variable(
                    (groups,), initializer="ones", dtype="float32", name=f"{variable.name}_kept_groups")

    def kept_groups(self, variable):
        """The mask of kept groups of ``variable`` (a group-penalised kernel this optimizer trains), or ``None``.

        A ``(groups,)`` float32 optimizer variable, ones unless a constraint that holds groups at zero
        (:class:`~keras_group_lasso.budget.cut.FrozenGroups`) writes it; this optimizer never reads it itself.
        """
        return getattr(self, "_kept_groups", {}).get(id(variable))

    def _declared_multiplier(self):
        """The multiplier variable the model of the penalties declares, or ``None`` (strength 1)."""
        for _, penalty in self._declared_penalties():
            if penalty.multiplier is not None:
                return penalty.multiplier
        return None

    def _refresh_multiplier(self):
        """On JAX, copy the declared multiplier into ``penalty_multiplier`` (outside any trace): the step reads it."""
        source = self._declared_multiplier()
        if source is None or not self.built or keras.backend.backend() != "jax":
            return
        import jax

        try:
            current, value = self.penalty_multiplier.value, source.value
        except TypeError:
            return  # the trainer holds the variables in its state for now (detached) and passes the copy
        if isinstance(current, jax.core.Tracer):
            return  # inside the compiled step: the trainer passed the value gathered before it
        copied = ops.copy(value)
        if isinstance(copied, jax.core.Tracer):  # a trace is running (a step jitted by hand): a traced value
            return  # written into the variable would outlive it
        self.penalty_multiplier.assign(copied)

    def _multiplier(self):
        """The ``(2,)`` strength multiplier the proximal step uses now."""
        source = self._declared_multiplier()
        if source is None or keras.backend.backend() == "jax":
            return self.penalty_multiplier
        return source

    def penalties(self):
        """``[(variable, penalty)]``: the group-sparse penalties this optimizer applies, read now.

        The penalties are the ones declared on the model's variables
        (``variable.regularizer``, set from a layer's ``kernel_regularizer``
        and ``bias_regularizer``); other regularizers (``L2``, ...) stay
        ordinary loss terms with their gradient.
        """
        if not self.built:
            return []
        return [(self._trainable_variables[i], p) for i, p in self._declared_penalties()]

    def _declared_penalties(self):
        found = []
        for index, variable in enumerate(self._trainable_variables):
            penalty = getattr(variable, "regularizer", None)
            if isinstance(penalty, GroupSparseRegularizer):
                found.append((index, penalty))
        return found

    def release(self):
        """Deprecated, does nothing: ``Proximal`` no longer changes the model's penalties.

        Kept so that code written for version 0.1 runs; it warns.
        """
        warnings.warn(
            "Proximal.release() is no longer needed and does nothing: Proximal never changes "
            "the model, so another optimizer trains it with the ordinary penalty gradients.",
            DeprecationWarning,
            stacklevel=2,
        )

    def check_trains(self, variables):
        """Raise unless this optimizer is not built yet or was built for ``variables`` (a model's trainable
        variables, in their order).

        Raises:
            ValueError: it was built for other variables (compiled into another model before).
        """
        if self.built:
            self._check_same_variables(list(variables))

    def _check_same_variables(self, variables):
        built = self._trainable_variables
        if len(variables) == len(built) and all(a is b for a, b in zip(variables, built)):
            return
        self._refuse_other_variables(len(variables))

    def _refuse_other_variables(self, count):
        built = self._trainable_variables
        raise ValueError(
            f"{type(self).__name__} '{self.name}' was built for the {len(built)} trainable variables "
            f"of another model (or of this model before its layers changed) and cannot train "
            f"these {count}: its state (step count, moments) and the penalties it applies "
            "belong to those variables. Give each model its own optimizer, e.g. "
            "`Proximal(keras.optimizers.SGD(0.1, momentum=0.9))` per `compile`."
        )

    def _check_same_shapes(self, values):
        built = self._trainable_variables
        same = len(values) == len(built) and all(
            tuple(v.shape) == tuple(b.shape) for v, b in zip(values, built)
        )
        if not same:
            self._refuse_other_variables(len(values))

    @property
    def variables(self):
        if self.built and keras.backend.backend() == "jax":
            self._refresh_multiplier()  # the trainer is gathering the state of its next steps
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

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        # The JAX trainer passes the values of the model's variables, not the
        # variables: refuse values that cannot be this optimizer's variables
        # (they would be matched to them by position, and their penalties applied).
        if self.built:
            self._check_same_shapes(trainable_variables)
        return super().stateless_apply(optimizer_variables, grads, trainable_variables)

    def apply(self, grads, trainable_variables=None):
        """Data gradient to the wrapped optimizer, then the proximal step of every group-sparse penalty.

        Args:
            grads: gradients of the whole loss with the model's penalties
                (what ``fit`` computes). A group-sparse penalty that was read
                last for a model compiled with this optimizer has no gradient
                in it; any other has its gradient in it, which is removed.
            trainable_variables: the variables, on the first call when the
                optimizer is not built yet; later they must be the same.
        """
        grads = list(grads)
        if not grads:
            return
        if not self.built:
            if trainable_variables is None:
                raise ValueError(
                    "Proximal: call `optimizer.build(trainable_variables)` or pass "
                    "`trainable_variables` to the first `apply`."
                )
            self.build(trainable_variables)
        elif trainable_variables is not None:
            self._check_same_variables(list(trainable_variables))
        penalties = self._declared_penalties()
        # A penalty read from `model.losses` of a model compiled with this optimizer
        # gave its value only (no gradient); any other reading gave its gradient too.
        with_gradient = [(i, p) for i, p in penalties if not p.value_only]
        if with_gradient:
            grads = self._without_penalty_gradients(grads, with_gradient)
        learning_rate = ops.convert_to_tensor(self.inner_optimizer.learning_rate)
        self.inner_optimizer.apply(grads, trainable_variables)
        if penalties:
            if torch_compiling() and not isinstance(self.inner_optimizer, keras.optimizers.SGD):
                # One deliberate break between the wrapped update and the proximal steps:
                # traced as one graph, the slot updates of Adam, AdamW and Nadam next to the
                # group norms crash TorchInductor's C++ code generation (KeyError in its
                # outer-loop fusion, torch 2.14); split, both halves compile and the step is
                # the same. SGD never crashed, and without the break Proximal(SGD) costs 1.10x
                # of plain compiled SGD instead of 1.21x (benchmarks/overhead.py).
                import torch

                torch._dynamo.graph_break()
            self._apply_proximal_steps(penalties, learning_rate)

    def _without_penalty_gradients(self, grads, penalties):
        """The data gradient: each penalty's gradient (closed form) removed from the loss gradient.

        Keras scales the loss by the optimizer's ``loss_scale_factor`` and, under
        a ``tf.distribute`` strategy, each replica's penalty terms by
        ``1 / replicas``; the same scale is removed here.
        """
        scale = (self.inner_optimizer.loss_scale_factor or 1.0) / _num_replicas()
        grads = list(grads)
        for index, penalty in penalties:
            grad = grads[index]
            if grad is None:
                continue
            grad = ops.convert_to_tensor(grad)
            value = self._trainable_variables[index]
            penalty_grad = penalty.gradient(ops.cast(value, grad.dtype), multiplier=self._multiplier())
            grads[index] = grad - ops.cast(scale, grad.dtype) * penalty_grad
        return grads

    def _proximal_point(self, index, penalty, value, rate, step):
        """``prox`` of ``penalty`` at ``value`` (the weight after the wrapped update); ``rate``: lr * multiplier.

        ``step``: the dict of this step's shared scalars (see ``_sgd_d``).
        """
        value = ops.convert_to_tensor(value)
        shape = tuple(value.shape)
        view = penalty.group_shape(shape)  # groups along axis -2 (whole channels for channels=C)
        dtype = prox.compute_dtype(value.dtype)
        x = _reshaped(_cast(value, dtype), view)
        m, c = (1.0, 1.0) if self._metric is None else self._metric(self.inner_optimizer, index, dtype, step)
        if isinstance(m, float):  # a constant metric: the Euclidean closed form, thresholds lr * λ / d
            rate = _cast(rate, dtype) / m
            z = prox.sgl_step(x, rate * penalty.factor, rate * penalty.l1, use_l1=bool(penalty.l1))
        else:  # d = m / c: the step in the metric m with thresholds times c (sgl_step is homogeneous)
            key = ("rate", penalty.multiplier_index, dtype)
            if key not in step:
                step[key] = _cast(rate, dtype) if isinstance(c, float) else _cast(rate, dtype) * _cast(c, dtype)
            rate = step[key]
            z = prox.weighted_sgl_step(x, _reshaped(m, view), rate * penalty.factor, rate * penalty.l1,
                                       use_l1=bool(penalty.l1))
        z = penalty.keep_spared(x, z)
        return _cast(_reshaped(z, shape), keras.backend.standardize_dtype(value.dtype))

    def _rates(self, learning_rate):
        """``lr * multiplier`` of each entry of the penalties' strength multiplier, once per step."""
        lr = ops.cast(learning_rate, "float32")
        multiplier = ops.cast(self._multiplier(), "float32")
        return [lr * multiplier[0], lr * multiplier[1]]

    def _coupled_points(self, coupled, rates, step):
        """Proximal points of the weights that share coupled groups, all read before any is written.

        In gradient units ``q = d * x`` (``d``: the metric), as
        :func:`keras_group_lasso.prox.weighted_sgl_step`: ``q`` soft-thresholded by
        ``lr * l1``; an own group ``g`` scaled by ``max(0, 1 - lr * factor *
        sqrt(|g|) / ||q_g||)``; every part of a coupled group ``k`` by the one
        factor ``max(0, 1 - lr * s_k / ||q_U||)`` of the whole union; then ``z = q / d``.
        """
        prepared, total = [], None
        for index, penalty in coupled:
            value = ops.convert_to_tensor(self._trainable_variables[index])
            shape = tuple(value.shape)
            view = penalty.group_shape(shape)
            dtype = prox.compute_dtype(value.dtype)
            lr_coupled = ops.cast(rates[COUPLED_INDEX], dtype)
            lr = ops.cast(rates[penalty.multiplier_index], dtype)
            x = ops.reshape(ops.cast(value, dtype), view)
            m, c = (1.0, 1.0) if self._metric is None else self._metric(self.inner_optimizer, index, dtype, step)
            # The union's norm adds parts of several weights: each in gradient units, d = m / c.
            d = ops.cast(m / c, dtype) if isinstance(m, float) else ops.reshape(m if isinstance(c, float) else m / c, view)
            q = ops.multiply(d, x)
            if penalty.l1:
                t = lr * penalty.l1
                q = q - ops.clip(q, -t, t)
            axes = prox.group_axes(view)
            sq = ops.reshape(ops.sum(ops.square(q), axis=axes), (-1,))
            own, onehot = penalty.membership(int(sq.shape[0]))
            onehot = ops.cast(onehot, dtype)
            part = ops.matmul(ops.reshape(sq, (1, -1)), onehot)[0]
            total = part if total is None else total + ops.cast(part, total.dtype)
            prepared.append((index, value, shape, view, dtype, lr, lr_coupled, d, q, sq, own, onehot, penalty))
        points = []
        keys = None  # the coupled groups every member spares: one ranking of the unions per step
        if any(penalty.sparing() for _, penalty in coupled):
            keys = coupled[0][1].spared_keys(total)
        for index, value, shape, view, dtype, lr, lr_coupled, d, q, sq, own, onehot, penalty in prepared:
            scales = ops.convert_to_tensor(penalty.scales, dtype)
            c = lr * penalty.factor * math.sqrt(prox.group_size(view))
            factor = prox.coupled_group_factors(sq, total, own, onehot, c, lr_coupled * scales)
            axis_shape = [1] * len(view)
            axis_shape[-2] = -1
            z = ops.divide(q * ops.reshape(factor, axis_shape), d)
            if keys is not None:  # the spared groups (a stream's strongest channels) stay as they were
                spared = ops.reshape(penalty.spared_groups(sq, keys), axis_shape)
                z = ops.where(ops.greater(spared, 0), ops.reshape(ops.cast(value, dtype), view), z)
            points.append((index, ops.cast(ops.reshape(z, shape), value.dtype)))
        return points

    def _apply_proximal_steps(self, penalties, learning_rate):
        coupled = [(i, p) for i, p in penalties if isinstance(p, CoupledGroupLasso)]
        penalties = [(i, p) for i, p in penalties if not isinstance(p, CoupledGroupLasso)]
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            if context is None:  # cross-replica context: no merge needed
                self._distributed_proximal_steps(tf.distribute.get_strategy(), penalties, learning_rate, coupled)
            else:
                context.merge_call(self._distributed_proximal_steps, args=(penalties, learning_rate, coupled))
            return
        points = self._points_function()(penalties, coupled, learning_rate)
        for index, z in points:
            self._trainable_variables[index].assign(z)

    def _points(self, penalties, coupled, learning_rate):
        """``[(variable index, its proximal point), ...]``: every point read before any variable is written."""
        rates, step = self._rates(learning_rate), {}
        points = self._coupled_points(coupled, rates, step) if coupled else []
        for index, penalty in penalties:
            variable = self._trainable_variables[index]
            points.append((index, self._proximal_point(index, penalty, variable, rates[penalty.multiplier_index], step)))
        return points

    def _points_function(self):
        """:meth:`_points`, compiled on its own by ``torch.compile`` where that pays (see ``jit_compile_step``)."""
        if keras.backend.backend() != "torch" or torch_compiling() or self._compiled_points is False:
            return self._points
        if self._compiled_points is None:
            self._eager_steps += 1
            if self.jit_compile_step is False or (self.jit_compile_step == "auto"
                                                  and self._eager_steps <= COMPILE_AFTER_STEPS):
                return self._points
            import torch

            self._compiled_points = torch.compile(self._points, fullgraph=True, dynamic=False)
        return self._compiled_or_eager

    def _compiled_or_eager(self, penalties, coupled, learning_rate):
        """The compiled :meth:`_points`; where compiling fails (no C++ compiler, ...), the eager one from then on.

        The points are computed before any variable is written, so a failed compilation changed nothing.
        """
        try:
            return self._compiled_points(penalties, coupled, learning_rate)
        except Exception as error:  # noqa: BLE001 - any compiler failure: the eager step is the same step
            self._compiled_points = False
            warnings.warn(f"Proximal: torch.compile of the proximal step failed ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); the step runs eagerly from now on "
                          "(the same step, slower). Proximal(..., jit_compile_step=False) skips the attempt.",
                          RuntimeWarning, stacklevel=2)
            return self._points(penalties, coupled, learning_rate)

    def _distributed_proximal_steps(self, strategy, penalties, learning_rate, coupled=()):
        # Like Keras's own weight decay: one update per variable, on every replica.
        rates, shared = self._rates(learning_rate), {}
        for index, z in self._coupled_points(coupled, rates, shared) if coupled else []:
            strategy.extended.update(
                self._trainable_variables[index].value, lambda var, z: var.assign(z), args=(z,), group=False
            )
        for index, penalty in penalties:

            def step(var, rate, index=index, penalty=penalty):
                return var.assign(self._proximal_point(index, penalty, var, rate, shared))

            strategy.extended.update(
                self._trainable_variables[index].value, step, args=(rates[penalty.multiplier_index],), group=False
            )

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "metric": self.metric,
            "jit_compile_step": self.jit_compile_step,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)


def _num_replicas():
    # The scale keras.losses applies to additional losses under tf.distribute.
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


def _resolve_optimizer(owner, optimizer):
    constraint = "a keras.optimizers.Optimizer (or a name keras.optimizers.get resolves)"
    if isinstance(optimizer, (str, dict)):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except (ValueError, TypeError, KeyError):  # a dict without its class_name: KeyError
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

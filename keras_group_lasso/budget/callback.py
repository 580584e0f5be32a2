"""Ask for a size, get it: a callback that steers the penalty strength until the model fits a budget.

The callback measures and applies; the parts it calls decide: :mod:`.controller`
what to do at a check (state and sizes in, a decision out) with the pure
functions of :mod:`.schedule`, :mod:`.measure` counts the sizes, cuts the
weakest groups down to a goal and rounds the widths, :mod:`.cut` ranks the
groups, finds the fewest that meet a goal on copies of the kernels' values and
holds the groups set to zero, :mod:`.rounding` picks widths in whole blocks,
:mod:`.latency_limit` keeps a latency budget's table and limit,
:mod:`.renewal` renews BatchNormalization statistics after a cut,
:mod:`.latency_check` times the pruned model when ``fit`` ends, and
:mod:`.state` is its progress, kept in the model
(:mod:`keras_group_lasso.declared`) so that a resumed training decides as the
uninterrupted one.
"""

import logging
import math
import numbers
import warnings

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import check_non_negative, check_positive_int, fail
from keras_group_lasso.budget import controller, cut, latency_check, measure, messages, renewal, rounding, schedule
from keras_group_lasso.budget.state import CUT, SEARCH, WITHIN, BudgetState
from keras_group_lasso.budget.latency_limit import LatencyLimit
from keras_group_lasso.declared import BUDGET_STATE_SIZE, declare_group_penalties, group_sparse_penalties

__all__ = ["SparsityBudget"]

_OWNER = "SparsityBudget"
_LOG = logging.getLogger("keras_group_lasso")
#: How a budget gets to its size: ``"gradual"`` cuts the weakest groups along the schedule as training goes;
#: ``"penalty"`` lets the steered penalties remove groups and cuts, once settling begins, what they left over.
PACES = ("gradual", "penalty")
#: Checks per epoch with ``update_freq="auto"`` and the gradual pace.
CHECKS_PER_EPOCH = 8
#: With the gradual pace, the share of the searching epochs before the first cut: the weights first learn which
#: groups matter.
WARM_UP = 1 / 3
#: With the gradual pace, a cut of at most this share of the prunable groups when settling begins is the
#: schedule's last step (logged); a larger one is said in a warning.
SMALL_CUT = 0.05
#: ``min_width="auto"``: each layer keeps at least this share of the width at which all prunable layers, equally
#: narrowed, meet the budget (:func:`.schedule.even_share`).
LEAST_WIDTH = 0.9


class SparsityBudget(keras.callbacks.Callback):
    """Steer the group penalties during ``fit`` so that training ends within a size budget.

    Sizes are counted as :func:`keras_group_lasso.sparsity_report` counts them at ``threshold``: selected input
    features, live hidden units (a coupled unit once), parameters and multiply-adds per sample of the Dense and
    convolution layers after surgery, and with ``max_latency`` the predicted time of a
    :class:`~keras_group_lasso.LatencyTable`. A budget is an ``int`` (a count) or a ``float`` in (0, 1] (a
    fraction of the dense model); several must all hold. The guide (``docs/budgets.md``) explains each part
    and gives the measurements behind the defaults.

    Each size follows a schedule from the dense size to the budget over the searching epochs (the first
    ``1 - settle`` of them)::

        target(progress) = budget + (dense - budget) * (1 - progress) ** schedule_power

    (for units, parameters, FLOPs and latency, in the width of every prunable layer narrowed alike rather than in
    size: :func:`.schedule.targets`).

    At every check (``update_freq``: by default eight per epoch) :func:`.controller.decide` says what to do: the
    penalties' strength multipliers (:func:`keras_group_lasso.set_penalty_multiplier`; input groups for
    ``max_features``, the others for ``max_units``, both for the rest) grow behind the schedule and ease ahead of
    it, within ``max_strength`` times the starting strength; with ``pace="gradual"`` (default), after a warm-up of
    a third of the searching epochs, a model over its target has its weakest groups set to zero, the fewest that
    meet it, and a model over its budget the check's share of the groups still to go (``cuts`` lists ``(epochs
    elapsed, groups)``), and with ``pace="penalty"`` the penalties alone remove
    groups. When settling begins a model still over its budget is cut to it, every zero group is held at zero
    and the survivors train without the penalties, so ``fit`` ends within the budget. A group's weakness is
    counted per share of the budget its unit frees, no layer goes below its least width (``min_width``) while the
    budget can be met without (along the way, least and most widths follow the schedule:
    :func:`.schedule.least_width_at`, :func:`.schedule.most_width_at`), and after a cut ``BatchNormalization``
    statistics renew; with ``round_to`` > 1 the settled widths are multiples of it (``rounded``, ``spared``). The guide says how each part works.

    The epoch's ``logs`` get ``budget_multiplier_input``, ``budget_multiplier_hidden``, ``budget_phase`` (0
    searching, 1 within the budget, 2 groups were cut), ``budget_over`` (the largest size / budget),
    ``budget_cut`` (groups set to zero in the epoch) and each budgeted size (``budget_flops``, ...,
    ``budget_latency`` in predicted seconds). The multipliers and the budget's progress are model state
    (:mod:`keras_group_lasso.declared`), saved with the weights: a training resumed by ``BackupAndRestore`` or from
    a ``ModelCheckpoint`` ends as the uninterrupted one does. A callback after this one that gives the model other
    weights when ``fit`` ends (``EarlyStopping(restore_best_weights=True)``) is caught, with a warning.

    Args:
        max_features: selected input features.
        max_units: live hidden units (neurons, channels).
        max_params: parameters of the Dense and convolution layers.
        max_flops: multiply-adds per sample of those layers; per position (a
            token) for a model on sequences of any length whose every
            counted layer works per position (a language model; the
            attention's products over the positions are counted at one).
        max_latency: a float in (0, 1], a fraction of the dense model's
            measured time, or ``(seconds, batch size)``, a time per batch
            of that size. The table is measured at that batch size, or at
            256 (``latency_limit.LATENCY_BATCH_SIZE``) for a fraction.
        latency_table: a :class:`~keras_group_lasso.LatencyTable` of this
            model (measured elsewhere, e.g. on the deployment device; for a
            fraction, of one batch size); ``None``: measured when ``fit``
            starts.
        latency_check: with ``max_latency``, build the pruned model when ``fit`` ends, time it beside the
            dense one and keep predicted vs measured in ``latency`` (a warning when the pruned model is more
            than 10 % over its budget), when the table was measured where ``fit`` runs. Default True.
        threshold: weights with ``|w| <= threshold`` count as zero (the
            paper's 1e-3; ``Proximal`` training has exact zeros). Prune the
            trained model with the same threshold.
        settle: the fraction of the epochs, at the end, that trains within
            the budget (in [0, 1)). Default 1/2: the second half recovers from the cuts while the learning
            rate is still high enough to (a decaying one is low in the last third).
        max_strength: the multipliers stay within this factor (>= 1) of the
            strength the training started with.
        schedule_power: the exponent of the schedule (> 0).
        round_to: an integer >= 1; above 1, the settled layers' widths are
            multiples of it (a model over its budget is cut in whole blocks). 1 (default): widths as training left them.
        update_freq: ``"auto"`` (default): eight checks per epoch with the
            gradual pace, the end of every epoch with the penalty pace;
            ``"epoch"``: the multipliers are steered (and with the gradual pace
            groups are cut) at the end of every epoch; ``"batch"`` or an
            integer ``n >= 1``: also after every ``n`` batches.
        spare_block: with ``round_to`` > 1, keep the penalties off the
            ``round_to`` strongest units of each layer rounding may resize. Default False.
        pace: ``"gradual"`` (default: cut along the schedule) or ``"penalty"`` (the penalties alone).
        min_width: ``"auto"`` (default) or a fraction in [0, 1) of each
            layer's units that no cut or penalty goes below; 0: none.

    Raises:
        InvalidParameterError: no budget, or a budget, ``threshold``,
            ``settle``, ``max_strength``, ``schedule_power``, ``round_to``, ``pace``, ``min_width``,
            ``update_freq`` or ``spare_block`` out of range (a count budget
            is at least 1: the strongest group of every layer stays), a
            ``max_latency`` at a batch size the ``latency_table`` lacks; when
            ``fit`` starts, a model whose layers carry no penalty of this
            package, whose group penalties all have ``factor`` 0, or (on JAX) a
            plain Sequential (see :mod:`keras_group_lasso.declared`); a
            ``max_flops`` for a model with inputs of variable size whose
            layers are counted some per position and some per sample; a
            ``latency_table`` measured for another model; a ``max_latency``
            below the predicted time of the narrowest model the budget can
            reach (every prunable layer one unit wide), before the first step.

    Example:
        >>> from keras_group_lasso import Proximal, add_group_sparsity, sparsity_report
        >>> rng = np.random.default_rng(0)
        >>> x = rng.normal(size=(256, 12)).astype("float32")
        >>> y = (x[:, 0] + x[:, 1] > 0).astype("float32")
        >>> model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
        ...                           keras.layers.Dense(1, activation="sigmoid")])
        >>> model = add_group_sparsity(model, 1e-3)
        >>> model.compile(Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "binary_crossentropy")
        >>> history = model.fit(x, y, epochs=10, verbose=0, callbacks=[SparsityBudget(max_features=4)])
        >>> sparsity_report(model).n_selected_features <= 4
        True
    """

    def __init__(self, max_features=None, max_units=None, max_params=None, max_flops=None, *, max_latency=None,
                 latency_table=None, latency_check=True, threshold=1e-3, settle=1 / 2, max_strength=20.0,
                 schedule_power=1.0, round_to=1, update_freq="auto", spare_block=False, pace="gradual",
                 min_width="auto"):
        super().__init__()
        self.max_features = schedule.check_limit(_OWNER, "max_features", max_features)
        self.max_units = schedule.check_limit(_OWNER, "max_units", max_units)
        self.max_params = schedule.check_limit(_OWNER, "max_params", max_params)
        self.max_flops = schedule.check_limit(_OWNER, "max_flops", max_flops)
        if all(v is None for v in (self.max_features, self.max_units, self.max_params, self.max_flops,
                                   max_latency)):
            fail(_OWNER, "max_features", "a budget (at least one of max_features, max_units, max_params, "
                 "max_flops, max_latency)", None)
        self._latency = LatencyLimit.checked(_OWNER, max_latency, latency_table)
        self.max_latency = None if self._latency is None else self._latency.given
        if not isinstance(latency_check, (bool, np.bool_)):
            fail(_OWNER, "latency_check", "True or False", latency_check)
        self.latency_check = bool(latency_check)
        self.latency = None
        self.threshold = check_non_negative(_OWNER, "threshold", threshold)
        settle = check_non_negative(_OWNER, "settle", settle)
        if settle >= 1.0:
            fail(_OWNER, "settle", "a fraction in [0, 1)", settle)
        self.settle = settle
        self.max_strength = check_non_negative(_OWNER, "max_strength", max_strength)
        if self.max_strength < 1.0:
            fail(_OWNER, "max_strength", "a number >= 1", max_strength)
        self.schedule_power = check_non_negative(_OWNER, "schedule_power", schedule_power)
        if self.schedule_power <= 0.0:
            fail(_OWNER, "schedule_power", "a number > 0", schedule_power)
        self.round_to = check_positive_int(_OWNER, "round_to", round_to)
        if pace not in PACES:
            fail(_OWNER, "pace", " or ".join(repr(p) for p in PACES), pace)
        self.pace = pace
        if isinstance(min_width, str) and min_width == "auto":
            self.min_width = min_width
        elif isinstance(min_width, bool) or not isinstance(min_width, numbers.Real) or not 0.0 <= min_width < 1.0:
            fail(_OWNER, "min_width", "'auto' or a fraction in [0, 1) of each layer's units", min_width)
        else:
            self.min_width = float(min_width)
        if isinstance(update_freq, str) and update_freq in ("epoch", "batch", "auto"):
            self.update_freq = 1 if update_freq == "batch" else update_freq
        elif isinstance(update_freq, bool) or not isinstance(update_freq, numbers.Integral) or update_freq < 1:
            fail(_OWNER, "update_freq", "'auto', 'epoch', 'batch' or an integer >= 1 (batches between checks)",
                 update_freq)
        else:
            self.update_freq = int(update_freq)
        if not isinstance(spare_block, (bool, np.bool_)):
            fail(_OWNER, "spare_block", "True or False", spare_block)
        self.spare_block = bool(spare_block)
        if self.update_freq != "epoch" and not (self.update_freq == "auto" and self.pace == "penalty"):
            # Only then a batch hook: Keras dispatches the batches of a fit whose callbacks have none
            # asynchronously.
            self.on_train_batch_end = self._check_batch
        self._epoch = 0
        self.rounded = {}
        self.spared = {}
        self.floors = {}
        self.cuts = []
        self._every = None
        self._pending = set()  # groups cut inside this epoch, held at zero after every batch until its end
        self._share = 0.0
        self._epoch_cut = 0
        self._renewal = renewal.StatisticsRenewal()  # the BatchNormalization momenta a cut lowered in this fit
        self.limits = None
        self._declared = None
        self._first_epoch = None
        self._curves = {}

    # ------------------------------------------------------------------ the model's state

    @property
    def state(self):
        """The budget's progress (:class:`~keras_group_lasso.budget.state.BudgetState`), read from the model."""
        if self._declared is None:
            return BudgetState()
        return BudgetState.from_vector(self._declared.budget_values())

    def _update(self, **changes):
        state = self.state.replace(**changes)
        self._declared.set_budget_values(state.to_vector(BUDGET_STATE_SIZE))
        return state

    @property
    def multiplier(self):
        """``[input groups, other groups]``: the strength multiplier the model trains with now."""
        return None if self._declared is None else self._declared.multiplier_values()

    @property
    def phase(self):
        return self.state.phase

    @property
    def initial(self):
        return list(self.state.initial)

    @property
    def reached(self):
        return list(self.state.reached)

    @property
    def last_sizes(self):
        return self.state.last_sizes

    @property
    def _settling(self):
        return self.state.settling

    @property
    def latency_batch_size(self):
        """The batch size the latency budget counts at (``None`` without ``max_latency``)."""
        return None if self._latency is None else self._latency.batch_size

    @property
    def latency_table(self):
        """The :class:`~keras_group_lasso.LatencyTable` a latency budget counts with (given, kept in the model's
        state or measured when training began; ``None`` without ``max_latency`` or before a table was given or
        measured)."""
        return None if self._latency is None else self._latency.table

    @property
    def least_width(self):
        """The share of its units below which this ``fit``'s budget takes no layer (while the budget can be met
        without): ``min_width``, or with ``"auto"`` the share measured when training began (0 before)."""
        return self._share

    @property
    def plan(self):
        """What this ``fit`` aims at (:class:`~keras_group_lasso.budget.controller.Plan`): the dense sizes, the limits,
        the schedule's power, the strength's cap and the pace (``None`` before training began)."""
        if self.limits is None:
            return None
        return controller.Plan(self.dense, self.limits, self.schedule_power, self.max_strength, self.pace == "gradual",
                               self._curves, self._share)

    # ------------------------------------------------------------------ measuring, and where training is

    def _meter(self):
        """How this budget counts the model's sizes now (:class:`.measure.Meter`).

        Until settling rounds the widths, at those rounding up would give. Reading ``self.model`` on JAX writes the
        training state back first.
        """
        return measure.Meter(self.model, self.threshold, self._latency, self.round_to,
                             self.round_to > 1 and self.state.rounded, _OWNER)

    def _over(self, sizes):
        return schedule.over(sizes, self.limits)

    def _epochs(self):
        return int(self.params.get("epochs", self._epoch + 1) if self.params else self._epoch + 1)

    def _search_end(self):
        """The number of epochs before the settling part."""
        return max(1, int(math.ceil((1.0 - self.settle) * self._epochs())))

    def _elapsed(self, epoch):
        """Epochs since ``fit`` began at a check in ``epoch`` (``None``: when training ends)."""
        if epoch is None:
            return float(self._epoch + 1)
        if self._steps and 0 < self._done < self._steps and epoch == self._epoch:
            return epoch + self._done / self._steps
        return float(epoch + 1)

    def _checks_every(self):
        """Batches between two checks inside an epoch, or ``None`` (the epoch's end only)."""
        if self.update_freq == "auto" and self.pace == "penalty":
            return None
        return schedule.checks_every(self.update_freq, self._steps, CHECKS_PER_EPOCH)

    # ------------------------------------------------------------------ Keras hooks

    def set_model(self, model):
        super().set_model(model)
        # Declared before any callback's on_train_begin, so BackupAndRestore finds the state to restore
        # whatever the order of the callbacks.
        self._declared = declare_group_penalties(model, _OWNER)

    def on_train_begin(self, logs=None):
        # Only what the model's structure fixes: a restore by another callback may come before or after.
        self._pending = set()
        if not any(cut.strength(p) > 0 for _, _, p in group_sparse_penalties(self.model)):
            fail(_OWNER, "model", "a model with group penalties of factor > 0 (the budget scales their strength)",
                 self.model)
        report = analysis.sparsity_report(self.model, threshold=self.threshold)
        per_position = {layer.flops_per_position for layer in report.layers if layer.flops_before}
        if self.max_flops is not None and len(per_position) > 1:
            fail(_OWNER, "max_flops", "None for a model with inputs of variable size whose layers are counted some "
                 "per position and some per sample (after a global pooling): use max_params or max_units",
                 self.max_flops)
        self.dense = {"features": report.n_features, "units": report.neurons, "params": report.params_before,
                      "flops": report.flops_before}
        self.limits, above = schedule.limits_of({"features": self.max_features, "units": self.max_units,
                                                 "params": self.max_params, "flops": self.max_flops}, self.dense)
        if self._latency is not None:  # the table (given, kept in the model's state or measured now) and the limit
            self._latency.begin(self.model, self._declared, above)
            self._latency_limit()
        if above:
            warnings.warn(messages.within_already(_OWNER, above), RuntimeWarning, stacklevel=2)
        self._release_constraints()  # a fit that ended by an exception may have left them
        self._warned = self._unmeetable = self._blocks_failed = False
        self._finished = None
        self.rounded = {}
        self._first_epoch = None
        self._steps = self.params.get("steps") if self.params else None  # None: a dataset of unknown length
        self._every = self._checks_every()
        self._narrowing()
        if self.min_width == "auto" and self._share:
            _LOG.info("%s: no layer goes below %.3g of its units while the budget can be met without (min_width="
                      "'auto')", _OWNER, self._share)
        self.cuts = []
        self._groups = sum(int(v.regularizer.group_shape(tuple(v.shape))[-2])
                           for v in cut.penalised_kernels(self.model))
        self._done = self._checked = 0  # batches of this epoch: done, done at the last check

    def _latency_limit(self):
        """The dense time and the latency limit of :class:`.LatencyLimit`, and its table for a monitor in this fit."""
        self.dense["latency"], self.limits["latency"] = self._latency.dense, self._latency.limit
        self._declared.training_latency = (self.latency_table, self.latency_batch_size)

    def _narrowing(self):
        """The sizes as curves of the width every prunable layer keeps, the even share that meets the budget (the
        schedule narrows the widths toward it) and the least width (``min_width``)."""
        self._curves = self._meter().width_curves(self.dense, self.limits)
        even = schedule.even_share(self.dense, self._curves, self.limits)
        self._share = LEAST_WIDTH * even if self.min_width == "auto" else self.min_width

    def on_epoch_begin(self, epoch, logs=None):
        """A new search at epoch 0; later, a resumed training catches up with the decision of the epoch before.

        The end of every epoch decides (steering, settling, the cut) and records that it did in the model's
        state. A checkpoint written at the end of an epoch by a callback that runs before this one
        (``BackupAndRestore``, ``ModelCheckpoint``) holds the state before that decision: a training
        resumed from it takes the decision here, from the same weights and state.
        """
        self._epoch = epoch
        self._done = self._checked = self._epoch_cut = 0
        if self.limits and "latency" in self.limits:  # for a monitor in this fit (which dropped any table a failed fit left)
            self._declared.training_latency = (self.latency_table, self.latency_batch_size)
        if self._first_epoch is not None:
            return
        self._first_epoch = epoch
        if self.limits and "latency" in self.limits and self._latency.adopt_restored(self.model, self._declared):
            self._latency_limit()
            self._narrowing()
        state = self.state
        if epoch == 0 or not state.started:
            start = [v if v > 0 else 1.0 for v in self._declared.multiplier_values()]
            self._declared.set_budget_values(BudgetState().started_from(start).to_vector(BUDGET_STATE_SIZE))
            self._declared.set_multiplier(*start)
        self._spare_blocks()
        if state.started and epoch > 0:
            if state.decided < epoch:
                self._decide(epoch - 1)
            elif state.settling or self.pace == "gradual":  # resumed: hold the groups at zero again, as the
                self._freeze()  # uninterrupted training does since they went
            if self.state.settling and self.state.phase == CUT:  # and renew the statistics as the training
                self._renew_statistics()  # that was not interrupted does (after the cut's epoch)

    def _check_batch(self, batch, logs=None):
        """With ``update_freq`` batches: steer after every ``update_freq`` of them (Keras's ``on_train_batch_end``)."""
        self._done = batch + 1
        if self._pending:  # reading self.model on JAX writes the training state back first (Callback.model)
            cut.zero_groups(self.model, self._pending)
        if (self.limits is None or not self._steps or self._every is None
                or self._done - self._checked < self._every or self._done >= self._steps):
            return  # the epoch's end checks the last batches itself
        # On JAX the training state lives outside the model's variables during an epoch; reading ``self.model``
        # writes it back (Keras's Callback.model) before the state and the weights are read.
        if self.model is None or self._settling:
            return
        sizes = self._meter().now()
        decision = self._ask(sizes, self._epoch + self._done / self._steps, (self._done - self._checked) / self._steps,
                             epoch_end=False)
        sizes = self._follow(decision, sizes, self._epoch)
        self._checked = self._done
        self._update(last_sizes=sizes)

    def _ask(self, sizes, elapsed, fraction, epoch_end):
        """The controller's decision (:func:`.controller.decide`) at a check ``elapsed`` epochs into ``fit``, a
        ``fraction`` of an epoch after the last one."""
        gradual = self.pace == "gradual"
        # The gradual pace starts after a warm-up and closes, at each check, its share of the way to the next one.
        gap = (self._every / self._steps if self._every and self._steps else 1.0) if gradual else None
        check = controller.check_at(elapsed, self._search_end(), WARM_UP if gradual else 0.0, gap, fraction,
                                    epoch_end)
        return controller.decide(self.state, self.multiplier, sizes, self.plan, check)

    def _follow(self, decision, sizes, epoch):
        """A decision that does not settle: train with its multiplier, and cut the weakest groups down to its goals
        (the gradual pace) and hold every group at zero from then on; the sizes after."""
        self._declared.set_multiplier(*decision.multiplier)
        if decision.goals is None and not decision.closing:
            return sizes
        removed, sizes = self._cut_weakest_groups(epoch, sizes, decision.goals or {}, decision.closing,
                                                  (decision.least_width, decision.most_width))
        if removed:
            _LOG.info("%s: %d groups set to zero in epoch %d to follow the schedule.", _OWNER, removed, epoch + 1)
            self._update(cut=self.state.cut + removed)
            self._epoch_cut += removed
            self._hold()
        return sizes

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = epoch
        if self._pending:  # the groups cut inside the epoch: the step is traced again once, with all of them
            self._freeze()
        if self.update_freq != "epoch" and not self._steps:  # a dataset of unknown length: its first epoch counts
            self._steps = self._done or None
            self._every = self._checks_every()
        if self.limits is None:
            return
        _, sizes = self._decide(epoch)
        if logs is not None:
            multiplier = self.multiplier
            logs["budget_multiplier_input"] = float(multiplier[0])
            logs["budget_multiplier_hidden"] = float(multiplier[1])
            logs["budget_phase"] = int(self.phase)
            logs["budget_over"] = float(self._over(sizes))
            logs["budget_cut"] = int(self._epoch_cut)
            for kind in self.limits:
                logs[f"budget_{kind}"] = float(sizes[kind]) if kind == "latency" else int(sizes[kind])

    def _decide(self, epoch):
        """What the end of ``epoch`` decides: steer the strength, or settle (round, cut, freeze).

        Returns ``(groups this decision set to zero, the sizes after it)``; records that it was taken.
        """
        sizes = self._meter().now()
        over = self._over(sizes)
        decision = self._ask(sizes, float(epoch + 1), schedule.last_fraction(self._every or "epoch", self._steps),
                             epoch_end=True)
        state, removed = self.state, 0
        if decision.settle:
            # Settling: the structure is fixed (by the cut if the model is over its budget) and the
            # survivors train within it.
            phase = state.phase
            if not state.settling and self.round_to > 1:
                # Whole blocks: widths step down a block at a time where the budget needs it (a cut of
                # single groups would remove units that free nothing until a block empties).
                self.rounded, removed = self._round_widths(epoch, grow=epoch + 1 < self._epochs())
                sizes = self._meter().now()
                over = self._over(sizes)
                if removed:
                    phase = CUT
            if over > 1.0:
                more, sizes = self._cut_weakest_groups(epoch, sizes)
                removed, phase = removed + more, CUT
            elif phase != CUT:
                phase = CUT if state.cut > 0 else WITHIN  # the gradual pace cut on the way
            if not state.settling:
                # The structure is fixed from here on: every group that is zero now stays zero (exactly: the
                # state a resumed training reads again), and the survivors train without the penalties, so
                # nothing more goes either (under the penalties a cut network kept losing groups).
                self._warn_far_below(sizes, epoch)
                cut.zero_dead_groups(self.model, self.threshold)
                self._update(settling=True, reached=self.multiplier)
                self._declared.set_multiplier(0.0, 0.0)
            self._update(phase=phase, cut=self.state.cut + removed)
            self._epoch_cut += removed
            if removed or (not state.settling and phase == CUT):  # after the last cut, whenever it was
                self._renew_statistics()
            self._freeze()
        else:
            sizes = self._follow(decision, sizes, epoch)
            if self.pace == "gradual":
                self._freeze()  # every group at zero now stays there (what a resumed training holds again)
            self._update(phase=SEARCH if self._over(sizes) > 1.0 else WITHIN)
        self._update(last_sizes=sizes, decided=epoch + 1)
        return removed, sizes

    def _warn_far_below(self, sizes, epoch):
        """Say so when settling begins below half a budget: the penalties took more than was asked."""
        message = messages.far_below(_OWNER, sizes, self.limits, self.dense, epoch)
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def on_train_end(self, logs=None):
        # A training stopped before its settling part (EarlyStopping, a KeyboardInterrupt handled by the
        # caller, fewer epochs): the budget still holds when fit returns. A callback after this one may
        # still give the model other weights (EarlyStopping(restore_best_weights=True)): the check then
        # runs once more after every callback, at the end of fit's History (Keras puts it last).
        if self.limits is None:
            return
        self._declared.training_latency = None
        self._finish()
        if "latency" in self.limits and self.latency_check:
            self.latency = latency_check.time_pruned(self.model, self.latency_table, self.threshold,
                                                     self.latency_batch_size, self.limits["latency"], _OWNER)
            if self.latency is not None and logs is not None:
                logs["budget_latency_predicted"] = self.latency["predicted"]
                logs["budget_latency_measured"] = self.latency["measured"]
        history = getattr(self.model, "history", None)
        if isinstance(history, keras.callbacks.History) and "on_train_end" not in vars(history):
            def after_every_callback(logs=None, history=history):
                del history.on_train_end
                history.on_train_end(logs)
                self._finish(after_others=True)

            history.on_train_end = after_every_callback

    def _finish(self, after_others=False):
        sizes = self._meter().now()
        if after_others and sizes == self._finished:
            return  # no callback after this one changed the model
        if self._over(sizes) > 1.0:
            if after_others:
                warnings.warn(messages.restored_over(_OWNER), RuntimeWarning, stacklevel=2)
                self._warned = False
            more, sizes = self._cut_weakest_groups(None, sizes)
            self._update(phase=CUT, cut=self.state.cut + more)
        self._update(last_sizes=sizes)
        self._finished = sizes
        self._release_constraints()
        if self.state.settling:  # the model keeps the strength the search reached (saved with it, resumed from)
            self._declared.set_multiplier(*self.reached)

    # ------------------------------------------------------------------ what a compiled step holds

    def _spare_blocks(self):
        """The groups the penalties leave alone for this ``fit``.

        The least widths (:func:`.cut.spare_floors`; ``floors``), and with ``spare_block`` the ``round_to`` strongest
        units of every roundable layer (:func:`.rounding.spare_blocks`; ``spared``). The train step is traced again,
        as it holds what it was traced with.
        """
        self.spared, self.floors = {}, {}
        # Every penalised kernel holds its cut groups through a mask the step reads as it runs: cutting and
        # freezing groups later in this fit traces nothing again (see cut.hold_groups).
        held = cut.hold_groups(self.model)
        if self._settling:
            if held:
                self.model.make_train_function(force=True)
            return
        if self._share > 0.0 or self.pace == "gradual":
            # With the gradual pace every kernel spares its strongest group at least: the cuts reach the size, and
            # a strength too high for the model cannot empty a layer (a network's one input channel, say) on the way.
            self.floors = cut.spare_floors(self.model, self._share, least=1 if self.pace == "gradual" else 0)
        if self.spare_block and self.round_to > 1:
            found = analysis.analyze(self.model, self.threshold, owner=_OWNER)
            self.spared = rounding.spare_blocks(found, self.round_to)
        if held or any(penalty.spared for _, _, penalty in group_sparse_penalties(self.model)):
            self.model.make_train_function(force=True)

    def _freeze(self):
        """Hold every exactly zero group at zero after each optimizer step until ``fit`` ends (see :mod:`.cut`)."""
        self._pending = set()
        if cut.freeze_groups(self.model, cut.dead_groups(self.model, self.threshold, exact=True)):
            self.model.make_train_function(force=True)

    def _hold(self):
        """:meth:`_freeze` inside an epoch, without tracing the step again (up to eight checks an epoch cut): the
        groups a traced step cannot take as it runs are set to zero after every batch (:meth:`_check_batch`) until
        the epoch's end freezes them."""
        self._pending = cut.hold_live(self.model, cut.dead_groups(self.model, self.threshold, exact=True))

    def _renew_statistics(self):
        """After a cut: the ``BatchNormalization`` layers renew their statistics over the settling part's steps (see
        :mod:`.renewal`; a cut is made when settling begins, and a resumed training lowers the momenta again)."""
        left = (self._epochs() - self._search_end()) * (self._steps or self._done)
        if self._renewal.lower(self.model, self._declared, left):
            self.model.make_train_function(force=True)

    def _release_constraints(self):
        """The kernels' own constraints back, and no spared groups: the next ``fit`` traces without them."""
        if self.model is None:
            return
        changed = self._renewal.restore(self._declared)
        changed = cut.release_frozen_groups(self.model) or changed
        for _, _, penalty in group_sparse_penalties(self.model):
            changed = changed or bool(penalty.spared)
            penalty.spared = 0
        if changed:
            self.model.make_train_function(force=True)

    # ------------------------------------------------------------------ setting groups to zero

    def _cut_weakest_groups(self, epoch, sizes, goals=None, closing=0.0, widths=(0.0, 1.0)):
        """Zero the fewest weakest groups that meet the budget, or ``goals``, and record it; returns ``(newly, sizes)``.

        ``goals``: sizes on the way to the budget, ``closing`` the share of the groups still to go before the
        budget that go as well (:func:`.measure.cut_to`), and ``widths`` the shares of its width no layer goes
        below on the way (besides the least widths, ``floors``) and above which its weakest groups go first. The
        cut to the budget says what it could not meet, or that it cut more than a small last step.
        """
        final = goals is None
        floors, ceilings = self.floors, None
        if not final:
            least, most = widths
            if least > 0.0:
                floors = {path: max(keep, self.floors.get(path, 0))
                          for path, keep in cut.least_groups(self.model, least, least=1).items()}
            if most < 1.0:
                ceilings = cut.least_groups(self.model, most)
        newly, best = measure.cut_to(self._meter(), sizes, self.limits if final else goals, floors, final,
                                     self.limits, closing, ceilings)
        if newly:
            self.cuts.append((self._elapsed(epoch), newly))
        if not final:  # a step along the schedule: the final cut says what it could not meet
            return newly, best
        if self._over(best) > 1.0 and not self._unmeetable:
            self._unmeetable = True  # said once per fit
            warnings.warn(messages.unmeetable(_OWNER, newly, best, self.limits,
                                              *measure.unmet_causes(self.model, self._declared)),
                          RuntimeWarning, stacklevel=3)
        elif newly and self.pace == "gradual" and newly <= SMALL_CUT * self._groups:
            _LOG.info("%s: %d groups set to zero to meet the budget when settling began.", _OWNER, newly)
        elif newly and self._over(best) <= 1.0:
            blocks = (f"widths in blocks of {self.round_to} (round_to) could not meet it, so "
                      if getattr(self, "_blocks_failed", False) else "")
            self._warn_cut(f"{blocks}{newly} of its weakest groups were set to zero", best, epoch)
        return newly, best

    def _warn_cut(self, what, sizes, epoch):
        """Say once per ``fit`` that ``what`` (groups, units) was set to zero to meet the budget."""
        if self._warned:
            return
        self._warned = True
        last = epoch is None or epoch + 1 >= self._epochs()
        stale = last and bool(renewal.moving_statistics_layers(self.model))
        warnings.warn(messages.cut_to_meet(_OWNER, what, sizes, self.limits, epoch, stale), RuntimeWarning,
                      stacklevel=3)

    def _round_widths(self, epoch, grow):
        """Give each roundable layer a multiple of ``round_to`` live units within the budget.

        See :func:`.measure.round_widths`. Returns ``({layer name: (live units before, after)}, live units removed)``.
        """
        done = measure.round_widths(self._meter(), self.limits, grow)
        self._update(rounded=True)  # from here on the sizes are the model's own
        if done is None:
            self._blocks_failed = True  # the cut of single groups takes over, and says so
            return {}, 0
        changed, removed = done
        if removed:
            self._warn_cut(f"{removed} live units went, in blocks of {self.round_to} (round_to)", self._meter().now(),
                           epoch)
        return changed, removed

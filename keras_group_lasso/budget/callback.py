"""Ask for a size, get it: a callback that steers the penalty strength until the model fits a budget.

The callback is the loop; the parts it calls decide and act: :mod:`.settings`
the arguments, checked and frozen, :mod:`.controller`
what to do at a check (state and sizes in, a decision out, with the pure
functions of :mod:`.schedule`), :mod:`.measure` the sizes, :mod:`.cutting` the
cuts and what they say (ranked on arrays by :mod:`.cut`, rounded by
:mod:`.rounding`), :mod:`.hold` what the compiled step holds (the groups at
zero, the spared groups, the BatchNormalization renewal of :mod:`.renewal`),
:mod:`.latency_limit` a latency budget's table and limit, :mod:`.latency_check`
the pruned model's time when ``fit`` ends, and :mod:`.state` the progress, kept
in the model's named variables (:mod:`keras_group_lasso.declared`) so that a
resumed training decides as the uninterrupted one.
"""

import dataclasses
import logging
import warnings

import keras

from keras_group_lasso._validation import fail
from keras_group_lasso.budget import controller, cut, latency_check, measure, messages, schedule
from keras_group_lasso.budget.cutting import SMALL_CUT, Cutting
from keras_group_lasso.budget.hold import StepHold
from keras_group_lasso.budget.latency_limit import LatencyLimit
from keras_group_lasso.budget.settings import WARM_UP, BudgetSettings
from keras_group_lasso.budget.state import CUT, SEARCH, WITHIN, BudgetState
from keras_group_lasso.declared import declare_group_penalties, group_sparse_penalties

__all__ = ["SparsityBudget", "SMALL_CUT"]

_OWNER = "SparsityBudget"
_LOG = logging.getLogger("keras_group_lasso")


class SparsityBudget(keras.callbacks.Callback):
    """Steer the group penalties during ``fit`` so that training ends within a size budget.

    Sizes are counted as :func:`keras_group_lasso.sparsity_report` counts them at ``threshold``: selected input
    features, live hidden units (a coupled unit once), parameters and multiply-adds per sample of the Dense and
    convolution layers after surgery, and with ``max_latency`` the predicted time of a
    :class:`~keras_group_lasso.LatencyTable`. A budget is an ``int`` (a count) or a ``float`` in (0, 1] (a
    fraction of the dense model); several must all hold. The guide (``docs/budgets.md``) explains each part
    and gives the measurements behind the defaults.

    Each size follows a schedule from the dense size to the budget over the searching epochs (the first
    ``1 - settle`` of them; :func:`.schedule.targets`). At every check (``update_freq``: by default eight per
    epoch) :func:`.controller.decide` says what to do: the penalties' strength multipliers grow behind the
    schedule and ease ahead of it (within ``max_strength`` times the starting strength); with ``pace="gradual"``
    (default), after a warm-up, a model over its target has its weakest groups set to zero, the fewest that meet
    it (``cuts`` lists ``(epochs elapsed, groups)``); with ``pace="penalty"`` the penalties alone remove groups.
    When settling begins a model still over its budget is cut to it, every zero group is held at zero and the
    survivors train without the penalties, so ``fit`` ends within the budget. A group's weakness is counted per
    share of the budget its unit frees, no layer goes below its least width (``min_width``) while the budget can
    be met without, ``BatchNormalization`` statistics renew after a cut, and with ``round_to`` > 1 the settled
    widths are multiples of it (``rounded``, ``spared``). The guide says how each part works.

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
        uniform_blocks: count the sizes of the model whose blocks of one
            class keep as many units and heads each (what
            ``prune_model(.., blocks="uniform")`` returns: a KerasHub
            backbone of the same class again, where every block can have
            one config), and cut the groups at the same place of those
            blocks by rank together, so that they end as wide. Default
            False: each block as training leaves it.

    Raises:
        InvalidParameterError: no budget, or a budget, ``threshold``,
            ``settle``, ``max_strength``, ``schedule_power``, ``round_to``, ``pace``, ``min_width``,
            ``update_freq``, ``spare_block`` (or ``True`` with ``round_to=1``) or ``uniform_blocks`` out of
            range (a count budget is at least 1: the strongest group of every layer stays), a
            ``max_latency`` at a batch size the ``latency_table`` lacks; when
            ``fit`` starts, a model whose layers carry no penalty of this
            package, whose group penalties all have ``factor`` 0, or (on JAX) a
            plain Sequential (see :mod:`keras_group_lasso.declared`); a fraction
            that leaves less than one of the model's features, units,
            parameters or multiply-adds; a
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
                 min_width="auto", uniform_blocks=False):
        super().__init__()
        self._settings = BudgetSettings.checked(
            _OWNER, max_features=max_features, max_units=max_units, max_params=max_params, max_flops=max_flops,
            max_latency=max_latency, latency_check=latency_check, threshold=threshold, settle=settle,
            max_strength=max_strength, schedule_power=schedule_power, round_to=round_to, update_freq=update_freq,
            spare_block=spare_block, pace=pace, min_width=min_width, uniform_blocks=uniform_blocks)
        self._latency = LatencyLimit.checked(_OWNER, max_latency, latency_table)
        self.latency = None
        if self.settings.checks_inside_epochs:
            self.on_train_batch_end = self._check_batch
        self._epoch, self._steps_at_begin = 0, None
        self._every = self._declared = self._first_epoch = self._cutting = self.limits = None
        self._share, self._epoch_cut, self._curves = 0.0, 0, {}
        self._hold = StepHold()  # kept across fits: one that ended by an exception is released by the next

    # ------------------------------------------------------------------ what it reached, read from the model

    @property
    def state(self):
        """The budget's progress (:class:`~keras_group_lasso.budget.state.BudgetState`), read from the model."""
        return BudgetState() if self._declared is None else BudgetState.from_values(self._declared.budget_values())

    def _update(self, **changes):
        state = self.state.replace(**changes)
        self._declared.set_budget_values(state.values())
        return state

    @property
    def multiplier(self):
        """``[input groups, other groups]``: the strength multiplier the model trains with now."""
        return None if self._declared is None else self._declared.multiplier_values()

    phase = property(lambda self: self.state.phase, doc="``SEARCH``, ``WITHIN`` or ``CUT`` (``budget_phase``).")
    initial = property(lambda self: list(self.state.initial), doc="The multiplier the search started from.")
    reached = property(lambda self: list(self.state.reached), doc="The multiplier the search reached.")
    last_sizes = property(lambda self: self.state.last_sizes, doc="``{kind: size}`` at the last check, or ``None``.")
    cuts = property(lambda self: [] if self._cutting is None else self._cutting.cuts,
                    doc="``[(epochs elapsed, groups set to zero)]`` in the last ``fit``, one entry per cut.")
    rounded = property(lambda self: {} if self._cutting is None else self._cutting.rounded,
                       doc="``{layer name: (live units before, after)}`` of the widths rounding changed.")
    prunable_groups = property(lambda self: None if self._cutting is None else self._cutting.groups, doc=(
        "The groups a cut may take, counted when ``fit`` began: the input-channel groups (rows) of every penalised "
        "kernel (depthwise and pointwise kernels apart, so a channel read by two kernels counts twice)."))
    floors = property(lambda self: self._hold.floors, doc="``{kernel path: groups}`` the penalties spare.")
    spared = property(lambda self: self._hold.spared, doc="``{layer name: units}`` spared for rounding.")
    least_width = property(lambda self: self._share, doc=(
        "The share of its units below which this ``fit``'s budget takes no layer while the budget can be met "
        "without: ``min_width``, or with ``'auto'`` the share measured when training began (0 before)."))
    settings = property(lambda self: self._settings, doc=(
        "The checked arguments (:class:`~keras_group_lasso.budget.settings.BudgetSettings`), read-only: a new "
        "``SparsityBudget`` is the way to others."))
    max_latency = property(lambda self: None if self._latency is None else self._latency.given,
                           doc="The latency budget as given (a fraction of the dense model's time), or ``None``.")
    latency_batch_size = property(lambda self: None if self._latency is None else self._latency.batch_size,
                                  doc="The batch size the latency budget counts at (``None`` without one).")
    latency_table = property(lambda self: None if self._latency is None else self._latency.table, doc=(
        "The :class:`~keras_group_lasso.LatencyTable` a latency budget counts with (given, kept in the model's "
        "state or measured when training began; ``None`` without ``max_latency`` or before one was had)."))

    @property
    def plan(self):
        """What this ``fit`` aims at (:class:`~keras_group_lasso.budget.controller.Plan`; ``None`` before it began)."""
        if self.limits is None:
            return None
        s = self.settings
        return controller.Plan(self.dense, self.limits, s.schedule_power, s.max_strength, s.gradual, self._curves,
                               self._share)

    # ------------------------------------------------------------------ measuring, and where training is

    def _meter(self):
        """How this budget counts the model's sizes now (:class:`.measure.Meter`); until settling rounds the
        widths, at those rounding up would give. Reading ``self.model`` on JAX writes the training state back."""
        s = self.settings
        return measure.Meter(self.model, s.threshold, self._latency, s.round_to, s.round_to > 1 and self.state.rounded,
                             _OWNER, s.uniform_blocks)

    def _over(self, sizes):
        return schedule.over(sizes, self.limits)

    def _epochs(self):
        return int(self.params.get("epochs", self._epoch + 1) if self.params else self._epoch + 1)

    def _search_end(self):
        return self.settings.search_end(self._epochs())

    def _elapsed(self, epoch):
        """Epochs since ``fit`` began at a check in ``epoch`` (``None``: when training ends)."""
        if epoch is None:
            return float(self._epoch + 1)
        if self._steps and 0 < self._done < self._steps and epoch == self._epoch:
            return epoch + self._done / self._steps
        return float(epoch + 1)

    # ------------------------------------------------------------------ Keras hooks

    def set_model(self, model):
        super().set_model(model)
        # Declared before any callback's on_train_begin, so BackupAndRestore finds the state to restore
        # whatever the order of the callbacks.
        self._declared = declare_group_penalties(model, _OWNER)

    def on_train_begin(self, logs=None):
        # Only what the model's structure fixes: a restore by another callback may come before or after.
        if not any(cut.strength(p) > 0 for _, _, p in group_sparse_penalties(self.model)):
            fail(_OWNER, "model", "a model with group penalties of factor > 0 (the budget scales their strength)",
                 self.model)
        self.dense = measure.dense_sizes(self.model, self.settings, _OWNER)
        self.limits, above = schedule.limits_of(self.settings.budgets, self.dense, _OWNER)
        if self._latency is not None:  # the table (given, kept in the model's state or measured now) and the limit
            self._latency.begin(self.model, self._declared, above)
            self._latency_limit()
        if above:
            warnings.warn(messages.within_already(_OWNER, above), RuntimeWarning, stacklevel=2)
        if self.settings.uniform_blocks:
            measure.warn_uneven_blocks(self.model, _OWNER)
        self._hold.release(self.model, self._declared)  # a fit that ended by an exception may have left them
        self._finished = self._first_epoch = None
        self._steps = self.params.get("steps") if self.params else None  # None: a dataset of unknown length
        self._every = self.settings.checks_every(self._steps)
        self._narrowing()
        if self.settings.min_width == "auto" and self._share:
            _LOG.info("%s: no layer goes below %.3g of its units while the budget can be met without (min_width="
                      "'auto')", _OWNER, self._share)
        self._cutting = Cutting(_OWNER, self.limits, cut.group_count(self.model), self.settings.gradual,
                                self.settings.round_to)
        self._done = self._checked = 0  # batches of this epoch: done, done at the last check

    def _latency_limit(self):
        """The dense time and the latency limit of :class:`.LatencyLimit`, and its table for a monitor in this fit."""
        self.dense["latency"], self.limits["latency"] = self._latency.dense, self._latency.limit
        self._declared.training_latency = (self.latency_table, self.latency_batch_size)

    def _narrowing(self):
        """The sizes as curves of the width every prunable layer keeps, the even share that meets the budget (the
        schedule narrows the widths toward it) and the least width (``min_width``)."""
        self._curves = self._meter().width_curves(self.dense, self.limits)
        self._share = self.settings.least_width(schedule.even_share(self.dense, self._curves, self.limits))

    def on_epoch_begin(self, epoch, logs=None):
        """A new search at epoch 0; later, a resumed training catches up with the decision of the epoch before.

        The end of every epoch decides (steering, settling, the cut) and records that it did in the model's
        state. A checkpoint written at the end of an epoch by a callback that runs before this one
        (``BackupAndRestore``, ``ModelCheckpoint``) holds the state before that decision: a training
        resumed from it takes the decision here, from the same weights and state.
        """
        self._epoch = epoch
        self._done = self._checked = self._epoch_cut = 0
        self._steps_at_begin = self._optimizer_steps()
        if self.limits and "latency" in self.limits:  # for a monitor in this fit (which dropped a failed fit's table)
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
            self._declared.set_budget_values(BudgetState().started_from(start).values())
            self._declared.set_multiplier(*start)
        self._hold.begin(self.model, self.state.settling, self._share, self.settings.gradual,
                         self.settings.round_to if self.settings.spare_block else 0, self.settings.threshold, _OWNER)
        if state.started and epoch > 0:
            if state.decided < epoch:
                self._decide(epoch - 1)
            elif state.settling or self.settings.gradual:  # resumed: hold the groups at zero again, as the
                self._hold.freeze(self.model, self.settings.threshold)  # uninterrupted training does since they went
            if self.state.settling and self.state.phase == CUT:  # and renew the statistics as the training
                self._renew_statistics()  # that was not interrupted does (after the cut's epoch)

    def _check_batch(self, batch, logs=None):
        """With ``update_freq`` batches: steer after every ``update_freq`` of them (Keras's ``on_train_batch_end``)."""
        self._done = batch + 1
        # On JAX the training state lives outside the model's variables during an epoch; reading ``self.model``
        # writes it back (Keras's Callback.model) before the state and the weights are read.
        if self._hold.pending:
            self._hold.after_batch(self.model)
        if (self.limits is None or not self._steps or self._every is None
                or self._done - self._checked < self._every or self._done >= self._steps):
            return  # the epoch's end checks the last batches itself
        if self.model is None or self.state.settling:
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
        gradual = self.settings.gradual
        # The gradual pace starts after a warm-up and closes, at each check, its share of the way to the next one.
        gap = (self._every / self._steps if self._every and self._steps else 1.0) if gradual else None
        check = controller.check_at(elapsed, self._search_end(), WARM_UP if gradual else 0.0, gap, fraction, epoch_end)
        return controller.decide(self.state, self.multiplier, sizes, self.plan, check)

    def _follow(self, decision, sizes, epoch):
        """A decision that does not settle: train with its multiplier, and cut the weakest groups down to its goals
        (the gradual pace) and hold every group at zero from then on; the sizes after."""
        self._declared.set_multiplier(*decision.multiplier)
        if decision.goals is None and not decision.closing:
            return sizes
        removed, sizes = self._cutting.along(self._meter(), sizes, decision.goals or {}, decision.closing,
                                             self._hold.floors, (decision.least_width, decision.most_width),
                                             self._elapsed(epoch))
        if removed:
            _LOG.info("%s: %d groups set to zero in epoch %d to follow the schedule.", _OWNER, removed, epoch + 1)
            self._update(cut=self.state.cut + removed)
            self._epoch_cut += removed
            self._hold.hold(self.model, self.settings.threshold)
        return sizes

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = epoch
        if self._hold.pending:  # the groups cut inside the epoch: the step is traced again once, with all of them
            self._hold.freeze(self.model, self.settings.threshold)
        if not self._steps and not self.settings.checks_inside_epochs:  # no batch hook counted them: the optimizer
            steps = self._optimizer_steps()  # did (the steps a BatchNormalization renewal spreads over)
            self._done = steps - self._steps_at_begin if None not in (steps, self._steps_at_begin) else 0
        if self.settings.update_freq != "epoch" and not self._steps:  # a dataset of unknown length: its first counts
            self._steps = self._done or None
            self._every = self.settings.checks_every(self._steps)
        if self.limits is None:
            return
        sizes = self._decide(epoch)
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
        """What the end of ``epoch`` decides: steer the strength, or settle (round, cut, freeze); records that it was
        taken and returns the sizes after it."""
        sizes = self._meter().now()
        decision = self._ask(sizes, float(epoch + 1), schedule.last_fraction(self._every or "epoch", self._steps),
                             epoch_end=True)
        if decision.settle:
            sizes = self._settle(epoch, sizes)
        else:
            sizes = self._follow(decision, sizes, epoch)
            if self.settings.gradual:
                self._hold.freeze(self.model, self.settings.threshold)  # every group at zero stays (so a resumed one)
            self._update(phase=SEARCH if self._over(sizes) > 1.0 else WITHIN)
        self._update(last_sizes=sizes, decided=epoch + 1)
        return sizes

    def _settle(self, epoch, sizes):
        """Settling: the structure is fixed (by the cut if the model is over its budget) and the survivors train
        within it without the penalties; the sizes after."""
        state, removed = self.state, 0
        phase = state.phase
        if not state.settling and self.settings.round_to > 1:
            # Whole blocks: widths step down a block at a time where the budget needs it (a cut of single groups
            # would remove units that free nothing until a block empties).
            removed = self._cutting.round_widths(self._meter(), epoch, grow=epoch + 1 < self._epochs())
            self._update(rounded=True)  # from here on the sizes are the model's own
            sizes = self._meter().now()
            phase = CUT if removed else phase
        if self._over(sizes) > 1.0:
            more, sizes = self._cutting.to_budget(self._meter(), sizes, self._hold.floors, self._elapsed(epoch), epoch,
                                                  epoch + 1 >= self._epochs(), self._declared)
            removed, phase = removed + more, CUT
        elif phase != CUT:
            phase = CUT if state.cut > 0 else WITHIN  # the gradual pace cut on the way
        if not state.settling:
            # Every group that is zero now stays zero (exactly: the state a resumed training reads again), and the
            # survivors train without the penalties, so nothing more goes (under them a cut network kept losing
            # groups).
            message = messages.far_below(_OWNER, sizes, self.limits, self.dense, epoch)
            if message:  # the penalties took more than was asked
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            cut.zero_dead_groups(self.model, self.settings.threshold)
            self._update(settling=True, reached=self.multiplier)
            self._declared.set_multiplier(0.0, 0.0)
        self._update(phase=phase, cut=self.state.cut + removed)
        self._epoch_cut += removed
        if removed or (not state.settling and phase == CUT):  # after the last cut, whenever it was
            self._renew_statistics()
        self._hold.freeze(self.model, self.settings.threshold)
        return sizes

    def _optimizer_steps(self):
        """The optimizer's step count (``iterations``), or ``None`` (no optimizer yet)."""
        iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
        return None if iterations is None else int(keras.ops.convert_to_numpy(iterations))

    def _renew_statistics(self):
        left = (self._epochs() - self._search_end()) * (self._steps or self._done)
        self._hold.renew_statistics(self.model, self._declared, left)

    def on_train_end(self, logs=None):
        # A training stopped before its settling part (EarlyStopping, a KeyboardInterrupt handled by the
        # caller, fewer epochs): the budget still holds when fit returns. A callback after this one may
        # still give the model other weights (EarlyStopping(restore_best_weights=True)): the check then
        # runs once more after every callback, at the end of fit's History (Keras puts it last).
        if self.limits is None:
            return
        self._declared.training_latency = None
        self._finish()
        if "latency" in self.limits and self.settings.latency_check:
            self.latency = latency_check.time_pruned(self.model, self.latency_table, self.settings.threshold,
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
                self._cutting.again()
            more, sizes = self._cutting.to_budget(self._meter(), sizes, self._hold.floors, self._elapsed(None), None,
                                                  True, self._declared)
            self._update(phase=CUT, cut=self.state.cut + more)
        self._update(last_sizes=sizes)
        self._finished = sizes
        self._hold.release(self.model, self._declared)
        if self.state.settling:  # the model keeps the strength the search reached (saved with it, resumed from)
            self._declared.set_multiplier(*self.reached)


# The arguments, read-only as given (checked: ``"batch"`` reads 1): ``budget.settle`` is ``budget.settings.settle``.
for _field in dataclasses.fields(BudgetSettings):
    setattr(SparsityBudget, _field.name, property(lambda self, name=_field.name: getattr(self.settings, name)))
del _field

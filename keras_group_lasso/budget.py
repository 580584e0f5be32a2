"""Ask for a size, get it: a callback that steers the penalty strength until the model fits a budget.

:class:`SparsityBudget` reads the model's size at the end of every epoch with
:func:`keras_group_lasso.sparsity_report` (the same counts as the report and
the surgery) and scales the strength of every group penalty declared on the
model through the model's ``penalty_multiplier`` (a variable the compiled
train step reads: nothing is rebuilt or recompiled). The multiplier grows
while the model is behind a schedule to the budget and eases when it is
ahead. If training has
not got there when the last part of the epochs begins, the callback sets the
weakest groups to zero, the fewest that meet the budget, keeps them at zero
for the rest of ``fit`` and says so; it enforces the budget again at every
later epoch, so ``fit`` always ends within it.
"""

import math
import numbers
import warnings

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import check_non_negative, check_positive_int, fail
from keras_group_lasso.declared import declare_group_penalties
from keras_group_lasso.graph import registry
from keras_group_lasso.regularizers import CoupledGroupLasso, GroupSparseRegularizer, group_sparse_penalties

__all__ = ["SparsityBudget"]

_OWNER = "SparsityBudget"
_KINDS = ("features", "units", "params", "flops")
SEARCH, WITHIN, CUT = 0, 1, 2  # the values of logs["budget_phase"]
_NEAR = 0.05  # settling may begin early once the schedule is this close to the budget (a fraction of it)
_KINDS_ORDER = ("features", "units", "params", "flops")
# The budget's progress, kept in the model (declared state `budget`, float32): every decision reads it
# from there, so a training resumed from saved weights decides exactly as the uninterrupted one.
_STARTED, _PHASE, _SETTLING, _INITIAL, _REACHED, _LAST, _HAS_LAST, _CUT, _ROUNDED, _DECIDED = (
    0, 1, 2, 3, 5, 7, 11, 12, 13, 14)


def _check_limit(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        fail(_OWNER, name, "an int >= 1 (a count) or a float in (0, 1] (a fraction of the dense model)", value)
    if isinstance(value, (int, np.integer)):
        if value < 1:
            # The strongest group of every layer stays, so no training can reach 0.
            fail(_OWNER, name, "an int >= 1 (a count) or a float in (0, 1] (a fraction of the dense model)", value)
        return int(value)
    if not (0.0 < value <= 1.0):
        fail(_OWNER, name, "an int >= 1 (a count) or a float in (0, 1] (a fraction of the dense model)", value)
    return float(value)


class SparsityBudget(keras.callbacks.Callback):
    """Steer the group penalties during ``fit`` so that training ends within a size budget.

    Budgets are counted as :func:`keras_group_lasso.sparsity_report` counts
    them with ``threshold``: selected input features, live hidden units
    (neurons and channels, a coupled unit once), parameters and multiply-adds
    per sample of the Dense and convolution layers after surgery. Each is an
    ``int`` (a count) or a ``float`` in (0, 1] (a fraction of the dense
    model); several budgets must all hold.

    At the end of every epoch the callback measures the model and sets the
    penalties' strength multipliers (:func:`keras_group_lasso.set_penalty_multiplier`,
    read inside the compiled step, with subgradient training and with
    :class:`~keras_group_lasso.Proximal` alike): the input groups' for
    ``max_features``, the other groups' for ``max_units``, both for
    ``max_params`` and ``max_flops`` (with ``update_freq``, also every few
    batches). Each size follows a schedule from the
    dense size to the budget over the searching part of the epochs,
    ``budget + (dense - budget) * (1 - progress) ** schedule_power`` (the
    default 1 is linear: groups go late, when the network has trained; 3 goes
    fast at first, gentle near the budget); a multiplier behind its schedule grows by the ratio
    size / target, at most 2x per epoch while nothing has gone yet, 1.2x
    while the size stalls, 1.1x while it shrinks, and never beyond
    ``max_strength`` times the strength the training started with; ahead of
    the schedule it shrinks by the same ratio (at most 0.9x, 0.5x when the
    size is below half its target).

    With ``update_freq`` an integer ``n`` (``"batch"``: 1) the multipliers
    are also steered after every ``n`` batches of an epoch, with the schedule
    at that point of the epoch and the same rates per epoch, taken in steps
    (a step after a tenth of an epoch moves a multiplier by at most ``2 **
    0.1``, and so on): when the size passes its target in the middle of an
    epoch the strength eases at once instead of at the epoch's end, which
    lands closer to the budget when a few epochs remove many groups.
    Settling, the cut and the rounding stay at epoch ends. Each check reads
    the model's weights and analyses them as :func:`~keras_group_lasso.sparsity_report`
    does (on JAX, Keras first writes the training state back to the model). Without a
    known number of steps per epoch (a dataset of unknown length) the first
    epoch is steered at its end only and later ones use its count.

    The last ``settle`` fraction of the epochs trains within the budget, in a
    fixed structure; settling begins earlier when the model is within its
    budget at an epoch where every scheduled size is within 5 % of its budget
    (the penalties would take it further below the budget than it needs). At
    the end of the epoch before the last ``settle`` fraction, a model still over
    the budget gets its weakest groups set to zero (a coupled group as one;
    input groups for a feature budget, the others for a unit budget, both
    for parameters and FLOPs), the fewest that meet the budget, and a
    warning says how many. Then every group that is zero (``<= threshold``)
    stays at zero for the rest of ``fit`` (its kernel gets a constraint that
    the optimizer applies after every step, inside the compiled step; the
    kernel's own constraint still applies first, and ``fit`` ends with the
    constraints the kernels had), and the survivors train without the
    penalties (multipliers 0), so no group comes back and the penalties
    remove none: ``fit`` ends at the size settling began with. The model
    keeps the multipliers the search reached. The score of a group is the root mean
    square of its weights over the median of its kernel's, so each layer
    loses its own weakest groups, and the strongest group of every kernel
    stays. A training that stops earlier (``EarlyStopping``) is cut the same
    way when it ends. ``fit`` therefore ends within the budget, however the
    penalties were set.

    With ``round_to`` > 1 every layer that makes its own units (a Dense or
    convolution layer, not the output, whose units one other layer reads
    outside a residual stream) ends with a multiple of ``round_to`` live
    units, or all its units. The budget counts each such layer at the
    multiple at or above its live units all along (the logs too), and when
    settling begins each layer grows to that width: it keeps its live units
    and the dead ones it grows into get random weights in and out (small
    ones out) and train in the settling epochs. A model over its budget
    when settling begins is cut in whole blocks rather than single groups:
    the layer whose step down loses the least group strength per budget
    share goes down a block until the budget holds (a model settling at its
    last epoch is only rounded down); a layer goes below ``round_to`` only
    when whole blocks cannot meet the budget. ``rounded`` holds ``{layer name: (live units
    before, after)}``. Processors compute channels in blocks (a CPU's vector
    registers hold 16 float32 numbers with AVX-512): a convolution with 4
    output channels can take as long as one with 16, so widths in whole
    blocks make the pruned model faster for the same multiply-adds.

    With ``spare_block=True`` (and ``round_to`` > 1) the penalties leave
    alone, during this ``fit``, the ``round_to`` strongest units of every
    layer rounding may resize (their outgoing groups in the one layer that
    reads them: the penalty's ``spared``). Rounding keeps a whole block of
    such a layer anyway and the budget counts it at that width all along,
    so the block costs nothing more; without it, the penalties can empty a
    layer to a few units and settling re-grows the rest of its block from
    random weights. ``spared`` holds ``{layer name: units spared}``. The
    train step is traced again at the start and at the end of ``fit`` (a
    compiled step holds what it was traced with).

    The epoch's ``logs`` (the progress bar, ``History``, a
    ``keras.callbacks.TensorBoard`` placed after it) get
    ``budget_multiplier_input``, ``budget_multiplier_hidden``,
    ``budget_phase`` (0 searching, 1 within the budget, 2 groups were cut),
    ``budget_over`` (the largest size / budget), the size of each budgeted
    quantity (``budget_features``, ``budget_units``, ``budget_params``,
    ``budget_flops``) and ``budget_cut`` (groups set to zero). The
    multipliers are a variable of the model, saved with it: a training
    resumed from a saved model starts from the strength the search reached.

    Args:
        max_features: selected input features.
        max_units: live hidden units (neurons, channels).
        max_params: parameters of the Dense and convolution layers.
        max_flops: multiply-adds per sample of those layers.
        threshold: weights with ``|w| <= threshold`` count as zero (the
            paper's 1e-3; ``Proximal`` training has exact zeros). Prune the
            trained model with the same threshold.
        settle: the fraction of the epochs, at the end, that trains within
            the budget (in [0, 1)).
        max_strength: the multipliers stay within this factor (>= 1) of the
            strength the training started with.
        schedule_power: the exponent of the schedule (> 0).
        round_to: an integer >= 1; above 1, the settled layers' widths are
            multiples of it (see above). 1 (default): widths as training left them.
        update_freq: ``"epoch"`` (default): the multipliers are steered at
            the end of every epoch; ``"batch"`` or an integer ``n >= 1``: also
            after every ``n`` batches (see above).
        spare_block: with ``round_to`` > 1, keep the penalties off the
            ``round_to`` strongest units of each layer rounding may resize
            (see above). Default False.

    Raises:
        InvalidParameterError: no budget, or a budget, ``threshold``,
            ``settle``, ``max_strength``, ``schedule_power``, ``round_to``,
            ``update_freq`` or ``spare_block`` out of range; at the start of ``fit``, a model made without
            :func:`keras_group_lasso.add_group_sparsity` (its penalties have
            no shared multiplier) or whose group penalties all have
            ``factor`` 0.

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

    def __init__(self, max_features=None, max_units=None, max_params=None, max_flops=None, *, threshold=1e-3,
                 settle=0.2, max_strength=20.0, schedule_power=1.0, round_to=1, update_freq="epoch",
                 spare_block=False):
        super().__init__()
        self.max_features = _check_limit("max_features", max_features)
        self.max_units = _check_limit("max_units", max_units)
        self.max_params = _check_limit("max_params", max_params)
        self.max_flops = _check_limit("max_flops", max_flops)
        if all(v is None for v in (self.max_features, self.max_units, self.max_params, self.max_flops)):
            fail(_OWNER, "max_features", "a budget (at least one of max_features, max_units, max_params, "
                 "max_flops)", None)
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
        if isinstance(update_freq, str) and update_freq in ("epoch", "batch"):
            self.update_freq = "epoch" if update_freq == "epoch" else 1
        elif isinstance(update_freq, bool) or not isinstance(update_freq, numbers.Integral) or update_freq < 1:
            fail(_OWNER, "update_freq", "'epoch', 'batch' or an integer >= 1 (batches between checks)", update_freq)
        else:
            self.update_freq = int(update_freq)
        if not isinstance(spare_block, (bool, np.bool_)):
            fail(_OWNER, "spare_block", "True or False", spare_block)
        self.spare_block = bool(spare_block)
        if self.update_freq != "epoch":
            # Only then a batch hook: Keras dispatches the batches of a fit whose callbacks have none
            # asynchronously.
            self.on_train_batch_end = self._check_batch
        self._epoch = 0
        self.rounded = {}
        self.spared = {}
        self.limits = None
        self._declared = None
        self._first_epoch = None

    # ------------------------------------------------------------------ measuring

    def _budgets(self):
        return {"features": self.max_features, "units": self.max_units, "params": self.max_params,
                "flops": self.max_flops}

    def _report(self):
        return analysis.sparsity_report(self.model, threshold=self.threshold)

    def _measure(self):
        """The budgeted sizes of the model now; with ``round_to`` > 1, until settling rounds the widths, at the
        widths rounding up would give."""
        if self.round_to == 1 or self._rounded_now:
            return self._sizes(self._report())
        found = analysis.analyze(self.model, self.threshold, owner=_OWNER)
        sizes = self._sizes(found.report)
        layers = self._rounded_up(found, grow=True)
        return _sizes_with(found, sizes, {layer.name: layer for layer in layers})

    def _rounded_up(self, found, grow):
        """The roundable layers of ``found``, each at the multiple of ``round_to`` at or above its live units."""
        layers = _roundable_layers(found)
        for layer in layers:
            layer.choices = _width_choices(layer.units, layer.live, self.round_to, grow)
            above = [c for c in layer.choices if c >= layer.live and (c % self.round_to == 0 or c == layer.units)]
            layer.width = min(above) if above else max(layer.choices)
        return layers

    @staticmethod
    def _sizes(report):
        return {"features": report.n_selected_features, "units": report.live_neurons,
                "params": report.params_after, "flops": report.flops_after}

    def _over(self, sizes, kinds=None):
        """The largest size / budget over ``kinds`` (all budgets by default); above 1: over the budget."""
        worst = 0.0
        for kind in self.limits if kinds is None else kinds:
            limit, size = self.limits[kind], sizes[kind]
            worst = max(worst, size / limit if limit > 0 else (math.inf if size > 0 else 0.0))
        return worst

    # ------------------------------------------------------------------ state (the model's)

    def _state(self):
        return self._declared.budget_values()

    def _write(self, state):
        self._declared.set_budget_values(state)

    @property
    def multiplier(self):
        """``[input groups, other groups]``: the strength multiplier the model trains with now."""
        return None if self._declared is None else self._declared.multiplier_values()

    @property
    def phase(self):
        return SEARCH if self._declared is None else int(self._state()[_PHASE])

    @property
    def initial(self):
        return None if self._declared is None else [float(v) for v in self._state()[_INITIAL:_INITIAL + 2]]

    @property
    def reached(self):
        return None if self._declared is None else [float(v) for v in self._state()[_REACHED:_REACHED + 2]]

    @property
    def last_sizes(self):
        state = None if self._declared is None else self._state()
        if state is None or not state[_HAS_LAST]:
            return None
        return {kind: float(v) for kind, v in zip(_KINDS_ORDER, state[_LAST:_LAST + 4])}

    @property
    def _settling(self):
        return self._declared is not None and bool(self._state()[_SETTLING])

    @property
    def _rounded_now(self):
        return self._declared is not None and bool(self._state()[_ROUNDED])

    def _set(self, **values):
        state = self._state()
        for key, value in values.items():
            index = {"phase": _PHASE, "settling": _SETTLING, "cut": _CUT, "rounded": _ROUNDED}[key]
            state[index] = float(value)
        self._write(state)

    def _record_sizes(self, sizes):
        state = self._state()
        state[_LAST:_LAST + 4] = [float(sizes[kind]) for kind in _KINDS_ORDER]
        state[_HAS_LAST] = 1.0
        self._write(state)

    # ------------------------------------------------------------------ Keras hooks

    def set_model(self, model):
        super().set_model(model)
        # Declared before any callback's on_train_begin, so BackupAndRestore finds the state to restore
        # whatever the order of the callbacks.
        self._declared = declare_group_penalties(model, _OWNER)

    def on_train_begin(self, logs=None):
        # Only what the model's structure fixes: a restore by another callback may come before or after.
        penalties = [p for _, p in group_sparse_penalties(self.model)]
        if not any(_strength(p) > 0 for p in penalties):
            fail(_OWNER, "model", "a model with group penalties of factor > 0 (the budget scales their strength)",
                 self.model)
        report = self._report()
        dense = {"features": report.n_features, "units": report.neurons, "params": report.params_before,
                 "flops": report.flops_before}
        if self.max_flops is not None and getattr(report, "flops_per_position", False):
            fail(_OWNER, "max_flops", "None for a model with inputs of variable size (its multiply-adds are "
                 "counted per position, not per sample): use max_params or max_units", self.max_flops)
        self.dense = dense
        self.limits = {}
        above = []
        for kind, limit in self._budgets().items():
            if limit is not None:
                count = limit if isinstance(limit, int) else int(math.floor(limit * dense[kind]))
                if count >= dense[kind]:
                    above.append(f"max_{kind}={limit!r} (the model has {dense[kind]})")
                self.limits[kind] = min(count, dense[kind])
        if above:
            warnings.warn(f"{_OWNER}: {', '.join(above)}: the dense model is within it already; the budget "
                          "removes nothing for it.", RuntimeWarning, stacklevel=2)
        self._release_frozen_groups()  # a fit that ended by an exception may have left them
        self._release_spared()
        self._warned = False
        self.rounded = {}
        self._first_epoch = None
        self._steps = self.params.get("steps") if self.params else None  # None: a dataset of unknown length
        self._done = self._checked = 0  # batches of this epoch: done, done at the last check

    def _start(self):
        """A new search: the strength the model has now (1 where it is 0) is where it starts."""
        start = [v if v > 0 else 1.0 for v in self._declared.multiplier_values()]
        state = np.zeros_like(self._state())
        state[_STARTED] = 1.0
        state[_PHASE] = SEARCH
        state[_INITIAL:_INITIAL + 2] = start
        state[_REACHED:_REACHED + 2] = start
        self._write(state)
        self._declared.set_multiplier(*start)

    def on_epoch_begin(self, epoch, logs=None):
        """A new search at epoch 0; later, a resumed training catches up with the decision of the epoch before.

        The end of every epoch decides (steering, settling, the cut) and records that it did in the model's
        state. A checkpoint written at the end of an epoch by a callback that runs before this one
        (``BackupAndRestore``, ``ModelCheckpoint``) holds the state before that decision: a training
        resumed from it takes the decision here, from the same weights and state, so it goes on exactly as
        the uninterrupted one, whatever the order of the callbacks.
        """
        self._epoch = epoch
        self._done = self._checked = 0
        if self._first_epoch is not None:
            return
        self._first_epoch = epoch
        state = self._state()
        if epoch == 0 or not state[_STARTED]:
            self._start()
            self._spare_blocks()
            return
        self._spare_blocks()
        if int(state[_DECIDED]) < epoch:
            self._decide(epoch - 1)
        elif self._settling:  # resumed inside the settling part: hold the cut groups at zero again
            self._freeze_cut_groups()

    def _spare_blocks(self):
        """With ``spare_block``: the reader penalty of every roundable layer spares that layer's ``round_to``
        strongest units for this ``fit`` (the train step is traced again, as it holds what it was traced with)."""
        self.spared = {}
        if not (self.spare_block and self.round_to > 1) or self._settling:
            return
        for layer in _roundable_layers(analysis.analyze(self.model, self.threshold, owner=_OWNER)):
            penalty = layer.reader.kernel.regularizer
            groups = penalty.group_shape(tuple(layer.reader.kernel.shape))[-2]
            if len(layer.rows) == groups and self.round_to < layer.units:  # the reader reads this layer alone
                penalty.spared = self.round_to
                self.spared[layer.name] = self.round_to
        if self.spared:
            self.model.make_train_function(force=True)

    def _release_spared(self):
        """Every penalty of the model spares nothing again; the next ``fit`` traces without it."""
        changed = False
        for _, penalty in group_sparse_penalties(self.model):
            changed = changed or bool(penalty.spared)
            penalty.spared = 0
        if changed:
            self.model.make_train_function(force=True)

    def _check_batch(self, batch, logs=None):
        """With ``update_freq`` batches: steer after every ``update_freq`` of them (Keras's ``on_train_batch_end``)."""
        self._done = batch + 1
        if (self._settling or self.limits is None or not self._steps
                or self._done - self._checked < self.update_freq or self._done >= self._steps):
            return  # the epoch's end checks the last batches itself
        sizes = self._measure()  # (on JAX, Keras writes the training state back to the model when we read it)
        progress = min(1.0, (self._epoch + self._done / self._steps) / self._search_end())
        self._steer(sizes, progress, (self._done - self._checked) / self._steps)
        self._checked = self._done
        self._record_sizes(sizes)

    def _epochs(self):
        return int(self.params.get("epochs", self._epoch + 1) if self.params else self._epoch + 1)

    def _search_end(self):
        """The number of epochs before the settling part."""
        return max(1, int(math.ceil((1.0 - self.settle) * self._epochs())))

    def _entry_overs(self, sizes, targets=None):
        """``[size / target]`` of the budgets each multiplier entry serves (input groups, other groups).

        ``None`` for an entry no budget needs (it is left as it is).
        """
        targets = self.limits if targets is None else targets
        overs = {}
        for kind, target in targets.items():
            size = sizes[kind]
            overs[kind] = size / target if target > 0 else (math.inf if size > 0 else 0.0)
        entries = []
        for own in ("features", "units"):
            served = [overs[k] for k in (own, "params", "flops") if k in overs]
            entries.append(max(served) if served else None)
        return entries

    def _steer(self, sizes, progress, fraction=1.0):
        """Move each multiplier entry so that the sizes follow :meth:`_targets` to the budget.

        ``fraction``: the part of an epoch since the last check; the per-epoch rates are taken to this power.
        """
        targets = self._targets(progress)
        before = self.last_sizes or self.dense
        multiplier, initial = self.multiplier, self.initial
        for entry, ratio in enumerate(self._entry_overs(sizes, targets)):
            if ratio is None:
                continue
            kinds = [k for k in (("features", "units")[entry], "params", "flops") if k in self.limits]
            untouched = all(sizes[k] >= self.dense[k] for k in kinds)
            stalled = all(sizes[k] >= before[k] for k in kinds)
            if ratio > 1.02:  # behind the schedule: stronger; faster while nothing has gone yet
                multiplier[entry] *= min(ratio, 2.0 if untouched else 1.2 if stalled else 1.1) ** fraction
                multiplier[entry] = min(multiplier[entry], initial[entry] * self.max_strength)
            elif ratio < 0.98:  # ahead of it: weaker, so the rest of the network keeps its strength
                multiplier[entry] *= max(ratio, 0.5 if ratio < 0.5 else 0.9) ** fraction
        self._declared.set_multiplier(*multiplier)

    def _near_budget(self, progress):
        """Whether every scheduled size is within ``_NEAR`` of its budget: a model within its budget then settles.

        Near the end of the schedule the penalties keep removing groups for a few epochs after they are
        eased (under ``Proximal`` a shrinking group reaches zero and stays there); searching on would
        take the model further below its budget than it needs.
        """
        targets = self._targets(progress)
        return all(targets[kind] - limit <= _NEAR * limit for kind, limit in self.limits.items())

    def _targets(self, progress):
        """Sizes on the way to the budget: ``budget + (dense - budget) * (1 - progress) ** schedule_power``."""
        return {kind: limit + (self.dense[kind] - limit) * (1.0 - progress) ** self.schedule_power
                for kind, limit in self.limits.items()}

    def _last_fraction(self):
        """The part of an epoch after its last batch check (``update_freq``), from the number of steps."""
        if self.update_freq == "epoch" or not self._steps:
            return 1.0
        last = ((self._steps - 1) // self.update_freq) * self.update_freq
        return (self._steps - last) / self._steps

    def _decide(self, epoch):
        """What the end of ``epoch`` decides: steer the strength, or settle (round, cut, freeze).

        Returns the number of groups this decision set to zero.
        """
        epochs, search_end = self._epochs(), self._search_end()
        sizes = self._measure()
        over = self._over(sizes)
        progress = min(1.0, (epoch + 1) / search_end)
        if self._settling or epoch + 1 >= search_end or (over <= 1.0 and self._near_budget(progress)):
            # Settling: the structure is fixed (by the cut if the model is over its budget) and the
            # survivors train within it.
            cut, phase = 0, self.phase
            if not self._settling and self.round_to > 1:
                # Whole blocks: widths step down a block at a time where the budget needs it (a cut of
                # single groups would remove units that free nothing until a block empties).
                self.rounded, cut = self._round_widths(epoch, grow=epoch + 1 < epochs)
                self._set(rounded=1)
                sizes = self._measure()
                over = self._over(sizes)
                if cut:
                    phase = CUT
            if over > 1.0:
                more, sizes = self._cut_weakest_groups(epoch, sizes)
                cut, over, phase = cut + more, self._over(sizes), CUT
            elif phase != CUT:
                phase = WITHIN
            state = self._state()
            state[_PHASE] = phase
            state[_CUT] += cut
            if not self._settling:
                # The structure is fixed from here on: every group that is zero now stays zero,
                # and the survivors train without the penalties, so nothing more goes either
                # (under the penalties a cut network kept losing groups, far below its budget).
                self._warn_far_below(sizes, epoch)
                state[_SETTLING] = 1.0
                state[_REACHED:_REACHED + 2] = self.multiplier
                self._write(state)
                self._zero_dead_groups()
                self._declared.set_multiplier(0.0, 0.0)
            else:
                self._write(state)
            self._freeze_cut_groups()
        else:
            cut = 0
            self._steer(sizes, progress, self._last_fraction())
            self._set(phase=SEARCH if over > 1.0 else WITHIN)
        self._record_sizes(sizes)
        state = self._state()
        state[_DECIDED] = epoch + 1
        self._write(state)
        return cut, sizes

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = epoch
        if self.update_freq != "epoch" and not self._steps:  # a dataset of unknown length: its first epoch counts
            self._steps = self._done or None
        if self.limits is None:
            return
        cut, sizes = self._decide(epoch)
        if logs is not None:
            multiplier = self.multiplier
            logs["budget_multiplier_input"] = float(multiplier[0])
            logs["budget_multiplier_hidden"] = float(multiplier[1])
            logs["budget_phase"] = int(self.phase)
            logs["budget_over"] = float(self._over(sizes))
            logs["budget_cut"] = int(cut)
            for kind in self.limits:
                logs[f"budget_{kind}"] = int(sizes[kind])

    def _warn_far_below(self, sizes, epoch):
        """Say so when settling begins below half a budget: the penalties took more than was asked."""
        far = [f"{kind} {sizes[kind]} (budget {limit})" for kind, limit in self.limits.items()
               if sizes[kind] < 0.5 * limit and sizes[kind] < self.dense[kind]]
        if far:
            warnings.warn(
                f"{_OWNER}: at the end of epoch {epoch + 1} the model was far below its budget: {', '.join(far)}. "
                "The penalties removed more than the budget asks before they could be eased (with Proximal a "
                "group at zero stays there); a smaller penalty factor lets the search land closer.",
                RuntimeWarning,
                stacklevel=3,
            )

    def on_train_end(self, logs=None):
        # A training stopped before its settling part (EarlyStopping, a KeyboardInterrupt handled by the
        # caller, fewer epochs): the budget still holds when fit returns. A callback after this one may
        # still restore other weights (EarlyStopping(restore_best_weights=True)): the check then runs
        # once more after every callback, at the end of fit's History.
        if self.limits is None:
            return
        self._finish()
        history = getattr(self.model, "history", None)
        if isinstance(history, keras.callbacks.History) and "on_train_end" not in vars(history):
            def after_every_callback(logs=None, history=history):
                del history.on_train_end
                history.on_train_end(logs)
                self._finish(after_others=True)

            history.on_train_end = after_every_callback

    def _finish(self, after_others=False):
        sizes = self._measure()
        if self._over(sizes) > 1.0:
            if after_others:
                warnings.warn(
                    f"{_OWNER}: a callback after it gave the model weights over its budget when fit ended "
                    "(EarlyStopping(restore_best_weights=True) restores weights from an epoch before the budget was "
                    "reached); their weakest groups are set to zero again to meet it.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self._warned = False
            more, sizes = self._cut_weakest_groups(None, sizes)
            self._set(phase=CUT, cut=self._state()[_CUT] + more)
        self._record_sizes(sizes)
        self._release_frozen_groups()
        self._release_spared()
        if self._settling:  # the model keeps the strength the search reached (saved with it, resumed from)
            self._declared.set_multiplier(*self.reached)

    # ------------------------------------------------------------------ keeping cut groups at zero

    def _freeze_cut_groups(self):
        """Keep every group cut so far at zero after each optimizer step, until the end of ``fit``.

        Each kernel with cut groups gets a :class:`_FrozenGroups` constraint
        (applied by the optimizer inside the compiled step, after the
        constraint the kernel had); the train step is traced again, once per
        change, since a compiled step holds the constraints it was traced with.
        """
        rows_by_path = {}
        for path, row in self._dead_groups(exact=True):
            rows_by_path.setdefault(path, set()).add(row)
        changed = False
        for variable in self.model.weights:
            rows = rows_by_path.get(variable.path)
            if not rows:
                continue
            view = variable.regularizer.group_shape(tuple(variable.shape))
            keep = np.ones(view[-2], dtype="float32")
            keep[sorted(rows)] = 0.0
            keep = keep.reshape((1,) * (len(view) - 2) + (view[-2], 1))
            current = variable.constraint
            if isinstance(current, _FrozenGroups):
                if np.array_equal(current.keep, keep):
                    continue
                current = current.inner
            variable.constraint = _FrozenGroups(keep, view, current)
            changed = True
        if changed:
            self.model.make_train_function(force=True)

    def _zero_dead_groups(self):
        """Set every group at or below the threshold exactly to zero (settling holds exactly these at zero).

        The model's thresholded outputs do not change; from here on the cut groups are the ones that are
        exactly zero, which a training resumed from saved weights reads again.
        """
        for variable in self._penalised_kernels():
            view = variable.regularizer.group_shape(tuple(variable.shape))
            value = np.array(keras.ops.convert_to_numpy(variable))
            grouped = value.reshape(view)
            axes = tuple(a for a in range(len(view)) if a != len(view) - 2)
            dead = np.max(np.abs(grouped), axis=axes) <= self.threshold
            if dead.any() and np.any(grouped[..., dead, :] != 0.0):
                grouped[..., dead, :] = 0.0
                variable.assign(value)

    def _penalised_kernels(self):
        return [v for v in self.model.weights
                if isinstance(getattr(v, "regularizer", None), GroupSparseRegularizer) and len(v.shape) >= 2]

    def _dead_groups(self, exact=False):
        """``{(path, row)}``: the groups of every penalised kernel whose weights are all ``<= threshold``
        (``exact``: all exactly zero)."""
        dead = set()
        for variable in self.model.weights:
            penalty = getattr(variable, "regularizer", None)
            if not isinstance(penalty, GroupSparseRegularizer) or len(variable.shape) < 2:
                continue
            view = penalty.group_shape(tuple(variable.shape))
            value = np.abs(np.asarray(keras.ops.convert_to_numpy(variable))).reshape(view)
            axes = tuple(a for a in range(len(view)) if a != len(view) - 2)
            largest = np.max(value, axis=axes)
            dead |= {(variable.path, int(row))
                     for row in np.flatnonzero(largest == 0.0 if exact else largest <= self.threshold)}
        return dead

    def _release_frozen_groups(self):
        """Give every kernel back the constraint it had before the cut; the next ``fit`` traces without them."""
        if self.model is None:
            return
        changed = False
        for variable in self.model.weights:
            if isinstance(variable.constraint, _FrozenGroups):
                variable.constraint = variable.constraint.inner
                changed = True
        if changed:
            self.model.make_train_function(force=True)

    # ------------------------------------------------------------------ the finishing cut

    def _cut_weakest_groups(self, epoch, sizes):
        """Zero the fewest weakest groups that meet the budget; returns (groups newly zeroed, sizes).

        Only input groups when only feature budgets are exceeded, only hidden
        groups when only unit budgets are; both for parameters and FLOPs. The
        groups an earlier cut removed go first (the structure stays what the
        first cut made it), then the weakest relative to their own layer; the
        strongest group of every kernel is never cut.
        """
        input_over, hidden_over = self._entry_overs(sizes)
        roles = {"input"} if (input_over or 0.0) > 1.0 else set()
        if (hidden_over or 0.0) > 1.0:
            roles.add("hidden")
        groups, variables = _ranked_groups(self.model, roles, self._dead_groups(exact=True))
        values = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]

        def assign(count):
            for variable, value in zip(variables, _zeroed(values, groups[:count], variables)):
                variable.assign(value)
            return self._measure()

        low, high = 0, len(groups)
        best = assign(high)
        if self._over(best) > 1.0:
            # Even with every group that may go gone the model is over the budget (e.g. a budget below
            # what layers the penalties cannot reach keep): keep the best the cut can do.
            count = high
        else:
            while low < high:  # the smallest count within the budget (sizes only shrink as groups go)
                middle = (low + high) // 2
                if self._over(assign(middle)) <= 1.0:
                    high = middle
                else:
                    low = middle + 1
            count = low
            best = assign(count)
        newly = sum(1 for _, _, was_zero in groups[:count] if not was_zero)
        if self._over(best) > 1.0:
            details = ", ".join(f"{kind} {best[kind]} (budget {limit})" for kind, limit in self.limits.items())
            warnings.warn(
                f"{_OWNER}: the budget cannot be met: with every group it may cut set to zero ({newly} newly) the "
                f"model has {details}. The strongest group of every layer stays, and layers without a group "
                "penalty keep their size; ask for a larger budget.",
                RuntimeWarning,
                stacklevel=3,
            )
        elif newly:
            self._warn_cut(f"{newly} of its weakest groups were set to zero", best, epoch)
        return newly, best

    def _warn_cut(self, what, sizes, epoch):
        """Say once per ``fit`` that ``what`` (groups, units) was set to zero to meet the budget."""
        if self._warned:
            return
        self._warned = True
        details = ", ".join(f"{kind} {sizes[kind]} (budget {limit})" for kind, limit in self.limits.items())
        when = "at the end of training" if epoch is None else f"at the end of epoch {epoch + 1}"
        warnings.warn(
            f"{_OWNER}: {when} the model was still over its budget; {what} to meet it: {details} "
            "(logs['budget_cut'] counts them at the epoch they went). A larger penalty factor or more epochs let "
            "the training get closer by itself.",
            RuntimeWarning,
            stacklevel=3,
        )

    # ------------------------------------------------------------------ widths in multiples of round_to

    def _round_widths(self, epoch, grow):
        """Give each roundable layer a multiple of ``round_to`` live units, within the budget.

        Every layer starts at the multiple at or above its live units (or all
        its units: what :meth:`_measure` counts), then, while the model is over
        its budget, the layer whose step down loses the least group strength
        per budget share goes a step down; a layer goes below ``round_to``
        only when whole blocks cannot meet the budget. The strongest units of
        a layer stay; dead ones that a layer grows into are re-initialized
        (``grow``; only while epochs are left to train them). Returns
        ``({layer name: (live units before, after)}, live units removed)``.
        """
        found = analysis.analyze(self.model, self.threshold, owner=_OWNER)
        sizes = self._sizes(found.report)
        layers = self._rounded_up(found, grow)
        if not layers:
            return {}, 0
        by_name = {layer.name: layer for layer in layers}

        def load(estimated):  # budgets' sum of size / limit: what a step down buys
            return sum(estimated[kind] / max(limit, 1) for kind, limit in self.limits.items())

        current = _sizes_with(found, sizes, by_name)
        for narrow in (False, True):
            while self._over(current) > 1.0:
                best = None
                for layer in layers:
                    lower = [c for c in layer.choices if c < layer.width
                             and (narrow or c % self.round_to == 0 or c == layer.units)]
                    if not lower:
                        continue
                    width, layer.width = layer.width, max(lower)
                    smaller = _sizes_with(found, sizes, by_name)
                    layer.width, lost = width, float(np.sum(layer.scores[max(lower):width]))
                    gain = load(current) - load(smaller)
                    if gain > 0 and (best is None or lost / gain < best[0]):
                        best = (lost / gain, layer, max(lower), smaller)
                if best is None:
                    break
                _, layer, layer_width, current = best
                layer.width = layer_width
        self._set(rounded=1)  # from here on the sizes are the model's own
        if self._over(current) > 1.0:
            return {}, 0  # blocks cannot meet it: the cut of single groups takes over
        rng = np.random.default_rng(0)
        changed, removed = {}, 0
        for layer in layers:
            if layer.width != layer.live:
                _apply_width(layer, self.threshold, rng)
                changed[layer.name] = (layer.live, layer.width)
                removed += max(0, layer.live - layer.width)
        if removed:
            self._warn_cut(f"{removed} live units went, in blocks of {self.round_to} (round_to)", self._measure(),
                           epoch)
        return changed, removed


class _FrozenGroups(keras.constraints.Constraint):
    """Zero the cut groups of one kernel (a variable's constraint while a budgeted ``fit`` settles).

    ``w`` seen as its penalty's group view (groups along axis -2) times
    ``keep`` (0 for a cut group, 1 otherwise), after ``inner``, the
    constraint the kernel had. Never saved: the callback removes it when
    ``fit`` ends.
    """

    def __init__(self, keep, view, inner=None):
        self.keep = keep
        self.view = tuple(int(n) for n in view)
        self.inner = inner

    def __call__(self, w):
        if self.inner is not None:
            w = self.inner(w)
        shape = keras.ops.shape(w)
        kept = keras.ops.reshape(w, self.view) * keras.ops.cast(self.keep, w.dtype)
        return keras.ops.reshape(kept, shape)


def _strength(penalty):
    scales = getattr(penalty, "scales", ())
    return max([penalty.factor, penalty.l1, *scales])


def _ranked_groups(model, roles, cut_before=frozenset()):
    """``([(score, ((variable index, row), ...), all zero), ...] weakest first, [variables])``.

    A group is a row along axis -2 of a penalty's group view (a unit that the
    layer reads); the rows of one coupled group are one entry. ``roles``:
    ``"input"`` (groups of input features) and/or ``"hidden"`` (the others,
    coupled groups included). The score is the root mean square of a group's
    weights over the median of its kernel's nonzero groups, so every layer is
    cut by how weak a group is among its own (a layer of many small input
    groups does not go first as a whole); groups in ``cut_before`` (``(path,
    row)``) come first, and the strongest group of each kernel is left out.
    """
    variables, entries, coupled = [], [], {}
    for variable in model.weights:
        penalty = getattr(variable, "regularizer", None)
        if not isinstance(penalty, GroupSparseRegularizer) or len(variable.shape) < 2:
            continue
        index = len(variables)
        variables.append(variable)
        view = penalty.group_shape(tuple(variable.shape))
        value = np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float64).reshape(view)
        axes = tuple(a for a in range(len(view)) if a != len(view) - 2)
        rms = np.sqrt(np.sum(value ** 2, axis=axes) / (value.size // view[-2]))
        live = rms[rms > 0]
        scale = float(np.median(live)) if live.size else 1.0
        strongest = int(np.argmax(rms))
        keys = penalty.coupled if isinstance(penalty, CoupledGroupLasso) else (-1,) * view[-2]
        for row, key in enumerate(keys):
            if ("input" if key < 0 and penalty.group_role == "input" else "hidden") not in roles:
                continue
            score = -1.0 if (variable.path, row) in cut_before else rms[row] / scale
            if key >= 0:
                total = coupled.setdefault(key, [0.0, 0, [], True])
                total[0] += score
                total[1] += 1
                total[2].append((index, row))
                total[3] = total[3] and rms[row] == 0
            elif row != strongest:
                entries.append((score, ((index, row),), rms[row] == 0))
    for score, parts, rows, zero in coupled.values():
        entries.append((score / parts, tuple(rows), zero))
    entries.sort(key=lambda entry: entry[0])
    return entries, variables


def _zeroed(values, groups, variables):
    """Copies of ``values`` with the rows of ``groups`` set to zero."""
    out = [v.copy() for v in values]
    for _, rows, _ in groups:
        for index, row in rows:
            penalty = variables[index].regularizer
            view = out[index].reshape(penalty.group_shape(out[index].shape))
            where = [slice(None)] * view.ndim
            where[-2] = row
            view[tuple(where)] = 0.0
    return out


class _Roundable:
    """A layer whose units one other layer reads: its width can change without touching anything else.

    ``order``: its units, strongest first (live by outgoing group strength over
    the reader's median, then dead ones by incoming strength); ``scores`` the
    same order's strengths (0 for dead units); ``rows[j]``: the reader's group
    row of unit ``j``.
    """

    def __init__(self, name, layer, reader_name, reader, rows, live_mask, outgoing_rms, incoming_rms):
        self.name, self.layer, self.reader_name, self.reader = name, layer, reader_name, reader
        self.rows = rows
        self.units = int(live_mask.size)
        self.live = int(live_mask.sum())
        live_scale = float(np.median(outgoing_rms[live_mask])) if self.live else 1.0
        strength = np.where(live_mask, outgoing_rms / (live_scale or 1.0), 0.0)
        self.order = np.array(sorted(range(self.units), key=lambda j: (not live_mask[j], -strength[j],
                                                                       -incoming_rms[j], j)), dtype=int)
        self.scores = strength[self.order]
        self.choices, self.width = (), self.live


def _roundable_layers(found):
    """The layers of ``found`` (an :class:`~keras_group_lasso.analysis.Analysis`) a rounding may resize.

    A Dense or convolution layer (not separable, not the output) each of
    whose units is made by it alone and read by one group row of one other
    layer, whose kernel has a plain (uncoupled) group penalty; units on a
    residual stream or read twice stay as they are.
    """
    graph, masks = found.graph, found.masks
    makers, readers = {}, {}
    for node in graph.units:
        for unit in node.out_ids:
            makers.setdefault(int(unit), []).append(node.name)
        for row, unit in enumerate(node.in_ids):
            readers.setdefault(int(unit), []).append((node.name, row))
    streamed = {int(u) for stream in graph.streams for u in stream.ids}
    out = []
    for node in graph.units:
        layer = graph.layers[node.name]
        if node.is_output or registry.is_separable(layer) or not hasattr(layer, "kernel"):
            continue
        found_readers = [readers.get(int(u), []) for u in node.out_ids]
        if any(len(r) != 1 or len(makers[int(u)]) != 1 or int(u) in streamed
               for u, r in zip(node.out_ids, found_readers)):
            continue
        names = {r[0][0] for r in found_readers}
        if len(names) != 1:
            continue
        reader_name = names.pop()
        reader = graph.layers[reader_name]
        penalty = getattr(getattr(reader, "kernel", None), "regularizer", None)
        if (registry.is_separable(reader) or not isinstance(penalty, GroupSparseRegularizer)
                or isinstance(penalty, CoupledGroupLasso)):
            continue
        if not np.any(masks.units[node.name]):
            continue
        rows = np.array([r[0][1] for r in found_readers], dtype=int)
        kernel = np.asarray(keras.ops.convert_to_numpy(reader.kernel), dtype=np.float64)
        view = kernel.reshape(penalty.group_shape(kernel.shape))
        axes = tuple(a for a in range(view.ndim) if a != view.ndim - 2)
        outgoing = np.sqrt(np.mean(view ** 2, axis=axes))[rows]
        own = np.asarray(keras.ops.convert_to_numpy(layer.kernel), dtype=np.float64)
        incoming = np.sqrt(np.mean(own.reshape(-1, own.shape[-1]) ** 2, axis=0))
        out.append(_Roundable(node.name, layer, reader_name, reader, rows, np.asarray(masks.units[node.name]),
                              outgoing, incoming))
    return out


def _width_choices(units, live, step, grow):
    """The widths a layer may take: multiples of ``step``, all its units, and its own width below ``step``."""
    choices = {c for c in range(step, units + 1, step)} | {units}
    if live < step or live == units:
        choices.add(live)
    if not grow:
        choices = {c for c in choices if c <= live}
    return sorted(c for c in choices if c >= 1)


def _sizes_with(found, sizes, widths):
    """``sizes`` with the layers in ``widths`` (name: :class:`_Roundable`) at their ``width``."""
    graph, masks = found.graph, found.masks
    kept_in = {node.name: int(masks.inputs[node.name].sum()) for node in graph.units}
    kept_out = {node.name: int(masks.units[node.name].sum()) for node in graph.units}
    new_in, new_out = dict(kept_in), dict(kept_out)
    for name, layer in widths.items():
        new_out[name] = layer.width
        new_in[layer.reader_name] += layer.width - layer.live
    out = dict(sizes)
    for node in graph.units:
        name = node.name
        if (new_in[name], new_out[name]) == (kept_in[name], kept_out[name]):
            continue
        layer = graph.layers[name]
        shape = registry.output_shape(layer, node.out_units)
        has_bias = getattr(layer, "bias", None) is not None
        for kind, count in (("flops", lambda i, o: registry.units_flops(layer, node.positions, i, o, shape)),
                            ("params", lambda i, o: registry.units_params(layer, node.positions, i, o, has_bias))):
            out[kind] += count(new_in[name], new_out[name]) - count(kept_in[name], kept_out[name])
        if not node.is_output:
            out["units"] += new_out[name] - kept_out[name]
    return out


def _apply_width(layer, threshold, rng):
    """Set ``layer`` to its ``width``: zero the reader rows of the units that go, re-initialize those that come.

    Returns the ``(variable path, row)`` of every group that comes back (no longer held at zero).
    """
    keep = set(int(j) for j in layer.order[:layer.width])
    kernel = layer.reader.kernel
    penalty = kernel.regularizer
    value = np.array(keras.ops.convert_to_numpy(kernel))
    view = value.reshape(penalty.group_shape(value.shape))
    own_value = np.array(keras.ops.convert_to_numpy(layer.layer.kernel))
    own = own_value.reshape(-1, own_value.shape[-1])
    live_rows = [int(layer.rows[j]) for j in keep if np.max(np.abs(view[..., layer.rows[j], :])) > threshold]
    out_scale = max(0.1 * _rms(view[..., live_rows, :]), 4.0 * threshold)
    live_cols = [j for j in keep if np.max(np.abs(own[:, j])) > threshold]
    in_scale = max(_rms(own[:, live_cols]), 4.0 * threshold)
    # A new column reads only the inputs that are live now: a zero input group stays zero (a unit cut
    # from the layer before must not come back through the weights of a unit that grows here).
    own_penalty = getattr(layer.layer.kernel, "regularizer", None)
    if isinstance(own_penalty, GroupSparseRegularizer):
        groups = own_value.reshape(own_penalty.group_shape(own_value.shape))
        axes = tuple(a for a in range(groups.ndim) if a != groups.ndim - 2)
        alive = np.max(np.abs(groups), axis=axes) > threshold
        reads = np.broadcast_to(alive.reshape((1,) * (groups.ndim - 2) + (-1, 1)), groups.shape)
        reads = reads.reshape(own.shape)[:, 0]
    else:
        reads = np.ones(own.shape[0], dtype=bool)
    back = set()
    for j in range(layer.units):
        row = int(layer.rows[j])
        if j not in keep:
            view[..., row, :] = 0.0
            continue
        if np.max(np.abs(view[..., row, :])) <= threshold:
            view[..., row, :] = rng.normal(scale=out_scale, size=view[..., row, :].shape)
            back.add((kernel.path, row))
        if np.max(np.abs(own[:, j])) <= threshold:
            own[:, j] = rng.normal(scale=in_scale, size=own.shape[0]) * reads
    kernel.assign(value)
    layer.layer.kernel.assign(own_value)
    return back


def _rms(values):
    return float(np.sqrt(np.mean(values ** 2))) if values.size else 0.0

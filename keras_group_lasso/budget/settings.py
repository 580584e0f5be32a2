"""What a size budget was asked for, checked once and frozen: the arguments of
:class:`~keras_group_lasso.SparsityBudget` and what follows from them alone (no model).
"""

import dataclasses
import math
import numbers

import numpy as np

from keras_group_lasso._validation import check_non_negative, check_positive_int, fail
from keras_group_lasso.budget import schedule

__all__ = ["BudgetSettings", "PACES", "CHECKS_PER_EPOCH", "WARM_UP", "LEAST_WIDTH"]

#: How a budget gets to its size: ``"gradual"`` cuts the weakest groups along the schedule as training goes;
#: ``"penalty"`` lets the steered penalties remove groups and cuts, once settling begins, what they left over.
PACES = ("gradual", "penalty")
#: Checks per epoch with ``update_freq="auto"`` and the gradual pace.
CHECKS_PER_EPOCH = 8
#: With the gradual pace, the share of the searching epochs before the first cut: the weights first learn which
#: groups matter.
WARM_UP = 1 / 3
#: ``min_width="auto"``: each layer keeps at least this share of the width at which all prunable layers, equally
#: narrowed, meet the budget (:func:`.schedule.even_share`).
LEAST_WIDTH = 0.9
_UPDATE_FREQS = ("epoch", "batch", "auto")


@dataclasses.dataclass(frozen=True)
class BudgetSettings:
    """The checked arguments of a budget (their meaning: :class:`~keras_group_lasso.SparsityBudget`).

    ``update_freq`` is ``"auto"``, ``"epoch"`` or a number of batches (``"batch"`` is 1); ``min_width`` is
    ``"auto"`` or a float. ``max_latency`` is checked, with its table, by :class:`.latency_limit.LatencyLimit`.

    Example:
        >>> settings = BudgetSettings.checked("SparsityBudget", max_flops=0.25, update_freq="batch")
        >>> settings.budgets["flops"], settings.update_freq, settings.search_end(epochs=10)
        (0.25, 1, 5)
    """

    max_features: object = None
    max_units: object = None
    max_params: object = None
    max_flops: object = None
    latency_check: bool = True
    threshold: float = 1e-3
    settle: float = 0.5
    max_strength: float = 20.0
    schedule_power: float = 1.0
    round_to: int = 1
    update_freq: object = "auto"
    spare_block: bool = False
    pace: str = "gradual"
    min_width: object = "auto"
    uniform_blocks: bool = False

    @classmethod
    def checked(cls, owner, *, max_features=None, max_units=None, max_params=None, max_flops=None,
                max_latency=None, latency_check=True, threshold=1e-3, settle=1 / 2, max_strength=20.0,
                schedule_power=1.0, round_to=1, update_freq="auto", spare_block=False, pace="gradual",
                min_width="auto", uniform_blocks=False):
        """The settings of these arguments (``max_latency`` only to say whether a budget was given).

        Raises:
            InvalidParameterError: no budget, or an argument out of its range (the message names it and what was
                received).
        """
        budgets = {name: schedule.check_limit(owner, name, value) for name, value in
                   (("max_features", max_features), ("max_units", max_units), ("max_params", max_params),
                    ("max_flops", max_flops))}
        if all(v is None for v in budgets.values()) and max_latency is None:
            fail(owner, "max_features", "a budget (at least one of max_features, max_units, max_params, "
                 "max_flops, max_latency)", None)
        threshold = check_non_negative(owner, "threshold", threshold)
        settle = _number(owner, "settle", settle, "a fraction in [0, 1)", lambda v: 0.0 <= v < 1.0)
        max_strength = _number(owner, "max_strength", max_strength, "a finite number >= 1", lambda v: v >= 1.0)
        schedule_power = _number(owner, "schedule_power", schedule_power, "a finite number > 0", lambda v: v > 0.0)
        round_to = check_positive_int(owner, "round_to", round_to)
        if pace not in PACES:
            fail(owner, "pace", " or ".join(repr(p) for p in PACES), pace)
        if not (isinstance(min_width, str) and min_width == "auto") and (
                isinstance(min_width, bool) or not isinstance(min_width, numbers.Real) or not 0.0 <= min_width < 1.0):
            fail(owner, "min_width", "'auto' or a fraction in [0, 1) of each layer's units", min_width)
        if isinstance(update_freq, str) and update_freq in _UPDATE_FREQS:
            update_freq = 1 if update_freq == "batch" else update_freq
        elif isinstance(update_freq, bool) or not isinstance(update_freq, numbers.Integral) or update_freq < 1:
            fail(owner, "update_freq", "'auto', 'epoch', 'batch' or an integer >= 1 (batches between checks)",
                 update_freq)
        else:
            update_freq = int(update_freq)
        flags = {name: _checked_bool(owner, name, value) for name, value in
                 (("latency_check", latency_check), ("spare_block", spare_block), ("uniform_blocks", uniform_blocks))}
        if flags["spare_block"] and round_to == 1:
            fail(owner, "spare_block", "False with round_to=1 (it spares a block of round_to units)", spare_block)
        return cls(**budgets, threshold=threshold, settle=float(settle), max_strength=float(max_strength),
                   schedule_power=float(schedule_power), round_to=round_to, update_freq=update_freq, pace=pace,
                   min_width=min_width if isinstance(min_width, str) else float(min_width), **flags)

    @property
    def budgets(self):
        """``{kind: budget or None}`` of the sizes counted from the model's structure (not the latency)."""
        return {"features": self.max_features, "units": self.max_units, "params": self.max_params,
                "flops": self.max_flops}

    @property
    def gradual(self):
        return self.pace == "gradual"

    @property
    def checks_inside_epochs(self):
        """Whether the budget checks inside an epoch (a batch hook: Keras dispatches the batches of a ``fit`` whose
        callbacks have none asynchronously)."""
        return self.update_freq != "epoch" and not (self.update_freq == "auto" and not self.gradual)

    def checks_every(self, steps):
        """Batches between two checks inside an epoch of ``steps`` batches, or ``None`` (the epoch's end only)."""
        if not self.checks_inside_epochs:
            return None
        return schedule.checks_every(self.update_freq, steps, CHECKS_PER_EPOCH)

    def search_end(self, epochs):
        """The number of epochs, of ``epochs``, before the settling part."""
        return max(1, int(math.ceil((1.0 - self.settle) * epochs)))

    def least_width(self, even):
        """The share of its units no layer goes below, given the ``even`` share at which every layer narrowed alike
        meets the budget."""
        return LEAST_WIDTH * even if self.min_width == "auto" else self.min_width


def _number(owner, name, value, constraint, accepts):
    """``value`` as a float when it is a finite real number (not a bool) that ``accepts``; else the error that
    names ``constraint``, the whole range at once."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "fiu":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not accepts(float(value)):
        fail(owner, name, constraint, value)
    return float(value)


def _checked_bool(owner, name, value):
    if not isinstance(value, (bool, np.bool_)):
        fail(owner, name, "True or False", value)
    return bool(value)

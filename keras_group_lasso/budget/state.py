"""A budget's progress as model state: a frozen view of the declared ``budget`` vector (float32).

Every decision of :class:`~keras_group_lasso.SparsityBudget` reads this state
from the model and writes it back, so a training resumed from saved weights
(``BackupAndRestore``, ``ModelCheckpoint``, ``load_model``) decides exactly as
the uninterrupted one. Values are float32 in both runs alike.
"""

import dataclasses

import numpy as np

from keras_group_lasso.budget.schedule import KINDS

__all__ = ["BudgetState", "SEARCH", "WITHIN", "CUT"]

SEARCH, WITHIN, CUT = 0, 1, 2  # the values of logs["budget_phase"]
_STARTED, _PHASE, _SETTLING, _INITIAL, _REACHED, _LAST, _HAS_LAST, _CUT, _ROUNDED, _DECIDED, _LATENCY = (
    0, 1, 2, 3, 5, 7, 11, 12, 13, 14, 15)
_COUNTS = KINDS[:4]  # stored at _LAST..; the predicted latency at _LATENCY (a state saved before it has 0 there)


@dataclasses.dataclass(frozen=True)
class BudgetState:
    """Where a budget's ``fit`` is.

    Attributes:
        started: a search has started (all zeros: none has).
        phase: ``SEARCH``, ``WITHIN`` or ``CUT``.
        settling: the structure is fixed; the cut groups are the exactly zero ones.
        initial: the multiplier the search started from (``max_strength`` is relative to it).
        reached: the multiplier the search reached (the model keeps it after ``fit``).
        last_sizes: ``{kind: size}`` at the last check, or ``None``.
        cut: groups the budget set to zero so far.
        rounded: widths were rounded (``round_to``).
        decided: the number of epochs whose end-of-epoch decision was taken.

    Example:
        >>> state = BudgetState.from_vector(np.zeros(16, "float32")).started_from([2.0, 1.0])
        >>> BudgetState.from_vector(state.to_vector()) == state, state.initial
        (True, (2.0, 1.0))
    """

    started: bool = False
    phase: int = SEARCH
    settling: bool = False
    initial: tuple = (1.0, 1.0)
    reached: tuple = (1.0, 1.0)
    last_sizes: dict = None
    cut: int = 0
    rounded: bool = False
    decided: int = 0

    @classmethod
    def from_vector(cls, vector):
        v = [float(x) for x in np.asarray(vector, dtype="float32")]
        return cls(
            started=bool(v[_STARTED]), phase=int(v[_PHASE]), settling=bool(v[_SETTLING]),
            initial=tuple(v[_INITIAL:_INITIAL + 2]), reached=tuple(v[_REACHED:_REACHED + 2]),
            last_sizes=(dict(zip(_COUNTS, v[_LAST:_LAST + 4]), latency=v[_LATENCY]) if v[_HAS_LAST] else None),
            cut=int(v[_CUT]), rounded=bool(v[_ROUNDED]), decided=int(v[_DECIDED]),
        )

    def to_vector(self, size=16):
        v = np.zeros(size, dtype="float32")
        v[_STARTED], v[_PHASE], v[_SETTLING] = float(self.started), self.phase, float(self.settling)
        v[_INITIAL:_INITIAL + 2], v[_REACHED:_REACHED + 2] = self.initial, self.reached
        if self.last_sizes is not None:
            v[_LAST:_LAST + 4] = [self.last_sizes[kind] for kind in _COUNTS]
            v[_LATENCY] = self.last_sizes.get("latency", 0.0)
            v[_HAS_LAST] = 1.0
        v[_CUT], v[_ROUNDED], v[_DECIDED] = self.cut, float(self.rounded), self.decided
        return v

    def started_from(self, multiplier):
        """A new search from ``multiplier``."""
        start = tuple(float(np.float32(m)) for m in multiplier)
        return BudgetState(started=True, initial=start, reached=start)

    def replace(self, **changes):
        if "last_sizes" in changes and changes["last_sizes"] is not None:
            # Stored as float32: read back the same in an uninterrupted and a resumed run.
            changes["last_sizes"] = {k: float(np.float32(changes["last_sizes"].get(k, 0.0))) for k in KINDS}
        for key in ("initial", "reached"):
            if key in changes:
                changes[key] = tuple(float(np.float32(m)) for m in changes[key])
        return dataclasses.replace(self, **changes)

"""A budget's progress as model state: a frozen view of the model's named ``budget_*`` variables (float32).

Every decision of :class:`~keras_group_lasso.SparsityBudget` reads this state
from the model and writes it back, so a training resumed from saved weights
(``BackupAndRestore``, ``ModelCheckpoint``, ``load_model``) decides exactly as
the uninterrupted one. Values are float32 in both runs alike. The variables
(:data:`keras_group_lasso.declared.BUDGET_VARIABLES`) are named after the
fields of :class:`BudgetState`.
"""

import dataclasses

import numpy as np

from keras_group_lasso.budget.schedule import KINDS

__all__ = ["BudgetState", "SEARCH", "WITHIN", "CUT"]

SEARCH, WITHIN, CUT = 0, 1, 2  # the values of logs["budget_phase"]


def _float32(values):
    return tuple(float(np.float32(v)) for v in values)


@dataclasses.dataclass(frozen=True)
class BudgetState:
    """Where a budget's ``fit`` is.

    Attributes:
        started: a search has started (all zeros: none has).
        phase: ``SEARCH``, ``WITHIN`` or ``CUT``.
        settling: the structure is fixed; the cut groups are the exactly zero ones.
        initial: the multiplier the search started from (``max_strength`` is relative to it).
        reached: the multiplier the search reached (the model keeps it after ``fit``).
        last_sizes: ``{kind: size}`` at the last check (every kind of ``schedule.KINDS``), or ``None``.
        cut: groups the budget set to zero so far.
        rounded: widths were rounded (``round_to``).
        decided: the number of epochs whose end-of-epoch decision was taken.

    Example:
        >>> state = BudgetState.from_values(BudgetState().started_from([2.0, 1.0]).values())
        >>> state.started, state.initial, sorted(state.values())[:3]
        (True, (2.0, 1.0), ['cut', 'decided', 'initial'])
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
    def from_values(cls, values):
        """The state of ``{variable name: value}`` (the ``budget_`` prefix left out); all zeros: none started."""
        read = {name: np.asarray(value, dtype="float32").reshape(-1) for name, value in values.items()}
        return cls(
            started=bool(read["started"][0]), phase=int(read["phase"][0]), settling=bool(read["settling"][0]),
            initial=_float32(read["initial"]), reached=_float32(read["reached"]),
            last_sizes=dict(zip(KINDS, _float32(read["last_sizes"]))) if read["measured"][0] else None,
            cut=int(read["cut"][0]), rounded=bool(read["rounded"][0]), decided=int(read["decided"][0]),
        )

    def values(self):
        """``{variable name: float32 array}``: what the model's ``budget_*`` variables hold."""
        last = self.last_sizes or {}
        return {name: np.asarray(value, dtype="float32") for name, value in (
            ("started", float(self.started)), ("phase", self.phase), ("settling", float(self.settling)),
            ("initial", self.initial), ("reached", self.reached),
            ("last_sizes", [last.get(kind, 0.0) for kind in KINDS]), ("measured", float(self.last_sizes is not None)),
            ("cut", self.cut), ("rounded", float(self.rounded)), ("decided", self.decided))}

    def started_from(self, multiplier):
        """A new search from ``multiplier``."""
        start = _float32(multiplier)
        return BudgetState(started=True, initial=start, reached=start)

    def replace(self, **changes):
        if "last_sizes" in changes and changes["last_sizes"] is not None:
            # Stored as float32: read back the same in an uninterrupted and a resumed run.
            changes["last_sizes"] = {k: float(np.float32(changes["last_sizes"].get(k, 0.0))) for k in KINDS}
        for key in ("initial", "reached"):
            if key in changes:
                changes[key] = _float32(changes[key])
        return dataclasses.replace(self, **changes)

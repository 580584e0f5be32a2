"""The cuts of one ``fit`` under a budget: made through :mod:`.measure`, recorded, and said when they must be.

A cut along the schedule is the budget's own pace and is only recorded; a cut to the budget itself (when settling
begins or ``fit`` ends) is logged when it is a small last step with epochs left after it, and said in a warning when
it is large, when no epoch is left to recover from it, when it needed whole blocks of units to go, or when not even
every group it may take meets the budget.
"""

import logging
import warnings

from keras_group_lasso.budget import cut, measure, messages, renewal, schedule

__all__ = ["Cutting", "SMALL_CUT"]

_LOG = logging.getLogger("keras_group_lasso")
#: With the gradual pace, a cut of at most this share of the prunable groups when settling begins, with epochs left,
#: is the schedule's last step (logged); a larger one, or one with no epoch after it, is said in a warning.
SMALL_CUT = 0.05


class Cutting:
    """The cuts of one ``fit`` of a model with ``groups`` prunable groups, under ``limits``.

    Attributes:
        cuts: ``[(epochs elapsed, groups set to zero)]``, one entry per cut.
        rounded: ``{layer name: (live units before, after)}`` of the widths rounding changed.
    """

    def __init__(self, owner, limits, groups, gradual, round_to):
        self.owner, self.limits, self.groups, self.gradual, self.round_to = owner, limits, groups, gradual, round_to
        self.cuts, self.rounded = [], {}
        self._warned = self._unmeetable = self._blocks_failed = False

    def along(self, meter, sizes, goals, closing, floors, widths, elapsed):
        """A step along the schedule: zero the fewest weakest groups that meet ``goals`` (and ``closing``: that share
        of the groups still to go before the limits); no layer goes below the share ``widths[0]`` of its width
        (nor its ``floors``), and a layer above ``widths[1]`` loses its weakest groups first. Returns ``(newly,
        sizes)``."""
        least, most = widths
        model = meter.model
        if least > 0.0:
            floors = {path: max(keep, floors.get(path, 0))
                      for path, keep in cut.least_groups(model, least, least=1).items()}
        ceilings = cut.least_groups(model, most) if most < 1.0 else None
        newly, sizes = measure.cut_to(meter, sizes, goals, floors, False, self.limits, closing, ceilings)
        self._record(elapsed, newly)
        return newly, sizes

    def to_budget(self, meter, sizes, floors, elapsed, epoch, last, declared):
        """Zero the fewest weakest groups that meet the budget, and say what it could not meet or that it cut more
        than a small last step (``epoch``: where, ``None`` when ``fit`` ended; ``last``: no epoch is left after it).
        Returns ``(newly, sizes)``."""
        newly, best = measure.cut_to(meter, sizes, self.limits, floors, True, self.limits)
        self._record(elapsed, newly)
        if schedule.over(best, self.limits) > 1.0 and not self._unmeetable:
            self._unmeetable = True  # said once per fit
            warnings.warn(messages.unmeetable(self.owner, newly, best, self.limits,
                                              *measure.unmet_causes(meter.model, declared)), RuntimeWarning,
                          stacklevel=4)
        elif (newly and self.gradual and newly <= SMALL_CUT * self.groups and epoch is not None and not last
              and not self._blocks_failed):  # the schedule's last step, with epochs left to recover from it
            _LOG.info("%s: %d groups set to zero to meet the budget when settling began.", self.owner, newly)
        elif newly and schedule.over(best, self.limits) <= 1.0:
            blocks = (f"widths in blocks of {self.round_to} (round_to) could not meet it, so "
                      if self._blocks_failed else "")
            self._say(f"{blocks}{newly} of its weakest groups were set to zero", meter, best, epoch, last)
        return newly, best

    def round_widths(self, meter, epoch, grow):
        """Give each roundable layer a multiple of ``round_to`` live units within the budget
        (:func:`.measure.round_widths`); returns the live units removed (the cut of single groups takes over, and
        says so, where blocks cannot)."""
        done = measure.round_widths(meter, self.limits, grow)
        if done is None:
            self._blocks_failed = True
            return 0
        self.rounded, removed = done
        if removed:
            self._say(f"{removed} live units went, in blocks of {self.round_to} (round_to)", meter, meter.now(),
                      epoch, not grow)
        return removed

    def again(self):
        """A cut after every callback (when ``fit`` ended) says itself again."""
        self._warned = False

    def _record(self, elapsed, newly):
        if newly:
            self.cuts.append((elapsed, newly))

    def _say(self, what, meter, sizes, epoch, last):
        """Say once per ``fit`` that ``what`` (groups, units) was set to zero to meet the budget."""
        if self._warned:
            return
        self._warned = True
        stale = (epoch is None or last) and bool(renewal.moving_statistics_layers(meter.model))
        warnings.warn(messages.cut_to_meet(self.owner, what, sizes, self.limits, epoch, stale), RuntimeWarning,
                      stacklevel=4)

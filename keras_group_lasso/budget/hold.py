"""What a budget's compiled training step holds: the groups it keeps at zero, the groups the penalties spare, and the
BatchNormalization momenta a cut lowered.

A compiled step holds what it was traced with. Each method here changes what the step holds and traces it again
only when the step cannot read the change as it runs (:func:`.cut.hold_groups`): cutting groups inside an epoch
traces nothing; the epoch's end, settling and the end of ``fit`` may.
"""

from keras_group_lasso import analysis
from keras_group_lasso.budget import cut, rounding
from keras_group_lasso.budget.renewal import StatisticsRenewal
from keras_group_lasso.declared import group_sparse_penalties

__all__ = ["StepHold"]


def _retrace(model, changed):
    if changed:
        model.make_train_function(force=True)
    return changed


class StepHold:
    """The holds of one ``fit`` under a budget.

    Attributes:
        floors: ``{kernel path: groups}`` each penalty spares (the least widths, :func:`.cut.spare_floors`).
        spared: ``{layer name: units}`` the penalties leave alone for rounding (:func:`.rounding.spare_blocks`).
        pending: ``{(path, row)}`` cut inside this epoch and set to zero after every batch until its end.
    """

    def __init__(self):
        self.floors, self.spared, self.pending = {}, {}, set()
        self._renewal = StatisticsRenewal()

    def begin(self, model, settling, share=0.0, gradual=True, block=0, threshold=1e-3, owner="SparsityBudget"):
        """When ``fit`` begins: hold cut groups through masks the step reads as it runs, and (unless ``settling``)
        let the penalties spare each layer's least width (``share``; with the gradual pace one group at least) and,
        with ``block`` > 1, the ``block`` strongest units of every layer rounding may resize."""
        self.floors, self.spared, self.pending = {}, {}, set()
        held = cut.hold_groups(model)
        if settling:
            return _retrace(model, held)
        if share > 0.0 or gradual:
            # With the gradual pace every kernel spares its strongest group at least: the cuts reach the size, and
            # a strength too high for the model cannot empty a layer (a network's one input channel, say) on the way.
            self.floors = cut.spare_floors(model, share, least=1 if gradual else 0)
        if block > 1:
            self.spared = rounding.spare_blocks(analysis.analyze(model, threshold, owner=owner), block)
        return _retrace(model, held or any(penalty.spared for _, _, penalty in group_sparse_penalties(model)))

    def freeze(self, model, threshold):
        """Hold every exactly zero group at zero after each optimizer step until ``fit`` ends."""
        self.pending = set()
        return _retrace(model, cut.freeze_groups(model, cut.dead_groups(model, threshold, exact=True)))

    def hold(self, model, threshold):
        """:meth:`freeze` inside an epoch, without tracing the step again: the groups a traced step cannot take as it
        runs are set to zero after every batch (:meth:`after_batch`) until the epoch's end freezes them."""
        self.pending = cut.hold_live(model, cut.dead_groups(model, threshold, exact=True))

    def after_batch(self, model):
        if self.pending:
            cut.zero_groups(model, self.pending)

    def renew_statistics(self, model, declared, steps_left):
        """After a cut: the ``BatchNormalization`` layers renew their statistics over ``steps_left`` steps (see
        :mod:`.renewal`)."""
        return _retrace(model, self._renewal.lower(model, declared, steps_left))

    def release(self, model, declared):
        """The kernels' own constraints and momenta back, and no spared groups: the next ``fit`` traces without."""
        changed = self._renewal.restore(declared)
        changed = cut.release_frozen_groups(model) or changed
        for _, _, penalty in group_sparse_penalties(model):
            changed = changed or bool(penalty.spared)
            penalty.spared = 0
        return _retrace(model, changed)

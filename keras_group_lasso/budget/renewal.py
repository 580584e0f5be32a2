"""After a cut: the BatchNormalization layers renew their moving statistics before ``fit`` ends.

A cut changes what every later layer computes, so statistics averaged over the steps before it no longer fit
the network in inference. For the rest of ``fit`` each such layer averages with::

    momentum = min(own momentum, STALE_SHARE ** (1 / steps left))

so that what it gathered before the cut weighs at most ``STALE_SHARE`` when ``fit`` ends; then each layer gets
its own momentum back. The own momenta are noted in the model's declared state as well: a model saved in between
carries the lowered momentum in its config, and loading its state gives the own one back.
"""

from keras_group_lasso.declared import MOMENTA, layer_paths
from keras_group_lasso.graph import registry

__all__ = ["STALE_SHARE", "StatisticsRenewal", "moving_statistics_layers"]

#: After a cut, the share of a BatchNormalization layer's moving statistics from before it that is left at the end.
STALE_SHARE = 0.01


def moving_statistics_layers(model):
    """``[(path, layer)]``: the layers of ``model`` (nested models included) that average statistics with a
    momentum."""
    return layer_paths(model, registry.keeps_moving_statistics)


class StatisticsRenewal:
    """The lowered momenta of one ``fit``: :meth:`lower` after a cut, :meth:`restore` when ``fit`` ends.

    ``declared`` is the model's :class:`~keras_group_lasso.declared.GroupPenalties`, where the own momenta are
    noted.
    """

    def __init__(self):
        self._own = {}  # {id: (layer, its own momentum)}

    def lower(self, model, declared, steps_left):
        """Lower the momentum of every layer that averages statistics for ``steps_left`` steps; returns whether a
        layer changed (a compiled step holds the momentum it was traced with: trace it again)."""
        if steps_left <= 0:
            return False
        momentum = STALE_SHARE ** (1.0 / steps_left)
        own = dict(declared.note(MOMENTA, {}))
        changed = False
        for path, layer in moving_statistics_layers(model):
            if layer.momentum > momentum:
                own.setdefault(path, float(layer.momentum))
                self._own.setdefault(id(layer), (layer, own[path]))
                layer.momentum = momentum
                changed = True
        if changed:
            declared.set_note(MOMENTA, own)
        return changed

    def restore(self, declared):
        """Give every lowered layer its own momentum back; returns whether one changed."""
        changed = bool(self._own)
        for layer, momentum in self._own.values():
            layer.momentum = momentum
        if changed:
            declared.set_note(MOMENTA, None)
        self._own = {}
        return changed

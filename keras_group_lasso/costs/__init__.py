"""What a structure costs: per unit (:func:`unit_costs`, from the graph and the widths) and in measured time
(:class:`LatencyTable`, timed on copies of the model)."""

from keras_group_lasso.costs.latency import DEFAULT_GRID, LatencyTable, current_device
from keras_group_lasso.costs.units import unit_costs

__all__ = ["unit_costs", "LatencyTable", "DEFAULT_GRID", "current_device"]

"""Surgery: rebuild a physically smaller model from a group-sparse one.

Three parts, as in Torch-Pruning: :mod:`~keras_group_lasso.analysis` decides
what is dead (one place), :mod:`.plan` plans what to cut across coupled layers
and refuses what it cannot plan, with the typed steps of :mod:`.steps` (one or
a few per node, decided before anything is built), the one registry
(:mod:`keras_group_lasso.graph.registry`) knows how to slice each layer type,
and :mod:`.build` applies the steps in a short loop; :mod:`.blocks` makes a block
of the user's own class again with the widths its layers kept.
"""

from keras_group_lasso.surgery.blocks import Rebuilt
from keras_group_lasso.surgery.build import BLOCKS, prune_model
from keras_group_lasso.surgery.layers import SelectFeatures
from keras_group_lasso.surgery.plan import DensePlan, LayerPlan, PruningPlan, UnsupportedModelError, plan_pruning

__all__ = [
    "prune_model",
    "plan_pruning",
    "PruningPlan",
    "DensePlan",
    "LayerPlan",
    "UnsupportedModelError",
    "SelectFeatures",
    "Rebuilt",
    "BLOCKS",
]

"""keras-group-lasso: group sparse regularization for Keras 3.

Penalties that drive whole units of a network to zero (Scardapane et al.,
"Group Sparse Regularization for Deep Neural Networks", 2017), tools to see
the sparsity, and surgery that rebuilds a physically smaller model.
"""

__version__ = "0.1.0"

from keras_group_lasso._validation import InvalidParameterError, NonFiniteError
from keras_group_lasso.analysis import SparsityReport, apply_threshold, sparsity_report
from keras_group_lasso.budget import SparsityBudget
from keras_group_lasso._distributed import is_chief
from keras_group_lasso.callbacks import SparsityMonitor
from keras_group_lasso.export import export_pruned
from keras_group_lasso.models import (
    GroupSparseModel,
    GroupSparseSequential,
    add_group_sparsity,
    coupled_groups,
    set_penalty_multiplier,
)
from keras_group_lasso.optimizers import Proximal
from keras_group_lasso.regularizers import (
    CoupledGroupLasso,
    GroupLasso,
    HiddenGroupLasso,
    InputGroupLasso,
    SparseGroupLasso,
)
from keras_group_lasso.surgery import UnsupportedModelError, plan_pruning, prune_model

__all__ = [
    "__version__",
    "InvalidParameterError",
    "NonFiniteError",
    "GroupLasso",
    "SparseGroupLasso",
    "InputGroupLasso",
    "HiddenGroupLasso",
    "CoupledGroupLasso",
    "add_group_sparsity",
    "GroupSparseModel",
    "GroupSparseSequential",
    "set_penalty_multiplier",
    "coupled_groups",
    "sparsity_report",
    "SparsityReport",
    "apply_threshold",
    "prune_model",
    "plan_pruning",
    "UnsupportedModelError",
    "SparsityMonitor",
    "is_chief",
    "SparsityBudget",
    "export_pruned",
    "Proximal",
]

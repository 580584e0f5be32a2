"""Size budgets: :class:`SparsityBudget` steers the penalties during ``fit`` until the model fits."""

from keras_group_lasso.budget.callback import SparsityBudget
from keras_group_lasso.budget.state import CUT, SEARCH, WITHIN, BudgetState

__all__ = ["SparsityBudget", "BudgetState", "SEARCH", "WITHIN", "CUT"]

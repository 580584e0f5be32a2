"""scikit-learn estimators with the paper's group-sparse penalties, and the regularization path.

:class:`GroupSparseMLPClassifier` and :class:`GroupSparseMLPRegressor` are
scikit-learn estimators (``clone``, ``Pipeline``, ``GridSearchCV``) and feature
selectors (``get_support``, ``transform``) built on a Keras MLP trained with the
sparse group Lasso (or group Lasso, L1, L2). Their :meth:`path` method runs
warm-started fits from a dense network to no feature at all and returns a
:class:`RegularizationPath` (scores, selected features, live neurons,
parameters, ``feature_importances_``, a plot).

Example:
    >>> from keras_group_lasso.sklearn import GroupSparseMLPClassifier
    >>> clf = GroupSparseMLPClassifier(hidden_layer_sizes=(40, 20), alpha=1e-3, random_state=0)
    >>> clf.fit(X_train, y_train).get_support().sum()
    >>> path = clf.path(X_train, y_train)
"""

from keras_group_lasso.sklearn._base import (
    GroupSparseMLPClassifier,
    GroupSparseMLPRegressor,
    ParameterError,
)
from keras_group_lasso.sklearn._path import PathPoint, RegularizationPath, input_group_strengths

__all__ = [
    "GroupSparseMLPClassifier",
    "GroupSparseMLPRegressor",
    "ParameterError",
    "RegularizationPath",
    "PathPoint",
    "input_group_strengths",
]

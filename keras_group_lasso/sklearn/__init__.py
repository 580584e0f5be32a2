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
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(size=(200, 8))
    >>> y = (X[:, 0] + X[:, 1] > 1).astype(int)   # only features 0 and 1 matter
    >>> clf = GroupSparseMLPClassifier((16,), alpha=1e-3, input_alpha=0.02, learning_rate=3e-3,
    ...                                proximal=True, epochs=100, batch_size=20, random_state=0)
    >>> clf.fit(X, y).get_support()
    array([ True,  True, False, False, False, False, False, False])
    >>> clf.transform(X).shape
    (200, 2)
"""

from keras_group_lasso.sklearn._base import (
    GroupSparseMLPClassifier,
    GroupSparseMLPRegressor,
    ParameterError,
)
from keras_group_lasso.sklearn._cv import GroupSparseMLPClassifierCV, GroupSparseMLPRegressorCV
from keras_group_lasso.sklearn._path import (
    PathPoint,
    RegularizationPath,
    input_group_strengths,
    regularization_path,
)

__all__ = [
    "GroupSparseMLPClassifier",
    "GroupSparseMLPRegressor",
    "GroupSparseMLPClassifierCV",
    "GroupSparseMLPRegressorCV",
    "ParameterError",
    "RegularizationPath",
    "PathPoint",
    "input_group_strengths",
    "regularization_path",
]

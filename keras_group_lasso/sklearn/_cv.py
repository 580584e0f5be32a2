"""Cross-validated estimators: the input-group strength chosen on the regularization path.

``fit`` runs :meth:`~GroupSparseMLPClassifier.path` on all the data (the
automatic grid, or ``alphas``), then the same path on the training part of
each split of ``cv`` with the same strengths, each scored on the split's
held-out part. A fold's passes (``epochs``, ``epochs_per_alpha``) are scaled
by ``n_samples / n_train`` so that every path takes the same number of
training steps per point: a pass over fewer rows is fewer steps, and a
strength trained for fewer steps removes fewer features, which would make
the folds' points denser than the all-data point at the same strength.

Per strength ``a_i`` the mean ``m_i`` of the fold scores says what the
point is worth. Among the points with at most ``max_features``
features (on the all-data path), those with ``m_i >= max_j m_j - tolerance``
are tied and the one with the fewest features wins (then the higher mean,
then the larger strength). ``tolerance="se"`` is the one-standard-error rule:
the standard error ``std(fold scores) / sqrt(n_folds)`` of the best point.
The fitted model is that point of the all-data path (it was trained on all
the data, warm-started along the path, as with scikit-learn's ``LassoCV``).
"""

import dataclasses
import math
import numbers

import numpy as np
from sklearn.base import clone, is_classifier
from sklearn.metrics import check_scoring, get_scorer_names
from sklearn.model_selection import check_cv

from keras_group_lasso.sklearn import _network
from keras_group_lasso.sklearn._base import GroupSparseMLPClassifier, GroupSparseMLPRegressor
from keras_group_lasso.sklearn._constraints import Interval, ParameterError, StrOptions

__all__ = ["GroupSparseMLPClassifierCV", "GroupSparseMLPRegressorCV"]

# Constructor arguments of the cross-validated estimators beyond the base
# estimator's, with the constraints they are validated against.
_CV_CONSTRAINTS = {
    "alphas": ["array-like", None],
    "path_multiplier": [Interval(numbers.Real, 1, None, closed="neither")],
    "max_alphas": [Interval(numbers.Integral, 2, None, closed="left")],
    "epochs_per_alpha": [Interval(numbers.Integral, 1, None, closed="left"), None],
    "refit": ["boolean"],
    "cv": ["cv_object"],
    "max_features": [Interval(numbers.Integral, 0, None, closed="left"), None],
    "scoring": [StrOptions(set(get_scorer_names())), callable, None],
    "tolerance": [Interval(numbers.Real, 0, None, closed="left"), StrOptions({"se"})],
}


# The base estimator's early-stopping arguments: the path does not use them.
_FIT_ONLY = ("early_stopping", "validation_fraction", "n_iter_no_change", "tol")



def fold_passes(passes, n, n_train, batch_size):
    """The passes over a fold's ``n_train`` rows that take as many steps of ``batch_size`` rows as ``passes`` over
    all ``n`` rows (at least 1): ``round(passes * ceil(n / b) / ceil(n_train / b))``, so that a strength shrinks as
    much on every path of a cross-validation (a pass over fewer rows can be fewer steps, or as many).

    Example:
        >>> fold_passes(20, 300, 200, 50), fold_passes(20, 150, 100, 200)
        (30, 20)
    """
    per_pass = -(-max(1, n_train) // batch_size)
    return max(1, round(passes * -(-n // batch_size) / per_pass))

class _CrossValidated:
    """``fit`` by cross-validation along the path; prediction and selection come from the base estimator."""

    _base_class = None

    _constraints = {
        **{
            k: v
            for k, v in GroupSparseMLPClassifier._constraints.items()
            if k not in _FIT_ONLY and k != "input_alpha"
        },
        **_CV_CONSTRAINTS,
    }

    def __init__(
        self,
        hidden_layer_sizes=(40, 20),
        *,
        alpha=1e-3,
        penalty="sgl",
        l1_ratio=1.0,
        optimizer="adam",
        learning_rate=1e-3,
        epochs=200,
        batch_size="auto",
        threshold=1e-2,
        proximal=False,
        alphas=None,
        path_multiplier=1.2,
        max_alphas=100,
        epochs_per_alpha=None,
        refit=True,
        cv=3,
        max_features=None,
        scoring=None,
        tolerance=0.0,
        random_state=None,
        verbose=0,
    ):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.alpha = alpha
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.threshold = threshold
        self.proximal = proximal
        self.alphas = alphas
        self.path_multiplier = path_multiplier
        self.max_alphas = max_alphas
        self.epochs_per_alpha = epochs_per_alpha
        self.refit = refit
        self.cv = cv
        self.max_features = max_features
        self.scoring = scoring
        self.tolerance = tolerance
        self.random_state = random_state
        self.verbose = verbose

    def _input_alpha(self):
        return getattr(self, "alpha_", self.alpha)

    def _check_params(self):
        hidden = super()._check_params()
        if self.alphas is not None:
            try:
                values = np.asarray(self.alphas, dtype=float)
                bad = (
                    values.ndim != 1
                    or values.size == 0
                    or not np.all(np.isfinite(values))
                    or np.any(values < 0)
                    or np.any(np.diff(values) <= 0)
                )
            except (TypeError, ValueError):
                bad = True
            if bad:
                raise ParameterError(
                    f"The 'alphas' parameter of {type(self).__name__} must be None or a 1-d increasing "
                    f"sequence of finite numbers >= 0. Got {self.alphas!r} instead."
                )
        return hidden

    def _base_estimator(self):
        """The unfitted base estimator whose :meth:`path` this estimator runs."""
        names = set(self._base_class._get_param_names()) & set(self._get_param_names())
        return self._base_class(**{name: getattr(self, name) for name in names})

    def _path_kwargs(self):
        return dict(
            path_multiplier=self.path_multiplier,
            max_alphas=self.max_alphas,
            epochs_per_alpha=self.epochs_per_alpha,
            refit=self.refit,
        )

    def fit(self, X, y):
        """Run the path on all the data and on each split of ``cv``; keep the chosen point's model.

        Args:
            X: array-like ``(n_samples, n_features)``; a DataFrame's column
                names are kept in ``feature_names_in_``.
            y: class labels (classifier) or targets (regressor).

        Returns:
            ``self``, fitted.

        Raises:
            ParameterError: a parameter has a bad type or value (scikit-learn's
                message form), or ``max_features`` is smaller than the fewest
                features of any point on a given ``alphas`` grid.
            ValueError: bad data (scikit-learn's checks), a single class in
                ``y``, or fewer samples than folds.
            NonFiniteError: the training of a point diverged.
        """
        hidden = self._check_params()
        self._forget_fit()
        try:
            return self._fit(X, y, hidden)
        except BaseException:
            self._forget_fit()  # a failed fit leaves the estimator unfitted, as the base estimators do
            raise

    def _fit(self, X, y, hidden):
        X_checked, y_checked = self._validate_fit_data(X, y)
        _, n_outputs = self._encode_targets(y_checked)  # the task's target checks, named after this estimator
        splitter = check_cv(self.cv, y_checked, classifier=is_classifier(self))
        splits = list(splitter.split(X_checked, y_checked))
        base = self._base_estimator()
        kwargs = self._path_kwargs()
        # Trained on all the data: the validation scores of this path are training scores,
        # replaced below by the cross-validated ones.
        full = base.path(X, y, self.alphas, validation_data=(X, y), **kwargs)
        alphas = full.alphas
        scores = np.empty((len(alphas), len(splits)))
        penalized = np.empty((len(alphas), len(splits)))
        scorer = None if self.scoring is None else check_scoring(base, scoring=self.scoring)
        epochs_per_alpha = kwargs.pop("epochs_per_alpha") or max(1, self.epochs // 4)
        batch = _network.resolved_batch_size(self.batch_size)
        for k, (train, test) in enumerate(splits):
            X_test, y_test = X_checked[test], y_checked[test]
            missing = ()
            if is_classifier(self):  # a path learns the classes it is shown
                missing = sorted(set(self.classes_.tolist()) - set(y_checked[train].tolist()))
            if missing:
                raise ValueError(f"{type(self).__name__}: the training part of fold {k + 1} of cv={self.cv!r} has no "
                                 f"sample of class {missing[0]!r} (a path learns the classes it is shown): use fewer "
                                 "folds or a stratified splitter (an int cv is stratified for a classifier).")
            fold = clone(base).set_params(epochs=fold_passes(self.epochs, len(X_checked), len(train), batch)).path(
                X_checked[train],
                y_checked[train],
                alphas,
                validation_data=(X_test, y_test),
                keep_weights=scorer is not None,
                epochs_per_alpha=fold_passes(epochs_per_alpha, len(X_checked), len(train), batch),
                **kwargs,
            )
            if scorer is None:
                scores[:, k] = fold.scores
            else:
                scores[:, k] = [scorer(fold.estimator(p), X_test, y_test) for p in fold]
            penalized[:, k] = [p.penalized_score for p in fold]
        means = scores.mean(axis=1)
        path = dataclasses.replace(
            full,
            score_name=full.score_name if self.scoring is None else str(self.scoring),
            points=tuple(
                dataclasses.replace(p, score=float(m), penalized_score=float(pm))
                for p, m, pm in zip(full.points, means, penalized.mean(axis=1))
            ),
        )
        point = self._choose(path, scores)
        # This estimator validated the data above (its data attributes are set): it becomes
        # fitted with the chosen point as the base estimator's fit would.
        self.alpha_ = point.alpha
        spec = self._spec(hidden, X_checked.shape[1], n_outputs, len(X_checked))
        self._finish(spec, point.weights, 0.0 if self.refit else point.alpha, point.history)
        self.path_ = path
        self.alphas_ = alphas
        self.scores_path_ = scores
        self.n_features_path_ = full.n_selected
        self.best_index_ = path.points.index(point)
        return self

    def _choose(self, path, scores):
        """The chosen point: fewest features among those tied with the best mean score."""
        n_selected = path.n_selected
        if self.max_features is not None and self.max_features < n_selected.min():
            raise ParameterError(
                f"The 'max_features' parameter of {type(self).__name__} must be at least the smallest "
                f"number of features on the path ({n_selected.min()}). Got {self.max_features!r} instead."
            )
        best = path.points.index(path.best(max_features=self.max_features))
        if self.tolerance == "se":
            n_folds = scores.shape[1]
            tolerance = float(np.std(scores[best], ddof=1) / math.sqrt(n_folds)) if n_folds > 1 else 0.0
        else:
            tolerance = float(self.tolerance)
        return path.best(max_features=self.max_features, tolerance=tolerance)

    def path(self, X, y, alphas=None, **kwargs):
        """The base estimator's :meth:`~GroupSparseMLPClassifier.path` with this estimator's parameters.

        The path arguments default to this estimator's (``alphas``,
        ``path_multiplier``, ``max_alphas``, ``epochs_per_alpha``, ``refit``);
        ``kwargs`` override them. Nothing is cross-validated and this
        estimator is not fitted or changed.
        """
        options = self._path_kwargs()
        options.update(kwargs)
        return self._base_estimator().path(X, y, self.alphas if alphas is None else alphas, **options)


_CV_ARGS_DOC = """
    Args:
        hidden_layer_sizes, alpha, penalty, l1_ratio, optimizer,
            learning_rate, epochs, batch_size, threshold, proximal,
            random_state, verbose: as for the base estimator (its
            ``input_alpha`` is what this estimator chooses; its early
            stopping has no place on the path). ``threshold`` defaults to
            1e-2, ten times the learning rate: under subgradient training a
            useless weight keeps moving by about the learning rate per step,
            and a threshold well above that removes it reliably.
        alphas: increasing input-group strengths (>= 0), or ``None`` for the
            automatic grid of the all-data path (the folds use its strengths).
        path_multiplier, max_alphas, epochs_per_alpha, refit: the path's
            arguments (see ``path``).
        cv: number of folds (stratified for the classifier), a scikit-learn
            splitter, or an iterable of ``(train, test)`` index arrays.
        max_features: choose among the points with at most this many features
            (``None``: all).
        scoring: how a fold scores a point: ``None`` (default) for the
            estimator's own score (accuracy or R², computed by the path), or a
            scikit-learn scorer name or callable (e.g. ``"neg_log_loss"``).
        tolerance: points whose mean cross-validated score is within this of
            the best are tied and the one with the fewest features wins;
            ``0`` (default): the best mean score (the fewest features among
            equal means); ``"se"``: the standard error of the best point's
            fold scores (the one-standard-error rule).
"""

_CV_ATTRIBUTES_DOC = """
    Attributes:
        alpha_: the chosen input-group strength (one of ``alphas_``).
        path_: the all-data :class:`~keras_group_lasso.sklearn.RegularizationPath`,
            each point's ``score`` being the mean of ``scores_path_`` over the
            folds (``penalized_score``: the mean of the folds' accuracy or R²
            before each point's refit); ``path_.estimator(point)`` gives any
            other point's model.
        best_index_: index of the chosen point in ``path_``.
        alphas_: ``(n_alphas,)`` the strengths of the path.
        scores_path_: ``(n_alphas, n_folds)`` held-out score of each fold's
            path (``scoring``; higher is better).
        n_features_path_: ``(n_alphas,)`` features selected by the all-data path.
        n_features_in_, feature_names_in_, support_, coefs_, intercepts_,
            model_, pruned_model_, sparsity_report_: of the chosen point's
            model, as for the base estimator.
"""


class GroupSparseMLPClassifierCV(_CrossValidated, GroupSparseMLPClassifier):
    __doc__ = (
        """:class:`GroupSparseMLPClassifier` with the input-group strength chosen by cross-validation.

    ``fit`` runs the regularization path on all the data and on the training
    part of each split of ``cv`` (same strengths), scores each fold's points
    on its held-out part (accuracy), and keeps the point of the all-data path
    with the fewest features among those whose mean score is within
    ``tolerance`` of the best (at most ``max_features`` features). Prediction,
    ``get_support`` and ``transform`` use that point's model.
"""
        + _CV_ARGS_DOC
        + _CV_ATTRIBUTES_DOC
        + """
    Example:
        >>> from keras_group_lasso.sklearn import GroupSparseMLPClassifierCV
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(size=(300, 8))
        >>> y = (X[:, 0] + X[:, 1] > 1).astype(int)   # only features 0 and 1 matter
        >>> clf = GroupSparseMLPClassifierCV((16,), learning_rate=3e-3, epochs=60, batch_size=50,
        ...                                  alphas=[0.0, 0.01, 0.02, 0.04], random_state=0)
        >>> clf.fit(X, y).get_support(indices=True)
        array([0, 1])
        >>> clf.alpha_, clf.scores_path_.shape
        (0.02, (4, 3))
    """
    )

    _base_class = GroupSparseMLPClassifier


class GroupSparseMLPRegressorCV(_CrossValidated, GroupSparseMLPRegressor):
    __doc__ = (
        """:class:`GroupSparseMLPRegressor` with the input-group strength chosen by cross-validation.

    The same procedure as :class:`GroupSparseMLPClassifierCV`, scored with R²
    and with unstratified folds.
"""
        + _CV_ARGS_DOC
        + _CV_ATTRIBUTES_DOC
        + """
    Example:
        >>> from keras_group_lasso.sklearn import GroupSparseMLPRegressorCV
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(size=(300, 8))
        >>> y = X[:, 0] - 2 * X[:, 1] ** 2   # only features 0 and 1 matter
        >>> reg = GroupSparseMLPRegressorCV((16,), learning_rate=1e-2, epochs=60, batch_size=50,
        ...                                 alphas=[0.0, 0.005, 0.01, 0.02], random_state=0)
        >>> reg.fit(X, y).get_support(indices=True)
        array([0, 1])
    """
    )

    _base_class = GroupSparseMLPRegressor

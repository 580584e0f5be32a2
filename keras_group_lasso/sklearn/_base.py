"""scikit-learn estimators around a group-sparse Keras MLP: fit, predict, select features."""

import copy
import functools
import warnings

import numpy as np
import sklearn
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.feature_selection import SelectorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from keras_group_lasso.analysis import is_zero
from keras_group_lasso.sklearn import _network
from keras_group_lasso.sklearn._constraints import ParameterError, check_parameters
from keras_group_lasso.sklearn._path import (
    check_path_args,
    check_validation_pair,
    run_path,
    warn_if_threshold_unreachable,
)
from keras_group_lasso.surgery import prune_model

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn

    def _validate_data(estimator, *args, **kwargs):
        return estimator._validate_data(*args, **kwargs)


__all__ = ["GroupSparseMLPClassifier", "GroupSparseMLPRegressor", "ParameterError"]


class _GroupSparseMLP(SelectorMixin, BaseEstimator):
    """Shared parameters, training and feature selection of the two estimators."""

    _task = None  # "classification" or "regression"

    # Declared constraints of the constructor parameters (see _constraints.py). Not named
    # `_parameter_constraints`: scikit-learn's estimator checks read that name with its own constraint types.
    _constraints = _network.PARAMETER_CONSTRAINTS

    def __init__(
        self,
        hidden_layer_sizes=(40, 20),
        *,
        alpha=1e-3,
        input_alpha=None,
        penalty="sgl",
        l1_ratio=1.0,
        optimizer="adam",
        learning_rate=1e-3,
        epochs=200,
        batch_size="auto",
        threshold=1e-3,
        proximal=False,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=10,
        tol=1e-4,
        random_state=None,
        verbose=0,
    ):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.alpha = alpha
        self.input_alpha = input_alpha
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.threshold = threshold
        self.proximal = proximal
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ tags

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        return tags

    # ------------------------------------------------------------------ validation

    def _check_params(self):
        """Validate every parameter; returns the hidden layer sizes as a tuple of ints."""
        name = type(self).__name__
        if not sklearn.get_config().get("skip_parameter_validation", False):
            check_parameters(self._constraints, self.get_params(deep=False), name)
        if self.proximal is True and self.penalty in ("l1", "l2"):
            # Proximal steps the package's group penalties only: Keras's L1 and L2 stay loss terms, which make no
            # exact zero, and with proximal=True no threshold is applied either: nothing would be selected.
            raise ParameterError(f"The 'proximal' parameter of {name} must be False with penalty={self.penalty!r} "
                                 "(the proximal step is for the group penalties 'sgl' and 'group'). Got True instead.")
        return _network.hidden_sizes(self.hidden_layer_sizes, name)

    def _validate_fit_data(self, X, y, reset=True):
        X, y = _validate_data(
            self,
            X,
            y,
            dtype=[np.float64, np.float32],
            multi_output=self._task == "regression",
            y_numeric=self._task == "regression",
            reset=reset,
        )
        return np.asarray(X, dtype=np.float32), y

    def _validate_predict_data(self, X):
        check_is_fitted(self)
        X = _validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        return np.asarray(X, dtype=np.float32)

    # ------------------------------------------------------------------ targets (per task)

    def _encode_targets(self, y):
        """Set the target attributes; return ``(y for Keras, n_outputs)``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ training

    def _input_alpha(self):
        return self.alpha if self.input_alpha is None else self.input_alpha

    def _spec(self, hidden, n_features, n_outputs, n_train):
        return _network.make_spec(
            self._task,
            hidden,
            n_features,
            n_outputs,
            n_train,
            penalty=self.penalty,
            l1_ratio=self.l1_ratio,
            optimizer=self.optimizer,
            proximal=self.proximal,
            batch_size=self.batch_size,
        )

    def fit(self, X, y):
        """Train the network, threshold its weights and select the input features.

        Args:
            X: array-like ``(n_samples, n_features)``; a DataFrame's column
                names are kept in ``feature_names_in_``.
            y: class labels (classifier) or targets ``(n_samples,)`` /
                ``(n_samples, n_outputs)`` (regressor).

        Returns:
            ``self``, fitted.

        Raises:
            ParameterError: a parameter has a bad type or value (scikit-learn's message form).
            ValueError: bad data (scikit-learn's checks), or a single class in ``y``.
            NonFiniteError: the training diverged (a NaN or infinite loss or
                weight), usually because the features are not scaled; the
                estimator is left unfitted.
        """
        hidden = self._check_params()
        try:
            return self._fit(hidden, X, y)
        except BaseException:  # the data attributes may be the new data's already: unfitted, not half-fitted
            self._forget_fit()
            raise

    def _fit(self, hidden, X, y):
        X, y = self._validate_fit_data(X, y)
        y_encoded, n_outputs = self._encode_targets(y)
        init_seed, data_seed, split_seed = _network.draw_seeds(self.random_state)
        X_train, y_train, X_val, y_val = X, y_encoded, None, None
        if self.early_stopping:
            X_train, X_val, y_train, y_val = _network.holdout(
                X, y_encoded, self.validation_fraction, split_seed, self._task
            )
        spec = self._spec(hidden, X.shape[1], n_outputs, len(X_train))

        network = _network.NETWORKS.acquire(spec)
        network.set_weights(_network.glorot_weights(spec, init_seed))
        network.reset_optimizer(self.learning_rate)
        network.set_alpha(self.alpha, self._input_alpha())
        network.set_mask(None)
        score = None
        if X_val is not None:
            score = lambda net: _network.score_outputs(self._task, net.predict(X_val), y_val)  # noqa: E731
        monitor = _network.PassMonitor(
            network,
            score=score,
            n_iter_no_change=self.n_iter_no_change if score is not None else None,
            tol=self.tol,
            verbose=self.verbose,
        )
        network.train(X_train, y_train, self.epochs, data_seed, monitor, verbose=1 if self.verbose >= 2 else 0)
        weights = network.get_weights()
        # Only a network that trained without error goes back (a diverged one would be fine too: the next fit
        # resets its weights and optimizer).
        _network.NETWORKS.release(network)
        _network.check_finite(
            f"{type(self).__name__}.fit", self._task, self.learning_rate, monitor, weights, self.epochs
        )
        return self._finish(spec, weights, self._input_alpha(), monitor.history())

    def _forget_fit(self):
        """Leave the estimator unfitted (after a fit that failed once the data was read)."""
        for name in list(vars(self)):
            if name.endswith("_") and not name.startswith("__"):
                delattr(self, name)

    def _finish(self, spec, weights, input_alpha, history):
        """Become fitted with a training's result: threshold ``weights`` (unless proximal), read the selection.

        The one way an estimator becomes fitted, after :meth:`fit` and for a
        point of :meth:`path`: ``spec`` is the trained
        network's shape, ``input_alpha`` the input-group strength it trained
        with last, ``history`` its per-pass record (``{"loss": [...], ...}``).
        The data attributes (``n_features_in_``, ``classes_``, ...) were set
        when this estimator validated the training data.
        """
        threshold = 0.0 if self.proximal else float(self.threshold)
        weights = [np.asarray(w, dtype=np.float32) for w in weights]
        if not self.proximal:
            # The paper's last step, with the rule of keras_group_lasso.apply_threshold.
            weights = [np.where(is_zero(w, threshold), np.float32(0), w) for w in weights]
        report = _network.sparsity_of(spec, weights, threshold)
        support = np.zeros(spec.n_features, dtype=bool)
        support[list(report.selected_features)] = True
        self.coefs_ = weights[0::2]
        self.intercepts_ = weights[1::2]
        self.sparsity_report_ = report
        self.support_ = support
        self.history_ = {name: list(values) for name, values in history.items()}
        self.n_iter_ = len(self.history_["loss"])
        self.loss_ = self.history_["loss"][-1] if self.history_["loss"] else float("nan")
        self._fitted_spec = spec
        self._fitted_input_alpha = float(input_alpha)
        self._fitted_alpha, self._fitted_learning_rate = float(self.alpha), self.learning_rate
        self._model = None
        self._pruned = None
        return self

    def _weights(self):
        return [w for pair in zip(self.coefs_, self.intercepts_) for w in pair]

    def __getstate__(self):
        # Keras models are rebuilt on demand from coefs_ / intercepts_.
        state = super().__getstate__()
        for name in ("_model", "_pruned"):
            if name in state:
                state[name] = None
        return state

    # ------------------------------------------------------------------ the path

    def path(
        self,
        X,
        y,
        alphas=None,
        *,
        validation_data=None,
        path_multiplier=1.2,
        max_alphas=100,
        epochs_per_alpha=None,
        refit=True,
        keep_weights=True,
    ):
        """The regularization path of this estimator's network on ``X, y``.

        Warm-started fits along an increasing input-group strength, from dense
        to no feature: :func:`~keras_group_lasso.sklearn.regularization_path`
        with this estimator's parameters (same seed, same points), and each
        point can become a fitted estimator (:meth:`RegularizationPath.estimator`).
        The estimator itself is not fitted or changed. Each point trains its
        passes in full: ``early_stopping``, ``n_iter_no_change`` and ``tol``
        are ``fit``'s alone (the path scores every point on the held-out data).

        Args:
            X, y: training data, as for ``fit``.
            alphas: increasing input-group strengths (>= 0), or ``None`` for
                the automatic grid. The first point is trained from scratch
                for ``epochs`` passes, the others are warm-started.
            validation_data: ``(X_val, y_val)`` to score the points; ``None``
                holds out ``validation_fraction`` of ``X, y`` (stratified for a classifier).
            path_multiplier: ratio of consecutive strengths of the automatic grid (> 1).
            max_alphas: most points of the automatic grid (>= 2).
            epochs_per_alpha: passes per point (and per refit); ``None``:
                ``max(1, epochs // 4)``.
            refit: retrain each point on its features before scoring it.
            keep_weights: keep each point's weights (needed by
                :meth:`RegularizationPath.estimator`).

        Returns:
            A :class:`~keras_group_lasso.sklearn.RegularizationPath`.

        Raises:
            ParameterError: a bad estimator parameter.
            InvalidParameterError: a bad argument of the path.
            NonFiniteError: the training of a point diverged (see ``fit``).

        Example:
            >>> rng = np.random.default_rng(0)
            >>> X, X_val = rng.uniform(size=(200, 8)), rng.uniform(size=(100, 8))
            >>> y = (X[:, 0] + X[:, 1] > 1).astype(int)   # only features 0 and 1 matter
            >>> y_val = (X_val[:, 0] + X_val[:, 1] > 1).astype(int)
            >>> clf = GroupSparseMLPClassifier((16,), alpha=1e-3, learning_rate=3e-3, proximal=True,
            ...                                epochs=100, batch_size=20, random_state=0)
            >>> path = clf.path(X, y, alphas=[0.0, 0.01, 0.02], validation_data=(X_val, y_val))
            >>> point = path.best(max_features=2)
            >>> point.alpha, point.selected_features
            (0.02, (0, 1))
            >>> path.estimator(point).score(X_val, y_val)
            0.96
        """
        owner = f"{type(self).__name__}.path"
        hidden = self._check_params()
        alphas = check_path_args(owner, alphas, path_multiplier, max_alphas, epochs_per_alpha, refit, keep_weights)
        # A copy validates the data (data attributes set, not fitted): the path's
        # estimator(point) finishes copies of it with a point's weights.
        work = clone(self)
        X, y = work._validate_fit_data(X, y)
        y_encoded, n_outputs = work._encode_targets(y)
        # From the copy's random_state: a RandomState passed in is not advanced by the path.
        init_seed, data_seed, split_seed = _network.draw_seeds(work.random_state)
        if check_validation_pair(owner, validation_data) is None:
            X_train, X_val, y_train, y_val = _network.holdout(
                X, y_encoded, self.validation_fraction, split_seed, self._task
            )
        else:
            X_val, y_val = work._validate_fit_data(*validation_data, reset=False)
            y_val = work._encode_validation_targets(y_val)
            X_train, y_train = X, y_encoded
        warn_if_threshold_unreachable(owner, self.learning_rate, self.threshold, self.proximal, stacklevel=2)
        spec = work._spec(hidden, X.shape[1], n_outputs, len(X_train))
        return run_path(
            owner,
            spec,
            (X_train, y_train),
            (X_val, y_val),
            alphas,
            alpha=self.alpha,
            start_alpha=self._input_alpha(),
            learning_rate=self.learning_rate,
            threshold=self.threshold,
            epochs=self.epochs,
            epochs_per_alpha=epochs_per_alpha or max(1, self.epochs // 4),
            init_seed=init_seed,
            data_seed=data_seed,
            path_multiplier=path_multiplier,
            max_alphas=max_alphas,
            refit=refit,
            keep_weights=keep_weights,
            verbose=self.verbose,
            feature_names=getattr(work, "feature_names_in_", None),
            make_estimator=functools.partial(_estimator_at, work, spec, refit),
            stacklevel=2,
        )

    # ------------------------------------------------------------------ outputs

    def _forward(self, X):
        # numpy on coefs_ / intercepts_, in float64: each row's output does not depend on the
        # other rows or their order (scikit-learn checks it; a float32 backend matmul can
        # differ in the last bit), it is the same on every backend, and has no per-call overhead.
        X = self._validate_predict_data(X)
        return _network.forward(self._weights(), X, self._task)

    def _get_support_mask(self):
        check_is_fitted(self)
        return self.support_

    @property
    def model_(self):
        """The network as a compiled ``keras.Sequential`` of Dense layers (built on first access).

        Its layers carry this package's penalties at the fitted strengths and
        its weights are ``coefs_`` / ``intercepts_``, thresholded: save it,
        inspect it with :func:`keras_group_lasso.sparsity_report`, or train it
        further. ``predict`` does not read it (it uses ``coefs_`` / ``intercepts_``).
        """
        check_is_fitted(self)
        if self._model is None:
            model = _network.build_export_model(
                self._fitted_spec, self._fitted_alpha, self._fitted_input_alpha, self._weights()
            )
            _network.compile_export_model(model, self._fitted_spec, self._fitted_learning_rate)
            self._model = model
        return self._model

    @property
    def pruned_model_(self):
        """The physically smaller ``keras.Model`` (:func:`keras_group_lasso.prune_model`), built on first use.

        It takes the original ``n_features_in_`` columns (``inputs="original"``)
        and computes what ``model_`` computes. ``None``, with a warning, when no
        input feature survived (there is nothing to keep).
        """
        check_is_fitted(self)
        if self._pruned is None:
            if not self.support_.any():
                warnings.warn(
                    f"{type(self).__name__}: no input feature survived the threshold; "
                    "there is no pruned model (pruned_model_ is None).",
                    UserWarning,
                    stacklevel=2,
                )
                return None
            self._pruned = prune_model(self.model_, threshold=0.0, inputs="original")
            self._pruned.compile(loss=self.model_.loss)
        return self._pruned


def _estimator_at(estimator, spec, refit, point):
    """A fitted copy of ``estimator`` (data validated, not fitted) with ``point``'s weights: ``path.estimator(point)``.

    Its ``input_alpha`` is the strength the point's model was last trained with
    (``point.alpha``, or 0 after a refit). A module-level function, so that a
    path holding it (through ``functools.partial``) pickles.
    """
    estimator = copy.deepcopy(estimator)
    estimator.set_params(input_alpha=0.0 if refit else point.alpha)
    return estimator._finish(spec, point.weights, estimator._input_alpha(), point.history)


class GroupSparseMLPClassifier(ClassifierMixin, _GroupSparseMLP):
    """A ReLU MLP classifier trained with group-sparse penalties that selects its input features.

    The network is ``n_features -> hidden_layer_sizes -> n_classes`` (ReLU,
    softmax, cross-entropy), trained with Adam or SGD on
    ``mean cross-entropy + R(W)`` where, for ``penalty="sgl"`` (the paper's
    sparse group Lasso, Scardapane et al. 2017)::

        R = input_alpha * (sum_features sqrt(|g|) ||W1[j, :]|| + l1_ratio * ||W1||_1)
          + alpha * sum_(later kernels) (sum_units sqrt(|g|) ||W[i, :]|| + l1_ratio * ||W||_1)
          + alpha * (1 + l1_ratio) * ||b||_1 over every bias

    (``"group"``: the same without the L1 parts; ``"l1"`` / ``"l2"``: Keras's
    ``L1`` / ``L2`` with ``alpha`` / ``input_alpha`` on every kernel and bias).
    After training every weight with ``|w| <= threshold`` is set to 0 (the
    paper's last step; skipped with ``proximal=True``, whose proximal updates
    make exact zeros). An input feature is *selected* when it still reaches
    the output (:func:`keras_group_lasso.sparsity_report`); ``get_support()``
    and ``transform()`` come from scikit-learn's ``SelectorMixin``.

    Training runs the ``epochs`` passes as one Keras epoch over a reshuffled
    stream of equal-size mini-batches, so small problems are fast; each fit
    compiles a training network of its own (nothing is kept between fits),
    and a :meth:`path` one for all its points. With the same
    ``random_state`` two fits give the same model.

    Args:
        hidden_layer_sizes: sizes of the hidden layers (an int for one layer;
            ``()`` for none: a group-Lasso logistic regression).
        alpha: strength of the penalty on the hidden groups and biases
            (and on the input groups unless ``input_alpha`` is set).
        input_alpha: strength on the input groups (feature selection);
            ``None`` uses ``alpha``. :meth:`path` varies this one.
        penalty: ``"sgl"`` (default), ``"group"``, ``"l1"`` or ``"l2"``.
        l1_ratio: elementwise strength relative to the group strength in
            ``"sgl"`` (1.0: the paper's single coefficient).
        optimizer: ``"adam"`` (default) or ``"sgd"``.
        learning_rate: step size of the optimizer.
        epochs: passes over the training data.
        batch_size: rows per training step, ``"auto"`` (200) or an int. A
            step never has fewer rows: on less data it takes rows from
            consecutive reshuffled passes (so a "pass" is one step then).
        threshold: weights with ``|w| <= threshold`` become 0 after training.
            Under subgradient training Adam keeps moving a useless weight by
            about ``learning_rate`` per step, so few weights end below a
            threshold smaller than the learning rate: keep ``learning_rate <=
            threshold`` (the paper's 1e-3 and 1e-3) or use ``proximal=True``.
        proximal: train with :class:`keras_group_lasso.Proximal` (exact zeros;
            the threshold is then not applied).
        early_stopping: hold out ``validation_fraction`` of the training data
            (stratified for a classifier) and stop when its score has not improved by
            ``tol`` for ``n_iter_no_change`` passes (the last weights are kept).
        validation_fraction: held-out fraction for early stopping and :meth:`path`.
        n_iter_no_change: patience of early stopping, in passes.
        tol: improvement that resets the patience.
        random_state: seed of the initial weights, the shuffling and the split.
        verbose: 0 silent; 1 logs one line per pass (logger
            ``"keras_group_lasso.sklearn"``, INFO); 2 also shows Keras's progress bar.

    Attributes:
        classes_: the class labels.
        n_features_in_, feature_names_in_: as in scikit-learn.
        support_: bool mask of the selected input features.
        coefs_, intercepts_: the thresholded kernels and biases (as in
            scikit-learn's MLP); ``predict`` uses them.
        model_: the same network as a compiled ``keras.Sequential`` (built on first access).
        pruned_model_: the physically smaller model (built on first access).
        sparsity_report_: the :class:`keras_group_lasso.SparsityReport` of ``model_``.
        history_: ``{"loss": [...]}`` per pass (loss includes the penalty), plus
            ``"val_score"`` with early stopping.
        n_iter_: passes run.  loss_: the last pass's mean training loss.

    Example:
        >>> from sklearn.pipeline import make_pipeline
        >>> from sklearn.preprocessing import MinMaxScaler
        >>> rng = np.random.default_rng(0)
        >>> X_train, X_test = rng.uniform(size=(200, 8)), rng.uniform(size=(100, 8))
        >>> y_train = (X_train[:, 0] + X_train[:, 1] > 1).astype(int)   # only features 0 and 1 matter
        >>> y_test = (X_test[:, 0] + X_test[:, 1] > 1).astype(int)
        >>> clf = GroupSparseMLPClassifier((16,), alpha=1e-3, input_alpha=0.02, learning_rate=3e-3,
        ...                                proximal=True, epochs=100, batch_size=20, random_state=0)
        >>> pipe = make_pipeline(MinMaxScaler(), clf).fit(X_train, y_train)
        >>> pipe.score(X_test, y_test), int(clf.get_support().sum())
        (0.95, 2)
    """

    _task = "classification"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = False
        return tags

    def _encode_targets(self, y):
        check_classification_targets(y)
        classes, y_encoded = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(
                f"{type(self).__name__}: argument `y` must contain at least 2 classes; "
                f"received 1 class ({classes[0]!r})."
            )
        self.classes_ = classes
        return y_encoded.astype(np.int32), len(classes)

    def _encode_validation_targets(self, y):
        check_classification_targets(y)
        index = np.searchsorted(self.classes_, y)
        index = np.clip(index, 0, len(self.classes_) - 1)
        unknown = self.classes_[index] != y
        if np.any(unknown):
            raise ValueError(
                f"{type(self).__name__}: argument `validation_data` must have labels seen in `y`; "
                f"received unknown labels {np.unique(np.asarray(y)[unknown])[:10]!r}."
            )
        return index.astype(np.int32)

    def predict_proba(self, X):
        """Class probabilities, ``(n_samples, n_classes)`` in the order of ``classes_``."""
        proba = self._forward(X)
        return proba / proba.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X):
        """``log(predict_proba(X))``."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X):
        """The most probable class of each sample."""
        proba = self._forward(X)
        return self.classes_[np.argmax(proba, axis=1)]


class GroupSparseMLPRegressor(RegressorMixin, _GroupSparseMLP):
    """A ReLU MLP regressor trained with group-sparse penalties that selects its input features.

    The same model, penalties, training and selection as
    :class:`GroupSparseMLPClassifier` (see there), with a linear output
    layer of ``n_outputs`` units and the mean squared error. Early stopping
    and :meth:`path` score with R². Targets are used as given (scale them if
    they are large: the penalty competes with the squared error).

    Attributes:
        n_outputs_: number of targets (the other attributes as for the classifier, without ``classes_``).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(size=(200, 8))
        >>> y = X[:, 0] - 2 * X[:, 1] ** 2   # only features 0 and 1 matter
        >>> reg = GroupSparseMLPRegressor((16,), alpha=1e-3, input_alpha=0.01, learning_rate=1e-2,
        ...                               proximal=True, epochs=100, batch_size=20, random_state=0)
        >>> reg.fit(X, y).get_support()
        array([ True,  True, False, False, False, False, False, False])
        >>> round(reg.score(X, y), 2)
        0.99
    """

    _task = "regression"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _encode_targets(self, y):
        y = np.asarray(y, dtype=np.float32)
        self._y_ndim = y.ndim
        y2 = y.reshape(len(y), -1)
        self.n_outputs_ = y2.shape[1]
        return y2, y2.shape[1]

    def _encode_validation_targets(self, y):
        y2 = np.asarray(y, dtype=np.float32).reshape(len(y), -1)
        if y2.shape[1] != self.n_outputs_:
            raise ValueError(
                f"{type(self).__name__}: argument `validation_data` must have {self.n_outputs_} "
                f"target column(s) like `y`; received {y2.shape[1]}."
            )
        return y2

    def predict(self, X):
        """Predicted targets, ``(n_samples,)`` or ``(n_samples, n_outputs)`` as ``y`` was at fit."""
        out = self._forward(X)
        return out.ravel() if self._y_ndim == 1 else out

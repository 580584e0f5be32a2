"""The regularization path: warm-started fits along an increasing input-group strength.

At each strength ``a`` of the grid (``a_0 < a_1 < ...``), starting from the
previous point's weights:

1. *select*: train ``epochs_per_alpha`` passes with the input groups at
   strength ``a`` (the other penalties stay at the estimator's ``alpha``),
   threshold, and keep the input features that still reach the output. A
   feature that left stays out for the rest of the path (its input is masked),
   so the selected sets shrink monotonically and each feature has one exit
   strength;
2. *refit* (``refit=True``, default): from the selected weights, train
   ``epochs_per_alpha`` passes on the selected features only, without the
   input-group penalty (the hidden and bias penalties stay at ``alpha``).
   This removes the shrinkage that a large ``a`` puts on the surviving input
   weights (like the relaxed Lasso), so the point's score says what its
   feature set is worth. The path goes on from the step-1 weights.

The automatic grid (``alphas=None``) starts from a dense fit (``a_0 = 0``).
For each feature ``j`` it then computes the smallest strength at which an
all-zero input group ``W1[j, :]`` would be stationary for the dense network,
``lambda_j = min {a : ||S(g_j, a * l1_ratio)||_2 <= a * sqrt(|g|)}`` with
``g_j`` the loss gradient of that group with feature ``j`` removed and ``S``
the soft-threshold (the group Lasso's optimality condition; ``||g_j|| / sqrt(|g|)``
for ``"group"`` and ``"l2"``, ``max |g_j|`` for ``"l1"``). The grid starts at
``median_j(lambda_j) / 10``, where nearly every feature survives, and grows by
``path_multiplier`` until no feature is left (or ``max_alphas`` points).
"""

import dataclasses
import math
import time
import warnings

import numpy as np
import sklearn
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_X_y

from keras_group_lasso._validation import Described, check_non_negative, fail
from keras_group_lasso.sklearn import _network
from keras_group_lasso.sklearn._constraints import StrOptions, check_parameters

__all__ = ["PathPoint", "RegularizationPath", "input_group_strengths", "regularization_path"]


@dataclasses.dataclass(frozen=True)
class PathPoint:
    """One point of a :class:`RegularizationPath`.

    Attributes:
        alpha: the input-group strength of the selection step.
        score: validation score (accuracy or R²) of the point's model.
        penalized_score: validation score of the selection step's model
            (equal to ``score`` when the path does not refit).
        selected_features: indices of the input features the model uses.
        live_neurons: hidden units left.
        layer_sizes: compact layer sizes, input layer first, output excluded.
        n_params: parameters left after removing dead features and units.
        sparsity: fraction of zero kernel weights.
        passes: training passes spent on this point (selection and refit).
        elapsed_s: seconds since the path started, when the point was done.
        weights: the model's weights (kernels and biases, thresholded), or
            ``None`` when the path was run with ``keep_weights=False``.
        history: ``{"loss": [...]}``, the training loss of each of the
            point's passes (selection, then refit).
    """

    alpha: float
    score: float
    penalized_score: float
    selected_features: tuple
    live_neurons: int
    layer_sizes: tuple
    n_params: int
    sparsity: float
    passes: int
    elapsed_s: float
    weights: tuple = dataclasses.field(default=None, repr=False, compare=False)
    history: dict = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def n_features(self):
        """Number of selected features."""
        return len(self.selected_features)


@dataclasses.dataclass(frozen=True)
class RegularizationPath:
    """The result of ``estimator.path(X, y)`` or :func:`regularization_path`: one :class:`PathPoint` per strength.

    Indexing, ``len`` and iteration go over the points. Arrays across the
    points: :attr:`alphas`, :attr:`scores`, :attr:`n_selected`.

    Attributes:
        points: the points, in increasing ``alpha``.
        n_features_in: number of input features.
        feature_names: the input's column names, or ``None``.
        score_name: ``"accuracy"`` or ``"r2"``.
        refit: whether each point's model was refitted on its features.
        elapsed_s: wall time of the whole path, in seconds.

    Example:
        >>> from keras_group_lasso.sklearn import GroupSparseMLPClassifier
        >>> rng = np.random.default_rng(0)
        >>> X, X_val = rng.uniform(size=(200, 8)), rng.uniform(size=(100, 8))
        >>> y = (X[:, 0] + X[:, 1] > 1).astype(int)   # only features 0 and 1 matter
        >>> y_val = (X_val[:, 0] + X_val[:, 1] > 1).astype(int)
        >>> clf = GroupSparseMLPClassifier((16,), alpha=1e-3, learning_rate=3e-3, proximal=True,
        ...                                epochs=100, batch_size=20, random_state=0)
        >>> path = clf.path(X, y, alphas=[0.0, 0.01, 0.02], validation_data=(X_val, y_val))
        >>> print(path)
        RegularizationPath: 3 points, ... s
               alpha  features  neurons  accuracy  penalized
                   0         8       10    0.9200        ...
                0.01         3       10    0.9600     0.9700
                0.02         2        9    0.9600     0.9500
        >>> best = path.best(max_features=2)
        >>> best.alpha, best.n_features, best.score
        (0.02, 2, 0.96)
        >>> path.estimator(best).score(X_val, y_val)
        0.96
        >>> ax = path.plot()   # validation score against the number of selected features
        >>> ax.get_xlabel()
        'selected features'
        >>> path.feature_importances_   # the strength at which each feature left the path
        array([ inf,  inf, 0.01, 0.01, 0.01, 0.01, 0.01, 0.02])
    """

    points: tuple
    n_features_in: int
    feature_names: tuple
    score_name: str
    refit: bool
    elapsed_s: float
    # ``point -> fitted estimator`` when an estimator's path() ran the path (it
    # knows the data attributes and how an estimator becomes fitted); ``None``
    # for regularization_path, whose points have no estimator.
    _make_estimator: object = dataclasses.field(default=None, repr=False, compare=False)

    def __len__(self):
        return len(self.points)

    def __getitem__(self, index):
        return self.points[index]

    def __iter__(self):
        return iter(self.points)

    @property
    def alphas(self):
        """``alpha`` of every point."""
        return np.array([p.alpha for p in self.points], dtype=float)

    @property
    def scores(self):
        """``score`` of every point."""
        return np.array([p.score for p in self.points], dtype=float)

    @property
    def n_selected(self):
        """Number of selected features of every point."""
        return np.array([p.n_features for p in self.points], dtype=int)

    @property
    def feature_importances_(self):
        """Per input feature, the strength at which it left the path (LassoNet's definition).

        ``importance[j] = alpha`` of the first point where feature ``j`` is no
        longer selected; ``inf`` if it is selected at every point. Larger means
        the feature survives a stronger penalty. (LassoNet also gives ``inf``
        to a feature missing from the very first point; here such a feature
        gets the first point's ``alpha``.)
        """
        out = np.full(self.n_features_in, np.inf)
        left = np.zeros(self.n_features_in, dtype=bool)
        for point in self.points:
            selected = np.zeros(self.n_features_in, dtype=bool)
            selected[list(point.selected_features)] = True
            newly = ~selected & ~left
            out[newly] = point.alpha
            left |= newly
        return out

    def best(self, max_features=None, tolerance=0.0):
        """The best point with at most ``max_features`` features.

        Among the points with at most ``max_features`` features (all when
        ``None``), those whose score is within ``tolerance`` of the highest
        score are equally good; the one with the fewest features wins (then
        the higher score, then the larger ``alpha``). ``tolerance=0`` picks
        the highest score.

        Raises:
            InvalidParameterError: ``max_features`` is not an int >= 0, no
                point has that few features, or ``tolerance`` is not a finite
                number >= 0.
        """
        owner = "RegularizationPath.best"
        if max_features is None:
            candidates = list(self.points)
        else:
            if isinstance(max_features, bool) or not isinstance(max_features, (int, np.integer)) or max_features < 0:
                fail(owner, "max_features", "an integer >= 0 or None", max_features)
            candidates = [p for p in self.points if p.n_features <= max_features]
            if not candidates:
                fail(
                    owner,
                    "max_features",
                    f"at least the smallest number of features on the path ({min(self.n_selected)})",
                    max_features,
                )
        tolerance = check_non_negative(owner, "tolerance", tolerance)
        top = max(p.score for p in candidates)
        good = [p for p in candidates if p.score >= top - tolerance]
        return min(good, key=lambda p: (p.n_features, -p.score, -p.alpha))

    def estimator(self, point):
        """A fitted estimator whose model is ``point``'s (a :class:`PathPoint` or an index).

        It has the path's parameters with ``input_alpha`` set to the strength
        its model was last trained with (``point.alpha``, or 0 after a refit)
        and every fitted attribute of ``fit``.

        Raises:
            InvalidParameterError: ``point`` is neither a point of this path nor
                the index of one, the path was run with ``keep_weights=False``,
                or it was run by :func:`regularization_path` (not by an
                estimator's ``path``), which knows no estimator.
        """
        if not isinstance(point, PathPoint):
            n = len(self.points)
            if isinstance(point, bool) or not isinstance(point, (int, np.integer)) or not -n <= point < n:
                fail(
                    "RegularizationPath.estimator",
                    "point",
                    f"a PathPoint or an index of one of the {n} points (an int in [-{n}, {n - 1}])",
                    point,
                )
            point = self.points[point]
        elif not any(point is own for own in self.points):
            fail("RegularizationPath.estimator", "point", "a point of this path (or the index of one)",
                 Described(f"a PathPoint of another path (alpha={point.alpha:g})"))
        if point.weights is None:
            fail(
                "RegularizationPath.estimator",
                "point",
                "a point with weights (run path with keep_weights=True)",
                point,
            )
        if self._make_estimator is None:
            fail(
                "RegularizationPath.estimator",
                "point",
                "a point of a path run by an estimator's path() (regularization_path makes no estimators)",
                point,
            )
        return self._make_estimator(point)

    def plot(self, ax=None, **kwargs):
        """Plot the score against the number of selected features (matplotlib, imported here).

        Args:
            ax: matplotlib ``Axes`` to draw on (default: a new figure).
            **kwargs: passed to ``ax.plot``.

        Returns:
            The ``Axes``.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        style = {"marker": "o", "markersize": 3, "linestyle": "-"}
        style.update(kwargs)
        ax.plot(self.n_selected, self.scores, **style)
        ax.set_xlabel("selected features")
        ax.set_ylabel(f"validation {self.score_name}")
        ax.set_title("regularization path")
        ax.grid(True, alpha=0.3)
        return ax

    def __str__(self):
        lines = [f"RegularizationPath: {len(self.points)} points, {self.elapsed_s:.1f} s"]
        lines.append(f"  {'alpha':>10}  {'features':>8}  {'neurons':>7}  {self.score_name:>8}  penalized")
        for p in self.points:
            lines.append(
                f"  {p.alpha:10.4g}  {p.n_features:8d}  {p.live_neurons:7d}  {p.score:8.4f}  {p.penalized_score:9.4f}"
            )
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the grid


def input_group_strengths(weights, x, y, task, penalty="sgl", l1_ratio=1.0):
    """Per input feature, the smallest input-group strength at which ``W1[j, :] = 0`` is stationary.

    For the MLP with ``weights = [W1, b1, ..., WL, bL]`` (ReLU hidden layers,
    softmax + cross-entropy or linear + mean squared error), ``g_j`` is the
    gradient of the mean loss with respect to ``W1[j, :]`` at ``W1[j, :] = 0``
    (the other weights fixed). Zero is optimal for the group when
    ``||S(g_j, a * l1_ratio)||_2 <= a * sqrt(|g|)`` (sparse group Lasso),
    ``||g_j|| <= a sqrt(|g|)`` (group Lasso; also used as a scale for L2), or
    ``max |g_j| <= a`` (L1); the smallest such ``a`` is returned.

    Args:
        weights: list of numpy arrays, kernels and biases alternating.
        x: float array ``(n, n_features)`` (subsample large data first).
        y: class indices ``(n,)`` in ``[0, n_outputs)`` for classification (labels encoded as the estimators
            encode them: their positions in the sorted classes), float ``(n, n_outputs)`` for regression.
        task: ``"classification"`` or ``"regression"``.
        penalty: ``"sgl"``, ``"group"``, ``"l1"`` or ``"l2"``.
        l1_ratio: the elementwise strength relative to the group strength (``"sgl"``).

    Returns:
        float array ``(n_features,)``, >= 0 (0 for a feature the loss ignores).

    Example:
        >>> from keras_group_lasso.sklearn import GroupSparseMLPClassifier
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(size=(200, 8))
        >>> y = (X[:, 0] + X[:, 1] > 1).astype(int)   # only features 0 and 1 matter
        >>> clf = GroupSparseMLPClassifier((16,), alpha=1e-3, input_alpha=0.02, learning_rate=3e-3,
        ...                                proximal=True, epochs=100, batch_size=20, random_state=0)
        >>> weights = [w for layer in zip(clf.fit(X, y).coefs_, clf.intercepts_) for w in layer]
        >>> lam = input_group_strengths(weights, X, y, "classification")
        >>> lam.round(2)   # features 0 and 1 resist a 10x stronger penalty than the others
        array([0.26, 0.26, 0.01, 0.01, 0.02, 0.01, 0.01, 0.  ])
    """
    kernels = [np.asarray(w, dtype=np.float64) for w in weights[0::2]]
    biases = [np.asarray(b, dtype=np.float64) for b in weights[1::2]]
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    widest = max(max(k.shape[1] for k in kernels), d)
    chunk = max(1, int(4_000_000 // max(1, n * widest)))
    grads = np.zeros((d, kernels[0].shape[1]))
    last = len(kernels) - 1
    for start in range(0, d, chunk):
        js = np.arange(start, min(d, start + chunk))
        h = np.repeat(x[None], len(js), axis=0)
        h[np.arange(len(js)), :, js] = 0.0
        pre = []
        for k, (kernel, bias) in enumerate(zip(kernels, biases)):
            z = h @ kernel + bias
            pre.append(z)
            h = np.maximum(z, 0.0) if k < last else z
        if task == "classification":
            h = h - h.max(axis=-1, keepdims=True)
            delta = np.exp(h)
            delta /= delta.sum(axis=-1, keepdims=True)
            delta[:, np.arange(n), np.asarray(y, dtype=int)] -= 1.0
            delta /= n
        else:
            target = np.asarray(y, dtype=np.float64).reshape(n, -1)
            delta = 2.0 * (h - target[None]) / (n * target.shape[1])
        for k in range(last, 0, -1):
            delta = (delta @ kernels[k].T) * (pre[k - 1] > 0)
        grads[js] = np.einsum("cn,cnm->cm", x[:, js].T, delta)
    size = grads.shape[1]
    if penalty == "l1":
        return np.abs(grads).max(axis=1)
    upper = np.linalg.norm(grads, axis=1) / math.sqrt(size)
    if penalty != "sgl" or l1_ratio == 0:
        return upper
    lo, hi = np.zeros(d), upper.copy()
    for _ in range(60):  # ||S(g, a r)|| - a sqrt(|g|) decreases in a: bisect
        mid = (lo + hi) / 2
        shrunk = np.maximum(np.abs(grads) - mid[:, None] * l1_ratio, 0.0)
        above = np.linalg.norm(shrunk, axis=1) > mid * math.sqrt(size)
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return hi


# ----------------------------------------------------------------------------- running it


def check_path_args(owner, alphas, path_multiplier, max_alphas, epochs_per_alpha, refit, keep_weights):
    """Validate the path's own arguments (messages name ``owner``); returns ``alphas`` as an array or ``None``."""
    if alphas is not None:
        try:
            values = np.asarray(alphas, dtype=float)
        except (TypeError, ValueError):
            fail(owner, "alphas", "None or a 1-d increasing sequence of finite numbers >= 0", alphas)
        if (
            values.ndim != 1
            or values.size == 0
            or not np.all(np.isfinite(values))
            or np.any(values < 0)
            or np.any(np.diff(values) <= 0)
        ):
            fail(owner, "alphas", "None or a 1-d increasing sequence of finite numbers >= 0", alphas)
        alphas = values
    if (
        isinstance(path_multiplier, bool)
        or not isinstance(path_multiplier, (int, float, np.integer, np.floating))
        or not math.isfinite(path_multiplier)
        or path_multiplier <= 1
    ):
        fail(owner, "path_multiplier", "a finite number > 1", path_multiplier)
    if isinstance(max_alphas, bool) or not isinstance(max_alphas, (int, np.integer)) or max_alphas < 2:
        fail(owner, "max_alphas", "an integer >= 2", max_alphas)
    if epochs_per_alpha is not None and (
        isinstance(epochs_per_alpha, bool)
        or not isinstance(epochs_per_alpha, (int, np.integer))
        or epochs_per_alpha < 1
    ):
        fail(owner, "epochs_per_alpha", "None or an integer >= 1", epochs_per_alpha)
    for name, value in (("refit", refit), ("keep_weights", keep_weights)):
        if not isinstance(value, bool):
            fail(owner, name, "True or False", value)
    return alphas


def check_validation_pair(owner, validation_data):
    """``validation_data`` as ``(X_val, y_val)``, or ``None``."""
    if validation_data is not None and (
        not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2
    ):
        fail(owner, "validation_data", "None or a pair (X_val, y_val)", validation_data)
    return validation_data


def warn_if_threshold_unreachable(owner, learning_rate, threshold, proximal, stacklevel):
    """Warn when subgradient training moves useless weights by more than ``threshold`` (few features leave)."""
    if not proximal and learning_rate > threshold:
        warnings.warn(
            f"{owner}: learning_rate={learning_rate!r} is larger than threshold="
            f"{threshold!r}; under subgradient training useless weights keep moving by "
            "about the learning rate, so few features fall below the threshold and leave. "
            "Use learning_rate <= threshold or proximal=True.",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def _threshold(weights, threshold):
    return [np.where(np.abs(w) <= threshold, np.zeros((), w.dtype), w) for w in weights]


def run_path(
    owner,
    spec,
    train,
    validation,
    alphas,
    *,
    alpha,
    start_alpha,
    learning_rate,
    threshold,
    epochs,
    epochs_per_alpha,
    init_seed,
    data_seed,
    path_multiplier,
    max_alphas,
    refit,
    keep_weights,
    verbose,
    feature_names=None,
    make_estimator=None,
    stacklevel=1,
):
    """The path on checked arrays: the one loop behind :func:`regularization_path` and the estimators' ``path``.

    Args:
        owner: the name in warnings and errors (``"regularization_path"``,
            ``"GroupSparseMLPClassifier.path"``).
        spec: the training network's :class:`~keras_group_lasso.sklearn._network.Spec`.
        train, validation: ``(x, y)`` pairs, ``x`` float32, ``y`` as the
            network trains on it (class indices, or float ``(n, n_outputs)``).
        alphas: checked strengths (an array), or ``None`` for the automatic grid.
        alpha: strength of the hidden and bias groups at every point.
        start_alpha: the automatic grid's second strength when the dense
            network's gradients give none (all zero).
        learning_rate, threshold, epochs: as the estimators' parameters.
        epochs_per_alpha: passes per point and per refit (an int).
        init_seed, data_seed: from :func:`~keras_group_lasso.sklearn._network.draw_seeds`.
        path_multiplier, max_alphas, refit, keep_weights, verbose: checked path arguments.
        feature_names, make_estimator: carried into the :class:`RegularizationPath`.
        stacklevel: of the ``max_alphas`` warning, counted from the caller of ``run_path``.

    Returns:
        A :class:`RegularizationPath`.
    """
    x_train, y_train = train
    x_val, y_val = validation
    task = spec.task
    threshold = 0.0 if spec.proximal else float(threshold)
    phase_seeds = np.random.default_rng(data_seed)
    refit_seeds = np.random.default_rng((int(data_seed), 1))  # a refit draws none of the path's own
    n_features = spec.n_features
    mask = np.ones(n_features, dtype=bool)
    points = []
    start = time.perf_counter()
    # One scratch model and one training network for the whole path (the strengths are variables
    # the network reads, so no point retraces); the network goes back to the idle ones when the path returns.
    read_sparsity = _network.SparsityReader(spec)
    network = _network.NETWORKS.acquire(spec)

    def score(weights):  # as the estimator's predict computes it
        return float(_network.score_outputs(task, _network.forward(weights, x_val, task), y_val))

    def train_for(passes, alpha_now, losses, seeds=phase_seeds):
        monitor = _network.PassMonitor(network)
        network.train(x_train, y_train, passes, int(seeds.integers(0, 2**31 - 1)), monitor)
        _network.check_finite(
            f"{owner} (alpha={alpha_now:g})", task, learning_rate, monitor, network.get_weights(), passes
        )
        losses += monitor.loss
        return monitor.passes

    try:
        grid = list(alphas) if alphas is not None else [0.0]
        index = 0
        while index < len(grid):
            input_alpha = float(grid[index])
            network.set_alpha(alpha, input_alpha)
            losses = []
            if index == 0:
                network.set_weights(_network.glorot_weights(spec, init_seed))
                network.reset_optimizer(learning_rate)
                network.set_mask(None)
                passes = train_for(epochs, input_alpha, losses)
            else:
                passes = train_for(epochs_per_alpha, input_alpha, losses)
            selected = _threshold(network.get_weights(), threshold)
            # A feature that left stays out: its input is masked, but Adam's
            # momentum can still move its (now useless) row; zero it.
            selected[0][~mask] = 0
            report = read_sparsity(selected, threshold)
            kept = np.zeros(n_features, dtype=bool)
            kept[list(report.selected_features)] = True
            mask &= kept
            # Rows of features that only reach dead units: zeroing them changes nothing computed.
            selected[0][~mask] = 0
            penalized_score = score(selected)
            final, final_report, final_score = selected, report, penalized_score
            if refit and mask.any():
                # The path goes on from the selection step's weights and optimizer state: a refit changes
                # nothing the next points select.
                kept_state = network.optimizer_state()
                network.set_alpha(alpha, 0.0)
                network.set_weights(selected)
                network.set_mask(mask)
                passes += train_for(epochs_per_alpha, input_alpha, losses, refit_seeds)
                final = _threshold(network.get_weights(), threshold)
                final[0][~mask] = 0
                final_report = read_sparsity(final, threshold)
                final_score = score(final)
                network.set_optimizer_state(kept_state)
            network.set_weights(selected)
            network.set_mask(mask)
            points.append(
                PathPoint(
                    alpha=input_alpha,
                    score=final_score,
                    penalized_score=penalized_score,
                    selected_features=tuple(final_report.selected_features),
                    live_neurons=final_report.live_neurons,
                    layer_sizes=tuple(final_report.layer_sizes),
                    n_params=final_report.params_after,
                    sparsity=final_report.sparsity,
                    passes=passes,
                    elapsed_s=time.perf_counter() - start,
                    weights=tuple(final) if keep_weights else None,
                    history={"loss": losses},
                )
            )
            if verbose:
                _network.logger.info(
                    "path point %d: alpha %.4g, %d features, score %.4f",
                    index,
                    input_alpha,
                    points[-1].n_features,
                    final_score,
                )
            if alphas is None:
                if not mask.any():
                    break
                if index == 0:
                    grid.append(_start_alpha(selected, x_train, y_train, spec, start_alpha))
                elif len(grid) >= max_alphas:
                    warnings.warn(
                        f"{owner}: stopped after max_alphas={max_alphas} points with "
                        f"{int(mask.sum())} features still selected; raise max_alphas or path_multiplier.",
                        UserWarning,
                        stacklevel=stacklevel + 1,
                    )
                    break
                else:
                    grid.append(grid[-1] * path_multiplier)
            index += 1
    finally:
        _network.NETWORKS.release(network)

    return RegularizationPath(
        points=tuple(points),
        n_features_in=n_features,
        feature_names=None if feature_names is None else tuple(str(n) for n in feature_names),
        score_name="accuracy" if task == "classification" else "r2",
        refit=refit,
        elapsed_s=time.perf_counter() - start,
        _make_estimator=make_estimator,
    )


def _start_alpha(weights, x, y, spec, fallback, max_samples=1000):
    """``median_j(lambda_j) / 10`` over the features the loss uses (see the module docstring)."""
    rng = np.random.default_rng(0)
    if len(x) > max_samples:
        rows = rng.choice(len(x), size=max_samples, replace=False)
        x, y = x[rows], y[rows]
    strengths = input_group_strengths(weights, x, y, spec.task, spec.penalty, spec.l1_ratio)
    positive = strengths[strengths > 0]
    if positive.size == 0:
        return max(float(fallback), 1e-6)
    return float(np.median(positive)) / 10.0


_FUNCTION_CONSTRAINTS = {
    "task": [StrOptions(set(_network.TASKS))],
    **{
        name: constraint
        for name, constraint in _network.PARAMETER_CONSTRAINTS.items()
        if name not in ("early_stopping", "n_iter_no_change", "tol")  # fit's early stopping: not on the path
    },
}


def regularization_path(
    X,
    y,
    alphas=None,
    *,
    task="classification",
    hidden_layer_sizes=(40, 20),
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
    validation_data=None,
    validation_fraction=0.1,
    path_multiplier=1.2,
    max_alphas=100,
    epochs_per_alpha=None,
    refit=True,
    keep_weights=True,
    random_state=None,
    verbose=0,
):
    """Warm-started fits of a group-sparse MLP along an increasing input-group strength, on arrays.

    scikit-learn's ``enet_path`` for the estimators' network: arrays and the
    estimators' parameters in, a :class:`RegularizationPath` out. Each point
    trains ``epochs_per_alpha`` passes from the previous point's weights with
    the input groups at strength ``alpha_i`` (the other penalties at
    ``alpha``), keeps the features that still reach the output (a feature
    that left stays out), and with ``refit=True`` retrains on those features
    without the input-group penalty before scoring on the validation data.
    The automatic grid starts with a dense fit (``alpha_0 = 0``), continues
    from a strength where nearly all features survive (estimated from the
    dense network's gradients, see :func:`input_group_strengths`) and
    multiplies by ``path_multiplier`` until no feature is left.
    ``GroupSparseMLPClassifier(**params).path(X, y, ...)`` runs the same
    path (same seed, same points) and also rebuilds an estimator from any
    point (:meth:`RegularizationPath.estimator`); this function makes none.
    ``hidden_layer_sizes``, ``alpha``, ``penalty``, ``l1_ratio``,
    ``optimizer``, ``learning_rate``, ``epochs``, ``batch_size``,
    ``threshold``, ``proximal``, ``validation_fraction``, ``random_state``
    and ``verbose`` are as for :class:`GroupSparseMLPClassifier`.

    Args:
        X: float array ``(n_samples, n_features)``.
        y: class labels (``task="classification"``) or targets ``(n_samples,)``
            / ``(n_samples, n_outputs)`` (``"regression"``).
        alphas: increasing input-group strengths (>= 0), or ``None`` for
            the automatic grid. The first point is trained from scratch
            for ``epochs`` passes, the others are warm-started.
        task: ``"classification"`` (softmax, cross-entropy, accuracy) or
            ``"regression"`` (linear, squared error, R²).
        input_alpha: only the automatic grid's fallback second strength, used
            when the dense network's gradients are all zero (``None``: ``alpha``).
        validation_data: ``(X_val, y_val)`` to score the points; ``None``
            holds out ``validation_fraction`` of ``X, y`` (stratified for
            classification).
        path_multiplier: ratio of consecutive strengths of the automatic grid (> 1).
        max_alphas: most points of the automatic grid (>= 2).
        epochs_per_alpha: passes per point (and per refit); ``None``:
            ``max(1, epochs // 4)``.
        refit: retrain each point on its features before scoring it.
        keep_weights: keep each point's weights (``[W1, b1, ..., WL, bL]``).

    Returns:
        A :class:`RegularizationPath`: its arrays ``alphas``, ``scores`` and
        ``n_selected`` go over the points.

    Raises:
        ParameterError: a bad network or training parameter (scikit-learn's
            message form, naming ``regularization_path``).
        InvalidParameterError: a bad argument of the path.
        ValueError: bad data (scikit-learn's checks), a single class, or
            validation labels not seen in ``y``.
        NonFiniteError: the training of a point diverged.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(size=(200, 6))
        >>> y = X[:, 0] - 2 * X[:, 1] ** 2   # only features 0 and 1 matter
        >>> path = regularization_path(X, y, [0.0, 0.005, 0.02], task="regression", hidden_layer_sizes=(16,),
        ...                            learning_rate=1e-2, proximal=True, epochs=60, batch_size=20,
        ...                            random_state=0)
        >>> path.alphas, path.n_selected
        (array([0.   , 0.005, 0.02 ]), array([6, 2, 2]))
        >>> path[-1].selected_features
        (0, 1)
    """
    owner = "regularization_path"
    params = {
        "task": task,
        "hidden_layer_sizes": hidden_layer_sizes,
        "alpha": alpha,
        "input_alpha": input_alpha,
        "penalty": penalty,
        "l1_ratio": l1_ratio,
        "optimizer": optimizer,
        "learning_rate": learning_rate,
        "epochs": epochs,
        "batch_size": batch_size,
        "threshold": threshold,
        "proximal": proximal,
        "validation_fraction": validation_fraction,
        "random_state": random_state,
        "verbose": verbose,
    }
    if not sklearn.get_config().get("skip_parameter_validation", False):
        check_parameters(_FUNCTION_CONSTRAINTS, params, owner)
    hidden = _network.hidden_sizes(hidden_layer_sizes, owner)
    alphas = check_path_args(owner, alphas, path_multiplier, max_alphas, epochs_per_alpha, refit, keep_weights)
    regression = task == "regression"
    X, y = _check_data(X, y, regression)
    if regression:
        y = np.asarray(y, dtype=np.float32).reshape(len(y), -1)
        classes = None
    else:
        check_classification_targets(y)
        classes, y = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"{owner}: argument `y` must contain at least 2 classes; received 1 class ({classes[0]!r}).")
        y = y.astype(np.int32)
    init_seed, data_seed, split_seed = _network.draw_seeds(random_state)
    if check_validation_pair(owner, validation_data) is None:
        x_train, x_val, y_train, y_val = _network.holdout(X, y, validation_fraction, split_seed, task)
    else:
        x_val, y_val = _check_data(*validation_data, regression)
        if x_val.shape[1] != X.shape[1]:
            raise ValueError(
                f"{owner}: argument `validation_data` must have {X.shape[1]} feature(s) like `X`; "
                f"received {x_val.shape[1]}."
            )
        if regression:
            y_val = np.asarray(y_val, dtype=np.float32).reshape(len(y_val), -1)
            if y_val.shape[1] != y.shape[1]:
                raise ValueError(
                    f"{owner}: argument `validation_data` must have {y.shape[1]} target column(s) like `y`; "
                    f"received {y_val.shape[1]}."
                )
        else:
            index = np.clip(np.searchsorted(classes, y_val), 0, len(classes) - 1)
            unknown = classes[index] != y_val
            if np.any(unknown):
                raise ValueError(
                    f"{owner}: argument `validation_data` must have labels seen in `y`; "
                    f"received unknown labels {np.unique(y_val[unknown])[:10]!r}."
                )
            y_val = index.astype(np.int32)
        x_train, y_train = X, y
    warn_if_threshold_unreachable(owner, learning_rate, threshold, proximal, stacklevel=2)
    spec = _network.make_spec(
        task,
        hidden,
        X.shape[1],
        y.shape[1] if regression else len(classes),
        len(x_train),
        penalty=penalty,
        l1_ratio=l1_ratio,
        optimizer=optimizer,
        proximal=proximal,
        batch_size=batch_size,
    )
    return run_path(
        owner,
        spec,
        (x_train, y_train),
        (x_val, y_val),
        alphas,
        alpha=float(alpha),
        start_alpha=alpha if input_alpha is None else input_alpha,
        learning_rate=learning_rate,
        threshold=threshold,
        epochs=epochs,
        epochs_per_alpha=epochs_per_alpha or max(1, epochs // 4),
        init_seed=init_seed,
        data_seed=data_seed,
        path_multiplier=path_multiplier,
        max_alphas=max_alphas,
        refit=refit,
        keep_weights=keep_weights,
        verbose=verbose,
        stacklevel=2,
    )


def _check_data(X, y, regression):
    X, y = check_X_y(X, y, dtype=[np.float64, np.float32], multi_output=regression, y_numeric=regression)
    return np.asarray(X, dtype=np.float32), y

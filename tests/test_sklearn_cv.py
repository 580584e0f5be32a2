"""keras_group_lasso.sklearn: the cross-validated estimators (the input-group strength chosen on the path)."""

import math

import keras
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import get_scorer_names
from sklearn.model_selection import KFold, ShuffleSplit, StratifiedKFold, StratifiedShuffleSplit
from sklearn.utils.estimator_checks import parametrize_with_checks

from keras_group_lasso import InvalidParameterError
from keras_group_lasso.sklearn import (
    GroupSparseMLPClassifier,
    GroupSparseMLPClassifierCV,
    GroupSparseMLPRegressor,
    GroupSparseMLPRegressorCV,
    ParameterError,
    RegularizationPath,
)

# Small and quick (each fit runs two short paths): one strength, one split, no refit.
# threshold = learning_rate, so the path does not warn that useless weights cannot fall below it.
FAST = dict(
    hidden_layer_sizes=(8,),
    epochs=10,
    learning_rate=0.05,
    threshold=0.05,
    alpha=1e-4,
    alphas=[0.0],
    refit=False,
    random_state=0,
)
TWO = dict(FAST, alphas=[0.0, 1e-3], epochs_per_alpha=2, cv=2)


# scikit-learn's API checks exercise the estimator contract, which does not depend on the Keras backend:
# they run once, on JAX (the faster one here); the numeric tests below run on both backends.
API_CHECKS_ONCE = pytest.mark.skipif(keras.backend.backend() != "jax",
                                     reason="scikit-learn's API checks run once, on the JAX backend")


@parametrize_with_checks(
    [
        GroupSparseMLPClassifierCV(**FAST, cv=StratifiedShuffleSplit(1, test_size=0.25, random_state=0)),
        GroupSparseMLPRegressorCV(**FAST, cv=ShuffleSplit(1, test_size=0.25, random_state=0)),
    ]
)
@API_CHECKS_ONCE
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# ----------------------------------------------------------------------------- data


# The cross-validated paths below train hundreds of epochs of small batches: eager PyTorch takes ~10x the time of
# compiled TensorFlow or JAX for them (4 to 5 minutes here). The choice they test is the same numpy on every backend,
# and the estimators train on PyTorch in the tests that stay (and in test_sklearn.py).
COMPILED_BACKENDS = pytest.mark.skipif(keras.backend.backend() == "torch",
                                       reason="long cross-validated paths: on TensorFlow and JAX (eager PyTorch is "
                                              "~10x slower on them; the estimators train on PyTorch elsewhere)")


def _selection_problem(n=600, seed=0):
    """12 uniform columns; the label depends on the first 3 only: ``x0 + x1 - x2 > 0.5``."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, 12)).astype("float32")
    y = (x[:, 0] + x[:, 1] - x[:, 2] > 0.5).astype(int)
    return x, y


@pytest.fixture(scope="module")
def selection_problem():
    return _selection_problem()


# The automatic grid (coarse, for speed), with settings under which the path keeps the three informative features longest.
PATH = dict(
    hidden_layer_sizes=(16,),
    alpha=1e-3,
    epochs=30,
    learning_rate=1e-3,
    threshold=1e-3,
    batch_size=50,
    path_multiplier=2.0,
    epochs_per_alpha=8,
    cv=2,
    tolerance="se",
    random_state=0,
)


@pytest.fixture(scope="module")
def fitted(selection_problem):
    x, y = selection_problem
    return GroupSparseMLPClassifierCV(**PATH).fit(x, y)


# ----------------------------------------------------------------------------- the fit


@COMPILED_BACKENDS
def test_recovers_the_informative_features(fitted, selection_problem):
    x, y = selection_problem
    np.testing.assert_array_equal(fitted.get_support(indices=True), [0, 1, 2])
    assert fitted.transform(x).shape == (len(x), 3)
    assert fitted.score(x, y) > 0.9
    proba = fitted.predict_proba(x)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(fitted.predict(x), fitted.classes_[proba.argmax(axis=1)])


@COMPILED_BACKENDS
def test_alpha_is_a_point_of_the_path_and_the_model_is_that_point(fitted, selection_problem):
    x, _ = selection_problem
    path = fitted.path_
    assert isinstance(path, RegularizationPath)
    n_alphas = len(path)
    assert fitted.alphas_.shape == (n_alphas,) and fitted.n_features_path_.shape == (n_alphas,)
    assert fitted.scores_path_.shape == (n_alphas, 2)
    np.testing.assert_array_equal(fitted.alphas_, path.alphas)
    np.testing.assert_array_equal(fitted.n_features_path_, path.n_selected)
    # The path's scores are the mean held-out scores of the folds.
    np.testing.assert_allclose(path.scores, fitted.scores_path_.mean(axis=1))
    assert fitted.alpha_ in fitted.alphas_
    point = path[fitted.best_index_]
    assert point.alpha == fitted.alpha_
    np.testing.assert_array_equal(fitted.get_support(indices=True), point.selected_features)
    # The fitted model is the chosen point's model, trained on all the data.
    rebuilt = path.estimator(point)
    np.testing.assert_array_equal(fitted.predict_proba(x), rebuilt.predict_proba(x))
    assert fitted.n_features_in_ == 12 and fitted.model_.count_params() > 0


@COMPILED_BACKENDS
def test_the_choice_is_the_one_standard_error_rule(fitted):
    scores = fitted.scores_path_
    means = scores.mean(axis=1)
    top = int(np.argmax(means))
    se = np.std(scores[top], ddof=1) / math.sqrt(scores.shape[1])
    tied = means >= means[top] - se
    chosen = fitted.best_index_
    assert tied[chosen]
    assert fitted.n_features_path_[chosen] == fitted.n_features_path_[tied].min()


@COMPILED_BACKENDS
def test_max_features_is_respected(selection_problem):
    x, y = selection_problem
    params = dict(PATH, learning_rate=3e-3, threshold=1e-2, alphas=[0.0, 0.03, 0.06], max_features=5)
    est = GroupSparseMLPClassifierCV(**params).fit(x, y)
    assert est.n_features_path_[est.best_index_] <= 5
    assert 0 < est.get_support().sum() <= 5
    assert est.n_features_path_[0] > 5  # the constraint did bind


@pytest.mark.parametrize(
    "cv, n_folds",
    [
        (4, 4),
        (KFold(2, shuffle=True, random_state=0), 2),
        (list(StratifiedKFold(3).split(np.zeros((600, 1)), _selection_problem()[1])), 3),
    ],
)
def test_cv_int_splitter_or_splits(cv, n_folds, selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifierCV(**dict(TWO, cv=cv)).fit(x, y)
    assert est.scores_path_.shape == (2, n_folds)
    assert np.all((est.scores_path_ >= 0) & (est.scores_path_ <= 1))
    assert est.alpha_ in (0.0, 1e-3)


def test_scoring_by_a_scorer_name(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifierCV(**dict(TWO, scoring="neg_log_loss")).fit(x, y)
    assert np.all(est.scores_path_ < 0)  # minus the held-out cross-entropy
    assert est.path_.score_name == "neg_log_loss"
    np.testing.assert_allclose(est.path_.scores, est.scores_path_.mean(axis=1))


def test_regressor_with_two_targets(rng):
    x = rng.uniform(size=(300, 6))
    y = np.stack([x[:, 0] - x[:, 1], x[:, 1] ** 2], axis=1)
    est = GroupSparseMLPRegressorCV(**dict(TWO, learning_rate=1e-2, threshold=1e-2, epochs=30)).fit(x, y)
    assert est.predict(x).shape == (300, 2)
    assert est.scores_path_.shape == (2, 2)
    assert est.score(x, y) > 0.5


def test_path_method_uses_the_estimators_path_settings(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifierCV(**TWO)
    path = est.path(x, y)
    np.testing.assert_array_equal(path.alphas, TWO["alphas"])
    assert isinstance(path.estimator(-1), GroupSparseMLPClassifier)
    assert not hasattr(est, "alpha_")  # path() does not fit


def test_get_params_and_clone():
    est = GroupSparseMLPClassifierCV(cv=5, max_features=3, tolerance="se")
    params = est.get_params()
    assert params["cv"] == 5 and params["max_features"] == 3 and params["tolerance"] == "se"
    assert "input_alpha" not in params  # that is what the estimator chooses
    assert clone(est).get_params() == params


# ----------------------------------------------------------------------------- bad arguments

NAME = "GroupSparseMLPClassifierCV"
_SCORERS = ", ".join(repr(name) for name in sorted(get_scorer_names()))


@pytest.mark.parametrize(
    "params, message",
    [
        ({"cv": "five"}, f"The 'cv' parameter of {NAME} must be an int in the range [2, inf), an object implementing 'split' and 'get_n_splits', an iterable or None. Got 'five' instead."),
        ({"cv": 1}, f"The 'cv' parameter of {NAME} must be an int in the range [2, inf), an object implementing 'split' and 'get_n_splits', an iterable or None. Got 1 instead."),
        ({"max_features": -1}, f"The 'max_features' parameter of {NAME} must be an int in the range [0, inf) or None. Got -1 instead."),
        ({"tolerance": "sd"}, f"The 'tolerance' parameter of {NAME} must be a float in the range [0.0, inf) or a str among {{'se'}}. Got 'sd' instead."),
        ({"tolerance": -0.1}, f"The 'tolerance' parameter of {NAME} must be a float in the range [0.0, inf) or a str among {{'se'}}. Got -0.1 instead."),
        ({"path_multiplier": 1.0}, f"The 'path_multiplier' parameter of {NAME} must be a float in the range (1.0, inf). Got 1.0 instead."),
        ({"max_alphas": 1}, f"The 'max_alphas' parameter of {NAME} must be an int in the range [2, inf). Got 1 instead."),
        ({"epochs_per_alpha": 0}, f"The 'epochs_per_alpha' parameter of {NAME} must be an int in the range [1, inf) or None. Got 0 instead."),
        ({"refit": 1}, f"The 'refit' parameter of {NAME} must be an instance of 'bool' or an instance of 'numpy.bool'. Got 1 instead."),
        ({"scoring": "closeness"}, f"The 'scoring' parameter of {NAME} must be a str among {{{_SCORERS}}}, a callable or None. Got 'closeness' instead."),
        ({"scoring": 3}, f"The 'scoring' parameter of {NAME} must be a str among {{{_SCORERS}}}, a callable or None. Got 3 instead."),
        ({"alphas": 0.5}, f"The 'alphas' parameter of {NAME} must be an array-like or None. Got 0.5 instead."),
        ({"alphas": "0.1"}, f"The 'alphas' parameter of {NAME} must be an array-like or None. Got '0.1' instead."),
        ({"cv": 2.0}, f"The 'cv' parameter of {NAME} must be an int in the range [2, inf), an object implementing 'split' and 'get_n_splits', an iterable or None. Got 2.0 instead."),
        ({"max_features": 2.5}, f"The 'max_features' parameter of {NAME} must be an int in the range [0, inf) or None. Got 2.5 instead."),
        ({"path_multiplier": float("inf")}, f"The 'path_multiplier' parameter of {NAME} must be a float in the range (1.0, inf). Got inf instead."),
        ({"proximal": None}, f"The 'proximal' parameter of {NAME} must be an instance of 'bool' or an instance of 'numpy.bool'. Got None instead."),
        ({"random_state": 1.5}, f"The 'random_state' parameter of {NAME} must be an int in the range [0, 4294967295], an instance of 'numpy.random.mtrand.RandomState' or None. Got 1.5 instead."),
        ({"verbose": None}, f"The 'verbose' parameter of {NAME} must be an int in the range [0, inf), an instance of 'bool' or an instance of 'numpy.bool'. Got None instead."),
        ({"alphas": [0.1, 0.01]}, f"The 'alphas' parameter of {NAME} must be None or a 1-d increasing sequence of finite numbers >= 0. Got [0.1, 0.01] instead."),
        ({"alphas": [-1.0]}, f"The 'alphas' parameter of {NAME} must be None or a 1-d increasing sequence of finite numbers >= 0. Got [-1.0] instead."),
        ({"alpha": -1.0}, f"The 'alpha' parameter of {NAME} must be a float in the range [0.0, inf). Got -1.0 instead."),
        ({"hidden_layer_sizes": (4, 0)}, f"The 'hidden_layer_sizes' parameter of {NAME} must be an int >= 1 or a sequence of ints >= 1. Got (4, 0) instead."),
    ],
)
def test_bad_parameters_fail_at_fit_with_sklearn_messages(params, message):
    est = GroupSparseMLPClassifierCV(**params)  # __init__ only stores
    with pytest.raises(ParameterError) as info:
        est.fit(np.zeros((6, 2)), [0, 1, 0, 1, 0, 1])
    assert str(info.value) == message
    # The package's error type, and what scikit-learn users catch (ValueError / TypeError).
    assert isinstance(info.value, InvalidParameterError)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    with pytest.raises(ParameterError) as info:
        GroupSparseMLPRegressorCV(**params).fit(np.zeros((6, 2)), [0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    assert str(info.value) == message.replace(NAME, "GroupSparseMLPRegressorCV")


@pytest.mark.parametrize("cls", [GroupSparseMLPClassifierCV, GroupSparseMLPRegressorCV])
def test_every_parameter_is_declared_and_checked(cls):
    est = cls()
    params = est.get_params(deep=False)
    assert set(cls._constraints) == set(params)
    bad = type("BadType", (), {})()
    y = [0, 1, 0, 1, 0, 1]
    for name in params:
        with pytest.raises(ParameterError, match=rf"^The '{name}' parameter of {cls.__name__} must be .* Got <.*BadType"):
            clone(est).set_params(**{name: bad}).fit(np.zeros((6, 2)), y)


@pytest.mark.parametrize(
    "params",
    [
        {"cv": KFold(2), "scoring": "accuracy", "tolerance": "se", "max_features": 0, "alphas": (0.0, 0.1)},
        {"cv": [([0, 1, 2], [3, 4, 5])], "scoring": len, "tolerance": 1, "epochs_per_alpha": 2, "alphas": np.array([0.1])},
        {"cv": None, "scoring": None, "path_multiplier": 1.5, "max_alphas": np.int64(2), "refit": np.bool_(False)},
    ],
)
def test_good_parameters_pass_the_checks(params):
    assert isinstance(GroupSparseMLPClassifierCV(**params)._check_params(), tuple)


def test_estimator_constraints_are_the_base_ones_without_early_stopping():
    base = GroupSparseMLPRegressor._constraints
    cv = GroupSparseMLPRegressorCV._constraints
    assert {k: cv[k] for k in cv if k in base} == {
        k: v for k, v in base.items() if k not in ("input_alpha", "early_stopping", "validation_fraction", "n_iter_no_change", "tol")
    }


def test_max_features_below_the_path_is_an_error(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifierCV(**dict(TWO, max_features=0))
    with pytest.raises(ParameterError) as info:
        est.fit(x, y)
    smallest = int(str(info.value).split("(")[1].split(")")[0])
    assert smallest > 0
    assert str(info.value) == (
        f"The 'max_features' parameter of {NAME} must be at least the smallest number of features on the "
        f"path ({smallest}). Got 0 instead."
    )


def test_one_class_is_refused_in_the_estimators_name():
    est = GroupSparseMLPClassifierCV(**TWO)
    with pytest.raises(ValueError) as info:
        est.fit(np.zeros((6, 2)), [3] * 6)
    assert str(info.value) == f"{NAME}: argument `y` must contain at least 2 classes; received 1 class (np.int64(3))."
    with pytest.raises(NotFittedError):  # a failed fit leaves nothing behind
        est.predict(np.zeros((6, 2)))


def test_every_fold_takes_as_many_steps_per_point_as_the_all_data_path():
    from keras_group_lasso.sklearn._cv import fold_passes

    for n, n_train, batch, passes in ((300, 200, 50, 20), (150, 100, 200, 20), (250, 200, 200, 8), (7, 3, 2, 5)):
        steps = passes * -(-n // batch)
        fold = fold_passes(passes, n, n_train, batch)
        per_pass = -(-n_train // batch)
        assert abs(fold * per_pass - steps) <= per_pass / 2 and fold >= 1


def test_a_fold_without_a_class_is_named_as_the_cross_validation_s_error():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(30, 4))
    y = np.array([0] * 15 + [1] * 14 + [2])  # class 2 has one member: some training part lacks it
    clf = GroupSparseMLPClassifierCV(**dict(FAST, cv=KFold(3)))
    with pytest.raises(ValueError, match=r"^GroupSparseMLPClassifierCV: the training part of fold 3 of cv=KFold\("
                                         r".*\) has no sample of class 2 "):
        clf.fit(X, y)
    with pytest.raises(NotFittedError):
        clf.predict(X)

"""keras_group_lasso.sklearn: scikit-learn conventions, feature selection, the regularization path."""

import dataclasses
import logging
import math
import re

import keras
import numpy as np
import pytest
import sklearn
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.datasets import make_regression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from keras_group_lasso import InvalidParameterError, NonFiniteError, sparsity_report
from keras_group_lasso.sklearn import (
    GroupSparseMLPClassifier,
    GroupSparseMLPRegressor,
    ParameterError,
    PathPoint,
    RegularizationPath,
    input_group_strengths,
    regularization_path,
)
from keras_group_lasso.sklearn import _network

# Small and quick, yet able to pass scikit-learn's accuracy checks (> 0.83 on blobs).
FAST = dict(hidden_layer_sizes=(8,), epochs=10, learning_rate=0.05, alpha=1e-4, random_state=0)

# Checks expected to fail, and why (scikit-learn >= 1.6 reads this dict).
EXPECTED_FAILED_CHECKS = {}


# scikit-learn's API checks exercise the estimator contract, which does not depend on the Keras backend:
# they run once, on JAX (the faster one here); the numeric tests below run on both backends.
API_CHECKS_ONCE = pytest.mark.skipif(keras.backend.backend() != "jax",
                                     reason="scikit-learn's API checks run once, on the JAX backend")


@parametrize_with_checks(
    [GroupSparseMLPClassifier(**FAST), GroupSparseMLPRegressor(**FAST)],
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS,
)
@API_CHECKS_ONCE
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# ----------------------------------------------------------------------------- data


def _selection_problem(n=600, seed=0):
    """12 uniform columns; the label depends on the first 3 only: ``x0 + x1 - x2 > 0.5``."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, 12)).astype("float32")
    y = (x[:, 0] + x[:, 1] - x[:, 2] > 0.5).astype(int)
    return x, y


@pytest.fixture(scope="module")
def selection_problem():
    return _selection_problem()


@pytest.fixture(scope="module")
def fitted(selection_problem):
    """Proximal training: exact zeros, so the noise columns leave for sure."""
    x, y = selection_problem
    est = GroupSparseMLPClassifier(
        hidden_layer_sizes=(16,), alpha=1e-2, epochs=100, learning_rate=3e-3, batch_size=50, proximal=True, random_state=0
    )
    return est.fit(x, y)


@pytest.fixture(scope="module")
def fitted_subgradient(selection_problem):
    x, y = selection_problem
    return GroupSparseMLPClassifier(**dict(FAST, epochs=30)).fit(x, y)


# ----------------------------------------------------------------------------- parameters


NAME = "GroupSparseMLPClassifier"
_BOOLEAN = "an instance of 'bool' or an instance of 'numpy.bool'"


@pytest.mark.quick
@pytest.mark.parametrize(
    "params, message",
    [
        # Interval of floats, closed at 0
        ({"alpha": -1.0}, f"The 'alpha' parameter of {NAME} must be a float in the range [0.0, inf). Got -1.0 instead."),
        ({"alpha": float("nan")}, f"The 'alpha' parameter of {NAME} must be a float in the range [0.0, inf). Got nan instead."),
        ({"alpha": float("inf")}, f"The 'alpha' parameter of {NAME} must be a float in the range [0.0, inf). Got inf instead."),
        ({"alpha": "0.1"}, f"The 'alpha' parameter of {NAME} must be a float in the range [0.0, inf). Got '0.1' instead."),
        ({"l1_ratio": -0.5}, f"The 'l1_ratio' parameter of {NAME} must be a float in the range [0.0, inf). Got -0.5 instead."),
        ({"threshold": -1e-3}, f"The 'threshold' parameter of {NAME} must be a float in the range [0.0, inf). Got -0.001 instead."),
        ({"tol": -1}, f"The 'tol' parameter of {NAME} must be a float in the range [0.0, inf). Got -1 instead."),
        # ... or None
        ({"input_alpha": -1}, f"The 'input_alpha' parameter of {NAME} must be a float in the range [0.0, inf) or None. Got -1 instead."),
        # string options
        ({"penalty": "elastic"}, f"The 'penalty' parameter of {NAME} must be a str among {{'group', 'l1', 'l2', 'sgl'}}. Got 'elastic' instead."),
        ({"optimizer": "lbfgs"}, f"The 'optimizer' parameter of {NAME} must be a str among {{'adam', 'sgd'}}. Got 'lbfgs' instead."),
        ({"optimizer": None}, f"The 'optimizer' parameter of {NAME} must be a str among {{'adam', 'sgd'}}. Got None instead."),
        # interval of ints
        ({"epochs": 0}, f"The 'epochs' parameter of {NAME} must be an int in the range [1, inf). Got 0 instead."),
        ({"epochs": 10.0}, f"The 'epochs' parameter of {NAME} must be an int in the range [1, inf). Got 10.0 instead."),
        ({"n_iter_no_change": 0}, f"The 'n_iter_no_change' parameter of {NAME} must be an int in the range [1, inf). Got 0 instead."),
        # open intervals
        ({"learning_rate": 0}, f"The 'learning_rate' parameter of {NAME} must be a float in the range (0.0, inf). Got 0 instead."),
        ({"validation_fraction": 1.0}, f"The 'validation_fraction' parameter of {NAME} must be a float in the range (0.0, 1.0). Got 1.0 instead."),
        ({"validation_fraction": 0}, f"The 'validation_fraction' parameter of {NAME} must be a float in the range (0.0, 1.0). Got 0 instead."),
        # a string option or an int
        ({"batch_size": "big"}, f"The 'batch_size' parameter of {NAME} must be a str among {{'auto'}} or an int in the range [1, inf). Got 'big' instead."),
        ({"batch_size": 0}, f"The 'batch_size' parameter of {NAME} must be a str among {{'auto'}} or an int in the range [1, inf). Got 0 instead."),
        # "boolean"
        ({"proximal": "yes"}, f"The 'proximal' parameter of {NAME} must be {_BOOLEAN}. Got 'yes' instead."),
        ({"early_stopping": 1}, f"The 'early_stopping' parameter of {NAME} must be {_BOOLEAN}. Got 1 instead."),
        # "random_state"
        ({"random_state": -1}, f"The 'random_state' parameter of {NAME} must be an int in the range [0, 4294967295], an instance of 'numpy.random.mtrand.RandomState' or None. Got -1 instead."),
        ({"random_state": "seed"}, f"The 'random_state' parameter of {NAME} must be an int in the range [0, 4294967295], an instance of 'numpy.random.mtrand.RandomState' or None. Got 'seed' instead."),
        # "verbose"
        ({"verbose": -1}, f"The 'verbose' parameter of {NAME} must be an int in the range [0, inf), {_BOOLEAN}. Got -1 instead."),
        ({"verbose": "loud"}, f"The 'verbose' parameter of {NAME} must be an int in the range [0, inf), {_BOOLEAN}. Got 'loud' instead."),
        # "array-like" or an int, then the estimator's own check of the sizes
        ({"hidden_layer_sizes": "16"}, f"The 'hidden_layer_sizes' parameter of {NAME} must be an array-like or an int in the range [1, inf). Got '16' instead."),
        ({"hidden_layer_sizes": 0}, f"The 'hidden_layer_sizes' parameter of {NAME} must be an array-like or an int in the range [1, inf). Got 0 instead."),
        ({"hidden_layer_sizes": (4, 0)}, f"The 'hidden_layer_sizes' parameter of {NAME} must be an int >= 1 or a sequence of ints >= 1. Got (4, 0) instead."),
        ({"hidden_layer_sizes": (4, 2.5)}, f"The 'hidden_layer_sizes' parameter of {NAME} must be an int >= 1 or a sequence of ints >= 1. Got (4, 2.5) instead."),
    ],
)
def test_bad_parameters_fail_at_fit_with_sklearn_messages(params, message):
    est = GroupSparseMLPClassifier(**params)  # __init__ only stores
    assert est.get_params()[next(iter(params))] is next(iter(params.values()))
    with pytest.raises(ParameterError) as info:
        est.fit(np.zeros((4, 2)), [0, 1, 0, 1])
    assert str(info.value) == message
    # The package's error type, and what scikit-learn users catch (ValueError / TypeError).
    assert isinstance(info.value, InvalidParameterError)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    with pytest.raises(ParameterError) as info:
        GroupSparseMLPRegressor(**params).fit(np.zeros((4, 2)), [0.0, 1.0, 0.0, 1.0])
    assert str(info.value) == message.replace(NAME, "GroupSparseMLPRegressor")


@pytest.mark.parametrize("cls", [GroupSparseMLPClassifier, GroupSparseMLPRegressor])
def test_every_parameter_is_declared_and_checked(cls):
    est = cls()
    params = est.get_params(deep=False)
    assert set(cls._constraints) == set(params)
    bad = type("BadType", (), {})()
    for name in params:
        with pytest.raises(ParameterError, match=rf"^The '{name}' parameter of {cls.__name__} must be .* Got <.*BadType"):
            clone(est).set_params(**{name: bad}).fit(np.zeros((4, 2)), [0, 1, 0, 1])


@pytest.mark.parametrize(
    "params",
    [
        {"alpha": np.float32(0.5), "l1_ratio": 0, "threshold": np.float64(0.0), "tol": 1, "input_alpha": None},
        {"epochs": np.int64(3), "batch_size": 20, "n_iter_no_change": np.int32(2), "hidden_layer_sizes": 3},
        {"hidden_layer_sizes": np.array([4, 2]), "validation_fraction": 0.5, "learning_rate": 1},
        {"proximal": np.bool_(True), "early_stopping": False, "verbose": True, "random_state": np.random.RandomState(0)},
        {"random_state": 2**32 - 1, "verbose": np.int64(0), "hidden_layer_sizes": []},
    ],
)
def test_good_parameters_pass_the_checks(params):
    assert isinstance(GroupSparseMLPClassifier(**params)._check_params(), tuple)


def test_skip_parameter_validation_skips_the_declared_checks(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifier(**dict(FAST, epochs=1, tol=-1.0))  # tol is unused without early stopping
    with pytest.raises(ParameterError, match="The 'tol' parameter"):
        est.fit(x, y)
    with sklearn.config_context(skip_parameter_validation=True):
        assert est.fit(x, y).n_iter_ == 1


def test_one_class_is_refused():
    with pytest.raises(ValueError) as info:
        GroupSparseMLPClassifier(**FAST).fit(np.zeros((4, 2)), [3, 3, 3, 3])
    assert str(info.value) == (
        "GroupSparseMLPClassifier: argument `y` must contain at least 2 classes; received 1 class (np.int64(3))."
    )


def _diverging_problem():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4))
    y = x[:, 0] + 0.1 * rng.normal(size=60)
    x_huge = x.copy()
    x_huge[:, 1] *= 1e30  # a feature in other units: the first pass overflows
    return x, x_huge, y


def _diverged_message(owner, passes, targets=" and large targets"):
    return (
        re.escape(f"{owner}: the training diverged: the loss became ")
        + rf"(nan|inf) at pass \d+ of {passes} \(training stopped there\)( and the weights are not finite \(.+\))?"
        + re.escape(
            f". The input data may contain large values and need to be preprocessed: scale the features{targets}, "
            "e.g. with sklearn.preprocessing.StandardScaler in a pipeline, or lower learning_rate (now 0.001)."
        )
        + "$"
    )


@pytest.mark.parametrize("early_stopping", [False, True])
def test_divergence_is_an_error_that_names_the_cause(early_stopping):
    x, x_huge, y = _diverging_problem()
    est = GroupSparseMLPRegressor(hidden_layer_sizes=(5,), epochs=5, random_state=0, early_stopping=early_stopping)
    with pytest.raises(NonFiniteError, match=_diverged_message("GroupSparseMLPRegressor.fit", 5)):
        est.fit(x_huge, y)
    # scikit-learn's MLP raises a ValueError here too; the estimator is left unfitted.
    with pytest.raises(ValueError):
        est.fit(x_huge, y)
    with pytest.raises(NotFittedError):
        est.predict(x)
    # The fix the message gives works, with the same (cached) network.
    fitted = make_pipeline(StandardScaler(), est).fit(x_huge, y)
    assert np.isfinite(est.loss_) and np.all(np.isfinite(fitted.predict(x_huge)))


def test_divergence_of_a_classifier_is_an_error():
    x, _, y = _diverging_problem()
    # Softmax cross-entropy survives 1e30 on JAX (saturated, finite gradients); near float32's largest
    # value the first layer overflows on every backend.
    x_huge = x.copy()
    x_huge[:, 1:] = np.sign(x[:, 1:]) * 3e38
    est = GroupSparseMLPClassifier(hidden_layer_sizes=(5,), epochs=5, random_state=0)
    with pytest.raises(NonFiniteError, match=_diverged_message("GroupSparseMLPClassifier.fit", 5, targets="")):
        est.fit(x_huge, (y > 0).astype(int))
    assert not hasattr(est, "coefs_") and not hasattr(est, "classes_")


def test_divergence_on_the_path_is_an_error():
    _, x_huge, y = _diverging_problem()
    est = GroupSparseMLPRegressor(hidden_layer_sizes=(5,), epochs=5, random_state=0)
    with pytest.raises(NonFiniteError, match=_diverged_message("GroupSparseMLPRegressor.path (alpha=0)", 5)):
        est.path(x_huge, y, alphas=[0.0, 0.01], epochs_per_alpha=1)


@pytest.mark.quick
def test_batch_larger_than_data_repeats_rows():
    x, y = _selection_problem(n=40)
    est = GroupSparseMLPClassifier(**FAST).fit(x, y)  # batch_size "auto": 200 rows a step
    assert est._fitted_spec.batch_size == 200 and est._fitted_spec.steps_per_pass == 1
    assert est.n_iter_ == FAST["epochs"]
    rows = next(_network._index_batches(40, 200, seed=0))
    # 5 consecutive permutations: every row exactly 5 times in the step
    assert len(rows) == 200 and set(np.bincount(rows, minlength=40)) == {5}


@pytest.mark.quick
def test_get_set_params_and_clone():
    est = GroupSparseMLPClassifier(alpha=0.5, penalty="group")
    assert est.get_params()["alpha"] == 0.5
    est.set_params(alpha=0.25, hidden_layer_sizes=(3,))
    twin = clone(est)
    assert twin.get_params() == est.get_params() and twin is not est


# ----------------------------------------------------------------------------- fitting and selection


def test_noise_features_are_dropped(fitted, selection_problem):
    x, y = selection_problem
    support = fitted.get_support()
    np.testing.assert_array_equal(support, [True] * 3 + [False] * 9)
    assert fitted.score(x, y) > 0.95
    np.testing.assert_array_equal(fitted.transform(x), x[:, support])
    np.testing.assert_array_equal(fitted.get_support(indices=True), [0, 1, 2])
    # Proximal: the dropped input groups are exact zeros (no threshold needed).
    assert np.all(fitted.coefs_[0][3:] == 0) and np.all(np.any(fitted.coefs_[0][:3] != 0, axis=1))


def test_fitted_attributes(fitted_subgradient):
    est = fitted_subgradient
    assert est.n_features_in_ == 12
    np.testing.assert_array_equal(est.classes_, [0, 1])
    assert len(est.history_["loss"]) == est.n_iter_ == 30
    assert est.loss_ == est.history_["loss"][-1]
    assert [w.shape for w in est.coefs_] == [(12, 8), (8, 2)]
    # Thresholded like apply_threshold: no weight is non-zero but <= threshold.
    for w in est.coefs_ + est.intercepts_:
        assert not np.any((w != 0) & (np.abs(w) <= est.threshold))
    assert est.sparsity_report_.selected_features == tuple(np.flatnonzero(est.support_))


def test_predict_proba_matches_the_keras_model(fitted, selection_problem):
    x, _ = selection_problem
    model = fitted.model_
    assert model is fitted.model_  # built once
    keras_proba = keras.ops.convert_to_numpy(model(x, training=False))
    np.testing.assert_allclose(fitted.predict_proba(x), keras_proba, atol=1e-5)
    np.testing.assert_allclose(fitted.predict_proba(x).sum(axis=1), 1.0, atol=1e-12)
    assert sparsity_report(model).selected_features == fitted.sparsity_report_.selected_features
    np.testing.assert_array_equal(fitted.predict(x), fitted.classes_[fitted.predict_proba(x).argmax(axis=1)])


def test_pruned_model_is_smaller_and_equal(fitted, selection_problem):
    x, _ = selection_problem
    pruned = fitted.pruned_model_
    assert pruned.count_params() < fitted.model_.count_params()
    assert tuple(pruned.kept_features) == tuple(np.flatnonzero(fitted.support_))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(pruned(x, training=False)), fitted.predict_proba(x), atol=1e-5
    )


def test_model_saves_and_loads(fitted, selection_problem, tmp_path):
    x, _ = selection_problem
    import warnings

    path = tmp_path / "model.keras"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. an optimizer saved unbuilt, loaded built
        fitted.model_.save(path)
        loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), fitted.predict_proba(x), atol=1e-6)


def test_same_seed_same_model_reused_network_or_not(selection_problem):
    x, y = selection_problem
    params = dict(FAST, epochs=3)
    a = GroupSparseMLPClassifier(**params).fit(x, y)
    b = GroupSparseMLPClassifier(**params).fit(x, y)  # reuses the idle training network
    _network.NETWORKS.clear()
    c = GroupSparseMLPClassifier(**params).fit(x, y)  # a freshly compiled one
    d = GroupSparseMLPClassifier(**dict(params, random_state=1)).fit(x, y)
    for w_a, w_b, w_c in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_, c.coefs_ + c.intercepts_):
        np.testing.assert_array_equal(w_a, w_b)
        np.testing.assert_array_equal(w_a, w_c)
    assert not np.array_equal(a.coefs_[0], d.coefs_[0])


def _count_networks(monkeypatch):
    built = []
    original = _network.Network.__init__
    monkeypatch.setattr(_network.Network, "__init__", lambda self, spec: (built.append(spec), original(self, spec))[1])
    return built


def test_alpha_changes_without_a_new_network(selection_problem, monkeypatch):
    x, y = selection_problem
    GroupSparseMLPClassifier(**FAST).fit(x, y)
    built = _count_networks(monkeypatch)
    weak = GroupSparseMLPClassifier(**dict(FAST, alpha=0.0)).fit(x, y)
    strong = GroupSparseMLPClassifier(**dict(FAST, alpha=0.05, learning_rate=0.01)).fit(x, y)
    assert built == []  # same shapes: the idle compiled network is reused, alpha is a variable
    assert np.linalg.norm(strong.coefs_[0]) < 0.5 * np.linalg.norm(weak.coefs_[0])
    # Along a path the strengths are variables of one network: every point trains it, none builds another.
    path = GroupSparseMLPClassifier(**dict(FAST, threshold=0.05)).path(x, y, [0.0, 0.01, 0.03], validation_data=(x, y))
    assert len(path) == 3 and len(built) == 0


def test_proximal_strength_changes_without_a_new_network(selection_problem, monkeypatch):
    # Under proximal training the strengths are the multiplier Proximal reads: a reused network trained at
    # another strength gives the same model as a fresh one, and a path compiles once.
    x, y = selection_problem
    params = dict(FAST, proximal=True, alpha=0.02, learning_rate=0.01)
    _network.NETWORKS.clear()
    fresh = GroupSparseMLPClassifier(**params).fit(x, y)
    built = _count_networks(monkeypatch)
    weak = GroupSparseMLPClassifier(**dict(params, alpha=0.0)).fit(x, y)
    again = GroupSparseMLPClassifier(**params).fit(x, y)
    path = GroupSparseMLPClassifier(**params).path(x, y, [0.0, 0.01, 0.03], validation_data=(x, y))
    assert built == []
    for w_fresh, w_again in zip(fresh.coefs_ + fresh.intercepts_, again.coefs_ + again.intercepts_):
        np.testing.assert_array_equal(w_fresh, w_again)
    assert np.sum(fresh.coefs_[0] == 0) > np.sum(weak.coefs_[0] == 0) + 10
    assert [point.n_features for point in path] == sorted((point.n_features for point in path), reverse=True)
    assert path[0].n_features > path[-1].n_features


@pytest.mark.parametrize("penalty", ["sgl", "group", "l1", "l2"])
def test_layer_penalties(penalty):
    from keras_group_lasso.regularizers import GroupSparseRegularizer

    first, first_bias = _network.layer_penalties(penalty, 0.01, 0.5, 0, input_alpha=0.03)
    second, second_bias = _network.layer_penalties(penalty, 0.01, 0.5, 1, input_alpha=0.03)
    if penalty in ("l1", "l2"):
        assert first.get_config() == {penalty: pytest.approx(0.03)}
        assert second.get_config() == first_bias.get_config() == {penalty: pytest.approx(0.01)}
        return
    ratio = 0.5 if penalty == "sgl" else 0.0
    assert isinstance(first, GroupSparseRegularizer) and isinstance(second, GroupSparseRegularizer)
    assert (first.role, first.factor, first.l1) == ("input", pytest.approx(0.03), pytest.approx(0.03 * ratio))
    assert (second.role, second.factor, second.l1) == ("hidden", pytest.approx(0.01), pytest.approx(0.01 * ratio))
    assert (second_bias.factor, second_bias.l1) == (pytest.approx(0.01), pytest.approx(0.01 * ratio))


def test_keras_model_carries_the_fitted_penalties(fitted):
    first, second = fitted.model_.layers[0], fitted.model_.layers[1]
    assert first.kernel_regularizer == _network.layer_penalties("sgl", 1e-2, 1.0, 0)[0]
    assert second.kernel_regularizer == _network.layer_penalties("sgl", 1e-2, 1.0, 1)[0]


def test_early_stopping_stops_and_records_scores(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifier(
        **dict(FAST, epochs=200, early_stopping=True, n_iter_no_change=3, tol=1.0)
    ).fit(x, y)
    assert est.n_iter_ == 4  # the first pass sets the best score; no later one can gain 1.0
    assert len(est.history_["val_score"]) == len(est.history_["loss"]) == 4


def test_verbose_logs_one_line_per_pass(selection_problem, caplog):
    x, y = selection_problem
    with caplog.at_level(logging.INFO, logger="keras_group_lasso.sklearn"):
        GroupSparseMLPClassifier(**dict(FAST, epochs=3, verbose=1)).fit(x, y)
    lines = [r.getMessage() for r in caplog.records if r.name == "keras_group_lasso.sklearn"]
    assert len(lines) == 3 and lines[0].startswith("pass 1: loss ")


def test_regressor_shapes_and_selection():
    x, y = make_regression(n_samples=300, n_features=8, n_informative=3, shuffle=False, noise=0.1, random_state=0)
    y = (y - y.mean()) / y.std()
    reg = GroupSparseMLPRegressor(
        hidden_layer_sizes=(16,), alpha=1e-2, epochs=100, learning_rate=3e-3, batch_size=50, proximal=True, random_state=0
    )
    reg.fit(x, y)
    assert reg.predict(x).shape == (300,)
    assert reg.score(x, y) > 0.9
    np.testing.assert_array_equal(reg.get_support(), [True] * 3 + [False] * 5)
    assert reg.n_outputs_ == 1  # (several outputs: scikit-learn's check_regressor_multioutput above)


def test_pipeline_and_grid_search(selection_problem):
    x, y = selection_problem
    pipe = make_pipeline(MinMaxScaler(), GroupSparseMLPClassifier(**FAST))
    search = GridSearchCV(pipe, {"groupsparsemlpclassifier__alpha": [1e-4, 1e-1]}, cv=2).fit(x, y)
    assert search.best_params_ == {"groupsparsemlpclassifier__alpha": 1e-4}
    assert search.score(x, y) > 0.8
    assert search.best_estimator_[-1].transform(x).shape[1] == search.best_estimator_[-1].support_.sum()


def test_dataframe_feature_names(selection_problem):
    pd = pytest.importorskip("pandas")
    x, y = selection_problem
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    est = GroupSparseMLPClassifier(**FAST).fit(frame, y)
    np.testing.assert_array_equal(est.feature_names_in_, frame.columns)
    np.testing.assert_array_equal(est.get_feature_names_out(), frame.columns[est.support_])


def test_pickle_round_trip(fitted, selection_problem):
    import pickle

    x, _ = selection_problem
    fitted.model_  # noqa: B018 - built and then dropped by pickling
    again = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(again.predict_proba(x), fitted.predict_proba(x))
    np.testing.assert_array_equal(again.support_, fitted.support_)


# ----------------------------------------------------------------------------- the gradient estimate


def _numeric_group_gradient(weights, x, y, j, task, eps=1e-6):
    """Central differences of the mean loss w.r.t. W1[j, :] at W1[j, :] = 0."""
    weights = [w.astype(np.float64).copy() for w in weights]
    weights[0][j] = 0.0

    def loss(w):
        out = _network.forward(w, x, task)
        if task == "classification":
            return -np.mean(np.log(out[np.arange(len(y)), y]))
        return np.mean((out - y.reshape(len(y), -1)) ** 2)

    grad = np.zeros(weights[0].shape[1])
    for k in range(len(grad)):
        plus = [w.copy() for w in weights]
        minus = [w.copy() for w in weights]
        plus[0][j, k] += eps
        minus[0][j, k] -= eps
        grad[k] = (loss(plus) - loss(minus)) / (2 * eps)
    return grad


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), task=st.sampled_from(["classification", "regression"]))
def test_input_group_strengths_against_finite_differences(seed, task):
    rng = np.random.default_rng(seed)
    n, d, sizes = 20, 4, (5, 3)
    x = rng.normal(size=(n, d))
    y = rng.integers(0, 3, size=n) if task == "classification" else rng.normal(size=(n, 3))
    dims = (d,) + sizes + (3,)
    weights = []
    for a, b in zip(dims[:-1], dims[1:]):
        weights += [rng.normal(size=(a, b)), rng.normal(size=b) * 0.1]
    group = input_group_strengths(weights, x, y, task, penalty="group")
    l1 = input_group_strengths(weights, x, y, task, penalty="l1")
    sgl = input_group_strengths(weights, x, y, task, penalty="sgl", l1_ratio=0.5)
    for j in range(d):
        g = _numeric_group_gradient(weights, x, y, j, task)
        assert group[j] == pytest.approx(np.linalg.norm(g) / math.sqrt(len(g)), rel=1e-4, abs=1e-9)
        assert l1[j] == pytest.approx(np.abs(g).max(), rel=1e-4, abs=1e-9)
        # At the returned strength a, zero is exactly on the edge of optimality.
        a = sgl[j]
        shrunk = np.maximum(np.abs(g) - 0.5 * a, 0.0)
        assert np.linalg.norm(shrunk) == pytest.approx(a * math.sqrt(len(g)), rel=1e-3, abs=1e-9)
        assert a <= group[j] + 1e-12


# ----------------------------------------------------------------------------- the path


# The paths train tens of epochs per point of small batches: eager PyTorch takes ~10x the time of compiled TensorFlow
# or JAX for them; the estimators' fits above run on PyTorch too, the path's arithmetic is the same numpy everywhere.
COMPILED_BACKENDS = pytest.mark.skipif(keras.backend.backend() == "torch",
                                       reason="long paths: on TensorFlow and JAX (eager PyTorch is ~10x slower on "
                                              "them; the estimators train on PyTorch in the other tests)")


@pytest.fixture(scope="module")
def path_result(selection_problem):
    x, y = selection_problem
    # learning_rate <= threshold: under Adam a useless weight moves by about the
    # learning rate per step, so with a larger one nothing falls below the threshold.
    est = GroupSparseMLPClassifier(
        hidden_layer_sizes=(16,), alpha=1e-3, epochs=30, learning_rate=1e-3, batch_size=50, random_state=0
    )
    return est, est.path(x, y, path_multiplier=1.6, epochs_per_alpha=8)


@COMPILED_BACKENDS
def test_path_runs_from_dense_to_empty(path_result):
    est, path = path_result
    assert isinstance(path, RegularizationPath) and all(isinstance(p, PathPoint) for p in path)
    assert path[0].alpha == 0.0 and path[0].n_features == 12
    assert path[-1].n_features == 0
    assert np.all(np.diff(path.alphas) > 0)
    for before, after in zip(path, path[1:]):  # features that left stay out
        assert set(after.selected_features) <= set(before.selected_features)
    assert not hasattr(est, "coefs_")  # the estimator is not fitted by path()


@COMPILED_BACKENDS
def test_path_keeps_informative_features_longest(path_result):
    _, path = path_result
    importance = path.feature_importances_
    assert importance[:3].min() > importance[3:].max()
    assert path.best(max_features=3).score > 0.9


@COMPILED_BACKENDS
def test_feature_importances_are_exit_strengths(path_result):
    _, path = path_result
    importance = path.feature_importances_
    for j in range(path.n_features_in):
        inside = [j in p.selected_features for p in path]
        first_out = inside.index(False)
        assert importance[j] == path[first_out].alpha
        assert all(inside[:first_out])


@COMPILED_BACKENDS
def test_path_points_rebuild_estimators(path_result, selection_problem):
    x, y = selection_problem
    _, path = path_result
    point = path.best(max_features=6)
    assert point.n_features <= 6
    est = path.estimator(point)
    np.testing.assert_array_equal(est.get_support(indices=True), point.selected_features)
    assert est.n_features_in_ == 12 and est.input_alpha == 0.0
    assert est.predict(x).shape == (len(x),)
    # Its training record is the point's own: one loss per pass (selection, then refit).
    assert est.n_iter_ == point.passes == len(est.history_["loss"]) > 0
    assert est.history_ == point.history and est.loss_ == point.history["loss"][-1]
    assert np.all(np.isfinite(est.history_["loss"]))


def test_the_path_function_is_the_path_method(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifier(**dict(FAST, epochs=6, threshold=0.05))
    kwargs = dict(validation_data=(x[300:], y[300:]), epochs_per_alpha=2)
    params = {k: v for k, v in est.get_params().items() if k not in ("early_stopping", "n_iter_no_change", "tol")}
    by_function = regularization_path(x[:300], y[:300], [0.0, 1e-2], task="classification", **params, **kwargs)
    by_method = est.path(x[:300], y[:300], [0.0, 1e-2], **kwargs)
    assert len(by_function) == len(by_method) == 2
    for a, b in zip(by_function, by_method):
        assert (a.alpha, a.score, a.selected_features, a.passes) == (b.alpha, b.score, b.selected_features, b.passes)
        for wa, wb in zip(a.weights, b.weights):
            np.testing.assert_array_equal(wa, wb)
    assert not hasattr(est, "coefs_")
    # Arrays in, a path out: only the estimator's path rebuilds estimators from its points.
    assert by_method.estimator(-1).get_support().sum() == by_method[-1].n_features
    with pytest.raises(InvalidParameterError, match="a point of a path run by an estimator's path()"):
        by_function.estimator(-1)


def test_the_path_function_on_labels_and_regression():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(120, 4)).astype("float32")
    params = dict(hidden_layer_sizes=(8,), epochs=4, learning_rate=0.01, threshold=0.05, batch_size=40, random_state=0)
    labels = np.where(x[:, 0] > 0.5, "yes", "no")
    path = regularization_path(x, labels, [0.0, 0.01], epochs_per_alpha=1, **params)
    assert path.score_name == "accuracy" and path.n_features_in == 4 and len(path) == 2
    reg = GroupSparseMLPRegressor(**params)
    target = x[:, 0] - x[:, 1]
    by_function = regularization_path(x, target, [0.0, 0.01], task="regression", epochs_per_alpha=1, **params)
    by_method = reg.path(x, target, [0.0, 0.01], epochs_per_alpha=1)
    assert by_function.score_name == "r2"
    np.testing.assert_array_equal(by_function.scores, by_method.scores)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"alphas": [0.1, 0.01]}, InvalidParameterError, "regularization_path: argument `alphas` must be None or a 1-d increasing sequence of finite numbers >= 0; received [0.1, 0.01]."),
        ({"max_alphas": 1}, InvalidParameterError, "regularization_path: argument `max_alphas` must be an integer >= 2; received 1."),
        ({"validation_data": (1, 2, 3)}, InvalidParameterError, "regularization_path: argument `validation_data` must be None or a pair (X_val, y_val); received (1, 2, 3)."),
        ({"task": "ranking"}, ParameterError, "The 'task' parameter of regularization_path must be a str among {'classification', 'regression'}. Got 'ranking' instead."),
        ({"penalty": "l0"}, ParameterError, "The 'penalty' parameter of regularization_path must be a str among {'group', 'l1', 'l2', 'sgl'}. Got 'l0' instead."),
        ({"hidden_layer_sizes": (4, 0)}, ParameterError, "The 'hidden_layer_sizes' parameter of regularization_path must be an int >= 1 or a sequence of ints >= 1. Got (4, 0) instead."),
        ({"y": np.zeros(20)}, ValueError, "regularization_path: argument `y` must contain at least 2 classes; received 1 class (np.float64(0.0))."),
    ],
)
def test_path_function_argument_errors(kwargs, error, message):
    x = np.random.default_rng(0).uniform(size=(20, 3))
    kwargs = dict({"y": (x[:, 0] > 0.5).astype(int)}, **kwargs)
    with pytest.raises(error) as info:
        regularization_path(x, **kwargs)
    assert str(info.value) == message


def test_path_with_given_alphas_and_validation_data_is_reproducible(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifier(**dict(FAST, epochs=6))
    alphas = [1e-3, 1e-2, 1e-1]
    kwargs = dict(validation_data=(x[300:], y[300:]), epochs_per_alpha=2, refit=False)
    with pytest.warns(UserWarning, match="learning_rate=0.05 is larger than threshold=0.001"):
        first = est.path(x[:300], y[:300], alphas, **kwargs)
    with pytest.warns(UserWarning, match="Use learning_rate <= threshold or proximal=True"):
        again = est.path(x[:300], y[:300], alphas, **kwargs)
    np.testing.assert_array_equal(first.alphas, alphas)
    assert [p.selected_features for p in first] == [p.selected_features for p in again]
    np.testing.assert_array_equal(first.scores, again.scores)
    for p in first:
        assert p.score == p.penalized_score  # no refit
        assert path_score(first, p, x[300:], y[300:]) == pytest.approx(p.score)


@COMPILED_BACKENDS
def test_proximal_path(selection_problem):
    x, y = selection_problem
    est = GroupSparseMLPClassifier(
        hidden_layer_sizes=(16,), alpha=1e-3, epochs=30, learning_rate=3e-3, batch_size=50, proximal=True, random_state=0
    )
    path = est.path(x, y, [0.0, 7e-3], epochs_per_alpha=40)
    assert path[1].selected_features == (0, 1, 2)
    for point in path:
        dropped = np.setdiff1d(np.arange(12), point.selected_features)
        assert np.all(point.weights[0][dropped] == 0)


def path_score(path, point, x, y):
    return path.estimator(point).score(x, y)


@COMPILED_BACKENDS
def test_path_plot(path_result):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    _, path = path_result
    ax = path.plot()
    x_data, y_data = ax.lines[0].get_data()
    np.testing.assert_array_equal(x_data, path.n_selected)
    np.testing.assert_array_equal(y_data, path.scores)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alphas": [0.1, 0.01]}, "GroupSparseMLPClassifier.path: argument `alphas` must be None or a 1-d increasing sequence of finite numbers >= 0; received [0.1, 0.01]."),
        ({"alphas": [-1.0]}, "GroupSparseMLPClassifier.path: argument `alphas` must be None or a 1-d increasing sequence of finite numbers >= 0; received [-1.0]."),
        ({"path_multiplier": 1.0}, "GroupSparseMLPClassifier.path: argument `path_multiplier` must be a finite number > 1; received 1.0."),
        ({"max_alphas": 1}, "GroupSparseMLPClassifier.path: argument `max_alphas` must be an integer >= 2; received 1."),
        ({"epochs_per_alpha": 0}, "GroupSparseMLPClassifier.path: argument `epochs_per_alpha` must be None or an integer >= 1; received 0."),
        ({"refit": 1}, "GroupSparseMLPClassifier.path: argument `refit` must be True or False; received 1."),
        ({"validation_data": (1, 2, 3)}, "GroupSparseMLPClassifier.path: argument `validation_data` must be None or a pair (X_val, y_val); received (1, 2, 3)."),
    ],
)
def test_path_argument_errors(kwargs, message, selection_problem):
    x, y = selection_problem
    with pytest.raises(InvalidParameterError) as info:
        GroupSparseMLPClassifier(**FAST).path(x, y, **kwargs)
    assert str(info.value) == message


@COMPILED_BACKENDS
def test_best_with_tolerance_prefers_fewer_features(path_result):
    _, path = path_result
    top = path.best()
    assert top.score == path.scores.max()
    loose = path.best(tolerance=0.05)
    assert loose.n_features <= top.n_features and loose.score >= top.score - 0.05
    assert path.best(tolerance=1.0).n_features == path.n_selected.min()


@COMPILED_BACKENDS
def test_estimator_of_a_point_that_is_not_on_the_path(path_result):
    _, path = path_result
    n = len(path)
    for bad in (n, -n - 1, 1.0, True, "0"):
        with pytest.raises(InvalidParameterError) as info:
            path.estimator(bad)
        assert str(info.value) == (
            "RegularizationPath.estimator: argument `point` must be a PathPoint or an index of one of the "
            f"{n} points (an int in [-{n}, {n - 1}]); received {bad!r}."
        )
    assert path.estimator(np.int64(-1)).get_support().sum() == path[-1].n_features
    other = dataclasses.replace(path[-1])  # equal, but a point of no path this one holds
    with pytest.raises(InvalidParameterError, match=re.escape(
            "RegularizationPath.estimator: argument `point` must be a point of this path (or the index of one); "
            f"received a PathPoint of another path (alpha={other.alpha:g}).")):
        path.estimator(other)


@COMPILED_BACKENDS
def test_best_errors(path_result):
    _, path = path_result
    with pytest.raises(InvalidParameterError, match="argument `max_features` must be an integer >= 0 or None; received -1."):
        path.best(max_features=-1)
    with pytest.raises(InvalidParameterError, match="argument `tolerance` must be a finite number >= 0; received -0.1."):
        path.best(tolerance=-0.1)


def _two_features(n=200, features=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, features))
    return X, (X[:, 0] + X[:, 1] > 1).astype(int)


@pytest.mark.parametrize("penalty", ["l1", "l2"])
def test_proximal_with_a_penalty_it_does_not_step_is_refused(penalty):
    """Proximal steps the group penalties only; with Keras's L1 or L2 no weight would reach zero and no threshold
    would apply: nothing could be selected."""
    X, y = _two_features(n=40)
    message = (f"The 'proximal' parameter of GroupSparseMLPClassifier must be False with penalty={penalty!r} (the "
               "proximal step is for the group penalties 'sgl' and 'group'). Got True instead.")
    clf = GroupSparseMLPClassifier((4,), penalty=penalty, proximal=True, epochs=1)
    for call in (lambda: clf.fit(X, y), lambda: clf.path(X, y, alphas=[0.0])):
        with pytest.raises(ParameterError, match=re.escape(message)):
            call()


def test_a_fit_that_fails_leaves_the_estimator_unfitted_not_half_fitted():
    X, y = _two_features(n=60)
    y = y + (X[:, 2] > 0.8)  # three classes
    clf = GroupSparseMLPClassifier((4,), epochs=2, random_state=0).fit(X, y)
    with pytest.raises(ValueError):
        clf.fit(X[:, :5], np.zeros(len(X), dtype=int))  # one class: refused after the data were read
    with pytest.raises(NotFittedError):
        clf.predict(X)
    assert not [name for name in vars(clf) if name.endswith("_") and not name.startswith("__")]
    assert clf.fit(X, y).predict(X).shape == (len(X),)


def test_the_fitted_model_keeps_the_strengths_it_was_fitted_with():
    X, y = _two_features(n=60)
    clf = GroupSparseMLPClassifier((4,), alpha=1e-3, learning_rate=1e-2, epochs=2, random_state=0).fit(X, y)
    clf.set_params(alpha=0.5, learning_rate=0.3)  # for the next fit only
    model = clf.model_
    assert model.layers[-1].kernel_regularizer.get_config()["factor"] == pytest.approx(1e-3)
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(1e-2)


@COMPILED_BACKENDS
def test_a_refit_changes_nothing_the_path_selects():
    """Each refit trains a copy's worth of steps with the strength off; the path goes on from the selection step's
    weights and optimizer state, so the points select and score as a path without refits does."""
    X, y = _two_features()
    clf = GroupSparseMLPClassifier((16,), alpha=1e-3, learning_rate=3e-3, proximal=True, epochs=20, batch_size=20,
                                   random_state=0)
    with_refit, without = (clf.path(X, y, alphas=[0.0, 0.01, 0.02], refit=refit) for refit in (True, False))
    assert len({p.selected_features for p in without}) > 1  # the strengths select: the path moves
    assert [p.selected_features for p in with_refit] == [p.selected_features for p in without]
    assert [p.penalized_score for p in with_refit] == [p.penalized_score for p in without]
    assert [p.passes for p in with_refit][1:] == [2 * p.passes for p in without][1:]

"""Proximal: the weighted proximal operator, the wrapper's step, training, serialization, errors."""

import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from keras import ops
from scipy.optimize import minimize

import _autodiff
from keras_group_lasso import (
    GroupLasso,
    InputGroupLasso,
    InvalidParameterError,
    Proximal,
    SparseGroupLasso,
    add_group_sparsity,
    prox,
    set_penalty_multiplier,
)
from keras_group_lasso import optimizers as kgl_optimizers
from keras_group_lasso.optimizers import weighted_sparse_group_soft_threshold
from keras_group_lasso.declared import declare_group_penalties

BACKEND = keras.backend.backend()


def as_np(x):
    return np.asarray(ops.convert_to_numpy(x), dtype=np.float64)


def groups_of(w):
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 1:
        return w.reshape(-1, 1)
    return np.moveaxis(w, -2, 0).reshape(w.shape[-2], -1)


def from_groups(g, shape):
    if len(shape) == 1:
        return g.reshape(shape)
    moved_shape = (shape[-2],) + tuple(s for i, s in enumerate(shape) if i != len(shape) - 2)
    return np.moveaxis(g.reshape(moved_shape), 0, -2)


def np_weighted_sgl(x, d, a, b):
    """numpy reference: exact weighted L1 step, then the group step in the scalar metric ||d s_g|| / ||s_g||."""
    x, d = np.asarray(x, np.float64), np.asarray(d, np.float64)
    if x.ndim == 1:
        return np.sign(x) * np.maximum(np.abs(x) - (a + b) / d, 0.0)
    s = np.sign(x) * np.maximum(np.abs(x) - b / d, 0.0)
    sg, dg = groups_of(s), groups_of(d)
    c = a * math.sqrt(sg.shape[1])
    pull = np.linalg.norm(dg * sg, axis=1, keepdims=True)
    scale = np.where(pull > 0, np.maximum(0.0, 1.0 - c / np.where(pull > 0, pull, 1.0)), 0.0)
    return from_groups(sg * scale, x.shape)


def weighted_objective(z, x, d, a, b):
    z = np.asarray(z, np.float64).reshape(x.shape)
    g = groups_of(z)
    size = g.shape[1] if x.ndim > 1 else 1
    return (0.5 * np.sum(d * (z - x) ** 2) + a * math.sqrt(size) * np.linalg.norm(g, axis=1).sum()
            + b * np.abs(z).sum())


SHAPES = [(4,), (3, 4), (4, 1), (2, 2, 3, 2)]
arrays = st.sampled_from(SHAPES).flatmap(
    lambda shape: st.tuples(
        hnp.arrays(np.float32, shape, elements=st.floats(-3, 3, width=32, allow_subnormal=False)),
        # metrics spanning six decades inside one group
        hnp.arrays(np.float32, shape, elements=st.floats(0.0001220703125, 128.0, width=32)),
    )
)
strengths = st.floats(0.0, 1.0, width=32, allow_subnormal=False)


# ---------------------------------------------------------------- the weighted operator


@settings(max_examples=30, deadline=None)
@given(xd=arrays, a=strengths, b=strengths)
def test_weighted_prox_matches_numpy_reference(xd, a, b):
    x, d = xd
    got = as_np(weighted_sparse_group_soft_threshold(x, d, a, b))
    expected = np_weighted_sgl(x, d, a, b)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)


@settings(max_examples=25, deadline=None)
@given(xd=arrays, a=strengths, b=strengths, k=st.sampled_from([1.0, 0.25, 8.0]))
def test_weighted_prox_with_constant_metric_is_the_euclidean_prox(xd, a, b, k):
    x, _ = xd
    got = as_np(weighted_sparse_group_soft_threshold(x, np.full(x.shape, k, np.float32), a, b))
    expected = as_np(prox.sparse_group_soft_threshold(x, a / k, b / k))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(xd=arrays, a=strengths)
def test_weighted_prox_zero_test_is_exact(xd, a):
    x, d = xd
    got = groups_of(as_np(weighted_sparse_group_soft_threshold(x, d, a)))
    size = groups_of(x).shape[1] if x.ndim > 1 else 1
    pulls = np.linalg.norm(groups_of(d) * groups_of(x), axis=1)
    for row, pull in zip(got, pulls):
        if pull <= a * math.sqrt(size) * (1 - 1e-4):
            assert np.all(row == 0.0)
        elif pull >= a * math.sqrt(size) * (1 + 1e-4):
            assert np.any(row != 0.0)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (3, 2)])
def test_weighted_prox_zeroes_the_groups_the_exact_minimizer_zeroes(shape, rng):
    """Brute-force minimization of the diagonal-metric objective: same zero groups; exact on biases."""
    for _ in range(4):
        x = rng.normal(scale=1.5, size=shape)
        d = 10.0 ** rng.uniform(-2, 1, size=shape)
        a, b = rng.uniform(0, 0.8), rng.uniform(0, 0.3)
        z = as_np(weighted_sparse_group_soft_threshold(x.astype(np.float32), d.astype(np.float32), a, b))
        best = min(
            (minimize(weighted_objective, start, args=(x, d, a, b), method="Powell",
                      options={"xtol": 1e-10, "ftol": 1e-14, "maxiter": 20000})
             for start in (np.zeros(x.size), x.ravel())),
            key=lambda r: r.fun,
        )
        exact = best.x.reshape(shape)
        if len(shape) == 1:
            np.testing.assert_allclose(z, exact, atol=1e-4)
        else:
            zero_here = np.all(groups_of(z) == 0.0, axis=1)
            zero_there = np.linalg.norm(groups_of(exact), axis=1) < 1e-4
            assert np.array_equal(zero_here, zero_there), (z, exact)


def test_weighted_prox_equals_the_exact_minimizer_when_the_metric_is_constant_per_group(rng):
    x = rng.normal(scale=1.5, size=(3, 2))
    d = np.repeat(10.0 ** rng.uniform(-1, 1, size=(3, 1)), 2, axis=1)
    a, b = 0.4, 0.1
    z = as_np(weighted_sparse_group_soft_threshold(x.astype(np.float32), d.astype(np.float32), a, b))
    best = minimize(weighted_objective, x.ravel(), args=(x, d, a, b), method="Powell",
                    options={"xtol": 1e-10, "ftol": 1e-14, "maxiter": 20000})
    assert weighted_objective(z, x, d, a, b) <= best.fun + 1e-6
    np.testing.assert_allclose(z.ravel(), best.x, atol=1e-3)


def test_a_surviving_group_is_in_balance_with_the_penalty(rng):
    """At a fixed point of step + prox, the data gradient on a surviving group has norm a*sqrt(|g|)/lr."""
    z = rng.normal(size=(1, 4))
    d = 10.0 ** rng.uniform(-2, 1, size=(1, 4))
    lr, a = 0.1, 0.05
    c = lr * a * 2.0  # sqrt(|g|) = 2
    # Invert the group step: x = z / (1 - c / ||d x||), with ||d x|| = ||d z|| + c.
    x = z * (np.linalg.norm(d * z) + c) / np.linalg.norm(d * z)
    grad = -(x - z) * d / lr  # x = z - lr * grad / d: the data step that lands on x
    got = as_np(weighted_sparse_group_soft_threshold(x.astype(np.float32), d.astype(np.float32), lr * a))
    np.testing.assert_allclose(got, z, rtol=1e-5)
    assert np.linalg.norm(grad) == pytest.approx(a * 2.0, rel=1e-6)


def test_weighted_prox_zero_groups_tiny_metric_and_zero_threshold_give_no_nan():
    x = np.zeros((3, 4), np.float32)
    x[1] = [1.0, -2.0, 0.5, 0.0]
    d = np.full_like(x, 1e-30)
    for a, b in ((0.0, 0.0), (0.1, 0.0), (0.0, 0.1), (10.0, 10.0)):
        out = as_np(weighted_sparse_group_soft_threshold(x, d, a, b))
        assert np.all(np.isfinite(out))
        assert np.all(out[[0, 2]] == 0.0)
    np.testing.assert_array_equal(as_np(weighted_sparse_group_soft_threshold(x, np.ones_like(x), 0.0, 0.0)), x)


# ---------------------------------------------------------------- the penalty gradient


def autodiff_gradient(reg, w):
    return _autodiff.gradient(reg, w)


@pytest.mark.parametrize("reg", [GroupLasso(0.3), SparseGroupLasso(0.2, l1=0.05), InputGroupLasso(0.1, l1=0.2)])
@pytest.mark.parametrize("shape", [(5,), (4, 3), (2, 2, 3, 2)])
def test_closed_form_penalty_gradient_matches_the_regularizer(reg, shape, rng):
    w = rng.normal(size=shape).astype(np.float32)
    if len(shape) > 1:
        w[..., 0, :] = 0.0  # a zero group
    w.flat[1] = 0.0  # a zero weight in a live group
    np.testing.assert_allclose(as_np(prox.group_sparse_gradient(w, reg.factor, reg.l1)), autodiff_gradient(reg, w),
                               rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- one step, by hand


def penalized_variable(value, reg):
    v = keras.Variable(np.asarray(value, np.float32))
    v.regularizer = reg
    return v


def np_penalty_gradient(w, reg):
    """numpy reference: a * sqrt(|g|) * g / ||g|| (0 for a zero group) + b * sign(w)."""
    w = np.asarray(w, np.float64)
    if w.ndim == 1:
        return (reg.factor + reg.l1) * np.sign(w)
    g = groups_of(w)
    norm = np.linalg.norm(g, axis=1, keepdims=True)
    group = reg.factor * math.sqrt(g.shape[1]) * np.where(norm > 0, g / np.where(norm > 0, norm, 1.0), 0.0)
    return from_groups(group, w.shape) + reg.l1 * np.sign(w)


def loss_gradient(data_gradient, w, reg):
    """What `fit` hands the optimizer: the gradient of data loss + penalty."""
    return (np.asarray(data_gradient, np.float64) + np_penalty_gradient(w, reg)).astype(np.float32)


def test_sgd_step_is_update_then_prox_with_threshold_lr_times_lambda(rng):
    w0 = rng.normal(size=(4, 3)).astype(np.float32)
    w0[2] *= 0.01  # a small group that the step must zero
    g = rng.normal(size=(4, 3)).astype(np.float32)
    reg = SparseGroupLasso(0.2, l1=0.1)
    v = penalized_variable(w0, reg)
    opt = Proximal(keras.optimizers.SGD(0.5))
    opt.build([v])
    opt.apply([loss_gradient(g, w0, reg)], [v])
    u = w0.astype(np.float64) - 0.5 * g
    expected = as_np(prox.sparse_group_soft_threshold(u.astype(np.float32), 0.5 * 0.2, 0.5 * 0.1))
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6, atol=1e-7)
    assert opt.iterations.numpy() == 1
    assert opt.resolved_metric == "optimizer"


@pytest.mark.quick
def test_adam_step_is_the_prox_in_adams_metric(rng):
    w0 = rng.normal(size=(4, 3)).astype(np.float32)
    g = rng.normal(size=(4, 3)).astype(np.float32)
    g[1] = 0.0  # no data gradient: the metric is ~eps there, the group must go
    reg = SparseGroupLasso(0.05, l1=0.01)
    v = penalized_variable(w0, reg)
    inner = keras.optimizers.Adam(0.1)
    opt = Proximal(inner)
    opt.build([v])
    opt.apply([loss_gradient(g, w0, reg)], [v])
    # After one Adam step: m = 0.1 g, v = 0.001 g^2, update lr*g/(|g| + eps/sqrt(0.001)) ...
    eps, lr = inner.epsilon, 0.1
    d = (np.sqrt(0.001 * g.astype(np.float64) ** 2) + eps) / math.sqrt(1 - 0.999)
    u = w0 - lr * g / d
    expected = np_weighted_sgl(u, d, lr * 0.05, lr * 0.01)
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-4, atol=1e-6)
    assert np.all(v.numpy()[1] == 0.0)
    assert opt.resolved_metric == "optimizer"


def test_a_metric_below_its_floor_is_raised_to_it(rng):
    # epsilon below MIN_METRIC: where Adam saw no gradient its metric would be ~epsilon; it is
    # floored at 1e-12 (the step stays finite, and the group goes).
    w0 = rng.normal(size=(4, 3)).astype(np.float32)
    g = rng.normal(size=(4, 3)).astype(np.float32)
    g[1] = 0.0
    reg = SparseGroupLasso(0.05, l1=0.01)
    v = penalized_variable(w0, reg)
    inner = keras.optimizers.Adam(0.1, epsilon=1e-14)
    opt = Proximal(inner)
    opt.build([v])
    opt.apply([loss_gradient(g, w0, reg)], [v])
    d_adam = (np.sqrt(0.001 * g.astype(np.float64) ** 2) + 1e-14) / math.sqrt(1 - 0.999)
    u = w0 - 0.1 * g / d_adam
    expected = np_weighted_sgl(u, np.maximum(d_adam, 1e-12), 0.1 * 0.05, 0.1 * 0.01)
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-4, atol=1e-6)
    assert np.all(v.numpy()[1] == 0.0) and np.all(np.isfinite(v.numpy()))


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.1),
        lambda: keras.optimizers.Adam(0.1, amsgrad=True),
        lambda: keras.optimizers.AdamW(0.1, weight_decay=0.0),
        lambda: keras.optimizers.RMSprop(0.1),
        lambda: keras.optimizers.RMSprop(0.1, centered=True),
        lambda: keras.optimizers.Adagrad(0.1),
        lambda: keras.optimizers.Adamax(0.1),
    ],
    ids=["adam", "amsgrad", "adamw", "rmsprop", "rmsprop-centered", "adagrad", "adamax"],
)
def test_preconditioner_table_is_the_optimizers_own_step(make, rng):
    """d in the table satisfies step = -lr * direction / d, with direction = g at step 1."""
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    g = rng.normal(size=(3, 2)).astype(np.float32)
    inner = make()
    v = keras.Variable(w0)
    inner.build([v])
    inner.apply([ops.convert_to_tensor(g)], [v])
    step = v.numpy().astype(np.float64) - w0
    d = as_np(kgl_optimizers._find_metric(inner)(inner, 0, "float32"))
    np.testing.assert_allclose(d, -0.1 * g / step, rtol=2e-3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.SGD(0.01, momentum=0.9),
        lambda: keras.optimizers.SGD(0.01, momentum=0.5, nesterov=True),
        lambda: keras.optimizers.SGD(0.01),
        lambda: keras.optimizers.RMSprop(0.01, momentum=0.5),
    ],
    ids=["sgd-momentum", "sgd-nesterov", "sgd", "rmsprop-momentum"],
)
def test_metric_of_momentum_optimizers_is_their_steady_step(make):
    """A steady gradient g moves the weight by lr * g / d once the velocity has settled."""
    inner = make()
    v = keras.Variable(np.zeros(3, np.float32))
    inner.build([v])
    g = np.array([1.0, -2.0, 0.5], np.float32)
    for _ in range(150):
        before = v.numpy().astype(np.float64)
        inner.apply([ops.convert_to_tensor(g)], [v])
    d = kgl_optimizers._find_metric(inner)(inner, 0, "float32")
    np.testing.assert_allclose(v.numpy() - before, -0.01 * g / as_np(d), rtol=1e-3)
    if isinstance(inner, keras.optimizers.SGD):
        assert d == pytest.approx(1.0 - inner.momentum)


def test_sgd_momentum_thresholds_are_lr_lambda_over_one_minus_momentum(rng):
    w0 = rng.normal(size=(4, 3)).astype(np.float32)
    g = rng.normal(size=(4, 3)).astype(np.float32)
    reg = SparseGroupLasso(0.2, l1=0.1)
    v = penalized_variable(w0, reg)
    opt = Proximal(keras.optimizers.SGD(0.5, momentum=0.75))
    opt.build([v])
    opt.apply([loss_gradient(g, w0, reg)], [v])
    u = w0 - 0.5 * g  # first step: the velocity starts at 0
    expected = as_np(prox.sparse_group_soft_threshold(u, 0.5 * 0.2 / 0.25, 0.5 * 0.1 / 0.25))
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-5, atol=1e-6)
    plain = Proximal(keras.optimizers.SGD(0.5, momentum=0.75), metric="euclidean")
    v2 = penalized_variable(w0, reg)
    plain.build([v2])
    plain.apply([loss_gradient(g, w0, reg)], [v2])
    np.testing.assert_allclose(v2.numpy(), as_np(prox.sparse_group_soft_threshold(u, 0.5 * 0.2, 0.5 * 0.1)),
                               rtol=1e-5, atol=1e-6)


def test_nadam_preconditioner_is_sqrt_v_hat_plus_eps(rng):
    g = rng.normal(size=(3, 2)).astype(np.float32)
    inner = keras.optimizers.Nadam(0.1)
    v = keras.Variable(np.zeros((3, 2), np.float32))
    inner.build([v])
    inner.apply([ops.convert_to_tensor(g)], [v])
    d = as_np(kgl_optimizers._find_metric(inner)(inner, 0, "float32"))
    np.testing.assert_allclose(d, np.abs(g) + inner.epsilon, rtol=1e-4)


def test_learning_rate_and_schedule_are_the_inner_optimizers():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)
    reg = GroupLasso(0.1)
    v = penalized_variable(np.full((2, 2), 1.0), reg)
    opt = Proximal(keras.optimizers.SGD(schedule))
    opt.build([v])
    for lr in (0.5, 0.25):  # the step uses the rate of its own iteration
        before = v.numpy().astype(np.float64)
        opt.apply([loss_gradient(np.zeros((2, 2)), before, reg)], [v])
        norm = np.linalg.norm(before, axis=1, keepdims=True)
        np.testing.assert_allclose(v.numpy(), before * (1 - lr * 0.1 * math.sqrt(2) / norm), rtol=1e-6)
    plain = Proximal(keras.optimizers.SGD(0.5))
    plain.learning_rate = 0.125
    assert float(plain.inner_optimizer.learning_rate) == 0.125
    assert float(plain.learning_rate) == 0.125


def test_inside_loss_scale_optimizer(rng):
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    g = rng.normal(size=(3, 2)).astype(np.float32)
    v = penalized_variable(w0, GroupLasso(0.2))
    opt = keras.optimizers.LossScaleOptimizer(Proximal(keras.optimizers.SGD(0.5)), initial_scale=64.0)
    opt.build([v])
    total = loss_gradient(g, w0, GroupLasso(0.2))
    if BACKEND == "jax":  # LossScaleOptimizer.apply is not eager-safe on JAX; fit uses stateless_apply
        (new_value,), _ = opt.stateless_apply([u.value for u in opt.variables], [64.0 * total], [v.value])
    else:
        opt.apply([64.0 * total], [v])
        new_value = v.numpy()
    expected = as_np(prox.group_soft_threshold(w0 - 0.5 * g, 0.5 * 0.2))
    np.testing.assert_allclose(as_np(new_value), expected, rtol=1e-5, atol=1e-6)


def test_build_reads_the_group_penalties_and_changes_no_variable():
    reg = SparseGroupLasso(0.1)
    v = penalized_variable(np.ones((2, 2)), reg)
    other = penalized_variable(np.ones((2, 2)), keras.regularizers.L2(0.1))
    plain = keras.Variable(np.ones((2,), np.float32))
    opt = Proximal(keras.optimizers.SGD(0.1))
    assert opt.penalties() == []
    opt.build([v, other, plain])
    assert v.regularizer is reg and isinstance(other.regularizer, keras.regularizers.L2)
    assert plain.regularizer is None
    assert opt.penalties() == [(v, reg)]
    # Penalties are read when the step is traced: a later declaration is seen.
    replaced = GroupLasso(0.5)
    v.regularizer = replaced
    assert opt.penalties() == [(v, replaced)]
    with pytest.warns(DeprecationWarning, match="no longer needed"):
        opt.release()
    assert v.regularizer is replaced


def test_l2_and_unpenalised_gradients_reach_the_inner_optimizer_unchanged(rng):
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    g = rng.normal(size=(3, 2)).astype(np.float32)
    other = penalized_variable(w0, keras.regularizers.L2(0.1))
    opt = Proximal(keras.optimizers.SGD(0.5))
    opt.build([other])
    opt.apply([ops.convert_to_tensor(g)], [other])
    np.testing.assert_allclose(other.numpy(), w0 - 0.5 * g, rtol=1e-6)


# ---------------------------------------------------------------- training


def toy_data(n=128, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    x[:, 5:] = 0.0  # three dead inputs: their rows get no gradient at all
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    return x, y


def toy_model(factor=0.05, first=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(6, activation="relu", kernel_regularizer=first or SparseGroupLasso(factor),
                               bias_regularizer=GroupLasso(1e-3)),
            keras.layers.Dense(2, activation="softmax", kernel_regularizer=GroupLasso(1e-3)),
        ]
    )
    return model


# optimizer, strength of the first kernel's SparseGroupLasso. With momentum 0.9
# the penalty's thresholds are 10x larger (lr * λ / (1 - momentum)): the same λ
# is a 10x stronger penalty for SGD's 10x longer steady steps.
OPTIMIZERS = {
    "sgd": (lambda: keras.optimizers.SGD(0.1), 0.05),
    "sgd-momentum": (lambda: keras.optimizers.SGD(0.1, momentum=0.9), 0.005),
    "adam": (lambda: keras.optimizers.Adam(1e-2), 0.05),
    "adamw": (lambda: keras.optimizers.AdamW(1e-2, weight_decay=1e-3), 0.05),
    "rmsprop": (lambda: keras.optimizers.RMSprop(1e-2), 0.05),
}


#: On torch, jit_compile=True is torch.compile, 15-20 s per training here (Dynamo tracing Keras's step): SGD's step
#: (one graph) is compiled in this module; Adam's (a graph split before the proximal step, with slots) in
#: tests/test_coupled.py's compiled step, whose model holds plain and coupled penalties. The others train eagerly
#: on torch (and compiled on TF and JAX).
TORCH_COMPILED = ("sgd",)
#: The compiled step is compared with an eager twin's for these (the step without and with slots).
TWINNED = ("sgd", "adam")
#: Compiled on TensorFlow and JAX, eager on torch, in tests about what the step does rather than how it compiles.
NOT_ON_TORCH = keras.backend.backend() != "torch"


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_gives_exact_zero_groups_that_stay_zero(name):
    x, y = toy_data()
    make, factor = OPTIMIZERS[name]
    model = toy_model(factor)
    compiled = keras.backend.backend() != "torch" or name in TORCH_COMPILED
    model.compile(Proximal(make()), "sparse_categorical_crossentropy", jit_compile=compiled)
    history = model.fit(x, y, epochs=4, batch_size=8, shuffle=False, verbose=0)
    # The compiled step is the eager one (on torch, jit_compile=True is torch.compile: the penalties and
    # the proximal step are traced, in one graph for SGD and split before the proximal step for the
    # others, whose slot updates next to it crashed the compiler's C++ code generation). Checked for SGD and Adam
    # (the step without and with slots) where they compile: an eager twin trains op by op, 3-6 s on JAX.
    if name in TWINNED and compiled:
        eager = toy_model(factor)
        eager.compile(Proximal(make()), "sparse_categorical_crossentropy", jit_compile=False)
        eager.fit(x, y, epochs=4, batch_size=8, shuffle=False, verbose=0)
        for compiled_weight, eager_weight in zip(model.get_weights(), eager.get_weights()):
            np.testing.assert_allclose(compiled_weight, eager_weight, atol=1e-5)
    kernel = model.layers[0].kernel.numpy()
    assert np.all(np.isfinite(history.history["loss"]))
    assert all(np.all(np.isfinite(w.numpy())) for w in model.trainable_weights)
    assert np.all(kernel[5:] == 0.0)  # exactly zero, no threshold
    assert np.all(np.linalg.norm(kernel[:2], axis=1) > 0)  # the informative inputs stay
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert np.all(model.layers[0].kernel.numpy()[5:] == 0.0)


def test_a_zero_group_comes_back_only_when_the_data_pulls():
    x, y = toy_data()
    for factor, comes_back in ((1e-3, True), (3.0, False)):
        model = toy_model(first=GroupLasso(factor))
        model.compile(Proximal(keras.optimizers.SGD(0.1)), "sparse_categorical_crossentropy",
                      jit_compile=NOT_ON_TORCH)
        model.build((None, 8))
        kernel = model.layers[0].kernel.numpy()
        kernel[0] = 0.0  # the most informative input, switched off
        model.layers[0].kernel.assign(kernel)
        model.fit(x, y, epochs=2, batch_size=16, verbose=0)
        assert np.any(model.layers[0].kernel.numpy()[0] != 0.0) == comes_back


def test_reported_loss_includes_the_penalty_value():
    x, y = toy_data()
    model = toy_model()
    model.compile(Proximal(keras.optimizers.SGD(0.1)), "sparse_categorical_crossentropy", jit_compile=NOT_ON_TORCH)
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    loss = model.evaluate(x, y, batch_size=len(x), verbose=0)
    probs = model.predict(x, verbose=0).astype(np.float64)
    data_loss = float(np.mean(-np.log(probs[np.arange(len(y)), y])))
    penalty = sum(float(ops.convert_to_numpy(w.regularizer(w))) for w in model.trainable_weights
                  if w.regularizer is not None)
    assert penalty > 0
    assert loss == pytest.approx(data_loss + penalty, rel=1e-4)


def test_report_penalty_false_is_accepted_for_old_files_and_warns():
    with pytest.warns(UserWarning, match="report_penalty=False has no effect"):
        opt = Proximal(keras.optimizers.SGD(0.1), report_penalty=False)
    assert "report_penalty" not in opt.get_config()


@pytest.mark.skipif(BACKEND != "tensorflow", reason="only TensorFlow builds the optimizer inside the first traced step")
def test_lazy_build_inside_the_first_step_equals_building_first():
    x, y = toy_data()
    weights = []
    for prebuild in (False, True):
        model = toy_model()
        model.compile(Proximal(keras.optimizers.Adam(1e-2)), "sparse_categorical_crossentropy", jit_compile=False)
        if prebuild:
            model.optimizer.build(model.trainable_variables)
        model.fit(x, y, epochs=2, batch_size=32, verbose=0, shuffle=False)
        weights.append([w.numpy() for w in model.trainable_weights])
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_keras_round_trip_keeps_the_optimizer_state_and_resumes(tmp_path):
    x, y = toy_data()
    model = toy_model()
    model.compile(Proximal(keras.optimizers.Adam(1e-2), name="prox"), "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, shuffle=False)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects: everything is registered
    assert isinstance(loaded.optimizer, Proximal)
    assert isinstance(loaded.optimizer.inner_optimizer, keras.optimizers.Adam)
    assert loaded.optimizer.name == "prox"
    assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 8
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert isinstance(loaded.layers[0].kernel_regularizer, SparseGroupLasso)
    assert loaded.layers[0].kernel.regularizer == loaded.layers[0].kernel_regularizer
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, shuffle=False)
    loaded.fit(x, y, epochs=2, batch_size=32, verbose=0, shuffle=False)
    for a, b in zip(model.trainable_weights, loaded.trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.quick
def test_get_config_round_trip_and_keras_serialization():
    opt = Proximal(keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), metric="euclidean", name="p")
    config = opt.get_config()
    assert config == {"name": "p", "optimizer": config["optimizer"], "metric": "euclidean",
                      "jit_compile_step": "auto"}
    again = Proximal.from_config(config)
    assert again.get_config() == config
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(restored, Proximal)
    assert restored.get_config() == config
    assert restored.inner_optimizer.get_config() == opt.inner_optimizer.get_config()


# ---------------------------------------------------------------- arguments


def test_metric_auto_resolves_per_optimizer():
    for cls in (keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.RMSprop,
                keras.optimizers.Adagrad, keras.optimizers.Nadam, keras.optimizers.Adamax):
        assert Proximal(cls()).resolved_metric == "optimizer"
    assert Proximal(keras.optimizers.Adam(), metric="euclidean").resolved_metric == "euclidean"
    with pytest.warns(UserWarning, match="the step metric of Lion is not known"):
        assert Proximal(keras.optimizers.Lion()).resolved_metric == "euclidean"
    assert Proximal("adam").resolved_metric == "optimizer"


def bad(message, *args, **kwargs):
    with pytest.raises(InvalidParameterError) as info:
        Proximal(*args, **kwargs)
    assert str(info.value) == message


@pytest.mark.quick
def test_bad_arguments_are_rejected_with_the_message_form():
    need = "a keras.optimizers.Optimizer (or a name keras.optimizers.get resolves)"
    bad(f"Proximal: argument `optimizer` must be {need}; received 3.", 3)
    bad(f"Proximal: argument `optimizer` must be {need}; received 'no-such-optimizer'.", "no-such-optimizer")
    bad(f"Proximal: argument `optimizer` must be {need}; received None.", None)
    bad(f"Proximal: argument `optimizer` must be {need}; received {{'bogus': 1}}.", {"bogus": 1})  # was a KeyError
    bad("Proximal: argument `metric` must be one of 'auto', 'optimizer', 'euclidean'; received 'adam'.",
        keras.optimizers.SGD(), metric="adam")
    bad("Proximal: argument `metric` must be 'euclidean' or 'auto' for an optimizer whose step metric is not "
        "known (Lion); 'optimizer' supports SGD, Adam, AdamW, Nadam, Adamax, RMSprop and Adagrad; "
        "received 'optimizer'.", keras.optimizers.Lion(), metric="optimizer")
    bad("Proximal: argument `report_penalty` must be True or False; received 'yes'.",
        keras.optimizers.SGD(), report_penalty="yes")
    bad("Proximal: argument `clipnorm` must be set on the wrapped optimizer, not on Proximal; received 1.0.",
        keras.optimizers.SGD(), clipnorm=1.0)

    def rejected(optimizer, constraint):
        with pytest.raises(InvalidParameterError) as info:
            Proximal(optimizer)
        assert str(info.value) == f"Proximal: argument `optimizer` must be {constraint}; received {optimizer!r}."

    rejected(Proximal(keras.optimizers.SGD()), "an optimizer that is not already a Proximal")
    rejected(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
             "an optimizer that is not a LossScaleOptimizer (wrap Proximal in it instead)")
    built = keras.optimizers.SGD()
    built.build([keras.Variable(np.ones(2, np.float32))])
    rejected(built, "an optimizer that is not built yet")
    rejected(keras.optimizers.Adam(use_ema=True),
             "an optimizer without use_ema (its averaged weights are never exactly sparse)")
    rejected(keras.optimizers.Adam(gradient_accumulation_steps=2), "an optimizer without gradient_accumulation_steps")


def test_apply_before_build_without_variables_is_an_error():
    with pytest.raises(ValueError, match="call `optimizer.build"):
        Proximal(keras.optimizers.SGD()).apply([np.ones(2, np.float32)])


# ---------------------------------------------------------------- tf.distribute

MIRRORED = textwrap.dedent(
    """
    import os
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import numpy as np
    import keras
    from keras_group_lasso import GroupLasso, Proximal, SparseGroupLasso

    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype("float32")
    x[:, 5:] = 0.0
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")

    def train(strategy, make):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((8,)),
                keras.layers.Dense(6, activation="relu", kernel_regularizer=SparseGroupLasso(0.1)),
                keras.layers.Dense(2, kernel_regularizer=GroupLasso(1e-3)),
            ])
            # jit_compile=False: XLA cannot place a MirroredStrategy over logical
            # CPU devices, with or without Proximal.
            model.compile(Proximal(make()), "sparse_categorical_crossentropy", jit_compile=False)
        model.fit(x, y, epochs=2, batch_size=8, verbose=0, shuffle=False)
        return [w.numpy() for w in model.trainable_weights]

    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    for make in (lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(1e-2)):
        a = train(mirrored, make)
        b = train(tf.distribute.get_strategy(), make)
        assert all(np.isfinite(w).all() for w in a)
        assert np.all(a[0][5:] == 0.0), a[0]
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, atol=1e-3)

    def coupled(strategy):  # a shortcut from the input: features are coupled groups, stepped jointly
        from keras_group_lasso import add_group_sparsity

        keras.utils.set_random_seed(0)
        with strategy.scope():
            inputs = keras.Input((8,))
            g = keras.layers.Dense(8, name="g")(keras.layers.Dense(4, activation="relu", name="g_in")(inputs))
            out = keras.layers.Dense(2, name="out")(keras.layers.Add()([inputs, g]))
            model = add_group_sparsity(keras.Model(inputs, out), 0.05, penalty="group", bias=False)
            model.compile(Proximal(keras.optimizers.SGD(0.1)), "sparse_categorical_crossentropy", jit_compile=False)
        model.fit(x, y, epochs=10, batch_size=32, verbose=0, shuffle=False)
        return [w.numpy() for w in model.trainable_weights]

    a, b = coupled(mirrored), coupled(tf.distribute.get_strategy())
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, atol=1e-4)
    print("OK")
    """
)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute.MirroredStrategy is TensorFlow-only")
def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED)
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


# ---------------------------------------------------------------- the model is the user's


def shrink_model(dtype="float32"):
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, kernel_regularizer=GroupLasso(0.05), dtype=dtype),
            keras.layers.Dense(3, kernel_regularizer=SparseGroupLasso(0.02, l1=0.01), dtype=dtype),
            keras.layers.Activation("linear", dtype="float32"),
        ]
    )


def declared_shrink_model():
    """``shrink_model`` as a functional model (on JAX a plain Sequential cannot declare its penalties' state)."""
    sequential = shrink_model()
    model = keras.Model(sequential.inputs, sequential.outputs)
    declare_group_penalties(model)
    return model


SHRINK_X = np.random.default_rng(3).normal(size=(16, 5)).astype(np.float32)
SHRINK_Y = np.zeros((16, 3), np.float32)
NO_DATA = np.zeros(16, np.float32)  # sample weights 0: the data gradient is exactly 0


def kernels(model):
    return [as_np(layer.kernel) for layer in model.layers if isinstance(layer, keras.layers.Dense)]


def penalties_of(model):
    return [layer.kernel_regularizer for layer in model.layers if isinstance(layer, keras.layers.Dense)]


def expected_step(before, regs, proximal, lr):
    """One step with no data gradient: the penalty's gradient step, or its proximal step."""
    out = []
    for w, reg in zip(before, regs):
        if proximal:
            out.append(as_np(prox.sparse_group_soft_threshold(w.astype(np.float32), lr * reg.factor, lr * reg.l1)))
        else:
            out.append(w - lr * np_penalty_gradient(w, reg))
    return out


def one_step(model):
    model.fit(SHRINK_X, SHRINK_Y, sample_weight=NO_DATA, batch_size=16, epochs=1, verbose=0, shuffle=False)


LR = 0.5
STEPS = st.lists(st.sampled_from(["proximal", "sgd", "fit", "clone", "save_load"]), min_size=2, max_size=7)


@settings(max_examples=6, deadline=None)
@given(STEPS)
def test_penalty_gradient_is_applied_exactly_when_the_optimizer_is_not_proximal(steps):
    """Any sequence of compile / fit / re-compile / clone / save-load: the penalty is never switched off."""
    import tempfile

    model = shrink_model()
    active = None  # "proximal", "sgd" or None (not compiled)
    with tempfile.TemporaryDirectory() as tmp:
        for i, step in enumerate(steps + ["fit"]):
            if step in ("proximal", "sgd"):
                optimizer = Proximal(keras.optimizers.SGD(LR)) if step == "proximal" else keras.optimizers.SGD(LR)
                model.compile(optimizer, "mean_squared_error")
                active = step
            elif step == "clone":
                copy = keras.models.clone_model(model)
                copy.set_weights(model.get_weights())
                model, active = copy, None
            elif step == "save_load" and active is not None:
                path = os.path.join(tmp, f"m{i}.keras")
                model.save(path)
                model = keras.saving.load_model(path)
                assert isinstance(model.optimizer, Proximal) == (active == "proximal")
            elif step == "fit":
                if active is None:
                    model.compile(keras.optimizers.SGD(LR), "mean_squared_error")
                    active = "sgd"
                before = kernels(model)
                one_step(model)
                expected = expected_step(before, penalties_of(model), active == "proximal", LR)
                for got, want in zip(kernels(model), expected):
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            for variable in model.trainable_variables:  # the declared penalties are untouched
                assert variable.regularizer is None or type(variable.regularizer) in (GroupLasso, SparseGroupLasso)


def test_recompiling_after_proximal_trains_with_the_penalty_gradient():
    model = shrink_model()
    model.compile(Proximal(keras.optimizers.SGD(LR)), "mean_squared_error")
    one_step(model)
    for make in (lambda m: m, lambda m: keras.models.clone_model(m)):
        again = make(model)
        again.set_weights(model.get_weights())
        again.compile(keras.optimizers.Adam(0.1), "mean_squared_error")
        before = kernels(again)
        one_step(again)
        # Adam's first step moves every weight with a non-zero gradient by ~lr: the penalty is active.
        moved = np.abs(kernels(again)[0] - before[0])
        live = np.linalg.norm(before[0], axis=1) > 0
        assert np.all(moved[live] > 0.05)


def assert_a_second_model_is_refused(first, second):
    """One Proximal compiled into ``first`` (trained a step), then into ``second`` (the same shapes): the second's
    first step is refused with nothing changed, and the first still trains with it."""
    optimizer = Proximal(keras.optimizers.SGD(0.1))
    first.compile(optimizer, "mean_squared_error")
    one_step(first)
    second.compile(optimizer, "mean_squared_error")
    before = kernels(second)
    with pytest.raises(ValueError, match=r"was built for the 4 trainable variables of another model .* "
                                         r"Give each model its own optimizer"):
        one_step(second)
    for a, b in zip(kernels(second), before):
        np.testing.assert_array_equal(a, b)
    one_step(first)


@pytest.mark.skipif(BACKEND == "jax", reason="a compiled JAX step passes values, not variables: a second model "
                    "of the same shapes whose penalties no model declares cannot be told from the first without "
                    "reading the call stack (declared ones can: the test below)")
def test_one_proximal_compiled_into_two_models_is_refused():
    assert_a_second_model_is_refused(shrink_model(), shrink_model())  # only the variables tell them apart


def test_one_proximal_compiled_into_two_penalised_models_is_refused_on_every_backend():
    # Models whose penalties add_group_sparsity declared: their penalties ask the model's optimizer whether it
    # applies them, which is where JAX too can tell (its compiled step hands the optimizer values only).
    assert_a_second_model_is_refused(add_group_sparsity(shrink_model(), 0.05),
                                     add_group_sparsity(shrink_model(), 5.0))  # another strength


def test_building_for_other_variables_is_refused():
    optimizer = Proximal(keras.optimizers.Adam())
    optimizer.build([keras.Variable(np.ones((2, 2), np.float32))])
    with pytest.raises(ValueError, match="was built for the 1 trainable variables of another model"):
        optimizer.build([keras.Variable(np.ones((2, 2), np.float32))])


DTYPES = ["float16", "bfloat16", "float32"] + (["float64"] if BACKEND == "tensorflow" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner", ["sgd", "adam"])
def test_proximal_step_works_in_every_float_dtype(dtype, inner):
    # Keras sums the loss terms in one dtype: a float64 penalty needs a float64 loss.
    floatx = keras.config.floatx()
    keras.config.set_floatx("float64" if dtype == "float64" else floatx)
    try:
        check_proximal_step_in_dtype(dtype, inner)
    finally:
        keras.config.set_floatx(floatx)


def check_proximal_step_in_dtype(dtype, inner):
    model = shrink_model(dtype)
    make = keras.optimizers.SGD if inner == "sgd" else keras.optimizers.Adam
    model.compile(Proximal(make(LR)), "mean_squared_error")
    before = kernels(model)
    one_step(model)
    after = kernels(model)
    assert all(str(layer.kernel.dtype).endswith(dtype) for layer in model.layers[:2])
    assert all(np.all(np.isfinite(w)) for w in after)
    if inner == "sgd":
        tolerance = {"float16": 2e-3, "bfloat16": 2e-2}.get(dtype, 1e-6)
        for got, want in zip(after, expected_step(before, penalties_of(model), True, LR)):
            np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    model.fit(SHRINK_X, SHRINK_Y, batch_size=8, epochs=3, verbose=0)
    assert all(np.all(np.isfinite(w)) for w in kernels(model))


@pytest.mark.parametrize("make", [lambda: keras.optimizers.SGD(0.5), lambda: keras.optimizers.Adam(0.5)],
                         ids=["sgd", "adam"])
def test_proximal_step_takes_whole_channels_of_a_flattened_map(make, rng):
    w0 = rng.normal(size=(12, 3)).astype(np.float32)
    w0[2::4] *= 1e-3  # channel 2 of 4, at all 3 positions: a weak group
    reg = GroupLasso(0.2, channels=4)
    v = penalized_variable(w0, reg)
    opt = Proximal(make())
    opt.build([v])
    if isinstance(opt.inner_optimizer, keras.optimizers.SGD):
        opt.apply([as_np(reg.gradient(w0)).astype(np.float32)], [v])  # no data gradient
        after = v.numpy()
        np.testing.assert_allclose(after, as_np(reg.prox(w0, 0.5)), rtol=1e-5, atol=1e-6)
        assert np.all(after[2::4] == 0.0)
    else:
        g = rng.normal(size=w0.shape).astype(np.float32)
        g[2::4] = 0.0  # no data pull on channel 2
        opt.apply([g + as_np(reg.gradient(w0)).astype(np.float32)], [v])
        after = v.numpy()
    # Zeros come in whole channels: each channel is zero at every position, or at none.
    per_row_zero = np.all(after == 0.0, axis=1).reshape(3, 4)
    assert np.all(per_row_zero.all(axis=0) == per_row_zero.any(axis=0))
    assert per_row_zero[:, 2].all()


# ---------------------------------------------------------------- value in the loss, step by the prox


def penalty_total(model):
    return ops.sum(ops.stack([ops.cast(loss, "float32") for loss in model.losses]))


@pytest.mark.parametrize("declared", [True, False])
def test_a_model_compiled_with_proximal_reads_its_penalties_as_values_without_gradient(declared):
    """Declared by their model, the penalties of a model compiled with `Proximal` give their value only.

    Penalties no model declared keep their gradient (the proximal step then removes it).
    """
    model = declared_shrink_model() if declared else shrink_model()
    closed_form = [np_penalty_gradient(w, reg) for w, reg in zip(kernels(model), penalties_of(model))]
    value = float(as_np(penalty_total(model)))

    def penalty_gradients():
        grads = _autodiff.model_gradients(model, lambda: penalty_total(model))
        return [g for g, v in zip(grads, model.trainable_variables) if len(v.shape) == 2]

    for got, want in zip(penalty_gradients(), closed_form):  # not compiled: the penalty's gradient
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for optimizer in (Proximal(keras.optimizers.SGD(LR)),
                      keras.optimizers.LossScaleOptimizer(Proximal(keras.optimizers.SGD(LR)))):
        model.compile(optimizer, "mean_squared_error")
        assert float(as_np(penalty_total(model))) == pytest.approx(value, rel=1e-6)  # the value is the same
        assert all(p.value_only == declared for p in penalties_of(model))
        if declared:
            assert all(not g.any() for g in penalty_gradients())  # the proximal step applies them
        else:
            for got, want in zip(penalty_gradients(), closed_form):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    model.compile(keras.optimizers.SGD(LR), "mean_squared_error")  # another optimizer: the gradient again
    for got, want in zip(penalty_gradients(), closed_form):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not any(p.value_only for p in penalties_of(model))


@pytest.mark.parametrize("how", ["not compiled", "compiled", "compiled, layers' losses", "declared, compiled",
                                 "declared, not compiled", "declared, compiled, layers' losses"])
def test_a_custom_loop_step_equals_a_fit_step(how):
    """Gradient of loss + penalties by hand, then `Proximal.apply`: the step `fit` takes, however the penalties were read.

    Read from `model.losses` of the model compiled with this `Proximal`, they
    carry no gradient; read any other way, they do and `apply` removes it.
    """
    x = SHRINK_X
    y = np.random.default_rng(4).normal(size=(16, 3)).astype(np.float32)
    reference = shrink_model()
    reference.compile(Proximal(keras.optimizers.SGD(LR)), "mean_squared_error")
    reference.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)

    model = declared_shrink_model() if how.startswith("declared") else shrink_model()
    optimizer = Proximal(keras.optimizers.SGD(LR))
    if "not compiled" not in how:
        model.compile(optimizer, "mean_squared_error")

    def penalties():
        if how.endswith("layers' losses"):
            return ops.sum(ops.stack([loss for layer in model.layers for loss in layer.losses]))
        return penalty_total(model)

    def total():
        return keras.losses.MeanSquaredError()(y, model(x)) + penalties()

    grads = _autodiff.model_gradients(model, total)
    value_only = how.startswith("declared") and "not compiled" not in how
    assert all(p.value_only == value_only for p in penalties_of(model))
    optimizer.apply([ops.convert_to_tensor(g) for g in grads], model.trainable_variables)
    # A penalty counted twice or not at all moves these weights by ~lr * 0.05, far beyond the tolerance.
    for got, want in zip(kernels(model), kernels(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_proximal_step_leaves_the_spared_groups_as_the_wrapped_update_left_them(rng):
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")

    def model(factor, spared):
        keras.utils.set_random_seed(3)
        penalty = GroupLasso(factor)
        penalty.spared = spared
        built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, kernel_regularizer=penalty)])
        built.compile(Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "mse")
        return built

    spared, unpenalised = model(1e3, 3), model(0.0, 0)  # the penalty empties every group it reads
    spared.train_on_batch(x, y)  # one step: the data gradients are the same in both
    unpenalised.train_on_batch(x, y)
    kernel = keras.ops.convert_to_numpy(spared.layers[1].kernel)[:, 0]
    reference = keras.ops.convert_to_numpy(unpenalised.layers[1].kernel)[:, 0]
    kept = np.flatnonzero(kernel)
    assert len(kept) == 3
    np.testing.assert_allclose(kernel[kept], reference[kept], rtol=1e-5)
    assert set(kept) == set(np.argsort(-np.abs(reference))[:3])


# ----------------------------------------------------------------------------- the proximal step compiled alone


def _residual_model():
    inp = keras.Input((16,))
    h = keras.layers.Dense(12, activation="relu", name="h")(inp)
    stream = keras.layers.Add(name="add")([h, keras.layers.Dense(12, name="branch")(h)])  # coupled groups
    out = keras.layers.Dense(3, name="out")(keras.layers.Dense(8, activation="relu", name="h2")(stream))
    return add_group_sparsity(keras.Model(inp, out), 3e-3)


def _train_with(jit_compile_step, x, y):
    keras.utils.set_random_seed(0)
    model = _residual_model()
    model.compile(Proximal(keras.optimizers.Adam(1e-2), jit_compile_step=jit_compile_step),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=50, epochs=4, verbose=0, shuffle=False)
    return model


def test_the_proximal_step_compiled_alone_is_the_eager_step(rng):
    x = rng.normal(size=(200, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0)
    eager = _train_with(False, x, y)
    compiled = _train_with(True, x, y)
    assert eager.optimizer._compiled_points is None
    if BACKEND == "torch":
        assert callable(compiled.optimizer._compiled_points)
    else:  # TensorFlow and JAX compile the whole training step already
        assert compiled.optimizer._compiled_points is None
    for a, b in zip(eager.get_weights(), compiled.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(a == 0, b == 0)  # the same exact zeros
    assert sum(int(np.sum(w == 0)) for w in compiled.get_weights()) > 0


@pytest.mark.skipif(BACKEND != "torch", reason="the step is compiled alone on PyTorch only")
def test_a_failed_compilation_leaves_the_step_eager_with_a_warning(rng, monkeypatch):
    import torch

    def broken(function, **kwargs):
        def call(*args):
            raise RuntimeError("no C++ compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    x = rng.normal(size=(200, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    eager = _train_with(False, x, y)
    with pytest.warns(RuntimeWarning, match=r"^Proximal: torch.compile of the proximal step failed \(RuntimeError: "
                                            r"no C\+\+ compiler\); the step runs eagerly from now on"):
        fallback = _train_with(True, x, y)
    assert fallback.optimizer._compiled_points is False
    for a, b in zip(eager.get_weights(), fallback.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_jit_compile_step_must_be_auto_or_a_bool(value):
    with pytest.raises(ValueError) as info:
        Proximal(keras.optimizers.SGD(0.1), jit_compile_step=value)
    assert str(info.value) == f"Proximal: argument `jit_compile_step` must be 'auto', True or False; received {value!r}."


def test_jit_compile_step_is_in_the_config():
    optimizer = Proximal(keras.optimizers.SGD(0.1), jit_compile_step=False)
    assert Proximal.from_config(optimizer.get_config()).jit_compile_step is False
    assert Proximal(keras.optimizers.SGD(0.1)).get_config()["jit_compile_step"] == "auto"


@pytest.mark.skipif(BACKEND != "jax", reason="the JAX trainer's state handling")
def test_a_train_step_jitted_by_hand_leaves_no_traced_value_in_the_optimizer():
    # Tracing model.train_step outside fit (as a custom loop or a cost analysis does) reads the optimizer's
    # variables inside the trace; the declared multiplier must not be copied into them there.
    import jax
    import jax.numpy as jnp

    model = add_group_sparsity(keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, activation="relu"),
                                                 keras.layers.Dense(3)]), 1e-3)
    model.compile(optimizer=Proximal(keras.optimizers.Adam(1e-2)), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 8), dtype=np.float32), rng.integers(0, 3, 16)
    model.train_on_batch(x, y)
    groups = (model.trainable_variables, model.non_trainable_variables, model.optimizer.variables,
              model.metrics_variables)
    state = tuple([jnp.array(v.value, copy=True) for v in variables] for variables in groups)
    jax.jit(model.train_step).lower(state, (jnp.asarray(x), jnp.asarray(y))).compile()
    assert not any(isinstance(v.value, jax.core.Tracer) for v in model.optimizer.variables)
    set_penalty_multiplier(model, 2.5)
    model.optimizer.variables  # the trainer gathering its state reads the declared multiplier afresh
    np.testing.assert_array_equal(ops.convert_to_numpy(model.optimizer.penalty_multiplier.value), [2.5, 2.5])

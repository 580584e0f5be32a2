"""The proximal operators of keras_group_lasso.prox against numpy references and brute force."""

import math

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from keras import ops
from scipy.optimize import minimize

from keras_group_lasso import SparseGroupLasso, prox


def as_np(x):
    return np.asarray(ops.convert_to_numpy(x), dtype=np.float64)


def groups_of(w):
    """numpy view of ``w`` as (n_groups, group_size): the slices along axis -2."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 1:
        return w.reshape(-1, 1)
    return np.moveaxis(w, -2, 0).reshape(w.shape[-2], -1)


def np_soft_threshold(x, t):
    return np.sign(x) * np.maximum(np.abs(x) - t, 0.0)


def np_group_soft_threshold(x, t):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        return np_soft_threshold(x, t)
    g = groups_of(x)
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    scale = np.where(norms > 0, np.maximum(0.0, 1.0 - t * math.sqrt(g.shape[1]) / np.where(norms > 0, norms, 1.0)), 0.0)
    moved = np.moveaxis(x, -2, 0)
    return np.moveaxis(moved * scale.reshape((-1,) + (1,) * (moved.ndim - 1)), 0, -2)


def sgl_objective(z, x, a, b):
    """0.5 ||z - x||^2 + a sum_g sqrt(|g|) ||z_g|| + b ||z||_1 (float64)."""
    z = np.asarray(z, np.float64).reshape(x.shape)
    g = groups_of(z)
    return 0.5 * np.sum((z - x) ** 2) + a * math.sqrt(g.shape[1]) * np.linalg.norm(g, axis=1).sum() + b * np.abs(z).sum()


# A fixed set of shapes (bias, Dense kernels incl. one-unit groups, a Conv kernel):
# JAX compiles every op once per shape, so open-ended shapes make the suite slow.
SHAPES = [(5,), (1,), (3, 4), (4, 1), (1, 3), (2, 2, 3, 2)]
shapes = st.sampled_from(SHAPES)
# Subnormal floats are excluded: XLA and oneDNN flush them to zero on CPU.
arrays = shapes.flatmap(
    lambda shape: hnp.arrays(np.float32, shape, elements=st.floats(-3, 3, width=32, allow_subnormal=False))
)
thresholds = st.floats(0.0, 2.0, width=32, allow_subnormal=False)


@settings(max_examples=30, deadline=None)
@given(x=arrays, t=thresholds)
def test_soft_threshold_matches_numpy(x, t):
    np.testing.assert_allclose(as_np(prox.soft_threshold(x, t)), np_soft_threshold(x.astype(np.float64), t), atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(x=arrays, t=thresholds)
def test_group_soft_threshold_matches_numpy(x, t):
    np.testing.assert_allclose(as_np(prox.group_soft_threshold(x, t)), np_group_soft_threshold(x, t), rtol=1e-5, atol=1e-5)


@pytest.mark.quick
@settings(max_examples=30, deadline=None)
@given(x=arrays, t=thresholds)
def test_group_soft_threshold_zero_exactly_inside_the_ball_and_scaled_outside(x, t):
    out = groups_of(as_np(prox.group_soft_threshold(x, t)))
    g = groups_of(x)
    radius = t * math.sqrt(g.shape[1]) if x.ndim > 1 else t
    norms = np.linalg.norm(g, axis=1)
    for row_in, row_out, norm in zip(g, out, norms):
        if norm <= radius * (1 - 1e-5):
            assert np.all(row_out == 0.0)  # exact zeros, not just small
        elif norm >= radius * (1 + 1e-5):
            # Same direction, norm reduced by exactly the radius.
            np.testing.assert_allclose(np.linalg.norm(row_out), norm - radius, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(row_out * norm, row_in * np.linalg.norm(row_out), rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(x=arrays)
def test_zero_threshold_is_the_identity(x):
    np.testing.assert_array_equal(as_np(prox.soft_threshold(x, 0.0)), x.astype(np.float64))
    np.testing.assert_allclose(as_np(prox.group_soft_threshold(x, 0.0)), x, rtol=1e-6, atol=0)
    np.testing.assert_allclose(as_np(prox.sparse_group_soft_threshold(x, 0.0, 0.0)), x, rtol=1e-6, atol=0)


def test_all_zero_group_stays_zero_without_nan():
    x = np.zeros((3, 4), np.float32)
    x[1] = [1.0, -2.0, 0.5, 0.0]
    for t in (0.0, 0.1, 10.0):
        out = as_np(prox.sparse_group_soft_threshold(x, t, t))
        assert not np.isnan(out).any()
        assert np.all(out[[0, 2]] == 0.0)


@pytest.mark.quick
def test_group_soft_threshold_known_answer():
    x = np.array([[3.0, 4.0], [0.1, 0.1]], np.float32)
    out = as_np(prox.group_soft_threshold(x, 1.0 / math.sqrt(2)))
    np.testing.assert_allclose(out, [[2.4, 3.2], [0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (3, 2), (2, 1, 2, 2)])
def test_sparse_group_prox_equals_brute_force_minimization(shape, rng):
    for _ in range(4):
        x = rng.normal(scale=1.5, size=shape)
        a, b = rng.uniform(0, 0.8), rng.uniform(0, 0.8)
        z = as_np(prox.sparse_group_soft_threshold(x.astype(np.float32), a, b))
        best = None
        # The objective is 1-strongly convex: any good local search finds the
        # minimizer; start from several points, including 0 and x.
        for start in (np.zeros(x.size), x.ravel(), rng.normal(size=x.size)):
            result = minimize(sgl_objective, start, args=(x, a, b), method="Powell",
                              options={"xtol": 1e-10, "ftol": 1e-14, "maxiter": 20000})
            if best is None or result.fun < best.fun:
                best = result
        # F(z) - F(z*) >= 0.5 ||z - z*||^2: compare the values, then the points.
        assert sgl_objective(z, x, a, b) <= best.fun + 1e-6
        np.testing.assert_allclose(z.ravel(), best.x, atol=2e-3)


@settings(max_examples=25, deadline=None)
@given(x=arrays, a=thresholds, b=thresholds)
def test_sparse_group_prox_is_soft_then_group_threshold(x, a, b):
    expected = np_group_soft_threshold(np_soft_threshold(x.astype(np.float64), b), a)
    np.testing.assert_allclose(as_np(prox.sparse_group_soft_threshold(x, a, b)), expected, rtol=1e-5, atol=1e-5)


def test_regularizer_prox_uses_step_times_strengths(rng):
    x = rng.normal(size=(5, 4)).astype(np.float32)
    reg = SparseGroupLasso(0.3, l1=0.1)
    expected = np_group_soft_threshold(np_soft_threshold(x.astype(np.float64), 0.5 * 0.1), 0.5 * 0.3)
    np.testing.assert_allclose(as_np(reg.prox(x, 0.5)), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0,), (2, 0, 4), (0, 0)])
def test_empty_weights_have_penalty_zero_and_an_empty_prox(shape):
    w = np.zeros(shape, np.float32)
    assert prox.group_size((0, 3)) == 3
    assert float(as_np(prox.group_sparse_penalty(w, 0.1, 0.1))) == 0.0
    assert float(as_np(SparseGroupLasso(0.1)(w))) == 0.0
    assert as_np(prox.sparse_group_soft_threshold(w, 0.1, 0.1)).shape == shape
    assert as_np(SparseGroupLasso(0.1).prox(w, 0.01)).shape == shape
    assert as_np(prox.group_norms(w)).shape == ((shape[-2],) if len(shape) > 1 else shape)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_penalty_and_gradient_are_float32_or_wider_for_backend_tensors(dtype):
    """A backend tensor (not only a Keras variable, whose dtype is a string) keeps float64 wide."""
    x = ops.convert_to_tensor(np.array([[3.0, 4.0], [0.0, 1.0]]), dtype=dtype)
    if keras.backend.standardize_dtype(x.dtype) != dtype:
        pytest.skip(f"this backend makes {x.dtype} tensors of {dtype} (JAX without x64)")
    wide = "float64" if dtype == "float64" else "float32"
    value = prox.group_sparse_penalty(x, 0.5, 0.1)
    assert keras.backend.standardize_dtype(value.dtype) == wide
    assert keras.backend.standardize_dtype(prox.group_sparse_gradient(x, 0.5, 0.1).dtype) == dtype
    assert float(ops.convert_to_numpy(value)) == pytest.approx(0.5 * math.sqrt(2) * (5.0 + 1.0) + 0.1 * 8.0, rel=1e-2)


@pytest.mark.parametrize("shape", [(5,), (4, 3), (2, 3, 4)])
def test_the_value_alone_equals_the_penalty_and_has_no_gradient(shape):
    import _autodiff

    w = np.random.default_rng(7).normal(size=shape).astype(np.float32)
    w[0] = 0.0  # a zero group
    full = prox.group_sparse_penalty(w, 0.3, 0.1)
    alone = prox.group_sparse_penalty(w, 0.3, 0.1, gradient=False)
    assert float(ops.convert_to_numpy(alone)) == pytest.approx(float(ops.convert_to_numpy(full)), rel=1e-6)
    assert not _autodiff.gradient(lambda x: prox.group_sparse_penalty(x, 0.3, 0.1, gradient=False), w).any()
    assert _autodiff.gradient(lambda x: prox.group_sparse_penalty(x, 0.3, 0.1), w).any()


@pytest.mark.parametrize("products", [True, False], ids=["products", "reductions"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_long_groups_match_numpy(dtype, products, monkeypatch):
    """Sums over more than 32 values (on TensorFlow on CPU a product with ones, longer than XLA's whole
    reduction there; both forms forced here on every backend): norms, value, gradient (autodiff too, through a
    zero group) and both proximal steps are the numpy ones."""
    import _autodiff

    monkeypatch.setattr(prox, "_sums_as_products", lambda: products)
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(6, 400)) * np.array([[1.0], [0.5], [0.0], [2.0], [0.7], [1.2]])).astype(dtype)  # row 2: 0
    d = rng.uniform(0.5, 2.0, size=x.shape).astype(dtype)
    if keras.backend.standardize_dtype(ops.convert_to_tensor(x).dtype) != dtype:
        pytest.skip(f"this backend makes {dtype} arrays float32 (JAX without x64)")
    a, b, n = 0.8, 0.1, 400  # group threshold 16 against norms of about 20, 10, 0, 40, 14 and 24
    wide = x.astype(np.float64)
    norms = np.linalg.norm(wide, axis=1)
    assert as_np(prox.group_norms(x)) == pytest.approx(norms, rel=1e-6)
    value = a * math.sqrt(n) * norms.sum() + b * np.abs(wide).sum()
    assert float(as_np(prox.group_sparse_penalty(x, a, b))) == pytest.approx(value, rel=1e-6)
    assert float(as_np(prox.group_sparse_penalty(x, a, b, gradient=False))) == pytest.approx(value, rel=1e-6)
    inverse = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)[:, None]
    gradient = a * math.sqrt(n) * wide * inverse + b * np.sign(wide)
    np.testing.assert_allclose(as_np(prox.group_sparse_gradient(x, a, b)), gradient, rtol=1e-5, atol=1e-6)
    through = _autodiff.gradient(lambda w: prox.group_sparse_penalty(w, a, b), x)
    assert np.all(np.isfinite(through)) and not through[2].any()  # the zero group: no NaN, no push
    np.testing.assert_allclose(through, gradient, rtol=1e-4, atol=1e-5)
    expected = np_group_soft_threshold(np_soft_threshold(wide, b), a)
    assert (np.abs(expected).max(axis=1) > 0).tolist() == [True, False, False, True, False, True]
    np.testing.assert_allclose(as_np(prox.sparse_group_soft_threshold(x, a, b)), expected, rtol=1e-5, atol=1e-6)
    s = np.sign(wide) * np.maximum(np.abs(wide) - b / d, 0.0)
    q_norms = np.linalg.norm(d * s, axis=1, keepdims=True)
    weighted = s * np.maximum(0.0, 1.0 - a * math.sqrt(n) / np.where(q_norms > 0, q_norms, 1.0))
    np.testing.assert_allclose(as_np(prox.weighted_sparse_group_soft_threshold(x, d, a, b)), weighted,
                               rtol=1e-5, atol=1e-6)
    # Many groups (their norms summed) and a long bias (its absolute values summed).
    many = rng.normal(size=(40, 50)).astype(dtype)
    value = a * math.sqrt(50) * np.linalg.norm(many.astype(np.float64), axis=1).sum() + b * np.abs(many).sum()
    bias = rng.normal(size=(400,)).astype(dtype)
    for gradient in (True, False):
        assert float(as_np(prox.group_sparse_penalty(many, a, b, gradient=gradient))) == pytest.approx(value, rel=1e-6)
        assert float(as_np(prox.group_sparse_penalty(bias, a, b, gradient=gradient))) == pytest.approx(
            (a + b) * np.abs(bias.astype(np.float64)).sum(), rel=1e-6)


def test_long_sums_are_products_on_tensorflow_on_cpu_only():
    on_cpu_tensorflow = keras.backend.backend() == "tensorflow" and not any(
        d.device_type in ("GPU", "TPU") for d in __import__("tensorflow").config.list_logical_devices())
    assert prox._sums_as_products() == on_cpu_tensorflow

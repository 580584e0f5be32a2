"""Pure ``keras.ops`` maths of group sparsity: norms, penalties, proximal operators.

A *group* is all outgoing weights of one unit. For a tensor of rank >= 2 the
groups are the slices along the input axis (axis -2): the rows ``W[i, :]`` of
a Dense kernel ``(in, out)``, the slices ``W[..., i, :]`` of a Conv kernel
``(..., in_ch, out_ch)``. For a rank-1 tensor (a bias) every scalar is its own
group. Nothing here knows about layers or models; every function works on the
TensorFlow, JAX and PyTorch backends and under ``jit_compile``.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_group_lasso._backend import tensorflow_on_cpu

__all__ = [
    "group_axes",
    "group_size",
    "group_norms",
    "safe_abs",
    "group_sparse_penalty",
    "group_sparse_gradient",
    "soft_threshold",
    "group_soft_threshold",
    "sparse_group_soft_threshold",
    "weighted_sparse_group_soft_threshold",
    "sgl_step",
    "weighted_sgl_step",
    "compute_dtype",
    "coupled_group_factors",
]


def _check_rank(shape, owner):
    if len(shape) == 0:
        raise ValueError(
            f"{owner}: expected a weight tensor of rank >= 1 (a bias or a kernel); "
            "received a scalar (rank 0), which has no groups."
        )


def group_axes(shape):
    """Axes summed over inside one group: every axis but -2 (``()`` for rank 1).

    Example:
        >>> group_axes((64, 40))
        (1,)
        >>> group_axes((3, 3, 16, 32))
        (0, 1, 3)
    """
    rank = len(shape)
    if rank < 2:
        return ()
    return tuple(a for a in range(rank) if a != rank - 2)


def group_size(shape):
    """Number of weights in one group, ``|g| = prod(shape) / shape[-2]`` (1 for rank 1).

    The product of every dimension but ``-2``, so a weight without groups
    (``shape[-2] == 0``) still has a group size, and its penalty is 0.

    Example:
        >>> group_size((64, 40))
        40
        >>> group_size((0, 40))
        40
    """
    shape = tuple(shape)
    if len(shape) < 2:
        return 1
    # A list, not a generator: torch.compile traces math.prod of a list without a graph break.
    return math.prod([int(d) for d in shape[:-2] + shape[-1:]])


def _as_tensor(x):
    x = ops.convert_to_tensor(x)
    _check_rank(tuple(x.shape), "group sparsity")
    return x


def group_norms(x):
    """Euclidean norm of every group, ``||g||_2``, one value per unit along axis -2.

    The result has shape ``(shape[-2],)`` for rank >= 2 and ``|x|`` for rank 1.
    Its gradient is finite everywhere and 0 at an all-zero group (a plain
    ``sqrt(sum(x**2))`` gives NaN there).

    Example:
        >>> x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype="float32")
        >>> ops.convert_to_numpy(group_norms(x))
        array([5., 0.], dtype=float32)
    """
    x = _as_tensor(x)
    axes = group_axes(tuple(x.shape))
    if not axes:
        return safe_abs(x)
    sq = ops.sum(ops.square(x), axis=axes)
    positive = ops.greater(sq, 0)
    # Double `where`: the untaken branch never sees sqrt(0), so no NaN gradient.
    safe_sq = ops.where(positive, sq, ops.ones_like(sq))
    return ops.where(positive, ops.sqrt(safe_sq), ops.zeros_like(sq))


def safe_abs(x):
    """``|x|`` whose gradient is ``sign(x)``, i.e. exactly 0 at ``x = 0`` on every backend.

    (TensorFlow and JAX disagree on the derivative of ``abs`` at 0; the paper
    and Theano use 0.)
    """
    return ops.multiply(x, ops.stop_gradient(ops.sign(x)))


def group_sparse_penalty(x, group_factor, l1_factor=0.0, gradient=True):
    """Sparse group Lasso value ``a * sum_g sqrt(|g|) ||g||_2 + b * sum |x|``.

    With ``a = group_factor`` and ``b = l1_factor``. On a rank-1 tensor every
    scalar is a group, so the value is ``(a + b) * sum |x|``. The gradient is
    defined explicitly, identical on TensorFlow, JAX and PyTorch, finite everywhere:
    ``a * sqrt(|g|) * g / ||g||`` (0 for a zero group, and for a group whose
    squared norm underflows, i.e. all ``|w| < ~1e-19`` in float32) plus
    ``b * sign(x)`` (0 at ``x = 0``, the paper's subgradient choice).

    The sum is taken in float32 at least, so float16 / bfloat16 weights
    neither overflow nor lose the small terms; the result is float32 (or the
    input dtype when wider).

    Args:
        x: weight tensor of rank >= 1.
        group_factor: ``a >= 0``.
        l1_factor: ``b >= 0``.
        gradient: ``False`` gives the value alone, with no gradient (no
            autodiff record, e.g. when a proximal step applies the penalty).

    Returns:
        A scalar tensor.

    Example:
        >>> round(float(group_sparse_penalty(np.ones((4, 9)), 0.1)), 6)   # 0.1 * 4 groups * sqrt(9) * 3
        3.6
    """
    x = _as_tensor(x)
    shape = tuple(x.shape)
    dtype = compute_dtype(x.dtype)
    axes = group_axes(shape)
    a = float(group_factor)
    b = float(l1_factor)
    if not gradient:  # stop_gradient reads a variable; a cast op only where the dtype changes
        x = ops.stop_gradient(x if keras.backend.standardize_dtype(x.dtype) == dtype else ops.cast(x, dtype))
        if not axes:
            return (a + b) * _vector_sum(ops.abs(x))
        return _value(x, _group_norm(x), a * math.sqrt(group_size(shape)), b)
    x = ops.cast(x, dtype)  # a tensor, not a variable, inside the custom gradient
    if not axes:
        return _l1_only(x, a + b)
    scale = a * math.sqrt(group_size(shape))
    return _sgl(x, scale, b)


def _l1_only(x, c):
    # The gradient recomputes sign(w) from w instead of keeping it from the forward
    # pass: one weight-sized array less to write and read back in every step.
    @ops.custom_gradient
    def penalty(w):
        value = c * _vector_sum(ops.abs(w))

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return ops.multiply(upstream, c * ops.sign(w))

        return value, grad

    return penalty(x)


# The longest reduction XLA's CPU compiler in TensorFlow keeps whole: over more elements it splits
# one into a reduce-window and a reduce (its TreeReductionRewriter) and fuses neither with the
# elementwise op that feeds it. A group norm of 400 weights is then three kernels of every training
# step (squares, reduce-window, reduce), the L1 sum of a bias three (abs, reduce-window, reduce),
# the sum of 784 group norms two. The same sums as a product with a vector of ones are one kernel
# each there, the squares or absolute values fused into it. JAX's XLA fuses the row reductions
# itself and gains nothing from a product, PyTorch runs its own kernels: the products are taken on
# TensorFlow on CPU only (a sum over all the weights of a kernel stays a reduction everywhere: XLA
# fuses that one better).
_LONGEST_WHOLE_REDUCTION = 32


def _sums_as_products():
    """Whether long sums are taken as a product with ones (see ``_LONGEST_WHOLE_REDUCTION``).

    Not on a GPU or TPU: XLA fuses the elementwise op into the reduction there, and a product would be a
    kernel more, in the lower precision their matrix products may use by default (TF32, bfloat16).
    """
    return tensorflow_on_cpu()


def _vector_sum(x):
    """The sum of ``x``, a vector (a bias) or one value per group (norms kept as a column, say)."""
    dims = tuple(x.shape)
    n = math.prod(dims) if all(isinstance(d, int) for d in dims) else 0
    if n > _LONGEST_WHOLE_REDUCTION and _sums_as_products():
        # A reshape of a vector or a column is free; vector times vector is a scalar.
        return ops.matmul(ops.reshape(x, (n,)), ops.ones((n,), keras.backend.standardize_dtype(x.dtype)))
    return ops.sum(x)


def _group_norm(x):
    """``||g||_2`` of every group of ``x`` (rank >= 2), kept as ``(1, ..., groups, 1)``: one reduction.

    One norm op instead of a square and a sum: one pass over the weights
    where the ops run one by one (eager PyTorch and TensorFlow), the same
    fused reduction under XLA. Rank > 3 is seen as ``(prod(shape[:-2]),
    groups, out)`` (a free reshape) so that every backend's norm takes it.
    A rank-2 ``x`` with long rows on TensorFlow on CPU: the squares times a
    column of ones (see ``_LONGEST_WHOLE_REDUCTION``), the same sums.
    """
    shape = tuple(x.shape)
    if len(shape) == 2:
        n = shape[1]
        if isinstance(n, int) and n > _LONGEST_WHOLE_REDUCTION and _sums_as_products():
            ones = ops.ones((n, 1), keras.backend.standardize_dtype(x.dtype))
            return ops.sqrt(ops.matmul(ops.square(x), ones))
        return ops.norm(x, axis=1, keepdims=True)
    view = (math.prod([int(d) for d in shape[:-2]]), shape[-2], shape[-1])
    norms = ops.norm(ops.reshape(x, view), axis=(0, 2), keepdims=True)
    return norms if len(shape) == 3 else ops.reshape(norms, (1,) * (len(shape) - 2) + (shape[-2], 1))


def _value(w, norms, scale, b):
    """``scale * sum(norms) + b * sum |w|``: the penalty from the group norms of ``w``."""
    value = scale * _vector_sum(norms)
    return value + b * ops.sum(ops.abs(w)) if b else value


def _sgl_value(w, scale, b):
    """``(value, 1 / ||g||)``: the penalty and the inverse group norms (0 for a zero group)."""
    norms = _group_norm(w)
    return _value(w, norms, scale, b), _inverse(norms)


def _sgl(x, scale, b):
    @ops.custom_gradient
    def penalty(w):
        value, inv_norm = _sgl_value(w, scale, b)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            # sign(w) recomputed here, not kept from the forward pass (see _l1_only); the
            # upstream scalar goes into the per-group scale and the l1 factor, not over w.
            upstream = ops.cast(upstream, w.dtype)
            return _sgl_gradient(w, upstream * (scale * inv_norm), upstream * b if b else 0.0)

        return value, grad

    return penalty(x)


def _inverse(norms):
    """``1 / norms``, and 0 where a norm is 0 (double ``where``: no NaN, no inf)."""
    positive = ops.greater(norms, 0)
    return ops.where(positive, 1.0 / ops.where(positive, norms, ops.ones_like(norms)), 0.0)


def _sgl_gradient(w, group_scale, b):
    # The one formula of the penalty gradient: the regularizers' custom gradient
    # and group_sparse_gradient (which Proximal subtracts) both end here.
    g = ops.multiply(w, group_scale)
    if not isinstance(b, float) or b:
        g = g + b * ops.sign(w)
    return g


def group_sparse_gradient(x, group_factor, l1_factor=0.0):
    """Gradient of :func:`group_sparse_penalty`, in closed form, in the dtype of ``x``.

    ``a * sqrt(|g|) * g / ||g||_2 + b * sign(x)`` with 0 for an all-zero group
    (and for a group whose squared norm underflows) and ``sign(0) = 0``: the
    subgradient the penalty's own gradient uses, computed by the same code. On
    a rank-1 tensor it is ``(a + b) * sign(x)``.

    Args:
        x: weight tensor of rank >= 1.
        group_factor: ``a >= 0``.
        l1_factor: ``b >= 0``.

    Returns:
        A tensor of the shape and dtype of ``x``.

    Example:
        >>> x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype="float32")
        >>> ops.convert_to_numpy(group_sparse_gradient(x, 0.5))
        array([[0.42426407, 0.56568545],
               [0.        , 0.        ]], dtype=float32)
    """
    x = _as_tensor(x)
    shape = tuple(x.shape)
    dtype = x.dtype
    wide = x if compute_dtype(dtype) == "float64" else ops.cast(x, "float32")
    axes = group_axes(shape)
    a = float(group_factor)
    b = float(l1_factor)
    if not axes:
        return ops.cast((a + b) * ops.sign(wide), dtype)
    scale = a * math.sqrt(group_size(shape))
    return ops.cast(_sgl_gradient(wide, scale * _inverse(_group_norm(wide)), b), dtype)


# Smallest normal number of the dtypes the proximal step is computed in, and its square root
# (the floor of a group norm: a group whose squares underflow counts as zero).
_TINY = {name: float(np.finfo(name).tiny) for name in ("float32", "float64")}
_SQRT_TINY = {name: math.sqrt(tiny) for name, tiny in _TINY.items()}

# Lower bound on a metric entry: keeps lr * lambda / d finite if a user
# sets epsilon=0 and a coordinate never saw a gradient.
MIN_METRIC = 1e-12


def compute_dtype(dtype):
    """float64 stays float64; float16, bfloat16 and float32 weights are stepped in float32.

    A half-precision group norm floored at float16's smallest normal number
    (6e-5) would shrink small groups by the wrong amount, and numpy has no
    ``finfo`` for bfloat16: the step is taken in float32 and cast back.
    """
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


def _stepped(x, a, b, use_l1):
    """:func:`sgl_step` on ``x`` in its compute dtype, cast back to the dtype of ``x``."""
    x = _as_tensor(x)
    dtype = compute_dtype(x.dtype)
    return ops.cast(sgl_step(ops.cast(x, dtype), a, b, use_l1), x.dtype)


def soft_threshold(x, threshold):
    """Elementwise soft-thresholding, the proximal operator of ``t * ||x||_1``.

    ``S_t(x) = sign(x) * max(|x| - t, 0)``, computed as ``x - clip(x, -t, t)``
    (exactly 0 inside ``[-t, t]``).

    Args:
        x: a tensor.
        threshold: ``t >= 0`` (a Python float or a scalar tensor).

    Example:
        >>> ops.convert_to_numpy(soft_threshold(np.array([-2.0, 0.5, 3.0], dtype="float32"), 1.0))
        array([-1.,  0.,  2.], dtype=float32)
    """
    x = ops.convert_to_tensor(x)
    t = ops.cast(threshold, x.dtype)
    return x - ops.clip(x, -t, t)


def group_soft_threshold(x, threshold):
    """Group soft-thresholding, the proximal operator of ``t * sum_g sqrt(|g|) ||g||_2``.

    Each group is shrunk towards 0 as a whole:
    ``g <- max(0, 1 - t * sqrt(|g|) / ||g||_2) * g`` (an all-zero group stays
    0; a group whose squares underflow lies inside the ball and becomes 0
    unless ``t == 0``). On a rank-1 tensor every scalar is a group, and this
    is :func:`soft_threshold`. Runs :func:`sgl_step`, the kernel that training runs.

    Args:
        x: weight tensor of rank >= 1, groups along axis -2.
        threshold: ``t >= 0``.

    Example:
        >>> x = np.array([[3.0, 4.0], [0.1, 0.1]], dtype="float32")
        >>> # t * sqrt(|g|) = 1: row 0 (norm 5) is scaled by 0.8, row 1 (norm 0.14) is zeroed
        >>> ops.convert_to_numpy(group_soft_threshold(x, 1.0 / math.sqrt(2)))
        array([[2.4, 3.2],
               [0. , 0. ]], dtype=float32)
    """
    return _stepped(x, threshold, 0.0, use_l1=False)


def sparse_group_soft_threshold(x, group_threshold, l1_threshold):
    """Proximal operator of the sparse group Lasso ``a * sum_g sqrt(|g|)||g|| + b * ||x||_1``.

    The closed form (Friedman, Hastie & Tibshirani 2010; Simon et al. 2013):
    soft-threshold every weight by ``b``, then group-soft-threshold the result
    by ``a``: ``prox(x) = G_a(S_b(x))``. On a rank-1 tensor this is
    ``S_{a+b}(x)``. Runs :func:`sgl_step`, the kernel that training runs.

    Args:
        x: weight tensor of rank >= 1.
        group_threshold: ``a >= 0`` (step size times the group factor).
        l1_threshold: ``b >= 0`` (step size times the l1 factor).

    Example:
        >>> x = np.array([[3.0, 4.0], [0.1, 0.1]], dtype="float32")
        >>> ops.convert_to_numpy(sparse_group_soft_threshold(x, 0.5, 0.1))   # S_0.1, then G_0.5
        array([[2.4780676, 3.3325737],
               [0.       , 0.       ]], dtype=float32)
    """
    return _stepped(x, group_threshold, l1_threshold, use_l1=True)


def weighted_sparse_group_soft_threshold(x, weights, group_threshold, l1_threshold=0.0):
    """Sparse-group-Lasso proximal step in a diagonal metric ``d`` (the group part in its scalar form).

    Targets ``argmin_z 0.5 * sum_i d_i (z_i - x_i)^2 + a * sum_g sqrt(|g|) ||z_g||_2 + b * ||z||_1``
    with ``d = weights > 0``, ``a = group_threshold``, ``b = l1_threshold``:

    1. L1 part, exact: ``s_i = sign(x_i) * max(|x_i| - b / d_i, 0)``.
    2. Group part, ``c = a * sqrt(|g|)``: ``z_g = s_g * max(0, 1 - c / ||d * s_g||_2)``.

    Step 2 is the exact group proximal step in the group's own scalar metric
    ``d_g = ||d * s_g|| / ||s_g||``. Compared with the exact diagonal-metric
    operator (which needs a one-dimensional root search per group):

    * the zero test is the same, ``||d * s_g|| <= c`` (the exact optimality
      condition at ``z_g = 0``), so exactly the same groups become 0;
    * it is the same when ``d`` is constant inside each group;
    * a surviving group keeps the same balance at a fixed point of
      gradient step + proximal step: the data gradient on the group has norm
      ``a * sqrt(|g|) / step``; only its direction inside the group is weighted
      by ``d`` (``∝ d_i z_i`` instead of ``∝ z_i``).

    It costs one extra elementwise product over :func:`keras_group_lasso.prox.sparse_group_soft_threshold`
    (with ``d = 1`` it *is* that function: both run :func:`sgl_step`). On a rank-1 tensor every scalar is
    a group and the result is exact: ``sign(x) * max(|x| - (a + b) / d, 0)``.

    Args:
        x: weight tensor of rank >= 1, groups along axis -2 (see :mod:`keras_group_lasso.prox`).
        weights: tensor of the shape of ``x``, the metric ``d > 0`` (values
            below 1e-12 are raised to 1e-12).
        group_threshold: ``a >= 0``.
        l1_threshold: ``b >= 0``.

    Returns:
        A tensor of the shape and dtype of ``x``.

    Example:
        >>> x = np.array([[3.0, 4.0], [0.1, 0.1]], dtype="float32")
        >>> d = np.full_like(x, 2.0)   # a constant metric divides both thresholds by d
        >>> ops.convert_to_numpy(weighted_sparse_group_soft_threshold(x, d, 1.0, 0.2))
        array([[2.4780676, 3.3325737],
               [0.       , 0.       ]], dtype=float32)
    """
    x = ops.convert_to_tensor(x)
    dtype = compute_dtype(x.dtype)
    d = ops.maximum(ops.cast(weights, dtype), MIN_METRIC)
    return ops.cast(weighted_sgl_step(ops.cast(x, dtype), d, group_threshold, l1_threshold), x.dtype)


def weighted_sgl_step(x, d, a, b, use_l1=True):
    """:func:`weighted_sparse_group_soft_threshold` with ``d`` already floored; ``use_l1=False`` skips ``b``.

    Works on ``q = d * x`` (gradient units), where both thresholds are plain
    soft thresholds, ``d * S_{b/d}(x) = S_b(d * x)``, and divides once at the end.
    """
    return ops.divide(sgl_step(ops.multiply(d, x), a, b, use_l1), d)


def sgl_step(x, a, b, use_l1=True):
    """The one kernel of the sparse-group-Lasso proximal step, in few ops (it runs every training step).

    ``S_t(x) = x - clip(x, -t, t)`` (exactly 0 inside); the group factor
    ``max(0, 1 - c / ||g||)`` with ``||g||`` floored at the square root of the dtype's
    smallest normal number, so an all-zero group, or one whose squares underflow, gets
    factor 0 (1 when ``c == 0``) without a ``where``. ``x`` is float32 or
    float64 (:func:`compute_dtype`); ``use_l1=False`` skips the soft threshold by ``b``.
    """
    dtype = x.dtype
    a = ops.cast(a, dtype)
    shape = tuple(x.shape)
    if len(shape) < 2:  # every scalar is a group: one soft threshold by a + b
        t = a + ops.cast(b, dtype) if use_l1 else a
        return x - ops.clip(x, -t, t)
    if use_l1:
        t = ops.cast(b, dtype)
        x = x - ops.clip(x, -t, t)
    c = a * math.sqrt(group_size(shape))
    floor = _SQRT_TINY[keras.backend.standardize_dtype(dtype)]
    return x * ops.maximum(1.0 - c / ops.maximum(_group_norm(x), floor), 0.0)


def coupled_group_factors(squares, union, own, membership, own_threshold, coupled_thresholds):
    """The factor each group of one weight is scaled by in a proximal step with coupled groups.

    A group is the weight's own or its part of a coupled group ``k`` (a unit whose weights lie in several
    kernels), which goes or stays as a whole::

        own group g:            max(0, 1 - own_threshold / ||q_g||)
        part of coupled k:      max(0, 1 - coupled_thresholds[k] / ||q_U(k)||)

    with ``||q_U(k)||**2 = union[k]``, the sum of the squared parts in every weight that shares ``k``. Norms are
    floored at the dtype's smallest normal number's root (an all-zero group gets factor 0).

    Args:
        squares: ``(G,)`` squared norms of the weight's groups.
        union: ``(K,)`` squared norms of the coupled groups, all their parts together.
        own: ``(G,)`` 1.0 for an own group, 0.0 for a part of a coupled one.
        membership: ``(G, K)`` one-hot: group ``g`` is part of coupled group ``k``.
        own_threshold: a scalar, ``lr * factor * sqrt(|g|)``.
        coupled_thresholds: ``(K,)``, ``lr * scale_k``.

    Returns:
        ``(G,)`` factors, in the dtype of ``squares``.

    Example:
        >>> f = coupled_group_factors(np.array([4.0, 9.0], "float32"), np.array([25.0], "float32"),
        ...                           np.array([1.0, 0.0], "float32"), np.array([[0.0], [1.0]], "float32"),
        ...                           1.0, np.array([2.5], "float32"))
        >>> np.round(ops.convert_to_numpy(f), 3).tolist()
        [0.5, 0.5]
    """
    squares = ops.convert_to_tensor(squares)
    dtype = squares.dtype
    tiny = _TINY[keras.backend.standardize_dtype(dtype)]
    union, own, membership = (ops.cast(ops.convert_to_tensor(v), dtype) for v in (union, own, membership))
    per_key = ops.maximum(1.0 - ops.cast(coupled_thresholds, dtype) * ops.rsqrt(ops.maximum(union, tiny)), 0.0)
    own_factor = ops.maximum(1.0 - ops.cast(own_threshold, dtype) * ops.rsqrt(ops.maximum(squares, tiny)), 0.0)
    return own_factor * own + ops.matmul(membership, ops.reshape(per_key, (-1, 1)))[:, 0]

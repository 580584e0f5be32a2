"""Group-sparse penalties as serializable ``keras.regularizers.Regularizer`` subclasses.

A group is all outgoing weights of one unit (a row ``W[i, :]`` of a Dense
kernel, the slice ``W[..., i, :]`` of a Conv kernel, each scalar of a bias):

* :class:`GroupLasso`: ``factor * sum_g sqrt(|g|) * ||g||_2``
* :class:`SparseGroupLasso`: the same plus ``l1 * sum |w|`` (``l1`` defaults to
  ``factor``, as in the paper)
* :class:`InputGroupLasso` / :class:`HiddenGroupLasso`: the same mathematics,
  tagged with the paper's role (input groups: feature selection; hidden
  groups: neuron pruning), each with an optional ``l1`` term.

All are registered with Keras under the package ``keras_group_lasso``, so a
model that uses them saves to ``.keras`` and loads back without
``custom_objects`` once this package is imported.
"""

import math
import numbers
import warnings

import keras
import numpy as np

from keras_group_lasso import prox
from keras_group_lasso._validation import Described, check_non_negative, check_positive_int, fail
from keras_group_lasso.groups import AXES, GroupView

__all__ = [
    "GroupLasso",
    "SparseGroupLasso",
    "InputGroupLasso",
    "HiddenGroupLasso",
    "CoupledGroupLasso",
    "GroupSparseRegularizer",
    "link_coupled_penalties",
    "get",
    "ALIASES",
]

_PACKAGE = "keras_group_lasso"
# Coupled groups (units several layers read) take the hidden entry of the strength multiplier.
COUPLED_INDEX = 1
DEFAULT_FACTOR = 1e-3


#: What a group penalty applies to, for the message that refuses anything else.
WEIGHT_ONLY = (
    "a weight (a kernel or a bias): a group penalty sums over the rows of a weight, so use it as "
    "kernel_regularizer or bias_regularizer; as activity_regularizer it would receive the layer's "
    "output and group the samples of a batch"
)


class GroupSparseRegularizer(keras.regularizers.Regularizer):
    """Base of every penalty here: ``factor * group Lasso + l1 * Lasso``.

    Not used directly; it holds the shared maths, validation and the
    :attr:`role` that reports and surgery read.

    Attributes:
        factor: strength of the group term.
        l1: strength of the elementwise term (0 for pure group Lasso).
        channels: ``None`` (groups are the slices along axis -2), or ``C``
            for a Dense kernel that reads a flattened ``(..., C)`` feature
            map: row ``r`` belongs to channel ``r % C``, and a group is all
            rows of one channel (so the penalty removes whole channels, not
            single positions of a map).
        axis: where a kernel holds the unit index of its groups: ``-2``
            (default; Dense and convolution kernels ``(..., in, out)``) or
            ``-1`` (a transposed convolution's kernel ``(..., out, in)``);
            :func:`~keras_group_lasso.add_group_sparsity` sets it from the
            layer (see :class:`~keras_group_lasso.groups.GroupView`).
        conv_groups: ``None``, or the ``groups`` of the grouped convolution
            whose kernel ``(k..., in / groups, filters)`` carries the penalty:
            input channel ``c``'s group is then its weights into the filters
            of its own convolution group
            (:func:`~keras_group_lasso.add_group_sparsity` sets it).
        role: ``"input"``, ``"hidden"`` or ``"any"``.
        spared: the number of strongest groups (largest norms, read at each
            step) that the penalty leaves alone: they add nothing to its
            value or gradient and its proximal step keeps them as they are.
            0 by default; :class:`~keras_group_lasso.SparsityBudget` with
            ``spare_block`` sets it during ``fit``. Not saved; a compiled step
            holds the value it was traced with.
        declared: the :class:`~keras_group_lasso.declared.GroupPenalties` of
            the model whose layer carries the penalty (``None`` until a model
            declares it): the strength multiplier the value is scaled by, and
            whether the model's optimizer applies the penalty itself.

    The value is a function of the weight and of the declared state only:
    ``multiplier * (factor * sum_g sqrt(|g|) ||w_g|| + l1 * ||w||_1)``. While
    the declaring model is compiled with an optimizer that applies the group
    penalties by their proximal step (:class:`~keras_group_lasso.Proximal`),
    the value carries no gradient (:attr:`value_only`).

    Raises:
        InvalidParameterError: when called on a scalar or on a tensor with an
            unknown dimension (a layer's output, not a weight). A group penalty
            belongs on ``kernel_regularizer`` or ``bias_regularizer``; a model
            that uses one as ``activity_regularizer`` is refused when it
            declares its penalties (``add_group_sparsity``, ``SparsityBudget``,
            ``set_penalty_multiplier``).
    """

    role = "any"

    def __init__(self, factor=DEFAULT_FACTOR, l1=0.0, channels=None, axis=-2, conv_groups=None):
        owner = type(self).__name__
        self.factor = check_non_negative(owner, "factor", factor)
        self.l1 = check_non_negative(owner, "l1", l1)
        if channels is not None:
            channels = check_positive_int(owner, "channels", channels)
        if isinstance(axis, bool) or axis not in AXES:
            fail(owner, "axis", "-2 (the unit index of a kernel (..., in, out)), -1 (a transposed "
                 "convolution's kernel (..., out, in)) or 0 (the heads of an attention output kernel "
                 "(heads, value_dim, out))", axis)
        if channels is not None and axis != -2:
            fail(owner, "channels", f"None with axis={axis} (channels applies to a Dense kernel)", channels)
        if conv_groups is not None:
            conv_groups = check_positive_int(owner, "conv_groups", conv_groups)
            if channels is not None or axis != -2:
                fail(owner, "conv_groups", "None with channels or axis set (conv_groups applies to a "
                     "convolution kernel (k..., in / groups, filters))", conv_groups)
        self.channels = channels
        self.axis = int(axis)
        self.conv_groups = None if conv_groups in (None, 1) else conv_groups
        self.declared = None
        # The number of strongest groups the penalty leaves alone (a SparsityBudget with
        # round_to sets it during fit; never saved). Read when a step is traced.
        self.spared = 0

    @property
    def multiplier(self):
        """The declared ``(2,)`` strength multiplier variable, or ``None`` (strength 1)."""
        return getattr(self, "_assigned_multiplier", None) if self.declared is None else self.declared.multiplier

    @multiplier.setter
    def multiplier(self, variable):
        # Version 0.2 code set this attribute itself; the model's declaration is the one place now.
        warnings.warn(
            f"{type(self).__name__}.multiplier: assigning the multiplier of one penalty is deprecated; the model "
            "declares one for all its penalties: use keras_group_lasso.declared.link_penalty_multiplier(model, "
            "variable) or keras_group_lasso.set_penalty_multiplier(model, value).",
            DeprecationWarning,
            stacklevel=2,
        )
        self._assigned_multiplier = variable

    @property
    def value_only(self):
        """Whether the value carries no gradient: the declaring model's optimizer applies the penalty itself."""
        return self.declared is not None and self.declared.applied_by_optimizer()

    @property
    def group_role(self):
        """``"input"`` or ``"hidden"``: :attr:`role`, or for ``"any"`` what the declaring model's graph says
        of the kernel (a kernel that reads the model's input holds input groups); ``"hidden"`` otherwise."""
        if self.role != "any":
            return self.role
        return self.declared.role_of(self) if self.declared is not None else "hidden"

    @property
    def multiplier_index(self):
        """Which entry of a ``(2,)`` strength multiplier scales this penalty: 0 for input groups, else 1."""
        return 0 if self.group_role == "input" else 1

    def _times_multiplier(self, value, multiplier=None, index=None):
        """``value`` times its entry of the strength multiplier (``multiplier`` if given, else the linked one)."""
        multiplier = self.multiplier if multiplier is None else multiplier
        if multiplier is None:
            return value
        index = self.multiplier_index if index is None else index
        return value * keras.ops.cast(multiplier[index], value.dtype)

    @property
    def view(self):
        """The :class:`~keras_group_lasso.groups.GroupView` of this penalty's weight (``axis``, ``channels``)."""
        return GroupView(self.axis, self.channels, self.conv_groups)

    def group_shape(self, shape):
        """The shape in which this penalty's groups lie along axis -2: a reshape of ``shape`` (:class:`GroupView`).

        Without ``channels`` and with ``axis=-2`` a kernel keeps its rank-2
        shape and a convolution kernel ``(k..., in, out)`` is ``(prod(k), in,
        out)``; with ``channels=C`` a kernel ``(rows, out)`` is seen as
        ``(rows // C, C, out)``: group ``c`` is the rows ``c, C + c, 2C + c,
        ...``; with ``axis=-1`` a kernel ``(k..., out, in)`` is ``(prod(k) * out,
        in, 1)``.

        Raises:
            InvalidParameterError: ``channels`` does not divide the number of rows.

        Example:
            >>> GroupLasso(1e-3, channels=4).group_shape((12, 5))
            (3, 4, 5)
        """
        try:
            return self.view.shape(shape)
        except ValueError:
            if self.conv_groups is not None:
                fail(type(self).__name__, "conv_groups",
                     f"a divisor of the filters of the kernel (the kernel has shape {tuple(shape)})",
                     self.conv_groups)
            fail(
                type(self).__name__,
                "channels",
                f"a divisor of the rows of a Dense kernel (the kernel has shape {tuple(shape)})",
                self.channels,
            )

    def _grouped(self, x):
        shape = tuple(x.shape)
        view = self.group_shape(shape)
        return x if view == shape else keras.ops.reshape(x, view)

    def spared_mask(self, view):
        """``(G,)``: 1 for the ``spared`` strongest groups (largest norms) of ``view`` (the group view), else 0.

        Example:
            >>> penalty = GroupLasso(0.1)
            >>> penalty.spared = 1
            >>> keras.ops.convert_to_numpy(penalty.spared_mask(np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 2.0]]))).tolist()
            [0.0, 1.0, 0.0]
        """
        view = keras.ops.stop_gradient(keras.ops.convert_to_tensor(view))
        axes = prox.group_axes(tuple(view.shape))
        sq = keras.ops.sum(keras.ops.square(view), axis=axes) if axes else keras.ops.square(view)
        sq = keras.ops.reshape(sq, (-1,))
        groups = int(sq.shape[0])
        if not self.spared:
            return keras.ops.zeros((groups,), sq.dtype)
        _, index = keras.ops.top_k(sq, min(self.spared, groups))
        return keras.ops.sum(keras.ops.one_hot(index, groups, dtype=sq.dtype), axis=0)

    def _spared_axis(self, view):
        """The spared mask of ``view`` shaped to broadcast over it (groups along axis -2)."""
        return _along_groups(self.spared_mask(view), view)

    def _unspared(self, view):
        """``view`` with its spared groups set to zero (the groups the penalty reads)."""
        if not self.spared:
            return view
        view = keras.ops.convert_to_tensor(view)
        return keras.ops.multiply(view, 1.0 - keras.ops.cast(self._spared_axis(view), view.dtype))

    def __call__(self, x):
        self._check_weight(x)
        view = self._unspared(self._grouped(x))
        value = prox.group_sparse_penalty(view, self.factor, self.l1, gradient=not self.value_only)
        return self._times_multiplier(value)

    def _check_weight(self, x):
        """Refuse a scalar or a tensor with an unknown dimension (no weight has one)."""
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) == 0:
            fail(
                type(self).__name__,
                "x",
                "a weight tensor of rank >= 1 (a bias or a kernel), not a scalar",
                x,
            )
        if any(d is None for d in shape):
            received = Described(f"a tensor of shape {shape}, which no weight has")
            fail(type(self).__name__, "x", WEIGHT_ONLY, received)

    def prox(self, x, step):
        """Proximal step of this penalty with step size ``step`` (e.g. the learning rate).

        Returns ``argmin_z 0.5 * ||z - x||^2 + step * penalty(z)``, which has
        exact zeros: see :func:`keras_group_lasso.prox.sparse_group_soft_threshold`.
        """
        x = keras.ops.convert_to_tensor(x)
        if self.multiplier is not None:
            step = step * float(keras.ops.convert_to_numpy(self.multiplier)[self.multiplier_index])
        view = self._grouped(x)
        z = prox.sparse_group_soft_threshold(view, step * self.factor, step * self.l1)
        return keras.ops.reshape(self.keep_spared(view, z), tuple(x.shape))

    def keep_spared(self, view, z):
        """``z`` (a proximal point of ``view``, both in the group view), the spared groups of ``view`` as they were."""
        if not self.spared:
            return z
        return keras.ops.where(keras.ops.cast(self._spared_axis(view), "bool"), keras.ops.cast(view, z.dtype), z)

    def gradient(self, x, multiplier=None):
        """The penalty's gradient at ``x`` (:func:`keras_group_lasso.prox.group_sparse_gradient`), shape of ``x``.

        ``multiplier``: the strength multiplier to use instead of the linked
        one (:func:`~keras_group_lasso.declared.link_penalty_multiplier`).
        """
        x = keras.ops.convert_to_tensor(x)
        g = prox.group_sparse_gradient(self._unspared(self._grouped(x)), self.factor, self.l1)
        return self._times_multiplier(keras.ops.reshape(g, tuple(x.shape)), multiplier)

    def _with_channels(self, config):
        if self.channels is not None:
            config["channels"] = self.channels
        if self.axis != -2:
            config["axis"] = self.axis
        if self.conv_groups is not None:
            config["conv_groups"] = self.conv_groups
        return config

    def get_config(self):
        return self._with_channels({"factor": self.factor, "l1": self.l1})

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self), tuple(sorted(self.get_config().items()))))


@keras.saving.register_keras_serializable(package=_PACKAGE, name="GroupLasso")
class GroupLasso(GroupSparseRegularizer):
    """Group Lasso: ``factor * sum_g sqrt(|g|) * ||g||_2`` over the groups of a weight.

    The groups are the slices along axis -2 (a Dense kernel's rows: all
    outgoing weights of one unit). On a bias every scalar is a group, so the
    penalty equals L1 there. Driving a whole group to zero removes the unit.

    Args:
        factor: finite number >= 0, the strength ``lambda``.
        axis: ``-2`` (default) or ``-1`` for a transposed convolution's
            kernel ``(..., out, in)`` (see :class:`GroupSparseRegularizer`).
        channels: ``None``, or the channels ``C`` of a flattened feature map
            that a Dense kernel reads (its groups are then whole channels,
            see :meth:`GroupSparseRegularizer.group_shape`).

    Raises:
        InvalidParameterError: for a negative, NaN, infinite, bool or
            non-numeric ``factor``.

    Example:
        >>> kernel = np.array([[3.0, 4.0], [0.0, 0.0]], dtype="float32")   # unit 1 is already off
        >>> round(float(GroupLasso(0.1)(kernel)), 4)   # 0.1 * sqrt(2) * 5
        0.7071
        >>> layer = keras.layers.Dense(20, kernel_regularizer=GroupLasso(1e-3))
    """

    def __init__(self, factor=DEFAULT_FACTOR, channels=None, axis=-2, conv_groups=None):
        super().__init__(factor=factor, l1=0.0, channels=channels, axis=axis, conv_groups=conv_groups)

    def get_config(self):
        return self._with_channels({"factor": self.factor})


@keras.saving.register_keras_serializable(package=_PACKAGE, name="SparseGroupLasso")
class SparseGroupLasso(GroupSparseRegularizer):
    """Sparse group Lasso: ``factor * sum_g sqrt(|g|) ||g||_2 + l1 * sum |w|``.

    Removes whole units (group term) and single connections of the units that
    stay (L1 term). On a bias this is ``(factor + l1) * sum |b|``: the paper's
    bias groups.

    Args:
        factor: finite number >= 0, the group strength.
        l1: finite number >= 0, the elementwise strength; ``None`` (default)
            uses ``factor``, the paper's single-coefficient choice.

    Example:
        >>> SparseGroupLasso(1e-3)
        SparseGroupLasso(factor=0.001, l1=0.001)
        >>> kernel = np.array([[3.0, 4.0], [0.0, 0.0]], dtype="float32")
        >>> round(float(SparseGroupLasso(0.1)(kernel)), 4)   # 0.1 * sqrt(2) * 5 + 0.1 * (3 + 4)
        1.4071
        >>> layer = keras.layers.Dense(40, kernel_regularizer=SparseGroupLasso(1e-3))
    """

    def __init__(self, factor=DEFAULT_FACTOR, l1=None, channels=None, axis=-2, conv_groups=None):
        owner = type(self).__name__
        factor = check_non_negative(owner, "factor", factor)
        l1 = factor if l1 is None else check_non_negative(owner, "l1", l1, allow_none=True)
        super().__init__(factor=factor, l1=l1, channels=channels, axis=axis, conv_groups=conv_groups)


@keras.saving.register_keras_serializable(package=_PACKAGE, name="InputGroupLasso")
class InputGroupLasso(GroupSparseRegularizer):
    """Group Lasso on the *input groups*: the kernel that reads the model's input.

    A zero row removes an input feature (feature selection). Same mathematics
    as :class:`GroupLasso` (plus ``l1 * sum |w|`` when ``l1 > 0``); the role is
    part of the object and its config so reports and surgery can tell feature
    selection from neuron pruning, and each role can get its own strength.

    Args:
        factor: finite number >= 0, the group strength.
        l1: finite number >= 0 (default 0: pure group Lasso).

    Example:
        >>> model = keras.Sequential([keras.Input((8,)),
        ...                           keras.layers.Dense(4, kernel_regularizer=InputGroupLasso(1e-3, l1=1e-3)),
        ...                           keras.layers.Dense(2, kernel_regularizer=HiddenGroupLasso(1e-3))])
        >>> model.layers[0].kernel_regularizer.role, len(model.losses)
        ('input', 2)
    """

    role = "input"


@keras.saving.register_keras_serializable(package=_PACKAGE, name="HiddenGroupLasso")
class HiddenGroupLasso(GroupSparseRegularizer):
    """Group Lasso on the *hidden groups*: kernels fed by a hidden layer.

    A zero row removes a hidden neuron (neuron pruning). Same mathematics as
    :class:`InputGroupLasso`.

    Args:
        factor: finite number >= 0, the group strength.
        l1: finite number >= 0 (default 0: pure group Lasso).

    Example:
        >>> HiddenGroupLasso(1e-3).role
        'hidden'
        >>> layer = keras.layers.Dense(10, kernel_regularizer=HiddenGroupLasso(1e-3))
    """

    role = "hidden"


@keras.saving.register_keras_serializable(package=_PACKAGE, name="CoupledGroupLasso")
class CoupledGroupLasso(GroupSparseRegularizer):
    """One kernel's share of group penalties whose groups span several layers (coupled units).

    A channel of a residual stream is read by several layers; the paper's
    group of that unit is all its outgoing weights, in all of them, and it is
    penalised as one: ``s_k * ||U_k||_2`` over the union ``U_k`` (with
    ``s_k = lambda_k * sqrt(|U_k|)``). A Keras regularizer sees one weight, so
    every kernel that holds part of a coupled group carries a
    ``CoupledGroupLasso`` that says which of its groups belong to which
    coupled group; :func:`link_coupled_penalties` (run by
    :func:`~keras_group_lasso.add_group_sparsity` and by
    :class:`~keras_group_lasso.GroupSparseModel` when it is built or loaded)
    lets them see each other's weights, and the *anchor* adds the value of
    every coupled group to the loss. Its other groups are ordinary groups
    (``factor * sqrt(|g|) * ||g||_2``), and ``l1 * sum |w|`` covers all weights.

    Args:
        factor: strength of this kernel's own (uncoupled) groups.
        l1: elementwise strength.
        channels: as for :class:`GroupLasso`.
        coupled: for each group of this kernel (axis -2 of the group view),
            the index of its coupled group, or -1 for an own group.
        scales: ``s_k`` of each coupled group ``k`` (the same list in every member).
        anchor: this member adds the coupled groups' value to the loss (exactly one per model).
        role: ``"input"`` or ``"hidden"``.

    ``spared`` (set by :class:`~keras_group_lasso.SparsityBudget` during
    ``fit``) spares this kernel's strongest own groups, and the strongest of
    the coupled groups it holds by the norm of the whole union; a coupled group
    spared by one member is spared in all (:meth:`spared_groups`).

    Example:
        >>> a = CoupledGroupLasso(0.1, coupled=[0, -1], scales=[1.0], anchor=True)
        >>> b = CoupledGroupLasso(0.1, coupled=[0], scales=[1.0])
        >>> ka = keras.Variable(np.array([[3.0, 0.0], [1.0, 1.0]], dtype="float32"))
        >>> kb = keras.Variable(np.array([[4.0]], dtype="float32"))
        >>> link_coupled_penalties([(ka, a), (kb, b)])
        >>> round(float(a(ka)), 4)   # 1.0 * ||(3, 0, 4)|| + 0.1 * sqrt(2) * ||(1, 1)||
        5.2
        >>> float(b(kb))   # its only group is coupled: the anchor counts it
        0.0
    """

    def __init__(self, factor=DEFAULT_FACTOR, l1=0.0, channels=None, coupled=(), scales=(), anchor=False,
                 role="hidden", axis=-2, conv_groups=None):
        super().__init__(factor=factor, l1=l1, channels=channels, axis=axis, conv_groups=conv_groups)
        owner = type(self).__name__
        try:
            coupled, scales = tuple(coupled), tuple(scales)
        except TypeError:
            fail(owner, "coupled", "a list of group indices and `scales` a list of numbers", (coupled, scales))
        # integers and numbers as they are: int(0.7) and float("1") would read what was not meant
        if any(isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) for k in coupled):
            fail(owner, "coupled", "a list of group indices (integers)", coupled)
        if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) for v in scales):
            fail(owner, "scales", "finite numbers >= 0", scales)
        self.coupled = tuple(int(k) for k in coupled)
        self.scales = tuple(float(v) for v in scales)
        if any(k < -1 or k >= len(self.scales) for k in self.coupled):
            fail(owner, "coupled", f"indices in [-1, {len(self.scales)}) (one scale per coupled group)",
                 list(self.coupled))
        if any(not (v >= 0.0 and v < float("inf")) for v in self.scales):
            fail(owner, "scales", "finite numbers >= 0", list(self.scales))
        if role not in ("input", "hidden"):
            fail(owner, "role", "'input' or 'hidden'", role)
        if not isinstance(anchor, (bool, np.bool_)):
            fail(owner, "anchor", "True or False", anchor)
        self.anchor = bool(anchor)
        self.role = role
        self._members = None

    def link(self, members):
        """Let this penalty read the weights of the others: ``members`` is ``[(variable, penalty)]`` of all of them."""
        self._members = list(members)

    def membership(self, groups):
        """``(own (G,), onehot (G, K))`` float32 tensors for a weight of ``groups`` groups: 1.0 for each own
        group, and which coupled group (of ``K``) each other group is part of."""
        if len(self.coupled) != groups:
            fail(type(self).__name__, "coupled", f"one entry per group of the weight ({groups} groups)",
                 len(self.coupled))
        # Built with tensor ops from the keys (not numpy), so that torch.compile traces it too.
        keys = keras.ops.convert_to_tensor(list(self.coupled), "int32")
        own = keras.ops.cast(keras.ops.less(keys, 0), "float32")
        every_key = keras.ops.arange(max(len(self.scales), 1), dtype="int32")
        onehot = keras.ops.cast(keras.ops.equal(keras.ops.expand_dims(keys, 1), every_key), "float32")
        return own, onehot

    def spared_keys(self, union):
        """``(K,)``: 1.0 for each coupled group that a member spares, else 0.0.

        A member with ``spared = n`` spares the ``n`` strongest of the coupled
        groups it holds, by the norm of the whole union (``union``: the ``(K,)``
        squared norms): every member that reads a stream ranks its channels
        alike, so the stream keeps its ``n`` strongest channels.
        """
        members = [penalty for _, penalty in self._members] if self._members is not None else [self]
        keys = max(len(self.scales), 1)
        spare = keras.ops.zeros((keys,), union.dtype)
        for penalty in members:
            held = sorted({k for k in penalty.coupled if k >= 0})
            if not penalty.spared or not held:
                continue
            mask = np.zeros(keys, dtype="float32")
            mask[held] = 1.0
            ranked = keras.ops.where(keras.ops.convert_to_tensor(mask > 0), union, -1.0)
            _, index = keras.ops.top_k(ranked, min(penalty.spared, len(held)))
            spare = keras.ops.maximum(spare, keras.ops.sum(keras.ops.one_hot(index, keys, dtype=union.dtype), axis=0))
        return spare

    def spared_groups(self, squares, keys):
        """``(G,)``: 1.0 for each group of this weight that the penalties leave alone, else 0.0.

        Its ``spared`` strongest own groups (by ``squares``, their ``(G,)``
        squared norms), and its parts of the coupled groups that any member
        spares (``keys``: :meth:`spared_keys`, the same for every member; ``None`` without coupled groups).
        """
        own, onehot = self.membership(int(squares.shape[0]))
        own = keras.ops.cast(own, squares.dtype)
        kept = keras.ops.zeros_like(own)
        if keys is not None:
            kept = keras.ops.matmul(keras.ops.cast(onehot, squares.dtype),
                                    keras.ops.reshape(keras.ops.cast(keys, squares.dtype), (-1, 1)))[:, 0]
        own_groups = int(np.sum(np.asarray(self.coupled) < 0))
        if self.spared and own_groups:
            _, index = keras.ops.top_k(keras.ops.where(keras.ops.greater(own, 0), squares, -1.0),
                                       min(self.spared, own_groups))
            kept = kept + own * keras.ops.sum(keras.ops.one_hot(index, int(squares.shape[0]), dtype=squares.dtype),
                                              axis=0)
        return kept

    def sparing(self):
        """Whether any member of the coupled groups spares groups (a step traced without sparing skips it)."""
        members = [penalty for _, penalty in self._members] if self._members is not None else [self]
        return any(penalty.spared for penalty in members)

    def _group_squares(self, x):
        """``(view, squares of each group (G,))`` of weight ``x``."""
        view = self._grouped(keras.ops.convert_to_tensor(x))
        axes = prox.group_axes(tuple(view.shape))
        sq = keras.ops.sum(keras.ops.square(view), axis=axes) if axes else keras.ops.square(view)
        return view, keras.ops.reshape(sq, (-1,))

    def coupled_squares(self, x):
        """``(K,)``: the squared norm of this weight's part of each coupled group."""
        _, sq = self._group_squares(x)
        _, onehot = self.membership(int(sq.shape[0]))
        return keras.ops.matmul(keras.ops.reshape(sq, (1, -1)), keras.ops.cast(onehot, sq.dtype))[0]

    def union_squares(self, own=None, dtype=None):
        """``(K,)``: squared norm of every coupled group, over all linked members (``own``: this member's value)."""
        if self._members is None:
            raise ValueError(
                "CoupledGroupLasso: the penalty is not linked to the other layers of its coupled groups. "
                "Build the model with keras_group_lasso.add_group_sparsity or keras_group_lasso.GroupSparseModel "
                "(or call keras_group_lasso.regularizers.link_coupled_penalties(model))."
            )
        total = None
        for variable, penalty in self._members:
            value = own if (penalty is self and own is not None) else variable.value
            if dtype is not None:
                value = keras.ops.cast(value, dtype)
            part = penalty.coupled_squares(value)
            total = part if total is None else total + keras.ops.cast(part, total.dtype)
        return total

    def __call__(self, x):
        self._check_weight(x)
        value_only = self.value_only
        if self.scales and self._members is None:
            self.union_squares()  # raises: unlinked, this kernel's coupled groups would be missing from the loss
        view, sq = self._group_squares(x)
        own, _ = self.membership(int(sq.shape[0]))
        own = keras.ops.cast(own, sq.dtype)
        sparing = self.sparing()
        union = self.union_squares(own=x) if self.scales and (self.anchor or sparing) else None
        keys = self.spared_keys(keras.ops.stop_gradient(union)) if sparing and union is not None else None
        if sparing:  # which groups are spared is no part of the value's gradient
            own = own * (1.0 - self.spared_groups(keras.ops.stop_gradient(sq), keys))
        size = prox.group_size(tuple(view.shape))
        value = self.factor * math.sqrt(size) * keras.ops.sum(own * _safe_sqrt(sq))
        if self.l1:
            value = value + self.l1 * keras.ops.sum(prox.safe_abs(x))
        value = self._times_multiplier(value)
        if self.anchor and self.scales:
            scales = keras.ops.convert_to_tensor(self.scales, union.dtype)
            if keys is not None:
                scales = scales * (1.0 - keys)
            coupled = keras.ops.sum(scales * _safe_sqrt(union))
            value = value + self._times_multiplier(coupled, index=COUPLED_INDEX)
        # The anchor's term reads the other members too: stop the whole value.
        return keras.ops.stop_gradient(value) if value_only else value

    def gradient(self, x, multiplier=None):
        """The gradient of every coupled group and own group at ``x`` (the other members at their current values)."""
        x = keras.ops.convert_to_tensor(x)
        view, sq = self._group_squares(x)
        own, onehot = self.membership(int(sq.shape[0]))
        own = keras.ops.cast(own, sq.dtype)
        union = self.union_squares(own=x, dtype=sq.dtype) if self.scales else None
        sparing = self.sparing()
        keys = self.spared_keys(union) if sparing and union is not None else None
        if sparing:
            own = own * (1.0 - self.spared_groups(sq, keys))
        size = prox.group_size(tuple(view.shape))
        scale = self.factor * math.sqrt(size) * own * _safe_rsqrt(sq)
        scale = self._times_multiplier(scale, multiplier)
        if self.scales:
            per_key = keras.ops.convert_to_tensor(self.scales, sq.dtype) * _safe_rsqrt(union)
            if keys is not None:
                per_key = per_key * (1.0 - keys)
            per_key = self._times_multiplier(per_key, multiplier, index=COUPLED_INDEX)
            scale = scale + keras.ops.matmul(keras.ops.cast(onehot, sq.dtype), keras.ops.reshape(per_key, (-1, 1)))[:, 0]
        g = view * _along_groups(scale, view)
        if self.l1:
            g = g + self._times_multiplier(self.l1 * keras.ops.sign(view), multiplier)
        return keras.ops.reshape(g, tuple(x.shape))

    def prox(self, x, step):
        raise NotImplementedError(
            "CoupledGroupLasso: the proximal step of a coupled group needs all its members at once; "
            "keras_group_lasso.Proximal takes it jointly."
        )

    def get_config(self):
        return self._with_channels({"factor": self.factor, "l1": self.l1, "coupled": list(self.coupled),
                                    "scales": list(self.scales), "anchor": self.anchor, "role": self.role})


def _along_groups(values, view):
    """``values`` (one per group) reshaped to broadcast over ``view`` (groups along axis -2, or 0 for a vector)."""
    shape = [1] * len(view.shape)
    shape[-2 if len(view.shape) > 1 else 0] = -1
    return keras.ops.reshape(values, shape)


def _safe_sqrt(sq):
    positive = keras.ops.greater(sq, 0)
    return keras.ops.where(positive, keras.ops.sqrt(keras.ops.where(positive, sq, keras.ops.ones_like(sq))), 0.0)


def _safe_rsqrt(sq):
    positive = keras.ops.greater(sq, 0)
    return keras.ops.where(positive, keras.ops.rsqrt(keras.ops.where(positive, sq, keras.ops.ones_like(sq))), 0.0)


def link_coupled_penalties(model_or_members):
    """Link the :class:`CoupledGroupLasso` penalties of a model (or ``[(variable, penalty)]``) to each other.

    Returns nothing; every member then reads the others' weights. A model
    with coupled penalties must have exactly one anchor among them.

    Raises:
        ValueError: the penalties disagree on the coupled groups, or there is not exactly one anchor.
    """
    if isinstance(model_or_members, (list, tuple)):
        members = list(model_or_members)
    else:
        members = [(v, v.regularizer) for v in model_or_members.weights
                   if isinstance(getattr(v, "regularizer", None), CoupledGroupLasso)]
    if not members:
        return
    anchors = sum(1 for _, penalty in members if penalty.anchor)
    scales = {penalty.scales for _, penalty in members}
    if anchors != 1 or len(scales) != 1:
        raise ValueError(
            f"link_coupled_penalties: the CoupledGroupLasso penalties must share one list of scales and have "
            f"exactly one anchor; received {anchors} anchors and {len(scales)} different lists of scales."
        )
    for _, penalty in members:
        penalty.link(members)


ALIASES = {
    "group_lasso": GroupLasso,
    "sparse_group_lasso": SparseGroupLasso,
    "input_group_lasso": InputGroupLasso,
    "hidden_group_lasso": HiddenGroupLasso,
}


def get(identifier):
    """Resolve a penalty from an instance, a config dict, or a name.

    Accepts this package's snake_case aliases (``"sparse_group_lasso"``,
    ``"group_lasso"``, ``"input_group_lasso"``, ``"hidden_group_lasso"``) and
    everything ``keras.regularizers.get`` accepts (``"l1"``, ``"l2"``, dicts).
    Keras's own ``keras.regularizers.get`` resolves plain strings only for
    Keras's built-in classes; use this function (or the classes) for ours.

    Example:
        >>> get("sparse_group_lasso")
        SparseGroupLasso(factor=0.001, l1=0.001)
    """
    if isinstance(identifier, str) and identifier in ALIASES:
        return ALIASES[identifier]()
    try:
        return keras.regularizers.get(identifier)
    except (ValueError, TypeError) as error:
        names = ", ".join(repr(k) for k in ALIASES)
        fail(
            "get",
            "identifier",
            f"a Regularizer, a config dict, None, one of {names} or a Keras regularizer name "
            f"({error})",
            identifier,
        )

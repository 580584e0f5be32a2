"""The one definition of a weight's groups: which axis holds the units whose outgoing weights form a group.

A group is all outgoing weights of one input unit. Where that unit's index
lies depends on the layer: axis ``-2`` of a Dense kernel ``(in, out)``, of a
convolution kernel ``(k..., in, out)``, of a depthwise kernel ``(k..., C, m)``
and of a pointwise kernel; axis ``-1`` of a transposed convolution kernel
``(k..., out, in)``. A :class:`GroupView` says which, and gives every consumer
the same two views of the weight:

* :meth:`GroupView.shape`: a *reshape only* (no transpose, so it works on
  ``keras.ops`` tensors inside a compiled step) after which group ``g`` is the
  slice ``[..., g, :]`` of a rank-3 view: the penalties, the proximal step
  (:mod:`keras_group_lasso.prox` sums over every axis but ``-2``) and the
  budget read this one;
* :meth:`GroupView.units`: the kernel as ``(positions, in_units, out_units)``
  (numpy; a transpose where needed): the masks, the report and surgery read
  which input unit reaches which output unit from it.

A Dense kernel that reads a flattened ``(..., C)`` map (``channels=C``) has
rows ``p * C + c``: its groups are whole channels, the rows ``c, C + c, ...``.

A grouped convolution (``groups=g``, ``1 < g``) has a kernel ``(k..., C / g,
F)``: input channel ``c`` of convolution group ``q = c // (C / g)`` reaches
only the ``F / g`` filters of group ``q``, through ``kernel[..., c % (C / g),
q * F / g : (q + 1) * F / g]``. Its reshape-only view ``(prod(k), C, F / g)``
(``conv_groups=g``) holds channel ``c``'s group in row ``(c % (C / g)) * g +
q`` (:meth:`GroupView.unit_order` says which channel each row is).

Example:
    >>> GroupView().shape((3, 3, 16, 32))
    (9, 16, 32)
    >>> GroupView(axis=-1).shape((3, 3, 32, 16))
    (288, 16, 1)
    >>> GroupView(channels=4).shape((12, 5))
    (3, 4, 5)
    >>> GroupView(conv_groups=2).shape((3, 3, 4, 6))
    (9, 8, 3)
"""

import dataclasses
import math

import numpy as np

__all__ = ["GroupView", "AXES"]

# The axes a group's unit index can lie on: -2 (Dense, convolutions), -1 (transposed convolutions) or 0 (the
# heads of an attention layer's output kernel (heads, value_dim, out)).
AXES = (-2, -1, 0)


@dataclasses.dataclass(frozen=True)
class GroupView:
    """Where the groups of a weight lie.

    Attributes:
        axis: ``-2`` (the unit index is the kernel's second-to-last axis),
            ``-1`` (its last axis: a transposed convolution's kernel) or ``0``
            (its first axis: the heads of an attention output kernel
            ``(heads, value_dim, out)``, each head's slice one group).
        channels: ``None``, or ``C`` for a Dense kernel (rank 2, ``axis=-2``)
            that reads a flattened ``(..., C)`` map: row ``r`` belongs to
            channel ``r % C``.
        conv_groups: ``None``, or the ``groups`` ``g`` of a grouped
            convolution's kernel ``(k..., C / g, F)`` (``axis=-2``).
    """

    axis: int = -2
    channels: object = None
    conv_groups: object = None

    def shape(self, shape):
        """The rank-3 (or unchanged rank <= 1) shape in which group ``g`` is ``[..., g, :]``; a reshape of ``shape``.

        ``(k..., G, n) -> (prod(k), G, n)``; with ``axis=-1``: ``(k..., n, G)
        -> (prod(k) * n, G, 1)``; with ``channels=C``: ``(P * C, n) -> (P, C,
        n)``; with ``conv_groups=g``: ``(k..., C / g, F) -> (prod(k), C, F /
        g)`` (rows in :meth:`unit_order`). A bias (rank 1) is its own view:
        each scalar is a group.

        Raises:
            ValueError: ``channels`` does not divide the rows of a rank-2
                kernel, or ``conv_groups`` the filters of a kernel.
        """
        shape = tuple(int(d) for d in shape)
        if len(shape) < 2:
            return shape
        if self.conv_groups is not None and self.conv_groups > 1:
            g = int(self.conv_groups)
            if shape[-1] % g:
                raise ValueError(f"conv_groups={g} does not divide the filters of a kernel of shape {shape}")
            return (math.prod(shape[:-2]), shape[-2] * g, shape[-1] // g)
        if self.axis == 0:
            return (1, shape[0], math.prod(shape[1:]))
        if self.axis == -1:
            return (math.prod(shape[:-1]), shape[-1], 1)
        if self.channels is not None:
            rows = shape[-2]
            if len(shape) != 2 or rows % self.channels:
                raise ValueError(f"channels={self.channels} does not divide the rows of a kernel of shape {shape}")
            return (rows // self.channels, self.channels, shape[-1])
        if len(shape) == 2:
            return shape
        return (math.prod(shape[:-2]), shape[-2], shape[-1])

    def groups(self, shape):
        """The number of groups of a weight of ``shape``.

        Example:
            >>> GroupView(axis=-1).groups((3, 3, 8, 4))
            4
        """
        view = self.shape(shape)
        return int(view[-2]) if len(view) >= 2 else int(view[0]) if view else 1

    def units(self, kernel, in_units):
        """``kernel`` (numpy) as ``(positions, in_units, out_units)``: ``[:, i, :]`` is input unit ``i``'s group.

        A Dense kernel ``(in, out)`` is ``(1, in, out)``; after ``Flatten`` of a
        ``(..., C)`` map (``in_units=C``), ``(positions, C, out)``; a
        convolution kernel ``(k..., C_in, C_out)`` is ``(prod(k), C_in, C_out)``;
        a transposed convolution kernel ``(k..., C_out, C_in)`` is transposed
        to ``(prod(k), C_in, C_out)``.

        Example:
            >>> GroupView().units(np.zeros((3, 3, 4, 8)), 4).shape
            (9, 4, 8)
            >>> GroupView(axis=-1).units(np.zeros((3, 3, 8, 4)), 4).shape
            (9, 4, 8)
        """
        kernel = np.asarray(kernel)
        if self.axis == 0:
            return kernel.reshape(1, kernel.shape[0], -1)
        if self._grouped:  # block-diagonal: channel c reaches only the filters of its convolution group
            g, per_in, filters = int(self.conv_groups), kernel.shape[-2], kernel.shape[-1]
            blocks = kernel.reshape(-1, per_in, g, filters // g)
            full = np.zeros((blocks.shape[0], g, per_in, g, filters // g), kernel.dtype)
            for q in range(g):
                full[:, q, :, q, :] = blocks[:, :, q, :]
            return full.reshape(blocks.shape[0], g * per_in, filters)
        if self.axis == -1:
            kernel = np.swapaxes(kernel, -1, -2)
        in_units, out_units = int(in_units), kernel.shape[-1]
        positions = kernel.size // (in_units * out_units) if in_units * out_units else 1
        return kernel.reshape(positions, in_units, out_units)

    def kernel(self, units, shape):
        """The inverse of :meth:`units`: a ``(positions, in_units, out_units)`` array back in a kernel's ``shape``.

        Example:
            >>> view = GroupView(axis=-1)
            >>> kernel = np.arange(24.0).reshape(2, 3, 4)
            >>> bool(np.array_equal(view.kernel(view.units(kernel, 4), kernel.shape), kernel))
            True
        """
        units = np.asarray(units)
        if self.axis == 0:
            return units.reshape(shape)
        if self._grouped:
            shape = tuple(int(d) for d in shape)
            g, per_in, filters = int(self.conv_groups), shape[-2], shape[-1]
            full = units.reshape(-1, g, per_in, g, filters // g)
            blocks = np.stack([full[:, q, :, q, :] for q in range(g)], axis=2)  # (P, C / g, g, F / g)
            return blocks.reshape(shape)
        if self.axis == -1:
            shape = tuple(shape)
            return np.swapaxes(units.reshape(shape[:-2] + (shape[-1], shape[-2])), -1, -2)
        return units.reshape(shape)

    @property
    def _grouped(self):
        return self.conv_groups is not None and self.conv_groups > 1

    def unit_order(self, in_units):
        """The input unit of each row of :meth:`shape`'s view, int ``(in_units,)`` (``arange`` but for ``conv_groups``).

        Example:
            >>> GroupView(conv_groups=2).unit_order(4).tolist()
            [0, 2, 1, 3]
        """
        rows = np.arange(int(in_units))
        if not self._grouped:
            return rows
        g = int(self.conv_groups)
        return (rows % g) * (int(in_units) // g) + rows // g

    def norms(self, kernel, in_units):
        """The L2 norm of each input unit's group, float32 ``(in_units,)`` (numpy).

        Example:
            >>> GroupView().norms(np.array([[3.0, 4.0], [0.0, 0.0]]), 2)
            array([5., 0.], dtype=float32)
        """
        view = self.units(np.asarray(kernel, np.float32), in_units)
        return np.sqrt(np.sum(np.square(view), axis=(0, 2)))

"""Rules of layers that make units: Dense, EinsumDense, convolutions, embeddings, and the units layers a
user declares (:class:`KernelUnitsRule`)."""

import math

import keras
import numpy as np

from keras_group_lasso.graph.rules.base import (
    MIXES_UNITS,
    Kind,
    LayerRule,
    activation_is_elementwise,
    adapted,
    call_activation,
    layer_config,
    pads,
    threshold_array,
    to_numpy,
)
from keras_group_lasso.groups import GroupView

# ----------------------------------------------------------------------------- layers that make units


class UnitsGraph:
    """How a units layer makes units, as the graph and the masks read it.

    The defaults are a kernel ``(..., in, out)`` read as ``(positions, in_units, out_units)`` by a
    :class:`~keras_group_lasso.groups.GroupView`; a layer of another shape overrides :meth:`kernel_shape`,
    :meth:`unit_shape` and :meth:`units_view`; one with a recurrence, coupled halves or tied units says so.
    """

    #: Where the groups of its kernels lie.
    view = GroupView()

    #: Its units stand for the input it reads (an Embedding's dimensions): a layer reading them has input groups.
    represents_input = False

    #: A unit whose incoming weights are all zero outputs a constant (not so for a recurrent layer).
    constant_outputs = True

    def mixes_units(self, layer):
        """Its activation mixes the units it makes (softmax): it may only be the output layer."""
        return not activation_is_elementwise(layer.activation)

    def kernel_shape(self, layer):
        """``(kernel rows per input unit (its window), input units, output units)`` from the kernel's shape."""
        shape = tuple(int(d) for d in layer.kernel.shape)
        return math.prod(shape[:-2]), shape[-2], shape[-1]

    def out_units(self, layer):
        return self.kernel_shape(layer)[2]

    def unit_shape(self, layer, channels, positions):
        """``(in_units, positions)`` when it reads ``channels`` ids laid out ``positions`` times, else ``None``."""
        window, kernel_in, _ = self.kernel_shape(layer)
        if positions != 1 or kernel_in != channels:
            return None
        return channels, window

    def view_of(self, layer):
        """The :class:`~keras_group_lasso.groups.GroupView` of its kernels (:attr:`view`, or one for this layer)."""
        return self.view

    def units_view(self, weights, in_units, layer=None):
        """The kernel (numpy, from :meth:`weights`) as ``(positions, in_units, out_units)`` (``layer``: the one
        whose :meth:`view_of` to use)."""
        view = self.view if layer is None else self.view_of(layer)
        return view.units(weights["kernel"], in_units)

    def connections(self, layer, weights, in_units):
        """bool ``(in_units, out_units)``: input unit ``i`` reaches output unit ``j`` through a non-zero weight."""
        return np.any(self.units_view(weights, in_units, layer) != 0, axis=0)

    def constant_contribution(self, layer, weights, in_units, values):
        """What constant input units add to every output unit's pre-activation, ``(out_units,)`` float64.

        ``values[i]`` is the constant of input unit ``i`` (0 for the others).
        Every output position sees every constant through the whole kernel:
        ``sum_i values[i] * sum_p K[p, i, :]`` (a layer that pads only ever
        gets constants of 0 here).
        """
        values = np.asarray(values, np.float64)
        if not values.any():  # the usual case: no constant input (skips a float64 copy of the kernel)
            return np.zeros(self.out_units(layer))
        return values @ self.units_view(weights, in_units, layer).astype(np.float64).sum(axis=0)

    def pads(self, layer):
        """A constant input is not constant at every output position (only a constant 0 passes)."""
        return pads(layer)

    def recurrence(self, layer, weights):
        """bool ``(out_units, out_units)``: unit ``j`` feeds unit ``k`` inside the layer; ``None``: no recurrence."""
        return None

    def paired_halves(self, layer):
        """The first and second half of its units must keep as many units each (a ``Bidirectional``)."""
        return False

    def tied_units(self, layer):
        """``[(input unit indices, unit indices), ...]``: sets of its inputs and units that stay or go as one
        (a grouped convolution's groups); ``[]``."""
        return []

    def inner_units(self, layer, weights, kept_out):
        """``(alive, total)`` of its inner units (an attention layer's heads), or ``None``."""
        return None


class UnitsPenalties:
    """Where a units layer's group penalties go, and what ``apply_threshold`` zeroes.

    The defaults: one kernel, ``layer.kernel``, penalised through ``kernel_regularizer``, and its bias. A layer
    with other kernels overrides :meth:`kernels` and :meth:`regularizer_attributes`; one with heads,
    :meth:`head_kernel`.
    """

    thresholded = True

    def kernels(self, layer):
        """``{role: variable}`` of its kernels: ``{"kernel": ...}`` (a SeparableConv: ``"kernel"``, ``"pointwise"``)."""
        return {"kernel": layer.kernel}

    def regularizer_attributes(self, layer):
        """The ``*_regularizer`` attributes that carry its group penalties, one per kernel."""
        return ("kernel_regularizer",)

    def own_unit_attributes(self, layer):
        """The ``*_regularizer`` attributes whose groups are the units the layer makes (a recurrent kernel's rows)."""
        return ()

    def penalty_layers(self, layer):
        """The layers that hold its penalties (a ``Bidirectional``: its two directions)."""
        return (layer,)

    def head_kernel(self, layer):
        """The variable whose groups are inner units of the layer (an attention layer's heads), or ``None``."""
        return None

    def keeps_heads_whole(self, layer):
        """It has heads (inner units) that surgery keeps whole here (an attention layer inside a block traced at
        probe sizes): they get no penalty."""
        return False

    def bias(self, layer):
        return layer.bias if getattr(layer, "use_bias", False) and layer.bias is not None else None

    def weights(self, layer, read=to_numpy):
        """Its weights by role, numpy: ``{"kernel", ["pointwise",] "bias"}`` (``bias`` ``None`` without one).

        ``read(variable)`` gives a variable's value (by default the one it holds; the budget reads candidate
        values this way without writing them into the model)."""
        out = {role: read(variable) for role, variable in self.kernels(layer).items()}
        bias = self.bias(layer)
        out["bias"] = None if bias is None else read(bias)
        return out

    def group_norms(self, layer, in_units):
        """The L2 norm of each input unit's group in its kernel, ``(in_units,)``."""
        return self.view_of(layer).norms(self.weights(layer)["kernel"], in_units)

    def thresholded_variables(self, layer):
        bias = self.bias(layer)
        return list(self.kernels(layer).values()) + ([bias] if bias is not None else [])


class UnitsSlicing:
    """How surgery and a latency table cut a units layer.

    The default slices the kernel's :meth:`~UnitsGraph.units_view` to the kept input and output units and sets
    the config's :attr:`width_key`; a layer whose weights are laid out otherwise overrides :meth:`slice_units`.
    """

    #: ``prune_model(fold_batchnorm=True)`` may merge a BatchNormalization that follows it.
    merges_batchnorm = True

    #: A 0/1 selection Dense may go right before it to pick the kept input features.
    selects_rows = False

    #: A budget's ``round_to`` may re-initialize its columns: one kernel ``(..., in, out)``.
    rounds = True

    #: Surgery checks each copy it makes on random inputs (a layer declared with ``register_layer``).
    checks_copies = False

    width_key = "filters"

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        """``(config, weights)`` keeping input units ``kept_in`` and output units ``kept_out``."""
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer.get_config()
        kernel = weights["kernel"]
        view = self.units_view(weights, in_units)[:, kept_in][:, :, kept_out]
        if kernel.ndim == 2:  # Dense, maybe after Flatten: rows p * C + c, p-major
            new_kernel = view.reshape(-1, kept_out.size)
        else:
            new_kernel = view.reshape(kernel.shape[:-2] + (kept_in.size, kept_out.size))
        config[self.width_key] = int(kept_out.size)
        return config, self._with_bias([np.ascontiguousarray(new_kernel)], weights, kept_out)

    def width_step(self, layer):
        """``None``: its input and output widths vary apart; else ``k``: it makes a multiple of ``k`` units and
        reads as many inputs as they need (a grouped convolution: ``k`` filters per group)."""
        return None

    def slice_widths(self, layer, weights, in_units, width_in, width_out):
        """``(config, weights, inputs read)`` of a copy making its first ``width_out`` units and reading its first
        ``width_in`` input units (with a :meth:`width_step`, those its units need): a latency table times it."""
        config, new = self.slice_units(layer, weights, in_units, np.arange(width_in), np.arange(width_out))
        return config, new, int(width_in)

    def _with_bias(self, new, weights, kept_out):
        if weights["bias"] is not None:
            new.append(np.ascontiguousarray(weights["bias"][kept_out]))
        return new


class UnitsCost:
    """What a units layer costs: multiply-adds and parameters, with all its units or those kept.
    """

    def flops(self, layer, positions, in_units, out_units, output_shape):
        """Multiply-adds per sample reading ``in_units`` and making ``out_units``.

        ``positions`` is the first axis of :meth:`units_view` (kernel window,
        or the positions of a flattened map for a Dense layer): ``output
        positions * positions * in * out``. An output axis of unknown size
        (``None``, see :func:`variable_axes`) counts as 1: the result is then
        the cost per position of those axes.
        """
        return _spatial(output_shape) * positions * in_units * out_units

    def params(self, layer, positions, in_units, out_units, has_bias):
        """Parameters (kernels and bias) reading ``in_units`` and making ``out_units``."""
        return positions * in_units * out_units + (out_units if has_bias else 0)

    def kept_cost(self, layer, positions, kept_in, kept_out, output_shape, has_bias, weights, kept_mask):
        """``(FLOPs, params)`` reading ``kept_in`` and making ``kept_out`` units (``weights``: thresholded)."""
        return (self.flops(layer, positions, kept_in, kept_out, output_shape),
                self.params(layer, positions, kept_in, kept_out, has_bias))

    def group_size(self, layer, positions, out_units):
        """The weights in one input unit's group: ``positions * out_units`` (its row at every position)."""
        return positions * out_units


class UnitsRule(UnitsGraph, UnitsPenalties, UnitsSlicing, UnitsCost, LayerRule):
    """A layer that makes units: one kernel ``(..., in, out)`` (Dense, Conv1D/2D/3D) and an optional bias.

    The group of input unit ``i`` is the slice ``[..., i, :]`` of the kernel
    (:attr:`view`). Its protocol is one small interface per concern:
    :class:`UnitsGraph` (how it makes units), :class:`UnitsPenalties` (where
    its penalties go), :class:`UnitsSlicing` (how surgery cuts it) and
    :class:`UnitsCost` (what it costs). Their defaults serve such a kernel; the
    rule of another layer overrides the methods of the concerns where it
    differs (SeparableConv: its kernels and their slicing; a transposed
    convolution: the axis of its groups). The four are parts of this class, not
    rules on their own (each reads the others' methods, and the registry knows a
    units layer by this class). A layer of your own whose kernels are
    contracted with its input's channels needs no method at all:
    ``register_layer(cls, "units", kernels=..., width=...)``.
    """

    kind = Kind.UNITS

    def refusal(self, layer):
        reason = adapted(layer)
        if reason is None and not activation_is_elementwise(layer.activation):
            return MIXES_UNITS
        return reason

    def classify(self, layer):
        reason = self.refusal(layer)
        if reason == MIXES_UNITS:
            return Kind.UNITS_MIXING, reason  # fine as the output layer
        return (Kind.OTHER, reason) if reason else (self.kind, None)


def _spatial(shape):
    return math.prod(int(d) for d in shape[1:-1] if d is not None) if len(shape) > 2 else 1


class DenseRule(UnitsRule):
    """``Dense``: a kernel ``(in, out)``; after ``Flatten`` of a ``(..., C)`` map its rows are ``p * C + c``."""

    selects_rows = True
    width_key = "units"

    def refusal(self, layer):
        return adapted(layer, "Dense layer") or super().refusal(layer)

    def unit_shape(self, layer, channels, positions):
        _, kernel_in, _ = self.kernel_shape(layer)
        if kernel_in != channels * positions:
            return None
        return channels, positions


class KernelUnitsRule(UnitsRule):
    """A layer of your own that makes units from kernels ``(..., inputs, units)``: what
    ``register_layer(cls, "units", kernels=..., width=...)`` puts in the table.

    The rule is exact for a layer that computes this way: each kernel ``K`` (a
    Dense's ``(inputs, units)``, a convolution's ``(window..., inputs,
    units)``) enters its call only as a contraction of the input's channels (its
    last axis) with ``K``'s ``inputs`` axis (``x @ K``, ``conv(x, K)``), and unit
    ``j`` of its output reads the input only through ``K[..., j]`` of every
    kernel and entry ``j`` of each of its ``biases`` (whatever elementwise math
    follows: a gate, an activation). Its config's ``width`` entry is its number
    of units, and every weight it holds is one of those kernels or biases. Input
    unit ``i``'s group is ``K[..., i, :]`` of every kernel; each kernel takes the
    group penalty through its regularizer argument (a config key). A unit it
    makes is never taken for a constant (its math is the layer's own): a unit
    goes when nothing reads it, an input unit when its rows of every kernel are
    zero. Surgery checks each copy it makes against the layer on random inputs
    (:attr:`checks_copies`).

    Args:
        cls: the layer class.
        kernels: ``{attribute: regularizer config key}`` of its kernels, the
            first one the layer's main kernel.
        width: the config key of its number of units.
        biases: attributes of its weights with one entry per unit.
        description: words for the list of supported layers.
        refusal: optional ``layer -> reason or None``.
    """

    selects_rows = True  # x @ K on the last axis: a selection of its input rows may go before it
    #: Surgery checks each copy it makes against the layer (the math is the user's, declared, not known).
    checks_copies = True
    merges_batchnorm = False
    rounds = False
    constant_outputs = False

    def __init__(self, cls, kernels, width, biases=(), description=None, refusal=None):
        super().__init__(cls, description, refusal=refusal)
        self.kernel_keys = dict(kernels)
        self.width_key = width
        self.biases = tuple(biases)
        attributes = list(self.kernel_keys)
        self.roles = {"kernel": attributes[0], **{attribute: attribute for attribute in attributes[1:]}}

    def refusal(self, layer):
        config = layer_config(layer)
        missing = [key for key in (self.width_key, *self.kernel_keys.values()) if key not in config]
        if missing:
            return (f"a layer whose config has no {', '.join(repr(key) for key in missing)} (the width and the "
                    "kernels' regularizer arguments named in register_layer)")
        found = {attribute: getattr(layer, attribute, None) for attribute in (*self.kernel_keys, *self.biases)}
        absent = [attribute for attribute, variable in found.items() if not isinstance(variable, keras.Variable)]
        if absent:
            return f"a layer without the weights {', '.join(repr(a) for a in absent)} named in register_layer"
        shapes = {tuple(int(d) for d in found[attribute].shape) for attribute in self.kernel_keys}
        if len(shapes) != 1 or len(next(iter(shapes))) < 2:
            return f"a layer whose kernels are not all of one shape (..., inputs, units): {sorted(shapes)}"
        units = next(iter(shapes))[-1]
        if config[self.width_key] != units:
            return (f"a layer whose config's {self.width_key!r} is {config[self.width_key]!r} while its kernels "
                    f"make {units} units")
        wrong = [a for a in self.biases if tuple(int(d) for d in found[a].shape) != (units,)]
        if wrong:
            return f"a layer whose biases {', '.join(repr(a) for a in wrong)} are not one entry per unit ({units},)"
        declared = {id(variable) for variable in found.values()}
        other = [variable.name for variable in layer.weights if id(variable) not in declared]
        if other:
            return f"a layer holding weights that register_layer does not name: {', '.join(repr(n) for n in other)}"
        return super(UnitsRule, self).refusal(layer)

    def mixes_units(self, layer):
        return False

    def kernels(self, layer):
        return {role: getattr(layer, attribute) for role, attribute in self.roles.items()}

    def regularizer_attributes(self, layer):
        return tuple(self.kernel_keys.values())

    def bias(self, layer):
        return None

    def weights(self, layer, read=to_numpy):
        out = {role: read(variable) for role, variable in self.kernels(layer).items()}
        out.update({f"per_unit/{attribute}": read(getattr(layer, attribute)) for attribute in self.biases})
        out["bias"] = None
        return out

    def thresholded_variables(self, layer):
        return list(self.kernels(layer).values()) + [getattr(layer, attribute) for attribute in self.biases]

    def kernel_shape(self, layer):
        shape = tuple(int(d) for d in self.kernels(layer)["kernel"].shape)
        return math.prod(shape[:-2]), shape[-2], shape[-1]

    def group_norms(self, layer, in_units):
        """The L2 norm of each input unit's group: its rows in every kernel together."""
        weights = self.weights(layer)
        return np.sqrt(sum(np.square(self.view.norms(weights[role], in_units)) for role in self.roles))

    def connections(self, layer, weights, in_units):
        return np.any([self.view.units(weights[role], in_units) != 0 for role in self.roles], axis=(0, 1))

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer_config(layer)
        config[self.width_key] = int(kept_out.size)
        by_variable = {id(getattr(layer, attribute)): weights[role] for role, attribute in self.roles.items()}
        by_variable.update({id(getattr(layer, attribute)): weights[f"per_unit/{attribute}"] for attribute in self.biases})
        new = []
        for variable in layer.weights:  # the order the layer builds them in
            value = by_variable[id(variable)]
            value = value[..., kept_in, :][..., kept_out] if value.ndim >= 2 else value[kept_out]
            new.append(np.ascontiguousarray(value))
        return config, new

    def flops(self, layer, positions, in_units, out_units, output_shape):
        return _spatial(output_shape) * positions * in_units * out_units * len(self.roles)

    def params(self, layer, positions, in_units, out_units, has_bias):
        return (positions * in_units * len(self.roles) + len(self.biases)) * out_units


def dense_equation(equation):
    """``(input letter, output letter)`` of an einsum equation that is a Dense layer on the last axis, else
    ``None``: a kernel of two axes ``(in, out)``, the input's last axis ``in``, the output the input's other axes in
    the same order then ``out`` (``"ab,bc->ac"``, ``"abc,cd->abd"``, ``"...b,bc->...c"``)."""
    try:
        operands, output = str(equation).replace(" ", "").split("->")
        inputs, kernel = operands.split(",")
    except ValueError:
        return None
    if len(kernel) != 2 or not inputs or not output:
        return None
    k_in, k_out = kernel
    if k_in == k_out or inputs[-1] != k_in or output[-1] != k_out or inputs[:-1] != output[:-1]:
        return None
    if k_in in output or k_out in inputs:
        return None
    return k_in, k_out


class EinsumDenseRule(UnitsRule):
    """``EinsumDense`` whose equation is a Dense on the last axis (``"abc,cd->abd"``): a kernel ``(in, out)`` and
    a bias on the output axis, or none. (Heads and other equations: not yet; refused by name.)"""

    merges_batchnorm = False
    width_key = "output_shape"

    def refusal(self, layer):
        reason = adapted(layer, "EinsumDense layer")
        if reason:
            return reason
        letters = dense_equation(layer.equation)
        if letters is None:
            return (f"an EinsumDense with equation {layer.equation!r} (only a Dense on the last axis, such as "
                    "'abc,cd->abd', is supported)")
        if layer.bias_axes not in (None, "", letters[1]):
            return f"an EinsumDense with bias_axes={layer.bias_axes!r} (a bias on the output axis or none)"
        return super().refusal(layer)

    def bias(self, layer):
        return getattr(layer, "bias", None)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        config, new = super().slice_units(layer, weights, in_units, kept_in, kept_out)
        shape = layer.get_config()["output_shape"]  # its last entry is the units, the others stay
        width = config["output_shape"]
        config["output_shape"] = width if isinstance(shape, int) else tuple(shape)[:-1] + (width,)
        return config, new


class ConvRule(UnitsRule):
    """``Conv1D/2D/3D`` (channels_last, ``groups=1``): a kernel ``(k..., in, out)``.

    A convolution with as many groups as input and output channels
    (``groups == filters == C``, ConvNeXt's depthwise convolution) is a
    per-unit layer, as ``DepthwiseConv`` is: kernel ``(k..., 1, C)``, one slice
    and one bias per channel.
    """

    def depthwise(self, layer):
        """``groups`` equals the input and output channels: each channel is filtered on its own."""
        groups = getattr(layer, "groups", 1)
        try:
            shape = tuple(int(d) for d in layer.kernel.shape)
        except Exception:  # noqa: BLE001 - not built
            return False
        return groups > 1 and shape[-2] == 1 and shape[-1] == groups

    def variant(self, layer):
        if getattr(layer, "groups", 1) in (1, None) or self.depthwise(layer):
            return self
        grouped = self.__dict__.get("_grouped")
        if grouped is None:
            grouped = self._grouped = GroupedConvRule(self.cls, self.description)
        return grouped

    def refusal(self, layer):
        if self.depthwise(layer):
            return _depthwise_refusal(layer)
        return _conv_refusal(layer) or super().refusal(layer)

    def classify(self, layer):
        if self.depthwise(layer):
            reason = self.refusal(layer)
            return (Kind.OTHER, reason) if reason else (Kind.PER_UNIT, None)
        return super().classify(layer)

    @property
    def slices(self):
        return True

    def slice(self, layer, kept):
        kept = np.asarray(kept, dtype=int)
        weights = layer.get_weights()
        config = dict(layer.get_config(), filters=int(kept.size), groups=int(kept.size))
        return config, [weights[0][..., kept]] + ([weights[1][kept]] if len(weights) > 1 else [])

    def pass_constants(self, layer, values, threshold=0.0):
        return _depthwise_constants(layer, values, threshold)

    def channel_flops(self, layer, output_shape):
        """``output positions * window``: the kernel ``(k..., C, 1)`` slides one window over each channel."""
        return _spatial(output_shape) * math.prod(int(d) for d in layer.kernel.shape[:-2])

    def checked_weights(self, layer):
        labels = ("kernel", "bias")
        return {labels[i]: to_numpy(v) for i, v in enumerate(self.thresholded_variables(layer))}


class GroupedConvRule(ConvRule):
    """``Conv1D/2D/3D`` with ``groups=g`` (``1 < g``, not one group per channel; ResNeXt, RegNet): a kernel
    ``(k..., C / g, F)``.

    Input channel ``c`` reaches only the ``F / g`` filters of its convolution
    group ``c // (C / g)`` (:class:`~keras_group_lasso.groups.GroupView` with
    ``conv_groups=g``: the penalties see each channel's own weights). Every
    group keeps as many inputs and filters as the others, so a convolution
    group goes only when all of it goes: its ``C / g`` input channels and its
    ``F / g`` filters, and ``groups`` shrinks with it. A channel of a kept
    group stays, even a dead or constant one (its zero weights change nothing).
    """

    rounds = False

    def variant(self, layer):
        return self

    def refusal(self, layer):
        return _conv_refusal(layer) or UnitsRule.refusal(self, layer)

    def classify(self, layer):
        return UnitsRule.classify(self, layer)

    def view_of(self, layer):
        return GroupView(conv_groups=int(layer.groups))

    def kernel_shape(self, layer):
        shape = tuple(int(d) for d in layer.kernel.shape)
        return math.prod(shape[:-2]), shape[-2] * int(layer.groups), shape[-1]

    def _sizes(self, layer):
        """``(groups, input channels per group, filters per group)``."""
        _, channels, filters = self.kernel_shape(layer)
        groups = int(layer.groups)
        return groups, channels // groups, filters // groups

    def tied_units(self, layer):
        groups, per_in, per_out = self._sizes(layer)
        return [(np.arange(q * per_in, (q + 1) * per_in), np.arange(q * per_out, (q + 1) * per_out))
                for q in range(groups)]

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        groups, per_in, per_out = self._sizes(layer)
        kept = np.unique(kept_out // per_out)
        whole = (np.array_equal(kept_out, (kept[:, None] * per_out + np.arange(per_out)).reshape(-1))
                 and np.array_equal(kept_in, (kept[:, None] * per_in + np.arange(per_in)).reshape(-1)))
        if not whole:
            raise RuntimeError(  # pragma: no cover - the masks keep whole convolution groups
                f"the channels of '{layer.name}' were to be cut inside a convolution group; please report this")
        config = dict(layer.get_config(), filters=int(kept_out.size), groups=int(kept.size))
        kernel = weights["kernel"][..., kept_out]
        return config, self._with_bias([np.ascontiguousarray(kernel)], weights, kept_out)

    def width_step(self, layer):
        return self._sizes(layer)[2]

    def slice_widths(self, layer, weights, in_units, width_in, width_out):
        """Whole convolution groups: as many as ``width_out`` filters make, reading their groups' inputs."""
        groups, per_in, per_out = self._sizes(layer)
        kept = min(groups, max(1, width_out // per_out))
        config, new = self.slice_units(layer, weights, in_units, np.arange(kept * per_in), np.arange(kept * per_out))
        return config, new, kept * per_in

    def group_size(self, layer, positions, out_units):
        return positions * out_units // int(layer.groups)

    def _kept_groups(self, layer, in_units, out_units):
        groups, per_in, per_out = self._sizes(layer)
        return max(1, -(-int(in_units) // per_in), -(-int(out_units) // per_out))

    def flops(self, layer, positions, in_units, out_units, output_shape):
        # Each filter reads the input channels of its own group only.
        return _spatial(output_shape) * positions * in_units * out_units // self._kept_groups(layer, in_units,
                                                                                              out_units)

    def params(self, layer, positions, in_units, out_units, has_bias):
        return (positions * in_units * out_units // self._kept_groups(layer, in_units, out_units)
                + (out_units if has_bias else 0))


def _conv_refusal(layer):
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        return "a convolution with data_format='channels_first'"
    return None


class SeparableConvRule(ConvRule):
    """``SeparableConv1D/2D`` (``depth_multiplier=1``): a depthwise ``(k..., C, 1)`` then a pointwise ``(1.., C, out)``.

    Input channel ``c``'s outgoing weights are ``depthwise[..., c, :]`` and
    ``pointwise[..., c, :]``: both kernels carry a penalty on the same groups.
    """

    def refusal(self, layer):
        if getattr(layer, "depth_multiplier", 1) != 1:
            return "a SeparableConv with depth_multiplier > 1"
        return super().refusal(layer)

    def variant(self, layer):
        return self

    def kernels(self, layer):
        return {"kernel": layer.depthwise_kernel, "pointwise": layer.pointwise_kernel}

    rounds = False

    def regularizer_attributes(self, layer):
        return ("depthwise_regularizer", "pointwise_regularizer")

    def kernel_shape(self, layer):
        depthwise = tuple(int(d) for d in layer.depthwise_kernel.shape)
        return math.prod(depthwise[:-2]), depthwise[-2], int(layer.pointwise_kernel.shape[-1])

    def connections(self, layer, weights, in_units):
        depthwise = self.units_view(weights, in_units)  # (positions, C, m)
        pointwise = weights["pointwise"].reshape(int(in_units), -1, weights["pointwise"].shape[-1])  # (C, m, out)
        live = np.any(depthwise != 0, axis=0)  # (C, m)
        return np.einsum("cm,cmo->co", live.astype(np.int64), (pointwise != 0).astype(np.int64)) > 0

    def constant_contribution(self, layer, weights, in_units, values):
        values = np.asarray(values, np.float64)
        if not values.any():
            return np.zeros(self.out_units(layer))
        depthwise = self.units_view(weights, in_units).astype(np.float64).sum(axis=0)  # (C, m)
        pointwise = weights["pointwise"].reshape(-1, weights["pointwise"].shape[-1]).astype(np.float64)
        return (values[:, None] * depthwise).reshape(-1) @ pointwise

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer.get_config()
        config["filters"] = int(kept_out.size)
        depthwise = weights["kernel"][..., kept_in, :]
        m = depthwise.shape[-1]
        rows = (kept_in[:, None] * m + np.arange(m)[None, :]).reshape(-1)
        pointwise = weights["pointwise"][..., rows, :][..., kept_out]
        new = [np.ascontiguousarray(depthwise), np.ascontiguousarray(pointwise)]
        return config, self._with_bias(new, weights, kept_out)

    def flops(self, layer, positions, in_units, out_units, output_shape):
        return _spatial(output_shape) * (positions * in_units + in_units * out_units)

    def params(self, layer, positions, in_units, out_units, has_bias):
        return positions * in_units + in_units * out_units + (out_units if has_bias else 0)


class ConvTransposeRule(ConvRule):
    """``Conv1D/2D/3DTranspose``: a kernel ``(k..., out, in)``, the axes the other way round from ``Conv``.

    Input unit ``i``'s group is ``kernel[..., :, i]`` (:class:`GroupView` with
    ``axis=-1``). Each input position spreads over a window of output
    positions, so the border and the stride pattern see different numbers of
    kernel taps: a constant input is not constant in the output, and only a
    constant 0 is folded (as through zero padding).
    """

    view = GroupView(axis=-1)
    merges_batchnorm = False
    rounds = False

    def variant(self, layer):
        return self

    def kernel_shape(self, layer):
        shape = tuple(int(d) for d in layer.kernel.shape)
        return math.prod(shape[:-2]), shape[-1], shape[-2]

    def pads(self, layer):
        return True

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        config = layer.get_config()
        config["filters"] = int(kept_out.size)
        kernel = weights["kernel"][..., kept_out, :][..., kept_in]
        return config, self._with_bias([np.ascontiguousarray(kernel)], weights, kept_out)

    def flops(self, layer, positions, in_units, out_units, output_shape):
        # Every input position meets the whole window once.
        try:
            shape = tuple(layer.input.shape)
        except Exception:  # noqa: BLE001 - seen outside a graph: the output's positions bound it
            shape = tuple(output_shape)
        return _spatial(shape) * positions * in_units * out_units


class EmbeddingRule(UnitsRule):
    """``Embedding``: its output dimensions are units; it reads integer indices, not values.

    Column ``j`` of the table ``(input_dim, output_dim)`` is unit ``j`` at
    every position of its input; each input position (a categorical column of
    a tabular input) reaches every unit whose column is not all zero. A unit
    that nobody reads leaves the table (and every reader); a column of zeros
    outputs 0 everywhere (a constant). An input column goes when every unit of
    its Embedding goes. Its table carries no group penalty of its own (its
    units are pruned through the groups of the layers that read them).
    """

    merges_batchnorm = False
    rounds = False
    represents_input = True
    width_key = "output_dim"

    def refusal(self, layer):
        return adapted(layer)

    def mixes_units(self, layer):
        return False

    def kernels(self, layer):
        return {"kernel": layer.embeddings}

    def regularizer_attributes(self, layer):
        return ()

    def bias(self, layer):
        return None

    def kernel_shape(self, layer):
        vocabulary, dims = (int(d) for d in layer.embeddings.shape)
        return vocabulary, 1, dims

    def unit_shape(self, layer, channels, positions):
        if positions != 1:
            return None
        return channels, int(layer.embeddings.shape[0])

    def connections(self, layer, weights, in_units):
        live = np.any(weights["kernel"] != 0, axis=0)
        return np.broadcast_to(live, (int(in_units), live.size)).copy()

    def constant_contribution(self, layer, weights, in_units, values):
        return np.zeros(weights["kernel"].shape[-1])

    def pads(self, layer):
        return False

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        if np.asarray(kept_in).size != in_units:  # pragma: no cover - an index read by a kept unit stays
            raise RuntimeError(f"the indices that '{layer.name}' reads were to be sliced; please report this")
        kept_out = np.asarray(kept_out, dtype=int)
        config = dict(layer.get_config(), output_dim=int(kept_out.size))
        return config, [np.ascontiguousarray(weights["kernel"][:, kept_out])]

    def flops(self, layer, positions, in_units, out_units, output_shape):
        return 0  # a lookup: no multiply-adds

    def params(self, layer, positions, in_units, out_units, has_bias):
        return positions * out_units


class ReversibleEmbeddingRule(EmbeddingRule):
    """``ReversibleEmbedding`` called forward (indices to vectors), as an ``Embedding``: its output dimensions are
    units. Its later calls with ``reverse=True`` (a language model's logits, from the same table when tied) are
    kept whole (:class:`~keras_group_lasso.graph.rules.shape.ReverseCall`): every channel they read stays, so the
    table keeps its columns. Without tied weights, the rows of the reverse projection go with the columns of the
    table."""

    def refusal(self, layer):
        reason = adapted(layer)
        if reason:
            return reason
        nodes = getattr(layer, "_inbound_nodes", ())
        if nodes:
            args, kwargs = nodes[0].arguments.args, nodes[0].arguments.kwargs
            if kwargs.get("reverse") is True or (len(args) > 1 and args[1] is True):
                return "a ReversibleEmbedding called first with reverse=True (its logits before its vectors)"
        return None

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        config, new = super().slice_units(layer, weights, in_units, kept_in, kept_out)
        reverse = getattr(layer, "reverse_embeddings", None)
        if reverse is not None:
            new.append(np.ascontiguousarray(to_numpy(reverse)[np.asarray(kept_out, dtype=int), :]))
        return config, new


class DepthwiseRule(LayerRule):
    """DepthwiseConv with ``depth_multiplier=1``: one kernel slice and one bias per channel.

    A constant channel ``c`` stays constant: ``c * sum_p K[p, c] + b`` without
    padding; through zero padding only a pre-activation equal to the bias
    everywhere (an input constant of 0) passes.
    """

    thresholded = True
    per_channel_flops = True

    def thresholded_variables(self, layer):
        return [layer.kernel] + ([layer.bias] if getattr(layer, "use_bias", False) and layer.bias is not None else [])

    def checked_weights(self, layer):
        labels = ("kernel", "bias")
        return {labels[i]: to_numpy(v) for i, v in enumerate(self.thresholded_variables(layer))}

    def pass_constants(self, layer, values, threshold=0.0):
        return _depthwise_constants(layer, values, threshold)

    def channel_flops(self, layer, output_shape):
        """``output positions * window``: the kernel ``(k..., C, 1)`` slides one window over each channel."""
        return _spatial(output_shape) * math.prod(int(d) for d in layer.kernel.shape[:-2])


def _depthwise_constants(layer, values, threshold):
    """One kernel slice per channel (``(k..., C, 1)`` or ``(k..., 1, C)``) on constant channels ``values``."""
    kernel = threshold_array(to_numpy(layer.kernel), threshold)
    weights = layer.get_weights()
    bias = threshold_array(weights[1], threshold).astype(np.float64) if len(weights) > 1 else 0.0
    total = kernel.reshape(-1, values.size).astype(np.float64).sum(axis=0)
    out = values * total + bias
    if pads(layer):
        out = np.where(values == 0, bias + np.zeros_like(values), np.nan)
    out = np.where(np.isnan(values), np.nan, out)
    return call_activation(layer, out)


def _depthwise_refusal(layer):
    """DepthwiseConv with ``depth_multiplier=1``, or a Conv with one group per channel."""
    if getattr(layer, "depth_multiplier", 1) not in (1, None):
        return "a DepthwiseConv with depth_multiplier > 1 (one channel makes several)"
    reason = adapted(layer)
    if reason is None and not activation_is_elementwise(layer.activation):
        return MIXES_UNITS
    return reason or _conv_refusal(layer)


def _depthwise(layer, kept):
    """DepthwiseConv (depth_multiplier 1): kernel ``(k..., C, 1)`` and bias ``(C,)`` sliced by channel."""
    weights = layer.get_weights()
    out = [weights[0][..., kept, :]]
    if len(weights) > 1:
        out.append(weights[1][kept])
    return layer.get_config(), out


def builtin_rules():
    """The rules of Keras's layers that make units (and of its depthwise convolutions), in the table's order."""
    layers = keras.layers
    rules = [DenseRule(layers.Dense),
             EinsumDenseRule(layers.EinsumDense, "EinsumDense (a Dense on the last axis: 'abc,cd->abd')")]
    rules += [ConvRule(getattr(layers, name), f"{name} (grouped too: whole groups pruned)")
              for name in ("Conv1D", "Conv2D", "Conv3D")]
    rules += [SeparableConvRule(getattr(layers, name)) for name in ("SeparableConv1D", "SeparableConv2D")]
    rules += [ConvTransposeRule(getattr(layers, name))
              for name in ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose")]
    rules.append(EmbeddingRule(layers.Embedding))
    if hasattr(layers, "ReversibleEmbedding"):
        rules.append(ReversibleEmbeddingRule(layers.ReversibleEmbedding, "ReversibleEmbedding (called forward)"))
    rules += [DepthwiseRule(getattr(layers, name), f"{name} (depth_multiplier=1)", slicer=_depthwise,
                            refusal=_depthwise_refusal) for name in ("DepthwiseConv1D", "DepthwiseConv2D")]
    return rules

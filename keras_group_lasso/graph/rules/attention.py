"""The rules of attention layers: a head is a unit (MultiHeadAttention; grouped-query attention, KerasHub's Gemma)."""

import copy
import math

import keras
import numpy as np

from keras_group_lasso.graph.rules.base import PROBE_SIZES, adapted, layer_config, probe_sized, to_numpy
from keras_group_lasso.graph.rules.recurrent import SequenceRule
from keras_group_lasso.graph.rules.shape import is_constant_array
from keras_group_lasso.groups import GroupView

_ATTENTION_PARTS = ("query", "key", "value", "attention_output")


def _attention_variables(layer):
    """``{role: variable}`` of a MultiHeadAttention: ``query``, ``key``, ``value``, ``output`` and their biases."""
    found = {}
    for variable in layer.weights:
        part, kind = variable.path.split("/")[-2:]
        if part in _ATTENTION_PARTS:
            role = "output" if part == "attention_output" else part
            found[role if kind == "kernel" else f"{role}_bias"] = variable
    return found


def _steps(layer):
    """The length of the sequence ``layer`` reads, ``None`` where unknown (any length; a layer with several calls
    or none; a length that stands for any inside a block traced at probe sizes)."""
    try:
        steps = layer.input[0].shape[1] if isinstance(layer.input, (list, tuple)) else layer.input.shape[1]
    except Exception:  # noqa: BLE001 - a layer with several calls or none
        return None
    return None if probe_sized(layer) and steps == PROBE_SIZES[1] else steps


def _operand_roles(layer):
    """``("query", "value"[, "key"], ...)``: the keywords of a MultiHeadAttention's operands, in the order the graph
    lists them (given positionally, or by keyword in any order; a constant mask is one too), the same in every call
    Keras recorded of it; ``()`` for a layer never called, ``None`` for calls that give them in different roles (a
    layer called again in another model, otherwise)."""
    found = {_roles_of(node.arguments) for node in getattr(layer, "_inbound_nodes", ())}
    if not found:
        return ()
    return found.pop() if len(found) == 1 else None


def _roles_of(arguments):
    def operand(value):  # what the graph lists as an operand: a tensor, or a constant array (a fixed mask)
        return isinstance(value, keras.KerasTensor) or is_constant_array(value)

    roles = [role for role, value in zip(("query", "value", "key"), arguments.args) if operand(value)]
    # a mask given as a tensor is a side argument, computed again apart (see AttentionRule.side_arguments)
    roles += [key for key, value in arguments.kwargs.items() if operand(value)
              and not (key in AttentionRule.side_arguments and isinstance(value, keras.KerasTensor))]
    return tuple(roles)


class AttentionRule(SequenceRule):
    """``MultiHeadAttention`` (self-attention: query, key and value read one tensor): heads are its inner units.

    The group of head ``h`` is its slice ``[h, :, :]`` of the output kernel
    ``(heads, value_dim, out)`` (``GroupView(axis=0)``): a head whose slice is
    zero adds nothing to the output (each head's softmax is its own), so its
    query, key, value and output slices go and the layer is built with fewer
    heads. Input unit ``i`` reaches the output through its rows of the query,
    key and value kernels ``(in, heads, dim)`` into live heads; an output unit
    whose output-kernel column is zero is never a constant to fold (only a
    constant 0 of its input is removed). Inside the kept heads, key and value
    dimensions that add nothing go too (:meth:`kept_shape`).
    """

    width_key = "output_shape"
    #: Group view of its head kernel (the output kernel).
    head_view = GroupView(axis=0)
    side_arguments = ("query_mask", "value_mask", "key_mask", "attention_mask")

    def refusal(self, layer):
        reason = adapted(layer)
        if reason:
            return reason
        if getattr(layer, "_use_gate", False) or layer.get_config().get("use_gate"):
            return "a MultiHeadAttention with use_gate=True"
        config = layer.get_config()
        if tuple(config.get("attention_axes") or (1,)) != (1,):
            return "a MultiHeadAttention over axes other than the sequence (attention_axes=(1,))"
        output_shape = config.get("output_shape")
        if output_shape is not None and len(tuple(np.atleast_1d(output_shape))) != 1:
            return "a MultiHeadAttention whose output_shape has several axes"
        try:
            variables = _attention_variables(layer)
        except Exception:  # noqa: BLE001 - not built
            variables = {}
        if not {"query", "key", "value", "output"} <= set(variables):
            return "a MultiHeadAttention that is not built"
        return None

    def kernels(self, layer):
        variables = _attention_variables(layer)
        return {role: variables[role] for role in ("query", "key", "value", "output")}

    def regularizer_attributes(self, layer):
        return ()

    def head_kernel(self, layer):
        """The variable whose groups are its heads (the output kernel); ``None`` inside a block traced at probe
        sizes, which keeps its heads whole (:func:`~.base.probe_sized`: a KerasHub decoder, whose class ties the
        size of a head to their number)."""
        return None if self.keeps_heads_whole(layer) else _attention_variables(layer)["output"]

    def keeps_heads_whole(self, layer):
        return probe_sized(layer)

    def bias(self, layer):
        return _attention_variables(layer).get("output_bias")

    def weights(self, layer, read=to_numpy):
        return {role: read(variable) for role, variable in _attention_variables(layer).items()} | {
            "bias": None if self.bias(layer) is None else read(self.bias(layer))}

    def thresholded_variables(self, layer):
        return list(_attention_variables(layer).values())

    def kernel_shape(self, layer):
        variables = _attention_variables(layer)
        return 1, int(variables["query"].shape[0]), int(variables["output"].shape[-1])

    def live_heads(self, weights, kept_out=None):
        """bool ``(heads,)``: heads with a non-zero output weight (into the units ``kept_out``, default all)."""
        output = weights["output"]
        if kept_out is not None:
            output = output[..., np.asarray(kept_out, dtype=int)]
        return np.any(output.reshape(output.shape[0], -1) != 0, axis=1)

    def units_view(self, weights, in_units, layer=None):
        """``(3, in_units, heads)``: input ``i``'s query, key and value weights into each head (any non-zero)."""
        return np.stack([np.any(weights[role] != 0, axis=-1) for role in ("query", "key", "value")]).astype(float)

    def connections(self, layer, weights, in_units):
        reads = np.any(self.units_view(weights, in_units) != 0, axis=0)  # (in, heads)
        writes = np.any(weights["output"] != 0, axis=1)  # (heads, out)
        return (reads.astype(np.int64) @ writes.astype(np.int64)) > 0

    def group_norms(self, layer, in_units):
        weights = self.weights(layer)
        squares = sum(np.sum(np.square(weights[role].astype(np.float32)), axis=(1, 2))
                      for role in ("query", "key", "value"))
        return np.sqrt(squares)

    def kept_shape(self, weights, kept_out, whole=False):
        """``(heads, key dims, value dims)`` that stay: the live heads, and for each the key and value
        dimensions it keeps (as many in every head: Keras gives all heads one ``key_dim`` and one ``value_dim``).

        Value dimension ``j`` of head ``h`` adds nothing when its output rows ``[h, j, :]`` are zero; key
        dimension ``j`` adds nothing to the scores when its query column (and bias) or its key column (and
        bias) is zero. A head keeps its live dimensions and, where another head keeps more, some dead ones.
        Where ``key_dim == value_dim`` (Keras on JAX needs it) both stay equal. ``whole``: every head and
        dimension stays.
        """
        kept_out = np.asarray(kept_out, dtype=int)
        if whole:
            heads, key_dim = weights["query"].shape[-2:]
            value_dim = weights["value"].shape[-1]
            return np.arange(heads), [np.arange(key_dim)] * heads, [np.arange(value_dim)] * heads
        heads = np.flatnonzero(self.live_heads(weights, kept_out))
        if heads.size == 0:  # a layer has at least one head: one whose output weights are zero adds nothing
            heads = np.arange(1)

        def live(role):
            column = np.any(weights[role] != 0, axis=0)  # (heads, dim)
            bias = weights.get(f"{role}_bias")
            return column if bias is None else column | (bias != 0)

        key_live = live("query") & live("key")
        value_live = np.any(weights["output"][..., kept_out] != 0, axis=-1)  # (heads, value_dim)
        key_dim, value_dim = key_live.shape[1], value_live.shape[1]
        new_key = max(1, int(key_live[heads].sum(axis=1).max()))
        new_value = max(1, int(value_live[heads].sum(axis=1).max()))
        if key_dim == value_dim:
            new_key = new_value = max(new_key, new_value)

        def dims(mask, count):  # live dimensions first, then dead ones, in index order
            return [np.sort(np.argsort(~mask[h], kind="stable")[:count]) for h in heads]

        return heads, dims(key_live, new_key), dims(value_live, new_value)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        heads, key_dims, value_dims = self.kept_shape(weights, kept_out, whole=self.keeps_heads_whole(layer))
        # Keras scales the query by 1 / sqrt(key_dim): fewer key dimensions need the query scaled back.
        scale = math.sqrt(key_dims[0].size / weights["query"].shape[-1])

        def pick(array, dims):  # array (..., heads, dim) -> the kept heads and their dims
            return np.stack([array[..., h, d] for h, d in zip(heads, dims)], axis=-2)

        new = []
        for role, dims, factor in (("query", key_dims, scale), ("key", key_dims, 1.0), ("value", value_dims, 1.0)):
            kernel = pick(weights[role][kept_in], dims)
            new.append(np.ascontiguousarray(kernel * np.asarray(factor, kernel.dtype) if factor != 1.0 else kernel))
            bias = weights.get(f"{role}_bias")
            if bias is not None:
                bias = pick(bias, dims)
                new.append(np.ascontiguousarray(bias * np.asarray(factor, bias.dtype) if factor != 1.0 else bias))
        output = np.stack([weights["output"][h][d] for h, d in zip(heads, value_dims)])
        new.append(np.ascontiguousarray(output[..., kept_out]))
        if weights["bias"] is not None:
            new.append(np.ascontiguousarray(weights["bias"][kept_out]))
        config = dict(layer.get_config(), num_heads=int(heads.size), key_dim=int(key_dims[0].size),
                      value_dim=int(value_dims[0].size), output_shape=int(kept_out.size))
        return config, new

    def call(self, layer, x, options=None):
        """Call ``layer`` as the model did: on ``x`` as query and value, with the same keyword options; ``x`` a
        list (cross-attention): its tensors in the roles (query, value, key) the model gave them."""
        if isinstance(x, (list, tuple)):
            return layer(**dict(zip(self.roles, x, strict=True)), **(options or {}))
        return layer(x, x, **(options or {}))

    #: The roles of the tensors it reads, in the graph's order of its operands (its variant for a layer given them
    #: otherwise: by keyword, a key of its own).
    roles = ("query", "value")

    def variant(self, layer):
        roles = _operand_roles(layer)
        if roles == self.roles or (roles is not None and len(roles) < 2):
            return self
        found = copy.copy(self)
        found.roles = roles
        return found

    def new_units(self, layer, flat):
        """Cross-attention (the query read from one tensor, the key and value from another: a decoder reading
        its encoder) is kept whole: every channel it reads stays, and so do its heads and outputs; ``(units,
        None)``. Its weights take no group penalty and are not counted, as a layer kept whole's. ``(None,
        reason)`` where its calls give its tensors in different roles."""
        if self.roles is None:
            return None, "a cross-attention layer whose calls give its tensors in different roles"
        return self.out_units(layer), None

    def _sizes(self, layer):
        variables = _attention_variables(layer)
        heads, key_dim = (int(d) for d in variables["query"].shape[1:])
        value_dim = int(variables["value"].shape[-1])
        steps = _steps(layer)
        return heads, key_dim, value_dim, 1 if steps is None else int(steps)

    def flops(self, layer, positions, in_units, out_units, output_shape, heads=None, key_dim=None, value_dim=None):
        """``T * in * H * (2 kd + vd)`` (projections) ``+ T^2 * H * (kd + vd)`` (scores, weighted values)
        ``+ T * H * vd * out`` (output) multiply-adds per sample, ``T`` its sequence length."""
        total, full_key, full_value, steps = self._sizes(layer)
        heads = total if heads is None else heads
        key_dim = full_key if key_dim is None else key_dim
        value_dim = full_value if value_dim is None else value_dim
        return (steps * in_units * heads * (2 * key_dim + value_dim) + steps * steps * heads * (key_dim + value_dim)
                + steps * heads * value_dim * out_units)

    def params(self, layer, positions, in_units, out_units, has_bias, heads=None, key_dim=None, value_dim=None):
        total, full_key, full_value, _ = self._sizes(layer)
        heads = total if heads is None else heads
        key_dim = full_key if key_dim is None else key_dim
        value_dim = full_value if value_dim is None else value_dim
        biases = _attention_variables(layer).get("query_bias") is not None
        return (in_units * heads * (2 * key_dim + value_dim) + (heads * (2 * key_dim + value_dim) if biases else 0)
                + heads * value_dim * out_units + (out_units if has_bias else 0))

    def inner_units(self, layer, weights, kept_out):
        """``(live heads, heads)`` with the units ``kept_out`` kept."""
        heads, _, _ = self.kept_shape(weights, kept_out, whole=self.keeps_heads_whole(layer))
        return int(heads.size), int(weights["output"].shape[0])

    def kept_cost(self, layer, positions, kept_in, kept_out, output_shape, has_bias, weights, kept_mask):
        heads, key_dims, value_dims = self.kept_shape(weights, np.flatnonzero(kept_mask), whole=self.keeps_heads_whole(layer))
        shape = dict(heads=int(heads.size), key_dim=int(key_dims[0].size), value_dim=int(value_dims[0].size))
        return (self.flops(layer, positions, kept_in, kept_out, output_shape, **shape),
                self.params(layer, positions, kept_in, kept_out, has_bias, **shape))


def builtin_rules():
    """The rule of Keras's MultiHeadAttention."""
    return [AttentionRule(keras.layers.MultiHeadAttention, "MultiHeadAttention (self-attention: heads pruned; cross-attention: kept whole)")]


def _einsum_parts(layer):
    """``(input letters, kernel letters, output letters)`` of an EinsumDense's equation (``"btd,ndh->btnh"``)."""
    left, output = layer.equation.split("->")
    inputs, kernel = left.split(",")
    return inputs, kernel, output


def _projection_axes(layer):
    """The kernel axes ``(model, heads, head dim)`` of an EinsumDense that projects a sequence ``(b, t, model)``
    into heads ``(b, t, heads, head dim)`` (a query, key or value); ``None`` for any other equation."""
    inputs, kernel, output = _einsum_parts(layer)
    if len(inputs) != 3 or len(output) != 4 or len(kernel) != 3 or inputs[:2] != output[:2]:
        return None
    axes = (inputs[2], output[2], output[3])
    if sorted(axes) != sorted(kernel) or inputs[2] in output:
        return None
    return tuple(kernel.index(letter) for letter in axes)


def _output_axes(layer):
    """The kernel axes ``(heads, head dim, model)`` of an EinsumDense that sums heads ``(b, t, heads, head dim)``
    back into a sequence ``(b, t, model)``; ``None`` for any other equation."""
    inputs, kernel, output = _einsum_parts(layer)
    if len(inputs) != 4 or len(output) != 3 or len(kernel) != 3 or inputs[:2] != output[:2]:
        return None
    axes = (inputs[2], inputs[3], output[2])
    if sorted(axes) != sorted(kernel):
        return None
    return tuple(kernel.index(letter) for letter in axes)


class GroupedQueryAttentionRule(AttentionRule):
    """Grouped-query attention of KerasHub's decoders (Gemma's ``CachedGemmaAttention``): ``num_query_heads``
    query heads read ``num_key_value_heads`` key-value heads, each key-value head read by the ``g =
    num_query_heads // num_key_value_heads`` query heads of its group, one after another.

    As in :class:`AttentionRule`, the group of query head ``h`` is its slice of the output kernel, and input unit
    ``i`` reaches the output through its rows of the query, key and value kernels. A query head whose output
    slice is zero adds nothing. A key-value head goes with the last query head of its group; the class gives
    every group as many query heads, so a group keeps as many as the group that keeps most (its live heads first,
    then dead ones, whose output rows are zero). The head size stays (the rotary embedding pairs dimension ``i``
    with ``i + head_dim / 2``, and the class scales the scores by ``1 / sqrt(head_dim)``). The kernels' axes are
    read from their equations: the projections ``(b, t, model) -> (b, t, heads, head_dim)`` in any kernel order,
    the output ``(b, t, heads, head_dim) -> (b, t, model)``.
    """

    width_key = None
    side_arguments = ("attention_mask",)
    _PARTS = (("query", "query"), ("key", "key"), ("value", "value"), ("attention_output", "output"))

    def _layers(self, layer):
        """``{role: EinsumDense}`` of its four projections, found by their names (``query``, ``key``, ``value``,
        ``attention_output``)."""
        found = {}
        for sub in layer._flatten_layers(include_self=False, recursive=False):  # noqa: SLF001 - Keras's own walk
            role = dict(self._PARTS).get(sub.name)
            if role is not None and isinstance(sub, keras.layers.EinsumDense):
                found[role] = sub
        return found

    def refusal(self, layer):
        reason = adapted(layer, "attention layer")
        if reason:
            return reason
        if not layer.built:
            return "a grouped-query attention layer that is not built"
        parts = self._layers(layer)
        if set(parts) != {"query", "key", "value", "output"}:
            return "a grouped-query attention layer without EinsumDense query, key, value and attention_output"
        for role, sub in parts.items():
            reason = adapted(sub, "projection")
            if reason:
                return reason
            axes = _output_axes(sub) if role == "output" else _projection_axes(sub)
            if axes is None:
                return f"a grouped-query attention whose {role} equation is {sub.equation!r}"
            if sub.bias is not None and self._refused_bias(role):
                return self._refused_bias(role)
        if not getattr(layer, "query_head_dim_normalize", True):
            return "a grouped-query attention with query_head_dim_normalize=False (its scale follows the heads)"
        heads, groups = (next((getattr(layer, name) for name in (key, f"_{key}") if hasattr(layer, name)), None)
                         for key in ("num_query_heads", "num_key_value_heads"))  # Mistral keeps them as _...
        if not isinstance(heads, int) or not isinstance(groups, int) or groups < 1:
            return "a grouped-query attention without num_query_heads and num_key_value_heads"
        if heads % groups:
            return "a grouped-query attention whose query heads are not a multiple of its key-value heads"
        return None

    def kernels(self, layer):
        return {role: sub.kernel for role, sub in self._layers(layer).items()}

    def _refused_bias(self, role):
        return f"a grouped-query attention whose {role} projection has a bias"

    def head_kernel(self, layer):
        """The output kernel, whose groups along its heads axis are the query heads."""
        if self.keeps_heads_whole(layer):
            return None
        output = self._layers(layer)["output"]
        return output.kernel if _output_axes(output)[0] == 0 else None

    def keeps_heads_whole(self, layer):
        return False

    def query_groups(self, layer):
        """The rows of :meth:`head_kernel` by key-value group (``[(0, .., g - 1), (g, .., 2 g - 1), ...]``): the
        class gives every group as many query heads, so they even out group by group; ``[]`` with heads kept whole."""
        if self.head_kernel(layer) is None:
            return []
        heads, groups, _, _ = self._sizes(layer)
        size = heads // groups
        return [tuple(range(j * size, (j + 1) * size)) for j in range(groups)]

    def bias(self, layer):
        return None

    def weights(self, layer, read=to_numpy):
        """The kernels in :class:`AttentionRule`'s layout: ``query (model, heads, dim)``, ``key`` and ``value``
        ``(model, key-value heads, dim)``, ``output (heads, dim, model)``."""
        parts = self._layers(layer)
        found = {}
        for role, sub in parts.items():
            axes = _output_axes(sub) if role == "output" else _projection_axes(sub)
            found[role] = np.transpose(read(sub.kernel), axes)
        return found | {"bias": None}

    def thresholded_variables(self, layer):
        return [sub.kernel for sub in self._layers(layer).values()]

    def kernel_shape(self, layer):
        parts = self._layers(layer)
        model = int(parts["query"].kernel.shape[_projection_axes(parts["query"])[0]])
        out = int(parts["output"].kernel.shape[_output_axes(parts["output"])[2]])
        return 1, model, out

    @staticmethod
    def _group(weights):
        """The number of query heads per key-value head."""
        return weights["query"].shape[1] // weights["key"].shape[1]

    def _per_query_head(self, weights):
        """``weights`` with the key and value kernels repeated to one head per query head."""
        group = self._group(weights)
        return dict(weights, key=np.repeat(weights["key"], group, axis=1),
                    value=np.repeat(weights["value"], group, axis=1))

    def units_view(self, weights, in_units, layer=None):
        return super().units_view(self._per_query_head(weights), in_units, layer)

    def kept_heads(self, weights, kept_out, whole=False):
        """``(query heads, key-value heads)`` that stay, in order, every kept group with as many query heads
        (``whole``: all of them). With ``weights["head_floor"]`` ``(groups, heads per group)`` (the most that
        another block of the same class keeps, ``prune_model(blocks="uniform")``), at least that many: dead
        groups in index order, dead heads after the live ones."""
        group = self._group(weights)
        if whole:
            return np.arange(weights["query"].shape[1]), np.arange(weights["key"].shape[1])
        live = self.live_heads(weights, kept_out).reshape(-1, group)  # (key-value heads, group)
        groups = np.flatnonzero(live.any(axis=1))
        if groups.size == 0:  # a layer has at least one head: one whose output weights are zero adds nothing
            groups = np.arange(1)
        count = max(1, int(live[groups].sum(axis=1).max()))
        floor = weights.get("head_floor")
        if floor is not None:
            more = int(floor[0]) - groups.size
            if more > 0:
                groups = np.sort(np.concatenate([groups, np.setdiff1d(np.arange(live.shape[0]), groups)[:more]]))
            count = max(count, int(floor[1]))
        heads = [g * group + np.sort(np.argsort(~live[g], kind="stable")[:count]) for g in groups]
        return np.concatenate(heads), groups

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        heads, groups = self.kept_heads(weights, kept_out, self.keeps_heads_whole(layer))
        parts = self._layers(layer)
        chosen = {"query": weights["query"][kept_in][:, heads], "key": weights["key"][kept_in][:, groups],
                  "value": weights["value"][kept_in][:, groups], "output": weights["output"][heads][..., kept_out]}
        new = []
        for role in ("query", "key", "value", "output"):
            axes = _output_axes(parts[role]) if role == "output" else _projection_axes(parts[role])
            new.append(np.ascontiguousarray(np.transpose(chosen[role], np.argsort(axes))))
        by_path = {variable.path: to_numpy(variable) for variable in layer.weights}  # biases: whole heads only
        by_path.update(zip([parts[role].kernel.path for role in ("query", "key", "value", "output")], new))
        config = dict(layer_config(layer), num_query_heads=int(heads.size), num_key_value_heads=int(groups.size))
        return config, [by_path[variable.path] for variable in layer.weights]

    new_units = None  # reads one tensor; two are refused by name, not kept whole

    def call(self, layer, x, options=None):
        options = dict(options or {})
        if getattr(layer, "sliding_window_size", None) and options.get("attention_mask") is None:
            # Called alone, without the mask its decoder computed (a block traced at probe sizes is then built again
            # as itself, in place of these calls): a sliding window needs some mask to shape, so every key is given.
            options["attention_mask"] = keras.ops.ones_like(keras.ops.einsum("btd,bsd->bts", x, x), dtype="bool")
        return layer(x, **options)

    def _sizes(self, layer):
        """``(query heads, key-value heads, head size, sequence length or 1)``."""
        parts = self._layers(layer)
        query, key = ([int(d) for d in parts[role].kernel.shape] for role in ("query", "key"))
        _, heads, dim = (query[a] for a in _projection_axes(parts["query"]))
        groups = key[_projection_axes(parts["key"])[1]]
        steps = _steps(layer)
        return heads, groups, dim, 1 if steps is None else int(steps)

    def flops(self, layer, positions, in_units, out_units, output_shape, heads=None, groups=None):
        """``T * in * dim * (H + 2 K)`` (projections) ``+ 2 T^2 * H * dim`` (scores, weighted values) ``+ T * H *
        dim * out`` (output) multiply-adds per sample: ``H`` query heads, ``K`` key-value heads."""
        total, kv, dim, steps = self._sizes(layer)
        heads = total if heads is None else heads
        kv = kv if groups is None else groups
        return steps * in_units * dim * (heads + 2 * kv) + 2 * steps * steps * heads * dim + steps * heads * dim * out_units

    def params(self, layer, positions, in_units, out_units, has_bias, heads=None, groups=None):
        total, kv, dim, _ = self._sizes(layer)
        heads = total if heads is None else heads
        kv = kv if groups is None else groups
        return in_units * dim * (heads + 2 * kv) + heads * dim * out_units

    def head_floor(self, layer, weights, kept_out):
        """``(key-value heads, query heads per key-value head)`` that stay with the units ``kept_out`` kept."""
        heads, groups = self.kept_heads(weights, kept_out, self.keeps_heads_whole(layer))
        return int(groups.size), int(heads.size // groups.size)

    def inner_units(self, layer, weights, kept_out):
        """``(live query heads, query heads)`` with the units ``kept_out`` kept."""
        heads = self.kept_heads(weights, kept_out, self.keeps_heads_whole(layer))[0]
        return int(heads.size), int(weights["output"].shape[0])

    def kept_cost(self, layer, positions, kept_in, kept_out, output_shape, has_bias, weights, kept_mask):
        heads, groups = self.kept_heads(weights, np.flatnonzero(kept_mask), self.keeps_heads_whole(layer))
        shape = dict(heads=int(heads.size), groups=int(groups.size))
        return (self.flops(layer, positions, kept_in, kept_out, output_shape, **shape),
                self.params(layer, positions, kept_in, kept_out, has_bias, **shape))


class WholeHeadsAttentionRule(GroupedQueryAttentionRule):
    """Grouped-query attention whose class derives the size of a head from the model's width and the number of
    heads (KerasHub's Llama, Mistral, Qwen and Phi-3: ``head_dim = hidden_dim // num_query_heads``): built with
    fewer heads it would compute something else, so its heads stay whole (no group penalty, said by
    ``add_group_sparsity``) and the layers around it (the gated feed-forward) are pruned. Its projections may
    have biases (Qwen's)."""

    def _refused_bias(self, role):
        return f"a grouped-query attention whose {role} projection has a bias" if role == "output" else None

    def keeps_heads_whole(self, layer):
        return True

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        if np.asarray(kept_in).size != in_units:  # pragma: no cover - the norm before it keeps every channel
            raise RuntimeError(f"the channels that '{layer.name}' reads were to be sliced, but its class derives its "
                               "head size from them; please report this")
        return super().slice_units(layer, weights, in_units, kept_in, kept_out)

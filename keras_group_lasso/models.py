"""Attach group-sparse penalties to an existing model."""

import dataclasses
import json
import math
import warnings

import keras
import numpy as np

from keras_group_lasso._validation import check_choice, check_non_negative, fail
from keras_group_lasso.analysis import dense_roles, get_layer, input_dense_layers
from keras_group_lasso.costs import LatencyTable, unit_costs
from keras_group_lasso.declared import (
    PenaltyState,
    attach_state,
    declare_group_penalties,
    group_sparse_penalties,
    layer_weights,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import graph_model, model_graph, traced_block
from keras_group_lasso.regularizers import (
    CoupledGroupLasso,
    GroupLasso,
    GroupSparseRegularizer,
    HiddenGroupLasso,
    InputGroupLasso,
    SparseGroupLasso,
)

__all__ = [
    "add_group_sparsity",
    "input_dense_layers",
    "GroupSparseModel",
    "GroupSparseSequential",
    "coupled_groups",
    "set_penalty_multiplier",
]


def _declare(model):
    # Model variables (not trainable): saved with the model, and part of the state a compiled
    # JAX train step receives, so a new value reaches the next step.
    model.penalty_multiplier = model.add_weight(
        shape=(2,), initializer="ones", trainable=False, name="penalty_multiplier", dtype="float32"
    )
    # Not tracked: read and written by callbacks only, never inside a compiled step.
    attach_state(model, PenaltyState(with_multiplier=False), carried=False)
    declare_group_penalties(model, type(model).__name__, multiplier=model.penalty_multiplier,
                            state=model.group_penalty_state)


class _MultiplierState:
    """``get_weights`` / ``set_weights`` are the layers' weights, as for the plain model, without the
    penalties' state (the multiplier and a budget's progress, saved with the model), so weights move
    between this model and a plain clone (``keras.models.clone_model`` of a Sequential gives a plain one)."""

    def _layer_variables(self):
        return layer_weights(self)

    def get_weights(self):
        return [keras.ops.convert_to_numpy(v) for v in self._layer_variables()]

    def count_params(self):
        """The layers' parameters, as for the plain model (the penalties' state is not a parameter)."""
        return int(sum(math.prod(v.shape) for v in self._layer_variables()))

    def set_weights(self, weights):
        variables = self._layer_variables()
        weights = list(weights)
        if len(weights) != len(variables):
            raise ValueError(
                f"set_weights on model '{self.name}': expected {len(variables)} weights (the layers' weights, "
                f"without the penalties' state), received {len(weights)}."
            )
        for variable, value in zip(variables, weights):
            if tuple(variable.shape) != tuple(getattr(value, "shape", ())):
                raise ValueError(
                    f"set_weights on model '{self.name}': weight '{variable.path}' has shape "
                    f"{tuple(variable.shape)}, received a value of shape {tuple(getattr(value, 'shape', ()))}."
                )
            variable.assign(value)


def _attach_head_penalties(model, penalties):
    """Put each penalty of ``{layer name: penalty}`` on the head kernel of the named layer (a MultiHeadAttention's
    output kernel); returns ``{layer name: that variable}``."""
    attached = {}
    for name, penalty in penalties.items():
        if not isinstance(penalty, GroupSparseRegularizer):
            penalty = keras.saving.deserialize_keras_object(penalty)
        layer = get_layer(model, name)
        rule = registry.units_rule(layer)
        variable = None if rule is None else rule.head_kernel(layer)
        if variable is None:
            fail("GroupSparseModel", "head_penalties", "penalties of layers with heads (MultiHeadAttention)",
                 f"{name!r} ({type(layer).__name__})")
        variable.regularizer = penalty
        attached[name] = variable
    return attached


def _attach_block_penalties(model, penalties):
    """Put each penalty of ``{variable path: penalty}`` on the model's variable of that path; returns ``{path:
    that variable}``."""
    variables = {variable.path: variable for variable in model.weights}
    attached = {}
    for path, penalty in penalties.items():
        if not isinstance(penalty, GroupSparseRegularizer):
            penalty = keras.saving.deserialize_keras_object(penalty)
        if path not in variables:
            fail("GroupSparseModel", "block_penalties", "penalties of the model's own weights (by path)", repr(path))
        variables[path].regularizer = penalty
        attached[path] = variables[path]
    return attached


@keras.saving.register_keras_serializable(package="keras_group_lasso", name="GroupSparseModel")
class GroupSparseModel(_MultiplierState, keras.Model):
    """A functional model whose group penalties share a strength multiplier and see each other
    (what ``add_group_sparsity`` returns for a functional model).

    Its attribute ``penalty_multiplier`` (a variable ``(input groups, other
    groups)``, ``(1, 1)`` at first, saved with the model) scales every
    group-sparse penalty of its layers: a
    :class:`~keras_group_lasso.SparsityBudget` steers the strength through it
    during ``fit`` (:func:`set_penalty_multiplier`). A
    :class:`~keras_group_lasso.CoupledGroupLasso` on one kernel needs the
    other kernels of its coupled groups; this model links them. Both links
    are made whenever the model is built: by :func:`add_group_sparsity`, by
    ``keras.saving.load_model`` and by ``keras.models.clone_model``. Otherwise
    it is a plain functional ``keras.Model`` (same call, same config).
    ``GroupSparseModel(model.inputs, model.outputs)`` gives these links to a
    functional model whose penalties were put on by hand (sharing its layers).
    Its attribute ``source_model`` (saved in its config) holds the class and
    config of the model ``add_group_sparsity`` copied when that class is not
    Keras's own (a KerasHub Backbone or Task): ``prune_model`` builds that
    class again where every block keeps the same widths.

    Example:
        >>> inputs = keras.Input((3,))
        >>> h = keras.layers.Dense(3, name="h")(inputs)
        >>> out = keras.layers.Dense(2, name="out")(keras.layers.Add()([inputs, h]))
        >>> model = add_group_sparsity(keras.Model(inputs, out), 1e-3)
        >>> type(model).__name__, [g.size for g in coupled_groups(model)]
        ('GroupSparseModel', [5, 5, 5])
    """

    def __init__(self, inputs, outputs, name=None, **kwargs):
        # ``head_penalties``: ``{layer name: penalty}`` on attention heads (a keyword, so that Keras still reads
        # the constructor as a functional model's).
        # ``block_penalties``: ``{variable path: penalty}`` on the weights of the sublayers of blocks written as
        # layers (a block's config does not hold its sublayers' penalties).
        # ``source_model``: the class and config (``keras.saving.serialize_keras_object``) of the model this one
        # copies when its class is not Keras's own (a KerasHub Task): what prune_model builds again.
        head_penalties = kwargs.pop("head_penalties", None) or {}
        block_penalties = kwargs.pop("block_penalties", None) or {}
        source = kwargs.pop("source_model", None)
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        # kept as JSON text, out of Keras's attribute tracking (a tracked dict would hold the model's layers)
        object.__setattr__(self, "_source_model", None if source is None else json.dumps(source))
        heads = _attach_head_penalties(self, head_penalties)
        inside = _attach_block_penalties(self, block_penalties)
        self.head_penalties = {name: variable.regularizer for name, variable in heads.items()}  # read by get_config
        self.block_penalties = {path: variable.regularizer for path, variable in inside.items()}
        _declare(self)
        # The declaration gives every weight a penalty object of its own: these are the ones on the kernels now.
        self.head_penalties = {name: variable.regularizer for name, variable in heads.items()}
        self.block_penalties = {path: variable.regularizer for path, variable in inside.items()}

    @property
    def preprocessor(self):
        """The preprocessor of the KerasHub Task ``add_group_sparsity`` copied (kept, not applied: this model takes
        what it makes), or ``None``; not saved with the model: after loading one, give it back with
        ``model.preprocessor = task.preprocessor`` (a layer, or ``None``) before ``prune_model``."""
        return getattr(self, "_task_preprocessor", None)

    @preprocessor.setter
    def preprocessor(self, value):
        if value is not None and not isinstance(value, keras.layers.Layer):
            fail(type(self).__name__, "preprocessor", "a preprocessor layer (a KerasHub Task's) or None", value)
        # kept out of Keras's tracking (a tracked layer would join the model's weights and its saved file)
        object.__setattr__(self, "_task_preprocessor", value)

    def __setattr__(self, name, value):
        if name == "preprocessor":  # past Keras's tracking, to the property
            GroupSparseModel.preprocessor.fset(self, value)
            return
        super().__setattr__(name, value)

    @property
    def source_model(self):
        """The class and config (``keras.saving.serialize_keras_object``) of the model this one copies, a new dict
        each time; ``None`` for a model of Keras's own classes."""
        return None if self._source_model is None else json.loads(self._source_model)

    def get_config(self):
        config = super().get_config()
        for key in ("head_penalties", "block_penalties"):
            if getattr(self, key):
                config[key] = {name: keras.saving.serialize_keras_object(penalty)
                               for name, penalty in getattr(self, key).items()}
        if self.source_model is not None:
            config["source_model"] = self.source_model
        return config


@keras.saving.register_keras_serializable(package="keras_group_lasso", name="GroupSparseSequential")
class GroupSparseSequential(_MultiplierState, keras.Sequential):
    """A ``keras.Sequential`` whose group penalties share a strength multiplier (what ``add_group_sparsity``
    returns for a Sequential model).

    As :class:`GroupSparseModel`: ``penalty_multiplier`` scales every
    group-sparse penalty of its layers, including layers added later with
    ``add``. Otherwise it is a plain ``keras.Sequential``.

    Example:
        >>> model = add_group_sparsity(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), 1e-3)
        >>> type(model).__name__, model.penalty_multiplier.numpy().tolist()
        ('GroupSparseSequential', [1.0, 1.0])
    """

    def __init__(self, layers=None, trainable=True, name=None):
        super().__init__(layers=layers, trainable=trainable, name=name)
        _declare(self)

    def add(self, layer, rebuild=True):
        super().add(layer, rebuild=rebuild)
        if hasattr(self, "penalty_multiplier"):
            declare_group_penalties(self, type(self).__name__)  # links the penalties of the new layer


def set_penalty_multiplier(model, value=None, *, input=None, hidden=None):
    """Set the strength multiplier of the group-sparse penalties of ``model``.

    The penalties then act as ``m * (factor * group Lasso + l1 * Lasso)``
    from the next training step on, without recompiling, in the loss and in
    the proximal steps of :class:`~keras_group_lasso.Proximal` alike (both
    read the one multiplier the model declares): ``m = input`` for the input
    groups (feature selection), ``m = hidden`` for all other groups; ``value``
    sets both. An argument left ``None`` keeps its entry. ``model`` is any
    model whose layers carry this package's penalties: one made by
    :func:`add_group_sparsity` holds the multiplier itself
    (``penalty_multiplier``); another gets it declared now (see
    :mod:`keras_group_lasso.declared`). Assigning ``model.penalty_multiplier``
    directly is the same.

    Raises:
        InvalidParameterError: a value is not a finite number >= 0, or the
            model carries no penalty of this package.

    Example:
        >>> model = add_group_sparsity(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), 1e-3)
        >>> set_penalty_multiplier(model, 2.5)
        >>> set_penalty_multiplier(model, input=4.0)
        >>> model.penalty_multiplier.numpy().tolist()
        [4.0, 2.5]
    """
    owner = "set_penalty_multiplier"
    value = check_non_negative(owner, "value", value, allow_none=True)
    input = check_non_negative(owner, "input", input, allow_none=True)
    hidden = check_non_negative(owner, "hidden", hidden, allow_none=True)
    declared = declare_group_penalties(model, owner)
    declared.set_multiplier(input=value if input is None else input, hidden=value if hidden is None else hidden)

_PENALTIES = ("sgl", "group")
_GROUP_WEIGHTS = ("size", "flops", "latency")


def _check_latency_table(owner, group_weight, latency_table):
    if latency_table is not None and not isinstance(latency_table, LatencyTable):
        fail(owner, "latency_table", "None or a LatencyTable", latency_table)
    if group_weight == "latency" and latency_table is None:
        fail(owner, "latency_table", "a LatencyTable of the model with group_weight='latency' (it weighs the groups)",
             latency_table)
    if group_weight != "latency" and latency_table is not None:
        fail(owner, "latency_table", f"None with group_weight={group_weight!r} (a table weighs the groups with "
             "group_weight='latency')", latency_table)


_A_MODEL = ("a Sequential or Functional keras.Model, or a subclassed one built on data (call it on a batch first) "
            "whose call can be traced")


def _check_graph_model(owner, model):
    # Sequential and Functional models have a graph of layers to copy; a subclassed model is read through the
    # functional model its call traces (graph_model), which the callers pass here.
    graph = isinstance(model, keras.Sequential) or any(
        cls.__name__ == "Functional" for cls in type(model).__mro__
    )
    if not graph:
        fail(owner, "model", _A_MODEL, model)
    try:
        model.inputs
    except (AttributeError, ValueError):
        fail(owner, "model", "a built model with a known input (start it with keras.Input)", model)
    if not model.inputs:
        fail(owner, "model", "a built model with a known input (start it with keras.Input)", model)


def _makes_units(layer):
    return registry.makes_units(layer)


def _dense_inside(model, prefix="", parents=()):
    """``(qualified name, layer, enclosing nested models)`` for every Dense and convolution layer, at any depth."""
    for layer in model.layers:
        name = prefix + layer.name
        traced = None if isinstance(layer, keras.Model) or _makes_units(layer) else traced_block(layer)
        if isinstance(layer, keras.Model) or traced is not None:
            yield from _dense_inside(traced or layer, name + "/", parents + ((name, layer),))
        elif _makes_units(layer):
            yield name, layer, parents


def _roles_by_layer(owner, model):
    """``{id(layer): (role, channels)}`` for every Dense and convolution layer; refuses one the graph cannot reach.

    ``channels`` is ``C`` for a Dense layer that reads a flattened ``(..., C)``
    map made by an earlier layer (its groups are whole channels), else ``None``.
    """
    roles = dense_roles(model)
    graph = model_graph(model)
    channels = graph.flatten_channels
    whole = {node.name for node in graph.nodes if node.kind == "whole"}
    by_layer = {}
    found = list(_dense_inside(model))
    read = {id(layer) for name, layer, _ in found if name in roles}
    for name, layer, parents in found:
        if name not in roles and id(layer) in read:
            continue  # a layer the model calls again outside the nested model that holds it (a tied embedding)
        if name in whole:
            continue  # kept whole by the graph (cross-attention): no penalty, every channel it reads stays
        if name not in roles:
            rule = registry.rule_of(layer)
            reason = rule.refusal(layer) if rule is not None and rule.refusal else None
            if reason:  # the layer itself is refused (a grouped convolution, ...): say so, as prune_model does
                fail(
                    owner,
                    "model",
                    f"a model whose layers that make units can be read (layer '{name}' ({type(layer).__name__}) is "
                    f"{reason}; see 'Supported layers' in the README)",
                    model,
                )
            inside = " > ".join(f"'{p}' ({type(m).__name__})" for p, m in parents) or "the model"
            fail(
                owner,
                "model",
                "a model whose nested models are called once, on one input, and whose blocks trace (the Dense layer "
                f"'{name}' is inside {inside}, whose graph cannot be read)",
                model,
            )
        by_layer[id(layer)] = (roles[name], channels.get(name), name)
    return by_layer


def _source_model(model):
    """The class and config of ``model`` where its class is not Keras's own (a KerasHub Backbone or Task), or of
    the model a penalised copy was made from; else ``None``."""
    if getattr(model, "source_model", None) is not None:
        return model.source_model
    if type(model).__module__.split(".")[0] in ("keras", "keras_group_lasso"):
        return None
    try:
        source = keras.saving.serialize_keras_object(model)
        source = {key: value for key, value in source.items() if key not in ("build_config", "compile_config")}
        return json.loads(json.dumps(source))  # plain values only
    except Exception:  # noqa: BLE001 - a model whose config cannot be written: pruned as a functional model
        return None


def _inputs_of(model):
    """New inputs for a copy of a Functional ``model``, each named as its input layer (``None`` for a Sequential).

    Keras's ``clone_model`` names a new input after the symbolic tensor (``keras_tensor_3``), not after its input
    layer (``input_layer_1``), which renames an input the user did not name: the copy keeps the layer's name, which
    ``get_layer`` and the pruned model use.
    """
    if isinstance(model, keras.Sequential):
        return None
    named = {id(layer.output): layer.name for layer in model.layers if isinstance(layer, keras.layers.InputLayer)}
    return keras.tree.map_structure(
        lambda x: keras.Input(batch_shape=x.shape, dtype=x.dtype, name=named.get(id(x), x.name)), model.input)


def _from_config(layer):
    """A new layer of ``layer``'s class from its config (:func:`~keras_group_lasso.graph.registry.layer_from_config`)."""
    return registry.layer_from_config(layer, registry.layer_config(layer))


def _penalise_sublayers(block, new, penalised, found=None):
    """Give the sublayers of ``new`` (a copy of the traced ``block``) their names and the group penalties of their
    counterparts in ``block``: as attributes, read when a sublayer is built, and on the variables of a sublayer
    built already (``found``: ``{variable path: penalty}`` of those, which the model's config keeps, since the
    block's config does not hold its sublayers' penalties)."""
    for original, made in _paired_sublayers(block, new):
        made.name = original.name
        if registry.units_rule(original) is None:
            continue  # no group penalty goes on it (a block's own MLP, which KerasHub made without a config)
        for key, value in penalised(original).items():
            if not key.endswith("_regularizer") or value is getattr(original, key, None):
                continue
            penalty = keras.regularizers.get(value)
            setattr(made, key, penalty)
            stem = key[: -len("_regularizer")]
            variable = getattr(made, stem, None)
            if not isinstance(variable, keras.Variable):
                variable = getattr(made, f"{stem}_kernel", None)
            if isinstance(variable, keras.Variable):
                variable.regularizer = penalty
                if found is not None:
                    found[variable.path] = penalty


def _paired_sublayers(original, made):
    """``(original sublayer, its counterpart)`` of two blocks of the same class, by the attribute (or list
    entry) that holds each, at any depth."""
    def children(layer):
        if isinstance(layer, keras.Sequential):
            return {str(i): sub for i, sub in enumerate(layer.layers)}
        found = {}
        for key, value in vars(layer).items():
            items = value if isinstance(value, (list, tuple)) else [value]
            for i, item in enumerate(items):
                if isinstance(item, keras.layers.Layer):
                    found[f"{key}[{i}]"] = item
        return found

    pairs, stack, seen = [], [(original, made)], set()
    while stack:
        a, b = stack.pop()
        mine, theirs = children(a), children(b)
        for key, sub in mine.items():
            if key in theirs and id(sub) not in seen and type(theirs[key]) is type(sub):
                seen.add(id(sub))
                pairs.append((sub, theirs[key]))
                stack.append((sub, theirs[key]))
    return pairs


def _layer_classes(model):
    """``{class name: class}`` of the layers of ``model``, nested models included."""
    found = {}
    for layer in model.layers:
        found[type(layer).__name__] = type(layer)
        if isinstance(layer, keras.Model):
            found.update(_layer_classes(layer))
    return found


def _refresh_normalization(model):
    # set_weights leaves a Normalization's cached mean and variance at their initial values;
    # loading its own variables again (the saving API) recomputes them.
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            _refresh_normalization(layer)
        elif hasattr(registry.rule_of(layer), "refresh"):
            registry.rule_of(layer).refresh(layer)


def _first_names(names):
    """The first three of ``names`` (texts) and how many more, for a warning."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _refuse_without_penalty(owner, model):
    unread = model_graph(model).unread_kernels()
    inside = (f"; its kernels are inside {registry.unread_text(unread)} (see 'Your own layers' in the docs)"
              if unread else "")
    fail(owner, "model", "a model with at least one Dense or convolution layer (the layers group penalties "
         f"go on); the copy would have no penalty{inside}", model)


def add_group_sparsity(model, factor=1e-3, *, l1=None, input_factor=None, penalty="sgl", bias=True,
                       group_weight="size", latency_table=None):
    """Return a copy of ``model`` with group-sparse penalties on every Dense and convolution layer.

    Layers that read the model input get :class:`InputGroupLasso` (feature
    selection; for a convolution, input channels); every other kernel gets
    :class:`HiddenGroupLasso` (neuron and channel pruning); biases get bias
    groups. The groups are all outgoing weights of one unit: a kernel row of a
    Dense layer, ``kernel[..., c, :]`` of a convolution (Conv1D/2D/3D; both
    kernels of a SeparableConv), and for a Dense layer after ``Flatten`` of a
    ``(..., C)`` map all rows of channel ``c`` (``channels=C``), so whole
    channels go. DepthwiseConv layers are left without a penalty. With
    ``penalty="sgl"`` (default) each term also has ``l1 * sum |w|``, the sparse
    group Lasso of the paper. Which layers read the input is
    :func:`keras_group_lasso.analysis.dense_roles`, the graph the report and
    surgery read. Nested Sequential or Functional blocks are copied too, with
    their Dense layers penalised. Existing kernel/bias regularizers of Dense
    layers are replaced; other layers are copied as they are. Weights are
    copied; the original model is not changed. The copy is not compiled.

    In a residual or branching model a unit can be read by several layers
    (:func:`coupled_groups`): its group is then its outgoing weights in all
    of them, penalised as one (``lambda * sqrt(|U|) * ||U||_2``, with
    ``input_factor`` when the unit is an input feature): the readers' kernels
    get a :class:`~keras_group_lasso.CoupledGroupLasso` and the copy is a
    :class:`GroupSparseModel`, which links them.

    ``group_weight="flops"`` weighs each group by what its unit costs instead
    of ``sqrt(|g|)``: the multiply-adds per sample of making the unit (in
    every layer that makes it) and of reading it (in every layer that reads
    it), scaled so that the penalised groups' mean weight stays their mean
    ``sqrt(|g|)`` (``factor`` keeps its scale). A channel of an early
    convolution, computed at every position of a large map, then weighs far
    more than a unit of a Dense head, so the penalty removes FLOPs rather than
    parameters. The groups of one layer share its strength, the mean cost of
    the units it reads; a coupled group gets its own.

    ``group_weight="latency"`` does the same with measured time instead of
    multiply-adds: a unit costs the marginal time of making it and of reading
    it in each layer, from ``latency_table``
    (:meth:`~keras_group_lasso.LatencyTable.marginal_seconds`: the slope of the
    layer's measured time over its grid of widths, from the smallest measured
    width to the dense one, at the table's largest batch size), normalized as
    the FLOPs are. A unit whose time does not grow with width costs 1 % of
    the mean unit, so its groups keep a penalty. Only the resulting strengths
    are kept (in the regularizers, as with ``"flops"``), so the model saves
    and loads without the table.

    Args:
        model: a built Sequential or Functional ``keras.Model``; a nested
            model must be a Sequential or Functional block called once with one
            input and one output.
        factor: group strength ``lambda`` (finite, >= 0).
        l1: elementwise strength for ``penalty="sgl"``; ``None`` uses
            ``factor`` (the paper's choice). ``penalty="group"`` has no
            elementwise term: it takes ``None`` only.
        input_factor: group strength for the input groups; ``None`` uses
            ``factor``. Lets feature selection be stronger or weaker than
            neuron pruning.
        penalty: ``"sgl"`` (sparse group Lasso) or ``"group"`` (group Lasso).
        bias: also penalize the biases (the paper's bias groups), with
            ``factor`` whatever ``group_weight`` is.
        group_weight: ``"size"`` (the paper's ``sqrt(|g|)``), ``"flops"``
            (the multiply-adds of the group's unit, see above) or
            ``"latency"`` (its measured time, see above).
        latency_table: a :class:`~keras_group_lasso.LatencyTable` measured
            for ``model``; required with ``group_weight="latency"``, and only
            then.

    Returns:
        A new, uncompiled model with the same weights whose penalties share a
        strength multiplier (``penalty_multiplier``, 1): a
        :class:`GroupSparseSequential` for a Sequential model without coupled
        units or blocks traced into the graph, else a :class:`GroupSparseModel`
        (over the same layers). For a KerasHub Task with a preprocessor, the
        copy keeps that preprocessor as ``preprocessor`` without applying it
        (with a warning): its ``fit`` and ``predict`` take what the
        preprocessor makes, and ``prune_model(..., blocks="uniform")`` gives
        it to the Task it builds again.

    Raises:
        InvalidParameterError: bad arguments, or a model that is not
            Sequential/Functional and whose call cannot be traced (a
            subclassed model built on data is copied as the functional model
            of the layers its call runs),
            or a Dense layer inside a nested model whose graph cannot be read
            (the message names both), or a ``latency_table`` of another model.

    Example:
        >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, name="conv"),
        ...                           keras.layers.Flatten(), keras.layers.Dense(3, name="head")])
        >>> sparse = add_group_sparsity(model, 1e-3)
        >>> sparse.get_layer("conv").kernel_regularizer
        InputGroupLasso(factor=0.001, l1=0.001)
        >>> sparse.get_layer("head").kernel_regularizer
        HiddenGroupLasso(factor=0.001, l1=0.001, channels=4)
    """
    owner = "add_group_sparsity"
    factor = check_non_negative(owner, "factor", factor)
    input_factor = check_non_negative(owner, "input_factor", input_factor, allow_none=True)
    input_factor = factor if input_factor is None else input_factor
    penalty = check_choice(owner, "penalty", penalty, _PENALTIES)
    if penalty == "sgl":
        l1 = factor if l1 is None else check_non_negative(owner, "l1", l1)
    elif l1 is not None:  # group Lasso has no elementwise term: a strength given for one would be dropped
        fail(owner, "l1", "None with penalty='group' (group Lasso has no elementwise term; penalty='sgl' has)", l1)
    else:
        l1 = 0.0
    if not isinstance(bias, (bool, np.bool_)):  # as SparsityBudget's flags: numpy's booleans are booleans
        fail(owner, "bias", "True or False", bias)
    bias = bool(bias)
    group_weight = check_choice(owner, "group_weight", group_weight, _GROUP_WEIGHTS)
    _check_latency_table(owner, group_weight, latency_table)
    # A KerasHub Task's preprocessor goes with its copy (as does the one a penalised copy of a Task holds).
    keeps = _is_hub_task(model) or isinstance(model, GroupSparseModel)
    preprocessor = getattr(model, "preprocessor", None) if keeps else None
    if not isinstance(model, keras.Model):
        fail(owner, "model", _A_MODEL, model)
    source = f"{type(model).__name__} {model.name!r}"
    model = graph_model(model)  # a subclassed model: the functional model of the layers its call runs
    _check_graph_model(owner, model)
    if latency_table is not None:
        latency_table.check_model(model, owner=owner, name="latency_table")
    roles = _roles_by_layer(owner, model)
    if not roles:
        _refuse_without_penalty(owner, model)
    input_l1 = l1 if penalty == "sgl" else 0.0
    replaced = []

    graph = model_graph(model)
    coupled = _coupling(graph, factor, input_factor)
    scale = {}
    if group_weight != "size":
        cost = unit_costs(graph, "flops") if group_weight == "flops" else _latency_costs(graph, latency_table)
        scale, scales = _cost_weights(graph, coupled, factor, input_factor, cost)
        coupled = _Coupling(coupled.members, scales, coupled.groups)

    def clone(layer):
        if id(layer) not in roles and traced_block(layer) is not None:
            # A block of layers (a subclassed Layer): a new one from its config, whose sublayers take their
            # penalties before they are built (when the copy is called).
            new = _from_config(layer)
            # A config without the layer's name (a block whose constructor takes no ``name``) gives a new one;
            # the copy keeps the user's, which the graph's names and the penalties are keyed by.
            new.name = layer.name
            _penalise_sublayers(layer, new, penalised)
            blocks_made.append((layer, new))
            return new
        if id(layer) not in roles and registry.rule_of(layer) is None:
            new = _from_config(layer)  # a layer the graph cannot read, copied as it is (said below)
            new.name = layer.name
            return new
        return registry.layer_from_config(layer, penalised(layer))

    def penalised(layer):
        """``layer``'s config with the group penalties of its role."""
        config = registry.layer_config(layer)
        found = roles.get(id(layer))
        if found is not None:
            role, channels, name = found
            own = (input_factor if role == "input" else factor) * scale.get(name, 1.0)
            own_l1 = input_l1 if role == "input" else l1
            rule = registry.units_rule(layer)
            view = rule.view_of(layer)  # a grouped convolution's groups: each channel's weights into its own group
            where = {"axis": view.axis, "conv_groups": view.conv_groups}
            if name in coupled.members:
                keys, anchor = coupled.members[name]
                penalty_of = lambda: CoupledGroupLasso(  # noqa: E731
                    own, l1=own_l1, channels=channels, coupled=keys, scales=coupled.scales, anchor=anchor, role=role,
                    **where)
            elif role == "input":
                penalty_of = lambda: InputGroupLasso(own, l1=input_l1, channels=channels, **where)  # noqa: E731
            else:
                penalty_of = lambda: HiddenGroupLasso(own, l1=l1, channels=channels, **where)  # noqa: E731
            kernels = rule.regularizer_attributes(layer)
            own_units = rule.own_unit_attributes(layer)
            holders = rule.penalty_layers(layer)
            has_bias = any(getattr(holder, "use_bias", False) for holder in holders)
            attributes = kernels + own_units + (("bias_regularizer",) if bias and has_bias else ())
            for holder in holders:
                for attribute in attributes:
                    existing = getattr(holder, attribute, None)
                    if existing is not None and not isinstance(existing, GroupSparseRegularizer):
                        replaced.append(f"{name}.{attribute} ({type(existing).__name__})")
            # Input unit c's outgoing weights, in every kernel (a SeparableConv's depthwise[..., c, :] and
            # pointwise[..., c, :]): each kernel carries the penalty on the same groups. A recurrent kernel's
            # groups are the layer's own units (hidden groups).
            penalties = {attribute: penalty_of for attribute in kernels}
            penalties.update({attribute: (lambda: HiddenGroupLasso(factor, l1=l1)) for attribute in own_units})
            if bias and has_bias:
                penalties["bias_regularizer"] = lambda: (
                    SparseGroupLasso(factor, l1=l1) if penalty == "sgl" else GroupLasso(factor)
                )
            if holders == (layer,):
                config.update({attribute: make() for attribute, make in penalties.items()})
            else:  # a wrapper (Bidirectional): the penalties go on the layers it holds
                for key in rule.penalty_config_keys(layer):
                    inner = dict(config[key]["config"])
                    inner.update({attribute: keras.saving.serialize_keras_object(make())
                                  for attribute, make in penalties.items()})
                    config[key] = dict(config[key], config=inner)
        return config

    blocks_made = []
    copy = keras.models.clone_model(model, clone_function=clone, recursive=True, input_tensors=_inputs_of(model))
    inside = {}  # {variable path: penalty} of the sublayers of blocks
    for layer, new in blocks_made:  # a block that makes its sublayers in build() (KerasHub's) has them now
        _penalise_sublayers(layer, new, penalised, inside)
    if not group_sparse_penalties(copy):  # every layer that makes units is one no penalty goes on (an embedding)
        _refuse_without_penalty(owner, model)
    unread = graph.unread_kernels()
    if unread:  # said now, before any training: never a model penalised in part without a word
        warnings.warn(
            f"{owner}: the kernels of {registry.unread_text(unread)} get no group penalty: their units keep their "
            f"size, a budget counts them as they are, and prune_model refuses the model. {registry.WHAT_TO_DO}",
            UserWarning,
            stacklevel=2,
        )
    unread_names = {name for name, *_ in unread}
    refused = [(name, cls, reason) for name, cls, reason in graph.problems if name not in unread_names]
    if refused and not unread:  # every kernel is penalised, but surgery will refuse: said before training too
        shown = ", ".join(f"'{name}' ({cls}): {reason}" for name, cls, reason in refused[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        warnings.warn(
            f"{owner}: every kernel gets its group penalty, but prune_model cannot rebuild this model: {shown}{more}. "
            "Training, sparsity_report and apply_threshold work; prune_model refuses until it can read those layers. "
            f"{registry.WHAT_TO_DO}",
            UserWarning,
            stacklevel=2,
        )
    whole = [node.name for node in graph.units if registry.units_rule(graph.layers[node.name]).keeps_heads_whole(
        graph.layers[node.name])]
    if whole:  # a penalty that surgery could not honour is not put on: said, so that nobody waits for heads to go
        shown = _first_names([f"'{name}'" for name in whole])
        warnings.warn(
            f"{owner}: the heads of {shown} get no group penalty and stay whole: their blocks are traced at fixed "
            "sizes (a KerasHub decoder) and are pruned only as themselves, built again from their config, which ties "
            "the size of a head to their number. The other layers of those blocks (the feed-forward neurons) are "
            "penalised and pruned.",
            UserWarning,
            stacklevel=2,
        )
    held = [node.name for node in graph.nodes if node.kind == "whole"
            and getattr(registry.rule_of(graph.layers[node.name]), "holds_heads", False)]
    if held:  # an attention layer the graph keeps whole by its class: its heads stay, said once
        shown = _first_names([f"'{name}' ({type(graph.layers[name]).__name__})" for name in held])
        warnings.warn(
            f"{owner}: the heads of {shown} get no group penalty and stay whole: their class is kept whole (its "
            "projections and positions are its own). The layers around them (the feed-forward neurons) are "
            "penalised and pruned.",
            UserWarning,
            stacklevel=2,
        )
    crossing = [node.name for node in graph.nodes if node.kind == "whole"
                and registry.units_rule(graph.layers[node.name]) is not None]
    if crossing:  # a layer that makes units, kept whole (cross-attention): no penalty, said once
        shown = _first_names([f"'{name}'" for name in crossing])
        warnings.warn(
            f"{owner}: {shown} read two tensors (cross-attention: a query from one, keys and values from another) "
            "and are kept whole: their heads get no group penalty and stay, and every channel they read stays. The "
            "layers around them are penalised and pruned.",
            UserWarning,
            stacklevel=2,
        )
    if replaced:
        warnings.warn(
            f"{owner}: the group penalties replace the regularizers these layers had: {', '.join(replaced)}. "
            "To keep one as well, add it to the copy's layer (a layer holds one regularizer per weight).",
            UserWarning,
            stacklevel=2,
        )
    # The model's own variables (the strength multiplier) are named after it, and PyTorch refuses a "." in a
    # parameter name (MobileNetV2 is "mobilenetv2_1.00_224"): the copy's name has "_" instead.
    name = copy.name.replace(".", "_")
    # Attention heads: the groups of each MultiHeadAttention's output kernel (its config has one regularizer for
    # all four kernels, so the penalty goes on that variable; the model's config declares it).
    heads = {}
    for node in graph.units:
        layer = graph.layers[node.name]
        if registry.units_rule(layer).head_kernel(layer) is not None and node.name not in graph.calls:
            heads[node.name] = HiddenGroupLasso(factor * scale.get(node.name, 1.0), l1=l1, axis=0)
    # a traced block's sublayers hold their penalties as attributes, which a rebuild from the config would drop
    blocks = any(id(layer) not in roles and traced_block(layer) is not None for layer in model.layers)
    if isinstance(copy, keras.Sequential) and not coupled.members and not heads and not blocks:
        # Rebuilt from its config: the layer classes of the model are known here, registered for serialization
        # or not (a custom layer of the user's script).
        with keras.saving.custom_object_scope(_layer_classes(copy)):
            copy = GroupSparseSequential.from_config(dict(copy.get_config(), name=name))
    elif isinstance(copy, keras.Sequential):  # coupled groups, heads, blocks: the functional class, same layers
        inputs = keras.Input(batch_shape=tuple(model.inputs[0].shape), dtype=model.inputs[0].dtype,
                             name=model.inputs[0].name)
        outputs = inputs
        for layer in copy.layers:
            outputs = layer(outputs)
        copy = GroupSparseModel(inputs, outputs, name=name, head_penalties=heads, block_penalties=inside,
                                source_model=_source_model(model))
    else:  # the functional copy's own input and output structures (a dict stays a dict)
        copy = GroupSparseModel(copy.input, copy.output, name=name, head_penalties=heads, block_penalties=inside,
                                source_model=_source_model(model))
    copy.set_weights([keras.ops.convert_to_numpy(v) for v in _in_order_of(layer_weights(model), copy)])
    _refresh_normalization(copy)
    if preprocessor is not None and isinstance(copy, GroupSparseModel):
        copy.preprocessor = preprocessor
        warnings.warn(
            f"{owner}: the penalised copy of {source} is a functional model over the "
            f"Task's inputs: it keeps the Task's preprocessor ({type(preprocessor).__name__}) as `.preprocessor` but "
            "does not apply it, so fit, evaluate and predict take what it makes (for instance "
            "`copy.preprocessor(x)`); prune_model(copy, blocks='uniform') builds the Task again with it where every "
            "block keeps as many units.",
            UserWarning,
            stacklevel=2,
        )
    return copy


def _is_hub_task(model):
    """Whether ``model`` is a KerasHub Task (whose ``preprocessor`` runs before it, outside its graph): a class
    named ``Task`` from ``keras_hub`` among its bases. A model of the user's that applies a preprocessor of its own
    in ``call`` is not one: its copy runs that layer already."""
    return any(base.__name__ == "Task" and base.__module__.split(".")[0] == "keras_hub"
               for base in type(model).__mro__)


def _in_order_of(weights, copy):
    """``weights`` (the source model's) in the order of ``copy``'s layer weights: as they are where every shape
    fits, else by path where the paths name them one to one (a functional copy may list its layers in another order
    than the model it copies: KerasHub's BART lists its decoder's position embedding elsewhere)."""
    targets = layer_weights(copy)
    if len(targets) == len(weights) and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(weights, targets)):
        return weights
    by_path = {v.path: v for v in weights}
    if len(by_path) == len(weights) == len(targets) and {v.path for v in targets} == set(by_path):
        return [by_path[v.path] for v in targets]
    return weights


class _Coupling:
    def __init__(self, members, scales, groups):
        self.members = members  # {layer name: (coupled index of each of its groups or -1, anchor)}
        self.scales = scales  # s_k = lambda_k * sqrt(|U_k|)
        self.groups = groups  # (unit id, ((layer name, group index), ...), size) of each coupled group


def _coupling(graph, factor, input_factor):
    """The coupled groups of ``graph``: units that more than one layer reads, with the layers' group indices."""
    if not graph.supported:
        return _Coupling({}, (), ())
    readers = {}
    separable = set()
    for node in graph.units:
        if node.name in graph.calls:  # a later call of a shared layer: the same kernel rows as its first call
            continue
        for i, unit in enumerate(node.in_ids):
            readers.setdefault(int(unit), []).append((node.name, i))
            if len(registry.units_rule(graph.layers[node.name]).kernels(graph.layers[node.name])) > 1:
                separable.add(int(unit))
    units = {node.name: node for node in graph.units}
    keys, scales, groups = {}, [], []
    for unit, found in readers.items():
        # One layer reading a unit through several rows (Concatenate of a tensor with itself) keeps its own
        # groups; SeparableConv's two kernels keep their own penalties.
        if len({name for name, _ in found}) < 2 or unit in separable:
            continue
        size = sum(registry.units_rule(graph.layers[name]).group_size(graph.layers[name], units[name].positions,
                                                                      units[name].out_units) for name, _ in found)
        strength = input_factor if unit < graph.n_features else factor
        keys[unit] = len(scales)
        scales.append(strength * math.sqrt(size))
        groups.append((unit, tuple(found), size))
    members = {}
    for node in graph.units:
        row = [keys.get(int(unit), -1) for unit in node.in_ids]
        # In the order of the penalty's group rows (a grouped convolution's rows are not its channels' order).
        layer = graph.layers[node.name]
        row = [row[int(u)] for u in registry.units_rule(layer).view_of(layer).unit_order(len(row))]
        if any(k >= 0 for k in row):
            members[node.name] = (row, not members)
    return _Coupling(members, tuple(scales), tuple(groups))


#: With ``group_weight="latency"`` a unit costs at least this fraction of the mean unit's cost.
_LATENCY_FLOOR = 0.01


def _latency_costs(graph, table):
    """``group_weight="latency"``: each unit's measured marginal time (:meth:`LatencyTable.marginal_seconds`).

    At the table's largest batch size (the least dominated by the call's fixed cost); a unit whose measured time
    does not grow with width (noise, or a layer whose time is the call's) costs ``_LATENCY_FLOOR`` of the mean,
    so that its groups keep a penalty.
    """
    cost = unit_costs(graph, "latency", table, max(table.batch_sizes))
    mean = sum(cost.values()) / len(cost) if cost else 0.0
    if mean <= 0.0:  # no layer's time grows with its width: equal costs
        return {unit: 1.0 for unit in cost}
    return {unit: max(value, _LATENCY_FLOOR * mean) for unit, value in cost.items()}


def _cost_weights(graph, coupled, factor, input_factor, cost):
    """``group_weight="flops"`` or ``"latency"``: a multiplier of each layer's strength, and the coupled groups' scales.

    A group's weight becomes the cost of its unit (``cost``: ``{unit id: cost}``, see :func:`~keras_group_lasso.costs.unit_costs`) over
    the mean of that cost, times the mean ``sqrt(|g|)``; means over the groups with a strength above 0.
    """
    coupled_units = {unit for unit, _, _ in coupled.groups}
    groups = []  # (layer name or None, cost, sqrt(size), strength > 0)
    for node in graph.units:
        if node.name in graph.calls:
            continue
        strength = input_factor if node.reads_input else factor
        layer = graph.layers[node.name]
        size = registry.units_rule(layer).params(layer, node.positions, 1, node.out_units, False)
        groups += [(node.name, cost[int(u)], math.sqrt(size), strength > 0)
                   for u in node.in_ids if int(u) not in coupled_units]
    for unit, _, size in coupled.groups:
        strength = input_factor if unit < graph.n_features else factor
        groups.append((None, cost[unit], math.sqrt(size), strength > 0))
    weighted = [(c, r) for _, c, r, on in groups if on]
    if not weighted:
        return {}, coupled.scales
    mean_cost = sum(c for c, _ in weighted) / len(weighted)
    mean_root = sum(r for _, r in weighted) / len(weighted)
    scale = {}
    for node in graph.units:
        own = [(c, r) for name, c, r, _ in groups if name == node.name]
        if own:
            scale[node.name] = sum(c for c, _ in own) / len(own) / mean_cost * mean_root / own[0][1]
    scales = tuple(
        (input_factor if unit < graph.n_features else factor) * cost[unit] / mean_cost * mean_root
        for unit, _, _ in coupled.groups
    )
    return scale, scales


@dataclasses.dataclass(frozen=True)
class CoupledGroup:
    """A unit that several layers read: its group is its outgoing weights in all of them.

    Attributes:
        unit: the unit id in the model graph (an input feature when ``< n_features``).
        readers: ``((layer name, group index), ...)``: where its weights lie.
        size: weights in the union, ``|U|``.
    """

    unit: int
    readers: tuple
    size: int


def coupled_groups(model):
    """The coupled groups of ``model``: units read by more than one layer (residual and branching models).

    Raises:
        InvalidParameterError: ``model`` is not a built Sequential or functional ``keras.Model``.
    """
    _check_graph_model("coupled_groups", model)
    coupling = _coupling(model_graph(model), 1.0, 1.0)
    return tuple(CoupledGroup(unit, readers, size) for unit, readers, size in coupling.groups)

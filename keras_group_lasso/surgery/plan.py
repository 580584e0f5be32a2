"""Plan what to cut: for each Dense layer, the rows and units that survive, across coupled layers.

The decision itself (which units are dead) is :func:`keras_group_lasso.analysis.unit_masks`;
this module turns it into a plan that covers every layer on the path from the
model input to its output, with the steps that build the smaller model
(:mod:`.steps`), and refuses models it cannot plan for.
"""

import dataclasses

import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import check_choice, fail
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import model_graph
from keras_group_lasso.surgery.steps import plan_steps

__all__ = ["UnsupportedModelError", "LayerPlan", "DensePlan", "PruningPlan", "plan_pruning", "SUPPORTED"]

def supported_text():
    """What surgery supports, in words, from the one registry of layer classes."""
    return (
        "Sequential or functional models, with one or several inputs (nested Sequential or functional blocks "
        "of these layers are opened): "
        + registry.supported_text()
    )


SUPPORTED = supported_text()

INPUTS = ("original", "selected")  # what the pruned model takes (``inputs=`` of plan_pruning and prune_model)


_OTHERS_SHOWN = 3


class UnsupportedModelError(ValueError):
    """Surgery cannot rebuild this model; the user's model is left as it was.

    The message is at most three lines: the layer and why, up to three other
    layers that are not supported either, and where to read what is.

    Attributes:
        layer_name: the first layer (or the model) that could not be interpreted.
        layer_class: its class name.
        reason: what it is, in words.
        others: ``"'name' (class): reason"`` of every other layer not supported.
        supported: what surgery supports, in words (:data:`SUPPORTED`).
    """

    def __init__(self, owner, layer_name, layer_class, reason, others=()):
        self.layer_name = layer_name
        self.layer_class = layer_class
        self.reason = reason
        self.others = tuple(others)
        self.supported = supported_text()
        message = f"{owner}: cannot prune layer '{layer_name}' ({layer_class}): {reason}."
        if others:
            more = len(others) - _OTHERS_SHOWN
            message += ("\nAlso not supported: " + ", ".join(others[:_OTHERS_SHOWN])
                        + (f" and {more} more layer{'s' if more > 1 else ''}" if more > 0 else "") + ".")
        super().__init__(f"{message}\n{registry.WHAT_TO_DO}")


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What one layer that makes units (Dense, convolution) keeps.

    Attributes:
        name: layer name.
        kept_inputs: indices of the input units kept (the kept units of the
            layer before, or the kept input features).
        kept_units: indices of the units (kernel columns) kept.
        folded_units: indices of removed constant units whose output is
            folded into the next layer's bias.
        inputs_before, inputs_after, units_before, units_after: sizes.
        params_before, params_after: kernel plus bias sizes.
        is_output: the layer produces the model output (keeps every unit).
    """

    name: str
    kept_inputs: tuple
    kept_units: tuple
    folded_units: tuple
    inputs_before: int
    inputs_after: int
    units_before: int
    units_after: int
    params_before: int
    params_after: int
    is_output: bool


DensePlan = LayerPlan  # the name of version 0.1


@dataclasses.dataclass(frozen=True)
class PruningPlan:
    """Everything surgery will cut, decided before any layer is built.

    Attributes:
        threshold: weights with ``|w| <= threshold`` are zero.
        input_shape: the model's input shape (without the batch axis); ``None`` with several inputs.
        input_shapes: the shape of each input (the features of all inputs are numbered one after the other).
        n_features: input features (flattened).
        kept_features: indices of the input features kept.
        dense: one :class:`LayerPlan` per layer that makes units, input to output.
        layer_sizes_before / layer_sizes_after: sizes with the input layer,
            without the output layer (as in the report).
        params_before / params_after: parameters of the layers that make units.
        report: the :class:`~keras_group_lasso.analysis.SparsityReport` at this
            threshold (with ``round_to`` > 1: of what the plan keeps).
        round_to: each hidden layer keeps a multiple of it of its units.
        folded_merges: ``{merge name: names of its operands that leave}``: operands
            constant on every channel, replaced by a ``Rescaling`` after the merge.
        removed_layers: layers that only such operands used (surgery builds none of them).
        steps: the surgery, one frozen step per node of the graph (a few for
            some), in call order: :class:`~keras_group_lasso.surgery.steps.NewInput`,
            ``NewConstant``, ``Drop``, ``Alias``, ``SelectUnits``, ``SliceUnits``, ``SlicePerUnit``,
            ``Merge``, ``Concat``, ``FoldConstants``, ``CallShared``
            (:mod:`keras_group_lasso.surgery.steps`); :func:`~keras_group_lasso.prune_model`
            applies them in order.
        inputs, fold_batchnorm: the options the steps were planned with (see
            :func:`~keras_group_lasso.prune_model`).
    """

    threshold: float
    input_shape: tuple
    n_features: int
    kept_features: tuple
    dense: tuple
    layer_sizes_before: tuple
    layer_sizes_after: tuple
    params_before: int
    params_after: int
    report: object = dataclasses.field(repr=False, compare=False)
    folded_merges: dict = dataclasses.field(default_factory=dict)
    removed_layers: tuple = ()
    round_to: int = 1
    masks: object = dataclasses.field(repr=False, compare=False, default=None)
    analysis: object = dataclasses.field(repr=False, compare=False, default=None)
    input_shapes: tuple = ()
    steps: tuple = dataclasses.field(default=(), repr=False)
    inputs: str = "original"
    fold_batchnorm: bool = False

    def to_dict(self):
        """A JSON-serializable dict (for a manifest)."""
        return {
            "threshold": self.threshold,
            "input_shape": (None if self.input_shape is None
                            else [None if d is None else int(d) for d in self.input_shape]),
            "input_shapes": [[None if d is None else int(d) for d in shape] for shape in self.input_shapes],
            "n_features": self.n_features,
            "kept_features": list(self.kept_features),
            "layer_sizes_before": list(self.layer_sizes_before),
            "layer_sizes_after": list(self.layer_sizes_after),
            "params_before": self.params_before,
            "params_after": self.params_after,
            "folded_merges": {name: list(dropped) for name, dropped in self.folded_merges.items()},
            "removed_layers": list(self.removed_layers),
            "round_to": self.round_to,
            "dense": [
                {
                    key: (list(value) if isinstance(value, tuple) else value)
                    for key, value in dataclasses.asdict(layer).items()
                }
                for layer in self.dense
            ],
            "inputs": self.inputs,
            "fold_batchnorm": self.fold_batchnorm,
            "steps": [step.to_dict() for step in self.steps],
        }


def _indices(mask):
    return tuple(int(i) for i in np.flatnonzero(mask))


def check_supported(owner, model):
    """Return the graph of ``model`` or raise :class:`UnsupportedModelError`."""
    graph = model_graph(model)
    if not graph.supported:
        problems = graph.problems or (
            (model.name, type(model).__name__, "a model whose layers the analysis cannot follow"),
        )
        name, cls, reason = problems[0]
        others = tuple(f"'{n}' ({c}): {r}" for n, c, r in problems[1:])
        raise UnsupportedModelError(owner, name, cls, reason, others)
    return graph


def plan_pruning(model, threshold=1e-3, round_to=1, inputs="original", fold_batchnorm=False):
    """Plan the surgery of ``model`` at ``threshold`` without building anything.

    The kept input units and units of every Dense and convolution layer come
    from :func:`keras_group_lasso.analysis.unit_masks` (the same fixed point as
    the report), so ``plan.layer_sizes_after == sparsity_report(model, threshold).layer_sizes``
    when ``round_to`` is 1. ``plan.steps`` says what
    :func:`~keras_group_lasso.prune_model` with the same arguments builds, node by node.

    Args:
        model: a built ``keras.Model``.
        threshold: finite number >= 0; weights with ``|w| <= threshold`` are zero.
        round_to: integer >= 1: each hidden layer keeps a multiple of it of
            its units (see :func:`~keras_group_lasso.prune_model`).
        inputs: ``"original"`` (default) or ``"selected"``: what the new model
            takes (see :func:`~keras_group_lasso.prune_model`).
        fold_batchnorm: bool (default ``False``): plan to merge each
            BatchNormalization that can be into the layer before it (see
            :func:`~keras_group_lasso.prune_model`).

    Returns:
        A frozen :class:`PruningPlan`; ``plan.to_dict()`` is JSON-serializable.

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``, a
            threshold at which no input feature survives, or a model in which
            no path of non-zero weights leads from an input feature to the output.
        NonFiniteError: a kernel or bias holds NaN or inf.
        UnsupportedModelError: the model holds a layer or a graph that surgery
            cannot interpret (the message names the layer and its class).

    Example:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
        >>> plan = plan_pruning(model, 1e-3)
        >>> plan.layer_sizes_after
        (3, 4)
        >>> tuple(step.kind for step in plan.steps)
        ('new_input', 'slice_units', 'slice_units')
    """
    owner = "plan_pruning"
    inputs = check_choice(owner, "inputs", inputs, INPUTS)
    if not isinstance(fold_batchnorm, bool):
        fail(owner, "fold_batchnorm", "a bool", fold_batchnorm)
    return build_plan(owner, model, threshold, round_to, inputs=inputs, fold_batchnorm=fold_batchnorm)


def build_plan(owner, model, threshold, round_to=1, inputs="original", fold_batchnorm=False, values=None,
               uniform=False):
    """The :class:`PruningPlan` of ``model`` with its steps, its :class:`~keras_group_lasso.analysis.Analysis` attached
    (with ``values``, ``{variable path: numpy array}``: of the model as if those weights held those values; with
    ``uniform``, blocks of one class keep as many units and heads each)."""
    result = analysis.analyze(model, threshold, owner=owner, round_to=round_to, values=values, uniform=uniform)
    check_supported(owner, model)
    graph, masks, report = result.graph, result.masks, result.report
    threshold = report.threshold
    if not masks.live_path:
        analysis.refuse_no_live_path(owner, model, threshold)

    plans = []
    for layer in report.layers:
        name = layer.name
        kept_in = _indices(masks.inputs[name])
        kept_out = _indices(masks.units[name])
        node = graph.node(name)
        has_bias = result.weights[name]["bias"] is not None
        rule = registry.units_rule(graph.layers[name])
        plans.append(
            LayerPlan(
                name=name,
                kept_inputs=kept_in,
                kept_units=kept_out,
                folded_units=_indices(masks.folded[name]),
                inputs_before=layer.groups,
                inputs_after=len(kept_in),
                units_before=layer.units,
                units_after=len(kept_out),
                params_before=rule.params(graph.layers[name], node.positions, layer.groups, layer.units, has_bias),
                params_after=rule.kept_cost(graph.layers[name], node.positions, len(kept_in), len(kept_out),
                                            graph.output_shape(name, node.out_units), has_bias, result.weights[name],
                                            masks.units[name])[1],
                is_output=layer.is_output,
            )
        )

    return PruningPlan(
        threshold=float(threshold),
        input_shape=tuple(graph.input_shape) if graph.input_shape is not None else None,
        input_shapes=tuple(tuple(found.shape) for found in graph.inputs),
        n_features=report.n_features,
        kept_features=report.selected_features,
        dense=tuple(plans),
        layer_sizes_before=report.original_layer_sizes,
        layer_sizes_after=report.layer_sizes,
        params_before=report.params_before,
        params_after=report.params_after,
        report=report,
        folded_merges={
            name: tuple(operand for operand, drop in zip(graph.tensor(name).inputs, fold.dropped) if drop)
            for name, fold in masks.merge_folds.items()
        },
        removed_layers=tuple(node.name for node in graph.nodes if node.name in masks.detached),
        round_to=int(round_to),
        masks=masks,
        analysis=result,
        steps=plan_steps(model, graph, masks, threshold, inputs=inputs, fold_batchnorm=fold_batchnorm, owner=owner),
        inputs=inputs,
        fold_batchnorm=fold_batchnorm,
    )


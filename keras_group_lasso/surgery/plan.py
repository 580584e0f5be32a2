"""Plan what to cut: for each Dense layer, the rows and units that survive, across coupled layers.

The decision itself (which units are dead) is :func:`keras_group_lasso.analysis.unit_masks`;
this module turns it into a plan that covers every layer on the path from the
model input to its output, and refuses models it cannot plan for.
"""

import dataclasses

import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import fail

__all__ = ["UnsupportedModelError", "DensePlan", "PruningPlan", "plan_pruning", "SUPPORTED"]

SUPPORTED = (
    "Sequential or functional models with one input and one output whose Dense layers form one "
    "chain (each layer used once), with only per-unit layers between them (Dropout, "
    "GaussianDropout, GaussianNoise, AlphaDropout, Identity, Activation with an elementwise "
    "function, ReLU, LeakyReLU, ELU, PReLU, BatchNormalization on the last axis, Normalization, "
    "Rescaling), input preprocessing before the first Dense (Normalization and Rescaling on any "
    "axes, the per-unit layers, Flatten), Activation or Softmax after the last one, and nested "
    "Sequential or functional blocks of these layers (called once, one input, one output)"
)


class UnsupportedModelError(ValueError):
    """Surgery cannot rebuild this model; the user's model is left as it was.

    Attributes:
        layer_name: the first layer (or the model) that could not be interpreted.
        layer_class: its class name.
        reason: what it is, in words.
    """

    def __init__(self, owner, layer_name, layer_class, reason, others=()):
        self.layer_name = layer_name
        self.layer_class = layer_class
        self.reason = reason
        message = f"{owner}: cannot prune layer '{layer_name}' ({layer_class}): {reason}."
        if others:
            message += " Also not supported: " + ", ".join(others) + "."
        message += f" Supported: {SUPPORTED}."
        super().__init__(message)


@dataclasses.dataclass(frozen=True)
class DensePlan:
    """What one Dense layer keeps.

    Attributes:
        name: layer name.
        kept_inputs: indices of the kernel rows kept (the kept units of the
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


@dataclasses.dataclass(frozen=True)
class _Step:
    name: str
    kind: str  # "head" (before the first Dense), "dense", "unit" (after a Dense), "tail", "flatten"
    dense: str = None  # for "unit": the Dense whose units it carries


@dataclasses.dataclass(frozen=True)
class PruningPlan:
    """Everything surgery will cut, decided before any layer is built.

    Attributes:
        threshold: weights with ``|w| <= threshold`` are zero.
        input_shape: the model's input shape (without the batch axis).
        n_features: input features (flattened).
        kept_features: indices of the input features kept.
        dense: one :class:`DensePlan` per Dense layer, input to output.
        layer_sizes_before / layer_sizes_after: sizes with the input layer,
            without the output layer (as in the report).
        params_before / params_after: parameters of the Dense layers.
        report: the :class:`~keras_group_lasso.analysis.SparsityReport` at this threshold.
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
    steps: tuple = dataclasses.field(repr=False, compare=False, default=())
    masks: object = dataclasses.field(repr=False, compare=False, default=None)

    def to_dict(self):
        """A JSON-serializable dict (for a manifest)."""
        return {
            "threshold": self.threshold,
            "input_shape": [None if d is None else int(d) for d in self.input_shape],
            "n_features": self.n_features,
            "kept_features": list(self.kept_features),
            "layer_sizes_before": list(self.layer_sizes_before),
            "layer_sizes_after": list(self.layer_sizes_after),
            "params_before": self.params_before,
            "params_after": self.params_after,
            "dense": [
                {
                    key: (list(value) if isinstance(value, tuple) else value)
                    for key, value in dataclasses.asdict(layer).items()
                }
                for layer in self.dense
            ],
        }


def _no_live_path(owner, model, threshold):
    """Raise for a model with no input feature left: blame the threshold only when it is the cause."""
    exact = analysis.sparsity_report(model, threshold=0.0)
    if threshold > 0 and exact.selected_features:
        fail(
            owner,
            "threshold",
            "small enough to leave a path of weights above it from an input feature to the output "
            f"(at this threshold every input feature is pruned and the output is a constant; "
            f"at threshold 0, {exact.n_selected_features} of {exact.n_features} features reach it)",
            threshold,
        )
    all_zero = [layer.name for layer in exact.layers if layer.zero_weights == layer.weights]
    cause = (
        "every kernel weight of " + ", ".join(f"'{name}'" for name in all_zero) + " is 0"
        if all_zero
        else "each path of non-zero weights from an input feature stops before the output"
    )
    fail(
        owner,
        "model",
        "a model with a path of non-zero weights from an input feature to the output (in this one "
        f"{cause}, so its output is a constant at any threshold and there is nothing to prune to)",
        model,
    )


def _indices(mask):
    return tuple(int(i) for i in np.flatnonzero(mask))


def check_supported(owner, model):
    """Return the analysis structure of ``model`` or raise :class:`UnsupportedModelError`."""
    structure = analysis._structure(model)
    if not structure.supported:
        problems = structure.uninterpreted or (
            (model.name, type(model).__name__, "a model whose Dense layers do not form one chain"),
        )
        # Name a layer that is itself not understood before a layer that merely branches.
        problems = sorted(problems, key=lambda p: p[2].startswith("a layer whose output feeds"))
        name, cls, reason = problems[0]
        others = tuple(f"'{n}' ({c}): {r}" for n, c, r in problems[1:])
        raise UnsupportedModelError(owner, name, cls, reason, others)
    return structure


def plan_pruning(model, threshold=1e-3):
    """Plan the surgery of ``model`` at ``threshold`` without building anything.

    The kept rows and units of every Dense layer come from
    :func:`keras_group_lasso.analysis.unit_masks` (the same fixed point as the
    report), so ``plan.layer_sizes_after == sparsity_report(model, threshold).layer_sizes``.

    Args:
        model: a built ``keras.Model``.
        threshold: finite number >= 0; weights with ``|w| <= threshold`` are zero.

    Returns:
        A frozen :class:`PruningPlan`; ``plan.to_dict()`` is JSON-serializable.

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``, a
            threshold at which no input feature survives, or a model in which
            no path of non-zero weights leads from an input feature to the output.
        NonFiniteError: a Dense kernel or bias holds NaN or inf.
        UnsupportedModelError: the model is not a chain of Dense layers that
            surgery understands (the message names the layer and its class).

    Example:
        >>> plan = plan_pruning(model, 1e-3)
        >>> plan.layer_sizes_after, plan.params_after
    """
    return _plan("plan_pruning", model, threshold)[0]


def _plan(owner, model, threshold):
    """``(plan, layers, kernels, biases)``: the plan plus the weights it was made from."""
    analysis._check_model(owner, model, threshold)
    check_supported(owner, model)
    structure, layers, kernels, biases, masks, report = analysis._analyze(owner, model, threshold)
    threshold = report.threshold
    if not masks.features.any():
        _no_live_path(owner, model, threshold)

    dense_plans = []
    for layer in report.layers:
        name = layer.name
        kept_in = _indices(masks.inputs[name])
        kept_out = _indices(masks.units[name])
        bias = 1 if layers[name].use_bias else 0
        dense_plans.append(
            DensePlan(
                name=name,
                kept_inputs=kept_in,
                kept_units=kept_out,
                folded_units=_indices(masks.folded[name]),
                inputs_before=layer.groups,
                inputs_after=len(kept_in),
                units_before=layer.units,
                units_after=len(kept_out),
                params_before=(layer.groups + bias) * layer.units,
                params_after=(len(kept_in) + bias) * len(kept_out),
                is_output=layer.is_output,
            )
        )

    steps = []
    for name in structure.head:
        steps.append(_Step(name, "head"))
    for name in structure.dense:
        steps.append(_Step(name, "dense"))
        kind = "tail" if structure.next[name] == "<output>" else "unit"
        for between in structure.between[name]:
            steps.append(_Step(between, kind, name))

    plan = PruningPlan(
        threshold=float(threshold),
        input_shape=tuple(structure.input_shape),
        n_features=report.n_features,
        kept_features=report.selected_features,
        dense=tuple(dense_plans),
        layer_sizes_before=report.original_layer_sizes,
        layer_sizes_after=report.layer_sizes,
        params_before=report.params_before,
        params_after=report.params_after,
        report=report,
        steps=tuple(steps),
        masks=masks,
    )
    return plan, layers, kernels, biases


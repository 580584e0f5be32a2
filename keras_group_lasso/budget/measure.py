"""A budgeted model's sizes, and the two steps that bring them down: a cut of the weakest groups, widths in blocks.

:class:`Meter` counts a model's sizes as :func:`keras_group_lasso.sparsity_report` counts them at a threshold
(with a latency budget, the table's predicted time too). :func:`cut_to` and :func:`round_widths` change the model
and return what they did; :class:`~keras_group_lasso.SparsityBudget` records it, says so and traces the step
again where it must.
"""

import dataclasses
import warnings

import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import fail
from keras_group_lasso.budget import cut, rounding, schedule
from keras_group_lasso.costs import unit_costs
from keras_group_lasso.graph import model_graph, registry
from keras_group_lasso.graph.masks import block_siblings

__all__ = ["Meter", "dense_sizes", "cut_to", "round_widths", "unmet_causes", "kernel_families", "warn_uneven_blocks"]


@dataclasses.dataclass(frozen=True)
class Meter:
    """How a budget counts the sizes of ``model``.

    Attributes:
        model: the Keras model; its weights are read at each measure.
        threshold: weights with ``|w| <= threshold`` count as zero.
        latency: the budget's :class:`~.latency_limit.LatencyLimit`, or ``None`` (no latency budget).
        round_to: above 1, until the widths were ``rounded``, the sizes are at the widths rounding up would give.
        rounded: the widths were rounded (with ``round_to`` > 1): the sizes are the model's own.
        owner: the name errors are raised under.
        uniform: the sizes are those of the model whose blocks of one class keep as many units and heads each
            (``prune_model(blocks="uniform")``), and a cut takes the groups of such blocks by rank together.
    """

    model: object
    threshold: float
    latency: object = None
    round_to: int = 1
    rounded: bool = False
    owner: str = "SparsityBudget"
    uniform: bool = False

    @property
    def predict(self):
        """The predicted time of ``{layer name: (in, out)}`` widths (:meth:`.LatencyLimit.predict`), or ``None``."""
        return None if self.latency is None else self.latency.predict

    def of(self, report, found=None):
        """The sizes of a report; with a latency budget (and ``found``, its :class:`Analysis`) the predicted time."""
        sizes = {"features": report.n_selected_features, "units": report.live_neurons,
                 "params": report.params_after, "flops": report.flops_after, "latency": 0.0}
        if self.latency is not None and found is not None and self.latency.table is not None:
            sizes["latency"] = self.latency.predict(self.latency.table.widths_of(found))
        return sizes

    def now(self, values=None):
        """The budgeted sizes of the model now.

        With ``values``, ``{kernel path: numpy array}``: as if its kernels held those, the model unchanged. With
        ``round_to`` > 1, until the widths were rounded, at the widths rounding up would give.
        """
        own_widths = self.round_to == 1 or self.rounded
        if self.latency is None and values is None and own_widths and not self.uniform:
            return self.of(analysis.sparsity_report(self.model, threshold=self.threshold))
        found = analysis.analyze(self.model, self.threshold, owner=self.owner, values=values, uniform=self.uniform)
        if own_widths:
            return self.of(found.report, found)
        layers = rounding.rounded_up(found, self.round_to, grow=True)
        return rounding.sizes_with(found, self.of(found.report, found), {layer.name: layer for layer in layers},
                                   self.predict)

    def narrowed(self, share):
        """The budgeted sizes of the model with every prunable layer at ``share`` of its width.

        Weighed on :func:`.cut.narrowed`'s values, not written. Its shape alone counts, not its training: a resumed
        ``fit`` finds the same sizes.
        """
        found = analysis.analyze(self.model, self.threshold, owner=self.owner,
                                 values=cut.narrowed(self.model, share), uniform=self.uniform)
        return self.of(found.report, found)

    def families(self):
        """The kernels (or rows of them) whose groups a cut takes by rank together (:func:`kernel_families`)."""
        return kernel_families(model_graph(self.model), self.uniform)

    def width_curves(self, dense, limits):
        """Each budgeted size as a curve of the share of its width every prunable layer keeps
        (:func:`.schedule.width_curves`), from the model narrowed alike to one group and to half; ``{}`` for feature
        budgets alone."""
        if not set(limits) - {"features"}:
            return {}
        budgeted = {kind: size for kind, size in dense.items() if kind in limits}  # a size the model lacks: None
        return schedule.width_curves(budgeted, self.narrowed(0.0), self.narrowed(0.5))

    def group_loads(self, sizes, goals):
        """``{kernel path: per-group share of the budgets}`` (:func:`.cut.group_loads`).

        Of the ``goals`` (budgets, or sizes on the way) the model is over at ``sizes``, each unit at what one more
        costs at the live widths.
        """
        found = analysis.analyze(self.model, self.threshold, owner=self.owner)
        masks = found.masks
        widths = {node.name: (int(masks.inputs[node.name].sum()), int(masks.units[node.name].sum()))
                  for node in found.graph.units if node.name in masks.units}
        table, batch_size = (None, None) if self.latency is None else (self.latency.table, self.latency.batch_size)
        over = [kind for kind, limit in goals.items() if sizes[kind] > limit] or list(goals)
        costs = [(unit_costs(found.graph, kind, table, batch_size, widths), goals[kind]) for kind in over]
        return cut.group_loads(found.graph, self.model, costs, cut.fixed_units(found.graph))


def dense_sizes(model, settings, owner):
    """``{kind: size}`` of the dense ``model`` as ``settings`` (:class:`.settings.BudgetSettings`) count them.

    Raises:
        InvalidParameterError: a ``max_flops`` for a model whose layers are counted some per position and some per
            sample.
    """
    report = analysis.sparsity_report(model, threshold=settings.threshold)
    per_position = {layer.flops_per_position for layer in report.layers if layer.flops_before}
    if settings.max_flops is not None and len(per_position) > 1:
        fail(owner, "max_flops", "None for a model with inputs of variable size whose layers are counted some "
             "per position and some per sample (after a global pooling): use max_params or max_units",
             settings.max_flops)
    return {"features": report.n_features, "units": report.neurons, "params": report.params_before,
            "flops": report.flops_before}


def warn_uneven_blocks(model, owner):
    """With ``uniform_blocks``: a warning when ``model`` has no penalised layers in two calls of one block class."""
    graph = model_graph(model)
    if kernel_families(graph) == kernel_families(graph, uniform=False):
        warnings.warn(f"{owner}: uniform_blocks=True has nothing to even out: the model has no penalised layers in "
                      "two calls of one block class; each layer keeps the width training leaves it.", RuntimeWarning,
                      stacklevel=3)


def cut_to(meter, sizes, goals, floors, final=True, limits=None, closing=0.0, ceilings=None):
    """Zero the fewest weakest groups that bring the model within ``goals``; returns ``(newly zeroed, sizes after)``.

    ``sizes``: the model's sizes now. Only input groups when only feature goals are exceeded, only hidden groups
    when only unit goals are; both for parameters and FLOPs. The groups already at zero go first, then the weakest
    relative to their own layer per share of the goals their unit takes (what cutting it frees: its multiply-adds,
    parameters, measured time, ...; :meth:`Meter.group_loads`); the strongest group of every kernel is never cut,
    nor the strongest groups a layer keeps under ``floors`` (``{kernel path: groups}``) while the goals can be met
    without (a step along the schedule, not ``final``, leaves them in any case: :func:`.cut.cut_weakest`).
    ``closing`` > 0 with ``limits``: at least that share of the groups the fewest cut within ``limits`` would take
    go too (ranked by the ``limits``). ``ceilings`` (``{kernel path: groups}``): the weakest groups of a kernel
    beyond its ceiling go in any case (:func:`.cut.ranked_groups`).
    """
    within = goals if not closing or limits is None else limits
    input_over, hidden_over = schedule.entry_overs(sizes, within)
    roles = {"input"} if (input_over or 0.0) > 1.0 else set()
    if (hidden_over or 0.0) > 1.0:
        roles.add("hidden")
    also = None
    if closing and limits is not None:
        also = (closing, lambda measured: schedule.over(measured, limits) <= 1.0)
    newly = cut.cut_weakest(meter.model, meter.threshold, roles, meter.group_loads(sizes, within), floors, meter.now,
                            lambda measured: schedule.over(measured, goals or {}) <= 1.0, floors_yield=final,
                            closing=also, ceilings=ceilings, families=meter.families())
    return newly, meter.now()


def round_widths(meter, limits, grow):
    """Give each roundable layer a multiple of ``round_to`` live units within ``limits`` (see :mod:`.rounding`).

    The strongest units of a layer stay; dead ones that a layer grows into are re-initialized (``grow``; only while
    epochs are left to train them). Returns ``({layer name: (live units before, after)}, live units removed)``, or
    ``None`` when whole blocks cannot meet ``limits`` (the model unchanged).
    """
    found = analysis.analyze(meter.model, meter.threshold, owner=meter.owner)
    layers, sizes = rounding.plan_widths(found, meter.of(found.report, found), limits, meter.round_to, grow,
                                         meter.predict)
    if not layers or schedule.over(sizes, limits) > 1.0:
        return None
    rng = np.random.default_rng(0)
    changed, removed = {}, 0
    for layer in layers:
        if layer.width != layer.live:
            rounding.apply_width(layer, meter.threshold, rng)
            changed[layer.name] = (layer.live, layer.width)
            removed += max(0, layer.live - layer.width)
    return changed, removed


def unmet_causes(model, declared):
    """``(frozen layers, unread kernels)``: what keeps its size whatever a cut takes (:func:`.messages.unmeetable`).

    The names of the penalised layers with ``trainable=False`` (in ``declared``, the model's
    :class:`~keras_group_lasso.declared.GroupPenalties`), and the text naming the kernels the graph cannot read
    (``""``: none).
    """
    frozen = sorted({layer.name for _, layer, _ in declared.penalties() if not layer.trainable})
    unread = model_graph(model).unread_kernels()
    return frozen, registry.unread_text(unread) if unread else ""


def kernel_families(graph, uniform=True):
    """``[(member, ...)]``: the group-penalised kernels whose groups a cut takes by rank together
    (:func:`.cut.tied_by_rank`).

    A grouped-query attention's query heads, key-value group by key-value group (its class gives every group as
    many: a head of one group frees nothing until every group loses one), as ``(kernel path, rows)`` members; with
    ``uniform``, also the kernels at the same place of the calls of blocks of one class
    (:func:`~keras_group_lasso.graph.masks.block_siblings`), of one shape, in one family per place and kernel.
    """
    families, tied = [], set()
    if uniform:
        for names in block_siblings(graph):
            kernels = [cut.penalised_kernels(graph.layers[name]) for name in names]
            if len({len(found) for found in kernels}) != 1:
                continue
            for together in zip(*kernels):
                if len({tuple(v.shape) for v in together}) == 1:
                    parts = _query_groups(graph.layers[names[0]], together[0])
                    families.append(tuple(v.path if rows is None else (v.path, rows)
                                          for v in together for rows in parts))
                    tied |= {v.path for v in together}
    for node in graph.units:
        layer = graph.layers[node.name]
        for variable in cut.penalised_kernels(layer):
            parts = _query_groups(layer, variable)
            if variable.path not in tied and len(parts) > 1:
                families.append(tuple((variable.path, rows) for rows in parts))
    return families


def _query_groups(layer, kernel):
    """The rows of ``kernel`` that even out apart: a grouped-query attention's query heads by key-value group, or
    ``[None]`` (all its rows together)."""
    rule = registry.units_rule(layer)
    groups = getattr(rule, "query_groups", None)
    if groups is None or rule.head_kernel(layer) is None or rule.head_kernel(layer).path != kernel.path:
        return [None]
    return groups(layer) or [None]

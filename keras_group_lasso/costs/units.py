"""What one unit costs: the multiply-adds, parameters, time, units or features a unit of a model graph adds.

A function of the graph and the widths alone (no weights are read): the budget ranks the groups it cuts by it
and :func:`~keras_group_lasso.add_group_sparsity` weighs the groups' penalties with it.
"""

from keras_group_lasso.graph import registry

__all__ = ["unit_costs"]


def unit_costs(graph, kind, latency_table=None, batch_size=None, widths=None):
    """``{unit id: cost}``: what one unit of a model graph costs in a budget's ``kind``.

    A unit costs what making it costs in every layer that makes it plus what reading it costs in every layer that
    reads it, each layer's cost per unit being::

        flops:    multiply-adds / input units,  multiply-adds / output units (and what a layer that costs
                  multiply-adds per channel on its own costs per channel: a depthwise convolution's window)
        params:   the kernel row of one input unit,  the kernel column and bias of one output unit
        latency:  LatencyTable.marginal_seconds (the slope of the layer's measured time over its widths)
        units:    0,  1 for a unit a hidden layer makes
        features: 1 for an input feature, 0 for any other unit

    Args:
        graph: a :class:`~keras_group_lasso.graph.ModelGraph`.
        kind: ``"flops"``, ``"params"``, ``"latency"``, ``"units"`` or ``"features"``.
        latency_table: the :class:`~keras_group_lasso.LatencyTable` of the graph's model (``kind="latency"`` only).
        batch_size: the table's batch size (``None``: its only one).
        widths: ``{layer name: (input units, output units)}`` to count multiply-adds and parameters at (the live
            units of a pruned structure: what one more unit costs there); ``None``: the dense widths. The
            latency slope is the table's, at the dense widths.

    A layer called several times counts its multiply-adds and time at each call, its parameters and units once.
    """
    if kind == "features":
        return {unit: 1.0 if unit < (graph.n_features or 0) else 0.0 for unit in range(graph.n_ids)}
    if kind == "latency":
        per_node = latency_table.marginal_seconds(batch_size)
    else:
        per_node = {}
        for node in graph.units:
            layer, rule = graph.layers[node.name], registry.units_rule(graph.layers[node.name])
            width_in, width_out = (widths or {}).get(node.name, (node.in_units, node.out_units))
            width_in, width_out = max(int(width_in), 1), max(int(width_out), 1)
            if kind == "flops":
                flops = rule.flops(layer, node.positions, width_in, width_out,
                                   graph.output_shape(node.name, node.out_units))
                per_node[node.name] = (flops / width_in, flops / width_out)
            elif node.name in graph.calls:  # a later call of a shared layer: its parameters and units counted once
                per_node[node.name] = (0.0, 0.0)
            elif kind == "params":
                kernel = rule.params(layer, node.positions, width_in, width_out, False)
                bias = rule.params(layer, node.positions, width_in, width_out, bool(getattr(layer, "use_bias", True)))
                per_node[node.name] = (kernel / width_in, bias / width_out)
            else:
                per_node[node.name] = (0.0, 0.0 if node.is_output else 1.0)
    cost = {}
    for node in graph.units:
        per_in, per_out = per_node[node.name]
        for ids, each in ((node.out_ids, per_out), (node.in_ids, per_in)):
            for unit in ids:
                cost[int(unit)] = cost.get(int(unit), 0.0) + each
    if kind == "flops":  # a depthwise convolution's window over each channel it reads
        for each, ids in graph.channel_costs().values():
            for unit in ids:
                cost[int(unit)] = cost.get(int(unit), 0.0) + each
    return cost

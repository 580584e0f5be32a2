"""The steering of a size budget, as pure functions of sizes and numbers (no model, no Keras).

Sizes are dicts ``{kind: count}`` over the kinds ``"features"``, ``"units"``,
``"params"``, ``"flops"`` and ``"latency"`` (predicted seconds, see
:mod:`.cost`); ``limits`` holds the budgeted kinds only. The multiplier has two
entries: input groups (served by ``features``) and all other groups (served by
``units``); ``params``, ``flops`` and ``latency`` are served by both.
"""

import math
import numbers

from keras_group_lasso._validation import fail

__all__ = ["KINDS", "check_limit", "check_latency", "limits_of", "targets", "over", "entry_overs", "steer",
           "closing_share", "near_budget", "last_fraction", "progress", "checks_every", "width_curves", "even_share"]

KINDS = ("features", "units", "params", "flops", "latency")
NEAR = 0.05  # settling may begin early once the schedule is this close to the budget (a fraction of it)
_SERVED = (("features", "params", "flops", "latency"), ("units", "params", "flops", "latency"))
_NOUNS = {"features": "selected input features", "units": "live hidden units", "params": "parameters",
          "flops": "multiply-adds"}


def check_limit(owner, name, value):
    """``value`` as an ``int`` count (>= 1) or a ``float`` fraction in (0, 1]; ``None`` stays ``None``.

    Raises:
        InvalidParameterError: anything else (a bool, 0, a negative count, a fraction outside (0, 1]).

    Example:
        >>> check_limit("SparsityBudget", "max_features", 5), check_limit("SparsityBudget", "max_params", 0.25)
        (5, 0.25)
    """
    constraint = "an int >= 1 (a count) or a float in (0, 1] (a fraction of the dense model)"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(owner, name, constraint, value)
    if isinstance(value, numbers.Integral):
        if value < 1:  # the strongest group of every layer stays, so no training reaches 0
            fail(owner, name, constraint, value)
        return int(value)
    if not (0.0 < value <= 1.0):
        fail(owner, name, constraint, value)
    return float(value)


def check_latency(owner, name, value):
    """``value`` as ``("fraction", f)`` for a float ``f`` in (0, 1], or ``("seconds", s, batch size)`` for a pair
    ``(s, batch size)`` with ``s > 0`` seconds; ``None`` stays ``None``.

    Raises:
        InvalidParameterError: anything else (a bool, 0, a negative number, a fraction above 1, a bad pair).

    Example:
        >>> check_latency("SparsityBudget", "max_latency", 0.2), check_latency("SparsityBudget", "max_latency", (0.004, 256))
        (('fraction', 0.2), ('seconds', 0.004, 256))
    """
    constraint = ("a float in (0, 1] (a fraction of the dense model's measured time) or a pair (seconds > 0, "
                  "batch size) (a time per batch of that size)")
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 2:
        seconds, batch = value
        if (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not math.isfinite(seconds)
                or seconds <= 0 or isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1):
            fail(owner, name, constraint, value)
        return ("seconds", float(seconds), int(batch))
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < value <= 1.0):
        fail(owner, name, constraint, value)
    return ("fraction", float(value))


def limits_of(budgets, dense, owner="SparsityBudget"):
    """``(limits, notes)``: each budget as a count, and a note for each that the dense model meets already.

    A budget that is not ``None`` counts as itself or, a fraction, as that share of the ``dense`` size rounded
    down; at most the dense size.

    Raises:
        InvalidParameterError: a fraction that is less than one of the model's features, units, parameters or
            multiply-adds (no model meets it: the strongest group of every layer stays).

    Example:
        >>> limits_of({"features": 0.5, "units": None, "params": 100}, {"features": 9, "units": 4, "params": 80})
        ({'features': 4, 'params': 80}, ['max_params=100 (the model has 80)'])
    """
    limits, notes = {}, []
    for kind, limit in budgets.items():
        if limit is not None:
            count = limit if isinstance(limit, int) else int(math.floor(limit * dense[kind]))
            if count < 1:
                fail(owner, f"max_{kind}", f"a fraction that leaves at least one of the model's {dense[kind]} "
                     f"{_NOUNS.get(kind, kind)} (the strongest group of every layer stays)", limit)
            if count >= dense[kind]:
                notes.append(f"max_{kind}={limit!r} (the model has {dense[kind]})")
            limits[kind] = min(count, dense[kind])
    return limits, notes


def _width(curve, dense, size):
    """The share of its width every prunable layer keeps where ``curve`` (``(c0, p)``, :func:`width_curves`) is at
    ``size``: ``((size - c0) / (dense - c0)) ** (1 / p)``, within [0, 1]."""
    least, exponent = curve
    return min(1.0, max(0.0, (size - least) / (dense - least))) ** (1.0 / exponent)


def _size(curve, dense, width):
    least, exponent = curve
    return least + (dense - least) * width ** exponent


def targets(dense, limits, progress, power, curves=None):
    """Sizes on the way to the budget: ``limit + (dense - limit) * (1 - progress) ** power`` for each budgeted kind.

    A kind with a curve in ``curves`` (:func:`width_curves`) goes down evenly in width rather than in size: its
    target is its size with every prunable layer at the width ``w + (1 - w) * (1 - progress) ** power``, where
    ``w`` is the width at which it meets its limit, so that each check cuts about as many groups as the one before
    (a latency or FLOP budget would otherwise leave most of its groups to the last checks, where narrow layers
    free little each).

    Example:
        >>> targets({"features": 50}, {"features": 10}, 0.5, 1.0)
        {'features': 30.0}
        >>> targets({"flops": 100.0}, {"flops": 25.0}, 0.5, 1.0, {"flops": (0.0, 2.0)})  # width 0.75: 56.25
        {'flops': 56.25}
    """
    way = {}
    for kind, limit in limits.items():
        curve = (curves or {}).get(kind)
        if curve is None:
            way[kind] = limit + (dense[kind] - limit) * (1.0 - progress) ** power
        else:
            end = _width(curve, dense[kind], limit)
            way[kind] = max(float(limit), _size(curve, dense[kind], width_at(end, progress, power)))
    return way


def width_at(end, progress, power):
    """The share of its width every prunable layer keeps on the schedule at ``progress``:
    ``end + (1 - end) * (1 - progress) ** power``, from all of it at the start to ``end`` (the share that meets the
    budget, :func:`even_share`) when the schedule ends.

    Example:
        >>> width_at(0.25, 0.5, 1.0)
        0.625
    """
    return end + (1.0 - end) * (1.0 - progress) ** power


def least_width_at(least, end, progress, power):
    """The least width of every layer at ``progress``: ``least`` (the share no layer goes below when the schedule
    ends) times the schedule's width then over ``end`` (:func:`width_at`), so that along the way no layer runs far
    ahead of the others (cutting one layer alone when the others have reached their least widths starves it in the
    last checks); ``least`` itself when narrowing alike cannot meet the budget (``end`` 0).

    Example:
        >>> least_width_at(0.18, 0.2, 0.5, 1.0)  # 0.9 of the schedule's width 0.6
        0.54
        >>> least_width_at(0.18, 0.2, 1.0, 1.0)
        0.18
    """
    if end <= 0.0:
        return least
    return min(1.0, least * width_at(end, progress, power) / end)


def most_width_at(least, end, progress, power):
    """The most width a layer keeps at ``progress``: the schedule's width (:func:`width_at`) times ``end / least``,
    as far above it as :func:`least_width_at` is below, so that no layer lags far behind the others either (a layer
    left whole while the others narrow is cut alone in the last checks, too fast to recover); 1 (none) without a
    least width or when narrowing alike cannot meet the budget.

    Example:
        >>> round(most_width_at(0.18, 0.2, 0.5, 1.0), 4)  # the schedule's width 0.6 over 0.9
        0.6667
        >>> most_width_at(0.0, 0.2, 0.5, 1.0)
        1.0
    """
    if least <= 0.0 or end <= 0.0:
        return 1.0
    return min(1.0, width_at(end, progress, power) * end / least)


def closing_share(progress, step, power=1.0):
    """The share of the groups still to go before the model is within its budget that a check cuts: its ``step``
    of what is left of the schedule, ``1 - (1 - step / (1 - progress)) ** power`` (``step / (1 - progress)`` for
    a linear schedule); 1 for the last check before the schedule's end.

    Counted in groups, not in sizes: a latency or FLOP budget closed evenly in size would leave most of its groups
    to the last checks, where narrow layers free little each.

    Example:
        >>> closing_share(0.5, 0.1), closing_share(0.95, 0.05), round(closing_share(0.5, 0.1, power=3.0), 3)
        (0.2, 1.0, 0.488)
    """
    if progress >= 1.0 or step >= 1.0 - progress:
        return 1.0
    return 1.0 - (1.0 - step / (1.0 - progress)) ** power


def _ratio(size, target):
    return size / target if target > 0 else (math.inf if size > 0 else 0.0)


def over(sizes, limits, kinds=None):
    """The largest ``size / limit`` over ``kinds`` (all budgeted kinds by default); above 1: over the budget.

    Example:
        >>> over({"features": 12, "units": 3}, {"features": 6, "units": 6})
        2.0
    """
    return max([_ratio(sizes[kind], limits[kind]) for kind in (limits if kinds is None else kinds)], default=0.0)


def entry_overs(sizes, goals):
    """``[size / goal]`` of the budgets each multiplier entry serves (input groups, other groups).

    ``None`` for an entry no budgeted kind needs (it is left as it is).

    Example:
        >>> entry_overs({"features": 20, "units": 8}, {"features": 10})
        [2.0, None]
    """
    ratios = {kind: _ratio(sizes[kind], goal) for kind, goal in goals.items()}
    return [max([ratios[k] for k in served if k in ratios], default=None) for served in _SERVED]


def steer(multiplier, initial, sizes, before, dense, limits, goals, max_strength, fraction=1.0):
    """The next multiplier: each entry moves so that the sizes follow ``goals`` (:func:`targets`) to the budget.

    An entry whose sizes are behind their goal by more than 2 % grows by the
    ratio ``size / goal``, at most 2x per epoch while none of its sizes has
    left the dense size, 1.2x while they stall (not below ``before``), 1.1x
    while they shrink, and never beyond ``initial * max_strength``; ahead of the
    goal by more than 2 % it shrinks by the ratio, at most 0.9x per epoch (0.5x
    below half the goal). ``fraction`` (a part of an epoch) takes each rate to
    that power.

    Example:
        >>> steer([1.0, 1.0], [1.0, 1.0], {"features": 50, "units": 8}, {"features": 50, "units": 8},
        ...       {"features": 50, "units": 8}, {"features": 10}, {"features": 25.0}, 20.0)
        [2.0, 1.0]
    """
    multiplier = list(multiplier)
    for entry, ratio in enumerate(entry_overs(sizes, goals)):
        if ratio is None:
            continue
        kinds = [k for k in _SERVED[entry] if k in limits]
        untouched = all(sizes[k] >= dense[k] for k in kinds)
        stalled = all(sizes[k] >= before[k] for k in kinds)
        if ratio > 1.02:  # behind the schedule: stronger; faster while nothing has gone yet
            multiplier[entry] *= min(ratio, 2.0 if untouched else 1.2 if stalled else 1.1) ** fraction
            multiplier[entry] = min(multiplier[entry], initial[entry] * max_strength)
        elif ratio < 0.98:  # ahead of it: weaker, so the rest of the network keeps its strength
            multiplier[entry] *= max(ratio, 0.5 if ratio < 0.5 else 0.9) ** fraction
    return multiplier


def near_budget(dense, limits, progress, power, curves=None):
    """Whether every scheduled size is within 5 % of its budget (a model within its budget then settles).

    Near the end of the schedule the penalties keep removing groups for a
    few epochs after they are eased; searching on would take the model
    further below its budget than it needs.

    Example:
        >>> dense, limits = {"features": 50}, {"features": 10}
        >>> near_budget(dense, limits, 0.99, 1.0), near_budget(dense, limits, 0.5, 1.0)
        (True, False)
    """
    goals = targets(dense, limits, progress, power, curves)
    return all(goals[kind] - limit <= NEAR * limit for kind, limit in limits.items())


def last_fraction(update_freq, steps):
    """The part of an epoch of ``steps`` batches after its last check every ``update_freq`` batches.

    Checks come after every ``update_freq`` batches except the last batch
    (the epoch's end checks that); ``"epoch"`` or an unknown ``steps``: 1.

    Example:
        >>> last_fraction(4, 10), last_fraction("epoch", 10)
        (0.2, 1.0)
    """
    if update_freq == "epoch" or not steps:
        return 1.0
    last = ((steps - 1) // update_freq) * update_freq
    return (steps - last) / steps


def progress(elapsed, search_end, warm_up=0.0):
    """Where the schedule is after ``elapsed`` epochs: 0 until ``warm_up * search_end``, 1 from ``search_end`` on.

    ``clip((elapsed - w) / (search_end - w), 0, 1)`` with ``w = warm_up * search_end``.

    Example:
        >>> progress(2.0, 4), progress(2.0, 4, warm_up=0.5), progress(1.0, 4, warm_up=0.5)
        (0.5, 0.0, 0.0)
    """
    start = warm_up * search_end
    return min(1.0, max(0.0, (elapsed - start) / (search_end - start)))


def checks_every(update_freq, steps, per_epoch):
    """Batches between two checks inside an epoch, or ``None`` (the epoch's end only).

    ``"auto"``: ``ceil(steps / per_epoch)`` (``None`` while ``steps`` is unknown); ``"epoch"``: ``None``; an
    integer: itself.

    Example:
        >>> checks_every("auto", 100, 8), checks_every("epoch", 100, 8), checks_every(5, None, 8)
        (13, None, 5)
    """
    if update_freq == "epoch":
        return None
    if update_freq == "auto":
        return max(1, math.ceil(steps / per_epoch)) if steps else None
    return update_freq


def width_curves(dense, narrowest, half):
    """``{kind: (c0, p)}``: each size as ``c(s) = c0 + (c1 - c0) * s ** p`` of the share ``s`` of its width that every
    prunable layer keeps.

    From three measurements: ``dense`` (``c1``), ``narrowest`` (``c0``, every prunable layer one group wide: what
    cannot narrow, such as a normalized stream or the layers no penalty reaches) and ``half`` (every prunable layer
    at half its width), which gives ``p = log2((c1 - c0) / (c(1/2) - c0))``, held in [1/2, 3]: about 2 where each
    weight joins two prunable layers, 1 where one side of it cannot narrow. Only the units, parameters, FLOPs and
    latency that narrowing changes have a curve.

    Example:
        >>> width_curves({"flops": 100.0, "units": 10}, {"flops": 20.0, "units": 10}, {"flops": 40.0, "units": 10})
        {'flops': (20.0, 2.0)}
    """
    curves = {}
    for kind in ("units", "params", "flops", "latency"):
        if kind not in dense or dense[kind] <= narrowest[kind]:
            continue
        span, drop = dense[kind] - narrowest[kind], half[kind] - narrowest[kind]
        curves[kind] = (narrowest[kind], min(3.0, max(0.5, math.log2(span / drop))) if 0 < drop < span else 1.0)
    return curves


def even_share(dense, curves, limits):
    """The share of its units each prunable layer keeps when all of them, narrowed alike, meet the budget.

    The share solves ``c(s) = limit`` on each budgeted kind's curve (:func:`width_curves`); the smallest over the
    budgeted units, parameters, FLOPs and latency (a kind that narrowing does not change does not count); 0 with
    features only, or when narrowing alike cannot meet a budget.

    Example:
        >>> dense = {"flops": 100.0}
        >>> round(even_share(dense, {"flops": (20.0, 2.0)}, {"flops": 60.0}), 3)  # sqrt(40 / 80)
        0.707
        >>> round(even_share(dense, {"flops": (20.0, 1.0)}, {"flops": 60.0}), 3)  # 40 / 80
        0.5
    """
    shares = []
    for kind, (least, power) in curves.items():
        if kind not in limits:
            continue
        if limits[kind] <= least:
            return 0.0
        shares.append(min(1.0, (limits[kind] - least) / (dense[kind] - least)) ** (1.0 / power))
    return min(shares, default=0.0)

"""What a budget does at a check, as a pure function: its state and the sizes in, a :class:`Decision` out.

No model and no Keras: :class:`~keras_group_lasso.SparsityBudget` measures the sizes, asks :func:`decide` and
applies the answer (writes the multiplier into the model's declared penalties, cuts the weakest groups down to
the goals on copies of the kernels and writes the cut once, fixes the structure when settling begins).
"""

import dataclasses
import math

from keras_group_lasso.budget import schedule

__all__ = ["Plan", "Check", "Decision", "check_at", "decide"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a ``fit`` under a budget aims at (fixed when training begins).

    Attributes:
        dense: ``{kind: size}`` of the dense model.
        limits: ``{kind: limit}`` of the budgeted kinds.
        power: the schedule's power (:func:`~.schedule.targets`).
        max_strength: how far the multiplier may grow beyond its start.
        gradual: the gradual pace (cut the weakest groups along the schedule), or the penalties alone.
        curves: ``{kind: (c0, p)}``, each size as a curve of the share of its width every prunable layer keeps
            (:func:`~.schedule.width_curves`): the schedule narrows those kinds evenly in width, not in size.
        least_width: the share of its width below which no layer goes when the schedule ends (``min_width``);
            along the way it follows the schedule (:func:`~.schedule.least_width_at`).
    """

    dense: dict
    limits: dict
    power: float = 1.0
    max_strength: float = 20.0
    gradual: bool = True
    curves: dict = None
    least_width: float = 0.0


@dataclasses.dataclass(frozen=True)
class Check:
    """Where a check is in training.

    Attributes:
        progress: the schedule's progress now (:func:`~.schedule.progress`): 0 at its start, 1 when settling must
            begin.
        step: the progress to the next check (the share of what is left that the gradual pace closes now).
        fraction: the part of an epoch since the last check (the steering's rates are taken to that power).
        epoch_end: a check at the end of an epoch, which may begin settling; one inside an epoch never does.
        search_over: the epochs before settling are over (settling begins now whatever the sizes).
    """

    progress: float
    step: float = 0.0
    fraction: float = 1.0
    epoch_end: bool = True
    search_over: bool = False


def check_at(elapsed, search_end, warm_up=0.0, gap=None, fraction=1.0, epoch_end=True):
    """The :class:`Check` ``elapsed`` epochs into ``fit`` (a float), where the search ends after ``search_end`` epochs.

    The progress is :func:`~.schedule.progress` with ``warm_up``. ``gap``: with the gradual pace, the part of an
    epoch to the next check (the step is the progress made until then, or until this epoch's end for a check inside
    an epoch); ``None``: no step (the penalty pace).

    Example:
        >>> check_at(1.5, 3, warm_up=1 / 3, gap=0.25, epoch_end=False)
        Check(progress=0.25, step=0.125, fraction=1.0, epoch_end=False, search_over=False)
    """
    progress, step = schedule.progress(elapsed, search_end, warm_up), 0.0
    if gap is not None:
        later = elapsed + gap if elapsed == int(elapsed) else min(elapsed + gap, math.floor(elapsed) + 1.0)
        step = schedule.progress(later, search_end, warm_up) - progress
    return Check(progress, step, fraction, epoch_end, epoch_end and elapsed >= search_end)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do at a check.

    Attributes:
        multiplier: ``(input groups, other groups)``: the strength multiplier to train with from here.
        goals: ``{kind: size}`` to cut the weakest groups down to now, or ``None`` (no cut).
        closing: with the gradual pace after its warm-up, the share of the groups still to go before the model is
            within its limits that go now as well (:func:`~.schedule.closing_share`); 0: none.
        settle: the structure is fixed from here (round the widths, cut down to the limits if over them, hold
            every group at zero, train the survivors without the penalties).
        least_width: the share of its width below which a cut now takes no layer (the plan's ``least_width``
            along the schedule, :func:`~.schedule.least_width_at`; the budget's own least widths when settling).
        most_width: the share of its width above which a cut along the schedule takes a layer's weakest groups
            first (:func:`~.schedule.most_width_at`); 1: none.
    """

    multiplier: tuple
    goals: dict = None
    closing: float = 0.0
    settle: bool = False
    least_width: float = 0.0
    most_width: float = 1.0


def decide(state, multiplier, sizes, plan, check):
    """The decision at ``check`` for a model of ``sizes`` training with ``multiplier`` in ``state``.

    At the end of an epoch the budget settles (a cut down to the limits when over them) once the search is over,
    or once the model is within its budget and the schedule within 5 % of it (:func:`~.schedule.near_budget`).
    Otherwise the multiplier is steered toward the schedule's sizes (:func:`~.schedule.steer`), and with the
    gradual pace the weakest groups are cut down to them when the model is over, and after the warm-up, a model
    over its budget also loses the check's share of the groups still to go (:func:`~.schedule.closing_share`), so
    that one the penalties took ahead of the schedule still meets its budget a little at each check.

    Args:
        state: the :class:`~keras_group_lasso.budget.state.BudgetState` (its start, the sizes at the last check,
            whether it settled).
        multiplier: ``[input groups, other groups]`` now.
        sizes: ``{kind: size}`` now.
        plan: the :class:`Plan`.
        check: the :class:`Check`.

    Returns:
        A :class:`Decision`.

    Example:
        >>> from keras_group_lasso.budget.state import BudgetState
        >>> import dataclasses
        >>> from keras_group_lasso.budget.state import BudgetState
        >>> plan = Plan(dense={"units": 100}, limits={"units": 25}, gradual=False)
        >>> state = BudgetState().started_from([1.0, 1.0])
        >>> decide(state, [1.0, 1.0], {"units": 100}, plan, Check(progress=0.5))  # nothing gone yet: stronger
        Decision(multiplier=(1.0, 1.6), goals=None, closing=0.0, settle=False, least_width=0.0, most_width=1.0)
        >>> gradual = dataclasses.replace(plan, gradual=True)  # and behind the schedule: cut on the way
        >>> decide(state, [1.0, 2.0], {"units": 70}, gradual, Check(progress=0.5, step=0.25))
        Decision(multiplier=(1.0, 2.2...), goals={'units': 62.5}, closing=0.5, settle=False, least_width=0.0, most_width=1.0)
        >>> decide(state, [1.0, 2.0], {"units": 30}, gradual, Check(progress=1.0, search_over=True))
        Decision(multiplier=(1.0, 2.0), goals={'units': 25}, closing=0.0, settle=True, least_width=0.0, most_width=1.0)
    """
    limits = plan.limits
    over = schedule.over(sizes, limits)
    if check.epoch_end and (state.settling or check.search_over or (
            over <= 1.0 and schedule.near_budget(plan.dense, limits, check.progress, plan.power, plan.curves))):
        return Decision(tuple(multiplier), dict(limits) if over > 1.0 else None, settle=True,
                        least_width=plan.least_width)
    goals = schedule.targets(plan.dense, limits, check.progress, plan.power, plan.curves)
    steered = schedule.steer(multiplier, state.initial, sizes, state.last_sizes or plan.dense, plan.dense, limits,
                             goals, plan.max_strength, check.fraction)
    if not plan.gradual:
        return Decision(tuple(steered))
    closing = (schedule.closing_share(check.progress, check.step, plan.power) if check.progress > 0.0 and over > 1.0
               else 0.0)
    even = schedule.even_share(plan.dense, plan.curves or {}, limits)
    least = schedule.least_width_at(plan.least_width, even, check.progress, plan.power)
    most = schedule.most_width_at(plan.least_width, even, check.progress, plan.power) if over > 1.0 else 1.0
    return Decision(tuple(steered), goals if schedule.over(sizes, goals) > 1.0 else None, closing, least_width=least,
                    most_width=most)

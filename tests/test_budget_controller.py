"""The budget's controller as a pure function: properties over random states, sizes and checks (no model)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_group_lasso.budget import schedule
from keras_group_lasso.budget.controller import Check, Decision, Plan, decide
from keras_group_lasso.budget.state import BudgetState

KINDS = ("features", "units", "params", "flops")


@st.composite
def cases(draw):
    """A plan, a state, a multiplier, sizes (between the limit's half and the dense size) and a check."""
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4, unique=True))
    dense = {kind: draw(st.integers(20, 10_000)) for kind in KINDS}
    dense["latency"] = 1.0
    limits = {kind: draw(st.integers(1, dense[kind] - 1)) for kind in kinds}
    sizes = dict(dense)
    for kind in kinds:
        sizes[kind] = draw(st.integers(max(1, limits[kind] // 2), dense[kind]))
    plan = Plan(dense, limits, power=draw(st.sampled_from([0.5, 1.0, 3.0])), max_strength=20.0,
                gradual=draw(st.booleans()))
    initial = (draw(st.floats(0.1, 10.0)), draw(st.floats(0.1, 10.0)))
    state = BudgetState().started_from(initial)
    if draw(st.booleans()):
        state = state.replace(last_sizes={kind: draw(st.integers(sizes[kind], dense[kind])) if kind != "latency"
                                          else 1.0 for kind in dense})
    state = state.replace(settling=draw(st.booleans()) and draw(st.booleans()))
    multiplier = [m * draw(st.floats(0.5, 2.0)) for m in initial]
    progress = draw(st.floats(0.0, 1.0))
    check = Check(progress=progress, step=draw(st.floats(0.0, 1.0 - progress)), fraction=draw(st.floats(0.01, 1.0)),
                  epoch_end=draw(st.booleans()), search_over=draw(st.booleans()) and draw(st.booleans()))
    return plan, state, multiplier, sizes, check


def _over(sizes, goals):
    return schedule.over(sizes, goals) > 1.0


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_decision_settles_only_at_an_epochs_end_and_always_once_the_search_is_over(case):
    plan, state, multiplier, sizes, check = case
    decision = decide(state, multiplier, sizes, plan, check)
    assert isinstance(decision, Decision)
    if not check.epoch_end:
        assert not decision.settle
    elif check.search_over or state.settling:
        assert decision.settle
    if decision.settle:  # the structure is fixed at the strength reached; a cut only when over the budget itself
        assert decision.multiplier == tuple(multiplier)
        assert decision.goals == (dict(plan.limits) if _over(sizes, plan.limits) else None)
    elif check.epoch_end:  # settling early needs the model within its budget and the schedule near it
        assert _over(sizes, plan.limits) or not schedule.near_budget(plan.dense, plan.limits, check.progress,
                                                                     plan.power)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_cut_on_the_way_goes_no_lower_than_the_budget_nor_higher_than_the_schedule_and_only_when_over(case):
    plan, state, multiplier, sizes, check = case
    decision = decide(state, multiplier, sizes, plan, check)
    if decision.settle:
        return
    if not plan.gradual:
        assert decision.goals is None  # the penalties alone remove groups
        return
    way = schedule.targets(plan.dense, plan.limits, check.progress, plan.power)
    # After the warm-up a model over its budget also loses the check's share of the groups still to go.
    closes = check.progress > 0 and _over(sizes, plan.limits)
    assert decision.closing == (schedule.closing_share(check.progress, check.step, plan.power) if closes else 0.0)
    assert 0.0 <= decision.closing <= 1.0
    if decision.goals is None:
        assert not _over(sizes, way)
        return
    assert decision.goals == way and _over(sizes, way)
    for kind, goal in decision.goals.items():
        assert plan.limits[kind] - 1e-9 <= goal


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_multiplier_grows_behind_the_schedule_eases_ahead_of_it_and_stays_under_its_cap(case):
    plan, state, multiplier, sizes, check = case
    decision = decide(state, multiplier, sizes, plan, check)
    if decision.settle:
        return
    way = schedule.targets(plan.dense, plan.limits, check.progress, plan.power)
    for entry, ratio in enumerate(schedule.entry_overs(sizes, way)):
        before, after = multiplier[entry], decision.multiplier[entry]
        if ratio is None or 0.98 <= ratio <= 1.02:
            assert after == before
        elif ratio > 1.02:
            assert after >= min(before, state.initial[entry] * plan.max_strength) - 1e-12
            assert after <= max(before, state.initial[entry] * plan.max_strength) + 1e-9
        else:
            assert after < before


def test_a_model_far_behind_in_the_last_check_before_settling_is_cut_to_its_budget():
    """The gradual pace's last check before the schedule's end goes the whole way (nothing left to settling)."""
    plan = Plan({"flops": 1000, "units": 100}, {"flops": 250}, gradual=True)
    state = BudgetState().started_from([1.0, 1.0])
    decision = decide(state, [1.0, 1.0], {"flops": 900, "units": 100}, plan,
                      Check(progress=0.9, step=0.1, epoch_end=False))
    assert decision.goals == {"flops": pytest.approx(325.0)} and decision.closing == 1.0  # every group still to go
    # Ahead of the schedule (600 below its 625), a check still closes its share (0.1 of the 0.5 left) of the
    # groups still to go:
    ahead = decide(state, [1.0, 1.0], {"flops": 600, "units": 100}, plan, Check(progress=0.5, step=0.1))
    assert ahead.goals is None and ahead.closing == pytest.approx(0.2)
    # Within the budget nothing more goes.
    within = decide(state, [1.0, 1.0], {"flops": 240, "units": 100}, plan, Check(progress=0.5, step=0.1))
    assert within.goals is None and within.closing == 0.0


def test_the_schedule_of_a_kind_with_a_width_curve_narrows_evenly_in_width():
    """A FLOP count that goes as the square of the width: the target halfway is at the width halfway between the
    dense one and the one that meets the budget, not at the FLOPs halfway."""
    dense, limits, curves = {"flops": 1000.0}, {"flops": 250.0}, {"flops": (0.0, 2.0)}  # the budget at width 0.5
    widths = [(schedule.targets(dense, limits, p, 1.0, curves)["flops"] / 1000.0) ** 0.5 for p in (0, .25, .5, 1)]
    assert widths == pytest.approx([1.0, 0.875, 0.75, 0.5])
    plan = Plan(dense, limits, curves=curves)
    state = BudgetState().started_from([1.0, 1.0])
    assert decide(state, [1.0, 1.0], {"flops": 900.0}, plan, Check(progress=0.5, step=0.1)).goals == {
        "flops": pytest.approx(562.5)}

def test_the_least_and_most_widths_follow_the_schedule_around_its_width_and_end_at_the_plans():
    """No layer runs ahead of the schedule nor lags behind it: along the way a cut takes no layer below the plan's
    least width scaled by the schedule's width over the width that meets the budget (always below the schedule's
    width, so its goals can be met), and a layer above as much over it loses its weakest groups first; settling
    keeps the plan's own least width."""
    dense, limits, curves = {"flops": 1000.0}, {"flops": 250.0}, {"flops": (0.0, 2.0)}  # the budget at width 0.5
    plan = Plan(dense, limits, power=2.0, curves=curves, least_width=0.45)
    state = BudgetState().started_from([1.0, 1.0])
    least = []
    for progress in (0.0, 0.25, 0.5, 0.75, 1.0 - 1e-9):
        decision = decide(state, [1.0, 1.0], {"flops": 1000.0}, plan, Check(progress=progress, step=0.0,
                                                                             epoch_end=False))
        width = schedule.width_at(0.5, progress, 2.0)
        assert decision.least_width == pytest.approx(0.9 * width)
        assert decision.most_width == pytest.approx(min(1.0, width / 0.9))  # as far above: no layer lags behind
        least.append(decision.least_width)
    assert least == sorted(least, reverse=True) and least[-1] == pytest.approx(0.45)
    # Within the budget no layer must lose more.
    assert decide(state, [1.0, 1.0], {"flops": 240.0}, plan, Check(progress=0.5, epoch_end=False)).most_width == 1.0
    settled = decide(state, [1.0, 1.0], {"flops": 240.0}, plan, Check(progress=1.0, search_over=True))
    assert settled.settle and settled.least_width == 0.45
    # Narrowing alike cannot meet the budget (nothing to scale by): the plan's least width all along.
    flat = Plan(dense, {"flops": 10.0}, curves={"flops": (100.0, 2.0)}, least_width=0.2)
    assert decide(state, [1.0, 1.0], {"flops": 1000.0}, flat, Check(progress=0.1, step=0.1)).least_width == 0.2


def test_a_decision_is_a_function_of_its_arguments_alone():
    plan = Plan({"units": 100}, {"units": 25})
    state = BudgetState().started_from([1.0, 1.0])
    args = (state, [1.0, 1.0], {"units": 80}, plan, Check(progress=0.4, step=0.1))
    first = decide(*args)
    assert decide(*args) == first and args[1] == [1.0, 1.0] and args[2] == {"units": 80}

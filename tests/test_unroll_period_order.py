"""`PeriodicSchedule.unroll` orders each processor's grid by one period's slot order where that is every period's
(`_period_order`: starts within the period, tied slots with one number of copies per period) and sorts the whole
grid otherwise: the same schedule as the whole-grid lexsort it replaced (tests/sim_reference.py), on random bodies
— unfolded, grouped updates, fused kinds, tied starts and ranks, zero-cycle tasks, starts outside the period,
schedules without costs — and on the policies' schedules.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.schedule._periodic import PeriodicSchedule, Slot
from layerpipe.schedule.policies import make_schedule, policy_options
from tests.sim_reference import reference_unroll
from tests.strategies import networks

KINDS = ("F", "A", "E", "G", "U", "AE", "EG", "AEG")


@st.composite
def periodic_schedules(draw: st.DrawFn) -> PeriodicSchedule:
    """Random bodies (unrolling reads no dependencies): J iterations per period, update groups g | J, slots of
    distinct (kind, layer, phase) with starts inside or outside the period (ties too), random lags and costs."""
    period = draw(st.integers(1, 8))
    unfold = draw(st.sampled_from((1, 2, 3, 4)))
    layers = draw(st.integers(1, 3))
    groups = tuple((layer, g) for layer in range(layers)
                   if (g := draw(st.sampled_from([d for d in (1, 2, 4) if unfold % d == 0]))) > 1)
    group = dict(groups)
    procs = draw(st.integers(1, 3))
    inside = draw(st.booleans())
    bodies: list[list[Slot]] = [[] for _ in range(procs)]
    costs: dict[tuple[str, int], int] = {}
    for layer in range(layers):
        for kind in draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4, unique=True)):
            costs[(kind, layer)] = draw(st.integers(0, 3))
            for phase in range(unfold // group.get(layer, 1) if kind == "U" else unfold):
                start = draw(st.integers(0, period - 1) if inside else st.integers(-3, 2 * period))
                bodies[draw(st.integers(0, procs - 1))].append(Slot(start, kind, layer, draw(st.integers(0, 3)), phase))
    with_costs = draw(st.booleans())
    return PeriodicSchedule(period, tuple(tuple(body) for body in bodies), costs if with_costs else {},
                            unfold=unfold, groups=groups)


def _same(a, b) -> None:
    assert a == b
    x, y = a.columns, b.columns
    assert x.bounds == y.bounds and x.tasks == y.tasks
    assert np.array_equal(x.task, y.task) and np.array_equal(x.iteration, y.iteration)


@settings(max_examples=400, deadline=None)
@given(schedule=periodic_schedules(), iterations=st.integers(1, 14))
def test_unroll_is_the_whole_grid_sort(schedule: PeriodicSchedule, iterations: int) -> None:
    _same(schedule.unroll(iterations), reference_unroll(schedule, iterations))


@settings(max_examples=40, deadline=None)
@given(network=networks(max_layers=6), policy=st.sampled_from(("layerpipe", "pipedream", "pipedream-2bw", "ooo")),
       num_procs=st.integers(1, 4), iterations=st.integers(1, 14), pe=st.booleans())
def test_unroll_of_policies_is_the_whole_grid_sort(network, policy, num_procs, iterations, pe) -> None:
    model = PEModel(lanes=2) if pe else MacsModel()
    periodic = make_schedule(policy, network, num_procs, model, policy_options(policy, {})).periodic
    if periodic is not None:
        _same(periodic.unroll(iterations), reference_unroll(periodic, iterations))

"""The planner's fast paths give what the slow references give, on generated networks, N and interconnects.

- `_search_plan` (the stage terms inlined in its innermost loop) against `reference_search_plan`: the same plan,
  stage by stage;
- `_replicated_timing` (the staleness read off the forward pins without building each trial's schedule, the
  versions counted only when several trials share the least staleness) against `reference_replicated_timing`;
- `_ForwardPins` against the schedule's own `forward_pins` and `periodic_staleness`, on arbitrary starts, lags
  and arrivals of a layout.

The references are the code from before the planner speed work (tests/schedule_reference_planner.py).
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Network
from layerpipe.schedule._planner import (
    Plan,
    PlanCosts,
    _ForwardPins,
    _replicated_timing,
    _search_plan,
    plan,
    replicated_layout,
)
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import periodic_of
from layerpipe.schedule._validate import periodic_staleness
from tests.schedule_reference import FAST, SPECS
from tests.schedule_reference_planner import reference_replicated_timing, reference_search_plan
from tests.strategies import networks


def _table(net: Network, overhead: int) -> TaskTable:
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    return TaskTable.of(build_training_graph(net, GraphOptions.pipedream()), model)


@FAST
@given(net=networks(max_layers=8, dag=True, max_width=16), n=st.integers(1, 12), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), replication=st.booleans())
def test_search_plan_matches_reference(net: Network, n: int, spec: str, overhead: int, replication: bool) -> None:
    costs = PlanCosts(_table(net, overhead), parse_interconnect(spec, 4))
    assert _search_plan(costs, n, replication) == reference_search_plan(costs, n, replication)


def _plan_of(table: TaskTable, n: int, spec: str, coalesce: int | None) -> tuple[Plan, object]:
    ic = parse_interconnect(spec, 4)
    return plan(PlanCosts(table, ic), n, replication=coalesce is None), ic


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(2, 8), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), coalesce=st.sampled_from((None, None, 2, 3)))
def test_replicated_timing_matches_reference(net: Network, n: int, spec: str, overhead: int,
                                             coalesce: int | None) -> None:
    table = _table(net, overhead)
    best, ic = _plan_of(table, n, spec, coalesce)
    got = _replicated_timing(table, best, n, ic, coalesce)  # type: ignore[arg-type]
    want = reference_replicated_timing(table, best, n, ic, coalesce)  # type: ignore[arg-type]
    assert got.table == want.table and got.placement == want.placement and got.period == want.period
    assert got.timing == want.timing


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(2, 8), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), coalesce=st.sampled_from((None, 2, 3)), seed=st.integers(0, 2**16))
def test_forward_pins_match_the_schedule(net: Network, n: int, spec: str, overhead: int, coalesce: int | None,
                                         seed: int) -> None:
    """Any starts, lags and arrivals (not only timings that hold): the pins are a formula of them."""
    table = _table(net, overhead)
    best, ic = _plan_of(table, n, spec, coalesce)
    laid = replicated_layout(table, best, n, ic, coalesce)  # type: ignore[arg-type]
    unfolded, period = laid.table, laid.period
    if period <= 0:
        return
    rng = random.Random(seed)
    start = [rng.randrange(period) for _ in range(len(unfolded))]
    lag = [rng.randrange(4) for _ in range(len(unfolded))]
    arrival = {(u, x): start[u] + unfolded.cost[u] + rng.randrange(2 * period)
               for u, x, _ in unfolded.weight_reads if rng.random() < 0.5}
    forward = _ForwardPins(unfolded, list(laid.placement), period, table.graph)
    pins = forward.pins(start, lag, arrival)
    schedule = periodic_of(unfolded, list(laid.placement), start, lag, period, n, arrival)
    want = schedule.forward_pins()
    assert list(pins.items()) == list(want.items())
    assert forward.staleness(pins) == periodic_staleness(schedule, table.graph, pins=want)

"""The scheduler passes' fast paths for issue 14's explore sweep (small networks, many points) give what the code
before them gave, on generated inputs:

- `_ForwardPins.versions` (the replicated layout's trial scores, `_replicated_scores`: each layer's
  `layer_versions` from the trial's starts and lags, counted once per equal input, stopped above a bound)
  against `periodic_versions` of the trial's schedule (`periodic_of`) under the same pins and against
  `reference_periodic_versions` (every period of the window, every update end listed), on any starts, lags and
  arrivals (in and out of the steady state's range), on PipeDream's graph and LayerPipe's;
- `best_trial` (versions only for the trials of the least staleness, a count stopped once it exceeds a count
  before it) against `reference_replicated_timing`'s choice, which counts every such trial on its schedule;
- `StalenessFloor.layer_floor` (only the edges on a path from F to U, found once per loop) against
  `reference_layer_floor` (every edge with its head between them), on any placement, starts and period;
- `order_bodies` (one sort of every task, dealt out) and `offset_bodies` (the offset keys sorted themselves)
  against `reference_order_bodies` (each processor's share sorted by a key function), keys with ties included;
  `pack_circular` against `reference_pack_circular`; `list_targets` against `reference_list_targets`, in any
  priority (a topological one, and not); `PlanCosts`' cut holds against `reference_cut_holds`;
  `update_chain_lags` (the chains found once per table) against `reference_update_chain_lags`.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Network
from layerpipe.schedule._bodies import list_targets, offset_bodies, order_bodies, pack_circular
from layerpipe.schedule._lags import StalenessFloor
from layerpipe.schedule._planner import PlanCosts, _replicated_timing, plan, replicated_layout
from layerpipe.schedule._replicated_scores import _ForwardPins
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import periodic_of, update_chain_lags
from layerpipe.schedule._versions import periodic_versions, version_readers
from tests.schedule_reference import FAST, SPECS, reference_periodic_versions
from tests.schedule_reference_planner import (
    reference_cut_holds,
    reference_layer_floor,
    reference_list_targets,
    reference_order_bodies,
    reference_pack_circular,
    reference_replicated_timing,
    reference_update_chain_lags,
)
from tests.strategies import networks


def _table(net: Network, overhead: int, pipedream: bool) -> TaskTable:
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    return TaskTable.of(build_training_graph(net, GraphOptions.pipedream() if pipedream else GraphOptions()), model)


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(2, 8), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), coalesce=st.sampled_from((None, 2, 3)), pipedream=st.booleans(),
       seed=st.integers(0, 2**16))
def test_versions_match_the_schedule(net: Network, n: int, spec: str, overhead: int, coalesce: int | None,
                                     pipedream: bool, seed: int) -> None:
    table = _table(net, overhead, pipedream)
    ic = parse_interconnect(spec, 4)
    best = plan(PlanCosts(_table(net, overhead, True), ic), n, replication=coalesce is None)
    laid = replicated_layout(table, best, n, ic, coalesce)
    unfolded, period = laid.table, laid.period
    if period <= 0:
        return
    rng = random.Random(seed)
    if rng.random() < 0.3:
        unfolded = replace(unfolded, cost=tuple(0 if rng.random() < 0.6 else c for c in unfolded.cost))
    placement = list(laid.placement) if rng.random() < 0.5 else [rng.randrange(2) for _ in range(len(unfolded))]
    steady = rng.random() < 0.7  # else starts past the period and negative lags: every period of the window swept
    start = [rng.choice((0, period // 2, rng.randrange(period))) if steady else rng.randrange(-period, 2 * period)
             for _ in range(len(unfolded))]
    lag = [rng.randrange(4) if steady else rng.randrange(-1, 4) for _ in range(len(unfolded))]
    # A read's version is released after it begins (`_most_versions_held` needs that of any timing): each
    # phase's releasing task after its forward.
    index = {(t.kind, t.layer, k): v for v, (t, k) in enumerate(zip(unfolded.tasks, unfolded.phase, strict=True))}
    for layer, back in version_readers(table.graph):
        for k in range(unfolded.unfold):
            f, e = index.get(("F", layer, k)), index.get((back, layer, k))
            if f is not None and e is not None and e != f:
                while lag[e] * period + start[e] < lag[f] * period + start[f] + unfolded.cost[f]:
                    lag[e] += 1
    arrival = {(u, x): start[u] + unfolded.cost[u] + rng.randrange(2 * period)
               for u, x, _ in unfolded.weight_reads if rng.random() < 0.5}
    forward = _ForwardPins(unfolded, placement, period, table.graph)
    pins = forward.pins(start, lag, arrival)
    schedule = periodic_of(unfolded, placement, start, lag, period, n, arrival)
    want = max(periodic_versions(schedule, table.graph, pins).values(), default=1)
    # and the code before the speed work, on the schedule's own pins (its forward pins are these)
    assert want == max(reference_periodic_versions(schedule, table.graph).values(), default=1)
    assert forward.versions(start, lag, pins) == want
    assert forward.versions(start, lag, pins) == want  # again, from the counts kept per layer
    for above in (want - 1, want, want + 1):
        assert forward.versions(start, lag, pins, above) == (None if want > above else want)


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(2, 8), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), coalesce=st.sampled_from((None, None, 2, 3)), pipedream=st.booleans())
def test_replicated_timing_on_both_graphs_matches_reference(net: Network, n: int, spec: str, overhead: int,
                                                             coalesce: int | None, pipedream: bool) -> None:
    """LayerPipe lays PipeDream's plan out on its own tasks (its replicated candidate): both graphs."""
    table = _table(net, overhead, pipedream)
    ic = parse_interconnect(spec, 4)
    best = plan(PlanCosts(_table(net, overhead, True), ic), n, replication=coalesce is None)
    got = _replicated_timing(table, best, n, ic, coalesce)
    want = reference_replicated_timing(table, best, n, ic, coalesce)
    assert got.table == want.table and got.placement == want.placement and got.period == want.period
    assert got.timing == want.timing


@FAST
@given(net=networks(max_layers=8, dag=True, max_width=12), n=st.integers(1, 6), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), pipedream=st.booleans(), seed=st.integers(0, 2**16))
def test_layer_floor_equals_the_reference(net: Network, n: int, spec: str, overhead: int, pipedream: bool,
                                          seed: int) -> None:
    table = _table(net, overhead, pipedream)
    floor = StalenessFloor(table, parse_interconnect(spec, 4))
    rng = random.Random(seed)
    for _ in range(3):
        period = rng.randrange(1, 2 * max(1, table.total))
        placement = [rng.randrange(n) for _ in range(len(table))]
        start = [rng.randrange(period) if rng.random() < 0.8 else rng.randrange(-period, 3 * period)
                 for _ in range(len(table))]
        for loop in table.weight_loops():
            assert floor.layer_floor(loop, placement, start, period) == \
                reference_layer_floor(floor, loop, placement, start, period)


@FAST
@given(n=st.integers(1, 8), data=st.data())
def test_bodies_equal_the_reference(n: int, data: st.DataObject) -> None:
    size = data.draw(st.integers(0, 60))
    placement = data.draw(st.lists(st.integers(0, n - 1), min_size=size, max_size=size))
    target = data.draw(st.lists(st.integers(-50, 200), min_size=size, max_size=size))
    period = data.draw(st.integers(1, 80))
    coarse = data.draw(st.integers(1, 40))  # keys with ties: equal keys keep task order
    for key in (lambda v: (target[v] // coarse,), lambda v: (target[v] % period, -target[v], v)):
        assert order_bodies(placement, n, key) == reference_order_bodies(placement, n, key)
    assert offset_bodies(placement, n, target, period) == \
        reference_order_bodies(placement, n, lambda v: (target[v] % period, target[v], v))


@FAST
@given(data=st.data())
def test_pack_circular_equals_the_reference(data: st.DataObject) -> None:
    period = data.draw(st.integers(1, 60))
    cost = data.draw(st.lists(st.integers(0, 12), max_size=12))
    release = data.draw(st.lists(st.integers(0, period - 1), min_size=len(cost), max_size=len(cost)))
    if sum(cost) > period:
        return
    assert pack_circular(release, cost, period) == reference_pack_circular(release, cost, period)


@FAST
@given(net=networks(max_layers=8, dag=True, max_width=12), n=st.integers(1, 6), overhead=st.integers(0, 3),
       pipedream=st.booleans(), seed=st.integers(0, 2**16))
def test_list_targets_equal_the_reference(net: Network, n: int, overhead: int, pipedream: bool, seed: int) -> None:
    table = _table(net, overhead, pipedream)
    rng = random.Random(seed)
    placement = [rng.randrange(n) for _ in range(len(table))]
    shuffled = list(range(len(table)))
    rng.shuffle(shuffled)
    for priority in (list(table.topo), shuffled):
        assert list_targets(table, placement, n, priority) == reference_list_targets(table, placement, n, priority)


@FAST
@given(net=networks(max_layers=8, dag=True, max_width=12), spec=st.sampled_from(SPECS), overhead=st.integers(0, 3),
       pipedream=st.booleans())
def test_cut_holds_equal_the_reference(net: Network, spec: str, overhead: int, pipedream: bool) -> None:
    table = _table(net, overhead, pipedream)
    ic = parse_interconnect(spec, 4)
    costs = PlanCosts(table, ic)
    assert (costs.cut_forward, costs.cut_backward) == reference_cut_holds(table, ic)


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(2, 8), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), coalesce=st.sampled_from((None, 2, 3)), seed=st.integers(0, 2**16))
def test_update_chain_lags_equal_the_reference(net: Network, n: int, spec: str, overhead: int, coalesce: int | None,
                                               seed: int) -> None:
    table = _table(net, overhead, True)
    ic = parse_interconnect(spec, 4)
    best = plan(PlanCosts(table, ic), n, replication=coalesce is None)
    unfolded = replicated_layout(table, best, n, ic, coalesce).table
    rng = random.Random(seed)
    for _ in range(4):
        period = rng.randrange(1, 2 * max(1, max(unfolded.cost)) + 2)  # some too short for a copy: no lags
        start = [rng.randrange(period) for _ in range(len(unfolded))]
        lag = [rng.randrange(3) for _ in range(len(unfolded))]
        assert update_chain_lags(unfolded, start, lag, period) == \
            reference_update_chain_lags(unfolded, start, lag, period)

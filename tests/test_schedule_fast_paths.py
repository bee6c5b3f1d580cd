"""The schedulers' fast paths (issues 13/14) give what the slow references give, on generated inputs.

- `improve` (items' edges summed per neighbour, a move's change memoised, moves pruned by a bound, the whole
  call memoised) against `reference_improve`, the search that re-reads every edge per trial move;
- `periodic_versions` (one steady-state period of reads) against `reference_periodic_versions` (all 4D);
- `_pack_channels` (decorated sort) against `reference_pack_channels` (a key function per queue);
- `_events` (the event-driven engine: steps without transfers skipped, a processor's next op started inline)
  against `reference_events`, and `_planned_order` (a planned bus's order and floors as arrays) against
  `reference_planned_order`;
- the memos (`TaskTable.token`, `transfers`, `comm_timing`, `replicated_timing`): equal content hits, a
  caller's copy can be changed without changing what the next caller gets.

- the planner's (branch perf-planner): `_search_plan` (stage terms inlined) against `reference_search_plan`;
  `_replicated_timing` (staleness off the forward pins, `_ForwardPins`, versions only among several trials of the
  least staleness) against `reference_replicated_timing`; `_ForwardPins` against the schedule's own pins; and
  `pinned_weight_sources` on arrays (`_pinned_on_arrays`) against its read-by-read path.

The references are the code from before the speed work (tests/schedule_reference.py, and
tests/schedule_reference_planner.py for the planner's).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Network, load_network
from layerpipe.schedule import _unfold, make_schedule
from layerpipe.schedule._balance import balance
from layerpipe.schedule._comm import Comm, _pack_channels, transfers
from layerpipe.schedule._comm_timing import _comm_timing, comm_timing
from layerpipe.schedule._deps import StageInfo, expand_stages
from layerpipe.schedule._engine import _events, _planned_order, bus_order, compile_schedule
from layerpipe.schedule._layerpipe import group_items, weight_groups
from layerpipe.schedule._op_sweep import DeadlockError
from layerpipe.schedule._placement import _improve, improve
from layerpipe.schedule._planner import (
    Plan,
    PlanCosts,
    _replicated_timing,
    _search_plan,
    plan,
    replicated_layout,
    replicated_timing,
)
from layerpipe.schedule._replicated_scores import _ForwardPins
from layerpipe.schedule._stage_programs import gpipe, one_f_one_b, zb_h1
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import periodic_of
from layerpipe.schedule._validate import periodic_staleness
from layerpipe.schedule._versions import periodic_versions
from layerpipe.schedule._workload import Workload
from tests.schedule_reference import (
    FAST,
    SPECS,
    improve_case,
    reference_balance,
    reference_events,
    reference_improve,
    reference_pack_channels,
    reference_periodic_versions,
    reference_planned_order,
    task_table,
)
from tests.schedule_reference_planner import reference_replicated_timing, reference_search_plan
from tests.strategies import networks


@FAST
@given(net=networks(max_layers=7, dag=True, max_width=12, max_batch=3), n=st.integers(2, 6),
       spec=st.sampled_from(SPECS), overhead=st.integers(0, 3), together=st.booleans(), seed=st.integers(0, 2**16),
       bounded=st.booleans())
def test_improve_equals_the_reference(net, n, spec, overhead, together, seed, bounded) -> None:
    table, ic, members, placement, max_words = improve_case(net, n, spec, overhead, together, seed, bounded)
    expected = reference_improve(table, placement, n, ic, members, max_words)
    assert _improve(table, placement, n, ic, members, max_words) == expected
    assert improve(table, placement, n, ic, members, max_words) == expected
    again = improve(table, placement, n, ic, members, max_words)  # the memo's answer, a list of its own
    assert again == expected
    again.append(-1)
    assert improve(table, placement, n, ic, members, max_words) == expected


@FAST
@given(weights=st.lists(st.integers(0, 40), max_size=40), n=st.integers(1, 9), seeded=st.booleans(),
       seed=st.integers(0, 2**16))
def test_balance_equals_the_reference(weights, n, seeded, seed) -> None:
    """LPT or a random start, then moves and swaps off the busiest processor: the sorted weights kept across
    rounds give the rounds that sort them afresh."""
    rng = random.Random(seed)
    initial = [rng.randrange(n) for _ in weights] if seeded else None
    assert balance(weights, n, initial) == reference_balance(weights, n, initial)


def test_improve_refuses_an_item_split_over_processors() -> None:
    table = task_table(load_network("mlp:8-6-4"), 0)
    _, members = group_items(table, weight_groups(table, True))
    split = next(m for m in members if len(m) > 1)
    placement = [0] * len(table)
    placement[split[0]] = 1
    with pytest.raises(ValueError, match="not on one processor"):
        _improve(table, placement, 2, parse_interconnect("links:2:1"), members, None)


def test_improve_on_zoo_placements_equals_the_reference() -> None:
    """The start placements LayerPipe's search really improves (`search_space`), on a zoo network."""
    from layerpipe.schedule._lags import asap_times
    from layerpipe.schedule._layerpipe import candidate_placements, pipedream_placement

    net, model = load_network("lenet5"), PEModel()
    table = TaskTable.of(build_training_graph(net), model)
    asap = asap_times(table)
    for spec in ("links:2:1", "rtl", "bus:2:16"):
        ic = parse_interconnect(spec, lanes=model.lanes)
        for n in (3, 8):
            for together in (False, True):
                starts = candidate_placements(table, n, weight_groups(table, together), asap)[0]
                _, members = group_items(table, weight_groups(table, together))
                for placement in [*starts, pipedream_placement(table, n)] if not together else starts:
                    for bound in (None, 4000):
                        assert _improve(table, placement, n, ic, members, bound) == \
                            reference_improve(table, placement, n, ic, members, bound), (spec, n, together, bound)


PERIODIC = ("layerpipe", "pipedream", "pipedream-2bw")


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12, max_batch=3), n=st.integers(1, 6),
       spec=st.sampled_from(SPECS), policy=st.sampled_from(PERIODIC), overhead=st.integers(0, 3))
def test_periodic_versions_equals_the_reference(net, n, spec, policy, overhead) -> None:
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    result = make_schedule(policy, net, n, model, interconnect=parse_interconnect(spec, lanes=4))
    schedule, graph = result.periodic, result.graph
    expected = reference_periodic_versions(schedule, graph)
    assert periodic_versions(schedule, graph) == expected
    assert periodic_versions(schedule, graph, schedule.read_pins()) == expected


def test_periodic_versions_on_zoo_schedules_equals_the_reference() -> None:
    """Replicated, unfolded and coalesced (2BW) schedules of real networks, deep lags included."""
    model = PEModel()
    cases = [("lenet5", spec, n) for spec in ("shared", "links:2:1", "bus:2:16") for n in (2, 5, 9)]
    for network, spec, n in [*cases, ("resnet18", "links:2:1", 6)]:
        net = load_network(network)
        ic = parse_interconnect(spec, lanes=model.lanes)
        for policy in PERIODIC:
            result = make_schedule(policy, net, n, model, interconnect=ic)
            assert periodic_versions(result.periodic, result.graph) == \
                reference_periodic_versions(result.periodic, result.graph), (network, spec, policy, n)


@FAST
@given(net=networks(max_layers=7, dag=True, max_width=12, max_batch=3), n=st.integers(2, 6),
       spec=st.sampled_from(tuple(s for s in SPECS if s != "shared")), overhead=st.integers(0, 3),
       seed=st.integers(0, 2**16), planned=st.booleans(), slack=st.integers(0, 40))
def test_pack_channels_equals_the_reference(net, n, spec, overhead, seed, planned, slack) -> None:
    table = task_table(net, overhead)
    rng = random.Random(seed)
    comm = Comm([rng.randrange(n) for _ in range(len(table))], parse_interconnect(spec, lanes=4), n)
    found = transfers(table, comm)
    busiest = max((sum(t.hold for t in found if t.channel == c) for c in {t.channel for t in found}), default=0)
    period = max(1, busiest, max(table.cost)) + slack
    start = [rng.randrange(period) for _ in range(len(table))]
    consumer = [rng.randrange(4) * period + s for s in start] if planned else None
    assert _pack_channels(table, comm, start, period, consumer, found) == \
        reference_pack_channels(table, comm, start, period, consumer, found)
    if busiest > 1:  # a channel over the period is refused by both
        with pytest.raises(ValueError):
            _pack_channels(table, comm, start, busiest - 1, consumer, found)
        with pytest.raises(ValueError):
            reference_pack_channels(table, comm, start, busiest - 1, consumer, found)


def test_table_tokens_name_contents() -> None:
    model = PEModel()
    a = TaskTable.of(build_training_graph(load_network("lenet5")), model)
    b = TaskTable.of(build_training_graph(load_network("lenet5")), model)
    c = TaskTable.of(build_training_graph(load_network("lenet5"), GraphOptions(intra=False)), model)
    d = TaskTable.of(build_training_graph(load_network("lenet5", 2)), model)
    assert a is not b and a.token == b.token
    assert len({a.token, c.token, d.token}) == 3


def test_memoised_timings_are_the_computed_ones_and_private_to_each_caller() -> None:
    net, model = load_network("resnet18"), PEModel()
    ic = parse_interconnect("links:2:1", lanes=model.lanes)
    table = TaskTable.of(build_training_graph(net), model)
    rng = random.Random(7)
    placement = [rng.randrange(4) for _ in range(len(table))]
    comm = Comm(placement, ic, 4)
    found = transfers(table, comm)
    period = max(sum(t.hold for t in found if t.channel == ch) for ch in {t.channel for t in found})
    period = max(period, sum(table.cost))
    start = [rng.randrange(period) for _ in range(len(table))]
    fresh = _comm_timing(table, start, period, comm)
    first = comm_timing(table, start, period, comm)
    assert first == fresh
    first[0][0] += 99
    first[1].clear()
    assert comm_timing(table, start, period, Comm(list(placement), ic, 4)) == fresh
    got = transfers(table, comm)
    got.clear()
    assert transfers(table, comm) == found

    pd_table = TaskTable.of(build_training_graph(net, GraphOptions.pipedream()), model)
    best = plan(PlanCosts(pd_table, ic), 8)
    laid = replicated_timing(table, best, 8, ic)
    laid.placement.append(-1)
    laid.timing.lag[0] += 5
    again = replicated_timing(TaskTable.of(build_training_graph(net), model), best, 8, ic)
    assert again.placement == laid.placement[:-1] and again.timing.lag[0] == laid.timing.lag[0] - 5


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(1, 4),
       policy=st.sampled_from(("gpipe", "1f1b", "zb-h1", "layerpipe", "pipedream")),
       spec=st.sampled_from(("links:0:1", "links:2:1", "links:1:1/8", "bus:2:3", "bus:0:1/2", "bus:1:4")),
       overhead=st.integers(0, 2), seed=st.integers(0, 2**16), change=st.sampled_from(("none", "prefix", "shuffle")))
def test_events_equal_the_reference(net, n, policy, spec, overhead, seed, change) -> None:
    """`_events` (steps without transfers skipped, a processor's next op started inline) against
    `reference_events`: the same starts, ends and served transfers, or the same deadlock report — on the bus
    (dynamic, and step by step for synchronous schedules) and on links, whole runs and program prefixes."""
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    result = make_schedule(policy, net, n, model)
    if result.explicit is not None:
        schedule = expand_stages(result.explicit, result.graph, result.stages)
    else:
        schedule = result.periodic.unroll(4)
    rng = random.Random(seed)
    if change == "shuffle":  # programs in another order: some deadlock
        rows = [list(row) for row in schedule.procs]
        rng.shuffle(rows[rng.randrange(len(rows))])
        schedule = replace(schedule, procs=tuple(tuple(row) for row in rows))
    c = compile_schedule(schedule, Workload.of_graph(result.graph, model))
    ic = parse_interconnect(spec, lanes=4)
    wpc = ic.words_per_cycle if ic.words_per_cycle is not None else 1
    bus = ic.kind == "bus"
    last = [rng.randint(c.bounds[p], c.bounds[p + 1]) for p in range(c.num_procs)] if change == "prefix" else None
    try:
        order = bus_order(c, ic.latency, wpc) if bus and last is None else None
        expected_served: list[tuple[int, int]] = []
        expected = reference_events(c, ic.latency, wpc, bus, order, last, expected_served)
    except DeadlockError as exc:
        with pytest.raises(DeadlockError) as caught:
            order = bus_order(c, ic.latency, wpc) if bus and last is None else None
            _events(c, ic.latency, wpc, bus, order, last, [])
        assert str(caught.value) == str(exc)
        return
    served: list[tuple[int, int]] = []
    assert _events(c, ic.latency, wpc, bus, order, last, served) == expected
    assert served == expected_served


@FAST
@given(program=st.sampled_from((gpipe, one_f_one_b, zb_h1)), procs=st.integers(1, 4), microbatches=st.integers(1, 4),
       steps=st.integers(1, 3), costs=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
                                               min_size=4, max_size=4),
       spec=st.sampled_from(("bus:2:3", "bus:0:1/2", "bus:1:4", "links:2:1")), words=st.integers(0, 9))
def test_events_equal_the_reference_on_stage_programs(program, procs, microbatches, steps, costs, spec,
                                                      words) -> None:
    """As above on stage-level programs of several steps, whose bus is served step by step (`_step_order`)."""
    try:
        schedule = program(procs, microbatches, steps=steps)
    except InputError:
        return
    stages = StageInfo(procs, (words,) * procs, (words,) * procs)
    c = compile_schedule(schedule, Workload.of_stages(costs[:procs], stages))
    ic = parse_interconnect(spec, lanes=4)
    wpc = ic.words_per_cycle if ic.words_per_cycle is not None else 1
    bus = ic.kind == "bus"
    order = bus_order(c, ic.latency, wpc) if bus else None
    expected_served: list[tuple[int, int]] = []
    expected = reference_events(c, ic.latency, wpc, bus, order, None, expected_served)
    served: list[tuple[int, int]] = []
    assert _events(c, ic.latency, wpc, bus, order, None, served) == expected
    assert served == expected_served


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(1, 4),
       policy=st.sampled_from(("layerpipe", "pipedream", "ooo")), overhead=st.integers(0, 2),
       spec=st.sampled_from(("bus:2:3", "bus:0:1/2", "bus:1:4")), iterations=st.integers(1, 9),
       bandwidth=st.sampled_from((None, 2.5, 0.75, math.inf, 1)))
def test_planned_order_equals_the_reference(net, n, policy, overhead, spec, iterations, bandwidth) -> None:
    """The planned bus of a periodic schedule's unrolled run: the same ranks and floors."""
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    ic = parse_interconnect(spec, lanes=4)
    result = make_schedule(policy, net, n, model, None, ic)
    assume(result.periodic is not None)
    workload = replace(Workload.of_graph(result.graph, model), plan=result.periodic)
    c = compile_schedule(result.periodic.unroll(iterations), workload)
    wpc = ic.words_per_cycle if bandwidth is None else bandwidth
    assert _planned_order(c, wpc) == reference_planned_order(c, wpc)


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
    """Any starts, lags and arrivals (not only timings that hold): the pins are a formula of them. With
    zero-cycle copies and readers on few processors and starts (so that `read_offset`'s extra cycle counts)."""
    table = _table(net, overhead)
    best, ic = _plan_of(table, n, spec, coalesce)
    laid = replicated_layout(table, best, n, ic, coalesce)  # type: ignore[arg-type]
    unfolded, period = laid.table, laid.period
    if period <= 0:
        return
    rng = random.Random(seed)
    if rng.random() < 0.5:
        unfolded = replace(unfolded, cost=tuple(0 if rng.random() < 0.6 else c for c in unfolded.cost))
    placement = list(laid.placement) if rng.random() < 0.5 else [rng.randrange(2) for _ in range(len(unfolded))]
    start = [rng.choice((0, period // 2, rng.randrange(period))) for _ in range(len(unfolded))]
    lag = [rng.randrange(4) for _ in range(len(unfolded))]
    arrival = {(u, x): start[u] + unfolded.cost[u] + rng.randrange(2 * period)
               for u, x, _ in unfolded.weight_reads if rng.random() < 0.5}
    schedule = periodic_of(unfolded, placement, start, lag, period, n, arrival)
    want = schedule.forward_pins()
    forward = _ForwardPins(unfolded, placement, period, table.graph)
    pins = forward.pins(start, lag, arrival)
    assert list(pins.items()) == list(want.items())
    assert forward.staleness(pins) == periodic_staleness(schedule, table.graph, pins=want)


@FAST
@given(net=networks(max_layers=6, dag=True, max_width=12), n=st.integers(2, 8), spec=st.sampled_from(SPECS),
       overhead=st.integers(0, 3), coalesce=st.sampled_from((None, 2, 3, 4)), seed=st.integers(0, 2**16))
def test_pins_on_arrays_match_read_by_read(net: Network, n: int, spec: str, overhead: int, coalesce: int | None,
                                           seed: int) -> None:
    """`pinned_weight_sources` on arrays (large tables) against its read-by-read path, capped or not, on any
    starts, lags and delays, with zero-cycle copies and readers."""
    table = _table(net, overhead)
    best, ic = _plan_of(table, n, spec, coalesce)
    laid = replicated_layout(table, best, n, ic, coalesce)  # type: ignore[arg-type]
    unfolded, period = laid.table, max(1, laid.period)
    if not unfolded.weight_reads:
        return
    rng = random.Random(seed)
    # zero-cycle copies and readers (`read_offset`'s extra cycle on one processor) at random
    unfolded = replace(unfolded, cost=tuple(0 if rng.random() < 0.6 else c for c in unfolded.cost))
    # few processors and starts, so that a reader often starts where a copy on its processor does (the extra
    # cycle then counts)
    placement = [rng.randrange(2) for _ in range(len(unfolded))]
    start = [rng.choice((0, period // 2, rng.randrange(period))) for _ in range(len(unfolded))]
    lag = [rng.randrange(4) for _ in range(len(unfolded))]
    delay = {x: rng.randrange(2 * period) for _, x, _ in unfolded.weight_reads if rng.random() < 0.3}
    newest = {(u, x): rng.choice(unfolded.update_copies[unfolded.tasks[x].layer])
              for u, x, _ in unfolded.weight_reads}
    for cap in (None, newest):
        want = _unfold.pinned_weight_sources(unfolded, placement, start, lag, period, delay, cap)
        arrays = _unfold._pinned_on_arrays(unfolded, unfolded._pin_arrays, placement, start, lag, period, delay, cap)
        assert arrays is not None and list(arrays.items()) == list(want.items())

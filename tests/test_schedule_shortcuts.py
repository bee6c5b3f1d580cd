"""The scheduler's second speed pass (issue 14: layerpipe and pipedream several times faster) gives what the code
before it gave, on generated inputs:

- `modulo_list_schedule` (fit inlined, processors whose widest free interval is too short skipped, the search
  stopped at a processor where the task starts at its ready time) against `reference_modulo_list_schedule`;
- `comm_timing`'s rounds (the lag sweep reading arrivals in place, a round skipped when the plan times cannot
  reorder a queue, the first packing handed on) against `reference_comm_timing` (every round re-planned, the
  lags solved by the retiming package's solver), and its fixpoint record (`replanned_alike`);
- `PeriodicSchedule.forward_pins` against the forward part of `read_pins`;
- `table_of` hands back the caller's own network object and a table equal to one built afresh.

The references are tests/schedule_reference.py (the code of commit 6b4e035).
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from layerpipe._memo import clear_memos
from layerpipe.costs import PEModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import make_schedule
from layerpipe.schedule._bodies import modulo_list_schedule
from layerpipe.schedule._comm import Comm, busiest_channel
from layerpipe.schedule._comm_timing import _comm_timing, comm_timing, replanned_alike
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._layerpipe import weight_groups
from layerpipe.schedule._planner import PlanCosts, plan, replicated_layout
from layerpipe.schedule._task_table import TaskTable, table_of
from tests.schedule_reference import (
    FAST,
    SPECS,
    reference_comm_timing,
    reference_modulo_list_schedule,
    task_table,
)
from tests.strategies import networks


@FAST
@given(net=networks(max_layers=7, dag=True, max_width=12, max_batch=3), n=st.integers(1, 6),
       overhead=st.integers(0, 3), together=st.booleans(), fixed=st.booleans(), seed=st.integers(0, 2**16),
       stretch=st.integers(0, 60))
def test_modulo_list_schedule_equals_the_reference(net, n, overhead, together, fixed, seed, stretch) -> None:
    table = task_table(net, overhead)
    asap = asap_times(table)
    priority = sorted(range(len(table)), key=lambda v: (asap[v], v))
    group = weight_groups(table, True) if together else None
    rng = random.Random(seed)
    pinned = [rng.randrange(n) for _ in range(len(table))] if fixed else None
    # From below the load bound (fragmentation and refusals) to well above it.
    period = max(1, -(-table.total // n) * (80 + stretch) // 100, max(table.cost))
    assert modulo_list_schedule(table, period, n, priority, group, pinned) == \
        reference_modulo_list_schedule(table, period, n, priority, group, pinned)


@FAST
@given(net=networks(max_layers=7, dag=True, max_width=12, max_batch=3), n=st.integers(2, 6),
       spec=st.sampled_from(SPECS), overhead=st.integers(0, 3), seed=st.integers(0, 2**16), slack=st.integers(0, 40))
def test_comm_timing_equals_the_reference(net, n, spec, overhead, seed, slack) -> None:
    table = task_table(net, overhead)
    ic = parse_interconnect(spec, lanes=4)
    rng = random.Random(seed)
    placement = [rng.randrange(n) for _ in range(len(table))]
    comm = Comm(placement, ic, n)
    loads = [0] * n
    for v, p in enumerate(placement):
        loads[p] += table.cost[v]
    period = max(1, max(loads), busiest_channel(table, comm)) + slack
    # Starts of a few tied producers: one start offset shared by many tasks makes equal releases.
    start = [rng.choice((0, rng.randrange(period))) for _ in range(len(table))]
    lag, arrival = _comm_timing(table, start, period, None if ic.is_shared else comm)
    assert (lag, arrival) == reference_comm_timing(table, start, period, None if ic.is_shared else comm)
    clear_memos()
    assert comm_timing(table, start, period, comm) == (lag, arrival)


def test_replicated_comm_timings_equal_the_reference() -> None:
    """Unfolded tables with weight reads between replicas: the rounds through `channel_timing`'s pins."""
    net, model = load_network("alexnet"), PEModel(lanes=4)
    table = TaskTable.of(build_training_graph(net), model)
    pd = TaskTable.of(build_training_graph(net, GraphOptions.pipedream()), model)
    rng = random.Random(3)
    for spec in ("rtl", "links:2:1", "bus:1:2"):
        ic = parse_interconnect(spec, lanes=4)
        for n in (3, 6):
            laid = replicated_layout(table, plan(PlanCosts(pd, ic), n), n, ic)
            comm = Comm(laid.placement, ic, n)
            for _ in range(3):
                start = [rng.randrange(laid.period) for _ in range(len(laid.table))]
                lag, arrival = _comm_timing(laid.table, start, laid.period, comm)
                assert (lag, arrival) == reference_comm_timing(laid.table, start, laid.period, comm)


def test_comm_timing_records_its_fixpoint() -> None:
    """`replanned_alike` is true only for the lags and arrivals `comm_timing` settled on, and then re-planning
    them gives them again."""
    net, model = load_network("resnet18"), PEModel(lanes=4)
    table = TaskTable.of(build_training_graph(net), model)
    ic = parse_interconnect("links:2:1", lanes=4)
    rng = random.Random(11)
    placement = [rng.randrange(4) for _ in range(len(table))]
    comm = Comm(placement, ic, 4)
    period = max(busiest_channel(table, comm), table.total)
    start = [rng.choice((0, rng.randrange(period))) for _ in range(len(table))]
    lag, arrival = comm_timing(table, start, period, comm)
    if replanned_alike(table, start, period, comm, lag, arrival):
        again = reference_comm_timing(table, start, period, comm)
        assert again == (lag, arrival)
    assert not replanned_alike(table, start, period, comm, [x + 1 for x in lag], arrival)
    clear_memos()
    assert not replanned_alike(table, start, period, comm, lag, arrival)  # forgotten: not claimed


def test_forward_pins_are_the_forward_part_of_read_pins() -> None:
    for network, spec, policy, n in (("lenet5", "rtl", "pipedream", 6), ("resnet18", "links:2:1", "layerpipe", 3),
                                     ("mlp:16-12-8-4", "shared", "pipedream-2bw", 3)):
        net = load_network(network)
        result = make_schedule(policy, net, n, PEModel(lanes=4), interconnect=parse_interconnect(spec, lanes=4))
        schedule = result.periodic
        fresh = type(schedule)(schedule.period, schedule.bodies, schedule.costs, schedule.read_delays,
                               schedule.unfold, schedule.groups, schedule.read_floor)
        forward = fresh.forward_pins()  # before read_pins: computed on its own
        assert forward == {k: s for k, s in schedule.read_pins().items() if k[0] == "F"}
        assert list(forward) == [k for k in schedule.read_pins() if k[0] == "F"]
        assert fresh.forward_pins() == forward


def test_table_of_names_the_callers_network() -> None:
    model = PEModel(lanes=4)
    first, second = load_network("lenet5"), load_network("lenet5")
    a = table_of(first, GraphOptions(), model)
    b = table_of(second, GraphOptions(), model)
    assert a.graph.network is first and b.graph.network is second
    fresh = TaskTable.of(build_training_graph(second), model)
    assert b == fresh and b.token == fresh.token and b.graph == fresh.graph
    clear_memos()
    assert table_of(second, GraphOptions(), model).graph.network is second

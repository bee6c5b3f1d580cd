"""`_lags.StalenessFloor`: the floor never exceeds the staleness a timing of those starts really has — the planned
timing on the interconnect (`timed`), and the listed timing of a modulo list schedule — so a probe it rules
out would have failed. Random placements, starts and periods of zoo networks on every kind of interconnect,
and the bounded search's own list schedules."""

from __future__ import annotations

import random

import pytest

from layerpipe.costs import PEModel
from layerpipe.dfg import GraphOptions
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule._bodies import contiguous_starts, modulo_list_schedule, order_bodies
from layerpipe.schedule._comm import Comm
from layerpipe.schedule._comm_timing import timed, timing_of
from layerpipe.schedule._lags import StalenessFloor, asap_times
from layerpipe.schedule._placement import placement_cost
from layerpipe.schedule._task_table import table_of

SPECS = ["links:2:1", "rtl", "bus:2:16", "shared", "links:1:1/8"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(("network", "num_procs"), [("lenet5", 3), ("alexnet", 6), ("resnet18", 8),
                                                    ("mlp:16-12-8-4", 2)])
def test_floor_is_below_every_planned_timing(network: str, num_procs: int, spec: str) -> None:
    model = PEModel()
    table = table_of(load_network(network), GraphOptions(), model)
    ic = parse_interconnect(spec, lanes=model.lanes)
    floor = StalenessFloor(table, ic)
    rng = random.Random(f"{network}{spec}")
    checked = 0
    for _ in range(12):
        placement = [rng.randrange(num_procs) for _ in range(len(table))]
        period = placement_cost(table, placement, num_procs, ic).period
        period = rng.choice((period, period + rng.randrange(1 + period // 3)))
        bodies = order_bodies(placement, num_procs, lambda v: (rng.random(), v))
        start = contiguous_starts(bodies, table.cost)
        timing = timed(table, start, period, Comm(placement, ic, num_procs))
        for loop in table.weight_loops():
            assert floor.layer_floor(loop, placement, start, period) <= timing.staleness[loop[0]], (loop, period)
            checked += 1
        if floor.above(placement, start, period, max(timing.staleness.values(), default=0)):
            raise AssertionError("the floor rules out a timing that meets its own staleness")
    assert checked


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(("network", "num_procs"), [("lenet5", 4), ("resnet18", 6), ("alexnet", 8)])
def test_floor_is_below_the_list_schedules_timings(network: str, num_procs: int, spec: str) -> None:
    model = PEModel()
    table = table_of(load_network(network), GraphOptions(), model)
    ic = parse_interconnect(spec, lanes=model.lanes)
    floor = StalenessFloor(table, ic)
    asap = asap_times(table)
    priority = sorted(range(len(table)), key=lambda v: (asap[v], v))
    low = -(-table.total // num_procs)
    for period in sorted({low + (table.total - low) * i // 10 for i in range(11)}):
        found = modulo_list_schedule(table, period, num_procs, priority)
        if found is None:
            continue
        placement, sigma = found
        start = [s % period for s in sigma]
        if placement_cost(table, placement, num_procs, ic).period > period:
            continue
        listed = timing_of(table, start, [s // period for s in sigma], period)
        planned = timed(table, start, period, Comm(placement, ic, num_procs))
        for loop in table.weight_loops():
            at_least = floor.layer_floor(loop, placement, start, period)
            assert at_least <= planned.staleness[loop[0]], (loop, period)
            if ic.is_shared:  # the listed lags hold without transfers
                assert at_least <= listed.staleness[loop[0]], (loop, period)

"""The `ooo` policy: Out-Of-Order BackProp's pipeline scheme (Oh et al., EuroSys'22), as a periodic schedule.

The backward splits into output gradients (δ_l and e_{l−1}: the task AE_l, the `intra` split only) and
weight gradients G_l, which nothing downstream waits for in the same iteration except U_l. Layers go to
processors by modulo allocation, processor(l) = ⌊(l−1)/g⌋ mod N for group size g (layers numbered from 1),
so a processor holds every layer's tasks of its groups; the period is the busiest processor's load. In each
body the forward and output-gradient work comes first (in ASAP order, or at target offsets in the period)
and the weight-gradient work (G, U) fills the rest of the period after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule._result import ScheduleResult, periodic_result
from layerpipe.schedule._shared import (
    TaskTable,
    Timing,
    asap_times,
    best_ordering,
    default_targets,
    order_bodies,
    pack_bodies,
)


@dataclass(frozen=True)
class OOOOptions:
    group_size: int = 1  #: g, consecutive layers per allocation group

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise InputError(f"group_size (-g) must be >= 1, got {self.group_size}")


def modulo_allocation(layer: int, group_size: int, num_procs: int) -> int:
    return ((layer - 1) // group_size) % num_procs


def schedule_ooo(network: Network, num_procs: int, model: CostModel, options: OOOOptions,
                 interconnect: Interconnect = SHARED) -> ScheduleResult:
    table = TaskTable.of(build_training_graph(network, GraphOptions(intra=True, inter=False)), model)
    placement = [modulo_allocation(t.layer, options.group_size, num_procs) for t in table.tasks]
    loads = [0] * num_procs
    for v, p in enumerate(placement):
        loads[p] += table.cost[v]
    period = max(loads)
    asap = asap_times(table)

    def filler(v: int) -> int:
        return 1 if table.tasks[v].kind in ("G", "U") else 0

    keys = [lambda v: (filler(v), asap[v], v), lambda v: (filler(v), asap[v] % period, asap[v], v)]
    timing = best_ordering(table, placement, num_procs, period, keys)
    # Forward and output-gradient work at its target offsets in the period, weight-gradient work after it.
    for target in default_targets(table, placement, num_procs, asap):
        bodies = order_bodies(placement, num_procs, lambda v, t=target: (filler(v), t[v] % period, t[v], v))
        timing = min(timing, pack_bodies(table, bodies, period, target), key=Timing.score)
    return periodic_result("ooo", options, table, num_procs, placement, timing.start, timing.lag, period,
                           table.cost)

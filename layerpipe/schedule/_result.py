"""What every policy returns: the schedule (periodic or explicit), its graph or stages, and its metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import TYPE_CHECKING

from layerpipe.dfg import TrainingGraph
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule._bodies import periodic_from
from layerpipe.schedule._comm import Comm, busiest_channel
from layerpipe.schedule._deps import StageInfo
from layerpipe.schedule._ir import OpSchedule
from layerpipe.schedule._lags import loop_lengths
from layerpipe.schedule._periodic import PeriodicSchedule
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import UnfoldedTable, periodic_of
from layerpipe.schedule._validate import periodic_staleness
from layerpipe.schedule._versions import periodic_versions
from layerpipe.schedule.metrics import (
    ScheduleMetrics,
    period_lower_bound,
    stash_versions,
    traffic_words,
    utilization_pct,
)

if TYPE_CHECKING:
    from layerpipe.schedule._engine import TimedRun


@dataclass(frozen=True)
class ScheduleResult:
    """A policy's schedule of `network` on `num_procs` processors.

    Asynchronous layer-level policies fill `periodic` (and `graph`); synchronous ones fill `explicit`, a
    stage-level `OpSchedule` of one step per `microbatches`, with `stages` naming each stage's layers.
    """

    policy: str
    options: object
    num_procs: int
    metrics: ScheduleMetrics
    network: Network | None = None
    graph: TrainingGraph | None = None
    periodic: PeriodicSchedule | None = None
    explicit: OpSchedule | None = None
    stages: StageInfo | None = None
    notes: tuple[str, ...] = ()
    #: The interconnect the schedule's timing assumes (every figure belongs to one).
    interconnect: Interconnect = SHARED
    #: The layer-level run a synchronous policy timed its step on, when that run is the one the simulator's steady
    #: state measures and the caller asked for it (`_sync_policies.steady_run_kept`, as `explore` does): the
    #: simulator reads it rather than time the same ops again. Not part of the result's value (equality, repr).
    timed_run: TimedRun | None = field(default=None, compare=False, repr=False)

    @property
    def synchronous(self) -> bool:
        return self.explicit is not None and self.explicit.synchronous

    @property
    def schedule(self) -> PeriodicSchedule | OpSchedule:
        """The policy's own schedule: `periodic` when it has one, else `explicit` (a result holds one of them)."""
        if self.periodic is not None:
            return self.periodic
        assert self.explicit is not None
        return self.explicit

    def ops(self, iterations: int | None = None) -> OpSchedule:
        """Explicit ops: the periodic body unrolled for `iterations` (default 2·max lag + 2), or the explicit
        schedule as is."""
        if self.periodic is not None:
            if iterations is None:
                iterations = 2 * max((s.lag for b in self.periodic.bodies for s in b), default=0) + 2
            return self.periodic.unroll(iterations)
        assert self.explicit is not None
        return self.explicit

    def options_dict(self) -> dict[str, object]:
        options = self.options
        return asdict(options) if is_dataclass(options) and not isinstance(options, type) else {}


def periodic_result(
    policy: str,
    options: object,
    table: TaskTable,
    num_procs: int,
    placement: Sequence[int],
    start: Sequence[int],
    lag: Sequence[int],
    period: int,
    item_costs: Sequence[int],
    max_staleness: int | None = None,
    notes: Sequence[str] = (),
    interconnect: Interconnect = SHARED,
    arrival: dict[tuple[int, int], int] | None = None,
    read_floor: Sequence[tuple[str, int, int, int]] = (),
    base_item_costs: Sequence[int] | None = None,
) -> ScheduleResult:
    """Assemble an asynchronous policy's periodic schedule and measure it.

    `arrival` is the planned arrival of every transfer (`Timing.arrival`, from the start of its producer's
    period) on `interconnect`; the bound adds the busiest channel of this placement to the compute bounds.
    An unfolded table (`_unfold.UnfoldedTable`, J iterations per period) gives an unfolded schedule; its
    staleness and versions come from the periodic timing phase by phase (`periodic_staleness`,
    `periodic_versions`), and `base_item_costs` (the items of one iteration) give the bound for one
    iteration per period.
    """
    graph = table.graph
    if arrival:
        _check_arrivals(table, start, lag, period, arrival)
    if isinstance(table, UnfoldedTable) or read_floor:
        return _unfolded_result(policy, options, table, num_procs, placement, start, lag, period, notes,
                                interconnect, arrival, read_floor, base_item_costs or item_costs)
    schedule = periodic_from(table, placement, start, lag, period, num_procs, arrival)
    batch = graph.network.batch
    bound = period_lower_bound(item_costs, num_procs, loop_lengths(table) if max_staleness is not None else None,
                               max_staleness)
    bound = max(bound, busiest_channel(table, Comm(placement, interconnect, num_procs)))
    where = {t: placement[v] for v, t in enumerate(table.tasks)}
    timing = {t: (lag[v] * period + start[v], table.cost[v]) for v, t in enumerate(table.tasks)}
    staleness = periodic_staleness(schedule, graph)
    versions = stash_versions(graph, timing, period)
    metrics = ScheduleMetrics(
        cycles_per_sample=period / batch,
        lower_bound_cycles=bound / batch,
        utilization_pct=utilization_pct(table.total, num_procs, period),
        traffic_words_per_sample=traffic_words(graph, where) / batch,
        weight_versions=max(versions.values(), default=1),
        max_staleness=max(staleness.values(), default=0),
        period_cycles=period,
        samples_per_period=batch,
        staleness_per_layer=staleness,
        weight_versions_per_layer=versions,
        # Any unfolding of this graph still does Σc of work per iteration on N processors.
        lower_bound_unfolded_cycles=table.total / (num_procs * batch),
    )
    return ScheduleResult(policy, options, num_procs, metrics, graph.network, graph, schedule, notes=tuple(notes),
                          interconnect=interconnect)


def _check_arrivals(table: TaskTable, start: Sequence[int], lag: Sequence[int], period: int,
                    arrival: dict[tuple[int, int], int]) -> None:
    """A plan in which a transfer arrives after its consumer starts is no plan: the simulator would run it
    later than scheduled (174.4 cycles per iteration against a planned 170 when the replicated plan's lags were
    settled wrong). Every planned arrival on a precedence edge u → v is checked: lag_v·P + start_v ≥
    lag_u·P + arrival(u, v). An AssertionError names the first one that is not (a scheduler bug)."""
    edge = table.edge_index
    for (u, v), at in arrival.items():
        if (u, v) in edge and lag[v] * period + start[v] < lag[u] * period + at:
            tu, tv = table.tasks[u], table.tasks[v]
            raise AssertionError(f"planned transfer {tu.kind}{tu.layer} (task {u}) -> {tv.kind}{tv.layer} (task {v}) "
                                 f"arrives at {lag[u] * period + at}, after its consumer starts at "
                                 f"{lag[v] * period + start[v]} (period {period})")


def _unfolded_result(policy: str, options: object, table: TaskTable, num_procs: int, placement: Sequence[int],
                     start: Sequence[int], lag: Sequence[int], period: int, notes: Sequence[str],
                     interconnect: Interconnect, arrival: dict[tuple[int, int], int] | None,
                     read_floor: Sequence[tuple[str, int, int, int]],
                     base_item_costs: Sequence[int]) -> ScheduleResult:
    """`periodic_result` for unfolded or grouped schedules: a period trains J·batch samples, traffic counts
    every crossing edge of the unfolded table (the replicas' gradient and weight copies included), and the
    bounds are the one-iteration-per-period bound of the plain items and Σc / N of the unfolded table."""
    graph = table.graph
    schedule = periodic_of(table, placement, start, lag, period, num_procs, arrival, read_floor)
    samples = schedule.unfold * graph.network.batch
    one = period_lower_bound(base_item_costs, num_procs)
    unfolded = max(table.total / num_procs, max(table.cost, default=0),
                   busiest_channel(table, Comm(placement, interconnect, num_procs)))
    words = sum(w for v, ps in enumerate(table.preds) for u, w in zip(ps, table.pred_words[v], strict=True)
                if placement[u] != placement[v])
    words += sum(w for u, x, w in table.weight_reads if placement[u] != placement[x])
    staleness = periodic_staleness(schedule, graph)
    versions = periodic_versions(schedule, graph)
    metrics = ScheduleMetrics(
        cycles_per_sample=period / samples,
        lower_bound_cycles=one / graph.network.batch,
        utilization_pct=utilization_pct(table.total, num_procs, period),
        traffic_words_per_sample=words / samples,
        weight_versions=max(versions.values(), default=1),
        max_staleness=max(staleness.values(), default=0),
        period_cycles=period,
        samples_per_period=samples,
        staleness_per_layer=staleness,
        weight_versions_per_layer=versions,
        lower_bound_unfolded_cycles=unfolded / samples,
    )
    return ScheduleResult(policy, options, num_procs, metrics, graph.network, graph, schedule, notes=tuple(notes),
                          interconnect=interconnect)

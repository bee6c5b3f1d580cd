"""PipeDream (async 1F1B with weight stashing, replicated stages) and PipeDream-2BW, as periodic schedules.

PipeDream (Narayanan et al., SOSP'19): the training graph with the fused backward B_l = A;E;G
(`GraphOptions.pipedream()`). With `replication` (the default) its planner (`_planner.plan`, §3.1) picks
contiguous stages *and* a replica count per stage on the given interconnect; a replicated stage runs
alternate micro-batches on its replicas (1F1B-RR), which is an unfolded periodic schedule (J = lcm of the
replica counts micro-batches per period), its replicas' gradients are summed into one update per round
(reduce to the root replica + broadcast, as transfers of the training graph's own G → U and U → F edges),
and every replica stashes the versions its own micro-batches need. A plan without replicas runs as below.

Without replication (`--no-replication`, the ablation and what this policy was before): layers cut into
min(N, L) contiguous stages by min-max F + B + U, one stage per processor. In steady state each stage runs
one forward block (its layers' F in order) and one backward block (B_l then U_l, in reverse layer order) per
period; the period is the busiest stage or channel. The blocks are laid out as 1F1B's steady state: stage
s's forward block starts where stage s − 1's ends and its backward block follows it around the period; lags
are the minimal legal ones. On balanced stages that gives PipeDream's figures: staleness S − 1 − s and
S − s stashed versions on stage s of S. (Simpler layouts — forward or backward block first everywhere —
are also timed and the best kept; with the forward block first every crossing costs a lag each way and the
lags are exactly the retiming solution of `layerpipe.retiming`, D_l = 2·S(l).)

PipeDream-2BW (Narayanan et al., ICML'21, §3): the same stages (no replicas), unfolded by m micro-batches
with one update group of m per layer: the gradients of m micro-batches are summed and applied once, at full
update cost, on the stage's processor. Double buffering: micro-batches of window k (iterations k·m …
k·m + m − 1) read version k − 1 — W(k+1) = W(k) − ν·∇f(W(k−1)) — a read pinned by design
(`PeriodicSchedule.read_floor`), never newer than the timing allows. Versions, staleness and memory are
then measured on the schedule (`periodic_versions`, `periodic_staleness`) and equal what the simulator and
the functional mode see; the paper's figures are 2 versions and staleness 1 when m ≥ the pipeline depth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule._balance import partition_contiguous
from layerpipe.schedule._bodies import best_ordering, order_bodies
from layerpipe.schedule._comm import Comm, busiest_channel
from layerpipe.schedule._comm_timing import Timing, timed
from layerpipe.schedule._ir import MAX_UNFOLD
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._planner import Plan, PlanCosts, Stage, plan, replicated_timing
from layerpipe.schedule._result import ScheduleResult, periodic_result
from layerpipe.schedule._task_table import TaskTable, table_of


@dataclass(frozen=True)
class PipeDreamOptions:
    """`replication`: PipeDream's planner over stages and replica counts (SOSP'19 §3.1); False keeps one
    processor per stage (the straight pipeline, for the ablation)."""

    replication: bool = True


@dataclass(frozen=True)
class PipeDream2BWOptions:
    microbatches: int | None = None  #: m, micro-batches per coalesced update (default: the number of stages)

    def __post_init__(self) -> None:
        if self.microbatches is not None and not 1 <= self.microbatches <= MAX_UNFOLD:
            raise InputError(f"microbatches (--microbatches) must be in 1..{MAX_UNFOLD} for pipedream-2bw (a period "
                             f"holds the m micro-batches of one update), got {self.microbatches}")


def stage_layers(table: TaskTable, num_procs: int) -> list[list[int]]:
    """Contiguous stages (lists of layer indices) balancing F + B + U per layer over min(N, L) stages."""
    network = table.graph.network
    work = {layer.index: 0 for layer in network.layers}
    for t, c in zip(table.tasks, table.cost, strict=True):
        work[t.layer] += c
    layers = [layer.index for layer in network.layers]
    runs = partition_contiguous([work[i] for i in layers], min(num_procs, len(layers)))
    return [[layers[i] for i in run] for run in runs]


def block_key(table: TaskTable) -> Callable[[int], tuple[int, int, int]]:
    """Body order of a stage, forward block first: F_l in layer order, then B_l and U_l, last layer first."""

    def key(v: int) -> tuple[int, int, int]:
        t = table.tasks[v]
        if t.kind == "F":
            return (0, t.layer, 0)
        return (1, -t.layer, 1 if t.kind == "U" else 0)

    return key


def _one_f_one_b(table: TaskTable, num_procs: int, interconnect: Interconnect = SHARED,
                 stages: list[list[int]] | None = None) -> tuple[list[int], int, Timing]:
    """Stages, period and the best 1F1B body timing: forward block first, backward block first, or per
    stage whichever block's ASAP start comes first modulo the period (1F1B's alternation)."""
    stages = stages or stage_layers(table, num_procs)
    stage_of = {layer: s for s, run in enumerate(stages) for layer in run}
    placement = [stage_of[t.layer] for t in table.tasks]
    loads = [0] * num_procs
    for v, p in enumerate(placement):
        loads[p] += table.cost[v]
    comm = Comm(placement, interconnect, num_procs)
    # The period fits the busiest stage and the busiest channel (activations and errors between stages).
    period = max(max(loads), busiest_channel(table, comm))
    asap = asap_times(table)
    first: dict[tuple[int, int], int] = {}  # (stage, block) → earliest ASAP start in the block
    block = block_key(table)
    for v in range(len(table)):
        k = (placement[v], block(v)[0])
        first[k] = min(first.get(k, asap[v]), asap[v])

    def backward_first(v: int) -> tuple[int, int, int]:
        b = block(v)
        return (1 - b[0], b[1], b[2])

    def alternating(v: int) -> tuple[int, int, int]:
        s, b = placement[v], block(v)
        f_first = first.get((s, 0), 0) % period <= first.get((s, 1), 0) % period
        return (b[0] if f_first else 1 - b[0], b[1], b[2])

    timing = best_ordering(table, placement, num_procs, period, [alternating, block, backward_first],
                           interconnect=interconnect)
    # 1F1B's steady state: stage s's forward block starts where stage s − 1's ends (offsets are the prefix
    # sums of the forward blocks, modulo P) and its backward block follows it around the period, so a
    # stage hands activations on, and gets errors back, within a period where the loads allow: staleness
    # about S − 1 − s on stage s instead of 2·(S − 1 − s) with one lag per crossing each way.
    forward_first_bodies = order_bodies(placement, num_procs, block)
    start = [0] * len(table)
    offset = 0
    for body in forward_first_bodies[: len(stages)]:
        at = offset
        for v in body:
            start[v] = at % period
            at += table.cost[v]
        offset += sum(table.cost[v] for v in body if table.tasks[v].kind == "F")
    packed = timed(table, start, period, comm)
    return placement, period, min(timing, packed, key=Timing.score)


def schedule_pipedream(network: Network, num_procs: int, model: CostModel, options: PipeDreamOptions,
                       interconnect: Interconnect = SHARED) -> ScheduleResult:
    table = table_of(network, GraphOptions.pipedream(), model)
    if not options.replication:
        placement, period, timing = _one_f_one_b(table, num_procs, interconnect)
        return periodic_result("pipedream", options, table, num_procs, placement, timing.start, timing.lag,
                               period, table.cost, interconnect=interconnect, arrival=timing.arrival)
    costs = PlanCosts(table, interconnect)
    best = plan(costs, num_procs)
    note = (f"PipeDream plan (SOSP'19 §3.1): stages {best.describe(costs.layers)} (layers x replicas) on "
            f"{best.procs} of {num_procs} processors, {float(best.cycles):.6g} planned cycles per micro-batch; "
            f"NOAM {best.noam}; all-reduce = reduce to the root replica + broadcast, 2(r-1)|W| words per round")
    if best.unfold == 1:
        layers = costs.layers
        stages = [[layers[i] for i in range(s.first, s.last + 1)] for s in best.stages]
        placement, period, timing = _one_f_one_b(table, num_procs, interconnect, stages)
        return periodic_result("pipedream", options, table, num_procs, placement, timing.start, timing.lag,
                               period, table.cost, notes=(note,), interconnect=interconnect, arrival=timing.arrival)
    laid = replicated_timing(table, best, num_procs, interconnect)
    return periodic_result("pipedream", options, laid.table, num_procs, laid.placement, laid.timing.start,
                           laid.timing.lag, laid.period, laid.table.cost, notes=(note,), interconnect=interconnect,
                           arrival=laid.timing.arrival, base_item_costs=table.cost)


def schedule_pipedream_2bw(network: Network, num_procs: int, model: CostModel,
                           options: PipeDream2BWOptions, interconnect: Interconnect = SHARED) -> ScheduleResult:
    table = TaskTable.of(build_training_graph(network, GraphOptions.pipedream()), model)
    stages = stage_layers(table, num_procs)
    m = options.microbatches or len(stages)
    position = {layer.index: i for i, layer in enumerate(network.layers)}
    straight = Plan(tuple(Stage(position[run[0]], position[run[-1]], 1) for run in stages), Fraction(0))
    laid = replicated_timing(table, straight, num_procs, interconnect, coalesce=m)
    weighted = sorted({t.layer for t in table.tasks if t.kind == "U"})
    floor = tuple(("F", layer, k, 1) for layer in weighted for k in range(m))
    notes = (f"2BW (ICML'21 §3): gradients of m={m} micro-batches summed into one update; window k reads "
             "version k-1 (double buffer)",)
    return periodic_result("pipedream-2bw", replace(options, microbatches=m), laid.table, num_procs,
                           laid.placement, laid.timing.start, laid.timing.lag, laid.period, laid.table.cost,
                           notes=notes, interconnect=interconnect, arrival=laid.timing.arrival, read_floor=floor,
                           base_item_costs=table.cost)

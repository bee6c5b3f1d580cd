"""Synchronous policies on a network: SIR's stage-level generators (`_sync`) applied to contiguous stages.

A network's layers are cut into S contiguous stages by dynamic programming (min-max per-step stage work
m·(F + I + W) + U, layers in topological order); S = p·v for p processors holding v chunks each (v = 1 for
gpipe, 1f1b, zb-h1, zb-h2; `virtual_stages` for interleaved-1f1b and zb-h1; 2 for zbv), with p = min(N,
⌊L/v⌋) so no stage is empty (the other processors idle). Stage costs come from `task_cost` through the
training graph: F_s = Σ F_l, I_s = Σ A_l + E_l (input gradient), W_s = Σ G_l (weight gradient), and the
per-step update U_s = Σ U_l, which runs right after the stage's last gradient op of the step.

Timing (`step_cycles`): two steps are timed in the `shared` interconnect model; the step time is the
difference of the two steps' completion times, so the first step's pipeline fill does not count but every
step's own bubbles do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule import _sync
from layerpipe.schedule._deps import StageInfo, dependencies
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._shared import partition_contiguous
from layerpipe.schedule._validate import dry_run
from layerpipe.schedule.metrics import ScheduleMetrics, traffic_words, utilization_pct

#: Steps generated for timing: the second one is the steady state.
TIMED_STEPS = 2

#: Largest step, in stage-level micro-batch slots (stages × micro-batches), that is generated and timed:
#: 64 stages × 256 micro-batches take ~8 s here and memory and time grow linearly beyond it.
MAX_STEP_SLOTS = 32768


def _check_step_size(policy: str, stages: int, microbatches: int) -> None:
    if stages * microbatches > MAX_STEP_SLOTS:
        raise InputError(f"{policy}: {stages} stages × {microbatches} micro-batches = {stages * microbatches} "
                         f"stage slots per step; the limit is {MAX_STEP_SLOTS} (fewer --microbatches or stages)")


@dataclass(frozen=True)
class SyncOptions:
    microbatches: int | None = None  #: m per step (default 2 × the processors used)

    def __post_init__(self) -> None:
        if self.microbatches is not None and self.microbatches < 1:
            raise InputError(f"microbatches must be >= 1, got {self.microbatches}")


@dataclass(frozen=True)
class InterleavedOptions:
    microbatches: int | None = None
    virtual_stages: int = 2  #: chunks per processor

    def __post_init__(self) -> None:
        SyncOptions(self.microbatches)
        if self.virtual_stages < 1:
            raise InputError(f"virtual_stages must be >= 1, got {self.virtual_stages}")


@dataclass(frozen=True)
class ZBH1Options(InterleavedOptions):
    virtual_stages: int = 1


@dataclass(frozen=True)
class SyncShape:
    """How a synchronous policy lays stages out: chunks per processor and the generator."""

    chunks: Callable[[object], int]
    generate: Callable[[int, int, object], OpSchedule]  # (processors, microbatches, options) → one step


SHAPES: dict[str, SyncShape] = {
    "gpipe": SyncShape(lambda o: 1, lambda p, m, o: _sync.gpipe(p, m, TIMED_STEPS)),
    "1f1b": SyncShape(lambda o: 1, lambda p, m, o: _sync.one_f_one_b(p, m, TIMED_STEPS)),
    "interleaved-1f1b": SyncShape(lambda o: o.virtual_stages,  # type: ignore[attr-defined]
                                  lambda p, m, o: _sync.interleaved_1f1b(p, m, o.virtual_stages, TIMED_STEPS)),  # type: ignore[attr-defined]
    "zb-h1": SyncShape(lambda o: o.virtual_stages,  # type: ignore[attr-defined]
                       lambda p, m, o: _sync.zb_h1(p, m, o.virtual_stages, TIMED_STEPS)),  # type: ignore[attr-defined]
    "zb-h2": SyncShape(lambda o: 1, lambda p, m, o: _sync.zb_h2(p, m, TIMED_STEPS)),
    "zbv": SyncShape(lambda o: 2, lambda p, m, o: _sync.zbv(p, m, TIMED_STEPS)),
}


class StageCost(NamedTuple):
    """Cycles of one stage's work: per micro-batch F, I (input gradient), W (weight gradient); per step U."""

    forward: int
    input_grad: int
    weight_grad: int
    update: int = 0
    backward_tail: int = 0  #: of a fused B, the work after the error for the previous stage has left


def step_cycles(stage_schedule: OpSchedule, stages: StageInfo, costs: Sequence[StageCost]) -> int:
    """Steady-state cycles of one step: the one call site that times synchronous schedules.

    Timed at stage level in the `shared` interconnect model (each processor runs its ops in order; an op
    starts when its producers have ended), as the layer-level expansion would run: stage s's per-step
    update U goes right after its last gradient op of the step (where `expand_stages` puts the U ops), and
    a fused B is timed as its part up to the previous stage's error and then its tail (the first layer's
    G: B expands to A, E, G per layer, last layer first), so the previous stage's backward does not wait
    for the tail. `layerpipe.sim` on the layer-level expansion gives the same step time (tests check chains;
    resnet18 agrees too); it is not called here because expanding resnet50 × 32 micro-batches takes seconds.
    """
    rows, split = [], set()
    for row in stage_schedule.procs:
        ops: list[Op] = []
        for op in row:
            if op.kind == "B":
                head, tail = Op(op.proc, "I", op.unit, op.iteration), Op(op.proc, "W", op.unit, op.iteration)
                ops += [head, tail]
                split |= {head, tail}
            else:
                ops.append(op)
        rows.append(tuple(ops))
    timed = OpSchedule("stage", tuple(rows), True, stage_schedule.microbatches)
    m = timed.microbatches
    last: dict[tuple[int, int], Op] = {}
    for op in timed.ops():
        if op.kind == "W":
            last[(op.unit, op.iteration // m)] = op  # program order: the stage's last gradient op of the step
    closing = {op: costs[op.unit].update for op in last.values()}

    def duration(op: Op) -> int:
        c = costs[op.unit]
        if op.kind == "F":
            base = c.forward
        elif op in split:
            base = c.input_grad + c.weight_grad - c.backward_tail if op.kind == "I" else c.backward_tail
        else:
            base = c.input_grad if op.kind == "I" else c.weight_grad
        return base + closing.get(op, 0)

    times = dry_run(timed, dependencies(timed, stages=stages), duration)
    done = [0] * timed.num_steps
    for op, (_, end) in times.items():
        step = op.iteration // m
        done[step] = max(done[step], end)
    return done[1] - done[0]


def schedule_synchronous(policy: str, network: Network, num_procs: int, model: CostModel,
                         options: SyncOptions | InterleavedOptions,
                         interconnect: Interconnect = SHARED) -> ScheduleResult:
    shape = SHAPES[policy]
    chunks = shape.chunks(options)
    procs = min(num_procs, len(network) // chunks)
    if procs < 1:
        raise InputError(f"{policy}: {chunks} chunks per processor need at least {chunks} layers, "
                         f"network {network.name} has {len(network)}")
    m = options.microbatches or 2 * procs
    _check_step_size(policy, procs * chunks, m)
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    costs = graph.costs(model)
    per_layer = {layer.index: 0 for layer in network.layers}
    for t, c in costs.items():
        per_layer[t.layer] += c * (1 if t.kind == "U" else m)
    layers = [layer.index for layer in network.layers]
    runs = partition_contiguous([per_layer[i] for i in layers], procs * chunks)
    stage_layers = [[layers[i] for i in run] for run in runs]
    stages = StageInfo.of_network(graph, stage_layers)
    stage_schedule = _pad(shape.generate(procs, m, options), num_procs)
    step = step_cycles(stage_schedule, stages, stage_costs_of(graph, model, stage_layers))
    one_step = _first_step(stage_schedule, m)

    batch = network.batch
    work = m * sum(c for t, c in costs.items() if t.kind != "U") + sum(c for t, c in costs.items() if t.kind == "U")
    busiest = max(-(-work // num_procs), max(costs.values()))
    proc_of_stage = {op.unit: op.proc for op in one_step.ops()}
    placement = {t: proc_of_stage[s] for s, run in enumerate(stage_layers) for t in graph.tasks if t.layer in run}
    metrics = ScheduleMetrics(
        cycles_per_sample=step / (m * batch),
        lower_bound_cycles=busiest / (m * batch),
        utilization_pct=utilization_pct(work, num_procs, step),
        traffic_words_per_sample=traffic_words(graph, placement) / batch,
        weight_versions=1,
        max_staleness=0,
        period_cycles=step,
        samples_per_period=m * batch,
        staleness_per_layer={layer.index: 0 for layer in network.layers if layer.has_weights},
        weight_versions_per_layer={layer.index: 1 for layer in network.layers if layer.has_weights},
    )
    notes = (f"{procs * chunks} stages on {procs} of {num_procs} processors, {m} micro-batches per step",)
    return ScheduleResult(policy, replace(options, microbatches=m), num_procs, metrics, network, graph,
                          explicit=one_step, stages=stages, notes=notes)


def _pad(schedule: OpSchedule, num_procs: int) -> OpSchedule:
    """Idle rows for processors the stages do not use."""
    rows = schedule.procs + ((),) * (num_procs - schedule.num_procs)
    return OpSchedule(schedule.level, rows, schedule.synchronous, schedule.microbatches)


def _first_step(schedule: OpSchedule, m: int) -> OpSchedule:
    rows = tuple(tuple(op for op in row if op.iteration < m) for row in schedule.procs)
    return OpSchedule(schedule.level, rows, schedule.synchronous, schedule.microbatches)


def stage_costs_of(graph: TrainingGraph, model: CostModel, stage_layers: Sequence[Sequence[int]]) -> list[StageCost]:
    """F, I (A + E), W (G) and U cycles per stage, and the G of the stage's first layer (a fused B's tail)."""
    costs = graph.costs(model)
    stage_of = {layer: s for s, run in enumerate(stage_layers) for layer in run}
    out = [[0, 0, 0, 0, 0] for _ in stage_layers]
    for t, c in costs.items():
        out[stage_of[t.layer]][{"F": 0, "G": 2, "U": 3}.get(t.kind, 1)] += c  # the rest (A, E) is I
        if t.kind == "G" and t.layer == min(stage_layers[stage_of[t.layer]]):
            out[stage_of[t.layer]][4] = c
    return [StageCost(*row) for row in out]


def schedule_stages(policy: str, num_procs: int, options: SyncOptions | InterleavedOptions,
                    stage_cost: tuple[int, int, int]) -> ScheduleResult:
    """A synchronous policy on `num_procs` processors with uniform stage costs (F, I, W) and no network:
    the torch.distributed.pipelining view (`--stages P --stage-costs F,B,W`, B the input-gradient part)."""
    shape = SHAPES[policy]
    chunks = shape.chunks(options)
    m = options.microbatches or 2 * num_procs
    f, i, w = stage_cost
    if min(f, i) < 1 or w < 0:
        raise InputError(f"stage costs F,B,W must have F, B >= 1 and W >= 0, got {f},{i},{w}")
    _check_step_size(policy, num_procs * chunks, m)
    stages = StageInfo(num_procs * chunks)
    step = step_cycles(shape.generate(num_procs, m, options), stages, [StageCost(f, i, w)] * stages.num_stages)
    work = m * (f + i + w) * stages.num_stages
    metrics = ScheduleMetrics(
        cycles_per_sample=step / m,
        lower_bound_cycles=-(-work // num_procs) / m,
        utilization_pct=utilization_pct(work, num_procs, step),
        traffic_words_per_sample=0.0,
        weight_versions=1,
        max_staleness=0,
        period_cycles=step,
        samples_per_period=m,
    )
    one_step = _first_step(shape.generate(num_procs, m, options), m)
    notes = (f"{stages.num_stages} stages with uniform costs F={f} I={i} W={w}, {m} micro-batches per step",)
    return ScheduleResult(policy, replace(options, microbatches=m), num_procs, metrics, explicit=one_step,
                          stages=stages, notes=notes)

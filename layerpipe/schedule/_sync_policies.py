"""Synchronous policies on a network: the stage-level generators (`_stage_programs`) applied to contiguous stages,
timed on the interconnect the policy is given.

A network's layers are cut into S contiguous stages by dynamic programming (min-max per-step stage work
m·(F + A + E + G) + U, layers in topological order); S = p·v for p processors holding v chunks each (v = 1
for gpipe, 1f1b, zb-h1, zb-h2; `virtual_stages` for interleaved-1f1b, zb-h1 and looped-bfs; 2 for zbv and
dualpipev), with p = min(N, ⌊L/v⌋) so no stage is empty (the other processors idle). `ooo` lays its stages
out by modulo allocation instead (`_ooo.py`) and shares everything below.

Timing (`timed_step`): the step is the steady-state step time of the schedule the simulator runs — the
layer-level expansion (`expand_stages`: every layer's F, A, E, G and its per-step U) of K steps, timed on the
policy's interconnect by the array engine of this layer (`layerpipe.schedule._engine`, the one `layerpipe.sim`
times with: activations and errors between stages are transfers on links or the bus; the scheduler does not
import the simulator, a layer above it). Step k's completion C(k) is its ops' latest end; the step time is
C(k) − C(k−1) once that difference has settled: the same value for the last SETTLED steps. On shared and links
no op or transfer waits for a later step (a link carries its transfers in its sender's program order), and a
bus serves a synchronous run step after step, each in step 0's order (a compiled bus, `layerpipe.schedule._engine.
bus_order`; a dynamic bus let stages with zero-cycle work queue later steps' transfers first, so steps never
settled), so every step's difference is final; on a bus the final step is still left out, which keeps a run
the engine serves dynamically (step 0 not a prefix of every program) honest. K starts at MIN_TIMED_STEPS and
doubles up to MAX_TIMED_STEPS; a schedule whose step times still differ then gets the largest difference over
the last half and says so in its notes (not seen on the zoo nor in the generated tests). Because no step's time
depends on a later step, the runs K asks for are read off one longer run: where the steady state's 2K-step run
(`steady_state_steps`, what `layerpipe explore` simulates) is small and the caller will simulate it
(`steady_run_kept`), that run is the first one timed, and the result keeps it (`ScheduleResult.timed_run`) for the
simulator to read rather than time again (issue 14).
Because the scheduler times on the simulator's engine, `simulate` of the result gives the scheduled step by
construction, on shared, links and bus (tests/test_sync_interconnect.py), and a stage with no backward work costs
nothing there (issue 12).

Lower bound (`lower_bound_cycles`): no step of m micro-batches is shorter than its work spread evenly over
the N processors, nor than the heaviest layer's work in the step (no policy here splits a layer) — exact
fractions, not rounded to whole cycles, so no self-timed run can beat it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from layerpipe._memo import BoundedMemo
from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule import _stage_programs
from layerpipe.schedule._balance import partition_contiguous
from layerpipe.schedule._deps import StageInfo, expand_stages
from layerpipe.schedule._engine import TimedRun, compile_schedule, run_timing
from layerpipe.schedule._ir import OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stream_engine import SIM_ITERATIONS_MIN
from layerpipe.schedule._workload import Workload
from layerpipe.schedule.metrics import ScheduleMetrics, traffic_words, utilization_pct

if TYPE_CHECKING:
    from layerpipe.schedule._ooo import OOOOptions  # _ooo imports this module: annotations only

#: Steps `SyncShape.generate` returns (tests train and simulate two steps).
TIMED_STEPS = 2
#: Steps first simulated to find the steady state, and the most ever simulated. Over the zoo and random chains
#: on shared, links and bus the difference is constant from the first one on (792 of 792 cases checked over
#: 14 steps), so two equal differences are taken as settled; tests/test_sync_interconnect.py checks the
#: figure against the simulator's steady state over 8 and 16 steps on generated networks, buses included.
MIN_TIMED_STEPS = 3
MAX_TIMED_STEPS = 48
#: Consecutive equal step differences that count as the steady state.
SETTLED = 2

#: Largest step, in stage-level micro-batch slots (stages × micro-batches), that is generated and timed. The
#: step is timed on columns (no object per op) by the run sweep of the array engine: 1f1b on a 256-layer MLP at
#: N = 256 (256 stages × 512 micro-batches = 131072 slots, 1.6 M layer ops over 3 steps) takes ~3 s CPU; the
#: limit, twice that, keeps a typo from starting a minutes-long run (it was 16384 when every op was an object).
MAX_STEP_SLOTS = 262144


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
    """How a synchronous policy lays stages out: chunks per processor, the generator of `steps` steps and the
    default micro-batches per step for p processors."""

    chunks: Callable[[object], int]
    build: Callable[[int, int, object, int], OpSchedule]  # (processors, microbatches, options, steps)
    default_microbatches: Callable[[int], int] = lambda p: 2 * p

    def generate(self, procs: int, microbatches: int, options: object, steps: int = TIMED_STEPS) -> OpSchedule:
        """`steps` steps of the policy's order (`TIMED_STEPS` unless given)."""
        return self.build(procs, microbatches, options, steps)


def _virtual(o: object) -> int:
    """Chunks per processor of an interleaved shape: its policies take InterleavedOptions (ZBH1Options is one)."""
    if not isinstance(o, InterleavedOptions):
        raise TypeError(f"an interleaved shape takes InterleavedOptions, got {type(o).__name__}")
    return o.virtual_stages


SHAPES: dict[str, SyncShape] = {
    "gpipe": SyncShape(lambda o: 1, lambda p, m, o, k: _stage_programs.gpipe(p, m, k)),
    "1f1b": SyncShape(lambda o: 1, lambda p, m, o, k: _stage_programs.one_f_one_b(p, m, k)),
    "interleaved-1f1b": SyncShape(_virtual, lambda p, m, o, k: _stage_programs.interleaved_1f1b(p, m, _virtual(o), k)),
    "zb-h1": SyncShape(_virtual, lambda p, m, o, k: _stage_programs.zb_h1(p, m, _virtual(o), k)),
    "zb-h2": SyncShape(lambda o: 1, lambda p, m, o, k: _stage_programs.zb_h2(p, m, k)),
    "zbv": SyncShape(lambda o: 2, lambda p, m, o, k: _stage_programs.zbv(p, m, k)),
    # DualPipeV needs one micro-batch per stage at least (torch refuses fewer): the default 2p is that minimum.
    "dualpipev": SyncShape(lambda o: 2, lambda p, m, o, k: _stage_programs.dualpipev(p, m, k)),
    "looped-bfs": SyncShape(_virtual, lambda p, m, o, k: _stage_programs.looped_bfs(p, m, _virtual(o), k)),
}


# ------------------------------------------------------------------------------------------------ timing


def simulated_microbatches(microbatches: int) -> int:
    """Micro-batches a synchronous schedule of m = `microbatches` per step is simulated for at least: three steps,
    and SIM_ITERATIONS_MIN (`layerpipe.dse._evaluate.simulated_iterations`)."""
    return max(SIM_ITERATIONS_MIN, 3 * microbatches)


def steady_state_steps(microbatches: int) -> tuple[int, int]:
    """(K, 2K) in steps of m = `microbatches`: the two runs of a synchronous schedule whose difference
    `layerpipe.dse`'s steady state measures — `simulated_microbatches` rounded up to whole steps, and twice that.
    `synchronous_result` times its step on the 2K run when it is small."""
    k = -(-simulated_microbatches(microbatches) // microbatches)
    return k, 2 * k


#: Layer ops up to which a synchronous step is timed on the steady state's 2K run (`steady_state_steps`) rather
#: than on MIN_TIMED_STEPS steps, and the result keeps the run (`ScheduleResult.timed_run`), within
#: `steady_run_kept`: the runs of issue 14's `explore` sweep hold up to ~14k; a larger one is not kept (memory).
STEADY_RUN_OPS = 1 << 16

_KEEP_STEADY_RUN: ContextVar[bool] = ContextVar("keep_steady_run", default=False)


@contextmanager
def steady_run_kept() -> Iterator[None]:
    """Within it, a synchronous policy times its step on the steady state's 2K-step run (where that has at most
    STEADY_RUN_OPS layer ops) and keeps the run in its result for the simulator to read: for a caller that
    simulates K and 2K steps of the result next (`layerpipe.dse`'s steady state). Outside it the step is timed on
    the MIN_TIMED_STEPS steps it needs (the same step either way: `network_step`)."""
    token = _KEEP_STEADY_RUN.set(True)
    try:
        yield
    finally:
        _KEEP_STEADY_RUN.reset(token)


def _layer_ops_bound(one_step: OpSchedule, stage_layers: Sequence[Sequence[int]]) -> int:
    """At most the layer ops one step of `one_step` expands to: each stage op becomes at most three tasks (a
    backward's A, E, G) of each layer of its stage, and the step's updates one per layer."""
    widest = max((len(run) for run in stage_layers), default=0)
    return 3 * widest * sum(one_step.row_lengths()) + sum(len(run) for run in stage_layers)


def step_differences(completions: Sequence[int], interconnect: Interconnect) -> list[int]:
    """C(k) − C(k−1) for the steps whose time is final (all but the last one's on a bus)."""
    last = len(completions) - (1 if interconnect.kind == "bus" else 0)
    return [completions[k] - completions[k - 1] for k in range(1, last)]


def settled_step(completions: Sequence[int], interconnect: Interconnect) -> int | None:
    """The step time once C(k) − C(k−1) is the same for the last `SETTLED` final steps, else None."""
    tail = step_differences(completions, interconnect)[-SETTLED:]
    return tail[0] if len(tail) == SETTLED and len(set(tail)) == 1 else None


def timed_step(run: Callable[[int], Sequence[int]], interconnect: Interconnect) -> tuple[int, bool]:
    """(steady-state step time, settled?) from `run(steps)`, the completion time of each of `steps` steps."""
    steps = MIN_TIMED_STEPS + (1 if interconnect.kind == "bus" else 0)
    while True:
        completions = run(steps)
        step = settled_step(completions, interconnect)
        if step is not None:
            return step, True
        if steps >= MAX_TIMED_STEPS:
            diffs = step_differences(completions, interconnect)
            return max(diffs[len(diffs) // 2:]), False
        steps = min(2 * steps, MAX_TIMED_STEPS)


def _completions(schedule: OpSchedule, workload: Workload, interconnect: Interconnect) -> list[int]:
    """Completion time of each step of `schedule` on `interconnect`, timed by the array engine of this layer —
    what `layerpipe.sim.simulate` of the schedule reports as `SimResult.completion_times`."""
    compiled = compile_schedule(schedule, workload)
    wpc = interconnect.words_per_cycle
    _, end = run_timing(compiled, interconnect.kind, interconnect.latency,
                        1 if wpc is None else int(wpc) if wpc.denominator == 1 else wpc)
    return compiled.completion_times(end).tolist()


def network_step(build: Callable[[int], OpSchedule], graph: TrainingGraph, stages: StageInfo, model: CostModel,
                 interconnect: Interconnect, first_steps: int = MIN_TIMED_STEPS) -> tuple[int, bool, TimedRun, int]:
    """Steady-state step of the stage-level order `build(steps)` run on `graph`'s network: the simulator's engine
    times the layer-level expansion on `interconnect`. Returns (step, settled, the longest run timed, its steps).

    No run is shorter than `first_steps` steps, and a run asked for that is not longer than one timed already is
    read off it: on every interconnect here step k's ops and times are the same in any longer run (the module
    docstring; on a bus `step_differences` leaves the last step out, as it does from a run of exactly k steps), so
    the step found is the one runs of exactly the lengths `timed_step` asks for give."""
    workload = Workload.of_graph(graph, model)
    wpc = interconnect.words_per_cycle
    link = (interconnect.kind, interconnect.latency,
            1 if wpc is None else int(wpc) if wpc.denominator == 1 else wpc)
    longest: list[tuple[int, TimedRun, list[int]]] = []  # (steps, run, its completions), the longest so far

    def run(steps: int) -> Sequence[int]:
        if not longest or steps > longest[-1][0]:
            timed = max(steps, first_steps)
            compiled = compile_schedule(expand_stages(build(timed), graph, stages), workload)
            made = TimedRun.of(compiled, workload, *link)
            completions = compiled.completion_times(made.end)
            longest[:] = [(timed, replace(made, completions=completions), completions.tolist())]
        return longest[-1][2][:steps]

    step, settled = timed_step(run, interconnect)
    return step, settled, longest[-1][1], longest[-1][0]


def stage_step(build: Callable[[int], OpSchedule], costs: Sequence[tuple[int, int, int]],
               interconnect: Interconnect) -> tuple[int, bool]:
    """Steady-state step of a stage-level order with given stage costs (F, I, W) and no network: transfers
    carry no words, so on links and the bus they cost the latency only."""
    workload = Workload.of_stages(costs)

    def run(steps: int) -> Sequence[int]:
        return _completions(build(steps), workload, interconnect)

    return timed_step(run, interconnect)


# ------------------------------------------------------------------------------------------------- memos

class NetworkKey:
    """A network as a memo key: equal when the networks are equal values with the same origins (`Network`
    equality leaves the origin out), hashed on a few cheap fields (a full `Network` hash walks every layer, at
    every lookup; equal keys still compare whole)."""

    __slots__ = ("_hash", "network", "origins")

    def __init__(self, network: Network) -> None:
        self.network = network
        self.origins = _origins(network)
        self._hash = hash((network.name, network.batch, network.input_shape, len(network.layers)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NetworkKey) and self._hash == other._hash and (
            self.network is other.network or (self.network == other.network and self.origins == other.origins))


#: `training_graph`'s graphs by network value; the oldest dropped past the cap.
_GRAPHS: BoundedMemo[NetworkKey, TrainingGraph] = BoundedMemo(8)
#: `partition_contiguous`'s runs by (per-layer work, count): gpipe, 1f1b, zb-h1 and ooo's contiguous layout cut
#: the same network into the same stages at one N.
_RUNS: BoundedMemo[tuple[tuple[int, ...], int], list[list[int]]] = BoundedMemo(64)


def training_graph(network: Network) -> TrainingGraph:
    """`build_training_graph(network, GraphOptions(intra=True, inter=True))`, the graph of every synchronous
    policy and ooo, memoised on the network's value (a sweep loads the same network for every point; the
    graph is a pure function of it). A hit on another, equal `Network` object gives the graph of that object
    (`graph.network is network`, which the simulator checks to reuse the graph) with the caches already filled
    (costs per model, successors, topological order): what a fresh build would compute, computed once."""
    key = NetworkKey(network)
    found = _GRAPHS.get(key)
    if found is not None and found.network is network:
        return found
    if found is None:
        graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    else:
        graph = replace(found, network=network)  # a new object: its caches start empty, so carry them over
        graph._costs.update(found._costs)
        graph.__dict__.update({k: v for k, v in found.__dict__.items() if k not in graph.__dict__})
    _GRAPHS.add(key, graph)  # the latest object, with every cache filled so far
    return graph


def _origins(network: Network) -> tuple[object, ...]:
    """Where `network` was derived from, all the way down (`Network` equality leaves its origin out)."""
    chain: list[object] = []
    origin = network.origin
    while origin is not None:
        chain.append(origin)
        origin = origin.source.origin
    return tuple(chain)


# ----------------------------------------------------------------------------------------------- results


def contiguous_stages(network: Network, graph: TrainingGraph, model: CostModel, count: int,
                      microbatches: int) -> list[list[int]]:
    """`count` contiguous stages of `network`'s layers, balanced on per-step work m·(F + A + E + G) + U."""
    per_layer = layer_step_work(graph, model, microbatches)
    layers = [layer.index for layer in network.layers]
    key = (tuple(per_layer[i] for i in layers), count)
    runs = _RUNS.get(key)
    if runs is None:
        runs = _RUNS.add(key, partition_contiguous(list(key[0]), count))
    return [[layers[i] for i in run] for run in runs]


def layer_step_work(graph: TrainingGraph, model: CostModel, microbatches: int) -> dict[int, int]:
    """Per layer, the cycles of its work in one step of `microbatches`: m·(F + A + E + G) + U."""
    per_layer = {layer.index: 0 for layer in graph.network.layers}
    for t, c in graph.costs(model).items():
        per_layer[t.layer] += c * (1 if t.kind == "U" else microbatches)
    return per_layer


def synchronous_result(policy: str, options: SyncOptions | InterleavedOptions | OOOOptions, network: Network,
                       graph: TrainingGraph, num_procs: int,
                       model: CostModel, interconnect: Interconnect, stage_layers: Sequence[Sequence[int]],
                       step_order: OpSchedule, microbatches: int, notes: Sequence[str]
                       ) -> ScheduleResult:
    """Time the one-step order `step_order` of `stage_layers` (at most `num_procs` processors, made by a generator
    of `_stage_programs`) on `interconnect` and measure it (shared by every synchronous policy)."""
    m = microbatches
    stages = StageInfo.of_network(graph, stage_layers)
    one_step = _pad(step_order, num_procs)

    def padded(steps: int) -> OpSchedule:
        return one_step if steps == 1 else _stage_programs.repeat_step(one_step, steps)

    # Where the caller will simulate the steady state (`steady_run_kept`: `layerpipe explore`), the step is timed on
    # its 2K-step run when that run is small, and the result keeps it: the simulator then reads its times instead
    # of compiling and timing the same ops again (issue 14). Otherwise, or for a larger run, the step is timed
    # over MIN_TIMED_STEPS steps (twice as long on the 2K run, for nothing when no simulation follows).
    steady = steady_state_steps(max(one_step.microbatches, 1))[1]
    small = _KEEP_STEADY_RUN.get() and _layer_ops_bound(one_step, stage_layers) * steady <= STEADY_RUN_OPS
    step, settled, run, run_steps = network_step(padded, graph, stages, model, interconnect,
                                                 steady if small else MIN_TIMED_STEPS)
    costs = graph.costs(model)
    work = m * sum(c for t, c in costs.items() if t.kind != "U") + sum(c for t, c in costs.items() if t.kind == "U")
    bound = max(work / num_procs, max(layer_step_work(graph, model, m).values()))
    proc_of_stage = _stage_processors(one_step)
    proc_of_layer = {layer: proc_of_stage[s] for s, run in enumerate(stage_layers) for layer in run}
    placement = {t: proc_of_layer[t.layer] for t in graph.tasks}
    batch = network.batch
    metrics = ScheduleMetrics(
        cycles_per_sample=step / (m * batch),
        lower_bound_cycles=bound / (m * batch),
        utilization_pct=utilization_pct(work, num_procs, step),
        traffic_words_per_sample=traffic_words(graph, placement) / batch,
        weight_versions=1,
        max_staleness=0,
        period_cycles=step,
        samples_per_period=m * batch,
        staleness_per_layer={layer.index: 0 for layer in network.layers if layer.has_weights},
        weight_versions_per_layer={layer.index: 1 for layer in network.layers if layer.has_weights},
    )
    said = [*notes, f"step timed by the simulator on {interconnect}"]
    if not settled:
        said.append(f"step times had not settled after {MAX_TIMED_STEPS} steps: the largest of the last half")
    kept = replace(run, made_from=(one_step, stages)) if small and run_steps == steady else None
    return ScheduleResult(policy, replace(options, microbatches=m), num_procs, metrics, network,
                          graph, explicit=one_step, stages=stages, notes=tuple(said), interconnect=interconnect,
                          timed_run=kept)


def schedule_synchronous(policy: str, network: Network, num_procs: int, model: CostModel,
                         options: SyncOptions | InterleavedOptions,
                         interconnect: Interconnect = SHARED) -> ScheduleResult:
    shape = SHAPES[policy]
    chunks = shape.chunks(options)
    procs = min(num_procs, len(network) // chunks)
    if procs < 1:
        raise InputError(f"{policy}: {chunks} chunks per processor need at least {chunks} layers, "
                         f"network {network.name} has {len(network)}")
    m = options.microbatches or shape.default_microbatches(procs)
    _check_step_size(policy, procs * chunks, m)
    if policy == "dualpipev" and m < 2 * procs:  # fail before timing, with the generator's message
        _stage_programs.dualpipev(procs, m)
    graph = training_graph(network)
    stage_layers = contiguous_stages(network, graph, model, procs * chunks, m)
    notes = (f"{procs * chunks} stages on {procs} of {num_procs} processors, {m} micro-batches per step",)
    return synchronous_result(policy, options, network, graph, num_procs, model, interconnect, stage_layers,
                              shape.generate(procs, m, options, 1), m, notes)


def _pad(schedule: OpSchedule, num_procs: int) -> OpSchedule:
    """Idle rows for processors the stages do not use (columns stay columns: no `Op` is built here)."""
    if schedule.columns is not None:
        return OpSchedule.from_columns(schedule.level, schedule.columns.padded(num_procs),
                                       synchronous=schedule.synchronous, microbatches=schedule.microbatches)
    rows = schedule.procs + ((),) * (num_procs - schedule.num_procs)
    return OpSchedule(schedule.level, rows, schedule.synchronous, schedule.microbatches)


def _stage_processors(schedule: OpSchedule) -> dict[int, int]:
    """stage → the processor of its last op (of its every op: a stage runs on one processor)."""
    c = schedule.columns
    if c is None:
        return {op.unit: op.proc for op in schedule.ops()}
    units = np.asarray([unit for _, unit in c.tasks], dtype=np.int64)[c.task] if c.num_ops else np.zeros(0, np.int64)
    proc = np.repeat(np.arange(c.num_procs, dtype=np.int64), np.diff(c.bounds))
    return dict(zip(units.tolist(), proc.tolist(), strict=True))


def schedule_stages(policy: str, num_procs: int, options: object,
                    stage_cost: tuple[int, int, int], interconnect: Interconnect = SHARED) -> ScheduleResult:
    """A synchronous policy on `num_procs` processors with uniform stage costs (F, I, W) and no network:
    the torch.distributed.pipelining view (`--stages P --stage-costs F,B,W`, B the input-gradient part),
    timed by the simulator at stage level on `interconnect` (transfers of no words: latency only)."""
    if policy not in SHAPES:
        sync = ", ".join(SHAPES)
        raise InputError(f"--stages takes one of {sync}; '{policy}' needs a NETWORK")
    if not isinstance(options, (SyncOptions, InterleavedOptions)):  # as make_schedule checks a policy's options
        raise InputError(f"policy '{policy}' takes SyncOptions or InterleavedOptions, got {type(options).__name__}")
    shape = SHAPES[policy]
    chunks = shape.chunks(options)
    m = options.microbatches or shape.default_microbatches(num_procs)
    f, i, w = stage_cost
    if min(f, i) < 1 or w < 0:
        raise InputError(f"stage costs F,B,W must have F, B >= 1 and W >= 0, got {f},{i},{w}")
    _check_step_size(policy, num_procs * chunks, m)
    one_step = shape.generate(num_procs, m, options, 1)
    stages = StageInfo(num_procs * chunks)
    step, settled = stage_step(lambda k: one_step if k == 1 else _stage_programs.repeat_step(one_step, k),
                               [(f, i, w)] * stages.num_stages, interconnect)
    work = m * (f + i + w) * stages.num_stages
    metrics = ScheduleMetrics(
        cycles_per_sample=step / m,
        lower_bound_cycles=max(work / num_procs, m * (f + i + w)) / m,
        utilization_pct=utilization_pct(work, num_procs, step),
        traffic_words_per_sample=0.0,
        weight_versions=1,
        max_staleness=0,
        period_cycles=step,
        samples_per_period=m,
    )
    notes: tuple[str, ...] = (
        f"{stages.num_stages} stages with uniform costs F={f} I={i} W={w}, {m} micro-batches per step",
        f"step timed by the simulator on {interconnect}")
    if not settled:
        notes += (f"step times had not settled after {MAX_TIMED_STEPS} steps: the largest of the last half",)
    return ScheduleResult(policy, replace(options, microbatches=m), num_procs, metrics, explicit=one_step,
                          stages=stages, notes=notes, interconnect=interconnect)

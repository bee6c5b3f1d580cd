"""The `ooo` policy: Out-Of-Order BackProp's pipeline-parallel scheme (Oh et al., "Out-Of-Order BackProp: An
Effective Scheduling Technique for Deep Learning", EuroSys'22, §5 "pipeline-parallel training"), synchronous.

What the paper's scheme is, and what we model (parameters checked against the public code,
github:mlsys-seo/ooo-backprop, `expr/pipe_par/code/OOO_backprop/schedule/`):

- **Modulo layer allocation** (`DeviceAllocatorManager.get_gpu_idx_modulo`): layer l (numbered from 0 in
  topological order) goes to processor ⌊l / g⌋ mod N; a run of g consecutive layers is a "virtual layer"
  — our stage — so stage s holds layers s·g .. s·g + g − 1 and runs on processor s mod N. The code's default
  g (`--modulo_batch`) is 1.
- **Breadth-first forwards** (the code's "MODULO forward schedule" picture: `E[0]E[0]E[0]E[0][4][4][4][4]`):
  a processor runs every ready micro-batch of its earliest stage before a later stage's.
- **Gradient fast-forwarding** (`_schedule_ooo_backpropagation`): a stage's output-gradient work (our I:
  A and E of its layers) runs as soon as its input gradient arrives and is sent on; its weight-gradient work
  (W: the layers' G) waits for that send and fills the gaps. W_s(t) runs before I_s(t+1) on every stage but
  the last (`_schedule_micro_batch_race_condition`), and the last stage's W waits for its last I.
- **Contiguous allocation** (the code's "fastforward" style, `get_gpu_idx`: even contiguous runs, one per
  GPU; option `allocation="contiguous"`): fast-forwarding on the same balanced contiguous stages as `gpipe`.
- **Push** (`PUSH`, `micro_batch_cap`; option `push`): with more micro-batches than processors, at most N are
  in flight — the first stage's forward of micro-batch t ≥ N waits for its weight gradient of t − N (the
  code gates every virtual layer but the last; we gate the first, which caps the micro-batches in flight the
  same way; a single stage is the last one and is not gated: its W waits for its last I).
- **Synchronous**: one update per step of m micro-batches with the summed gradient, staleness 0 (the
  paper's pipeline scheme is GPipe's semantics with a better order). The per-step update U_s runs after
  the stage's last W.

How the order is made: a list simulation over the stage ops with the stage costs (F, I = A + E, W = G) of
the cost model and the uncontended transfer time of the activation or error words on the given
interconnect (`Interconnect.transfer_cycles`); at each decision the processor takes, among its ready ops,
first an I (or the W that gates a ready I), then an F (earliest stage, then micro-batch), then the oldest W;
idle when nothing is ready. The order is then timed like every synchronous policy, by the simulator on the
interconnect (`_sync_policies.synchronous_result`). `allocation="auto"` (the default) orders modulo allocation
with g = 1 .. ⌈L/N⌉ (or the given `group_size`) and the contiguous stages, has the simulator time the
MAX_TIMED_LAYOUTS best by the list simulation's one-step estimate and the contiguous one, and keeps the
fastest timed step (ties: the better estimate); the paper tunes g per model, the code defaults to 1. The
micro-batches per step default to gpipe's, 2·min(N, L), so the two compare step for step as the paper does.

Simplifications: TensorFlow's runtime order inside a virtual layer (layer by layer) is ours only at stage
granularity; the paper's GPU-stream overlap of communication with compute is the interconnect model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule import _stage_programs
from layerpipe.schedule._deps import StageInfo
from layerpipe.schedule._ir import OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stage_programs import StageOp
from layerpipe.schedule._sync_policies import (
    StageCost,
    _check_step_size,
    contiguous_stages,
    layer_step_work,
    synchronous_result,
)

#: Largest number of group sizes `group_size=None` tries (each one list-scheduled order).
MAX_GROUP_TRIALS = 16
#: Layouts the simulator times, the best by the list simulation's estimate (plus the contiguous one).
MAX_TIMED_LAYOUTS = 2
#: Layer allocations: modulo groups, contiguous balanced stages, or the faster of both.
ALLOCATIONS = ("auto", "modulo", "contiguous")


@dataclass(frozen=True)
class OOOOptions:
    group_size: int | None = None  #: g, consecutive layers per allocation group (None: the fastest g)
    microbatches: int | None = None  #: m per step (default 2 × the processors used)
    push: bool = False  #: at most N micro-batches in flight
    allocation: str = "auto"  #: one of ALLOCATIONS

    def __post_init__(self) -> None:
        if self.group_size is not None and (isinstance(self.group_size, bool) or self.group_size < 1):
            raise InputError(f"group_size (-g) must be >= 1, got {self.group_size}")
        if self.microbatches is not None and self.microbatches < 1:
            raise InputError(f"microbatches must be >= 1, got {self.microbatches}")
        if not isinstance(self.push, bool):
            raise InputError(f"push must be true or false, got {self.push!r}")
        if self.allocation not in ALLOCATIONS:
            raise InputError(f"allocation '{self.allocation}' is not one of {', '.join(ALLOCATIONS)}")
        if self.allocation == "contiguous" and self.group_size is not None:
            raise InputError("group_size (-g) applies to modulo allocation, not allocation 'contiguous'")


def modulo_allocation(position: int, group_size: int, num_procs: int) -> int:
    """OOO's processor of the layer at topological `position` (from 0): ⌊position / g⌋ mod N."""
    return (position // group_size) % num_procs


def modulo_stages(network: Network, group_size: int) -> list[list[int]]:
    """Runs of `group_size` consecutive layers (topological order): OOO's virtual layers, our stages."""
    layers = [layer.index for layer in network.layers]
    return [layers[k:k + group_size] for k in range(0, len(layers), group_size)]


def stage_costs(graph: TrainingGraph, model: CostModel, stage_layers: Sequence[Sequence[int]]) -> list[StageCost]:
    """F, I (A + E), W (G) per micro-batch and U per step of every stage."""
    stage_of = {layer: s for s, run in enumerate(stage_layers) for layer in run}
    out = [[0, 0, 0, 0] for _ in stage_layers]
    for t, c in graph.costs(model).items():
        out[stage_of[t.layer]][{"F": 0, "G": 2, "U": 3}.get(t.kind, 1)] += c  # the rest (A, E) is I
    return [StageCost(*row) for row in out]


def ooo_order(costs: Sequence[StageCost], num_procs: int, microbatches: int, push: bool,
              stages: StageInfo, interconnect: Interconnect) -> tuple[list[list[StageOp]], int]:
    """One step's per-processor order of stage s on processor s mod N (see the module docstring), and the
    step's makespan in the list simulation (uncontended transfers: an estimate, not the timed step)."""
    count, m = len(costs), microbatches
    proc = [s % num_procs for s in range(count)]
    end: dict[StageOp, int] = {}
    free = [0] * num_procs
    rows: list[list[StageOp]] = [[] for _ in range(num_procs)]
    nxt = {kind: [0] * count for kind in "FIW"}  # next micro-batch per kind and stage
    last = count - 1

    def arrival(producer: StageOp, words: int, here: int) -> int | None:
        done = end.get(producer)
        if done is None:
            return None
        return done if proc[producer[1]] == here else done + interconnect.transfer_cycles(words)

    def ready_time(op: StageOp) -> int | None:
        """When `op`'s inputs are in, or None if a producer has not been placed yet."""
        kind, s, t = op
        here = proc[s]
        needs: list[int | None] = []
        if kind == "F":
            if s:
                needs.append(arrival(("F", s - 1, t), stages.words_into_forward(s), here))
            if push and s == 0 < last and t >= num_procs:  # the code gates every stage but the last
                needs.append(end.get(("W", 0, t - num_procs)))
        elif kind == "I":
            needs.append(end.get(("F", s, t)))
            if s < last:
                needs.append(arrival(("I", s + 1, t), stages.words_into_backward(s), here))
                if t:
                    needs.append(end.get(("W", s, t - 1)))
        else:
            needs.append(end.get(("I", s, t) if s < last else ("I", s, m - 1)))
        known = [n for n in needs if n is not None]
        if len(known) < len(needs):
            return None
        return max([0, *known])

    def duration(op: StageOp) -> int:
        kind, s, t = op
        c = costs[s]
        base = {"F": c.forward, "I": c.input_grad, "W": c.weight_grad}[kind]
        return base + (c.update if kind == "W" and t == m - 1 else 0)  # W_s(m−1) is the stage's last: then U

    def priority(op: StageOp, gates_ready_input: bool) -> tuple[int, int, int]:
        kind, s, t = op
        if kind == "I":
            return (0, t, -s)
        if kind == "W" and gates_ready_input:
            return (0, t, -s)
        if kind == "F":
            return (1, s, t)
        return (2, t, s)

    # Each (kind, stage) has one candidate, its next micro-batch; its ready time changes only when one of its
    # producers is placed, and a processor's best candidate only when one of its candidates or its free time
    # changes, so both are cached and refreshed for what a placement touches.
    ready: dict[tuple[str, int], int | None] = {(k, s): ready_time((k, s, 0)) for s in range(count) for k in "FIW"}
    own: list[list[int]] = [[s for s in range(count) if proc[s] == p] for p in range(num_procs)]
    best_of: list[tuple[int, tuple[int, int, int], StageOp] | None] = [None] * num_procs

    def refresh(p: int) -> None:
        best = None
        for s in own[p]:
            for kind in "FIW":
                t = nxt[kind][s]
                r = ready[(kind, s)]
                if t >= m or r is None:
                    continue
                # I_s(t+1) has its input gradient and waits only for this W: the W is on the critical path.
                gates = kind == "W" and s < last and nxt["I"][s] == t + 1 and ("I", s + 1, t + 1) in end
                key = (max(r, free[p]), priority((kind, s, t), gates), (kind, s, t))
                if best is None or key < best:
                    best = key
        best_of[p] = best

    for p in range(num_procs):
        refresh(p)
    for _ in range(3 * m * count):
        (start, _, op), here = min(((best, p) for p, best in enumerate(best_of) if best is not None),
                                   key=lambda pair: (pair[0][0], pair[0][1], pair[1]))
        kind, s, _ = op
        end[op] = start + duration(op)
        free[here] = end[op]
        rows[here].append(op)
        nxt[kind][s] += 1
        touched = {(kind, s)}  # the next op of this kind and stage, and every consumer of `op`
        if kind == "F":
            touched |= {("F", s + 1), ("I", s)} if s < last else {("I", s)}
        elif kind == "I":
            touched |= {("W", s)} | ({("I", s - 1)} if s else set())
        else:
            touched |= {("I", s)} | ({("F", 0)} if push and s == 0 else set())
        dirty = {here}
        for k, u in touched:
            if u <= last and nxt[k][u] < m:
                ready[(k, u)] = ready_time((k, u, nxt[k][u]))
                dirty.add(proc[u])
        if kind == "I" and s:
            dirty.add(proc[s - 1])  # W_{s−1}'s gate looks at I_s's progress
        for p in dirty:
            refresh(p)
    return rows, max(end.values(), default=0)


def schedule_ooo(network: Network, num_procs: int, model: CostModel, options: OOOOptions,
                 interconnect: Interconnect = SHARED) -> ScheduleResult:
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    m = options.microbatches or 2 * min(num_procs, len(network))
    layouts: list[tuple[int | None, list[list[int]]]] = []
    if options.allocation != "contiguous":
        if options.group_size is not None:
            sizes = [options.group_size]
        else:
            sizes = list(range(1, min(-(-len(network) // num_procs), MAX_GROUP_TRIALS) + 1))
        layouts += [(g, modulo_stages(network, g)) for g in sizes]
    if options.allocation != "modulo":
        procs = min(num_procs, len(network))
        layouts.append((None, contiguous_stages(network, graph, model, procs, m)))
    # Every layout gets its order and the list simulation's estimate of its step; the simulator (which costs
    # far more) times the MAX_TIMED_LAYOUTS best estimates and always the contiguous layout, skipping those
    # whose busiest processor's work (a lower bound on the step) already reaches the best step timed.
    per_layer = layer_step_work(graph, model, m)

    def busiest(stage_layers: list[list[int]]) -> int:
        load = [0] * min(num_procs, len(stage_layers))
        for s, run in enumerate(stage_layers):
            load[s % len(load)] += sum(per_layer[layer] for layer in run)
        return max(load)

    planned = []
    for k, (g, stage_layers) in enumerate(layouts):
        stages = StageInfo.of_network(graph, stage_layers)
        procs = min(num_procs, len(stage_layers))
        _check_step_size("ooo", len(stage_layers), m)
        rows, estimate = ooo_order(stage_costs(graph, model, stage_layers), procs, m, options.push, stages,
                                   interconnect)
        planned.append((estimate, k, g, stage_layers, rows))
    planned.sort(key=lambda plan: (plan[0], plan[1]))
    timed = planned[:MAX_TIMED_LAYOUTS] + [plan for plan in planned[MAX_TIMED_LAYOUTS:] if plan[2] is None]
    best: ScheduleResult | None = None
    for _, _, g, stage_layers, rows in timed:
        if best is not None and busiest(stage_layers) >= best.metrics.period_cycles:
            continue
        result = _with_stages(network, graph, num_procs, model, options, interconnect, g, stage_layers, m, rows)
        if best is None or result.metrics.period_cycles < best.metrics.period_cycles:
            best = result
    assert best is not None
    return best


def _with_stages(network: Network, graph: TrainingGraph, num_procs: int, model: CostModel, options: OOOOptions,
                 interconnect: Interconnect, g: int | None, stage_layers: list[list[int]], m: int,
                 rows: list[list[StageOp]]) -> ScheduleResult:
    """OOO's order `rows` of `stage_layers` (stage s on processor s mod N), timed; `g` None for contiguous."""
    procs = min(num_procs, len(stage_layers))

    def build(steps: int) -> OpSchedule:
        return _stage_programs._schedule(rows, m, steps)

    if g is None:
        layout = f"contiguous allocation: {len(stage_layers)} balanced stages"
        chosen = replace(options, allocation="contiguous")
    else:
        layout = f"modulo allocation: {len(stage_layers)} groups of {g} layers"
        chosen = replace(options, allocation="modulo", group_size=g)
    picked = " (the fastest layout timed)" if options.allocation == "auto" or options.group_size is None else ""
    notes = (f"{layout}{picked} on {procs} of {num_procs} processors, {m} micro-batches per step"
             + (", push: at most N in flight" if options.push else ""),)
    return synchronous_result("ooo", chosen, network, graph, num_procs, model, interconnect, stage_layers,
                              build, m, notes)

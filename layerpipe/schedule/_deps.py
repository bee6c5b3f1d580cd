"""Which op needs which: the one dependency function every consumer shares (contract 1).

The validator, the timing simulator and the RTL compiler all ask `dependencies(schedule, ...)` for every op's
producers and the words each producer sends; nothing else in the project restates these rules.

Layer-level schedules (ops are DFG tasks of layer l and iteration t; needs the `TrainingGraph`):
- every DFG edge src→dst other than a weight edge: dst(t) needs src(t − delay) (the builder gives these
  edges delay 0, so this is the same iteration);
- the gradient edge G_l → U_l is precedence in the same iteration even when it carries delayed-gradient
  delays: U_l(t) applies g_l(t) and writes version t+1 (async), the delays say how late that may be;
- U_l(t) needs U_l(t−1): updates apply in iteration order (role "order", no data);
- weight edges U_l → F_l, U_l → E_l are NOT precedence in asynchronous schedules: they are version reads,
  and which version an op read is an outcome of the timing (the simulator observes it) — unless the schedule
  pins it (`OpSchedule.read_pins`, from an unrolled periodic schedule): X_l(t) pinned to s reads version
  ⌊t/g⌋ − s, so it needs U_l(⌊t/g⌋ − s − 1), which writes it, and receives |W_l| words from it.
Grouped updates (`OpSchedule.groups`, layer → g; unfolded periodic schedules: PipeDream's replicas, 2BW) are
numbered by update, not iteration: U_l(k) needs G_l(t) for every t in k·g … k·g + g − 1 (the group's summed
gradient; the last group may be cut short by the run) and U_l(k−1).
Synchronous layer-level schedules (the expansion of a stage-level schedule, below) have one update per
layer per step, and its op's `iteration` is the step index j (U_l(j) writes version j+1):
- U_l(j) needs G_l(t) for every micro-batch t of step j (the step's summed gradient) and U_l(j−1);
- a weight reader F_l(t)/E_l(t) of step j ≥ 1 needs U_l(j−1) (it reads version j);
- U_l(j) needs every weight reader of step j (role "version": they must read version j, not j+1).

Stage-level schedules (torch.distributed.pipelining's rules; stage s of S, micro-batch t):
- F_s(t) needs F_{s−1}(t) (role "activation");
- the last stage's B/I(t) needs its F(t); B/I_s(t) needs B/I_{s+1}(t) (role "error") and F_s(t) ("kept");
- W_s(t) needs I_s(t) ("kept");
- step boundaries: the update of stage s for step j is implicit — it happens on the stage's processor right
  after the stage's last gradient op (B or W) of step j. We keep it implicit (torch does too: its
  REDUCE_GRAD is a communication action, not a compute op), so the forwards of stage s in step j ≥ 1 need
  every gradient op of stage s in step j−1 (role "step", no data). The edges go to the first such forward
  on each processor; the later ones follow it in program order. `expand_stages` makes the update explicit as
  U ops when a stage-level schedule is applied to a network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.schedule._ir import Op, OpKey, OpSchedule, ScheduleError

#: Roles of dependencies that are not DFG edges.
ROLE_ORDER = "order"  # U_l(t−1) → U_l(t)
ROLE_VERSION = "version"  # a weight reader of step j → U_l(j) (write after read)
ROLE_STEP = "step"  # last gradient op of a stage's step → the stage's forwards of the next step

#: Stage-level kinds that produce a stage's weight gradient (its update waits for them).
STAGE_GRADIENT_KINDS = ("B", "W")


@dataclass(frozen=True)
class Dependency:
    """`producer` must finish before the consumer starts; it sends `words` (0 for pure ordering)."""

    producer: Op
    words: int
    role: str


@dataclass(frozen=True)
class TaskEdge:
    """A precedence between tasks at iteration distance `delay`: dst(t) needs src(t − delay)."""

    src: tuple[str, int]
    dst: tuple[str, int]
    delay: int
    words: int
    role: str


@dataclass(frozen=True)
class StageInfo:
    """What the stage-level rules need to know about the stages.

    `forward_words[s]` is what F_s(t) receives from F_{s−1}(t); `backward_words[s]` what B/I_s(t) receives
    from B/I_{s+1}(t) (both 0 when not known). `layers[s]` lists the network layers of stage s, needed only
    to expand stage ops into layer tasks.
    """

    num_stages: int
    forward_words: tuple[int, ...] = ()
    backward_words: tuple[int, ...] = ()
    layers: tuple[tuple[int, ...], ...] = ()

    def words_into_forward(self, stage: int) -> int:
        return self.forward_words[stage] if self.forward_words else 0

    def words_into_backward(self, stage: int) -> int:
        return self.backward_words[stage] if self.backward_words else 0

    @staticmethod
    def of_network(graph: TrainingGraph, stage_layers: Sequence[Sequence[int]]) -> StageInfo:
        """Stages cut from `graph`'s network: the words crossing each cut, both ways.

        With skip connections more than one tensor crosses a cut; torch forwards them through the stages
        in between, so the words into F_s are all activations produced before stage s and used at or after it.
        """
        stage_of = _stage_of_layers(graph, stage_layers)
        count = len(stage_layers)
        forward, backward = [0] * count, [0] * count
        for e in graph.edges:
            src, dst = stage_of[e.src.layer], stage_of[e.dst.layer]
            if e.role == "activation":
                for s in range(src + 1, dst + 1):
                    forward[s] += e.words
            elif e.role == "error":
                for s in range(dst, src):
                    backward[s] += e.words
        layers = tuple(tuple(sorted(ls)) for ls in stage_layers)
        return StageInfo(count, tuple(forward), tuple(backward), layers)


def _stage_of_layers(graph: TrainingGraph, stage_layers: Sequence[Sequence[int]]) -> dict[int, int]:
    stage_of: dict[int, int] = {}
    for s, layers in enumerate(stage_layers):
        for layer in layers:
            if layer in stage_of:
                raise InputError(f"stage map: layer {layer} is in stages {stage_of[layer]} and {s}")
            stage_of[layer] = s
    missing = [layer.index for layer in graph.network.layers if layer.index not in stage_of]
    if missing:
        raise InputError(f"stage map: layers {missing} are in no stage")
    return stage_of


def layer_task_edges(graph: TrainingGraph, pinned_reads: Mapping[tuple[str, int], int] | None = None
                     ) -> list[TaskEdge]:
    """The precedence edges of asynchronous layer-level schedules, per task (see the module docstring).

    Periodic schedules are checked against these directly in modulo form. `pinned_reads` are the weight
    reads an unrolled periodic schedule pins (`OpSchedule.read_staleness`): X_l(t) reading version t − s
    waits for U_l(t − s − 1), which writes it, and receives the weights (|W_l| words) from it.
    """
    pinned = pinned_reads or {}
    edges: list[TaskEdge] = []
    for e in graph.edges:
        src, dst = (e.src.kind, e.src.layer), (e.dst.kind, e.dst.layer)
        if e.role == "weights":
            if dst in pinned:
                edges.append(TaskEdge(src, dst, pinned[dst] + 1, e.words, e.role))
            continue  # otherwise a version read, not precedence
        delay = 0 if e.role == "gradient" else e.delay
        edges.append(TaskEdge(src, dst, delay, e.words, e.role))
    for t in graph.tasks:
        if t.has("U"):
            edges.append(TaskEdge((t.kind, t.layer), (t.kind, t.layer), 1, 0, ROLE_ORDER))
    return edges


def dependencies(
    schedule: OpSchedule, graph: TrainingGraph | None = None, stages: StageInfo | None = None
) -> dict[Op, tuple[Dependency, ...]]:
    """Every op's producers, with the words each sends (contract 1).

    Layer-level schedules need `graph`; stage-level ones take `stages` (default: as many stages as the
    schedule names, word counts 0). Raises `ScheduleError` when a producer is not in the schedule.
    """
    by_key: dict[OpKey, Op] = {}
    for op in schedule.ops():
        by_key.setdefault(op.key, op)
    if schedule.level == "stage":
        return _stage_dependencies(schedule, by_key, stages)
    if graph is None:
        raise InputError("layer-level schedule dependencies need the training graph")
    if schedule.synchronous:
        return _sync_layer_dependencies(schedule, by_key, graph)
    return _async_layer_dependencies(schedule, by_key, graph)


class MissingProducer(ScheduleError):
    """A consumer's producer is not in the schedule; `consumer` says who noticed."""

    def __init__(self, consumer: Op, key: OpKey) -> None:
        kind, unit, it = key
        super().__init__(f"missing op: {consumer} needs {kind}{unit}.{it}, which no processor runs", proc=consumer.proc)
        self.consumer = consumer
        self.key = key

    def __reduce__(self) -> tuple:
        return (type(self), (self.consumer, self.key))


def _lookup(by_key: Mapping[OpKey, Op], key: OpKey, consumer: Op) -> Op:
    try:
        return by_key[key]
    except KeyError:
        raise MissingProducer(consumer, key) from None


def _async_layer_dependencies(
    schedule: OpSchedule, by_key: Mapping[OpKey, Op], graph: TrainingGraph
) -> dict[Op, tuple[Dependency, ...]]:
    if not schedule.simple:
        return _grouped_layer_dependencies(schedule, by_key, graph)
    incoming: dict[tuple[str, int], list[TaskEdge]] = {}
    for e in layer_task_edges(graph, schedule.read_staleness_map()):
        incoming.setdefault(e.dst, []).append(e)
    out: dict[Op, tuple[Dependency, ...]] = {}
    for op in schedule.ops():
        deps = []
        for e in incoming.get((op.kind, op.unit), ()):
            t = op.iteration - e.delay
            if t >= 0:
                deps.append(Dependency(_lookup(by_key, (*e.src, t), op), e.words, e.role))
        out[op] = tuple(deps)
    return out


def _grouped_layer_dependencies(
    schedule: OpSchedule, by_key: Mapping[OpKey, Op], graph: TrainingGraph
) -> dict[Op, tuple[Dependency, ...]]:
    """The asynchronous rules with update groups and per-phase read pins (see the module docstring)."""
    groups, unfold, pins = schedule.groups_map(), schedule.unfold, schedule.read_pins()
    total = schedule.num_iterations
    incoming: dict[tuple[str, int], list[TaskEdge]] = {}
    for e in layer_task_edges(graph):
        incoming.setdefault(e.dst, []).append(e)
    weight_in: dict[tuple[str, int], list] = {}
    for edge in graph.edges:
        if edge.role == "weights":
            weight_in.setdefault((edge.dst.kind, edge.dst.layer), []).append(edge)
    out: dict[Op, tuple[Dependency, ...]] = {}
    for op in schedule.ops():
        deps: list[Dependency] = []
        g = groups.get(op.unit, 1)
        for e in incoming.get((op.kind, op.unit), ()):
            if e.role == ROLE_ORDER:
                if op.iteration > 0:
                    deps.append(Dependency(_lookup(by_key, (*e.src, op.iteration - 1), op), 0, e.role))
            elif e.role == "gradient":
                first = op.iteration * g
                deps += [Dependency(_lookup(by_key, (*e.src, t), op), e.words, e.role)
                         for t in range(first, min(first + g, total))]
            elif op.iteration - e.delay >= 0:
                deps.append(Dependency(_lookup(by_key, (*e.src, op.iteration - e.delay), op), e.words, e.role))
        for edge in weight_in.get((op.kind, op.unit), ()):
            stale = pins.get((op.kind, op.unit, op.iteration % unfold))
            if stale is not None and op.iteration // g - stale - 1 >= 0:
                key = (edge.src.kind, edge.src.layer, op.iteration // g - stale - 1)
                deps.append(Dependency(_lookup(by_key, key, op), edge.words, edge.role))
        out[op] = tuple(deps)
    return out


def _sync_layer_dependencies(
    schedule: OpSchedule, by_key: Mapping[OpKey, Op], graph: TrainingGraph
) -> dict[Op, tuple[Dependency, ...]]:
    m = _microbatches(schedule)
    total = schedule.num_iterations
    incoming: dict[tuple[str, int], list] = {}
    readers: dict[tuple[str, int], list] = {}  # U task → the weight edges it feeds
    for e in graph.edges:
        incoming.setdefault((e.dst.kind, e.dst.layer), []).append(e)
        if e.role == "weights":
            readers.setdefault((e.src.kind, e.src.layer), []).append(e)
    out: dict[Op, tuple[Dependency, ...]] = {}
    for op in schedule.ops():
        deps: list[Dependency] = []
        if op.kind == "U":
            j = op.iteration
            step_mbs = range(j * m, min((j + 1) * m, total))
            for e in incoming.get((op.kind, op.unit), ()):
                if e.role == "gradient":
                    src = (e.src.kind, e.src.layer)
                    deps += [Dependency(_lookup(by_key, (*src, t), op), e.words, e.role) for t in step_mbs]
            for e in readers.get((op.kind, op.unit), ()):
                reader = (e.dst.kind, e.dst.layer)
                deps += [Dependency(_lookup(by_key, (*reader, t), op), 0, ROLE_VERSION) for t in step_mbs]
            if j > 0:
                deps.append(Dependency(_lookup(by_key, (op.kind, op.unit, j - 1), op), 0, ROLE_ORDER))
        else:
            step = op.iteration // m
            for e in incoming.get((op.kind, op.unit), ()):
                if e.role == "weights":
                    if step > 0:
                        key = (e.src.kind, e.src.layer, step - 1)
                        deps.append(Dependency(_lookup(by_key, key, op), e.words, e.role))
                elif op.iteration - e.delay >= 0:
                    key = (e.src.kind, e.src.layer, op.iteration - e.delay)
                    deps.append(Dependency(_lookup(by_key, key, op), e.words, e.role))
        out[op] = tuple(deps)
    return out


def _microbatches(schedule: OpSchedule) -> int:
    if schedule.microbatches < 1:
        raise InputError(f"synchronous schedule: microbatches must be >= 1, got {schedule.microbatches}")
    return schedule.microbatches


def _stage_dependencies(
    schedule: OpSchedule, by_key: Mapping[OpKey, Op], stages: StageInfo | None
) -> dict[Op, tuple[Dependency, ...]]:
    num_stages = stages.num_stages if stages else 1 + max((op.unit for op in schedule.ops()), default=-1)
    info = stages or StageInfo(num_stages)
    m = _microbatches(schedule) if schedule.synchronous else 0
    # The gradient ops of each (stage, step): what the next step's forwards of that stage wait for. Only the
    # first forward of a (stage, step) on each processor gets these edges; the processor's later forwards of
    # that step follow it in program order anyway, so m edges per stage and step say what m² would.
    gradient_ops: dict[tuple[int, int], list[Op]] = {}
    first_forwards: set[Op] = set()
    if m:
        seen: set[tuple[int, int, int]] = set()
        for op in schedule.ops():
            if op.kind in STAGE_GRADIENT_KINDS:
                gradient_ops.setdefault((op.unit, op.iteration // m), []).append(op)
            elif op.kind == "F" and (op.unit, op.iteration // m, op.proc) not in seen:
                seen.add((op.unit, op.iteration // m, op.proc))
                first_forwards.add(op)
    out: dict[Op, tuple[Dependency, ...]] = {}
    for op in schedule.ops():
        s, t = op.unit, op.iteration
        deps: list[Dependency] = []
        if op.kind == "F":
            if s > 0:
                deps.append(Dependency(_lookup(by_key, ("F", s - 1, t), op), info.words_into_forward(s), "activation"))
            if op in first_forwards and t >= m:
                deps += [Dependency(g, 0, ROLE_STEP) for g in gradient_ops.get((s, t // m - 1), ())]
        elif op.kind in ("B", "I"):
            if s < num_stages - 1:
                later = "B" if ("B", s + 1, t) in by_key else "I"
                deps.append(Dependency(_lookup(by_key, (later, s + 1, t), op), info.words_into_backward(s), "error"))
            deps.append(Dependency(_lookup(by_key, ("F", s, t), op), 0, "kept"))
        elif op.kind == "W":
            deps.append(Dependency(_lookup(by_key, ("I", s, t), op), 0, "kept"))
        else:
            raise ScheduleError(f"op {op} on p{op.proc}: kind '{op.kind}' is not a stage-level kind (F, B, I, W)")
        out[op] = tuple(deps)
    return out


def expand_stages(schedule: OpSchedule, graph: TrainingGraph, stages: StageInfo) -> OpSchedule:
    """The layer-level synchronous schedule that runs a stage-level one on a network.

    Each stage op becomes its stage's layer tasks on the same processor: F → F_l in layer order; B → the
    backward tasks of each layer (A, E, G or the graph's fused groups) in reverse layer order; I → the
    tasks without G; W → the G tasks. The implicit per-step update becomes explicit U_l(j) ops (iteration =
    step j) right after the stage's last gradient op of step j. I/W schedules need a graph whose G is its
    own task (the `intra` split).
    """
    if schedule.level != "stage" or not schedule.synchronous:
        raise InputError("expand_stages takes a synchronous stage-level schedule")
    if len(stages.layers) != stages.num_stages:
        raise InputError("expand_stages needs the layers of every stage (StageInfo.of_network)")
    m = _microbatches(schedule)
    owner: dict[int, int] = {}
    for op in schedule.ops():
        if owner.setdefault(op.unit, op.proc) != op.proc:
            raise InputError(f"stage {op.unit} runs on p{owner[op.unit]} and p{op.proc}; expansion needs one")
    backward: dict[int, list[str]] = {}
    for t in graph.tasks:
        if not t.has("F") and not t.has("U"):
            backward.setdefault(t.layer, []).append(t.kind)
    weighted = {layer.index for layer in graph.network.layers if layer.has_weights}

    def tasks_of(op: Op) -> list[tuple[str, int]]:
        layers = stages.layers[op.unit]
        if op.kind == "F":
            return [("F", layer) for layer in layers]
        out = []
        for layer in reversed(layers):
            for kind in backward.get(layer, ()):
                if op.kind == "B" or (op.kind == "I" and "G" not in kind) or (op.kind == "W" and kind == "G"):
                    out.append((kind, layer))
                elif "G" in kind and kind != "G":
                    raise InputError(f"stage op {op.kind} needs G as its own task, but layer {layer} fuses '{kind}'")
        return out

    remaining = {}  # (stage, step) → gradient ops still to run before the update
    for op in schedule.ops():
        if op.kind in STAGE_GRADIENT_KINDS:
            key = (op.unit, op.iteration // m)
            remaining[key] = remaining.get(key, 0) + 1
    rows = []
    for p, row in enumerate(schedule.procs):
        ops: list[Op] = []
        for op in row:
            ops += [Op(p, kind, layer, op.iteration) for kind, layer in tasks_of(op)]
            if op.kind in STAGE_GRADIENT_KINDS:
                key = (op.unit, op.iteration // m)
                remaining[key] -= 1
                if remaining[key] == 0:
                    j = op.iteration // m
                    ops += [Op(p, "U", layer, j) for layer in stages.layers[op.unit] if layer in weighted]
        rows.append(tuple(ops))
    return OpSchedule("layer", tuple(rows), synchronous=True, microbatches=m)

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
from typing import TYPE_CHECKING, NoReturn

from layerpipe._memo import BoundedMemo
from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.schedule._ir import Op, OpColumns, OpKey, OpSchedule, ScheduleError

if TYPE_CHECKING:  # numpy loads when arrays are built, not at import (the CLI's parser imports this package)
    import numpy as np

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
                     ) -> tuple[TaskEdge, ...]:
    """The precedence edges of asynchronous layer-level schedules, per task (see the module docstring).

    Periodic schedules are checked against these directly in modulo form. `pinned_reads` are the weight
    reads an unrolled periodic schedule pins (`OpSchedule.read_staleness`): X_l(t) reading version t − s
    waits for U_l(t − s − 1), which writes it, and receives the weights (|W_l| words) from it.

    Memoised by the graph and the pins (a pure function of both): every compile, unfolding and task table of a
    graph reads them, a frozen `TaskEdge` made per edge each time (issue 14).
    """
    key = (graph, tuple(sorted((pinned_reads or {}).items())))
    found = _TASK_EDGES.get(key)
    if found is None:
        found = _TASK_EDGES.add(key, tuple(_layer_task_edges(graph, dict(key[1]))))
    return found


#: `layer_task_edges`' memo.
_TASK_EDGES: BoundedMemo[tuple[object, ...], tuple[TaskEdge, ...]] = BoundedMemo(32)


def _layer_task_edges(graph: TrainingGraph, pinned: Mapping[tuple[str, int], int]) -> list[TaskEdge]:
    """`layer_task_edges` without its memo."""
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
        by_key.setdefault((op.kind, op.unit, op.iteration), op)  # `op.key`, without a property call per op
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


def _missing(consumer: Op, key: OpKey) -> NoReturn:
    raise MissingProducer(consumer, key)


def _dependency(producer: Op, words: int, role: str) -> Dependency:
    """`Dependency(producer, words, role)` without the frozen dataclass's `object.__setattr__` per field (as
    `_periodic.make_slot` makes slots): the rules make one to three per op of every schedule validated."""
    made = object.__new__(Dependency)
    state = made.__dict__
    state["producer"], state["words"], state["role"] = producer, words, role
    return made


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
                deps.append(_dependency(_lookup(by_key, (*e.src, t), op), e.words, e.role))
        out[op] = tuple(deps)
    return out


def _incoming(graph: TrainingGraph) -> tuple[dict[tuple[str, int], list[TaskEdge]], dict[tuple[str, int], list]]:
    """Per consumer task (kind, layer): its layer-level edges, and its weight edges (the grouped rules of both
    the op-by-op and the array path read these)."""
    incoming: dict[tuple[str, int], list[TaskEdge]] = {}
    for e in layer_task_edges(graph):
        incoming.setdefault(e.dst, []).append(e)
    weight_in: dict[tuple[str, int], list] = {}
    for edge in graph.edges:
        if edge.role == "weights":
            weight_in.setdefault((edge.dst.kind, edge.dst.layer), []).append(edge)
    return incoming, weight_in


def _grouped_layer_dependencies(
    schedule: OpSchedule, by_key: Mapping[OpKey, Op], graph: TrainingGraph
) -> dict[Op, tuple[Dependency, ...]]:
    """The asynchronous rules with update groups and per-phase read pins (see the module docstring)."""
    groups, unfold, pins = schedule.groups_map(), schedule.unfold, schedule.read_pins()
    total = schedule.num_iterations
    incoming, weight_in = _incoming(graph)
    out: dict[Op, tuple[Dependency, ...]] = {}
    for op in schedule.ops():
        deps: list[Dependency] = []
        g = groups.get(op.unit, 1)
        for e in incoming.get((op.kind, op.unit), ()):
            if e.role == ROLE_ORDER:
                if op.iteration > 0:
                    deps.append(_dependency(_lookup(by_key, (*e.src, op.iteration - 1), op), 0, e.role))
            elif e.role == "gradient":
                first = op.iteration * g
                deps += [_dependency(_lookup(by_key, (*e.src, t), op), e.words, e.role)
                         for t in range(first, min(first + g, total))]
            elif op.iteration - e.delay >= 0:
                deps.append(_dependency(_lookup(by_key, (*e.src, op.iteration - e.delay), op), e.words, e.role))
        for edge in weight_in.get((op.kind, op.unit), ()):
            stale = pins.get((op.kind, op.unit, op.iteration % unfold))
            if stale is not None and op.iteration // g - stale - 1 >= 0:
                key = (edge.src.kind, edge.src.layer, op.iteration // g - stale - 1)
                deps.append(_dependency(_lookup(by_key, key, op), edge.words, edge.role))
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
                    deps += [_dependency(_lookup(by_key, (*src, t), op), e.words, e.role) for t in step_mbs]
            for e in readers.get((op.kind, op.unit), ()):
                reader = (e.dst.kind, e.dst.layer)
                deps += [_dependency(_lookup(by_key, (*reader, t), op), 0, ROLE_VERSION) for t in step_mbs]
            if j > 0:
                deps.append(_dependency(_lookup(by_key, (op.kind, op.unit, j - 1), op), 0, ROLE_ORDER))
        else:
            step = op.iteration // m
            for e in incoming.get((op.kind, op.unit), ()):
                if e.role == "weights":
                    if step > 0:
                        key = (e.src.kind, e.src.layer, step - 1)
                        deps.append(_dependency(_lookup(by_key, key, op), e.words, e.role))
                elif op.iteration - e.delay >= 0:
                    key = (e.src.kind, e.src.layer, op.iteration - e.delay)
                    deps.append(_dependency(_lookup(by_key, key, op), e.words, e.role))
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
    # (stage, step, processor) → that first forward; asked by key, as hashing an `Op` (a dataclass whose hash
    # is rebuilt on every call) costs several times a tuple of ints.
    first_forward: dict[tuple[int, int, int], Op] = {}
    if m:
        for op in schedule.ops():
            if op.kind in STAGE_GRADIENT_KINDS:
                gradient_ops.setdefault((op.unit, op.iteration // m), []).append(op)
            elif op.kind == "F":
                first_forward.setdefault((op.unit, op.iteration // m, op.proc), op)
    # Every op has one to three producers of fixed roles: each tuple is built at once, each `Dependency` by
    # `_dependency` (this runs on every op of every explicit schedule validated).
    out: dict[Op, tuple[Dependency, ...]] = {}
    dep, find = _dependency, by_key.get
    for op in schedule.ops():
        kind, s, t = op.kind, op.unit, op.iteration
        if kind == "F":
            if s > 0:
                producer = find(("F", s - 1, t)) or _missing(op, ("F", s - 1, t))
                deps: tuple[Dependency, ...] = (dep(producer, info.words_into_forward(s), "activation"),)
            else:
                deps = ()
            # The first forward of its (stage, step, processor) — or one equal to it: same key, same iteration.
            if t >= m and m and first_forward[(s, t // m, op.proc)].iteration == t:
                deps += tuple(dep(g, 0, ROLE_STEP) for g in gradient_ops.get((s, t // m - 1), ()))
        elif kind == "B" or kind == "I":
            if s < num_stages - 1:
                later = find(("B", s + 1, t)) or find(("I", s + 1, t)) or _missing(op, ("I", s + 1, t))
                error = dep(later, info.words_into_backward(s), "error")
                deps = (error, dep(find(("F", s, t)) or _missing(op, ("F", s, t)), 0, "kept"))
            else:
                deps = (dep(find(("F", s, t)) or _missing(op, ("F", s, t)), 0, "kept"),)
        elif kind == "W":
            deps = (dep(find(("I", s, t)) or _missing(op, ("I", s, t)), 0, "kept"),)
        else:
            raise ScheduleError(f"op {op} on p{op.proc}: kind '{kind}' is not a stage-level kind (F, B, I, W)")
        out[op] = deps
    return out


def expand_stages(schedule: OpSchedule, graph: TrainingGraph, stages: StageInfo) -> OpSchedule:
    """The layer-level synchronous schedule that runs a stage-level one on a network.

    Each stage op becomes its stage's layer tasks on the same processor: F → F_l in layer order; B → the
    backward tasks of each layer (A, E, G or the graph's fused groups) in reverse layer order; I → the
    tasks without G; W → the G tasks. The implicit per-step update becomes explicit U_l(j) ops (iteration =
    step j) right after the stage's last gradient op of step j. I/W schedules need a graph whose G is its
    own task (the `intra` split).

    Built as columns (`OpColumns`, no `Op` per layer task): each stage task (kind, stage) has a template of
    layer tasks, and a stage's last gradient op of a step the same template followed by the stage's updates.
    """
    import numpy as np

    from layerpipe.schedule._int_lists import stable_argsort

    if schedule.level != "stage" or not schedule.synchronous:
        raise InputError("expand_stages takes a synchronous stage-level schedule")
    if len(stages.layers) != stages.num_stages:
        raise InputError("expand_stages needs the layers of every stage (StageInfo.of_network)")
    m = _microbatches(schedule)
    columns = schedule.as_columns()
    n = columns.num_ops
    bounds = np.asarray(columns.bounds, dtype=np.int64)
    if schedule.columns is not None:
        proc = np.repeat(np.arange(columns.num_procs, dtype=np.int64), np.diff(bounds))
    else:  # the processor each op names (the expansion puts its tasks on the row that lists it)
        proc = np.fromiter((op.proc for op in schedule.ops()), np.int64, n)
    units = np.asarray([unit for _, unit in columns.tasks], dtype=np.int64)
    unit = units[columns.task] if n else np.zeros(0, dtype=np.int64)
    iteration = np.asarray(columns.iteration, dtype=np.int64)
    if n:  # every stage on one processor: the first op of a stage on another processor than its first
        span = int(unit.max()) + 1
        owner = np.full(span, -1, dtype=np.int64)
        firsts = np.unique(unit, return_index=True)
        owner[firsts[0]] = proc[firsts[1]]
        moved = np.flatnonzero(owner[unit] != proc)
        if len(moved):
            i = int(moved[0])
            raise InputError(f"stage {int(unit[i])} runs on p{int(owner[unit[i]])} and p{int(proc[i])}; "
                             "expansion needs one")
    backward: dict[int, list[str]] = {}
    for t in graph.tasks:
        if not t.has("F") and not t.has("U"):
            backward.setdefault(t.layer, []).append(t.kind)
    weighted = {layer.index for layer in graph.network.layers if layer.has_weights}

    def tasks_of(kind: str, stage: int) -> list[tuple[str, int]]:
        layers = stages.layers[stage]
        if kind == "F":
            return [("F", layer) for layer in layers]
        out = []
        for layer in reversed(layers):
            for task_kind in backward.get(layer, ()):
                if kind == "B" or (kind == "I" and "G" not in task_kind) or (kind == "W" and task_kind == "G"):
                    out.append((task_kind, layer))
                elif "G" in task_kind and task_kind != "G":
                    raise InputError(f"stage op {kind} needs G as its own task, but layer {layer} fuses '{task_kind}'")
        return out

    # The last gradient op (B, W) of each (stage, step), in op order: the stage's updates follow it.
    gradient = np.asarray([kind in STAGE_GRADIENT_KINDS for kind, _ in columns.tasks], dtype=bool)
    grads = np.flatnonzero(gradient[columns.task]) if n else np.zeros(0, dtype=np.int64)
    last = np.zeros(n, dtype=bool)
    if len(grads):
        key = unit[grads] * (int(iteration.max()) // m + 1) + iteration[grads] // m
        rev = np.unique(key[::-1], return_index=True)[1]
        last[grads[len(grads) - 1 - rev]] = True
    # Templates: (stage task, followed by the updates?) → layer tasks; numbered in order of first use, as the
    # op-by-op expansion met them (so a fused-G error names the first such stage op).
    template_of = columns.task * 2 + last
    used, first_use = np.unique(template_of, return_index=True)
    layer_task_id: dict[tuple[str, int], int] = {}
    lengths = np.zeros(2 * len(columns.tasks), dtype=np.int64)
    flat_task: list[int] = []
    flat_update: list[bool] = []
    starts = np.zeros(2 * len(columns.tasks), dtype=np.int64)
    known: dict[int, list[tuple[str, int]]] = {}
    for tmpl in used[stable_argsort(first_use)].tolist():
        kind, stage = columns.tasks[tmpl // 2]
        tasks = known.get(tmpl // 2)
        if tasks is None:
            tasks = known[tmpl // 2] = tasks_of(kind, stage)
        updates = [("U", layer) for layer in stages.layers[stage] if layer in weighted] if tmpl % 2 else []
        starts[tmpl] = len(flat_task)
        lengths[tmpl] = len(tasks) + len(updates)
        flat_task += [layer_task_id.setdefault(t, len(layer_task_id)) for t in (*tasks, *updates)]
        flat_update += [False] * len(tasks) + [True] * len(updates)
    counts = lengths[template_of]
    owner_op, offset = _expand(counts)
    at = starts[template_of][owner_op] + offset
    is_update = np.asarray(flat_update, dtype=bool)[at]
    its = iteration[owner_op]
    out_iteration = np.where(is_update, its // m, its)
    out_bounds = np.concatenate(([0], np.cumsum(counts)))[bounds]  # layer ops before each processor's first
    expanded = OpColumns(tuple(out_bounds.tolist()), tuple(layer_task_id),
                         np.asarray(flat_task, dtype=np.int64)[at], out_iteration)
    return OpSchedule.from_columns("layer", expanded, synchronous=True, microbatches=m)


# --- the same rules as arrays -------------------------------------------------------------------------------
#
# `dependency_arrays` lists exactly what `dependencies()` lists — the same producers with the same words and
# roles, in the same order per consumer — as numpy arrays over the ops numbered in `schedule.ops()` order, with
# no object per edge (issue 14: one `Dependency` per edge was 76–82 % of a stage-level `simulate()`). Each
# task's rules become rows of a rule table, a task's rows in dependency order. Row r turns a consumer op of its
# task at iteration `it` into producers src(base + k), k = 0 … count − 1, where base = (it // div) · mul − off
# and count = 1, or min(cap, total − base) when cap > 0 (a step's or an update group's micro-batches), and only
# when base ≥ 0 and it mod `mod` = `phase` (a read pin of one phase). Where src has no op at that iteration the
# row's `alt` task is tried (stage level: B or I). The stage rules' step edges (a stage's gradient ops of the
# previous step) are lists, not rows: they are built apart and merged in after the rows' dependencies.
# Where a producer is missing, or the schedule is outside what the arrays cover, the result is None and the
# caller asks `dependencies()`, which raises the error it always raised.

#: Largest (tasks × iterations) lookup table `dependency_arrays` builds (beyond it: None, op by op instead).
MAX_INDEX_CELLS = 50_000_000


@dataclass(frozen=True, eq=False)
class DependencyArrays:
    """Producers per consumer as CSR: consumer i's are `producer[ptr[i]:ptr[i+1]]`, each sending `words` with
    role `roles[role]`. Roles are numbered in order of first appearance (consumer order, then dependency
    order), as a walk over `dependencies()`'s map in op order numbers them."""

    ptr: np.ndarray
    producer: np.ndarray
    words: np.ndarray
    role: np.ndarray  #: int8 codes into `roles`
    roles: tuple[str, ...]


#: The columns of a rule row (see above); `task` is the consumer task, `src`/`alt` producer tasks (−1: none).
_RULE_COLUMNS = ("task", "src", "alt", "div", "mul", "off", "cap", "mod", "phase", "words", "role")


class _Rules:
    """The rule table under construction, over the tasks of the schedule (`task_id`)."""

    def __init__(self, tasks: Sequence[tuple[str, int]]) -> None:
        self.task_id = {t: k for k, t in enumerate(tasks)}
        self.rows: list[tuple[int, ...]] = []
        self.role_names: list[str] = []
        self._role_ids: dict[str, int] = {}  # role → its index in role_names (no list search per row)
        self._table: np.ndarray | None = None

    def add(self, task: int, src: tuple[str, int], words: int, role: str, *, div: int = 1, mul: int = 1,
            off: int = 0, cap: int = 0, mod: int = 1, phase: int = 0, alt: tuple[str, int] | None = None) -> None:
        code = self._role_ids.get(role)
        if code is None:
            code = self._role_ids[role] = len(self.role_names)
            self.role_names.append(role)
        alt_id = self.task_id.get(alt, -1) if alt is not None else -1
        self.rows.append((task, self.task_id.get(src, -1), alt_id, div, mul, off, cap, mod, phase, words, code))
        self._table = None

    def table(self) -> np.ndarray:
        """The rows as an int64 array (one column per `_RULE_COLUMNS` name), made once per set of rows."""
        import numpy as np

        if self._table is None:
            self._table = np.asarray(self.rows, dtype=np.int64).reshape(-1, len(_RULE_COLUMNS))
        return self._table


def dependency_arrays(schedule: OpSchedule, tasks: Sequence[tuple[str, int]], task: np.ndarray,
                      iteration: np.ndarray, graph: TrainingGraph | None = None,
                      stages: StageInfo | None = None) -> DependencyArrays | None:
    """`dependencies(schedule, graph, stages)` as arrays (see above), for stage-level, synchronous layer-level
    and grouped (unfolded) asynchronous layer-level schedules. Op i of `schedule.ops()` is task
    `tasks[task[i]]` at iteration `iteration[i]`; no two ops may share a (task, iteration). None when the
    arrays do not apply: a missing producer, a kind the rules do not know, a negative iteration, a lookup table
    over `MAX_INDEX_CELLS`, a simple asynchronous schedule (it has its own array path)."""
    import numpy as np

    from layerpipe.schedule._int_lists import INT32_MAX, stable_argsort

    n = len(task)
    if n and int(iteration.min()) < 0:
        return None
    span = int(iteration.max()) + 1 if n else 0
    if len(tasks) * span > MAX_INDEX_CELLS:
        return None
    rules = _Rules(tasks)
    steps: tuple[np.ndarray, np.ndarray] | None = None
    if schedule.level == "stage":
        made = _stage_rules(schedule, rules, tasks, task, iteration, stages)
        if made is None:
            return None
        total, steps = made
    elif graph is None:
        return None
    elif schedule.synchronous:
        m = _microbatches(schedule)
        updates = np.asarray([kind == "U" for kind, _ in tasks], dtype=bool)[task] if n else np.zeros(0, bool)
        total = int(iteration[~updates].max()) + 1 if (~updates).any() else 0
        rules = _sync_rules_of(graph, m, tasks)
    elif schedule.simple or schedule.unfold < 1 or any(g < 1 for _, g in schedule.groups):
        return None
    else:
        total = span
        _grouped_rules(schedule, rules, graph)
    # Op numbers as int32 where they fit (issue 14: the producers and the table are the compile step's peak).
    index = np.full((len(tasks), span), -1, dtype=np.int32 if n < INT32_MAX else np.int64)
    index[task, iteration] = np.arange(n, dtype=np.int64)
    counts, producer, words, role = _apply(rules, len(tasks), task, iteration, index, total)
    if steps is not None and len(steps[0]):
        consumer = np.repeat(np.arange(n, dtype=np.int64), counts)
        consumer = np.concatenate([consumer, steps[0]])
        producer = np.concatenate([producer, steps[1]])
        words = np.concatenate([words, np.zeros(len(steps[0]), dtype=np.int64)])
        step_role = len(rules.role_names)
        rules.role_names.append(ROLE_STEP)
        role = np.concatenate([role, np.full(len(steps[0]), step_role, dtype=np.int8)])
        order = stable_argsort(consumer)  # a forward's activation, then its step edges
        producer, words, role = producer[order], words[order], role[order]
        counts = np.bincount(consumer, minlength=n)
    if (producer < 0).any():
        return None
    # Number the roles by first appearance, as the op-by-op walk does.
    present = np.bincount(role, minlength=len(rules.role_names)).nonzero()[0].tolist() if len(role) else []
    first = {r: int(np.argmax(role == r)) for r in present}
    ranked = sorted(first, key=first.__getitem__)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    names = tuple(rules.role_names[r] for r in ranked)
    if ranked == list(range(len(ranked))):  # numbered so already: the codes stand
        return DependencyArrays(ptr, producer, words, role.astype(np.int8, copy=False), names)
    code = np.zeros(len(rules.role_names), dtype=np.int8)
    code[ranked] = np.arange(len(ranked))
    return DependencyArrays(ptr, producer, words, code[role], names)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts c_0, c_1, …: the owner j and the offset k < c_j of every one of the Σc items, in order."""
    import numpy as np

    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(len(owner), dtype=np.int64) - starts[owner]


#: Consumer ops per block of `_apply`: its per-(consumer, rule) arrays stay this many ops long, whatever the run.
APPLY_BLOCK = 8192


def _apply(rules: _Rules, num_tasks: int, task: np.ndarray, iteration: np.ndarray, index: np.ndarray,
           total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(producers per consumer, producer, words, role code) of every dependency the rule rows give,
    consumer-major, each consumer's in row order; producer −1 where it is missing. Consumers are taken in blocks
    of `APPLY_BLOCK` ops, so the intermediate arrays (several per consumer and rule) do not grow with the run
    (issue 14: memory per op)."""
    import numpy as np

    from layerpipe.schedule import _native
    from layerpipe.schedule._int_lists import INT32_MAX, INT32_MIN

    table = rules.table()
    col = {name: table[:, k] for k, name in enumerate(_RULE_COLUMNS)}
    # Producers in `index`'s type and words as int32 where every rule's fit: 9 bytes per dependency, not 17,
    # in the blocks and in their concatenation (issue 14: memory per op).
    fits = not len(table) or (int(col["words"].min()) >= INT32_MIN
                              and int(col["words"].max()) <= INT32_MAX)
    words_of = col["words"].astype(np.int32) if fits else col["words"]
    per_task = np.bincount(col["task"], minlength=num_tasks)
    first_row = per_task.cumsum() - per_task  # rows are added task by task
    # Which of div, mul, off, cap, mod hold their neutral value in every row (one comparison of the five columns).
    neutral = (table[:, 3:8] == (1, 1, 0, 0, 1)).all(axis=0).tolist() if len(table) else [True] * 5
    trivial = dict(zip(("div", "mul", "off", "cap", "mod"), neutral, strict=True))
    native = _native.apply_rules(task, iteration, first_row, per_task, table, total, not trivial["mod"], index)
    if native is not None:  # the same entries from C (`_kernels.c`), in these types
        counts, producer, words, role = native
        return counts, producer.astype(index.dtype), words.astype(words_of.dtype), role.astype(np.int8)
    has_alt = bool((col["alt"] >= 0).any())
    span = index.shape[1]
    flat = index.reshape(-1)
    n = len(task)
    counts = np.zeros(n, dtype=np.int64)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for lo in range(0, n, APPLY_BLOCK):
        block_task, it_block = task[lo:lo + APPLY_BLOCK], iteration[lo:lo + APPLY_BLOCK]
        # Each consumer's rows are its task's, consecutive from first_row: rows and iterations repeated per
        # consumer, without an array of owners and offsets (`_expand`) where the rows are enough.
        many = per_task[block_task]
        before = many.cumsum()
        before -= many
        row = (first_row[block_task] - before).repeat(many)
        row += np.arange(len(row), dtype=np.int64)
        it = it_block.repeat(many)
        base = it if trivial["div"] else it // col["div"][row]
        if not trivial["mul"]:
            base = base * col["mul"][row]
        if not trivial["off"]:
            base = base - col["off"][row]
        live = base >= 0
        if not trivial["mod"]:
            live &= it % col["mod"][row] == col["phase"][row]
        if trivial["cap"] and live.all():  # one producer per (consumer, row): the pairs are the rows themselves
            pair, t = None, base
        else:
            if trivial["cap"]:
                count = np.ones(len(row), dtype=np.int64)
            else:
                cap = col["cap"][row]
                count = np.where(cap > 0, np.minimum(cap, total - base), 1)
            pair, k = _expand(np.where(live, np.maximum(count, 0), 0))
            row, t = row[pair], base[pair] + k
        # Looked up in the flat table with `where` rather than masked 2-D indexing (half the time): slot 0 stands
        # in where the row has no such task or iteration, and its value is not taken.
        src = col["src"][row]
        found = (src >= 0) & (t < span)
        producer = np.where(found, flat[np.where(found, src * span + t, 0)], -1).astype(index.dtype, copy=False)
        if has_alt:  # where src has no op at that iteration, the row's alternative task
            src = col["alt"][row]
            found = (producer < 0) & (src >= 0) & (t < span)
            producer = np.where(found, flat[np.where(found, src * span + t, 0)], producer)
        if pair is None:
            counts[lo:lo + APPLY_BLOCK] = many
        else:
            cons = np.repeat(np.arange(len(block_task), dtype=np.int64), many)
            counts[lo:lo + APPLY_BLOCK] = np.bincount(cons[pair], minlength=len(block_task))
        parts.append((producer, words_of[row], col["role"][row].astype(np.int8)))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return counts, empty, empty.copy(), empty.astype(np.int8)
    if len(parts) == 1:
        return counts, *parts[0]
    return counts, *(np.concatenate([part[k] for part in parts]) for k in range(3))  # type: ignore[return-value]


def _sync_rules_of(graph: TrainingGraph, m: int, tasks: Sequence[tuple[str, int]]) -> _Rules:
    """`_sync_rules` over `tasks`, memoised: a synchronous policy's scheduler times one step and the simulator
    runs many, with the same graph, micro-batches and tasks (issue 14). Read only: `dependency_arrays` adds step
    edges' role to stage-level rules alone."""
    key = (graph, m, tuple(tasks))
    found = _SYNC_RULES.get(key)
    if found is None:
        found = _Rules(key[2])
        _sync_rules(found, graph, m)
        _SYNC_RULES.add(key, found)
    return found


#: `_sync_rules_of`'s tables.
_SYNC_RULES: BoundedMemo[tuple[object, ...], _Rules] = BoundedMemo(16)


def _sync_rules(rules: _Rules, graph: TrainingGraph, m: int) -> None:
    """`_sync_layer_dependencies` as rows."""
    incoming: dict[tuple[str, int], list] = {}
    readers: dict[tuple[str, int], list] = {}
    for e in graph.edges:
        incoming.setdefault((e.dst.kind, e.dst.layer), []).append(e)
        if e.role == "weights":
            readers.setdefault((e.src.kind, e.src.layer), []).append(e)
    for k, (kind, unit) in enumerate(rules.task_id):
        if kind == "U":
            for e in incoming.get((kind, unit), ()):
                if e.role == "gradient":  # every micro-batch of step j: j·m … j·m + m − 1 (< total)
                    rules.add(k, (e.src.kind, e.src.layer), e.words, e.role, mul=m, cap=m)
            for e in readers.get((kind, unit), ()):
                rules.add(k, (e.dst.kind, e.dst.layer), 0, ROLE_VERSION, mul=m, cap=m)
            rules.add(k, (kind, unit), 0, ROLE_ORDER, off=1)
        else:
            for e in incoming.get((kind, unit), ()):
                if e.role == "weights":  # U_l(step − 1)
                    rules.add(k, (e.src.kind, e.src.layer), e.words, e.role, div=m, off=1)
                else:
                    rules.add(k, (e.src.kind, e.src.layer), e.words, e.role, off=e.delay)


def _grouped_rules(schedule: OpSchedule, rules: _Rules, graph: TrainingGraph) -> None:
    """`_grouped_layer_dependencies` as rows: a read pin of phase q is a row of `mod` J and `phase` q."""
    groups, unfold, pins = schedule.groups_map(), schedule.unfold, schedule.read_pins()
    incoming, weight_in = _incoming(graph)
    for k, (kind, unit) in enumerate(rules.task_id):
        g = groups.get(unit, 1)
        for e in incoming.get((kind, unit), ()):
            if e.role == ROLE_ORDER:
                rules.add(k, e.src, 0, e.role, off=1)
            elif e.role == "gradient":  # the group's iterations u·g … u·g + g − 1 (< total)
                rules.add(k, e.src, e.words, e.role, mul=g, cap=g)
            else:
                rules.add(k, e.src, e.words, e.role, off=e.delay)
        for edge in weight_in.get((kind, unit), ()):
            for q in range(unfold):
                stale = pins.get((kind, unit, q))
                if stale is not None:  # X(t) of phase q reads version ⌊t/g⌋ − s: U(⌊t/g⌋ − s − 1) writes it
                    rules.add(k, (edge.src.kind, edge.src.layer), edge.words, edge.role, div=g, off=stale + 1,
                              mod=unfold, phase=q)


def _stage_rules(schedule: OpSchedule, rules: _Rules, tasks: Sequence[tuple[str, int]], task: np.ndarray,
                 iteration: np.ndarray, stages: StageInfo | None
                 ) -> tuple[int, tuple[np.ndarray, np.ndarray]] | None:
    """`_stage_dependencies` as rows, and its step edges as (consumer, producer) arrays; None where the
    op-by-op rules would raise (a kind that is not F, B, I, W; a stage without word counts)."""
    import numpy as np

    from layerpipe.schedule._int_lists import stable_argsort

    units = [unit for _, unit in tasks]
    if any(kind not in ("F", "B", "I", "W") for kind, _ in tasks) or min(units, default=0) < 0:
        return None
    num_stages = stages.num_stages if stages else 1 + max(units, default=-1)
    info = stages or StageInfo(num_stages)
    for kind, s in tasks:
        if kind == "F" and s > 0 and info.forward_words and s >= len(info.forward_words):
            return None
        if kind in ("B", "I") and s < num_stages - 1 and info.backward_words and s >= len(info.backward_words):
            return None
    m = _microbatches(schedule) if schedule.synchronous else 0
    for k, (kind, s) in enumerate(tasks):
        if kind == "F":
            if s > 0:
                rules.add(k, ("F", s - 1), info.words_into_forward(s), "activation")
        elif kind in ("B", "I"):
            if s < num_stages - 1:
                rules.add(k, ("B", s + 1), info.words_into_backward(s), "error", alt=("I", s + 1))
            rules.add(k, ("F", s), 0, "kept")
        else:
            rules.add(k, ("I", s), 0, "kept")
    empty = np.zeros(0, dtype=np.int64)
    n = len(task)
    if not m or not n or int(iteration.max()) < m:  # asynchronous, or one step: no step edges
        return 0, (empty, empty)
    # Step edges: the first forward of (stage, step j ≥ 1) on each processor needs every gradient op (B, W) of
    # the stage in step j − 1, in op order.
    kinds = [kind for kind, _ in tasks]
    unit = np.asarray(units, dtype=np.int64)[task]
    step = iteration // m
    num_steps = int(step.max()) + 1
    proc = np.repeat(np.arange(schedule.num_procs, dtype=np.int64), schedule.row_lengths())
    gradient = np.flatnonzero(np.asarray([kind in ("B", "W") for kind in kinds], dtype=bool)[task])
    g_key = unit[gradient] * num_steps + step[gradient]
    by_key = stable_argsort(g_key)
    g_sorted, g_ops = g_key[by_key], gradient[by_key]
    forwards = np.flatnonzero(np.asarray([kind == "F" for kind in kinds], dtype=bool)[task])
    f_key = (unit[forwards] * num_steps + step[forwards]) * schedule.num_procs + proc[forwards]
    _, first = np.unique(f_key, return_index=True)
    heads = np.sort(forwards[first])
    heads = heads[iteration[heads] >= m]
    want = unit[heads] * num_steps + step[heads] - 1
    lo = np.searchsorted(g_sorted, want, side="left")
    hi = np.searchsorted(g_sorted, want, side="right")
    owner, offset = _expand(hi - lo)
    return 0, (heads[owner], g_ops[lo[owner] + offset])

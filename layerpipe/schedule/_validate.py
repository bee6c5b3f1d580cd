"""The one validator for every schedule, and a minimal dry-run timing used by it.

`validate(schedule, ...)` checks an explicit `OpSchedule` or a `PeriodicSchedule` against the rules of design
notes §5 and raises `ScheduleError` on the first fault: one summary line (what the CLI prints) and a
step × processor grid with the failing step marked (`>>` in the margin, the failing cell in brackets).

Explicit schedules: structure (kinds and units legal, each op on the row of its processor), counts (every
task of every iteration exactly once, on exactly one processor), precedence (the per-processor orders
together with `dependencies` admit an execution: no deadlock, no op before its producer on its own
processor; synchronous steps are linked through their weight versions by the dependency rules), and for
asynchronous layer-level schedules an optional staleness bound under the dry-run timing.

Periodic schedules: lags and starts ≥ 0, counts (every task of the graph in exactly one body — J copies,
phases 0..J−1, when unfolded by J; J/g copies of the update of a layer with group g), no overlap on a
processor modulo the period (a body may wrap past P), precedence in modulo form over the (unfolded,
`_unfold.unfolded_edges`) edges — for every edge u→v of delay d: (lag_v − lag_u + d)·P + start_v ≥
start_u + cost_u (+ comm(words) across processors) — and the staleness of F_l under the periodic timing.
Where the two sides are equal on one processor behind a zero-cycle producer, the ops start in the same cycle
and `tie_rank` (the order `unroll` emits) must put the producer first — the one ordering rule (issue 12), so
an accepted periodic schedule never unrolls into one the explicit validator rejects or the simulator
deadlocks on.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from heapq import heapify, heappop, heappush
from itertools import chain, pairwise

from layerpipe._gc import gc_paused
from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.schedule._deps import Dependency, MissingProducer, StageInfo, dependencies
from layerpipe.schedule._ir import KINDS_LAYER, KINDS_STAGE, Op, OpKey, OpSchedule, ScheduleError, tie_rank
from layerpipe.schedule._periodic import PeriodicSchedule, Slot, latest_update, read_offset, slot_order
from layerpipe.schedule._unfold import copies, unfolded_edge_tuples

#: Op durations: per (kind, unit), a function of the op, or None for one cycle each.
Durations = Mapping[tuple[str, int], int] | Callable[[Op], int] | None

#: Grids taller than this show only the rows around the marked step.
GRID_WINDOW = 12


def _duration_fn(durations: Durations) -> Callable[[Op], int]:
    if durations is None:
        return lambda op: 1
    if callable(durations):
        return durations
    table = durations
    return lambda op: table[(op.kind, op.unit)]


def _partial_timing(
    schedule: OpSchedule, deps: Mapping[Op, tuple[Dependency, ...]], duration: Callable[[Op], int]
) -> tuple[dict[Op, tuple[int, int]], list[Op]]:
    """List-schedule the ops in program order; return (start, end) of every op that can run, and the
    processors' first ops that never can (empty unless the orders deadlock).

    Kahn's algorithm over dependency edges plus program-order edges: an op's start is the latest end of its
    producers and of its processor's previous op, so topological order gives exact times in linear time.
    The ops are numbered processor-major (so number order is (processor, slot) order, the order ready ops
    are taken in) and the search runs on those numbers. Hashing an `Op` (a dataclass, its hash rebuilt in
    Python on every lookup) was most of the cost, so each op is hashed twice (numbered, timed): `deps` as
    `dependencies` makes it (keyed by the schedule's ops, in order) is read in order, and producers — the
    schedule's own `Op` objects — are numbered by identity, by equality only for another object. A schedule
    that lists an op twice (not yet validated) takes `_partial_timing_by_op`, whose dictionaries give
    repeated ops their own meaning.
    """
    rows = schedule.procs
    ops = list(chain.from_iterable(rows))
    number = {op: k for k, op in enumerate(ops)}
    n = len(ops)
    if len(number) != n:
        return _partial_timing_by_op(schedule, deps, duration)
    # list == list compares items by identity first: one C pass when the keys are the ops themselves.
    in_order = list(deps.values()) if len(deps) == n and list(deps) == ops else [deps.get(op, ()) for op in ops]
    by_id = {id(op): k for k, op in enumerate(ops)}
    # next_on[k]: the op after k on its processor, or -1 at the end of a row.
    next_on = list(range(1, n + 1))
    waiting = [1] * n
    row_start = 0
    for row in rows:
        if row:
            waiting[row_start] = 0
            row_start += len(row)
            next_on[row_start - 1] = -1
    consumers: list[list[int]] = [[] for _ in range(n)]
    producers: list[list[int]] = [[] for _ in range(n)]
    for k, ds in enumerate(in_order):
        if ds:
            waiting[k] += len(ds)
            mine = producers[k]
            for d in ds:
                j = by_id.get(id(d.producer))
                if j is None:
                    j = number.get(d.producer)
                if j is not None:  # a producer outside the schedule never ends: k stays waiting
                    consumers[j].append(k)
                    mine.append(j)
    ready = [k for k in range(n) if not waiting[k]]  # ascending: already a heap
    end = [0] * n
    done = [False] * n
    times: dict[Op, tuple[int, int]] = {}
    while ready:
        k = heappop(ready)
        start = end[k - 1] if k and next_on[k - 1] == k else 0
        for j in producers[k]:
            if end[j] > start:
                start = end[j]
        op = ops[k]
        end[k] = finish = start + duration(op)
        times[op] = (start, finish)
        done[k] = True
        for j in consumers[k]:
            waiting[j] -= 1
            if not waiting[j]:
                heappush(ready, j)
        j = next_on[k]
        if j >= 0:
            waiting[j] -= 1
            if not waiting[j]:
                heappush(ready, j)
    blocked = []
    row_start = 0
    for row in rows:
        head = next((k for k in range(row_start, row_start + len(row)) if not done[k]), None)
        if head is not None:
            blocked.append(ops[head])
        row_start += len(row)
    return times, blocked


def _partial_timing_by_op(
    schedule: OpSchedule, deps: Mapping[Op, tuple[Dependency, ...]], duration: Callable[[Op], int]
) -> tuple[dict[Op, tuple[int, int]], list[Op]]:
    """`_partial_timing` keyed by op (the straightforward form, and the one for rows that repeat an op)."""
    waiting: dict[Op, int] = {}
    consumers: dict[Op, list[Op]] = {}
    for row in schedule.procs:
        for i, op in enumerate(row):
            waiting[op] = len(deps.get(op, ())) + (1 if i else 0)
            for d in deps.get(op, ()):
                consumers.setdefault(d.producer, []).append(op)
    position = {op: (p, i) for p, row in enumerate(schedule.procs) for i, op in enumerate(row)}
    ready = [position[op] for op, n in waiting.items() if n == 0]
    heapify(ready)
    times: dict[Op, tuple[int, int]] = {}
    while ready:
        p, i = heappop(ready)
        op = schedule.procs[p][i]
        previous_end = times[schedule.procs[p][i - 1]][1] if i else 0
        start = max([previous_end] + [times[d.producer][1] for d in deps.get(op, ())])
        times[op] = (start, start + duration(op))
        successors = consumers.get(op, [])
        if i + 1 < len(schedule.procs[p]):
            successors = [*successors, schedule.procs[p][i + 1]]
        for nxt in successors:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                heappush(ready, position[nxt])
    heads = (next((op for op in row if op not in times), None) for row in schedule.procs)
    blocked = [op for op in heads if op is not None]
    return times, blocked


def dry_run(
    schedule: OpSchedule,
    deps: Mapping[Op, tuple[Dependency, ...]],
    durations: Durations = None,
) -> dict[Op, tuple[int, int]]:
    """(start, end) of every op: each processor runs its ops in order, an op starts when its processor is
    free and its producers have ended. No communication, no memory: for validation and quick checks only —
    the timing engine is `layerpipe.sim`. Raises `ScheduleError` when the orders deadlock.
    """
    with gc_paused():  # two int lists per op (see `validate_explicit`)
        times, blocked = _partial_timing(schedule, deps, _duration_fn(durations))
    if blocked:
        _raise_deadlock(schedule, deps, times, blocked)
    return times


# --------------------------------------------------------------------------------------------- grids


def format_grid(
    cells: Mapping[tuple[int, int], str],
    num_procs: int,
    row_labels: Mapping[int, str] | None = None,
    mark: tuple[int, int] | None = None,
) -> str:
    """A step × processor grid: rows are steps (keys' first element), columns processors; `mark` (row, proc)
    gets `>>` in the margin and brackets around its cell. Tall grids keep the rows near the mark."""
    rows = sorted({r for r, _ in cells} | ({mark[0]} if mark else set()))
    if mark and len(rows) > 2 * GRID_WINDOW + 1:
        k = rows.index(mark[0])
        shown = rows[max(0, k - GRID_WINDOW) : k + GRID_WINDOW + 1]
    else:
        shown = rows[: 2 * GRID_WINDOW + 1] if len(rows) > 2 * GRID_WINDOW + 1 else rows
    labels = {r: (row_labels or {}).get(r, f"step {r}") for r in shown}

    def text(r: int, p: int) -> str:
        cell = cells.get((r, p), "")
        return f"[{cell}]" if mark == (r, p) else cell

    widths = [max([len(f"p{p}")] + [len(text(r, p)) for r in shown]) for p in range(num_procs)]
    lw = max((len(v) for v in labels.values()), default=4)
    lines = [(" " * (lw + 5) + " ".join(f"p{p}".ljust(widths[p]) for p in range(num_procs))).rstrip()]
    if shown and shown[0] != rows[0]:
        lines.append("   ...")
    for r in shown:
        margin = ">> " if mark and r == mark[0] else "   "
        body = " ".join(text(r, p).ljust(widths[p]) for p in range(num_procs))
        lines.append(f"{margin}{labels[r].rjust(lw)}: {body}".rstrip())
    if shown and shown[-1] != rows[-1]:
        lines.append("   ...")
    return "\n".join(lines)


def _explicit_grid(schedule: OpSchedule, times: Mapping[Op, tuple[int, int]] | None, mark: Op | None) -> str:
    """Grid of an explicit schedule: row = the op's step in a unit-time dry run (ops that cannot run follow
    their processor's last runnable op), so ops that run together line up like torch's pipeline order."""
    cells: dict[tuple[int, int], str] = {}
    where: dict[Op, int] = {}
    stuck_from = max((end for _, end in times.values()), default=0) if times is not None else 0
    for p, row in enumerate(schedule.procs):
        step = 0
        for op in row:
            if times is not None:
                step = times[op][0] if op in times else max(step, stuck_from)
            while (step, p) in cells:
                step += 1
            cells[(step, p)] = str(op)
            where.setdefault(op, step)
            step += 1
    width = len(str(max((r for r, _ in cells), default=0)))
    labels = {r: f"step {str(r).zfill(width)}" for r, _ in cells}
    return format_grid(cells, schedule.num_procs, labels, (where[mark], mark.proc) if mark in where else None)


def _unit_times(schedule: OpSchedule, deps: Mapping[Op, tuple[Dependency, ...]] | None) -> dict[Op, tuple[int, int]]:
    if deps is None:
        return {op: (i, i + 1) for row in schedule.procs for i, op in enumerate(row)}
    return _partial_timing(schedule, deps, lambda op: 1)[0]


def _fail(
    schedule: OpSchedule, summary: str, at: Op | None, deps: Mapping[Op, tuple[Dependency, ...]] | None = None
) -> None:
    grid = _explicit_grid(schedule, _unit_times(schedule, deps), at)
    raise ScheduleError(summary, grid, step=None, proc=at.proc if at else None)


def _raise_deadlock(
    schedule: OpSchedule,
    deps: Mapping[Op, tuple[Dependency, ...]],
    times: Mapping[Op, tuple[int, int]],
    blocked: list[Op],
) -> None:
    slot = {op: i for row in schedule.procs for i, op in enumerate(row)}
    # Prefer an op whose producer its own processor runs later: the plainest form of the fault.
    for op in blocked:
        for d in deps.get(op, ()):
            if d.producer.proc == op.proc and slot[d.producer] > slot[op]:
                _fail(
                    schedule,
                    f"precedence: {op} on p{op.proc} (slot {slot[op]}) needs {d.producer}, "
                    f"which p{op.proc} runs later (slot {slot[d.producer]})",
                    op,
                    deps,
                )
    op = blocked[0]
    waits = next(d.producer for d in deps[op] if d.producer not in times)
    _fail(
        schedule,
        f"precedence: deadlock — {op} on p{op.proc} (slot {slot[op]}) needs {waits}, which p{waits.proc} "
        f"(slot {slot[waits]}) cannot reach because its earlier ops wait in turn",
        op,
        deps,
    )


# ----------------------------------------------------------------------------------- explicit schedules


def _expected_keys(
    schedule: OpSchedule, graph: TrainingGraph | None, stages: StageInfo | None, iterations: int
) -> set[OpKey] | None:
    """Every op key the schedule must hold, except stage-level backward ops (B xor I+W, checked apart)."""
    if schedule.level == "stage":
        num_stages = stages.num_stages if stages else 1 + max((op.unit for op in schedule.ops()), default=-1)
        return {("F", s, t) for s in range(num_stages) for t in range(iterations)}
    if graph is None:
        return None
    keys: set[OpKey] = set()
    steps = -(-iterations // schedule.microbatches) if schedule.synchronous and schedule.microbatches else 0
    groups = schedule.groups_map()
    for task in graph.tasks:
        if schedule.synchronous and task.kind == "U":
            keys |= {(task.kind, task.layer, j) for j in range(steps)}
        elif task.kind == "U" and task.layer in groups:  # one update per group of g iterations
            keys |= {(task.kind, task.layer, u) for u in range(-(-iterations // groups[task.layer]))}
        else:
            keys |= {(task.kind, task.layer, t) for t in range(iterations)}
    return keys


def _check_structure(schedule: OpSchedule, graph: TrainingGraph | None, stages: StageInfo | None) -> None:
    kinds = KINDS_STAGE if schedule.level == "stage" else KINDS_LAYER
    tasks = {(t.kind, t.layer) for t in graph.tasks} if graph is not None and schedule.level == "layer" else None
    for p, row in enumerate(schedule.procs):
        for op in row:
            if op.proc != p:
                _fail(schedule, f"op {op} is listed on p{p} but says processor {op.proc}", op)
            if op.kind not in kinds:
                _fail(schedule, f"op {op} on p{p}: kind '{op.kind}' is not one of {', '.join(kinds)}", op)
            if tasks is not None and (op.kind, op.unit) not in tasks:
                _fail(schedule, f"op {op} on p{p}: the training graph has no task {op.kind}{op.unit}", op)
            if stages is not None and schedule.level == "stage" and not 0 <= op.unit < stages.num_stages:
                _fail(schedule, f"op {op} on p{p}: stage {op.unit} is not in 0..{stages.num_stages - 1}", op)


def _check_duplicates(schedule: OpSchedule) -> None:
    keys = [(op.kind, op.unit, op.iteration) for op in chain.from_iterable(schedule.procs)]
    if len(set(keys)) == len(keys):
        return  # no repeat (a set of tuples, hashed in C); else the walk below names the first
    seen: dict[OpKey, Op] = {}
    for op in schedule.ops():
        if op.key in seen:
            first = seen[op.key]
            _fail(schedule, f"duplicate: {op} runs twice (on p{first.proc} and on p{op.proc})", op)
        seen[op.key] = op


def _check_counts(schedule: OpSchedule, graph: TrainingGraph | None, stages: StageInfo | None, iterations: int) -> None:
    """Every expected op is present (after duplicates and producers were checked: what is left is ops
    nothing consumes, such as a last W or U), and none lies outside the iterations."""
    ops = list(chain.from_iterable(schedule.procs))
    seen = {(op.kind, op.unit, op.iteration): op for op in ops}
    expected = _expected_keys(schedule, graph, stages, iterations)
    if expected is None:
        return
    if schedule.level == "stage":
        pairs = {(k[1], k[2]) for k in expected}
        # Each (stage, micro-batch) has B, or I and W, and not both: checked on sets at once; the walk below,
        # pair by pair in order, only to name the first fault.
        has = {kind: {(s, t) for k, s, t in seen if k == kind} for kind in "BIW"}
        split = has["I"] & has["W"]
        if has["I"] != has["W"] or has["B"] & split or not pairs <= has["B"] | split:
            _check_stage_backwards(schedule, pairs, seen)
        extra = [op for op in ops if op.iteration >= iterations]
    else:
        extra = [op for op in ops if (op.kind, op.unit, op.iteration) not in expected]
    for key in sorted(expected - seen.keys()):
        kind, unit, it = key
        _fail(schedule, f"missing op: {kind}{unit}.{it} — no processor runs it", _sibling(schedule, unit, it))
    if extra:
        _fail(schedule, f"extra op: {extra[0]} on p{extra[0].proc} is outside iterations 0..{iterations - 1}", extra[0])


def _check_stage_backwards(schedule: OpSchedule, pairs: set[tuple[int, int]], seen: Mapping[OpKey, Op]) -> None:
    """The first (stage, micro-batch), in order, whose backward is not B alone or I and W."""
    for s, t in sorted(pairs):
        has = {kind for kind in "BIW" if (kind, s, t) in seen}
        if "B" in has and len(has) > 1:
            _fail(schedule, f"duplicate: stage {s} micro-batch {t} has both B and I/W", seen[("B", s, t)])
        if has in ({"I"}, {"W"}):
            present, absent = ("I", "W") if has == {"I"} else ("W", "I")
            summary = f"missing op: {absent}{s}.{t} (stage {s} splits micro-batch {t} into I and W)"
            _fail(schedule, summary, seen[(present, s, t)])
        if not has:
            summary = f"missing op: B{s}.{t} (or I{s}.{t} and W{s}.{t}): no processor runs it"
            _fail(schedule, summary, _sibling(schedule, s, t))


def _sibling(schedule: OpSchedule, unit: int, iteration: int) -> Op | None:
    """Where to point for an op that is missing and that no other op needs: the last op of the same unit and
    iteration (its missing partner would come after it), if any."""
    return next((op for op in reversed(list(schedule.ops())) if (op.unit, op.iteration) == (unit, iteration)), None)


def _check_staleness(
    schedule: OpSchedule,
    deps: Mapping[Op, tuple[Dependency, ...]],
    times: Mapping[Op, tuple[int, int]],
    max_staleness: int,
) -> None:
    """Staleness of F_l(t) = ⌊t/g⌋ − (number of U_l ops that ended by the time F_l(t) starts), in updates
    (g = 1 unless the layer's updates are grouped)."""
    groups = schedule.groups_map()
    update_ends: dict[int, list[int]] = {}
    for op, (_, end) in times.items():
        if op.kind == "U":
            update_ends.setdefault(op.unit, []).append(end)
    for ends in update_ends.values():
        ends.sort()
    for op in sorted((op for op in times if op.kind == "F" and op.unit in update_ends), key=lambda o: times[o][0]):
        version = bisect_right(update_ends[op.unit], times[op][0])
        stale = op.iteration // groups.get(op.unit, 1) - version
        if stale > max_staleness:
            _fail(
                schedule,
                f"staleness: {op} on p{op.proc} reads version {version}, staleness {stale} "
                f"> bound {max_staleness}",
                op,
                deps,
            )


def validate_explicit(
    schedule: OpSchedule,
    graph: TrainingGraph | None = None,
    stages: StageInfo | None = None,
    *,
    iterations: int | None = None,
    durations: Durations = None,
    max_staleness: int | None = None,
) -> dict[Op, tuple[int, int]]:
    """Validate an explicit schedule; return its dry-run timing (unit durations unless given)."""
    # The checks, the dependencies and the dry run make a few small acyclic objects per op: without the pause,
    # collections triggered by them walk every live object (validate_explicit 1.3x slower on the zoo schedules).
    with gc_paused():
        _check_structure(schedule, graph, stages)
        total = schedule.num_iterations if iterations is None else iterations
        _check_duplicates(schedule)
        try:
            deps = dependencies(schedule, graph, stages)
        except MissingProducer as exc:
            _fail(schedule, exc.summary, exc.consumer)
        _check_counts(schedule, graph, stages, total)
        times = dry_run(schedule, deps, durations)
        if max_staleness is not None and schedule.level == "layer" and not schedule.synchronous:
            _check_staleness(schedule, deps, times, max_staleness)
        return times


# ----------------------------------------------------------------------------------- periodic schedules


def _periodic_grid(schedule: PeriodicSchedule, mark: tuple[int, int] | None) -> str:
    """Rows are the distinct start offsets of the bodies; `mark` is (start, proc)."""
    cells: dict[tuple[int, int], str] = {}
    for p, body in enumerate(schedule.bodies):
        for slot in sorted(body, key=slot_order):
            cells[(slot.start, p)] = (cells[(slot.start, p)] + " " if (slot.start, p) in cells else "") + str(slot)
    labels = {r: f"@{r}" for r, _ in cells}
    return format_grid(cells, schedule.num_procs, labels, mark)


def _label(task: tuple[str, int, int]) -> str:
    kind, layer, phase = task
    return f"{kind}{layer}.{phase}" if phase else f"{kind}{layer}"


def validate_periodic(
    schedule: PeriodicSchedule,
    graph: TrainingGraph,
    *,
    costs: Mapping[tuple[str, int], int] | None = None,
    comm: Callable[[int], int] | None = None,
    max_staleness: int | None = None,
) -> None:
    """Validate a periodic schedule of `graph`'s tasks in modulo form (see the module docstring)."""
    cost = dict(costs if costs is not None else schedule.costs)
    period, unfold, groups = schedule.period, schedule.unfold, dict(schedule.groups)

    def fail(summary: str, p: int | None, start: int | None) -> None:
        mark = (start, p) if p is not None and start is not None else None
        raise ScheduleError(summary, _periodic_grid(schedule, mark), step=start, proc=p)

    where: dict[tuple[str, int, int], tuple[int, int, int]] = {}  # task copy → (proc, lag, start)
    for p, body in enumerate(schedule.bodies):
        for slot in body:
            task = (slot.kind, slot.layer, slot.phase)
            if slot.lag < 0 or slot.start < 0:
                fail(f"lag: slot {slot} on p{p} has a negative lag or start", p, slot.start)
            if task in where:
                other = where[task][0]
                fail(f"duplicate: task {_label(task)} is in the bodies of p{other} and p{p}", p, slot.start)
            if (slot.kind, slot.layer) not in cost:
                fail(f"slot {slot} on p{p}: no cost known for task {slot.kind}{slot.layer}", p, slot.start)
            where[task] = (p, slot.lag, slot.start)
    graph_tasks = {(t.kind, t.layer, k) for t in graph.tasks for k in range(copies(t.kind, t.layer, unfold, groups))}
    for task in sorted(graph_tasks - where.keys()):
        fail(f"missing op: task {_label(task)} is in no processor's body", None, None)
    for task in sorted(where.keys() - graph_tasks):
        fail(f"extra op: task {_label(task)} is not in the training graph"
             + (f" unfolded by {unfold}" if unfold > 1 else ""), where[task][0], where[task][2])

    for p, body in enumerate(schedule.bodies):
        busy = [s for s in body if cost[(s.kind, s.layer)] > 0]
        if sum(cost[(s.kind, s.layer)] for s in busy) > period:
            fail(f"overlap: p{p} has more work than the period {period}", p, busy[0].start)
        for i, a in enumerate(busy if not _disjoint_arcs(busy, cost, period) else ()):  # the first overlap
            for b in busy[i + 1 :]:
                ca, cb = cost[(a.kind, a.layer)], cost[(b.kind, b.layer)]
                if (b.start - a.start) % period < ca or (a.start - b.start) % period < cb:
                    fail(f"overlap: on p{p}, {b} overlaps {a} modulo the period {period}", p, b.start)
        # A zero-cycle op occupies no cycles but keeps its place in the program: one that starts inside another
        # op's cycles waits for it (the unrolled program runs in start order), so the plan would not hold.
        for z in body:
            if cost[(z.kind, z.layer)] == 0:
                for a in busy:
                    if 0 < (z.start - a.start) % period < cost[(a.kind, a.layer)]:
                        fail(f"overlap: on p{p}, {z} (0 cycles) starts inside {a}'s cycles modulo the period "
                             f"{period}; it would wait for {a} to end", p, z.start)

    # Every edge of every schedule validated: plain tuples, and the labels made only for a failure.
    for src, dst, delay, words, role in unfolded_edge_tuples(graph, unfold, groups):
        (pu, lag_u, st_u), (pv, lag_v, st_v) = where[src], where[dst]
        ready = st_u + cost[src[:2]] + (comm(words) if comm is not None and pu != pv else 0)
        at = (lag_v - lag_u + delay) * period + st_v
        if at < ready:
            fail(
                f"precedence: {_label(dst)} (p{pv}, lag {lag_v}, start {st_v}) starts before {_label(src)} "
                f"(p{pu}, lag {lag_u}, start {st_u}) delivers ({role}, delay {delay})",
                pv,
                st_v,
            )
        if pu == pv and at == st_u and tie_rank(*dst[:2]) <= tie_rank(*src[:2]):
            # Same cycle on one processor behind a zero-cycle producer: the unroll orders them by tie_rank.
            fail(f"precedence: {_label(dst)} starts in the cycle {_label(src)} (0 cycles) does, on p{pv}, but the "
                 f"tie order (one iteration's dataflow order) runs {_label(dst)} first", pv, st_v)

    if max_staleness is not None:
        for layer, stale in periodic_staleness(schedule, graph, cost).items():
            if stale > max_staleness:
                p, _, start = where[("F", layer, 0)]
                fail(f"staleness: F{layer} reads weights {stale} updates old > bound {max_staleness}", p, start)


def _disjoint_arcs(busy: Sequence[Slot], cost: Mapping[tuple[str, int], int], period: int) -> bool:
    """Whether the slots' cycles (arcs [start, start + cost) around the period, costs > 0, their sum ≤ P) are
    pairwise disjoint: each arc ends by the next one's start in circular order. A check in n log n instead of
    the pairs' n² (a large unfolded body holds hundreds of slots); the pairs are searched, in their order, only
    when some overlap, to name the first."""
    if len(busy) < 2:
        return True
    arcs = sorted((s.start % period, cost[(s.kind, s.layer)]) for s in busy)
    if arcs[0][0] + period - arcs[-1][0] < arcs[-1][1]:  # the last arc wraps into the first
        return False
    return all(b - a >= c for (a, c), (b, _) in pairwise(arcs))


def periodic_staleness(
    schedule: PeriodicSchedule, graph: TrainingGraph, costs: Mapping[tuple[str, int], int] | None = None,
    pins: Mapping[tuple[str, int, int], int] | None = None,
) -> dict[int, int]:
    """Steady-state staleness of F_l per weight layer under the periodic timing, in updates: the largest s of
    F_l's phases, where F_l(t) reads version ⌊t/g⌋ − s (`PeriodicSchedule.read_pins`; with J = g = 1, F_l(t)
    starts at (t + lag_F)·P + start_F, U_l(i) ends at (i + lag_U)·P + start_U + cost_U, and s = −k − 1 with
    k = lag_F − lag_U + ⌊(start_F − start_U − cost_U)/P⌋, the same for every t once the pipeline is full).
    `pins` are the schedule's `read_pins()`, when the caller has them already.
    """
    if costs is not None and dict(costs) != schedule.costs:
        schedule, pins = replace(schedule, costs=dict(costs)), None  # other costs, other pins
    weighted = {t.layer for t in graph.tasks if t.kind == "U"}
    out: dict[int, int] = {}
    for (kind, layer, _), stale in (schedule.read_pins() if pins is None else pins).items():
        if kind == "F" and layer in weighted:
            out[layer] = max(out.get(layer, stale), stale)
    return dict(sorted(out.items()))


def validate(
    schedule: OpSchedule | PeriodicSchedule,
    graph: TrainingGraph | None = None,
    stages: StageInfo | None = None,
    *,
    max_staleness: int | None = None,
    iterations: int | None = None,
    durations: Durations = None,
    costs: Mapping[tuple[str, int], int] | None = None,
    comm: Callable[[int], int] | None = None,
) -> dict[Op, tuple[int, int]] | None:
    """Validate any schedule; raise `ScheduleError` on the first fault.

    Explicit schedules take `iterations` (default: as many as the ops name), `durations` (for the dry run and
    the staleness check; default one cycle per op) and return the dry-run timing. Periodic schedules need
    `graph`, take `costs` (default: the schedule's own) and `comm` (cycles of a transfer of w words between
    processors), and return None. `max_staleness` bounds the staleness of every F_l in both.
    """
    if isinstance(schedule, PeriodicSchedule):
        if graph is None:
            raise ScheduleError("periodic schedules are validated against their training graph; none given")
        if iterations is not None or durations is not None:
            raise InputError("validate: 'iterations' and 'durations' apply to explicit schedules, not periodic ones")
        validate_periodic(schedule, graph, costs=costs, comm=comm, max_staleness=max_staleness)
        return None
    if costs is not None or comm is not None:
        raise InputError("validate: 'costs' and 'comm' apply to periodic schedules; explicit ones take 'durations'")
    return validate_explicit(
        schedule, graph, stages, iterations=iterations, durations=durations, max_staleness=max_staleness
    )


# --- the pins themselves ----------------------------------------------------------------------------------
# Which version each reader reads (`PeriodicSchedule.read_pins`, whose staleness and versions the passes above
# measure): `_periodic` holds the rule (`latest_update`) and the schedule; this applies the rule to every reader,
# layer by layer, in plain Python for the small readers × copies tables of most layers, as arrays for large
# ones.

#: The order of `read_pins`' keys (kind, layer, phase): by layer, then kind, then phase.
_PIN_ORDER = operator.itemgetter(1, 0, 2)

#: Readers × update copies of one layer up to which the pins are computed in plain Python (numpy's per-call
#: cost outweighs a few dozen integer formulas).
SMALL_PINS = 256


def schedule_pins(schedule: PeriodicSchedule, vectorised: bool,
                  forward_only: bool = False) -> dict[tuple[str, int, int], int]:
    """`PeriodicSchedule.read_pins`: per reader, `latest_update` over its layer's update copies — reader by
    reader, or (`vectorised`, a period > 0) a layer at a time (`latest_updates`). `forward_only`: the F readers
    alone (`PeriodicSchedule.forward_pins`)."""
    floor = {(k, layer, phase): st for k, layer, phase, st in schedule.read_floor}
    groups = dict(schedule.groups)
    updates: dict[int, list[tuple[Slot, int]]] = {}
    readers: dict[int, list[tuple[Slot, int]]] = {}
    for p, body in enumerate(schedule.bodies):
        for s in body:
            if s.kind == "U":
                updates.setdefault(s.layer, []).append((s, p))
            elif (s.kind == "F") if forward_only else ("F" in s.kind or "E" in s.kind):
                readers.setdefault(s.layer, []).append((s, p))
    stale: dict[tuple[str, int, int], int] = {}
    for layer, xs in readers.items():
        us = updates.get(layer)
        if not us or ("U", layer) not in schedule.costs:
            continue
        g = groups.get(layer, 1)
        per = schedule.unfold // g
        c_u = schedule.costs[("U", layer)]
        delays = [schedule.read_delays.get((x.kind, layer, x.phase) if x.phase else (x.kind, layer), 0)
                  for x, _ in xs]
        c_xs = [schedule.costs.get((x.kind, layer), 1) for x, _ in xs]
        if vectorised:
            best = latest_updates(schedule.period, xs, us, c_u, c_xs, delays, per)
        else:
            best = [latest_update(x.start, x.lag, [(u.start, u.lag, u.phase, read_offset(c_u, c_x, pu == px))
                                                   for u, pu in us], per, schedule.period, delay)[0]
                    for (x, px), c_x, delay in zip(xs, c_xs, delays, strict=True)]
        for (x, _), b in zip(xs, best, strict=True):
            key = (x.kind, layer, x.phase)
            value = x.phase // g - 1 - b
            stale[key] = max(value, floor.get(key, value)) if floor else value
    return {key: stale[key] for key in sorted(stale, key=_PIN_ORDER)}


def latest_updates(period: int, xs: Sequence[tuple[Slot, int]], us: Sequence[tuple[Slot, int]], c_u: int,
                   c_xs: Sequence[int], delays: Sequence[int], per: int) -> list[int]:
    """`latest_update`'s newest update for each reader of `xs` (slot, processor) over the copies `us`, as arrays:
    f = ⌊(start_X − start_U − offset − delay)/P⌋, seen = (J/g)·(f − lag_U + lag_X) + phase_U, its max."""
    if len(xs) * len(us) <= SMALL_PINS:
        copies = [(u.start, u.lag, u.phase, pu) for u, pu in us]
        out = []
        for (x, px), cost_x, delay in zip(xs, c_xs, delays, strict=True):
            at, reader_lag = x.start - delay, x.lag
            zero = c_u == 0 and cost_x == 0
            out.append(max(per * ((at - start - (c_u + (zero and pu == px))) // period - lag + reader_lag) + phase
                           for start, lag, phase, pu in copies))
        return out
    import numpy as np

    x_start, x_lag, x_proc = np.array([(x.start, x.lag, p) for x, p in xs], dtype=np.int64).T
    u_start, u_lag, u_phase, u_proc = np.array([(u.start, u.lag, u.phase, p) for u, p in us], dtype=np.int64).T
    c_x = np.array(c_xs, dtype=np.int64)
    # `read_offset`: the update's cost, one more for a zero-cycle update on a zero-cycle reader's processor
    offset = c_u + ((c_u == 0) & (c_x[:, None] == 0) & (x_proc[:, None] == u_proc[None, :]))
    f = (x_start[:, None] - u_start[None, :] - offset - np.array(delays, dtype=np.int64)[:, None]) // period
    seen = per * (f - u_lag[None, :] + x_lag[:, None]) + u_phase[None, :]
    return seen.max(axis=1).tolist()

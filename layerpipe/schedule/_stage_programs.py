"""Synchronous stage-level schedules: GPipe, 1F1B, interleaved 1F1B, Zero Bubble H1/H2, ZB-V, DualPipeV and
LoopedBFS (OOO BackProp's order needs the stage costs: `_ooo.py`).

Each generator returns an `OpSchedule(level="stage", synchronous=True, microbatches=m)`: per processor, the
ordered compute ops of `steps` steps of m micro-batches (step j holds micro-batches j·m .. j·m+m−1; the
stage's weight update is implicit at the end of each step, see `layerpipe.schedule._deps`). Stage ops are
F (forward), B (full backward), I (input gradient) and W (weight gradient).

Stage → processor maps are torch.distributed.pipelining's: stage s on processor s for one stage per
processor, looping (s on s mod p) for interleaved schedules and LoopedBFS, and V-shaped for ZB-V and
DualPipeV (stage s on s for s < p, on 2p−1−s for the second half). With uniform stage costs the
per-processor compute order equals torch 2.13's ScheduleGPipe, ScheduleInterleaved1F1B,
ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV (an OVERLAP_F_B action is its F
then its B) and ScheduleLoopedBFS (tests/test_sync_torch.py, tests/test_dualpipe.py run torch's own order
builders). For 1F1B we produce the correct order; torch 2.13's Schedule1F1B numbers the last rank's
forwards from 1 (`3F1 3B0 3F2 …` for 4 ranks). torch 2.13 has no ZB-H2.

ZB-H2 (Zero Bubble paper, §3.1, Figure 4): more warm-up forwards (2(p−1−i)+1 before stage i's first I)
fill the bubble before the first backward, W passes fill the steady-state gaps whenever the memory limit
(2p−1 activations held from F to W, the paper's peak) stops the next F, and the tail's W passes are
reordered into a parallelogram. With m ≥ 2p−1 every processor is busy without a gap from its first op to
its last (tests/test_zero_bubble.py measures bubble and memory with the simulator).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from layerpipe.errors import InputError
from layerpipe.schedule._ir import OpColumns, OpSchedule

#: (kind, stage, micro-batch) of one step.
StageOp = tuple[str, int, int]


def _check(procs: int, microbatches: int, steps: int, virtual_stages: int = 1) -> None:
    for name, value in (("stages", procs), ("microbatches", microbatches), ("steps", steps)):
        if value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if virtual_stages < 1:
        raise InputError(f"virtual_stages must be >= 1, got {virtual_stages}")


def _schedule(rows: Sequence[Sequence[StageOp]], microbatches: int, steps: int) -> OpSchedule:
    """Repeat one step's per-processor orders `steps` times, micro-batches offset by j·m: processor p runs
    Op(p, k, s, j·m + t) for j = 0 … steps − 1, for each (k, s, t) of its row. Built as columns (`OpColumns`):
    the `Op`s exist only when something reads `procs` (the timing engine does not)."""
    task_id: dict[tuple[str, int], int] = {}
    table: list[tuple[np.ndarray, np.ndarray]] = []
    for row in rows:
        ids = np.fromiter((task_id.setdefault((k, s), len(task_id)) for k, s, _ in row), np.int64, len(row))
        table.append((ids, np.fromiter((t for _, _, t in row), np.int64, len(row))))
    return _repeated(table, tuple(task_id), microbatches, steps)


def _schedule_of_arrays(rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], kinds: tuple[str, ...],
                        microbatches: int, steps: int) -> OpSchedule:
    """`_schedule` of rows given as arrays (kind code into `kinds`, stage, micro-batch) per op: the same columns,
    tasks numbered as `_schedule` numbers them (by first appearance, row by row)."""
    stride = 1 + max((int(stage.max()) for _, stage, _ in rows if len(stage)), default=0)
    keys = [kind * stride + stage for kind, stage, _ in rows]
    flat = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    distinct, first = np.unique(flat, return_index=True)
    by_first = np.argsort(first)
    number = np.empty(len(distinct), dtype=np.int64)
    number[by_first] = np.arange(len(distinct), dtype=np.int64)
    tasks = tuple((kinds[key // stride], key % stride) for key in distinct[by_first].tolist())
    table = [(number[np.searchsorted(distinct, key)], t) for key, (_, _, t) in zip(keys, rows, strict=True)]
    return _repeated(table, tasks, microbatches, steps)


def _repeated(rows: Sequence[tuple[np.ndarray, np.ndarray]], tasks: tuple[tuple[str, int], ...], microbatches: int,
              steps: int) -> OpSchedule:
    """The columns of `steps` steps of rows of (task id, micro-batch) arrays (see `_schedule`)."""
    tasked: list[np.ndarray] = []
    iterations: list[np.ndarray] = []
    bounds = [0]
    offsets = np.arange(steps, dtype=np.int64)[:, None] * microbatches
    for ids, its in rows:
        tasked.append(np.tile(ids, steps))
        iterations.append((offsets + its[None, :]).ravel())
        bounds.append(bounds[-1] + len(ids) * steps)
    empty = np.zeros(0, dtype=np.int64)
    columns = OpColumns(tuple(bounds), tasks, np.concatenate(tasked) if tasked else empty,
                        np.concatenate(iterations) if iterations else empty)
    return OpSchedule.from_columns("stage", columns, synchronous=True, microbatches=microbatches)


def repeat_step(one_step: OpSchedule, steps: int) -> OpSchedule:
    """`steps` steps of a one-step stage schedule: what its generator gives when asked for `steps` steps (every
    generator here repeats its step with `_repeated`), without generating the order again."""
    c = one_step.as_columns()
    rows = [(c.task[lo:hi], c.iteration[lo:hi]) for lo, hi in itertools.pairwise(c.bounds)]
    return _repeated(rows, c.tasks, one_step.microbatches, steps)


def looping_stage_map(procs: int, virtual_stages: int) -> list[int]:
    """Processor of each stage when every processor holds `virtual_stages` chunks round-robin."""
    return [s % procs for s in range(procs * virtual_stages)]


def v_stage_map(procs: int) -> list[int]:
    """ZB-V's processor of each of 2p stages: down the processors and back up."""
    return [s if s < procs else 2 * procs - 1 - s for s in range(2 * procs)]


def gpipe(stages: int, microbatches: int, steps: int = 1) -> OpSchedule:
    """All forwards, then all backwards, per stage (fill–drain)."""
    _check(stages, microbatches, steps)
    m = microbatches
    every = np.arange(m, dtype=np.int64)
    rows = [(np.repeat(np.array([0, 1]), m), np.full(2 * m, s, dtype=np.int64), np.tile(every, 2))
            for s in range(stages)]
    return _schedule_of_arrays(rows, ("F", "B"), m, steps)


def one_f_one_b(stages: int, microbatches: int, steps: int = 1) -> OpSchedule:
    """PipeDream-Flush / Megatron 1F1B: stage s warms up with p−1−s forwards, then alternates F and B."""
    _check(stages, microbatches, steps)
    m, rows = microbatches, []
    for s in range(stages):
        warmup = min(stages - 1 - s, m)
        steady = m - warmup  # (F warmup + k, B k) for k < steady, then the remaining backwards
        kind = np.concatenate([np.zeros(warmup, dtype=np.int64), np.tile(np.array([0, 1]), steady),
                               np.ones(warmup, dtype=np.int64)])
        pairs = np.stack([np.arange(warmup, m, dtype=np.int64), np.arange(steady, dtype=np.int64)], axis=1)
        t = np.concatenate([np.arange(warmup, dtype=np.int64), pairs.ravel(), np.arange(steady, m, dtype=np.int64)])
        rows.append((kind, np.full(2 * m, s, dtype=np.int64), t))
    return _schedule_of_arrays(rows, ("F", "B"), m, steps)


def _interleaved_rank(procs: int, m: int, v: int, rank: int, zero_bubble: bool) -> list[StageOp]:
    """Depth-first interleaved order of one processor (Megatron's interleaved 1F1B; with `zero_bubble`,
    ZB-H1: B split into I and W, W deferred by `rank` backward slots and then run after each I).

    Micro-batches go in rounds of m/r (r = max(1, m // p) rounds): a processor runs a round's micro-batches
    through one of its chunks before moving to its next chunk (forwards up the chunks, backwards down).
    Warm-up forwards: (v−1)·round + 2·(p−1−rank) (1·(p−1−rank) with zero bubble), capped at m·v.
    """
    rounds = max(1, m // procs) if v > 1 else 1  # with one chunk the rounds do not change the order
    if m % rounds:
        raise InputError(
            f"microbatches {m}: interleaved schedules on {procs} processors need a multiple of {rounds} "
            f"(the number of rounds, max(1, microbatches // processors))"
        )
    per_round = m // rounds
    total = m * v
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (procs - 1 - rank), total)
    count: dict[tuple[str, int], int] = {}

    def forward_chunk(k: int) -> int:  # the chunk of the k-th forward: up the chunks, a round at a time
        return (k // per_round) % v

    def backward_chunk(k: int) -> int:  # the chunk of the k-th backward: down the chunks
        return v - 1 - (k // per_round) % v

    def take(kind: str, chunk: int) -> StageOp:
        stage = chunk * procs + rank
        t = count.get((kind, stage), 0)
        count[(kind, stage)] = t + 1
        return (kind, stage, t)

    ops: list[StageOp] = [take("F", forward_chunk(k)) for k in range(warmup)]
    backward_chunks: list[int] = []
    for k in range(total):  # the k-th backward, preceded by a forward while forwards remain
        if warmup + k < total:
            ops.append(take("F", forward_chunk(warmup + k)))
        chunk = backward_chunk(k)
        ops.append(take("I" if zero_bubble else "B", chunk))
        backward_chunks.append(chunk)
        if zero_bubble and k >= rank:
            ops.append(take("W", backward_chunks[k - rank]))
    if zero_bubble:
        ops += [take("W", chunk) for chunk in backward_chunks[max(0, total - rank) :]]
    return ops


def interleaved_1f1b(procs: int, microbatches: int, virtual_stages: int = 2, steps: int = 1) -> OpSchedule:
    """Interleaved 1F1B: `virtual_stages` chunks per processor, stage s on processor s mod p."""
    _check(procs, microbatches, steps, virtual_stages)
    rows = [_interleaved_rank(procs, microbatches, virtual_stages, r, False) for r in range(procs)]
    return _schedule(rows, microbatches, steps)


def zb_h1(procs: int, microbatches: int, virtual_stages: int = 1, steps: int = 1) -> OpSchedule:
    """Zero Bubble H1 (ZB1P): 1F1B's memory, B split into I and W, W fills the tail bubbles.

    With `virtual_stages` 2 it is torch's ScheduleInterleavedZeroBubble.
    """
    _check(procs, microbatches, steps, virtual_stages)
    rows = [_interleaved_rank(procs, microbatches, virtual_stages, r, True) for r in range(procs)]
    return _schedule(rows, microbatches, steps)


def zbv(procs: int, microbatches: int, steps: int = 1) -> OpSchedule:
    """ZB-V: two chunks per processor in a V (stages r and 2p−1−r on processor r), B split into I and W.

    The order is computed as for max(2p−1, m) micro-batches and the ones ≥ m are dropped, as torch does.
    """
    _check(procs, microbatches, steps)
    rows = []
    n = max(2 * procs - 1, microbatches)
    for r in range(procs):
        down, up = r, 2 * procs - 1 - r  # the processor's stage on the way down and on the way up
        count: dict[tuple[str, int], int] = {}

        def take(kind: str, stage: int, count: dict[tuple[str, int], int] = count) -> StageOp:
            t = count.get((kind, stage), 0)
            count[(kind, stage)] = t + 1
            return (kind, stage, t)

        ops = [take("F", down) for _ in range(2 * (procs - r) - 1)]
        for _ in range(r):
            ops += [take("F", up), take("F", down)]
        for _ in range(procs - r):
            f, i = take("F", up), take("I", up)
            ops += [f, i, ("W", up, i[2])]  # a W right after its I shares the I's counter
        while count[("F", up)] < count[("F", down)] or count[("F", down)] < n:
            if count[("F", down)] < n:
                ops.append(take("F", down))
            i = take("I", down)
            ops += [i, ("W", down, i[2])]
            f, i = take("F", up), take("I", up)
            ops += [f, i, ("W", up, i[2])]
        count[("W", down)] = count.get(("I", down), 0)
        count[("W", up)] = count.get(("I", up), 0)
        for _ in range(r):
            ops += [take("I", down), take("I", up)]
        for _ in range(procs - r):
            ops += [take("I", down), take("W", down)]
        while count[("W", up)] < count.get(("I", up), 0):
            ops.append(take("W", up))
        while count[("W", down)] < count.get(("I", down), 0):
            ops.append(take("W", down))
        rows.append([op for op in ops if op[2] < microbatches])
    return _schedule(rows, microbatches, steps)


def zb_h2(stages: int, microbatches: int, steps: int = 1) -> OpSchedule:
    """Zero Bubble H2 (Qi et al., ICLR'24, §3.1 and Figure 4): B split into I and W, extra warm-up forwards
    and W passes that fill the steady-state gaps, the tail's W passes reordered into a parallelogram.

    The order is a unit-time list simulation (F = I = W = 1, the paper's assumption): at every time step each
    stage i runs, in this priority, its next I if its inputs are in; else its next F if its inputs are in and
    two limits allow it — at most 2(p−1−i)+1 forwards ahead of the I's (the paper's warm-up, which fills the
    bubble before the first I) and at most 2p−1 activations held, an activation being held from its F until
    its W (the paper's peak memory (2p−1)·M_B); else its oldest pending W. So W runs in the steady state
    whenever the memory limit stops the next F, not only at the end of the step. With m ≥ 2p−1 stage i is busy
    without a gap over [i, i + 3m): consecutive steps tile with no bubble ((p−1)(F+I−2W) = 0), where ZB-H1
    leaves p−1−i idle units on stage i and 1F1B 3(p−1−i). Simplification: the paper's post-validation step
    (which removes the optimizer's synchronisation) is not modelled; our step boundary is per stage anyway.
    """
    _check(stages, microbatches, steps)
    p, m = stages, microbatches
    finished: dict[StageOp, int] = {}  # op → time it ends

    def inputs_in(op: StageOp, now: int) -> bool:
        kind, s, t = op
        if kind == "F":
            need = [("F", s - 1, t)] if s else []
        elif kind == "I":
            need = [("F", s, t)] + ([("I", s + 1, t)] if s < p - 1 else [])
        else:
            need = [("I", s, t)]
        return all(finished.get(n, now + 1) <= now for n in need)

    started = {kind: [0] * p for kind in "FIW"}  # per kind, the next micro-batch of each stage
    rows: list[list[StageOp]] = [[] for _ in range(p)]
    now = 0
    while any(len(row) < 3 * m for row in rows):
        for i in range(p):
            f, b, w = started["F"][i], started["I"][i], started["W"][i]
            candidates = [
                ("I", i, b) if b < m else None,
                ("F", i, f) if f < m and f - b < 2 * (p - 1 - i) + 1 and f - w < 2 * p - 1 else None,
                ("W", i, w) if w < b else None,
            ]
            for op in candidates:
                if op is not None and inputs_in(op, now):
                    rows[i].append(op)
                    finished[op] = now + 1
                    started[op[0]][i] += 1
                    break
        now += 1
    return _schedule(rows, m, steps)


def looped_bfs(procs: int, microbatches: int, virtual_stages: int = 2, steps: int = 1) -> OpSchedule:
    """Breadth-first pipeline parallelism (Lamy-Poirier, "Breadth-First Pipeline Parallelism", arXiv
    2211.05953; torch 2.13's ScheduleLoopedBFS): `virtual_stages` stages per processor, stage s on s mod p;
    a processor runs every micro-batch's forward of its first stage, then of its next, and the full backwards
    of its stages in reverse, micro-batches last first (torch's order). Modelled: the order; torch's idle
    padding is dropped (the simulator waits for inputs itself)."""
    _check(procs, microbatches, steps, virtual_stages)
    m, rows = microbatches, []
    for rank in range(procs):
        own = range(rank, procs * virtual_stages, procs)
        row: list[StageOp] = [("F", s, t) for s in own for t in range(m)]
        row += [("B", s, t) for s in reversed(own) for t in reversed(range(m))]
        rows.append(row)
    return _schedule(rows, m, steps)


def dualpipev(procs: int, microbatches: int, steps: int = 1) -> OpSchedule:
    """DualPipeV (DeepSeek-V3 technical report, arXiv 2412.19437 §3.2.1, and its "cut-in-half" V variant from
    github:deepseek-ai/DualPipe; torch 2.13's ScheduleDualPipeV): two stages per processor in a V (stages r
    and 2p−1−r on processor r), eight phases per rank as torch builds them — warm-up forwards of the first
    stage, paired forwards, zero-bubble I/W on the second stage, the main phase of overlapped forward of one
    stage with full backward of the other, then backwards that switch to I with deferred W halfway.

    Simplification: an overlapped "F&B" pair runs as its F then its B, back to back on the processor (the
    report's overlap of one chunk's compute with the other's communication is not modelled), so the pair
    costs F + B, not less. torch refuses fewer micro-batches than stages (2p); so do we.
    """
    _check(procs, microbatches, steps)
    if microbatches < 2 * procs:
        raise InputError(f"microbatches {microbatches}: dualpipev on {procs} processors needs at least "
                         f"{2 * procs} (one per stage, as torch's ScheduleDualPipeV)")
    rows = [_dualpipev_rank(procs, microbatches, r) for r in range(procs)]
    return _schedule(rows, microbatches, steps)


def _dualpipev_rank(procs: int, m: int, rank: int) -> list[StageOp]:
    """One rank's order, phase by phase as torch 2.13 builds it (counters per stage and kind; a full B
    advances both the I and the W counter; a W takes the oldest I still without its W)."""
    first, second = rank, 2 * procs - 1 - rank
    count: dict[tuple[str, int], int] = {}
    pending_w: list[tuple[int, int]] = []
    ops: list[StageOp] = []

    def add(kind: str, stage: int) -> None:
        t = count.get(("I" if kind == "B" else kind, stage), 0)
        ops.append((kind, stage, t))
        if kind == "B":
            count[("I", stage)] = t + 1
            count[("W", stage)] = count.get(("W", stage), 0) + 1
            return
        if kind == "I":
            pending_w.append((stage, t))
        count[(kind, stage)] = t + 1

    def weight() -> None:
        if pending_w:
            stage, t = pending_w.pop(0)
            ops.append(("W", stage, t))
            count[("W", stage)] = count.get(("W", stage), 0) + 1

    for _ in range(2 * (procs - rank - 1)):  # 1: forwards of the first stage
        add("F", first)
    for _ in range(rank + 1):  # 2: forwards of both stages
        add("F", first)
        add("F", second)
    for _ in range(procs - rank - 1):  # 3: I, W, F of the second stage (zero bubble)
        add("I", second)
        weight()
        add("F", second)
    for _ in range(m - 2 * procs + rank + 1):  # 4: main phase, F of one stage with B of the other
        add("F", first)
        add("B", second)
        add("F", second)
        add("B", first)
    for _ in range(procs - rank - 1):  # 5: B of the second stage, then F of the second with B of the first
        add("B", second)
        add("F", second)
        add("B", first)
    zero_bubble = False
    for i in range(rank + 1):  # 6: backwards of both stages, I (with W deferred) from the middle on
        if i == (rank + 1) // 2 and rank % 2 == 1:
            zero_bubble = True
        add("I" if zero_bubble else "B", second)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            zero_bubble = True
        add("I" if zero_bubble else "B", first)
    for _ in range(procs - rank - 1):  # 7: a deferred W, then the first stage's backward
        weight()
        add("I" if zero_bubble else "B", first)
    for _ in range(rank + 1):  # 8: the remaining W
        weight()
    return ops

"""Stage-level dependencies as arrays without the rule table: `dependency_arrays`' result for the stage-level
pipelines the simulator times most (1F1B, ZB-H1 and the other generators, asynchronous or one step), built
from a table of at most two producer tasks per consumer task.

`layerpipe.schedule._deps.dependency_arrays` turns every task's rules into rows of a general rule table
(divisors, offsets, caps, phases) and applies them in blocks: some sixty numpy calls, a fixed cost that was a
sixth of a full `simulate()` of 1F1B at p = 8, m = 64 (issue 14: 94 of 518 µs). The stage rules need none of
that generality: consumer task k at micro-batch t needs producer task src(k) at the same t (else, for an
error, task alt(k)), and the "kept" F_s(t) or I_s(t) — at most two rows per task, the same for every
micro-batch. So every op's producers come from one lookup of its task's two rows in a (task, micro-batch)
table, about fifteen numpy calls.

`stage_dependency_arrays` returns exactly what `dependency_arrays` returns — the same values, order and
dtypes — or None where it does not cover the schedule (the caller then asks `dependency_arrays`, which gives
the arrays or its None): a synchronous schedule of more than one step (its step edges), tasks not numbered in
order of first appearance (the role numbering below relies on it), no ops, and everything `dependency_arrays`
itself turns down. `tests/test_stage_deps.py` compares the two over generated schedules.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerpipe.schedule._deps import MAX_INDEX_CELLS, DependencyArrays, StageInfo, _microbatches
from layerpipe.schedule._ir import OpSchedule, numbered_by_first_appearance

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

#: The kinds of stage-level ops (`dependencies()` raises on any other).
STAGE_KINDS = frozenset(("F", "B", "I", "W"))


def stage_dependency_arrays(schedule: OpSchedule, tasks: Sequence[tuple[str, int]], task: np.ndarray,
                            iteration: np.ndarray, stages: StageInfo | None = None,
                            numbered: bool = False) -> DependencyArrays | None:
    """`dependency_arrays(schedule, tasks, task, iteration, stages=stages)` of a stage-level schedule, or None
    where this builder does not apply (see the module docstring). Op i is task `tasks[task[i]]` at micro-batch
    `iteration[i]`; the tasks must be numbered in order of first appearance, as `compile_schedule` numbers them:
    it is checked unless the caller says they are (`numbered`: compile's numbering, whose check was already made
    or holds by construction — the check is a running maximum over every op, 6 µs of ~45 at p = 8, m = 64)."""
    n = len(task)
    if schedule.level != "stage" or not n:
        return None
    # `dependency_arrays`' checks in its order, so this raises (a synchronous schedule without micro-batches)
    # exactly where it would, and turns down what it turns down.
    if int(iteration.min()) < 0:
        return None
    span = int(iteration.max()) + 1
    if len(tasks) * span > MAX_INDEX_CELLS:
        return None
    for kind, unit in tasks:  # one pass, not two generators (a few µs a call)
        if unit < 0 or kind not in STAGE_KINDS:
            return None  # `dependencies()` raises
    rows = _rows_of(tuple(tasks), stages)
    if rows is None:
        return None
    if schedule.synchronous and span > _microbatches(schedule):
        return None  # more than one step: the step edges
    if not numbered and not numbered_by_first_appearance(task, len(tasks)):
        return None  # the role codes below are numbered by first appearance only then (see `_task_rows`)
    # The (task, micro-batch) → op table, flat, with one more task row of −1: a missing producer task indexes
    # it, so no mask is needed before the lookup. int32 op numbers, as `dependency_arrays` has them.
    index = np.full((len(tasks) + 1) * span, -1, dtype=np.int32 if n < INT32_MAX else np.int64)
    index[task * span + iteration] = np.arange(n, dtype=np.int64)
    # Every op's rows are its task's, consumer-major: `take` from the per-task tables (ten times fancy indexing's
    # speed on these small tables).
    count = rows.count.take(task)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=ptr[1:])
    # A task's rows are numbered consecutively (`_task_rows`): entry e of op j is row first[task[j]] + e − ptr[j].
    # Five calls on flat arrays; picking the cells out of the (op, slot) tables by a mask took twice as long.
    cells = (rows.first.take(task) - ptr[:-1]).repeat(count) + np.arange(int(ptr[-1]), dtype=np.int64)
    at = iteration.repeat(count)
    producer = index.take(rows.src.take(cells) * span + at)
    if rows.alt is not None:  # where src has no op at that micro-batch, the row's alternative
        producer = np.where(producer < 0, index.take(rows.alt.take(cells) * span + at), producer)
    if (producer < 0).any():
        return None  # a missing producer: `dependency_arrays` gives None too, and `dependencies()` says which
    return DependencyArrays(ptr, producer, rows.words.take(cells), rows.role.take(cells), rows.roles)


@dataclass(frozen=True)
class _TaskRows:
    """`_stage_rules`' rows, numbered in the order they are met: per row, its producer task, its alternative
    producer task (None when no row needs one), its words and role code (in `dependency_arrays`' dtypes); per
    task (the last: none, the index table's −1 row), how many rows it has and the number of its first (its
    others follow it: a task's rows are met one after another). Read-only: `_rows_of` shares them between
    calls."""

    src: np.ndarray
    alt: np.ndarray | None
    words: np.ndarray
    role: np.ndarray
    count: np.ndarray
    first: np.ndarray
    roles: tuple[str, ...]


#: Task lists whose rows `_rows_of` keeps (a scheduler times many candidates of one pipeline's tasks).
MEMO_SIZE = 64


def _rows_of(tasks: tuple[tuple[str, int], ...], stages: StageInfo | None) -> _TaskRows | None:
    """`_task_rows`, kept per (tasks, stages): they depend on nothing else, and building them (a Python pass
    over the tasks and seven small arrays) was a third of the builder's time at p = 8."""
    try:
        return _memo_rows(tasks, stages)
    except TypeError:  # a StageInfo holding lists (unhashable): built for this call
        return _task_rows(tasks, stages)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _memo_rows(tasks: tuple[tuple[str, int], ...], stages: StageInfo | None) -> _TaskRows | None:
    return _task_rows(tasks, stages)


def _task_rows(tasks: Sequence[tuple[str, int]], stages: StageInfo | None) -> _TaskRows | None:
    """The rows of `_stage_rules` per task (see `_TaskRows`); None where the op-by-op rules would raise (a stage
    without word counts). Role codes in the order the rows are met, as `_stage_rules` adds them: with tasks
    numbered by first appearance (and every op of a task having all its task's rows) that is the order the
    roles first appear among the dependencies, the numbering `dependency_arrays` gives them."""
    num_stages = stages.num_stages if stages else 1 + max((unit for _, unit in tasks), default=-1)
    info = stages or StageInfo(num_stages)
    for kind, s in tasks:  # the checks of `_stage_rules`
        if kind == "F" and s > 0 and info.forward_words and s >= len(info.forward_words):
            return None
        if kind in ("B", "I") and s < num_stages - 1 and info.backward_words and s >= len(info.backward_words):
            return None
    task_id = {t: k for k, t in enumerate(tasks)}
    none = len(tasks)  # the index table's row of −1
    get = task_id.get
    src: list[int] = []
    alt: list[int] = []
    words: list[int] = []
    role: list[int] = []
    first: list[int] = []
    count: list[int] = []
    role_ids: dict[str, int] = {}

    def row(producer: int, other: int, w: int, name: str) -> None:
        if producer == none:  # no such task at all: every op of this row takes the alternative
            producer, other = other, none
        src.append(producer)
        alt.append(other)
        words.append(w)
        role.append(role_ids.setdefault(name, len(role_ids)))

    for kind, s in tasks:  # `_stage_rules`' rows, in its order
        first.append(len(src))
        if kind == "F":
            if s > 0:
                row(get(("F", s - 1), none), none, info.words_into_forward(s), "activation")
        elif kind in ("B", "I"):
            if s < num_stages - 1:
                row(get(("B", s + 1), none), get(("I", s + 1), none), info.words_into_backward(s), "error")
            row(get(("F", s), none), none, 0, "kept")
        else:
            row(get(("I", s), none), none, 0, "kept")
        count.append(len(src) - first[-1])
    first.append(0)  # the index table's row of −1: no rows
    count.append(0)
    fits = not words or (min(words) >= INT32_MIN and max(words) <= INT32_MAX)  # as `dependency_arrays` has them
    arrays = (np.asarray(src, dtype=np.int64), np.asarray(alt, dtype=np.int64) if any(a != none for a in alt) else None,
              np.asarray(words, dtype=np.int32 if fits else np.int64), np.asarray(role, dtype=np.int8),
              np.asarray(count, dtype=np.int64), np.asarray(first, dtype=np.int64))
    for a in arrays:
        if a is not None:
            a.flags.writeable = False  # shared by every call with these tasks (`_rows_of`)
    return _TaskRows(*arrays, tuple(role_ids))

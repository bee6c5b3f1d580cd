"""The stage-level dependency builder (`layerpipe.schedule._stage_deps.stage_dependency_arrays`) gives exactly the
rule table's arrays (`layerpipe.schedule._deps.dependency_arrays`) — values, order, dtypes, role names — wherever
it gives arrays, over every stage-level generator and seeded variations of them: mixed B and I/W ops in one
stage (the alternative producer), ops left out (missing producers), words that need int64, tasks not numbered by
first appearance; and it covers the asynchronous and one-step schedules the simulator times most."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from layerpipe.schedule import (
    Op,
    OpSchedule,
    StageInfo,
    dualpipev,
    gpipe,
    interleaved_1f1b,
    looped_bfs,
    one_f_one_b,
    zb_h1,
    zb_h2,
    zbv,
)
from layerpipe.schedule._deps import DependencyArrays, dependency_arrays
from layerpipe.schedule._engine import _from_columns, _from_ops
from layerpipe.schedule._ir import numbered_by_first_appearance
from layerpipe.schedule._stage_deps import stage_dependency_arrays

GENERATORS: dict[str, Callable[[int, int, int], OpSchedule]] = {
    "gpipe": lambda p, m, steps: gpipe(p, m, steps=steps),
    "1f1b": lambda p, m, steps: one_f_one_b(p, m, steps=steps),
    "zb-h1": lambda p, m, steps: zb_h1(p, m, steps=steps),
    "zb-h1-v2": lambda p, m, steps: zb_h1(p, m, virtual_stages=2, steps=steps),
    "zb-h2": lambda p, m, steps: zb_h2(p, m),
    "zbv": lambda p, m, steps: zbv(p, m, steps=steps),
    "dualpipev": lambda p, m, steps: dualpipev(p, 2 * m),
    "interleaved": lambda p, m, steps: interleaved_1f1b(p, m, 2, steps=steps),
    "looped-bfs": lambda p, m, steps: looped_bfs(p, m),
}


def _numbered(schedule: OpSchedule) -> tuple[tuple[tuple[str, int], ...], np.ndarray, np.ndarray]:
    """(tasks, task, iteration) as `compile_schedule` numbers them."""
    if schedule.columns is not None:
        _, tasks, task, iteration = _from_columns(schedule.columns)
    else:
        _, _, tasks, task, iteration = _from_ops(schedule)
    return tasks, task, iteration


def _arrays(a: DependencyArrays) -> tuple[object, ...]:
    return (*((x.dtype.str, x.shape, x.tobytes()) for x in (a.ptr, a.producer, a.words, a.role)), a.roles)


def _agree(schedule: OpSchedule, stages: StageInfo | None = None,
           numbered: tuple[tuple[tuple[str, int], ...], np.ndarray, np.ndarray] | None = None) -> bool:
    """Does the builder give the rule table's arrays where it gives any? True when it gave them."""
    if numbered is None:
        numbered = _numbered(schedule)
        # `compile_schedule` numbers tasks by first appearance (so `_array_dependencies` skips the builder's check)
        assert numbered_by_first_appearance(numbered[1], len(numbered[0]))
    tasks, task, iteration = numbered
    fast = stage_dependency_arrays(schedule, tasks, task, iteration, stages)
    general = dependency_arrays(schedule, tasks, task, iteration, stages=stages)
    if numbered_by_first_appearance(task, len(tasks)):  # the caller's word for it: the same arrays, or None
        told = stage_dependency_arrays(schedule, tasks, task, iteration, stages, numbered=True)
        assert (told is None) == (fast is None) and (fast is None or _arrays(told) == _arrays(fast))  # type: ignore[arg-type]
    if fast is None:
        return False
    assert general is not None, "the builder gave arrays where the rule table gives none"
    assert _arrays(fast) == _arrays(general)
    return True


def _stage_info(rng: random.Random, stages: int, wide: bool) -> StageInfo:
    top = 1 << 40 if wide else 5000
    return StageInfo(stages, tuple(rng.randrange(top) for _ in range(stages)),
                     tuple(rng.randrange(top) for _ in range(stages)))


def _num_stages(schedule: OpSchedule) -> int:
    return 1 + max(op.unit for op in schedule.ops())


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("procs,micro", [(2, 4), (3, 6), (4, 8), (8, 16)])
def test_the_builder_gives_the_rule_tables_arrays(name: str, procs: int, micro: int) -> None:
    rng = random.Random(f"{name}{procs}{micro}")
    schedule = GENERATORS[name](procs, micro, 1)
    stages = _num_stages(schedule)
    for info in (None, _stage_info(rng, stages, wide=False), _stage_info(rng, stages, wide=True)):
        assert _agree(schedule, info)  # one step or asynchronous: covered


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "zbv", "interleaved"])
def test_several_steps_are_left_to_the_rule_table(name: str) -> None:
    schedule = GENERATORS[name](3, 6, 2)
    assert not _agree(schedule)  # the step edges


def _split_backwards(schedule: OpSchedule, rng: random.Random) -> OpSchedule:
    """Some B(s, t) ops replaced by I(s, t) then W(s, t) on the same processor: stages with both B and I ops, so
    an error input comes from B(s + 1, t) or, where that has no op, I(s + 1, t)."""
    rows = []
    for row in schedule.procs:
        out: list[Op] = []
        for op in row:
            if op.kind == "B" and rng.random() < 0.4:
                out += [replace(op, kind="I"), replace(op, kind="W")]
            else:
                out.append(op)
        rows.append(tuple(out))
    return replace(schedule, procs=tuple(rows))


def _drop_one(schedule: OpSchedule, rng: random.Random) -> OpSchedule:
    places = [(p, k) for p, row in enumerate(schedule.procs) for k in range(len(row))]
    p, k = rng.choice(places)
    return replace(schedule, procs=tuple(row[:k] + row[k + 1:] if q == p else row
                                         for q, row in enumerate(schedule.procs)))


@pytest.mark.parametrize("seed", range(40))
def test_generated_variations_agree(seed: int) -> None:
    rng = random.Random(seed)
    name = rng.choice(sorted(GENERATORS))
    procs = rng.randint(2, 5)
    schedule = GENERATORS[name](procs, procs * rng.randint(1, 3), 1)  # multiples: what every generator takes
    stages = _num_stages(schedule)
    info = rng.choice([None, _stage_info(rng, stages, wide=rng.random() < 0.3)])
    mixed = _split_backwards(schedule, rng)
    assert _agree(mixed, info)
    for _ in range(3):  # an op left out: both give None where a producer is missing, else the same arrays
        _agree(_drop_one(mixed, rng), info)
    # Tasks numbered otherwise than by first appearance: the builder declines (the role numbering relies on it)
    # or agrees.
    tasks, task, iteration = _numbered(mixed)
    order = list(range(len(tasks)))
    rng.shuffle(order)
    renumber = np.asarray(order, dtype=np.int64)
    shuffled = tuple(tasks[order.index(k)] for k in range(len(tasks)))
    _agree(mixed, info, (shuffled, renumber[task], iteration))


def test_what_the_rule_table_turns_down_is_turned_down() -> None:
    schedule = one_f_one_b(2, 4)
    tasks, task, iteration = _numbered(schedule)
    assert stage_dependency_arrays(schedule, tasks, task, iteration - 1) is None  # a negative micro-batch
    odd = tuple(("U", unit) if kind == "W" else (kind, unit) for kind, unit in tasks)
    assert stage_dependency_arrays(schedule, (*odd, ("U", 0)), task, iteration) is None  # not a stage kind
    short = StageInfo(2, (0,), (0,))  # word counts missing for stage 1's forward
    assert stage_dependency_arrays(schedule, tasks, task, iteration, short) is None
    assert dependency_arrays(schedule, tasks, task, iteration, stages=short) is None


def test_the_memo_of_task_rows_is_private_to_each_caller() -> None:
    schedule = zb_h1(3, 6)
    tasks, task, iteration = _numbered(schedule)
    first = stage_dependency_arrays(schedule, tasks, task, iteration)
    assert first is not None
    expected = _arrays(first)
    for a in (first.ptr, first.producer, first.words, first.role):
        a[:] = 0  # a caller's arrays are its own: the next call is not changed
    again = stage_dependency_arrays(schedule, list(tasks), task, iteration)  # equal tasks, any sequence
    assert again is not None and _arrays(again) == expected
    lists = StageInfo(3, [1, 2, 3], [4, 5, 6])  # type: ignore[arg-type] - unhashable: built for the call
    assert _agree(schedule, lists)

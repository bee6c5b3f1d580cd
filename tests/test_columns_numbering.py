"""How a schedule of columns is numbered, without a sort (issue 14: these ran on every `compile_schedule`):

- `OpColumns.first_positions` (a running minimum per task on short rows) against `np.unique`'s first indices;
- `numbered_by_first_appearance` (a running maximum) against its definition from the first positions;
- `_engine._from_columns`, which shares the columns when they are numbered so, against its general path
  (first positions sorted, ids renumbered), on generated columns: tasks missing, ids in any order.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.schedule._engine import _from_columns
from layerpipe.schedule._ir import OpColumns, numbered_by_first_appearance


@st.composite
def columns(draw: st.DrawFn) -> OpColumns:
    num_tasks = draw(st.integers(1, 8))
    rows = draw(st.lists(st.lists(st.integers(0, num_tasks - 1), max_size=12), min_size=1, max_size=4))
    if draw(st.booleans()):  # renumbered by first appearance: the common case, and the fast path's
        seen: dict[int, int] = {}
        rows = [[seen.setdefault(k, len(seen)) for k in row] for row in rows]
        num_tasks = max(len(seen), 1) if draw(st.booleans()) else num_tasks  # or with tasks that have no op
    flat = [k for row in rows for k in row]
    bounds = tuple(np.cumsum([0] + [len(row) for row in rows]).tolist())
    tasks = tuple(("F" if k % 2 else "B", k) for k in range(num_tasks))
    iteration = np.asarray(draw(st.lists(st.integers(0, 5), min_size=len(flat), max_size=len(flat))), np.int64)
    return OpColumns(bounds, tasks, np.asarray(flat, dtype=np.int64), iteration)


def _first_by_sort(c: OpColumns) -> list[int]:
    first = np.full(len(c.tasks), c.num_ops, dtype=np.int64)
    present, at = np.unique(c.task, return_index=True)
    first[present] = at
    return first.tolist()


@settings(max_examples=300, deadline=None)
@given(columns())
def test_first_positions_and_the_numbering_check(c: OpColumns) -> None:
    first = _first_by_sort(c)
    assert c.first_positions().tolist() == first
    expected = all(f < c.num_ops for f in first) and sorted(first) == first
    assert numbered_by_first_appearance(c.task, len(c.tasks)) is expected
    assert c.numbered_by_first_appearance() is expected


@settings(max_examples=300, deadline=None)
@given(columns())
def test_from_columns_shares_what_its_general_path_builds(c: OpColumns) -> None:
    fast = _from_columns(c)
    with pytest.MonkeyPatch.context() as m:  # the general path: first positions sorted, ids renumbered
        m.setattr(OpColumns, "numbered_by_first_appearance", lambda self: False)
        general = _from_columns(c)
    assert fast[0] == general[0] and fast[1] == general[1]
    for a, b in zip(fast[2:], general[2:], strict=True):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()


def test_long_rows_take_the_row_by_row_path() -> None:
    rng = np.random.default_rng(7)
    task = rng.integers(0, 40, 3 * 5000)
    c = OpColumns((0, 5000, 10000, 15000), tuple(("F", k) for k in range(41)), task, np.zeros(len(task), np.int64))
    assert c.first_positions().tolist() == _first_by_sort(c)

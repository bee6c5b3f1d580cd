"""`layerpipe.schedule._int_lists.int64_array` (the engine's int lists written into an int64 array through
`struct`) gives what `np.asarray(values, dtype=np.int64)` gives — the same values and dtype, or the same error —
on generated lists: ints across the whole int64 range and past it, bools, numpy ints, floats, lists longer than
one `struct` call takes (a small chunk), empty lists."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import layerpipe.schedule._int_lists as int_lists
from layerpipe.schedule._int_lists import int64_array

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
ODD = st.one_of(st.integers(-(1 << 70), 1 << 70), st.booleans(), INT64.map(np.int64),
                st.floats(-1e15, 1e15, allow_nan=False))


def numpy_result(values: list) -> tuple[str, object]:
    try:
        made = np.asarray(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError) as error:
        return "error", type(error)
    return "array", (made.dtype.str, made.shape, made.tobytes())


def ours(values: list) -> tuple[str, object]:
    try:
        made = int64_array(values)
    except (OverflowError, TypeError, ValueError) as error:
        return "error", type(error)
    assert made.flags.writeable  # results are the callers' own arrays, as numpy's are
    return "array", (made.dtype.str, made.shape, made.tobytes())


@settings(max_examples=300, deadline=None)
@given(st.lists(INT64, max_size=40), st.integers(1, 7))
def test_int64_lists_are_numpys_arrays(values: list[int], chunk: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(int_lists, "CHUNK", chunk)  # several `struct` calls per list
        assert ours(values) == numpy_result(values)
    assert ours(values) == numpy_result(values)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(INT64, ODD), max_size=20))
def test_anything_else_is_what_numpy_makes_of_it(values: list) -> None:
    assert ours(values) == numpy_result(values)

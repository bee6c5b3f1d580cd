"""`layerpipe.schedule._int_lists.int64_array` (the engine's int lists written into an int64 array through
`struct`) gives what `np.asarray(values, dtype=np.int64)` gives — the same values and dtype, or the same error —
on generated lists: ints across the whole int64 range and past it, bools, numpy ints, floats, lists longer than
one `struct` call takes (a small chunk), empty lists. `stable_argsort` (the engine's stable sorts of integer keys
as one or two 16-bit radix passes) gives `np.argsort(keys, kind="stable")`'s permutation on generated keys of
every integer dtype, with ranges below 16 bits, between 16 and 32 bits (two passes) and wider; `sorted_unique` gives
`np.unique(values)` (values, dtype, shape) on integer arrays of every dtype, 1-D and 2-D."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import layerpipe.schedule._int_lists as int_lists
from layerpipe.schedule._int_lists import int64_array, sorted_unique, stable_argsort

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


DTYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(DTYPES), st.sampled_from((1, 1 << 8, 1 << 16, (1 << 16) + 1, 1 << 32, 1 << 40)),
       st.integers(0, 60), st.booleans())
def test_stable_argsort_is_numpys_stable_argsort(data: st.DataObject, dtype: type, span: int, size: int,
                                                 short: bool) -> None:
    info = np.iinfo(dtype)
    span = min(span, int(info.max) - int(info.min))
    low = data.draw(st.integers(int(info.min), int(info.max) - span))
    # Few distinct values as often as many: the stable order among equal keys is what the passes must keep.
    pool = data.draw(st.lists(st.integers(low, low + span), min_size=1, max_size=8))
    keys = np.asarray(data.draw(st.lists(st.one_of(st.sampled_from(pool), st.integers(low, low + span)),
                                         max_size=size)), dtype=dtype)
    with pytest.MonkeyPatch.context() as patch:
        if short:
            patch.setattr(int_lists, "SMALL_SORT", 0)  # the radix passes on short arrays too
        got = stable_argsort(keys)
    want = np.argsort(keys, kind="stable")
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(DTYPES), st.data(), st.integers(0, 40), st.booleans())
def test_sorted_unique_is_numpys_unique(dtype: type, data: st.DataObject, size: int, square: bool) -> None:
    info = np.iinfo(dtype)
    values = data.draw(st.lists(st.integers(int(info.min), int(info.max)) | st.integers(0, 3), min_size=size,
                                max_size=size))
    keys = np.asarray(values, dtype=dtype)
    if square and size % 2 == 0:
        keys = keys.reshape(2, -1)  # flattened, as numpy's is
    got, want = sorted_unique(keys), np.unique(keys)
    assert (got.dtype, got.shape, got.tolist()) == (want.dtype, want.shape, want.tolist())

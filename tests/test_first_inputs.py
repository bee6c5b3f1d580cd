"""`layerpipe.schedule._runs.first_inputs` (the op sweep's inputs: each op's first needed input, the rest for ops
with more, from running counts over the CSR entries) gives what the per-op lists give
(`split_first(needed_input_lists(...))`), on generated CSR arrays — through the running counts, and through
`_first_of_pairs` where no op has more than two entries: inputs on the op's own processor before and
after it, on other processors, transfer inputs numbered past the ops, ops with none, one or several."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.schedule._runs import PAIRS, _first_of_pairs, first_inputs, needed_input_lists, split_first


@st.composite
def csr(draw: st.DrawFn, per_op: int = 3) -> tuple[list[int], np.ndarray, np.ndarray, int]:
    rows = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
    bounds = np.cumsum([0, *rows]).tolist()
    n = bounds[-1]
    transfers = draw(st.integers(0, 3))
    inputs = [draw(st.lists(st.integers(0, max(n + transfers - 1, 0)), max_size=per_op)) if n + transfers else []
              for _ in range(n)]
    ptr = np.cumsum([0, *map(len, inputs)])
    dtype = draw(st.sampled_from([np.int32, np.int64]))  # the compiled arrays narrow to int32 where they fit
    src = np.asarray([x for row in inputs for x in row], dtype=dtype)
    return bounds, ptr.astype(dtype), src, n + transfers


@settings(max_examples=400, deadline=None)
@given(csr())
def test_first_inputs_are_the_per_op_lists(made: tuple[list[int], np.ndarray, np.ndarray, int]) -> None:
    bounds, ptr, src, sentinel = made
    assert first_inputs(bounds, ptr, src, sentinel) == split_first(needed_input_lists(bounds, ptr, src), sentinel)


@settings(max_examples=400, deadline=None)
@given(csr(per_op=PAIRS))
def test_first_of_pairs_is_the_per_op_lists(made: tuple[list[int], np.ndarray, np.ndarray, int]) -> None:
    """At most two entries per op (every stage-level schedule): `_first_of_pairs`, checked directly."""
    bounds, ptr, src, sentinel = made
    expected = split_first(needed_input_lists(bounds, ptr, src), sentinel)
    assert first_inputs(bounds, ptr, src, sentinel) == expected
    if bounds[-1]:
        assert _first_of_pairs(bounds, ptr, src, ptr[1:] - ptr[:-1], sentinel) == expected

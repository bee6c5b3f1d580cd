"""`layerpipe.sim._memory._stage_activation_peaks` (a stage-level run's activation peaks from running sums at each F
op, no sort of every change) gives what the general path gives — `_peaks_at_once` over
`_stage_activation_intervals`, and `peak_memory` without `engine_times` — on generated engine-like timings (every
op starting no earlier than the one before it on its processor ends, from cycle 0): zero-cycle ops, releases at the
very cycle of an allocation, processors without ops or without F ops, stages of equal and of different sizes
(zeros among them), micro-batches listed twice. And `simulate()` reports the same peaks through either path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.schedule import one_f_one_b, zb_h1
from layerpipe.schedule._engine import CompiledSchedule
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.sim import Workload, simulate
from layerpipe.sim._memory import _peaks_at_once, _stage_activation_intervals, _stage_activation_peaks, peak_memory

EMPTY = np.zeros(0, dtype=np.int64)


@st.composite
def stage_runs(draw: st.DrawFn) -> tuple[CompiledSchedule, np.ndarray, np.ndarray, Workload]:
    procs = draw(st.integers(1, 4))
    stages = draw(st.integers(1, 4))
    op = st.tuples(st.sampled_from("FBIW"), st.integers(0, stages - 1), st.integers(0, 4))
    rows = [draw(st.lists(op, max_size=8)) for _ in range(procs)]
    tasks = list(dict.fromkeys((kind, unit) for row in rows for kind, unit, _ in row))
    ids = {t: k for k, t in enumerate(tasks)}
    start, end = [], []
    for row in rows:
        t = draw(st.integers(0, 3))
        for _ in row:
            t += draw(st.integers(0, 3))  # idle before the op
            start.append(t)
            t += draw(st.integers(0, 3))  # its cycles (zero too)
            end.append(t)
    flat = [o for row in rows for o in row]
    bounds = np.cumsum([0, *map(len, rows)]).tolist()
    schedule = OpSchedule("stage", tuple(tuple(Op(p, k, u, i) for k, u, i in row) for p, row in enumerate(rows)))
    none = np.zeros(0, dtype=np.int32)
    compiled = CompiledSchedule(schedule, bounds, (0,) * len(tasks), tuple(tasks),
                                np.asarray([ids[(k, u)] for k, u, _ in flat], dtype=np.int64),
                                np.asarray([i for _, _, i in flat], dtype=np.int64),
                                np.zeros(len(flat) + 1, dtype=np.int32), none, none, none.astype(np.int8), ())
    sizes = draw(st.one_of(st.just([1] * stages), st.lists(st.integers(0, 9), min_size=stages, max_size=stages)))
    workload = Workload.of_stages([(1, 1, 1)] * stages, activation_words=sizes)
    return compiled, np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64), workload


@settings(max_examples=500, deadline=None)
@given(stage_runs())
def test_stage_activation_peaks_are_the_general_peaks(run: tuple[CompiledSchedule, np.ndarray, np.ndarray,
                                                                 Workload]) -> None:
    c, start, end, workload = run
    fast = _stage_activation_peaks(c, start, end, workload)
    if not c.num_ops:
        assert fast is None
        return
    where, lo, hi, words = _stage_activation_intervals(c, start, end, workload)
    assert fast == _peaks_at_once(c.num_procs, [where, where, EMPTY], [lo, hi, EMPTY], [words, -words, EMPTY])
    assert fast == peak_memory(c, start, end, EMPTY, workload, "stash")
    assert fast == peak_memory(c, start, end, EMPTY, workload, "stash", engine_times=True)


@pytest.mark.parametrize("generate", [one_f_one_b, zb_h1])
@pytest.mark.parametrize("sizes", [None, [3, 0, 5, 2]])
def test_simulate_reports_the_general_peaks(generate, sizes: list[int] | None) -> None:
    workload = Workload.of_stages([(7, 9, 5)] * 4, activation_words=sizes)
    result = simulate(generate(4, 9), workload)
    general = peak_memory(result._compiled, result.start, result.end, EMPTY, workload, "stash")
    assert _stage_activation_peaks(result._compiled, result.start, result.end, workload) is not None
    assert list(result.peak_memory_words) == general

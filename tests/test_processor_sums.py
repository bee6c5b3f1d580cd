"""`layerpipe.sim._report.processor_sums` (busy cycles, bubble cycles and bubbles per processor from one
`add.reduceat`, what a result of the engine reports) gives what the figures' own passes give — `SimResult`'s general
path, taken by a result built from its fields (no compiled schedule) — on generated processor-major timings:
processors without ops, ops that overlap or leave negative gaps, zero-cycle ops. And a full `simulate()` reports the
same figures through either path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.schedule import one_f_one_b, zb_h1
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.sim import SimConfig, SimResult, Workload, simulate
from layerpipe.sim._report import processor_sums


def general_figures(bounds: list[int], start: np.ndarray, end: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """busy, bubble cycles and bubbles of a `SimResult` built from its fields: the per-figure passes."""
    procs = [[Op(p, "F", p, k) for k in range(bounds[p + 1] - bounds[p])] for p in range(len(bounds) - 1)]
    schedule = OpSchedule("stage", tuple(tuple(row) for row in procs))
    ops = tuple(op for row in procs for op in row)
    result = SimResult(schedule, SimConfig(), ops, start, end, np.full(len(ops), -1), (0,) * len(procs), {})
    assert result._processor_sums is None  # not a result of the engine: the general path
    return list(result.busy_cycles), list(result.bubble_cycles), [len(b) for b in result.bubbles]


@st.composite
def timings(draw: st.DrawFn) -> tuple[list[int], np.ndarray, np.ndarray]:
    rows = draw(st.lists(st.integers(0, 7), min_size=1, max_size=5))
    bounds = np.cumsum([0, *rows]).tolist()
    n = bounds[-1]
    start = np.asarray(draw(st.lists(st.integers(-5, 60), min_size=n, max_size=n)), dtype=np.int64)
    length = np.asarray(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), dtype=np.int64)
    return bounds, start, start + length


@settings(max_examples=400, deadline=None)
@given(timings())
def test_processor_sums_are_the_general_figures(made: tuple[list[int], np.ndarray, np.ndarray]) -> None:
    bounds, start, end = made
    assert processor_sums(start, end, bounds) == general_figures(bounds, start, end)


@pytest.mark.parametrize("generate", [one_f_one_b, zb_h1])
@pytest.mark.parametrize("config", [SimConfig(), SimConfig.links(latency=2, words_per_cycle=1)])
def test_simulate_reports_the_same_through_either_path(generate, config: SimConfig) -> None:
    schedule = generate(4, 9)
    workload = Workload.of_stages([(7, 9, 5)] * 4)
    fused = simulate(schedule, workload, config)
    general = simulate(schedule, workload, config)
    general.__dict__["_processor_sums"] = None  # the figures one at a time
    assert fused._processor_sums is not None
    assert fused.metrics() == general.metrics()
    assert fused.bubble_cycles == general.bubble_cycles and fused.busy_cycles == general.busy_cycles

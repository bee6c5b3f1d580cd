"""The one-input sweep of stage-level schedules on `shared` (`layerpipe.schedule._engine._sweep_single`) times
what the op-by-op sweep times, for every stage-level generator and several sizes, and leaves deadlocks to the
sweeps that report them (the same report as before)."""

from __future__ import annotations

import pytest

from layerpipe.schedule import OpSchedule, dualpipev, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
from layerpipe.schedule._engine import compile_schedule, run_timing
from layerpipe.schedule._op_sweep import _sweep, _sweep_single
from layerpipe.sim import DeadlockError, Workload

GENERATORS = {
    "1f1b": lambda p, m: one_f_one_b(p, m),
    "zb-h1": lambda p, m: zb_h1(p, m),
    "gpipe": lambda p, m: gpipe(p, m),
    "interleaved": lambda p, m: interleaved_1f1b(p, m, 2),
    "dualpipev": lambda p, m: dualpipev(p, 2 * m),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("procs,micro", [(2, 4), (3, 6), (8, 16)])
def test_the_one_input_sweep_times_what_the_op_sweep_times(name: str, procs: int, micro: int) -> None:
    schedule = GENERATORS[name](procs, micro)
    stages = 1 + max(op.unit for op in schedule.ops())
    compiled = compile_schedule(schedule, Workload.of_stages([(3 + s % 2, 4, 2 + s % 3) for s in range(stages)]))
    expected = _sweep(compiled, compiled.prods)
    single = _sweep_single(compiled)
    if single is None:  # an op needing two inputs from elsewhere: the general sweep times it
        assert compiled.sweep_first[1] is not None
    else:
        assert (single[0].tolist(), single[1].tolist()) == expected
    start, end = run_timing(compiled)
    assert (start.tolist(), end.tolist()) == expected


def test_a_deadlock_is_reported_by_the_op_sweep() -> None:
    text = ("# layerpipe schedule v1 level=stage procs=2 synchronous microbatches=2\n"
            "p0: F0.0 F0.1 B0.0 B0.1\np1: B1.0 F1.0 F1.1 B1.1\n")
    stuck = compile_schedule(OpSchedule.from_text(text), Workload.of_stages([(1, 2, 0), (1, 2, 0)]))
    assert _sweep_single(stuck) is None
    with pytest.raises(DeadlockError) as by_engine:
        run_timing(stuck)
    with pytest.raises(DeadlockError) as by_sweep:
        _sweep(stuck, stuck.prods)
    assert str(by_engine.value) == str(by_sweep.value)

"""`_partial_timing` (the dry run on op numbers) gives what `_partial_timing_by_op` (keyed by op, the
straightforward form) gives: the same times in the same order, the same blocked heads, on generated
schedules — real ones from the policies with rows shuffled (so some deadlock), and random op lists with
dependencies on ops outside the schedule, repeated producers and repeated ops."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.schedule import dependencies, make_schedule
from layerpipe.schedule._deps import Dependency
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._validate import _partial_timing, _partial_timing_by_op
from tests.schedule_reference import FAST
from tests.strategies import networks

MODEL = make_cost_model("pe")


def _same(schedule: OpSchedule, deps: dict[Op, tuple[Dependency, ...]], cost: dict[Op, int]) -> None:
    try:
        expected_times, expected_blocked = _partial_timing_by_op(schedule, deps, cost.__getitem__)
    except KeyError:  # rows that repeat an op can meet it before its earlier copy has a time
        with pytest.raises(KeyError):
            _partial_timing(schedule, deps, cost.__getitem__)
        return
    times, blocked = _partial_timing(schedule, deps, cost.__getitem__)
    assert list(times.items()) == list(expected_times.items())
    assert blocked == expected_blocked


@FAST
@given(net=networks(max_layers=5, dag=True, max_width=8), n=st.integers(1, 4),
       policy=st.sampled_from(("layerpipe", "pipedream", "gpipe", "1f1b", "zb-h1", "ooo")),
       seed=st.integers(0, 2**16), shuffle=st.booleans())
def test_dry_run_on_numbers_equals_by_op_on_policy_schedules(net, n, policy, seed, shuffle) -> None:
    result = make_schedule(policy, net, n, MODEL)
    schedule = result.explicit if result.explicit is not None else result.periodic.unroll(4)
    deps = dependencies(schedule, result.graph, result.stages)
    rng = random.Random(seed)
    rows = [list(row) for row in schedule.procs]
    if shuffle:
        p = rng.randrange(len(rows))
        rng.shuffle(rows[p])
    shuffled = OpSchedule(schedule.level, tuple(tuple(row) for row in rows), schedule.synchronous,
                          schedule.microbatches)
    _same(shuffled, deps, {op: rng.randrange(4) for row in rows for op in row})


@FAST
@given(data=st.data(), n=st.integers(1, 4), size=st.integers(0, 12))
def test_dry_run_on_numbers_equals_by_op_on_random_ops(data, n, size) -> None:
    universe = [Op(data.draw(st.integers(0, n - 1)), "F", u, 0) for u in range(size + 3)]
    picks = data.draw(st.lists(st.integers(0, len(universe) - 1), max_size=size))  # may repeat an op
    rows: list[list[Op]] = [[] for _ in range(n)]
    for k in picks:
        rows[data.draw(st.integers(0, n - 1))].append(universe[k])
    deps = {op: tuple(Dependency(universe[k], 0, "activation")
                      for k in data.draw(st.lists(st.integers(0, len(universe) - 1), max_size=3)))
            for op in universe if data.draw(st.booleans())}
    cost = {op: data.draw(st.integers(0, 3)) for op in universe}
    _same(OpSchedule("layer", tuple(tuple(row) for row in rows)), deps, cost)

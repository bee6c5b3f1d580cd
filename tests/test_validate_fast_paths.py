"""The validator's fast paths give what the straightforward forms give, on generated schedules.

- `_partial_timing` (the dry run on op numbers) against `_partial_timing_by_op` (keyed by op): the same times
  in the same order, the same blocked heads — on real schedules from the policies with a row shuffled (so
  some deadlock), and random op lists with dependencies on ops outside the schedule, repeated producers, producers
  equal to an op but not the same object, and repeated ops;
- `_stage_dependencies` (tuples built at once, first forwards asked by key) against
  `reference_stage_dependencies` (tests/schedule_reference.py): the same map in the same order, or the same
  error — on the stage programs and on random stage-level op lists (missing producers, repeated ops, wrong
  kinds);
- `validate_periodic` (the unfolded edges as tuples, labels made only for a failure) against
  `reference_validate_periodic`: the same verdict and the same error (summary, grid, step, processor) on the
  policies' periodic schedules with a slot moved (so some break a rule), with and without a transfer cost and
  a staleness bound;
- `dependencies` (each `Dependency` made by `_dependency`, without the frozen dataclass's `__init__`) against
  the same rules with the dataclass's constructor: equal maps of equal objects, layer- and stage-level;
- `_check_duplicates` and `_check_counts` (checks on sets of keys, the op-by-op walk only to name a fault)
  against `reference_check_duplicates` and `reference_check_counts`: the same verdict and error on the
  policies' explicit schedules, layer- and stage-level, with an op dropped, repeated, renamed or moved.
"""

from __future__ import annotations

import random
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.schedule import _deps, dependencies, make_schedule
from layerpipe.schedule._deps import Dependency, MissingProducer, StageInfo, _stage_dependencies, expand_stages
from layerpipe.schedule._ir import Op, OpSchedule, ScheduleError
from layerpipe.schedule._layerpipe import LayerPipeOptions
from layerpipe.schedule._periodic import make_slot
from layerpipe.schedule._stage_programs import dualpipev, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
from layerpipe.schedule._validate import (
    _check_counts,
    _check_duplicates,
    _partial_timing,
    _partial_timing_by_op,
    validate_periodic,
)
from tests.schedule_reference import (
    FAST,
    reference_check_counts,
    reference_check_duplicates,
    reference_stage_dependencies,
    reference_validate_periodic,
)
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
    # Producers are the schedule's own objects or equal copies; the map's keys in the rows' order or not.
    deps = {op: tuple(Dependency(replace(universe[k]) if data.draw(st.booleans()) else universe[k], 0, "activation")
                      for k in data.draw(st.lists(st.integers(0, len(universe) - 1), max_size=3)))
            for op in universe if data.draw(st.booleans())}
    if data.draw(st.booleans()):
        deps = {op: deps.get(op, ()) for row in rows for op in row}
    cost = {op: data.draw(st.integers(0, 3)) for op in universe}
    _same(OpSchedule("layer", tuple(tuple(row) for row in rows)), deps, cost)


def _same_stage_dependencies(schedule: OpSchedule, stages: StageInfo | None) -> None:
    by_key: dict[tuple[str, int, int], Op] = {}
    for op in schedule.ops():
        by_key.setdefault(op.key, op)
    try:
        expected = reference_stage_dependencies(schedule, by_key, stages)
    except (InputError, IndexError) as exc:  # ScheduleError, MissingProducer; IndexError: stages too few
        with pytest.raises(type(exc)) as caught:
            _stage_dependencies(schedule, by_key, stages)
        assert str(caught.value) == str(exc)
        if isinstance(exc, MissingProducer):
            assert (caught.value.consumer, caught.value.key) == (exc.consumer, exc.key)
        return
    assert list(_stage_dependencies(schedule, by_key, stages).items()) == list(expected.items())


@FAST
@given(program=st.sampled_from((gpipe, one_f_one_b, zb_h1, interleaved_1f1b, dualpipev)), procs=st.integers(1, 4),
       microbatches=st.integers(1, 4), steps=st.integers(1, 3), words=st.booleans())
def test_stage_dependencies_equal_the_reference_on_stage_programs(program, procs, microbatches, steps,
                                                                  words) -> None:
    try:
        schedule = program(procs, microbatches, steps=steps)
    except InputError:  # a program that does not take these sizes
        return
    num_stages = 1 + max(op.unit for op in schedule.ops())
    stages = StageInfo(num_stages, tuple(range(num_stages)), tuple(range(5, 5 + num_stages))) if words else None
    _same_stage_dependencies(schedule, stages)


@FAST
@given(data=st.data(), n=st.integers(1, 3), size=st.integers(0, 14), synchronous=st.booleans(),
       microbatches=st.integers(1, 3), num_stages=st.integers(0, 4))
def test_stage_dependencies_equal_the_reference_on_random_ops(data, n, size, synchronous, microbatches,
                                                              num_stages) -> None:
    ops = st.builds(Op, st.integers(0, n - 1), st.sampled_from("FBIWX"), st.integers(0, 3), st.integers(0, 5))
    rows = [data.draw(st.lists(ops, max_size=size)) for _ in range(n)]  # may repeat an op, or miss producers
    schedule = OpSchedule("stage", tuple(tuple(row) for row in rows), synchronous, microbatches if synchronous else 0)
    _same_stage_dependencies(schedule, StageInfo(num_stages, tuple(range(num_stages))) if num_stages else None)


@FAST
@given(net=networks(max_layers=5, dag=True, max_width=8), n=st.integers(1, 4),
       policy=st.sampled_from(("layerpipe", "layerpipe-unfold", "pipedream", "ooo")), seed=st.integers(0, 2**16),
       move=st.sampled_from(("none", "start", "lag")), comm=st.booleans(),
       max_staleness=st.none() | st.integers(0, 3))
def test_validate_periodic_equals_the_reference(net, n, policy, seed, move, comm, max_staleness) -> None:
    if policy == "layerpipe-unfold":
        result = make_schedule("layerpipe", net, n, MODEL, LayerPipeOptions(unfold=2))
    else:
        result = make_schedule(policy, net, n, MODEL)
    schedule = result.periodic
    assume(schedule is not None)  # some policies give an explicit schedule on one processor
    rng = random.Random(seed)
    bodies = [list(body) for body in schedule.bodies]
    p = rng.choice([p for p, body in enumerate(bodies) if body])
    k = rng.randrange(len(bodies[p]))
    s = bodies[p][k]
    if move == "start":
        bodies[p][k] = make_slot(max(0, s.start + rng.randint(-3, 3)), s.kind, s.layer, s.lag, s.phase)
    elif move == "lag":
        bodies[p][k] = make_slot(s.start, s.kind, s.layer, s.lag + rng.randint(-2, 1), s.phase)
    schedule = replace(schedule, bodies=tuple(tuple(body) for body in bodies))
    cost = (lambda words: 1 + words // 4) if comm else None
    try:
        reference_validate_periodic(schedule, result.graph, comm=cost, max_staleness=max_staleness)
    except ScheduleError as exc:
        with pytest.raises(ScheduleError) as caught:
            validate_periodic(schedule, result.graph, comm=cost, max_staleness=max_staleness)
        got = caught.value
        assert (got.summary, got.grid, got.step, got.proc) == (exc.summary, exc.grid, exc.step, exc.proc)
        return
    validate_periodic(schedule, result.graph, comm=cost, max_staleness=max_staleness)


def _same_verdict(check, reference, *args) -> None:  # type: ignore[no-untyped-def]
    try:
        reference(*args)
    except ScheduleError as exc:
        with pytest.raises(ScheduleError) as caught:
            check(*args)
        got = caught.value
        assert (got.summary, got.grid, got.proc) == (exc.summary, exc.grid, exc.proc)
        return
    check(*args)


@FAST
@given(net=networks(max_layers=5, dag=True, max_width=8), n=st.integers(1, 4),
       policy=st.sampled_from(("gpipe", "1f1b", "zb-h1", "layerpipe", "pipedream")),
       seed=st.integers(0, 2**16), change=st.sampled_from(("none", "drop", "repeat", "kind", "iteration", "move")))
def test_explicit_checks_equal_the_reference(net, n, policy, seed, change) -> None:
    result = make_schedule(policy, net, n, MODEL)
    # Stage-level programs (synchronous policies) and unrolled layer-level schedules.
    schedule = result.explicit if result.explicit is not None else result.periodic.unroll(3)
    graph = result.graph
    rng = random.Random(seed)
    rows = [list(row) for row in schedule.procs]
    p = rng.choice([p for p, row in enumerate(rows) if row])
    k = rng.randrange(len(rows[p]))
    op = rows[p][k]
    if change == "drop":
        del rows[p][k]
    elif change == "repeat":
        rows[p].insert(rng.randrange(len(rows[p]) + 1), replace(op))
    elif change == "kind":
        kinds = ("F", "B", "I", "W") if schedule.level == "stage" else ("F", "E", "G", "U", "AEG")
        rows[p][k] = replace(op, kind=rng.choice(kinds))
    elif change == "iteration":
        rows[p][k] = replace(op, iteration=op.iteration + rng.choice((-1, 1, 5)))
    elif change == "move":
        q = rng.randrange(len(rows))
        del rows[p][k]
        rows[q].insert(rng.randrange(len(rows[q]) + 1), replace(op, proc=q))
    changed = replace(schedule, procs=tuple(tuple(row) for row in rows))
    stages = result.stages if schedule.level == "stage" else None
    _same_verdict(_check_duplicates, reference_check_duplicates, changed)
    _same_verdict(_check_counts, reference_check_counts, changed, graph, stages, changed.num_iterations)
    _same_verdict(_check_counts, reference_check_counts, changed, graph, stages, schedule.num_iterations)


@FAST
@given(net=networks(max_layers=5, dag=True, max_width=8), n=st.integers(1, 4), unfold=st.sampled_from((1, 2)),
       policy=st.sampled_from(("gpipe", "1f1b", "zb-h1", "layerpipe", "pipedream", "pipedream-2bw")),
       expand=st.booleans())
def test_dependencies_equal_those_of_the_dataclass_constructor(net, n, unfold, policy, expand) -> None:
    options = LayerPipeOptions(unfold=unfold) if policy == "layerpipe" else None
    result = make_schedule(policy, net, n, MODEL, options)
    if result.explicit is not None:  # a stage-level program, or its layer-level expansion
        schedule = expand_stages(result.explicit, result.graph, result.stages) if expand else result.explicit
    else:
        schedule = result.periodic.unroll(5)
    fast = dependencies(schedule, result.graph, result.stages)
    with mock.patch.object(_deps, "_dependency", Dependency):
        expected = dependencies(schedule, result.graph, result.stages)
    assert list(fast.items()) == list(expected.items())
    for made, plain in zip((d for ds in fast.values() for d in ds), (d for ds in expected.values() for d in ds),
                           strict=True):
        assert type(made) is Dependency and vars(made) == vars(plain) and hash(made) == hash(plain)

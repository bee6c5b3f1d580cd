"""Issue 14's array paths against the object paths they replace: schedules held as columns (`OpColumns`), the
stage-level generators, `expand_stages` and `PeriodicSchedule.unroll` building columns, the run sweep
(`layerpipe.schedule._runs`) against the op-by-op sweep (`layerpipe.schedule._engine._sweep`), deadlocks
included; results that compute their figures when read; the synchronous step cap.
"""

from __future__ import annotations

import dataclasses
import pickle
import random

import numpy as np
import pytest

from layerpipe.costs import make_cost_model
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import (
    Op,
    OpSchedule,
    PeriodicSchedule,
    StageInfo,
    _stage_programs,
    make_schedule,
    policy_options,
)
from layerpipe.schedule._deps import STAGE_GRADIENT_KINDS, expand_stages
from layerpipe.schedule._engine import _hold_cycles, compile_schedule
from layerpipe.schedule._ir import OpColumns, op_order_key
from layerpipe.schedule._op_sweep import _run_sweep, _sweep
from layerpipe.schedule._runs import Runs, make_runs
from layerpipe.schedule._sync_policies import MAX_STEP_SLOTS, _check_step_size, contiguous_stages
from layerpipe.schedule._workload import Workload
from layerpipe.sim import DeadlockError

GENERATORS = {
    "gpipe": lambda p, m: _stage_programs.gpipe(p, m, 2),
    "1f1b": lambda p, m: _stage_programs.one_f_one_b(p, m, 3),
    "zb-h1": lambda p, m: _stage_programs.zb_h1(p, m, 1, 2),
    "zb-h2": lambda p, m: _stage_programs.zb_h2(p, m),
    "interleaved": lambda p, m: _stage_programs.interleaved_1f1b(p, m, 2, 2),
    "zbv": lambda p, m: _stage_programs.zbv(p, m, 2),
    "looped-bfs": lambda p, m: _stage_programs.looped_bfs(p, m),
}


def _plain(schedule: OpSchedule) -> OpSchedule:
    """The same schedule held as `Op` rows."""
    return OpSchedule(schedule.level, tuple(tuple(row) for row in schedule.procs), schedule.synchronous,
                      schedule.microbatches)


def test_a_schedule_of_columns_is_the_schedule_of_its_ops() -> None:
    columns = OpColumns((0, 3, 3, 4), (("F", 0), ("B", 0), ("F", 1)), np.array([0, 1, 0, 2]), np.array([0, 0, 1, 0]))
    lazy = OpSchedule.from_columns("stage", columns, synchronous=True, microbatches=2)
    assert not lazy.materialized and lazy.num_procs == 3 and lazy.row_lengths() == [3, 0, 1]
    assert lazy.num_iterations == 2 and not lazy.materialized  # read from the columns
    ops = ((Op(0, "F", 0, 0), Op(0, "B", 0, 0), Op(0, "F", 0, 1)), (), (Op(2, "F", 1, 0),))
    plain = OpSchedule("stage", ops, True, 2)
    assert lazy == plain and hash(lazy) == hash(plain) and lazy.to_text() == plain.to_text()
    assert lazy.materialized and all(type(op.iteration) is int for op in lazy.ops())
    again = pickle.loads(pickle.dumps(OpSchedule.from_columns("stage", columns, synchronous=True, microbatches=2)))
    assert again == plain
    # `replace` with new rows drops the columns: the new schedule is its rows, not the old columns.
    fewer = dataclasses.replace(lazy, procs=((), (), ()))
    assert fewer.columns is None and fewer.num_procs == 3 and list(fewer.ops()) == []
    with pytest.raises(AttributeError):
        _ = lazy.no_such_field  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="unknown fields"):
        OpSchedule.from_columns("stage", columns, steps=2)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators_build_columns_of_the_ops_they_always_built(name: str) -> None:
    schedule = GENERATORS[name](3, 6)
    assert schedule.columns is not None and not schedule.materialized
    workload = Workload.of_stages([(2, 3, 1)] * (1 + max(unit for _, unit in schedule.columns.tasks)))
    compiled = compile_schedule(schedule, workload)
    assert not schedule.materialized  # compiled from the columns
    by_ops = compile_schedule(_plain(schedule), workload)
    for field in ("proc", "bounds", "dur", "tasks"):
        assert getattr(compiled, field) == getattr(by_ops, field), field
    for field in ("task", "iteration", "prod_ptr", "prod_idx", "prod_words", "prod_role"):
        assert np.array_equal(getattr(compiled, field), getattr(by_ops, field)), field
    assert compiled.roles == by_ops.roles and compiled.ops == by_ops.ops


def _reference_expansion(schedule: OpSchedule, graph, stages: StageInfo) -> tuple[tuple[Op, ...], ...]:
    """`expand_stages` op by op, as its docstring states it (the rule the columns must reproduce)."""
    backward: dict[int, list[str]] = {}
    for t in graph.tasks:
        if not t.has("F") and not t.has("U"):
            backward.setdefault(t.layer, []).append(t.kind)
    weighted = {layer.index for layer in graph.network.layers if layer.has_weights}
    m = schedule.microbatches
    remaining: dict[tuple[int, int], int] = {}
    for op in schedule.ops():
        if op.kind in STAGE_GRADIENT_KINDS:
            remaining[(op.unit, op.iteration // m)] = remaining.get((op.unit, op.iteration // m), 0) + 1
    rows = []
    for p, row in enumerate(schedule.procs):
        out: list[Op] = []
        for op in row:
            layers = stages.layers[op.unit]
            if op.kind == "F":
                out += [Op(p, "F", layer, op.iteration) for layer in layers]
            else:
                for layer in reversed(layers):
                    for kind in backward.get(layer, ()):
                        if op.kind == "B" or (op.kind == "I" and "G" not in kind) or (op.kind == "W" and kind == "G"):
                            out.append(Op(p, kind, layer, op.iteration))
            if op.kind in STAGE_GRADIENT_KINDS:
                key = (op.unit, op.iteration // m)
                remaining[key] -= 1
                if not remaining[key]:
                    out += [Op(p, "U", layer, key[1]) for layer in layers if layer in weighted]
        rows.append(tuple(out))
    return tuple(rows)


@pytest.mark.parametrize("net", ["mlp:16-12-8-4", "lenet5", "resnet18"])
@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_expand_stages_builds_the_reference_expansion(net: str, name: str) -> None:
    network = load_network(net)
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    model = make_cost_model("pe", lanes=16)
    for procs, m in ((1, 2), (2, 5), (3, 6)):
        try:
            schedule = GENERATORS[name](procs, m)
        except InputError:
            continue  # a shape the generator refuses (micro-batches per round)
        count = 1 + max(op.unit for op in schedule.ops())
        if count > len(network):
            continue
        info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, count, m))
        expanded = expand_stages(schedule, graph, info)
        assert expanded.columns is not None and not expanded.materialized
        reference = _reference_expansion(_plain(schedule), graph, info)
        assert expanded.procs == reference
        assert expand_stages(_plain(schedule), graph, info).procs == reference  # from Op rows too


def test_expand_stages_errors_name_the_first_offending_op() -> None:
    network = load_network("mlp:16-12-8-4")
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    info = StageInfo.of_network(graph, [[0, 1], [2, 3]])
    rows = _plain(_stage_programs.gpipe(2, 2)).procs
    moved = OpSchedule("stage", (rows[0] + (Op(0, "F", 1, 2),), rows[1]), True, 2)
    with pytest.raises(InputError, match=r"^stage 1 runs on p0 and p1; expansion needs one$"):
        expand_stages(moved, graph, info)
    fused = build_training_graph(network, GraphOptions.pipedream())
    with pytest.raises(InputError, match="needs G as its own task"):
        expand_stages(_stage_programs.zb_h1(2, 2), fused, StageInfo.of_network(fused, [[0, 1], [2, 3]]))


def _runs(compiled, kind: str) -> Runs:
    """The runs of `compiled` under `kind`'s inputs, built whatever share of the ops heads one."""
    if kind == "shared":
        made = make_runs(compiled.bounds, compiled.dur, compiled.prod_ptr, compiled.prod_idx, max_head_share=1.0)
    else:
        plan = compiled.link_plan
        made = make_runs(compiled.bounds, compiled.dur, plan.input_ptr, plan.input_src, plan.send_producer,
                         plan.send_input, plan.send_link, max_head_share=1.0)
    assert made is not None
    return made


def _both_sweeps(compiled, kind: str) -> tuple[object, object]:
    """(start, end) lists by the run sweep and by the op sweep."""
    if kind == "shared":
        runs = _run_sweep(compiled, _runs(compiled, kind), compiled.num_ops)
        return tuple(a.tolist() for a in runs), _sweep(compiled, compiled.prods)
    plan = compiled.link_plan
    hold = [0] * compiled.num_ops + _hold_cycles(np.asarray(plan.words, dtype=np.int64), 2).tolist()
    runs = _run_sweep(compiled, _runs(compiled, kind), compiled.num_ops + len(plan.words), hold, 3, plan)
    return tuple(a.tolist() for a in runs), _sweep(compiled, plan.inputs, plan, hold, 3)


@pytest.mark.parametrize("kind", ["shared", "links"])
@pytest.mark.parametrize("seed", range(8))
def test_the_run_sweep_times_what_the_op_sweep_times(kind: str, seed: int) -> None:
    """Synchronous layer-level expansions (long local runs) and stage-level schedules (short ones), random
    durations and word counts."""
    rng = random.Random(seed)
    network = load_network(rng.choice(["mlp:16-12-8-4", "lenet5", "resnet18"]))
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    model = make_cost_model("pe", lanes=rng.choice([4, 16]))
    name = rng.choice(sorted(GENERATORS))
    procs, m = rng.choice([(2, 4), (3, 6), (2, 5)])
    try:
        stage = GENERATORS[name](procs, m)
    except InputError:
        stage = GENERATORS["1f1b"](procs, m)
    if 1 + max(op.unit for op in stage.ops()) > len(network):  # more stages than layers
        stage = GENERATORS["1f1b"](procs, m)
    count = 1 + max(op.unit for op in stage.ops())
    info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, count, m))
    for schedule, workload in (
        (expand_stages(stage, graph, info), Workload.of_graph(graph, model)),
        (stage, Workload.of_stages([(rng.randint(1, 9), rng.randint(1, 9), rng.randint(0, 4)) for _ in range(count)],
                                   StageInfo(count, tuple(rng.randint(0, 9) for _ in range(count)),
                                             tuple(rng.randint(0, 9) for _ in range(count))))),
    ):
        compiled = compile_schedule(schedule, workload)
        runs, ops = _both_sweeps(compiled, kind)
        assert runs == ops


@pytest.mark.parametrize("kind", ["shared", "links"])
def test_the_run_sweep_reports_the_op_sweeps_deadlock(kind: str) -> None:
    """A backward before the forward it needs, on another processor: both sweeps stop at the same ops."""
    text = ("# layerpipe schedule v1 level=stage procs=2 synchronous microbatches=2\n"
            "p0: F0.0 F0.1 B0.0 B0.1\np1: B1.0 F1.0 F1.1 B1.1\n")
    compiled = compile_schedule(OpSchedule.from_text(text), Workload.of_stages([(1, 2, 0), (1, 2, 0)]))
    with pytest.raises(DeadlockError) as by_runs:
        _both_sweeps_runs_only(compiled, kind)
    with pytest.raises(DeadlockError) as by_ops:
        _both_sweeps_ops_only(compiled, kind)
    assert str(by_runs.value) == str(by_ops.value) and by_runs.value.blocked == by_ops.value.blocked


def _both_sweeps_runs_only(compiled, kind: str) -> object:
    if kind == "shared":
        return _run_sweep(compiled, _runs(compiled, kind), compiled.num_ops)
    plan = compiled.link_plan
    hold = [0] * (compiled.num_ops + len(plan.words))
    return _run_sweep(compiled, _runs(compiled, kind), compiled.num_ops + len(plan.words), hold, 1, plan)


def _both_sweeps_ops_only(compiled, kind: str) -> object:
    if kind == "shared":
        return _sweep(compiled, compiled.prods)
    plan = compiled.link_plan
    return _sweep(compiled, plan.inputs, plan, [0] * (compiled.num_ops + len(plan.words)), 1)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_the_op_sweep_needs_no_earlier_input_of_its_own_processor(name: str) -> None:
    """Dropping inputs that are earlier ops of the consumer's processor (`sweep_inputs`) changes no time, on
    shared and links, and no deadlock report."""
    schedule = GENERATORS[name](3, 6)
    count = 1 + max(op.unit for op in schedule.ops())
    workload = Workload.of_stages([(2 + s % 3, 3, s % 2) for s in range(count)],
                                  StageInfo(count, tuple(range(3, 3 + count)), tuple(range(2, 2 + count))))
    compiled = compile_schedule(schedule, workload)
    assert sum(map(len, compiled.sweep_inputs)) < sum(map(len, compiled.prods))
    assert _sweep(compiled, compiled.sweep_inputs) == _sweep(compiled, compiled.prods)
    plan = compiled.link_plan
    hold = [0] * compiled.num_ops + _hold_cycles(np.asarray(plan.words, dtype=np.int64), 2).tolist()
    assert _sweep(compiled, plan.sweep_inputs, plan, hold, 3) == _sweep(compiled, plan.inputs, plan, hold, 3)
    text = ("# layerpipe schedule v1 level=stage procs=2 synchronous microbatches=2\n"
            "p0: F0.0 F0.1 B0.0 B0.1\np1: B1.0 F1.0 F1.1 B1.1\n")
    stuck = compile_schedule(OpSchedule.from_text(text), Workload.of_stages([(1, 2, 0), (1, 2, 0)]))
    with pytest.raises(DeadlockError) as few:
        _sweep(stuck, stuck.sweep_inputs)
    with pytest.raises(DeadlockError) as every:
        _sweep(stuck, stuck.prods)
    assert str(few.value) == str(every.value)


def test_runs_are_built_where_they_pay() -> None:
    """A layer-level expansion merges its local chains into runs; a stage-level pipeline (every op but a few
    waits for another processor) keeps the op-by-op sweep."""
    network = load_network("resnet18")
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    model = make_cost_model("pe", lanes=16)
    stage = _stage_programs.one_f_one_b(4, 8, 2)
    info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, 4, 8))
    layer = compile_schedule(expand_stages(stage, graph, info), Workload.of_graph(graph, model))
    assert layer.shared_runs is not None and len(layer.shared_runs.head) < layer.num_ops / 4
    assert compile_schedule(stage, Workload.of_stages([(2, 3, 1)] * 4)).shared_runs is None


def _reference_unroll(periodic: PeriodicSchedule, iterations: int) -> tuple[tuple[Op, ...], ...]:
    """`PeriodicSchedule.unroll` op by op, as its docstring states it: every (period, slot) op of an iteration in
    range, sorted by `op_order_key` of its planned start."""
    max_lag = max((s.lag for body in periodic.bodies for s in body), default=0)
    periods = -(-iterations // periodic.unfold) + max_lag + 1
    limit = {layer: -(-iterations // g) for layer, g in periodic.groups}
    rows = []
    for p, body in enumerate(periodic.bodies):
        timed = []
        for j in range(periods):
            for s in body:
                t = periodic.iteration(s, j)
                if 0 <= t < (limit.get(s.layer, iterations) if s.kind == "U" else iterations):
                    op = Op(p, s.kind, s.layer, t)
                    busy = periodic.costs.get((s.kind, s.layer), 1) > 0
                    timed.append((op_order_key(j * periodic.period + s.start, op, busy), op))
        timed.sort(key=lambda x: x[0])
        rows.append(tuple(op for _, op in timed))
    return tuple(rows)


@pytest.mark.parametrize("net", ["mlp:16-12-8-4", "lenet5", "resnet18"])
@pytest.mark.parametrize(("policy", "given"), [("layerpipe", {}), ("layerpipe", {"max_staleness": 1}),
                                               ("pipedream", {}), ("pipedream-2bw", {})])
def test_unroll_builds_the_reference_ops(net: str, policy: str, given: dict) -> None:
    """Unrolled as columns: the same ops in the same order as sorting every op's key, unfolded and grouped
    schedules included; a schedule read from text (no costs: every task busy) too."""
    network = load_network(net)
    model = make_cost_model("pe", lanes=16)
    for n in (2, 3):
        periodic = make_schedule(policy, network, n, model, policy_options(policy, given)).periodic
        assert periodic is not None
        for iterations in (1, 5, 12):
            unrolled = periodic.unroll(iterations)
            assert unrolled.columns is not None and not unrolled.materialized
            assert unrolled.procs == _reference_unroll(periodic, iterations)
        text = PeriodicSchedule.from_text(periodic.to_text())
        assert text.unroll(7).procs == _reference_unroll(text, 7)


def test_a_deferred_result_is_the_result_of_computing_everything() -> None:
    """`simulate` computes versions, peaks, traffic and ops when read: equal to a result built at once."""
    from layerpipe.sim import SimConfig, SimResult, simulate
    from layerpipe.sim._memory import peak_memory
    from layerpipe.sim._report import link_traffic
    from layerpipe.sim._versions import version_array

    network = load_network("lenet5")
    model = make_cost_model("pe", lanes=16)
    result = make_schedule("layerpipe", network, 3, model)
    assert result.periodic is not None and result.graph is not None
    workload = Workload.of_graph(result.graph, model)
    schedule = result.periodic.unroll(9)
    config = SimConfig.links(latency=2, words_per_cycle=4)
    lazy = simulate(schedule, workload, config)
    assert not schedule.materialized and "versions" not in lazy.__dict__
    c = lazy._compiled
    assert c is not None
    versions = version_array(c, lazy.start, lazy.end, workload, config.mode, remote_copies=True)
    eager = SimResult(schedule, config, c.ops, lazy.start, lazy.end, versions,
                      tuple(peak_memory(c, lazy.start, lazy.end, versions, workload, config.mode, distributed=True)),
                      link_traffic(c), workload.batch, workload.memory_unit, c)
    assert lazy.metrics() == eager.metrics() and lazy.version_records() == eager.version_records()
    assert np.array_equal(lazy.versions, eager.versions) and lazy.ops == eager.ops
    again = pickle.loads(pickle.dumps(simulate(schedule, workload, config)))
    assert again.metrics() == eager.metrics()


def test_the_step_cap_admits_1f1b_at_256_processors() -> None:
    """1f1b on a 256-layer MLP at N = 256 (256 stages × 512 micro-batches) is under the cap (issue 14: it was
    refused at 16384 slots); a thousand stages of a thousand micro-batches is still refused."""
    _check_step_size("1f1b", 256, 512)
    assert MAX_STEP_SLOTS >= 256 * 512
    with pytest.raises(InputError, match="stage slots per step; the limit is"):
        _check_step_size("gpipe", 1000, 1000)


def _listed_1f1b_and_gpipe(stages: int, m: int) -> tuple[list[list[tuple[str, int, int]]], ...]:
    """The rows of 1F1B and GPipe as (kind, stage, micro-batch) lists, the way their generators once built them."""
    one, fill = [], []
    for s in range(stages):
        warmup = min(stages - 1 - s, m)
        row = [("F", s, t) for t in range(warmup)]
        for k in range(m - warmup):
            row += [("F", s, warmup + k), ("B", s, k)]
        one.append(row + [("B", s, t) for t in range(m - warmup, m)])
        fill.append([("F", s, t) for t in range(m)] + [("B", s, t) for t in range(m)])
    return one, fill


@pytest.mark.parametrize("seed", range(6))
def test_array_built_generators_give_the_listed_rows_columns(seed: int) -> None:
    """1F1B and GPipe built on arrays: the columns (bounds, task numbering, tasks, iterations) of the listed rows
    through `_schedule`, at generated stage, micro-batch and step counts (m below, at and above the stages)."""
    rng = random.Random(seed)
    stages, steps = rng.randint(1, 9), rng.randint(1, 3)
    m = rng.choice([1, stages - 1 or 1, stages, 2 * stages + 1])
    one, fill = _listed_1f1b_and_gpipe(stages, m)
    for built, rows in ((_stage_programs.one_f_one_b(stages, m, steps), one),
                        (_stage_programs.gpipe(stages, m, steps), fill)):
        listed = _stage_programs._schedule(rows, m, steps)
        assert built.columns is not None and listed.columns is not None
        assert built.columns.bounds == listed.columns.bounds and built.columns.tasks == listed.columns.tasks
        assert np.array_equal(built.columns.task, listed.columns.task)
        assert np.array_equal(built.columns.iteration, listed.columns.iteration)
        assert built.microbatches == listed.microbatches and built.synchronous


def _runs_fields(runs: Runs) -> tuple[object, ...]:
    return tuple(getattr(runs, f.name).tolist() if isinstance(getattr(runs, f.name), np.ndarray)
                 else getattr(runs, f.name) for f in dataclasses.fields(runs))


@pytest.mark.parametrize("kind", ["shared", "links"])
@pytest.mark.parametrize("seed", range(6))
def test_runs_of_small_schedules_are_the_shared_ones(kind: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below `SHARE_MIN` values the runs' lists come from `tolist()` and numpy lookups instead of the shared-int
    path: the same runs, field for field (stage-level and layer-level expansions, periodic unrolls, both input
    kinds: op inputs only, and transfers)."""
    import layerpipe.schedule._runs as runs_module
    from layerpipe.sim import policy_ops

    rng = random.Random(seed)
    network = load_network(rng.choice(["mlp:16-12-8-4", "lenet5", "resnet18"]))
    model = make_cost_model("pe", lanes=rng.choice([4, 16]))
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    procs, m = rng.choice([(2, 4), (3, 6)])
    stage = GENERATORS["1f1b"](procs, m)
    count = 1 + max(op.unit for op in stage.ops())
    info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, count, m))
    policy = rng.choice(["layerpipe", "pipedream", "ooo"])
    periodic = make_schedule(policy, network, procs, model, policy_options(policy, {}))
    for schedule, workload in ((expand_stages(stage, graph, info), Workload.of_graph(graph, model)),
                               policy_ops(periodic, network, model, rng.choice([8, 24]))):
        compiled = compile_schedule(schedule, workload)
        small = _runs_fields(_runs(compiled, kind))
        monkeypatch.setattr(runs_module, "SHARE_MIN", 0)  # every list through the shared path
        assert _runs_fields(_runs(compiled, kind)) == small
        monkeypatch.undo()

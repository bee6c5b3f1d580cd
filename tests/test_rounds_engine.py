"""The lock-step rounds of `layerpipe.schedule._rounds` against the op-by-op sweep they must equal
(`layerpipe.schedule._engine._sweep`), on `shared` and on `links` (transfers queued per link, random words,
bandwidths and latencies): generated stage-level and layer-level schedules with random durations (zero-cycle
ops included), the processor counts where the engine picks the rounds, the cases where it must not
(too few runs per round, inputs too wide, a deadlock), and the deadlock report that still comes from the sweep.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import OpSchedule, StageInfo, _stage_programs
from layerpipe.schedule._deps import expand_stages
from layerpipe.schedule._engine import _hold_cycles, compile_schedule, run_timing
from layerpipe.schedule._op_sweep import _sweep
from layerpipe.schedule._rounds import MAX_INPUTS, MIN_PROCS, LinkSends, sweep_rounds
from layerpipe.schedule._sync_policies import contiguous_stages
from layerpipe.schedule._workload import Workload
from layerpipe.sim import DeadlockError
from tests.strategies import networks
from tests.test_array_engine import GENERATORS  # the stage generators at the array tests' sizes


def _rounds(compiled, min_runs_per_round: int = 1) -> tuple[list[int], list[int]] | None:
    timed = sweep_rounds(compiled.bounds, compiled.dur_array(), compiled.prod_ptr, compiled.prod_idx,
                         min_runs_per_round=min_runs_per_round)
    return None if timed is None else (timed[0].tolist(), timed[1].tolist())


def _link_rounds(compiled, words_per_cycle: int, latency: int) -> tuple[object, object]:
    """(rounds, op sweep) on `links`: (start, end) lists of each, the rounds forced."""
    plan = compiled.link_plan
    held = _hold_cycles(np.asarray(plan.words, dtype=np.int64), words_per_cycle)
    timed = sweep_rounds(compiled.bounds, compiled.dur_array(), plan.input_ptr, plan.input_src,
                         LinkSends(plan.send_producer, plan.send_link, held, latency), min_runs_per_round=1)
    hold = [0] * compiled.num_ops + held.tolist()
    swept = _sweep(compiled, plan.inputs, plan, hold, latency)
    return (None if timed is None else (timed[0].tolist(), timed[1].tolist())), swept


def _stage_workload(rng: random.Random, count: int) -> Workload:
    """Random stage costs, zero-cycle W and U included, and random words."""
    return Workload.of_stages([(rng.randint(0, 9), rng.randint(1, 9), rng.randint(0, 4)) for _ in range(count)],
                              StageInfo(count, tuple(rng.randint(0, 9) for _ in range(count)),
                                        tuple(rng.randint(0, 9) for _ in range(count))))


@pytest.mark.parametrize("seed", range(16))
def test_the_rounds_time_what_the_op_sweep_times(seed: int) -> None:
    """Every generator at 1–7 processors, at stage level and expanded to layers, forced to run the rounds."""
    rng = random.Random(seed)
    name = rng.choice(sorted(GENERATORS))
    procs, m = rng.randint(1, 7), rng.choice([2, 4, 6, 8])
    try:
        stage = GENERATORS[name](procs, m)
    except InputError:  # a shape this generator refuses (micro-batches per round, stages per chunk)
        stage = GENERATORS["1f1b"](procs, m)
    count = 1 + max(op.unit for op in stage.ops())
    compiled = compile_schedule(stage, _stage_workload(rng, count))
    assert _rounds(compiled) == _sweep(compiled, compiled.prods)
    rounds, swept = _link_rounds(compiled, rng.randint(1, 3), rng.randint(0, 4))
    assert rounds == swept
    network = load_network(rng.choice(["mlp:16-12-8-4-4-4-4-4-4-4-4-4-4-4-4-4", "resnet18"]))
    if count <= len(network):
        graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
        model = make_cost_model("pe", lanes=rng.choice([4, 16]))
        info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, count, m))
        layer = compile_schedule(expand_stages(stage, graph, info), Workload.of_graph(graph, model))
        assert _rounds(layer) == _sweep(layer, layer.prods)
        rounds, swept = _link_rounds(layer, rng.choice([1, 4, 64]), rng.randint(0, 9))
        assert rounds == swept


@pytest.mark.parametrize("procs", [40, 64])
def test_the_engine_times_many_processors_by_rounds_and_equals_the_sweep(procs: int) -> None:
    """1f1b over a deep MLP at 40 and 64 processors: the default rule picks the rounds, and `run_timing` gives the
    op sweep's times."""
    network = load_network("mlp:" + "-".join(["8"] * (procs + 1)))
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    model = make_cost_model("pe", lanes=4)
    m = 2 * procs
    info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, procs, m))
    compiled = compile_schedule(expand_stages(_stage_programs.one_f_one_b(procs, m, 3), graph, info),
                                Workload.of_graph(graph, model))
    assert sweep_rounds(compiled.bounds, compiled.dur_array(), compiled.prod_ptr, compiled.prod_idx) is not None
    start, end = run_timing(compiled, "shared")
    assert (start.tolist(), end.tolist()) == _sweep(compiled, compiled.prods)
    plan = compiled.link_plan
    hold = [0] * compiled.num_ops + _hold_cycles(np.asarray(plan.words, dtype=np.int64), 2).tolist()
    start, end = run_timing(compiled, "links", 3, 2)
    assert (start.tolist(), end.tolist()) == _sweep(compiled, plan.inputs, plan, hold, 3)


def test_the_rounds_give_way_where_they_do_not_pay() -> None:
    """Two processors cannot share a round among 30 runs; a run with more inputs than the table holds goes to the
    run sweep too (op 0 on p0 reads one op of each of p1 … p`width`)."""
    compiled = compile_schedule(_stage_programs.one_f_one_b(2, 8, 3), Workload.of_stages([(2, 3, 1)] * 2))
    assert _rounds(compiled, 30) is None and _rounds(compiled, 1) == _sweep(compiled, compiled.prods)
    for width, timed in ((MAX_INPUTS, True), (MAX_INPUTS + 1, False)):
        bounds = list(range(width + 2))
        ptr = np.array([0] + [width] * (width + 1))
        src = np.arange(1, width + 1)
        got = sweep_rounds(bounds, np.full(width + 1, 3), ptr, src, min_runs_per_round=1)
        if timed:
            assert got is not None and got[0].tolist() == [3] + [0] * width and got[1].tolist() == [6] + [3] * width
            big = 3 * 2**31  # offsets past int32: the tables widen
            got = sweep_rounds(bounds, np.full(width + 1, big), ptr, src, min_runs_per_round=1)
            assert got is not None and got[1].tolist() == [2 * big] + [big] * width
        else:
            assert got is None


def _stuck_text(procs: int) -> str:
    """GPipe over `procs` stages with p0's row reversed: its first op, a backward, waits for its own forwards."""
    lines = _stage_programs.gpipe(procs, 4, 1).to_text().splitlines()
    head, first = lines[0], lines[1].split()
    return "\n".join([head, " ".join([first[0], *reversed(first[1:])]), *lines[2:]]) + "\n"


def test_a_deadlock_is_left_to_the_sweep_to_report() -> None:
    """The rounds give None on a deadlock, and `run_timing` with MIN_PROCS processors or more (where the rounds
    are tried first) raises the op sweep's own report."""
    stuck = compile_schedule(OpSchedule.from_text(_stuck_text(3)), Workload.of_stages([(1, 2, 0)] * 3))
    assert _rounds(stuck) is None
    with pytest.raises(DeadlockError):
        _sweep(stuck, stuck.prods)
    procs = 2 * MIN_PROCS
    compiled = compile_schedule(OpSchedule.from_text(_stuck_text(procs)), Workload.of_stages([(1, 2, 0)] * procs))
    with pytest.raises(DeadlockError) as by_engine:
        run_timing(compiled, "shared")
    with pytest.raises(DeadlockError) as by_sweep:
        _sweep(compiled, compiled.prods)
    assert str(by_engine.value) == str(by_sweep.value)
    plan = compiled.link_plan
    held = _hold_cycles(np.asarray(plan.words, dtype=np.int64), 1)
    assert sweep_rounds(compiled.bounds, compiled.dur_array(), plan.input_ptr, plan.input_src,
                        LinkSends(plan.send_producer, plan.send_link, held, 2), min_runs_per_round=1) is None
    with pytest.raises(DeadlockError) as by_engine:
        run_timing(compiled, "links", 2, 1)
    with pytest.raises(DeadlockError) as by_sweep:
        _sweep(compiled, plan.inputs, plan, [0] * compiled.num_ops + [1] * len(plan.words), 2)
    assert str(by_engine.value) == str(by_sweep.value)


@pytest.mark.parametrize("seed", range(4))
def test_the_grouped_running_maximum_restarts_at_each_group(seed: int) -> None:
    """The loop the link queue falls back on where its one-accumulate step would overflow: per group, the running
    maximum, against a plain Python reference."""
    from layerpipe.schedule._rounds import _grouped_running_max

    rng = random.Random(seed)
    values = np.array([rng.randint(-50, 50) for _ in range(60)], dtype=np.int64)
    new = np.array([k == 0 or rng.random() < 0.2 for k in range(60)], dtype=bool)
    expected, best = [], 0
    for v, fresh in zip(values.tolist(), new.tolist(), strict=True):
        best = v if fresh else max(best, v)
        expected.append(best)
    assert _grouped_running_max(values, new).tolist() == expected


@settings(max_examples=12, deadline=None)
@given(network=networks(max_layers=40, max_width=12),
       procs=st.integers(12, 40), name=st.sampled_from(["1f1b", "gpipe", "zb-h1"]),
       interconnect=st.sampled_from(["shared", "links"]), latency=st.integers(0, 6),
       words_per_cycle=st.integers(1, 8))
def test_the_engine_equals_the_sweep_on_generated_networks(network, procs: int, name: str, interconnect: str,
                                                         latency: int, words_per_cycle: int) -> None:
    """Property: on generated networks (residual blocks included) split into 12 to 40 stages, the rounds (forced)
    and `run_timing` (the rounds wherever the engine picks them) give the op sweep's times on shared and links."""
    assume(len(network) >= 12)
    stages = min(procs, len(network))
    m = 2 * stages
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True))
    model = make_cost_model("pe", lanes=4)
    info = StageInfo.of_network(graph, contiguous_stages(network, graph, model, stages, m))
    stage = {"1f1b": lambda: _stage_programs.one_f_one_b(stages, m, 2),
             "gpipe": lambda: _stage_programs.gpipe(stages, m, 2),
             "zb-h1": lambda: _stage_programs.zb_h1(stages, m, 1, 2)}[name]()
    compiled = compile_schedule(expand_stages(stage, graph, info), Workload.of_graph(graph, model))
    if interconnect == "shared":
        swept = _sweep(compiled, compiled.prods)
        assert _rounds(compiled) == swept
        start, end = run_timing(compiled, "shared")
        assert (start.tolist(), end.tolist()) == swept
        return
    rounds, swept = _link_rounds(compiled, words_per_cycle, latency)
    assert rounds == swept
    start, end = run_timing(compiled, "links", latency, words_per_cycle)
    assert (start.tolist(), end.tolist()) == swept

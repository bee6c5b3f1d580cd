"""Timing engine: hand-computed timings (shared and links), contention, tie order, bubbles, traffic, deadlock,
and properties against the schedule package's independent dry run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import mlp
from layerpipe.schedule import Op, OpSchedule, StageInfo, dependencies, dry_run
from layerpipe.sim import DeadlockError, SimConfig, Workload, compile_schedule, simulate
from layerpipe.sim._engine import _listed_dependencies, _run_links_events, run
from tests.strategies import networks


def stage_schedule(rows: list[str], microbatches: int = 2) -> OpSchedule:
    text = f"# layerpipe schedule v1 level=stage procs={len(rows)} synchronous microbatches={microbatches}\n"
    text += "".join(f"p{p}: {row}\n" for p, row in enumerate(rows))
    return OpSchedule.from_text(text)


def layer_schedule(rows: list[str]) -> OpSchedule:
    text = f"# layerpipe schedule v1 level=layer procs={len(rows)}\n"
    return OpSchedule.from_text(text + "".join(f"p{p}: {row}\n" for p, row in enumerate(rows)))


def times(result) -> dict[str, tuple[int, int]]:
    return {str(op): (int(s), int(e)) for op, s, e in zip(result.ops, result.start, result.end, strict=True)}


GPIPE_2X2 = ["F0.0 F0.1 B0.0 B0.1", "F1.0 F1.1 B1.0 B1.1"]


def test_shared_hand_timing_bubbles_busy():
    work = Workload.of_stages([(1, 2, 0), (1, 2, 0)])
    r = simulate(stage_schedule(GPIPE_2X2), work, SimConfig())
    assert times(r) == {
        "F0.0": (0, 1), "F0.1": (1, 2), "B0.0": (5, 7), "B0.1": (7, 9),
        "F1.0": (1, 2), "F1.1": (2, 3), "B1.0": (3, 5), "B1.1": (5, 7),
    }
    assert r.total_cycles == 9
    assert r.busy_cycles == (6, 6) and r.idle_cycles == (3, 3)
    # p0 waits 2..5 for the first backward; p1's idle cycles are before its first op and after its last.
    assert [b.tolist() for b in r.bubbles] == [[[2, 5]], []]
    assert r.bubble_cycles == (3, 0)
    assert r.utilization_pct == pytest.approx(100 * 12 / 18)
    assert r.cycles_per_iteration == pytest.approx(9 / 2)  # one step: falls back to total / micro-batches


def test_links_hand_timing_with_contention():
    # 4 words cross each stage boundary; 2 words per cycle -> a transfer holds its link 2 cycles, +1 latency.
    work = Workload.of_stages([(1, 2, 0), (1, 2, 0)], StageInfo(2, (0, 4), (4, 0)))
    r = simulate(stage_schedule(GPIPE_2X2), work, SimConfig.links(latency=1, words_per_cycle=2))
    t = times(r)
    assert t["F1.0"] == (4, 5)  # F0.0 ends 1, link 1..3, arrives 4
    assert t["F1.1"] == (6, 7)  # F0.1 ends 2 but the link is busy until 3: 3..5, arrives 6
    assert t["B1.0"] == (7, 9) and t["B1.1"] == (9, 11)
    assert t["B0.0"] == (12, 14) and t["B0.1"] == (14, 16)
    assert r.total_cycles == 16
    assert r.link_traffic_words == {(0, 1): 8, (1, 0): 8} and r.traffic_words == 16
    # The same schedule in shared memory still counts the words that cross processors.
    assert simulate(stage_schedule(GPIPE_2X2), work).traffic_words == 16


def test_links_same_time_transfers_go_in_consumer_order():
    graph = build_training_graph(mlp([4, 3, 2]))
    work = Workload.of_graph(graph, MacsModel())
    # F2 on p0 feeds A2 (loss, 2 words), G2 (kept, 3) and E2 (stash weights, 6) on p1: three transfers start
    # when F2 ends, in p1's program order.
    base = ["F1.0 F2.0 A1.0 G1.0 U1.0", "A2.0 {} U2.0"]
    config = SimConfig.links(latency=0, words_per_cycle=1)
    f2_end = 12 + 6
    r = simulate(layer_schedule([base[0], base[1].format("E2.0 G2.0")]), work, config)
    assert r.start_of("A", 2, 0) == f2_end + 2
    assert r.start_of("E", 2, 0) == f2_end + 2 + 6  # after A2's 2 words and its own 6
    assert r.start_of("G", 2, 0) == r.end_of("E", 2, 0)  # its 3 words arrived at 29, E runs until 32
    r = simulate(layer_schedule([base[0], base[1].format("G2.0 E2.0")]), work, config)
    assert r.start_of("G", 2, 0) == f2_end + 2 + 3
    assert r.start_of("E", 2, 0) == f2_end + 2 + 3 + 6


def test_zero_duration_producers_tie_in_consumer_order():
    # F0 takes no time: F0.0 and F0.1 both end at cycle 0, so their transfers tie and go in p1's order,
    # which runs micro-batch 1 first. (The event-driven engine handles this case.)
    work = Workload.of_stages([(0, 2, 0), (1, 2, 0)], StageInfo(2, (0, 4), (4, 0)))
    sched = stage_schedule(["F0.0 F0.1 B0.0 B0.1", "F1.1 F1.0 B1.0 B1.1"])
    t = times(simulate(sched, work, SimConfig.links(latency=0, words_per_cycle=2)))
    assert t["F1.1"] == (2, 3) and t["F1.0"] == (4, 5)


def test_deadlock_names_blocked_processors_and_inputs():
    work = Workload.of_stages([(1, 2, 0), (1, 2, 0)])
    bad = stage_schedule(["B0.0 F0.0", "F1.0 B1.0"], microbatches=1)
    for config in (SimConfig(), SimConfig.links(1)):
        with pytest.raises(DeadlockError) as err:
            simulate(bad, work, config)
        assert isinstance(err.value, InputError)
        msg = str(err.value)
        assert "\n" not in msg
        assert "p0 blocked at B0.0 waiting for F0.0 (p0), B1.0 (p1)" in msg
        assert "p1 blocked at F1.0 waiting for F0.0 (p0)" in msg
        assert set(err.value.blocked) == {0, 1}


def test_bad_schedules_are_input_errors():
    work = Workload.of_stages([(1, 2, 0)])
    with pytest.raises(InputError, match="appears twice"):
        simulate(stage_schedule(["F0.0 F0.0 B0.0"], microbatches=1), work)
    with pytest.raises(InputError, match="no task"):
        simulate(stage_schedule(["F0.0 B0.0", "F1.0 B1.0"], microbatches=1), work)
    with pytest.raises(InputError, match="interconnect"):
        SimConfig("ring")
    with pytest.raises(InputError, match="link_words_per_cycle"):
        SimConfig.links(1, 0)


def sequential_schedule(graph, iterations: int, procs: int, placement: dict) -> OpSchedule:
    """Iteration-major sequential order split over processors: always deadlock-free."""
    rows: list[list[Op]] = [[] for _ in range(procs)]
    for t in range(iterations):
        for task in graph.intra_iteration_order():
            p = placement[(task.kind, task.layer)]
            rows[p].append(Op(p, task.kind, task.layer, t))
    return OpSchedule("layer", tuple(tuple(r) for r in rows))


def edge_list(consumer, producer, words, role, roles) -> list[tuple[int, int, int, str]]:
    return sorted((int(c), int(p), int(w), roles[r]) for c, p, w, r in zip(consumer, producer, words, role,
                                                                             strict=True))


@st.composite
def placed_schedules(draw):
    net = draw(networks(max_layers=5, max_width=6))
    options = GraphOptions(intra=draw(st.booleans()), inter=draw(st.booleans()),
                           weight_mode=draw(st.sampled_from(["stash", "latest"])))
    graph = build_training_graph(net, options)
    procs = draw(st.integers(1, 3))
    placement = {(t.kind, t.layer): draw(st.integers(0, procs - 1)) for t in graph.tasks}
    sched = sequential_schedule(graph, draw(st.integers(1, 4)), procs, placement)
    return graph, sched


@settings(max_examples=40, deadline=None)
@given(placed_schedules(), st.integers(0, 3), st.integers(1, 4))
def test_engine_properties(case, latency, words_per_cycle):
    graph, sched = case
    work = Workload.of_graph(graph, PEModel(lanes=4, overhead=1))
    deps = dependencies(sched, graph)
    shared = simulate(sched, work)
    # The shared engine agrees with the schedule package's independent list-scheduling dry run.
    expected = dry_run(sched, deps, work.durations)
    assert {op: (int(s), int(e)) for op, s, e in zip(shared.ops, shared.start, shared.end, strict=True)} == expected
    # Links with no latency and unlimited bandwidth time exactly like shared memory (the other engine).
    free_links = simulate(sched, work, SimConfig.links(0, math.inf))
    assert free_links.start.tolist() == shared.start.tolist()
    # The array path over `layer_task_edges` finds exactly the producers `dependencies()` lists.
    compiled = compile_schedule(sched, work)
    ptr, producer, words, role, roles = _listed_dependencies(sched, list(compiled.ops), work)
    consumer = np.repeat(np.arange(compiled.num_ops), np.diff(ptr))
    assert edge_list(compiled.consumer_of_edge, compiled.prod_idx, compiled.prod_words, compiled.prod_role,
                     compiled.roles) == edge_list(consumer, producer, words, role, roles)
    # The static-order sweep and the event-driven engine agree when every op takes >= 1 cycle.
    events = _run_links_events(compiled, latency, words_per_cycle)
    assert events == run(compiled, SimConfig.links(latency, words_per_cycle))
    # With real links: no op starts before its producers end (plus latency across processors), no overlap.
    linked = simulate(sched, work, SimConfig.links(latency, words_per_cycle))
    pos = {op: i for i, op in enumerate(linked.ops)}
    for op, dep_list in deps.items():
        s = linked.start[pos[op]]
        for d in dep_list:
            lag = 0 if d.producer.proc == op.proc else latency + -(-d.words // words_per_cycle)
            assert s >= linked.end[pos[d.producer]] + lag
    for row_start in range(sched.num_procs):
        mask = linked.proc == row_start
        s, e = linked.start[mask], linked.end[mask]
        assert (s[1:] >= e[:-1]).all()
    assert linked.total_cycles >= shared.total_cycles
    # Every processor always holds the current weights of the layers whose updates it runs.
    owned = [0] * sched.num_procs
    for layer, words in work.weight_words.items():
        owned[next(op.proc for op in sched.ops() if op.kind == "U" and op.unit == layer)] += words
    assert all(peak >= own for peak, own in zip(linked.peak_memory_words, owned, strict=True))
    assert linked.traffic_words == shared.traffic_words
    assert sum(linked.busy_cycles) == sum(work.durations[(op.kind, op.unit)] for op in sched.ops())

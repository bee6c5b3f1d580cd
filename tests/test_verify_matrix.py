"""Issue 11's done-when matrix: `layerpipe verify NETWORK --policy layerpipe --no-keep-weights-together --batch B`
passes bit-exact and cycle-exact for B ∈ {1, 4}, N ∈ {2, 3, 4}, lanes ∈ {1, 2, 4} (Icarus, each run watched op
by op; the suite runs 8 points of a pairwise covering subset — every (N, lanes), (B, N) and (B, lanes) pair, the
pairs of (4, 4, 4) counted as covered by the margin test's split run, which checks what a point checks — and
`pytest --exhaustive` the full product of 18), and the split placement is faster in RTL than the
weights-together one by the margin the model predicts.

Cost (issue 13): a point's Icarus run is ~1 s of iverilog, then cocotb's per-cycle monitor, whose cost grows with
the run's cycles; the Verilog export and the reference are seconds of Python, and a CLI process adds its imports
(~2.5 s CPU) and a second scheduling. So each point runs the fewest iterations T whose middle is steady
(`steady_design`: what the measured period needs, 4..13 here instead of 16), the whole matrix calls the
function the CLI calls (`verify_design`), and three points, together covering every N, lane count and batch,
go through the CLI itself. (The Verilator harness does not pay here: its C++ build is ~1 min per design, and it
has no per-op monitor, so no measured period.)"""

from __future__ import annotations

import json
from itertools import product

import pytest

pytest.importorskip("cocotb_tools.runner")
pytest.importorskip("torch")

from layerpipe.hdl._flow import Design, make_design, steady_design
from layerpipe.hdl._verify import verify_design
from layerpipe.report import RTLPoint, rtl_model_cycles_per_sample
from tests.conftest import grid, run_cli

#: Widths every lane count divides (matrix transfers need it), small enough for Icarus.
NETWORK = "mlp:8-8-8-4"
MATRIX = list(product((1, 4), (2, 3, 4), (1, 2, 4)))  # (B, N, lanes)
#: The points verified through `layerpipe verify` itself: each N, each lane count and both batches once.
THROUGH_CLI = {(1, 2, 4), (4, 3, 2), (4, 4, 1)}
#: (B, N, lanes) of `test_split_is_faster_in_rtl_than_weights_together_by_the_models_margin`, whose split run checks
#: what a matrix point checks: the pairwise cut counts its pairs as covered.
SPLIT_POINT = (4, 4, 4)


def _check_split_run(doc: dict, design: Design, batch: int) -> None:
    """What every verified split placement must show: weight versions cross the links, bit- and cycle-exact, the
    simulator's whole-run cycles and the program's period measured in RTL."""
    moved = {send.src[0] for pe in design.program.pes for e in pe.entries for send in e.sends}
    assert "W" in moved  # the policy's placement really splits: weight versions cross the links
    assert doc["bit_exact"] and doc["cycle_exact"] and doc["batch"] == batch and doc["samples"] == design.samples
    assert doc["cycles_rtl"] == design.sim.total_cycles
    assert doc["period_rtl"] == doc["period_sim"] == design.program.period


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "n", "lanes"), grid(MATRIX, keep=sorted(THROUGH_CLI), covered=[SPLIT_POINT]),
                         ids=[f"b{b}-n{n}-v{v}" for b, n, v in MATRIX])
def test_verify_split_placements_matrix(batch: int, n: int, lanes: int) -> None:
    design = steady_design(NETWORK, "layerpipe", n, lanes, keep_weights_together=False, batch=batch)
    if (batch, n, lanes) in THROUGH_CLI:
        proc = run_cli("verify", NETWORK, "--policy", "layerpipe", "--no-keep-weights-together", "--batch",
                       str(batch), "-n", str(n), "--lanes", str(lanes), "--samples", str(design.samples),
                       "--format", "json", timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        doc = json.loads(proc.stdout)
    else:
        doc = verify_design(design)
    _check_split_run(doc, design, batch)


@pytest.mark.slow
def test_split_is_faster_in_rtl_than_weights_together_by_the_models_margin() -> None:
    """N = 4, 4 lanes, micro-batches of 4: the policy's split placement against its weights-together one, both
    verified; the steady state measured in RTL gives the model's ratio exactly (and so do the whole runs' cycles
    and the simulator's)."""
    # The fewest iterations at which both placements have a steady middle (the measured period needs one).
    batch, n, lanes = SPLIT_POINT
    samples = max(steady_design(NETWORK, "layerpipe", n, lanes, keep_weights_together=keep, batch=batch).samples
                  for keep in (False, True))
    point = RTLPoint(NETWORK, n, lanes, samples, batch=batch)
    runs = {}
    for keep in (False, True):
        design = make_design(NETWORK, "layerpipe", point.num_pes, point.lanes, point.samples,
                             keep_weights_together=keep, batch=point.batch)
        doc = verify_design(design)
        assert doc["bit_exact"] and doc["cycle_exact"], doc
        runs[keep] = (doc, design)
    (split, split_design), (together, together_design) = runs[False], runs[True]
    _check_split_run(split, split_design, batch)  # a matrix point (SPLIT_POINT) as well
    assert split["period_rtl"] < together["period_rtl"]
    model_split = rtl_model_cycles_per_sample(point, "layerpipe", False)
    model_together = rtl_model_cycles_per_sample(point, "layerpipe", True)
    # cycles per sample of a micro-batch of 4: the period / 4 in both
    assert split["period_rtl"] / 4 == model_split and together["period_rtl"] / 4 == model_together
    assert together["period_rtl"] / split["period_rtl"] == model_together / model_split
    assert (together["cycles_rtl"] / split["cycles_rtl"]
            == together_design.sim.total_cycles / split_design.sim.total_cycles)

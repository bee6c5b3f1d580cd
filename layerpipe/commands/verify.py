"""`layerpipe verify NETWORK --policy NAME -n N --lanes V --samples T [--sim icarus|verilator] [--seed S]`.

Builds the accelerator, runs it in an RTL simulator through the cocotb bench (`tests/cocotb_accel.py`) on T
samples, and compares it with

- the integer PyTorch reference (bit-exact final weights, `bit_exact`),
- the Python simulator under the `rtl` cost model (`cycles_rtl` == `cycles_sim`),
- the float64 reference on the same data and weight versions (`max_abs_weight_error`, in LSBs of the format:
  the fixed-point rounding the hardware accumulates, for information).

Exit status 0 only when the run is bit-exact and cycle-exact; 1 when it is not; 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from layerpipe.commands._common import format_table, positive_int, to_json
from layerpipe.commands.rtl import add_design_args, make_design_from_args
from layerpipe.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="simulate the generated RTL and compare it with PyTorch and the simulator",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_design_args(p)
    p.add_argument("--samples", type=positive_int("--samples"), required=True, help="training samples T")
    p.add_argument("--sim", choices=("icarus", "verilator"), default="icarus", help="RTL simulator (default icarus)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and initial weights (default 0)")
    p.add_argument("--stall", type=float, default=0.0,
                   help="probability that the sample stream stalls in a cycle (default 0)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--build-dir", default=None, help="keep the build here (default: a temporary directory)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401  (the reference needs it; fail early with one line)
    except ImportError:
        raise InputError("verify needs torch for the reference (pip install torch==2.13.0)") from None
    if not 0.0 <= args.stall < 1.0:
        raise InputError(f"--stall must be a probability in [0, 1), got {args.stall}")
    from layerpipe.hdl._flow import export_verilog, run_bench, write_vectors

    design = make_design_from_args(args, args.samples)
    vectors = design.vectors(args.seed)
    with tempfile.TemporaryDirectory(prefix="layerpipe-verify-") as tmp:
        build = Path(args.build_dir) if args.build_dir else Path(tmp)
        build.mkdir(parents=True, exist_ok=True)
        (build / "layerpipe_accel.v").write_text(export_verilog(design))
        write_vectors(vectors, build / "vectors.json")
        result_path = build / "result.json"
        case = "run_stalled" if args.stall > 0 else "run_plain"
        run = run_bench(build / "layerpipe_accel.v", build / "vectors.json", build / "sim_build", sim=args.sim,
                        testcases=(case,), result_path=result_path, stall=args.stall)
        if not result_path.exists():
            log = run.log.read_text() if run.log.exists() else ""
            last = next((line.strip() for line in reversed(log.splitlines()) if "Error" in line), "no log")
            raise InputError(f"the RTL simulation did not finish: {last}")
        observed = json.loads(result_path.read_text())
    doc = compare(vectors, observed, design.fmt.frac_bits)
    doc.update({"network": design.network.name, "policy": design.policy, "num_pes": design.num_pes,
                "lanes": design.lanes, "samples": design.samples, "sim": args.sim, "seed": args.seed})
    ok = doc["bit_exact"] and doc["cycle_exact"]
    if args.format == "json":
        print(to_json(doc), end="")
    else:
        rows = [[k, doc[k]] for k in ("bit_exact", "cycle_exact", "cycles_rtl", "cycles_sim",
                                      "max_abs_weight_error", "commands_rtl")]
        print(f"{doc['network']} {doc['policy']} N={doc['num_pes']} lanes={doc['lanes']} T={doc['samples']} "
              f"on {doc['sim']}: {'PASS' if ok else 'FAIL'}")
        print(format_table(["check", "value"], rows), end="")
    return 0 if ok else 1


def compare(vectors: dict, observed: dict, frac_bits: int) -> dict:
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
    }

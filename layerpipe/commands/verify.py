"""`layerpipe verify NETWORK --policy NAME -n N --lanes V --samples T [--sim icarus|verilator|harness] [--seed S]`.

Builds the accelerator, runs it in an RTL simulator through the cocotb bench (`layerpipe.hdl.cocotb_accel`) on T
samples, and compares it with

- the integer PyTorch reference (bit-exact final weights, `bit_exact`),
- the Python simulator under the `rtl` cost model (`cycles_rtl` == `cycles_sim`),
- the float64 reference on the same data and weight versions (`max_abs_weight_error`, in LSBs of the format:
  the fixed-point rounding the hardware accumulates, for information).

Exit status 0 only when the run is bit-exact and cycle-exact; 1 when it is not; 2 for bad input.
"""

from __future__ import annotations

import argparse

from layerpipe.commands._common import build_dir, format_table, non_negative_int, positive_int, require_extras, to_json
from layerpipe.commands.rtl import add_design_args, make_design_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="simulate the generated RTL and compare it with PyTorch and the simulator",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_design_args(p)
    p.add_argument("--samples", type=positive_int("--samples"), required=True, help="training samples T")
    p.add_argument("--sim", choices=("icarus", "verilator", "harness"), default="icarus",
                   help="RTL simulator: cocotb on icarus (default) or verilator, or the Verilator C++ harness "
                        "(fast, for long runs)")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0,
                   help="seed of the data and initial weights (default 0)")
    p.add_argument("--stall", type=float, default=0.0,
                   help="probability that the sample stream and each link stall in a cycle (default 0; stalled "
                   "runs must stay bit-exact and take at least the simulator's cycles)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--build-dir", type=build_dir, default=None,
                   help="keep the build here (default: a temporary directory)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    require_extras("verify", "hdl", "torch")
    from layerpipe.hdl._verify import verify_design

    design = make_design_from_args(args, args.samples)
    doc = verify_design(design, sim=args.sim, seed=args.seed, stall=args.stall, build_dir=args.build_dir)
    # A stalled run is timed by the stalls, not the simulator: it must be bit-exact and no faster.
    ok = doc["bit_exact"] and (doc["cycle_exact"] or (args.stall > 0 and doc["cycles_rtl"] >= doc["cycles_sim"]))
    if args.format == "json":
        print(to_json(doc), end="")
    else:
        rows = [[k, doc[k]] for k in ("bit_exact", "cycle_exact", "cycles_rtl", "cycles_sim",
                                      "max_abs_weight_error", "commands_rtl", "period_rtl", "period_sim")]
        print(f"{doc['network']} {doc['policy']} N={doc['num_pes']} lanes={doc['lanes']} T={doc['samples']} "
              f"on {doc['sim']}: {'PASS' if ok else 'FAIL'}")
        print(format_table(["check", "value"], rows), end="")
    return 0 if ok else 1

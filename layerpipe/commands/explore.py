"""`layerpipe explore`: design-space sweeps with a crash-safe, resumable results file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from layerpipe.commands._common import check_registry_names, int_list, output_file, positive_int
from layerpipe.commands._names import COST_MODEL_TAKES, MAX_PROCS

if TYPE_CHECKING:
    from layerpipe.dse import SweepSpec

#: Most local worker processes: each holds a Python with numpy and scipy (~100 MB); 10^5 of them was a fork bomb.
MAX_JOBS = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explore", help="sweep networks × N × policies × options; Pareto fronts and plots")
    p.add_argument("networks", nargs="*", help="network specs (or give --sweep FILE.yaml)")
    p.add_argument("--sweep", help="versioned YAML sweep file instead of the flags below")
    p.add_argument("-n", "--num-procs", type=int_list("-n", maximum=MAX_PROCS),
                   help="processor counts, e.g. 2,4,8 or 2-16")
    p.add_argument("--policies", help="comma list of policies (default layerpipe,pipedream)")
    p.add_argument("--max-staleness", type=int_list("--max-staleness", minimum=0),
                   help="staleness bounds for the layerpipe policy, e.g. 1,2,4")
    p.add_argument("--lanes", type=int_list("--lanes"), help="MAC lanes per processor (pe/rtl cost models)")
    p.add_argument("--interconnect", dest="interconnects", default=None, metavar="SPEC[,SPEC...]",
                   help="interconnects to sweep, comma-separated: shared, links:L:W, bus:L:W, rtl (default rtl)")
    p.add_argument("--max-traffic", dest="max_traffic", default=None, metavar="WORDS[,WORDS...]",
                   help="layerpipe: bounds on words per sample, to trace the cycles-vs-traffic front")
    p.add_argument("--reverse-first-k", dest="reverse_first_k", default=None, metavar="K[,K...]",
                   help="dp-ooo: reverse first-k values to sweep, integers >= 0 or auto (default auto)")
    p.add_argument("--batch", type=positive_int("--batch"), default=1)
    sweepable = ", ".join(name for name, takes in COST_MODEL_TAKES.items() if "profile" not in takes)
    p.add_argument("--cost-model", default="pe", help=f"{sweepable} (default pe)")  # the registry's names
    p.add_argument("--area", action="store_true",
                   help="add RTL area figures: place and route on ecp5-85k with the PyPI yosys + nextpnr (Debian "
                        "yosys iCE40 statistics without them; MLP points only; minutes per point, cached)")
    p.add_argument("--jobs", type=positive_int("--jobs", MAX_JOBS), default=1,
                   help=f"points evaluated at once: this process and N-1 worker processes (at most {MAX_JOBS})")
    p.add_argument("--scheduler", help="Dask scheduler address (tcp://host:port) to run the sweep on")
    p.add_argument("--out", type=output_file, required=True, help="results CSV (appended as points finish)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--pareto-dir", help="write pareto.csv and plots here (default: beside --out)")
    p.add_argument("--plots", default="pareto,speedup", metavar="PLOT[,PLOT...]",
                   help="SVG plots drawn once after the sweep: pareto (pareto.svg), speedup (speedup_vs_n.svg), "
                        "or none (default pareto,speedup)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=run)


class _Axes(TypedDict, total=False):
    """The sweep axes the command line may set (`SweepSpec`'s defaults for the others)."""

    lanes: tuple[int, ...]
    interconnects: tuple[str, ...]
    max_traffic: tuple[float | None, ...]
    reverse_first_k: tuple[str, ...]
    max_staleness: tuple[int | None, ...]


def _spec(args: argparse.Namespace) -> SweepSpec:
    from layerpipe.dse import SweepSpec, load_sweep_yaml
    from layerpipe.errors import InputError

    if args.sweep:
        if args.networks or args.num_procs or args.policies:
            raise InputError("give either --sweep FILE or networks/-n/--policies, not both")
        return load_sweep_yaml(args.sweep)
    if not args.networks:
        raise InputError("explore needs at least one NETWORK or --sweep FILE.yaml")
    if not args.num_procs:
        raise InputError("explore needs -n (processor counts), e.g. -n 2,4,8")
    kw: _Axes = {}
    if args.lanes:
        kw["lanes"] = tuple(args.lanes)
    if args.interconnects is not None:
        kw["interconnects"] = tuple(s.strip() for s in args.interconnects.split(",") if s.strip())
    if args.max_traffic is not None:
        kw["max_traffic"] = tuple(_words(s) for s in args.max_traffic.split(","))
    if args.reverse_first_k is not None:
        kw["reverse_first_k"] = tuple(s.strip() for s in args.reverse_first_k.split(","))
    if args.max_staleness:
        kw["max_staleness"] = tuple(args.max_staleness)
    policies = tuple((args.policies if args.policies is not None else "layerpipe,pipedream").split(","))
    return SweepSpec(tuple(args.networks), tuple(args.num_procs), policies, batch=args.batch,
                     cost_model=args.cost_model, area=args.area, **kw)


def _words(text: str) -> float:
    from layerpipe.errors import InputError

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(f"--max-traffic takes words per sample >= 0 (the least any placement needs is 0: every "
                         f"task on one processor), got '{text}'")
    return value


def _plots(text: str) -> tuple[str, ...]:
    from layerpipe.dse._pareto import PLOTS
    from layerpipe.errors import InputError

    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if names == ("none",):
        return ()
    bad = [n for n in names if n not in PLOTS]
    if bad or not names:
        raise InputError(f"--plots takes a comma list of {', '.join(PLOTS)}, or none; got '{text}'")
    return names


def run(args: argparse.Namespace) -> int:
    if args.policies is not None and not args.sweep:  # the names `_spec` makes points of, before dse is imported
        check_registry_names(policies=args.policies.split(","))
    from layerpipe.dse import COLUMNS, ResultsFile, run_sweep, save_pareto
    from layerpipe.dse._evaluate import check_points
    from layerpipe.dse._pareto import check_pareto_dir

    spec = _spec(args)
    plots = _plots(args.plots)
    check_points(spec.points())  # bad network/policy names fail before any work
    out_dir = Path(args.pareto_dir) if args.pareto_dir else Path(args.out).parent
    ResultsFile(args.out).check(spec.sweep_id)  # another sweep's file, or not a results file: refused
    check_pareto_dir(out_dir, spec.sweep_id, COLUMNS)  # never over files of the user's or of another sweep
    summary = run_sweep(spec, args.out, jobs=args.jobs, scheduler=args.scheduler, resume=args.resume,
                        progress=not args.no_progress)
    rows = ResultsFile(args.out).read_rows()
    files = save_pareto(rows, out_dir, COLUMNS, plots)
    rate = summary.evaluated_points / summary.seconds if summary.seconds > 0 else 0.0
    print(f"{summary.total_points} points ({summary.skipped_points} resumed, {summary.evaluated_points} evaluated, "
          f"{rate:.1f} points/s) -> {args.out}; Pareto: {', '.join(str(f) for f in files)}")
    return 0

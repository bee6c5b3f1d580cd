"""`layerpipe report`: regenerate the reproducible `reports/` folder."""

from __future__ import annotations

import argparse

from layerpipe.commands._common import make_parent, replaceable_folder

#: A file every report folder holds: an existing --out without it is not a report, and is not replaced.
REPORT_MARKER = "compare.csv"


def _report_owns(name: str) -> bool:
    from layerpipe.report import REPORT_OUTPUTS  # on use: building the parser imports no scheduling code

    return REPORT_OUTPUTS(name)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="regenerate reports/ (comparison, ablation, Gantt charts, RTL summary)")
    p.add_argument("--out", type=replaceable_folder(REPORT_MARKER, "layerpipe report", _report_owns), default="reports",
                   help="output folder (default reports/; new, empty or an earlier report's)")
    p.add_argument("--no-rtl", action="store_true", help="skip the RTL verification and synthesis section")
    p.add_argument("--interconnect", default="rtl", metavar="SPEC",
                   help="interconnect of every section but the headline (which always shows shared, rtl and "
                        "links:2:1/16): shared, links:L:W, bus:L:W or rtl (default rtl)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from layerpipe.commands._common import require_extras

    if not args.no_rtl:  # the RTL section verifies a design: before minutes of scheduling, not after
        require_extras("report", "hdl", "torch")
    from layerpipe.report import ReportConfig, generate

    make_parent(args.out)
    from layerpipe.interconnect import parse_interconnect

    config = ReportConfig(rtl=not args.no_rtl, interconnect=args.interconnect)
    parse_interconnect(config.interconnect, lanes=config.lanes)  # a bad spec fails before any work
    files = generate(args.out, config, progress=not args.no_progress)
    print(f"{len(files)} files -> {args.out}/")
    return 0

"""`layerpipe report`: regenerate the reproducible `reports/` folder."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="regenerate reports/ (comparison, ablation, Gantt charts, RTL summary)")
    p.add_argument("--out", default="reports", help="output folder (default reports/)")
    p.add_argument("--no-rtl", action="store_true", help="skip the RTL verification and synthesis section")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from layerpipe.report import ReportConfig, generate

    files = generate(args.out, ReportConfig(rtl=not args.no_rtl), progress=not args.no_progress)
    print(f"{len(files)} files -> {args.out}/")
    return 0

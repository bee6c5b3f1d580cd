"""`layerpipe report`: regenerate the reproducible `reports/` folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerpipe.commands._common import ArgumentValueError
from layerpipe.errors import InputError


def output_folder(text: str) -> str:
    """--out: a folder path that is not an existing file (the report replaces the folder as a whole, so a file
    there would be moved aside and lost), checked before the minutes of work."""
    if not text.strip():
        raise ArgumentValueError("must be a folder path, got ''")
    if Path(text).exists() and not Path(text).is_dir():
        raise ArgumentValueError(f"must be a folder, got the file '{text}'")
    return text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="regenerate reports/ (comparison, ablation, Gantt charts, RTL summary)")
    p.add_argument("--out", type=output_folder, default="reports", help="output folder (default reports/)")
    p.add_argument("--no-rtl", action="store_true", help="skip the RTL verification and synthesis section")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from layerpipe.report import ReportConfig, generate

    parent = Path(args.out).resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {args.out}: cannot create {parent}: {exc.strerror or exc}") from None
    files = generate(args.out, ReportConfig(rtl=not args.no_rtl), progress=not args.no_progress)
    print(f"{len(files)} files -> {args.out}/")
    return 0

"""`layerpipe report`: regenerate the reproducible `reports/` folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerpipe.commands._common import ArgumentValueError
from layerpipe.errors import InputError

#: A file every report folder holds: an existing --out without it is not a report, and is not replaced.
REPORT_MARKER = "compare.csv"


def output_folder(text: str) -> str:
    """--out, checked before the minutes of work. The report replaces the folder as a whole (built beside it,
    then swapped in, the old one deleted), so --out must be new, empty or an earlier report: a file there, or
    a folder of other files (`--out .`, `--out ~/work`), would be moved aside and lost."""
    if not text.strip():
        raise ArgumentValueError("must be a folder path, got ''")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ArgumentValueError(f"must be a folder, got the file '{text}'")
    if path.is_dir() and any(path.iterdir()) and not (path / REPORT_MARKER).is_file():
        raise ArgumentValueError(f"'{text}' holds files but no layerpipe report ({REPORT_MARKER}); give a new or "
                                 "empty folder, or an earlier report's, since the folder is replaced")
    if Path.cwd().resolve().is_relative_to(path.resolve()):
        raise ArgumentValueError(f"must not be the current folder or one above it, got '{text}'")
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

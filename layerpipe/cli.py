"""The `layerpipe` command line.

Each subcommand lives in its own module under `layerpipe.commands` and exposes `register(subparsers)`,
which adds its parser and sets `handler`. Bad input of any kind (`InputError`, argparse errors) prints
one line on stderr and exits 2; no traceback, no half-written output.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import layerpipe
from layerpipe import __version__
from layerpipe.errors import InputError

#: Subcommand modules, in the order `--help` lists them.
COMMAND_MODULES = (
    "graph",
    "delays",
    "schedule",
    "compare",
    "simulate",
    "rtl",
    "verify",
    "explore",
    "report",
    "profile",
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    # the package's one-line summary, not this module's ("The `layerpipe` command line.")
    parser = _Parser(prog="layerpipe", description=(layerpipe.__doc__ or "").strip() or None)
    parser.add_argument("--version", action="version", version=f"layerpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"layerpipe.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"layerpipe.commands.{name}":
                continue  # not built yet
            raise
        module.register(sub)
    parser.set_defaults(commands=tuple(sub.choices))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:  # like any other bad input: one line on stderr, exit 2 (help is --help)
            raise InputError(f"a COMMAND is required: {', '.join(args.commands)} (layerpipe --help describes them)")
        return int(args.handler(args) or 0)
    except InputError as exc:
        print(f"layerpipe: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("layerpipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `layerpipe` command line.

Each subcommand lives in its own module under `layerpipe.commands` and exposes `register(subparsers)`,
which adds its parser and sets `handler`; the module is imported only when its subcommand runs
(`COMMANDS` holds the names and help lines `--help` lists). A command module imports at module level only what
its parser needs (the registries' names come from `layerpipe.commands._names`) and its handler imports the rest,
so `layerpipe CMD --help` and argument errors load no numeric library either (issue 14 item 3). Bad input of
any kind (`InputError`, argparse errors) and every other expected failure (`expected_failure`: a missing extra, a
refused path, too deep, too large, not UTF-8) prints one line on stderr and exits 2; no traceback, no
half-written output.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, TypeVar, overload

import layerpipe
from layerpipe import __version__
from layerpipe.errors import InputError

#: Subcommand → the one line `layerpipe --help` lists for it, in that order. Each lives in
#: `layerpipe.commands.<name>`, imported only when that subcommand runs (issue 14 item 3: importing every
#: command module to build the parser pulled in numpy, scipy and networkx and cost ~250 ms per start).
#: tests/test_cli_errors.py checks each line against the `help=` its module registers.
COMMANDS: dict[str, str] = {
    "graph": "layers, tasks and costs of a network's training graph",
    "delays": "per-layer gradient delays and iteration lags for a stage map (retiming)",
    "schedule": "one policy's schedule of a network on N processors",
    "compare": "cycles per sample of every policy on one cost model",
    "simulate": "time a schedule cycle by cycle (and run its numerics); write traces",
    "rtl": "generate the Verilog and microcode of an N-PE training accelerator",
    "verify": "simulate the generated RTL and compare it with PyTorch and the simulator",
    "explore": "sweep networks × N × policies × options; Pareto fronts and plots",
    "report": "regenerate reports/ (comparison, ablation, Gantt charts, RTL summary)",
    "profile": "time every layer's F, A, E, G, U with PyTorch on this CPU (profiled costs)",
}

#: Subcommand modules, in the order `--help` lists them.
COMMAND_MODULES = tuple(COMMANDS)


_N = TypeVar("_N")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}")


class _LazyCommand(_Parser):
    """A subcommand's parser that imports its module only when the subcommand is parsed.

    The top-level parser needs only the name and the one-line help; the module's `register` builds the
    real parser (with the same prog, so errors and `--help` read as before) on first use.
    """

    def __init__(self, *, module: str, **kwargs: Any) -> None:  # argparse.ArgumentParser's keywords
        super().__init__(**kwargs)
        self._module = module
        self._real: argparse.ArgumentParser | None = None

    def real(self) -> argparse.ArgumentParser:
        if self._real is None:
            name = self._module.rsplit(".", 1)[1]
            action = _Parser(prog="layerpipe").add_subparsers(dest="command", parser_class=_Parser)
            importlib.import_module(self._module).register(action)
            self._real = action.choices[name]
        return self._real

    # argparse's own overloads: no namespace gives a new Namespace, a given one is filled and returned.
    @overload
    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: None = None) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        return self.real().parse_known_args(args, namespace)

    def format_help(self) -> str:
        return self.real().format_help()

    def format_usage(self) -> str:
        return self.real().format_usage()


def build_parser() -> argparse.ArgumentParser:
    # the package's one-line summary, not this module's ("The `layerpipe` command line.")
    summary = (layerpipe.__doc__ or "").strip().split("\n\n")[0]  # the package's first paragraph, not its API tour
    parser = _Parser(prog="layerpipe", description=summary or None)
    parser.add_argument("--version", action="version", version=f"layerpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_LazyCommand)
    for name, line in COMMANDS.items():
        sub.add_parser(name, help=line, module=f"layerpipe.commands.{name}", add_help=False)
    parser.set_defaults(commands=tuple(sub.choices))
    return parser


#: Optional extras: a missing module of one names the install command (pyproject's optional-dependencies).
EXTRAS: dict[str, str] = {"amaranth": "hdl", "cocotb": "hdl", "cocotb_tools": "hdl", "torch": "torch",
                          "distributed": "dask", "dask": "dask"}


#: Longest error line printed (characters): messages quote the user's input, which may be huge.
MAX_MESSAGE = 2000


def expected_failure(exc: BaseException) -> str | None:
    """The one-line message of an expected failure, or None for a bug (which keeps its traceback).

    Expected: bad input (`InputError`), an optional extra not installed, the operating system refusing a path
    (read-only, missing, full disk), input nested deeper than Python's recursion limit (YAML/JSON), a run too
    large for this machine's memory, and text that is not UTF-8. Each is the user's situation, not a bug, so
    it is one line and exit 2 (issue 12 item 6).
    """
    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        root = exc.name.split(".")[0]
        if root in EXTRAS:
            extra = EXTRAS[root]
            return (f"this command needs the '{extra}' extra ({root} is not installed): "
                    f"pip install 'layerpipe[{extra}]'")
        return None
    if isinstance(exc, RecursionError):
        return "input nested too deeply (lists or mappings inside each other beyond Python's recursion limit)"
    if isinstance(exc, MemoryError):
        return "not enough memory for this run; make it smaller (fewer samples, iterations, processors or layers)"
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x})"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"cannot access {exc.filename}: {exc.strerror or exc}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:  # like any other bad input: one line on stderr, exit 2 (help is --help)
            raise InputError(f"a COMMAND is required: {', '.join(args.commands)} (layerpipe --help describes them)")
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("layerpipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the one place an expected failure becomes one line and exit 2
        message = expected_failure(exc)
        if message is None:
            raise
        line = " ".join(message.split())
        if len(line) > MAX_MESSAGE:  # a 1 MB field echoed back is one line, but not a readable one
            line = line[:MAX_MESSAGE] + f"… ({len(line) - MAX_MESSAGE} more characters)"
        print(f"layerpipe: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by the CLI subcommands: argument types, atomic output, tables.

Every command's parser imports this module, so at module level it imports only the standard library and cheap
layerpipe modules (issue 14 item 3: `layerpipe CMD --help` in well under 100 ms); the cost models and the
interconnects are imported by the functions that build them, when a command runs.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from layerpipe._files import check_creatable, check_output_file, check_output_folder, write_atomic
from layerpipe.commands._names import COST_MODEL_TAKES, POLICY_NAMES
from layerpipe.errors import InputError, unknown_name

__all__ = ["write_atomic"]  # re-exported: commands import their file helpers from here or from layerpipe._files


class ArgumentValueError(InputError, argparse.ArgumentTypeError):
    """A bad option value. argparse shows an ArgumentTypeError's own message (for other exceptions raised by a
    `type=` function it prints only "invalid parse value"), and outside argparse it is an InputError."""


def positive_int(field: str, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgumentValueError(f"{field} must be a positive integer, got '{text}'") from None
        if value < 1:
            raise ArgumentValueError(f"{field} must be a positive integer (>= 1), got {value}")
        if maximum is not None and value > maximum:
            raise ArgumentValueError(f"{field} must be an integer in 1..{maximum}, got {value}")
        return value

    return parse


def int_in(field: str, lo: int, hi: int) -> Callable[[str], int]:
    """An integer in lo..hi (--stream-bits, --csr-bits), refused naming the field and the range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgumentValueError(f"{field} must be an integer in {lo}..{hi}, got '{text}'") from None
        if not lo <= value <= hi:
            raise ArgumentValueError(f"{field} must be an integer in {lo}..{hi}, got {value}")
        return value

    return parse


def positive_float(field: str) -> Callable[[str], float]:
    """The one parser of a finite number > 0 (--lr, --time-limit): '0.0625', '2e-4' and '3' are fine;
    'nan', 'inf', '0' and '-1' are refused naming the field."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ArgumentValueError(f"{field} must be a number > 0 such as 0.0625 or 2e-4, got '{text}'") from None
        if not (value > 0 and math.isfinite(value)):
            raise ArgumentValueError(f"{field} must be a finite number > 0, got {text}")
        return value

    return parse


def non_negative_int(field: str, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgumentValueError(f"{field} must be an integer >= 0, got '{text}'") from None
        if value < 0:
            raise ArgumentValueError(f"{field} must be >= 0, got {value}")
        if maximum is not None and value > maximum:
            raise ArgumentValueError(f"{field} must be an integer in 0..{maximum}, got {value}")
        return value

    return parse


def int_list(field: str, minimum: int = 1, maximum: int | None = None):
    """Parse '7,8,9' or '2-16' into a list of ints, each in minimum..maximum."""

    def parse(text: str) -> list[int]:
        values: list[int] = []
        allowed = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        out_of_range = ArgumentValueError(f"{field} values must be {allowed}, got '{text}'")
        for part in text.split(","):
            try:
                if "-" in part.strip()[1:]:
                    lo, hi = (int(end) for end in part.split("-", 1))
                else:
                    lo = hi = int(part)
            except ValueError:
                raise ArgumentValueError(f"{field} must be integers like 7,8,9 or 2-16, got '{text}'") from None
            if hi < lo:
                raise ArgumentValueError(f"{field}: a range LO-HI needs LO <= HI (like 2-9), got '{part.strip()}'")
            if lo < minimum or (maximum is not None and hi > maximum):  # before '1-100000000' expands
                raise out_of_range
            values.extend(range(lo, hi + 1))
        return values

    return parse


def output_file(text: str) -> str:
    """An output FILE argument (argparse names the flag in front of the message), checked before any work:
    not empty, not a directory, not a socket or block device (`layerpipe._files.check_output_file`)."""
    try:
        return check_output_file(text)
    except InputError as exc:
        raise ArgumentValueError(str(exc)) from None


def add_output_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", type=output_file, default=None,
                        help="write to FILE (atomically) instead of stdout")


#: Limits of the sizes the shared flags take (issue 12 item 5): far above any real accelerator, low enough that
#: no cost or memory figure overflows what the simulator and the functional mode allocate.
MAX_BATCH = 1 << 16
MAX_LANES = 1 << 20
MAX_OVERHEAD = 10**9


def add_network_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=positive_int("--batch", MAX_BATCH), default=None,
                        help="micro-batch size B (default: the network's own, 1 for built-ins)")


#: What each cost model takes from the command line (besides its name): the registry's `takes`, from the static
#: copy the parsers use (tests/test_cli_names.py holds it equal to `layerpipe.costs.COST_MODELS`).
COST_MODEL_OPTIONS = {name: tuple(f"--{p}" for p in takes) for name, takes in COST_MODEL_TAKES.items()}
_DEFAULT_LANES = 64
_DEFAULT_OVERHEAD = 16


def check_registry_names(*, policies: Iterable[str] = (), cost_model: str | None = None) -> None:
    """Policy and cost-model names checked against the parsers' static copies (`_names`) before a handler imports
    the registries or reads a network: a misspelt name is an argument error, answered in ~30 ms rather than the
    ~300 ms of importing the scheduler first (issue 14 item 3). The message is the registry's own
    (`unknown_name`), which the registry gives again if a name ever got past this check. So these names are
    checked before the NETWORK and the other flags; a command line with several errors reports these first."""
    for name in policies:
        if name not in POLICY_NAMES:
            raise unknown_name("policy", name, POLICY_NAMES)
    if cost_model is not None and cost_model not in COST_MODEL_TAKES:
        raise unknown_name("cost model", cost_model, COST_MODEL_TAKES)


def add_cost_args(parser: argparse.ArgumentParser, default: str = "pe") -> None:
    # --lanes/--overhead default to None so that `cost_model_from_args` can tell a flag the chosen model
    # ignores (an error) from one left out (the model's default).
    parser.add_argument("--cost-model", default=default, help=f"{', '.join(COST_MODEL_TAKES)} (default {default})")
    parser.add_argument("--lanes", type=positive_int("--lanes", MAX_LANES), default=None,
                        help=f"MACs per cycle (pe, rtl; default {_DEFAULT_LANES})")
    parser.add_argument("--overhead", type=non_negative_int("--overhead", MAX_OVERHEAD), default=None,
                        help=f"fixed cycles per op (pe; default {_DEFAULT_OVERHEAD})")
    parser.add_argument("--profile", default=None, help="profile JSON for --cost-model profiled")


def cost_model_from_args(args: argparse.Namespace, network=None):
    """The cost model the flags ask for; `network` (when given) is checked against a profile's network."""
    from layerpipe.costs import ProfiledModel, make_cost_model

    given = {flag: getattr(args, flag.lstrip("-")) for flag in ("--lanes", "--overhead", "--profile")}
    takes = COST_MODEL_OPTIONS.get(args.cost_model)
    if takes is not None:  # an unknown name is make_cost_model's error, which lists the models
        for flag, value in given.items():
            if value is not None and flag not in takes:
                users = ", ".join(name for name, flags in COST_MODEL_OPTIONS.items() if flag in flags)
                raise InputError(f"{flag} applies to --cost-model {users}, not '{args.cost_model}'")
    lanes = _DEFAULT_LANES if args.lanes is None else args.lanes
    overhead = _DEFAULT_OVERHEAD if args.overhead is None else args.overhead
    model = make_cost_model(args.cost_model, lanes=lanes, overhead=overhead, profile=args.profile)
    if network is not None and isinstance(model, ProfiledModel):
        model.check_network(network)
    return model


def add_interconnect_arg(parser: argparse.ArgumentParser, default: str = "rtl") -> None:
    parser.add_argument("--interconnect", default=default, metavar="SPEC",
                        help="how data moves between processors: shared (free, an idealisation), "
                             "links:LATENCY:WORDS_PER_CYCLE (one link per processor pair; W may be a fraction "
                             "such as 1/16), bus:LATENCY:WORDS_PER_CYCLE (one medium), or rtl (the links "
                             f"`layerpipe rtl` generates: latency 2, --lanes words per cycle); default {default}")


def interconnect_from_args(args: argparse.Namespace, model=None):
    """The interconnect the flags ask for; `rtl` takes the cost model's lanes (1 for models without lanes:
    one MAC and one word per cycle)."""
    from layerpipe.interconnect import parse_interconnect

    lanes = getattr(model, "lanes", None) or 1
    return parse_interconnect(args.interconnect, lanes=lanes)


#: Optional extras (pyproject's optional-dependencies) and the modules that show one is installed.
EXTRA_MODULES = {"hdl": ("amaranth", "cocotb"), "torch": ("torch",)}


def require_extras(command: str, *extras: str) -> None:
    """Before any work: one line naming the install command when an extra the command needs is missing
    (issue 12 item 9: `rtl` without amaranth was an 11-line traceback after the README's first command)."""
    import importlib.util

    for extra in extras:
        for module in EXTRA_MODULES[extra]:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken install
                found = False
            if not found:
                raise InputError(f"`layerpipe {command}` needs the '{extra}' extra ({module} is not installed): "
                                 f"pip install 'layerpipe[{extra}]'")


def build_dir(text: str) -> str:
    """A --build-dir: a folder (new or existing) this user can write, checked before any work."""
    import os

    path = Path(text)
    if not text.strip():
        raise ArgumentValueError("must be a folder path, got ''")
    if path.exists() and not path.is_dir():
        raise ArgumentValueError(f"must be a folder, got the file '{text}'")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ArgumentValueError(f"'{text}': cannot write in it (read-only)")
    if not path.exists():
        try:
            check_creatable(path, f"'{text}'")
        except InputError as exc:
            raise ArgumentValueError(str(exc)) from None
    return text


def emit(text: str, out: str | None) -> None:
    """Print to stdout, or write atomically to `out`."""
    if out:
        write_atomic(out, text)
    else:
        print(text, end="" if text.endswith("\n") else "\n")


def to_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table; numbers right-aligned."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) if rows else False for i in range(len(headers))]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if num else s.ljust(w) for s, w, num in zip(items, widths, numeric,
                                                                                 strict=True)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.4g}"
    return str(value)


def replaceable_folder(marker: str, what: str, owns: Callable[[str], bool] | None = None):
    """An --out folder that a command replaces as a whole (built beside it, swapped in, the old one deleted).

    It must be new, empty, or an earlier output of the same command (it holds `marker`, and only names that
    `owns` accepts): a file there, or a folder of other files (`--out .`, `--out ~/work`), would be moved aside
    and lost. `/`, `.`, `..` and folders above the current one are refused. Checked before any work.
    """

    def parse(text: str) -> str:
        try:
            return check_output_folder(text, owns or (lambda name: True), marker, what)
        except InputError as exc:
            raise ArgumentValueError(str(exc)) from None

    return parse


def make_parent(out: str) -> None:
    """Create the folder that will hold `out`; one line on failure."""
    parent = Path(out).resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create {parent}: {exc.strerror or exc}") from None


def add_split_args(parser: argparse.ArgumentParser) -> None:
    """The DFG's split switches (design notes §2), for commands that build the graph themselves."""
    parser.add_argument("--no-intra", action="store_true", help="keep E and G of a layer in one task")
    parser.add_argument("--no-inter", action="store_true", help="keep A and E of a layer in one task")

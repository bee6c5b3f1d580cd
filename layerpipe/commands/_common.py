"""Helpers shared by the CLI subcommands: argument types, atomic output, tables."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from layerpipe.errors import InputError


class ArgumentValueError(InputError, argparse.ArgumentTypeError):
    """A bad option value. argparse shows an ArgumentTypeError's own message (for other exceptions raised by a
    `type=` function it prints only "invalid parse value"), and outside argparse it is an InputError."""


def positive_int(field: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgumentValueError(f"{field} must be a positive integer, got '{text}'") from None
        if value < 1:
            raise ArgumentValueError(f"{field} must be a positive integer (>= 1), got {value}")
        return value

    return parse


def int_list(field: str, minimum: int = 1):
    """Parse '7,8,9' or '2-16' into a list of ints, each >= minimum."""

    def parse(text: str) -> list[int]:
        values: list[int] = []
        try:
            for part in text.split(","):
                if "-" in part.strip()[1:]:
                    lo, hi = part.split("-", 1)
                    values.extend(range(int(lo), int(hi) + 1))
                else:
                    values.append(int(part))
        except ValueError:
            raise ArgumentValueError(f"{field} must be integers like 7,8,9 or 2-16, got '{text}'") from None
        bad = [v for v in values if v < minimum]
        if bad or not values:
            raise ArgumentValueError(f"{field} values must be >= {minimum}, got '{text}'")
        return values

    return parse


def add_network_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=positive_int("--batch"), default=None,
                        help="micro-batch size B (default: the network's own, 1 for built-ins)")


def add_cost_args(parser: argparse.ArgumentParser, default: str = "pe") -> None:
    parser.add_argument("--cost-model", default=default, help=f"macs, pe, profiled, rtl (default {default})")
    parser.add_argument("--lanes", type=positive_int("--lanes"), default=64, help="MACs per cycle (pe, rtl)")
    parser.add_argument("--overhead", type=int, default=16, help="fixed cycles per op (pe)")
    parser.add_argument("--profile", default=None, help="profile JSON for --cost-model profiled")


def cost_model_from_args(args: argparse.Namespace):
    from layerpipe.costs import make_cost_model

    return make_cost_model(args.cost_model, lanes=args.lanes, overhead=args.overhead, profile=args.profile)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file so that readers see either the old or the whole new content, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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

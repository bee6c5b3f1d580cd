"""The retiming code as it was before networkx became the graph layer (hand-written topological order, DAG
longest path, numpy Bellman–Ford, Floyd–Warshall, union-find legality), loaded from git for the side-by-side
rows of benchmarks/bench_retiming.py — not a copy kept in the tree.

`load(rev)` reads layerpipe/retiming/{_cycle_ratio,_delays,_leiserson_saxe}.py at `rev` with `git show`
and executes them as the package `_retiming_before` (their `layerpipe.retiming` / `layerpipe._cycle_ratio` /
`layerpipe._gradient_delays` imports pointed at each other); the rest of layerpipe (dfg, costs, errors) is
today's. Returns the module holding the old public functions, or raises `BeforeUnavailable` (no git, no
such revision) so the benchmark can say why it prints no "before" column.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

#: The last commit whose retiming was hand-written (the next one, 4c404fd, moved it onto networkx).
BEFORE_NETWORKX = "4c404fd^"
PACKAGE = "_retiming_before"
#: Old import targets → the module of this package that holds them at BEFORE_NETWORKX.
_MODULES = {"layerpipe.retiming": "_leiserson_saxe", "layerpipe._cycle_ratio": "_cycle_ratio",
            "layerpipe._gradient_delays": "_delays"}
_LOAD_ORDER = ("_cycle_ratio", "_delays", "_leiserson_saxe")  # _leiserson_saxe re-exports from _delays


class BeforeUnavailable(RuntimeError):
    """The old code cannot be read (not a git checkout, or the revision is missing)."""


def load(rev: str = BEFORE_NETWORKX) -> types.ModuleType:
    root = Path(__file__).resolve().parent.parent
    sources = {}
    for name in _LOAD_ORDER:
        try:
            text = subprocess.run(["git", "show", f"{rev}:layerpipe/retiming/{name}.py"], cwd=root, check=True,
                                  capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise BeforeUnavailable(f"git show {rev}:layerpipe/retiming/{name}.py failed: {exc}") from None
        for old, new in _MODULES.items():
            text = re.sub(rf"\bfrom {re.escape(old)} import", f"from {PACKAGE}.{new} import", text)
        sources[name] = text
    package = types.ModuleType(PACKAGE)
    package.__path__ = []
    sys.modules[PACKAGE] = package
    for name in _LOAD_ORDER:
        sys.modules[f"{PACKAGE}.{name}"] = types.ModuleType(f"{PACKAGE}.{name}")
    for name in _LOAD_ORDER:
        module = sys.modules[f"{PACKAGE}.{name}"]
        exec(compile(sources[name], f"<{rev}:layerpipe/retiming/{name}.py>", "exec"), module.__dict__)
    return sys.modules[f"{PACKAGE}._leiserson_saxe"]

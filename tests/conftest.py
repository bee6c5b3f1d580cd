"""Shared test helpers and hypothesis profiles.

- `run_cli(*args)`: the `layerpipe` command line in a fresh interpreter (`python -m layerpipe.cli`), as
  a user runs it — exit status, stdout and stderr, with a timeout so a hang fails instead of stalling
  the suite. Tests import it: `from tests.conftest import run_cli`.
- Hypothesis profiles, chosen by `HYPOTHESIS_PROFILE` (default `dev`; `ci` when CI is set):
  `dev`   — no per-example deadline: ~8 developers share 2 cores, so wall-clock deadlines are noise;
  `ci`    — the same, and failing examples print their reproduction blob for the log;
  `quick` — 10 examples per property, for a fast local loop (`HYPOTHESIS_PROFILE=quick pytest -m "not slow"`).
  A test that sets `max_examples` itself keeps it in every profile.
- CPU time per test, opt-in: `LAYERPIPE_TEST_CPU=PATH pytest ...` appends one JSON line per test to PATH
  (nodeid, slow mark, CPU seconds of setup+call+teardown in this process *and* its waited-for children —
  so a CLI test's subprocess counts —, wall seconds, xdist worker). `tools/test_times.py PATH` sums it
  per tier and lists the top N. CPU, not wall: the machine is shared, wall times are load.
- Longest first under xdist: workers take tests in collection order, one at a time, so a long test collected
  last runs alone at the end while the other worker idles. In an xdist worker the items are reordered by the
  CPU seconds recorded in `tests/cpu_times.json` (`tools/test_times.py PATH --write-order tests/cpu_times.json`
  rewrites it), longest first; a slow test not in the file counts as `UNRECORDED_SLOW_S`, any other unrecorded
  test as 0 (it keeps its collection order). An `xdist_group` moves as one block (its tests stay together, in
  order). A single process (no `-n`) keeps the collection order.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

_HERE = os.path.dirname(os.path.abspath(__file__))

settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", deadline=None, max_examples=10)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def run_cli(*args: str, timeout: float = 300, cwd: str | os.PathLike[str] | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`layerpipe ARGS...` in a subprocess of this interpreter; text output captured."""
    return subprocess.run([sys.executable, "-m", "layerpipe.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


_CPU_LOG = os.environ.get("LAYERPIPE_TEST_CPU")


def _cpu_seconds() -> float:
    """User+system CPU of this process and of its terminated, waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if _CPU_LOG:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
        """Record the item's CPU (setup + call + teardown; a session fixture counts where it is built)."""
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        yield
        record = {"nodeid": item.nodeid, "slow": item.get_closest_marker("slow") is not None,
                  "cpu": round(_cpu_seconds() - cpu0, 3), "wall": round(time.perf_counter() - wall0, 3),
                  "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
        _write_record(record)

    def _write_record(record: dict[str, object]) -> None:
        # One short O_APPEND write per line: xdist workers share the file without interleaving.
        fd = os.open(str(_CPU_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)

    def pytest_collection_finish(session: pytest.Session) -> None:
        """The process's CPU up to here (interpreter start, imports, collection): per worker, not per test."""
        _write_record({"nodeid": "<startup+collection>", "slow": False, "cpu": round(_cpu_seconds(), 3),
                       "wall": None, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})


#: The order key of a slow test with no recorded CPU (a new one): early, but after the recorded heavy ones.
UNRECORDED_SLOW_S = 10.0
CPU_TIMES = os.path.join(_HERE, "cpu_times.json")


def _recorded_cpu() -> dict[str, float]:
    try:
        with open(CPU_TIMES, encoding="utf-8") as f:
            return {str(k): float(v) for k, v in json.load(f)["cpu_seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}  # no file or an unreadable one: the collection order, as without this hook


def longest_first(items: list[pytest.Item], recorded: dict[str, float]) -> list[pytest.Item]:
    """`items` with the most expensive blocks first; a block is one test, or one xdist_group's tests."""
    def cost(item: pytest.Item) -> float:
        if item.nodeid in recorded:
            return recorded[item.nodeid]
        return UNRECORDED_SLOW_S if item.get_closest_marker("slow") is not None else 0.0

    blocks: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        group = item.get_closest_marker("xdist_group")
        key = f"group:{group.args[0] if group.args else group.kwargs.get('name')}" if group else f"item:{index}"
        blocks.setdefault(key, []).append(index)
    order = sorted(blocks.values(), key=lambda members: (-max(cost(items[i]) for i in members), members[0]))
    return [items[i] for members in order for i in members]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only in an xdist worker: every worker reorders the same collection the same way (xdist checks that the
    # collections agree), and the controller hands the tests out in this order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = longest_first(items, _recorded_cpu())

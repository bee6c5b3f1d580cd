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

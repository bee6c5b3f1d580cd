"""Shared test helpers and hypothesis profiles.

- `run_cli(*args)`: the `layerpipe` command line in a fresh interpreter (`python -m layerpipe.cli`), as
  a user runs it — exit status, stdout and stderr, with a timeout so a hang fails instead of stalling
  the suite. Tests import it: `from tests.conftest import run_cli`.
- Hypothesis profiles, chosen by `HYPOTHESIS_PROFILE` (default `dev`; `ci` when CI is set):
  `dev`   — no per-example deadline: ~8 developers share 2 cores, so wall-clock deadlines are noise;
  `ci`    — the same, and failing examples print their reproduction blob for the log;
  `quick` — 10 examples per property, for a fast local loop (`HYPOTHESIS_PROFILE=quick pytest -m "not slow"`).
  A test that sets `max_examples` itself keeps it in every profile.
"""

from __future__ import annotations

import os
import subprocess
import sys

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

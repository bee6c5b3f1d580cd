"""Shared test helpers and hypothesis profiles.

- `run_cli(*args)`: the `layerpipe` command line in a fresh interpreter (`python -m layerpipe.cli`), as
  a user runs it — exit status, stdout and stderr, with a timeout so a hang fails instead of stalling
  the suite. Tests import it: `from tests.conftest import run_cli`.
- Hypothesis profiles, chosen by `HYPOTHESIS_PROFILE` (default `dev`; `ci` when CI is set):
  `dev`   — no per-example deadline: ~8 developers share 2 cores, so wall-clock deadlines are noise;
  `ci`    — the same, failing examples print their reproduction blob for the log, and the examples are
            derandomized (a function of each test): CI's verdict is the one a clean clone gives here with CI set,
            not a draw. The dev profile keeps exploring at random (and stores what it finds in .hypothesis/);
  `quick` — 10 examples per property, for a fast local loop (`HYPOTHESIS_PROFILE=quick pytest -m "not slow"`).
  A test that sets `max_examples` itself keeps it in every profile.
- Verilator models (cocotb's and the harness's) are built at -O0 (`LAYERPIPE_VERILATOR_OPT_FAST`, set unless the
  caller set it), but for the harness's hot code, at -O1 (same build time, ~6x the speed of a long run). Verilator's
  runtime files keep their default level: the build that setup.sh --dev ran compiled them into ccache once.
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
- `cached_schedule(...)`: `make_schedule` computed once per test run and shared by every test and every xdist
  worker of the run (a pickle per call in a folder the run creates and removes; no cache outlives the run, so
  a code change is always seen). The zoo sweeps of test_comm_schedule, test_policies and test_report schedule
  the same (policy, network, N, cost model, interconnect) many times over. Use it only where the schedule is
  an input of the check, not the thing whose computation is under test (determinism, speed, errors).
- `pairwise(points, covered=(), keep=())` / `grid(...)`: a grid of parameter points cut to a pairwise
  covering subset for the suite — every pair of values of two parameters that occurs together in some point
  occurs together in a kept point (or in one of `covered`, points another test runs; `keep`: points always
  kept) — and the rest marked
  `exhaustive`. Exhaustive tests are skipped unless `--exhaustive` (or `LAYERPIPE_EXHAUSTIVE=1`) is given:
  the suite runs every class of case (each value of each parameter, each pair of them) — 302-322 s of pytest
  (585-624 CPU-s) in the clean-clone CI runs on 2 cores of 2026-12-06 22:41-23:10, 310 s (586 CPU-s) and
  285 s (541 CPU-s) at 00:10 and 00:37 the next night, against issue 13's target of 300 s; 273-295 s
  (529-571 CPU-s) the session before, the difference ~12 CPU-s of new tests, ~8 of LayerPipe's searches on
  fewer processors inside the property tests, the rest the machine — and the full grids (every combination,
  ~3 minutes more) are one flag away.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from layerpipe.costs import CostModel
    from layerpipe.interconnect import Interconnect
    from layerpipe.network import Network
    from layerpipe.schedule import ScheduleResult

_HERE = os.path.dirname(os.path.abspath(__file__))

settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)
settings.register_profile("quick", deadline=None, max_examples=10)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
# Verilator models built at -O0 (cocotb's and the C++ harness's): a test's run is seconds, and -O0 halves the
# model's build at the default -Os (hdl/_cocotb.py) and cuts the harness's -O2 build by ~40 % (hdl/_harness.py).
os.environ.setdefault("LAYERPIPE_VERILATOR_OPT_FAST", "-O0")


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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="also run the tests marked exhaustive (the full RTL and zoo grids; see tests/conftest.py)")


def exhaustive_enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("--exhaustive")) or os.environ.get("LAYERPIPE_EXHAUSTIVE", "") not in ("", "0")


def _pairs(point: tuple[object, ...]) -> set[tuple[int, object, int, object]]:
    return {(i, point[i], j, point[j]) for i in range(len(point)) for j in range(i + 1, len(point))}


def pairwise(points: Sequence[tuple[object, ...]], covered: Sequence[tuple[object, ...]] = (),
             keep: Sequence[tuple[object, ...]] = ()) -> list[tuple[object, ...]]:
    """The points of a greedy pairwise covering subset of `points`, in their order: the points of `keep`, then
    repeatedly the point that covers the most value pairs not yet covered (the first such on ties:
    deterministic), until every pair that occurs in `points` occurs in a chosen point or in `covered` (points
    another test runs). Points of one parameter are each kept."""
    if points and len(points[0]) < 2:
        return list(points)
    needed: set[tuple[int, object, int, object]] = set().union(*(_pairs(p) for p in points))
    for point in covered:
        needed -= _pairs(point)
    chosen = {k for k, p in enumerate(points) if p in keep}
    for k in chosen:
        needed -= _pairs(points[k])
    while needed:
        best = max(range(len(points)), key=lambda k: (len(_pairs(points[k]) & needed), -k))
        chosen.add(best)
        needed -= _pairs(points[best])
    return [p for k, p in enumerate(points) if k in chosen]


def grid(points: Sequence[tuple[object, ...]], covered: Sequence[tuple[object, ...]] = (),
         keep: Sequence[tuple[object, ...]] = ()) -> list[object]:
    """`points` as pytest params: the `pairwise` subset as they are, every other point marked exhaustive."""
    kept = {tuple(p) for p in pairwise(points, covered, keep)}
    return [pytest.param(*p, marks=() if tuple(p) in kept else pytest.mark.exhaustive) for p in points]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not exhaustive_enabled(config):
        skip = pytest.mark.skip(reason="exhaustive tier (--exhaustive or LAYERPIPE_EXHAUSTIVE=1 runs it)")
        for item in items:
            if item.get_closest_marker("exhaustive") is not None:
                item.add_marker(skip)
    # Only in an xdist worker: every worker reorders the same collection the same way (xdist checks that the
    # collections agree), and the controller hands the tests out in this order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = longest_first(items, _recorded_cpu())


#: The run's schedule folder: made by the controller (or the single process) and inherited by xdist's workers,
#: which are started after pytest_configure.
SCHEDULE_CACHE_ENV = "LAYERPIPE_TEST_SCHEDULE_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker uses its controller's folder
    folder = tempfile.mkdtemp(prefix="layerpipe-test-schedules-")
    os.environ[SCHEDULE_CACHE_ENV] = folder  # replaces any inherited value: one folder per run
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def cached_schedule(name: str, network: Network, num_procs: int, model: CostModel, options: object | None = None,
                    interconnect: Interconnect | None = None) -> ScheduleResult:
    """`make_schedule(...)`, computed once per test run (see the module docstring). Each call returns its own
    copy (unpickled), so a test cannot change another's result."""
    from layerpipe.interconnect import SHARED
    from layerpipe.schedule.policies import POLICIES, make_schedule

    folder = os.environ.get(SCHEDULE_CACHE_ENV)
    if not folder or not os.path.isdir(folder) or name not in POLICIES:
        return make_schedule(name, network, num_procs, model, options, interconnect)
    # The defaults spelled out, so `options=None` and the default options object (and no interconnect and
    # `shared`) are one entry. Equal pickles are equal arguments; unequal ones at worst a second computation.
    args = (name, network, num_procs, model, POLICIES[name].options() if options is None else options,
            SHARED if interconnect is None else interconnect)
    path = os.path.join(folder, hashlib.sha256(pickle.dumps(args, protocol=5)).hexdigest() + ".pickle")
    try:
        with open(path, "rb") as f:
            cached: ScheduleResult = pickle.load(f)
        return cached
    except FileNotFoundError:
        pass
    result = make_schedule(*args)  # an InputError propagates and is not cached
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as f:
        pickle.dump(result, f, protocol=5)
    os.replace(partial, path)  # whole or absent: a worker reading it never sees a partial pickle
    return result


def cached_verilog(design: object, *, debug: bool = False, export: Callable[..., str] | None = None) -> str:
    """`layerpipe.hdl._flow.export_verilog(design, debug=debug)`, computed once per test run and shared by every
    test and xdist worker of the run, like `cached_schedule`: the text is a pure function of the design's program,
    learning-rate shift and host configuration (what `Accelerator` is built from) and `debug`, and those pickle
    to equal bytes exactly when they are equal. For tests whose Verilog is an input of the check (a simulation, a
    lint, a synthesis), never for one that checks the export itself (determinism, errors). `export` computes a
    miss (default: `export_verilog` as it is now)."""
    import layerpipe.hdl._flow as flow

    export = export or flow.export_verilog
    folder = os.environ.get(SCHEDULE_CACHE_ENV)
    if not folder or not os.path.isdir(folder):
        return export(design, debug=debug)
    key = pickle.dumps((design.program, design.lr_shift, design.host, debug), protocol=5)  # type: ignore[attr-defined]
    path = os.path.join(folder, hashlib.sha256(key).hexdigest() + ".v")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        pass
    verilog = export(design, debug=debug)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(verilog)
    os.replace(partial, path)
    return verilog


@pytest.fixture
def shared_verilog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `export_verilog` of the test — its own and the library's (`verify_design`, the report's RTL jobs) —
    goes through `cached_verilog`: the suite exports some designs in several tests (a lint and a simulation of
    one design, the report's designs and their synthesis check)."""
    import functools

    import layerpipe.hdl._flow as flow

    monkeypatch.setattr(flow, "export_verilog", functools.partial(cached_verilog, export=flow.export_verilog))


@pytest.fixture
def replica_counts_dividing_12(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """PipeDream's planner as it was before a stage could have any replica count up to N: one search over the
    counts that divide 12. For regression tests pinned on a plan found then (the class they guard is also
    tested on generated cases in today's space). The scheduling memos are emptied before and after, so no plan
    of the old space reaches another test."""
    from layerpipe._memo import clear_memos
    from layerpipe.schedule import _planner

    monkeypatch.setattr(_planner, "rounds", lambda n: ((12, tuple(c for c in (1, 2, 3, 4, 6) if c <= n)),))
    clear_memos()
    yield
    clear_memos()

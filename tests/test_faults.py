"""Fault tests (issue 12, Done when): SIGKILL at random points of `simulate`, `report`, `rtl` and
`explore --jobs 2`, at least 20 kills each.

- `simulate`, `report`, `rtl`: the output folder is always the old or the new one (byte for byte), never
  missing or mixed; no temporary folder survives the next (complete) run.
- `explore --jobs 2`: every row in the results file is a whole row equal to the clean run's row for its point;
  a `--resume` after the last kill gives the clean run's bytes; no worker outlives the killed parent by more
  than 5 s; no temporary file survives.

Each run is a forked child of this process running the real command (`layerpipe.cli.main`, or
`layerpipe.report.generate` with a tiny configuration since the report has no small CLI form): no interpreter
start per kill, so 20 kills cost seconds, not minutes (the report's schedules are memoized in this process
first, see its test; `simulate` and `explore` run once in this process first, `_warm`, so no child imports
matplotlib again). The child makes itself a process group, so its workers
can be found after it dies. Kill times are drawn from a seeded generator over the CPU seconds of a complete run
(`_Clock`: the kills land over the command's work however loaded the machine is).

A forked child shares tqdm's lock with this process in two ways, and both hung CI until pytest-timeout (900 s):
- Forking a process that runs other threads copies their locks as they were: a lock another thread held at the
  fork is held for ever in the child. tqdm's monitor thread (started by the first progress bar in this xdist
  worker, any earlier test's) takes tqdm's lock every few seconds, and a child forked inside that window hung on
  its own first bar. So the monitor is stopped before every fork and never restarted in this process.
- tqdm's lock includes a multiprocessing semaphore, which a fork shares rather than copies. Every bar takes it,
  even a disabled one; a child SIGKILLed while holding it left it held for ever, so the next child and then this
  worker's next bar (another test's) hung. So each child makes its own tqdm locks first thing (`_own_tqdm_locks`),
  as a separately started `layerpipe` process would have.
Each wait on a child has a deadline that fails the test in CHILD_SECONDS with what was running.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from layerpipe.cli import main

KILLS = 20
SURVIVAL_SECONDS = 5.0
CHILD_SECONDS = 180.0  # a complete run takes 0.5-3 s here; a child that outlives this is hung, not slow


def _no_monitor_thread() -> None:
    """Stop tqdm's monitor thread and keep it from starting again in this process (see the module docstring)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0
    monitor = tqdm.monitor
    if monitor is not None:
        monitor.exit()  # sets its event and joins it
        tqdm.monitor = None


def _own_tqdm_locks() -> None:
    """In a forked child: tqdm locks of its own, so that killing it cannot leave this process's held (docstring)."""
    import multiprocessing
    import threading

    from tqdm import tqdm
    from tqdm.std import TqdmDefaultWriteLock

    TqdmDefaultWriteLock.th_lock = threading.RLock()
    TqdmDefaultWriteLock.mp_lock = multiprocessing.RLock()
    tqdm.set_lock(TqdmDefaultWriteLock())


def _watch(pid: int, until: float = math.inf) -> tuple[int | None, float]:
    """Wait for a forked child, reading the CPU seconds its run has used (`_tree_cpu`): (its wait status, the CPU
    of its whole run) when it ends first, (None, the CPU so far) when that reaches `until` first (it still runs).
    With a deadline: a hung child is killed (its group too) and the test fails naming it."""
    deadline = time.monotonic() + CHILD_SECONDS
    while time.monotonic() < deadline:
        ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # ended, not yet reaped:
        cpu = _tree_cpu(pid)  # a zombie's /proc entry still holds its whole run's CPU
        if ended is not None:
            return os.waitpid(pid, 0)[1], cpu
        if cpu >= until:
            return None, cpu
        time.sleep(0.005)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # hung before it made its group
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked run {pid} did not finish in {CHILD_SECONDS:g} s (hung, not slow: a run takes seconds)")


def _wait(pid: int) -> int:
    """The child's wait status, once it has ended (`_watch`'s deadline)."""
    status, _ = _watch(pid)
    assert status is not None
    return status


_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds a child has used so far: its own, its ended-and-waited-for children's, and its live
    descendants' (`explore --jobs 2`'s workers), from /proc, to the kernel's tick; 0 once it is reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        # every thread's children: a process pool may start its workers from a thread of its own
        kids = [kid for task in Path(f"/proc/{pid}/task").iterdir() for kid in (task / "children").read_text().split()]
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 after the command name
    own = sum(int(x) for x in fields[11:15]) / _TICK
    return own + sum(_tree_cpu(int(kid)) for kid in kids)


def _spawn(work: Callable[[], int], cwd: Path) -> int:
    _no_monitor_thread()
    pid = os.fork()
    if pid == 0:  # the child: its own process group, quiet, the real command, then exit without pytest
        code = 99
        try:
            os.setpgid(0, 0)
            _own_tqdm_locks()
            os.chdir(cwd)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            code = int(work() or 0)
        finally:
            os._exit(code)
    return pid


def _warm(run: Callable[[], int]) -> None:
    """Run a command once in this process, its output discarded, before any child is forked: the children then
    inherit its imports and loaded caches (matplotlib alone is ~0.45 s of CPU to import, its fonts more to load)
    instead of each loading them again, so a run's length, and the kill times drawn over it, are the command's
    own work, where it writes its files."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert run() == 0


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


def _wait_group_gone(pgid: int) -> list[int]:
    """Processes of the group still alive SURVIVAL_SECONDS after its leader died (killed, then reported)."""
    deadline = time.monotonic() + SURVIVAL_SECONDS
    while time.monotonic() < deadline:
        if not _group_members(pgid):
            return []
        time.sleep(0.05)
    left = _group_members(pgid)
    for pid in left:  # ours: the test started them
        os.kill(pid, signal.SIGKILL)
    return left


def _complete(work: Callable[[], int], cwd: Path) -> float:
    """Run `work` to its end in a child; the CPU seconds its run took (its workers' too), as `_tree_cpu` reads."""
    pid = _spawn(work, cwd)
    status, cpu = _watch(pid)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0
    assert not _wait_group_gone(pid)
    return cpu


class _Clock:
    """Kill times in CPU seconds of the run, not wall seconds: the kills land over the command's work however busy
    the machine is (a wall-clock delay drawn from a run measured while the machine was busy is long, so the kills
    would land later in the run and each killed run would cost more). `length` is the CPU of a complete run, kept
    as the least seen."""

    def __init__(self, length: float) -> None:
        self.length = length

    def kill_at(self, work: Callable[[], int], cwd: Path, rng: random.Random) -> bool:
        """Run `work`, SIGKILL it at a random point of a run; True when it was killed (not finished first)."""
        delay = rng.uniform(0.0, 1.1 * self.length)
        pid = _spawn(work, cwd)
        status, cpu = _watch(pid, delay)
        if status is not None:  # finished before its kill time: a complete run, and maybe a shorter length
            assert os.waitstatus_to_exitcode(status) == 0
            self.length = min(self.length, cpu)
            assert not _wait_group_gone(pid)
            return False
        os.kill(pid, signal.SIGKILL)
        status = _wait(pid)
        survivors = _wait_group_gone(pid)
        assert not survivors, f"processes {survivors} outlived their killed parent by {SURVIVAL_SECONDS} s"
        return os.waitstatus_to_exitcode(status) == -signal.SIGKILL


def _snapshot(folder: Path) -> dict[str, str] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def _folder_kills(tmp_path: Path, runs: tuple[Callable[[], int], Callable[[], int]], out: Path, seed: int) -> None:
    """The old-or-new property of a folder output under KILLS kills at random points."""
    first, second = runs
    _complete(first, tmp_path)
    snap_a = _snapshot(out)
    length = _complete(second, tmp_path)
    snap_b = _snapshot(out)
    assert snap_a != snap_b and snap_a and snap_b
    rng = random.Random(seed)
    clock = _Clock(length)
    kills = attempts = 0
    while kills < KILLS and attempts < 3 * KILLS:
        attempts += 1
        run = runs[attempts % 2]
        kills += clock.kill_at(run, tmp_path, rng)
        now = _snapshot(out)
        assert now in (snap_a, snap_b), "the output folder is missing or mixed after a kill"
    assert kills >= KILLS, f"only {kills} of {attempts} runs were killed before they finished"
    _complete(first, tmp_path)  # the next run cleans what the killed ones left
    assert _snapshot(out) == snap_a
    assert _temporaries(out.parent) == [], _temporaries(out.parent)


def test_forks_start_with_no_tqdm_monitor_thread() -> None:
    """The hang CI met: a bar earlier in the worker starts tqdm's monitor; after _no_monitor_thread none runs and a
    new bar starts none (a thread holding tqdm's lock at a fork would hang the child's first bar)."""
    import threading

    from tqdm import tqdm

    saved = tqdm.monitor_interval
    try:
        tqdm.monitor_interval = 10
        with tqdm(total=1, disable=True):
            pass
        assert any(t.name == "tqdm_monitor" for t in threading.enumerate())  # what an earlier test leaves
        _no_monitor_thread()
        with tqdm(total=1, disable=True):
            pass
        assert tqdm.monitor is None
        assert not any(t.name == "tqdm_monitor" and t.is_alive() for t in threading.enumerate())
    finally:
        tqdm.monitor_interval = saved


def test_a_child_killed_holding_tqdms_lock_blocks_no_one(tmp_path: Path) -> None:
    """The second hang CI met: a child SIGKILLed inside a bar's lock. Afterwards this process and a new child both
    take tqdm's lock at once (before `_own_tqdm_locks`, the shared semaphore stayed held and both waited for ever)."""
    from tqdm import tqdm
    from tqdm.std import TqdmDefaultWriteLock

    tqdm.get_lock()  # this process's locks exist before the fork, as after any earlier bar
    held = tmp_path / "held"

    def hold() -> int:
        tqdm.get_lock().acquire()
        held.write_text("1")
        time.sleep(60)
        return 0

    pid = _spawn(hold, tmp_path)
    deadline = time.monotonic() + CHILD_SECONDS
    while not held.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.exists(), "the child never took the lock"
    os.kill(pid, signal.SIGKILL)
    assert os.waitstatus_to_exitcode(_wait(pid)) == -signal.SIGKILL
    mp_lock = TqdmDefaultWriteLock.mp_lock
    assert mp_lock is not None and mp_lock.acquire(timeout=5), "the killed child left this process's tqdm lock held"
    mp_lock.release()
    _complete(lambda: tqdm(total=1, disable=True).close() or 0, tmp_path)


def test_a_hung_child_fails_the_test_in_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "CHILD_SECONDS", 0.5)
    pid = _spawn(lambda: time.sleep(60) or 0, tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"did not finish in 0.5 s \(hung"):
        _wait(pid)
    assert not _group_members(pid)


@pytest.mark.slow
def test_simulate_survives_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    base = ["simulate", "mlp:16-12-8-4", "--policy", "layerpipe", "-n", "2", "--out", str(out)]
    runs = (lambda: main([*base, "--samples", "8"]), lambda: main([*base, "--samples", "24", "--functional",
                                                                    "float64"]))
    _warm(lambda: main([*base[:-1], str(tmp_path / "warm"), "--samples", "24", "--functional", "float64"]))
    _folder_kills(tmp_path, runs, out, seed=1)


@pytest.mark.slow
def test_rtl_survives_sigkill(tmp_path: Path, shared_verilog: None) -> None:
    """The Verilog of both runs' designs is exported for real once, in this process, and shared through the run's
    cache (`tests.conftest.cached_verilog`: a pure function of the design, ~1 s of amaranth and yosys per run); each
    forked child then runs the real command — scheduling, compiling, the staged folder — so the kills land across
    the part where files are written and swapped."""
    pytest.importorskip("amaranth")
    out = tmp_path / "rtl"
    base = ["rtl", "mlp:8-6-4", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--no-synth", "--out", str(out)]
    runs = (lambda: main([*base, "--samples", "8"]), lambda: main([*base, "--samples", "16"]))
    for run in runs:  # in this process: the cached Verilog the children read
        assert run() == 0
    _folder_kills(tmp_path, runs, out, seed=2)


def _memoized(real: Callable, cache: dict[str, object]) -> Callable:
    def call(*args: object, **kwargs: object) -> object:
        key = repr((real.__module__, args, sorted(kwargs.items())))
        if key not in cache:
            cache[key] = real(*args, **kwargs)
        return cache[key]
    return call


@pytest.mark.slow
def test_report_survives_sigkill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a one-network report schedules every policy (data-parallel ones on the stream engine). The
    schedules are computed for real once, in this process, and memoized; each forked child then runs the real
    `generate` — tables, plots, Gantt simulations, the staged folder — with them, so the kills land
    across the whole of a run that takes about a second, the part where files are written and swapped."""
    import layerpipe.report as report
    import layerpipe.report_ooo as report_ooo

    cache: dict[str, object] = {}
    monkeypatch.setattr(report, "make_schedule", _memoized(report.make_schedule, cache))
    monkeypatch.setattr(report_ooo, "make_schedule", _memoized(report_ooo.make_schedule, cache))
    # The sections with fixed inputs of their own (the Gantt charts' network, the OOO section's points) cut to
    # the same tiny network: what is under test is how the folder is written, not the figures (test_report
    # checks those). The full OOO section alone is ~30 s of CPU to memoize, a lenet5 Gantt ~1 s per child.
    monkeypatch.setattr(report, "GANTT_NETWORK", "mlp:8-6-4")
    monkeypatch.setattr(report, "GANTT_PROCS", 2)
    monkeypatch.setattr(report_ooo, "DP_NETWORKS", ("mlp:8-6-4",))
    monkeypatch.setattr(report_ooo, "DP_PROCS", (2,))
    monkeypatch.setattr(report_ooo, "STREAM_NETWORKS", ("mlp:8-6-4",))
    out = tmp_path / "report"

    def run(procs: tuple[int, ...]) -> Callable[[], int]:
        def work() -> int:
            cfg = report.ReportConfig(networks=("mlp:8-6-4",), procs=procs, rtl=False,
                                      paper_interconnects=("shared",), paper_batches=(1,))
            report.generate(out, cfg, progress=False)
            return 0
        return work

    for procs in ((2,), (3,)):  # fill the memo here, so the children inherit it
        run(procs)()
    _folder_kills(tmp_path, (run((2,)), run((3,))), out, seed=3)


@pytest.mark.slow
def test_explore_jobs_2_survives_sigkill(tmp_path: Path) -> None:
    from layerpipe.dse import ResultsFile

    args = ["explore", "mlp:16-12-8-4", "mlp:12-10-8", "-n", "1-6", "--policies", "layerpipe,pipedream",
            "--jobs", "2", "--no-progress"]
    clean = tmp_path / "clean" / "r.csv"
    _warm(lambda: main([*args, "--jobs", "1", "--out", str(tmp_path / "warm" / "r.csv")]))  # the last --jobs wins
    import concurrent.futures.process  # noqa: F401  (what --jobs 2 imports and a one-job run does not: _warm's aim)
    length = _complete(lambda: main([*args, "--out", str(clean)]), tmp_path)
    reference = {r["point_index"]: r for r in ResultsFile(clean).read_rows()}
    rng = random.Random(4)
    clock = _Clock(length)
    kills = attempts = 0
    last = None
    while kills < KILLS and attempts < 3 * KILLS:
        attempts += 1
        out = tmp_path / f"run{attempts}" / "r.csv"
        if not clock.kill_at(lambda out=out: main([*args, "--out", str(out)]), tmp_path, rng):
            continue
        kills += 1
        if out.exists():
            rows = ResultsFile(out).read_rows()  # a torn last line is dropped, never misread
            assert len({r["point_index"] for r in rows}) == len(rows)
            for row in rows:
                assert row == reference[row["point_index"]]
            last = out
        for name in ("pareto.csv", "pareto.svg", "speedup_vs_n.svg"):  # written whole or not at all
            if (out.parent / name).exists():
                assert (out.parent / name).read_bytes() == (clean.parent / name).read_bytes()
    assert kills >= KILLS, f"only {kills} of {attempts} runs were killed before they finished"
    assert last is not None
    _complete(lambda: main([*args, "--out", str(last), "--resume"]), tmp_path)
    assert last.read_bytes() == clean.read_bytes()
    assert _temporaries(last.parent) == []

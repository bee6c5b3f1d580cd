"""Run a sweep: points are evaluated in this process and local worker processes, or on a Dask cluster, and each
finished point is appended to the results file by this (the only writing) process, with a progress bar.

One job runs in this process, a point at a time, each row appended as soon as it is made (it once evaluated every
point before writing any: a run killed before the end kept no row). N local jobs are this process and N − 1 worker
processes, sharing the batches of points (`_share`): a forked worker pays for its start and for the pages it
copies from this process (issue 14: once a point took ~5 ms, two workers ran `--jobs 2` at 1.6x one job, this
process idle; this process and one worker, at 1.7x). On Dask every point is submitted and each row appended as its
future completes (`distributed.as_completed`: a Dask future is not a concurrent.futures.Future). A point or worker
that raises fails the run with its one-line message; rows already written stay.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerpipe._gc import gc_paused, survivors_frozen
from layerpipe.dse._evaluate import evaluate_point
from layerpipe.dse._store import ResultsFile
from layerpipe.dse._sweep import DesignPoint, SweepSpec
from layerpipe.errors import InputError

if TYPE_CHECKING:
    from distributed import Future as DaskFuture
    from tqdm import tqdm


@dataclass(frozen=True)
class RunSummary:
    total_points: int
    skipped_points: int
    evaluated_points: int
    seconds: float


def _row(spec: SweepSpec, index: int, point: DesignPoint, frozen: survivors_frozen | None = None
         ) -> dict[str, object]:
    # The collector paused for the point: its scheduler and simulator build many short-lived objects (slots,
    # tuples, small arrays) that reference counting frees, and the collections they set off only walk them
    # (~1 % of issue 14's sweep); whatever cycles a point leaves are collected after it. What the point keeps
    # (memo entries) is frozen out of the collector's walks before it runs again (`survivors_frozen`).
    with gc_paused():
        row = evaluate_point(point, area=spec.area)
        if frozen is not None:
            frozen.step()
    row.update(sweep_id=spec.sweep_id, point_index=index)
    return row


def _rows(spec: SweepSpec, batch: list[tuple[int, DesignPoint]]) -> list[dict[str, object]]:
    with survivors_frozen() as frozen:
        return [_row(spec, i, p, frozen) for i, p in batch]


def _batches(pending: list[tuple[int, DesignPoint]]) -> list[list[tuple[int, DesignPoint]]]:
    """The pending points of one network, processor count and setting together (every policy and bound of it):
    a worker process memoises the passes those share — the task table, PipeDream's plan, which LayerPipe's
    replicated candidate reuses (design notes §11) — so spreading them over workers would compute them once
    per worker. Batches in the order of their first point."""
    groups: dict[tuple[object, ...], list[tuple[int, DesignPoint]]] = {}
    for i, p in pending:
        key = (p.network, p.batch, p.num_procs, p.lanes, p.interconnect, p.cost_model)
        groups.setdefault(key, []).append((i, p))
    return list(groups.values())


def _batch_work(batch: list[tuple[int, DesignPoint]]) -> int:
    """A batch's work, roughly: its points × the network's layers × N (what a point's tasks and runs grow with), to
    hand out the largest batches first (`_share`), so that no process is left with a large one at the end."""
    from layerpipe.network import load_network

    point = batch[0][1]
    return len(batch) * len(load_network(point.network, point.batch).layers) * point.num_procs


#: How often a worker's watchdog checks that its parent is alive (the fault tests allow 5 s).
WATCHDOG_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the sweep's process dies, even by SIGKILL (issue 12 item 8:
    orphaned workers lived 11+ minutes and kept a caller's pipe open).

    Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), which the kernel delivers the moment the parent goes, even while
    the worker runs C code holding the GIL. Everywhere (and for the race where the parent died before the
    prctl): a daemon thread polls the parent pid every WATCHDOG_SECONDS and exits the worker."""
    import contextlib
    import ctypes
    import os
    import signal
    import threading
    import time

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no libc prctl: the watchdog below still works
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="layerpipe-parent-watchdog", daemon=True).start()


@contextmanager
def _local_executor(jobs: int) -> Iterator[Callable[..., Future[Any]]]:
    import os

    # Imported here: `concurrent.futures.process` loads multiprocessing (~17 ms), which a one-job run never uses.
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
        yield pool.submit


@contextmanager
def _dask_executor(address: str) -> Iterator[Callable[..., DaskFuture[Any]]]:
    try:
        from distributed import Client
    except ImportError:
        raise InputError("--scheduler needs dask distributed (pip install -r requirements-dev.txt)") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise InputError(f"--scheduler {address}: cannot connect ({exc})") from None
    try:
        yield lambda fn, *args: client.submit(fn, *args, pure=False)
    finally:
        client.close()


def run_sweep(spec: SweepSpec, out: str | Path, *, jobs: int = 1, scheduler: str | None = None,
              resume: bool = False, progress: bool = True) -> RunSummary:
    import time

    t0 = time.perf_counter()
    points = spec.points()
    store = ResultsFile(out)
    done = store.start(spec.sweep_id, resume)
    pending = [(i, p) for i, p in enumerate(points) if i not in done]
    bar = _progress_bar(len(points), len(points) - len(pending), progress)
    if scheduler:
        with _dask_executor(scheduler) as dask_submit, bar:
            _drain_dask([dask_submit(_row, spec, i, p) for i, p in pending], store, bar)
    elif jobs == 1:  # in this process, a point at a time, each row written as soon as it is made
        with bar, survivors_frozen() as frozen:
            for i, p in pending:
                store.append(_row(spec, i, p, frozen))
                bar.update(1)
    else:
        batches = sorted(_batches(pending), key=_batch_work, reverse=True)  # largest first: the last ones are small
        with _local_executor(jobs - 1) as submit, bar, survivors_frozen() as frozen:
            _share(spec, batches, submit, jobs - 1, store, bar, frozen)
    store.finalize()
    return RunSummary(len(points), len(points) - len(pending), len(pending), time.perf_counter() - t0)


#: Seconds this thread holds the GIL at most while workers run (`sys.setswitchinterval`; Python's default: 0.005).
SWITCH_INTERVAL = 0.0005

#: Batches each worker holds at once (one running, the next queued), so that it never waits for this process, busy
#: with a point of its own, to hand it the next.
WORKER_QUEUE = 2


def _share(spec: SweepSpec, batches: list[list[tuple[int, DesignPoint]]], submit: Callable[..., Future[Any]],
           workers: int, store: ResultsFile, bar: tqdm[Any] | _NoBar, frozen: survivors_frozen) -> None:
    """The batches, in order, over `workers` worker processes and this process: each worker holds WORKER_QUEUE
    batches, this process takes the next batch whenever it has finished one, and after each of its own points
    appends every row the workers have finished meanwhile."""
    from collections import deque

    queue = deque(batches)
    running: set[Future[Any]] = set()

    def collect(block: bool) -> None:
        nonlocal running
        if running:
            if block:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
            else:  # after each point: `done()` per future, not `wait`'s waiters and locks
                finished = {fut for fut in running if fut.done()}
                running -= finished
            for fut in sorted(finished, key=id):
                for row in fut.result():
                    store.append(row)
                    bar.update(1)
        # A batch queued behind a worker's running one waits for it; near the end this process takes it instead.
        held = WORKER_QUEUE * workers if len(queue) > WORKER_QUEUE * workers else workers
        while queue and len(running) < held:
            running.add(submit(_rows, spec, queue.popleft()))

    # The pool's threads in this process (its manager, the call queue's feeder) hand a worker its next batch and
    # take in its rows; each needs the GIL, which this thread, busy with its points, yields only every switch
    # interval (5 ms): at 0.5 ms a worker waits less between batches.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    try:
        collect(block=False)
        while queue:
            for i, p in queue.popleft():
                store.append(_row(spec, i, p, frozen))
                bar.update(1)
                collect(block=False)
        while running:
            collect(block=True)
    finally:
        sys.setswitchinterval(interval)


class _NoBar:
    """What a run without progress (`progress=False`, `explore --no-progress`) counts its points on: nothing."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def _progress_bar(total: int, initial: int, progress: bool) -> tqdm[Any] | _NoBar:
    """The run's progress bar on stderr (terminals only), or none: tqdm is imported only for a bar (~27 ms of a
    `layerpipe explore --no-progress` process's start, issue 14)."""
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="pt", file=sys.stderr, disable=None, desc="explore",
                dynamic_ncols=True)  # disable=None: terminals only


def _drain_dask(futures: list[DaskFuture[Any]], store: ResultsFile, bar: tqdm[Any] | _NoBar) -> None:
    from distributed import as_completed

    for fut in as_completed(futures):
        store.append(fut.result())
        bar.update(1)

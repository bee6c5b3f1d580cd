"""`SimResult`: what a simulation measured, and how the summary figures are defined.

- `total_cycles`: the end of the last op (the run starts at cycle 0).
- `cycles_per_iteration` (steady state): the slope of completion times. An iteration's completion time
  C(t) is the latest end among its ops (asynchronous schedules); for synchronous schedules the unit is a
  step of m micro-batches (its update ops included) and the slope is divided by m. The slope is taken
  over the middle half of the run, (C(hi) − C(lo)) / (hi − lo) with lo = ⌊K/4⌋, hi = K − 1 − ⌊K/4⌋ for K
  iterations (steps), which skips the prologue (pipeline fill) and the epilogue (drain, where ops run
  early because later iterations no longer compete). A periodic schedule in steady state completes one
  iteration per period, so this equals its period once the fill is shorter than K/4 iterations. No
  steady state is faster than the busiest processor's busy cycles per iteration, so the figure is at least
  that: ops start as early as possible, a processor can run ahead of its plan during the fill and then
  give that slack back one cycle at a time for many iterations, which would bias a finite window low.
  With fewer than 3 iterations (steps) it falls back to total_cycles / iterations.
- `cycles_per_sample` = cycles_per_iteration / batch (an iteration is one micro-batch of B samples).
- busy = Σ durations per processor; idle = total_cycles − busy; bubbles = idle intervals between a
  processor's first start and last end (gaps before its first op or after its last are not bubbles).
- traffic: words of every (producer, consumer) pair on different processors, total and per link p→q,
  counted the same in both interconnect models.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from layerpipe._gc import gc_paused
from layerpipe.schedule._engine import completion_times, steady_cycles_per_iteration
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.sim._engine import CompiledSchedule
from layerpipe.sim._interconnect import SimConfig


@dataclass(frozen=True)
class PendingReports:
    """How a deferred result computes its version map and its peaks when first read: `versions(compiled, start,
    end)`, and `peaks(compiled, start, end, versions)` where `versions()` gives the version map (called only when
    the peaks need it: weights held; a stage-level run without weight sizes never computes it for its metrics)."""

    versions: Callable[[CompiledSchedule, np.ndarray, np.ndarray], np.ndarray]
    peaks: Callable[[CompiledSchedule, np.ndarray, np.ndarray, Callable[[], np.ndarray]], tuple[int, ...]]


@dataclass(frozen=True, eq=False)
class SimResult:
    """Timing of every op and the figures derived from it. Arrays are indexed like `ops`."""

    schedule: OpSchedule
    config: SimConfig
    ops: tuple[Op, ...]
    start: np.ndarray
    end: np.ndarray
    versions: np.ndarray  #: version read, −1 for ops that read no weights
    peak_memory_words: tuple[int, ...]
    link_traffic_words: dict[tuple[int, int], int]
    batch: int = 1
    memory_unit: str = "words"
    _compiled: CompiledSchedule | None = field(default=None, repr=False)

    # A result of `deferred` computes `ops`, `versions`, `peak_memory_words` and `link_traffic_words` when one
    # is first read (issue 14: summary figures computed when read; a scheduler timing candidates reads only
    # the cycle counts, and the `Op`s of a schedule of columns need never exist).
    def __getattr__(self, name: str) -> Any:
        pending = self.__dict__.get("_pending")
        if pending is None or name not in _DEFERRED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        compiled = self.__dict__["_compiled"]
        if name == "ops":
            value: Any = compiled.ops
        elif name == "link_traffic_words":
            value = link_traffic(compiled)
        elif name == "versions":
            value = pending.versions(compiled, self.__dict__["start"], self.__dict__["end"])
        else:  # the peaks read the version map only where weights are held (it is computed then)
            value = pending.peaks(compiled, self.__dict__["start"], self.__dict__["end"], lambda: self.versions)
        object.__setattr__(self, name, value)
        return value

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with every figure computed (the pending computation is a closure)."""
        for name in _DEFERRED:
            getattr(self, name)
        state = dict(self.__dict__)
        state.pop("_pending", None)
        return state

    @classmethod
    def deferred(cls, compiled: CompiledSchedule, config: SimConfig, start: np.ndarray, end: np.ndarray,
                 reports: PendingReports, batch: int = 1, memory_unit: str = "words") -> SimResult:
        """A result of `compiled`'s timing whose ops, version map and peaks (`reports`) and traffic are computed
        when first read: the same values as building them at once."""
        made = cls.__new__(cls)
        given = {"schedule": compiled.schedule, "config": config, "start": start, "end": end, "batch": batch,
                 "memory_unit": memory_unit, "_compiled": compiled, "_pending": reports}
        made.__dict__.update(given)  # what `object.__setattr__` field by field (frozen) writes, in one call
        return made

    @property
    def num_procs(self) -> int:
        return self.schedule.num_procs

    @cached_property
    def total_cycles(self) -> int:  # read by most figures: one reduction, not one per read
        return int(self.end.max()) if len(self.end) else 0

    @cached_property
    def proc(self) -> np.ndarray:
        if self._from_compiled:
            return self._compiled.proc_array(np.int64)  # type: ignore[union-attr]
        return np.fromiter((op.proc for op in self.ops), np.int64, len(self.ops))

    @cached_property
    def iterations(self) -> np.ndarray:
        if self._from_compiled:
            return self._compiled.iteration.astype(np.int64)  # type: ignore[union-attr]
        return np.fromiter((op.iteration for op in self.ops), np.int64, len(self.ops))

    @property
    def _from_compiled(self) -> bool:
        """Are this result's ops its compiled schedule's, in its numbering (every result of the engine)?"""
        compiled = self._compiled
        return compiled is not None and ("_pending" in self.__dict__ or self.__dict__.get("ops") is compiled.ops)

    @property
    def num_ops(self) -> int:
        return self._compiled.num_ops if self._from_compiled else len(self.ops)  # type: ignore[union-attr]

    @cached_property
    def index(self) -> dict[tuple[str, int, int], int]:
        """(kind, unit, iteration) → position in `ops`."""
        return {op.key: i for i, op in enumerate(self.ops)}

    def start_of(self, kind: str, unit: int, iteration: int) -> int:
        return int(self.start[self.index[(kind, unit, iteration)]])

    def end_of(self, kind: str, unit: int, iteration: int) -> int:
        return int(self.end[self.index[(kind, unit, iteration)]])

    @cached_property
    def version_map(self) -> dict[tuple[str, int, int], int]:
        """{(kind, unit, iteration): version} for every op that reads weights."""
        return {op.key: int(v) for op, v in zip(self.ops, self.versions, strict=True) if v >= 0}

    # --- processors -------------------------------------------------------------------------------------
    @cached_property
    def busy_cycles(self) -> tuple[int, ...]:
        sums = self._processor_sums
        if sums is not None:
            return tuple(sums[0])
        if self._from_compiled:  # processor-major ops: a sum per processor's slice (issue 14)
            cuts = self._compiled.bounds  # type: ignore[union-attr]
            return tuple(int(self.end[lo:hi].sum()) - int(self.start[lo:hi].sum())
                         for lo, hi in itertools.pairwise(cuts))  # no array over every op (memory)
        dur = self.end - self.start
        return tuple(int(x) for x in np.bincount(self.proc, weights=dur, minlength=self.num_procs).astype(np.int64))

    @cached_property
    def _processor_sums(self) -> tuple[list[int], list[int], list[int]] | None:
        """(busy cycles, bubble cycles, bubbles) per processor from one running sum (`processor_sums`) for a
        result of the engine up to `SMALL_OPS` ops; None otherwise (the figures then come one at a time). The
        same values as `busy_cycles`, `bubble_cycles` and the lengths of `bubbles`: the three took ~30 numpy
        calls, a twentieth of a full `simulate()` of ZB-H1 at p = 8, m = 64 (issue 14)."""
        start, end = self.start, self.end
        if (not self._from_compiled or self.num_ops > SMALL_OPS or not isinstance(start, np.ndarray)
                or not isinstance(end, np.ndarray) or start.dtype != np.int64 or end.dtype != np.int64):
            return None
        return processor_sums(start, end, self._compiled.bounds)  # type: ignore[union-attr]

    @property
    def idle_cycles(self) -> tuple[int, ...]:
        return tuple(self.total_cycles - b for b in self.busy_cycles)

    @cached_property
    def _gaps(self) -> tuple[np.ndarray, list[int]]:
        """Every processor's idle intervals [from, to) between its ops, one (k, 2) array processor after
        processor, and where each processor's rows begin (one pass over every op, not one per processor)."""
        if self._from_compiled:  # the compiled schedule's bounds are the rows' cuts
            cuts = np.asarray(self._compiled.bounds, dtype=np.int64)  # type: ignore[union-attr]
        else:
            cuts = np.zeros(self.num_procs + 1, dtype=np.int64)
            np.cumsum(self.schedule.row_lengths(), out=cuts[1:])
        start, end = np.asarray(self.start, dtype=np.int64), np.asarray(self.end, dtype=np.int64)
        gap = start[1:] > end[:-1]
        last = cuts[1:-1] - 1  # op k is compared with op k + 1: not across a processor's last op
        gap[last[(last >= 0) & (last < len(gap))]] = False
        at = gap.nonzero()[0]
        rows = np.empty((len(at), 2), dtype=np.int64)
        rows[:, 0] = end[at]
        rows[:, 1] = start[at + 1]
        return rows, np.searchsorted(at, cuts, side="left").tolist()

    @cached_property
    def bubbles(self) -> tuple[np.ndarray, ...]:
        """Per processor, an (k, 2) array of idle intervals [from, to) between its first and last op."""
        rows, cuts = self._gaps
        return tuple(rows[a:b] for a, b in itertools.pairwise(cuts))

    @property
    def bubble_cycles(self) -> tuple[int, ...]:
        sums = self._processor_sums
        if sums is not None:
            return tuple(sums[1])
        rows, cuts = self._gaps
        return tuple(_slice_sums(rows[:, 1] - rows[:, 0], cuts))

    @property
    def utilization_pct(self) -> float:
        total = self.total_cycles * self.num_procs
        return 100.0 * sum(self.busy_cycles) / total if total else 0.0

    @property
    def traffic_words(self) -> int:
        return sum(self.link_traffic_words.values())

    # --- steady state -----------------------------------------------------------------------------------
    @cached_property
    def num_iterations(self) -> int:
        return self.schedule.num_iterations

    @cached_property
    def completion_times(self) -> np.ndarray:
        """C(k): latest end of iteration k's ops (of step k's ops for synchronous schedules); the engine's
        `completion_times` rule."""
        if self._from_compiled:
            return self._compiled.completion_times(self.end)  # type: ignore[union-attr]
        is_update = np.fromiter((op.kind == "U" for op in self.ops), bool, len(self.ops))
        sizes = self.schedule.groups_map()
        group = np.fromiter((sizes.get(op.unit, 1) if op.kind == "U" else 1 for op in self.ops), np.int64,
                            len(self.ops))
        return completion_times(self.schedule, self.iterations, is_update, group, self.end)

    @cached_property
    def cycles_per_iteration(self) -> float:
        return steady_cycles_per_iteration(self.schedule, self.completion_times, self.total_cycles,
                                           max(self.busy_cycles, default=0), self.num_iterations)

    @property
    def cycles_per_sample(self) -> float:
        return self.cycles_per_iteration / self.batch

    def steady_cycles_per_iteration(self, shorter: SimResult) -> float:
        """The self-timed steady state per iteration (per micro-batch for synchronous schedules), measured with
        a shorter run of the same schedule: the larger of this run's own middle-half slope
        (`cycles_per_iteration`) and the cycles its extra iterations take, (total − shorter's total) ÷ extra
        iterations (same fill, same drain).

        No finite run shows the steady state exactly: a processor may run ahead of its plan during the fill
        and give the slack back a cycle at a time for many periods (it had less to wait for: initial weights
        need no transfer), and the drain runs early. Both only make a run look *faster*, never slower, so the
        larger estimate is the closer one; the difference is exact once the fill has settled within the
        shorter run. Use whole periods (whole steps) for both runs.
        """
        return self.steady_cycles_per_iteration_of(shorter.num_iterations, shorter.total_cycles)

    def steady_cycles_per_iteration_of(self, shorter_iterations: int, shorter_total_cycles: int) -> float:
        """`steady_cycles_per_iteration` with the shorter run given by its iterations and total cycles alone (all
        it reads of it: `layerpipe.sim.simulate_policy_pair`)."""
        extra = self.num_iterations - shorter_iterations
        if extra <= 0:
            raise ValueError(f"the shorter run has {shorter_iterations} iterations, this one "
                             f"{self.num_iterations}: it must have more")
        return max(self.cycles_per_iteration, (self.total_cycles - shorter_total_cycles) / extra)

    # --- output -----------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, object]:
        """JSON-ready summary (metrics.json); names carry units."""
        with gc_paused():  # the figures computed when first read build their arrays and lists under one pause
            return self._metrics()

    def _metrics(self) -> dict[str, object]:
        links = {f"p{p}->p{q}": w for (p, q), w in sorted(self.link_traffic_words.items())}
        return {
            "num_procs": self.num_procs,
            "num_ops": self.num_ops,
            "iterations": self.num_iterations,
            "batch": self.batch,
            **self.config.describe(),
            "total_cycles": self.total_cycles,
            "cycles_per_iteration": round(self.cycles_per_iteration, 6),
            "cycles_per_sample": round(self.cycles_per_sample, 6),
            "utilization_pct": round(self.utilization_pct, 4),
            "traffic_words": self.traffic_words,
            "link_traffic_words": links,
            "memory_unit": self.memory_unit,
            "peak_memory_words": list(self.peak_memory_words),
            "busy_cycles": list(self.busy_cycles),
            "idle_cycles": list(self.idle_cycles),
            "bubble_cycles": list(self.bubble_cycles),
            "bubbles": self._bubble_counts(),
        }

    def _bubble_counts(self) -> list[int]:
        sums = self._processor_sums
        return list(sums[2]) if sums is not None else [len(b) for b in self.bubbles]

    def version_records(self) -> list[dict[str, object]]:
        """versions.json rows: every weight-reading op in processor and program order."""
        unit = "layer" if self.schedule.level == "layer" else "stage"
        return [{"proc": op.proc, "kind": op.kind, unit: op.unit, "iteration": op.iteration, "version": int(v)}
                for op, v in zip(self.ops, self.versions, strict=True) if v >= 0]


#: Ops up to which the busy cycles come from one running sum over every op (above, a sum per processor: no
#: array over every op, issue 14's memory).
SMALL_OPS = 1 << 16

#: Dependencies per processor up to which the traffic sums take every entry at once (above, one at a time).
SMALL_ENTRIES = 2048

#: The fields a `SimResult.deferred` result computes when first read.
_DEFERRED = ("ops", "versions", "peak_memory_words", "link_traffic_words")


def _slice_sums(values: np.ndarray, cuts: list[int]) -> list[int]:
    """Sums of values[cuts[k]:cuts[k+1]] for every k, exact integers (differences of one running sum)."""
    running = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=running[1:])
    at = running[np.asarray(cuts, dtype=np.int64)]
    return (at[1:] - at[:-1]).tolist()


def processor_sums(start: np.ndarray, end: np.ndarray, bounds: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Per processor (ops numbered processor-major, processor p's are bounds[p] … bounds[p+1] − 1): its busy
    cycles (Σ end − start), its bubble cycles (Σ of the positive gaps start[k+1] − end[k] between its consecutive
    ops) and its bubbles (how many such gaps) — `SimResult`'s three figures, exact int64 sums (the same values as
    each figure's own pass). One `add.reduceat` over three rows at the processors' first ops: a running sum
    (`cumsum`) is no vector loop in numpy and took ten times as long (5 µs for 1.5k ops)."""
    procs = len(bounds) - 1
    busy, bubble, count = [0] * procs, [0] * procs, [0] * procs
    nonempty = [p for p in range(procs) if bounds[p] < bounds[p + 1]]  # reduceat sums nothing for no op
    if not nonempty:
        return busy, bubble, count
    firsts = [bounds[p] for p in nonempty]
    rows = np.empty((3, len(start)), dtype=np.int64)  # per op: its duration, the gap before it, gap > 0?
    np.subtract(end, start, out=rows[0])
    gap = rows[1]
    np.subtract(start[1:], end[:-1], out=gap[1:])
    gap[firsts] = 0  # no gap before a processor's first op (op 0's included)
    np.maximum(gap, 0, out=gap)
    np.greater(gap, 0, out=rows[2])
    sums = np.add.reduceat(rows, firsts, axis=1).tolist()
    for k, p in enumerate(nonempty):
        busy[p], bubble[p], count[p] = sums[0][k], sums[1][k], sums[2][k]
    return busy, bubble, count


def link_traffic(c: CompiledSchedule) -> dict[tuple[int, int], int]:
    """Words per ordered processor pair, over every cross-processor (producer, consumer) pair. A pair's words
    are the sum of its dependencies' words, so the sums run over the dependencies directly (no pairing sort);
    a processor pair is listed when any dependency crosses it, as when any (producer, consumer) pair does."""
    procs = c.num_procs
    if len(c.prod_idx) <= SMALL_ENTRIES * max(procs, 1):  # at once: a pass per processor costs more here
        # Entries are consumer-major and consumers processor-major: each consumer processor's entries are one
        # slice (no array of every entry's consumer).
        cuts = np.asarray(c.prod_ptr)[np.asarray(c.bounds, dtype=np.int64)]
        dst = np.arange(procs, dtype=np.int64).repeat(cuts[1:] - cuts[:-1])
        pair = c.proc_array(np.int64).take(c.prod_idx) * procs + dst  # `take`: indexing's values, half its cost
        present = np.zeros(procs ** 2, dtype=bool)
        present[pair] = True
        # Pairs on one processor are summed too and left out after (each pair's entries in the same order).
        sums = np.bincount(pair, weights=c.prod_words, minlength=procs ** 2).astype(np.int64)
        present[::procs + 1] = False
        words = sums.tolist()  # one conversion, not one `int()` of a numpy scalar per pair
        return {(k // procs, k % procs): words[k] for k in present.nonzero()[0].tolist()}
    proc = c.proc_array()
    # Consumers are numbered processor-major: consumer processor q's entries are one slice of the CSR arrays,
    # taken in turn (no array over every entry: issue 14). Each pair's sum adds its entries in the same order
    # as one bincount over all of them would.
    cuts = np.asarray(c.prod_ptr)[np.asarray(c.bounds, dtype=np.int64)].tolist()
    traffic: dict[tuple[int, int], int] = {}
    for q in range(procs):
        src = proc[c.prod_idx[cuts[q]:cuts[q + 1]]]
        cross = src != q
        if not cross.any():
            continue
        sums = np.bincount(src[cross], weights=c.prod_words[cuts[q]:cuts[q + 1]][cross], minlength=procs)
        present = np.bincount(src[cross], minlength=procs) > 0
        for p in np.flatnonzero(present).tolist():
            traffic[(p, q)] = int(sums[p].astype(np.int64))
    return dict(sorted(traffic.items()))

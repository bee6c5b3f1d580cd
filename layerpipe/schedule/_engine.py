"""The array timing engine: explicit per-processor op lists in, start and end cycle of every op out.

It sits in the schedule layer, below the simulator (issue 13's layering: nothing imports a layer above it), so
the synchronous schedulers time their step on it (`_sync_policies`) and `layerpipe.sim` builds its reports on
it (`layerpipe.sim._engine.run` adds the `SimConfig` front end).

Rules (design notes §7, contract 2): each processor runs its ops in program order; an op starts when its
processor is free and all its inputs have arrived — a producer's output arrives when the producer ends
(same processor, or the `shared` interconnect) or when its transfer arrives (`links`, see
`layerpipe.sim._interconnect`; the hold of a transfer is `link_hold_cycles`, defined here).

Speed: the schedule is compiled once into integer arrays — ops numbered processor-major (the op after i
on its processor is i + 1), task ids, durations, producer lists — and the hot loops touch only Python ints
and lists, no per-event objects. Dependencies come from SIR's `layerpipe.schedule._deps` (contract 1), as
arrays (`layerpipe.schedule._dep_csr`): `dependency_arrays` (the rules of `dependencies()` without an object
per edge) for stage-level, synchronous and grouped schedules, and for simple asynchronous layer-level
schedules that module's `layer_task_edges` (the same rule `dependencies()` applies op by op: dst(t) needs
src(t − delay)) with array indexing; `dependencies()` itself, op by op, only where neither applies and to
raise its errors. Tests check all give the same producers in the same order. Schedules held as columns
(`OpSchedule.from_columns`) compile without an `Op` object; layer-level schedules are swept run by run
(`layerpipe.schedule._runs`), and on `shared` and `links`, where many runs share each round (12 processors or
more, short runs: deep pipelines), every processor's next run is timed together on arrays
(`layerpipe.schedule._rounds`); the three give the same times, and tests compare them.

Both interconnect models reduce to a longest path over program order and data edges. Transfers on a link
go in order of producer end time, ties by consumer order; all producers on a link p→q run on p, one after
another, so when every such producer takes at least one cycle their end times increase along p's program
and the link order is simply (producer position, consumer position) — known before timing. The engine
therefore queues an op's transfers on their links the moment it finishes, while walking its processor's
program: departure = max(producer end, link free), the link stays busy ceil(w / words_per_cycle) cycles,
and the data is available `latency` cycles later. Start times then do not depend on the order the
processors are visited in, so a work-list sweep computes them without a heap: run each processor as far as
its inputs allow, park it on the first input that is not available yet, wake it when that input is.

Only a zero-duration producer can end in the same cycle as the op before it and so tie with it on a link;
schedules with such a producer take the event-driven engine (`_run_links_events`): end events in time
order from a heap of plain ints (end · n + op); all ops ending in a cycle (zero-duration ones started in
that cycle included) are processed before that cycle's transfers are queued per link in consumer order.
Tests check that both engines agree wherever both apply. A bus always takes the event-driven engine; where
the run has a plan to follow it is compiled (`bus_order`: a planned run's order and times, a synchronous
run's step after step in step 0's order).

When no processor can proceed and ops remain, the engine raises `DeadlockError` naming every blocked
processor, its next op and the producers it waits for.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

from layerpipe._gc import gc_paused
from layerpipe.errors import InputError
from layerpipe.schedule import _native
from layerpipe.schedule._dep_csr import (
    Csr,
    _array_dependencies,
    _listed_dependencies,
    _task_edge_dependencies,
)
from layerpipe.schedule._int_lists import INT32_MAX, INT32_MIN, int64_array, stable_argsort
from layerpipe.schedule._ir import Op, OpColumns, OpSchedule, RunPlan, tie_rank
from layerpipe.schedule._op_sweep import (
    STAGE_ROUNDS_MIN_PROCS,
    DeadlockError,
    _check_finished,
    _run_sweep,
    _sweep_first,
    _sweep_single,
)
from layerpipe.schedule._rounds import MIN_PROCS as ROUNDS_MIN_PROCS
from layerpipe.schedule._rounds import LinkSends, sweep_rounds
from layerpipe.schedule._runs import (
    FirstInputs,
    Runs,
    first_inputs,
    make_runs,
    needed_input_lists,
)
from layerpipe.schedule._workload import Workload

#: The interconnect kinds the engine times (`layerpipe.interconnect`; `SimConfig.interconnect`).
KINDS = ("shared", "links", "bus")


def link_hold_cycles(words: int, words_per_cycle: float | Fraction) -> int:
    """ceil(words / words_per_cycle), exact for integer and fractional bandwidths; 0 for infinite bandwidth."""
    if words <= 0 or words_per_cycle == math.inf:
        return 0
    if isinstance(words_per_cycle, int):
        return -(-words // words_per_cycle)
    if isinstance(words_per_cycle, Fraction):
        return -(-(words * words_per_cycle.denominator) // words_per_cycle.numerator)
    return math.ceil(words / words_per_cycle)


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    """A schedule as arrays. Op i runs on `proc[i]`; processor p owns ops bounds[p]..bounds[p+1]−1.

    Op i is task `tasks[task[i]]` = (kind, unit) of iteration `iteration[i]` and takes `cost[task[i]]` cycles.
    Its producers are prod_idx[prod_ptr[i]:prod_ptr[i+1]] (CSR), with the words each sends and the dependency role
    (`roles[prod_role[k]]`).

    Memory per op (issue 14): the per-op lists `proc` and `dur` (what the op-by-op and event-driven engines index)
    are built when first read, not at compile time — the run sweep of `shared` and the reports never read them;
    `proc_array()` and `dur_array()` give the same values as arrays, built when asked and not kept.
    """

    schedule: OpSchedule
    bounds: list[int]
    cost: tuple[int, ...]  #: cycles per task
    tasks: tuple[tuple[str, int], ...]
    task: np.ndarray
    iteration: np.ndarray
    prod_ptr: np.ndarray  #: int32 when the values fit (as `prod_idx` and `prod_words`), else int64
    prod_idx: np.ndarray
    prod_words: np.ndarray
    prod_role: np.ndarray
    roles: tuple[str, ...]
    #: The plan the ops were made from (`Workload.plan`), or None: `plan_time` is read from it.
    plan: RunPlan | None = None

    @cached_property
    def plan_time(self) -> list[int] | None:
        """Planned start of every op (`RunPlan.planned_starts`), or None without a plan or when it misses an op: the
        order a compiled bus serves transfers in. Computed when first read (only a bus reads it: a pass over every
        op that `shared` and `links` runs never need)."""
        plan = self.plan
        return None if plan is None else plan.planned_starts(self.tasks, self.task, self.iteration)

    @property
    def num_ops(self) -> int:
        return self.bounds[-1]

    @cached_property
    def proc(self) -> list[int]:
        """The processor of every op, a list (the engines' view; `proc_array` for arrays)."""
        return self.proc_array(np.int64).tolist()

    @cached_property
    def dur(self) -> list[int]:
        """The cycles of every op, a list: every op of a task shares its duration's int object."""
        if max(self.cost, default=0) <= 256 and min(self.cost, default=0) >= -5:
            return self.dur_array().tolist()  # small ints are shared objects anyway: one C pass
        with gc_paused():
            return list(map(self.cost.__getitem__, self.task.tolist()))

    def proc_array(self, dtype: type = np.int32) -> np.ndarray:
        """The processor of every op, from `bounds` (int32 by default: processor pairs p·N + q still fit)."""
        cuts = np.asarray(self.bounds, dtype=np.int64)  # ndarray methods: numpy's function wrappers cost more
        return np.arange(self.num_procs, dtype=dtype).repeat(cuts[1:] - cuts[:-1])

    def dur_array(self) -> np.ndarray:
        """The cycles of every op, an int64 array (`take`: the same values as indexing, at half its cost)."""
        return np.asarray(self.cost, dtype=np.int64).take(self.task) if self.num_ops else np.zeros(0, dtype=np.int64)

    @cached_property
    def ops(self) -> tuple[Op, ...]:
        """The `Op`s in compiled numbering (the schedule's rows, built on first read for a schedule of columns)."""
        return tuple(itertools.chain.from_iterable(self.schedule.procs))

    @property
    def num_procs(self) -> int:
        return len(self.bounds) - 1

    def completion_times(self, end: np.ndarray) -> np.ndarray:
        """`completion_times` of this schedule's ops given their ends (compiled numbering)."""
        schedule = self.schedule
        if (schedule.synchronous and self.num_ops and all(kind != "U" for kind, _ in self.tasks)
                and int(self.iteration.max()) < max(schedule.microbatches, 1)):
            return np.asarray([int(end.max())], dtype=np.int64)  # one step without updates: C(0) is the last end
        # Block by block, each block's flags and keys from per-task tables: no array per op (issue 14).
        is_update = np.asarray([kind == "U" for kind, _ in self.tasks], dtype=bool)
        sizes = self.schedule.groups_map()
        group = np.asarray([sizes.get(unit, 1) if kind == "U" else 1 for kind, unit in self.tasks], dtype=np.int64)
        task = self.task
        return _completions(self.schedule, self.iteration, end, lambda lo, hi: (is_update[task[lo:hi]],
                                                                                group[task[lo:hi]]))

    @property
    def consumer_of_edge(self) -> np.ndarray:
        """The consumer op of every CSR entry (computed when asked, not kept: memory per op, issue 14)."""
        return np.arange(self.num_ops, dtype=np.int64).repeat(self.prod_ptr[1:] - self.prod_ptr[:-1])

    @cached_property
    def prods(self) -> list[list[int]]:
        """Per op, its producer ops (a list per op: the event-driven engine's and the deadlock report's view)."""
        return _split(self.prod_idx, self.prod_ptr)

    @cached_property
    def sweep_inputs(self) -> list[list[int]]:
        """Per op, the producers the `shared` sweep must look at: all but earlier ops of its own processor
        (`layerpipe.schedule._runs.needed_inputs`: the same times, the same deadlock reports)."""
        return needed_input_lists(self.bounds, self.prod_ptr, self.prod_idx)

    @cached_property
    def sweep_first(self) -> FirstInputs:
        """`sweep_inputs` as the op-by-op sweep reads them (`layerpipe.schedule._runs.first_inputs`)."""
        return first_inputs(self.bounds, self.prod_ptr, self.prod_idx, self.num_ops)

    @property
    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct (producer, consumer) pairs sorted by producer then consumer, words summed per pair:
        one transfer each when they sit on different processors. Computed when asked, not kept (the traffic
        report and the link plan, itself kept, read it once each)."""
        if not len(self.prod_idx):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty.copy(), empty.copy()
        made = _native.pairs(self.num_ops, self.prod_ptr, self.prod_idx, self.prod_words)  # C, where it is built
        if made is not None:
            return made
        # Entries are consumer-major, so a stable sort by producer alone leaves each producer's consumers in
        # order: the stable sort by (producer, consumer) (not np.unique: numpy 2's is a hash, then a sort).
        order = stable_argsort(self.prod_idx)
        producer = self.prod_idx[order].astype(np.int64)
        consumer = self.consumer_of_edge[order]
        starts = np.flatnonzero(np.concatenate(([True], (producer[1:] != producer[:-1]) |
                                                (consumer[1:] != consumer[:-1]))))
        words = self.prod_words[order]
        if words.dtype == np.int32:  # narrowed at compile time: sum in int64 (exact)
            words = words.astype(np.int64)
        if len(starts) < len(words):  # a pair listed more than once: its words summed
            words = np.add.reduceat(words, starts)
        return producer[starts], consumer[starts], words.astype(np.int64)  # summed before any cast (floats)

    # The runs are built for each run of the engine and not kept: their Python lists (~40 B per op) were the
    # largest part of what a simulated schedule held while its reports were computed (issue 14: lenet5 at 100k
    # iterations, 2.6 M ops, held 110 MiB of them), and the library compiles a schedule for each simulation.

    @property
    def shared_runs(self) -> Runs | None:
        """The runs of ops under the `shared` model's inputs (every producer); None where they do not pay: a
        stage-level schedule (nearly every stage op waits for another processor), or too few ops merged."""
        if self.schedule.level == "stage":
            return None
        return make_runs(self.bounds, self.dur_array(), self.prod_ptr, self.prod_idx)

    @property
    def link_runs(self) -> Runs | None:
        """The runs of ops under the `links` model's inputs (same-processor producers and transfers), or None
        as for `shared_runs`."""
        if self.schedule.level == "stage":
            return None
        plan = self.link_plan
        return make_runs(self.bounds, self.dur_array(), plan.input_ptr, plan.input_src, plan.send_producer,
                         plan.send_input, plan.send_link)

    @cached_property
    def consumers(self) -> list[list[tuple[int, int]]]:
        """Per op, its (consumer, words) pairs in consumer order (the event-driven engine's view)."""
        producer, consumer, words = self.pairs
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.num_ops)]
        for i, j, w in zip(producer.tolist(), consumer.tolist(), words.tolist(), strict=True):
            out[i].append((j, w))
        return out

    @cached_property
    def link_plan(self) -> LinkPlan:
        """The transfers of the `links` model: inputs n, n+1, ... (see the module docstring)."""
        n, procs = self.num_ops, self.num_procs
        proc = self.proc_array(np.int64)
        producer, consumer, words = self.pairs  # sorted by producer, then consumer: each op's send order
        made = _native.link_inputs(n, producer, consumer, proc)  # C, where it is built: the same arrays
        if made is not None:
            ptr, src, pair = made
            i = producer[pair]
            links = proc[i] * procs + proc[consumer[pair]]
            return LinkPlan(ptr, src, i, n + np.arange(len(pair), dtype=np.int64), links, words[pair], self.bounds)
        cross = proc[producer] != proc[consumer]
        i, j, w = producer[cross], consumer[cross], words[cross]
        transfer = n + np.arange(len(i), dtype=np.int64)
        local = ~cross
        # Inputs of each op: its same-processor producers and its incoming transfers.
        dst = np.concatenate([consumer[local], j])
        src = np.concatenate([producer[local], transfer])
        by_dst = stable_argsort(dst)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
        links = proc[i] * procs + proc[j]
        return LinkPlan(ptr, src[by_dst], i, transfer, links, w, self.bounds)


@dataclass(frozen=True, eq=False)
class LinkPlan:
    """Transfer k is input n + k: `words[k]` from op `producer[k]`. Op j's inputs (its same-processor producers'
    op numbers and its transfers' input numbers) are input_src[input_ptr[j]:input_ptr[j+1]]; transfer k, sent
    by op send_producer[k], is input send_input[k] on link send_link[k] (p·N + q), in the order they queue."""

    input_ptr: np.ndarray
    input_src: np.ndarray
    send_producer: np.ndarray
    send_input: np.ndarray
    send_link: np.ndarray
    word_array: np.ndarray  #: words per transfer (the rounds read the arrays; the lists are built when read)
    bounds: list[int]  #: the compiled schedule's processor bounds (op numbering)

    @cached_property
    def words(self) -> list[int]:
        """Words per transfer, a list (the op sweep's and the event engine's view)."""
        return self.word_array.tolist()

    @cached_property
    def producer(self) -> list[int]:
        """The sending op of each transfer, a list (the deadlock report's view)."""
        return self.send_producer.tolist()

    @cached_property
    def inputs(self) -> list[list[int]]:
        """`inputs[j]`: op j's inputs, a list per op (the op-by-op sweep's view)."""
        return _split(self.input_src, self.input_ptr)

    @cached_property
    def sweep_inputs(self) -> list[list[int]]:
        """`inputs` without earlier ops of the consumer's own processor (see `CompiledSchedule.sweep_inputs`)."""
        return needed_input_lists(self.bounds, self.input_ptr, self.input_src)

    @cached_property
    def sweep_first(self) -> FirstInputs:
        """`sweep_inputs` as the op-by-op sweep reads them (`layerpipe.schedule._runs.first_inputs`)."""
        return first_inputs(self.bounds, self.input_ptr, self.input_src, len(self.input_ptr) - 1 + len(self.word_array))

    @cached_property
    def sends(self) -> list[list[tuple[int, int]]]:
        """`sends[i]`: op i's transfers as (input number, link) in the order they queue."""
        n = len(self.input_ptr) - 1
        send_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.send_producer, minlength=n), out=send_ptr[1:])
        flat = list(zip(self.send_input.tolist(), self.send_link.tolist(), strict=True))
        with gc_paused():
            return [flat[a:b] for a, b in itertools.pairwise(send_ptr.tolist())]


def completion_times(schedule: OpSchedule, iteration: np.ndarray, is_update: np.ndarray, group: np.ndarray,
                     end: np.ndarray) -> np.ndarray:
    """C(k), the latest end of iteration k's ops — of step k's ops for synchronous schedules (an update op's
    iteration is its step; the others' is their micro-batch, step t // m) — of every op, given per op its
    iteration, whether it is an update and its update group size g (grouped updates complete their group's
    last iteration). The one definition `SimResult.completion_times` and the synchronous schedulers share."""
    return _completions(schedule, iteration, end, lambda lo, hi: (is_update[lo:hi], group[lo:hi]))


#: Ops per block of `completion_times` (its scratch arrays stay this long, whatever the run: issue 14).
COMPLETION_BLOCK = 1 << 16


def _completions(schedule: OpSchedule, iteration: np.ndarray, end: np.ndarray,
                 flags: Callable[[int, int], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """`completion_times` block by block; `flags(lo, hi)` gives ops lo … hi − 1's (is update, group size). Every
    key is at most the largest iteration (or the last one, grouped), so the table is allocated that long and cut
    to the largest key."""
    n = len(iteration)
    cap = max(schedule.num_iterations - 1, 0) if schedule.groups and not schedule.synchronous else 0
    out = np.zeros(max(int(iteration.max()), cap) + 1 if n else 0, dtype=np.int64)
    top = -1
    for lo in range(0, n, COMPLETION_BLOCK):
        hi = min(lo + COMPLETION_BLOCK, n)
        key = np.asarray(iteration[lo:hi], dtype=np.int64)
        if schedule.synchronous:
            is_update, _ = flags(lo, hi)
            key = np.where(is_update, key, key // max(schedule.microbatches, 1))
        elif schedule.groups:
            _, group = flags(lo, hi)
            key = np.minimum((key + 1) * group - 1, cap)
        np.maximum.at(out, key, end[lo:hi])
        top = max(top, int(key.max()))
    return out[:top + 1].copy() if top + 1 < len(out) else out


def steady_cycles_per_iteration(schedule: OpSchedule, completions: np.ndarray, total_cycles: int,
                                busiest: int, iterations: int | None = None) -> float:
    """The steady-state slope of `completions` (C(k) per iteration or step): over the middle half, whole
    periods of an unfolded schedule, per micro-batch of a synchronous one, and at least the busiest
    processor's `busiest` cycles per iteration; total_cycles / iterations below 3. The one definition
    `SimResult.cycles_per_iteration` (whose docstring states the rule) and the stream policies share."""
    if iterations is None:  # `schedule.num_iterations` (a pass over the ops): read once, or given
        iterations = schedule.num_iterations
    k = len(completions)
    lo, hi = k // 4, k - 1 - k // 4
    unfold = max(schedule.unfold, 1)  # unfolded schedules repeat every J iterations: whole periods
    hi = lo + (hi - lo) // unfold * unfold
    if k < 3 or hi <= lo:
        return total_cycles / max(iterations, 1)
    slope = float(completions[hi] - completions[lo]) / (hi - lo)
    if schedule.synchronous:
        slope /= max(schedule.microbatches, 1)
    return max(slope, busiest / iterations)


def _split(flat: np.ndarray, ptr: np.ndarray) -> list[list[int]]:
    values, cuts = flat.tolist(), ptr.tolist()
    with gc_paused():
        return [values[a:b] for a, b in itertools.pairwise(cuts)]


def compile_schedule(schedule: OpSchedule, workload: Workload) -> CompiledSchedule:
    """Number the ops (processor-major), look up durations, and turn the dependencies into arrays."""
    with gc_paused():
        return _compile(schedule, workload)


_PROC_OF = operator.attrgetter("proc")
_TASK_OF = operator.attrgetter("kind", "unit")
_ITERATION_OF = operator.attrgetter("iteration")


def _compile(schedule: OpSchedule, workload: Workload) -> CompiledSchedule:
    if schedule.columns is not None:
        bounds, tasks, task, iteration = _from_columns(schedule.columns)
        ops: list[Op] | None = None
    else:
        ops, bounds, tasks, task, iteration = _from_ops(schedule)
    n = bounds[-1]

    def op_at(i: int) -> Op:  # error messages name ops: a schedule of columns builds them only then
        if ops is not None:
            return ops[i]
        p = _proc_of(bounds, i)
        return schedule.procs[p][i - bounds[p]]

    if n > 1 and _has_duplicate(task * (int(iteration.max()) + 1) + iteration, len(tasks) * (int(iteration.max()) + 1)):
        _raise_duplicate(list(itertools.chain.from_iterable(schedule.procs)))
    cost = [workload.durations.get(t, -1) for t in tasks]
    for k, c in enumerate(cost):
        if c < 0:
            cost[k] = workload.duration(op_at(int(np.flatnonzero(task == k)[0])))  # raises: no such task
    csr: Csr | None
    if workload.level == "layer" and not schedule.synchronous and schedule.simple:
        csr = _task_edge_dependencies(schedule, op_at, tasks, task, iteration, workload)
    else:  # stage-level, synchronous and grouped schedules
        csr = _array_dependencies(schedule, tasks, task, iteration, workload)
    if csr is None:  # outside what the arrays cover, or an error to report: `dependencies()`, op by op
        csr = _listed_dependencies(schedule, list(itertools.chain.from_iterable(schedule.procs)), workload)
    ptr, producer, words, role, roles = csr
    compiled = CompiledSchedule(schedule, bounds, tuple(cost), tasks, task, iteration, _narrow_ptr(ptr),
                                _narrow(producer), _narrow(words), role, roles, plan=workload.plan)
    if ops is not None:
        compiled.__dict__["ops"] = tuple(ops)  # the cached `ops`: the schedule's own objects
    return compiled


def _narrow(values: np.ndarray) -> np.ndarray:
    """A CSR array as int32 when every value fits (issue 14: memory per dependency). Readers index with it,
    compare it and widen it to int64 before any product or sum that could leave int32."""
    if values.dtype == np.int64 and (not len(values) or (int(values.min()) >= INT32_MIN
                                                          and int(values.max()) <= INT32_MAX)):
        return values.astype(np.int32)
    return values


def _narrow_ptr(ptr: np.ndarray) -> np.ndarray:
    """`_narrow` of a CSR pointer: it rises from 0, so its last value is its largest (one element read, not two
    reductions)."""
    if ptr.dtype == np.int64 and (not len(ptr) or (int(ptr[0]) >= 0 and int(ptr[-1]) <= INT32_MAX)):
        return ptr.astype(np.int32)
    return _narrow(ptr)


def _has_duplicate(slot: np.ndarray, cells: int) -> bool:
    """Does any (task, iteration) slot number in 0 … cells − 1 occur twice? A table of cells flags where that is
    at most a few per op (no sort), else a sort."""
    if cells <= 4 * len(slot):
        seen = np.zeros(cells, dtype=bool)
        seen[slot] = True
        return int(np.count_nonzero(seen)) < len(slot)
    ordered = np.sort(slot)
    return bool((ordered[1:] == ordered[:-1]).any())


def _proc_of(bounds: list[int], i: int) -> int:
    """The processor whose ops include op i."""
    return bisect.bisect_right(bounds, i) - 1


def _from_columns(columns: OpColumns) -> tuple[list[int], tuple[tuple[str, int], ...], np.ndarray, np.ndarray]:
    """(bounds, tasks, task, iteration) of a schedule of columns, tasks numbered in order of first appearance
    (as `_from_ops` numbers them)."""
    task = np.asarray(columns.task, dtype=np.int64)
    if columns.numbered_by_first_appearance():  # so already (`PeriodicSchedule.unroll`, the generators): shared
        return list(columns.bounds), columns.tasks, task, np.asarray(columns.iteration, dtype=np.int64)
    first = columns.first_positions()
    present = (first < columns.num_ops).nonzero()[0]
    order = present[stable_argsort(first[present])]
    tasks = tuple(columns.tasks[int(k)] for k in order)
    if (order == np.arange(len(order))).all():  # numbered so already (`PeriodicSchedule.unroll`): share the column
        return list(columns.bounds), tasks, task, np.asarray(columns.iteration, dtype=np.int64)
    renumber = np.zeros(len(columns.tasks), dtype=np.int64)
    renumber[order] = np.arange(len(order), dtype=np.int64)
    return list(columns.bounds), tasks, renumber[task], np.asarray(columns.iteration, dtype=np.int64)


def _from_ops(schedule: OpSchedule) -> tuple[list[Op], list[int], tuple[tuple[str, int], ...], np.ndarray,
                                              np.ndarray]:
    """(ops, bounds, tasks, task, iteration) of a schedule of `Op`s, checking every op's processor."""
    ops: list[Op] = []
    bounds = [0]
    for row in schedule.procs:
        ops.extend(row)
        bounds.append(len(ops))
    n = len(ops)
    # Per-op fields read by C-level loops (map over attrgetters): no Python bytecode per op.
    listed_on = np.repeat(np.arange(len(schedule.procs), dtype=np.int64), np.diff(bounds))
    wrong = np.flatnonzero(np.fromiter(map(_PROC_OF, ops), np.int64, n) != listed_on)
    if len(wrong):
        op, p = ops[int(wrong[0])], int(listed_on[wrong[0]])
        raise InputError(f"op {op} is listed on p{p} but says it runs on p{op.proc}")
    keys = list(map(_TASK_OF, ops))
    task_ids = {t: k for k, t in enumerate(dict.fromkeys(keys))}  # numbered in order of first appearance
    task = np.fromiter(map(task_ids.__getitem__, keys), np.int64, n)
    iteration = np.fromiter(map(_ITERATION_OF, ops), np.int64, n)
    return ops, bounds, tuple(task_ids), task, iteration


def _raise_duplicate(ops: list[Op]) -> None:
    seen: dict[tuple[str, int, int], Op] = {}
    for op in ops:
        key = (op.kind, op.unit, op.iteration)
        if key in seen:
            raise InputError(f"op {op} appears twice (p{seen[key].proc} and p{op.proc})")
        seen[key] = op


def run_timing(compiled: CompiledSchedule, kind: str = "shared", latency: int = 0,
               words_per_cycle: float | Fraction = 1) -> tuple[np.ndarray, np.ndarray]:
    """Start and end cycle of every op (compiled numbering, int64 arrays) on interconnect `kind` (one of
    `KINDS`) with the given link latency and bandwidth (ignored on `shared`)."""
    if kind not in KINDS:
        raise InputError(f"interconnect '{kind}' is not one of {', '.join(KINDS)}")
    with gc_paused():
        start, end = _run(compiled, kind, latency, words_per_cycle)
    return _int64(start), _int64(end)


@dataclass(frozen=True, eq=False)
class TimedRun:
    """A compiled schedule and every op's start and end on one interconnect, as `run_timing` gave them: a scheduler
    that timed its schedule by running it hands the run on (`ScheduleResult.timed_run`), and the simulator, asked for
    that very run, reads it instead of compiling and timing it again (`layerpipe.sim.simulate_policy_runs`)."""

    compiled: CompiledSchedule
    workload: Workload  #: what `compiled` was compiled on
    link: tuple[str, int, int | float | Fraction]  #: `run_timing`'s kind, latency and words per cycle
    start: np.ndarray
    end: np.ndarray
    #: What the maker built `compiled.schedule` from, for a reader to check by identity that this is the run it
    #: wants (a synchronous step: the one-step order and its stages).
    made_from: tuple[object, ...] = ()
    #: `compiled.completion_times(end)`, where the maker computed it (the steps' completions a scheduler reads).
    completions: np.ndarray | None = None

    @staticmethod
    def of(compiled: CompiledSchedule, workload: Workload, kind: str = "shared", latency: int = 0,
           words_per_cycle: float | Fraction = 1) -> TimedRun:
        """`compiled` (of `workload`) timed by `run_timing` on the interconnect given."""
        start, end = run_timing(compiled, kind, latency, words_per_cycle)
        return TimedRun(compiled, workload, (kind, latency, words_per_cycle), start, end)

    def times_on(self, kind: str, latency: int, words_per_cycle: float | Fraction
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """(start, end) if `run_timing` on this interconnect gives these times (`shared` reads neither latency nor
        bandwidth), else None."""
        if kind != self.link[0] or (kind != "shared" and (latency, words_per_cycle) != self.link[1:]):
            return None
        return self.start, self.end


def _int64(times: list[int] | np.ndarray) -> np.ndarray:
    """An engine's times as an int64 array (its lists through `struct`, `int64_array`: twice numpy's speed)."""
    return int64_array(times) if isinstance(times, list) else np.asarray(times, dtype=np.int64)


def _run(c: CompiledSchedule, kind: str, latency: int, words_per_cycle: float | Fraction
         ) -> tuple[list[int] | np.ndarray, list[int] | np.ndarray]:
    if kind == "shared":
        timed = _native.sweep(c.bounds, c.dur_array(), c.prod_ptr, c.prod_idx)  # the C sweep, where it is built
        if timed is not None:
            return timed  # else not built, or a deadlock (the sweeps below report it)
        if c.schedule.level == "stage" and c.num_procs < STAGE_ROUNDS_MIN_PROCS:
            timed = _sweep_single(c)
            if timed is not None:
                return timed  # else an op needs several inputs, or a deadlock (the sweeps below report it)
        if c.num_procs >= ROUNDS_MIN_PROCS:  # many processors: lock-step rounds on arrays
            timed = sweep_rounds(c.bounds, c.dur_array(), c.prod_ptr, c.prod_idx)
            if timed is not None:
                return timed  # else they do not pay here, or a deadlock (the sweeps below report it)
        runs = c.shared_runs
        if runs is None:
            return _sweep_first(c, c.sweep_first, lambda: c.sweep_inputs)
        return _run_sweep(c, runs, c.num_ops)
    if kind == "bus":  # one channel for every processor, served in planned order when planned
        return _run_links_events(c, latency, words_per_cycle, bus=True)
    if 0 in c.cost and _zero_duration_sender(c):  # some op takes 0 cycles (`cost` lists present tasks only)
        return _run_links_events(c, latency, words_per_cycle)
    plan = c.link_plan
    held = _hold_cycles(np.asarray(plan.word_array, dtype=np.int64), words_per_cycle)
    if _native.library() is not None:  # the C sweep: each op's transfers, in the order they queue (`LinkPlan`)
        send_ptr = np.zeros(c.num_ops + 1, dtype=np.int64)
        np.cumsum(np.bincount(plan.send_producer, minlength=c.num_ops), out=send_ptr[1:])
        timed = _native.sweep(c.bounds, c.dur_array(), plan.input_ptr, plan.input_src,
                              (send_ptr, plan.send_input, plan.send_link, held, latency), c.num_procs)
        if timed is not None:
            return timed
    if c.num_procs >= ROUNDS_MIN_PROCS:  # as on shared: lock-step rounds, the transfers timed per round
        timed = sweep_rounds(c.bounds, c.dur_array(), plan.input_ptr, plan.input_src,
                             LinkSends(plan.send_producer, plan.send_link, held, latency))
        if timed is not None:
            return timed
    hold = [0] * c.num_ops + held.tolist()
    runs = c.link_runs
    if runs is None:
        return _sweep_first(c, plan.sweep_first, lambda: plan.sweep_inputs, plan, hold, latency)
    return _run_sweep(c, runs, c.num_ops + len(plan.word_array), hold, latency, plan)


def _hold_cycles(words: np.ndarray, words_per_cycle: float | Fraction) -> np.ndarray:
    """`link_hold_cycles` of many transfers at once (exact integer ceil for integer and fractional bandwidths)."""
    if words_per_cycle == math.inf:
        return np.zeros_like(words)
    if isinstance(words_per_cycle, int):
        return -(-words // words_per_cycle)
    if isinstance(words_per_cycle, Fraction):
        return -(-(words * words_per_cycle.denominator) // words_per_cycle.numerator)
    return np.ceil(words / words_per_cycle).astype(np.int64)


def _zero_duration_sender(c: CompiledSchedule) -> bool:
    proc = c.proc
    return any(c.dur[i] == 0 and any(proc[j] != proc[i] for j, _ in c.consumers[i]) for i in range(c.num_ops))


@dataclass(frozen=True)
class BusOrder:
    """A compiled bus: transfer (producer i, consumer j) leaves `rank[(i, j)]`-th (ranks 0, 1, 2, ...), when its
    producer has ended, the transfer before it has left and, for a planned run, not before `floor[rank]`."""

    rank: dict[tuple[int, int], int]
    floor: list[int] | None = None


def bus_order(c: CompiledSchedule, latency: int, words_per_cycle: float | Fraction) -> BusOrder | None:
    """How a bus serves this run: a planned run's transfers in the plan's order and times, a synchronous
    schedule's step after step in one step's order, anything else dynamically (None: producer-end order).

    - Planned (`Workload.plan`): ranks by `layerpipe.interconnect.compiled_bus_key` of the planned times —
      the order `layerpipe.schedule._comm.channel_timing` packs the bus in — and each transfer leaves no
      earlier than the plan's bus replayed from cycle 0 on the planned releases, d_k = max(r_k, d_{k−1} +
      h_{k−1}). The plan is one valid execution in that order, so no op ends later than planned, the bus is
      exactly the replayed one, and a run that gets ahead of its plan in the fill (initial weights need no
      transfer) cannot run the bus ahead and give the slack back over many periods.
    - Synchronous (`OpSchedule.synchronous`): the transfers of step k go after all of step k − 1's, each
      step in the order the bus serves step 0 run alone (producer-end order). A dynamic bus let processors
      with zero-cycle work queue every later step's transfers ahead of the current step's, so steps never
      settled and a step's time depended on the run's length (1f1b, 4 stages, bus:1:1/4: 144 cycles per
      step over 4 steps, 272 over 16); in a fixed order the run is a max-plus linear system and its steps
      repeat.
    """
    if c.plan_time is not None:
        return _planned_order(c, words_per_cycle)
    if c.schedule.synchronous and c.schedule.microbatches >= 1:
        return _step_order(c, latency, words_per_cycle)
    return None


def _cross_transfers(c: CompiledSchedule) -> Iterator[tuple[int, int, int]]:
    """(producer, consumer, words) of every pair on different processors, by producer then consumer."""
    proc = c.proc
    for i, out in enumerate(c.consumers):
        for j, words in out:
            if proc[j] != proc[i]:
                yield i, j, words


def _planned_order(c: CompiledSchedule, words_per_cycle: float | Fraction) -> BusOrder:
    """`bus_order` of a planned run, as arrays (one lexsort and a running maximum: every simulated bus of a
    periodic schedule): cross-processor pairs by `compiled_bus_key`, floors d_k = max(r_k, d_{k−1} + h_{k−1})."""
    assert c.plan_time is not None
    producer, consumer, words = c.pairs  # the pairs `_cross_transfers` walks, in its order
    proc = c.proc_array(np.int64)
    cross = proc[producer] != proc[consumer]
    i, j, words = producer[cross], consumer[cross], words[cross]
    plan = np.asarray(c.plan_time, dtype=np.int64)
    release = plan[i] + c.dur_array()[i]
    ranks = np.asarray([tie_rank(kind, unit) for kind, unit in c.tasks], dtype=np.int64).reshape(-1, 3)[c.task[j]]
    # compiled_bus_key(release, producer start, consumer processor, consumer start, consumer tie rank, producer
    # processor), then consumer j, then producer i; lexsort takes its keys last first.
    order = np.lexsort((i, j, proc[i], ranks[:, 2], ranks[:, 1], ranks[:, 0], plan[j], proc[j], plan[i], release))
    i, j, release = i[order], j[order], release[order]
    hold = _hold_cycles(words[order], words_per_cycle)
    # With S_k the holds of the transfers before k, d_k = S_k + max(0, max over m ≤ k of (r_m − S_m)): the bus
    # is free from cycle 0, then each transfer leaves at its release or when the one before it has gone.
    before = np.concatenate(([0], np.cumsum(hold)[:-1])).astype(np.int64) if len(hold) else hold
    depart = before + np.maximum(np.maximum.accumulate(release - before), 0) if len(hold) else hold
    return BusOrder(dict(zip(zip(i.tolist(), j.tolist(), strict=True), range(len(i)), strict=True)), depart.tolist())


def _step_order(c: CompiledSchedule, latency: int, words_per_cycle: float | Fraction) -> BusOrder | None:
    """Step after step in step 0's own order (see `bus_order`); None when step 0 is not a prefix of every
    processor's program or does not run alone (the dynamic bus then reports what happens)."""
    m = c.schedule.microbatches
    is_update = [kind == "U" for kind, _ in c.tasks]
    task, iteration = c.task.tolist(), c.iteration.tolist()
    # Layer-level updates are numbered by step; every other op by micro-batch.
    step = [t if is_update[k] else t // m for k, t in zip(task, iteration, strict=True)]
    last = []
    for p in range(c.num_procs):
        lo, hi = c.bounds[p], c.bounds[p + 1]
        k = lo
        while k < hi and step[k] == 0:
            k += 1
        if any(step[x] == 0 for x in range(k, hi)):
            return None
        last.append(k)
    served: list[tuple[int, int]] = []
    try:
        _events(c, latency, words_per_cycle, True, None, last, served)
    except DeadlockError:
        return None

    def local(x: int, base: int) -> int:  # op x's number within the step `base` (its own or its producer's)
        return iteration[x] - base * (1 if is_update[task[x]] else m)

    first = {(task[i], local(i, 0), task[j], local(j, 0)): r for r, (i, j) in enumerate(served)}
    keyed = []
    for i, j, _ in _cross_transfers(c):
        r = first.get((task[i], local(i, step[i]), task[j], local(j, step[i])))
        if r is None:
            return None
        keyed.append((step[i], r, i, j))
    keyed.sort()
    return BusOrder({(i, j): k for k, (_, _, i, j) in enumerate(keyed)})


def _run_links_events(c: CompiledSchedule, latency: int, words_per_cycle: float | Fraction,
                      bus: bool = False) -> tuple[list[int], list[int]]:
    """Event-driven timing; `bus` puts every transfer on one channel (link number 0), served as `bus_order`
    says."""
    order = bus_order(c, latency, words_per_cycle) if bus else None
    return _events(c, latency, words_per_cycle, bus, order)


def _events(c: CompiledSchedule, latency: int, words_per_cycle: float | Fraction, bus: bool, order: BusOrder | None,
            last: list[int] | None = None, served: list[tuple[int, int]] | None = None) -> tuple[list[int], list[int]]:
    """The event-driven engine. `order` compiles the bus (ranks, and floors for planned runs); `last[p]` ends
    processor p's program early (ops from it on, and what they consume, are left out); `served` collects the
    transfers (producer, consumer) in the order the channel served them."""
    n, procs = c.num_ops, c.num_procs
    dur, proc, consumers = c.dur, c.proc, c.consumers
    pending = [len(set(row)) for row in c.prods]  # distinct producers: one transfer per pair
    ready = [0] * n  # latest input arrival seen so far
    start = [0] * n
    end = [0] * n
    done = [False] * n
    nxt = c.bounds[:-1].copy()
    last = c.bounds[1:] if last is None else last
    free = [0] * procs
    running = [False] * procs
    link_free: dict[int, int] = {}
    hold_of: dict[int, int] = {}  # words → link cycles, memoised
    heap: list[int] = []
    rank = order.rank if order is not None else {}
    floor = order.floor if order is not None else None
    released: dict[int, tuple[int, int, int]] = {}  # rank → (producer, consumer, words)
    head = 0
    heappush, heappop = heapq.heappush, heapq.heappop

    def try_start(p: int) -> None:
        i = nxt[p]
        if running[p] or i >= last[p] or pending[i]:
            return
        s = free[p] if free[p] > ready[i] else ready[i]
        start[i] = s
        end[i] = e = s + dur[i]
        running[p] = True
        nxt[p] = i + 1
        heappush(heap, e * n + i)

    for p in range(procs):
        try_start(p)
    while heap:
        t = heap[0] // n
        base, bound = t * n, (t + 1) * n
        transfers: list[tuple[int, int, int, int]] = []
        # Every op ending at t, including zero-duration ops that start and end at t on the way, before
        # any transfer of cycle t is queued: transfers of one cycle go in consumer order.
        while heap and heap[0] < bound:
            i = heappop(heap) - base
            p = proc[i]
            done[i] = True
            running[p] = False
            free[p] = t
            for j, words in consumers[i]:
                q = proc[j]
                if j >= last[q]:
                    continue  # beyond the programs run
                if q == p:
                    if ready[j] < t:
                        ready[j] = t
                    pending[j] -= 1
                else:
                    transfers.append((0 if bus else p * procs + q, j, i, words))
            # p is idle: its next op starts if its inputs are in — `try_start(p)` inlined, once p's own consumers
            # are counted (the one of them that can start is its next op; it starts at t or when its input came).
            k = nxt[p]
            if k < last[p] and not pending[k]:
                s = t if t > ready[k] else ready[k]
                start[k] = s
                end[k] = e = s + dur[k]
                running[p] = True
                nxt[p] = k + 1
                heappush(heap, e * n + k)
        if not transfers:
            continue  # nothing released: a ranked queue was drained when its last transfer came
        if rank:
            for _, j, i, words in transfers:
                released[rank[(i, j)]] = (i, j, words)
            queue = []
            while head in released:
                i, j, words = released.pop(head)
                queue.append((0, j, i, words, floor[head] if floor is not None else 0))
                head += 1
        else:
            transfers.sort()  # per link, in consumer order (ops are numbered processor-major)
            queue = [(link, j, i, words, 0) for link, j, i, words in transfers]
        for link, j, i, words, not_before in queue:
            depart = link_free.get(link, 0)
            if depart < t:
                depart = t
            if depart < not_before:
                depart = not_before
            hold = hold_of.get(words)
            if hold is None:
                hold = hold_of[words] = link_hold_cycles(words, words_per_cycle)
            link_free[link] = depart + hold
            arrival = depart + hold + latency
            if served is not None:
                served.append((i, j))
            if ready[j] < arrival:
                ready[j] = arrival
            pending[j] -= 1
            if not pending[j]:
                try_start(proc[j])
    if any(nxt[p] < last[p] for p in range(procs)):
        _check_finished(c, nxt, done, c.prods, [])
    return start, end

"""The simulation path as it was before issue 14's pass on explore's simulation path (commit 36075c7): the version
map (sim/_versions.py) — `version_array` counting each layer's updates with a search per layer, `_remote_copies`
looking every task's ops up with a pass over every op — and (layerpipe/schedule/_periodic.py) `unroll` sorting every
processor's whole grid. Kept as the references the fast forms are tested against (tests/test_versions_arrays.py,
tests/test_unroll_period_order.py); not used by the package.
"""

from __future__ import annotations

import numpy as np

from layerpipe.schedule._int_lists import stable_argsort
from layerpipe.schedule._ir import OpColumns, OpSchedule, tie_rank
from layerpipe.schedule._periodic import PeriodicSchedule
from layerpipe.sim._engine import CompiledSchedule
from layerpipe.sim._memory import _unit_per_op
from layerpipe.sim._versions import _apply_floor, _stash_from_forward
from layerpipe.sim._workload import Workload


def reference_version_array(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, workload: Workload,
                  mode: str, remote_copies: bool = False) -> np.ndarray:
    """Version read by every op (compiled numbering), −1 for ops that read no weights."""
    versions = np.full(c.num_ops, -1, dtype=np.int64)
    reads = np.asarray(workload.weight_readers(c.tasks), dtype=bool)[c.task]
    if not reads.any():
        return versions
    sched = c.schedule
    if sched.synchronous:
        versions[reads] = c.iteration[reads] // max(sched.microbatches, 1)
        return versions
    if workload.level == "stage":
        return versions
    unit = _unit_per_op(c)  # int16 / int32 where they fit (memory per op)
    updates = np.flatnonzero(np.asarray([k == "U" for k, _ in c.tasks], dtype=bool)[c.task])
    updates = updates[np.lexsort((end[updates], unit[updates]))]  # by layer, then end time
    update_units, update_ends = unit[updates], end[updates]
    readers = np.flatnonzero(reads)
    readers = readers[stable_argsort(unit[readers])]
    layers, first = np.unique(unit[readers], return_index=True)
    for layer, lo, hi in zip(layers.tolist(), first.tolist(), [*first[1:].tolist(), len(readers)], strict=True):
        members = readers[lo:hi]
        a, b = np.searchsorted(update_units, [layer, layer + 1])
        versions[members] = np.searchsorted(update_ends[a:b], start[members], side="right")
    if remote_copies:
        reference_remote_copies(c, versions)
    if sched.read_floor:
        _apply_floor(c, versions, unit)
    if mode == "stash":
        _stash_from_forward(c, versions, readers, unit)
    return versions


def reference_remote_copies(c: CompiledSchedule, versions: np.ndarray) -> None:
    """Readers on another processor than their layer's U read their pinned version (the copy sent to them)."""
    pinned = c.schedule.read_staleness_map()
    if not pinned or not getattr(c.schedule, "simple", True):
        return  # unfolded / grouped schedules pin per phase and update group: their own rule
    proc = c.proc_array()
    task_ids = {t: k for k, t in enumerate(c.tasks)}
    owner = {}
    for (kind, unit), k in task_ids.items():
        ops = np.flatnonzero(c.task == k)
        if "U" in kind and len(ops):
            owner[unit] = proc[ops[0]]
    for (kind, unit), stale in pinned.items():
        reader = task_ids.get((kind, unit))
        if reader is None or unit not in owner:
            continue
        ops = np.flatnonzero((c.task == reader) & (proc != owner[unit]))
        versions[ops] = np.maximum(0, c.iteration[ops] - stale)


def reference_unroll(self: PeriodicSchedule, iterations: int) -> OpSchedule:
    """`PeriodicSchedule.unroll` as of commit 36075c7: every processor's whole (period, slot) grid in one lexsort.

    Explicit ops for iterations 0..T−1 (and updates 0..⌈T/g⌉−1), each processor's ops in `op_order_key`
    order of their start times.

    Built as columns (`OpColumns`): per processor, the (period, slot) grid of iterations is sorted by the
    key's parts with one stable lexsort — the order of sorting the keys as tuples, which is this one rule —
    and the `Op`s are made only if something reads `procs`."""
    max_lag = max((s.lag for body in self.bodies for s in body), default=0)
    periods = -(-iterations // self.unfold) + max_lag + 1
    limit = {layer: -(-iterations // g) for layer, g in self.groups}
    task_id: dict[tuple[str, int], int] = {}
    task_parts: list[np.ndarray] = []
    iteration_parts: list[np.ndarray] = []
    bounds = [0]
    j = np.arange(periods, dtype=np.int64)
    for body in self.bodies:
        if not body:
            bounds.append(bounds[-1])
            continue
        # Per slot: its task, start, lag, phase, copies per period, iteration limit, busy, tie rank.
        ids = np.asarray([task_id.setdefault((s.kind, s.layer), len(task_id)) for s in body], dtype=np.int64)
        start = np.asarray([s.start for s in body], dtype=np.int64)
        lag = np.asarray([s.lag for s in body], dtype=np.int64)
        phase = np.asarray([s.phase for s in body], dtype=np.int64)
        per = np.asarray([self.phases(s.kind, s.layer) for s in body], dtype=np.int64)
        cap = np.asarray([limit.get(s.layer, iterations) if s.kind == "U" else iterations for s in body],
                         dtype=np.int64)
        # Without costs (a schedule read from text) every task counts as busy.
        busy = np.asarray([self.costs.get((s.kind, s.layer), 1) > 0 for s in body], dtype=np.int64)
        rank = np.asarray([tie_rank(s.kind, s.layer) for s in body], dtype=np.int64).reshape(len(body), 3)
        # The grid in the order the ops were listed before sorting: period by period, the body's slots.
        t = per[None, :] * (j[:, None] - lag[None, :]) + phase[None, :]
        live = (t >= 0) & (t < cap[None, :])
        slot = np.broadcast_to(np.arange(len(body)), t.shape)[live]
        t = t[live]
        when = (j[:, None] * self.period + start[None, :])[live]
        order = np.lexsort((t, rank[slot, 2], rank[slot, 1], rank[slot, 0], busy[slot], when))
        task_parts.append(ids[slot[order]])
        iteration_parts.append(t[order])
        bounds.append(bounds[-1] + len(order))
    empty = np.zeros(0, dtype=np.int64)
    columns = OpColumns(tuple(bounds), tuple(task_id), np.concatenate(task_parts) if task_parts else empty,
                        np.concatenate(iteration_parts) if iteration_parts else empty).in_first_appearance_order()
    pins = self.read_pins()
    phase0 = tuple((k, layer, st) for (k, layer, phase), st in pins.items() if phase == 0)
    phased = tuple((k, layer, phase, st) for (k, layer, phase), st in pins.items() if phase > 0)
    return OpSchedule.from_columns("layer", columns, read_staleness=phase0, unfold=self.unfold,
                                   groups=self.groups, read_phases=phased, read_floor=self.read_floor)

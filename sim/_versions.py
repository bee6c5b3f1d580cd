"""The version map: which weight version every weight-reading op read (design notes §3, contract 1).

- asynchronous layer-level schedules: an F or E op of layer l reads version k = the number of U_l ops
  that have finished when it starts (end ≤ its start). U_l ops on the op's own processor finish before
  it exactly when they precede it in program order, so the rule needs no special case for them. U_l
  ops finish in iteration order (U_l(t) needs U_l(t−1)), so version k holds updates 0..k−1.
- on a distributed interconnect (`links`, `bus`, `rtl`) an op away from its layer's U reads the copy the
  owner sent for it: the version the schedule pins (`OpSchedule.read_staleness`: X_l(t) reads t − s, sent by
  U_l(t − s − 1) and waited for), not a newer one that may have ended at the owner meanwhile.
- `stash`: an op containing E of layer l at iteration t reads the version F_l(t) read.
- `latest`: E reads the current version at its start, like F.
- `ema`: E computes with the current weights (recorded here) and the moving-average correction
  reconstructs F_l(t)'s version; the version to reconstruct is F_l(t)'s entry in the same map.
- synchronous schedules: every op of step j = t // m reads version j.
- reads pinned by design (`OpSchedule.read_floor`: PipeDream-2BW's double buffer, window k reads version
  k − 1) read that version even when a newer one has been written (never a newer one than the count).
- asynchronous stage-level schedules have no update ops, so no versions are recorded for them.

Ops that read no weights get −1.
"""

from __future__ import annotations

import numpy as np

from layerpipe.schedule._int_lists import stable_argsort
from layerpipe.sim._engine import CompiledSchedule
from layerpipe.sim._memory import _unit_per_op
from layerpipe.sim._workload import Workload


def version_array(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, workload: Workload,
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
    versions[readers] = _updates_ended(update_units, update_ends, unit[readers], start[readers])
    if remote_copies:
        _remote_copies(c, versions)
    if sched.read_floor:
        _apply_floor(c, versions, unit)
    if mode == "stash":
        _stash_from_forward(c, versions, readers, unit)
    return versions


def _updates_ended(update_units: np.ndarray, update_ends: np.ndarray, units: np.ndarray, times: np.ndarray
                   ) -> np.ndarray:
    """Per (unit, time) query, how many updates of that unit end at or before the time; the updates are sorted by
    unit, then end. One search over keys unit · span + time (every time and end in 0 … span − 1) less where
    the unit's updates begin — not a search per unit (a dozen numpy calls per layer: issue 14)."""
    if not len(units):
        return np.zeros(0, dtype=np.int64)
    low = min(int(units.min()), int(update_units.min()) if len(update_units) else 0)
    span = max(int(times.max()), int(update_ends.max()) if len(update_ends) else 0) + 1
    if int(times.min()) < 0 or (max(int(units.max()), int(update_units.max()) if len(update_units) else 0)
                                - low + 1) * span >= 1 << 62:  # keys out of range: a search per unit
        out = np.zeros(len(units), dtype=np.int64)
        for u in np.unique(units).tolist():
            mine = np.flatnonzero(units == u)
            a, b = np.searchsorted(update_units, [u, u + 1])
            out[mine] = np.searchsorted(update_ends[a:b], times[mine], side="right")
        return out
    update_keys = (update_units.astype(np.int64) - low) * span + update_ends
    query_units = units.astype(np.int64) - low
    ended = np.searchsorted(update_keys, query_units * span + times, side="right")
    return ended - np.searchsorted(update_keys, query_units * span, side="left")


def _apply_floor(c: CompiledSchedule, versions: np.ndarray, unit: np.ndarray) -> None:
    """Reads pinned by design (`OpSchedule.read_floor`, PipeDream-2BW's double buffer) read version
    ⌊t/g⌋ − s even when a newer one is there: the version the policy gives them, not the newest."""
    sched = c.schedule
    groups = sched.groups_map()
    floor = {(kind, layer, phase): s for kind, layer, phase, s in sched.read_floor}
    kinds = [k for k, _ in c.tasks]
    for i in np.flatnonzero(versions >= 0).tolist():
        layer, t = int(unit[i]), int(c.iteration[i])
        s = floor.get((kinds[c.task[i]], layer, t % sched.unfold))
        if s is not None:
            versions[i] = min(versions[i], max(0, t // groups.get(layer, 1) - s))


def _remote_copies(c: CompiledSchedule, versions: np.ndarray) -> None:
    """Readers on another processor than their layer's U read their pinned version (the copy sent to them)."""
    pinned = c.schedule.read_staleness_map()
    if not pinned or not getattr(c.schedule, "simple", True):
        return  # unfolded / grouped schedules pin per phase and update group: their own rule
    num_tasks = len(c.tasks)
    proc = c.proc_array()
    # Each task's first op (ops are numbered processor-major: its processor's), by one pass over the ops.
    present, first_op = np.unique(c.task, return_index=True)
    first_proc = np.full(num_tasks, -1, dtype=np.int64)
    first_proc[present] = proc[first_op]
    owner: dict[int, int] = {}
    for k, (kind, unit) in enumerate(c.tasks):  # a later U task of a unit wins, as before
        if "U" in kind and first_proc[k] >= 0:
            owner[unit] = int(first_proc[k])
    task_ids = {t: k for k, t in enumerate(c.tasks)}
    stale = np.zeros(num_tasks, dtype=np.int64)  # per reader task: its pin (any sign), where its unit has an owner
    held_at = np.full(num_tasks, -1, dtype=np.int64)  # … and that owner's processor (−1: not pinned)
    for (kind, unit), s in pinned.items():
        reader = task_ids.get((kind, unit))
        if reader is not None and unit in owner:
            stale[reader], held_at[reader] = s, owner[unit]
    if not bool((held_at >= 0).any()):
        return
    at = held_at.take(c.task)
    ops = np.flatnonzero((at >= 0) & (proc != at))
    versions[ops] = np.maximum(0, c.iteration[ops] - stale.take(c.task[ops]))


def _stash_from_forward(c: CompiledSchedule, versions: np.ndarray, readers: np.ndarray, unit: np.ndarray) -> None:
    """Backward readers (kinds with E, not F) take the version of F of their layer and iteration."""
    is_forward = np.asarray([k == "F" for k, _ in c.tasks], dtype=bool)[c.task]
    backward = readers[~is_forward[readers]]
    forward = np.flatnonzero(is_forward)
    if not len(backward) or not len(forward):
        return
    span = int(c.iteration.max()) + 1
    forward_key = unit[forward].astype(np.int64) * span + c.iteration[forward]
    order = stable_argsort(forward_key)  # keys are distinct: the same order; radix sort
    forward, forward_key = forward[order], forward_key[order]
    key = unit[backward].astype(np.int64) * span + c.iteration[backward]
    pos = np.minimum(np.searchsorted(forward_key, key), len(forward_key) - 1)
    found = forward_key[pos] == key
    versions[backward[found]] = versions[forward[pos[found]]]

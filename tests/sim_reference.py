"""The simulator's version map as it was before issue 14's pass on explore's simulation path (commit 36075c7,
sim/_versions.py): `version_array` counting each layer's updates with a search per layer, and `_remote_copies`
looking every task's ops up with a pass over every op. Kept as the references the array forms are tested against
(tests/test_versions_arrays.py); not used by the package.
"""

from __future__ import annotations

import numpy as np

from layerpipe.schedule._int_lists import stable_argsort
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

"""The version map: which weight version every weight-reading op read (design notes §3, contract 1).

- asynchronous layer-level schedules: an F or E op of layer l reads version k = the number of U_l ops
  that have finished when it starts (end ≤ its start). U_l ops on the op's own processor finish before
  it exactly when they precede it in program order, so the rule needs no special case for them. U_l
  ops finish in iteration order (U_l(t) needs U_l(t−1)), so version k holds updates 0..k−1.
- `stash`: an op containing E of layer l at iteration t reads the version F_l(t) read.
- `latest`: E reads the current version at its start, like F.
- `ema`: E computes with the current weights (recorded here) and the moving-average correction
  reconstructs F_l(t)'s version; the version to reconstruct is F_l(t)'s entry in the same map.
- synchronous schedules: every op of step j = t // m reads version j.
- asynchronous stage-level schedules have no update ops, so no versions are recorded for them.

Ops that read no weights get −1.
"""

from __future__ import annotations

import numpy as np

from layerpipe.sim._engine import CompiledSchedule
from layerpipe.sim._workload import Workload


def version_array(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, workload: Workload,
                  mode: str) -> np.ndarray:
    """Version read by every op (compiled numbering), −1 for ops that read no weights."""
    n = c.num_ops
    versions = np.full(n, -1, dtype=np.int64)
    reads: dict[tuple[str, int], bool] = {}
    readers: list[int] = []
    for i, op in enumerate(c.ops):
        key = (op.kind, op.unit)
        r = reads.get(key)
        if r is None:
            r = reads[key] = workload.reads_weights(*key)
        if r:
            readers.append(i)
    if not readers:
        return versions
    sched = c.schedule
    idx = np.asarray(readers, dtype=np.int64)
    if sched.synchronous:
        m = max(sched.microbatches, 1)
        versions[idx] = np.fromiter((c.ops[i].iteration // m for i in readers), np.int64, len(readers))
        return versions
    if workload.level == "stage":
        return versions
    update_ends: dict[int, list[int]] = {}
    for i, op in enumerate(c.ops):
        if op.kind == "U":
            update_ends.setdefault(op.unit, []).append(int(end[i]))
    by_layer: dict[int, list[int]] = {}
    for i in readers:
        by_layer.setdefault(c.ops[i].unit, []).append(i)
    for layer, members in by_layer.items():
        ends = np.sort(np.asarray(update_ends.get(layer, []), dtype=np.int64))
        m_idx = np.asarray(members, dtype=np.int64)
        versions[m_idx] = np.searchsorted(ends, start[m_idx], side="right")
    if mode == "stash":
        forward = {(op.unit, op.iteration): i for i, op in enumerate(c.ops) if op.kind == "F"}
        for i in readers:
            op = c.ops[i]
            if "F" not in op.kind:  # an E-containing backward op reads its forward's version
                f = forward.get((op.unit, op.iteration))
                if f is not None:
                    versions[i] = versions[f]
    return versions

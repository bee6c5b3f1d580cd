"""A shorter run that is the start of a longer one: its times read off the longer run, not simulated again (issue
14: `explore` times every point twice, K and 2K iterations of the same schedule, and the K run was a tenth of the
sweep).

`is_prefix_run(longer, bounds, positions, kind)` says whether every op of a shorter run (a cut of `longer`,
`restricted_compile` / `keeps_producers`: op i is `longer`'s op positions[i], with the same producers, words and
cost; processor p's ops are bounds[p] … bounds[p+1] − 1) starts and ends in `longer`'s run exactly when it does in
its own, by what the engine reads (`layerpipe.schedule._engine`):

- an op starts when its processor's previous op has ended and its inputs are there: so each processor's kept ops
  must be its *first* ops in `longer` (no op of `longer` alone runs before one of them on its processor), and
  every producer of a kept op is kept (the cut's own condition);
- on `links`, a transfer leaves when its producer has ended and the transfer queued before it on its link has left:
  so on every link the transfers between kept ops must come first (none of `longer`'s other transfers queued
  ahead of one of them). Each link carries one processor's sends, in its program order.

Then by induction over the kept ops in time every one has the same start and end in both runs. Where any of this
fails — a pipelined schedule whose processors interleave iterations, so the K run's last iterations run without
the (K+1)-th's ops between theirs — the shorter run is simulated. `shared` and `links` only: a bus serves in a
planned or dynamic order with floors of its own (simulated), and so do links whose zero-cycle senders the event
engine times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layerpipe.schedule._engine import CompiledSchedule, _zero_duration_sender
from layerpipe.schedule._int_lists import stable_argsort

#: The interconnects on which a shorter run can be read off a longer one (see the module docstring).
PREFIX_KINDS = ("shared", "links")


def is_prefix_run(longer: CompiledSchedule, bounds: Sequence[int], positions: np.ndarray, kind: str) -> bool:
    """Whether the shorter run — ops at `positions` of `longer` (a cut whose producers are all kept:
    `restricted_compile`, `keeps_producers`), processor p's ops bounds[p] … bounds[p+1] − 1 — is `longer`'s run at
    `positions` (see the module docstring). Needs no compiled schedule of the shorter run."""
    if kind not in PREFIX_KINDS or len(longer.bounds) != len(bounds):
        return False
    n = len(positions)
    own = np.asarray(longer.bounds, dtype=np.int64)
    cut = np.asarray(bounds, dtype=np.int64)
    proc = np.arange(len(cut) - 1, dtype=np.int64).repeat(cut[1:] - cut[:-1])
    # Each processor's kept ops are its first ops: op i, the (i − cut[p])-th of processor p, is longer's own[p] + that
    if n and not np.array_equal(positions - own.take(proc), np.arange(n, dtype=np.int64) - cut.take(proc)):
        return False
    if kind == "shared":
        return True
    if 0 in longer.cost and _zero_duration_sender(longer):
        return False  # timed by the event engine (`_run_links_events`)
    plan = longer.link_plan
    total = longer.num_ops
    transfers = len(plan.word_array)
    if not transfers:
        return True
    # The consumer of each transfer: the op whose inputs list it (each transfer is one input of one op).
    ptr = np.asarray(plan.input_ptr, dtype=np.int64)
    entries = ptr[1:] - ptr[:-1]
    owner = np.repeat(np.arange(total, dtype=np.int64), entries)
    src = np.asarray(plan.input_src, dtype=np.int64)
    is_transfer = src >= total
    consumer = np.empty(transfers, dtype=np.int64)  # by input number less the op count
    consumer[src[is_transfer] - total] = owner[is_transfer]
    kept = np.zeros(total, dtype=bool)
    kept[positions] = True
    sent = consumer.take(np.asarray(plan.send_input, dtype=np.int64) - total)  # each queued transfer's consumer
    both = kept.take(np.asarray(plan.send_producer, dtype=np.int64)) & kept.take(sent)
    # On each link, in queue order (transfer numbers), no transfer of `longer` alone before a kept one.
    order = stable_argsort(np.asarray(plan.send_link, dtype=np.int64))
    link = np.asarray(plan.send_link, dtype=np.int64)[order]
    dropped = ~both[order]
    seen = np.cumsum(dropped)
    first = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
    before = seen - dropped  # dropped transfers before this one, over all links so far
    base = np.repeat(before[first], np.diff(np.r_[first, len(link)]))  # ... up to its link's first transfer
    return not bool((both[order] & (before > base)).any())

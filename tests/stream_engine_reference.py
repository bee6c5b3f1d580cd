"""The stream engine's `run_program` as it stood before its per-event work was trimmed (issue 14's speed work): the
oracle tests/test_stream_engine_identity.py compares the fast one with on generated programs. Not used by the
package."""

from __future__ import annotations

import heapq

from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._stream_engine import Program, Timing, _deadlock, share_lanes


def reference_run_program(program: Program, interconnect: Interconnect = SHARED) -> Timing:
    """`run_program` as it was before its per-event work was trimmed (issue 14), kept as the oracle."""
    n = program.num_items
    names, device, stream, work = program.names, program.device, program.stream, program.work
    consumers: list[list[int]] = [[] for _ in range(n)]
    pending = [0] * n
    for i, deps in enumerate(program.deps):
        pending[i] = len(deps)
        for d in deps:
            consumers[d].append(i)
    queues: dict[tuple[int, int], list[int]] = {}
    for i in range(n):
        if names[i] is not None:
            queues.setdefault((device[i], stream[i]), []).append(i)
    head = dict.fromkeys(queues, 0)
    busy = dict.fromkeys(queues, False)
    start = [-1] * n
    end = [-1] * n
    # Computing kernels per device: item → remaining MACs; shares as of `since[d]`.
    computing: list[dict[int, int]] = [{} for _ in program.lanes]
    share: list[dict[int, int]] = [{} for _ in program.lanes]
    since = [0] * len(program.lanes)
    stamp = [0] * len(program.lanes)
    channel_free: dict[int, int] = {}
    num_devices = len(program.lanes)
    bus = interconnect.kind == "bus"
    holds: dict[int, int] = {}  # words → channel cycles
    waiting_on: dict[int, list[tuple[int, int, int]]] = {}  # channel → (priority, ready time, item) heap
    # Events: (time, order, kind, item, stamp); kind 0 = an item finished, 1 = launch overhead over,
    # 2 = a device's projected completion (valid while its stamp is current), 3 = a channel is free.
    heap: list[tuple[int, int, int, int, int]] = []
    seq = 0

    def push(t: int, kind: int, item: int, st: int = 0) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, item, st))
        seq += 1

    def settle(d: int, t: int) -> None:
        """Advance device d's computing kernels to t at their current shares."""
        dt = t - since[d]
        if dt:
            for k, a in share[d].items():
                computing[d][k] -= a * dt
        since[d] = t

    def reshare(d: int, t: int) -> None:
        kernels = list(computing[d])
        stamp[d] += 1
        if not kernels:
            share[d] = {}
            return
        if len(kernels) == 1:  # the common case, and what share_lanes gives for one kernel
            share[d] = {kernels[0]: min(program.width[kernels[0]], program.lanes[d])}
        else:
            got = share_lanes(program.lanes[d], [program.width[k] for k in kernels], [stream[k] for k in kernels])
            share[d] = dict(zip(kernels, got, strict=True))
        nxt = min(t + max(0, -(-computing[d][k] // a)) for k, a in share[d].items() if a > 0)
        push(nxt, 2, d, stamp[d])

    def try_launch(q: tuple[int, int], t: int) -> None:
        if busy[q] or head[q] >= len(queues[q]):
            return
        i = queues[q][head[q]]
        if pending[i]:
            return
        busy[q] = True
        head[q] += 1
        start[i] = t
        push(t + program.overhead[i], 1, i)

    def ready(i: int, t: int) -> None:
        """Item i's dependencies have all finished (at t)."""
        if names[i] is not None:
            try_launch((device[i], stream[i]), t)
            return
        if interconnect.is_shared:
            start[i] = t
            push(t, 0, i)
            return
        c = 0 if bus else device[i] * num_devices + stream[i]  # `Interconnect.channel`
        waiting = waiting_on.setdefault(c, [])
        if channel_free.get(c, 0) <= t and not waiting:
            depart(i, c, t)
        else:  # the channel is busy: its free event takes the best waiting transfer
            heapq.heappush(waiting, (program.priority[i], t, i))

    def depart(i: int, c: int, t: int) -> None:
        hold = holds.get(work[i])
        if hold is None:
            hold = holds[work[i]] = interconnect.hold(work[i])
        channel_free[c] = t + hold
        start[i] = t
        push(t + hold + interconnect.latency, 0, i)
        push(t + hold, 3, c)

    def finish(i: int, t: int) -> None:
        end[i] = t
        if names[i] is not None:
            q = (device[i], stream[i])
            busy[q] = False
        for j in consumers[i]:
            pending[j] -= 1
            if not pending[j]:
                ready(j, t)
        if names[i] is not None:
            try_launch((device[i], stream[i]), t)

    for i in range(n):
        if not pending[i] and names[i] is None:
            ready(i, 0)
    for q in queues:
        try_launch(q, 0)
    while heap:
        t, _, kind, item, st = heapq.heappop(heap)
        if kind == 0:
            finish(item, t)
        elif kind == 1:
            if work[item] == 0:
                finish(item, t)
            else:
                d = device[item]
                settle(d, t)
                computing[d][item] = work[item]
                reshare(d, t)
        elif kind == 3:
            waiting = waiting_on[item]
            if waiting and channel_free[item] <= t:
                _, _, i = heapq.heappop(waiting)
                depart(i, item, t)
        elif st == stamp[item]:
            d = item
            settle(d, t)
            done = sorted(k for k, rem in computing[d].items() if rem <= 0)
            for k in done:
                del computing[d][k]
            reshare(d, t)
            for k in done:
                finish(k, t)
    if any(e < 0 for e in end):
        _deadlock(program, end, queues, head)
    return Timing(start, end)

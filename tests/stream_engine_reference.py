"""The stream engine's `run_program` as it stood before its per-event work was trimmed (issue 14's speed work): the
oracle tests/test_stream_engine_identity.py compares the fast one with on generated programs; and
`cycles_per_iteration` as it stood when it placed the rows first, and the data-parallel policies' `build_program`
before its per-kernel work was trimmed, and the stream policies' one. Not used by the package."""

from __future__ import annotations

import heapq

import numpy as np

from layerpipe.costs import atomic_work
from layerpipe.dfg import Task
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._dataparallel import _NOT_LOCAL, DPPlan
from layerpipe.schedule._engine import completion_times, steady_cycles_per_iteration
from layerpipe.schedule._ir import Op
from layerpipe.schedule._stream_engine import Program, Timing, _deadlock, placed_rows, share_lanes
from layerpipe.schedule._streams import _NOT_LOCAL as _STREAM_NOT_LOCAL
from layerpipe.schedule._streams import StreamPlan, kernel_width


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


def reference_cycles_per_iteration(program: Program, timing: Timing, row: list[int], num_rows: int,
                         microbatches: int) -> float:
    """The steady-state cycles per micro-batch of the run: `SimResult.cycles_per_iteration` of what
    `layerpipe.sim._streams.sim_result` makes of it (the same rows, completion times and slope rule,
    `layerpipe.schedule._engine`), without building the result: `cycles_per_iteration` as it was before it
    stopped placing the rows (issue 14's speed work), kept as the oracle."""
    schedule, items = placed_rows(program, timing, row, num_rows, microbatches)
    ops = [op for r in schedule.procs for op in r]
    iteration = np.fromiter((op.iteration for op in ops), np.int64, len(ops))
    is_update = np.fromiter((op.kind == "U" for op in ops), bool, len(ops))
    sizes = schedule.groups_map()
    group = np.fromiter((sizes.get(op.unit, 1) if op.kind == "U" else 1 for op in ops), np.int64, len(ops))
    start = np.asarray([timing.start[i] for i in items], dtype=np.int64)
    end = np.asarray([timing.end[i] for i in items], dtype=np.int64)
    proc = np.fromiter((op.proc for op in ops), np.int64, len(ops))
    busy = np.bincount(proc, weights=end - start, minlength=schedule.num_procs).astype(np.int64)
    total = int(end.max()) if len(end) else 0
    return steady_cycles_per_iteration(schedule, completion_times(schedule, iteration, is_update, group, end),
                                       total, int(busy.max()) if len(busy) else 0)


def reference_build_program(p: DPPlan, steps: int) -> Program:
    """The kernels and ring transfers of `steps` steps (see the module docstring), as a stream-engine
    `Program` with one device of one lane per replica: a kernel of c cycles is c units of work."""
    n, net, graph = p.num_procs, p.network, p.graph
    prog = Program([1] * n, [1] * n)
    local: dict[Task, list[Task]] = {t: [] for t in graph.tasks}
    for e in graph.edges:
        if e.role not in _NOT_LOCAL and e.delay == 0:
            local[e.dst].append(e.src)
    first = set(p.first)
    item: dict[tuple[int, str, int, int], int] = {}  # (replica, kind, layer, t or step) → item
    done_at: dict[tuple[int, int, int], int] = {}  # (replica, layer, step) → item when its gradient is reduced

    def add(rep: int, kind: str, layer: int, t: int, step: int) -> None:
        task = graph.task_of(layer, kind)
        if task is None:
            return
        deps = [item[(rep, s.kind, s.layer, t)] for s in local[task]]
        if kind in "FE" and step > 0 and (rep, "U", layer, step - 1) in item:
            deps.append(item[(rep, "U", layer, step - 1)])
        prog.kernel(Op(rep, kind, layer, t), rep, 0, p.costs[task], 1, 0, deps)
        item[(rep, kind, layer, t)] = prog.num_items - 1

    def update(rep: int, layer: int, step: int) -> None:
        t = step * n + rep
        deps = [done_at[(rep, layer, step)]]
        deps += [item[(rep, k, layer, t)] for k in "FE" if (rep, k, layer, t) in item]  # write after read
        if step > 0:
            deps.append(item[(rep, "U", layer, step - 1)])
        task = graph.task_of(layer, "U")
        assert task is not None
        prog.kernel(Op(rep, "U", layer, step), rep, 0, p.costs[task], 1, 0, deps)
        item[(rep, "U", layer, step)] = prog.num_items - 1

    layers = [layer.index for layer in net.layers]
    for step in range(steps):
        for rep in range(n):
            t = step * n + rep
            for layer in layers:
                if layer in first and step > 0:
                    update(rep, layer, step - 1)  # gated: the update lands just before F_i
                add(rep, "F", layer, t, step)
            for layer in reversed(layers):
                for kind in "AE":
                    add(rep, kind, layer, t, step)
                if layer not in first:
                    add(rep, "G", layer, t, step)
            for layer in p.first:
                add(rep, "G", layer, t, step)
        for group in p.all_reduces:
            grads = {rep: [item[(rep, "G", layer, step * n + rep)] for layer in group] for rep in range(n)}
            if n == 1:
                for layer, g in zip(group, grads[0], strict=True):
                    done_at[(0, layer, step)] = g  # one replica: nothing to reduce
                continue
            words = -(-sum(net.layer(layer).weight_count for layer in group) // n)
            ring = [(rep, (rep + 1) % n) for rep in range(n)]
            priority = min(group) if p.comm_priority else 0
            # Round s: every replica sends to the next one, after its gradients and (from the second round on)
            # what it received in round s − 1, from replica rep − 1: item sent + (rep − 1) mod n of that round.
            sent = prog.transfers(ring, words, [tuple(grads[rep]) for rep in range(n)], priority)
            for _ in range(2 * (n - 1) - 1):
                sent = prog.transfers(ring, words, [(*grads[rep], sent + (rep - 1) % n) for rep in range(n)],
                                      priority)
            for rep in range(n):
                for layer in group:
                    done_at[(rep, layer, step)] = sent + (rep - 1) % n
        for rep in range(n):
            for layer in reversed(layers):
                if net.layer(layer).has_weights and layer not in first:
                    update(rep, layer, step)
            if step == steps - 1:
                for layer in p.first:
                    update(rep, layer, step)  # the last step's gated updates: no next forward to wait for
    return prog


def reference_stream_build_program(p: StreamPlan, iterations: int) -> Program:
    """`layerpipe.schedule._streams.build_program` before it kept each kernel's work and width."""
    net, graph, dev = p.network, p.graph, p.device
    prog = Program([dev.lanes], [p.streams])
    local: dict[Task, list[Task]] = {t: [] for t in graph.tasks}
    for e in graph.edges:
        if e.role not in _STREAM_NOT_LOCAL and e.delay == 0:
            local[e.dst].append(e.src)
    item: dict[tuple[str, int, int], int] = {}
    weights = [layer.index for layer in net.layers if layer.has_weights]
    lane_of_g = {layer: 1 + k % (p.streams - 1) for k, layer in enumerate(reversed(weights))} if p.streams > 1 else {}

    def add(kind: str, layer: int, t: int, stream: int) -> None:
        task = graph.task_of(layer, kind)
        if task is None:
            return
        deps = [item[(s.kind, s.layer, t)] for s in local[task]]
        if kind == "U":
            deps += [item[(k, layer, t)] for k in "FEG" if (k, layer, t) in item]
            if t > 0:
                deps.append(item[("U", layer, t - 1)])
        elif kind in "FE" and t > 0 and ("U", layer, t - 1) in item:
            deps.append(item[("U", layer, t - 1)])
        lay = net.layer(layer)
        prog.kernel(Op(stream, kind, layer, t), 0, stream, atomic_work(lay, kind, net.batch),
                    kernel_width(lay, kind, net.batch), dev.overhead, deps)
        item[(kind, layer, t)] = prog.num_items - 1

    layers = [layer.index for layer in net.layers]
    for t in range(iterations):
        for layer in layers:
            if p.ooo and t > 0 and layer in weights:
                add("U", layer, t - 1, 0)  # gated: the update lands just before F_l reads it
            add("F", layer, t, 0)
        for layer in reversed(layers):
            add("A", layer, t, 0)
            add("E", layer, t, 0)
            if layer in weights and layer not in p.deferred:
                add("G", layer, t, lane_of_g.get(layer, 0) if p.ooo else 0)
        for layer in reversed(p.deferred):
            add("G", layer, t, 1 if p.streams > 1 else 0)
        if not p.ooo:
            for layer in reversed(weights):
                add("U", layer, t, 0)
        elif t == iterations - 1:
            for layer in weights:
                add("U", layer, t, 0)  # the last iteration's gated updates: no next forward
    return prog

"""The stream engine: devices with concurrent streams that share MAC lanes, and transfers on an interconnect.

It sits in the schedule layer (issue 13's layering: the stream and data-parallel policies time their
kernels on it without importing the simulator, a layer above); `layerpipe.sim._streams` re-exports it and
turns its timing into a `SimResult`.

The shared event engine (`layerpipe.schedule._engine`) runs one op at a time per processor. Two schedules of
Out-Of-Order BackProp (Oh et al., EuroSys'22) need more: its single-GPU scheme runs weight-gradient kernels
on a second CUDA stream *beside* output-gradient kernels (§6 of the paper), and its data-parallel scheme
overlaps each layer's gradient all-reduce with the remaining backward and the next forward (§5). This
module times both, on the interconnect model of `layerpipe.interconnect` (design notes §11).

A `Program` holds items of two kinds, numbered in the order they were added:

- **kernels**: run on one stream of one device; a stream runs its kernels in the order given. A kernel
  starts when its stream's previous kernel has ended and every dependency has finished. It then holds its
  stream `overhead` cycles (the launch overhead: address setup, fill and drain — the `pe` cost model's
  per-op overhead) without using lanes, and then computes `work` MACs on the lanes it is given.
- **transfers**: `words` from device p to device q, on the interconnect's channel p→q (`links`), on the
  one medium (`bus`), or free (`shared`). A transfer is ready when its dependencies have finished; it
  leaves when the channel is free, holds it ⌈words / w⌉ cycles and arrives `latency` later — the timing of
  `layerpipe.schedule._engine`. Transfers waiting for a channel leave first ready, first sent (ties by
  item number), unless they carry priorities: then the lowest priority leaves first when the channel frees
  (non-preemptive; ByteScheduler/P3-style tensor priorities). Transfers use no stream and no lanes (a DMA
  engine or NIC moves them).

**The lane-sharing rule.** A device has `lanes` MAC lanes. A kernel can fill at most `width` of them (its
independent outputs: one lane computes one output element's dot product — an output-stationary dataflow).
The kernels computing on a device at a moment share its lanes by integer water-filling: kernels are taken
in order of width (ties by stream); each gets min(width, ⌊lanes left / kernels left⌋); lanes still left
go, in stream order, to kernels that can fill more. So two kernels that can each fill the device split
it, and a kernel that cannot fill the lanes leaves the rest to the other stream. Shares change only when
a kernel starts or stops computing; between such events a kernel advances `share` MACs per cycle and
ends at the first whole cycle its work is done (⌈remaining / share⌉), so times stay integers.
Simplifications: no memory-bandwidth or cache contention between streams; launch overheads of different
streams overlap fully (a GPU's launch queue is not modelled); a kernel alone takes
overhead + ⌈work / min(width, lanes)⌉ — the `pe` model's cost when it fills the lanes.

With one stream per device and no transfers, this engine gives the same start and end times as the shared
event engine on the same ops with those durations (tested).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from layerpipe._gc import gc_paused
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._engine import completion_times, steady_cycles_per_iteration
from layerpipe.schedule._ir import Op, OpSchedule

#: Iterations a design point is simulated for at least (`layerpipe.dse._evaluate.simulated_iterations`, which
#: imports it from here); the data-parallel policies time their step over the same horizon, so the figure
#: `compare` prints is the one `explore` measures. It sits here, below both, so neither imports upward.
SIM_ITERATIONS_MIN = 16


def _check_earlier(n: int, deps: Sequence[int]) -> None:
    """Item `n`'s dependencies (or a batch's, from item `n` on) are all items added before it."""
    if deps and not (min(deps) >= 0 and max(deps) < n):
        raise InputError(f"item {n} depends on an item that is not an earlier one: {tuple(deps)}")


@dataclass
class Program:
    """Kernels and transfers of a run; build it with `kernel` and `transfer`."""

    lanes: list[int]  #: lanes per device
    streams: list[int]  #: streams per device
    names: list[Op | None] = field(default_factory=list)  #: a kernel's op (None for a transfer)
    device: list[int] = field(default_factory=list)  #: kernel: its device; transfer: the sender
    stream: list[int] = field(default_factory=list)  #: kernel: its stream; transfer: the receiver
    work: list[int] = field(default_factory=list)  #: kernel: MACs; transfer: words
    width: list[int] = field(default_factory=list)
    overhead: list[int] = field(default_factory=list)
    priority: list[int] = field(default_factory=list)  #: transfer: its channel priority (lower goes first)
    deps: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.lanes) != len(self.streams):
            raise InputError("a program needs lanes and streams for every device")
        for d, (lanes, streams) in enumerate(zip(self.lanes, self.streams, strict=True)):
            if lanes < 1:
                raise InputError(f"device {d}: lanes must be >= 1, got {lanes}")
            if streams < 1:
                raise InputError(f"device {d}: streams must be >= 1, got {streams}")

    @property
    def num_items(self) -> int:
        return len(self.names)

    def kernel(self, op: Op, device: int, stream: int, work: int, width: int, overhead: int = 0,
               deps: tuple[int, ...] | list[int] = ()) -> int:
        """Add a kernel at the end of `stream` of `device`; returns its item number."""
        if not 0 <= stream < self.streams[device]:
            raise InputError(f"kernel {op}: stream {stream} is not one of device {device}'s "
                             f"{self.streams[device]} streams")
        if work < 0 or width < 1 or overhead < 0:
            raise InputError(f"kernel {op}: work >= 0, width >= 1 and overhead >= 0, got {work}, {width}, "
                             f"{overhead}")
        return self._add(op, device, stream, work, width, overhead, deps)

    def transfer(self, src: int, dst: int, words: int, deps: tuple[int, ...] | list[int] = (),
                 priority: int = 0) -> int:
        """Add a transfer of `words` from device `src` to device `dst`; returns its item number. Of the
        transfers waiting for a channel the lowest `priority` leaves first (ties: first ready, then item)."""
        if src == dst:
            raise InputError(f"a transfer needs two devices, got {src} -> {dst}")
        return self._add(None, src, dst, words, 1, 0, deps, priority)

    def transfers(self, pairs: list[tuple[int, int]], words: int, deps: list[tuple[int, ...]],
                  priority: int = 0) -> int:
        """`transfer(src, dst, words, deps[k], priority)` for each (src, dst) of `pairs` in turn, at once: the item
        number of the first (the others follow it). A collective's round (a ring all-reduce sends N at a time,
        ~10^5 per data-parallel run) is added without a call per transfer. The transfers of one call depend on
        none of each other."""
        n = len(self.names)
        count = len(pairs)
        if len(deps) != count:
            raise InputError(f"{count} transfers need {count} dependency lists, got {len(deps)}")
        for src, dst in pairs:
            if src == dst:
                raise InputError(f"a transfer needs two devices, got {src} -> {dst}")
        _check_earlier(n, [d for ds in deps for d in ds])
        return self.append_transfers(pairs, words, deps, priority)

    def append_transfers(self, pairs: list[tuple[int, int]], words: int, deps: list[tuple[int, ...]],
                         priority: int = 0) -> int:
        """`transfers` without its checks, for a builder whose transfers are valid by construction (one
        dependency tuple per pair, two devices each, earlier items): a ring all-reduce's rounds."""
        n = len(self.names)
        count = len(pairs)
        self.names.extend([None] * count)
        self.device.extend([src for src, _ in pairs])
        self.stream.extend([dst for _, dst in pairs])
        self.work.extend([words] * count)
        self.width.extend([1] * count)
        self.overhead.extend([0] * count)
        self.priority.extend([priority] * count)
        self.deps.extend(deps)
        return n

    def append_kernel(self, op: Op, device: int, work: int, deps: tuple[int, ...]) -> int:
        """`kernel(op, device, 0, work, 1, 0, deps)` without its checks, for a builder whose kernels are valid by
        construction (stream 0, work >= 0, `deps` earlier items): the data-parallel programs add ~10^5 a run."""
        n = len(self.names)
        self.names.append(op)
        self.device.append(device)
        self.stream.append(0)
        self.work.append(work)
        self.width.append(1)
        self.overhead.append(0)
        self.priority.append(0)
        self.deps.append(deps)
        return n

    def _add(self, name: Op | None, device: int, stream: int, work: int, width: int, overhead: int,
             deps: tuple[int, ...] | list[int], priority: int = 0) -> int:
        n = len(self.names)
        deps = tuple(deps)  # a repeated dependency is counted and released once per mention: harmless
        _check_earlier(n, deps)
        self.names.append(name)
        self.device.append(device)
        self.stream.append(stream)
        self.work.append(work)
        self.width.append(width)
        self.overhead.append(overhead)
        self.priority.append(priority)
        self.deps.append(deps)
        return n

    def is_transfer(self, i: int) -> bool:
        return self.names[i] is None


@dataclass(frozen=True)
class Timing:
    """Per item: start (a kernel's launch, a transfer's departure) and end (a kernel's end, a transfer's
    arrival)."""

    start: list[int]
    end: list[int]

    @property
    def total_cycles(self) -> int:
        return max(self.end, default=0)


def share_lanes(lanes: int, widths: list[int], streams: list[int]) -> list[int]:
    """The lane-sharing rule (module docstring): integer water-filling of `lanes` over kernels that can
    fill `widths[k]` lanes each, on streams `streams[k]`."""
    order = sorted(range(len(widths)), key=lambda k: (widths[k], streams[k], k))
    share = [0] * len(widths)
    left = lanes
    for n, k in enumerate(order):
        give = min(widths[k], left // (len(order) - n))
        share[k] = give
        left -= give
    for k in sorted(range(len(widths)), key=lambda k: (streams[k], k)):
        if left <= 0:
            break
        more = min(widths[k] - share[k], left)
        share[k] += more
        left -= more
    return share


def run_program(program: Program, interconnect: Interconnect = SHARED) -> Timing:
    """Start and end cycle of every item (see the module docstring for the rules).

    The data-parallel policies time ~10^5 items per run and dozens of runs per schedule (dp-ooo's choice of K),
    so the per-event work is kept small. An event is one int in the heap, its time above its running number
    (`order`, which breaks ties in the order events were made, as the reference's (time, order, ...) tuples
    do); what it is sits in `payload[order]` (item << 2 | kind) and, for a projected completion, `valid[order]`
    (its device's stamp). A kernel on a device of one stream computes alone, at min(width, lanes) lanes, so
    when its launch overhead is over its end is known: it gets a finish event at once, made where the shared
    rule's projected completion would be (the same time and running number), without the sharing books. The
    hot path (an item finishes, which readies its consumers, which launch or depart) is written out in the
    event loop rather than as calls. The rules, and so every start and end, are those of
    tests/stream_engine_reference.py (tests/test_stream_engine_identity.py)."""
    with gc_paused():  # the run builds a few lists per item and no cycles: collections would only walk them
        return _run(program, interconnect)


def _run(program: Program, interconnect: Interconnect) -> Timing:
    """`run_program`'s body."""
    n = program.num_items
    names, device, stream, work = program.names, program.device, program.stream, program.work
    overhead, width, lanes, priority = program.overhead, program.width, program.lanes, program.priority
    consumers: list[list[int]] = [[] for _ in range(n)]
    pending = [0] * n
    for i, deps in enumerate(program.deps):
        if deps:
            pending[i] = len(deps)
            for d in deps:
                consumers[d].append(i)
    is_kernel = [name is not None for name in names]
    alone = [s == 1 for s in program.streams]  # a device of one stream: its kernels never share lanes
    # Each stream's kernels in order; `qof[i]` numbers kernel i's stream (its queue), -1 for a transfer.
    queue_of: dict[tuple[int, int], int] = {}
    queues: list[list[int]] = []
    qof = [-1] * n
    for i in range(n):
        if is_kernel[i]:
            key = (device[i], stream[i])
            q = queue_of.get(key)
            if q is None:
                q = queue_of[key] = len(queues)
                queues.append([])
            queues[q].append(i)
            qof[i] = q
    head = [0] * len(queues)
    busy = [False] * len(queues)
    start = [-1] * n
    end = [-1] * n
    # Computing kernels per device of several streams: item → remaining MACs; shares as of `since[d]`.
    computing: list[dict[int, int]] = [{} for _ in lanes]
    share: list[dict[int, int]] = [{} for _ in lanes]
    since = [0] * len(lanes)
    stamp = [0] * len(lanes)
    num_devices = len(lanes)
    bus = interconnect.kind == "bus"
    shared = interconnect.is_shared
    latency = interconnect.latency
    # A transfer's channel (`Interconnect.channel`, numbered) and hold; -1 and 0 for a kernel.
    chan = [-1] * n
    hold = [0] * n
    holds: dict[int, int] = {}  # words → channel cycles
    if not shared:
        for i in range(n):
            if not is_kernel[i]:
                chan[i] = 0 if bus else device[i] * num_devices + stream[i]
                words = work[i]
                h = holds.get(words)
                if h is None:
                    h = holds[words] = interconnect.hold(words)
                hold[i] = h
    channel_free = [0] * (num_devices * num_devices)  # by channel: when it is free again
    # By channel: the transfers waiting for it, a (priority, ready time, item) heap.
    waiting_on: list[list[tuple[int, int, int]]] = [[] for _ in channel_free]
    # Events: kind 0 = an item finished, 1 = launch overhead over, 2 = a device's projected completion (valid
    # while its stamp is `valid[order]`), 3 = a channel is free. A kernel makes at most three events (its launch
    # and two projections: after its launch and after a completion, each of which ends a kernel), a transfer two.
    bound = 3 * n + 1
    shift = bound.bit_length()
    low = (1 << shift) - 1
    payload = [0] * bound
    valid = [0] * bound
    heap: list[int] = []
    order = 0
    heappush, heappop = heapq.heappush, heapq.heappop

    def settle(d: int, t: int) -> None:
        """Advance device d's computing kernels to t at their current shares."""
        dt = t - since[d]
        if dt:
            running = computing[d]
            for k, a in share[d].items():
                running[k] -= a * dt
        since[d] = t

    def reshare(d: int, t: int) -> None:
        nonlocal order
        running = computing[d]
        stamp[d] += 1
        if not running:
            share[d] = {}
            return
        if len(running) == 1:  # what share_lanes gives for one kernel
            (k,) = running
            a = min(width[k], lanes[d])
            share[d] = {k: a}
            nxt = t + max(0, -(-running[k] // a))
        else:
            kernels = list(running)
            got = share_lanes(lanes[d], [width[k] for k in kernels], [stream[k] for k in kernels])
            share[d] = dict(zip(kernels, got, strict=True))
            nxt = min(t + max(0, -(-running[k] // a)) for k, a in share[d].items() if a > 0)
        payload[order] = d << 2 | 2
        valid[order] = stamp[d]
        heappush(heap, nxt << shift | order)
        order += 1

    def launch(q: int, t: int) -> None:
        """Start stream q's next kernel if the stream is idle and the kernel's dependencies have finished."""
        nonlocal order
        if busy[q]:
            return
        items = queues[q]
        at = head[q]
        if at >= len(items):
            return
        i = items[at]
        if pending[i]:
            return
        busy[q] = True
        head[q] = at + 1
        start[i] = t
        payload[order] = i << 2 | 1
        heappush(heap, (t + overhead[i]) << shift | order)
        order += 1

    def depart(i: int, c: int, t: int) -> None:
        """Transfer i leaves on its free channel c at t: it arrives, and the channel frees, later."""
        nonlocal order
        h = hold[i]
        channel_free[c] = t + h
        start[i] = t
        payload[order] = i << 2
        heappush(heap, (t + h + latency) << shift | order)
        payload[order + 1] = c << 2 | 3
        heappush(heap, (t + h) << shift | (order + 1))
        order += 2

    def ready(i: int, t: int) -> None:
        """Item i's dependencies have all finished (at t)."""
        nonlocal order
        q = qof[i]
        if q >= 0:
            launch(q, t)
        elif shared:
            start[i] = t
            payload[order] = i << 2
            heappush(heap, t << shift | order)
            order += 1
        else:
            c = chan[i]
            waiting = waiting_on[c]
            if channel_free[c] <= t and not waiting:
                depart(i, c, t)
            else:  # the channel is busy: its free event takes the best waiting transfer
                heappush(waiting, (priority[i], t, i))

    for i in range(n):
        if not pending[i] and not is_kernel[i]:
            ready(i, 0)
    for q in range(len(queues)):
        launch(q, 0)
    while heap:
        event = heappop(heap)
        t = event >> shift
        what = payload[event & low]
        kind = what & 3
        item = what >> 2
        if kind == 0:
            finished: tuple[int, ...] | list[int] = (item,)
        elif kind == 1:
            if work[item] == 0:
                finished = (item,)
            elif alone[device[item]]:  # the projection the shared rule makes, as a finish event
                payload[order] = item << 2
                heappush(heap, (t - (-work[item] // min(width[item], lanes[device[item]]))) << shift | order)
                order += 1
                continue
            else:
                d = device[item]
                settle(d, t)
                computing[d][item] = work[item]
                reshare(d, t)
                continue
        elif kind == 3:
            waiting = waiting_on[item]
            if waiting and channel_free[item] <= t:
                depart(heappop(waiting)[2], item, t)
            continue
        elif valid[event & low] == stamp[item]:
            d = item
            settle(d, t)
            running = computing[d]
            finished = sorted(k for k, rem in running.items() if rem <= 0)
            for k in finished:
                del running[k]
            reshare(d, t)
        else:
            continue
        for i in finished:  # each ends at t: its consumers may be ready, its stream may launch the next
            end[i] = t
            q = qof[i]
            if q >= 0:
                busy[q] = False
            for j in consumers[i]:
                left = pending[j] - 1
                pending[j] = left
                if left:
                    continue
                qj = qof[j]
                if qj >= 0:  # `launch(qj, t)` written out: j is not necessarily its stream's next kernel
                    if busy[qj]:
                        continue
                    items = queues[qj]
                    at = head[qj]
                    k = items[at]  # j is in this queue, not launched yet, so `at` is in range
                    if pending[k]:
                        continue
                    busy[qj] = True
                    head[qj] = at + 1
                    start[k] = t
                    payload[order] = k << 2 | 1
                    heappush(heap, (t + overhead[k]) << shift | order)
                    order += 1
                elif shared:
                    start[j] = t
                    payload[order] = j << 2
                    heappush(heap, t << shift | order)
                    order += 1
                else:  # `ready(j, t)` for a transfer, written out
                    c = chan[j]
                    waiting = waiting_on[c]
                    if channel_free[c] <= t and not waiting:  # `depart(j, c, t)` written out
                        h = hold[j]
                        channel_free[c] = t + h
                        start[j] = t
                        payload[order] = j << 2
                        heappush(heap, (t + h + latency) << shift | order)
                        payload[order + 1] = c << 2 | 3
                        heappush(heap, (t + h) << shift | (order + 1))
                        order += 2
                    else:
                        heappush(waiting, (priority[j], t, j))
            if q >= 0:
                launch(q, t)
    if min(end, default=0) < 0:
        _deadlock(program, end, {key: queues[q] for key, q in queue_of.items()},
                  {key: head[q] for key, q in queue_of.items()})
    return Timing(start, end)


def _deadlock(program: Program, end: list[int], queues: dict[tuple[int, int], list[int]],
              head: dict[tuple[int, int], int]) -> None:
    parts = []
    for (d, s), items in sorted(queues.items()):
        if head[(d, s)] < len(items):
            i = items[head[(d, s)]]
            if end[i] >= 0:
                continue
            waits = [program.names[j] or f"transfer {j}" for j in program.deps[i] if end[j] < 0]
            parts.append(f"device {d} stream {s} blocked at {program.names[i]} waiting for "
                         + ", ".join(str(w) for w in waits))
    raise InputError("deadlock: " + ("; ".join(parts) or "transfers wait on each other"))


def placed_rows(program: Program, timing: Timing, row: list[int], num_rows: int,
                microbatches: int) -> tuple[OpSchedule, list[int]]:
    """The run's kernels as a synchronous schedule of `num_rows` rows (`row[i]` per kernel: a replica, or a
    stream of the one device), each row's ops in start order, with `microbatches` micro-batches a step; and
    the item number of each of its ops, rows in order (`layerpipe.sim._streams.sim_result` indexes by it)."""
    rows: list[list[tuple[int, int, Op]]] = [[] for _ in range(num_rows)]
    for i in range(program.num_items):
        op = program.names[i]
        if op is not None:
            rows[row[i]].append((timing.start[i], i, Op(row[i], op.kind, op.unit, op.iteration)))
    ordered = [sorted(r) for r in rows]
    items = [i for r in ordered for _, i, _ in r]
    schedule = OpSchedule("layer", tuple(tuple(op for _, _, op in r) for r in ordered), True, microbatches)
    return schedule, items


def cycles_per_iteration(program: Program, timing: Timing, row: list[int], num_rows: int,
                         microbatches: int) -> float:
    """The steady-state cycles per micro-batch of the run: `SimResult.cycles_per_iteration` of what
    `layerpipe.sim._streams.sim_result` makes of it (the same rows, completion times and slope rule,
    `layerpipe.schedule._engine`), without building the result — what the policies' figures are.

    The rows' op order does not enter these figures (completions are maxima, a row's busy cycles a sum), so no
    ops are placed (`placed_rows` makes an Op per kernel and sorts the rows, a third of a dp run's CPU outside
    the engine): the kernels' columns are read from the program, and only the busy sums take the rows' order
    (row, then start), so that their float additions are those of the placed rows. The figures are
    tests/stream_engine_reference.py's, from placed rows (tests/test_stream_engine_identity.py)."""
    names = program.names
    items = [i for i, op in enumerate(names) if op is not None]
    ops = [op for op in names if op is not None]
    count = len(items)
    iteration = np.fromiter((op.iteration for op in ops), np.int64, count)
    is_update = np.fromiter((op.kind == "U" for op in ops), bool, count)
    start = np.asarray([timing.start[i] for i in items], dtype=np.int64)
    end = np.asarray([timing.end[i] for i in items], dtype=np.int64)
    proc = np.fromiter((row[i] for i in items), np.int64, count)
    placed = np.lexsort((np.asarray(items, dtype=np.int64), start, proc))  # placed_rows' order
    busy = np.bincount(proc[placed], weights=(end - start)[placed], minlength=num_rows).astype(np.int64)
    total = int(end.max()) if count else 0
    counted = iteration[~is_update]  # a synchronous schedule's iterations leave its updates (steps) out
    iterations = 1 + (int(counted.max()) if len(counted) else -1)
    # The flags the rules read (synchronous, micro-batches a step, no groups, no unfolding), without the ops.
    flags = OpSchedule("layer", (), True, microbatches)
    group = np.ones(count, dtype=np.int64)
    return steady_cycles_per_iteration(flags, completion_times(flags, iteration, is_update, group, end),
                                       total, int(busy.max()) if len(busy) else 0, iterations)

"""Schedule → microcode compiler: what each processing element runs, and where its data lives.

Input: an MLP (`Linear` layers without bias, ReLU hidden, identity output, batch 1), its training graph, a
periodic schedule over N PEs, the PE width `lanes` and the sample capacity T_max. Output: a `Program` —
per PE a microcode ROM and a memory map — plus a deterministic text dump.

Microcode. A PE walks periods j = 0, 1, …; in each it visits its body entries in start order (the order
`PeriodicSchedule.unroll` gives, so the RTL runs exactly the op lists the simulator times). An entry with lag λ
runs iteration t = j − λ and is skipped when t < 0 or t ≥ T. A fused task (PipeDream's AEG) becomes one
`Entry` with several atomic `Step`s that run back to back. An entry waits for its incoming transfers of
iteration t (arrival counters > t), then starts; when its last step ends it queues its outgoing transfers,
one per (consumer op, link), in consumer program order — the simulator's `links` model.

Memory. Vectors and matrices are stored as words of `lanes` elements; a vector of n elements takes
⌈n/lanes⌉ words, a matrix n_out × n_in takes n_out rows of ⌈n_in/lanes⌉ words. Each PE has a vector memory
(samples x and y, activations a_l, deltas δ_l, errors e_l) and a matrix memory (weights W_l, stashed copies
S_l, gradients g_l). Per-iteration values are ring buffers: iteration t uses slot t mod depth. The depth
of a buffer is the number of iterations its producer can run ahead of its last reader, derived from the
lags: the shortest iteration distance d with reader(t) ⇝ producer(t + d) along program order and data
edges (all cycles of a valid schedule move forward in iterations, so d ≥ 1), rounded up to a power of two.
ReLU's mask uses a_l (a_l > 0 exactly when z_l > 0), so z_l needs no storage of its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat
from layerpipe.hdl._pe import MAX_DEPTH, MAX_DIM, MAX_LANES
from layerpipe.network import Network
from layerpipe.schedule import PeriodicSchedule, Slot

#: Policies whose schedules this hardware runs (asynchronous, layer-level, periodic).
SUPPORTED_POLICIES: tuple[str, ...] = ("layerpipe", "pipedream")
#: Weight modes the PE implements (`ema` needs a moving-average unit the PE does not have).
SUPPORTED_WEIGHT_MODES: tuple[str, ...] = ("stash", "latest")


@dataclass(frozen=True)
class HardwareLimits:
    """What one generated accelerator can hold; exceeding one is an `InputError` naming it.

    Defaults are the PE's own limits (`hdl/_pe.py`): operand dimensions, lanes, words per memory.
    """

    max_width: int = MAX_DIM
    max_lanes: int = MAX_LANES
    max_memory_words: int = MAX_DEPTH
    max_samples: int = 65536


DEFAULT_LIMITS = HardwareLimits()


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Buffer:
    """A region of one PE memory: `depth` slots of `slot_words` words.

    Vectors: iteration t uses slot t mod depth. Weights: slot v mod depth holds version v of W_l (a ring of
    versions: U_l(t) reads version t and writes version t+1, so stashing needs no copies).
    """

    name: str  #: value it holds: x, y, a3, d3 (δ), e2, W3, g3
    memory: str  #: "local" (bank 0), "samples" or "from<p>" (receive banks), "weights", "grads"
    base: int
    slot_words: int
    depth: int

    @property
    def words(self) -> int:
        return self.slot_words * self.depth

    def address(self, index: int) -> int:
        return self.base + (index % self.depth) * self.slot_words


@dataclass(frozen=True)
class Step:
    """One atomic operation (F, A, E, G or U) of layer `layer`: one PE command.

    Operands by kind (buffer names):
      F: x=a_{l-1} (x for layer 1), w=W_l, dst=a_l
      A: x=e_l, y=a_l (the ReLU mask) — output layer: x=a_L, y=target — dst=δ_l
      E: y=δ_l, w=W_l, dst=e_{l-1}
      G: x=a_{l-1}, y=δ_l, dst=g_l
      U: w=W_l, g=g_l, dst=W_l
    Weight versions: the op of iteration t reads version max(0, t + version) of W_l (U reads t, writes t+1).
    """

    kind: str
    layer: int
    n_in: int
    n_out: int
    relu: bool  #: hidden layer (ReLU) vs output layer (identity, loss derivative in A)
    x: str = ""
    y: str = ""
    w: str = ""
    g: str = ""
    dst: str = ""
    version: int = 0

    @property
    def rows(self) -> int:
        return 1 if self.kind == "A" else self.n_out

    @property
    def cols(self) -> int:
        return self.n_out if self.kind == "A" else self.n_in


@dataclass(frozen=True)
class Send:
    """After the producer ends: move `elements` from buffer `src` to buffer `dst` on PE `dest`.

    Arrival increments counter `counter` of the destination PE; `consumer` is the task waiting for it.
    """

    dest: int
    src: str
    dst: str
    elements: int
    counter: int
    consumer: str


@dataclass(frozen=True)
class Entry:
    """One task of the periodic body: runs iteration j − lag in period j."""

    kind: str
    layer: int
    lag: int
    start: int
    steps: tuple[Step, ...]
    waits: tuple[int, ...]  #: arrival counters of this PE that must exceed t before the entry starts
    sends: tuple[Send, ...]  #: in link-queue order (destination, then consumer program order)


@dataclass(frozen=True)
class PEProgram:
    index: int
    entries: tuple[Entry, ...]
    buffers: tuple[Buffer, ...]
    counters: tuple[str, ...]  #: incoming transfer streams, by counter index (names for the dump)
    queues: tuple[tuple[int, int], ...] = ()  #: (destination PE, link queue depth in producer ops)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def memory_words(self, memory: str) -> int:
        return sum(b.words for b in self.buffers if b.memory == memory)

    @property
    def memories(self) -> tuple[str, ...]:
        """Memories in PE order: local bank, receive banks (samples first, then by source PE), weights, grads."""
        recv = sorted({b.memory for b in self.buffers if b.memory.startswith("from")}, key=lambda m: int(m[4:]))
        samples = ("samples",) if any(b.memory == "samples" for b in self.buffers) else ()
        return ("local", *samples, *recv, "weights", "grads")

    @property
    def receive_banks(self) -> tuple[str, ...]:
        """Vector banks 1.. of the PE (bank 0 is "local")."""
        return tuple(m for m in self.memories if m == "samples" or m.startswith("from"))

    def bank(self, memory: str) -> int:
        return 0 if memory == "local" else 1 + self.receive_banks.index(memory)

    @property
    def senders(self) -> tuple[int, ...]:
        return tuple(q for q, _ in self.queues)

    def queue_depth(self, dest: int) -> int:
        return dict(self.queues)[dest]

    @property
    def max_lag(self) -> int:
        return max((e.lag for e in self.entries), default=0)


@dataclass(frozen=True)
class Program:
    """The compiled accelerator: one PE program per processor, plus the shapes every PE shares."""

    network: Network
    widths: tuple[int, ...]
    lanes: int
    max_samples: int
    period: int
    weight_mode: str
    pes: tuple[PEProgram, ...]
    fmt: FixedFormat = DEFAULT_FORMAT
    limits: HardwareLimits = field(default=DEFAULT_LIMITS, compare=False)

    @property
    def num_pes(self) -> int:
        return len(self.pes)

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    def owner(self, layer: int) -> int:
        """The PE that holds W_layer."""
        for pe in self.pes:
            if any(b.name == f"W{layer}" for b in pe.buffers):
                return pe.index
        raise KeyError(layer)

    def holder(self, value: str) -> int:
        """The PE whose sample bank holds `value` ("x" or "y")."""
        for pe in self.pes:
            if any(b.name == value and b.memory == "samples" for b in pe.buffers):
                return pe.index
        raise KeyError(value)

    def links(self) -> tuple[tuple[int, int], ...]:
        """Ordered PE pairs that carry data."""
        return tuple((pe.index, q) for pe in self.pes for q in pe.senders)

    def to_text(self) -> str:
        """The microcode and memory maps as text (deterministic: a pure function of the program)."""
        lines = [f"# layerpipe microcode v1 network={self.network.name} pes={self.num_pes} lanes={self.lanes} "
                 f"period={self.period} weight_mode={self.weight_mode} max_samples={self.max_samples} "
                 f"format=Q{self.fmt.total_bits - self.fmt.frac_bits}.{self.fmt.frac_bits}"]
        for pe in self.pes:
            lines.append(f"pe{pe.index}:")
            for mem in pe.memories:
                where = f" (bank {pe.bank(mem)})" if mem not in ("weights", "grads") else ""
                lines.append(f"  memory {mem}{where}: {pe.memory_words(mem)} words")
                for b in pe.buffers:
                    if b.memory == mem:
                        lines.append(f"    {b.name:<4} base={b.base:<6} slot_words={b.slot_words:<5} depth={b.depth}")
            for i, name in enumerate(pe.counters):
                lines.append(f"  counter {i}: {name}")
            for q, depth in pe.queues:
                lines.append(f"  link pe{pe.index}->pe{q}: queue depth {depth}")
            for i, e in enumerate(pe.entries):
                waits = ",".join(str(c) for c in e.waits) or "-"
                lines.append(f"  {i:>3}: {e.kind}{e.layer} lag={e.lag} start={e.start} waits={waits}")
                for s in e.steps:
                    ops = " ".join(f"{k}={v}" for k, v in (("x", s.x), ("y", s.y), ("w", s.w), ("g", s.g),
                                                           ("dst", s.dst)) if v)
                    version = f" version=t{s.version:+d}" if s.w else ""
                    lines.append(f"       {s.kind}{s.layer} {s.rows}x{s.cols}{' relu' if s.relu else ''} "
                                 f"{ops}{version}")
                for s in e.sends:
                    lines.append(f"       send {s.src}->pe{s.dest}.{s.dst} {s.elements} elements counter {s.counter} "
                                 f"for {s.consumer}")
        return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# Checks: what the hardware cannot run is rejected with one line naming the limit.


def mlp_widths(network: Network, fmt: FixedFormat = DEFAULT_FORMAT,
               limits: HardwareLimits = DEFAULT_LIMITS) -> tuple[int, ...]:
    """The widths n_0..n_L of an MLP the RTL can run, or `InputError` naming what it is not."""
    if network.batch != 1:
        raise InputError(f"the RTL trains with batch 1 (per-sample SGD), got --batch {network.batch}")
    if not network.is_chain:
        raise InputError(f"the RTL runs chains of fully connected layers; {network.name} is not a chain")
    last = network.layers[-1].index
    for layer in network.layers:
        if layer.kind != "linear":
            raise InputError(f"the RTL runs MLPs (linear layers only); layer '{layer.name}' is {layer.kind}")
        if layer.op.bias:  # type: ignore[union-attr]
            raise InputError(f"the RTL has no biases; layer '{layer.name}' has bias=true")
        want = "identity" if layer.index == last else "relu"
        if layer.activation != want:
            raise InputError(f"the RTL needs ReLU hidden layers and an identity output; layer '{layer.name}' "
                             f"has {layer.activation}")
    widths = (network.input_size, *(layer.out_size for layer in network.layers))
    for w in widths:
        if w > limits.max_width:
            raise InputError(f"layer width {w} exceeds the RTL limit of {limits.max_width} elements per "
                             "operand dimension")
    return widths


def check_lanes(lanes: int, limits: HardwareLimits = DEFAULT_LIMITS) -> int:
    if not isinstance(lanes, int) or isinstance(lanes, bool) or not 1 <= lanes <= limits.max_lanes:
        raise InputError(f"lanes must be an integer in 1..{limits.max_lanes}, got {lanes!r}")
    return lanes


def check_samples(samples: int, limits: HardwareLimits = DEFAULT_LIMITS) -> int:
    if not isinstance(samples, int) or isinstance(samples, bool) or not 1 <= samples <= limits.max_samples:
        raise InputError(f"samples must be an integer in 1..{limits.max_samples}, got {samples!r}")
    return samples


def _normalise(schedule: PeriodicSchedule) -> list[list[Slot]]:
    """Bodies with every start in [0, period), sorted in program order (as `unroll` orders ops)."""
    p = schedule.period
    bodies = []
    for body in schedule.bodies:
        slots = [Slot(s.start % p, s.kind, s.layer, s.lag + s.start // p) for s in body]
        bodies.append(sorted(slots, key=lambda s: (s.start, s.layer, s.kind)))
    return bodies


def _check_placement(graph: TrainingGraph, bodies: list[list[Slot]], policy: str) -> dict[int, int]:
    """Owner PE of each W_l; every task that reads or writes W_l (F, E, G, U) must run there."""
    where: dict[tuple[str, int], int] = {}
    for p, body in enumerate(bodies):
        for s in body:
            if (s.kind, s.layer) in where:
                raise InputError(f"task {s.kind}{s.layer} appears twice in the periodic schedule")
            where[(s.kind, s.layer)] = p
    for task in graph.tasks:
        if (task.kind, task.layer) not in where:
            raise InputError(f"the periodic schedule has no slot for task {task}")
    owner: dict[int, int] = {}
    for task in graph.tasks:
        if "F" in task.kind:
            owner[task.layer] = where[(task.kind, task.layer)]
    for task in graph.tasks:
        p = where[(task.kind, task.layer)]
        if any(k in task.kind for k in "EGU") and p != owner[task.layer]:
            raise InputError(f"policy {policy} places {task} away from W{task.layer}'s owner (PE "
                             f"{owner[task.layer]}); the RTL needs --keep-weights-together")
    return owner


# ----------------------------------------------------------------------------------------------------------
# Iteration distances (ring-buffer depths).


class _Distances:
    """Shortest iteration distances on the periodic happens-before graph.

    Nodes are tasks. Program order: entry i → entry i+1 of the same period moves from iteration j − λ_i to
    j − λ_{i+1} (weight λ_i − λ_{i+1}); the last entry → the first of the next period adds 1. Data edges
    (delay 0) have weight 0. dist(Y, X) = d means Y(t) ⇝ X(t + d).
    """

    def __init__(self, bodies: list[list[Slot]], data_edges: Sequence[tuple[tuple[str, int], tuple[str, int]]]):
        self.adj: dict[tuple[str, int], list[tuple[tuple[str, int], int]]] = {}
        for body in bodies:
            for i, s in enumerate(body):
                nxt = body[(i + 1) % len(body)]
                w = s.lag - nxt.lag + (1 if i + 1 == len(body) else 0)
                self.adj.setdefault((s.kind, s.layer), []).append(((nxt.kind, nxt.layer), w))
        for src, dst in data_edges:
            self.adj.setdefault(src, []).append((dst, 0))
        # Potentials (Johnson) make every edge weight non-negative so Dijkstra applies.
        nodes = list(self.adj)
        pot = dict.fromkeys(nodes, 0)
        for _ in range(len(nodes)):
            changed = False
            for u in nodes:
                for v, w in self.adj[u]:
                    if pot[u] + w < pot[v]:
                        pot[v] = pot[u] + w
                        changed = True
            if not changed:
                break
        else:
            raise InputError("the periodic schedule deadlocks: a dependency cycle does not advance an iteration")
        self.pot = pot
        self._cache: dict[tuple[str, int], dict[tuple[str, int], int]] = {}

    def __call__(self, src: tuple[str, int], dst: tuple[str, int]) -> int:
        if src not in self._cache:
            best = {src: 0}
            heap = [(0, src)]
            while heap:
                d, u = heapq.heappop(heap)
                if d > best[u]:
                    continue
                for v, w in self.adj.get(u, ()):
                    nd = d + w + self.pot[u] - self.pot[v]
                    if nd < best.get(v, 1 << 60):
                        best[v] = nd
                        heapq.heappush(heap, (nd, v))
            self._cache[src] = {v: d - self.pot[src] + self.pot[v] for v, d in best.items()}
        return self._cache[src].get(dst, 1 << 30)


class _UnrolledDistances:
    """Iteration distances that also hold in the prologue, where the steady-state paths may not exist.

    A steady-state path Y(t) ⇝ X(t + d) can pass through ops of iterations < 0, which are skipped: early in
    a run the producer can then run further ahead than d. So the distance is also measured on the unrolled
    op graph of the first `window` iterations (program order of every PE, data edges of existing ops): for
    each t, the smallest iteration of X reachable from Y(t). Where none is reachable the producer is not
    held back at all, and the depth must cover every later iteration of the window. The result is the
    larger of the two, so ring slots are never rewritten before their readers end, whatever the timing.
    """

    def __init__(self, bodies: list[list[Slot]], data_edges: Sequence[tuple[TaskKey, TaskKey]], steady: _Distances,
                 samples: int) -> None:
        self.steady = steady
        max_lag = max((s.lag for body in bodies for s in body), default=0)
        horizon = 4 * (max_lag + 2) + 16
        self.window = min(samples, horizon)
        self.exact = samples <= horizon  # the window is the whole run
        # Ops of each PE in program order; node = (task, t).
        self.succ: dict[tuple[TaskKey, int], list[tuple[TaskKey, int]]] = {}
        order: list[tuple[TaskKey, int]] = []
        for body in bodies:
            prev = None
            for j in range(self.window + max_lag):
                for slot in body:
                    t = j - slot.lag
                    if 0 <= t < self.window:
                        node = ((slot.kind, slot.layer), t)
                        self.succ[node] = []
                        if prev is not None:
                            self.succ[prev].append(node)
                        prev = node
        for src, dst in data_edges:
            for t in range(self.window):
                if (src, t) in self.succ and (dst, t) in self.succ:
                    self.succ[(src, t)].append((dst, t))
        indegree = dict.fromkeys(self.succ, 0)
        for outs in self.succ.values():
            for n in outs:
                indegree[n] += 1
        ready = [n for n, k in indegree.items() if k == 0]
        while ready:
            n = ready.pop()
            order.append(n)
            for m in self.succ[n]:
                indegree[m] -= 1
                if indegree[m] == 0:
                    ready.append(m)
        if len(order) != len(self.succ):
            raise InputError("the periodic schedule deadlocks in its first iterations (a dependency cycle)")
        self.order = order
        self._reach: dict[TaskKey, dict[tuple[TaskKey, int], int]] = {}

    def _min_reach(self, target: TaskKey) -> dict[tuple[TaskKey, int], int]:
        """For every op, the smallest iteration of `target` reachable from it (itself included)."""
        if target not in self._reach:
            inf = 1 << 30
            best: dict[tuple[TaskKey, int], int] = {}
            for node in reversed(self.order):
                here = node[1] if node[0] == target else inf
                best[node] = min([here, *(best[m] for m in self.succ[node])])
            self._reach[target] = best
        return self._reach[target]

    def __call__(self, reader: TaskKey, producer: TaskKey) -> int:
        d = self.steady(reader, producer)
        reach = self._min_reach(producer)
        # Without the whole run in the window, its last iterations lack the paths a longer run has.
        last = self.window if self.exact else self.window // 2
        for t in range(last):
            r = reach.get((reader, t))
            if r is None:
                continue
            d = max(d, r - t if r < (1 << 30) else self.window - t)
        return d


# ----------------------------------------------------------------------------------------------------------
# The compiler.


TaskKey = tuple[str, int]


def compile_schedule(network: Network, graph: TrainingGraph, schedule: PeriodicSchedule, lanes: int,
                     max_samples: int, *, policy: str = "the schedule", fmt: FixedFormat = DEFAULT_FORMAT,
                     limits: HardwareLimits = DEFAULT_LIMITS) -> Program:
    """Compile a periodic schedule of `network` into per-PE microcode and memory maps."""
    widths = mlp_widths(network, fmt, limits)
    check_lanes(lanes, limits)
    check_samples(max_samples, limits)
    mode = graph.options.weight_mode
    if mode not in SUPPORTED_WEIGHT_MODES:
        raise InputError(f"weight mode '{mode}' is not supported by the RTL; supported: "
                         f"{', '.join(SUPPORTED_WEIGHT_MODES)}")
    bodies = _normalise(schedule)
    owner = _check_placement(graph, bodies, policy)
    num_layers = len(widths) - 1
    pe_of = {(s.kind, s.layer): p for p, body in enumerate(bodies) for s in body}
    slot_of = {(s.kind, s.layer): s for body in bodies for s in body}
    index_of = {(s.kind, s.layer): i for body in bodies for i, s in enumerate(body)}
    task_with = {(t.layer, a): (t.kind, t.layer) for t in graph.tasks for a in t.kind}

    def task(layer: int, atomic: str) -> TaskKey:
        return task_with[(layer, atomic)]

    # Cross-PE transfers: one per (producer task, consumer task) pair, as the simulator counts them.
    transfers: dict[tuple[TaskKey, TaskKey], int] = {}
    data_edges: list[tuple[TaskKey, TaskKey]] = []
    for e in graph.edges:
        if e.role in ("weights", "stash"):
            continue  # version reads: same PE, ordered by the program
        src, dst = (e.src.kind, e.src.layer), (e.dst.kind, e.dst.layer)
        data_edges.append((src, dst))
        if pe_of[src] != pe_of[dst] and e.role != "gradient":
            if (src, dst) in transfers:
                raise InputError(f"tasks {src[0]}{src[1]} and {dst[0]}{dst[1]} exchange two values on different "
                                 "PEs; the RTL sends one vector per transfer")
            transfers[(src, dst)] = e.words
    dist = _UnrolledDistances(bodies, data_edges, _Distances(bodies, data_edges), max_samples)

    # Vector values: name → (producer task or None for a sample, elements, reader tasks).
    values: dict[str, tuple[TaskKey | None, int, list[TaskKey]]] = {
        "x": (None, widths[0], [task(1, "F"), task(1, "G")]),
        "y": (None, widths[-1], [task(num_layers, "A")]),
    }
    for layer in range(1, num_layers + 1):
        readers = [task(layer, "A")]  # the ReLU mask, or the loss input of the output layer
        if layer < num_layers:
            readers += [task(layer + 1, "F"), task(layer + 1, "G")]
        values[f"a{layer}"] = (task(layer, "F"), widths[layer], readers)
        values[f"d{layer}"] = (task(layer, "A"), widths[layer],
                               [task(layer, "E"), task(layer, "G")] if layer > 1 else [task(layer, "G")])
        if layer > 1:
            values[f"e{layer - 1}"] = (task(layer, "E"), widths[layer - 1], [task(layer - 1, "A")])

    sample_depth = _pow2_at_least(max_samples)
    programs = []
    for p, body in enumerate(bodies):
        buffers: list[Buffer] = []

        def add(name: str, memory: str, slot_words: int, depth: int, buffers: list[Buffer] = buffers) -> None:
            base = sum(b.words for b in buffers if b.memory == memory)
            buffers.append(Buffer(name, memory, base, slot_words, depth))

        for name, (prod, elements, readers) in values.items():
            words = ceil_div(elements, lanes)
            if prod is None:
                if any(pe_of[r] == p for r in readers):
                    add(name, "samples", words, sample_depth)
                continue
            if pe_of[prod] == p:
                # Read here and by the transfers from here (done before their consumers start).
                add(name, "local", words, _pow2_at_least(max(dist(r, prod) for r in readers)))
            elif any(pe_of[r] == p for r in readers):
                local = [r for r in readers if pe_of[r] == p]
                add(name, f"from{pe_of[prod]}", words, _pow2_at_least(max(dist(r, prod) for r in local)))
        versions: dict[int, dict[str, int]] = {}
        for layer in range(1, num_layers + 1):
            if owner[layer] != p:
                continue
            matrix_words = widths[layer] * ceil_div(widths[layer - 1], lanes)
            versions[layer] = offsets = _version_offsets(body, layer, task, mode)
            add(f"W{layer}", "weights", matrix_words, _pow2_at_least(offsets["ring"]))
            # U is always its own task, so g_l is kept from G_l(t) to U_l(t).
            add(f"g{layer}", "grads", matrix_words, _pow2_at_least(dist(task(layer, "U"), task(layer, "G"))))
        for memory in sorted({b.memory for b in buffers}):
            used = sum(b.words for b in buffers if b.memory == memory)
            if used > limits.max_memory_words:
                raise InputError(f"PE {p} needs {used} words of {memory} memory, beyond the RTL limit of "
                                 f"{limits.max_memory_words} words; use fewer --samples, more lanes or more PEs")
        counters = sorted(((src, dst) for (src, dst) in transfers if pe_of[dst] == p),
                          key=lambda sd: (index_of[sd[1]], pe_of[sd[0]], sd))
        entries = []
        for s in body:
            key = (s.kind, s.layer)
            steps = tuple(_step(atomic, s.layer, widths, versions[s.layer]) if atomic != "A" else
                          _step(atomic, s.layer, widths, {}) for atomic in s.kind)
            waits = tuple(i for i, (_, dst) in enumerate(counters) if dst == key)
            entries.append(Entry(s.kind, s.layer, s.lag, s.start, steps, waits, ()))
        programs.append((p, entries, buffers, counters))

    # Sends name the destination's counters, so they are filled in once every PE is laid out.
    counter_at = {p: {sd: i for i, sd in enumerate(c)} for p, _, _, c in programs}
    result = []
    for p, entries, buffers, counters in programs:
        final = []
        need: dict[int, dict[TaskKey, int]] = {}
        for e in entries:
            key = (e.kind, e.layer)
            outs = [(src, dst) for (src, dst) in transfers if src == key]
            # Link queue order for one producer: consumer PE, then consumer program order (lag, then index).
            outs.sort(key=lambda sd: (pe_of[sd[1]], slot_of[sd[1]].lag, index_of[sd[1]]))
            sends = []
            for src, dst in outs:
                value = _value_sent(src, dst)
                sends.append(Send(pe_of[dst], value, value, transfers[(src, dst)], counter_at[pe_of[dst]][(src, dst)],
                                  f"{dst[0]}{dst[1]}"))
                # The queue item of this op stays until its last transfer arrives, before its consumer
                # starts; the op d iterations later cannot end before that consumer has run.
                per = need.setdefault(pe_of[dst], {})
                per[key] = max(per.get(key, 1), dist(dst, src))
            final.append(Entry(e.kind, e.layer, e.lag, e.start, e.steps, e.waits, tuple(sends)))
        queues = tuple((q, _pow2_at_least(sum(per.values()))) for q, per in sorted(need.items()))
        names = tuple(f"{s[0]}{s[1]}->{d[0]}{d[1]}" for s, d in counters)
        result.append(PEProgram(p, tuple(final), tuple(buffers), names, queues))
    return Program(network, widths, lanes, max_samples, schedule.period, mode, tuple(result), fmt, limits)


def _value_sent(src: TaskKey, dst: TaskKey) -> str:
    """The vector a transfer between two tasks carries (MLP edges: one value per task pair)."""
    kind, layer = src
    if "F" in kind:
        return f"a{layer}"  # activation to F_{l+1}/G_{l+1}, the mask a_l or the output a_L to A_l
    if "E" in kind and dst[1] == layer - 1:
        return f"e{layer - 1}"  # error to the layer below
    if "A" in kind:
        return f"d{layer}"  # δ_l to E_l / G_l
    raise AssertionError(f"no vector travels {src} -> {dst}")


def _version_offsets(body: list[Slot], layer: int, task: Callable[[int, str], TaskKey], mode: str) -> dict[str, int]:
    """Which version of W_layer F and E of iteration t read, and how many versions must be kept.

    On the owner PE the program order fixes the versions: the op of iteration t at program position
    (t + λ, i) follows the updates U(t') with (t' + λ_U, i_U) < (t + λ, i), i.e. t' < t + λ − λ_U + [i_U < i],
    so it reads version max(0, t + c) with c = λ − λ_U + [i_U < i]. Under `stash` E reads F's version; the
    ring keeps c_E − c_F + 1 versions (the ones written between F(t) and E(t), plus F's).
    """
    pos = {(s.kind, s.layer): (s.lag, i) for i, s in enumerate(body)}
    lag_u, i_u = pos[task(layer, "U")]

    def offset(key: TaskKey) -> int:
        lag, i = pos[key]
        return lag - lag_u + (1 if i_u < i else 0)

    c_f = offset(task(layer, "F"))
    if c_f > 0:
        raise InputError(f"F{layer} runs after U{layer} of its own iteration; the schedule is invalid")
    if layer == 1:
        return {"F": c_f, "ring": 1}
    c_e = offset(task(layer, "E"))
    if mode == "latest":
        return {"F": c_f, "E": c_e, "ring": 1}
    return {"F": c_f, "E": c_f, "ring": c_e - c_f + 1}


def _step(atomic: str, layer: int, widths: Sequence[int], versions: dict[str, int]) -> Step:
    n_in, n_out = widths[layer - 1], widths[layer]
    hidden = layer < len(widths) - 1
    below = f"a{layer - 1}" if layer > 1 else "x"
    if atomic == "F":
        return Step("F", layer, n_in, n_out, hidden, x=below, w=f"W{layer}", dst=f"a{layer}", version=versions["F"])
    if atomic == "A":
        if hidden:
            return Step("A", layer, n_in, n_out, hidden, x=f"e{layer}", y=f"a{layer}", dst=f"d{layer}")
        return Step("A", layer, n_in, n_out, hidden, x=f"a{layer}", y="y", dst=f"d{layer}")
    if atomic == "E":
        return Step("E", layer, n_in, n_out, hidden, y=f"d{layer}", w=f"W{layer}", dst=f"e{layer - 1}",
                    version=versions["E"])
    if atomic == "G":
        return Step("G", layer, n_in, n_out, hidden, x=below, y=f"d{layer}", dst=f"g{layer}")
    if atomic == "U":
        return Step("U", layer, n_in, n_out, hidden, w=f"W{layer}", g=f"g{layer}", dst=f"W{layer}")
    raise AssertionError(atomic)

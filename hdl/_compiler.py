"""Schedule → microcode compiler: what each processing element runs, and where its data lives.

Input: an MLP (`Linear` layers without bias, ReLU hidden, identity output, micro-batch B), its training graph, a
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

from collections.abc import Sequence
from dataclasses import dataclass, replace

from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat
from layerpipe.hdl._conv import check_window_layer, copy_window, matrix_shape, window_of
from layerpipe.hdl._distances import DataEdge, Distances, TaskKey, UnrolledDistances
from layerpipe.hdl._program import (
    DEFAULT_LIMITS,
    Buffer,
    Entry,
    HardwareLimits,
    PEProgram,
    Program,
    Send,
    Step,
    ceil_div,
    pow2_at_least,
)
from layerpipe.hdl._split import SplitShapes, split_shapes
from layerpipe.network import Network
from layerpipe.schedule import PeriodicSchedule, Slot

#: Policies whose schedules this hardware runs (asynchronous, layer-level, periodic).
SUPPORTED_POLICIES: tuple[str, ...] = ("layerpipe", "pipedream")
#: Weight modes the PE implements (`ema` needs a moving-average unit the PE does not have).
SUPPORTED_WEIGHT_MODES: tuple[str, ...] = ("stash", "latest")


# ----------------------------------------------------------------------------------------------------------
# Checks: what the hardware cannot run is rejected with one line naming the limit.


def mlp_widths(network: Network, fmt: FixedFormat = DEFAULT_FORMAT,
               limits: HardwareLimits = DEFAULT_LIMITS) -> tuple[int, ...]:
    """The widths n_0..n_L of an MLP the RTL can run, or `InputError` naming what it is not."""
    if not 1 <= network.batch <= limits.max_batch:
        raise InputError(f"--batch {network.batch} is beyond the RTL's micro-batch limit of {limits.max_batch} samples "
                         "per op (the command's batch field)")
    if not network.is_chain and network.origin is None:  # a split variant's structure: `hdl/_split.py`
        raise InputError(f"the RTL runs chains of layers (linear, conv2d, pooling, flatten); {network.name} is not "
                         "a chain")
    last = network.layers[-1].index
    for layer in network.layers:
        if layer.kind != "linear":
            check_window_layer(layer, layer.index == last)
            if not layer.has_weights:
                continue
        if layer.op.bias:  # type: ignore[union-attr]
            raise InputError(f"the RTL has no biases; layer '{layer.name}' has bias=true")
        want = "identity" if layer.index == last else "relu"
        if layer.activation != want:
            raise InputError(f"the RTL needs ReLU hidden layers and an identity output; layer '{layer.name}' "
                             f"has {layer.activation}")
    widths = (network.input_size, *(layer.out_size for layer in network.layers))
    shapes = [matrix_shape(layer) for layer in network.layers if layer.has_weights]
    for w in (*widths, *(n for shape in shapes for n in shape)):
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
    """Owner PE of each W_l: the PE running U_l, which keeps the master ring of versions.

    Atomic F, E and G tasks may run anywhere (weights and gradients are streamed); a fused task that reads W_l
    or produces g_l (PipeDream's AEG, the ablations' AE/EG) must run on the owner, because the PE streams
    whole values between atomic tasks only.
    """
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
        if "U" in task.kind:
            if task.kind != "U":
                raise InputError(f"task {task} fuses U with other work; the RTL runs U as its own task")
            owner[task.layer] = where[(task.kind, task.layer)]
    for task in graph.tasks:
        p = where[(task.kind, task.layer)]
        if len(task.kind) > 1 and any(k in task.kind for k in "FEG") and p != owner[task.layer]:
            raise InputError(f"policy {policy} places fused task {task} on PE {p}, away from W{task.layer}'s owner "
                             f"(PE {owner[task.layer]}, which runs U{task.layer}); the RTL streams weights and "
                             "gradients only to atomic F, E and G tasks (--keep-weights-together)")
    return owner


# ----------------------------------------------------------------------------------------------------------
# The compiler.


@dataclass(frozen=True)
class _Transfer:
    """A cross-PE dependency the simulator times as one transfer per (producer op, consumer op)."""

    words: int
    delay: int  #: consumer iteration − producer iteration
    kind: str  #: vector, gradient (g_l to U_l's PE), weights (a version from U_l), stash (F_l's version to E_l)


def compile_program(network: Network, graph: TrainingGraph, schedule: PeriodicSchedule, lanes: int,
                     max_samples: int, *, policy: str = "the schedule", fmt: FixedFormat = DEFAULT_FORMAT,
                     limits: HardwareLimits = DEFAULT_LIMITS, sample_depth: int | None = None) -> Program:
    """Compile a periodic schedule of `network` into per-PE microcode and memory maps.

    Any placement of the atomic F, A, E, G, U tasks compiles (the owner of W_l is the PE running U_l). Values
    cross PEs exactly where the simulator's dependencies (`layerpipe.schedule._deps`) put a transfer:
    vectors; g_l from G_l's PE to the owner; a weight version from U_l(i) to every F_l / E_l reader elsewhere,
    as pinned by the schedule's timing (`PeriodicSchedule.read_staleness`: X_l(t) reads version t − s, sent
    by U_l(t − s − 1)); under `stash`, F_l(t)'s version to E_l(t) when they run on different PEs.
    `sample_depth` (a power of two): slots of the x / y sample rings, which the host refills during the run
    (hdl/_host.py); None keeps all `max_samples` iterations on chip.
    """
    widths = mlp_widths(network, fmt, limits)
    check_lanes(lanes, limits)
    shapes = split_shapes(network, lanes)
    check_samples(max_samples, limits)
    batch = network.batch
    mode = graph.options.weight_mode
    if mode not in SUPPORTED_WEIGHT_MODES:
        raise InputError(f"weight mode '{mode}' is not supported by the RTL; supported: "
                         f"{', '.join(SUPPORTED_WEIGHT_MODES)}")
    if getattr(schedule, "unfold", 1) != 1 or getattr(schedule, "groups", ()):
        raise InputError(f"policy {policy} emitted an unfolded schedule ({getattr(schedule, 'unfold', 1)} iterations "
                         "per period or grouped updates); the RTL runs one iteration per period")
    bodies = _normalise(schedule)
    owner = _check_placement(graph, bodies, policy)
    num_layers = len(widths) - 1
    weighted = [layer.index for layer in network.layers if layer.has_weights]
    matrix = {index: matrix_shape(network.layer(index)) for index in weighted}
    pe_of = {(s.kind, s.layer): p for p, body in enumerate(bodies) for s in body}
    slot_of = {(s.kind, s.layer): s for body in bodies for s in body}
    index_of = {(s.kind, s.layer): i for body in bodies for i, s in enumerate(body)}
    task_with = {(t.layer, a): (t.kind, t.layer) for t in graph.tasks for a in t.kind}
    pinned = {(kind, layer): stale for kind, layer, stale in schedule.read_staleness()}

    def task(layer: int, atomic: str) -> TaskKey:
        return task_with[(layer, atomic)]

    def name(key: TaskKey) -> str:
        return f"{key[0]}{key[1]}"

    # Cross-PE transfers: one per (producer task, consumer task) pair, as the simulator counts them.
    transfers: dict[tuple[TaskKey, TaskKey], _Transfer] = {}
    data_edges: list[DataEdge] = []

    def add_transfer(src: TaskKey, dst: TaskKey, transfer: _Transfer) -> None:
        if (src, dst) in transfers:
            raise InputError(f"tasks {name(src)} and {name(dst)} exchange two values on different PEs; the RTL "
                             "sends one value per transfer")
        transfers[(src, dst)] = transfer

    for e in graph.edges:
        if e.role == "weights":
            continue  # version reads: pinned below
        src, dst = (e.src.kind, e.src.layer), (e.dst.kind, e.dst.layer)
        data_edges.append((src, dst, 0))
        if pe_of[src] != pe_of[dst]:
            add_transfer(src, dst, _Transfer(e.words, 0, {"gradient": "gradient", "stash": "stash"}.get(e.role,
                                                                                                      "vector")))
    readers = {layer: [(t.kind, t.layer) for t in graph.tasks if t.layer == layer and "U" not in t.kind
                       and ("F" in t.kind or "E" in t.kind)] for layer in weighted}
    # Version reads are the graph's weight edges (U_l → F_l; U_l → E_l under `latest`; under `stash` E_l gets
    # F_l's version over the stash edge instead).
    versioned = {(e.dst.kind, e.dst.layer) for e in graph.edges if e.role == "weights"}
    for layer in weighted:
        u = task(layer, "U")
        for key in readers[layer]:
            if key not in versioned:
                continue
            if key not in pinned:
                if pe_of[key] != owner[layer]:
                    raise InputError(f"task {name(key)} runs on PE {pe_of[key]}, away from W{layer}'s owner PE "
                                     f"{owner[layer]}, but the schedule pins no version for it (a periodic schedule "
                                     "without task costs); the RTL needs the versions to stream")
                continue
            delay = pinned[key] + 1
            if delay < 0:
                raise InputError(f"task {name(key)} reads W{layer} before U{layer} of its own iteration wrote it "
                                 f"(staleness {pinned[key]}); the schedule is invalid")
            data_edges.append((u, key, delay))
            if pe_of[key] != owner[layer]:
                add_transfer(u, key, _Transfer(matrix[layer][0] * matrix[layer][1], delay, "weights"))
    for (src, dst), tr in transfers.items():
        n_in = matrix[src[1]][1] if tr.kind != "vector" else 0
        if tr.kind != "vector" and shapes.cols[src[1] - 1] != network.layer(src[1]).in_size:
            raise InputError(f"task {name(dst)} on PE {pe_of[dst]} needs a matrix of layer {src[1]} from {name(src)} "
                             f"on PE {pe_of[src]}, whose columns are a split layer's parts padded to whole words: its "
                             "transfer would take more link beats than the rtl interconnect's ⌈words/lanes⌉; use "
                             "--keep-weights-together")
        if tr.kind == "vector" and batch > 1 and (tr.words // batch) % lanes:
            per = tr.words // batch
            raise InputError(f"task {name(dst)} on PE {pe_of[dst]} receives a vector of {per} elements per sample "
                             f"from {name(src)} on PE {pe_of[src]}: with --batch {batch} its samples, each padded to "
                             f"whole words, take more link beats than the rtl interconnect's ⌈words/lanes⌉; use "
                             f"--lanes dividing {per} or --batch 1")
        if tr.kind != "vector" and n_in % lanes:
            what = {"gradient": f"g{src[1]}", "weights": f"a version of W{src[1]}", "stash": f"W{src[1]}"}[tr.kind]
            raise InputError(f"task {name(dst)} on PE {pe_of[dst]} needs {what} from {name(src)} on PE {pe_of[src]}, "
                             f"but W{src[1]} has {n_in} columns, not a multiple of --lanes {lanes}: its padded rows "
                             f"take more link beats than the rtl interconnect's ⌈words/lanes⌉; use --lanes dividing "
                             f"{n_in} or --keep-weights-together")
    dist = UnrolledDistances(bodies, data_edges, Distances(bodies, data_edges), max_samples)

    # Weight reads: which buffer and version of W_l each F / E step reads on its PE.
    def program_offset(key: TaskKey, layer: int) -> int:
        """Version offset c (reads max(0, t + c)) of a reader on the owner PE, from program order."""
        u = slot_of[task(layer, "U")]
        x = slot_of[key]
        return x.lag - u.lag + (1 if index_of[task(layer, "U")] < index_of[key] else 0)

    def version_offset(key: TaskKey, layer: int) -> int:
        # The schedule's pin (the simulator's version rule); on the owner it equals the program order's.
        return -pinned[key] if key in pinned else program_offset(key, layer)

    def weight_read(layer: int, atomic: str, p: int) -> tuple[str, int]:
        """(buffer, slot offset) that step `atomic` (F or E) of W_layer's reader on PE p reads."""
        f_key = task(layer, "F")
        ring = f"W{layer}" if p == owner[layer] else f"C{layer}"
        if atomic == "F":
            offset = version_offset(f_key, layer)
            if offset > 0:
                raise InputError(f"F{layer} runs after U{layer} of its own iteration; the schedule is invalid")
            return ring, offset
        e_key = task(layer, "E")
        if mode == "latest":
            return ring, version_offset(e_key, layer)
        if pe_of[f_key] == p:
            return weight_read(layer, "F", p)  # stash: the version F_l(t) read, still in the same ring
        return f"S{layer}", 0  # stash: F_l(t)'s version, received from F_l's PE

    need: dict[tuple[int, str], int] = {}  # (PE, weight buffer) → iterations its slots must survive

    def require(p: int, buf: str, depth: int) -> None:
        need[(p, buf)] = max(need.get((p, buf), 1), depth)

    def require_version(p: int, buf: str, reader: TaskKey, layer: int, offset: int) -> None:
        # Version v = t + offset of reader(t) is overwritten when version v + depth arrives (written by, or
        # sent after, U(v + depth − 1)): reader(t) ⇝ U(t + offset + depth − 1) must hold.
        require(p, buf, dist.versions(reader, task(layer, "U"), offset))

    reads: dict[tuple[TaskKey, str], tuple[str, int]] = {}
    for layer in weighted:
        for key in readers[layer]:
            p = pe_of[key]
            for atomic in key[0]:
                if atomic in "FE":
                    buf, offset = reads[(key, atomic)] = weight_read(layer, atomic, p)
                    if buf.startswith("S"):
                        require(p, buf, dist(key, task(layer, "F")))
                    else:
                        require_version(p, buf, key, layer, offset)
    for (src, dst), tr in transfers.items():
        layer = src[1]
        if tr.kind == "weights":  # sourced from the master ring at version t + 1, read as version t_X − s
            require_version(owner[layer], f"W{layer}", dst, layer, -pinned[dst])
        elif tr.kind == "stash":  # sourced from the ring F read, at F's version
            buf, offset = reads[(src, "F")]
            require_version(pe_of[src], buf, dst, layer, offset)

    # Vector operands: each step reads a vector where the DFG edge into it puts it. `source` is that edge's
    # producer (None: a sample); on the reader's PE the value is local (bank 0, written by its producer), in the
    # sample bank, or received from the producer's PE (buffer `v@q` in bank from<q>). F_l passes its input
    # a_{l-1} on to G_l (the DFG's F_l → G_l edge), from wherever F_l reads it.
    # A split layer's parts (`hdl/_split.py`): the consumer c's input is the concatenation a<first>-<last> in
    # bank 0 of F_c's PE ("written" by the sentinel ("cat", c): the parts write their views of it), c's E
    # writes e<first>-<last> there, whose views e<i> the parts' A read.
    produced: dict[str, TaskKey] = {}
    order = ["x", "y"]
    for layer in range(1, num_layers + 1):
        produced[f"a{layer}"] = task(layer, "F")
        order.append(f"a{layer}")
        if layer in matrix:
            produced[f"d{layer}"] = task(layer, "A")
            order.append(f"d{layer}")
        elif _is_max_pool(network, layer):
            produced[f"m{layer}"] = task(layer, "F")
            order.append(f"m{layer}")
        if shapes.inputs[layer - 1] != (0,):
            produced[shapes.error_value(layer)] = task(layer, "E")
            order.append(shapes.error_value(layer))
            if shapes.is_cat(layer):
                order.append(shapes.input_value(layer))
                for part, _, _ in shapes.segments[layer]:
                    produced[f"e{part}"] = task(layer, "E")
                    order.append(f"e{part}")

    def view_region(p: int, buf: str) -> tuple[str, int] | None:
        """(region, word offset) when `buf` on PE p is a part's slice of a concatenation held there."""
        value = buf.split("@")[0]
        if value[0] not in "ae" or "-" in value or not value[1:].isdigit():
            return None
        part = shapes.part_of(int(value[1:]))
        if part is None:
            return None
        c, offset, _ = part
        if value[0] == "a" and pe_of[task(c, "F")] == p:
            return shapes.input_value(c), offset
        if value[0] == "e" and "@" not in buf and pe_of[task(c, "E")] == p:
            return shapes.error_value(c), offset
        return None

    def partials(layer: int) -> list[tuple[TaskKey, str]]:
        """The partial errors of `layer` when its consumer is a split layer: (E of each part, its value)."""
        readers_of = shapes.consumers[layer - 1]
        return [(task(c, "E"), shapes.error_value(c)) for c in readers_of] if len(readers_of) > 1 else []

    def source(atomic: str, layer: int, which: str) -> tuple[TaskKey | None, str]:
        below = shapes.input_value(layer)
        ins = shapes.inputs[layer - 1]
        if atomic == "F":
            if len(ins) > 1:
                return ("cat", layer), below
            return (task(ins[0], "F") if ins != (0,) else None), below
        if atomic == "G":
            return (task(layer, "F"), below) if which == "x" else (task(layer, "A"), f"d{layer}")
        if atomic == "E" and layer not in matrix:  # pooling, flatten: e_l, and max pooling's argmax mask
            return (task(layer + 1, "E"), f"e{layer}") if which == "x" else (task(layer, "F"), f"m{layer}")
        if atomic == "E":
            return task(layer, "A"), f"d{layer}"
        if layer < num_layers:  # A of a hidden layer: e_l (from its consumer's E) and the mask a_l
            if which == "x" and partials(layer):
                return partials(layer)[0]
            consumer = shapes.consumer[layer - 1]
            return (task(consumer, "E"), f"e{layer}") if which == "x" else (task(layer, "F"), f"a{layer}")
        return (task(layer, "F"), f"a{layer}") if which == "x" else (None, "y")

    def location(p: int, producer: TaskKey | None, value: str) -> str:
        if producer is None:
            return value
        if producer[0] == "cat":  # the concatenation lives where its consumer's F runs
            return value
        if pe_of[producer] != p:
            return f"{value}@{pe_of[producer]}"
        if produced.get(value) == producer:
            return value
        return location(p, *source("F", producer[1], "x"))  # F_l passing on its input

    def memory_of(p: int, buf: str) -> str:
        if view_region(p, buf) is not None:
            return "local"
        if "@" in buf:
            return f"from{buf.split('@')[1]}"
        return "samples" if buf in ("x", "y") else "local"

    # (PE, buffer) → tasks whose end writes its slot t, and tasks that must have run before it is rewritten.
    writers: dict[tuple[int, str], set[TaskKey | None]] = {}
    vreaders: dict[tuple[int, str], set[TaskKey]] = {}

    def use(p: int, buf: str, reader: TaskKey) -> None:
        vreaders.setdefault((p, buf), set()).add(reader)
        writers.setdefault((p, buf), set())

    operands: dict[tuple[TaskKey, int, str], str] = {}  # (task, step index, x|y) → buffer on the task's PE
    summed: dict[tuple[TaskKey, int], tuple[str, ...]] = {}  # (A task, step index) → further x buffers (x_sum)
    for key, p in pe_of.items():
        for k, atomic in enumerate(key[0]):
            if atomic == "U":
                continue
            for which in _operands(atomic, key[1] in matrix, _is_max_pool(network, key[1])):
                producer, value = source(atomic, key[1], which)
                buf = operands[(key, k, which)] = location(p, producer, value)
                use(p, buf, key)
                if producer is not None and producer[0] == "cat":
                    if pe_of[task(producer[1], "F")] != p:
                        raise InputError(f"task {name(key)} on PE {p} reads the concatenation of a split layer's parts "
                                         f"held on PE {pe_of[task(producer[1], 'F')]}; the RTL reads it only where its "
                                         "consumer's F runs (--keep-weights-together)")
                    writers[(p, buf)].update(task(part, "F") for part, _, _ in shapes.segments[producer[1]])
                elif producer is not None and buf == value:
                    writers[(p, buf)].add(producer)
            if atomic == "A" and partials(key[1]):  # the other parts' partial errors, summed into x
                more = []
                for producer, value in partials(key[1])[1:]:
                    buf = location(p, producer, value)
                    use(p, buf, key)
                    if buf == value:
                        writers[(p, buf)].add(producer)
                    more.append(buf)
                summed[(key, k)] = tuple(more)
    vector_sends: dict[tuple[TaskKey, TaskKey], tuple[str, str]] = {}  # transfer → (source buffer, dest buffer)
    for (src, dst), tr in transfers.items():
        if tr.kind != "vector":
            continue
        values = {source(atomic, dst[1], which)[1] for k, atomic in enumerate(dst[0]) if atomic != "U"
                  for which in ("x", "y") if (dst, k, which) in operands and source(atomic, dst[1], which)[0] == src}
        if "F" in dst[0] and shapes.is_cat(dst[1]) and src[1] in shapes.inputs[dst[1] - 1]:
            values = {f"a{src[1]}"}  # a part into its slice of the concatenation (a view on F_c's PE)
        if "A" in dst[0] and src in [e for e, _ in partials(dst[1])]:
            values = {v for e, v in partials(dst[1]) if e == src}  # a part's partial error to the producer's A
        if any("-" in v for v in values):
            raise InputError(f"tasks {name(src)} and {name(dst)} would exchange the concatenation of a split layer's "
                             "parts across PEs; the RTL keeps it where its consumer's F runs (--keep-weights-together)")
        if not values and dst[1] not in matrix:
            raise InputError(f"layer '{network.layer(dst[1]).name}' runs {name(src)} on PE {pe_of[src]} and "
                             f"{name(dst)} on PE {pe_of[dst]}: the schedule moves its kept input between them, "
                             "which the RTL's pooling / flatten backward does not read; use "
                             "--keep-weights-together, another -n or policy")
        if len(values) != 1:
            raise InputError(f"tasks {name(src)} and {name(dst)} exchange {len(values)} vectors on different PEs; the "
                             "RTL sends one vector per transfer")
        value = values.pop()
        here, there = location(pe_of[src], src, value), f"{value}@{pe_of[src]}"
        vector_sends[(src, dst)] = (here, there)
        use(pe_of[src], here, dst)  # the transfer ends before its consumer starts
        if here == value and value in produced:
            writers[(pe_of[src], here)].add(produced[value])
        writers.setdefault((pe_of[dst], there), set()).add(src)
        vreaders.setdefault((pe_of[dst], there), set())  # a part's slice of a concatenation: read as the region

    def vector_depth(p: int, buf: str) -> int:
        if memory_of(p, buf) == "samples":
            return pow2_at_least(max_samples if sample_depth is None else sample_depth)
        # A concatenation and its views share slots: every reader of any of them against every writer.
        members = [b for q, b in vreaders if q == p and (b == buf or (view_region(p, b) or ("",))[0] == buf)]
        readers_of = set().union(*(vreaders.get((p, b), set()) for b in members), vreaders.get((p, buf), set()))
        writers_of = set().union(*(writers.get((p, b), set()) for b in members), writers.get((p, buf), set()))
        if "-" in buf and buf in produced:
            writers_of.add(produced[buf])  # the error region: E_c writes it
        pairs = [dist(r, w) for r in readers_of for w in writers_of if w is not None]
        return pow2_at_least(max(pairs, default=1))

    def elements_of(value: str) -> int:
        if value in ("x", "y"):
            return widths[0] if value == "x" else widths[-1]
        if value.startswith("m"):  # sized as the DFG's kept edge (the pooling's input): its link beats
            return widths[int(value[1:]) - 1]
        return widths[int(value[1:].split("_")[0])]

    programs = []
    for p, body in enumerate(bodies):
        buffers: list[Buffer] = []

        def add(name: str, memory: str, slot_words: int, depth: int, buffers: list[Buffer] = buffers) -> None:
            base = sum(b.words for b in buffers if b.memory == memory)
            buffers.append(Buffer(name, memory, base, slot_words, depth))

        held = {b for q, b in vreaders if q == p}  # the vector buffers of this PE
        groups = [(operands[((s.kind, s.layer), k, "x")], *summed[((s.kind, s.layer), k)]) for s in body
                  for k, a in enumerate(s.kind) if a == "A" and ((s.kind, s.layer), k) in summed]
        aligned = {b for group in groups for b in group}
        for group in groups:
            memories = [memory_of(p, b) for b in group]
            if len(set(memories)) != len(memories):
                raise InputError(f"PE {p} would receive two partial errors of one layer ({', '.join(group)}) into one "
                                 "bank: the PE sums them from distinct banks in one beat; use --no-split-layers or "
                                 "another -n")
        for s in body:  # what the PE's steps write (a part's slice of a concatenation may have no reader of its own)
            for atomic in s.kind:
                if atomic in "FAE":
                    held.add(_step(atomic, s.layer, widths, shapes, network).dst)
        views = {b: view_region(p, b) for b in held}
        held |= {v[0] for v in views.values() if v is not None}
        for group in groups:  # first: the partial errors one A sums, the same slots of distinct banks
            depth = max(vector_depth(p, b) for b in group)
            slot = batch * ceil_div(elements_of(group[0].split("@")[0]), lanes)
            base = max(sum(b.words for b in buffers if b.memory == memory_of(p, g)) for g in group)
            for g in group:
                gap = base - sum(b.words for b in buffers if b.memory == memory_of(p, g))
                if gap:
                    add(f"pad{len(buffers)}", memory_of(p, g), gap, 1)  # words left unused, for the alignment
                add(g, memory_of(p, g), slot, depth)
        for buf in sorted((b for b in held if views.get(b) is None), key=lambda b: (order.index(b.split("@")[0]), b)):
            value = buf.split("@")[0]
            if "-" in value:  # a concatenation (or its error) of consumer c: the parts' padded words
                words = shapes.region_words(shapes.consumer[int(value[1:].split("-")[0]) - 1])
                add(buf, "local", batch * words, vector_depth(p, buf))
                continue
            if buf in aligned:
                continue
            add(buf, memory_of(p, buf), batch * ceil_div(elements_of(value), lanes), vector_depth(p, buf))
        ordered = sorted(held, key=lambda b: (order.index(b.split("@")[0]), b))
        for buf in (b for b in ordered if views.get(b) is not None):
            region_name, offset = views[buf]  # type: ignore[misc]
            region = next(b for b in buffers if b.name == region_name)
            part_words = batch * ceil_div(widths[int(buf.split("@")[0][1:])], lanes)  # B runs, `pitch // B` apart
            buffers.append(Buffer(buf, "local", region.base + offset, part_words, region.depth, region_name,
                                  region.slot_words))
        for layer in weighted:
            # W as the PE stores it: conv2d (O, C·K·K); a split layer's consumer with its parts' columns padded
            stored_cols = shapes.cols[layer - 1] if shapes.is_cat(layer) else matrix[layer][1]
            matrix_words = matrix[layer][0] * ceil_div(stored_cols, lanes)
            for ring in (f"W{layer}", f"C{layer}", f"S{layer}"):
                if (p, ring) in need:
                    add(ring, "weights", matrix_words, pow2_at_least(need[(p, ring)]))
            # U is always its own task, so g_l is kept from G_l(t) to U_l(t) (or to its transfer's end).
            if p in (owner[layer], pe_of[task(layer, "G")]):
                add(f"g{layer}", "grads", matrix_words, pow2_at_least(dist(task(layer, "U"), task(layer, "G"))))
        for memory in sorted({b.memory for b in buffers}):
            used = sum(b.words for b in buffers if b.memory == memory)
            if used > limits.max_memory_words:
                raise InputError(f"PE {p} needs {used} words of {memory} memory, beyond the RTL limit of "
                                 f"{limits.max_memory_words} words; use fewer --samples, a smaller --batch (now "
                                 f"{batch}), more lanes or more PEs")
        counters = sorted(((src, dst) for (src, dst) in transfers if pe_of[dst] == p),
                          key=lambda sd: (index_of[sd[1]], pe_of[sd[0]], sd))
        entries = []
        for s in body:
            key = (s.kind, s.layer)
            steps: list[Step] = []
            for atomic in s.kind:
                step = _step(atomic, s.layer, widths, shapes, network)
                if atomic != "U":
                    step = replace(step, batch=batch)
                if (key, len(steps), "x") in operands:
                    step = replace(step, x=operands[(key, len(steps), "x")])
                if (key, len(steps), "y") in operands:
                    step = replace(step, y=operands[(key, len(steps), "y")])
                if (key, len(steps)) in summed:
                    step = replace(step, x_sum=summed[(key, len(steps))])
                if (key, atomic) in reads:
                    buf, offset = reads[(key, atomic)]
                    step = replace(step, w=buf, version=offset)
                steps.append(step)
            waits = tuple((i, transfers[sd].delay) for i, sd in enumerate(counters) if sd[1] == key)
            entries.append(Entry(s.kind, s.layer, s.lag, s.start, tuple(steps), waits, ()))
        programs.append((p, entries, buffers, counters))

    # Sends name the destination's counters, so they are filled in once every PE is laid out.
    counter_at = {p: {sd: i for i, sd in enumerate(c)} for p, _, _, c in programs}
    result = []
    for p, entries, buffers, counters in programs:
        final = []
        queue_need: dict[int, dict[TaskKey, int]] = {}
        for entry in entries:
            key = (entry.kind, entry.layer)
            outs = [(src, dst) for (src, dst) in transfers if src == key]
            # Link queue order for one producer: consumer PE, then consumer program order (period, index).
            outs.sort(key=lambda sd: (pe_of[sd[1]], transfers[sd].delay + slot_of[sd[1]].lag, index_of[sd[1]]))
            sends = []
            for src, dst in outs:
                tr = transfers[(src, dst)]
                q, layer = pe_of[dst], src[1]
                counter = counter_at[q][(src, dst)]
                if tr.kind == "vector":
                    send = Send(q, *vector_sends[(src, dst)], tr.words, counter, name(dst))
                elif tr.kind == "gradient":
                    send = Send(q, f"g{layer}", f"g{layer}", tr.words, counter, name(dst))
                elif tr.kind == "weights":
                    send = Send(q, f"W{layer}", f"C{layer}", tr.words, counter, name(dst), tr.delay, 1, 1)
                else:  # stash
                    buf, offset = reads[(src, "F")]
                    send = Send(q, buf, f"S{layer}", tr.words, counter, name(dst), 0, offset, 0)
                sends.append(send)
                # The queue item of this op stays until its last transfer arrives, before its consumer
                # starts; the op d iterations later cannot end before that consumer has run.
                need_of = queue_need.setdefault(q, {})
                need_of[key] = max(need_of.get(key, 1), dist(dst, src) + tr.delay)
            final.append(Entry(entry.kind, entry.layer, entry.lag, entry.start, entry.steps, entry.waits,
                               tuple(sends)))
        queues = tuple((q, pow2_at_least(sum(n.values()))) for q, n in sorted(queue_need.items()))
        names = tuple(f"{name(s)}->{name(d)}" for s, d in counters)
        result.append(PEProgram(p, tuple(final), tuple(buffers), names, queues))
    cols = shapes.cols if shapes.segments else ()
    return Program(network, widths, lanes, max_samples, schedule.period, mode, tuple(result), fmt, limits, cols)


def _is_max_pool(network: Network, layer: int) -> bool:
    op = network.layer(layer).op
    return getattr(op, "kind", "") == "pool" and getattr(op, "mode", "") == "max"


def _operands(atomic: str, weighted: bool, max_pool: bool) -> tuple[str, ...]:
    """The vector operands (x, y) step `atomic` reads; U reads none."""
    if atomic in "GA":
        return ("x", "y")
    if atomic == "F":
        return ("x",)
    if weighted:
        return ("y",)  # E: δ
    return ("x", "y") if max_pool else ("x",)  # pooling / flatten E: e_l (and the argmax mask)


def _step(atomic: str, layer: int, widths: Sequence[int], shapes: SplitShapes, network: Network | None = None) -> Step:
    """Step `atomic` of `layer` reading the owner's ring at the current version (weight reads are set after)."""
    n_in, n_out = shapes.cols[layer - 1], widths[layer]
    hidden = layer < len(widths) - 1
    below = shapes.input_value(layer)
    if network is not None and network.layer(layer).kind != "linear":
        return _window_step(atomic, layer, widths, network)
    if atomic == "F":
        return Step("F", layer, n_in, n_out, hidden, x=below, w=f"W{layer}", dst=f"a{layer}")
    if atomic == "A":
        if hidden:
            return Step("A", layer, n_in, n_out, hidden, x=f"e{layer}", y=f"a{layer}", dst=f"d{layer}")
        return Step("A", layer, n_in, n_out, hidden, x=f"a{layer}", y="y", dst=f"d{layer}")
    if atomic == "E":
        return Step("E", layer, n_in, n_out, hidden, y=f"d{layer}", w=f"W{layer}", dst=shapes.error_value(layer))
    if atomic == "G":
        return Step("G", layer, n_in, n_out, hidden, x=below, y=f"d{layer}", dst=f"g{layer}")
    if atomic == "U":
        return Step("U", layer, n_in, n_out, hidden, w=f"W{layer}", g=f"g{layer}", dst=f"W{layer}")
    raise AssertionError(atomic)


def _window_step(atomic: str, layer: int, widths: Sequence[int], network: Network) -> Step:
    """A step of a conv2d, pooling or flatten layer: window ops carry their loop nest; conv A and U are the
    vector and matrix walks of a linear layer over the flattened output and the (O, C·K·K) weights."""
    info = network.layer(layer)
    below = f"a{layer - 1}" if layer > 1 else "x"
    n_in, n_out = widths[layer - 1], widths[layer]
    window = window_of(info, atomic, network.batch) if info.kind != "flatten" and atomic in "FEG" else None
    if info.kind == "flatten":
        copy = copy_window(n_in, network.batch)
        if atomic == "F":
            return Step("F", layer, n_in, n_out, False, x=below, dst=f"a{layer}", window=copy)
        return Step("E", layer, n_out, n_in, False, x=f"e{layer}", dst=f"e{layer - 1}", window=copy)
    if info.kind == "pool":
        if atomic == "F":
            mask = f"m{layer}" if _is_max_pool(network, layer) else ""
            return Step("F", layer, n_in, n_out, False, x=below, dst=f"a{layer}", window=window, mask=mask)
        y = f"m{layer}" if _is_max_pool(network, layer) else ""
        return Step("E", layer, n_in, n_out, False, x=f"e{layer}", y=y, dst=f"e{layer - 1}", window=window)
    rows, cols = matrix_shape(info)
    if atomic == "F":
        return Step("F", layer, n_in, n_out, True, x=below, w=f"W{layer}", dst=f"a{layer}", window=window)
    if atomic == "A":
        return Step("A", layer, n_in, n_out, True, x=f"e{layer}", y=f"a{layer}", dst=f"d{layer}")
    if atomic == "E":
        return Step("E", layer, n_in, n_out, True, y=f"d{layer}", w=f"W{layer}", dst=f"e{layer - 1}", window=window)
    if atomic == "G":
        return Step("G", layer, n_in, n_out, True, x=below, y=f"d{layer}", dst=f"g{layer}", window=window)
    return Step("U", layer, cols, rows, True, w=f"W{layer}", g=f"g{layer}", dst=f"W{layer}")

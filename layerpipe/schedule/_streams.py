"""Single-device training on concurrent streams: `stream` and OOO BackProp's `stream-ooo`.

Source: Out-Of-Order BackProp (Oh et al., EuroSys'22), §6 (single-GPU training: weight-gradient kernels
on a separate CUDA stream, run beside the output-gradient kernels; for DenseNet the last block's weight
gradients are deferred into the next iteration's forward) and its public code (`expr/single_gpu/`). Our
own model of the scheme, timed by the stream engine (`layerpipe.schedule._stream_engine`, where the
lane-sharing rule is stated; `layerpipe.sim._streams` simulates these policies on it).

The device is the `pe` cost model's processor: `lanes` MAC lanes and a fixed launch overhead per kernel
(`overhead`, the model's per-op overhead); `macs` is one lane with no overhead. A task is one kernel; its
work is its MAC (or elementwise) count and its width the independent outputs it writes (an
output-stationary dataflow: one lane per output element): F and A write B·n_out values, E writes B·n_in,
G and U write |W_l|. Alone on the device a kernel takes overhead + ⌈work / min(width, lanes)⌉ — the `pe`
cost when it fills the lanes. Iteration t is one micro-batch; every update lands before the next forward
reads the layer, so both policies are plain SGD, one update per micro-batch (no staleness).

- `stream` — every task on one stream in backprop order: F_1..F_L, then for l = L..1: A_l, E_l, G_l, then
  the updates (PyTorch's autograd then `optimizer.step()`).
- `stream-ooo` — output-gradient work (A, E), the forwards and the updates on stream 0; G_l on streams
  1..S−1 (round robin, backward order). G_l needs δ_l, so it cannot start before A_l is done: it runs beside
  E_l or beside the output gradients of layers backprop reaches after l (j ≤ l), never beside earlier work.
  U_l is gated just before F_l of the next iteration. `defer` > 0 moves the weight gradients of the last
  `defer` weight layers (the last block) behind G_1 on stream 1, so they run beside the next iteration's
  forward, before that forward reaches them (their inputs are kept one iteration longer). With S = 1 every
  G_l stays on stream 0 right after its layer's output gradient: the `stream` order.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerpipe.costs import CostModel, MacsModel, PEModel, atomic_work
from layerpipe.dfg import GraphOptions, Task, TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Layer, Network
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stream_engine import Program, cycles_per_iteration, run_program
from layerpipe.schedule.metrics import ScheduleMetrics

POLICY_NAMES = ("stream", "stream-ooo")
#: Iterations simulated for a policy's figures: those `layerpipe explore` simulates (`layerpipe.dse._evaluate.
#: simulated_iterations`, 16 for one micro-batch a step), so compare, explore and simulate print one figure.
TIMED_ITERATIONS = 16
#: Most streams a device may have: beyond any GPU's useful concurrency (CUDA allows 128 connections).
MAX_STREAMS = 128
_NOT_LOCAL = ("weights", "stash", "gradient")


@dataclass(frozen=True)
class StreamOptions:
    pass


@dataclass(frozen=True)
class StreamOOOOptions:
    streams: int = 2  #: S concurrent streams (stream 0: critical path; 1..S−1: weight gradients)
    defer: int = 0  #: last weight layers whose G runs beside the next iteration's forward

    def __post_init__(self) -> None:
        s = self.streams
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_STREAMS:
            raise InputError(f"--streams must be an integer in 1..{MAX_STREAMS}, got {s!r}")
        d = self.defer
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise InputError(f"--defer must be an integer >= 0 (weight layers), got {d!r}")


@dataclass(frozen=True)
class Device:
    lanes: int
    overhead: int


def device_of(model: CostModel) -> Device:
    if isinstance(model, PEModel):
        return Device(model.lanes, model.overhead)
    if isinstance(model, MacsModel):
        return Device(1, 0)
    raise InputError(f"stream policies need cost model pe or macs (lanes and a launch overhead), got "
                     f"'{model.name}'")


def kernel_width(layer: Layer, kind: str, batch: int) -> int:
    """Independent outputs of one atomic task: the lanes it can fill (module docstring)."""
    if kind in "FA":
        return max(1, batch * layer.out_size)
    if kind == "E":
        return max(1, batch * layer.in_size)
    return max(1, layer.weight_count)  # G, U


@dataclass(frozen=True)
class StreamPlan:
    network: Network
    graph: TrainingGraph
    device: Device
    streams: int
    ooo: bool
    deferred: tuple[int, ...]


def plan(network: Network, model: CostModel, ooo: bool, streams: int, defer: int) -> StreamPlan:
    weights = [layer.index for layer in network.layers if layer.has_weights]
    if defer > len(weights):
        raise InputError(f"--defer must be in 0..{len(weights)} (the weight layers of {network.name}), got {defer}")
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True, weight_mode="latest"))
    deferred = tuple(weights[len(weights) - defer:]) if defer else ()
    return StreamPlan(network, graph, device_of(model), streams, ooo, deferred)


def build_program(p: StreamPlan, iterations: int) -> Program:
    """The kernels of `iterations` iterations on one device (module docstring)."""
    net, graph, dev = p.network, p.graph, p.device
    prog = Program([dev.lanes], [p.streams])
    local: dict[Task, list[Task]] = {t: [] for t in graph.tasks}
    for e in graph.edges:
        if e.role not in _NOT_LOCAL and e.delay == 0:
            local[e.dst].append(e.src)
    item: dict[tuple[str, int, int], int] = {}
    weights = [layer.index for layer in net.layers if layer.has_weights]
    lane_of_g = {layer: 1 + k % (p.streams - 1) for k, layer in enumerate(reversed(weights))} if p.streams > 1 else {}

    sizes: dict[tuple[str, int], tuple[int, int]] = {}

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
        size = sizes.get((kind, layer))
        if size is None:  # a (kind, layer)'s work and width, worked out once rather than every iteration
            lay = net.layer(layer)
            size = sizes[(kind, layer)] = (atomic_work(lay, kind, net.batch), kernel_width(lay, kind, net.batch))
        prog.kernel(Op(stream, kind, layer, t), 0, stream, size[0], size[1], dev.overhead, deps)
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


def step_cycles(p: StreamPlan, iterations: int) -> float:
    """Steady-state cycles per iteration over `iterations` iterations: the `SimResult.cycles_per_iteration`
    that simulating them measures (`layerpipe.sim._streams.simulate_result`), one row per stream."""
    prog = build_program(p, iterations)
    return cycles_per_iteration(prog, run_program(prog, SHARED), list(prog.stream), p.streams, 1)


def peak_words(p: StreamPlan) -> int:
    """A static figure: weights, one gradient buffer, the activations one micro-batch keeps, and those of the
    deferred layers kept one iteration longer."""
    net = p.network
    kept = {layer.index: net.batch * (layer.in_size + layer.out_size) for layer in net.layers}
    return 2 * net.total_weights + sum(kept.values()) + sum(kept[layer] for layer in p.deferred)


def _schedule(policy: str, network: Network, num_procs: int, model: CostModel, options: object, ooo: bool,
              streams: int, defer: int) -> ScheduleResult:
    if num_procs != 1:
        raise InputError(f"{policy} models one device with concurrent streams: -n must be 1, got {num_procs}")
    p = plan(network, model, ooo, streams, defer)
    step = step_cycles(p, TIMED_ITERATIONS)  # exactly what simulating the same iterations measures
    lay = {layer.index: layer for layer in network.layers}
    work = sum(atomic_work(lay[t.layer], t.kind, network.batch) for t in p.graph.tasks)
    launches = len(p.graph.tasks) * p.device.overhead
    bound = max(-(-work // p.device.lanes), -(-launches // streams))
    weights = [layer.index for layer in network.layers if layer.has_weights]
    metrics = ScheduleMetrics(
        cycles_per_sample=step / network.batch,
        lower_bound_cycles=bound / network.batch,
        utilization_pct=round(100.0 * work / (p.device.lanes * step), 3) if step else 0.0,  # lane utilization
        traffic_words_per_sample=0.0,
        weight_versions=1,
        max_staleness=0,
        period_cycles=round(step),
        samples_per_period=network.batch,
        staleness_per_layer=dict.fromkeys(weights, 0),
        weight_versions_per_layer=dict.fromkeys(weights, 1),
    )
    one = build_program(p, 1)
    rows: list[list[Op]] = [[] for _ in range(streams)]
    for name in one.names:
        assert name is not None
        rows[name.proc].append(name)
    explicit = OpSchedule("layer", tuple(tuple(r) for r in rows), True, 1)
    notes = (f"one device: {p.device.lanes} lanes, launch overhead {p.device.overhead} cycles per kernel, "
             f"{streams} stream(s); rows of the schedule are streams; utilization is of the lanes",
             *((f"weight gradients of layers {', '.join(map(str, p.deferred))} deferred into the next forward",)
               if p.deferred else ()))
    return ScheduleResult(policy, options, num_procs, metrics, network, p.graph, explicit=explicit, notes=notes)


def schedule_stream(network: Network, num_procs: int, model: CostModel, options: StreamOptions,
                    interconnect: Interconnect = SHARED) -> ScheduleResult:
    return _schedule("stream", network, num_procs, model, options, False, 1, 0)


def schedule_stream_ooo(network: Network, num_procs: int, model: CostModel, options: StreamOOOOptions,
                        interconnect: Interconnect = SHARED) -> ScheduleResult:
    return _schedule("stream-ooo", network, num_procs, model, options, True, options.streams, options.defer)


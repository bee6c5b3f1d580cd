"""Data-parallel training with a ring all-reduce per layer: `dp` and OOO BackProp's `dp-ooo` (reverse first-k).

Source: Out-Of-Order BackProp (Oh et al., EuroSys'22), §5 (data-parallel training) and its public code
(github.com/mlsys-seo/ooo-backprop, `expr/data_par/code/OOO_backprop/dp_schedule.py`: `reverse_first_k`,
`num_dependency`). Read to learn the scheme; the code here is our own model of it.

N replicas of the whole network each train on their own micro-batch of B samples; a step is N micro-batches
(micro-batch t = j·N + p runs on replica p in step j) and every replica applies the same summed gradient,
so the step is plain synchronous mini-batch SGD on N·B samples (no staleness; the functional mode checks it).

**Ring all-reduce.** The gradient of a layer (or of a bucket of layers, Σ|W_l| words) is reduced by the
classic ring: 2(N − 1) steps — N − 1 reduce-scatter steps, then N − 1 all-gather steps — in each of which
replica p sends one chunk of ⌈|W|/N⌉ words to replica p + 1 (mod N). Step s of replica p leaves when p
has its own gradient and has received step s − 1 from p − 1; replica p holds the reduced gradient when
step 2N − 3 from p − 1 has arrived. Uncontended, on an interconnect of latency L and w words per cycle:

    T_AR(|W|) = 2(N − 1) · (⌈⌈|W|/N⌉ / w⌉ + L)

On `links` the ring uses the N links p → p+1 (all of a replica's all-reduces share its one outgoing link,
first ready first sent, or lowest layer first with `comm_priority`, as ByteScheduler and P3 order
tensors); on `bus` all N·2(N − 1) transfers of an all-reduce share the one medium, so a ring
step takes N holds; on `shared` the all-reduce is free (an idealisation that the results name). `rtl` is
refused: the generated hardware's links join the PEs of one pipeline and have no reduction unit, so no
data-parallel replica set exists to put on them. Simplifications: the additions of the reduce-scatter run
in the communication engine (no compute cycles), the transfers use no processor time, and chunks round up.

**Orders** (one compute stream per replica; the stream engine, `layerpipe.schedule._stream_engine`, times
kernels and transfers):

- `dp` — the usual order (PyTorch DDP, Horovod): F_1..F_L, then for l = L..1: A_l, E_l, G_l; the
  all-reduce of a layer (bucket) starts when its G is done; every update U_l is applied at the end of the
  step, after its all-reduce, and the next step's F_1 follows them. `bucket_words` > 0 groups layers in
  backward order into buckets that close once they reach that many words (DDP's `bucket_cap_mb`).
- `dp-ooo` — OOO's reverse first-k: the weight gradients G_1..G_K of the first K weight layers are taken
  out of the backward and computed after it in forward order (layer 1 first), so layer 1's all-reduce, the
  one the next step needs first, starts earliest; their updates are gated just before F_i of the next step
  (U_i then F_i), so their all-reduces overlap the next forward. Layers after K keep the `dp` order and
  update at the end of the step (the public code applies them in one `apply_gradients`). K = 0 is `dp`.
  OOO's `num_dependency` (a poll for layer i's reduced gradient may start only after F_{i − num_dependency})
  keeps TensorFlow's dataflow executor from running the poll too early; on an in-order stream U_i runs
  right before F_i anyway, so it has no counterpart here.
- `reverse_first_k = "auto"` simulates K on the given interconnect and keeps the fastest step (the smallest
  K on ties), coarse to fine (`choose_k`: exhaustive up to 8 weight layers): the costs decide, as OOO's
  authors tuned k by measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from layerpipe._memo import BoundedMemo
from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, Task, TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stream_engine import SIM_ITERATIONS_MIN, Program, cycles_per_iteration, run_program
from layerpipe.schedule._sync_policies import NetworkKey
from layerpipe.schedule.metrics import ScheduleMetrics

POLICY_NAMES = ("dp", "dp-ooo")
#: Edge roles that are not data of one iteration on one replica (weights are gated by the update order).
_NOT_LOCAL = ("weights", "stash", "gradient")


@dataclass(frozen=True)
class DPOptions:
    bucket_words: int = 0  #: gradient bucket size in words (0: one all-reduce per layer)
    comm_priority: bool = False  #: waiting all-reduce chunks leave lowest layer first (else first ready)

    def __post_init__(self) -> None:
        _check_bucket(self.bucket_words)
        _check_priority(self.comm_priority)


@dataclass(frozen=True)
class DPOOOOptions:
    reverse_first_k: int | str = "auto"  #: K, or "auto" (chosen by simulation)
    bucket_words: int = 0  #: as for dp, for the layers after K
    comm_priority: bool = False  #: as for dp

    def __post_init__(self) -> None:
        k = self.reverse_first_k
        if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise InputError(f"--reverse-first-k must be an integer >= 0 or 'auto', got {k!r}")
        _check_bucket(self.bucket_words)
        _check_priority(self.comm_priority)


def _check_bucket(words: object) -> None:
    if isinstance(words, bool) or not isinstance(words, int) or words < 0:
        raise InputError(f"--bucket-words must be an integer >= 0 (0: one all-reduce per layer), got {words!r}")


def _check_priority(value: object) -> None:
    if not isinstance(value, bool):
        raise InputError(f"comm_priority (--comm-priority) must be true or false, got {value!r}")


def check_interconnect(interconnect: Interconnect) -> None:
    if interconnect.label == "rtl":
        raise InputError("--interconnect rtl cannot carry a data-parallel all-reduce (the generated links join "
                         "one pipeline's PEs, with no reduction unit); allowed: shared, links:L:W, bus:L:W")


def ring_allreduce_cycles(words: int, num_procs: int, interconnect: Interconnect) -> int:
    """T_AR: uncontended cycles of a ring all-reduce of `words` over `num_procs` replicas (module docstring)."""
    if num_procs < 2 or interconnect.is_shared:
        return 0
    chunk = -(-words // num_procs)
    return 2 * (num_procs - 1) * (interconnect.hold(chunk) + interconnect.latency)


@dataclass(frozen=True)
class DPPlan:
    """What a run needs: replicas, the first-K layers, the buckets (in backward order) and the graph."""

    network: Network
    num_procs: int
    graph: TrainingGraph
    costs: dict[Task, int]
    first: tuple[int, ...]  #: weight layers whose G is reversed and whose U is gated (forward order)
    buckets: tuple[tuple[int, ...], ...]  #: the other weight layers' all-reduce groups, backward order
    comm_priority: bool = False  #: chunks of lower layers overtake waiting ones (ByteScheduler, P3)

    @property
    def all_reduces(self) -> tuple[tuple[int, ...], ...]:
        """Every all-reduce in the order its gradient becomes ready: the buckets, then layers 1..K."""
        return self.buckets + tuple((layer,) for layer in self.first)


def weight_layers(network: Network) -> list[int]:
    return [layer.index for layer in network.layers if layer.has_weights]


def plan(network: Network, num_procs: int, model: CostModel, k: int, bucket_words: int,
         comm_priority: bool = False) -> DPPlan:
    weights = weight_layers(network)
    if k > len(weights):
        raise InputError(f"--reverse-first-k must be in 0..{len(weights)} (the weight layers of "
                         f"{network.name}) or 'auto', got {k}")
    graph = build_training_graph(network, GraphOptions(intra=True, inter=True, weight_mode="latest"))
    first = tuple(weights[:k])
    buckets: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0
    for layer in reversed(weights[k:]):
        current.append(layer)
        size += network.layer(layer).weight_count
        if size >= bucket_words:
            buckets.append(tuple(current))
            current, size = [], 0
    if current:
        buckets.append(tuple(current))
    return DPPlan(network, num_procs, graph, graph.costs(model), first, tuple(buckets), comm_priority)


def build_program(p: DPPlan, steps: int) -> Program:
    """The kernels and ring transfers of `steps` steps (see the module docstring), as a stream-engine
    `Program` with one device of one lane per replica: a kernel of c cycles is c units of work.

    dp-ooo's choice of K builds a program per K tried (~4·10^4 items each), so what does not change between
    kernels is worked out once: per (kind, layer), its task's cost and the (kind, layer) keys of its
    same-iteration dependencies; a micro-batch's items are looked up by those short keys. Items go straight
    onto the program's lists (`Program.append_kernel`, `append_transfers`): they are valid by construction.
    The program is the one tests/stream_engine_reference.py builds, item for item
    (tests/test_stream_engine_identity.py).
    """
    n, net, graph = p.num_procs, p.network, p.graph
    prog = Program([1] * n, [1] * n)
    local: dict[Task, list[Task]] = {t: [] for t in graph.tasks}
    for e in graph.edges:
        if e.role not in _NOT_LOCAL and e.delay == 0:
            local[e.dst].append(e.src)
    first = set(p.first)
    layers = [layer.index for layer in net.layers]
    # (kind, layer) → (cost, dependency keys), for the tasks that exist.
    kernel_of: dict[tuple[str, int], tuple[int, list[tuple[str, int]]]] = {}
    for layer in layers:
        for kind in "FAEGU":
            task = graph.task_of(layer, kind)
            if task is not None:
                kernel_of[(kind, layer)] = (p.costs[task], [(s.kind, s.layer) for s in local[task]])
    if any(cost < 0 for cost, _ in kernel_of.values()):
        raise InputError("a data-parallel kernel needs a cost >= 0")
    # Per micro-batch t: (kind, layer) → item. Updates by (replica, layer, step); reduced gradients likewise.
    batch: dict[int, dict[tuple[str, int], int]] = {}
    u_item: dict[tuple[int, int, int], int] = {}
    done_at: dict[tuple[int, int, int], int] = {}
    kernel = prog.append_kernel

    def add(rep: int, kind: str, layer: int, t: int, step: int) -> None:
        known = kernel_of.get((kind, layer))
        if known is None:
            return
        cost, keys = known
        items = batch[t]
        deps = [items[key] for key in keys]
        if step > 0 and kind in "FE":
            u = u_item.get((rep, layer, step - 1))
            if u is not None:
                deps.append(u)
        items[(kind, layer)] = kernel(Op(rep, kind, layer, t), rep, cost, tuple(deps))

    def update(rep: int, layer: int, step: int) -> None:
        items = batch[step * n + rep]
        deps = [done_at[(rep, layer, step)]]
        deps += [items[(k, layer)] for k in "FE" if (k, layer) in items]  # write after read
        if step > 0:
            deps.append(u_item[(rep, layer, step - 1)])
        u_item[(rep, layer, step)] = kernel(Op(rep, "U", layer, step), rep, kernel_of[("U", layer)][0], tuple(deps))

    ring = [(rep, (rep + 1) % n) for rep in range(n)]  # replica rep sends to rep + 1 ...
    behind = [(rep - 1) % n for rep in range(n)]  # ... and receives from rep - 1
    backward = list(reversed(layers))
    updated = [layer for layer in backward if net.layer(layer).has_weights and layer not in first]
    for step in range(steps):
        for rep in range(n):
            t = step * n + rep
            batch[t] = {}
            for layer in layers:
                if layer in first and step > 0:
                    update(rep, layer, step - 1)  # gated: the update lands just before F_i
                add(rep, "F", layer, t, step)
            for layer in backward:
                add(rep, "A", layer, t, step)
                add(rep, "E", layer, t, step)
                if layer not in first:
                    add(rep, "G", layer, t, step)
            for layer in p.first:
                add(rep, "G", layer, t, step)
        for group in p.all_reduces:
            grads = [[batch[step * n + rep][("G", layer)] for layer in group] for rep in range(n)]
            if n == 1:
                for layer, g in zip(group, grads[0], strict=True):
                    done_at[(0, layer, step)] = g  # one replica: nothing to reduce
                continue
            words = -(-sum(net.layer(layer).weight_count for layer in group) // n)
            priority = min(group) if p.comm_priority else 0
            # Round s: every replica sends to the next one, after its gradients and (from the second round on)
            # what it received in round s − 1, from replica rep − 1: item sent + (rep − 1) mod n of that round.
            own = [tuple(g) for g in grads]
            sent = prog.append_transfers(ring, words, own, priority)
            for _ in range(2 * (n - 1) - 1):
                deps = [(*g, sent + back) for g, back in zip(own, behind, strict=True)]
                sent = prog.append_transfers(ring, words, deps, priority)
            for rep in range(n):
                for layer in group:
                    done_at[(rep, layer, step)] = sent + (rep - 1) % n
        for rep in range(n):
            for layer in updated:
                update(rep, layer, step)
            if step == steps - 1:
                for layer in p.first:
                    update(rep, layer, step)  # the last step's gated updates: no next forward to wait for
    return prog


def peak_words(p: DPPlan) -> tuple[int, ...]:
    """Per replica, a static figure: the weights, one gradient buffer, and every activation a micro-batch
    keeps for its backward (a_{l−1} and z_l of each layer: the forward/backward turn holds all of them)."""
    net = p.network
    weights = sum(layer.weight_count for layer in net.layers)
    kept = sum(net.batch * (layer.in_size + layer.out_size) for layer in net.layers)
    return (2 * weights + kept,) * p.num_procs


def timed_steps(num_procs: int) -> int:
    """Steps a policy's figures are measured over: the micro-batches `layerpipe explore` and the fuzz simulate
    (`layerpipe.dse._evaluate.simulated_iterations`: max(16, 3·m) for m = N micro-batches a step), so the
    figure `compare` prints is the one `explore` and `simulate` measure. The step time is `SimResult`'s
    middle-half slope over them; on a bus FIFO order can keep shifting for many steps (about 1% on
    resnet18 × 16 between 3 and 10 steps), so it is a figure over this horizon, not a proven limit."""
    return -(-max(SIM_ITERATIONS_MIN, 3 * num_procs) // num_procs)


def step_cycles(p: DPPlan, interconnect: Interconnect) -> float:
    """Cycles of one step (N micro-batches) over `timed_steps`: exact, a fraction when the slope is one."""
    prog = build_program(p, timed_steps(p.num_procs))
    return cycles_per_iteration(prog, run_program(prog, interconnect), list(prog.device), p.num_procs,
                                p.num_procs) * p.num_procs


#: `step_cycles` by (network, N, cost model, K, bucket words, priority, interconnect), the values its plan and
#: run are made of: `dp` and `dp-ooo` of one point both time K = 0 (the OOO report and `compare` ask for both),
#: and a repeated query times nothing. The oldest dropped past the cap.
_STEPS: BoundedMemo[tuple[object, ...], float] = BoundedMemo(256)


def memo_step_cycles(network: Network, num_procs: int, model: CostModel, k: int, bucket_words: int,
                     comm_priority: bool, interconnect: Interconnect, p: DPPlan | None = None) -> float:
    """`step_cycles` of `plan(network, num_procs, model, k, bucket_words, comm_priority)` (`p`, when the caller
    has it), remembered in `_STEPS` (not for a cost model that is not hashable)."""
    key = (NetworkKey(network), num_procs, model, k, bucket_words, comm_priority, interconnect)
    remember = True
    try:
        known = _STEPS.get(key)
    except TypeError:  # a model that is not hashable
        known, remember = None, False
    if known is None:
        if p is None:
            p = plan(network, num_procs, model, k, bucket_words, comm_priority)
        known = step_cycles(p, interconnect)
        if remember:
            _STEPS.add(key, known)
    return known


def choose_k(network: Network, num_procs: int, model: CostModel, bucket_words: int,
             interconnect: Interconnect, comm_priority: bool = False) -> tuple[int, float]:
    """`auto`: the K with the fastest simulated step, the smallest on ties, found coarse to fine: every
    g-th K in 0..L_w (g = ⌈L_w / 8⌉, L_w included), then every K within g of the best of those. With
    L_w ≤ 8 weight layers that is every K; beyond, a K between grid points can be missed when the step time
    has a narrow dip there (the search costs about 8 + 2g simulations instead of L_w + 1). Returns K and its
    step's cycles (`step_cycles`), which the schedule reports without simulating that K again."""
    weights = len(weight_layers(network))
    grid = max(1, -(-weights // 8))
    times: dict[int, float] = {}

    def best(ks: list[int]) -> int:
        for k in ks:
            if k not in times:
                times[k] = memo_step_cycles(network, num_procs, model, k, bucket_words, comm_priority, interconnect)
        return min(sorted(times), key=lambda k: (times[k], k))

    coarse = best(sorted(set(range(0, weights + 1, grid)) | {weights}))
    k = best(list(range(max(0, coarse - grid + 1), min(weights, coarse + grid - 1) + 1)))
    return k, times[k]


def schedule_dp(network: Network, num_procs: int, model: CostModel, options: DPOptions,
                interconnect: Interconnect = SHARED) -> ScheduleResult:
    return _schedule("dp", network, num_procs, model, options, 0, options.bucket_words, interconnect,
                     options.comm_priority)


def schedule_dp_ooo(network: Network, num_procs: int, model: CostModel, options: DPOOOOptions,
                    interconnect: Interconnect = SHARED) -> ScheduleResult:
    check_interconnect(interconnect)
    k = options.reverse_first_k
    step = None
    if k == "auto":
        k, step = choose_k(network, num_procs, model, options.bucket_words, interconnect, options.comm_priority)
    assert isinstance(k, int)
    return _schedule("dp-ooo", network, num_procs, model, replace(options, reverse_first_k=k), k,
                     options.bucket_words, interconnect, options.comm_priority, step)


def _schedule(policy: str, network: Network, num_procs: int, model: CostModel, options: object, k: int,
              bucket_words: int, interconnect: Interconnect, comm_priority: bool,
              step: float | None = None) -> ScheduleResult:
    """`step`: the plan's `step_cycles` when the caller has it (`choose_k` simulated the chosen K)."""
    check_interconnect(interconnect)
    if not weight_layers(network):
        raise InputError(f"{policy}: network {network.name} has no weight layers to all-reduce")
    p = plan(network, num_procs, model, k, bucket_words, comm_priority)
    if step is None:
        step = memo_step_cycles(network, num_procs, model, k, bucket_words, comm_priority, interconnect, p)
    work = sum(p.costs.values())
    samples = num_procs * network.batch
    chunk_words = sum(-(-sum(network.layer(layer).weight_count for layer in group) // num_procs)
                      for group in p.all_reduces)
    traffic = 2 * (num_procs - 1) * num_procs * chunk_words if num_procs > 1 else 0
    # The busiest channel per step: a ring link carries 2(N − 1) chunks of every all-reduce, the bus all N
    # replicas' (shared: nothing). A step is at least that, and at least one replica's compute.
    holds = sum(interconnect.hold(-(-sum(network.layer(x).weight_count for x in g) // num_procs))
                for g in p.all_reduces)
    channel = 2 * (num_procs - 1) * holds * (num_procs if interconnect.kind == "bus" else 1) if num_procs > 1 else 0
    weights = weight_layers(network)
    metrics = ScheduleMetrics(
        cycles_per_sample=step / samples,  # exactly what simulating the same steps measures
        lower_bound_cycles=max(work, channel) / samples,
        utilization_pct=round(100.0 * work / step, 3) if step else 0.0,  # each replica's busy share
        traffic_words_per_sample=traffic / samples,
        weight_versions=1,
        max_staleness=0,
        period_cycles=round(step),
        samples_per_period=samples,
        staleness_per_layer=dict.fromkeys(weights, 0),
        weight_versions_per_layer=dict.fromkeys(weights, 1),
    )
    one = build_program(p, 1)
    rows: list[list[Op]] = [[] for _ in range(num_procs)]
    for name, dev in zip(one.names, one.device, strict=True):
        if name is not None:
            rows[dev].append(name)
    explicit = OpSchedule("layer", tuple(tuple(r) for r in rows), True, num_procs)
    slowest = max((ring_allreduce_cycles(network.layer(g[0]).weight_count if len(g) == 1 else
                                         sum(network.layer(x).weight_count for x in g), num_procs, interconnect)
                   for g in p.all_reduces), default=0)
    notes = (f"{num_procs} replicas, one micro-batch each per step; ring all-reduce of |W| words: "
             f"2(N-1) steps of ceil(|W|/N) words, {len(p.all_reduces)} all-reduces per step, the largest "
             f"{slowest} cycles uncontended on {interconnect}",
             f"reverse first-k: K = {k}" + (f" (layers {', '.join(map(str, p.first))})" if k else ""))
    return ScheduleResult(policy, options, num_procs, metrics, network, p.graph, explicit=explicit, notes=notes,
                          interconnect=interconnect)


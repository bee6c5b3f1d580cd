"""The `ooo` policy: Out-Of-Order BackProp's pipeline-parallel scheme (Oh et al., "Out-Of-Order BackProp: An
Effective Scheduling Technique for Deep Learning", EuroSys'22, §5 "pipeline-parallel training"), synchronous.

What the paper's scheme is, and what we model (parameters checked against the public code,
github:mlsys-seo/ooo-backprop, `expr/pipe_par/code/OOO_backprop/schedule/`):

- **Modulo layer allocation** (`DeviceAllocatorManager.get_gpu_idx_modulo`): layer l (numbered from 0 in
  topological order) goes to processor ⌊l / g⌋ mod N; a run of g consecutive layers is a "virtual layer"
  — our stage — so stage s holds layers s·g .. s·g + g − 1 and runs on processor s mod N. The code's default
  g (`--modulo_batch`) is 1.
- **Breadth-first forwards** (the code's "MODULO forward schedule" picture: `E[0]E[0]E[0]E[0][4][4][4][4]`):
  a processor runs every ready micro-batch of its earliest stage before a later stage's.
- **Gradient fast-forwarding** (`_schedule_ooo_backpropagation`): a stage's output-gradient work (our I:
  A and E of its layers) runs as soon as its input gradient arrives and is sent on; its weight-gradient work
  (W: the layers' G) waits for that send and fills the gaps. W_s(t) runs before I_s(t+1) on every stage but
  the last (`_schedule_micro_batch_race_condition`), and the last stage's W waits for its last I.
- **Contiguous allocation** (the code's "fastforward" style, `get_gpu_idx`: even contiguous runs, one per
  GPU; option `allocation="contiguous"`): fast-forwarding on the same balanced contiguous stages as `gpipe`.
- **Push** (`PUSH`, `micro_batch_cap`; option `push`): with more micro-batches than processors, at most N are
  in flight — the first stage's forward of micro-batch t ≥ N waits for its weight gradient of t − N (the
  code gates every virtual layer but the last; we gate the first, which caps the micro-batches in flight the
  same way; a single stage is the last one and is not gated: its W waits for its last I).
- **Synchronous**: one update per step of m micro-batches with the summed gradient, staleness 0 (the
  paper's pipeline scheme is GPipe's semantics with a better order). The per-step update U_s runs after
  the stage's last W.

How the order is made: a list simulation over the stage ops with the stage costs (F, I = A + E, W = G) of
the cost model and the uncontended transfer time of the activation or error words on the given
interconnect (`Interconnect.transfer_cycles`); at each decision the processor takes, among its ready ops,
first an I (or the W that gates a ready I), then an F (earliest stage, then micro-batch), then the oldest W;
idle when nothing is ready (`_ooo_order.py`; layouts whose estimate provably cannot be among the best are
not simulated to the end, `_plan_layouts`). The order is then timed like every synchronous policy, by the
simulator on the interconnect (`_sync_policies.synchronous_result`). `allocation="auto"` (the default)
orders modulo allocation with g = 1 .. ⌈L/N⌉ (or the given `group_size`) and the contiguous stages, has the
simulator time the MAX_TIMED_LAYOUTS best by the list simulation's one-step estimate and the contiguous one,
and keeps the fastest timed step (ties: the better estimate); the paper tunes g per model, the code defaults
to 1. The micro-batches per step default to gpipe's, 2·min(N, L), so the two compare step for step as the
paper does.

Simplifications: TensorFlow's runtime order inside a virtual layer (layer by layer) is ours only at stage
granularity; the paper's GPU-stream overlap of communication with compute is the interconnect model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from layerpipe.costs import CostModel
from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule import _stage_programs
from layerpipe.schedule._deps import StageInfo
from layerpipe.schedule._ooo_order import StageCost, makespan_bound, ooo_order
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stage_programs import StageOp
from layerpipe.schedule._sync_policies import (
    _check_step_size,
    contiguous_stages,
    layer_step_work,
    synchronous_result,
    training_graph,
)

#: Largest number of group sizes `group_size=None` tries (each one list-scheduled order).
MAX_GROUP_TRIALS = 16
#: Layouts the simulator times, the best by the list simulation's estimate (plus the contiguous one).
MAX_TIMED_LAYOUTS = 2
#: Layer allocations: modulo groups, contiguous balanced stages, or the faster of both.
ALLOCATIONS = ("auto", "modulo", "contiguous")


@dataclass(frozen=True)
class OOOOptions:
    group_size: int | None = None  #: g, consecutive layers per allocation group (None: the fastest g)
    microbatches: int | None = None  #: m per step (default 2 × the processors used)
    push: bool = False  #: at most N micro-batches in flight
    allocation: str = "auto"  #: one of ALLOCATIONS

    def __post_init__(self) -> None:
        if self.group_size is not None and (isinstance(self.group_size, bool) or self.group_size < 1):
            raise InputError(f"group_size (-g) must be >= 1, got {self.group_size}")
        if self.microbatches is not None and self.microbatches < 1:
            raise InputError(f"microbatches must be >= 1, got {self.microbatches}")
        if not isinstance(self.push, bool):
            raise InputError(f"push must be true or false, got {self.push!r}")
        if self.allocation not in ALLOCATIONS:
            raise InputError(f"allocation '{self.allocation}' is not one of {', '.join(ALLOCATIONS)}")
        if self.allocation == "contiguous" and self.group_size is not None:
            raise InputError("group_size (-g) applies to modulo allocation, not allocation 'contiguous'")


def modulo_allocation(position: int, group_size: int, num_procs: int) -> int:
    """OOO's processor of the layer at topological `position` (from 0): ⌊position / g⌋ mod N."""
    return (position // group_size) % num_procs


def modulo_stages(network: Network, group_size: int) -> list[list[int]]:
    """Runs of `group_size` consecutive layers (topological order): OOO's virtual layers, our stages."""
    layers = [layer.index for layer in network.layers]
    return [layers[k:k + group_size] for k in range(0, len(layers), group_size)]


def stage_costs(graph: TrainingGraph, model: CostModel, stage_layers: Sequence[Sequence[int]]) -> list[StageCost]:
    """F, I (A + E), W (G) per micro-batch and U per step of every stage."""
    return _stage_costs_of(layer_costs(graph, model), stage_layers)


def layer_costs(graph: TrainingGraph, model: CostModel) -> dict[int, list[int]]:
    """Per layer, its [F, I (A + E), W (G), U] cycles."""
    out = {layer.index: [0, 0, 0, 0] for layer in graph.network.layers}
    for t, c in graph.costs(model).items():
        out[t.layer][{"F": 0, "G": 2, "U": 3}.get(t.kind, 1)] += c  # the rest (A, E) is I
    return out


def _stage_costs_of(per_layer: dict[int, list[int]], stage_layers: Sequence[Sequence[int]]) -> list[StageCost]:
    return [StageCost(*(sum(part) for part in zip(*(per_layer[layer] for layer in run), strict=True)))
            for run in stage_layers]


def schedule_ooo(network: Network, num_procs: int, model: CostModel, options: OOOOptions,
                 interconnect: Interconnect = SHARED) -> ScheduleResult:
    graph = training_graph(network)
    m = options.microbatches or 2 * min(num_procs, len(network))
    layouts: list[tuple[int | None, list[list[int]]]] = []
    if options.allocation != "contiguous":
        if options.group_size is not None:
            sizes = [options.group_size]
        else:
            sizes = list(range(1, min(-(-len(network) // num_procs), MAX_GROUP_TRIALS) + 1))
        layouts += [(g, modulo_stages(network, g)) for g in sizes]
    if options.allocation != "modulo":
        procs = min(num_procs, len(network))
        layouts.append((None, contiguous_stages(network, graph, model, procs, m)))
    # The layouts with the MAX_TIMED_LAYOUTS best estimates of the list simulation get their order (the others
    # need none: `_plan_layouts`); the simulator (which costs far more) times those and always the contiguous
    # layout, skipping those whose busiest processor's work (a lower bound on the step) already reaches the
    # best step timed.
    per_layer = layer_step_work(graph, model, m)

    def busiest(stage_layers: list[list[int]]) -> int:
        load = [0] * min(num_procs, len(stage_layers))
        for s, run in enumerate(stage_layers):
            load[s % len(load)] += sum(per_layer[layer] for layer in run)
        return max(load)

    for _, stage_layers in layouts:  # every layout's size is checked (in order) before any work
        _check_step_size("ooo", len(stage_layers), m)
    planned = _plan_layouts(graph, model, layouts, num_procs, m, options.push, interconnect)
    planned.sort(key=lambda plan: (plan[0], plan[1]))
    timed = planned[:MAX_TIMED_LAYOUTS] + [plan for plan in planned[MAX_TIMED_LAYOUTS:] if plan[2] is None]
    best: ScheduleResult | None = None
    seen: list[list[list[int]]] = []
    for _, _, g, stage_layers, rows in timed:
        if best is not None and busiest(stage_layers) >= best.metrics.period_cycles:
            continue
        chosen = _layout_options(options, g)  # first: it refuses what it refuses even for a layout skipped below
        if stage_layers in seen:  # the same stages as a layout timed already (N ≥ L: g = 1 is the contiguous
            continue  # cut): the same order and step, which cannot beat that one's
        seen.append(stage_layers)
        result = _with_stages(network, graph, num_procs, model, chosen, options, interconnect, g, stage_layers, m,
                              rows)
        if best is None or result.metrics.period_cycles < best.metrics.period_cycles:
            best = result
    assert best is not None
    return best


def _plan_layouts(graph: TrainingGraph, model: CostModel, layouts: list[tuple[int | None, list[list[int]]]],
                  num_procs: int, m: int, push: bool, interconnect: Interconnect
                  ) -> list[tuple[int, int, int | None, list[list[int]], list[list[StageOp]]]]:
    """(estimate, k, g, stages, order) of layout k: every layout that can be among the MAX_TIMED_LAYOUTS best by
    (estimate, k), and the contiguous one (g None), which is always timed; the others are left out.

    A layout's estimate is at least `makespan_bound` (its busiest processor's work after the first forward can
    reach it), so the layouts are simulated in the order of that bound, and once MAX_TIMED_LAYOUTS estimates are
    known, a layout whose bound exceeds the last of them is not simulated, nor finished once its simulation
    shows it would exceed it (`cutoff`): it could not be picked.
    """
    per_layer = layer_costs(graph, model)
    prepared = []
    for k, (g, stage_layers) in enumerate(layouts):
        costs = _stage_costs_of(per_layer, stage_layers)
        procs = min(num_procs, len(stage_layers))
        prepared.append((g is not None, makespan_bound(costs, procs, m), k, g, stage_layers, costs, procs))
    prepared.sort(key=lambda item: item[:3])  # the contiguous layout first: it is needed anyway
    planned: list[tuple[int, int, int | None, list[list[int]], list[list[StageOp]]]] = []
    for modulo, bound, k, g, stage_layers, costs, procs in prepared:
        known = sorted(plan[:2] for plan in planned)
        cutoff = known[MAX_TIMED_LAYOUTS - 1][0] if modulo and len(known) >= MAX_TIMED_LAYOUTS else None
        if cutoff is not None and bound > cutoff:
            break  # so is every later bound
        stages = StageInfo.of_network(graph, stage_layers)
        made = ooo_order(costs, procs, m, push, stages, interconnect, cutoff)
        if made is not None:
            rows, estimate = made
            planned.append((estimate, k, g, stage_layers, rows))
    return planned


def _layout_options(options: OOOOptions, g: int | None) -> OOOOptions:
    """The options a result of layout g (None: contiguous) reports: its allocation and group size."""
    if g is None:  # a given group size (-g with allocation auto) sized the modulo layout, not this one
        return replace(options, allocation="contiguous", group_size=None)
    return replace(options, allocation="modulo", group_size=g)


def _with_stages(network: Network, graph: TrainingGraph, num_procs: int, model: CostModel, chosen: OOOOptions,
                 options: OOOOptions, interconnect: Interconnect, g: int | None, stage_layers: list[list[int]], m: int,
                 rows: list[list[StageOp]]) -> ScheduleResult:
    """OOO's order `rows` of `stage_layers` (stage s on processor s mod N), timed; `g` None for contiguous;
    `chosen` the layout's options (`_layout_options`), `options` the ones given."""
    procs = min(num_procs, len(stage_layers))
    if g is None:
        layout = f"contiguous allocation: {len(stage_layers)} balanced stages"
    else:
        layout = f"modulo allocation: {len(stage_layers)} groups of {g} layers"
    picked = " (the fastest layout timed)" if options.allocation == "auto" or options.group_size is None else ""
    notes = (f"{layout}{picked} on {procs} of {num_procs} processors, {m} micro-batches per step"
             + (", push: at most N in flight" if options.push else ""),)
    return synchronous_result("ooo", chosen, network, graph, num_procs, model, interconnect, stage_layers,
                              _stage_programs._schedule(rows, m, 1), m, notes)

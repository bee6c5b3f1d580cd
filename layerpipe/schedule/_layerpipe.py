"""The `layerpipe` policy: fine-grained training tasks balanced over N processors in a periodic schedule.

Without a staleness bound the period is the largest processor load, so placement is load balancing over
the tasks — or over each layer's weight tasks F, E, G, U as one item under `keep_weights_together`, which
keeps W_l on one processor (no weight traffic). Three candidate placements are timed: LPT + repair (moves
and swaps off the busiest processor), the iteration's timeline cut into N contiguous runs + repair, and
that cut unrepaired (each body one stretch of the iteration, so lags step about once per processor: the
least staleness, at a slightly longer period). Bodies are ordered and packed by `best_ordering`; lags are
the minimal legal ones. The shortest period wins; within `PERIOD_SLACK` of it, the lowest staleness. A
placement's period and words need no timing, so only the placements that can still win are timed (`_ranked`).

With `max_staleness` K every weight loop must turn around within K + 1 periods (span of F_l … U_l ≤
(K+1)·P). The shortest candidate meeting K is kept unless the modulo list scheduler (tasks at their
earliest fit after their producers) meets K at a shorter period, searched from the bound
max(⌈Σc/N⌉, max c, ⌈T_loop(l)/(K+1)⌉) upward (geometric probe, then bisection).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from layerpipe._memo import BoundedMemo
from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network, split_layer, split_refusal
from layerpipe.schedule._balance import balance, timeline_partition
from layerpipe.schedule._bodies import (
    asap_keys,
    best_ordering,
    default_targets,
    modulo_list_schedule,
    offset_bodies,
    ordering_starts,
    pack_bodies,
    time_bodies,
)
from layerpipe.schedule._comm import Comm
from layerpipe.schedule._comm_timing import Timing, timing_of
from layerpipe.schedule._comm_timing import timed as timed_starts
from layerpipe.schedule._ir import check_unfolding
from layerpipe.schedule._lags import StalenessFloor, asap_times, loop_lengths, timeline
from layerpipe.schedule._placement import PlacementCost, improve, placement_cost
from layerpipe.schedule._planner import Plan, PlanCosts, replicated_layout, replicated_timing
from layerpipe.schedule._planner import plan as plan_stages
from layerpipe.schedule._result import ScheduleResult, periodic_result
from layerpipe.schedule._self_timed import settled
from layerpipe.schedule._task_table import TaskTable, table_of
from layerpipe.schedule._unfold import UnfoldedTable, balanced_unfolded
from layerpipe.schedule.metrics import period_lower_bound

#: Period probes under a staleness bound grow by this factor until one is feasible.
PROBE_GROWTH = 1.03
#: A placement whose period is within this fraction of the shortest may win on staleness.
PERIOD_SLACK = 0.002


@dataclass(frozen=True)
class LayerPipeOptions:
    intra: bool = True  #: split a layer's E and G (they run in parallel)
    inter: bool = True  #: split δ_l (A_l) from e_{l−1} (E_l), so per-layer work can be balanced
    max_staleness: int | None = None  #: bound on how many updates a weight read may lag (None: unbounded)
    keep_weights_together: bool = False  #: a layer's F, E, G, U on one processor: no weight traffic
    max_traffic: float | None = None  #: bound on words moved between processors per sample (None: unbounded)
    split_layers: bool = True  #: also try heavy layers split by output rows/channels (`split_variants`)
    #: also try PipeDream's replicated plan (stages x replicas, several iterations per period) on LayerPipe's
    #: tasks; False keeps one iteration per period (what the generated hardware runs)
    replication: bool = True
    #: J iterations per period (`--unfold`): the graph unfolded by J (`_unfold.balanced_unfolded`), a task's
    #: copies of alternate iterations may sit on different processors (issue 10 item 5)
    unfold: int = 1

    def __post_init__(self) -> None:
        check_unfolding(self.unfold, ())
        if self.max_staleness is not None and self.max_staleness < 0:
            raise InputError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.max_traffic is not None and not self.max_traffic >= 0:
            raise InputError(f"max_traffic (--max-traffic) must be >= 0 words per sample, got {self.max_traffic}; "
                             "the least any placement needs is 0 (every task on one processor)")


def weight_groups(table: TaskTable, together: bool) -> list[int]:
    """Group id per task: a weight layer's F, E, G, U share the layer's id when `together`; others alone."""
    out = []
    for v, t in enumerate(table.tasks):
        layer = table.graph.network.layer(t.layer)
        if together and layer.has_weights and any(t.has(k) for k in "FEGU"):
            out.append(-t.layer)  # negative ids cannot clash with task indices
        else:
            out.append(v)
    return out


def group_items(table: TaskTable, group: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Costs of the placement items and the tasks of each."""
    index: dict[int, int] = {}
    members: list[list[int]] = []
    for v, g in enumerate(group):
        if g not in index:
            index[g] = len(members)
            members.append([])
        members[index[g]].append(v)
    return [sum(table.cost[v] for v in m) for m in members], members


def place_items(members: Sequence[Sequence[int]], item_proc: Sequence[int], num_tasks: int) -> list[int]:
    placement = [0] * num_tasks
    for i, tasks in enumerate(members):
        for v in tasks:
            placement[v] = item_proc[i]
    return placement


def candidate_placements(table: TaskTable, num_procs: int, group: Sequence[int],
                         asap: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Task placements worth timing, and the item costs: LPT and the iteration's timeline cut into runs,
    each repaired by moves and swaps off the busiest processor, and the timeline cut as it is (a longer
    period, but every body one stretch of the iteration: the least staleness)."""
    item_costs, members = group_items(table, group)
    position = {v: k for k, v in enumerate(timeline(table, asap))}
    order = sorted(range(len(members)), key=lambda i: min(position[v] for v in members[i]))
    cut = timeline_partition(item_costs, order, num_procs)
    starts = [balance(item_costs, num_procs), balance(item_costs, num_procs, cut), cut]
    return [place_items(members, item_proc, len(table)) for item_proc in starts], item_costs


def loads_of(table: TaskTable, placement: Sequence[int], num_procs: int) -> list[int]:
    load = [0] * num_procs
    for v, p in enumerate(placement):
        load[p] += table.cost[v]
    return load


def schedule_layerpipe(network: Network, num_procs: int, model: CostModel, options: LayerPipeOptions,
                       interconnect: Interconnect = SHARED) -> ScheduleResult:
    """LayerPipe's schedule of `network` on N processors: the best, by (cycles per sample, words per sample,
    staleness), of its search on N (`_searched`) and its searches on fewer processors, the rest left idle.

    Any placement on N' < N processors is a placement on N, so more processors never make LayerPipe slower.
    The searches do not guarantee that alone: the staleness-bounded one spreads tasks over every processor and
    could miss what fewer processors meet (alexnet on links:2:64, max staleness 2: 7.19e8 cycles per sample
    on 3 processors, 1.14e9 on 4..10; resnet18 at max staleness 4 fell back to one processor on 6 and 8). The
    searches on fewer processors stop where Σc / N' per sample, the least any N' processors can do, is above the
    best found: an unbounded search that balances its N processors rarely looks below N. Above N = 21 the fewer
    counts are a bounded set (`fewer_counts`)."""
    best, fresh = _searched(network, num_procs, model, options, interconnect)
    total = table_of(network, GraphOptions(intra=options.intra, inter=options.inter), model).total
    for fewer in fewer_counts(num_procs):
        m = best.result.metrics
        if total * m.samples_per_period > m.period_cycles * fewer * network.batch:
            break  # Σc / (N' · batch) > period / samples: nothing on N' (or fewer) processors is as fast
        found, _ = _searched(network, fewer, model, options, interconnect)
        if _rank_variant_last(found.result) < _rank_variant_last(best.result):
            best, fresh = found, False
    if fresh:  # computed by this call, naming the caller's network: no one else holds it
        return best.result
    result = best.on(num_procs, network)  # a memoised search, measured afresh for this caller
    if best.result.num_procs == num_procs:
        return result
    note = (f"uses {best.result.num_procs} of the {num_procs} processors: the search on more found nothing faster "
            f"(the others stay idle)")
    return replace(result, notes=(*result.notes, note))


#: The processor counts just below N that `schedule_layerpipe` searches, and the small ones it searches up to:
#: every count below N up to N = NEAR + SMALL + 1 (the zoo's and the papers' counts), a bounded number above.
FEWER_NEAR = 4
FEWER_SMALL = 16


def fewer_counts(num_procs: int) -> list[int]:
    """The counts below N that LayerPipe's schedule on N is compared with, largest first: N − 1 … N − NEAR, the
    halvings of N above SMALL, and SMALL … 1. Every count below N while N ≤ NEAR + SMALL + 1, so more processors
    are never slower there; above, the halvings and the small counts keep what a staleness bound finds on few
    processors (lenet5 at max staleness 2 uses 12 of 128) in 4 + log2(N) + 16 searches, not N − 1 (each a search
    on up to N processors: 117 searches, 10 s, for that lenet5 point)."""
    near = range(num_procs - 1, max(0, num_procs - 1 - FEWER_NEAR), -1)
    halvings = []
    half = num_procs // 2
    while half > FEWER_SMALL:
        halvings.append(half)
        half //= 2
    small = range(min(FEWER_SMALL, num_procs - 1), 0, -1)
    return sorted({*near, *halvings, *small}, reverse=True)


#: A search's schedule measured on N processors (its own or more), naming the given network where it is equal to
#: the one searched (a caller's own object; a split variant keeps its own).
Measure = Callable[[int, Network], ScheduleResult]


class Searched:
    """A search's result on its own processor count, and the same schedule measured on any count (`on`)."""

    def __init__(self, result: ScheduleResult, on: Measure) -> None:
        self.result = result
        self.on = on

    def with_options(self, options: LayerPipeOptions) -> Searched:
        """The same search reported under the caller's `options` (a split variant is searched under others)."""
        on = self.on
        return Searched(replace(self.result, options=options),
                        lambda n, network: replace(on(n, network), options=options))

    def with_note(self, note: str) -> Searched:
        """The same search with one more note, on any processor count."""
        def on(num_procs: int, network: Network) -> ScheduleResult:
            result = self.on(num_procs, network)
            return replace(result, notes=(*result.notes, note))
        return Searched(replace(self.result, notes=(*self.result.notes, note)), on)


def _assemble(**arguments: object) -> Searched:
    """`periodic_result("layerpipe", ..., **arguments)` on the search's N (`arguments["num_procs"]`), and the
    means to measure the same schedule again on any N."""
    def on(num_procs: int, network: Network) -> ScheduleResult:
        table = arguments["table"]
        assert isinstance(table, TaskTable)
        if table.graph.network is not network and table.graph.network == network:
            table = replace(table, graph=table.graph.with_network(network))
        return periodic_result("layerpipe", **{**arguments, "table": table, "num_procs": num_procs})  # type: ignore[arg-type]
    table = arguments["table"]
    assert isinstance(table, TaskTable)
    return Searched(on(arguments["num_procs"], table.graph.network), on)  # type: ignore[arg-type]


def _searched(network: Network, num_procs: int, model: CostModel, options: LayerPipeOptions,
              interconnect: Interconnect) -> tuple[Searched, bool]:
    """`_search`, memoised by its inputs (values; a model that cannot be hashed is not remembered), and whether
    this call computed it: a sweep over N searches each N' once for all the N above it."""
    try:
        key = (network, num_procs, model, options, interconnect)
        found = _SEARCHED.get(key)
    except TypeError:
        return _search(network, num_procs, model, options, interconnect), True
    if found is not None:
        return found, False
    return _SEARCHED.add(key, _search(network, num_procs, model, options, interconnect)), True


#: `_searched`'s memo.
_SEARCHED: BoundedMemo[tuple[object, ...], Searched] = BoundedMemo(32)


def _search(network: Network, num_procs: int, model: CostModel, options: LayerPipeOptions,
            interconnect: Interconnect) -> Searched:
    """The best of `network` as given and, under `split_layers`, its split variants (`split_plans`), by (cycles
    per sample, words per sample, staleness). Variants are searched weight-stationary (`keep_weights_together`;
    the result keeps the caller's options). A split result's network and graph are the variant's and its notes
    name the splits. The unsplit network is the incumbent a variant must beat, so splitting never loses."""
    if options.unfold > 1:  # `--unfold J`: its own search (`_schedule_unfolded`), issue 10 item 5
        return _schedule_unfolded(network, num_procs, model, options, interconnect)
    best = _schedule_network(network, num_procs, model, options, interconnect)
    if not options.split_layers:
        return best
    # The family is weight-stationary (issue 9: "with the weights stationary, which moves only activations"):
    # variants keep every layer's F, E, G, U together, so only activations and errors cross processors.
    stationary = replace(options, keep_weights_together=True)
    chosen: tuple[Searched, tuple[tuple[str, int], ...], Network] | None = None
    for plan in split_plans(network, num_procs, model, best.result.metrics.cycles_per_sample * network.batch):
        variant = network
        for layer, parts in plan:
            variant = split_layer(variant, layer, parts)
        try:
            build_training_graph(variant).costs(model)
        except InputError:  # a model that cannot time the parts (a profile of the unsplit layers): no split
            break
        found = _schedule_network(variant, num_procs, model, stationary, interconnect).with_options(options)
        if _rank(found.result) < _rank(chosen[0].result if chosen else best.result):
            chosen = (found, plan, variant)
    if chosen is None:
        return best
    found, plan, variant = chosen
    note = (f"{'; '.join(f'layer {layer} split into {parts} parts' for layer, parts in plan)} by output "
            f"rows/channels, weights stationary (network {variant.name})")
    return found.with_note(note)


#: Target periods a split plan aims at, as multiples of one processor's fair share ⌈Σc / N⌉: the parts carry
#: per-op overheads and the items must still pack onto N processors, so a little above the share often wins.
SPLIT_TARGETS = (1.0, 1.1, 1.2, 1.35, 1.5)
#: At most this many of the heaviest layers (by F + E + G) are split in one plan.
MAX_SPLIT_LAYERS = 4


def split_plans(network: Network, num_procs: int, model: CostModel,
                period: float) -> list[tuple[tuple[str, int], ...]]:
    """Split plans worth scheduling (issue 9 item 3): for each target T = f·⌈Σc / N⌉ (f in `SPLIT_TARGETS`)
    below the unsplit `period`, every one of the `MAX_SPLIT_LAYERS` heaviest splittable layers whose
    weight-stationary item c_l (all its tasks) exceeds T, split into ⌈c_l / T⌉ parts (at most N and its rows),
    so each part fits the target; distinct plans only. A pruning heuristic, not a search of every split: at
    most five searches, none when no layer outweighs a processor's share (resnet50 at N = 16)."""
    costs = table_of(network, GraphOptions(), model).graph.costs(model)
    own = {layer.index: 0 for layer in network.layers}  # all of a layer's tasks: its weight-stationary item
    for task, cost in costs.items():
        own[task.layer] += cost
    share = -(-sum(costs.values()) // num_procs)  # ⌈Σc / N⌉, the fair share of one processor

    def feg(index: int) -> int:
        layer = network.layer(index)
        kinds = "FG" if layer.takes_network_input else "FEG"
        return sum(model.atomic_cost(layer, k, network.batch) for k in kinds)

    heavy = sorted((i for i, c in own.items() if c > share and split_refusal(network, i, 2) is None),
                   key=lambda i: (-feg(i), i))[:MAX_SPLIT_LAYERS]
    plans: list[tuple[tuple[str, int], ...]] = []
    for factor in SPLIT_TARGETS:
        target = factor * share
        if target >= period:
            break
        plan = tuple((network.layer(i).name, min(math.ceil(own[i] / target), num_procs, network.layer(i).out_shape[0]))
                     for i in heavy if own[i] > target)
        plan = tuple((name, k) for name, k in plan if k >= 2)
        if plan and plan not in plans:
            plans.append(plan)
    return plans


def _rank(result: ScheduleResult) -> tuple[float, float, int]:
    m = result.metrics
    return (m.cycles_per_sample, m.traffic_words_per_sample, m.max_staleness)


def _rank_variant_last(result: ScheduleResult) -> tuple[float, float, int, bool]:
    """`_rank`, then the network as given before a split variant: a variant is kept only when it is better, on
    any processor count, as within one search (`_search`)."""
    return (*_rank(result), result.network is not None and result.network.origin is not None)


def _schedule_network(network: Network, num_procs: int, model: CostModel, options: LayerPipeOptions,
                      interconnect: Interconnect = SHARED) -> Searched:
    """LayerPipe's placement search on one network (as given, or a split variant)."""
    table = table_of(network, GraphOptions(intra=options.intra, inter=options.inter), model)
    asap = asap_times(table)
    max_words = None if options.max_traffic is None else options.max_traffic * network.batch
    k = options.max_staleness
    replicated = _replicated_candidate(table, num_procs, model, interconnect, options, max_words)
    beaten = _replicated_beats_every_placement(table, num_procs, interconnect, options, replicated)
    if beaten is not None:
        laid, one = beaten
        if k is None:
            return laid
        if laid.result.metrics.max_staleness <= k:
            return _fewer_stages(table, num_procs, model, interconnect, options, max_words, laid,
                                 (Fraction(one), Fraction(-1)))
    planned = planned_straight_pipelines(network, num_procs, model, interconnect)
    ranked = ranked_space(table, num_procs, asap, options, interconnect, max_words, planned)
    if k is None:
        # The period on the interconnect first, then the words moved, then staleness: only the placements of
        # the least (period, words) are timed (the first group), and none when the replicated plan beats them.
        period, words = ranked[0][0][1].period, ranked[0][0][1].words
        if replicated is not None and _per_sample(replicated) < (Fraction(period), Fraction(words)):
            return _replicated_result(table, replicated, num_procs, interconnect, options)
        best = min((_time(table, num_procs, placement, asap, interconnect, cost) for placement, cost in ranked[0]),
                   key=lambda t: t.timing.score())
    else:
        # The shortest period among the candidates that meet the bound, unless list scheduling finds shorter.
        # The groups go by (period, words), so the first group with a candidate meeting the bound holds the
        # shortest such period and, among its candidates that meet it, the fallback (fewest words, then score).
        ceiling, fallback = None, None
        floor = StalenessFloor(table, interconnect)
        for placements in ranked:
            # A placement none of whose body orders can meet the bound (`StalenessFloor`) is not timed: only
            # the candidates that meet it are read
            timed = [_time(table, num_procs, placement, asap, interconnect, cost) for placement, cost in placements
                     if not _cannot_meet(table, num_procs, placement, asap, cost.period, floor, k)]
            meeting = [t for t in timed if t.timing.score()[0] <= k]
            if meeting:
                ceiling, fallback = meeting[0].period, min(meeting, key=lambda t: t.timing.score())
                break
        group = weight_groups(table, options.keep_weights_together)
        item_costs, _ = group_items(table, group)
        found = _bounded(table, num_procs, group, item_costs, asap, k, ceiling, interconnect, max_words)
        chosen = found or fallback
        assert chosen is not None, "_bounded finds a period whenever no candidate meets the bound"
        chosen = _pipedream_orders(table, num_procs, model, interconnect, options, max_words, planned, chosen)
        best = _settle(table, _tightened(table, chosen, k, num_procs, interconnect), k, num_procs, interconnect)
    group = weight_groups(table, options.keep_weights_together)
    item_costs, _ = group_items(table, group)
    searched = _assemble(options=options, table=table, num_procs=num_procs, placement=best.placement,
                         start=best.timing.start, lag=best.timing.lag, period=best.period, item_costs=item_costs,
                         max_staleness=k, interconnect=interconnect, arrival=best.timing.arrival)
    if k is not None and replicated is not None and _per_sample(replicated) < (Fraction(best.period),
                                                                             Fraction(best.cost.words)):
        # PipeDream's replicated plan under the bound too, when it meets it: the unbounded search's winner
        # whenever that winner is within the bound (resnet50 on links:2:64, N = 16, max staleness 4: 7.67e8
        # cycles per sample at staleness 4, where the single-iteration bounded search found 2.47e9).
        laid = beaten[0] if beaten is not None else _replicated_result(table, replicated, num_procs, interconnect,
                                                                        options)
        if laid.result.metrics.max_staleness <= k and _rank(laid.result) < _rank(searched.result):
            searched = laid
    if k is not None:
        return _fewer_stages(table, num_procs, model, interconnect, options, max_words, searched,
                             (Fraction(best.period), Fraction(best.cost.words)))
    return searched


def _replicated_beats_every_placement(table: TaskTable, num_procs: int, interconnect: Interconnect,
                                      options: LayerPipeOptions, replicated: ReplicatedCandidate | None
                                      ) -> tuple[Searched, int] | None:
    """PipeDream's replicated plan laid out, with the bound it beats, when its period per iteration is below
    `period_lower_bound` of the table's tasks on N processors — a bound on the busiest processor of *any*
    placement of one iteration, so on the period of every candidate the single-iteration searches (the ranked
    space, the bounded search, PipeDream's straight pipelines) could time. Branch and bound: the search then
    returns what it would have returned, without building the space (on `rtl` the data-parallel plan beats
    every single-iteration placement of the zoo at nearly every N — lenet5 at N = 3 ties the bound; issue 14: the
    space was most of the layerpipe policy's time). The laid-out result's cycles per sample (a float, as `_rank`
    compares them) are checked below the bound's too, so it outranks every such candidate as the search would
    rank them. None otherwise."""
    if replicated is None:
        return None
    one = period_lower_bound(table.cost, num_procs)
    if _per_sample(replicated)[0] >= one:
        return None
    laid = _replicated_result(table, replicated, num_procs, interconnect, options)
    if laid.result.metrics.cycles_per_sample >= one / table.graph.network.batch:
        return None
    return laid, one


def _pipedream_orders(table: TaskTable, num_procs: int, model: CostModel, interconnect: Interconnect,
                      options: LayerPipeOptions, max_words: float | None,
                      planned: tuple[tuple[tuple[int, ...], ...], ...], chosen: Candidate) -> Candidate:
    """Under a staleness bound, PipeDream's straight pipelines (`pipedream_placement`'s and the planner's,
    `planned`) timed as PipeDream times them — its 1F1B body orders (`_pipedream._one_f_one_b`) — on LayerPipe's
    tasks, when one meets the bound and beats `chosen` by (period, words, staleness). The bounded search times
    those placements with its own orders, which can miss PipeDream's: mlp:1-1-9 on 2 processors, links:1:1/16,
    max staleness 3, where PipeDream runs at 16 cycles per sample with staleness 3 and the search found 18. Each
    straight pipeline also as PipeDream's own timing of it, carried onto LayerPipe's tasks (`_carried`), and
    PipeDream's own work-balanced cut (`pipedream --no-replication` cuts its fused tasks' work)."""
    from layerpipe.schedule._pipedream import _one_f_one_b, stage_layers

    k = options.max_staleness
    assert k is not None
    pd_table = table_of(table.graph.network, GraphOptions.pipedream(), model)
    cuts = [stage_layers(table, num_procs), stage_layers(pd_table, num_procs),
            *([list(run) for run in stages] for stages in planned)]
    cuts = [cut for i, cut in enumerate(cuts) if cut not in cuts[:i]]
    timings = [_one_f_one_b(table, num_procs, interconnect, cut) for cut in cuts]
    timings += [_carried(table, pd_table, num_procs, interconnect, cut) for cut in cuts]
    for placement, period, timing in timings:
        if timing.score()[0] > k or (options.keep_weights_together and not _keeps_weights(table, placement)):
            continue
        cost = placement_cost(table, placement, num_procs, interconnect)
        if max_words is not None and cost.words > max_words:
            continue
        if (period, cost.words, timing.score()) < (chosen.period, chosen.cost.words, chosen.timing.score()):
            chosen = Candidate(placement, period, cost, timing)
    return chosen


def _carried(table: TaskTable, pd_table: TaskTable, num_procs: int, interconnect: Interconnect,
             cut: list[list[int]]) -> tuple[list[int], int, Timing]:
    """PipeDream's own 1F1B timing of a straight pipeline, on its own tasks (a layer's backward one task, A;E;G),
    carried onto LayerPipe's: each fused task's parts run one after another from where it ran, on its processor.
    PipeDream's orders timed afresh on LayerPipe's split tasks (the parts packed one by one) can differ from that
    and come out staler: a residual network on 3 processors, bus:1:2, whose PipeDream schedule runs at 18 cycles
    per sample with staleness 3 gave staleness 4 and 5 on LayerPipe's tasks, so LayerPipe under a bound of 3
    found 19. Where the parts cost more than the whole (per-task overheads), they are packed at or after those
    offsets and the period grows to the busiest processor or channel."""
    from layerpipe.schedule._pipedream import _one_f_one_b

    pd_placement, pd_period, pd_timing = _one_f_one_b(pd_table, num_procs, interconnect, cut)
    fused: dict[tuple[int, str], int] = {}  # (layer, letter) → the PipeDream task holding it
    for u, t in enumerate(pd_table.tasks):
        for letter in t.kind:
            fused[(t.layer, letter)] = u
    owner = [fused[(t.layer, t.kind[0])] for t in table.tasks]
    # Each part's offset in its fused task: A first (E and G read it), the error E last, so the error leaves
    # for the previous stage when PipeDream's fused task sends it (sent earlier, it could take a shared channel
    # ahead of a transfer PipeDream sends first: on bus:1:2, E2 → A1 ahead of F1 → F2 delayed F2 by a period)
    def order(v: int) -> int:
        kind = table.tasks[v].kind
        return 0 if "A" in kind else 2 if "E" in kind else 1

    before = [0] * len(table)
    parts: dict[int, list[int]] = {}
    for v, u in enumerate(owner):
        parts.setdefault(u, []).append(v)
    for vs in parts.values():
        at = 0
        for v in sorted(vs, key=order):
            before[v] = at
            at += table.cost[v]
    placement = [pd_placement[u] for u in owner]
    target = [pd_timing.lag[u] * pd_period + pd_timing.start[u] + before[v] for v, u in enumerate(owner)]
    comm = Comm(placement, interconnect, num_procs)
    period = max(pd_period, placement_cost(table, placement, num_procs, interconnect).period)
    if period == pd_period and all(sum(table.cost[v] for v in vs) == pd_table.cost[u] for u, vs in parts.items()):
        return placement, period, timed_starts(table, [t % period for t in target], period, comm)
    return placement, period, pack_bodies(table, offset_bodies(placement, num_procs, target, period), period, target,
                                          comm)


def _fewer_stages(table: TaskTable, num_procs: int, model: CostModel, interconnect: Interconnect,
                  options: LayerPipeOptions, max_words: float | None, searched: Searched,
                  slower: tuple[Fraction, Fraction]) -> Searched:
    """Under a staleness bound, PipeDream's best replicated plans of fewer stages than its fastest, down to one
    stage (data parallelism on up to N replicas), each laid out on LayerPipe's tasks: in 1F1B-RR the
    micro-batches in flight, and with them the staleness, grow with the stages, so a plan of fewer stages can
    meet a bound its fastest plan misses and still beat the single-iteration bounded search (resnet18 on
    links:2:1/16, N = 8, max staleness 2: one stage on 8 replicas, 2.34e7 cycles per sample at staleness 2,
    against 4.42e7). The best-ranked of `searched` (the bounded search's result, or PipeDream's fastest plan
    where that met the bound and ranked better) and the plans that meet the bound is kept; a plan whose layout
    alone, (period, words) per iteration, is not below `slower` — the bounded search's candidate's, or a lower
    bound on every single-iteration candidate's period that `searched` already beats — is not timed."""
    k = options.max_staleness
    assert k is not None
    if options.keep_weights_together or not options.replication:
        return searched  # no replicated candidate at all (`_replicated_candidate`)
    pd_table = table_of(table.graph.network, GraphOptions.pipedream(), model)
    chosen, tried = searched, set()
    for limit in range(len(plan_stages(PlanCosts(pd_table, interconnect), num_procs).stages) - 1, 0, -1):
        candidate = _replicated_candidate(table, num_procs, model, interconnect, options, max_words, limit)
        if candidate is None or candidate.plan in tried or _per_sample(candidate) >= slower:
            continue  # no replicas (the single-iteration search holds it), too many words, seen, or slower anyway
        tried.add(candidate.plan)
        laid = _replicated_result(table, candidate, num_procs, interconnect, options)
        if laid.result.metrics.max_staleness <= k and _rank(laid.result) < _rank(chosen.result):
            chosen = laid
    return chosen


def _per_sample(replicated: ReplicatedCandidate) -> tuple[Fraction, Fraction]:
    """The replicated plan's (period, words) per iteration: J iterations per period."""
    unfold = replicated.table.unfold
    return Fraction(replicated.period, unfold), Fraction(replicated.words, unfold)


def _replicated_result(table: TaskTable, replicated: ReplicatedCandidate, num_procs: int,
                       interconnect: Interconnect, options: LayerPipeOptions) -> Searched:
    laid = replicated_timing(table, replicated.plan, num_procs, interconnect)
    note = f"PipeDream's replicated placement, on LayerPipe's tasks: {replicated.note}"
    return _assemble(options=options, table=laid.table, num_procs=num_procs, placement=laid.placement,
                     start=laid.timing.start, lag=laid.timing.lag, period=laid.period, item_costs=laid.table.cost,
                     interconnect=interconnect, arrival=laid.timing.arrival, base_item_costs=table.cost,
                     notes=(note,))


def ranked_space(table: TaskTable, num_procs: int, asap: Sequence[int], options: LayerPipeOptions,
                 interconnect: Interconnect, max_words: float | None,
                 planned: tuple[tuple[tuple[int, ...], ...], ...] = ()) -> list[list[tuple[list[int], PlacementCost]]]:
    """`_ranked` of `search_space`, memoised by what they read: the table's content (`TaskTable.token`) and graph,
    N, `keep_weights_together` (the only option the space reads), the interconnect and `max_words`. `asap` is
    `asap_times(table)`, a function of the table, so the table's key covers it. A sweep schedules layerpipe with
    and without a staleness bound at each network × N, and both start from this same space (issue 14: a fifth of
    the layerpipe policy's time). `planned` (`planned_straight_pipelines`) is part of the key. Each caller gets its
    own lists."""
    key = (table.token, table.graph, num_procs, options.keep_weights_together, interconnect, max_words, planned)
    found = _RANKED.get(key)
    if found is None:
        found = _RANKED.add(key, _ranked(table, num_procs, search_space(table, num_procs, asap, options,
                                                                          interconnect, max_words, planned),
                                         interconnect, max_words))
    return [[(list(placement), cost) for placement, cost in group] for group in found]


#: `ranked_space`'s memo (`PlacementCost` is frozen; the placements are copied out).
_RANKED: BoundedMemo[tuple[object, ...], list[list[tuple[list[int], PlacementCost]]]] = BoundedMemo(16)


def _ranked(table: TaskTable, num_procs: int, placements: Sequence[list[int]], interconnect: Interconnect,
            max_words: float | None) -> list[list[tuple[list[int], PlacementCost]]]:
    """The placements with their costs (those within `max_words`), grouped by (period, words), the groups in
    increasing order and each in search order: the policy ranks candidates by (period, words, staleness), so
    the period and words — which need no timing — say which ones are worth timing. One processor moving
    nothing is always within a bound, so there is always a group."""
    groups: dict[tuple[int, int], list[tuple[list[int], PlacementCost]]] = {}
    for placement in placements:
        cost = placement_cost(table, placement, num_procs, interconnect)
        if max_words is None or cost.words <= max_words:
            groups.setdefault((cost.period, cost.words), []).append((placement, cost))
    return [groups[key] for key in sorted(groups)]


@dataclass(frozen=True)
class Candidate:
    """A placement timed on the interconnect: its period, traffic and body timing."""

    placement: list[int]
    period: int
    cost: PlacementCost
    timing: Timing


def _time(table: TaskTable, num_procs: int, placement: list[int], asap: Sequence[int],
          interconnect: Interconnect, cost: PlacementCost | None = None) -> Candidate:
    cost = cost or placement_cost(table, placement, num_procs, interconnect)
    period = cost.period
    timing = best_ordering(table, placement, num_procs, period, asap_keys(asap, period),
                           default_targets(table, placement, num_procs, asap), interconnect)
    return Candidate(placement, period, cost, timing)


def _cannot_meet(table: TaskTable, num_procs: int, placement: list[int], asap: Sequence[int], period: int,
                 floor: StalenessFloor, k: int) -> bool:
    """Whether every timing `_time` would try for the placement (its body orders and packings at `period`)
    has a staleness above k by its starts alone (`StalenessFloor.above`), so its best cannot meet k."""
    starts = ordering_starts(table, placement, num_procs, period, asap_keys(asap, period),
                             default_targets(table, placement, num_procs, asap))
    return all(floor.above(placement, start, period, k) for start in starts)


def search_space(table: TaskTable, num_procs: int, asap: Sequence[int], options: LayerPipeOptions,
                 interconnect: Interconnect, max_words: float | None,
                 planned: tuple[tuple[tuple[int, ...], ...], ...] = ()) -> list[list[int]]:
    """The placements LayerPipe times (design notes §11, issue 9's search space):

    - load-balanced placements of single tasks (LPT + repair, the timeline cut + repair, the cut as is);
    - weight-stationary placements: the same three over items that keep a layer's F, E, G, U where W_l
      lives (no weight or gradient traffic; A and weightless layers move freely);
    - PipeDream's own placements, so LayerPipe is never slower than PipeDream on the same interconnect: its
      straight pipeline balanced by work (`pipedream --no-replication`), and the straight pipelines its planner
      picks on this interconnect (`planned`, each stage's layers: `planned_straight_pipelines`; a replicated
      plan is the unfolded candidate, `_replicated_candidate`);
    and, off `shared`, each of them improved by `improve` (moves off the busiest processor or channel while
    they lower the period, then the words moved) — which moves a G away from its U only when the gradient
    transfer pays. `keep_weights_together` keeps only weight-stationary items.
    """
    together = weight_groups(table, True)
    groupings = [together] if options.keep_weights_together else [weight_groups(table, False), together]
    out: list[list[int]] = []
    for group in groupings:
        out += candidate_placements(table, num_procs, group, asap)[0]
    for pipedream in [pipedream_placement(table, num_procs, stages) for stages in (None, *planned)]:
        if not options.keep_weights_together or _keeps_weights(table, pipedream):
            out.append(pipedream)
    if max_words is not None:
        out.append([0] * len(table))  # one processor moves nothing: a bound is always met
    if not interconnect.is_shared or max_words is not None:
        _, members = group_items(table, together if options.keep_weights_together else range(len(table)))
        out += [improve(table, placement, num_procs, interconnect, members, max_words) for placement in out]
    unique: dict[tuple[int, ...], list[int]] = {}
    for placement in out:
        unique.setdefault(tuple(placement), placement)
    return list(unique.values())


@dataclass(frozen=True)
class ReplicatedCandidate:
    """PipeDream's replicated plan laid out on LayerPipe's tasks (its unfolded table and period), with its words
    moved per period; `replicated_timing(table, plan, ...)` times it when it wins."""

    plan: Plan
    table: UnfoldedTable
    placement: tuple[int, ...]
    period: int
    words: int
    note: str


def _replicated_candidate(table: TaskTable, num_procs: int, model: CostModel, interconnect: Interconnect,
                          options: LayerPipeOptions, max_words: float | None,
                          max_stages: int | None = None) -> ReplicatedCandidate | None:
    """PipeDream's own plan — contiguous stages *and* replicas, 1F1B-RR, on this interconnect (`_planner`) —
    with LayerPipe's finer tasks on the same processors: its loads and channels are PipeDream's, so its
    period is at most PipeDream's. This keeps LayerPipe's search space a superset of the strongest PipeDream's
    (design notes §11). None when the plan has no replicas (the single-iteration search already holds it),
    when weights must stay together and a replica set splits them, or when it moves more words than allowed.

    LayerPipe's own moves are not applied on top of the replicas: moving A/G copies of an unfolded table gave
    plans the self-timed run did not keep (simulated 81.2 vs planned 77 cycles on a generated residual network,
    links:1:1/8), so the replicated candidate is PipeDream's plan exactly, on LayerPipe's tasks.

    `max_stages`: PipeDream's best plan of at most that many stages instead (a staleness bound's candidates:
    `_fewer_stages`)."""
    if options.keep_weights_together or not options.replication:
        return None
    pd_table = table_of(table.graph.network, GraphOptions.pipedream(), model)
    costs = PlanCosts(pd_table, interconnect)
    best = plan_stages(costs, num_procs, max_stages=max_stages)
    if best.unfold == 1:
        return None
    laid = replicated_layout(table, best, num_procs, interconnect)
    words = placement_cost(laid.table, laid.placement, num_procs, interconnect).words
    if max_words is not None and words > max_words * laid.table.unfold:
        return None
    return ReplicatedCandidate(best, laid.table, laid.placement, laid.period, words,
                               f"stages x replicas {best.describe(costs.layers)}")


def planned_straight_pipelines(network: Network, num_procs: int, model: CostModel,
                               interconnect: Interconnect) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The plans of PipeDream's planner on this interconnect that are straight pipelines (one replica per
    stage: one iteration per period), as each stage's layers, stage s on processor s: its best plan when that
    has no replicas, and its best without replication (`pipedream --no-replication` balances work alone). The
    planner cuts stages by compute *and* the words crossing each cut, so its straight pipeline can differ from
    `pipedream_placement`'s: a random residual network on 2 processors, links:2:1/4, was planned 1 | 2-4 at 25
    cycles per sample, where LayerPipe, without that placement, found 28."""
    pd_table = table_of(network, GraphOptions.pipedream(), model)
    costs = PlanCosts(pd_table, interconnect)
    out: dict[tuple[tuple[int, ...], ...], None] = {}
    for replication in (True, False):
        best = plan_stages(costs, num_procs, replication)
        if best.unfold == 1:
            out[tuple(tuple(costs.layers[s.first:s.last + 1]) for s in best.stages)] = None
    return tuple(out)


def pipedream_placement(table: TaskTable, num_procs: int, stages: Sequence[Sequence[int]] | None = None) -> list[int]:
    """PipeDream's straight-pipeline placement of `table`'s tasks, stage s on processor s: `stages` (each stage's
    layers), or by default contiguous stages cut by `pipedream --no-replication`'s rule on `table` itself. Per-layer
    work is the same fused (PipeDream's graph) or split (LayerPipe's) only without per-task overheads: a split
    backward pays the overhead three times, so the two cuts can differ, and callers that must hold PipeDream's
    own plan pass its stages (`_pipedream_orders` tries both)."""
    from layerpipe.schedule._pipedream import stage_layers

    if stages is None:
        stages = stage_layers(table, num_procs)
    stage_of = {layer: s for s, run in enumerate(stages) for layer in run}
    return [stage_of[t.layer] for t in table.tasks]


def _keeps_weights(table: TaskTable, placement: Sequence[int]) -> bool:
    group = weight_groups(table, True)
    home: dict[int, int] = {}
    return all(home.setdefault(g, placement[v]) == placement[v] for v, g in enumerate(group) if g < 0)


def _tightened(table: TaskTable, best: Candidate, k: int, num_procs: int, interconnect: Interconnect) -> Candidate:
    """`best`'s bodies (each processor's tasks in start order) re-timed without gaps at the shortest period
    from its busiest processor or channel up that still meets staleness ≤ k, if shorter than its own.

    The bounded search probes and bisects periods of the modulo list scheduler, which assumes that a longer
    period is always easier; it is not, so the schedule it returns can have slack the self-timed run does not
    keep: mlp:16-12-8-4 on 3 processors, max staleness 1, links:1:1 was scheduled at 219 cycles and simulated
    at 178, and the same bodies without gaps meet the bound at 178 (its busiest processor)."""
    low = best.cost.period
    if low >= best.period:
        return best
    bodies = [sorted((v for v in range(len(table)) if best.placement[v] == p), key=lambda v: (best.timing.start[v], v))
              for p in range(num_procs)]
    comm = None if interconnect.is_shared else Comm(best.placement, interconnect, num_procs)

    def attempt(period: int) -> Candidate | None:
        timing = time_bodies(table, bodies, period, comm)
        return Candidate(best.placement, period, best.cost, timing) if timing.score()[0] <= k else None

    found = attempt(low)
    return found if found is not None else _bisect(attempt, low, best.period, best)


def _settle(table: TaskTable, best: Candidate, k: int, num_procs: int, interconnect: Interconnect) -> Candidate:
    """`best` at the period its self-timed run settles at (`_self_timed.settled`: the same bodies, lags and
    pinned reads, re-timed at the ceiling of its constraint graph's maximum cycle ratio), when shorter.

    `_tightened` re-times bodies gap-free, and where that breaks the bound it keeps the searched period, which
    can still have slack: mlp:16-12-8-4 on 3 processors, max staleness 1 was scheduled at 90 cycles on
    `shared` (143 on links:2:16) and simulated at 89 (140), the ratio of its graph.

    The graph holds every processor's and every link's cycle (its load over one period), so its ratio is at
    least the busiest processor or channel: a timing at that period has no slack to take out (not re-timed)."""
    if best.period <= best.cost.period:
        return best
    found = settled(table, best.placement, num_procs, best.timing, best.period, interconnect)
    if found.period >= best.period or found.timing.score()[0] > k:
        return best
    return Candidate(best.placement, found.period, best.cost, found.timing)


def _bisect(attempt: Callable[[int], Candidate | None], failed: int, period: int, found: Candidate) -> Candidate:
    """Bisection between a period that failed and one that succeeded (`found`): the best success seen."""
    while period - failed > 1:
        mid = (failed + period) // 2
        trial = attempt(mid)
        if trial is None:
            failed = mid
        else:
            period, found = mid, trial
    return found


def _bounded(table: TaskTable, num_procs: int, group: Sequence[int], item_costs: Sequence[int],
             asap: Sequence[int], k: int, known: int | None, interconnect: Interconnect = SHARED,
             max_words: float | None = None) -> Candidate | None:
    """The smallest period below `known` (a period already achieved with staleness ≤ k, or None) at which
    the modulo list scheduler meets staleness ≤ k on the interconnect (its placement's channels must fit the
    period, its transfers are planned); None if it finds none below `known`."""
    priority = sorted(range(len(table)), key=lambda v: (asap[v], v))
    together = group if any(g < 0 for g in group) else None
    floor = StalenessFloor(table, interconnect)

    def attempt(period: int, fixed: Sequence[int] | None = None) -> Candidate | None:
        found = modulo_list_schedule(table, period, num_procs, priority, together, fixed)
        if found is None:
            return None
        placement, sigma = found
        start = [s % period for s in sigma]
        if floor.above(placement, start, period, k):  # no timing of these starts meets the bound: not planned
            return None
        cost = placement_cost(table, placement, num_procs, interconnect)
        if cost.period > period or (max_words is not None and cost.words > max_words):
            return None
        comm = Comm(placement, interconnect, num_procs)
        if interconnect.is_shared:
            listed = timing_of(table, start, [s // period for s in sigma], period)
            best = min(listed, timed_starts(table, start, period, comm), key=Timing.score)
        else:  # the listed timing is the tight one
            best = timed_starts(table, start, period, comm)
        return Candidate(placement, period, cost, best) if best.score()[0] <= k else None

    low = period_lower_bound(item_costs, num_procs, loop_lengths(table), k)
    # A whole iteration run through on one processor fits every loop in one period: always feasible.
    ceiling = max(table.total, low)
    if known is not None:
        if known <= low:
            return None
        ceiling = known - 1
    serial = [0] * len(table)
    failed, period = low - 1, low
    while True:
        found = attempt(period)
        if found is not None:
            break
        if period >= ceiling:
            if known is not None:
                return None
            found = attempt(period, serial)
            assert found is not None, "one processor running one iteration after another meets any bound"
            break
        failed, period = period, min(ceiling, max(period + 1, int(period * PROBE_GROWTH)))
    return _bisect(attempt, failed, period, found)


def _schedule_unfolded(network: Network, num_procs: int, model: CostModel, options: LayerPipeOptions,
                       interconnect: Interconnect) -> Searched:
    """`--unfold J`: LayerPipe's tasks unfolded by J and balanced copy by copy (`balanced_unfolded`); no layer
    splits, no staleness or traffic bound (refused rather than ignored)."""
    if options.max_staleness is not None or options.max_traffic is not None:
        raise InputError("--unfold takes no --max-staleness or --max-traffic (the unfolded search is by load only)")
    graph = build_training_graph(network, GraphOptions(intra=options.intra, inter=options.inter))
    table = TaskTable.of(graph, model)
    unfolded, placement, period, timing = balanced_unfolded(table, options.unfold, num_procs, interconnect,
                                                            options.keep_weights_together)
    return _assemble(options=options, table=unfolded, num_procs=num_procs, placement=placement,
                     start=timing.start, lag=timing.lag, period=period, item_costs=unfolded.cost,
                     interconnect=interconnect, arrival=timing.arrival, base_item_costs=table.cost)

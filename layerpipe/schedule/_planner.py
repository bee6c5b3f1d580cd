"""PipeDream's planner: contiguous stages and a replica count per stage (Narayanan et al., SOSP'19, §3.1).

PipeDream's optimizer (github.com/msr-fiddle/pipedream, `optimizer/optimizer_graph_hierarchical.py`,
`compute_partitioning`) fills A(j, m), the best time per mini-batch of the first j layers on m machines, as
min over a cut k < j and the last stage's replicas m' of max(A(k, m − m'), T(k+1..j, m'), transfer(k)),
where T(stage, m') = (compute + all-reduce) / m'. We use its recurrence on our cost model and interconnect
(read to learn the scheme; the code is our own):

- Work per layer is the training graph of `GraphOptions.pipedream()` (F, fused backward B = A;E;G, U) under
  the cost model. A stage of layers i..j on r replicas runs every r-th micro-batch on each replica
  (1F1B-RR, round-robin); the replicas' gradients are summed and applied once per round of r micro-batches
  (one update group of r iterations, `layerpipe.schedule._unfold`).
- All-reduce, as modelled: reduce to one replica (the root, which runs the stage's updates) and broadcast,
  2(r − 1)·|W| words per round: every other replica sends its gradient of every layer to the root and gets
  the new weights back — the training graph's own G → U and U → F edges, so the simulator times them as
  transfers. (PipeDream's formula charges a ring-like 4(m'−1)|W|/m' per mini-batch; reduce + broadcast
  moves half of that over links that the root shares, which is what a point-to-point interconnect without
  a reduction engine can do.)
- Per micro-batch in steady state a stage costs max(root compute, all-reduce link) / r:
  root compute = Σ (F + B + U) / r (the root also applies the updates), and on `links` each root ↔ replica
  link holds Σ_l ⌈|W_l| / w⌉ per round. A cut between stages of r and r' replicas sends micro-batch t from
  replica t mod r to replica t mod r', so each of the lcm(r, r') links that carry it holds
  Σ ⌈words / w⌉ / lcm(r, r') per micro-batch, each direction on its own link. On a `bus` every transfer
  shares the medium, so its load is a sum over stages and cuts: the recurrence keeps, per state, the
  Pareto front of (largest stage or link term, bus load) and minimises their maximum at the end. On
  `shared` communication is free and only compute counts.
- The objective is cycles per micro-batch, an exact fraction; ties go to more processors (no idle
  processor when it costs nothing), then fewer stages, then the earlier cut. A stage of a DAG is a
  contiguous run of layers in topological order; cuts charge every edge that crosses them as if it ran
  between the two adjacent stages (PipeDream's convention; exact on chains, an estimate when a skip edge
  spans more than one stage — the schedule built from the plan then times the real transfers).
- A stage may have any replica count up to N, as in PipeDream (its A(j, m) tries every m' ≤ m). The periodic
  schedule needs the rounds of all stages to line up in J = lcm(replicas) micro-batches per period (the
  unfolding), so a plan's J is capped at `round_cap(N)` = max(12, N) (at most 64, the most iterations a period
  holds): every single count up to N (pure data parallelism on N included) and every mix whose lcm fits, e.g.
  2 + 6 or 3 + 4 + 1 at N = 8, but not 3 + 8 at N = 11 (J = 24). The search runs once per round R of
  `rounds(N)` over the counts dividing R; together they cover exactly the capped space. Micro-batches in
  flight follow from the 1F1B-RR lags; NOAM (⌈N / replicas of the input stage⌉, SOSP'19 §3.2) is reported
  with the plan.

`brute_force_plan` enumerates every (partition, replicas) with the same objective, for the tests.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from layerpipe._memo import BoundedMemo
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._bodies import (
    contiguous_starts,
    default_targets,
    modulo_list_schedule,
    offset_bodies,
    order_bodies,
    packed_starts,
)
from layerpipe.schedule._comm import Comm, busiest_channel
from layerpipe.schedule._comm_timing import Timing
from layerpipe.schedule._ir import MAX_UNFOLD
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._replicated_scores import Trial, best_trial, timed_trial
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import UnfoldedTable, unfold_table

#: The least cap on J = lcm(replicas), the micro-batches per period in which the rounds of all stages line up
#: (`round_cap`); 12 holds the mixes of 1, 2, 3, 4 and 6 replicas.
MAX_ROUND = 12


def round_cap(num_procs: int) -> int:
    """The largest J = lcm(replicas) a plan on `num_procs` processors may have: max(12, N), so every replica
    count up to N is allowed on its own — up to the most iterations a period may hold (`MAX_UNFOLD` = 64: each
    body holds J copies of its tasks), so past 64 processors a stage has at most 64 replicas."""
    return min(max(MAX_ROUND, num_procs), MAX_UNFOLD)


def rounds(num_procs: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The searches that cover every plan of J ≤ `round_cap(N)`: (R, the replica counts ≤ N that divide R), for
    each R ≤ the cap whose counts are not all among another R's. A plan of J = L ≤ the cap has every count in
    L's set, hence in a kept one; a plan in R's set has J dividing R. So their union is the capped space."""
    cap = round_cap(num_procs)
    kept: dict[int, tuple[int, ...]] = {}
    for r in range(cap, 0, -1):
        counts = tuple(c for c in range(1, min(r, num_procs) + 1) if r % c == 0)
        if not any(set(counts) <= set(other) for other in kept.values()):
            kept[r] = counts
    return tuple(sorted(kept.items()))


def replica_counts(num_procs: int) -> tuple[int, ...]:
    """Every replica count a stage may have on `num_procs` processors (1..min(N, 64))."""
    return tuple(sorted({c for _, counts in rounds(num_procs) for c in counts}))


@dataclass(frozen=True)
class Stage:
    """Layers `first`..`last` (positions in the network's topological order, inclusive) on `replicas`."""

    first: int
    last: int
    replicas: int


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    cycles: Fraction  #: steady-state cycles per micro-batch under the planner's cost model

    @property
    def procs(self) -> int:
        return sum(s.replicas for s in self.stages)

    @property
    def unfold(self) -> int:
        """J: micro-batches per period so that every stage completes whole rounds."""
        return math.lcm(*(s.replicas for s in self.stages))

    @property
    def noam(self) -> int:
        """PipeDream's number of optimal active mini-batches, ⌈N / replicas of the input stage⌉ (§3.2)."""
        return -(-self.procs // self.stages[0].replicas)

    def describe(self, layers: Sequence[int]) -> str:
        parts = []
        for s in self.stages:
            span = f"{layers[s.first]}" if s.first == s.last else f"{layers[s.first]}-{layers[s.last]}"
            parts.append(f"{span}x{s.replicas}")
        return " | ".join(parts)


class PlanCosts:
    """Per-layer sums of the planner's cost model (prefix sums, so a stage costs O(1))."""

    def __init__(self, table: TaskTable, interconnect: Interconnect = SHARED) -> None:
        network = table.graph.network
        self.layers = [layer.index for layer in network.layers]
        position = {layer: i for i, layer in enumerate(self.layers)}
        n = len(self.layers)
        self.interconnect = interconnect
        ic = interconnect
        work, update, weight_hold = [0] * n, [0] * n, [0] * n
        for t, c in zip(table.tasks, table.cost, strict=True):
            if t.kind == "U":
                update[position[t.layer]] += c
            else:
                work[position[t.layer]] += c
        for layer in network.layers:
            if layer.has_weights:
                weight_hold[position[layer.index]] = ic.hold(layer.weight_count)
        self.work = _prefix([w + u for w, u in zip(work, update, strict=True)])
        self.weight_hold = _prefix(weight_hold)
        # Cut i (between positions i − 1 and i): holds of the edges crossing it, forward and backward.
        self.cut_forward, self.cut_backward = [0] * (n + 1), [0] * (n + 1)
        for v, ps in enumerate(table.preds):
            b = position[table.tasks[v].layer]
            for u, w in zip(ps, table.pred_words[v], strict=True):
                a = position[table.tasks[u].layer]
                if a == b:
                    continue  # crosses no cut
                held, side = ic.hold(w), self.cut_forward if a < b else self.cut_backward
                for cut in range(min(a, b) + 1, max(a, b) + 1):
                    side[cut] += held

    def __len__(self) -> int:
        return len(self.layers)

    def key(self) -> tuple[object, ...]:
        """Everything `plan` reads of these costs: equal keys give equal plans (the memo of `plan`)."""
        return (len(self.layers), tuple(self.work), tuple(self.weight_hold), tuple(self.cut_forward),
                tuple(self.cut_backward), self.interconnect)

    # Every term is a whole number of cycles over r or lcm(r, r'), divisors of the search's round R: the
    # `scaled_*` forms are the terms times R, exact integers (the search compares ~10⁵ of them: `Fraction` was
    # most of its time); the plain forms are the terms themselves.

    def scaled_stage_term(self, first: int, last: int, r: int, scale: int) -> int:
        """scale · max(root compute, all-reduce link) per micro-batch of a stage on r replicas (r divides scale)."""
        compute = self.work[last + 1] - self.work[first]
        if r > 1 and self.interconnect.kind == "links":
            compute = max(compute, self.weight_hold[last + 1] - self.weight_hold[first])
        return compute * (scale // r)

    def scaled_stage_bus(self, first: int, last: int, r: int, scale: int) -> int:
        """scale · bus cycles per micro-batch of the stage's all-reduce: 2(r − 1) transfers per layer per
        round."""
        if self.interconnect.kind != "bus":
            return 0
        return 2 * (r - 1) * (self.weight_hold[last + 1] - self.weight_hold[first]) * (scale // r)

    def scaled_cut_term(self, cut: int, r_before: int, r_after: int, scale: int) -> int:
        """scale · the busiest link of a cut per micro-batch (each of its lcm(r, r') links carries 1/lcm; the
        lcm divides scale)."""
        if self.interconnect.kind != "links":
            return 0
        return max(self.cut_forward[cut], self.cut_backward[cut]) * (scale // math.lcm(r_before, r_after))

    def scaled_cut_bus(self, cut: int, scale: int) -> int:
        if self.interconnect.kind != "bus":
            return 0
        return (self.cut_forward[cut] + self.cut_backward[cut]) * scale

    def stage_term(self, first: int, last: int, r: int) -> Fraction:
        """max(root compute, all-reduce link) per micro-batch of a stage on r replicas."""
        return Fraction(self.scaled_stage_term(first, last, r, r), r)

    def stage_bus(self, first: int, last: int, r: int) -> Fraction:
        """Bus cycles per micro-batch of the stage's all-reduce: 2(r − 1) transfers per layer per round."""
        return Fraction(self.scaled_stage_bus(first, last, r, r), r)

    def cut_term(self, cut: int, r_before: int, r_after: int) -> Fraction:
        """The busiest link of a cut per micro-batch (each of its lcm(r, r') links carries 1/lcm of them)."""
        scale = math.lcm(r_before, r_after)
        return Fraction(self.scaled_cut_term(cut, r_before, r_after, scale), scale)

    def cut_bus(self, cut: int) -> Fraction:
        return Fraction(self.scaled_cut_bus(cut, 1))

    def cost(self, stages: Sequence[Stage]) -> Fraction:
        """The objective of one whole configuration (what brute force evaluates)."""
        term = max(self.stage_term(s.first, s.last, s.replicas) for s in stages)
        bus = sum((self.stage_bus(s.first, s.last, s.replicas) for s in stages), Fraction(0))
        for a, b in itertools.pairwise(stages):
            term = max(term, self.cut_term(b.first, a.replicas, b.replicas))
            bus += self.cut_bus(b.first)
        return max(term, bus)


def _prefix(values: Sequence[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _preference(cycles: Fraction | int, stages: Sequence[Stage]) -> tuple:
    """Smaller is better: cycles, then more processors, fewer stages, earlier cuts and fewer replicas first."""
    return (cycles, -sum(s.replicas for s in stages), len(stages),
            tuple((s.last, s.replicas) for s in stages))


#: A plan under construction: (earlier stages, last stage), a cons list (no copying per transition).
_Chain = tuple | None


def _flatten(chain: _Chain) -> tuple[Stage, ...]:
    out: list[Stage] = []
    while chain is not None:
        chain, stage = chain
        out.append(stage)
    return tuple(reversed(out))


#: `plan`'s results by (costs key, processors, replication). The pipedream policy and layerpipe's replicated
#: candidate plan the same network on the same interconnect (design notes §11: LayerPipe's space holds
#: PipeDream's plan), and sweeps plan one network at many N: the search is the planner's largest cost.
_PLANS: BoundedMemo[tuple[object, ...], Plan] = BoundedMemo(256)


def plan(costs: PlanCosts, num_procs: int, replication: bool = True, max_stages: int | None = None) -> Plan:
    """The best plan, of at most `max_stages` stages when given (memoized: `Plan` is frozen, so a shared result
    cannot be changed by a caller)."""
    key = (costs.key(), num_procs, replication, max_stages)
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS.add(key, _search_plan(costs, num_procs, replication, max_stages))
    return found


def _search_plan(costs: PlanCosts, num_procs: int, replication: bool, max_stages: int | None = None) -> Plan:
    """The best plan on at most `num_procs` processors (module docstring): the best of one search per round of
    `rounds(N)`; `replication=False` allows one replica per stage only (PipeDream's straight pipeline), and
    `max_stages` at most that many stages. The search with the most replica counts goes first, and each search
    is bounded by the best plan before it."""
    searches = rounds(num_procs) if replication else ((1, (1,)),)
    best: Plan | None = None
    for round_, counts in sorted(searches, key=lambda e: (-len(e[1]), e[0])):
        found = _search_round(costs, num_procs, counts, round_, None if best is None else best.cycles, max_stages)
        if found is not None and (best is None or _preference(found.cycles, found.stages)
                                  < _preference(best.cycles, best.stages)):
            best = found
    assert best is not None  # the first search has no outer bound, and one stage on one processor is a plan
    return best


def _search_round(costs: PlanCosts, num_procs: int, counts: Sequence[int], round_: int,
                  beat: Fraction | None, max_stages: int | None = None) -> Plan | None:
    """The best plan whose stages have replica counts in `counts` (all dividing `round_`), of at most
    `max_stages` stages when given, or None when none is at most `beat` cycles per micro-batch.

    States are (cut, processors used, replicas of the last stage; and stages so far under `max_stages`) with a
    Pareto front of (largest term, bus load). Branch and bound: the best complete plan so far (first: one stage
    on the most replicas allowed, or `beat`) bounds the search — a stage over it is not extended (its compute
    only grows with more layers), nor a prefix whose remaining work over the remaining processors exceeds it.
    Values are scaled by `round_` (the `scaled_*` forms): integers, so ⌊beat · round_⌋ bounds exactly — a plan
    of this search ties `beat` only where beat · round_ is whole.
    """
    n = len(costs)
    options = [r for r in counts if r <= num_procs]
    widest = max(options)
    bound = max(costs.scaled_stage_term(0, n - 1, widest, round_), costs.scaled_stage_bus(0, n - 1, widest, round_))
    if beat is not None:
        bound = min(bound, math.floor(beat * round_))
    fronts: dict[tuple[int, int, int, int], list[tuple[int, int, _Chain]]] = {}
    work = costs.work

    def offer(key: tuple[int, int, int, int], term: int, bus: int, chain: _Chain) -> None:
        nonlocal bound
        if key[0] == n:
            bound = min(bound, max(term, bus))
        front = fronts.setdefault(key, [])
        for k, (t, b, c) in enumerate(front):
            if t <= term and b <= bus:
                if (t, b) == (term, bus) and _preference(term, _flatten(chain)) < _preference(t, _flatten(c)):
                    front[k] = (term, bus, chain)
                return
        front[:] = [e for e in front if not (term <= e[0] and bus <= e[1])]
        front.append((term, bus, chain))

    # `scaled_stage_term` and `scaled_stage_bus` inlined below (the search's innermost loop, ~10⁵ stages per
    # plan): the same integers from the same prefix sums, without two method calls per stage.
    links, on_bus, hold = costs.interconnect.kind == "links", costs.interconnect.kind == "bus", costs.weight_hold

    def extend(cut: int, used: int, r_before: int | None, depth: int, front: list[tuple[int, int, _Chain]]) -> None:
        if max_stages is not None and depth >= max_stages:
            return  # a prefix of max_stages stages that does not cover every layer: no plan
        deeper = depth + 1 if max_stages is not None else 0  # stages are counted only under a limit
        for r in options:
            if used + r > num_procs:
                continue
            link = costs.scaled_cut_term(cut, r_before, r, round_) if r_before is not None else 0
            cut_bus = costs.scaled_cut_bus(cut, round_) if r_before is not None else 0
            left = num_procs - used - r
            scale, all_reduce, bus_rounds = round_ // r, r > 1 and links, 2 * (r - 1)
            for last in range(cut, n):
                compute = work[last + 1] - work[cut]
                if all_reduce:
                    compute = max(compute, hold[last + 1] - hold[cut])
                term = compute * scale  # `scaled_stage_term(cut, last, r)`
                if term > bound:
                    break  # longer stages on r replicas only cost more
                rest = work[n] - work[last + 1]
                if rest and (not left or rest * round_ > bound * left):
                    continue  # the layers after this stage cannot finish within the bound on what is left
                extra = max(term, link)
                # `scaled_stage_bus(cut, last, r)`
                bus = (bus_rounds * (hold[last + 1] - hold[cut]) * scale if on_bus else 0) + cut_bus
                for t, b, chain in front:
                    if max(t, extra) <= bound and b + bus <= bound:
                        offer((last + 1, used + r, r, deeper), max(t, extra), b + bus,
                              (chain, Stage(cut, last, r)))

    extend(0, 0, None, 0, [(0, 0, None)])
    for cut in range(1, n):  # fronts at cut are final once every stage ending at cut − 1 was offered
        for key in sorted(k for k in fronts if k[0] == cut):
            extend(cut, key[1], key[2], key[3], list(fronts[key]))
    finals = [(max(t, b), _flatten(c)) for (at, *_), front in fronts.items() if at == n for t, b, c in front]
    if not finals:
        return None
    scaled, stages = min(finals, key=lambda e: _preference(*e))
    return Plan(stages, Fraction(scaled, round_))


def brute_force_plan(costs: PlanCosts, num_procs: int, replication: bool = True,
                     max_stages: int | None = None) -> Plan:
    """Every contiguous partition (of at most `max_stages` stages) × every replica vector on at most
    `num_procs` processors whose J fits `round_cap` (tests only)."""
    n = len(costs)
    options = replica_counts(num_procs) if replication else (1,)
    cap = round_cap(num_procs)
    best: tuple[tuple, Plan] | None = None
    for cuts_count in range(n if max_stages is None else min(n, max_stages)):
        for cuts in itertools.combinations(range(1, n), cuts_count):
            bounds = [0, *cuts, n]
            spans = list(itertools.pairwise(bounds))
            for reps in _replica_vectors(options, len(spans), num_procs):
                if math.lcm(*reps) > cap:
                    continue
                stages = tuple(Stage(a, b - 1, r) for (a, b), r in zip(spans, reps, strict=True))
                cycles = costs.cost(stages)
                key = _preference(cycles, stages)
                if best is None or key < best[0]:
                    best = (key, Plan(stages, cycles))
    assert best is not None
    return best[1]


def _replica_vectors(options: Sequence[int], parts: int, budget: int) -> Iterator[tuple[int, ...]]:
    """Every vector of `parts` counts from `options` summing to at most `budget`, in lexicographic order."""
    if parts == 0:
        yield ()
        return
    for r in options:
        if r + parts - 1 > budget:  # the other parts need at least one processor each
            break
        for rest in _replica_vectors(options, parts - 1, budget - r):
            yield (r, *rest)


# ------------------------------------------------------------------------------ the replicated schedule


@dataclass(frozen=True)
class Replicated:
    """A plan laid out as an unfolded periodic timing (1F1B-RR)."""

    table: UnfoldedTable
    placement: list[int]
    period: int
    timing: Timing


def stage_processors(plan_: Plan) -> list[list[int]]:
    """Processors of each stage: consecutive, the first one the root (it runs the stage's updates)."""
    out, at = [], 0
    for s in plan_.stages:
        out.append(list(range(at, at + s.replicas)))
        at += s.replicas
    return out


def replicated_timing(table: TaskTable, plan_: Plan, num_procs: int, interconnect: Interconnect = SHARED,
                      coalesce: int | None = None) -> Replicated:
    """`_replicated_timing`, memoised by what it reads — the table's content (`TaskTable.token`) and graph, the
    plan, N, the interconnect and `coalesce`: LayerPipe's replicated candidate lays out the same plan on the
    same tasks in its searches with and without a traffic bound. Each caller gets its own lists."""
    key = (table.token, table.graph, plan_, num_procs, interconnect, coalesce)
    found = _REPLICATED.get(key)
    if found is None:
        found = _REPLICATED.add(key, _replicated_timing(table, plan_, num_procs, interconnect, coalesce))
    t = found.timing
    return replace(found, placement=list(found.placement),
                   timing=Timing(list(t.start), list(t.lag), dict(t.staleness), dict(t.arrival)))


#: `replicated_timing`'s memo (few entries: an unfolded table of a large network is large).
_REPLICATED: BoundedMemo[tuple[object, ...], Replicated] = BoundedMemo(16)


@dataclass(frozen=True)
class Layout:
    """A plan's copies on their processors, before any body is timed: what fixes the period and the traffic."""

    table: UnfoldedTable
    placement: tuple[int, ...]
    period: int  #: the busiest processor or channel
    stage_of: dict[int, int]  #: layer → its stage
    replicas: dict[int, int]  #: layer → its update group (the stage's replicas, or `coalesce`)


def replicated_layout(table: TaskTable, plan_: Plan, num_procs: int, interconnect: Interconnect = SHARED,
                      coalesce: int | None = None) -> Layout:
    """The layout `replicated_timing` times (its unfolded table, placement and period), without the timing:
    a caller that compares periods and traffic first (LayerPipe's replicated candidate) times only a winner.
    Memoised like `replicated_timing` (the timing lays out the same plan again); `Layout` is read only."""
    key = (table.token, table.graph, plan_, num_procs, interconnect, coalesce)
    found = _LAYOUTS.get(key)
    if found is None:
        found = _LAYOUTS.add(key, _layout(table, plan_, num_procs, interconnect, coalesce))
    return found


#: `replicated_layout`'s memo.
_LAYOUTS: BoundedMemo[tuple[object, ...], Layout] = BoundedMemo(16)


def _layout(table: TaskTable, plan_: Plan, num_procs: int, interconnect: Interconnect,
            coalesce: int | None) -> Layout:
    layers = [layer.index for layer in table.graph.network.layers]
    stage_of = {layers[i]: k for k, s in enumerate(plan_.stages) for i in range(s.first, s.last + 1)}
    procs = stage_processors(plan_)
    replicas = {layer: coalesce or plan_.stages[k].replicas for layer, k in stage_of.items()}
    weighted = {t.layer for t in table.tasks if t.kind == "U"}
    unfold = coalesce or plan_.unfold
    unfolded = unfold_table(table, unfold, {layer: r for layer, r in replicas.items() if layer in weighted})
    placement = []
    for t, k in zip(unfolded.tasks, unfolded.phase, strict=True):
        mine = procs[stage_of[t.layer]]
        placement.append(mine[0] if t.kind == "U" else mine[k % len(mine)])
    loads = [0] * num_procs
    for v, p in enumerate(placement):
        loads[p] += unfolded.cost[v]
    period = max(max(loads), busiest_channel(unfolded, Comm(placement, interconnect, num_procs)))
    return Layout(unfolded, tuple(placement), period, stage_of, replicas)


def _replicated_timing(table: TaskTable, plan_: Plan, num_procs: int, interconnect: Interconnect,
                       coalesce: int | None) -> Replicated:
    """The plan's stages on their replicas: `table` unfolded by J = lcm(replicas) with update groups of r per
    stage, micro-batch t of a stage on its replica t mod r (round-robin), the updates on the root. The
    period is the busiest processor or channel; the bodies run each micro-batch's forward block and
    backward block (1F1B; the best of forward first, backward first, all forwards first, the target packings,
    the modulo list schedule and the steady state's own slots, by `_replicated_scores.best_trial`), and the lags
    are the minimal ones on the interconnect.

    `coalesce` = m instead unfolds by m with one update group of m per layer (PipeDream-2BW's coalesced
    gradients, ICML'21 §3), for plans without replicas."""
    laid = replicated_layout(table, plan_, num_procs, interconnect, coalesce)
    unfolded, period, stage_of, replicas = laid.table, laid.period, laid.stage_of, laid.replicas
    placement = list(laid.placement)

    def block(v: int) -> tuple[int, int, int, int]:
        """(micro-batch of the copy within the period, block, order in block); U after its group's last B."""
        t, k = unfolded.tasks[v], unfolded.phase[v]
        if t.kind == "F":
            return (k, 0, t.layer, 0)
        g = replicas[t.layer]
        return ((k * g + g - 1) if t.kind == "U" else k, 1, -t.layer, 1 if t.kind == "U" else 0)

    blocks = [block(v) for v in range(len(unfolded))]  # each key reads them, several times per task
    keys: list[Callable[[int], tuple]] = [
        blocks.__getitem__,
        lambda v: (blocks[v][0], 1 - blocks[v][1], *blocks[v][2:]),
        lambda v: (blocks[v][1], *blocks[v]),
    ]
    comm = Comm(placement, interconnect, num_procs)
    starts = [contiguous_starts(order_bodies(placement, num_procs, key), unfolded.cost) for key in keys]
    for target in default_targets(unfolded, placement, num_procs, asap_times(unfolded)):
        bodies = offset_bodies(placement, num_procs, target, period)  # by target offset mod the period
        starts.append(packed_starts(unfolded, bodies, period, target))
    # 1F1B-RR: every copy at its earliest fit after its producers, in the order of the steady state's slots.
    priority = _topological_by(unfolded, _round_robin_targets(unfolded, plan_, stage_of, replicas, period))
    listed = modulo_list_schedule(unfolded, period, num_procs, priority, fixed=placement)
    if listed is not None:
        starts.append([at % period for at in listed[1]])
    if coalesce:
        starts.append(_coalesced_starts(unfolded, plan_, stage_of, period, interconnect))
    else:
        starts.append(_round_robin_starts(unfolded, plan_, stage_of, period, interconnect))
    # Each trial's starts with their minimal lags and arrivals (`comm_timing`): the staleness `timed` would add is
    # the winner's alone (`best_trial` scores the trials by their forward pins). Orders that give the same starts
    # (a third of them on the data-parallel plans of issue 14's sweep) are one trial, timed once, at its first
    # order's place: a timing is a function of the starts, and a later equal trial could not win.
    timings: dict[tuple[int, ...], Trial] = {}
    for start in starts:
        key = tuple(start)
        if key not in timings:
            timings[key] = timed_trial(unfolded, start, period, comm)
    return Replicated(unfolded, placement, period, best_trial(unfolded, placement, period, num_procs, comm,
                                                                table.graph, list(timings.values())))


def _coalesced_starts(table: UnfoldedTable, plan_: Plan, stage_of: dict[int, int], period: int,
                      interconnect: Interconnect) -> list[int]:
    """PipeDream-2BW's steady state (ICML'21 §3, fig. 3) for a straight pipeline unfolded by m: stage s runs m
    slots of σ_s ≥ f_s + b_s cycles (the widest stage's, where the period leaves room for the stage's updates)
    from offset o_s — slot j holds the forward of micro-batch j and the
    backward of micro-batch j − d_s (of the previous window when negative) — then its updates. o_{s+1} and
    d_s are the smallest that let every forward follow its input and every backward follow the next stage's
    (over all slots of the window, transfers uncontended); `minimal_lags` then makes the timing legal."""
    count, m = len(plan_.stages), table.unfold
    f, b, comm_f, comm_b = [0] * count, [0] * count, [0] * count, [0] * count
    for v, (t, k, c) in enumerate(zip(table.tasks, table.phase, table.cost, strict=True)):
        if k == 0 and t.kind != "U":
            (f if t.kind == "F" else b)[stage_of[t.layer]] += c
            for src, w in zip(table.preds[v], table.pred_words[v], strict=True):
                su = stage_of[table.tasks[src].layer]
                if su != stage_of[t.layer]:
                    (comm_f if t.kind == "F" else comm_b)[stage_of[t.layer]] += interconnect.transfer_cycles(w)
    u = [0] * count
    for t, c in zip(table.tasks, table.cost, strict=True):
        if t.kind == "U":
            u[stage_of[t.layer]] += c
    # Slots as long as the longest stage's (so a faster stage does not run ahead of the pipeline), as long as
    # the stage's m slots and updates still fit in the period.
    widest = max(f[s] + b[s] for s in range(count))
    sigma = [max(f[s] + b[s], min(widest, (period - u[s]) // m)) for s in range(count)]
    offset = [0] * count
    for s in range(1, count):
        offset[s] = max(offset[s - 1] + j * (sigma[s - 1] - sigma[s]) + f[s - 1] + comm_f[s] for j in range(m))
    delay = [0] * count
    for s in range(count - 2, -1, -1):
        n = s + 1
        need = max(offset[n] + (k + delay[n]) * sigma[n] + f[n] + b[n] + comm_b[s]
                   - offset[s] - k * sigma[s] - f[s] for k in range(m))
        delay[s] = max(0, -(-need // sigma[s])) if sigma[s] else 0
    start = []
    for t, k in zip(table.tasks, table.phase, strict=True):
        s = stage_of[t.layer]
        if t.kind == "U":
            at = offset[s] + m * sigma[s]
        elif t.kind == "F":
            at = offset[s] + k * sigma[s]
        else:
            at = offset[s] + ((k + delay[s]) % m) * sigma[s] + f[s]
        start.append(at)
    # Within a block the layers go in order (forward) and reverse order (backward), then U_l last layer first.
    out = [0] * len(table)
    blocks: dict[tuple[int, int], list[int]] = {}  # (stage, start) → its tasks in index order (one pass)
    for v, (t, at) in enumerate(zip(table.tasks, start, strict=True)):
        blocks.setdefault((stage_of[t.layer], at), []).append(v)
    for p_key in sorted(blocks):
        members = blocks[p_key]
        members.sort(key=lambda v: (table.tasks[v].layer if table.tasks[v].kind == "F" else -table.tasks[v].layer))
        at = p_key[1]
        for v in members:
            out[v] = at % period
            at += table.cost[v]
    return out


def _round_robin_starts(table: UnfoldedTable, plan_: Plan, stage_of: dict[int, int], period: int,
                        interconnect: Interconnect) -> list[int]:
    """1F1B-RR's steady state (SOSP'19 §3.2) for replicated stages: with τ = P/J cycles per micro-batch,
    micro-batch k enters stage s at o_s + k·τ on replica k mod r_s; the slot there runs its forward block,
    then the backward of micro-batch k − d_s (same replica: d_s a multiple of r_s), and on the root the update
    of one round. Each replica's slots are r·τ apart, which holds f + b (+ u on the root) because the period
    is at least every processor's load, so the bodies never overlap. o_{s+1} = o_s + f_s (+ the transfer) and
    d_s ≥ d_{s+1} + (f_{s+1} + b_{s+1} + transfers)/τ make every forward follow its input and every
    backward the next stage's; `minimal_lags` then makes the timing legal where the estimate is short."""
    count, unfold = len(plan_.stages), table.unfold
    f, b, comm_f, comm_b = [0] * count, [0] * count, [0] * count, [0] * count
    for v, (t, k, c) in enumerate(zip(table.tasks, table.phase, table.cost, strict=True)):
        if k == 0 and t.kind != "U":
            (f if t.kind == "F" else b)[stage_of[t.layer]] += c
            for u, w in zip(table.preds[v], table.pred_words[v], strict=True):
                if stage_of[table.tasks[u].layer] != stage_of[t.layer]:
                    (comm_f if t.kind == "F" else comm_b)[stage_of[t.layer]] += interconnect.transfer_cycles(w)
    # τ = P/J exactly, in integers: ⌈x/τ⌉ = ⌈x·J/P⌉ and ⌊o + j·τ⌋ = o + ⌊j·P/J⌋ for whole o
    offset = [0] * count
    for s in range(1, count):
        offset[s] = offset[s - 1] + f[s - 1] + comm_f[s]
    delay = [0] * count
    for s in range(count - 2, -1, -1):
        r = plan_.stages[s].replicas
        d = delay[s + 1] - (-(f[s + 1] + b[s + 1] + comm_f[s + 1] + comm_b[s]) * unfold // period)
        delay[s] = -(-d // r) * r
    # the slot (micro-batch whose forward it starts with) of every copy
    slot = []
    for t, k in zip(table.tasks, table.phase, strict=True):
        s = stage_of[t.layer]
        r = plan_.stages[s].replicas
        if t.kind == "F":
            slot.append(k)
        elif t.kind == "U":  # round q after its last micro-batch's backward, on the root: slot r(q + 1) + d
            slot.append(r * (k + 1) + delay[s])
        else:
            slot.append(k + delay[s])
    start = [0] * len(table)
    groups: dict[tuple[int, int], list[int]] = {}
    for v, t in enumerate(table.tasks):  # slots past the period's last are the next period's first (a lag)
        groups.setdefault((stage_of[t.layer], slot[v] % unfold), []).append(v)
    for (s, j), members in groups.items():
        members.sort(key=lambda v: (0 if table.tasks[v].kind == "F" else 2 if table.tasks[v].kind == "U" else 1,
                                    table.tasks[v].layer if table.tasks[v].kind == "F" else -table.tasks[v].layer))
        at = offset[s] + j * period // unfold
        for v in members:
            start[v] = at % period
            at += table.cost[v]
    return start


def _topological_by(table: TaskTable, key: Sequence[int]) -> list[int]:
    """A topological order of the delay-0 edges that takes the smallest `key` first among the ready tasks."""
    succs: list[list[int]] = [[] for _ in range(len(table))]
    waiting = [len(ps) for ps in table.preds]
    for v, ps in enumerate(table.preds):
        for u in ps:
            succs[u].append(v)
    ready = [(key[v], v) for v in range(len(table)) if not waiting[v]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for w in succs[v]:
            waiting[w] -= 1
            if not waiting[w]:
                heapq.heappush(ready, (key[w], w))
    return out


def _round_robin_targets(table: UnfoldedTable, plan_: Plan, stage_of: dict[int, int], replicas: dict[int, int],
                         period: int) -> list[int]:
    """Where 1F1B-RR's steady state puts each copy (SOSP'19 §3.2): micro-batch k enters stage s at
    o_s + k·τ (τ = P/J cycles per micro-batch, o_s the forward time of the stages before s) and its backward
    runs d_s micro-batches later, in the slot of the forward of micro-batch k + d_s on the same replica —
    d_s = d_{s+1} + ⌈(f_{s+1} + b_{s+1}) / τ⌉ (d = 0 on the last stage), rounded up to a multiple of r_s.
    As the priority of the modulo list scheduler (`modulo_list_schedule`: each copy at its earliest fit after
    its producers), a stage's backward comes back within the period where the loads allow, so the lags stay
    near PipeDream's in-flight count instead of one period per stage crossing."""
    count = len(plan_.stages)
    forward, backward = [0] * count, [0] * count
    for t, k, c in zip(table.tasks, table.phase, table.cost, strict=True):
        if k == 0 and t.kind != "U":
            (forward if t.kind == "F" else backward)[stage_of[t.layer]] += c
    unfold = table.unfold  # τ = P/J, in integers as in `_round_robin_starts`
    offset = [sum(forward[:s]) for s in range(count)]
    # B_s(k) must follow B_{s+1}(k): o_s + (k + d_s)·τ + f_s ≥ o_{s+1} + (k + d_{s+1})·τ + f_{s+1} + b_{s+1},
    # i.e. d_s ≥ d_{s+1} + (f_{s+1} + b_{s+1}) / τ; the last stage runs B(k) right after F(k) (d = 0).
    delay = [0] * count
    for s in range(count - 2, -1, -1):
        d = delay[s + 1] + (-(-(forward[s + 1] + backward[s + 1]) * unfold // period) if period else 0)
        r = plan_.stages[s].replicas if table.unfold == plan_.unfold else 1
        delay[s] = -(-d // r) * r
    target = []
    for t, k in zip(table.tasks, table.phase, strict=True):
        s = stage_of[t.layer]
        if t.kind == "F":
            at = offset[s] + k * period // unfold
        else:
            last = k * replicas[t.layer] + replicas[t.layer] - 1 if t.kind == "U" else k
            at = offset[s] + forward[s] + (last + delay[s]) * period // unfold
        target.append(at)
    return target

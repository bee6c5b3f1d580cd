"""The period a self-timed run of a periodic timing settles at, read off the timing's own constraint graph.

The simulator runs a periodic schedule self-timed (design notes §7): each processor runs its ops in program
order, an op starts when its processor is free and its inputs (data, and the weight version the schedule pins
it to read) have arrived, and a link p→q sends in producer order, each transfer leaving when its producer has
ended and the link is free. With the program orders, the lags and the pinned versions fixed, that run is a
max-plus linear system, and its steady period is the maximum cycle ratio (Howard's algorithm,
`layerpipe.retiming.max_cycle_ratio`) of a graph whose nodes are the tasks (times: costs) and the transfers
(times: link hold, then latency) and whose edges are

- program order on each processor, in a period (0 periods) and from its last op to the next period's first
  (1 period); the same on each link, in its send order;
- every delay-0 precedence u→v, over lag_v − lag_u periods (through its transfer when u and v are apart);
- every pinned weight read: X_l(t) reads version t − s, written by U_l(t − s − 1), so U_l → X_l over
  lag_X − lag_U + s + 1 periods (through the transfer of the new weights when X_l runs away from U_l);
- U_l → U_l over one period (updates apply in order).

A schedule whose period P exceeds that ratio λ has slack the simulator does not keep: the run settles at λ.
`settled` re-times the same bodies, lags and pins at ⌈λ⌉ — the least solution of the graph's difference
constraints x_dst ≥ x_src + t_src − ⌈λ⌉·periods, one more retiming — which is a valid timing of the same
orders whose reads are at least as fresh, so its own ratio is λ again (it can only be tighter, and ⌈λ⌉
admits it). Where λ is not an integer the run settles at λ < ⌈λ⌉: a period of one iteration cannot equal it
(`SettledTiming.ratio` keeps λ). The bounded search of `_layerpipe` (a staleness bound) is the
policy that produced slack; unbounded schedules have P = the busiest processor or channel, which is a cycle of
this graph, so λ = P there.

On a `bus` the simulator serves a planned run's transfers no earlier than the plan sends them
(`layerpipe.sim._engine.bus_order`): the run cannot settle below the plan, so this pass leaves bus timings be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

from layerpipe.interconnect import Interconnect
from layerpipe.retiming import max_cycle_ratio, solve_difference_constraints
from layerpipe.schedule._bodies import periodic_from
from layerpipe.schedule._comm_timing import Timing, timing_of
from layerpipe.schedule._ir import tie_rank
from layerpipe.schedule._task_table import TaskTable


@dataclass
class ConstraintGraph:
    """Nodes 0..n−1 are the tasks; later ones are transfers (link hold) and their latencies. Edge i runs
    src[i] → dst[i] over periods[i] periods; a node's time is what it adds to a path through it."""

    time: list[int]
    src: list[int]
    dst: list[int]
    periods: list[int]
    #: (producer task, consumer task) → (transfer node, node whose end is the arrival)
    transfers: dict[tuple[int, int], tuple[int, int]]

    def add(self, a: int, b: int, periods: int) -> None:
        self.src.append(a)
        self.dst.append(b)
        self.periods.append(periods)

    def node(self, time: int) -> int:
        self.time.append(time)
        return len(self.time) - 1


def pinned_reads(table: TaskTable, placement: Sequence[int], timing: Timing, period: int,
                 num_procs: int) -> dict[int, int]:
    """Reader task index → the staleness s its weight read is pinned to (the rule the unroll pins with:
    `PeriodicSchedule.read_pins`)."""
    schedule = periodic_from(table, placement, timing.start, timing.lag, period, num_procs, timing.arrival)
    pins = schedule.read_pins()
    index = {(t.kind, t.layer): v for v, t in enumerate(table.tasks)}
    return {index[(kind, layer)]: s for (kind, layer, phase), s in pins.items() if phase == 0}


def constraint_graph(table: TaskTable, placement: Sequence[int], num_procs: int, start: Sequence[int],
                     lag: Sequence[int], pins: Mapping[int, int], period: int,
                     interconnect: Interconnect) -> ConstraintGraph:
    """The self-timed run's graph of a timing (module docstring): `pins[x]` is the staleness reader task x is
    pinned to (`pinned_reads`); one iteration per period only."""
    n = len(table)
    graph = ConstraintGraph(list(table.cost), [], [], [], {})

    def program_key(v: int) -> tuple[int, bool, tuple[int, int, int], int]:  # `_ir.op_order_key`'s order
        t = table.tasks[v]
        return (start[v], table.cost[v] > 0, tie_rank(t.kind, t.layer), -lag[v])

    def cycle(order: Sequence[int]) -> None:
        for a, b in pairwise(order):
            graph.add(a, b, 0)
        if order:
            graph.add(order[-1], order[0], 1)

    for p in range(num_procs):
        cycle(sorted((v for v in range(n) if placement[v] == p), key=program_key))
    edges: list[tuple[int, int, int, int]] = []  # (u, v, periods, words): what must reach v from u
    for v, preds in enumerate(table.preds):
        for u, words in zip(preds, table.pred_words[v], strict=True):
            edges.append((u, v, lag[v] - lag[u], words))
    for u, x, words in table.weight_reads:
        if x in pins:
            edges.append((u, x, lag[x] - lag[u] + pins[x] + 1, words))
    links: dict[int, list[tuple[tuple[object, ...], int]]] = {}
    for u, v, periods, words in edges:
        if interconnect.is_shared or placement[u] == placement[v]:
            graph.add(u, v, periods)
            continue
        send = graph.node(interconnect.hold(words))
        graph.add(u, send, 0)
        last = send
        if interconnect.latency:
            last = graph.node(interconnect.latency)
            graph.add(send, last, 0)
        graph.add(last, v, periods)
        graph.transfers[(u, v)] = (send, last)
        channel = interconnect.channel(placement[u], placement[v], num_procs)
        # a link sends in its producer's program order, one producer's consumers in their program order
        links.setdefault(channel, []).append(((*program_key(u), periods * period + start[v], v), send))
    for queue in links.values():
        cycle([send for _, send in sorted(queue)])
    for u in range(n):
        if table.tasks[u].has("U"):
            graph.add(u, u, 1)
    return graph


def self_timed_period(graph: ConstraintGraph) -> Fraction:
    """The steady period of the self-timed run: the graph's maximum cycle ratio."""
    ratio, _, _ = max_cycle_ratio(len(graph.time), graph.src, graph.dst, graph.time, graph.periods)
    return ratio


@dataclass(frozen=True)
class SettledTiming:
    """A timing re-timed at the self-timed run's period (`settled`)."""

    period: int
    timing: Timing
    #: The self-timed run's period λ of the timing given (cycles per iteration).
    ratio: Fraction


def settled(table: TaskTable, placement: Sequence[int], num_procs: int, timing: Timing, period: int,
            interconnect: Interconnect) -> SettledTiming:
    """`timing` with the slack the self-timed run does not keep taken out: the same bodies, lags and pinned
    reads at period ⌈λ⌉ (module docstring); `timing` itself when ⌈λ⌉ = `period` or on a bus."""
    if interconnect.kind == "bus":
        return SettledTiming(period, timing, Fraction(period))
    pins = pinned_reads(table, placement, timing, period, num_procs)
    graph = constraint_graph(table, placement, num_procs, timing.start, timing.lag, pins, period, interconnect)
    ratio = self_timed_period(graph)
    tight = -(-ratio.numerator // ratio.denominator)
    if tight >= period:
        return SettledTiming(period, timing, ratio)
    bound = [graph.time[a] - tight * w for a, w in zip(graph.src, graph.periods, strict=True)]
    x = solve_difference_constraints(len(graph.time), graph.src, graph.dst, bound)
    assert x is not None, "a period at or above the maximum cycle ratio admits the constraints"
    n = len(table)
    shift = [int(x[v]) // tight for v in range(n)]
    start = [int(x[v]) % tight for v in range(n)]
    lag = [timing.lag[v] + shift[v] for v in range(n)]
    low = min(lag, default=0)
    lag = [g - low for g in lag]
    arrival = {(u, v): int(x[last]) + graph.time[last] - shift[u] * tight
               for (u, v), (_, last) in graph.transfers.items()}
    return SettledTiming(tight, timing_of(table, start, lag, tight, arrival), ratio)

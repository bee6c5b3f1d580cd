"""Lags and transfer arrivals of a timing, and the `Timing` record the policies compare (design notes §5).

- `comm_timing`  — minimal lags with the transfers planned on the interconnect (`_comm.channel_timing`),
                   re-planned with the consumers' plan times until the lags stop changing.
- `minimal_lags` — the lags alone; `timed` / `timing_of` — a `Timing` (starts, lags, staleness, arrivals).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from layerpipe._memo import memo
from layerpipe.schedule._comm import Comm, channel_timing, pack, packed_arrivals, queues, same_order
from layerpipe.schedule._lags import _longest_lags, lags_from_ready, loop_spans, staleness_from_span
from layerpipe.schedule._task_table import TaskTable


def minimal_lags(table: TaskTable, start: Sequence[int], period: int, comm: Comm | None = None) -> list[int]:
    """The smallest non-negative lags under which every delay-0 edge u→v is met:
    (lag_v − lag_u)·P + start_v ≥ ready_uv, i.e. lag_v ≥ lag_u + ⌈(ready_uv − start_v)/P⌉, where ready_uv is
    start_u + c_u, or the planned arrival of the transfer when `comm` puts u and v on different processors.

    A longest path in topological order; the order edges U_l(t−1) → U_l(t) hold for any lags (one slot
    per period), and weight edges are version reads, not precedence.
    """
    return comm_timing(table, start, period, comm)[0]


#: Rounds of re-planning the channels with the consumers' plan times (their program order) as the tie order.
COMM_ROUNDS = 4


def comm_timing(table: TaskTable, start: Sequence[int], period: int,
                comm: Comm | None = None) -> tuple[list[int], dict[tuple[int, int], int]]:
    """Minimal lags and the planned arrival offset of every transfer (`_comm.channel_timing`).

    The queue order of one producer's consumers on a channel is their program order, which depends on the
    lags; the channels are planned with the start offsets first, then with the resulting plan times, until
    the lags stop changing.

    Memoised (a pure function of the table's content, the starts, the period and the placement on its
    interconnect): the searches time the same bodies again — two body orders that coincide, the bounded and
    unbounded searches of one network, a candidate re-timed at a period it was already timed at. Each caller
    gets its own lists.
    """
    placed: tuple[object, ...] | None = None
    if comm is not None and not comm.free:
        placed = (tuple(comm.placement), comm.interconnect, comm.num_procs)
    key = (table.token, tuple(start), period, placed)
    found = _TIMINGS.get(key)
    if found is None:
        lag, arrival, fixed = _rounds(table, start, period, comm if placed is not None else None)
        global _TIMINGS_HELD
        while _TIMINGS and _TIMINGS_HELD + len(lag) + len(arrival) > _TIMINGS_CAP:
            dropped = _TIMINGS.pop(next(iter(_TIMINGS)))  # oldest first
            _TIMINGS_HELD -= len(dropped[0]) + len(dropped[1])
        found = _TIMINGS[key] = (tuple(lag), arrival, fixed)
        _TIMINGS_HELD += len(lag) + len(arrival)
    return list(found[0]), dict(found[1])


def replanned_alike(table: TaskTable, start: Sequence[int], period: int, comm: Comm, lag: Sequence[int],
                    arrival: dict[tuple[int, int], int]) -> bool:
    """Whether `comm_timing` gave these lags and arrivals for these starts (still in its memo) at a fixpoint of
    its rounds: `channel_timing` on the plan times of `lag` gives `arrival` again, and `_longest_lags` on
    those gives `lag`. Then a pass that would re-plan them (`_replicated_scores._settled_lags`) knows the answer without
    packing a channel. False when unknown (not memoised, or the rounds ran out before the lags settled)."""
    if comm.free:
        return False
    found = _TIMINGS.get((table.token, tuple(start), period, (tuple(comm.placement), comm.interconnect,
                                                               comm.num_procs)))
    return found is not None and found[2] and found[0] == tuple(lag) and found[1] == arrival


#: `comm_timing`'s memo, bounded by the lags and arrivals it holds (not by entries: unfolded tables are large):
#: key → (lags, arrivals, whether the rounds reached their fixpoint).
_TIMINGS: dict[tuple[object, ...], tuple[tuple[int, ...], dict[tuple[int, int], int], bool]] = {}
_TIMINGS_CAP = 400_000
_TIMINGS_HELD = 0


def _clear_timings() -> None:
    global _TIMINGS_HELD
    _TIMINGS.clear()
    _TIMINGS_HELD = 0


memo(_TIMINGS, _clear_timings)


def _comm_timing(table: TaskTable, start: Sequence[int], period: int,
                 comm: Comm | None) -> tuple[list[int], dict[tuple[int, int], int]]:
    """`comm_timing` without its memo."""
    lag, arrival, _ = _rounds(table, start, period, comm)
    return lag, arrival


def _rounds(table: TaskTable, start: Sequence[int], period: int,
            comm: Comm | None) -> tuple[list[int], dict[tuple[int, int], int], bool]:
    """Lags, arrivals, and whether the rounds reached their fixpoint (the lags stopped changing)."""
    from layerpipe.schedule._unfold import UnfoldedTable  # _unfold imports this module

    if comm is None:
        return _longest_lags(table, start, period, {}), {}, False
    lined = queues(table, comm)
    if lined.edge_transfers is None or (lined.any_weight and isinstance(table, UnfoldedTable)):
        return _planned_rounds(table, start, period, comm)
    # No re-pinned weight reads (`channel_timing`'s unfolded case): the channels are packed directly and the
    # lags read the arrivals by edge index; the dict of arrivals is built once, for the last round.
    src, dst = table.precedence
    cost, n = table.cost, len(table)

    if table.forward:
        slots = lined.edge_slots

        def lags_of(arrive: list[int]) -> list[int]:
            """`lags_from_ready`'s sweep, reading each edge's ready time as it goes (its transfer's arrival, or
            the producer's end) instead of building the list first."""
            r = [0] * n
            for u, v, t in zip(src, dst, slots, strict=True):
                need = r[u] - ((start[v] - (arrive[t] if t >= 0 else start[u] + cost[u])) // period)
                if need > r[v]:
                    r[v] = need
            return r
    else:
        end = [start[u] + cost[u] for u in src]
        edge_transfers = lined.edge_transfers or []

        def lags_of(arrive: list[int]) -> list[int]:
            ready = list(end)
            for e, i in edge_transfers:
                ready[e] = arrive[i]
            return lags_from_ready(table, start, period, ready)

    packed = pack(table, comm, lined, start, period, None)
    lag = lags_of(packed[0])
    # When the plan times of these lags keep every tied run in its order (always, without a tie), the first
    # round would pack the same arrivals, give the same lags and stop: the result is this packing's, a fixpoint.
    ties = packed[2]
    fixed = not ties or (ties is not True and same_order(ties, lined, start, [lag[v] * period + start[v]
                                                                              for v in range(len(table))], period))
    for _ in range(0 if fixed else COMM_ROUNDS):
        plan = [lag[v] * period + start[v] for v in range(len(table))]
        packed = pack(table, comm, lined, start, period, plan)
        again = lags_of(packed[0])
        fixed = again == lag
        lag = again
        if fixed:
            break
    return lag, packed_arrivals(lined, packed), fixed


def _planned_rounds(table: TaskTable, start: Sequence[int], period: int,
                    comm: Comm) -> tuple[list[int], dict[tuple[int, int], int], bool]:
    """The rounds of `comm_timing` through `channel_timing` (which re-pins an unfolded table's weight reads).

    The first round's plan times usually keep every tied queue in order (`same_order`): its packing is then the
    first one's, handed to `channel_timing` rather than repeated; and arrivals equal to the previous round's
    give its lags again without another sweep."""
    lined = queues(table, comm)
    first = pack(table, comm, lined, start, period, None)
    arrival = packed_arrivals(lined, first)  # `channel_timing` without plan times
    lag = _longest_lags(table, start, period, arrival)
    fixed = False
    for round_ in range(COMM_ROUNDS):
        plan = [lag[v] * period + start[v] for v in range(len(table))]
        ties = first[2]
        alike = round_ == 0 and isinstance(ties, list) and same_order(ties, lined, start, plan, period)
        again_arrival = channel_timing(table, comm, start, period, plan, packed=first if alike else None)
        again = lag if again_arrival == arrival else _longest_lags(table, start, period, again_arrival)
        arrival = again_arrival
        fixed = again == lag
        lag = again
        if fixed:
            break
    return lag, arrival, fixed


@dataclass(frozen=True)
class Timing:
    """Starts and lags of a placement, with the per-layer staleness they give."""

    start: list[int]
    lag: list[int]
    staleness: dict[int, int]
    #: Planned arrival of every transfer (u, v), from the start of u's period (empty on `shared`).
    arrival: dict[tuple[int, int], int] = field(default_factory=dict)

    def score(self) -> tuple[int, int, int]:
        """Smaller is better: worst staleness, total staleness, deepest lag (activation memory)."""
        return (max(self.staleness.values(), default=0), sum(self.staleness.values()), max(self.lag, default=0))


def timed(table: TaskTable, start: list[int], period: int, comm: Comm | None = None) -> Timing:
    """The minimal lags for these starts (transfers planned on `comm`) and the staleness they give."""
    lag, arrival = comm_timing(table, start, period, comm)
    return timing_of(table, start, lag, period, arrival)


def timing_of(table: TaskTable, start: list[int], lag: list[int], period: int,
              arrival: dict[tuple[int, int], int] | None = None) -> Timing:
    spans = loop_spans(table, start, lag, period, arrival)
    return Timing(start, lag, {layer: staleness_from_span(s, period) for layer, s in spans.items()},
                  dict(arrival or {}))

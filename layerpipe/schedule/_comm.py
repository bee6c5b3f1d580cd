"""Transfers of a periodic placement: which data crosses processors, on which channel, and when it arrives
(design notes §11; the interconnect model is `layerpipe.interconnect`).

A placement puts each task of the training graph on a processor. Every precedence edge u → v whose ends sit
on different processors is a transfer of the edge's words from u's processor to v's, and so is every weight
read: the task X_l that reads W_l away from the processor running U_l receives the new version (|W_l| words)
after each update. Under the simulator's rules (`layerpipe.sim._engine`) a transfer leaves its channel when
its producer has ended and the channel is free, in producer order (a link p→q only carries transfers from
p, so its order is p's program order; consumers of one producer go in their program order), holds it
⌈words / w⌉ cycles and arrives `latency` later.

A periodic schedule repeats every P cycles, so each channel repeats too: `channel_timing` packs a channel's
transfers around the period in that FIFO order (the steady state of the queue: each transfer departs at
max(its release, the previous one's departure + hold), the last of one period feeding the first of the
next), which needs the channel's occupancy Σ hold ≤ P. The arrivals it returns, relative to the producer's
period, are what `minimal_lags` waits for: lag_v ≥ lag_u + ⌈(arrival − start_v) / P⌉. Because the
simulator's queue order is the plan's and the plan is one valid execution, self-timed execution is never
slower than the plan, and it cannot be faster than the busiest processor or channel: with
P = max(busiest processor, busiest channel) the simulated period equals the scheduled one.

On a `bus` every transfer shares channel 0. Its order across processors is not fixed by any one program, so
a self-timed run that gets ahead of the plan would reorder it (and, with unequal transfers, lose the period);
a planned run's bus is therefore compiled — as an accelerator whose microcode issues its bus transfers would:
`channel_timing` packs it in the order `layerpipe.interconnect.compiled_bus_key` defines and the simulator
serves it in that order, no transfer before the plan's bus sends it (`layerpipe.sim._engine.bus_order`).
Weight reads of an unfolded table come from the update copy the timing pins them to, so the planned
transfers are the simulated ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import NamedTuple

from layerpipe._memo import BoundedMemo
from layerpipe.interconnect import SHARED, Interconnect, compiled_bus_key
from layerpipe.schedule._ir import tie_rank
from layerpipe.schedule._task_table import TaskTable


@dataclass(frozen=True)
class Comm:
    """The interconnect a periodic timing is planned on, with the placement it applies to."""

    placement: Sequence[int]
    interconnect: Interconnect = SHARED
    num_procs: int = 1

    @property
    def free(self) -> bool:
        return self.interconnect.is_shared


class Transfer(NamedTuple):
    """Producer task index `src` sends `words` to consumer task index `dst` on `channel`; `weight` marks a
    weight read (U_l → a reader of W_l: it sets the version read, not a lag). A named tuple: placements are
    listed by the hundred per schedule, and a frozen dataclass costs several times as much to make."""

    src: int
    dst: int
    words: int
    channel: int
    hold: int
    weight: bool = False
    #: For a weight read, the update copy `table.weight_reads` names (`src` is the copy really read from).
    listed: int = -1


def transfers(table: TaskTable, comm: Comm, sources: Mapping[tuple[int, int], int] | None = None) -> list[Transfer]:
    """Every transfer of one iteration under `comm`'s placement (none on `shared`); `sources[(u, x)]` replaces
    the update copy a weight read (u, x) of the table comes from (`channel_timing`).

    Memoised by the table's content (`TaskTable.token`), placement, interconnect, processors and sources: the
    timing passes ask for the transfers of one placement many times (every body order tried, every round of
    re-planning), and `Transfer`s are frozen, so the lists share them (each caller gets its own list)."""
    if comm.free:
        return []
    return list(queues(table, comm, sources).found)


def queues(table: TaskTable, comm: Comm, sources: Mapping[tuple[int, int], int] | None = None) -> Queues:
    """`transfers` with their channel queues (`Queues`), memoised by the same key (`comm` not `shared`)."""
    key = (table.token, tuple(comm.placement), comm.interconnect, comm.num_procs,
           tuple(sorted(sources.items())) if sources else None)
    found = _TRANSFERS.get(key)
    if found is None:
        if sources:
            # Only the weight reads depend on `sources`: the precedence transfers, which come first, are the
            # plain queues' own (re-pinning rounds of a large unfolded table would otherwise rebuild them all).
            plain = queues(table, comm).found
            made = [*plain[: _precedence_count(plain)], *_weight_transfers(table, comm, sources)]
        else:
            made = _transfers(table, comm, sources)
        found = _TRANSFERS.add(key, Queues(table, comm, tuple(made)))
    return found


def _precedence_count(found: Sequence[Transfer]) -> int:
    """How many of `_transfers`' list are precedence transfers (they precede every weight read)."""
    count = len(found)
    while count and found[count - 1].weight:
        count -= 1
    return count


class Queues:
    """Transfers as the packing reads them on every call: flat per-transfer lists (no attribute lookups in the
    loops) and each channel's transfers, channels in order of first use and each in `found` order. The lists
    only the timing passes read are made on first use (a placement is often only costed: `channel_hold`,
    `words`)."""

    def __init__(self, table: TaskTable, comm: Comm, found: Sequence[Transfer]) -> None:
        self.found = tuple(found)
        self._table, self._placement = table, comm.placement
        self.hold = [t.hold for t in found]
        self.words = sum(t.words for t in found)
        by_channel: dict[int, list[int]] = {}
        for i, t in enumerate(found):
            by_channel.setdefault(t.channel, []).append(i)
        self.channels = list(by_channel.values())
        hold = self.hold
        self.channel_hold = [sum(hold[i] for i in queue) for queue in self.channels]

    @cached_property
    def src(self) -> list[int]:
        return [t.src for t in self.found]

    @cached_property
    def dst(self) -> list[int]:
        return [t.dst for t in self.found]

    @cached_property
    def weight(self) -> list[bool]:
        return [t.weight for t in self.found]

    @cached_property
    def any_weight(self) -> bool:
        return any(self.weight)

    @cached_property
    def pairs(self) -> list[tuple[int, int]]:
        return [(t.src, t.dst) for t in self.found]

    @cached_property
    def src_cost(self) -> list[int]:
        cost = self._table.cost
        return [cost[t.src] for t in self.found]

    @cached_property
    def dst_place(self) -> list[int]:
        place = self._placement
        return [place[t.dst] for t in self.found]

    @cached_property
    def lanes(self) -> list[list[tuple[int, int, int, int, bool, int]]]:
        """Per channel, its transfers as (index, producer, consumer, producer's cost, weight read, hold): what
        the links' packing reads of each."""
        src, dst, src_cost, weight, hold = self.src, self.dst, self.src_cost, self.weight, self.hold
        return [[(i, src[i], dst[i], src_cost[i], weight[i], hold[i]) for i in queue] for queue in self.channels]

    @cached_property
    def edge_transfers(self) -> list[tuple[int, int]] | None:
        """(precedence edge index in `table.precedence`, transfer index) of every transfer on a precedence edge,
        when no two transfers share their ends (then the lag pass reads arrivals by index, not by dict)."""
        pairs, weight = self.pairs, self.weight
        if len(set(pairs)) != len(pairs):
            return None
        edge = self._table.edge_index
        return [(edge[pair], i) for i, pair in enumerate(pairs) if not weight[i] and pair in edge]

    @cached_property
    def edge_slots(self) -> list[int]:
        """Per precedence edge of the table (`table.precedence` order), the transfer carrying it or −1 (local);
        only when `edge_transfers` is not None."""
        assert self.edge_transfers is not None
        slots = [-1] * len(self._table.precedence[0])
        for e, i in self.edge_transfers:
            slots[e] = i
        return slots


#: `transfers`' memo: (table token, placement, interconnect, processors, sources) → the transfers' `Queues`.
_TRANSFERS: BoundedMemo[tuple[object, ...], Queues] = BoundedMemo(128)


def _transfers(table: TaskTable, comm: Comm, sources: Mapping[tuple[int, int], int] | None) -> list[Transfer]:
    ic, place, n = comm.interconnect, comm.placement, comm.num_procs
    bus = ic.kind == "bus"
    holds: dict[int, int] = {}  # words → hold: a table moves few distinct sizes
    out = []
    for v, ps in enumerate(table.preds):
        pv = place[v]
        for u, w in zip(ps, table.pred_words[v], strict=True):
            pu = place[u]
            if pu != pv:
                h = holds.get(w)
                if h is None:
                    h = holds[w] = ic.hold(w)
                out.append(Transfer(u, v, w, 0 if bus else pu * n + pv, h))  # `Interconnect.channel`
    out += _weight_transfers(table, comm, sources)
    return out


def _weight_transfers(table: TaskTable, comm: Comm, sources: Mapping[tuple[int, int], int] | None) -> list[Transfer]:
    """`_transfers`' weight reads: each from the update copy `sources` names (or the one the table lists)."""
    ic, place, n = comm.interconnect, comm.placement, comm.num_procs
    bus = ic.kind == "bus"
    holds: dict[int, int] = {}  # words → hold, as in `_transfers` (re-pinning rounds rebuild these by the hundred)
    out = []
    for u, x, w in table.weight_reads:
        src = sources.get((u, x), u) if sources else u
        ps, px = place[src], place[x]
        if ps != px:
            h = holds.get(w)
            if h is None:
                h = holds[w] = ic.hold(w)
            out.append(Transfer(src, x, w, 0 if bus else ps * n + px, h, True, u))  # `Interconnect.channel`
    return out


def channel_loads(table: TaskTable, comm: Comm) -> dict[int, int]:
    """Cycles each channel is held per iteration (only channels that carry something)."""
    load: dict[int, int] = {}
    for t in transfers(table, comm):
        if t.hold:
            load[t.channel] = load.get(t.channel, 0) + t.hold
    return load


def busiest_channel(table: TaskTable, comm: Comm) -> int:
    """The period bound the placement's traffic sets: the most cycles any channel is held per iteration."""
    return max(channel_loads(table, comm).values(), default=0)


#: Rounds of re-planning an unfolded table's weight reads from the copies the timing pins them to, before the
#: pins may only move to older copies (then the rounds end: each moves a pin, and a pin can only grow older).
SOURCE_ROUNDS = 4


def channel_timing(table: TaskTable, comm: Comm, start: Sequence[int], period: int,
                   consumer_time: Sequence[int] | None = None,
                   packed: tuple[list[int], list[int], object] | None = None) -> dict[tuple[int, int], int]:
    """Arrival of every transfer (u, v), in cycles from the start of u's period (u's start is start[u]).

    `packed`, when the caller has it, is `pack` of the table's own transfers on these plan times (the first
    packing, which is then not repeated).

    `consumer_time[v]` orders the consumers of one producer on one channel (their program order: absolute
    start in the plan, lag·P + start); without it they go by start offset. Channels must fit in the period.

    Weight reads of an unfolded table with several update copies per layer are planned from the copy the
    timing makes each reader read (`_unfold.pinned_weight_sources`: the rule the unrolled schedule pins
    reads with, which needs the lags, so only with `consumer_time`), re-planned until the copies stop
    changing; each is reported under the read `table.weight_reads` lists, as its arrival after the listed
    copy's end plus the delay after the read copy's end — so `read_delays` (arrival − end of the listed copy)
    is the delay of the transfer the simulator makes.

    The copies need not settle: a newer copy's transfer can make a full bus late enough that the reader pins
    an older one, and without that transfer the newer copy would be in time again. After `SOURCE_ROUNDS`
    free rounds a pin only moves to older copies, so the rounds end; a read whose plan then holds it to an
    older copy than its planned arrival would pin is reported with the least delay that pins that copy
    (`_unfold.pinning_delay`), so the run reads — and the bus carries — what the plan packed.
    """
    if comm.free:
        return {}
    lined = queues(table, comm)
    found = lined.found
    if not found:
        return {}
    arrival = packed_arrivals(lined, packed if packed is not None else pack(table, comm, lined, start, period,
                                                                            consumer_time))
    if consumer_time is None or not lined.any_weight:
        return arrival
    from layerpipe.schedule._unfold import (  # _unfold imports this module
        UnfoldedTable,
        pinned_weight_sources,
        pinning_delay,
    )

    if not isinstance(table, UnfoldedTable):
        return arrival
    lag = [(at - s) // period for at, s in zip(consumer_time, start, strict=True)]
    sources = {(u, x): u for u, x, _ in table.weight_reads}

    def delays() -> dict[int, int]:
        return {t.dst: arrival[(t.src, t.dst)] - start[t.src] - table.cost[t.src] for t in found if t.weight}

    # After the free rounds a pin only moves older, by at most J/g updates per period of its transfer's delay,
    # which is under 2P + latency (the queue and the hold each under a period): a bound on the rounds.
    settled_at: int | None = None
    moves = table.unfold * (3 + comm.interconnect.latency // max(1, period))
    for round_ in range(SOURCE_ROUNDS + len(sources) * moves):
        newest = sources if round_ >= SOURCE_ROUNDS else None
        again = pinned_weight_sources(table, comm.placement, start, lag, period, delays(), newest)
        if again == sources:
            settled_at = round_
            break
        sources = again
        lined = queues(table, comm, sources)
        found = lined.found
        arrival = packed_arrivals(lined, pack(table, comm, lined, start, period, consumer_time))
    assert settled_at is not None, "the weight-read pins did not settle"
    out = {(t.src, t.dst): arrival[(t.src, t.dst)] for t in found if not t.weight}
    for t in found:
        if t.weight:
            out[(t.listed, t.dst)] = (arrival[(t.src, t.dst)] - start[t.src] - table.cost[t.src]
                                      + start[t.listed] + table.cost[t.listed])
    if settled_at < SOURCE_ROUNDS:  # settled in a free round: every pin is the one its arrival gives
        return out
    delay = delays()
    natural = pinned_weight_sources(table, comm.placement, start, lag, period, delay)
    for (u, x), source in sources.items():
        if natural[(u, x)] != source:  # held to an older copy: report the delay that pins it
            held = pinning_delay(table, comm.placement, start, lag, period, x, source, delay.get(x, 0))
            out[(u, x)] = start[u] + table.cost[u] + held
    return out


def _pack_channels(table: TaskTable, comm: Comm, start: Sequence[int], period: int,
                   consumer_time: Sequence[int] | None, found: Sequence[Transfer]) -> dict[tuple[int, int], int]:
    """Arrivals of `found`, each channel packed around the period in its FIFO order (`pack`)."""
    lined = Queues(table, comm, found)
    return packed_arrivals(lined, pack(table, comm, lined, start, period, consumer_time))


def packed_arrivals(lined: Queues, packed: tuple[list[int], list[int], object]) -> dict[tuple[int, int], int]:
    """`pack`'s arrivals by (producer, consumer), entered channel by channel in queue order (a later transfer
    between the same two tasks replaces an earlier one)."""
    arrive, order, _ = packed
    pairs = lined.pairs
    return {pairs[i]: arrive[i] for i in order}


def pack(table: TaskTable, comm: Comm, lined: Queues, start: Sequence[int], period: int,
         consumer_time: Sequence[int] | None) -> tuple[list[int], list[int], bool | list[list[tuple[int, ...]]]]:
    """Arrival of every transfer of `lined` (by index), the transfers channel by channel in queue order, each
    channel packed around the period in its FIFO order, and where the plan times can change that order: on a
    bus anywhere (True); on links only within a run of transfers of one channel that release at the same
    offset in the same period (the plan times only break those ties), so without such a run every
    `consumer_time` packs alike. The runs are listed (their entries, `same_order` reads them).

    The queue's FIFO order in one period: release offset modulo P (a producer ending past P releases in the
    next period, ahead of that period's later releases), earlier periods first on a tie; equal releases in the
    consumer's program order — its processor, then its plan time in the same frame (a weight read is consumed
    at least one iteration later) — as the simulator's engine queues them. A bus is compiled: the one order
    `compiled_bus_key` defines, on plan times taken in the window of the release (the simulator applies it to
    the absolute planned times). Each transfer's key ends with its position in `found`, so equal keys keep
    that order (as a stable sort would). The departures are `_fifo_departures`' (`_departures`, on the sorted
    entries); a channel of one transfer departs at its release."""
    latency = comm.interconnect.latency
    if comm.interconnect.kind == "bus":
        return _pack_bus(table, comm, lined, start, period, consumer_time)
    # On links a channel p→q carries transfers into q alone: the consumer's processor, third in the order above,
    # is the same for all of them and drops out. Each entry is (offset, −period, consumer plan time in the
    # frame + later, consumer, producer, index, release, hold): the index ends the order, so the sort never
    # compares the last two.
    arrive = [0] * len(lined.src)
    order: list[int] = []
    ties: list[list[tuple[int, ...]]] = []  # runs of entries with equal release offset and period, in order
    key_of = consumer_time if consumer_time is not None else start
    for lane, held in zip(lined.lanes, lined.channel_hold, strict=True):
        if held > period:
            raise ValueError(f"channel of {held} cycles per period does not fit the period {period}")
        if len(lane) == 1:  # departs at its release: arrival = release + hold + latency
            i, u, _, cost_u, _, hold = lane[0]
            arrive[i] = start[u] + cost_u + hold + latency
            order.append(i)
            continue
        if consumer_time is None:  # the frame is the release's period
            entries = [(r % period, -(r // period), start[v] - (r // period) * period + (period if weight else 0), v, u,
                        i, r, hold)
                       for i, u, v, cost_u, weight, hold in lane for r in (start[u] + cost_u,)]
        else:
            entries = [(r % period, -(r // period),
                        key_of[v] - (key_of[u] // period + r // period) * period + (period if weight else 0), v, u, i,
                        r, hold)
                       for i, u, v, cost_u, weight, hold in lane for r in (start[u] + cost_u,)]
        entries.sort()
        departs = _departures(entries, period)
        previous = entries[0]
        run: list[tuple[int, ...]] | None = None  # the tied run `previous` is in, if any
        for entry, d in zip(entries, departs, strict=True):
            offset, whole, _, _, _, i, r, hold = entry
            arrive[i] = d + r - offset + hold + latency
            order.append(i)
            if entry is not previous and offset == previous[0] and whole == previous[1]:
                if run is None:
                    run = [previous]
                    ties.append(run)
                run.append(entry)
            else:
                run = None
            previous = entry
    return arrive, order, ties


def same_order(ties: list[list[tuple[int, ...]]], lined: Queues, start: Sequence[int], plan: Sequence[int],
               period: int) -> bool:
    """Whether packing the links again on plan times `plan` keeps every tied run of `pack` (without plan times)
    in its order — then it packs every channel alike: the same arrivals, in the same order. In a run the
    release offset and period are equal, so the order is the consumer's plan time in the producer's frame (+ P
    for a weight read), then consumer, producer, index, as `pack` keys it."""
    weight = lined.weight
    for run in ties:
        keys = [(plan[v] - (plan[u] // period - whole) * period + (period if weight[i] else 0), v, u, i)
                for _, whole, _, v, u, i, _, _ in run]
        if any(a > b for a, b in pairwise(keys)):
            return False
    return True


def _departures(entries: Sequence[tuple[int, ...]], period: int) -> list[int]:
    """`_fifo_departures` of a queue in order, each entry (release offset, ..., hold last): d_k = max(r_k,
    d_{k−1} + h_{k−1}) from "no carry", then with the carry of the previous period's last transfer until it
    stops growing."""
    carry: int | None = None
    while True:
        at = carry if carry is not None else entries[0][0]
        departs = []
        for entry in entries:
            if entry[0] > at:
                at = entry[0]
            departs.append(at)
            at += entry[-1]
        new_carry = at - period
        if carry is not None and new_carry <= carry:
            return departs
        if carry is None and new_carry <= departs[0]:
            return departs
        carry = new_carry


def _pack_bus(table: TaskTable, comm: Comm, lined: Queues, start: Sequence[int], period: int,
              consumer_time: Sequence[int] | None) -> tuple[list[int], list[int], bool]:
    """`pack` on a bus: the compiled order (`compiled_bus_key`, taken on plan times: they always matter)."""
    latency = comm.interconnect.latency
    key_of = consumer_time if consumer_time is not None else start
    place = comm.placement
    src, dst, hold, weight, src_cost, dst_place = (lined.src, lined.dst, lined.hold, lined.weight, lined.src_cost,
                                                   lined.dst_place)
    arrive = [0] * len(src)
    order: list[int] = []
    for queue, held in zip(lined.channels, lined.channel_hold, strict=True):
        if held > period:
            raise ValueError(f"channel of {held} cycles per period does not fit the period {period}")
        entries: list[tuple[tuple[object, ...], int, int]] = []
        for i in queue:
            u, v = src[i], dst[i]
            plan_release = key_of[u] + src_cost[i]
            window = plan_release - plan_release % period
            consumer = table.tasks[v]
            key = (compiled_bus_key(plan_release - window, key_of[u] - window, dst_place[i],
                                    key_of[v] + (period if weight[i] else 0) - window,
                                    tie_rank(consumer.kind, consumer.layer), place[u]),
                   v, u, i)
            entries.append((key, i, start[u] + src_cost[i]))
        entries.sort()  # keys are distinct (they end with the index): the order of the keys alone
        departs = _departures([(r % period, hold[i]) for _, i, r in entries], period)
        for (_, i, r), d in zip(entries, departs, strict=True):
            arrive[i] = d + (r - r % period) + hold[i] + latency
            order.append(i)
    return arrive, order, True


def _fifo_departures(release: Sequence[int], hold: Sequence[int], period: int) -> list[int]:
    """Steady-state departures of a FIFO channel that sees these releases every `period` cycles.

    d_k = max(r_k, d_{k−1} + h_{k−1}); the first transfer also waits for the last one of the previous
    period (d_last + h_last − P). Iterated to the fixpoint from "no carry"; it exists when Σh ≤ P and is
    reached within two passes because the carry can only grow and is bounded by the first release.
    """
    if sum(hold) > period:
        raise ValueError(f"channel of {sum(hold)} cycles per period does not fit the period {period}")
    carry: int | None = None
    while True:
        at = carry if carry is not None else release[0]
        out = []
        for r, h in zip(release, hold, strict=True):
            at = max(r, at)
            out.append(at)
            at += h
        new_carry = at - period
        if carry is not None and new_carry <= carry:
            return out
        if new_carry <= out[0] and carry is None:
            # The previous period's last transfer frees the channel before this period's first departs.
            return out
        carry = new_carry

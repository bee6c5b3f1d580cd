"""Placement search on an interconnect: which processor runs each task, seeing the traffic (design notes §11).

A periodic schedule of a placement has period P ≥ max(busiest processor, busiest channel) — every channel
carries its transfers once per period (`_comm`) — and the ordering passes reach that bound (lags absorb
any latency), so a placement's *period on the interconnect* is

    period(placement) = max(max_p Σ_{v on p} c(v), max_channel Σ_{transfers on it} ⌈words / w⌉).

`improve` is a local search over that objective: it moves one item (a task, or a weight group of a layer's
F, E, G, U under `keep_weights_together`) off the bottleneck resource — the busiest processor, or one end
of a transfer on the busiest channel — while that lowers (period, resources at the period, words), under
an optional bound on words per iteration. Loads and channel holds are updated incrementally, so a move
costs the degree of the item, not the size of the graph; a round with many candidate moves finds and scores
them together on arrays (`_placement_arrays`, per-item sums per processor kept under moves as well).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass
from operator import neg

import numpy as np

from layerpipe._memo import BoundedMemo, memo
from layerpipe.interconnect import Interconnect
from layerpipe.schedule._comm import Comm, queues
from layerpipe.schedule._placement_arrays import INT64_SAFE, Dense, PairSums, candidate_arrays, scored_arrays
from layerpipe.schedule._task_table import TaskTable

#: Least loaded processors a move off the busiest processor may go to (besides its data's processors).
LIGHT_TARGETS = 3
#: Most improving moves one search makes (each lowers the objective, so it stops long before on real graphs).
MAX_MOVES = 4000


@dataclass(frozen=True)
class PlacementCost:
    """A placement's figures on an interconnect: its period bound and the words it moves per iteration."""

    period: int
    busiest_processor: int
    busiest_channel: int
    words: int


def placement_cost(table: TaskTable, placement: Sequence[int], num_procs: int,
                   interconnect: Interconnect) -> PlacementCost:
    load = [0] * num_procs
    cost = table.cost
    for v, p in enumerate(placement):
        load[p] += cost[v]
    if interconnect.is_shared:  # no channels, but the words still cross processors
        channel, words = 0, crossing_words(table, placement)
    else:  # the transfers with their channels' holds (`queues`, memoised for the timing passes)
        lined = queues(table, Comm(placement, interconnect, num_procs))
        channel, words = max(lined.channel_hold, default=0), lined.words
    return PlacementCost(max(max(load), channel), max(load), channel, words)


def crossing_words(table: TaskTable, placement: Sequence[int]) -> int:
    """Words per iteration on precedence edges and weight reads whose ends are on different processors."""
    words = sum(w for v, ps in enumerate(table.preds) for u, w in zip(ps, table.pred_words[v], strict=True)
                if placement[u] != placement[v])
    return words + sum(w for u, x, w in table.weight_reads if placement[u] != placement[x])


class _Items:
    """What `improve` reads of a table, its items and the interconnect, whatever the placement: each item's
    edges to tasks of other items summed per other task and direction (`nbrs`: words and holds out of the
    item and into it, so a trial move reads one row per neighbour), the items next to each item, and the
    edges that hold a channel. Shared by the searches from every start placement of one table (`_items`)."""

    def __init__(self, table: TaskTable, interconnect: Interconnect, members: Sequence[Sequence[int]]) -> None:
        shared = interconnect.is_shared
        self.members = members
        self.item_of = [0] * len(table)
        for i, tasks in enumerate(members):
            for v in tasks:
                self.item_of[v] = i
        self.item_cost = [sum(table.cost[v] for v in tasks) for tasks in members]
        # Every data edge once, with its hold: (producer, consumer, words, hold).
        self.edges: list[tuple[int, int, int, int]] = []
        for v, ps in enumerate(table.preds):
            for u, w in zip(ps, table.pred_words[v], strict=True):
                self.edges.append((u, v, w, interconnect.hold(w)))
        for u, x, w in table.weight_reads:
            self.edges.append((u, x, w, interconnect.hold(w)))
        # Per item, per other task: [words out, hold out, words in, hold in] (holds only where channels exist).
        rows: list[dict[int, list[int]]] = [{} for _ in members]
        for u, v, w, h in self.edges:
            iu, iv = self.item_of[u], self.item_of[v]
            if iu == iv:
                continue
            h = 0 if shared else h
            out = rows[iu].setdefault(v, [0, 0, 0, 0])
            out[0] += w
            out[1] += h
            into = rows[iv].setdefault(u, [0, 0, 0, 0])
            into[2] += w
            into[3] += h
        self.nbrs: list[list[tuple[int, int, int, int, int]]] = [
            [(x, wo, ho, wi, hi) for x, (wo, ho, wi, hi) in row.items()] for row in rows]
        self.nbr_tasks = [tuple(row) for row in rows]
        self.nbr_items = [sorted({self.item_of[x] for x in row}) for row in rows]
        #: The edges that hold a channel, for the moves off the busiest channel: (producer, consumer).
        self.held = [(u, v) for u, v, _, h in self.edges if h and not shared]
        #: Whether every sum of loads, holds and words fits int64 with room (`Dense`, else Python ints only).
        self.fits_int64 = (sum(self.item_cost) < INT64_SAFE
                           and sum(w + h for _, _, w, h in self.edges) < INT64_SAFE)
        self._pairs: PairSums | None = None

    @property
    def pairs(self) -> PairSums:
        """`PairSums` of these items, built on first use (then shared like the rest)."""
        if self._pairs is None:
            self._pairs = PairSums(self, len(self.members))
        return self._pairs


#: `_Items` by (table token, interconnect, items): the few last, for the start placements of one search.
_ITEMS: BoundedMemo[tuple[object, ...], _Items] = BoundedMemo(8)


def _items(table: TaskTable, interconnect: Interconnect, members: Sequence[Sequence[int]]) -> _Items:
    key = (table.token, interconnect, tuple(map(tuple, members)))
    found = _ITEMS.get(key)
    if found is None:
        found = _ITEMS.add(key, _Items(table, interconnect, members))
    return found


class _State:
    """Loads, channel holds and words of a placement, kept up to date under moves of whole items.

    An item's tasks share one processor (`item_place`). The channel and word changes of a move (`delta`) are
    memoised per (item, destination) until the item or one of its neighbours moves.
    """

    def __init__(self, table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
                 members: Sequence[Sequence[int]]) -> None:
        self.ic, self.n = interconnect, num_procs
        self.shared, self.bus = interconnect.is_shared, interconnect.kind == "bus"
        items = _items(table, interconnect, members)
        self.members, self.item_of, self.item_cost = members, items.item_of, items.item_cost
        self.nbrs, self.nbr_tasks, self.nbr_items, self.held = items.nbrs, items.nbr_tasks, items.nbr_items, items.held
        self.place = list(placement)
        self.item_place = [self.place[tasks[0]] for tasks in members]
        for i, tasks in enumerate(members):
            if any(self.place[v] != self.item_place[i] for v in tasks):
                raise ValueError(f"improve: the tasks of item {i} are not on one processor")
        self.load = [0] * num_procs
        for v, p in enumerate(self.place):
            self.load[p] += table.cost[v]
        self.chan: dict[int, int] = {}
        self.words = 0
        for u, v, w, h in items.edges:
            if self.place[u] != self.place[v]:
                self.words += w
                if h and not self.shared:
                    c = self.channel(self.place[u], self.place[v])
                    self.chan[c] = self.chan.get(c, 0) + h
        self.memo: list[dict[int, tuple[list[tuple[int, int]], int]]] = [{} for _ in members]
        self._histogram()
        #: Items per processor: how many moves a round off the busiest processors offers (`array_round`).
        self.items_on = [0] * num_procs
        for p in self.item_place:
            self.items_on[p] += 1
        self._items = items
        #: The same figures on arrays, built at the first round large enough (`arrays`), then kept by `move`.
        self.dense: Dense | None = None

    def array_round(self) -> bool:
        """Whether this round's moves are found and scored on arrays: when the items on the busiest processors
        times the targets each may have reach `ARRAY_ROUND_MOVES` (numpy's fixed cost per round is about what
        the Python rounds spend on that many moves), and every figure fits int64."""
        top, n = self.levels[0], self.n
        on_busiest = sum(k for k, x in zip(self.items_on, self.load, strict=True) if x == top)
        return on_busiest * min(n - 1, LIGHT_TARGETS + 1) >= ARRAY_ROUND_MOVES and self._items.fits_int64

    def arrays(self) -> Dense:
        if self.dense is None:
            self.dense = Dense(self, self._items.pairs)
        return self.dense

    def _histogram(self) -> None:
        """How many resources (processors and channels) carry each load, and those loads, largest first:
        what a move's effect on (period, resources at the period) is read from without a full scan."""
        self.hist: dict[int, int] = {}
        for x in (*self.load, *self.chan.values()):
            self.hist[x] = self.hist.get(x, 0) + 1
        self.levels = sorted(self.hist, reverse=True)

    def channel(self, p: int, q: int) -> int:
        return 0 if self.bus else p * self.n + q

    def key(self) -> tuple[int, int, int]:
        top = self.levels[0]
        return top, self.hist[top], self.words

    def delta(self, item: int, dst: int) -> tuple[list[tuple[int, int]], int]:
        """Channel hold changes (channel, change ≠ 0) and the change in words if `item` moved to `dst`."""
        memo = self.memo[item]
        found = memo.get(dst)
        if found is not None:
            return found
        src = self.item_place[item]
        place, n, bus = self.place, self.n, self.bus
        changes: dict[int, int] = {}
        dw = 0
        for x, wo, ho, wi, hi in self.nbrs[item]:
            q = place[x]
            if q != src:
                dw -= wo + wi
                if ho:
                    c = 0 if bus else src * n + q
                    changes[c] = changes.get(c, 0) - ho
                if hi:
                    c = 0 if bus else q * n + src
                    changes[c] = changes.get(c, 0) - hi
            if q != dst:
                dw += wo + wi
                if ho:
                    c = 0 if bus else dst * n + q
                    changes[c] = changes.get(c, 0) + ho
                if hi:
                    c = 0 if bus else q * n + dst
                    changes[c] = changes.get(c, 0) + hi
        found = memo[dst] = ([(c, d) for c, d in changes.items() if d], dw)
        return found

    def key_after(self, item: int, dst: int, beat: tuple[int, int, int]) -> tuple[int, int, int] | None:
        """(period, resources at the period, words) if `item` moved to `dst` — or None when a resource the move
        raises passes `beat`'s period (then the key is above `beat`; the caller wants keys below it)."""
        c = self.item_cost[item]
        load = self.load
        new_dst = load[dst] + c
        bound = beat[0]
        if new_dst > bound:
            return None
        found = self.memo[item].get(dst)
        changes, dw = found if found is not None else self.delta(item, dst)
        # The resources the move touches (distinct: src ≠ dst, and channels are not processors), old → new.
        old_src = load[self.item_place[item]]
        olds, news = [old_src, load[dst]], [old_src - c, new_dst]
        high = max(old_src - c, new_dst)
        if changes:
            chan = self.chan
            for ch, d in changes:
                old = chan.get(ch, 0)
                new = old + d
                if new > bound:
                    return None
                olds.append(old)
                news.append(new)
                if new > high:
                    high = new
        hist = self.hist
        top = high
        for level in self.levels:  # the largest load some untouched resource still holds
            if level <= high:
                break
            if hist[level] > olds.count(level):
                top = level
                break
        if not top:  # nothing loaded at all: every resource holds 0, as counted before the move
            return 0, hist.get(0, 0), self.words + dw
        return top, hist.get(top, 0) - olds.count(top) + news.count(top), self.words + dw

    def move(self, item: int, dst: int) -> None:
        src = self.item_place[item]
        changes, dw = self.delta(item, dst)
        # The histogram follows each resource the move changes: old level out, new level in (a channel at 0
        # holds nothing and is not counted, as in `_histogram`).
        for ch, d in changes:
            old = self.chan.get(ch, 0)
            value = old + d
            if old:
                self._level_out(old)
            if value:
                self.chan[ch] = value
                self._level_in(value)
            else:
                self.chan.pop(ch, None)
        self.words += dw
        cost = self.item_cost[item]
        for p, change in ((src, -cost), (dst, cost)):
            self._level_out(self.load[p])
            self.load[p] += change
            self._level_in(self.load[p])
        self.items_on[src] -= 1
        self.items_on[dst] += 1
        for v in self.members[item]:
            self.place[v] = dst
        self.item_place[item] = dst
        self.memo[item].clear()
        for j in self.nbr_items[item]:
            self.memo[j].clear()
        if self.dense is not None:
            self.dense.move(item, src, dst, changes)

    def _level_out(self, x: int) -> None:
        left = self.hist[x] - 1
        if left:
            self.hist[x] = left
        else:
            del self.hist[x]
            del self.levels[bisect_left(self.levels, -x, key=neg)]

    def _level_in(self, x: int) -> None:
        if x in self.hist:
            self.hist[x] += 1
        else:
            self.hist[x] = 1
            insort(self.levels, x, key=neg)

    def candidate_moves(self) -> list[tuple[int, int]]:
        """(item, destination) pairs that touch a bottleneck resource, in order — less those that would load
        their destination processor past the period (no such move lowers the key)."""
        top = self.levels[0]
        moves: set[tuple[int, int]] = set()
        load, cost = self.load, self.item_cost
        # Off a busiest processor: to one of the least loaded processors, or to where the item's data goes.
        light = sorted(range(self.n), key=lambda q: (load[q], q))[:LIGHT_TARGETS]
        busiest = {p for p, x in enumerate(load) if x == top}
        if busiest:
            place, nbr_tasks = self.place, self.nbr_tasks
            for i, p in enumerate(self.item_place):
                if p in busiest:
                    room = top - cost[i]
                    targets = {*light, *map(place.__getitem__, nbr_tasks[i])}
                    targets.discard(p)
                    moves.update([(i, q) for q in targets if load[q] <= room])
        moves.update(self.channel_moves(top))
        return sorted(moves)

    def channel_moves(self, top: int) -> set[tuple[int, int]]:
        """The candidate moves off the channels holding `top`: either end of a transfer on one, to the other
        end's processor (unless that loads it past `top`)."""
        moves: set[tuple[int, int]] = set()
        hot = {ch for ch, x in self.chan.items() if x == top}
        if hot:
            load, cost = self.load, self.item_cost
            place, item_of, bus, n = self.place, self.item_of, self.bus, self.n
            for u, v in self.held:
                pu, pv = place[u], place[v]
                if pu != pv and (0 if bus else pu * n + pv) in hot:  # `channel`, inlined (every held edge)
                    iu, iv = item_of[u], item_of[v]
                    if load[pv] + cost[iu] <= top:
                        moves.add((iu, pv))
                    if load[pu] + cost[iv] <= top:
                        moves.add((iv, pu))
        return moves


def improve(table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
            members: Sequence[Sequence[int]], max_words: float | None = None) -> list[int]:
    """A placement no single move of an item off a bottleneck improves, by (period, resources at the period,
    words per iteration), never exceeding `max_words` words per iteration when given. Each item's tasks must
    share a processor in `placement`.

    Memoised by the table's content (`TaskTable.token`) and every argument: LayerPipe's searches with and
    without a staleness bound start from the same placements."""
    key = (table.token, tuple(placement), num_procs, interconnect, tuple(map(tuple, members)), max_words)
    found = _IMPROVED.get(key)
    if found is None:
        if len(_IMPROVED) >= _IMPROVED_KEPT:
            _IMPROVED.pop(next(iter(_IMPROVED)))
        found = _IMPROVED[key] = tuple(_improve(table, placement, num_procs, interconnect, members, max_words))
    return list(found)


#: `improve`'s memo: (table token, start, N, interconnect, items, bound) → the improved placement.
_IMPROVED: dict[tuple[object, ...], tuple[int, ...]] = memo({})
_IMPROVED_KEPT = 256


def _improve(table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
             members: Sequence[Sequence[int]], max_words: float | None) -> list[int]:
    state = _State(table, placement, num_procs, interconnect, members)
    for _ in range(MAX_MOVES):
        # the first candidate move of least key below the placement's own (`best_move`)
        if state.array_round():
            dense = state.arrays()
            items, dsts = candidate_arrays(state, dense, LIGHT_TARGETS)
            k = scored_arrays(state, dense, items, dsts, state.key(), max_words)
            best = None if k < 0 else (int(items[k]), int(dsts[k]))
        else:
            best = best_move(state, state.candidate_moves(), state.key(), max_words)
        if best is None:
            break
        state.move(*best)
    return state.place


# --- one round's moves scored together -------------------------------------------------------------------
# `improve` tries every candidate move of a round (an item off a bottleneck to another processor) and keeps the
# first one of least key (period, resources at the period, words), if below the placement's own key. One at a
# time (`_State.key_after`) each trial costs a few microseconds of Python; resnet50 at N = 16 offers hundreds
# of moves a round over thousands of rounds. So `_improve` finds a round's moves and scores them on arrays
# (`_placement_arrays`: per-item sums per processor kept under moves, keys bounded first and computed exactly
# only where the bound allows the best); `one_at_a_time` is the reference it is tested against
# (tests/test_move_scores.py, tests/test_placement_arrays.py), and what runs on figures past int64. Both pick
# the same move: a trial the loop cuts short (a resource above the best period so far) has a key above that
# best, so it is never the least.

#: Moves from which `best_move` scores a given list on arrays rather than one at a time.
BATCH_MOVES = 48
#: Estimated moves from which `_improve` finds and scores a round on arrays (`_State.array_round`).
ARRAY_ROUND_MOVES = 100

Key = tuple[int, int, int]


def best_move(state: _State, moves: Sequence[tuple[int, int]], current: Key,
              max_words: float | None) -> tuple[int, int] | None:
    """The first of `moves` (in order) of least key below `current`, skipping moves that take the words past
    `max_words` and above `current`'s; None when none is below."""
    if len(moves) >= BATCH_MOVES and state.dense is not None:  # arrays already kept: score on them
        return _scored(state, moves, current, max_words)
    return one_at_a_time(state, moves, current, max_words)


def one_at_a_time(state: _State, moves: Sequence[tuple[int, int]], current: Key,
                  max_words: float | None) -> tuple[int, int] | None:
    """`best_move` trial by trial: each trial only needs to beat the best so far (`key_after` stops early)."""
    beat = current
    best: tuple[int, int] | None = None
    for item, dst in moves:  # in order: on equal keys the first move wins
        after = state.key_after(item, dst, beat)
        if after is None or not after < beat:
            continue
        if max_words is not None and after[2] > max_words and after[2] > current[2]:
            continue
        beat, best = after, (item, dst)
    return best


def _scored(state: _State, moves: Sequence[tuple[int, int]], current: Key,
            max_words: float | None) -> tuple[int, int] | None:
    """`best_move` on arrays (`scored_arrays`); OverflowError when a figure is past int64."""
    if not state._items.fits_int64:
        raise OverflowError("move figures beyond int64")
    pairs = np.array(moves, dtype=np.int64).reshape(len(moves), 2)
    k = scored_arrays(state, state.arrays(), pairs[:, 0], pairs[:, 1], current, max_words)
    return None if k < 0 else moves[k]

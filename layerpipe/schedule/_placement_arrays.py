"""`improve`'s rounds on dense arrays: a placement's per-item neighbour sums kept per processor, so that a round's
candidate moves and their keys come out of a few numpy calls instead of a Python loop over the moves.

Why dense: every move of item i from s to d changes the same figures, read off four rows of i —

- words: WS[i, s] − WS[i, d], where WS[i, r] sums the words of i's edges to tasks now on r (both directions);
- links: channel (s, r) loses HO[i, r] and (d, r) gains it (holds of i's edges out to tasks on r), channel
  (r, s) loses HI[i, r] and (r, d) gains it (holds in); channels (s, d) and (d, s) get both of their terms;
- bus: the one channel changes by HB[i, s] − HB[i, d] (HB = HO + HI);
- candidate targets: the processors r with NB[i, r] > 0 (i has a neighbour task there).

and a move of item j from a to b shifts, for each item next to j, j's share of those sums from column a to
column b — the degree of j, like `_State.move`.

The key of a move (period, resources at the period, words) is the maximum of the loads and holds after the
move and how many resources hold it. Split the resources into those the move cannot change (processors other
than s and d, channels outside rows and columns s and d; their maximum and its count depend only on (s, d)) and
those it may change (s, d and the channels of rows and columns s and d, counted with their new values —
a channel whose change is 0 keeps its value, so counting it there or among the unchanged gives the same max and
count). That is `_State.key_after`'s key exactly (tests/test_placement_arrays.py), computed for every move
of a round at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from layerpipe.schedule._placement import _Items, _State

Key = tuple[int, int, int]

#: Bound on the summed loads, holds and words of a table scored on int64 arrays: every figure a round computes
#: stays below twice it, and words below it compare with a float words bound exactly (numpy compares int64 with
#: a float in float64, exact up to 2**53). Far beyond any table; above it the rounds run on Python ints.
INT64_SAFE = 1 << 53

#: The figure planes of `Dense.sums`: words, holds out, holds in, neighbour tasks.
_WORDS, _OUT, _IN, _NEAR = range(4)


class PairSums:
    """What a move of each item does to its neighbours' dense sums, whatever the placement: per item j, the items
    next to it (`near[j]`) and j's share of their [words, holds out, holds in, tasks] sums (`share[j]`, 4 × len).
    Also every (item, neighbour task, figures) entry, to build the sums of a start placement at once."""

    def __init__(self, items: _Items, count: int) -> None:
        by_pair: dict[tuple[int, int], list[int]] = {}
        entry_item: list[int] = []
        entry_task: list[int] = []
        entry_figures: list[tuple[int, int, int, int]] = []
        for i, row in enumerate(items.nbrs):
            for x, wo, ho, wi, hi in row:
                entry_item.append(i)
                entry_task.append(x)
                entry_figures.append((wo + wi, ho, hi, 1))
                sums = by_pair.setdefault((items.item_of[x], i), [0, 0, 0, 0])
                sums[0] += wo + wi
                sums[1] += ho
                sums[2] += hi
                sums[3] += 1
        grouped: list[list[tuple[int, list[int]]]] = [[] for _ in range(count)]
        for (j, i), sums in by_pair.items():
            grouped[j].append((i, sums))
        self.near = [np.array([i for i, _ in g], dtype=np.int64) for g in grouped]
        self.share = [np.array([s for _, s in g], dtype=np.int64).reshape(len(g), 4).T.copy() for g in grouped]
        self.entry_item = np.array(entry_item, dtype=np.int64)
        self.entry_task = np.array(entry_task, dtype=np.int64)
        self.entry_figures = np.array(entry_figures, dtype=np.int64).reshape(len(entry_item), 4).T.copy()
        #: Per item, its holds out and in summed over all its neighbours: what a move can add to one channel.
        self.out_total = np.zeros(count, dtype=np.int64)
        self.in_total = np.zeros(count, dtype=np.int64)
        np.add.at(self.out_total, self.entry_item, self.entry_figures[_OUT])
        np.add.at(self.in_total, self.entry_item, self.entry_figures[_IN])


class Dense:
    """A placement's loads, holds and per-item sums on int64 arrays, kept in step with `_State` under moves."""

    def __init__(self, state: _State, pairs: PairSums) -> None:
        n, count = state.n, len(state.item_place)
        self.pairs = pairs
        self.load = np.array(state.load, dtype=np.int64)
        self.cost = np.array(state.item_cost, dtype=np.int64)
        self.item_place = np.array(state.item_place, dtype=np.int64)
        # Channel holds as an N×N matrix (links) or one cell (bus); absent channels hold 0.
        self.chan = np.zeros(1 if state.bus else n * n, dtype=np.int64)
        for ch, x in state.chan.items():
            self.chan[ch] = x
        self.sums = np.zeros((4, count, n), dtype=np.int64)
        if len(pairs.entry_item):
            place = np.array(state.place, dtype=np.int64)
            for k in range(4):
                np.add.at(self.sums[k], (pairs.entry_item, place[pairs.entry_task]), pairs.entry_figures[k])

    def move(self, item: int, src: int, dst: int, changes: Sequence[tuple[int, int]]) -> None:
        c = self.cost[item]
        self.load[src] -= c
        self.load[dst] += c
        self.item_place[item] = dst
        for ch, d in changes:
            self.chan[ch] += d
        near = self.pairs.near[item]
        if len(near):
            share = self.pairs.share[item]
            self.sums[:, near, src] -= share
            self.sums[:, near, dst] += share


def candidate_arrays(state: _State, dense: Dense, light_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """`_State.candidate_moves` as (items, destinations) arrays, in the same (sorted) order."""
    top = state.levels[0]
    load, n = dense.load, state.n
    busy = load == top
    rows = np.flatnonzero(busy[dense.item_place])  # the items on a busiest processor
    if len(rows):
        light = np.argsort(load, kind="stable")[:light_targets]  # least loaded, ties by index
        want = dense.sums[_NEAR][rows] > 0  # processors where the item has a neighbour task
        want[:, light] = True
        want[np.arange(len(rows)), dense.item_place[rows]] = False
        want &= load[None, :] <= (top - dense.cost[rows])[:, None]
        at, dsts = np.nonzero(want)  # row-major: by item, then destination
        items = rows[at]
    else:
        items = dsts = np.zeros(0, dtype=np.int64)
    if not state.shared and top in state.chan.values():  # a busiest channel: its ends' moves, merged in order
        extra = state.channel_moves(top)
        if extra:
            codes = np.union1d(items * n + dsts, np.array([i * n + q for i, q in extra], dtype=np.int64))
            items, dsts = codes // n, codes % n
    return items, dsts


def scored_arrays(state: _State, dense: Dense, items: np.ndarray, dsts: np.ndarray, current: Key,
                  max_words: float | None) -> int:
    """`best_move` on arrays: the index of the first move of least key below `current` (words past
    `max_words` and above `current`'s skipped), or -1.

    Every move's period is bounded from below first, from what its (s, d) pair leaves alone and what only grows
    (the loads of s and d after the move, the holds of d's other channels); exact keys are computed only for the
    moves whose bound does not exceed the best exact period found — first among the moves of least bound, which
    usually hold the best move, then, if that best is above their bound, among all moves up to it. A move left
    out has a period above the best's, so the pick is the one over all moves."""
    count = len(items)
    if not count:
        return -1
    load = dense.load
    src = dense.item_place[items]
    cost = dense.cost[items]
    new_src, new_dst = load[src] - cost, load[dsts] + cost
    fig = _Figures(state, dense, items, src, dsts)
    base = np.maximum(np.maximum(new_src, new_dst), fig.left_top)
    bound = base if fig.floor is None else np.maximum(base, fig.floor)
    top0, at0, words0 = current
    open_ = np.flatnonzero(bound <= top0)  # a move bounded above the current period cannot go below it
    if not len(open_):
        return -1

    def least_of(sel: np.ndarray) -> tuple[int, int]:
        """The first move of least key below `current` among `sel` (index into the round's moves) and its period;
        (-1, 0) for none."""
        top, at_top, words = _keys(state, dense, fig, sel, items[sel], dsts[sel], src[sel], new_src[sel],
                                   new_dst[sel], base[sel])
        below = (top < top0) | ((top == top0) & ((at_top < at0) | ((at_top == at0) & (words < words0))))
        if max_words is not None:
            below &= ~((words > max_words) & (words > words0))
        pick = np.flatnonzero(below)
        if not len(pick):
            return -1, 0
        # least key, lexicographically; the first move among equals (lexsort is stable)
        first = pick[np.lexsort((words[pick], at_top[pick], top[pick]))[0]]
        return int(sel[first]), int(top[first])

    least = bound[open_].min()
    best, period = least_of(open_[bound[open_] == least])
    if best >= 0 and period == least:
        return best
    return least_of(open_ if best < 0 else open_[bound[open_] <= period])[0]


class _Figures:
    """Per move, what its (s, d) pair decides, computed once per distinct pair: the highest load or hold the move
    leaves alone (`left_top`) and how many resources hold it (`left_count`); on links also a floor under the
    channels it changes (`floor`: d's other channels only gain) and a cap over them (`cap`: s's channels only
    lose, but for the two between s and d; d's gain at most the item's total holds out, or in)."""

    def __init__(self, state: _State, dense: Dense, items: np.ndarray, src: np.ndarray, dsts: np.ndarray) -> None:
        n = state.n
        load = dense.load
        # The distinct pairs, by a table over all N² codes (cheaper than sorting for np.unique)
        codes = src * n + dsts
        present = np.zeros(n * n, dtype=bool)
        present[codes] = True
        pair_codes = np.flatnonzero(present)
        pairs = len(pair_codes)
        position = np.empty(n * n, dtype=np.int64)
        position[pair_codes] = np.arange(pairs)
        pair_of = position[codes]
        ps, pd = pair_codes // n, pair_codes % n
        hit = np.zeros((pairs, n), dtype=bool)
        ar = np.arange(pairs)
        hit[ar, ps] = True
        hit[ar, pd] = True
        left = np.where(hit, -1, load[None, :])
        self.floor: np.ndarray | None = None
        self.cap: np.ndarray | None = None
        if not state.shared and not state.bus:  # links: the channels outside rows and columns s and d
            chan = dense.chan.reshape(n, n)
            left_chan = np.where(hit[:, :, None] | hit[:, None, :], -1, chan[None, :, :]).reshape(pairs, -1)
            left = np.concatenate((left, left_chan), axis=1)
            self.floor = np.where(hit, -1, np.maximum(chan[pd], chan[:, pd].T)).max(axis=1)[pair_of]
            # Whole rows and columns (the diagonal holds 0): a looser cap, but per processor, not per pair.
            out_max, in_max = chan.max(axis=1), chan.max(axis=0)
            self.cap = np.maximum(np.maximum(out_max, in_max)[src],
                                  np.maximum(out_max[dsts] + dense.pairs.out_total[items],
                                             in_max[dsts] + dense.pairs.in_total[items]))
        left_top = left.max(axis=1)
        self.left_count = (left == left_top[:, None]).sum(axis=1)[pair_of]
        self.left_top = left_top[pair_of]


def _keys(state: _State, dense: Dense, fig: _Figures, sel: np.ndarray, items: np.ndarray, dsts: np.ndarray,
          src: np.ndarray, new_src: np.ndarray, new_dst: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, ...]:
    """The keys (period, resources at the period, words) of the moves `sel` (their items, destinations, ...
    given): the highest of what each leaves alone and what it changes, after the move, and how many hold it."""
    n, sums = state.n, dense.sums
    left_top, left_count = fig.left_top[sel], fig.left_count[sel]
    words = state.words + sums[_WORDS][items, src] - sums[_WORDS][items, dsts]
    top = base.copy()  # the period when no changed channel reaches it
    if state.bus:
        both = sums[_OUT] + sums[_IN]
        bus = dense.chan[0] + both[items, src] - both[items, dsts]
        top = np.maximum(top, bus)
    at_top = np.where(left_top == top, left_count, 0) + (new_src == top) + (new_dst == top)
    if state.bus:
        at_top += bus == top
    elif fig.cap is not None:
        # Links: only moves whose changed channels may reach the period read them (one row of i per block).
        k = np.flatnonzero(fig.cap[sel] >= top)
        if len(k):
            i, s, d = items[k], src[k], dsts[k]
            chan = dense.chan.reshape(n, n)
            out, into = sums[_OUT][i], sums[_IN][i]
            m = np.arange(len(k))
            grid = np.empty((len(k), 4, n), dtype=np.int64)
            np.subtract(chan[s], out, out=grid[:, 0])  # (s, r) loses i's holds out to r
            np.add(chan[d], out, out=grid[:, 1])  # (d, r) gains them
            np.subtract(chan[:, s].T, into, out=grid[:, 2])  # (r, s) loses i's holds in from r
            np.add(chan[:, d].T, into, out=grid[:, 3])  # (r, d) gains them
            grid[m, :, s] = -1  # r ∈ {s, d}: the two channels between s and d, taken below with both terms
            grid[m, :, d] = -1
            flat = grid.reshape(len(k), -1)
            s_d = chan[s, d] - out[m, d] + into[m, s]
            d_s = chan[d, s] + out[m, s] - into[m, d]
            sub_top = np.maximum.reduce([top[k], flat.max(axis=1), s_d, d_s])
            sub_at = (np.where(left_top[k] == sub_top, left_count[k], 0) + (new_src[k] == sub_top)
                      + (new_dst[k] == sub_top) + (flat == sub_top[:, None]).sum(axis=1) + (s_d == sub_top)
                      + (d_s == sub_top))
            top[k], at_top[k] = sub_top, sub_at
    # Nothing loaded at all: every resource holds 0, counted as before the move (`key_after`).
    at_top = np.where(top == 0, state.hist.get(0, 0), at_top)
    return top, at_top, words

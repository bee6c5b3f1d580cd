"""Placement search on an interconnect: which processor runs each task, seeing the traffic (design notes §11).

A periodic schedule of a placement has period P ≥ max(busiest processor, busiest channel) — every channel
carries its transfers once per period (`_comm`) — and the ordering passes reach that bound (lags absorb
any latency), so a placement's *period on the interconnect* is

    period(placement) = max(max_p Σ_{v on p} c(v), max_channel Σ_{transfers on it} ⌈words / w⌉).

`improve` is a local search over that objective: it moves one item (a task, or a weight group of a layer's
F, E, G, U under `keep_weights_together`) off the bottleneck resource — the busiest processor, or one end
of a transfer on the busiest channel — while that lowers (period, resources at the period, words), under
an optional bound on words per iteration. Loads and channel holds are updated incrementally, so a move
costs the degree of the item, not the size of the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from layerpipe.interconnect import Interconnect
from layerpipe.schedule._comm import Comm, transfers
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
    for v, p in enumerate(placement):
        load[p] += table.cost[v]
    holds: dict[int, int] = {}
    words = 0
    for t in transfers(table, Comm(placement, interconnect, num_procs)):
        holds[t.channel] = holds.get(t.channel, 0) + t.hold
        words += t.words
    if interconnect.is_shared:  # no channels, but the words still cross processors
        words = crossing_words(table, placement)
    channel = max(holds.values(), default=0)
    return PlacementCost(max(max(load), channel), max(load), channel, words)


def crossing_words(table: TaskTable, placement: Sequence[int]) -> int:
    """Words per iteration on precedence edges and weight reads whose ends are on different processors."""
    words = sum(w for v, ps in enumerate(table.preds) for u, w in zip(ps, table.pred_words[v], strict=True)
                if placement[u] != placement[v])
    return words + sum(w for u, x, w in table.weight_reads if placement[u] != placement[x])


class _State:
    """Loads, channel holds and words of a placement, kept up to date under moves of whole items."""

    def __init__(self, table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
                 members: Sequence[Sequence[int]]) -> None:
        self.table, self.ic, self.n = table, interconnect, num_procs
        self.place = list(placement)
        self.members = members
        self.item_of = [0] * len(table)
        for i, tasks in enumerate(members):
            for v in tasks:
                self.item_of[v] = i
        self.item_cost = [sum(table.cost[v] for v in tasks) for tasks in members]
        self.load = [0] * num_procs
        for v, p in enumerate(self.place):
            self.load[p] += table.cost[v]
        # Every data edge once: (producer, consumer, words, hold).
        self.edges: list[tuple[int, int, int, int]] = []
        for v, ps in enumerate(table.preds):
            for u, w in zip(ps, table.pred_words[v], strict=True):
                self.edges.append((u, v, w, interconnect.hold(w)))
        for u, x, w in table.weight_reads:
            self.edges.append((u, x, w, interconnect.hold(w)))
        self.item_edges: list[list[int]] = [[] for _ in members]
        for k, (u, v, _, _) in enumerate(self.edges):
            iu, iv = self.item_of[u], self.item_of[v]
            if iu != iv:
                self.item_edges[iu].append(k)
                self.item_edges[iv].append(k)
        self.chan: dict[int, int] = {}
        self.words = 0
        for u, v, w, h in self.edges:
            if self.place[u] != self.place[v]:
                self.words += w
                if h:
                    c = interconnect.channel(self.place[u], self.place[v], num_procs)
                    self.chan[c] = self.chan.get(c, 0) + h
        self._histogram()

    def _histogram(self) -> None:
        """How many resources (processors and channels) carry each load, and those loads, largest first:
        what a move's effect on (period, resources at the period) is read from without a full scan."""
        self.hist: dict[int, int] = {}
        for x in (*self.load, *self.chan.values()):
            self.hist[x] = self.hist.get(x, 0) + 1
        self.levels = sorted(self.hist, reverse=True)

    def channel(self, p: int, q: int) -> int:
        return self.ic.channel(p, q, self.n)

    def key(self) -> tuple[int, int, int]:
        top = self.levels[0]
        return top, self.hist[top], self.words

    def delta(self, item: int, dst: int) -> tuple[dict[int, int], int]:
        """Channel hold changes and the change in words if `item` moved to `dst`."""
        src = self.place[self.members[item][0]]
        changes: dict[int, int] = {}
        dw = 0
        shared = self.ic.is_shared
        for k in self.item_edges[item]:
            u, v, w, h = self.edges[k]
            mine_is_u = self.item_of[u] == item
            other = self.place[v] if mine_is_u else self.place[u]
            before = (src, other) if mine_is_u else (other, src)
            after = (dst, other) if mine_is_u else (other, dst)
            if before[0] != before[1]:
                dw -= w
                if h and not shared:
                    c = self.channel(*before)
                    changes[c] = changes.get(c, 0) - h
            if after[0] != after[1]:
                dw += w
                if h and not shared:
                    c = self.channel(*after)
                    changes[c] = changes.get(c, 0) + h
        return changes, dw

    def key_after(self, item: int, dst: int) -> tuple[int, int, int]:
        src = self.place[self.members[item][0]]
        c = self.item_cost[item]
        changes, dw = self.delta(item, dst)
        # The resources the move touches, old value → new value; every other resource keeps its load.
        touched = [(self.load[src], self.load[src] - c), (self.load[dst], self.load[dst] + c)]
        touched += [(self.chan.get(ch, 0), self.chan.get(ch, 0) + d) for ch, d in changes.items() if d]
        adjust: dict[int, int] = {}
        for old, new in touched:
            if old:
                adjust[old] = adjust.get(old, 0) - 1
            if new:
                adjust[new] = adjust.get(new, 0) + 1
        top = max((v for v, d in adjust.items() if d > 0), default=0)
        for level in self.levels:  # the largest load still held after the move
            if level <= top:
                break
            if self.hist[level] + adjust.get(level, 0) > 0:
                top = level
                break
        at_top = self.hist.get(top, 0) + adjust.get(top, 0)
        return top, at_top, self.words + dw

    def move(self, item: int, dst: int) -> None:
        src = self.place[self.members[item][0]]
        changes, dw = self.delta(item, dst)
        for ch, d in changes.items():
            value = self.chan.get(ch, 0) + d
            if value:
                self.chan[ch] = value
            else:
                self.chan.pop(ch, None)
        self.words += dw
        self.load[src] -= self.item_cost[item]
        self.load[dst] += self.item_cost[item]
        for v in self.members[item]:
            self.place[v] = dst
        self._histogram()

    def candidate_moves(self) -> list[tuple[int, int]]:
        """(item, destination) pairs that touch a bottleneck resource."""
        top, _, _ = self.key()
        moves: set[tuple[int, int]] = set()
        # Off a busiest processor: to one of the least loaded processors, or to where the item's data goes.
        light = sorted(range(self.n), key=lambda q: (self.load[q], q))[:LIGHT_TARGETS]
        for p, x in enumerate(self.load):
            if x == top:
                items = {self.item_of[v] for v, q in enumerate(self.place) if q == p}
                for i in items:
                    near = {self.place[v] for k in self.item_edges[i] for v in self.edges[k][:2]}
                    moves |= {(i, q) for q in (*light, *near) if q != p}
        hot = {ch for ch, x in self.chan.items() if x == top}
        if hot:
            for u, v, _, h in self.edges:
                pu, pv = self.place[u], self.place[v]
                if h and pu != pv and self.channel(pu, pv) in hot:
                    moves.add((self.item_of[u], pv))
                    moves.add((self.item_of[v], pu))
        return sorted(moves)


def improve(table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
            members: Sequence[Sequence[int]], max_words: float | None = None) -> list[int]:
    """A placement no single move of an item off a bottleneck improves, by (period, resources at the period,
    words per iteration), never exceeding `max_words` words per iteration when given."""
    state = _State(table, placement, num_procs, interconnect, members)
    for _ in range(MAX_MOVES):
        current = state.key()
        best: tuple[tuple[int, int, int], int, int] | None = None
        for item, dst in state.candidate_moves():
            after = state.key_after(item, dst)
            if max_words is not None and after[2] > max_words and after[2] > current[2]:
                continue
            if after < current and (best is None or (after, item, dst) < best):
                best = (after, item, dst)
        if best is None:
            break
        state.move(best[1], best[2])
    return state.place

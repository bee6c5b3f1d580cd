"""A floor under the staleness of any timing of given start offsets: proof that a bounded-search probe fails
before its transfers are planned (design notes §5).

LayerPipe's bounded search (`_layerpipe._bounded`) probes periods: at each it list-schedules a placement and
its starts, then plans the transfers on the interconnect (`_comm_timing.timed`: channel packing and lags) to
learn the staleness, and the probe fails when some layer's exceeds the bound k. On resnet18 at N = 6 and 8
under k = 4 every probe below the serial fallback fails, and the planning is most of each probe's cost.

The floor needs no packing. Whatever the channels do, a transfer arrives no earlier than its producer's end
plus its hold and the latency (`_comm.pack`: a transfer departs at or after its release), so the lags `timed`
returns satisfy, on every precedence edge u→v, lag_v − lag_u ≥ ⌈(start_u + c_u + x_uv − start_v)/P⌉ with x_uv
that uncontended transfer time when u and v are on different processors (0 on `shared`, and 0 for the listed
lags of a list schedule, which hold without transfers). Along every path from F_l to U_l those bounds add up,
so lag_U − lag_F is at least the longest such path, and the span from F_l to U_l's weights being readable
(`_lags.loop_spans`: readable no earlier than U_l's end) gives a staleness at least the one that span gives.
A layer whose floor is above k proves the probe fails; the timing it would have computed is never needed.

Only a couple of layers are tried per probe (the one that proved the last failure, then the longest loop):
each costs one sweep over the loop's edges, a fraction of a timing, and a probe that succeeds pays for them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from layerpipe.interconnect import Interconnect
from layerpipe.schedule._lags import loop_lengths, staleness_from_span
from layerpipe.schedule._task_table import TaskTable

#: Layers tried per probe: the last layer that proved a failure, then the longest loops.
TRIES = 2

_UNREACHED = -(1 << 62)


class StalenessFloor:
    """The floor for one table on one interconnect, over the placements and starts of one search."""

    def __init__(self, table: TaskTable, interconnect: Interconnect) -> None:
        self.table = table
        self.usable = table.forward  # edges by head in topological (index) order: one sweep is a longest path
        src, dst = table.precedence
        self.src, self.dst, self.cost = src, dst, table.cost
        # Uncontended transfer time of each edge when its ends are apart (the least over edges of one pair)
        least: dict[tuple[int, int], int] = {}
        if not interconnect.is_shared:
            for v, ps in enumerate(table.preds):
                for u, w in zip(ps, table.pred_words[v], strict=True):
                    x = interconnect.transfer_cycles(w)
                    least[(u, v)] = min(least.get((u, v), x), x)
        self.transfer = [least.get((u, v), 0) for u, v in zip(src, dst, strict=True)]
        lengths = loop_lengths(table)
        # The longest loops first: their F runs earliest and reads the stalest weights
        self.loops = sorted(table.weight_loops(), key=lambda loop: (-lengths.get(loop[0], 0), loop[0]))
        self.last: tuple[int, int, int] | None = None

    def layer_floor(self, loop: tuple[int, int, int], placement: Sequence[int], start: Sequence[int],
                    period: int) -> int:
        """The least staleness layer `loop` = (layer, F task, U task) can have under any lags these starts and
        the placement's transfers allow."""
        _, f, u = loop
        src, dst, cost, transfer = self.src, self.dst, self.cost, self.transfer
        reach = [_UNREACHED] * len(cost)
        reach[f] = 0
        # A path from f holds tasks above f (edges run forward); only edges into f+1..u can end on one to u
        for e in range(bisect_right(dst, f), bisect_right(dst, u)):
            a = src[e]
            lag_a = reach[a]
            if lag_a == _UNREACHED:
                continue
            b = dst[e]
            ready = start[a] + cost[a] + (transfer[e] if placement[a] != placement[b] else 0)
            need = lag_a - ((start[b] - ready) // period)
            if need > reach[b]:
                reach[b] = need
        if reach[u] == _UNREACHED:
            return 0
        return staleness_from_span(reach[u] * period + start[u] + cost[u] - start[f], period)

    def above(self, placement: Sequence[int], start: Sequence[int], period: int, bound: int) -> bool:
        """Whether some layer's floor (of the few tried) is above `bound`: every timing of these starts on this
        placement then has a staleness above it."""
        if not self.usable or period <= 0:
            return False
        tried = [self.last] if self.last is not None else []
        tried += [loop for loop in self.loops[:TRIES] if loop not in tried]
        for loop in tried[:TRIES]:
            if self.layer_floor(loop, placement, start, period) > bound:
                self.last = loop
                return True
        return False

"""One round of `_placement.improve`'s local search scored on arrays: the first move of least key.

`improve` tries every candidate move of a round (an item off a bottleneck to another processor) and keeps the
first one of least key (period, resources at the period, words), if below the placement's own key. One at a
time (`_State.key_after`) each trial costs a few microseconds of Python; resnet50 at N = 16 offers hundreds
of moves a round over thousands of rounds (~45 % of the CPU of `layerpipe` on resnet50, N = 2..16,
`links:2:1`). Here a round's moves are scored together: the channel changes of each move (`_State.delta`,
memoised) are flattened once and the keys computed with numpy, which pays from a few dozen moves on
(`BATCH_MOVES`); below that the one-at-a-time loop runs. Both pick the same move (tests/test_move_scores.py):
a trial the loop cuts short (a resource above the best period so far) has a key above that best, so it is
never the least.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from layerpipe.schedule._placement import _State

#: Moves in a round from which they are scored on arrays (numpy's fixed cost per round, ~20 array calls, is
#: about what the one-at-a-time loop spends on this many moves).
BATCH_MOVES = 48

#: Largest magnitude of a load, hold or word count scored on int64 arrays (far beyond any table; above it the
#: one-at-a-time loop, on Python ints, scores the round).
_INT64_SAFE = 1 << 60

Key = tuple[int, int, int]


def best_move(state: _State, moves: Sequence[tuple[int, int]], current: Key,
              max_words: float | None) -> tuple[int, int] | None:
    """The first of `moves` (in order) of least key below `current`, skipping moves that take the words past
    `max_words` and above `current`'s; None when none is below."""
    if len(moves) >= BATCH_MOVES:
        try:
            return _scored(state, moves, current, max_words)
        except OverflowError:  # a figure past int64's safe range: Python ints, one at a time
            pass
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
    """`best_move` on arrays; OverflowError when a figure is too large for int64 (`best_move` then scores one
    at a time)."""
    if not moves:
        return None
    flat, memo, delta = state.flat, state.memo, state.delta
    count = len(moves)
    dws = [0] * count
    # Every move's channel changes, flattened: per entry its channel and change; `sizes` entries per move
    entry_chan: list[int] = []
    entry_change: list[int] = []
    sizes = [0] * count
    for k, (item, dst) in enumerate(moves):
        found = flat[item].get(dst)
        if found is None:
            known = memo[item].get(dst)
            changes, dw = known if known is not None else delta(item, dst)
            found = flat[item][dst] = (tuple(ch for ch, _ in changes), tuple(d for _, d in changes), dw)
        channels, change, dws[k] = found
        entry_chan += channels
        entry_change += change
        sizes[k] = len(channels)
    levels, hist = state.levels, state.hist
    if levels and (levels[0] >= _INT64_SAFE or abs(state.words) >= _INT64_SAFE
                   or max(dws) >= _INT64_SAFE or min(dws) <= -_INT64_SAFE):
        raise OverflowError("move figures beyond int64")
    pairs = np.fromiter(chain.from_iterable(moves), dtype=np.int64, count=2 * count).reshape(count, 2)
    moved, target = pairs[:, 0], pairs[:, 1]
    load = np.array(state.load, dtype=np.int64)
    cost = np.array(state.item_cost, dtype=np.int64)[moved]
    old_src = load[np.array(state.item_place, dtype=np.int64)[moved]]
    old_dst = load[target]
    new_src, new_dst = old_src - cost, old_dst + cost
    holds = np.zeros(1 if state.bus else state.n * state.n, dtype=np.int64)  # channel → its hold now
    for ch, x in state.chan.items():
        holds[ch] = x
    em = np.repeat(np.arange(count, dtype=np.int64), sizes)
    eo = holds[np.array(entry_chan, dtype=np.int64)]
    en = eo + np.array(entry_change, dtype=np.int64)
    # The highest resource the move touches, after it.
    high = np.maximum(new_src, new_dst)
    if len(em):
        np.maximum.at(high, em, en)

    def touched_at(values_src: np.ndarray, values_dst: np.ndarray, values_chan: np.ndarray,
                   level: np.ndarray | int) -> np.ndarray:
        """Per move, how many of its touched resources hold `level` (one per move, or one for all)."""
        out = (values_src == level).astype(np.int64) + (values_dst == level)
        if len(em):
            at = level[em] if isinstance(level, np.ndarray) else level
            out += np.bincount(em, weights=(values_chan == at), minlength=count).astype(np.int64)
        return out

    # `key_after`'s top: the first level above `high` that some untouched resource still holds, else `high`.
    top = high.copy()
    open_ = np.ones(count, dtype=bool)
    for level in levels:
        open_ &= high < level
        if not open_.any():
            break
        held = open_ & (hist[level] > touched_at(old_src, old_dst, eo, level))
        top[held] = level
        open_ &= ~held
    ascending = np.array(levels[::-1], dtype=np.int64)
    counts = np.array([hist[x] for x in levels[::-1]], dtype=np.int64)
    where = np.minimum(np.searchsorted(ascending, top), len(ascending) - 1)
    hist_top = np.where(ascending[where] == top, counts[where], 0)
    at_top = hist_top - touched_at(old_src, old_dst, eo, top) + touched_at(new_src, new_dst, en, top)
    # Nothing loaded at all: every resource holds 0, counted as before the move (`key_after`).
    at_top = np.where(top == 0, hist.get(0, 0), at_top)
    words = state.words + np.array(dws, dtype=np.int64)
    top0, at0, words0 = current
    below = (top < top0) | ((top == top0) & ((at_top < at0) | ((at_top == at0) & (words < words0))))
    if max_words is not None:
        below &= ~((words > max_words) & (words > words0))
    pick = np.flatnonzero(below)
    if not len(pick):
        return None
    for figure in (top, at_top, words):  # least key, lexicographically; the first move among equals
        values = figure[pick]
        pick = pick[values == values.min()]
    return moves[int(pick[0])]

"""`_validate._disjoint_arcs`, the n log n check `validate_periodic` runs before searching a body's slot pairs
for the first overlap, agrees with the pairs themselves on random bodies (overlapping or not, wrapping past
the period or not)."""

from __future__ import annotations

import random

from layerpipe.schedule._periodic import make_slot
from layerpipe.schedule._validate import _disjoint_arcs


def _pairs_disjoint(slots, cost, period) -> bool:
    for i, a in enumerate(slots):
        for b in slots[i + 1 :]:
            ca, cb = cost[(a.kind, a.layer)], cost[(b.kind, b.layer)]
            if (b.start - a.start) % period < ca or (a.start - b.start) % period < cb:
                return False
    return True


def test_disjoint_arcs_agrees_with_the_pairs() -> None:
    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for _ in range(20000):
        period = rng.randint(1, 40)
        count = rng.randint(0, 6)
        costs = [rng.randint(1, max(1, period // max(1, count))) for _ in range(count)]
        if sum(costs) > period:  # validate_periodic fails such a body before the pairs
            continue
        if rng.random() < 0.5:  # packed without overlap, then maybe one start nudged
            at, starts = rng.randint(0, 3 * period), []
            for c in costs:
                at += rng.randint(0, 2)
                starts.append(at)
                at += c
            if starts and at - starts[0] > period:
                continue
            if starts and rng.random() < 0.3:
                starts[rng.randrange(len(starts))] += rng.choice((-1, 1))
        else:
            starts = [rng.randint(0, 2 * period) for _ in costs]
        slots = [make_slot(max(0, s), "F", layer, 0) for layer, s in enumerate(starts)]
        rng.shuffle(slots)
        cost = {("F", layer): c for layer, c in enumerate(costs)}
        expected = _pairs_disjoint(slots, cost, period)
        assert _disjoint_arcs(slots, cost, period) == expected, (period, starts, costs)
        seen[expected] += 1
    assert seen[True] > 1000 and seen[False] > 1000

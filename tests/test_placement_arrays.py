"""`_placement_arrays`: `improve`'s rounds on dense arrays give what the straightforward rounds give — the same
candidate moves in the same order (`_State.candidate_moves`), the same pick (`one_at_a_time`, trial by trial with
`_State.key_after`), and arrays that stay equal to those rebuilt from the placement after every move — on
generated networks, processor counts, interconnects and start placements, with and without a words bound; and
the histogram of loads and holds `_State.move` keeps equal to the one recounted."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from layerpipe.costs import PEModel
from layerpipe.dfg import GraphOptions
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule._layerpipe import group_items, weight_groups
from layerpipe.schedule._placement import LIGHT_TARGETS, _improve, _items, _State, one_at_a_time
from layerpipe.schedule._placement_arrays import Dense, candidate_arrays, scored_arrays
from layerpipe.schedule._task_table import table_of
from tests.schedule_reference import FAST, SPECS, improve_case, random_placement, task_table
from tests.strategies import networks


def _reference_improve(table, state: _State, max_words: float | None, check_arrays: bool) -> int:
    """Runs the search the straightforward way, checking every round's array figures against it; the rounds."""
    rounds = 0
    while True:
        moves = state.candidate_moves()
        items, dsts = candidate_arrays(state, state.arrays(), LIGHT_TARGETS)
        assert list(zip(items.tolist(), dsts.tolist(), strict=True)) == moves
        expected = one_at_a_time(state, moves, state.key(), max_words)
        k = scored_arrays(state, state.arrays(), items, dsts, state.key(), max_words)
        assert (None if k < 0 else moves[k]) == expected, rounds
        if check_arrays:
            fresh = Dense(state, _items(table, state.ic, state.members).pairs)
            for name in ("load", "cost", "item_place", "chan", "sums"):
                assert np.array_equal(getattr(state.arrays(), name), getattr(fresh, name)), (name, rounds)
            hist, levels = dict(state.hist), list(state.levels)  # kept under moves: as recounted
            state._histogram()
            assert (state.hist, state.levels) == (hist, levels), rounds
        if expected is None:
            return rounds
        state.move(*expected)
        rounds += 1


@FAST
@given(net=networks(max_layers=7, dag=True, max_width=12, max_batch=3), n=st.integers(2, 7),
       spec=st.sampled_from(SPECS), overhead=st.integers(0, 3), together=st.booleans(), seed=st.integers(0, 2**16),
       bounded=st.booleans())
def test_array_rounds_equal_the_reference_rounds(net, n, spec, overhead, together, seed, bounded) -> None:
    table, ic, members, placement, max_words = improve_case(net, n, spec, overhead, together, seed, bounded)
    state = _State(table, placement, n, ic, members)
    _reference_improve(table, state, max_words, check_arrays=True)
    assert _improve(table, placement, n, ic, members, max_words) == state.place


def test_array_rounds_on_zoo_networks() -> None:
    """Large rounds (hundreds of moves, several busiest resources, hot channels from random starts)."""
    model = PEModel()
    for network, n, spec in (("resnet18", 8, "links:2:1"), ("alexnet", 5, "bus:2:16"), ("resnet18", 16, "rtl"),
                             ("lenet5", 3, "links:1:1/8")):
        table = table_of(load_network(network), GraphOptions(), model)
        ic = parse_interconnect(spec, lanes=model.lanes)
        for seed, together in ((0, False), (1, True)):
            _, members = group_items(table, weight_groups(table, together))
            placement = random_placement(len(table), members, n, random.Random(seed))
            state = _State(table, placement, n, ic, members)
            assert _reference_improve(table, state, None, check_arrays=seed == 0) > 0
            assert _improve(table, placement, n, ic, members, None) == state.place


def test_figures_past_the_array_bound_run_on_python_ints() -> None:
    """Costs and words scaled past `INT64_SAFE`: no arrays are kept and the search is the reference's, scaled."""
    from dataclasses import replace

    from layerpipe.schedule._placement_arrays import INT64_SAFE
    from tests.schedule_reference import reference_improve

    table = task_table(load_network("lenet5"), 2)
    huge = replace(table, cost=tuple(c * INT64_SAFE for c in table.cost),
                   pred_words=tuple(tuple(w * INT64_SAFE for w in ws) for ws in table.pred_words),
                   weight_reads=tuple((u, x, w * INT64_SAFE) for u, x, w in table.weight_reads))
    ic = parse_interconnect("links:2:1", lanes=4)
    _, members = group_items(huge, range(len(huge)))
    placement = [v % 6 for v in range(len(huge))]
    assert not _items(huge, ic, members).fits_int64
    found = _improve(huge, placement, 6, ic, members, None)
    assert found == reference_improve(huge, placement, 6, ic, members, None)
    assert found != placement

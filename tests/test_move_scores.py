"""`_placement.best_move`: a round of `improve`'s candidate moves scored on arrays picks the move the one-at-a-time loop
picks — the first of least key below the placement's own, under a words bound or not — on every round of
searches from random placements of zoo networks on every kind of interconnect."""

from __future__ import annotations

import random

import pytest

from layerpipe.costs import PEModel
from layerpipe.dfg import GraphOptions
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule._layerpipe import group_items, weight_groups
from layerpipe.schedule._placement import _scored, _State, best_move, improve, one_at_a_time
from layerpipe.schedule._task_table import table_of
from tests.schedule_reference import random_placement


def _searches(network: str, spec: str, num_procs: int, seed: int, together: bool):
    """Every round of a search from a random placement: (state, moves, key, words bound), the state as the
    round sees it (the search moves on after the round is checked)."""
    model = PEModel()
    table = table_of(load_network(network), GraphOptions(), model)
    ic = parse_interconnect(spec, lanes=model.lanes)
    _, members = group_items(table, weight_groups(table, True) if together else range(len(table)))
    rng = random.Random(seed)
    placement = random_placement(len(table), members, num_procs, rng)
    state = _State(table, placement, num_procs, ic, members)
    bound = None if seed % 2 else state.words * rng.choice((0.5, 0.9, 1.0))
    for _ in range(400):
        moves = state.candidate_moves()
        yield state, moves, state.key(), bound
        best = one_at_a_time(state, moves, state.key(), bound)
        if best is None:
            return
        state.move(*best)


@pytest.mark.parametrize("spec", ["links:2:1", "rtl", "bus:2:16", "shared", "links:1:1/8"])
@pytest.mark.parametrize(("network", "num_procs"), [("lenet5", 4), ("alexnet", 8), ("resnet18", 6),
                                                    ("mlp:16-12-8-4", 3)])
def test_array_scores_pick_the_loops_move(network: str, num_procs: int, spec: str) -> None:
    rounds = 0
    for seed in range(4):
        for state, moves, key, bound in _searches(network, spec, num_procs, seed, together=seed >= 2):
            expected = one_at_a_time(state, moves, key, bound)
            assert _scored(state, moves, key, bound) == expected, (network, spec, seed, rounds)
            assert best_move(state, moves, key, bound) == expected
            rounds += 1
    assert rounds


def test_improve_unchanged_through_the_array_path() -> None:
    """A large search (resnet18 on 8 processors offers rounds of more than `BATCH_MOVES` moves) ends where the
    loop alone ends (`_improve` finds and scores its rounds on arrays)."""
    model = PEModel()
    table = table_of(load_network("resnet18"), GraphOptions(), model)
    ic = parse_interconnect("links:2:1", lanes=model.lanes)
    _, members = group_items(table, range(len(table)))
    start = [v % 8 for v in range(len(table))]
    from layerpipe._memo import clear_memos

    clear_memos()
    batched = improve(table, start, 8, ic, members)
    state = _State(table, start, 8, ic, members)
    while (best := one_at_a_time(state, state.candidate_moves(), state.key(), None)) is not None:
        state.move(*best)
    assert batched == state.place

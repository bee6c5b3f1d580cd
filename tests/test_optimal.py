"""The `optimal` policy proves minimum periods, and the `layerpipe` heuristic is measured against it."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import make_schedule, validate
from layerpipe.schedule._optimal import OptimalOptions, optimal_assignment
from tests.strategies import networks

MODEL = make_cost_model("pe", lanes=4, overhead=2)


def brute_force_makespan(costs: list[int], procs: int) -> int:
    return min(max(sum(c for c, p in zip(costs, assign, strict=True) if p == q) for q in range(procs))
               for assign in itertools.product(range(procs), repeat=len(costs)))


@settings(max_examples=30, deadline=None)
@given(costs=st.lists(st.integers(1, 60), min_size=1, max_size=7), procs=st.integers(1, 3))
def test_milp_matches_brute_force(costs: list[int], procs: int) -> None:
    proc, period, proven = optimal_assignment(costs, procs, time_limit_s=30)
    assert proven
    assert period == brute_force_makespan(costs, procs)
    loads = [sum(c for c, p in zip(costs, proc, strict=True) if p == q) for q in range(procs)]
    assert max(loads) == period


@pytest.mark.parametrize("spec", ["mlp:7-6-5-3", "mlp:784-256-128-10", "lenet5"])
@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_optimal_proves_its_period_and_bounds_the_heuristic(spec: str, n: int) -> None:
    net = load_network(spec)
    best = make_schedule("optimal", net, n, MODEL)
    validate(best.periodic, best.graph)
    assert best.notes[0].startswith("optimal:"), best.notes
    assert "one iteration per period" in best.notes[0]  # what it proves, and that unfolding is outside it
    heuristic = make_schedule("layerpipe", net, n, MODEL)
    # optimal covers J = 1 only: a layerpipe schedule that unfolds (or splits a layer, a different graph) may
    # beat it, never its own bound with unfolding
    assert heuristic.metrics.lower_bound_unfolded_cycles <= heuristic.metrics.cycles_per_sample
    plain = heuristic.periodic is not None and heuristic.periodic.unfold == 1 and heuristic.graph == best.graph
    if plain:
        assert best.metrics.lower_bound_cycles <= best.metrics.cycles_per_sample <= heuristic.metrics.cycles_per_sample
    # the heuristic is close to the proven optimum on these graphs (or better, where it leaves J = 1)
    assert heuristic.metrics.cycles_per_sample <= 1.05 * best.metrics.cycles_per_sample


@settings(max_examples=25, deadline=None)
@given(net=networks(max_layers=4), n=st.integers(1, 4))
def test_heuristic_never_beats_the_optimum(net, n: int) -> None:
    best = make_schedule("optimal", net, n, MODEL, OptimalOptions(time_limit_s=30))
    assert best.notes[0].startswith("optimal:")
    assert make_schedule("layerpipe", net, n, MODEL).metrics.period_cycles >= best.metrics.period_cycles


def test_optimal_keeps_weight_tasks_together_when_asked() -> None:
    net = load_network("mlp:7-6-5-3")
    result = make_schedule("optimal", net, 3, MODEL, OptimalOptions(keep_weights_together=True))
    where = result.periodic.placement()  # type: ignore[union-attr]
    for layer in net.layers:
        procs = {where[(kind, layer.index)] for kind in ("F", "E", "G", "U") if (kind, layer.index) in where}
        assert len(procs) == 1
    free = make_schedule("optimal", net, 3, MODEL)
    assert result.metrics.period_cycles >= free.metrics.period_cycles


def test_optimal_refuses_large_graphs() -> None:
    with pytest.raises(InputError, match="use --policy layerpipe"):
        make_schedule("optimal", load_network("alexnet"), 2, MODEL)

"""LayerPipe's search bounded by PipeDream's replicated plan (issue 14): where that plan's period per iteration is
below the lower bound on any single-iteration placement's period (`period_lower_bound` of the tasks on N
processors), `_schedule_network` returns it without building or timing the single-iteration space. The bound
must make no difference: on generated networks, processor counts, cost models, interconnects and staleness
bounds, the result is the one of the whole search (the prune switched off, memos cleared), field for field.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerpipe._memo import clear_memos
from layerpipe.costs import PEModel, make_cost_model
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import ScheduleResult, _layerpipe, make_schedule
from layerpipe.schedule._layerpipe import LayerPipeOptions
from tests.strategies import networks

SPECS = ("shared", "rtl", "links:1:4", "links:2:1/4", "links:1:1/16", "bus:1:2", "bus:2:8")


def _what(result: ScheduleResult) -> tuple[object, ...]:
    return result.metrics, result.periodic, result.notes, result.num_procs


def _both(monkeypatch: pytest.MonkeyPatch, net, n: int, model, options: LayerPipeOptions, spec: str,
          lanes: int) -> tuple[ScheduleResult, ScheduleResult, bool]:
    """(bounded search, whole search, whether the bound cut the search), each from empty memos."""
    ic = parse_interconnect(spec, lanes=lanes)
    fired = []
    real = _layerpipe._replicated_beats_every_placement

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        fired.append(found is not None)
        return found

    clear_memos()
    with monkeypatch.context() as m:
        m.setattr(_layerpipe, "_replicated_beats_every_placement", spy)
        bounded = make_schedule("layerpipe", net, n, model, options, ic)
    clear_memos()
    with monkeypatch.context() as m:
        m.setattr(_layerpipe, "_replicated_beats_every_placement", lambda *a, **k: None)
        whole = make_schedule("layerpipe", net, n, model, options, ic)
    clear_memos()
    return bounded, whole, any(fired)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(net=networks(max_layers=6, dag=True, max_width=20), n=st.integers(2, 9), spec=st.sampled_from(SPECS),
       lanes=st.sampled_from((1, 4, 16)), overhead=st.sampled_from((0, 2, 11)),
       k=st.sampled_from((None, 0, 1, 2, 4)))
def test_the_bound_returns_what_the_whole_search_returns(monkeypatch, net, n, spec, lanes, overhead, k) -> None:
    options = LayerPipeOptions(max_staleness=k)
    bounded, whole, _ = _both(monkeypatch, net, n, PEModel(lanes=lanes, overhead=overhead), options, spec, lanes)
    assert _what(bounded) == _what(whole)


@pytest.mark.parametrize("k", [None, 1, 4])
@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
def test_on_rtl_the_data_parallel_plan_cuts_the_search_and_changes_nothing(monkeypatch, n: int, k: int | None
                                                                           ) -> None:
    """issue 14's sweep (64 lanes): on `rtl` PipeDream's data-parallel plan beats every single-iteration placement
    of lenet5 (its period per iteration is Σc / N, the bound is ⌈Σc / N⌉ or a heavier layer's task), so the bound
    cuts the search — with and without a staleness bound — and the result is the whole search's."""
    net = load_network("lenet5")
    bounded, whole, fired = _both(monkeypatch, net, n, make_cost_model("pe", lanes=64), LayerPipeOptions(
        max_staleness=k), "rtl", 64)
    assert _what(bounded) == _what(whole)
    assert fired == (n != 3)  # at N = 3, Σc / 3 is an integer: the plan ties the bound and the search runs
    assert bounded.periodic is not None and bounded.periodic.unfold == n

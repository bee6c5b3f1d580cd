"""LayerPipe's ranked search space is memoised (`_layerpipe.ranked_space`: a sweep schedules the policy with and
without a staleness bound at each network × N, both from the same space). The memo must be pure: on generated
networks, processor counts, interconnects, weight grouping and traffic bounds, a call that hits the memo returns
what `_ranked(search_space(...))` computes from scratch, a caller changing the lists it got does not change what
the next caller gets, and whole layerpipe schedules made after another policy variant filled the memo are the
ones made from empty memos."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe._memo import clear_memos
from layerpipe.costs import make_cost_model
from layerpipe.dfg import GraphOptions
from layerpipe.interconnect import parse_interconnect
from layerpipe.schedule import make_schedule
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._layerpipe import LayerPipeOptions, _ranked, ranked_space, search_space
from layerpipe.schedule._task_table import table_of
from tests.strategies import networks

INTERCONNECTS = ("shared", "links:2:16", "links:1:1/4", "bus:1:2")


ARGS = st.tuples(st.integers(1, 4), st.sampled_from(INTERCONNECTS), st.booleans(),
                 st.sampled_from((None, 0.0, 3.0, 40.0)))


def _fresh(network, args: tuple[int, str, bool, float | None]) -> list:
    num_procs, spec, together, max_words = args
    table = table_of(network, GraphOptions(), make_cost_model("pe", lanes=1))
    interconnect = parse_interconnect(spec, lanes=1)
    options = LayerPipeOptions(keep_weights_together=together)
    return _ranked(table, num_procs, search_space(table, num_procs, asap_times(table), options, interconnect,
                                                  max_words), interconnect, max_words)


def _memoised(network, args: tuple[int, str, bool, float | None], bound: int | None = None) -> list:
    num_procs, spec, together, max_words = args
    table = table_of(network, GraphOptions(), make_cost_model("pe", lanes=1))  # an equal table, rebuilt or not
    return ranked_space(table, num_procs, asap_times(table),
                        LayerPipeOptions(keep_weights_together=together, max_staleness=bound),
                        parse_interconnect(spec, lanes=1), max_words)


@settings(max_examples=40, deadline=None)
@given(networks(max_layers=5), ARGS, st.integers(0, 3), ARGS)
def test_memoised_space_is_the_computed_one(network, args, changed: int, drawn) -> None:
    other = tuple(drawn[k] if k == changed else a for k, a in enumerate(args))  # one argument redrawn
    fresh = _fresh(network, args)
    clear_memos()
    first = _memoised(network, args)  # fills the memo
    assert first == fresh
    for group in first:  # a caller editing its lists
        for placement, _ in group:
            placement.reverse()
        group.clear()
    # A hit, through another option the space does not read (the staleness bound)
    assert _memoised(network, args, bound=2) == fresh
    # Other arguments after it: every one the space reads is in the key
    assert _memoised(network, other) == _fresh(network, other)


@settings(max_examples=15, deadline=None)
@given(networks(max_layers=5), st.integers(2, 4), st.sampled_from(INTERCONNECTS), st.sampled_from((None, 0, 1, 3)))
def test_schedules_after_a_filled_memo_are_cold_ones(network, num_procs: int, spec: str,
                                                     bound: int | None) -> None:
    model = make_cost_model("pe", lanes=1)
    interconnect = parse_interconnect(spec, lanes=1)
    options = LayerPipeOptions(max_staleness=bound)
    clear_memos()
    cold = make_schedule("layerpipe", network, num_procs, model, options, interconnect)
    clear_memos()
    make_schedule("layerpipe", network, num_procs, model, LayerPipeOptions(max_staleness=None if bound else 2),
                  interconnect)  # the sweep's other variant first: the space is then a hit
    warm = make_schedule("layerpipe", network, num_procs, model, options, interconnect)
    assert warm.periodic == cold.periodic
    assert warm.metrics == cold.metrics
    assert warm.notes == cold.notes

"""LayerPipe's placement space holds PipeDream's (design notes §11): on the same network, processor count, cost
model and interconnect, `layerpipe` is never slower than `pipedream` — replicated or straight, whichever plan
PipeDream's planner picks there.

The search held PipeDream's straight pipeline only as `pipedream --no-replication` cuts it (work balanced,
blind to the interconnect); the planner cuts stages by the words crossing them too, and where its best plan is a
straight pipeline LayerPipe could miss it: a residual network on 2 processors, links:2:1/4, planned 1 | 2-4 at 25
cycles per sample, where LayerPipe found 28 (`_layerpipe.planned_straight_pipelines` now adds those placements).
Ladder: the property over generated networks (chains and DAGs), processor counts, cost models and interconnects,
with replication and without; the pinned case.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from layerpipe.costs import PEModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Add, Linear, NetworkBuilder
from layerpipe.schedule import make_schedule, validate
from layerpipe.schedule._layerpipe import LayerPipeOptions
from layerpipe.schedule._pipedream import PipeDreamOptions
from tests.strategies import networks

SPECS = ("shared", "links:1:4", "links:2:1/4", "links:1:1/16", "bus:1:2", "bus:2:8", "rtl")


def _residual(width: int, *layers: tuple[str, int | str, str]):
    """A small network of bias-free ReLU layers: (name, out features, input) for a linear layer, (name, input,
    input) for an add."""
    builder = NetworkBuilder("random", (width,))
    for name, a, b in layers:
        if isinstance(a, int):
            builder.add(name, Linear(a, bias=False, activation="relu"), [b])
        else:
            builder.add(name, Add(activation="relu"), [a, b])
    return builder.build()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(net=networks(max_layers=7, dag=True, max_width=24), n=st.integers(2, 12), spec=st.sampled_from(SPECS),
       lanes=st.sampled_from((1, 4, 16)), overhead=st.sampled_from((0, 2, 11)), replication=st.booleans())
def test_layerpipe_is_never_slower_than_pipedream_on_generated_networks(net, n, spec, lanes, overhead,
                                                                        replication) -> None:
    model = PEModel(lanes=lanes, overhead=overhead)
    ic = parse_interconnect(spec, lanes=lanes)
    lp = make_schedule("layerpipe", net, n, model, LayerPipeOptions(replication=replication), ic).metrics
    pd = make_schedule("pipedream", net, n, model, PipeDreamOptions(replication=replication), ic).metrics
    assert lp.cycles_per_sample <= pd.cycles_per_sample


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(net=networks(max_layers=5, dag=True, max_width=16), n=st.integers(2, 4),
       spec=st.sampled_from(("links:2:1/4", "links:1:1/16", "bus:1:2", "links:1:4")),
       lanes=st.sampled_from((1, 4, 16)), overhead=st.sampled_from((0, 2, 11)))
def test_layerpipe_is_never_slower_than_pipedreams_straight_plans(net, n, spec, lanes, overhead) -> None:
    """Where the planner's best is a straight pipeline: few processors and costly words. 200 examples catch the
    missing placement under 4 of 6 random seeds (the broad property above needs ~1000)."""
    model = PEModel(lanes=lanes, overhead=overhead)
    ic = parse_interconnect(spec, lanes=lanes)
    lp = make_schedule("layerpipe", net, n, model, interconnect=ic).metrics
    pd = make_schedule("pipedream", net, n, model, interconnect=ic).metrics
    assert lp.cycles_per_sample <= pd.cycles_per_sample


def test_the_planners_straight_pipeline_is_in_layerpipes_space() -> None:
    net = _residual(7, ("b0.fc0", 1, "input"), ("b0.fc1", 7, "b0.fc0"), ("b0.add", "b0.fc1", "input"),
                    ("fc3", 1, "b0.add"))
    model, ic = PEModel(lanes=4, overhead=0), parse_interconnect("links:2:1/4", lanes=4)
    pd = make_schedule("pipedream", net, 2, model, interconnect=ic)
    assert pd.periodic.unfold == 1 and "stages 1x1 | 2-4x1" in pd.notes[0] and pd.metrics.cycles_per_sample == 25
    lp = make_schedule("layerpipe", net, 2, model, interconnect=ic)
    assert lp.metrics.cycles_per_sample <= 25  # 28 without the planner's placement


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(net=networks(max_layers=5, dag=True, max_width=16), n=st.integers(2, 4),
       spec=st.sampled_from(("links:2:1/4", "links:1:1/16", "bus:1:2", "links:1:4")),
       lanes=st.sampled_from((1, 4, 16)), overhead=st.sampled_from((0, 2, 11)), k=st.integers(0, 4))
def test_under_a_bound_pipedream_meets_layerpipe_is_never_slower(net, n, spec, lanes, overhead, k) -> None:
    """Where PipeDream's own schedule meets a staleness bound, LayerPipe under that bound is at least as fast."""
    model = PEModel(lanes=lanes, overhead=overhead)
    ic = parse_interconnect(spec, lanes=lanes)
    pd = make_schedule("pipedream", net, n, model, interconnect=ic).metrics
    assume(pd.max_staleness <= k)
    lp = make_schedule("layerpipe", net, n, model, LayerPipeOptions(max_staleness=k), ic).metrics
    assert lp.max_staleness <= k and lp.cycles_per_sample <= pd.cycles_per_sample


def test_pipedreams_own_orders_meet_a_bound_its_placement_meets() -> None:
    """Found by the property above (~1 case in 500 over random DAGs before it was focused): PipeDream's straight
    pipeline of mlp:1-1-9 on 2 processors (links:1:1/16, overhead 0) runs at 16 cycles per sample with
    staleness 3; LayerPipe unbounded found 16 at staleness 4 on the same placement, and under max staleness 3 its
    bounded search found only 18: it timed that placement with its own body orders, not PipeDream's 1F1B ones
    (`_layerpipe._pipedream_orders` now tries them)."""
    from layerpipe.network import mlp

    net, model = mlp([1, 1, 9]), PEModel(lanes=4, overhead=0)
    ic = parse_interconnect("links:1:1/16", lanes=4)
    pd = make_schedule("pipedream", net, 2, model, interconnect=ic).metrics
    assert (pd.cycles_per_sample, pd.max_staleness) == (16, 3)
    lp = make_schedule("layerpipe", net, 2, model, LayerPipeOptions(max_staleness=3), ic)
    assert lp.metrics.cycles_per_sample == 16 and lp.metrics.max_staleness <= 3
    validate(lp.periodic, lp.graph, max_staleness=3)


def test_under_a_bound_pipedreams_own_timing_is_carried_onto_layerpipes_tasks() -> None:
    """PipeDream's 1F1B orders re-timed on LayerPipe's split tasks send A;E;G's error as soon as E ends, ahead of
    a forward transfer PipeDream sends first on the bus, and came out staler (4 where PipeDream has 3): under a
    bound of 3 LayerPipe found 19 cycles per sample against PipeDream's 18. PipeDream's own timing carried onto
    the split tasks (`_layerpipe._carried`: the parts where the fused task ran, the error last) is 18 at 3."""
    net = _residual(3, ("fc0", 6, "input"), ("b1.fc0", 6, "fc0"), ("b1.add", "b1.fc0", "fc0"), ("fc3", 1, "b1.add"))
    model, ic = PEModel(lanes=16, overhead=0), parse_interconnect("bus:1:2", lanes=16)
    pd = make_schedule("pipedream", net, 3, model, interconnect=ic)
    assert (pd.metrics.cycles_per_sample, pd.metrics.max_staleness) == (18, 3)
    lp = make_schedule("layerpipe", net, 3, model, LayerPipeOptions(max_staleness=3), ic)
    assert lp.metrics.max_staleness <= 3 and lp.metrics.cycles_per_sample <= 18  # 19 before
    validate(lp.periodic, lp.graph, max_staleness=3)

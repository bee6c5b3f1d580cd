"""Communication is part of the schedule (issue 9): transfers are planned on the interconnect, the simulator
agrees with the plan, and LayerPipe's placement search — which contains PipeDream's own placement — is never
slower than PipeDream on the same interconnect and batch.

Ladder: the scheduler's period (a plan that packs every channel's transfers around the period in the
simulator's FIFO order) → the cycle-accurate simulator's steady state, self-timed, on the same interconnect.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.interconnect import Interconnect, parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import POLICIES, make_schedule, validate
from layerpipe.schedule._layerpipe import LayerPipeOptions
from layerpipe.schedule._pipedream import PipeDreamOptions
from layerpipe.sim import SimConfig, simulate_policy_result
from tests.strategies import networks

ZOO = ("mlp:784-256-128-10", "lenet5", "alexnet", "vgg16", "resnet18", "resnet50")
KINDS = ("shared", "links:2:16", "links:2:1/16", "bus:2:16", "rtl")
#: The periodic (asynchronous) policies that run on a whole zoo network (`optimal` has a size limit).
PERIODIC = tuple(name for name, p in POLICIES.items() if not p.synchronous and name != "optimal")


def steady_iterations(result) -> int:
    """A run long enough to be past the fill, in whole periods (J iterations each)."""
    deepest = max((s.lag for body in result.periodic.bodies for s in body), default=0)
    unfold = result.periodic.unfold
    return -(-max(64, (4 * deepest + 16) * unfold) // unfold) * unfold  # whole periods: whole update groups


def simulated_period(result, network, model, interconnect: Interconnect) -> float:
    """The self-timed steady state per iteration.

    No finite run shows it exactly: a processor may run ahead of its plan during the fill and give the slack
    back a cycle at a time for many periods, and the drain runs early. Both artefacts only make a run look
    *faster*, never slower, so the larger of two estimates is the closer one: the simulator's own slope over
    the middle half of a run of 2K iterations, and the extra cycles K more iterations take (same fill, same
    drain), ÷ K."""
    k = steady_iterations(result)
    config = SimConfig.of(interconnect)
    short = simulate_policy_result(result, network, model, k, config)
    long = simulate_policy_result(result, network, model, 2 * k, config)
    return max(long.cycles_per_iteration, (long.total_cycles - short.total_cycles) / k)


@pytest.mark.slow
@pytest.mark.parametrize("spec", KINDS)
@pytest.mark.parametrize("network", ZOO)
def test_simulated_period_equals_scheduled_period_on_every_interconnect(network, spec) -> None:
    net, model = load_network(network), PEModel()
    ic = parse_interconnect(spec, lanes=model.lanes)
    for policy in PERIODIC:
        for n in (2, 4, 8):
            result = make_schedule(policy, net, n, model, interconnect=ic)
            assert result.interconnect == ic
            # unfolded schedules run `unfold` iterations per period
            per_iteration = result.metrics.period_cycles / result.periodic.unfold
            assert simulated_period(result, net, model, ic) == pytest.approx(per_iteration, abs=1e-9), \
                (policy, n)


def test_simulated_period_equals_scheduled_period_small() -> None:
    """The fast tier's slice of the test above: two networks, every periodic policy, every kind."""
    model = PEModel(lanes=16, overhead=4)
    for network in ("mlp:64-48-32-16", "lenet5"):
        net = load_network(network)
        for spec in KINDS:
            ic = parse_interconnect(spec, lanes=model.lanes)
            for policy in PERIODIC:
                result = make_schedule(policy, net, 4, model, interconnect=ic)
                per_iteration = result.metrics.period_cycles / result.periodic.unfold
                assert simulated_period(result, net, model, ic) == pytest.approx(per_iteration), (network, spec,
                                                                                                  policy)


def _never_slower(network: str, batch: int, spec: str, procs) -> None:
    net, model = load_network(network, batch), PEModel()
    ic = parse_interconnect(spec, lanes=model.lanes)
    for n in procs:
        lp = make_schedule("layerpipe", net, n, model, interconnect=ic).metrics
        pd = make_schedule("pipedream", net, n, model, interconnect=ic).metrics
        assert lp.cycles_per_sample <= pd.cycles_per_sample, (network, batch, spec, n)
        # Bounded to PipeDream's own words per sample, PipeDream's placement is still in the space.
        bounded = make_schedule("layerpipe", net, n, model,
                                LayerPipeOptions(max_traffic=pd.traffic_words_per_sample), ic).metrics
        assert bounded.traffic_words_per_sample <= pd.traffic_words_per_sample
        assert bounded.cycles_per_sample <= pd.cycles_per_sample, (network, batch, spec, n, "max-traffic")


@pytest.mark.slow
@pytest.mark.parametrize("spec", ("shared", "rtl", "links:2:1"))
@pytest.mark.parametrize("batch", (1, 32))
@pytest.mark.parametrize("network", ZOO)
def test_layerpipe_is_never_slower_than_pipedream(network, batch, spec) -> None:
    _never_slower(network, batch, spec, range(2, 17))


def test_layerpipe_is_never_slower_than_pipedream_small() -> None:
    for network in ("mlp:784-256-128-10", "lenet5"):
        for spec in ("links:2:1", "links:2:1/16"):
            _never_slower(network, 1, spec, (2, 7, 9))


def test_layerpipe_moves_fewer_words_than_the_free_placement_on_slow_links() -> None:
    """The search sees the traffic: on a GPU-like compute:link ratio LayerPipe keeps weights where they are
    used instead of moving W and g every sample as its shared-memory placement does."""
    net, model = load_network("lenet5"), PEModel()
    free = make_schedule("layerpipe", net, 8, model).metrics
    slow = parse_interconnect("links:2:1/16")
    lp = make_schedule("layerpipe", net, 8, model, interconnect=slow).metrics
    pd = make_schedule("pipedream", net, 8, model, interconnect=slow).metrics
    straight = make_schedule("pipedream", net, 8, model, PipeDreamOptions(replication=False), slow).metrics
    assert lp.traffic_words_per_sample * 5 < free.traffic_words_per_sample
    assert lp.cycles_per_sample <= pd.cycles_per_sample < straight.cycles_per_sample
    # On free communication that placement would have been far faster than on the slow links.
    assert free.cycles_per_sample < lp.cycles_per_sample


def test_max_traffic_bounds_words_and_trades_cycles() -> None:
    net, model = load_network("lenet5"), PEModel()
    ic = parse_interconnect("links:2:1")
    serial = make_schedule("layerpipe", net, 1, model).metrics.cycles_per_sample
    for bound in (0, 5000, 12328, 20000):
        m = make_schedule("layerpipe", net, 8, model, LayerPipeOptions(max_traffic=bound), ic).metrics
        assert m.traffic_words_per_sample <= bound
        assert m.cycles_per_sample <= serial  # one processor moves nothing: always in the space
        if bound == 0:
            assert m.cycles_per_sample == serial


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(net=networks(max_layers=6, dag=True, max_width=12, max_batch=3), n=st.integers(1, 6),
       spec=st.sampled_from(("shared", "links:0:1", "links:3:2", "links:1:1/8", "bus:2:3", "bus:0:1/2")),
       policy=st.sampled_from(PERIODIC), overhead=st.integers(0, 3))
def test_every_schedule_on_every_interconnect_validates_and_runs_at_its_period(net, n, spec, policy,
                                                                                overhead) -> None:
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    ic = parse_interconnect(spec)
    result = make_schedule(policy, net, n, model, interconnect=ic)
    validate(result.periodic, result.graph)
    per_iteration = result.metrics.period_cycles / result.periodic.unfold
    assert simulated_period(result, net, model, ic) == pytest.approx(per_iteration)

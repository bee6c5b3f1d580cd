"""A shorter run read off a longer one (`layerpipe.sim._prefix.is_prefix_run`, used by `simulate_policy_runs` for
explore's K run beside its 2K one): where it says the shorter run is the start of the longer, every op's start and
end, the version map, the peaks and the steady state are what simulating the shorter run alone gives; where it says
not, the run is simulated. Generated networks, every policy kind, `shared`, `links` and `rtl` (a bus is always
simulated), run lengths in both orders; both answers are seen.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule._pipedream import PipeDreamOptions
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import SimConfig, _policy, simulate_policy_pair, simulate_policy_result, simulate_policy_runs
from layerpipe.sim._prefix import is_prefix_run
from tests.strategies import networks

POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "zb-h1", "ooo")
INTERCONNECTS = ("shared", "links:1:1", "links:2:1/4", "rtl", "bus:1:2")


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    said: list[bool] = []
    real = _policy.is_prefix_run

    def spy(*args, **kwargs):
        said.append(real(*args, **kwargs))
        return said[-1]

    monkeypatch.setattr(_policy, "is_prefix_run", spy)
    return said


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(network=networks(max_layers=5, dag=True, max_width=12), policy=st.sampled_from(POLICIES),
       num_procs=st.integers(1, 4), interconnect=st.sampled_from(INTERCONNECTS), k=st.integers(1, 12),
       longer_first=st.booleans())
def test_a_run_read_off_a_longer_one_is_the_run_alone(monkeypatch, network, policy, num_procs, interconnect, k,
                                                      longer_first) -> None:
    model = MacsModel()
    spec = parse_interconnect(interconnect, lanes=1)
    result = make_schedule(policy, network, num_procs, model, policy_options(policy, {}), spec)
    config = SimConfig.of(spec)
    said = _spy(monkeypatch)
    lengths = (2 * k, k) if longer_first else (k, 2 * k)
    runs = simulate_policy_runs(result, network, model, lengths, config)
    event(f"read off the longer run: {any(said)}")
    for run, length in zip(runs, lengths, strict=True):
        alone = simulate_policy_result(result, network, model, length, config)
        assert np.array_equal(run.start, alone.start) and np.array_equal(run.end, alone.end)
        assert np.array_equal(run.versions, alone.versions)
        assert run.peak_memory_words == alone.peak_memory_words
        assert run.cycles_per_iteration == alone.cycles_per_iteration
    shorter, longer = (runs[1], runs[0]) if longer_first else runs
    assert longer.steady_cycles_per_iteration(shorter) == \
        simulate_policy_result(result, network, model, 2 * k, config).steady_cycles_per_iteration(
            simulate_policy_result(result, network, model, k, config))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(network=networks(max_layers=5, dag=True, max_width=12), policy=st.sampled_from(POLICIES),
       num_procs=st.integers(1, 4), interconnect=st.sampled_from(INTERCONNECTS), k=st.integers(1, 12))
def test_the_pair_reads_what_the_runs_give(monkeypatch, network, policy, num_procs, interconnect, k) -> None:
    """`simulate_policy_pair` (explore's steady state: the shorter run's total read off the longer run where it is
    its start, without compiling it) gives the longer run and the shorter run's iterations and total cycles that
    `simulate_policy_runs` gives, and the same steady state."""
    model = MacsModel()
    spec = parse_interconnect(interconnect, lanes=1)
    result = make_schedule(policy, network, num_procs, model, policy_options(policy, {}), spec)
    config = SimConfig.of(spec)
    cut: list[bool] = []
    restricted = _policy.restricted_compile
    monkeypatch.setattr(_policy, "restricted_compile", lambda *a: cut.append(True) or restricted(*a))
    long_run, iterations, total = simulate_policy_pair(result, network, model, 2 * k, k, config)
    event(f"shorter run compiled: {bool(cut)}")
    monkeypatch.undo()
    want_long, want_short = simulate_policy_runs(result, network, model, (2 * k, k), config)
    assert (iterations, total) == (want_short.num_iterations, want_short.total_cycles)
    assert np.array_equal(long_run.start, want_long.start) and np.array_equal(long_run.end, want_long.end)
    assert long_run.peak_memory_words == want_long.peak_memory_words
    assert long_run.steady_cycles_per_iteration_of(iterations, total) == \
        want_long.steady_cycles_per_iteration(want_short)


@pytest.mark.parametrize(("policy", "interconnect", "num_procs", "expected"), [
    ("gpipe", "links:1:1", 3, True),  # whole steps, each processor's first ops: the start of the longer run
    ("1f1b", "shared", 3, True),
    ("pipedream", "links:1:1", 1, True),  # one processor runs one iteration after another
    ("pipedream", "links:1:1", 3, False),  # a straight pipeline: the K-th iteration's forwards run between the
    ("pipedream", "bus:1:2", 1, False),  # last ones' backwards. A bus keeps its own order and floors: simulated
])
def test_which_runs_are_read_off(monkeypatch, policy: str, interconnect: str, num_procs: int, expected: bool) -> None:
    network, model = load_network("mlp:16-12-8-4"), MacsModel()
    spec = parse_interconnect(interconnect, lanes=1)
    options = PipeDreamOptions(replication=False) if policy == "pipedream" else policy_options(policy, {})
    result = make_schedule(policy, network, num_procs, model, options, spec)
    said = _spy(monkeypatch)
    simulate_policy_runs(result, network, model, (12, 6), SimConfig.of(spec))
    assert said == [expected]


def test_a_dropped_transfer_ahead_on_a_link_is_no_prefix() -> None:
    """The link check alone: the kept ops are each processor's first ops, but a transfer only the longer run has
    (to an op it cuts) is queued on a link ahead of a kept one, so the kept one leaves later in the longer run."""
    network, model = load_network("mlp:16-12-8-4"), MacsModel()
    spec = parse_interconnect("links:1:1", lanes=1)
    result = make_schedule("gpipe", network, 2, model, policy_options("gpipe", {}), spec)
    runs = _policy.compiled_policy_runs(result, network, model, (8, 4), "stash")
    (longer, _, _), (shorter, _, cut) = runs
    assert cut is not None and is_prefix_run(longer, shorter.bounds, cut, "links")
    plan = longer.link_plan
    # Queue every transfer of the longer run alone first on its link: the kept ones now wait behind them.
    kept = np.zeros(longer.num_ops, dtype=bool)
    kept[cut] = True
    late = ~kept[plan.send_producer]
    assert late.any() and (~late).any()
    order = np.r_[np.flatnonzero(late), np.flatnonzero(~late)]
    for name in ("send_producer", "send_input", "send_link"):
        object.__setattr__(plan, name, getattr(plan, name)[order])
    assert set(plan.send_link[: int(late.sum())].tolist()) & set(plan.send_link[int(late.sum()):].tolist())
    assert not is_prefix_run(longer, shorter.bounds, cut, "links")

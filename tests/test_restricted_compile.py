"""A shorter run's compiled schedule cut out of a longer one's (`layerpipe.sim._restrict.restricted_compile`, used
by `simulate_policy_result` for explore's K-iteration run after its 2K one) is what compiling it gives: the same
numbering, tasks, costs, producers, words, roles and planned starts — or None, never something else.

Generated networks and policies (periodic, unfolded and grouped, synchronous), any pair of run lengths (whole
periods and steps or not, the shorter first or not), and schedules that are not a cut of the longer one.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.schedule._engine import CompiledSchedule
from layerpipe.schedule._task_table import clear_memos
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import SimConfig, compile_schedule, policy_ops, simulate_policy_result
from layerpipe.sim import _policy as sim_policy
from layerpipe.sim._restrict import restricted_compile
from tests.strategies import networks

POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "zb-h1", "ooo")
INTERCONNECTS = ("shared", "links:1:1", "bus:1:2")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(a: CompiledSchedule, b: CompiledSchedule) -> None:
    """Every field compiling gives, equal (values; a cut keeps `longer`'s narrow types where they fit)."""
    assert a.bounds == b.bounds
    assert a.tasks == b.tasks
    assert a.cost == b.cost
    assert a.roles == b.roles
    assert a.plan_time == b.plan_time
    for name in ("task", "iteration", "prod_ptr", "prod_idx", "prod_words", "prod_role"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        assert np.array_equal(x, y), name
    assert a.schedule is b.schedule or a.schedule == b.schedule
    if "link_plan" in a.__dict__:  # cut out of the longer run's
        x, y = a.link_plan, b.link_plan
        assert x.bounds == y.bounds
        for name in ("input_ptr", "input_src", "send_producer", "send_input", "send_link", "word_array"):
            assert getattr(x, name).dtype == getattr(y, name).dtype, name
            assert np.array_equal(getattr(x, name), getattr(y, name)), name


def _result(network, policy: str, num_procs: int, interconnect: str, model):
    spec = parse_interconnect(interconnect, lanes=getattr(model, "lanes", None) or 1)
    return make_schedule(policy, network, num_procs, model, policy_options(policy, {}), spec)


@SETTINGS
@given(network=networks(max_layers=5), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 4),
       interconnect=st.sampled_from(INTERCONNECTS), shorter=st.integers(1, 12), extra=st.integers(0, 12),
       mode=st.sampled_from(("stash", "latest")), pe=st.booleans(), plan=st.booleans())
def test_cut_is_the_compiled_schedule(network, policy, num_procs, interconnect, shorter, extra, mode, pe,
                                      plan) -> None:
    model = PEModel(lanes=2) if pe else MacsModel()
    result = _result(network, policy, num_procs, interconnect, model)
    longer_ops, workload = policy_ops(result, network, model, shorter + extra, mode)
    longer = compile_schedule(longer_ops, workload)
    if plan:
        assert longer.link_plan is not None  # computed, as a run on links does: the cut cuts it too
    schedule, _ = policy_ops(result, network, model, shorter, mode)
    cut = restricted_compile(longer, schedule, workload)
    note(f"{policy} p={num_procs} {interconnect} {shorter}+{extra}: cut {'made' if cut is not None else 'refused'}")
    event(f"{policy}: cut {'made' if cut is not None else 'refused'}")
    if cut is not None:
        _same(cut, compile_schedule(schedule, workload))
    # And the other way round: a longer schedule is never a cut of a shorter one.
    if extra:
        assert restricted_compile(compile_schedule(schedule, workload), longer_ops, workload) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_explore_pairs_are_cut(policy: str) -> None:
    """explore's pairs (2K, then K whole periods or steps) are cut, not compiled again: the point of it."""
    from layerpipe.dse._evaluate import simulated_iterations
    from layerpipe.network import load_network

    network = load_network("lenet5")
    model = PEModel(lanes=4)
    result = _result(network, policy, 3, "links:1:1", model)
    k = simulated_iterations(result)
    if result.explicit is not None:
        m = max(result.explicit.microbatches, 1)
        k = -(-k // m) * m
    longer_ops, workload = policy_ops(result, network, model, 2 * k)
    schedule, _ = policy_ops(result, network, model, k)
    longer = compile_schedule(longer_ops, workload)
    assert longer.link_plan is not None
    cut = restricted_compile(longer, schedule, workload)
    assert cut is not None and "link_plan" in cut.__dict__
    _same(cut, compile_schedule(schedule, workload))


@SETTINGS
@given(network=networks(max_layers=4), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 3),
       interconnect=st.sampled_from(INTERCONNECTS), lengths=st.lists(st.integers(1, 10), min_size=1, max_size=4))
def test_simulated_runs_are_unchanged(network, policy, num_procs, interconnect, lengths) -> None:
    """`simulate_policy_result` with the last run remembered (any sequence of run lengths) times every op as with
    nothing remembered."""
    model = MacsModel()
    result = _result(network, policy, num_procs, interconnect, model)
    config = SimConfig.of(parse_interconnect(interconnect, lanes=1))
    clear_memos()
    runs = [simulate_policy_result(result, network, model, k, config) for k in lengths]
    for k, run in zip(lengths, runs, strict=True):
        clear_memos()
        fresh = simulate_policy_result(result, network, model, k, config)
        assert np.array_equal(run.start, fresh.start) and np.array_equal(run.end, fresh.end)
        assert np.array_equal(run.versions, fresh.versions)
        assert run.peak_memory_words == fresh.peak_memory_words
        assert run.cycles_per_iteration == fresh.cycles_per_iteration


def test_memo_is_taken_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The remembered run is used once, and runs over `REMEMBERED_OPS` ops are not remembered."""
    from layerpipe.network import load_network

    network, model = load_network("lenet5"), MacsModel()
    result = _result(network, "gpipe", 2, "shared", model)
    clear_memos()
    simulate_policy_result(result, network, model, 8)
    assert "run" in sim_policy._LAST
    simulate_policy_result(result, network, model, 4)
    assert "run" not in sim_policy._LAST  # taken by the cut; the cut itself is not remembered
    monkeypatch.setattr(sim_policy, "REMEMBERED_OPS", 10)
    simulate_policy_result(result, network, model, 8)
    assert "run" not in sim_policy._LAST

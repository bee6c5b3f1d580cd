"""A synchronous step timed on the steady state's own run, and that run read by the simulator (issue 14).

Within `steady_run_kept` (what `explore` schedules in), `_sync_policies.synchronous_result` times its step over the
2K steps that the steady state simulates (`steady_state_steps`) when that run is small, reads the shorter runs
`timed_step` asks for off it, and keeps it (`ScheduleResult.timed_run`); `layerpipe.sim.simulate_policy_runs` then
reads its times instead of compiling and timing the same ops again. Held here, over generated networks, every
synchronous policy, cost models and interconnects:

- the result is the one runs of exactly the lengths `timed_step` asks for give (the scheduler outside
  `steady_run_kept`, which keeps no run);
- a simulation that reads the kept run gives every figure a fresh one gives, on the scheduled interconnect and on
  another (where the kept times do not apply and the run is timed again);
- `explore`'s steady state does read it: no compile and no timing of the long run in the simulator.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layerpipe.schedule._sync_policies as sync
import layerpipe.sim as sim
import layerpipe.sim._policy as policy_sim
from layerpipe._memo import clear_memos
from layerpipe.costs import MacsModel, PEModel, make_cost_model
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Network, load_network
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule.policies import make_schedule
from layerpipe.sim import SimConfig, SimResult, simulate_policy_runs
from tests.strategies import networks

SYNC = sorted([*sync.SHAPES, "ooo"])
INTERCONNECTS = ["shared", "links:3:2", "bus:2:4", "links:1:1/4", "bus:0:1", "rtl"]
COST_MODELS = [MacsModel(), PEModel(4, 0), PEModel(2, 11)]


def _schedule(name: str, network: Network, n: int, model, ic: str, keep: bool = True) -> ScheduleResult | None:
    try:
        with sync.steady_run_kept() if keep else contextlib.nullcontext():
            return make_schedule(name, network, n, model, None, parse_interconnect(ic, lanes=1))
    except InputError:  # the documented refusal: fewer layers than a processor's chunks
        return None


def _runs(result: ScheduleResult) -> tuple[int, int]:
    """(2K, K) in micro-batches, as `layerpipe.dse`'s steady state simulates them."""
    assert result.explicit is not None
    m = max(result.explicit.microbatches, 1)
    k, two_k = sync.steady_state_steps(m)
    return two_k * m, k * m


def _figures(run: SimResult) -> tuple[object, ...]:
    return (run.start.tolist(), run.end.tolist(), run.total_cycles, run.peak_memory_words, run.busy_cycles,
            run.traffic_words, run.cycles_per_iteration, run.completion_times.tolist())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(network=networks(max_layers=7, max_width=12), n=st.integers(1, 9), name=st.sampled_from(SYNC),
       model=st.sampled_from(COST_MODELS), ic=st.sampled_from(INTERCONNECTS))
def test_the_step_from_the_long_run_is_the_step_of_exact_runs(network: Network, n: int, name: str, model,
                                                              ic: str) -> None:
    kept = _schedule(name, network, n, model, ic)
    clear_memos()
    exact = _schedule(name, network, n, model, ic, keep=False)  # runs of exactly MIN_TIMED_STEPS, 2·MIN_TIMED_STEPS…
    assert (kept is None) == (exact is None)
    if kept is None or exact is None:
        return
    assert exact.timed_run is None
    assert kept == exact and kept.notes == exact.notes and kept.metrics == exact.metrics


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(network=networks(max_layers=6, max_width=12), n=st.integers(2, 8), name=st.sampled_from(SYNC),
       model=st.sampled_from(COST_MODELS), ic=st.sampled_from(INTERCONNECTS),
       other=st.sampled_from(INTERCONNECTS))
def test_a_simulation_reading_the_kept_run_is_a_fresh_simulation(network: Network, n: int, name: str, model,
                                                                 ic: str, other: str) -> None:
    result = _schedule(name, network, n, model, ic)
    if result is None:
        return
    assert result.timed_run is not None  # every generated step here is small
    fresh = replace(result, timed_run=None)
    for on in (ic, other):
        config = SimConfig.of(parse_interconnect(on, lanes=1))
        got = simulate_policy_runs(result, network, model, _runs(result), config)
        want = simulate_policy_runs(fresh, network, model, _runs(result), config)
        for a, b in zip(got, want, strict=True):
            assert _figures(a) == _figures(b)


def test_explore_reads_the_kept_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The steady state of a synchronous point compiles and times nothing of the long run in the simulator."""
    network, model = load_network("lenet5"), make_cost_model("pe")
    compiled: list[int] = []
    timed: list[int] = []
    compile_schedule, run_timing = policy_sim.compile_schedule, sim.run_timing
    monkeypatch.setattr(policy_sim, "compile_schedule", lambda s, w: compiled.append(1) or compile_schedule(s, w))
    monkeypatch.setattr(sim, "run_timing", lambda *a: timed.append(1) or run_timing(*a))
    for name in ("gpipe", "1f1b", "zb-h1", "ooo"):
        result = _schedule(name, network, 4, model, "rtl")
        assert result is not None and result.timed_run is not None
        config = SimConfig.of(result.interconnect)
        long_run, short_run = simulate_policy_runs(result, network, model, _runs(result), config)
        assert np.array_equal(long_run.end, result.timed_run.end)
        assert short_run.total_cycles <= long_run.total_cycles
    assert compiled == [] and timed == []


def test_the_run_is_kept_only_when_asked_and_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside `steady_run_kept` (`compare`, `schedule`: no simulation follows) and past STEADY_RUN_OPS the step is
    timed over MIN_TIMED_STEPS steps and no run is kept."""
    network, model = load_network("lenet5"), make_cost_model("pe")
    steps: list[int] = []
    build = sync._stage_programs.repeat_step
    monkeypatch.setattr(sync._stage_programs, "repeat_step", lambda one, k: steps.append(k) or build(one, k))
    kept = _schedule("1f1b", network, 4, model, "shared")
    assert kept is not None and kept.timed_run is not None and steps == [sync.steady_state_steps(8)[1]]
    steps.clear()
    plain = make_schedule("1f1b", network, 4, model)
    assert plain.timed_run is None and steps == [sync.MIN_TIMED_STEPS]
    monkeypatch.setattr(sync, "STEADY_RUN_OPS", 10)
    steps.clear()
    large = _schedule("1f1b", network, 4, model, "shared")
    assert large is not None and large.timed_run is None and steps == [sync.MIN_TIMED_STEPS]
    assert kept == plain == large

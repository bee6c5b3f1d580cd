"""The run sweep on `links` (`layerpipe.schedule._runs`) reads each run's transfers from flat lists (`Sends`: where
each head's begin, then input, link and offset per transfer) rather than a list of tuples per head. Properties, on
generated networks and policies with random latencies and bandwidths (zero-cycle ops included): the flat lists
hold, head by head, the tuples the per-head lists held (their construction kept here as the reference), and the
run sweep times every op as the op-by-op sweep (`_sweep`, the engine's oracle) does.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.schedule._engine import _hold_cycles
from layerpipe.schedule._op_sweep import _run_sweep, _sweep
from layerpipe.schedule._runs import Runs, make_runs
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import compile_schedule, policy_ops
from tests.strategies import networks

POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "zb-h1", "ooo")


def reference_sends(runs: Runs, send_producer: np.ndarray, send_input: np.ndarray, send_link: np.ndarray
                    ) -> list[list[tuple[int, int, int]]]:
    """Per head, its runs' transfers as (input number, link, off of the sending op): the per-head lists the run
    sweep read before `Sends` (`make_runs` as of commit 36075c7)."""
    head_number = np.searchsorted(np.asarray(runs.head, dtype=np.int64), runs.run_of.astype(np.int64))
    owner = head_number[send_producer]
    s_ptr = np.zeros(len(runs.head) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(runs.head)), out=s_ptr[1:])
    flat = list(zip(send_input.tolist(), send_link.tolist(), runs.off[send_producer].tolist(), strict=True))
    return [flat[a:b] for a, b in zip(s_ptr[:-1].tolist(), s_ptr[1:].tolist(), strict=True)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(network=networks(max_layers=6), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 5),
       iterations=st.integers(1, 12), latency=st.integers(0, 5), words_per_cycle=st.integers(1, 6),
       zero=st.booleans())
def test_run_sweep_on_links_times_what_the_op_sweep_times(network, policy, num_procs, iterations, latency,
                                                          words_per_cycle, zero) -> None:
    model = PEModel(lanes=2) if zero else MacsModel()  # the PE model gives zero-cycle tasks on narrow layers
    result = make_schedule(policy, network, num_procs, model, policy_options(policy, {}),
                           parse_interconnect(f"links:{latency}:{words_per_cycle}", lanes=2))
    compiled = compile_schedule(*policy_ops(result, network, model, iterations))
    plan = compiled.link_plan
    runs = make_runs(compiled.bounds, compiled.dur_array(), plan.input_ptr, plan.input_src, plan.send_producer,
                     plan.send_input, plan.send_link, max_head_share=1.0)
    assert runs is not None and runs.sends is not None
    expected = reference_sends(runs, plan.send_producer, plan.send_input, plan.send_link)
    assert [runs.sends.of_head(k) for k in range(len(runs.head))] == expected
    hold = [0] * compiled.num_ops + _hold_cycles(np.asarray(plan.words, dtype=np.int64), words_per_cycle).tolist()
    start, end = _run_sweep(compiled, runs, compiled.num_ops + len(plan.words), hold, latency, plan)
    assert (start.tolist(), end.tolist()) == _sweep(compiled, plan.inputs, plan, hold, latency)

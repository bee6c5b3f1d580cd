"""The version map's array forms (`layerpipe.sim._versions`: every reader's count of ended updates by one search
over (unit, time) keys; the remote readers' pinned copies from per-task tables) against the per-layer searches and
per-task passes they replaced (tests/sim_reference.py), on generated networks, policies, interconnects and weight
modes, and the count itself against its definition on random updates and queries (huge keys included).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import SimConfig, compile_schedule, policy_ops
from layerpipe.sim._engine import run_timing
from layerpipe.sim._versions import _remote_copies, _updates_ended, version_array
from tests.sim_reference import reference_remote_copies, reference_version_array
from tests.strategies import networks

POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "ooo")
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(network=networks(max_layers=6), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 4),
       iterations=st.integers(1, 12), interconnect=st.sampled_from(("shared", "links:1:1", "bus:2:1")),
       mode=st.sampled_from(("stash", "latest", "ema")), pe=st.booleans(), staleness=st.none() | st.integers(0, 2))
def test_version_array_is_the_reference(network, policy, num_procs, iterations, interconnect, mode, pe,
                                        staleness) -> None:
    model = PEModel(lanes=2) if pe else MacsModel()
    spec = parse_interconnect(interconnect, lanes=2)
    given_options = {"max_staleness": staleness} if staleness is not None and policy == "layerpipe" else {}
    result = make_schedule(policy, network, num_procs, model, policy_options(policy, given_options), spec)
    schedule, workload = policy_ops(result, network, model, iterations, mode)
    compiled = compile_schedule(schedule, workload)
    config = SimConfig.of(spec, mode)
    start, end = run_timing(compiled, config.interconnect, config.link_latency, config.link_words_per_cycle)
    for remote in (False, True):
        expected = reference_version_array(compiled, start, end, workload, mode, remote)
        assert np.array_equal(version_array(compiled, start, end, workload, mode, remote), expected)
    event(f"{policy}: {'pinned' if compiled.schedule.read_staleness else 'no pins'}")
    if compiled.schedule.read_staleness:  # the pinned copies alone, on random versions too
        versions = np.random.default_rng(iterations).integers(-1, 5, compiled.num_ops)
        mine, theirs = versions.copy(), versions.copy()
        _remote_copies(compiled, mine)
        reference_remote_copies(compiled, theirs)
        assert np.array_equal(mine, theirs)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), huge=st.booleans())
def test_updates_ended_counts_by_definition(data, huge: bool) -> None:
    """Per query (unit, time): the updates of that unit ending at or before the time (sorted by unit, then end)."""
    top = (1 << 61) if huge else 40  # huge times: keys out of int64's range take the search per unit
    units = st.integers(-2, 4)
    updates = sorted(data.draw(st.lists(st.tuples(units, st.integers(0, top)), max_size=20)))
    queries = data.draw(st.lists(st.tuples(units, st.integers(0, top)), max_size=20))
    update_units = np.asarray([u for u, _ in updates], dtype=np.int64)
    update_ends = np.asarray([e for _, e in updates], dtype=np.int64)
    got = _updates_ended(update_units, update_ends, np.asarray([u for u, _ in queries], dtype=np.int64),
                         np.asarray([t for _, t in queries], dtype=np.int64))
    assert got.tolist() == [sum(1 for v, e in updates if v == u and e <= t) for u, t in queries]

"""PipeDream-2BW (Narayanan et al., ICML'21 §3): two weight versions, gradients coalesced over m micro-batches,
one update per m. The schedule's versions, staleness and weight memory are measured on the periodic timing;
here they must equal what the simulator observes running it, and the paper's figures — 2 versions, staleness
1 update — on pipelines with m ≥ their depth. Functional mode and the reference run its numerics."""

from __future__ import annotations

import numpy as np
import pytest

from layerpipe.costs import make_cost_model
from layerpipe.fixedpoint import DEFAULT_FORMAT
from layerpipe.network import load_network
from layerpipe.numerics import init_weights, make_data
from layerpipe.reference import train_reference
from layerpipe.schedule._pipedream import PipeDream2BWOptions, PipeDreamOptions
from layerpipe.schedule.policies import make_schedule
from layerpipe.sim import SimConfig, policy_ops, simulate_policy_result
from layerpipe.sim._memory import _weight_steps
from layerpipe.sim.functional import FunctionalConfig, order_by_start, run_functional

MODEL = make_cost_model("pe", lanes=4, overhead=2)
BALANCED = "mlp:" + "-".join(["16"] * 9)


def _observed(result, network, periods: int = 8):
    """(staleness per layer, weight versions held per layer) as the simulator sees them in the steady state:
    F_l(t) of window ⌊t/m⌋ reads version v, staleness ⌊t/m⌋ − v; versions from the memory sweep's weight
    steps (words held / |W_l|), over the middle of the run."""
    periodic = result.periodic
    m = periodic.unfold
    iterations = m * periods
    sim = simulate_policy_result(result, network, MODEL, iterations, SimConfig("shared"))
    stale: dict[int, int] = {}
    for (kind, layer, t), version in sim.version_map.items():
        if kind == "F" and iterations // 4 <= t < 3 * iterations // 4:
            stale[layer] = max(stale.get(layer, 0), t // periodic.group(layer) - version)
    lo, hi = sim.total_cycles // 4, 3 * sim.total_cycles // 4
    workload = policy_ops(result, network, MODEL, 1)[1]
    versions: dict[int, int] = {}
    steps = _weight_steps(sim._compiled, sim.start, sim.end, sim.versions, workload, "stash")
    for (layer, size), (_, times, deltas) in zip(sorted(workload.weight_words.items()), steps, strict=True):
        held = np.cumsum(deltas) // size  # from times[k] on, held[k] versions
        first = max(int(np.searchsorted(times, lo, side="right")) - 1, 0)
        versions[layer] = int(held[first:int(np.searchsorted(times, hi))].max())
    return stale, versions, sim


@pytest.mark.parametrize("n,m", [(2, 2), (3, 3), (4, 4), (4, 8), (3, 7)])
def test_2bw_versions_and_staleness_are_the_papers_and_the_simulators(n: int, m: int) -> None:
    network = load_network(BALANCED)
    result = make_schedule("pipedream-2bw", network, n, MODEL, PipeDream2BWOptions(microbatches=m))
    metrics, periodic = result.metrics, result.periodic
    assert periodic is not None and periodic.unfold == m and set(dict(periodic.groups).values()) == {m}
    # the paper: W(t+1) = W(t) − ν∇f(W(t−1)), two versions
    assert metrics.max_staleness == 1 and metrics.weight_versions == 2
    stale, versions, sim = _observed(result, network)
    assert stale == metrics.staleness_per_layer
    assert versions == metrics.weight_versions_per_layer
    assert sim.cycles_per_iteration == periodic.period / m  # and it runs at the scheduled period
    # one update per m micro-batches, at full cost
    updates = [op for op in sim.ops if op.kind == "U" and op.unit == 1]
    assert len(updates) == -(-sim.num_iterations // m)
    straight = make_schedule("pipedream", network, n, MODEL, PipeDreamOptions(replication=False))
    assert periodic.costs == straight.periodic.costs  # type: ignore[union-attr]


@pytest.mark.parametrize("spec,n", [("lenet5", 4), ("mlp:784-256-128-10", 3)])
def test_2bw_measures_what_the_simulator_sees_on_unbalanced_stages(spec: str, n: int) -> None:
    """Where stages are unbalanced the figures may exceed the paper's (the model does not hide it): they still
    equal the simulator's."""
    network = load_network(spec)
    result = make_schedule("pipedream-2bw", network, n, MODEL)
    stale, versions, _ = _observed(result, network, periods=6)
    assert stale == result.metrics.staleness_per_layer
    assert versions == result.metrics.weight_versions_per_layer
    assert result.metrics.max_staleness >= 1  # window k reads version k − 1 at the freshest


@pytest.mark.parametrize("fixed", [False, True], ids=["float64", "fixed"])
def test_2bw_numerics_coalesce_m_gradients_per_update(fixed: bool) -> None:
    network = load_network("mlp:8-8-6-4-3")
    model = make_cost_model("macs")
    result = make_schedule("pipedream-2bw", network, 3, model, PipeDream2BWOptions(microbatches=3))
    iterations = 12
    sim = simulate_policy_result(result, network, model, iterations)
    fmt = DEFAULT_FORMAT if fixed else None
    data, init = make_data(network, iterations, 3), init_weights(network, 3, fmt)
    order = order_by_start(zip(sim.ops, sim.start.tolist(), sim.end.tolist(), strict=True))
    groups = sim.schedule.groups
    got = run_functional(network, order, sim.version_map, init, data, FunctionalConfig(fmt=fmt, groups=groups))
    want = train_reference(network, init, data, sim.version_map, fmt=fmt, groups=groups)
    for key, value in want.weights.items():
        if fixed:
            np.testing.assert_array_equal(got.weights[key], value)
        else:
            np.testing.assert_allclose(got.weights[key], value, rtol=1e-9, atol=1e-12)
    assert set(got.updates.values()) == {iterations // 3}
    # no forward of window k reads a version newer than k − 1 (the double buffer), and some read exactly that
    reads = [(t, v) for (kind, _, t), v in sim.version_map.items() if kind == "F"]
    assert all(v <= max(0, t // 3 - 1) for t, v in reads) and any(v == t // 3 - 1 > 0 for t, v in reads)

"""The simulator against the other parts: retiming's delays, the policies' periods and staleness.

- Retiming (RET): a schedule built from `solve_delays` — stage s on processor s, task v at lag r(v) (U_l at
  r(U_l) + D_l: the contract numbers U by the iteration whose gradient it applies) — must read, when
  simulated, every F_l(t) at staleness exactly D_l: 2·S(l) on chains, the solver's D_l on residual DAGs.
- Policies (SLP): simulating a periodic schedule can only be as fast as or faster than its period (the
  plan is one valid execution; the simulator starts each op as early as possible in the same order), and
  exactly as fast when some processor's body fills the period. Where a layer's weight tasks share a
  processor the versions follow from program order alone, so the simulated staleness must equal the
  policy's own staleness figures.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.dfg import TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.retiming import DelaySolution, solve_delays
from layerpipe.schedule import PeriodicSchedule, Slot, expand_stages
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import Workload, policy_ops, repeat_steps, simulate, simulate_policy_result
from tests.strategies import networks, stage_maps


def retimed_schedule(graph: TrainingGraph, solution: DelaySolution) -> PeriodicSchedule:
    """Stage s on processor s, each body back to back in the graph's topological order, lags from RET."""
    costs = graph.costs(MacsModel())
    bodies: list[list[Slot]] = [[] for _ in range(solution.num_stages)]
    ends = [0] * solution.num_stages
    for task in graph.intra_iteration_order():
        s = solution.stage_of_task[task]
        lag = solution.lags[task] + (solution.delays.get(task.layer, 0) if task.has("U") else 0)
        bodies[s].append(Slot(ends[s], task.kind, task.layer, lag))
        ends[s] += costs[task]
    return PeriodicSchedule(max(ends), tuple(tuple(b) for b in bodies))


def simulated_staleness(graph: TrainingGraph, schedule: PeriodicSchedule, iterations: int) -> dict[int, set[int]]:
    """Per weight layer, the staleness t − version of every F_l(t) once t is past the deepest delay."""
    result = simulate(schedule.unroll(iterations), Workload.of_graph(graph, MacsModel()))
    out: dict[int, set[int]] = {}
    for (kind, layer, t), version in result.version_map.items():
        if kind == "F" and t >= iterations // 2:
            out.setdefault(layer, set()).add(t - version)
    return out


@st.composite
def staged_networks(draw, dag: bool):
    net = draw(networks(max_layers=6, dag=dag, max_width=4))
    return net, draw(stage_maps(net, max_stages=4))


@settings(max_examples=25, deadline=None)
@given(staged_networks(dag=False))
def test_chain_staleness_equals_retiming_delays(case):
    net, stages = case
    graph = build_training_graph(net)
    solution = solve_delays(graph, stages)
    depth = max(solution.delays.values(), default=0) + max(solution.lags.values(), default=0)
    seen = simulated_staleness(graph, retimed_schedule(graph, solution), 2 * depth + 4)
    count = max(stages) + 1
    for layer in net.layers:
        if layer.has_weights:
            expected = 2 * (count - 1 - stages[layer.index - 1])  # 2·S(l)
            assert solution.delays[layer.index] == expected
            assert seen[layer.index] == {expected}


@settings(max_examples=25, deadline=None)
@given(staged_networks(dag=True))
def test_residual_dag_staleness_equals_retiming_delays(case):
    net, stages = case
    graph = build_training_graph(net)
    solution = solve_delays(graph, stages)
    depth = max(solution.delays.values(), default=0) + max(solution.lags.values(), default=0)
    seen = simulated_staleness(graph, retimed_schedule(graph, solution), 2 * depth + 4)
    assert seen == {layer: {d} for layer, d in solution.delays.items()}


ASYNC_CASES = [
    ("mlp:16-12-10-8-6-4", 3), ("mlp:16-12-10-8-6-4", 5), ("mlp:32-30-28-26-24-22-20-18", 4), ("lenet5", 4),
    ("examples/residual_mlp.yaml", 3),
]


@pytest.mark.parametrize(("spec", "procs"), ASYNC_CASES)
@pytest.mark.parametrize(("policy", "options"), [
    ("layerpipe", {}), ("layerpipe", {"keep_weights_together": True}), ("pipedream", {}),
])
def test_async_policies_period_and_staleness(spec, procs, policy, options):
    net = load_network(spec, 1)
    model = PEModel(4, 2)
    result = make_schedule(policy, net, procs, model, policy_options(policy, options))
    periodic = result.periodic
    assert periodic is not None and result.graph is not None
    # Simulated as early as possible, a schedule may run ahead of its plan in the fill and take many
    # iterations to give the slack back (one cycle over ~75 iterations in one case here); run long enough
    # for the middle-half window to be in steady state.
    iterations = max(4 * (max(periodic.lags().values()) + 3), 200) * periodic.unfold
    sim = simulate(periodic.unroll(iterations), Workload.of_graph(result.graph, model))
    costs = result.graph.costs(model)
    loads = [sum(costs[next(t for t in costs if (t.kind, t.layer) == (s.kind, s.layer))] for s in body)
             for body in periodic.bodies]
    per_iteration = periodic.period / periodic.unfold  # unfolded (replicated PipeDream): J iterations a period
    assert sim.cycles_per_iteration <= per_iteration
    if max(loads) == periodic.period:  # a full processor cannot go faster than its body
        assert sim.cycles_per_iteration == per_iteration
    placement = periodic.placement()
    together = all(placement.get(("F", layer)) == placement.get(("U", layer))
                   for layer in result.metrics.staleness_per_layer)
    if together:  # versions follow from program order alone
        t = iterations // 2
        staleness = {layer: t // periodic.group(layer) - sim.version_map[("F", layer, t)]
                     for layer in result.metrics.staleness_per_layer}
        if periodic.unfold == 1:
            assert staleness == result.metrics.staleness_per_layer
        else:  # phases differ; the reported figure is the largest over them
            assert all(staleness[layer] <= s for layer, s in result.metrics.staleness_per_layer.items())


SYNC_POLICIES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev", "looped-bfs", "ooo"]


def simulated_step_cycles(spec: str, procs: int, policy: str) -> tuple[float, int]:
    net = load_network(spec, 1)
    model = PEModel(4, 2)
    result = make_schedule(policy, net, procs, model)
    assert result.explicit is not None and result.stages is not None and result.graph is not None
    m = result.explicit.microbatches
    layer_level = expand_stages(repeat_steps(result.explicit, 6 * m), result.graph, result.stages)
    sim = simulate(layer_level, Workload.of_graph(result.graph, model))
    return sim.cycles_per_iteration * m, result.metrics.period_cycles


@pytest.mark.parametrize("spec", ["mlp:16-12-10-8-6-4", "lenet5"])
@pytest.mark.parametrize("policy", SYNC_POLICIES)
def test_sync_policies_step_time(spec, policy):
    simulated, planned = simulated_step_cycles(spec, 3, policy)
    assert simulated == planned


def test_pipedream_2bw_period():
    """2BW applies one update per m micro-batches at the update's full cost (ICML'21 §3; tests/
    test_pipedream_2bw.py has its versions and staleness); simulated, the period is the scheduler's."""
    net = load_network("mlp:16-12-10-8-6-4", 1)
    model = PEModel(4, 2)
    result = make_schedule("pipedream-2bw", net, 3, model)
    assert result.periodic is not None and result.graph is not None
    schedule, workload = policy_ops(result, net, model, 30 * result.periodic.unfold)
    assert workload.durations == Workload.of_graph(result.graph, model).durations
    sim = simulate(schedule, workload)
    assert sim.cycles_per_iteration == result.periodic.period / result.periodic.unfold


def test_simulate_policy_result_unrolls_or_repeats_steps():
    net = load_network("mlp:8-6-5-4", 1)
    model = PEModel(4, 2)
    sync = make_schedule("1f1b", net, 2, model, policy_options("1f1b", {"microbatches": 4}))
    result = simulate_policy_result(sync, net, model, 10)  # steps of 4, 4 and 2 micro-batches
    assert result.num_iterations == 10 and result.schedule.synchronous
    assert sorted({t // 4 for (_, _, t) in result.version_map}) == [0, 1, 2]
    assert {op.iteration for op in result.ops if op.kind == "U"} == {0, 1, 2}
    periodic = make_schedule("layerpipe", net, 2, model)
    assert simulate_policy_result(periodic, net, model, 7).num_iterations == 7
    with pytest.raises(InputError, match="not 'lenet5'"):
        simulate_policy_result(periodic, load_network("lenet5", 1), model, 7)

"""What each policy promises beyond validity: options, placements, staleness bounds, stage layouts, timing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.retiming import solve_delays
from layerpipe.schedule import make_schedule, policy_options, validate
from layerpipe.schedule._balance import partition_contiguous
from layerpipe.schedule._bodies import order_bodies, pack_circular, time_bodies
from layerpipe.schedule._deps import expand_stages
from layerpipe.schedule._lags import loop_lengths
from layerpipe.schedule._layerpipe import LayerPipeOptions
from layerpipe.schedule._ooo import OOOOptions
from layerpipe.schedule._pipedream import PipeDream2BWOptions, PipeDreamOptions, block_key, stage_layers
from layerpipe.schedule._sync_policies import SHAPES, SyncOptions, schedule_stages
from layerpipe.schedule._task_table import TaskTable
from layerpipe.sim import SimConfig, Workload, simulate
from tests.strategies import networks

MODEL = make_cost_model("pe", lanes=4, overhead=2)
#: PipeDream's straight pipeline (one processor per stage), whose figures these tests hold to its paper's.
STRAIGHT = PipeDreamOptions(replication=False)


# ----------------------------------------------------------------------------------------------- options


def test_options_that_do_not_apply_name_the_option_and_the_policy() -> None:
    with pytest.raises(InputError, match=r"option group_size does not apply to policy 'layerpipe'"):
        policy_options("layerpipe", {"group_size": 2})
    with pytest.raises(InputError, match=r"option --virtual-stages does not apply to policy 'gpipe'"):
        policy_options("gpipe", {"virtual_stages": 2}, {"virtual_stages": "--virtual-stages"})
    assert policy_options("ooo", {"group_size": 3}) == OOOOptions(group_size=3)


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(InputError, match=r"unknown policy 'nope'; allowed: layerpipe, pipedream, .*optimal"):
        make_schedule("nope", load_network("mlp:7-6-3"), 2, MODEL)


def test_bad_processor_counts_and_option_types_are_input_errors() -> None:
    net = load_network("mlp:7-6-3")
    with pytest.raises(InputError, match="num_procs"):
        make_schedule("layerpipe", net, 0, MODEL)
    with pytest.raises(InputError, match="takes LayerPipeOptions, got OOOOptions"):
        make_schedule("layerpipe", net, 2, MODEL, OOOOptions())
    with pytest.raises(InputError, match="max_staleness must be >= 0"):
        LayerPipeOptions(max_staleness=-1)


# ------------------------------------------------------------------------------------------- layerpipe


@pytest.mark.parametrize("intra,inter,kinds", [(True, True, {"F", "A", "E", "G", "U"}),
                                               (True, False, {"F", "A", "AE", "G", "U"}),
                                               (False, True, {"F", "A", "EG", "G", "U"}),
                                               (False, False, {"F", "AG", "AEG", "U"})])
def test_layerpipe_switches_choose_the_task_split(intra: bool, inter: bool, kinds: set[str]) -> None:
    result = make_schedule("layerpipe", load_network("mlp:9-8-7-6"), 3, MODEL, LayerPipeOptions(intra, inter))
    assert {kind for kind, _ in result.periodic.placement()} == kinds  # type: ignore[union-attr]


@pytest.mark.parametrize("spec", ["mlp:784-256-128-10", "lenet5", "resnet18"])
def test_keep_weights_together_moves_no_weights(spec: str) -> None:
    net = load_network(spec)
    for n in (2, 5, 8):
        result = make_schedule("layerpipe", net, n, MODEL, LayerPipeOptions(keep_weights_together=True))
        validate(result.periodic, result.graph)
        where = result.periodic.placement()  # type: ignore[union-attr]
        for e in result.graph.edges:  # type: ignore[union-attr]
            if e.role in ("weights", "stash", "gradient"):
                assert where[(e.src.kind, e.src.layer)] == where[(e.dst.kind, e.dst.layer)], e


@settings(max_examples=25, deadline=None)
@given(net=networks(max_layers=5), n=st.integers(1, 5), k=st.integers(0, 3), together=st.booleans())
def test_max_staleness_is_met_and_the_loop_bound_respected(net, n: int, k: int, together: bool) -> None:
    options = LayerPipeOptions(max_staleness=k, keep_weights_together=together)
    result = make_schedule("layerpipe", net, n, MODEL, options)
    validate(result.periodic, result.graph, max_staleness=k)
    assert result.metrics.max_staleness <= k
    if together:
        where = result.periodic.placement()  # type: ignore[union-attr]
        assert all(where[(e.src.kind, e.src.layer)] == where[(e.dst.kind, e.dst.layer)]
                   for e in result.graph.edges if e.role in ("weights", "stash", "gradient"))  # type: ignore[union-attr]
    table = TaskTable.of(result.graph, MODEL)  # type: ignore[arg-type]
    for length in loop_lengths(table).values():
        assert result.metrics.period_cycles * (k + 1) >= length


def test_max_staleness_zero_on_the_zoo_mlp_is_plain_sgd() -> None:
    net = load_network("mlp:784-256-128-10")
    result = make_schedule("layerpipe", net, 4, MODEL, LayerPipeOptions(max_staleness=0))
    assert result.metrics.max_staleness == 0
    unbounded = make_schedule("layerpipe", net, 4, MODEL)
    # per sample: an unbounded schedule may unfold several iterations into one period
    assert result.metrics.cycles_per_sample >= unbounded.metrics.cycles_per_sample


# ------------------------------------------------------------------------------------ pipedream family


def test_partition_contiguous_is_min_max() -> None:
    weights = [5, 1, 1, 9, 2, 2, 2, 7]
    runs = partition_contiguous(weights, 3)
    assert [i for run in runs for i in run] == list(range(len(weights)))
    best = min(max(sum(weights[:a]), sum(weights[a:b]), sum(weights[b:]))
               for a in range(1, len(weights)) for b in range(a + 1, len(weights)))
    assert max(sum(weights[i] for i in run) for run in runs) == best


@pytest.mark.parametrize("widths", [[8] * 7, [12, 10, 8, 8, 6, 4]])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_pipedream_lags_agree_with_the_retiming_solution(widths: list[int], n: int) -> None:
    """With the forward block first on every stage each stage crossing costs one lag, which is the
    retiming model of `layerpipe.retiming`: our minimal lags equal its least retiming, and the
    staleness of layer l is its delay D_l = 2·S(l). Its U_l runs D_l iterations behind (the delays sit on
    G_l → U_l and r(U_l) counts from there), ours names U_l by the gradient's iteration: lag + D_l."""
    net = load_network("mlp:" + "-".join(map(str, widths)))
    result = make_schedule("pipedream", net, n, MODEL, STRAIGHT)
    table = TaskTable.of(result.graph, MODEL)  # type: ignore[arg-type]
    stages = stage_layers(table, n)
    stage_of = {layer: s for s, run in enumerate(stages) for layer in run}
    placement = [stage_of[t.layer] for t in table.tasks]
    period = result.metrics.period_cycles
    timing = time_bodies(table, order_bodies(placement, n, block_key(table)), period)
    solution = solve_delays(table.graph, [stage_of[layer.index] for layer in net.layers])
    expected = {t: r + (solution.delays[t.layer] if t.kind == "U" else 0) for t, r in solution.lags.items()}
    assert {t: timing.lag[v] for v, t in enumerate(table.tasks)} == expected
    assert timing.staleness == dict(solution.delays)
    assert all(d == 2 * solution.stages_after(layer) for layer, d in solution.delays.items())


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_pipedream_on_balanced_stages_has_the_papers_staleness_and_versions(n: int) -> None:
    """Weight stashing in 1F1B: stage s of S reads weights S − 1 − s updates old and holds S − s versions
    (the first layer has no E, so it needs no stash)."""
    net = load_network("mlp:" + "-".join(["64"] * 9))
    result = make_schedule("pipedream", net, n, MODEL, STRAIGHT)
    table = TaskTable.of(result.graph, MODEL)  # type: ignore[arg-type]
    for s, layers in enumerate(stage_layers(table, n)):
        for layer in layers:
            assert result.metrics.staleness_per_layer[layer] == n - 1 - s
            assert result.metrics.weight_versions_per_layer[layer] == (1 if layer == 1 else n - s)


def test_pipedream_stashes_fewer_versions_down_the_pipeline() -> None:
    result = make_schedule("pipedream", load_network("mlp:" + "-".join(["16"] * 9)), 4, MODEL, STRAIGHT)
    versions = result.metrics.weight_versions_per_layer
    layers = sorted(versions)
    assert versions[layers[0]] >= versions[layers[-1]] and versions[layers[-1]] <= 2


def test_pipedream_2bw_holds_two_versions_and_updates_once_per_m() -> None:
    """More in tests/test_pipedream_2bw.py; here against the straight pipeline it coalesces."""
    net = load_network("mlp:" + "-".join(["16"] * 9))
    plain = make_schedule("pipedream", net, 4, MODEL, STRAIGHT)
    two = make_schedule("pipedream-2bw", net, 4, MODEL, PipeDream2BWOptions(microbatches=8))
    assert two.metrics.weight_versions == 2 and two.metrics.max_staleness == 1
    assert two.metrics.cycles_per_sample < plain.metrics.cycles_per_sample
    assert two.periodic.unfold == 8 and dict(two.periodic.groups) == {layer: 8 for layer in range(1, 9)}  # type: ignore[union-attr]
    assert two.periodic.costs == plain.periodic.costs  # type: ignore[union-attr]  # one full update per window


# ------------------------------------------------------------------------------------------------- ooo


@pytest.mark.parametrize("g", [1, 2, 3])
def test_ooo_allocates_layers_modulo(g: int) -> None:
    net = load_network("lenet5")
    result = make_schedule("ooo", net, 3, MODEL, OOOOptions(group_size=g, allocation="modulo"))
    assert result.synchronous and result.stages is not None and result.explicit is not None
    position = {layer.index: k for k, layer in enumerate(net.layers)}
    for stage, proc in result.explicit.placement().items():
        for layer in result.stages.layers[stage]:
            assert proc == (position[layer] // g) % 3, (stage, layer)


# ----------------------------------------------------------------------------------------- synchronous


@pytest.mark.parametrize("policy", sorted(SHAPES))
@pytest.mark.parametrize("spec,n", [("mlp:7-6-5-4-3", 2), ("mlp:9-8-8-7-7-6-5-4-3", 3), ("lenet5", 2)])
def test_sync_step_time_equals_the_simulator_on_the_layer_expansion(policy: str, spec: str, n: int) -> None:
    """The step a policy reports is the simulator's steady-state step of the layer-level expansion."""
    net = load_network(spec)
    result = make_schedule(policy, net, n, MODEL)
    m = result.explicit.microbatches  # type: ignore[union-attr]
    procs = sum(1 for row in result.explicit.procs if row)  # type: ignore[union-attr]
    steps = SHAPES[policy].build(procs, m, result.options, 6)
    layer_level = expand_stages(steps, result.graph, result.stages)  # type: ignore[arg-type]
    sim = simulate(layer_level, Workload.of_graph(result.graph, MODEL), SimConfig("shared"))  # type: ignore[arg-type]
    done = sim.completion_times
    assert {int(done[k] - done[k - 1]) for k in range(2, 6)} == {result.metrics.period_cycles}


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 9)])
def test_gpipe_step_is_fill_plus_drain(p: int, m: int) -> None:
    result = schedule_stages("gpipe", p, SyncOptions(microbatches=m), (2, 3, 1))
    assert result.metrics.period_cycles == (m + p - 1) * (2 + 3 + 1)
    validate(result.explicit, stages=result.stages)


def test_zero_bubble_beats_1f1b_with_uniform_costs() -> None:
    one = schedule_stages("1f1b", 4, SyncOptions(microbatches=8), (1, 1, 1)).metrics.period_cycles
    h1 = schedule_stages("zb-h1", 4, policy_options("zb-h1", {"microbatches": 8}), (1, 1, 1)).metrics  # type: ignore[arg-type]
    h2 = schedule_stages("zb-h2", 4, SyncOptions(microbatches=8), (1, 1, 1)).metrics.period_cycles
    assert h2 <= h1.period_cycles < one
    assert h2 == 3 * 8  # the parallelogram: no bubble at all once m >= 2p - 1


# ------------------------------------------------------------------------------- against the simulator


@pytest.mark.parametrize("spec,n", [("lenet5", 3), ("mlp:784-256-128-10", 5), ("resnet18", 4)])
@pytest.mark.parametrize("policy", ["layerpipe", "pipedream"])
def test_simulated_unrolled_schedule_runs_at_the_period_with_no_more_staleness(spec: str, n: int,
                                                                               policy: str) -> None:
    """Run self-timed by the simulator, the unrolled body completes one iteration per period, and no
    F reads older weights than the periodic timing predicts (ops may run early, updates land early)."""
    result = make_schedule(policy, load_network(spec), n, MODEL)
    deepest = max(s.lag for body in result.periodic.bodies for s in body)  # type: ignore[union-attr]
    iterations = (3 * deepest + 12) * result.periodic.unfold  # type: ignore[union-attr]
    sim = simulate(result.periodic.unroll(iterations), Workload.of_graph(result.graph, MODEL),  # type: ignore[union-attr,arg-type]
                   SimConfig("shared"))
    periodic = result.periodic
    assert periodic is not None
    assert sim.cycles_per_iteration == periodic.period / periodic.unfold
    seen: dict[int, int] = {}
    for (kind, layer, t), version in sim.version_map.items():
        if kind == "F" and iterations // 2 < t < iterations - 5:  # staleness in updates (replicas: rounds)
            seen[layer] = max(seen.get(layer, 0), t // periodic.group(layer) - version)
    for layer, predicted in result.metrics.staleness_per_layer.items():
        assert predicted - 1 <= seen[layer] <= predicted


# ---------------------------------------------------------------------------------------- shared passes


@settings(max_examples=100, deadline=None)
@given(data=st.data(), period=st.integers(1, 60))
def test_pack_circular_never_overlaps_modulo_the_period(data, period: int) -> None:
    costs = data.draw(st.lists(st.integers(0, period), min_size=1, max_size=8).filter(lambda c: sum(c) <= period))
    release = sorted(data.draw(st.lists(st.integers(0, period - 1), min_size=len(costs), max_size=len(costs))))
    starts = pack_circular(release, costs, period)
    assert all(0 <= s < period for s in starts)
    busy = [(s, c) for s, c in zip(starts, costs, strict=True) if c > 0]
    for i, (a, ca) in enumerate(busy):
        for b, cb in busy[i + 1:]:
            assert (b - a) % period >= ca and (a - b) % period >= cb
    # unrolled, the tasks run in the given order, each at or after its release, within one period
    unrolled = [starts[0] + (period if starts[0] < release[0] else 0)]
    for k in range(1, len(starts)):
        at = starts[k]
        while at < unrolled[-1] + costs[k - 1]:
            at += period
        unrolled.append(at)
    assert all(u >= r for u, r in zip(unrolled, release, strict=True))
    assert unrolled[-1] + costs[-1] <= unrolled[0] + period

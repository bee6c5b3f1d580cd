"""The schedule IR's shared passes: the dependency function (layer and stage level, asynchronous and
synchronous), stage word counts, and the expansion of stage ops into layer tasks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import (
    Op,
    OpSchedule,
    PeriodicSchedule,
    ScheduleError,
    Slot,
    StageInfo,
    dependencies,
    expand_stages,
    gpipe,
    layer_task_edges,
    one_f_one_b,
    validate,
    zb_h1,
    zb_h2,
)
from tests.strategies import networks, stage_maps


def producers(deps, op: Op) -> set[tuple[str, int, str]]:
    return {(str(d.producer), d.words, d.role) for d in deps[op]}


def stage_layers(stage_map: list[int]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(max(stage_map) + 1)]
    for layer, s in enumerate(stage_map, start=1):
        out[s].append(layer)
    return out


# -------------------------------------------------------------------------------------------- layer level


def test_async_layer_dependencies_follow_the_graph() -> None:
    graph = build_training_graph(load_network("mlp:7-6-5-3"))  # batch 1, stash
    order = graph.intra_iteration_order()
    schedule = OpSchedule("layer", (tuple(Op(0, t.kind, t.layer, it) for it in range(2) for t in order),))
    deps = dependencies(schedule, graph)
    assert producers(deps, Op(0, "F", 2, 1)) == {("F1.1", 6, "activation")}  # not U2.0: a version read
    assert producers(deps, Op(0, "A", 2, 0)) == {("E3.0", 5, "error"), ("F2.0", 5, "kept")}
    assert producers(deps, Op(0, "E", 3, 0)) == {("A3.0", 3, "delta"), ("F3.0", 15, "stash")}
    assert producers(deps, Op(0, "U", 3, 1)) == {("G3.1", 15, "gradient"), ("U3.0", 0, "order")}
    assert producers(deps, Op(0, "U", 3, 0)) == {("G3.0", 15, "gradient")}
    assert producers(deps, Op(0, "F", 1, 0)) == set()
    validate(schedule, graph)


def test_latest_mode_has_no_stash_edge_and_weights_are_not_precedence() -> None:
    graph = build_training_graph(load_network("mlp:7-6-5-3"), GraphOptions(weight_mode="latest"))
    edges = {(e.src, e.dst, e.role) for e in layer_task_edges(graph)}
    assert (("U", 3), ("E", 3), "weights") not in edges
    assert (("F", 3), ("E", 3), "stash") not in edges
    assert (("U", 3), ("U", 3), "order") in edges


def test_missing_producer_is_a_schedule_error() -> None:
    graph = build_training_graph(load_network("mlp:4-3"))
    with pytest.raises(ScheduleError, match=r"missing op: A1\.0 needs F1\.0, which no processor runs"):
        dependencies(OpSchedule("layer", ((Op(0, "A", 1, 0),),)), graph)
    with pytest.raises(InputError, match="need the training graph"):
        dependencies(OpSchedule("layer", ((Op(0, "F", 1, 0),),)))


def test_periodic_unroll_validates_against_the_same_rules() -> None:
    graph = build_training_graph(load_network("mlp:4-3-2"))
    order = graph.intra_iteration_order()
    # Forward tasks on p0, backward and updates on p1 one iteration later: a two-stage pipeline.
    bodies = (
        tuple(Slot(i, t.kind, t.layer, 0) for i, t in enumerate(x for x in order if x.kind == "F")),
        tuple(Slot(i, t.kind, t.layer, 1) for i, t in enumerate(x for x in order if x.kind != "F")),
    )
    periodic = PeriodicSchedule(len(order), bodies, {(t.kind, t.layer): 1 for t in order})
    validate(periodic, graph)
    explicit = periodic.unroll(5)
    assert explicit.num_iterations == 5
    validate(explicit, graph, durations=periodic.costs)


# -------------------------------------------------------------------------------------------- stage level


def test_stage_dependencies_are_torch_rules() -> None:
    schedule = zb_h1(2, 2, steps=2)  # stages 0, 1; I/W split; 2 steps of 2
    info = StageInfo(2, forward_words=(0, 7), backward_words=(9, 0))
    deps = dependencies(schedule, stages=info)
    assert producers(deps, Op(1, "F", 1, 0)) == {("F0.0", 7, "activation")}
    assert producers(deps, Op(1, "I", 1, 1)) == {("F1.1", 0, "kept")}
    assert producers(deps, Op(0, "I", 0, 1)) == {("I1.1", 9, "error"), ("F0.1", 0, "kept")}
    assert producers(deps, Op(0, "W", 0, 0)) == {("I0.0", 0, "kept")}
    # Step 1's forwards wait for the implicit update: every gradient op (W here) of the stage in step 0.
    assert producers(deps, Op(0, "F", 0, 2)) == {("W0.0", 0, "step"), ("W0.1", 0, "step")}
    assert producers(deps, Op(1, "F", 1, 2)) == {("F0.2", 7, "activation"), ("W1.0", 0, "step"), ("W1.1", 0, "step")}
    # Later forwards of the step follow the first one in program order: no need to repeat the edges.
    assert producers(deps, Op(1, "F", 1, 3)) == {("F0.3", 7, "activation")}
    full = dependencies(gpipe(2, 1, steps=2))
    assert producers(full, Op(0, "B", 0, 0)) == {("B1.0", 0, "error"), ("F0.0", 0, "kept")}
    assert producers(full, Op(0, "F", 0, 1)) == {("B0.0", 0, "step")}


def test_stage_words_on_a_chain_and_across_skip_connections() -> None:
    chain = build_training_graph(load_network("mlp:7-6-5-3", batch=2))
    info = StageInfo.of_network(chain, [[1], [2, 3]])
    assert info.forward_words == (0, 2 * 6) and info.backward_words == (2 * 6, 0)
    resnet = build_training_graph(load_network("resnet18"))
    layers = [layer.index for layer in resnet.network.layers]
    cut = len(layers) // 2
    info = StageInfo.of_network(resnet, [layers[:cut], layers[cut:]])
    crossing = [e for e in resnet.edges if e.role == "activation" and e.src.layer <= layers[cut - 1] < e.dst.layer]
    assert info.forward_words[1] == sum(e.words for e in crossing) > 0
    with pytest.raises(InputError, match="are in no stage"):
        StageInfo.of_network(chain, [[1], [2]])


def test_expansion_by_hand() -> None:
    graph = build_training_graph(load_network("mlp:4-3-2"))  # layers 1, 2 (layer 1 has no E)
    info = StageInfo.of_network(graph, [[1, 2]])
    expanded = expand_stages(gpipe(1, 2), graph, info)
    assert " ".join(str(op) for op in expanded.procs[0]) == (
        "F1.0 F2.0 F1.1 F2.1 A2.0 E2.0 G2.0 A1.0 G1.0 A2.1 E2.1 G2.1 A1.1 G1.1 U1.0 U2.0"
    )
    split = expand_stages(zb_h1(1, 1), graph, info)
    assert " ".join(str(op) for op in split.procs[0]) == "F1.0 F2.0 A2.0 E2.0 A1.0 G2.0 G1.0 U1.0 U2.0"
    with pytest.raises(InputError, match="fuses 'AEG'"):
        expand_stages(zb_h1(1, 1), build_training_graph(graph.network, GraphOptions.pipedream()), info)


def test_sync_layer_dependencies_link_steps_through_updates() -> None:
    graph = build_training_graph(load_network("mlp:4-3-2"))
    info = StageInfo.of_network(graph, [[1], [2]])
    expanded = expand_stages(one_f_one_b(2, 2, steps=2), graph, info)
    deps = dependencies(expanded, graph)
    u = Op(1, "U", 2, 1)  # the update of layer 2 in step 1
    assert {str(d.producer) for d in deps[u] if d.role == "gradient"} == {"G2.2", "G2.3"}
    assert {str(d.producer) for d in deps[u] if d.role == "version"} == {"F2.2", "F2.3"}
    assert {str(d.producer) for d in deps[u] if d.role == "order"} == {"U2.0"}
    assert {str(d.producer) for d in deps[Op(1, "F", 2, 2)] if d.role == "weights"} == {"U2.0"}
    assert not [d for d in deps[Op(1, "F", 2, 1)] if d.role == "weights"]  # step 0 reads version 0
    validate(expanded, graph)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_expanded_sync_schedules_validate_on_random_networks(data: st.DataObject) -> None:
    network = data.draw(networks(max_layers=7))
    stage_map = data.draw(stage_maps(network, max_stages=4))
    layers = stage_layers(stage_map)
    graph = build_training_graph(network)
    info = StageInfo.of_network(graph, layers)
    m = data.draw(st.integers(1, 5))
    generator = data.draw(st.sampled_from([gpipe, one_f_one_b, zb_h2]))
    stage_schedule = generator(len(layers), m, steps=2)
    validate(stage_schedule, stages=info)
    expanded = expand_stages(stage_schedule, graph, info)
    validate(expanded, graph)
    tasks = sum(1 for t in graph.tasks if t.kind != "U")
    updates = sum(1 for t in graph.tasks if t.kind == "U")
    assert sum(len(row) for row in expanded.procs) == tasks * 2 * m + updates * 2


def test_step_edges_reach_the_first_forward_on_every_processor() -> None:
    """A stage whose next-step forwards are split over processors: each processor's first one waits."""
    text = "# layerpipe schedule v1 level=stage synchronous microbatches=2\n"
    schedule = OpSchedule.from_text(text + "p0: F0.0 F0.1 B0.0 B0.1 F0.2 B0.2 B0.3\np1: F0.3\n")
    deps = dependencies(schedule)
    assert producers(deps, Op(1, "F", 0, 3)) == {("B0.0", 0, "step"), ("B0.1", 0, "step")}
    assert producers(deps, Op(0, "F", 0, 2)) == {("B0.0", 0, "step"), ("B0.1", 0, "step")}
    validate(schedule)


@st.composite
def weight_read_schedules(draw: st.DrawFn) -> PeriodicSchedule:
    """One layer's F, E and update copies spread over processors and phases, with costs that may be zero (the
    `read_offset` rule's extra cycle), planned transfer delays and designed floors."""
    unfold = draw(st.sampled_from((1, 2, 3, 4, 6)))
    group = draw(st.sampled_from([g for g in (1, 2, 3, 6) if unfold % g == 0]))
    period = draw(st.integers(1, 40))
    procs = draw(st.integers(1, 3))
    bodies: list[list[Slot]] = [[] for _ in range(procs)]
    slot = st.tuples(st.integers(0, period - 1), st.integers(0, 3), st.integers(0, procs - 1))
    for kind, copies in (("F", unfold), ("E", unfold), ("U", unfold // group)):
        for phase in range(copies):
            start, lag, p = draw(slot)
            bodies[p].append(Slot(start, kind, 1, lag, phase))
    costs = {(k, 1): draw(st.integers(0, 5)) for k in ("F", "E", "U")}
    delays = {("F", 1, k) if k else ("F", 1): draw(st.integers(0, 2 * period)) for k in range(unfold)
              if draw(st.booleans())}
    floor = tuple(("F", 1, k, draw(st.integers(-2, 3))) for k in range(unfold) if draw(st.booleans()))
    return PeriodicSchedule(period, tuple(tuple(b) for b in bodies), costs, delays, unfold,
                            ((1, group),) if group > 1 else (), floor)


@pytest.mark.slow  # 300 generated schedules: ~2 s of CPU
@settings(max_examples=300)
@given(weight_read_schedules())
def test_read_pins_on_arrays_are_the_reader_by_reader_rule(schedule: PeriodicSchedule) -> None:
    """`read_pins` computes `latest_update` a layer at a time on arrays; reader by reader gives the same pins, in
    the same order."""
    vectorised, one_by_one = schedule._pins(vectorised=True), schedule._pins(vectorised=False)
    assert vectorised == one_by_one and list(vectorised) == list(one_by_one)
    assert schedule.read_pins() == one_by_one


@pytest.mark.parametrize(("network", "n", "interconnect"), [("lenet5", 4, None), ("resnet18", 9, "links:2:1"),
                                                            ("mlp:784-256-128-10", 7, "bus:2:16")])
def test_planned_starts_on_arrays_are_planned_start_op_by_op(network: str, n: int, interconnect: str | None) -> None:
    """`PeriodicSchedule.planned_starts` (what the compiler reads for every op at once) is `planned_start` of each
    op of the unrolled schedule, unfolded and replicated plans included; a task the bodies do not hold gives None."""
    from layerpipe.costs import PEModel
    from layerpipe.interconnect import parse_interconnect
    from layerpipe.schedule import make_schedule

    model = PEModel()
    kw = {"interconnect": parse_interconnect(interconnect, lanes=model.lanes)} if interconnect else {}
    periodic = make_schedule("layerpipe", load_network(network), n, model, **kw).periodic
    assert periodic is not None
    columns = periodic.unroll(3 * periodic.unfold + 2).as_columns()
    expected = [periodic.planned_start(*columns.tasks[k], t)
                for k, t in zip(columns.task.tolist(), columns.iteration.tolist(), strict=True)]
    assert periodic.planned_starts(columns.tasks, columns.task, columns.iteration) == expected
    assert periodic.planned_starts((*columns.tasks, ("F", 999)), [len(columns.tasks)], [0]) is None

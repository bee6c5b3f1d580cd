"""The validator catches every fault class on hand-made bad schedules, and its error is one summary line with
the step × processor grid (failing step marked `>>`, failing cell in brackets) attached."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.dfg import TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import (
    Op,
    OpSchedule,
    PeriodicSchedule,
    ScheduleError,
    Slot,
    dependencies,
    dry_run,
    format_grid,
    gpipe,
    periodic_staleness,
    validate,
    zb_h1,
)
from tests.strategies import networks


def stage(rows: list[str], m: int) -> OpSchedule:
    text = f"# layerpipe schedule v1 level=stage synchronous microbatches={m}\n"
    return OpSchedule.from_text(text + "".join(f"p{p}: {row}\n" for p, row in enumerate(rows)))


def failure(schedule, *args, **kwargs) -> ScheduleError:
    with pytest.raises(ScheduleError) as info:
        validate(schedule, *args, **kwargs)
    error = info.value
    assert isinstance(error, InputError)  # the CLI maps it to one line and exit 2
    assert "\n" not in str(error)
    assert error.grid and error.grid in error.__notes__
    return error


def marked(error: ScheduleError) -> tuple[str, str]:
    """(the marked row's label, the bracketed cell)."""
    rows = [line for line in error.grid.splitlines() if line.startswith(">>")]
    assert len(rows) == 1, error.grid
    cell = re.search(r"\[([^\]]*)\]", rows[0])
    assert cell, error.grid
    return rows[0].split(":")[0][2:].strip(), cell.group(1)


# ------------------------------------------------------------------------------------------ explicit


def test_good_schedules_pass_and_dry_run_times_them() -> None:
    schedule = stage(["F0.0 F0.1 B0.0 B0.1", "F1.0 B1.0 F1.1 B1.1"], 2)
    times = validate(schedule)
    assert times is not None
    assert times[Op(1, "B", 1, 1)] == (4, 5)
    assert dry_run(schedule, dependencies(schedule), {("F", 0): 2, ("F", 1): 2, ("B", 0): 3, ("B", 1): 3}) == {
        Op(0, "F", 0, 0): (0, 2),
        Op(0, "F", 0, 1): (2, 4),
        Op(1, "F", 1, 0): (2, 4),
        Op(1, "B", 1, 0): (4, 7),
        Op(1, "F", 1, 1): (7, 9),
        Op(0, "B", 0, 0): (7, 10),
        Op(1, "B", 1, 1): (9, 12),
        Op(0, "B", 0, 1): (12, 15),
    }


def test_precedence_on_one_processor_marks_the_consumer() -> None:
    error = failure(stage(["F0.0 F0.1 B0.0 B0.1", "B1.0 F1.0 F1.1 B1.1"], 2))
    assert str(error) == "precedence: B1.0 on p1 (slot 0) needs F1.0, which p1 runs later (slot 1)"
    assert marked(error)[1] == "B1.0"


def test_deadlock_across_processors() -> None:
    # p0 waits for B0.0 (needs B1.0) before F0.1, p1 waits for F1.1 (needs F0.1) before B1.0.
    error = failure(stage(["F0.0 B0.0 F0.1 B0.1", "F1.0 F1.1 B1.0 B1.1"], 2))
    assert str(error).startswith("precedence: deadlock")
    assert marked(error)[1] in {"B0.0", "F1.1"}


def test_step_boundary_is_precedence() -> None:
    """Step 1's forwards read version 1: they must follow the stage's gradient ops of step 0."""
    good = gpipe(2, 2, steps=2)
    validate(good)
    row = list(good.procs[0])
    row[2], row[4] = row[4], row[2]  # F0.2 (step 1) before B0.0 (step 0)
    error = failure(OpSchedule("stage", (tuple(row), good.procs[1]), True, 2))
    assert str(error).startswith("precedence: F0.2 on p0 (slot 2) needs B0.")


def test_missing_op_marks_who_needs_it() -> None:
    error = failure(stage(["F0.0 F0.1 B0.0 B0.1", "F1.0 B1.0 B1.1"], 2))
    assert str(error) == "missing op: B1.1 needs F1.1, which no processor runs"
    assert marked(error)[1] == "B1.1"


def test_missing_op_nobody_needs() -> None:
    error = failure(stage(["F0.0 I0.0", "F1.0 I1.0 W1.0"], 1))
    assert str(error) == "missing op: W0.0 (stage 0 splits micro-batch 0 into I and W)"
    assert marked(error)[1] == "I0.0"
    graph = build_training_graph(load_network("mlp:4-3"))
    error = failure(OpSchedule("layer", ((Op(0, "F", 1, 0), Op(0, "A", 1, 0), Op(0, "G", 1, 0)),)), graph)
    assert str(error) == "missing op: U1.0 — no processor runs it"
    assert marked(error)[1] == "G1.0"


def test_duplicate_op() -> None:
    error = failure(stage(["F0.0 F0.1 B0.0 B0.1", "F1.0 B1.0 F1.1 B1.1 F1.1"], 2))
    assert str(error) == "duplicate: F1.1 runs twice (on p1 and on p1)"
    assert marked(error)[1] == "F1.1"
    error = failure(stage(["F0.0 B0.0 F1.0", "F1.0 B1.0"], 1))
    assert str(error) == "duplicate: F1.0 runs twice (on p0 and on p1)"


def test_b_and_i_for_the_same_microbatch() -> None:
    error = failure(stage(["F0.0 B0.0 I0.0 W0.0"], 1))
    assert "both B and I/W" in str(error)


def test_extra_and_foreign_ops() -> None:
    error = failure(stage(["F0.0 B0.0 F0.1 B0.1"], 2), iterations=1)
    assert str(error).startswith("extra op: F0.1")
    error = failure(OpSchedule("stage", ((Op(0, "F", 0, 0), Op(0, "E", 0, 0)),), True, 1))
    assert "kind 'E' is not one of F, B, I, W" in str(error)
    error = failure(OpSchedule("stage", ((Op(1, "F", 0, 0),),), True, 1))
    assert "listed on p0 but says processor 1" in str(error)


def test_grid_windows_tall_schedules_around_the_mark() -> None:
    good = gpipe(2, 40)
    row = list(good.procs[1])
    row[5], row[45] = row[45], row[5]  # B1.5 before F1.5
    error = failure(OpSchedule("stage", (good.procs[0], tuple(row)), True, 40))
    lines = error.grid.splitlines()
    assert len(lines) < 35 and "   ..." in lines
    assert marked(error)[1] == "B1.5"


def test_errors_survive_pickling() -> None:
    """Design-space sweeps run on dask workers, which send exceptions back pickled."""
    error = failure(stage(["F0.0 F0.1 B0.0 B0.1", "B1.0 F1.0 F1.1 B1.1"], 2))
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ScheduleError and str(copy) == str(error) and copy.grid == error.grid
    with pytest.raises(ScheduleError) as info:
        dependencies(stage(["B0.0"], 1))
    missing = pickle.loads(pickle.dumps(info.value))
    assert str(missing) == str(info.value) and missing.consumer == info.value.consumer


def test_format_grid_marks_row_and_cell() -> None:
    grid = format_grid({(0, 0): "F0.0", (1, 0): "B0.0", (1, 1): "F1.0"}, 2, mark=(1, 1))
    assert grid.splitlines() == [
        "           p0   p1",
        "   step 0: F0.0",
        ">> step 1: B0.0 [F1.0]",
    ]


# ------------------------------------------------------------------------------------------ periodic


@pytest.fixture(scope="module")
def graph() -> TrainingGraph:
    return build_training_graph(load_network("mlp:7-6-5-3"))


def sequential(graph: TrainingGraph, update_lag: int = 0) -> PeriodicSchedule:
    """All tasks on one processor in a topological order; U lags `update_lag` iterations behind."""
    costs = {(t.kind, t.layer): c for t, c in graph.costs(make_cost_model("macs")).items()}
    start, body = 0, []
    for task in graph.intra_iteration_order():
        body.append(Slot(start, task.kind, task.layer, update_lag if task.kind == "U" else 0))
        start += costs[(task.kind, task.layer)]
    return PeriodicSchedule(start, (tuple(body),), costs)


def replace_slot(schedule: PeriodicSchedule, kind: str, layer: int, **changes) -> PeriodicSchedule:
    body = []
    for s in schedule.bodies[0]:
        if (s.kind, s.layer) == (kind, layer):
            s = Slot(changes.get("start", s.start), s.kind, s.layer, changes.get("lag", s.lag))
        body.append(s)
    return PeriodicSchedule(schedule.period, (tuple(body),), schedule.costs)


def test_sequential_periodic_schedule_passes(graph: TrainingGraph) -> None:
    schedule = sequential(graph)
    validate(schedule, graph, max_staleness=0)
    assert periodic_staleness(schedule, graph) == {1: 0, 2: 0, 3: 0}
    validate(schedule.unroll(4), graph, durations=schedule.costs, max_staleness=0)


def test_periodic_overlap_and_too_much_work(graph: TrainingGraph) -> None:
    base = sequential(graph)
    error = failure(replace_slot(base, "F", 2, start=1), graph)
    assert str(error).startswith("overlap: on p0, F2-0@1 overlaps F1-0@0")
    assert marked(error) == ("@1", "F2-0@1")
    error = failure(PeriodicSchedule(base.period - 1, base.bodies, base.costs), graph)
    assert str(error) == f"overlap: p0 has more work than the period {base.period - 1}"


def test_periodic_body_may_wrap_past_the_period(graph: TrainingGraph) -> None:
    base = sequential(graph)
    shifted = tuple(Slot(s.start + base.period - 10, s.kind, s.layer, s.lag) for s in base.bodies[0])
    validate(PeriodicSchedule(base.period, (shifted,), base.costs), graph)


def test_periodic_precedence(graph: TrainingGraph) -> None:
    base = sequential(graph)
    f2 = next(s for s in base.bodies[0] if (s.kind, s.layer) == ("F", 2))
    f3 = next(s for s in base.bodies[0] if (s.kind, s.layer) == ("F", 3))
    f3_cost = base.costs[("F", 3)]
    swapped = replace_slot(replace_slot(base, "F", 2, start=f2.start + f3_cost), "F", 3, start=f2.start)
    assert f3.start == f2.start + base.costs[("F", 2)]
    error = failure(swapped, graph)
    assert str(error).startswith("precedence: F3 (p0, lag 0, start 42) starts before F2")
    # U1 alone on a second processor at the start of the period: it would apply g1 before G1 computed it.
    u1 = next(s for s in base.bodies[0] if (s.kind, s.layer) == ("U", 1))
    rest = tuple(s for s in base.bodies[0] if s != u1)
    error = failure(PeriodicSchedule(base.period, (rest, (Slot(0, "U", 1, 0),)), base.costs), graph)
    assert str(error).startswith("precedence: U1 (p1, lag 0, start 0) starts before G1")
    assert marked(error) == ("@0", "U1-0@0")
    # One iteration later it is fine, and a link latency of a whole period breaks it again.
    later = PeriodicSchedule(base.period, (rest, (Slot(0, "U", 1, 1),)), base.costs)
    validate(later, graph)
    failure(later, graph, comm=lambda words: base.period)


def test_periodic_negative_lag(graph: TrainingGraph) -> None:
    error = failure(replace_slot(sequential(graph), "F", 1, lag=-1), graph)
    assert str(error).startswith("lag: slot F1--1@0 on p0 has a negative lag")


def test_periodic_counts(graph: TrainingGraph) -> None:
    base = sequential(graph)
    missing = PeriodicSchedule(base.period, (base.bodies[0][:-1],), base.costs)
    assert str(failure(missing, graph)).startswith("missing op: task U1")
    twice = PeriodicSchedule(base.period, (base.bodies[0], (base.bodies[0][0],)), base.costs)
    assert str(failure(twice, graph)) == "duplicate: task F1 is in the bodies of p0 and p1"


def test_staleness_bound_periodic_and_explicit_agree(graph: TrainingGraph) -> None:
    late = sequential(graph, update_lag=2)
    assert periodic_staleness(late, graph) == {1: 2, 2: 2, 3: 2}
    validate(late, graph, max_staleness=2)
    error = failure(late, graph, max_staleness=1)
    assert str(error) == "staleness: F1 reads weights 2 updates old > bound 1"
    assert marked(error)[1] == "F1-0@0"
    unrolled = late.unroll(6)
    validate(unrolled, graph, durations=late.costs, max_staleness=2)
    error = failure(unrolled, graph, durations=late.costs, max_staleness=1)
    assert str(error).startswith("staleness: F1.2 on p0 reads version 0, staleness 2 > bound 1")


def test_sync_stage_schedule_of_torch_shape_passes() -> None:
    validate(zb_h1(4, 8, 2, steps=2))


# ------------------------------------------------------------------ issue 12: zero-cost tasks never deadlock


def _with_flattens(draw, body):
    """`body` rebuilt with weightless layers — flattens (0 cycles under `macs`) and activations — first and
    between its linear layers, like lenet5's flatten between its convolutions and linears."""
    from layerpipe.network import Activation, Flatten, Linear, NetworkBuilder

    builder = NetworkBuilder("zero-cost", body.input_shape, body.batch)
    prev = "input"
    if draw(st.booleans()):
        builder.add("w0", Flatten() if draw(st.booleans()) else Activation("relu"), [prev])
        prev = "w0"
    for layer in body.layers:
        builder.add(f"l{layer.index}", Linear(layer.out_shape[0], activation="relu"), [prev])
        prev = f"l{layer.index}"
        for k in range(draw(st.integers(0, 2))):
            builder.add(f"f{layer.index}.{k}", Flatten(), [prev])
            prev = f"f{layer.index}.{k}"
    return builder.build()


ASYNC_POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "optimal")


def _schedule_validate_simulate(network, n: int, policy: str, model) -> None:
    from layerpipe.schedule import make_schedule
    from layerpipe.sim import SimConfig, Workload, simulate

    try:
        result = make_schedule(policy, network, n, model)
    except InputError as exc:  # the exact policy refuses graphs above its size limit, and only those
        assert policy == "optimal" and "limit is" in str(exc), exc
        return
    assert result.periodic is not None and result.graph is not None
    validate(result.periodic, result.graph)
    ops = result.ops(3 * result.periodic.unfold + 4)
    validate(ops, result.graph, durations=result.periodic.costs)  # the unrolled order admits an execution
    sim = simulate(ops, Workload.of_graph(result.graph, model), SimConfig("shared"))  # raises on deadlock
    assert sim.total_cycles > 0


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 16), policy=st.sampled_from(ASYNC_POLICIES),
       model=st.sampled_from(["macs", "pe0"]))
def test_schedules_with_zero_cost_tasks_validate_unroll_and_run(data, n: int, policy: str, model: str) -> None:
    """Issue 12 item 1 as a class: flatten (0 cycles under `macs`) and `pe --overhead 0` ops start in the
    same cycle as their consumers; the one tie order (`tie_rank`) keeps unroll, both validators and the
    simulator in agreement, so schedule → validate → simulate never deadlocks, for every asynchronous policy."""
    body = data.draw(networks(max_layers=5, max_width=10, dag=False))
    network = _with_flattens(data.draw, body)
    cost = make_cost_model("macs") if model == "macs" else make_cost_model("pe", lanes=4, overhead=0)
    _schedule_validate_simulate(network, n, policy, cost)


@pytest.mark.parametrize("policy", ASYNC_POLICIES)
def test_issue_12_example_lenet5_under_macs_runs(policy: str) -> None:
    """`layerpipe simulate lenet5 --policy P -n 4 --cost-model macs` deadlocked for these policies."""
    _schedule_validate_simulate(load_network("lenet5"), 4, policy, make_cost_model("macs"))


def test_zero_cost_producer_at_its_consumers_start_unrolls_producer_first() -> None:
    """E of a flatten (0 cycles) feeds A of the layer before it; packed on one processor both start at the
    same cycle. Sorting ties by (layer, kind) ran A1 first — the explicit validator then rejected the
    unrolled schedule the periodic validator had accepted. `tie_rank` runs E2 first."""
    from layerpipe.network import Flatten, Linear, NetworkBuilder
    from layerpipe.schedule._bodies import contiguous_starts
    from layerpipe.schedule._comm_timing import minimal_lags
    from layerpipe.schedule._ir import tie_rank
    from layerpipe.schedule._task_table import TaskTable
    from layerpipe.schedule._unfold import periodic_of

    builder = NetworkBuilder("flat", (4,), 1)
    builder.add("a", Linear(3, activation="relu"), ["input"])
    builder.add("flat", Flatten(), ["a"])
    builder.add("b", Linear(2), ["flat"])
    graph = build_training_graph(builder.build())
    model = make_cost_model("macs")
    table = TaskTable.of(graph, model)
    body = [sorted(table.topo, key=lambda v: tie_rank(table.tasks[v].kind, table.tasks[v].layer))]
    start = contiguous_starts(body, table.cost)
    schedule = periodic_of(table, [0] * len(table), start, minimal_lags(table, start, 10**6), 10**6, 1)
    where = {(t.kind, t.layer): start[v] for v, t in enumerate(table.tasks)}
    assert where[("E", 2)] == where[("A", 1)] and table.cost[table.tasks.index(graph.task_of(2, "E"))] == 0
    validate(schedule, graph)
    ops = schedule.unroll(3)
    row = [str(op) for op in ops.procs[0]]
    assert row.index("E2.0") < row.index("A1.0")
    validate(ops, graph)

"""A shorter run's compiled schedule cut out of a longer one's (`layerpipe.sim._restrict.restricted_compile`, used
by `simulate_policy_runs` for explore's K-iteration run beside its 2K one) is what compiling it gives: the same
numbering, tasks, costs, producers, words, roles and planned starts — or None, never something else.

Generated networks and policies (periodic, unfolded and grouped, synchronous), any pair of run lengths (whole
periods and steps or not, the shorter first or not), and schedules that are not a cut of the longer one.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.schedule._engine import CompiledSchedule
from layerpipe.schedule._layerpipe import LayerPipeOptions
from layerpipe.schedule._periodic import PeriodicSchedule, Slot
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import (
    SimConfig,
    SimResult,
    compile_schedule,
    policy_ops,
    simulate_policy_result,
    simulate_policy_runs,
)
from layerpipe.sim._restrict import restricted_compile, shorter_ops, shorter_schedule
from tests.strategies import networks

POLICIES = ("layerpipe", "layerpipe-unfold", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "zb-h1", "ooo")
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
    if policy == "layerpipe-unfold":  # J = 2 iterations per period
        return make_schedule("layerpipe", network, num_procs, model, LayerPipeOptions(unfold=2), spec)
    return make_schedule(policy, network, num_procs, model, policy_options(policy, {}), spec)


@st.composite
def periodic_schedules(draw: st.DrawFn) -> PeriodicSchedule:
    """A random periodic schedule (unrolling reads no dependencies): unfolded by J, update groups g | J, slots of
    distinct (kind, layer, phase) with random starts (ties too) and lags, on 1–3 processors."""
    unfold = draw(st.sampled_from((1, 2, 3, 4)))
    layers = draw(st.integers(1, 3))
    groups = tuple((layer, g) for layer in range(layers)
                   if (g := draw(st.sampled_from([d for d in (1, 2, 3, 4) if unfold % d == 0]))) > 1)
    group = dict(groups)
    procs = draw(st.integers(1, 3))
    bodies: list[list[Slot]] = [[] for _ in range(procs)]
    for layer in range(layers):
        for kind in ("F", "A", "E", "G", "U"):
            for phase in range(unfold // group.get(layer, 1) if kind == "U" else unfold):
                slot = Slot(draw(st.integers(0, 7)), kind, layer, draw(st.integers(0, 3)), phase)
                bodies[draw(st.integers(0, procs - 1))].append(slot)
    return PeriodicSchedule(8, tuple(tuple(body) for body in bodies), unfold=unfold, groups=groups)


@settings(max_examples=300, deadline=None)
@given(schedule=periodic_schedules(), shorter=st.integers(1, 12), extra=st.integers(0, 12))
def test_cut_unroll_is_the_unroll(schedule: PeriodicSchedule, shorter: int, extra: int) -> None:
    """`shorter_schedule` of any periodic schedule (unfolded, grouped updates, tied starts) is its `unroll`."""
    result = SimpleNamespace(periodic=schedule, explicit=None)
    cut = shorter_schedule(result, schedule.unroll(shorter + extra), shorter)  # type: ignore[arg-type]
    assert cut is not None  # every task runs in the first period
    _same_schedule(cut, schedule.unroll(shorter))


@SETTINGS
@given(network=networks(max_layers=5), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 4),
       interconnect=st.sampled_from(INTERCONNECTS), shorter=st.integers(1, 12), extra=st.integers(0, 12),
       mode=st.sampled_from(("stash", "latest")), pe=st.booleans(), plan=st.booleans())
def test_cut_is_the_compiled_schedule(network, policy, num_procs, interconnect, shorter, extra, mode, pe,
                                      plan) -> None:
    model = PEModel(lanes=2) if pe else MacsModel()
    result = _result(network, policy, num_procs, interconnect, model)
    longer_ops, workload = policy_ops(result, network, model, shorter + extra, mode)
    longer = _compiled(longer_ops, workload)
    if longer is None:
        return  # an unfolded schedule cut mid-period can miss a producer: compiling it says so (no cut to make)
    if plan:  # computed, as a run on links (its transfers) or a bus (its planned starts) does: the cut cuts them
        assert longer.link_plan is not None
        longer.__dict__.setdefault("plan_time", longer.plan_time)
    schedule, _ = policy_ops(result, network, model, shorter, mode)
    cut = restricted_compile(longer, schedule, workload)
    direct = _compiled(schedule, workload)
    if direct is None:  # compiling the shorter run raises (a producer it lacks): never a cut of it either
        assert cut is None
        event("shorter run not compiled: no cut")
        return
    if cut is not None:  # and given the positions of a cut of the longer run's ops, where it is one
        ops_cut = shorter_ops(result, longer_ops, shorter)
        if ops_cut is not None:
            given_positions = restricted_compile(longer, ops_cut[0], workload, ops_cut[1])
            assert given_positions is not None
            _same(given_positions, compile_schedule(ops_cut[0], workload))
    note(f"{policy} p={num_procs} {interconnect} {shorter}+{extra}: cut {'made' if cut is not None else 'refused'}")
    event(f"{policy}: cut {'made' if cut is not None else 'refused'}")
    if cut is not None:
        event(f"planned starts {'cut' if cut.__dict__.get('plan_time') is not None else 'not cut'}")
        _same(cut, direct)
    # And the other way round: a longer schedule is never a cut of a shorter one.
    if extra:
        assert restricted_compile(direct, longer_ops, workload) is None


def _compiled(schedule, workload) -> CompiledSchedule | None:
    """`compile_schedule`, or None where it raises (a missing producer: J-unfolded schedules unrolled for a number of
    iterations that is not a multiple of J can miss one)."""
    try:
        return compile_schedule(schedule, workload)
    except InputError:
        return None


def _same_schedule(a, b) -> None:
    """Two schedules of columns alike: fields, rows, tasks and their numbering, iterations."""
    assert a == b  # every field, and the ops
    x, y = a.columns, b.columns
    assert x.bounds == y.bounds and x.tasks == y.tasks
    assert np.array_equal(x.task, y.task) and np.array_equal(x.iteration, y.iteration)


@SETTINGS
@given(network=networks(max_layers=5), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 4),
       interconnect=st.sampled_from(INTERCONNECTS), shorter=st.integers(1, 12), extra=st.integers(0, 12),
       whole=st.booleans())
def test_cut_ops_are_the_policy_ops(network, policy, num_procs, interconnect, shorter, extra, whole) -> None:
    """`shorter_schedule` is `policy_ops`' schedule of the shorter run, or None."""
    model = MacsModel()
    result = _result(network, policy, num_procs, interconnect, model)
    if whole and result.explicit is not None:  # whole steps, as explore asks
        m = max(result.explicit.microbatches, 1)
        shorter, extra = shorter * m, extra * m
    longer, _ = policy_ops(result, network, model, shorter + extra)
    cut = shorter_schedule(result, longer, shorter)
    event(f"{policy}: ops {'cut' if cut is not None else 'refused'}")
    if cut is not None:
        _same_schedule(cut, policy_ops(result, network, model, shorter)[0])
    if extra:
        assert shorter_schedule(result, policy_ops(result, network, model, shorter)[0], shorter + extra) is None


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
    cut_ops = shorter_schedule(result, longer_ops, k)
    assert cut_ops is not None
    _same_schedule(cut_ops, schedule)
    longer = compile_schedule(longer_ops, workload)
    assert longer.link_plan is not None
    cut = restricted_compile(longer, schedule, workload)
    assert cut is not None and "link_plan" in cut.__dict__
    ops_cut = shorter_ops(result, longer_ops, k)  # as simulate_policy_runs cuts them: with the positions
    assert ops_cut is not None
    given_positions = restricted_compile(longer, ops_cut[0], workload, ops_cut[1])
    assert given_positions is not None
    _same(given_positions, compile_schedule(schedule, workload))
    _same(cut, compile_schedule(schedule, workload))


@SETTINGS
@given(network=networks(max_layers=4), policy=st.sampled_from(POLICIES), num_procs=st.integers(1, 3),
       interconnect=st.sampled_from(INTERCONNECTS), lengths=st.lists(st.integers(1, 10), min_size=1, max_size=4))
def test_simulated_runs_are_unchanged(network, policy, num_procs, interconnect, lengths) -> None:
    """`simulate_policy_runs` (the shorter runs cut out of the longest) times every op of every run as
    `simulate_policy_result` does for that run alone, and raises what the first failing run alone raises."""
    model = MacsModel()
    result = _result(network, policy, num_procs, interconnect, model)
    config = SimConfig.of(parse_interconnect(interconnect, lanes=1))

    def alone(k: int) -> SimResult | str:  # the run, or the error it raises
        try:
            return simulate_policy_result(result, network, model, k, config)
        except InputError as error:
            return str(error)

    fresh = [alone(k) for k in lengths]
    try:
        runs: list[SimResult] | str = simulate_policy_runs(result, network, model, lengths, config)
    except InputError as error:
        runs = str(error)
    if isinstance(runs, str):
        assert runs in {f for f in fresh if isinstance(f, str)}  # one of the runs alone fails so
        return
    for run, single in zip(runs, fresh, strict=True):
        assert not isinstance(single, str)
        assert np.array_equal(run.start, single.start) and np.array_equal(run.end, single.end)
        assert np.array_equal(run.versions, single.versions)
        assert run.peak_memory_words == single.peak_memory_words
        assert run.cycles_per_iteration == single.cycles_per_iteration


def test_no_cut_of_a_run_compiling_refuses() -> None:
    """A J = 2 unfolded schedule unrolled for one iteration lacks a producer (E2.0 reads U2.1): compiling raises,
    and no cut of the two-iteration run is made for it (its producer is not among the kept ops)."""
    from layerpipe.network import Add, Linear, NetworkBuilder

    builder = NetworkBuilder("residual", (1,), 1)
    builder.add("fc0", Linear(2, bias=False, activation="relu"))
    builder.add("b1.fc0", Linear(1, bias=False, activation="relu"))
    builder.add("b1.fc1", Linear(2, bias=False, activation="relu"))
    builder.add("b1.add", Add(activation="relu"), inputs=["b1.fc1", "fc0"])
    builder.add("fc4", Linear(1, bias=False, activation="relu"))
    network, model = builder.build(), MacsModel()
    result = _result(network, "layerpipe-unfold", 2, "shared", model)
    longer_ops, workload = policy_ops(result, network, model, 2, "latest")
    schedule, _ = policy_ops(result, network, model, 1, "latest")
    assert _compiled(schedule, workload) is None
    assert restricted_compile(compile_schedule(longer_ops, workload), schedule, workload) is None


@pytest.mark.parametrize("policy", ["pipedream", "1f1b"])
def test_a_cut_keeps_its_producers_or_says_not(policy: str) -> None:
    """`keeps_producers` (what `simulate_policy_pair` checks before reading a shorter run's times off a longer run,
    without compiling the cut): true of the cut `shorter_ops` makes — and `restricted_compile` of it compiles what
    compiling the shorter run gives — false once a producer of a kept op is left out, and false when the schedule's
    rule fields differ from the longer run's."""
    from layerpipe.network import load_network
    from layerpipe.sim._restrict import keeps_producers

    network, model = load_network("mlp:16-12-8-4"), MacsModel()
    result = _result(network, policy, 3, "links:1:1", model)
    longer_ops, workload = policy_ops(result, network, model, 12)
    longer = compile_schedule(longer_ops, workload)
    cut = shorter_ops(result, longer_ops, 6)
    assert cut is not None
    schedule, positions = cut
    assert keeps_producers(longer, schedule, workload, positions)
    compiled = restricted_compile(longer, schedule, workload, positions)
    assert compiled is not None
    _same(compiled, compile_schedule(policy_ops(result, network, model, 6)[0], workload))
    # Leave out the producer of some kept op's first input: that op's producers are no longer all kept.
    ptr = np.asarray(longer.prod_ptr, dtype=np.int64)
    kept_with_input = [int(i) for i in positions if ptr[i + 1] > ptr[i]]
    producer = int(longer.prod_idx[ptr[kept_with_input[-1]]])
    assert not keeps_producers(longer, schedule, workload, positions[positions != producer])
    other = SimpleNamespace(**{name: getattr(schedule, name) for name in
                               ("level", "synchronous", "microbatches", "read_staleness", "unfold", "groups",
                                "read_phases", "read_floor", "columns")})
    other.microbatches = schedule.microbatches + 1
    assert not keeps_producers(longer, other, workload, positions)  # type: ignore[arg-type]

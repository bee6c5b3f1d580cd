"""The C kernels (`layerpipe/schedule/_kernels.c`, loaded by `layerpipe.schedule._native`) against the Python code they
stand in for. The sweep: every op's start and end on generated schedules — policies' layer-level runs on generated
networks, stage-level programs with random costs — on `shared`, `links` and `rtl` (a bus is never timed by it),
deadlocks reported as before, and the cases where it must not run (not built, a stale library, LAYERPIPE_NATIVE=0,
negative durations, times past int64) falling back to the Python engine with the same times. The rules: every
compiled schedule's producers, words and roles, as `_deps._apply` gives them (synchronous, grouped and stage-level
rule tables, cut-off groups and steps, alternative tasks), and the pairs and the link plan made from them.

The library is built here with the machine's C compiler when setup.sh has not built it; without a compiler these
tests skip (the Python engine is then the only one, and every other test runs it)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.schedule import OpSchedule, _native, _stage_programs, make_schedule, policy_options
from layerpipe.schedule._engine import compile_schedule, run_timing
from layerpipe.schedule._op_sweep import _sweep
from layerpipe.sim import DeadlockError, SimConfig, Workload, policy_ops
from tests.strategies import networks

POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "zb-h1", "ooo")
INTERCONNECTS = ("shared", "links:1:1", "links:2:1/4", "links:0:3", "rtl")


#: Stage-level programs of every shape (processors, micro-batches per step).
STAGE_GENERATORS = {
    "gpipe": lambda p, m: _stage_programs.gpipe(p, m, 2),
    "1f1b": lambda p, m: _stage_programs.one_f_one_b(p, m, 3),
    "zb-h1": lambda p, m: _stage_programs.zb_h1(p, m, 1, 2),
    "interleaved": lambda p, m: _stage_programs.interleaved_1f1b(p, m, 2, 2),
    "dualpipev": lambda p, m: _stage_programs.dualpipev(p, 2 * m),
}


def _both(monkeypatch: pytest.MonkeyPatch, compute: Callable[[], object]) -> tuple[object, object]:
    """`compute()` with the C kernels, then with their Python versions; an InputError as its message (a run too
    short for an unfolded schedule's grouped updates raises one either way)."""

    def outcome() -> object:
        try:
            return compute()
        except InputError as error:
            return str(error)

    native = outcome()
    with monkeypatch.context() as m:
        m.setattr(_native, "_loaded", [None])
        return native, outcome()


@pytest.fixture(scope="module", autouse=True)
def built() -> Iterator[None]:
    if _native.library() is None:
        try:
            _native.build()
        except OSError as exc:  # no C compiler here: the Python engine is the only one
            pytest.skip(str(exc))
    assert _native.library() is not None, "the C sweep was built but does not load"
    yield


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Python engine alone, as without the library."""
    monkeypatch.setattr(_native, "_loaded", [None])
    yield


def _times(compiled, kind: str, latency: int = 0, wpc: object = 1) -> tuple[list[int], list[int]]:
    start, end = run_timing(compiled, kind, latency, wpc)  # type: ignore[arg-type]
    return start.tolist(), end.tolist()


def _python_times(monkeypatch: pytest.MonkeyPatch, compiled, kind: str, latency: int = 0,
                  wpc: object = 1) -> tuple[list[int], list[int]]:
    with monkeypatch.context() as m:
        m.setattr(_native, "_loaded", [None])
        return _times(compiled, kind, latency, wpc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(network=networks(max_layers=5, dag=True, max_width=12), policy=st.sampled_from(POLICIES),
       num_procs=st.integers(1, 5), interconnect=st.sampled_from(INTERCONNECTS), iterations=st.integers(1, 10))
def test_a_policys_run_is_timed_alike_by_both_engines(monkeypatch: pytest.MonkeyPatch, network, policy: str,
                                                      num_procs: int, interconnect: str, iterations: int) -> None:
    model = MacsModel()
    spec = parse_interconnect(interconnect, lanes=1)
    result = make_schedule(policy, network, num_procs, model, policy_options(policy, {}), spec)
    compiled = compile_schedule(*policy_ops(result, network, model, iterations))
    config = SimConfig.of(spec)
    args = (config.interconnect, config.link_latency, config.link_words_per_cycle)
    assert _times(compiled, *args) == _python_times(monkeypatch, compiled, *args)


@pytest.mark.parametrize("name", sorted(STAGE_GENERATORS))
@pytest.mark.parametrize("kind", ["shared", "links"])
def test_stage_programs_with_random_costs_are_timed_alike(monkeypatch: pytest.MonkeyPatch, name: str,
                                                          kind: str) -> None:
    rng = random.Random(f"{name}-{kind}")
    for _ in range(6):
        procs, micro = rng.randint(2, 6), rng.randint(1, 6)
        schedule = STAGE_GENERATORS[name](procs, procs * micro)
        stages = 1 + max(op.unit for op in schedule.ops())
        costs = [(rng.randint(0, 9), rng.randint(1, 9), rng.randint(0, 5)) for _ in range(stages)]
        compiled = compile_schedule(schedule, Workload.of_stages(costs))
        latency = rng.randint(0, 4)
        assert _times(compiled, kind, latency, 1) == _python_times(monkeypatch, compiled, kind, latency, 1)
        if kind == "shared":  # and the op-by-op sweep, the reference of every engine
            assert _times(compiled, kind) == tuple(_sweep(compiled, compiled.prods))


@pytest.mark.parametrize("kind", ["shared", "links"])
def test_a_deadlock_is_reported_as_the_python_sweep_reports_it(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A backward before the forward it needs, on another processor: the C sweep stops, the Python sweep reports."""
    text = ("# layerpipe schedule v1 level=stage procs=2 synchronous microbatches=2\n"
            "p0: F0.0 F0.1 B0.0 B0.1\np1: B1.0 F1.0 F1.1 B1.1\n")
    compiled = compile_schedule(OpSchedule.from_text(text), Workload.of_stages([(1, 2, 0), (1, 2, 0)]))
    bounds, dur = compiled.bounds, compiled.dur_array()
    assert _native.sweep(bounds, dur, compiled.prod_ptr, compiled.prod_idx) is None  # it stopped: blocked
    with pytest.raises(DeadlockError) as native:
        run_timing(compiled, kind)
    with monkeypatch.context() as m:
        m.setattr(_native, "_loaded", [None])
        with pytest.raises(DeadlockError) as python:
            run_timing(compiled, kind)
    assert str(native.value) == str(python.value) and native.value.blocked == python.value.blocked


def _compiled_fields(compiled) -> tuple[object, ...]:
    """Every array compiling gives, with its dtype, and the pairs and the link plan made from them."""
    plan = compiled.link_plan
    return (compiled.bounds, compiled.tasks, compiled.cost, compiled.roles, plan.bounds, *(
        (array.dtype.str, array.tolist())
        for array in (*(getattr(compiled, name) for name in ("task", "iteration", "prod_ptr", "prod_idx",
                                                              "prod_words", "prod_role")),
                      *compiled.pairs,
                      *(getattr(plan, name) for name in ("input_ptr", "input_src", "send_producer", "send_input",
                                                         "send_link", "word_array")))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(network=networks(max_layers=5, dag=True, max_width=12),
       policy=st.sampled_from((*POLICIES, "layerpipe-unfold")), num_procs=st.integers(1, 5),
       iterations=st.integers(1, 13))
def test_the_rules_give_every_compiled_schedule_the_same_dependencies(monkeypatch: pytest.MonkeyPatch, network,
                                                                      policy: str, num_procs: int,
                                                                      iterations: int) -> None:
    """Compiling a policy's run of any length (whole steps and groups or not) gives the same arrays, dtypes
    included, with the C rules as with `_apply`'s numpy (LayerPipe unfolded by 2: grouped updates), and the same
    pairs and link plan from C as from numpy's sorts."""
    from layerpipe.schedule._layerpipe import LayerPipeOptions

    model = MacsModel()
    options = (LayerPipeOptions(unfold=2) if policy == "layerpipe-unfold"
               else policy_options(policy, {}))
    name = "layerpipe" if policy == "layerpipe-unfold" else policy
    result = make_schedule(name, network, num_procs, model, options)
    schedule, workload = policy_ops(result, network, model, iterations)
    native, python = _both(monkeypatch, lambda: _compiled_fields(compile_schedule(schedule, workload)))
    assert native == python


@pytest.mark.parametrize("name", sorted(STAGE_GENERATORS))
def test_stage_level_rules_give_the_same_dependencies(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from layerpipe.schedule._deps import DependencyArrays, dependency_arrays

    for procs, micro in ((2, 2), (3, 4), (4, 3)):
        schedule = STAGE_GENERATORS[name](procs, procs * micro)
        stages = 1 + max(op.unit for op in schedule.ops())
        workload = Workload.of_stages([(3, 4, 2)] * stages)
        compiled = compile_schedule(schedule, workload)
        args = (schedule, compiled.tasks, compiled.task, compiled.iteration)
        native, python = _both(monkeypatch, lambda: dependency_arrays(*args, stages=workload.stages))  # noqa: B023 - called now
        assert isinstance(native, DependencyArrays) and isinstance(python, DependencyArrays)
        assert native.roles == python.roles
        for field in ("ptr", "producer", "words", "role"):
            a, b = getattr(native, field), getattr(python, field)
            assert (a.dtype.str, a.tolist()) == (b.dtype.str, b.tolist()), field


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(network=networks(max_layers=5, dag=True, max_width=12),
       policy=st.sampled_from((*POLICIES, "layerpipe-unfold")), num_procs=st.integers(1, 5),
       interconnect=st.sampled_from(("shared", "links:1:1", "rtl", "bus:1:2")),
       mode=st.sampled_from(("stash", "latest", "ema")), iterations=st.integers(1, 12))
def test_peak_memory_is_the_same_from_c(monkeypatch: pytest.MonkeyPatch, network, policy: str, num_procs: int,
                                        interconnect: str, mode: str, iterations: int) -> None:
    """`peak_memory` of a simulated layer-level run (shared: one copy per weight; elsewhere every reader's own, and
    `ema`'s buffer where the backward readers are) from `lp_peaks` as from numpy, every processor."""
    from layerpipe.schedule._layerpipe import LayerPipeOptions
    from layerpipe.sim import simulate_policy_result

    model = MacsModel()
    spec = parse_interconnect(interconnect, lanes=1)
    options = LayerPipeOptions(unfold=2) if policy == "layerpipe-unfold" else policy_options(policy, {})
    result = make_schedule("layerpipe" if policy == "layerpipe-unfold" else policy, network, num_procs, model,
                           options, spec)
    config = SimConfig.of(spec, mode=mode)
    # The peaks are computed when read: read within `_both`, each with its own engine.
    native, python = _both(monkeypatch, lambda: simulate_policy_result(result, network, model, iterations,
                                                                       config).peak_memory_words)
    assert native == python


@pytest.mark.parametrize("mode", ["stash", "latest", "ema"])
@pytest.mark.parametrize("interconnect", ["shared", "links:1:1"])
def test_peak_memory_of_zoo_runs_is_the_same_from_c(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                    interconnect: str) -> None:
    """The same on fixed runs that hold weights where only their forwards read them (LayerPipe on 2-4 processors:
    on links, a processor without the layer's backward readers holds no `ema` buffer), every policy kind."""
    from layerpipe.network import load_network
    from layerpipe.sim import simulate_policy_result

    model = MacsModel()
    spec = parse_interconnect(interconnect, lanes=1)
    config = SimConfig.of(spec, mode=mode)
    for name in ("mlp:16-12-8-4", "lenet5"):
        network = load_network(name)
        for policy in ("layerpipe", "pipedream", "1f1b", "zb-h1"):
            for num_procs in (2, 3, 4):
                result = make_schedule(policy, network, num_procs, model, policy_options(policy, {}), spec)
                native, python = _both(monkeypatch, lambda: simulate_policy_result(
                    result, network, model, 8, config).peak_memory_words)  # noqa: B023 - called now
                assert native == python, (name, policy, num_procs)


def _mlp_run(kind: str = "shared"):
    from layerpipe.network import load_network

    network, model = load_network("mlp:16-12-8-4"), MacsModel()
    result = make_schedule("1f1b", network, 3, model, policy_options("1f1b", {}), parse_interconnect(kind, lanes=1))
    return compile_schedule(*policy_ops(result, network, model, 12))


def test_it_does_not_run_where_it_must_not(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _mlp_run()
    bounds, dur, ptr, src = compiled.bounds, compiled.dur_array(), compiled.prod_ptr, compiled.prod_idx
    timed = _native.sweep(bounds, dur, ptr, src)
    assert timed is not None
    assert (timed[0].tolist(), timed[1].tolist()) == _python_times(monkeypatch, compiled, "shared")
    assert _native.sweep(bounds, -dur, ptr, src) is None  # a negative duration: its -1 "not yet" would be a time
    monkeypatch.setattr(_native, "TIME_LIMIT", int(dur.sum()))
    assert _native.sweep(bounds, dur, ptr, src) is None  # times that could leave int64: exact Python integers
    assert _times(compiled, "shared") == _python_times(monkeypatch, compiled, "shared")


def test_a_stale_or_switched_off_library_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native, "_loaded", [])
    monkeypatch.setattr(_native, "source_sha", lambda: "0" * 64)  # the library was built from another source
    with pytest.warns(RuntimeWarning, match="was built from another _kernels.c: the Python versions"):
        assert _native.library() is None
    monkeypatch.setattr(_native, "_loaded", [])
    monkeypatch.undo()
    monkeypatch.setattr(_native, "_loaded", [])
    monkeypatch.setenv(_native.ENV, "0")
    assert _native.library() is None
    monkeypatch.setattr(_native, "_loaded", [])
    monkeypatch.delenv(_native.ENV)
    assert _native.library() is not None


def test_the_python_engine_alone_gives_the_same_runs(python_only: None) -> None:
    """With the library off, `run_timing` is the Python engine (what a machine without a compiler runs)."""
    assert _native.library() is None
    compiled = _mlp_run("links:1:1")
    start, end = run_timing(compiled, "links", 1, 1)
    assert np.array_equal(end - start, compiled.dur_array())


def test_the_kernels_scratch_is_traced_and_freed() -> None:
    """The kernels report their scratch to tracemalloc (memory per op counts it: benchmarks/bench_sim.py) and free
    all of it before they return."""
    import tracemalloc

    compiled = _mlp_run("links:1:1")
    _native.scratch_peak(reset=True)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        run_timing(compiled, "links", 1, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    scratch = _native.scratch_peak(reset=True)
    assert scratch > 16 * compiled.num_ops  # the sweep's two words per op at least
    assert peak - before >= scratch
    assert _native.scratch_peak() == 0  # nothing held after it returned

"""Simulating what a scheduling policy returns (`layerpipe.schedule.policies.make_schedule`).

Asynchronous policies give a periodic body: it is unrolled for the iterations asked. Synchronous policies
give one step of m micro-batches at stage level: it is repeated for ceil(iterations / m) steps (the last one
cut short), then expanded to layer tasks by `expand_stages`, so every layer's F, A, E, G and its per-step U
are timed on their own with the cost model — the same ops the functional mode executes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from layerpipe._gc import gc_paused
from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, TrainingGraph, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import Network
from layerpipe.schedule import _dataparallel, _streams
from layerpipe.schedule._deps import expand_stages
from layerpipe.schedule._engine import TimedRun
from layerpipe.schedule._ir import OpColumns, OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.sim._engine import CompiledSchedule, compile_schedule
from layerpipe.sim._interconnect import SimConfig
from layerpipe.sim._prefix import PREFIX_KINDS, is_prefix_run
from layerpipe.sim._report import SimResult
from layerpipe.sim._restrict import keeps_producers, restricted_compile, shorter_ops
from layerpipe.sim._streams import simulate_result as simulate_stream_result
from layerpipe.sim._workload import Workload


def repeat_steps(one_step: OpSchedule, iterations: int) -> OpSchedule:
    """A synchronous step's per-processor orders repeated for `iterations` micro-batches (the last step may be
    cut short), micro-batch numbers offset by j·m in step j."""
    m = one_step.microbatches
    if not one_step.synchronous or m < 1:
        raise InputError("repeat_steps takes a synchronous schedule with microbatches >= 1")
    steps = -(-iterations // m)
    # On columns (no `Op` per op): each row's step repeated with micro-batches offset by j·m, step-major, the
    # ops of micro-batches past `iterations` dropped.
    one = one_step.as_columns()
    offsets = np.arange(steps, dtype=np.int64)[:, None] * m
    tasks, its, bounds = [], [], [0]
    for lo, hi in itertools.pairwise(one.bounds):
        it = (offsets + one.iteration[None, lo:hi]).ravel()
        keep = it < iterations
        tasks.append(np.tile(one.task[lo:hi], steps)[keep])
        its.append(it[keep])
        bounds.append(bounds[-1] + int(keep.sum()))
    empty = np.zeros(0, dtype=np.int64)
    columns = OpColumns(tuple(bounds), one.tasks, np.concatenate(tasks) if tasks else empty,
                        np.concatenate(its) if its else empty)
    return OpSchedule.from_columns(one_step.level, columns, synchronous=True, microbatches=m)


def simulated_network(result: ScheduleResult, network: Network) -> Network:
    """The network `result`'s ops run on: `network`, or the split variant of it the policy scheduled (the
    `layerpipe` policy may split a heavy layer, `layerpipe.network.split_layer`; the variant's origin names
    `network`). Any other network is an InputError."""
    scheduled = result.network
    if scheduled is None or scheduled.name == network.name:
        return network
    root = scheduled
    while root.origin is not None:
        root = root.origin.source
    # The variant's source must be this very network (names alone may repeat), at any batch.
    if root is not scheduled and (root.name, root.input_shape, root.layers) == (network.name, network.input_shape,
                                                                                network.layers):
        return scheduled.with_batch(network.batch) if scheduled.batch != network.batch else scheduled
    raise InputError(f"schedule is for network '{scheduled.name}', not '{network.name}'")


def policy_ops(result: ScheduleResult, network: Network, model: CostModel, iterations: int,
               mode: str = "stash") -> tuple[OpSchedule, Workload]:
    """The explicit layer-level ops of `iterations` iterations (micro-batches) of `result`, and their workload
    (the policy's graph switches, weight mode `mode`, costs from `model`). A result scheduled on a split
    variant of `network` runs the variant (`simulated_network`)."""
    schedule, graph = _policy_schedule(result, network, iterations, mode)
    return schedule, _policy_workload(result, graph, model)


def _policy_schedule(result: ScheduleResult, network: Network, iterations: int, mode: str
                     ) -> tuple[OpSchedule, TrainingGraph]:
    """`policy_ops`' ops, and the graph its workload is made from."""
    graph = _policy_graph(result, network, iterations, mode)
    return _ops_on(result, graph, iterations), graph


def _policy_graph(result: ScheduleResult, network: Network, iterations: int, mode: str) -> TrainingGraph:
    """The graph `result`'s ops of `network` run on under weight mode `mode` (`iterations` is checked here)."""
    if result.graph is None:
        raise InputError(f"policy '{result.policy}' was scheduled without a network; simulate it from a "
                         "stage-level schedule file with --stage-costs")
    network = simulated_network(result, network)
    if iterations < 1:
        raise InputError(f"iterations must be >= 1, got {iterations}")
    if result.policy in (*_dataparallel.POLICY_NAMES, *_streams.POLICY_NAMES):
        raise InputError(f"policy '{result.policy}' overlaps kernels (all-reduces beside compute, or streams): it "
                         "has no one-op-at-a-time processor program; layerpipe compare and "
                         "layerpipe.sim.simulate_policy_result time it on the stream engine")
    options = result.graph.options
    wanted = GraphOptions(options.intra, options.inter, mode)
    # The scheduled graph itself when it is this network's under these switches (a graph is a pure function of
    # both; sweeps simulate every point twice).
    return (result.graph if result.graph.network is network and options == wanted
            else build_training_graph(network, wanted))


def _ops_on(result: ScheduleResult, graph: TrainingGraph, iterations: int) -> OpSchedule:
    """The layer-level ops of `iterations` iterations of `result` on `graph` (`_policy_graph`)."""
    if result.periodic is not None:
        return result.periodic.unroll(iterations)
    if result.explicit is not None and result.stages is not None:
        return expand_stages(repeat_steps(result.explicit, iterations), graph, result.stages)
    raise InputError(f"policy '{result.policy}' returned neither a periodic nor a staged schedule")


def _policy_workload(result: ScheduleResult, graph: TrainingGraph, model: CostModel) -> Workload:
    """`policy_ops`' workload: of the graph and the cost model, and of the policy's plan (not of the iterations)."""
    workload = Workload.of_graph(graph, model)
    if result.periodic is not None:
        workload = replace(workload, plan=result.periodic)  # a bus serves transfers in the planned order
    if result.periodic is not None and result.periodic.costs:
        # The durations the policy scheduled win over the cost model's: PipeDream-2BW's U writes 1/m of the
        # shadow weights per iteration, so its scheduled cost is ⌈c_U/m⌉.
        workload = replace(workload, durations={**workload.durations, **result.periodic.costs})
    return workload


#: A compiled run: the schedule, its workload, and where it was cut out of the longest run, each op's number in
#: that run's compiled schedule (None for the longest run, or one compiled on its own).
CompiledRun = tuple[CompiledSchedule, Workload, np.ndarray | None]


def compiled_policy_runs(result: ScheduleResult, network: Network, model: CostModel, iterations: Sequence[int],
                         mode: str, longest: tuple[CompiledSchedule, Workload] | None = None) -> list[CompiledRun]:
    """`compile_schedule(*policy_ops(...))` for each run length, in the order given: the longest is compiled, and
    every shorter one cut out of it (`restricted_compile`: the same numbering, producers and costs, where that can
    be shown; compiled otherwise). The workload is a function of (result, network, model, mode) alone, so one
    serves every run. `longest`: the longest run's (compiled schedule, workload), where the caller has them
    (`_compiled_longest`)."""
    full, workload = longest or _compiled_longest(result, network, model, max(iterations), mode)
    out: list[CompiledRun] = []
    for k in iterations:
        if k == max(iterations):
            out.append((full, workload, None))
            continue
        cut = shorter_ops(result, full.schedule, k)
        shorter = cut[0] if cut is not None else _policy_schedule(result, network, k, mode)[0]
        compiled = restricted_compile(full, shorter, workload, None if cut is None else cut[1])
        if compiled is None:
            out.append((compile_schedule(shorter, workload), workload, None))
        else:
            out.append((compiled, workload, cut[1] if cut is not None else None))
    return out


def _compiled_longest(result: ScheduleResult, network: Network, model: CostModel, iterations: int, mode: str
                      ) -> tuple[CompiledSchedule, Workload]:
    """The compiled run of `iterations` iterations of `result` and its workload: the scheduler's own run where it
    is that run (`scheduled_run`), else compiled."""
    graph = _policy_graph(result, network, iterations, mode)
    workload = _policy_workload(result, graph, model)
    timed = scheduled_run(result, workload, iterations)
    return (timed.compiled if timed is not None else compile_schedule(_ops_on(result, graph, iterations), workload),
            workload)


def scheduled_run(result: ScheduleResult, workload: Workload, iterations: int) -> TimedRun | None:
    """The run the scheduler timed `result` on (`ScheduleResult.timed_run`: a synchronous step timed over the
    steady state's run) when it is the run of `iterations` iterations of `result` on `workload` that `policy_ops`
    would make — the same one-step order and stages, as many micro-batches (whole steps), the same workload —
    else None."""
    run = result.timed_run
    if (run is None or len(run.made_from) != 2 or run.made_from[0] is not result.explicit
            or run.made_from[1] is not result.stages or run.compiled.schedule.num_iterations != iterations
            or run.workload != workload):
        return None
    return run


def simulate_policy_runs(result: ScheduleResult, network: Network, model: CostModel, iterations: Sequence[int],
                         config: SimConfig | None = None) -> list[SimResult]:
    """`simulate_policy_result` for several run lengths of one schedule (explore's steady state times K and 2K
    iterations of every point: `layerpipe.dse._evaluate.steady_simulation`): the shorter runs' compiled schedules
    are cut out of the longest run's (`compiled_policy_runs`) instead of unrolled and compiled again, and a shorter
    run that is the longest one's start (`is_prefix_run`) has its times read off the longest run's."""
    return _simulate_runs(result, network, model, iterations, config or SimConfig())


def _simulate_runs(result: ScheduleResult, network: Network, model: CostModel, iterations: Sequence[int],
                   config: SimConfig, longest: tuple[CompiledSchedule, Workload] | None = None) -> list[SimResult]:
    """`simulate_policy_runs`; `longest` as `compiled_policy_runs` takes it."""
    from layerpipe.sim import simulate_compiled

    if result.policy in (*_dataparallel.POLICY_NAMES, *_streams.POLICY_NAMES):
        return [simulate_stream_result(result, network, model, k, config) for k in iterations]
    with gc_paused():
        runs = compiled_policy_runs(result, network, model, iterations, config.mode, longest)
        full = runs[list(iterations).index(max(iterations))][0]
        # A shorter run that is the start of the longest one is read off it (`is_prefix_run`), not simulated again;
        # the longest one is read off the scheduler's run when it is that run on this interconnect (`scheduled_run`).
        prefix = [cut is not None and is_prefix_run(full, compiled.bounds, cut, config.interconnect)
                  for compiled, _, cut in runs]
        timed = _simulated_longest(result, full, runs[0][1], config) if any(prefix) else None
        out = []
        for (compiled, workload, cut), cut_of_full in zip(runs, prefix, strict=True):
            if cut_of_full and timed is not None and cut is not None:
                out.append(simulate_compiled(compiled, workload, config, times=(timed.start[cut], timed.end[cut])))
            elif compiled is full:
                out.append(timed if timed is not None else _simulated_longest(result, full, workload, config))
            else:
                out.append(simulate_compiled(compiled, workload, config))
        return out


def _simulated_longest(result: ScheduleResult, full: CompiledSchedule, workload: Workload, config: SimConfig
                       ) -> SimResult:
    """The longest run (`full`) simulated: its times and its steps' completions read off the scheduler's run where
    it is that very run on this interconnect (`scheduled_run`, `TimedRun.times_on`)."""
    from layerpipe.sim import simulate_compiled

    scheduled = result.timed_run
    known = (scheduled.times_on(config.interconnect, config.link_latency, config.link_words_per_cycle)
             if scheduled is not None and scheduled.compiled is full else None)
    timed = simulate_compiled(full, workload, config, times=known)
    if known is not None and scheduled is not None and scheduled.completions is not None:
        timed.__dict__["completion_times"] = scheduled.completions  # cached: the same rule on the same run
    return timed


def simulate_policy_pair(result: ScheduleResult, network: Network, model: CostModel, longer: int, shorter: int,
                         config: SimConfig | None = None) -> tuple[SimResult, int, int]:
    """`simulate_policy_runs(result, network, model, (longer, shorter), config)` as a steady state reads the pair
    (`SimResult.steady_cycles_per_iteration`, `layerpipe.dse._evaluate.steady_simulation`): the longer run, and the
    shorter run's iterations and total cycles. Where the shorter run is the longer one's start (`keeps_producers`,
    then `is_prefix_run`) it is neither compiled nor simulated: its total is the last end of its ops in the longer
    run, which `simulate_policy_runs` would have read off it too (issue 14: not cutting its compiled schedule out
    saves ~1 % of `explore`'s sweep)."""
    config = config or SimConfig()
    longest = None
    if (result.policy not in (*_dataparallel.POLICY_NAMES, *_streams.POLICY_NAMES)
            and config.interconnect in PREFIX_KINDS and 0 < shorter < longer):
        with gc_paused():
            longest = _compiled_longest(result, network, model, longer, config.mode)
            full, workload = longest
            cut = shorter_ops(result, full.schedule, shorter)
            if (cut is not None and cut[0].columns is not None and keeps_producers(full, cut[0], workload, cut[1])
                    and is_prefix_run(full, cut[0].columns.bounds, cut[1], config.interconnect)):
                run = _simulated_longest(result, full, workload, config)
                return run, cut[0].num_iterations, int(run.end.take(cut[1]).max()) if len(cut[1]) else 0
    long_run, short_run = _simulate_runs(result, network, model, (longer, shorter), config, longest)
    return long_run, short_run.num_iterations, short_run.total_cycles


def simulate_policy_result(result: ScheduleResult, network: Network, model: CostModel, iterations: int,
                           config: SimConfig | None = None) -> SimResult:
    """Time `iterations` iterations of a policy's schedule of `network` under `config` (default shared). dp,
    dp-ooo, stream and stream-ooo overlap kernels with all-reduces or with each other: the stream engine
    (`layerpipe.sim._streams`) times them, rebuilt from the policy's options on `config`'s interconnect."""
    return simulate_policy_runs(result, network, model, (iterations,), config)[0]

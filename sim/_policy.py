"""Simulate what a scheduling policy produced: the bridge from `ScheduleResult` to `simulate`.

Asynchronous policies give a periodic schedule, unrolled for the requested iterations; synchronous ones
give one step of stage ops, repeated for enough steps and expanded to layer tasks so every layer's work is
timed by the same cost model and the same dependency rules. The DFG is rebuilt with the simulation's
weight mode (under `stash`, E_l waits for the weights its F_l read; otherwise for U_l).
"""

from __future__ import annotations

from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.network import Network
from layerpipe.schedule._deps import expand_stages
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.sim._interconnect import SimConfig
from layerpipe.sim._report import SimResult
from layerpipe.sim._workload import Workload


def repeat_steps(one_step: OpSchedule, iterations: int) -> OpSchedule:
    """A synchronous step's per-processor orders repeated for `iterations` micro-batches (the last step may be
    cut short), micro-batch numbers offset by j·m in step j."""
    m = one_step.microbatches
    steps = -(-iterations // m)
    rows = tuple(tuple(Op(op.proc, op.kind, op.unit, j * m + op.iteration) for j in range(steps) for op in row
                       if j * m + op.iteration < iterations) for row in one_step.procs)
    return OpSchedule(one_step.level, rows, True, m)


def policy_ops(result: ScheduleResult, network: Network, model: CostModel, iterations: int,
               mode: str = "stash") -> tuple[OpSchedule, Workload]:
    """The explicit layer-level ops of `iterations` iterations of `result`, and their workload."""
    assert result.graph is not None
    graph = build_training_graph(network, GraphOptions(result.graph.options.intra, result.graph.options.inter, mode))
    if result.periodic is not None:
        schedule = result.periodic.unroll(iterations)
    else:
        assert result.explicit is not None and result.stages is not None
        schedule = expand_stages(repeat_steps(result.explicit, iterations), graph, result.stages)
    return schedule, Workload.of_graph(graph, model)


def simulate_policy_result(result: ScheduleResult, network: Network, model: CostModel, iterations: int,
                           config: SimConfig | None = None) -> SimResult:
    """Time `iterations` iterations of a policy's schedule under `config`."""
    from layerpipe.sim import simulate

    config = config or SimConfig()
    schedule, workload = policy_ops(result, network, model, iterations, config.mode)
    return simulate(schedule, workload, config)

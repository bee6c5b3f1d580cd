"""The cycle-accurate simulator (design notes §7), imported as `layerpipe.sim`.

`simulate(schedule, workload, config)` times an explicit `OpSchedule`: each processor runs its ops in
order, an op starts when its processor is free and its inputs have arrived under the interconnect model
of `SimConfig` (`shared` or `links`, contract 2). The `SimResult` has every op's start and end, total
and steady-state cycles, busy/idle/bubbles per processor, traffic, peak memory and the version map.
`Workload.of_graph(graph, cost_model)` describes layer-level work, `Workload.of_stages(...)` stage-level
work with given stage costs; `simulate_policy_result` times what a scheduling policy returned. Traces
(`trace.py`) and Gantt pictures (`gantt.py`) render a result.
"""

from __future__ import annotations

import numpy as np

from layerpipe.schedule._ir import OpSchedule
from layerpipe.sim._engine import CompiledSchedule, DeadlockError, compile_schedule, run
from layerpipe.sim._interconnect import INTERCONNECTS, MODES, SimConfig, link_hold_cycles
from layerpipe.sim._memory import peak_memory
from layerpipe.sim._policy import policy_ops, repeat_steps, simulate_policy_result, simulated_network
from layerpipe.sim._report import SimResult, link_traffic
from layerpipe.sim._versions import version_array
from layerpipe.sim._workload import Workload

__all__ = [
    "INTERCONNECTS",
    "MODES",
    "CompiledSchedule",
    "DeadlockError",
    "SimConfig",
    "SimResult",
    "Workload",
    "compile_schedule",
    "link_hold_cycles",
    "policy_ops",
    "repeat_steps",
    "simulate",
    "simulate_compiled",
    "simulate_policy_result",
    "simulated_network",
]


def simulate(schedule: OpSchedule, workload: Workload, config: SimConfig | None = None) -> SimResult:
    """Time `schedule` on `workload` under `config` (default: shared memory, `stash`)."""
    return simulate_compiled(compile_schedule(schedule, workload), workload, config or SimConfig())


def simulate_compiled(compiled: CompiledSchedule, workload: Workload, config: SimConfig,
                      *, reports: bool = True) -> SimResult:
    """Time an already compiled schedule (compile once, simulate under several configs).

    `reports=False` skips the version map and the memory sweep (they stay −1 / 0): for callers that
    need only cycle counts, such as schedulers timing candidates.
    """
    start_l, end_l = run(compiled, config)
    start = np.asarray(start_l, dtype=np.int64)
    end = np.asarray(end_l, dtype=np.int64)
    if reports:
        versions = version_array(compiled, start, end, workload, config.mode,
                                 remote_copies=config.interconnect != "shared")
        peaks = tuple(peak_memory(compiled, start, end, versions, workload, config.mode,
                                  distributed=config.interconnect != "shared"))
    else:
        versions = np.full(compiled.num_ops, -1, dtype=np.int64)
        peaks = (0,) * compiled.num_procs
    return SimResult(compiled.schedule, config, compiled.ops, start, end, versions, peaks,
                     link_traffic(compiled), workload.batch, workload.memory_unit, compiled)

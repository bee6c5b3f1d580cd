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

from collections.abc import Callable

import numpy as np

from layerpipe._gc import gc_paused
from layerpipe.schedule._engine import run_timing
from layerpipe.schedule._ir import OpSchedule
from layerpipe.sim._engine import CompiledSchedule, DeadlockError, compile_schedule, run  # noqa: F401 - run: as before
from layerpipe.sim._interconnect import INTERCONNECTS, MODES, SimConfig, link_hold_cycles
from layerpipe.sim._memory import peak_memory
from layerpipe.sim._policy import (
    policy_ops,
    repeat_steps,
    simulate_policy_pair,
    simulate_policy_result,
    simulate_policy_runs,
    simulated_network,
)
from layerpipe.sim._report import PendingReports, SimResult
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
    "simulate_policy_pair",
    "simulate_policy_result",
    "simulate_policy_runs",
    "simulated_network",
]


def simulate(schedule: OpSchedule, workload: Workload, config: SimConfig | None = None) -> SimResult:
    """Time `schedule` on `workload` under `config` (default: shared memory, `stash`)."""
    # One pause of the collector for the whole call, not one per step: a collection at the end of each step's
    # pause scanned the lists the step had just built and the next still needed (16–20 % of a 1F1B p = 8 call).
    with gc_paused():
        return simulate_compiled(compile_schedule(schedule, workload), workload, config or SimConfig())


def simulate_compiled(compiled: CompiledSchedule, workload: Workload, config: SimConfig,
                      *, reports: bool = True, times: tuple[np.ndarray, np.ndarray] | None = None) -> SimResult:
    """Time an already compiled schedule (compile once, simulate under several configs).

    `reports=False` skips the version map and the memory sweep (they stay −1 / 0): for callers that
    need only cycle counts, such as schedulers timing candidates. Either way the result computes its version
    map, peaks, traffic and `ops` when they are first read. `times`: every op's (start, end) already known (a run
    that is the start of a longer one: `simulate_policy_runs`), not timed again.
    """
    start, end = times or run_timing(compiled, config.interconnect, config.link_latency, config.link_words_per_cycle)
    distributed = config.interconnect != "shared"

    def versions(c: CompiledSchedule, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        if not reports:
            return np.full(c.num_ops, -1, dtype=np.int64)
        return version_array(c, start, end, workload, config.mode, remote_copies=distributed)

    def peaks(c: CompiledSchedule, start: np.ndarray, end: np.ndarray,
              version_map: Callable[[], np.ndarray]) -> tuple[int, ...]:
        if not reports:
            return (0,) * c.num_procs
        # The version map only where weights are held (the peaks of activations alone do not read it).
        held = version_map() if any(workload.weight_words.values()) else np.zeros(0, dtype=np.int64)
        return tuple(peak_memory(c, start, end, held, workload, config.mode, distributed=distributed,
                                 engine_times=True))

    # The version map, the peaks, the traffic and the ops are computed when first read (the same values).
    return SimResult.deferred(compiled, config, start, end, PendingReports(versions, peaks), workload.batch,
                              workload.memory_unit)

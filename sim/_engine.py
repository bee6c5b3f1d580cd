"""The simulator's front end to the array timing engine (`layerpipe.schedule._engine`).

The engine — compiling a schedule into arrays, the work-list sweep of `shared` and `links`, the event-driven
engine of a bus and of zero-duration senders, the compiled bus order, deadlock reports — sits in the schedule
layer (issue 13's layering: the synchronous schedulers time their step on it without importing the simulator).
This module keeps the names the simulator and its tests always used, and `run` takes a `SimConfig`.
"""

from __future__ import annotations

from layerpipe.schedule._dep_csr import MAX_INDEX_CELLS
from layerpipe.schedule._engine import (
    BusOrder,
    CompiledSchedule,
    LinkPlan,
    _array_dependencies,
    _events,
    _listed_dependencies,
    _run_links_events,
    bus_order,
    compile_schedule,
    run_timing,
)
from layerpipe.schedule._op_sweep import DeadlockError, _sweep
from layerpipe.sim._interconnect import SimConfig

__all__ = [
    "MAX_INDEX_CELLS",
    "BusOrder",
    "CompiledSchedule",
    "DeadlockError",
    "LinkPlan",
    "_array_dependencies",
    "_events",
    "_listed_dependencies",
    "_run_links_events",
    "_sweep",
    "bus_order",
    "compile_schedule",
    "run",
]


def run(compiled: CompiledSchedule, config: SimConfig) -> tuple[list[int], list[int]]:
    """Start and end cycle of every op (compiled numbering) under `config`'s interconnect, as lists (the
    engine's `run_timing` gives arrays)."""
    start, end = run_timing(compiled, config.interconnect, config.link_latency, config.link_words_per_cycle)
    return start.tolist(), end.tolist()

"""Schedules: the IR (ops, explicit and periodic schedules, text/CSV/torch forms), dependencies, the validator,
synchronous stage-level generators and the policies."""

from layerpipe.schedule._deps import Dependency, StageInfo, TaskEdge, dependencies, expand_stages, layer_task_edges
from layerpipe.schedule._ir import (
    KINDS_LAYER,
    KINDS_STAGE,
    Op,
    OpSchedule,
    PeriodicSchedule,
    ScheduleError,
    Slot,
    parse_op,
)
from layerpipe.schedule._validate import dry_run, format_grid, periodic_staleness, validate

__all__ = [
    "KINDS_LAYER",
    "KINDS_STAGE",
    "Dependency",
    "Op",
    "OpSchedule",
    "PeriodicSchedule",
    "ScheduleError",
    "Slot",
    "StageInfo",
    "TaskEdge",
    "dependencies",
    "dry_run",
    "expand_stages",
    "format_grid",
    "layer_task_edges",
    "parse_op",
    "periodic_staleness",
    "validate",
]

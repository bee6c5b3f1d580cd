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
from layerpipe.schedule._sync import (
    gpipe,
    interleaved_1f1b,
    looping_stage_map,
    one_f_one_b,
    v_stage_map,
    zb_h1,
    zb_h2,
    zbv,
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
    "gpipe",
    "interleaved_1f1b",
    "layer_task_edges",
    "looping_stage_map",
    "one_f_one_b",
    "parse_op",
    "periodic_staleness",
    "v_stage_map",
    "validate",
    "zb_h1",
    "zb_h2",
    "zbv",
]

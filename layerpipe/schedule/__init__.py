"""Schedules: the IR (ops, explicit and periodic schedules, text/CSV/torch forms), dependencies, the validator,
synchronous stage-level generators and the policies."""

from layerpipe.schedule._deps import Dependency, StageInfo, TaskEdge, dependencies, expand_stages, layer_task_edges
from layerpipe.schedule._formats import (
    FORMATS,
    dump_schedule,
    from_csv,
    from_torch_actions,
    from_torch_csv,
    load_schedule,
    to_csv,
    to_torch_actions,
    to_torch_csv,
)
from layerpipe.schedule._ir import KINDS_LAYER, KINDS_STAGE, Op, OpSchedule, ScheduleError, parse_op
from layerpipe.schedule._layerpipe import LayerPipeOptions
from layerpipe.schedule._ooo import OOOOptions
from layerpipe.schedule._optimal import OptimalOptions
from layerpipe.schedule._periodic import PeriodicSchedule, Slot
from layerpipe.schedule._pipedream import PipeDream2BWOptions, PipeDreamOptions
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stage_programs import (
    dualpipev,
    gpipe,
    interleaved_1f1b,
    looped_bfs,
    looping_stage_map,
    one_f_one_b,
    v_stage_map,
    zb_h1,
    zb_h2,
    zbv,
)
from layerpipe.schedule._sync_policies import InterleavedOptions, SyncOptions, ZBH1Options
from layerpipe.schedule._validate import dry_run, format_grid, periodic_staleness, validate
from layerpipe.schedule.metrics import ScheduleMetrics, period_lower_bound
from layerpipe.schedule.policies import POLICIES, get_policy, make_schedule, policy_options

__all__ = [
    "FORMATS",
    "KINDS_LAYER",
    "KINDS_STAGE",
    "POLICIES",
    "Dependency",
    "InterleavedOptions",
    "LayerPipeOptions",
    "OOOOptions",
    "Op",
    "OpSchedule",
    "OptimalOptions",
    "PeriodicSchedule",
    "PipeDream2BWOptions",
    "PipeDreamOptions",
    "ScheduleError",
    "ScheduleMetrics",
    "ScheduleResult",
    "Slot",
    "StageInfo",
    "SyncOptions",
    "TaskEdge",
    "ZBH1Options",
    "dependencies",
    "dry_run",
    "dualpipev",
    "dump_schedule",
    "expand_stages",
    "format_grid",
    "from_csv",
    "from_torch_actions",
    "from_torch_csv",
    "get_policy",
    "gpipe",
    "interleaved_1f1b",
    "layer_task_edges",
    "load_schedule",
    "looped_bfs",
    "looping_stage_map",
    "make_schedule",
    "one_f_one_b",
    "parse_op",
    "period_lower_bound",
    "periodic_staleness",
    "policy_options",
    "to_csv",
    "to_torch_actions",
    "to_torch_csv",
    "v_stage_map",
    "validate",
    "zb_h1",
    "zb_h2",
    "zbv",
]

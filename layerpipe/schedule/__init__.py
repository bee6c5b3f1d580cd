"""Schedules: the IR (ops, explicit and periodic schedules, text/CSV/torch forms), the validator, policies."""

from layerpipe.schedule._ir import KINDS_LAYER, KINDS_STAGE, Op, OpSchedule, PeriodicSchedule, Slot, parse_op

__all__ = ["KINDS_LAYER", "KINDS_STAGE", "Op", "OpSchedule", "PeriodicSchedule", "Slot", "parse_op"]

"""What the ops of a schedule compute (`Workload`): defined in the schedule layer
(`layerpipe.schedule._workload`), so the schedulers time schedules on the array engine without importing the
simulator; re-exported here under the name the simulator always had."""

from __future__ import annotations

from layerpipe.schedule._workload import STAGE_WEIGHT_READERS, Workload

__all__ = ["STAGE_WEIGHT_READERS", "Workload"]

"""What the ops of a schedule compute: durations, dependencies and the sizes the memory report needs.

A `Workload` is the timing engine's (`layerpipe.schedule._engine`) and the simulator's view of the work behind
the op names; it lives in the schedule layer so the schedulers can time schedules without importing the
simulator (`layerpipe.sim` re-exports it). Two kinds:

- layer level (`Workload.of_graph`): ops are tasks of a `TrainingGraph`; durations come from
  `TrainingGraph.costs` (the one cost function, `layerpipe.costs.task_cost`); dependencies and the words
  they carry from SIR's `layerpipe.schedule._deps.dependencies` with the graph.
- stage level (`Workload.of_stages`): ops are torch-style stage ops F/B/I/W with given per-stage costs
  (F, I, W) — forward, input gradient, weight gradient; a full backward B costs I + W, as in
  `layerpipe schedule --stage-costs`; dependencies from the same function with a
  `StageInfo`. Without a network there are no word counts, so the memory report counts each micro-batch
  activation a stage keeps as `activation_words[s]` words (1 by default: the unit is then "activations").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from layerpipe.costs import CostModel
from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.schedule._deps import Dependency, StageInfo, dependencies
from layerpipe.schedule._ir import Op, OpSchedule, RunPlan

#: Stage-level kinds that read the stage's weights (I and B contain E; W is the weight gradient only).
STAGE_WEIGHT_READERS = ("F", "B", "I")


@dataclass(frozen=True)
class Workload:
    """Durations per (kind, unit), the dependency source, and word counts for memory.

    `weight_words[u]` is |W_u| for every unit (layer or stage) with weights; `activation_words[s]` is used
    by stage-level schedules only (layer-level ones take kept words from the dependencies).
    """

    level: str
    durations: Mapping[tuple[str, int], int]
    batch: int = 1
    graph: TrainingGraph | None = None
    stages: StageInfo | None = None
    weight_words: Mapping[int, int] = field(default_factory=dict)
    activation_words: Mapping[int, int] = field(default_factory=dict)
    memory_unit: str = "words"  #: "activations" when stage activations are counted, not sized
    #: The plan the ops were made from, if any (the periodic schedule they were unrolled from): a `bus` serves
    #: its transfers in the planned order, no earlier than planned (a compiled bus, `layerpipe.schedule._engine`),
    #: so self-timed runs keep the scheduler's bus on the one shared medium.
    plan: RunPlan | None = None

    @staticmethod
    def of_graph(graph: TrainingGraph, model: CostModel) -> Workload:
        """Layer-level work of `graph` timed by cost model `model`."""
        durations = {(t.kind, t.layer): c for t, c in graph.costs(model).items()}
        weights = {layer.index: layer.weight_count for layer in graph.network.layers if layer.has_weights}
        return Workload("layer", durations, graph.network.batch, graph=graph, weight_words=weights)

    @staticmethod
    def of_stages(
        costs: Sequence[tuple[int, int, int]],
        stages: StageInfo | None = None,
        activation_words: Sequence[int] | None = None,
        weight_words: Sequence[int] | None = None,
    ) -> Workload:
        """Stage-level work: `costs[s] = (F, I, W)` cycles of stage s; a full backward B costs I + W."""
        durations: dict[tuple[str, int], int] = {}
        for s, (f, i, w) in enumerate(costs):
            if min(f, i, w) < 0:
                raise InputError(f"stage {s} costs F,B,W = {f},{i},{w}: all must be >= 0")
            durations.update({("F", s): f, ("B", s): i + w, ("I", s): i, ("W", s): w})
        count = len(costs)
        acts = list(activation_words) if activation_words is not None else [1] * count
        weights = list(weight_words) if weight_words is not None else [0] * count
        if len(acts) != count or len(weights) != count:
            raise InputError(f"stage word counts must have one entry per stage ({count})")
        return Workload("stage", durations, 1, stages=stages or StageInfo(count),
                        weight_words={s: w for s, w in enumerate(weights) if w > 0},
                        activation_words=dict(enumerate(acts)),
                        memory_unit="words" if activation_words is not None else "activations")

    def duration(self, op: Op) -> int:
        try:
            return self.durations[(op.kind, op.unit)]
        except KeyError:
            what = "layer" if self.level == "layer" else "stage"
            raise InputError(f"op {op} on p{op.proc}: the workload has no task {op.kind} of {what} {op.unit}") from None

    def dependencies(self, schedule: OpSchedule) -> dict[Op, tuple[Dependency, ...]]:
        """Every op's producers (contract 1), from SIR's shared dependency function."""
        if schedule.level != self.level:
            raise InputError(f"schedule is {schedule.level}-level but the workload is {self.level}-level")
        if self.level == "layer":
            return dependencies(schedule, graph=self.graph)
        return dependencies(schedule, stages=self.stages)

    def weight_readers(self, tasks: Sequence[tuple[str, int]]) -> list[bool]:
        """`reads_weights` of every (kind, unit) task, in one pass."""
        if self.level == "stage":
            return [kind in STAGE_WEIGHT_READERS for kind, _ in tasks]
        weights = self.weight_words
        return [unit in weights and ("F" in kind or "E" in kind) for kind, unit in tasks]

    def reads_weights(self, kind: str, unit: int) -> bool:
        """Does a `kind` op of `unit` read weights (so the version map records it)?"""
        if self.level == "stage":
            return kind in STAGE_WEIGHT_READERS
        return unit in self.weight_words and ("F" in kind or "E" in kind)

"""A shorter run of a policy's schedule cut out of a longer run of it (issue 14: `explore` simulates every point
twice, K and 2K iterations of the same schedule, and unrolled and compiled both from scratch).

`shorter_schedule(result, longer, iterations)` gives `policy_ops`' ops of the shorter run from the longer run's
(its docstring says why the cut is them).

`restricted_compile(longer, schedule, workload)` gives what `compile_schedule(schedule, workload)` gives — the same
numbering, tasks, costs, producers (same order, words and roles), role names and planned starts — when it can
prove that from `longer`, compiled from a schedule of the same kind with the same workload; None otherwise (the
caller compiles as usual). What it checks, and why that is enough:

- `schedule`'s ops are, processor by processor, a subsequence of `longer`'s (same (task, iteration) keys, same
  order), and the fields that choose the dependency rules (level, synchronous, micro-batches, unfolding, groups,
  read pins) are equal. Layer-level schedules only: the stage rules' step edges depend on which forward comes
  first in a step, which cutting a step short can change.
- The layer-level rules (`_deps`: `layer_task_edges`, `_sync_rules`, `_grouped_rules`, and `dependencies()`, which
  they equal) give an op's producers from its own (task, iteration) alone, by looking keys up among the ops; the
  run's length enters only as the bound of a group's or a step's micro-batches (min(g, total − base)) and as
  lookups that find nothing. Both can only give the longer run *more* producers, never other ones, and any
  extra one is an op the shorter run does not have. So where every producer `longer` lists for a kept op is kept,
  the shorter run's producers are exactly those, in the same order; otherwise None.
- Task ids and role codes are numbered by first appearance, which cutting ops can change: both are renumbered
  from the kept ops, as compiling them would.
"""

from __future__ import annotations

import numpy as np

from layerpipe.schedule._dep_csr import MAX_INDEX_CELLS
from layerpipe.schedule._engine import (
    CompiledSchedule,
    LinkPlan,
    _from_columns,
    _narrow,
    _narrow_ptr,
)
from layerpipe.schedule._ir import OpColumns, OpSchedule
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._workload import Workload

#: The schedule fields that choose the dependency rules and their pins: equal in both runs, or no restriction.
RULE_FIELDS = ("level", "synchronous", "microbatches", "read_staleness", "unfold", "groups", "read_phases",
               "read_floor")

#: Largest (tasks × iterations) table the key lookup builds, per op of the longer run (beyond it: None).
MAX_CELLS_PER_OP = 8


def restricted_compile(longer: CompiledSchedule, schedule: OpSchedule, workload: Workload,
                       positions: np.ndarray | None = None) -> CompiledSchedule | None:
    """`compile_schedule(schedule, workload)` cut out of `longer`, compiled with this same `workload` (see the
    module docstring); None where that cannot be shown (the caller compiles). `positions`, when given, are each
    op's number in `longer` (a cut of its ops, `shorter_ops`: not looked up again)."""
    columns = schedule.columns
    if columns is None or not _same_rules(longer, schedule, workload):
        return None
    bounds, tasks, task, iteration = _from_columns(columns)
    pos = _positions(longer, bounds, tasks, task, iteration) if positions is None else positions
    if pos is None:
        return None
    cost = [workload.durations.get(t, -1) for t in tasks]
    if min(cost, default=0) < 0:
        return None  # a task without a duration: compiling raises the error
    keep_codes = False
    if not schedule.synchronous and schedule.simple:  # compiled from `layer_task_edges` (`_task_edge_dependencies`)
        # Its roles are numbered in the order of the task edges into present tasks: the same as `longer`'s when it
        # was compiled so (its table fits) with the same tasks present (the same edges).
        span = int(longer.iteration.max()) + 1 if longer.num_ops else 0
        if len(tasks) != len(longer.tasks) or len(longer.tasks) * span > MAX_INDEX_CELLS:
            return None
        keep_codes = True
    kept = _kept(longer, pos)
    renumber = kept.cumsum() - 1  # old op number → new, for kept ops
    csr = _restricted_producers(longer, pos, kept, renumber, keep_codes)
    if csr is None:
        return None
    ptr, producer, words, role, roles = csr
    compiled = CompiledSchedule(schedule, bounds, tuple(cost), tasks, task, iteration, _narrow_ptr(ptr),
                                _narrow(producer), _narrow(words), role, roles, plan=workload.plan)
    planned = longer.__dict__.get("plan_time")  # where `longer`'s run read its planned starts (a bus): cut too
    if planned is not None and longer.plan is workload.plan:  # a planned start is the plan's (task, iteration)'s
        compiled.__dict__["plan_time"] = list(map(planned.__getitem__, pos.tolist()))  # the cached property
    links: LinkPlan | None = longer.__dict__.get("link_plan")  # `longer`'s transfers, where its run computed them
    if links is not None:
        compiled.__dict__["link_plan"] = restricted_link_plan(links, pos, kept, renumber, compiled.bounds)  # cached
    return compiled


def keeps_producers(longer: CompiledSchedule, schedule: OpSchedule, workload: Workload, positions: np.ndarray) -> bool:
    """Whether `schedule`'s ops — `longer`'s ops at `positions`, a cut of them (`shorter_ops`) — compiled on their own
    with `workload` (the one `longer` was compiled with) have the producers, words and costs they have in `longer`:
    what `restricted_compile` shows before it builds the cut (the module docstring), without building it. Its other
    conditions (a duration for every task, role codes it can renumber) only decide whether it can *build* the cut:
    the cut's tasks are `longer`'s, with their durations, and no role is read by the timing. For a caller that
    needs only the cut's times, read off `longer`'s run (`layerpipe.sim._prefix.is_prefix_run`)."""
    if schedule.columns is None or not _same_rules(longer, schedule, workload):
        return False
    return _kept_entries(longer, _kept(longer, positions)) is not None


def _same_rules(longer: CompiledSchedule, schedule: OpSchedule, workload: Workload) -> bool:
    """Layer level, and the fields that choose the dependency rules equal (`RULE_FIELDS`)."""
    return (schedule.level == "layer" and workload.level == "layer"
            and all(getattr(schedule, name) == getattr(longer.schedule, name) for name in RULE_FIELDS))


def _kept_entries(longer: CompiledSchedule, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(producers per op of `longer`, which CSR entries are the kept ops', their producers), or None where a kept
    op has a producer that is not kept (the cut's own condition: `restricted_compile`, `keeps_producers`)."""
    ptr = np.asarray(longer.prod_ptr, dtype=np.int64)
    count = ptr[1:] - ptr[:-1]
    entries = kept.repeat(count)
    producer = longer.prod_idx[entries]
    if len(producer) and not kept.take(producer).all():
        return None
    return count, entries, producer


def _kept(longer: CompiledSchedule, positions: np.ndarray) -> np.ndarray:
    """Per op of `longer`: is it at one of `positions`?"""
    kept = np.zeros(longer.num_ops, dtype=bool)
    kept[positions] = True
    return kept


def shorter_schedule(result: ScheduleResult, longer: OpSchedule, iterations: int) -> OpSchedule | None:
    """`shorter_ops`' schedule."""
    cut = shorter_ops(result, longer, iterations)
    return None if cut is None else cut[0]


def shorter_ops(result: ScheduleResult, longer: OpSchedule, iterations: int) -> tuple[OpSchedule, np.ndarray] | None:
    """`policy_ops`' ops of `iterations` iterations of `result`, cut out of `longer`, its ops of more (at least as
    many) iterations, and each op's number in `longer`; None where the cut is not known to be them (the caller
    makes them).

    - Periodic (`PeriodicSchedule.unroll`): each processor's ops are its (period, slot) grid's live cells in one
      stable sort by a key that does not depend on the run's length, and a cell of the shorter run is a cell of
      the longer one, live in both, exactly when its iteration is below the shorter run's bound (T, or ⌈T/g⌉
      for the updates of a layer with update group g; such a cell's period is within the shorter grid). A
      stable sort of a subset keeps the subset's order: the cut is the longer run's ops with iterations below
      the bounds, tasks renumbered by first appearance.
    - Synchronous, whole steps (`repeat_steps`, then `expand_stages`): each processor repeats one step's
      program step after step, and a step expands alike whatever follows it: the first T / m steps are each
      processor's first ops — micro-batches below T, updates (numbered by step) below T / m — with the same
      tasks, numbered as before (every task runs in step 0).
    """
    columns = longer.columns
    if columns is None or iterations < 1 or iterations > longer.num_iterations:
        return None
    if result.periodic is not None and not longer.synchronous:
        groups = dict(result.periodic.groups)
        bound = [-(-iterations // groups[unit]) if kind == "U" and unit in groups else iterations
                 for kind, unit in columns.tasks]
        cut = _ops_below(columns, bound)
        if cut is None:
            return None
        ops = cut[0]  # numbered by first appearance, as `unroll` numbers them (so already, mostly: one pass to see)
        if not ops.numbered_by_first_appearance():
            ops = ops.in_first_appearance_order()
        return OpSchedule.from_columns("layer", ops,
                                       read_staleness=longer.read_staleness, unfold=longer.unfold,
                                       groups=longer.groups, read_phases=longer.read_phases,
                                       read_floor=longer.read_floor), cut[1]
    m = longer.microbatches
    if (result.explicit is None or not longer.synchronous or m < 1 or iterations % m
            or longer.level != "layer"):
        return None
    cut = _ops_below(columns, [iterations // m if kind == "U" else iterations for kind, _ in columns.tasks])
    if cut is None:
        return None
    return OpSchedule.from_columns("layer", cut[0], synchronous=True, microbatches=m), cut[1]


def _ops_below(columns: OpColumns, bound: list[int]) -> tuple[OpColumns, np.ndarray] | None:
    """The ops whose iteration is below their task's `bound`, in order, and their positions in `columns`; None if
    a task is left without ops."""
    below = columns.iteration < np.asarray(bound, dtype=np.int64).take(columns.task)
    task = columns.task[below]
    if int(np.count_nonzero(np.bincount(task, minlength=len(columns.tasks)))) < len(columns.tasks):
        return None
    kept = np.zeros(len(below) + 1, dtype=np.int64)
    below.cumsum(out=kept[1:])
    bounds = kept.take(np.asarray(columns.bounds, dtype=np.int64)).tolist()
    return OpColumns(tuple(bounds), columns.tasks, task, columns.iteration[below]), np.flatnonzero(below)


def _positions(longer: CompiledSchedule, bounds: list[int], tasks: tuple[tuple[str, int], ...], task: np.ndarray,
               iteration: np.ndarray) -> np.ndarray | None:
    """Each op's number in `longer` (the op of the same task and iteration), or None unless every processor's ops
    are a subsequence of its ops in `longer` (same processor, same order)."""
    n, total = bounds[-1], longer.num_ops
    if len(bounds) != len(longer.bounds) or n > total:
        return None
    if not n:
        return np.zeros(0, dtype=np.int64)
    known = {t: k for k, t in enumerate(longer.tasks)}
    ids = [known.get(t, -1) for t in tasks]
    if min(ids, default=0) < 0 or int(iteration.min()) < 0:
        return None
    span = int(longer.iteration.max()) + 1 if total else 0
    if int(iteration.max()) >= span or len(longer.tasks) * span > MAX_CELLS_PER_OP * max(total, 1) + 1024:
        return None
    # `longer` compiled without duplicate keys: each cell holds at most one op.
    index = np.full(len(longer.tasks) * span, -1, dtype=np.int64)
    index[longer.task * span + longer.iteration] = np.arange(total, dtype=np.int64)
    pos = index[np.asarray(ids, dtype=np.int64)[task] * span + iteration]
    if int(pos.min()) < 0 or (n > 1 and not bool((pos[1:] > pos[:-1]).all())):
        return None  # an op `longer` lacks, or out of order (ops are numbered processor-major in both)
    # Increasing numbers: each processor's ops lie within its own range of `longer`'s numbers.
    cut = np.asarray(bounds, dtype=np.int64)
    own = np.asarray(longer.bounds, dtype=np.int64)
    has = cut[1:] > cut[:-1]
    first, last = pos[cut[:-1][has]], pos[cut[1:][has] - 1]
    if bool((first < own[:-1][has]).any()) or bool((last >= own[1:][has]).any()):
        return None
    return pos


#: CSR producers: (pointer per consumer, producers, words, role codes, role names).
Producers = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]


def _restricted_producers(longer: CompiledSchedule, pos: np.ndarray, kept: np.ndarray, renumber: np.ndarray,
                          keep_codes: bool) -> Producers | None:
    """The kept ops' producers (`kept` per op of `longer`, at `pos`; `renumber`: their new numbers), as `longer`
    lists them, renumbered; None if one of them is not kept. Role codes stay `longer`'s with `keep_codes`, else
    are numbered by first appearance among the kept entries."""
    n = len(pos)
    found = _kept_entries(longer, kept)
    if found is None:
        return None
    count, entries, producer = found
    ptr = np.zeros(n + 1, dtype=np.int64)
    count.take(pos).cumsum(out=ptr[1:])
    role = longer.prod_role[entries]
    if keep_codes or not len(role):  # (no entries: no role appears, unless the edges number them)
        return ptr, renumber.take(producer), longer.prod_words[entries], role, longer.roles if keep_codes else ()
    # Roles numbered by first appearance among the kept entries, as compiling the kept ops numbers them.
    codes, first = np.unique(role, return_index=True)
    ranked = codes[first.argsort()].tolist()
    names = tuple(longer.roles[r] for r in ranked)
    if ranked != list(range(len(ranked))):
        code = np.zeros(len(longer.roles), dtype=role.dtype)
        code[ranked] = np.arange(len(ranked))
        role = code.take(role)
    return ptr, renumber.take(producer), longer.prod_words[entries], role, names


def restricted_link_plan(plan: LinkPlan, pos: np.ndarray, kept: np.ndarray, renumber: np.ndarray,
                         bounds: list[int]) -> LinkPlan:
    """The `link_plan` of the ops at `pos` (increasing op numbers of `plan`'s schedule, every producer of theirs
    among them: a `restricted_compile`; `kept` per op, `renumber` their new numbers), cut out of `plan`. Its
    transfers are the pairs of its dependencies, the kept consumers' pairs: the kept transfers, in the same
    (producer, consumer) order, numbered from the new op count on; each op's inputs are its same-processor
    producers, then its transfers, as before."""
    total, n = len(plan.input_ptr) - 1, len(pos)
    count = plan.input_ptr[1:] - plan.input_ptr[:-1]
    src = plan.input_src[kept.repeat(count)]  # the kept ops' inputs
    is_transfer = src >= total
    # Every transfer is one input of its consumer: the kept ones are the kept ops' transfer inputs.
    keep_transfer = np.zeros(len(plan.word_array), dtype=bool)
    keep_transfer[src[is_transfer] - total] = True
    number = keep_transfer.cumsum() + (n - 1)  # old transfer → its new input number, for kept ones
    if len(number):
        new_src = np.where(is_transfer, number.take(np.where(is_transfer, src - total, 0)),
                           renumber.take(np.where(is_transfer, 0, src)))
    else:  # no transfer (shared memory, or every producer on its consumer's processor)
        new_src = renumber.take(src)
    ptr = np.zeros(n + 1, dtype=np.int64)
    count.take(pos).cumsum(out=ptr[1:])
    return LinkPlan(ptr, new_src, renumber.take(plan.send_producer[keep_transfer]), number[keep_transfer],
                    plan.send_link[keep_transfer], plan.word_array[keep_transfer], bounds)

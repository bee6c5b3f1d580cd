"""The compiled schedule's dependencies as CSR arrays (`layerpipe.schedule._engine` builds its schedules with
these): producers per consumer op, the words each sends, the role codes and names.

Three sources, all giving exactly what `layerpipe.schedule._deps.dependencies()` lists (contract 1), in its
order: simple asynchronous layer-level schedules from `layer_task_edges` (dst(t) needs src(t − delay)) with array
indexing; stage-level, synchronous and grouped schedules from `dependency_arrays` (the rules as arrays); anything
else, and every error, from `dependencies()` op by op.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from layerpipe.schedule._deps import MissingProducer, TaskEdge, dependency_arrays, layer_task_edges
from layerpipe.schedule._int_lists import INT32_MAX, INT32_MIN, stable_argsort
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._stage_deps import stage_dependency_arrays
from layerpipe.schedule._workload import Workload

#: Largest (tasks × iterations) lookup table the array path of the dependencies builds.
MAX_INDEX_CELLS = 50_000_000

#: Producers as CSR: (pointer per consumer, producers, words, role codes, role names).
Csr = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]


def _csr(consumer: np.ndarray, producer: np.ndarray, words: np.ndarray, role: np.ndarray, n: int,
         roles: tuple[str, ...]) -> Csr:
    order = stable_argsort(consumer)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(consumer, minlength=n), out=ptr[1:])
    return ptr, producer[order], words[order], role[order], roles


def _array_dependencies(schedule: OpSchedule, tasks: tuple[tuple[str, int], ...], task: np.ndarray,
                        iteration: np.ndarray, workload: Workload) -> Csr | None:
    """CSR arrays from SIR's `dependency_arrays`: the rules of `dependencies()` as arrays, the same producers in
    the same order with the same role numbering; None where they do not apply. The tasks are numbered as
    `compile_schedule` numbers them (by first appearance: every caller passes a compiled schedule's)."""
    if schedule.level != workload.level:
        return None  # `dependencies()` says why
    if workload.level == "layer":
        arrays = dependency_arrays(schedule, tasks, task, iteration, graph=workload.graph)
    else:  # the stage rules' own builder where it applies (1F1B, ZB-H1 ...: a third of the rule table's time)
        arrays = stage_dependency_arrays(schedule, tasks, task, iteration, workload.stages, numbered=True)
        if arrays is None:
            arrays = dependency_arrays(schedule, tasks, task, iteration, stages=workload.stages)
    if arrays is None:
        return None
    return arrays.ptr, arrays.producer, arrays.words, arrays.role, arrays.roles


def _listed_dependencies(schedule: OpSchedule, ops: list[Op], workload: Workload) -> Csr:
    """CSR arrays from `dependencies()` (contract 1), op by op."""
    deps = workload.dependencies(schedule)
    # The map lists ops in schedule order (identity check); looking each op up would hash every Op.
    listed = list(deps.items())
    if len(listed) == len(ops) and all(a is b for (a, _), b in zip(listed, ops, strict=True)):
        per_op = [d for _, d in listed]
    else:
        per_op = [deps[op] for op in ops]
    flat = [(i, dep) for i, dep_list in enumerate(per_op) for dep in dep_list]
    index_of = {id(op): i for i, op in enumerate(ops)}
    try:
        producer = [index_of[id(dep.producer)] for _, dep in flat]
    except KeyError:  # an equal but distinct Op object: look producers up by key
        by_key = {op.key: i for i, op in enumerate(ops)}
        producer = [by_key[dep.producer.key] for _, dep in flat]
    role_ids: dict[str, int] = {}
    role = [role_ids.setdefault(dep.role, len(role_ids)) for _, dep in flat]
    return _csr(np.fromiter((i for i, _ in flat), np.int64, len(flat)), np.asarray(producer, np.int64),
                np.fromiter((dep.words for _, dep in flat), np.int64, len(flat)), np.asarray(role, np.int8),
                len(ops), tuple(role_ids))


def _task_edge_dependencies(schedule: OpSchedule, op_at: Callable[[int], Op], tasks: tuple[tuple[str, int], ...],
                            task: np.ndarray, iteration: np.ndarray, workload: Workload) -> Csr | None:
    """CSR arrays of an asynchronous layer-level schedule from `layer_task_edges`: op dst(t) needs src(t − delay)."""
    assert workload.graph is not None
    n = len(task)
    span = int(iteration.max()) + 1 if n else 0
    if len(tasks) * span > MAX_INDEX_CELLS:  # sparse iteration numbers: look producers up op by op instead
        return None
    # int32 where the numbers fit (issue 14: these are the compile step's peak): the op numbers, the words.
    small = n < INT32_MAX
    index = np.full((len(tasks), span), -1, dtype=np.int32 if small else np.int64)
    index[task, iteration] = np.arange(n)
    task_id = {t: k for k, t in enumerate(tasks)}
    members = stable_argsort(task)
    cuts = np.searchsorted(task[members], np.arange(len(tasks) + 1))
    role_ids: dict[str, int] = {}
    task_edges = layer_task_edges(workload.graph, schedule.read_staleness_map())
    live = [(e, task_id[e.dst]) for e in task_edges if e.dst in task_id]
    for e, _ in live:  # roles numbered in edge order (an edge into a present task numbers its role)
        role_ids.setdefault(e.role, len(role_ids))
    per_task = np.diff(cuts)
    if int(per_task[[dst for _, dst in live]].sum()) <= MAX_AT_ONCE:
        return _edges_at_once(live, task_id, role_ids, op_at, members, cuts, iteration, index, n, small)
    # Two passes over the edges, so no array of every edge is built twice: count each consumer's producers (and
    # find a missing one, first edge first), then write each edge's producers at their consumers' next free
    # places — consumer-major and, per consumer, in edge order (what a stable sort of all edges by consumer
    # gives).
    edges = []
    count = np.zeros(n, dtype=np.int64)
    for e, dst in live:
        role = role_ids[e.role]
        consumers, producers, t = _edge_producers(e, dst, task_id.get(e.src), members, cuts, iteration, index)
        missing = np.flatnonzero(producers < 0)
        if len(missing):
            k = int(missing[0])
            raise MissingProducer(op_at(int(consumers[k])), (*e.src, int(t[k])))
        if len(consumers):
            count[consumers] += 1
            edges.append((e, dst, role))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=ptr[1:])
    narrow_words = all(INT32_MIN <= e.words <= INT32_MAX for e, _, _ in edges)
    producer = np.empty(int(ptr[-1]), dtype=np.int32 if small else np.int64)
    words = np.empty(int(ptr[-1]), dtype=np.int32 if narrow_words else np.int64)
    role_of = np.empty(int(ptr[-1]), dtype=np.int8)
    cursor = ptr[:-1].copy()
    for e, dst, role in edges:
        consumers, producers, _ = _edge_producers(e, dst, task_id.get(e.src), members, cuts, iteration, index)
        at = cursor[consumers]
        producer[at] = producers
        words[at] = e.words
        role_of[at] = role
        cursor[consumers] += 1
    return ptr, producer, words, role_of, tuple(role_ids)


#: (Edge, consumer) pairs up to which `_task_edge_dependencies` takes every edge at once (a few arrays of that
#: length, ~50 B per pair); above, edge by edge in two passes (memory per op, issue 14).
MAX_AT_ONCE = 1 << 16


def _edges_at_once(live: list[tuple[TaskEdge, int]], task_id: dict[tuple[str, int], int], role_ids: dict[str, int],
                   op_at: Callable[[int], Op], members: np.ndarray, cuts: np.ndarray, iteration: np.ndarray,
                   index: np.ndarray, n: int, small: bool) -> Csr:
    """`_task_edge_dependencies`' CSR from one pass over every (edge, consumer) pair: a schedule of a few thousand
    ops has a few hundred task edges, and the edge-by-edge passes made ~20 numpy calls per edge (issue 14: 2.7 ms
    per compile of an explore point). The same entries in the same order: the pairs are listed edge by edge, each
    edge's consumers in op order, then sorted stably by consumer; the same first missing producer."""
    k = len(live)
    dst = np.asarray([d for _, d in live], dtype=np.int64)
    src = np.asarray([task_id.get(e.src, -1) for e, _ in live], dtype=np.int64)
    delay = np.asarray([e.delay for e, _ in live], dtype=np.int64)
    words_of = np.asarray([e.words for e, _ in live], dtype=np.int64)
    role_of = np.asarray([role_ids[e.role] for e, _ in live], dtype=np.int8)
    count = cuts[dst + 1] - cuts[dst] if k else np.zeros(0, dtype=np.int64)
    edge = np.repeat(np.arange(k, dtype=np.int64), count)
    first = np.cumsum(count) - count
    consumer = members[cuts[dst][edge] + np.arange(len(edge), dtype=np.int64) - first[edge]]
    t = iteration[consumer] - delay[edge]
    needed = t >= 0
    edge, consumer, t = edge[needed], consumer[needed], t[needed]
    e_src = src[edge]
    producer = np.full(len(edge), -1, dtype=index.dtype)
    has_src = e_src >= 0
    producer[has_src] = index[e_src[has_src], t[has_src]]
    missing = np.flatnonzero(producer < 0)
    if len(missing):
        at = int(missing[0])
        raise MissingProducer(op_at(int(consumer[at])), (*live[int(edge[at])][0].src, int(t[at])))
    used = np.bincount(edge, minlength=k) > 0  # edges with a consumer: their words decide the words' type
    narrow = all(INT32_MIN <= w <= INT32_MAX for w in words_of[used].tolist())
    order = stable_argsort(consumer)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(consumer, minlength=n), out=ptr[1:])
    edge = edge[order]
    return (ptr, producer[order].astype(np.int32 if small else np.int64, copy=False),
            words_of.astype(np.int32 if narrow else np.int64)[edge], role_of[edge], tuple(role_ids))


def _edge_producers(e: TaskEdge, dst: int, src: int | None, members: np.ndarray, cuts: np.ndarray,
                    iteration: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(consumers, producers, producer iterations) of task edge `e` into task `dst`: every op dst(t) with
    t − delay ≥ 0 needs src(t − delay); producer −1 where src has no such op."""
    consumers = members[cuts[dst]:cuts[dst + 1]]
    t = iteration[consumers] - e.delay
    needed = t >= 0
    consumers, t = consumers[needed], t[needed]
    producers = index[src, t] if src is not None else np.full(len(t), -1, dtype=np.int64)
    return consumers, producers, t

"""The training graph in index form for the scheduling passes (design notes §5).

- `TaskTable` — costs, delay-0 precedence (the dependency rules of `_deps`), a topological order, the words
                each precedence edge carries and the weight reads.
- `TaskTable.token` — one int per distinct table content, the key the memos of pure passes use (a table is
                built again for every call on the same network, so identity would never hit).
- `table_of`   — the table of a network's training graph under graph options and a cost model, memoised (the
                policies of one sweep point build the same ones: layerpipe with and without a staleness bound,
                its replicated candidate and pipedream).

The memos of pure passes here and elsewhere register in `layerpipe._memo` (`clear_memos` empties them all).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from functools import cached_property

from layerpipe._memo import BoundedMemo, memo
from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, Task, TrainingGraph, build_training_graph
from layerpipe.network import Network
from layerpipe.schedule._deps import layer_task_edges

#: Table contents (every field but the graph, with the class) → their token; the oldest dropped past the cap. A
#: dropped content that comes back gets a new token (the counter never repeats), so a token names one content.
_TOKENS: dict[tuple[object, ...], int] = memo({})
_TOKENS_KEPT = 64
_NEXT_TOKEN = itertools.count()


@dataclass(frozen=True)
class TaskTable:
    """A training graph in index form for the scheduling passes."""

    graph: TrainingGraph
    tasks: tuple[Task, ...]
    cost: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]  # delay-0 precedence predecessors (the dependency rules of `_deps`)
    topo: tuple[int, ...]
    #: Words each precedence edge carries, aligned with `preds` (what crosses when the ends are apart).
    pred_words: tuple[tuple[int, ...], ...] = ()
    #: Weight reads (U task, reader task, |W| words): the reader gets every new version from U.
    weight_reads: tuple[tuple[int, int, int], ...] = ()

    @staticmethod
    def of(graph: TrainingGraph, model: CostModel) -> TaskTable:
        costs = graph.costs(model)
        order = graph.intra_iteration_order()
        index = {t: i for i, t in enumerate(order)}
        words: list[dict[int, int]] = [{} for _ in order]
        for e in layer_task_edges(graph):
            if e.delay == 0:
                u, v = index[Task(e.src[1], e.src[0])], index[Task(e.dst[1], e.dst[0])]
                words[v][u] = words[v].get(u, 0) + e.words
        preds = tuple(tuple(sorted(w)) for w in words)
        reads = tuple(sorted((index[e.src], index[e.dst], e.words) for e in graph.edges if e.role == "weights"))
        return TaskTable(graph, tuple(order), tuple(costs[t] for t in order), preds, tuple(range(len(order))),
                         tuple(tuple(words[v][u] for u in ps) for v, ps in enumerate(preds)), reads)

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def total(self) -> int:
        return sum(self.cost)

    @cached_property
    def precedence(self) -> tuple[list[int], list[int]]:
        """The delay-0 precedence edges as aligned (sources, heads) lists, by head in index order then source:
        the constraint rows of the difference-constraint passes (`_lags`)."""
        return ([u for ps in self.preds for u in ps], [v for v, ps in enumerate(self.preds) for _ in ps])

    @cached_property
    def edge_index(self) -> dict[tuple[int, int], int]:
        """(source, head) → position of that precedence edge in `precedence` (the edges are distinct)."""
        src, dst = self.precedence
        return {(u, v): e for e, (u, v) in enumerate(zip(src, dst, strict=True))}

    @cached_property
    def forward(self) -> bool:
        """Whether `topo` is the index order and every precedence edge runs forward in it: then relaxing the
        edges in `precedence` order (by head) is a topological sweep (`_lags.lags_from_ready`)."""
        src, dst = self.precedence
        return self.topo == tuple(range(len(self.tasks))) and all(u < v for u, v in zip(src, dst, strict=True))

    @cached_property
    def token(self) -> int:
        """An int shared by exactly the tables of equal content (class and every field but `graph`): the memo key
        of passes that read only those fields (`_comm_timing.comm_timing`, `_comm.transfers`). Equal graphs build
        equal tables, and a graph's task order is deterministic, so rebuilt tables of one network hit."""
        content = (type(self).__name__, *(getattr(self, f.name) for f in fields(self) if f.name != "graph"))
        found = _TOKENS.get(content)
        if found is None:
            if len(_TOKENS) >= _TOKENS_KEPT:
                _TOKENS.pop(next(iter(_TOKENS)))
            found = _TOKENS[content] = next(_NEXT_TOKEN)
        return found

    def weight_loops(self) -> tuple[tuple[int, int, int], ...]:
        """(layer, index of the task holding F_l, index of the task holding U_l) per weight layer (built once per
        table: every timing of a candidate reads them)."""
        return self._weight_loops

    @cached_property
    def _weight_loops(self) -> tuple[tuple[int, int, int], ...]:
        where = {(t.layer, a): i for i, t in enumerate(self.tasks) for a in t.kind}
        return tuple((t.layer, where[(t.layer, "F")], i) for i, t in enumerate(self.tasks) if t.has("U"))


#: `table_of`'s memo: (network, graph options, cost model) → the table (read only, like every table).
_TABLES: BoundedMemo[tuple[object, ...], TaskTable] = BoundedMemo(16)


def table_of(network: Network, options: GraphOptions, model: CostModel) -> TaskTable:
    """`TaskTable.of(build_training_graph(network, options), model)`, memoised by its inputs (networks, graph
    options and cost models are values; a model that cannot be hashed is not remembered)."""
    try:
        key = (network, options, model)
        found = _TABLES.get(key)
    except TypeError:
        return TaskTable.of(build_training_graph(network, options), model)
    if found is None:
        found = _TABLES.add(key, TaskTable.of(build_training_graph(network, options), model))
    if found.graph.network is not network:  # an equal network: the result names the caller's own object
        found = replace(found, graph=found.graph.with_network(network))
    return found

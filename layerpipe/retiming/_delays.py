"""Retiming of training graphs: timed views, weight-loop bounds, and the delayed-gradient solver — the
fewest gradient delays D_l that let retiming pipeline a training graph.

`timed_graph` turns a `TrainingGraph` (with task costs and optional D_l) into a `TimedGraph`;
`loop_bounds` gives the weight loop of every layer (its longest path over one iteration, by the
difference-constraint solver).

Formulation (design notes §4). Inputs: a training graph (tasks v, edges e = u→v with delays w(e)), a
stage for every task, and the weight-register rule (on by default). Unknowns: integers D_l ≥ 0, one per
layer with weights, added on the gradient edge G_l → U_l, and a retiming r(v) ∈ ℤ. With
w'(e) = w(e) + D_l if e is the gradient edge of layer l, else w(e), the retimed delays must satisfy

    w_r(e) = w'(e) + r(v) − r(u) ≥ b(e)   for every edge e = u→v, where
    b(e) = 1  if stage(u) ≠ stage(v)                         (a stage boundary holds a pipeline register)
    b(e) = 1  if e is a weight edge U_l → F_l or U_l → E_l   (the weight memory is state; rule can be dropped)
    b(e) = 0  otherwise                                      (w_r ≥ 0: the retiming is legal)

and we minimise Σ_l D_l. Rewritten as difference constraints over x = (r, D):

    r(u) − r(v) − D_{l(e)} ≤ w(e) − b(e)      (the D term only in the row of layer l's gradient edge)

This is an LP, solved by HiGHS (`scipy.optimize.linprog(method="highs")`) with r ≥ 0, D ≥ 0. Its matrix
is a directed graph's incidence matrix (one +1 and one −1 per row) plus one column per layer with a
single nonzero; appending unit columns keeps a matrix totally unimodular, and the right-hand side is
integral, so the vertex HiGHS returns is integral. We check that and round.

The answer is made canonical in a second step: with D fixed, the feasible r form a lattice (difference
constraints), and we report its least element with r ≥ 0 (`solve_difference_constraints`, Bellman–Ford),
so min r = 0.
r(v) is the iteration lag of task v: in period j a periodic schedule runs task v of iteration j − r(v).
The retimed delay of an activation edge is how many iterations its activation waits in a buffer.

Nothing here knows the closed form: on a chain the loop of layer l (U_l → F_l → … → F_L → A_L → … →
A_l → G_l → U_l) crosses S(l) stage boundaries going forward and S(l) coming back and keeps its weight
register, so it needs 2·S(l) + 1 delays and has 1 + D_l; the LP finds D_l = 2·S(l) because that is the
bound, and the tests check it. Every cycle of a training graph passes a gradient edge (the only edges
with delays are weight edges, entered only from U_l, entered only from G_l), so a solution always exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from layerpipe.dfg import Edge, Task, TrainingGraph, iter_loops
from layerpipe.errors import InputError
from layerpipe.retiming._leiserson_saxe import (
    IterationBound,
    TimedGraph,
    iteration_bound,
    solve_difference_constraints,
)

if TYPE_CHECKING:
    import networkx as nx

    from layerpipe.costs import CostModel

__all__ = [
    "DelaySolution",
    "LoopBound",
    "delays_feasible",
    "loop_bounds",
    "min_added_delays",
    "solve_delays",
    "timed_graph",
]


def timed_graph(graph: TrainingGraph, costs: Mapping[Task, int],
                delays: Mapping[int, int] | None = None) -> TimedGraph:
    """A training graph as a timed graph; `delays` adds D_l delays on each layer's G_l → U_l edge."""
    delays = delays or {}
    w = [e.delay + delays.get(e.src.layer, 0) if e.role == "gradient" else e.delay for e in graph.edges]
    src, dst = graph.edge_ends
    # The delay-0 edges are a subset of the training graph's, which are acyclic (one iteration's precedence).
    return TimedGraph.of_indices(graph.tasks, [int(costs[t]) for t in graph.tasks], src, dst, w, graph.task_index,
                                 zero_delay_acyclic=True)


@dataclass(frozen=True)
class LoopBound:
    """The weight loop of a layer: U_l → F_l, the longest path on to G_l → U_l, and its delays."""

    layer: int
    path: tuple[Task, ...]  # F_l … U_l along the longest-time path
    time: int
    delays: int

    @property
    def bound(self) -> Fraction:
        return Fraction(self.time, self.delays)


def loop_bounds(graph: TrainingGraph, costs: Mapping[Task, int],
                delays: Mapping[int, int] | None = None) -> list[LoopBound]:
    """T_loop(l) = (time of the loop's longest path) / (its delays) for every layer with weights.

    The loop closes through the weight edge U_l → F_l; its path F_l ⇝ U_l runs over the delay-0 edges of
    one iteration (the D_l of the gradient edge count as delays of the loop, not as a cut). The tasks
    between F_l and U_l are networkx's descendants of F_l and of U_l in the reversed DAG (both graphs built
    once, over task indices: hashing tasks was most of the time); the longest path is the least solution of
    r(v) ≥ r(u) + t(v) over the edges among them (`solve_difference_constraints` in the DAG's topological
    order), walked back from U_l along tight edges.
    """
    import networkx as nx  # ~0.1 s of import: loaded when used, not with the package

    delays = delays or {}
    tasks = graph.tasks
    index = {t: i for i, t in enumerate(tasks)}
    cost = [int(costs[t]) for t in tasks]
    dag: nx.DiGraph[Any] = nx.DiGraph()  # Any: the stubs type descendants() over object nodes
    dag.add_nodes_from(range(len(tasks)))
    dag.add_edges_from((index[e.src], index[e.dst]) for e in graph.edges if e.delay == 0)
    preds = dag.reverse(copy=True)
    order = list(nx.topological_sort(dag))
    out = []
    for layer, weight_edge in iter_loops(graph):
        start, end = index[weight_edge.dst], index[weight_edge.src]
        between = nx.descendants(dag, start) & nx.descendants(preds, end)
        between.update((start, end))
        rows = [(u, v) for v in between for u in preds.adj[v] if u in between]
        r = solve_difference_constraints(len(tasks), [u for u, _ in rows], [v for _, v in rows],
                                         [cost[v] for _, v in rows], order=order)
        assert r is not None, "one iteration's delay-0 edges are acyclic"
        path = [end]
        while path[-1] != start:
            v = path[-1]
            path.append(next(u for u in preds.adj[v] if u in between and r[u] + cost[v] == r[v]))
        out.append(LoopBound(layer, tuple(tasks[v] for v in reversed(path)), cost[start] + int(r[end]),
                             weight_edge.delay + delays.get(layer, 0)))
    return out


def min_added_delays(
    graph: TimedGraph, required: Sequence[int], group_of_edge: Sequence[int | None], num_groups: int
) -> tuple[list[int], np.ndarray]:
    """Fewest delays x_k ≥ 0 (added to every edge of group k) so that a retiming r gives every edge e at
    least `required[e]` delays; minimises Σ x_k. Returns x and the least r ≥ 0 for that x.

    Raises ValueError when no x works (a cycle without group edges needs more delays than it has).
    """
    return _min_added(len(graph.nodes), graph.src, graph.dst, graph.delays, required, group_of_edge, num_groups)


def _min_added(n: int, src: np.ndarray, dst: np.ndarray, edge_delays: np.ndarray, required: Sequence[int] | np.ndarray,
               group_of_edge: Sequence[int | None], num_groups: int) -> tuple[list[int], np.ndarray]:
    """`min_added_delays` on the edges as index arrays."""
    m = len(src)
    need = np.asarray(required, dtype=np.int64) - edge_delays
    groups = [(k, g) for k, g in enumerate(group_of_edge) if g is not None]
    rows = np.concatenate([np.arange(m), np.arange(m), [k for k, _ in groups]]).astype(np.int64)
    cols = np.concatenate([src, dst, [n + g for _, g in groups]]).astype(np.int64)
    vals = np.concatenate([np.ones(m), -np.ones(m), -np.ones(len(groups))])
    # The LP stays (networkx has no min-cost tension / LP solver): HiGHS solves it exactly. Imported here
    # because scipy costs seconds at CLI start-up, not to dodge a circle.
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    a_ub = coo_matrix((vals, (rows, cols)), shape=(m, n + num_groups)).tocsr()
    cost = np.concatenate([np.zeros(n), np.ones(num_groups)])
    result = linprog(cost, A_ub=a_ub, b_ub=-need, bounds=(0, None), method="highs")
    if result.status == 2:
        raise ValueError("no added delays satisfy the constraints: a cycle without a delay group needs delays")
    if result.status != 0:
        raise RuntimeError(f"HiGHS failed on the delay LP: {result.message}")
    added = np.rint(result.x[n:])
    # Total unimodularity promises an integral vertex; anything else is a bug in the formulation.
    if not np.allclose(result.x[n:], added, atol=1e-6):
        raise AssertionError(f"delay LP returned a fractional vertex: {result.x[n:]}")
    added_ints = [int(a) for a in added]
    r = solve_difference_constraints(n, src, dst, _bounds(need, group_of_edge, added_ints))
    if r is None:
        raise AssertionError("rounded LP delays are infeasible")
    return added_ints, r


def _bounds(need: np.ndarray, group_of_edge: Sequence[int | None], added: Sequence[int]) -> np.ndarray:
    """Per-edge bounds b in r(dst) ≥ r(src) + b once the group delays `added` are placed."""
    extra = np.array([added[g] if g is not None else 0 for g in group_of_edge], dtype=np.int64)
    return need - extra


@dataclass(frozen=True)
class _Problem:
    """A training graph's constraint system: its edges as task indices with their delays, the delays each edge
    must have after retiming, the delay group (layer) of gradient edges, and each group's layer."""

    num_tasks: int
    src: np.ndarray
    dst: np.ndarray
    edge_delays: np.ndarray
    required: np.ndarray
    group_of_edge: list[int | None]
    layers: list[int]  # layer index of each group


def _stage_of_task(graph: TrainingGraph, stages: Sequence[int] | Mapping[Task, int]) -> dict[Task, int]:
    if isinstance(stages, Mapping):
        missing = [str(t) for t in graph.tasks if t not in stages]
        if missing:
            raise InputError(f"stage map has no stage for tasks {', '.join(missing[:5])}")
        out = {t: int(stages[t]) for t in graph.tasks}
    else:
        if len(stages) != len(graph.network):
            raise InputError(f"stage map needs one stage per layer ({len(graph.network)}), got {len(stages)}")
        out = {t: int(stages[t.layer - 1]) for t in graph.tasks}
    if any(s < 0 for s in out.values()):
        raise InputError("stage map: stages must be >= 0")
    return out


def _problem(graph: TrainingGraph, stage: Mapping[Task, int], weight_register: bool) -> _Problem:
    weight_layers = [layer.index for layer in graph.network.layers if layer.has_weights]
    group = {layer: k for k, layer in enumerate(weight_layers)}
    src, dst = graph.edge_ends
    stage_of = np.fromiter((stage[t] for t in graph.tasks), dtype=np.int64, count=len(graph.tasks))
    register = np.fromiter((weight_register and e.role == "weights" for e in graph.edges), dtype=bool,
                           count=len(graph.edges))
    required = ((stage_of[src] != stage_of[dst]) | register).astype(np.int64)  # a stage crossing or a register
    group_of_edge = [group[e.src.layer] if e.role == "gradient" else None for e in graph.edges]
    return _Problem(len(graph.tasks), np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                    np.fromiter((e.delay for e in graph.edges), dtype=np.int64, count=len(graph.edges)),
                    required, group_of_edge, weight_layers)


@dataclass(frozen=True)
class DelaySolution:
    """Delays D_l, lags r and retimed edge delays for a training graph under a stage assignment."""

    graph: TrainingGraph
    stage_of_task: Mapping[Task, int]
    delays: Mapping[int, int]  # D_l by layer index, for layers with weights
    lags: Mapping[Task, int]  # r(v): task v runs iteration j − r(v) in period j
    edge_delays: tuple[int, ...]  # retimed delays w_r, aligned with graph.edges (D_l included)
    weight_register: bool
    bound_before: IterationBound | None = None  # plain SGD (D = 0), with the cost model given
    bound_after: IterationBound | None = None  # with the delays D_l

    @property
    def num_stages(self) -> int:
        return max(self.stage_of_task.values()) + 1 if self.stage_of_task else 0

    def stage_of_layer(self, layer: int) -> int:
        forward = self.graph.task_of(layer, "F")
        if forward is None:
            raise KeyError(layer)
        return self.stage_of_task[forward]

    def stages_after(self, layer: int) -> int:
        """S(l): pipeline stages after the stage of layer l's forward task."""
        return self.num_stages - 1 - self.stage_of_layer(layer)

    def retimed_delay(self, edge: Edge) -> int:
        return self.edge_delays[self.graph.edges.index(edge)]

    def skip_buffers(self) -> list[tuple[Edge, int]]:
        """Activation edges that skip layers (src is not the previous layer) and their buffer depths in
        iterations: the retimed delay, i.e. how many later iterations pass before the consumer reads it."""
        return [(e, d) for e, d in zip(self.graph.edges, self.edge_delays, strict=True)
                if e.role == "activation" and e.src.layer != e.dst.layer - 1]


def solve_delays(
    graph: TrainingGraph,
    stages: Sequence[int] | Mapping[Task, int],
    model: CostModel | None = None,
    *,
    weight_register: bool = True,
) -> DelaySolution:
    """The fewest per-layer gradient delays and the least retiming for a stage assignment.

    `stages` gives a stage per layer (layer order) or per task. With a cost `model`, the solution also
    carries the iteration bounds before (D = 0) and after (with D_l). See the module docstring.
    """
    stage = _stage_of_task(graph, stages)
    problem = _problem(graph, stage, weight_register)
    added, r = _min_added(problem.num_tasks, problem.src, problem.dst, problem.edge_delays, problem.required,
                          problem.group_of_edge, len(problem.layers))
    delays = dict(zip(problem.layers, added, strict=True))
    lags = dict(zip(graph.tasks, r.tolist(), strict=True))
    # w_r = w + D_l (gradient edges) + r(dst) − r(src), edge by edge (`retimed_delays` of the delayed graph)
    src, dst = graph.edge_ends
    edge_delays = np.asarray([e.delay + delays.get(e.src.layer, 0) if e.role == "gradient" else e.delay
                              for e in graph.edges], dtype=np.int64) + r[dst] - r[src]
    before = after = None
    if model is not None:
        costs = graph.costs(model)
        policy: list[int] = []  # Howard's, from the graph without delays to the one with them (same edges)
        before = iteration_bound(timed_graph(graph, costs), policy)
        after = iteration_bound(timed_graph(graph, costs, delays), policy)
    return DelaySolution(graph, stage, delays, lags, tuple(edge_delays.tolist()), weight_register,
                         before, after)


def delays_feasible(
    graph: TrainingGraph,
    stages: Sequence[int] | Mapping[Task, int],
    delays: Mapping[int, int],
    *,
    weight_register: bool = True,
) -> bool:
    """Whether some retiming meets the stage and register constraints with these D_l (missing = 0)."""
    problem = _problem(graph, _stage_of_task(graph, stages), weight_register)
    added = [int(delays.get(layer, 0)) for layer in problem.layers]
    bounds = _bounds(problem.required - problem.edge_delays, problem.group_of_edge, added)
    return solve_difference_constraints(len(graph.tasks), problem.src, problem.dst, bounds) is not None

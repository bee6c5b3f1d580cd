"""The training dataflow graph (design notes §2).

Nodes are tasks of one iteration (one micro-batch): F, A, E, G, U per layer, or fused groups of them.
Edges carry a data volume in words and a delay in iterations. Every variant — LayerPipe's fine split,
the intra-only or inter-only ablations, PipeDream's fused backward — comes out of one builder:

| intra | inter | backward tasks of a weight layer l                                       |
|-------|-------|--------------------------------------------------------------------------|
| yes   | yes   | A_l, E_l, G_l — all separate (LayerPipe)                                 |
| yes   | no    | AE_l (δ_l and e_{l-1} in one task), G_l                                   |
| no    | yes   | A_l, EG_l (E and G in one task, not in parallel)                          |
| no    | no    | AEG_l — PipeDream's fused backward B = A;E;G                              |

Without the inter-layer split the δ computation of layer l stays with W_l's E (the usual per-layer
backward), so A and E of a layer cannot land on different processors. A fused kind is the string of its
atomic parts in F, A, E, G, U order; a layer with no E (its input is the network input) simply lacks the
letter. Weightless layers (pool, flatten, activation, add) have F and, unless they read the network
input, E (their elementwise or pooling backward, fused activation included).

Edges of one iteration have delay 0. Weight edges U_l → F_l and U_l → E_l have delay 1: update k writes
version k+1, which iteration k+1 reads (plain SGD). Under `stash`, E_l reads the weights F_l read, so the
edge is F_l → E_l (role "stash", delay 0) instead of U_l → E_l. The delayed-gradient delays D_l live on
G_l → U_l and are placed by `layerpipe.retiming`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

from layerpipe.costs import CostModel, task_cost
from layerpipe.errors import InputError
from layerpipe.network import INPUT, Layer, Network

if TYPE_CHECKING:
    import networkx as nx

WEIGHT_MODES: tuple[str, ...] = ("stash", "latest", "ema")

#: Edge roles: what an edge carries.
ROLES: tuple[str, ...] = (
    "activation",  # a_l, forward F_p -> F_l
    "kept",  # what a layer keeps from its forward for its backward: z_l (F->A), a_{l-1} (F->G), masks (F->E)
    "loss",  # a_L to the loss derivative at the output layer's backward
    "error",  # e_l, from a consumer's E to this layer's A (or E for weightless layers)
    "delta",  # δ_l, A_l -> E_l and A_l -> G_l
    "gradient",  # g_l, G_l -> U_l (carries D_l)
    "weights",  # W_l, U_l -> F_l and U_l -> E_l, delay 1 (the weight register)
    "stash",  # W_l travelling with the sample, F_l -> E_l under `stash`
)


@dataclass(frozen=True, order=True)
class Task:
    """One task of one iteration: `kind` is an atomic letter (F, A, E, G, U) or a fused group ("AEG")."""

    layer: int
    kind: str

    def __str__(self) -> str:
        return f"{self.kind}{self.layer}"

    def has(self, atomic: str) -> bool:
        return atomic in self.kind


@dataclass(frozen=True)
class Edge:
    src: Task
    dst: Task
    words: int
    delay: int
    role: str


@dataclass(frozen=True)
class GraphOptions:
    """Switches of the graph builder. Defaults are LayerPipe's full split with weight stashing."""

    intra: bool = True
    inter: bool = True
    weight_mode: str = "stash"

    def __post_init__(self) -> None:
        if self.weight_mode not in WEIGHT_MODES:
            raise InputError(f"weight_mode '{self.weight_mode}' is not one of {', '.join(WEIGHT_MODES)}")

    @staticmethod
    def pipedream() -> GraphOptions:
        return GraphOptions(intra=False, inter=False, weight_mode="stash")


def backward_groups(layer: Layer, options: GraphOptions) -> list[str]:
    """The backward task kinds of a layer under the switches, in dependency order."""
    has_e = not layer.takes_network_input
    if not layer.has_weights:
        return ["E"] if has_e else []
    e = "E" if has_e else ""
    if options.intra and options.inter:
        groups = ["A", e, "G"]
    elif options.intra:
        groups = ["A" + e, "G"]
    elif options.inter:
        groups = ["A", e + "G"]
    else:
        groups = ["A" + e + "G"]
    return [g for g in groups if g]


@dataclass(frozen=True)
class TrainingGraph:
    """Tasks and edges of one training iteration of a network, with loop (cross-iteration) edges."""

    network: Network
    options: GraphOptions
    tasks: tuple[Task, ...]
    edges: tuple[Edge, ...]
    _owner: dict[tuple[int, str], Task] = field(default_factory=dict, compare=False, repr=False)
    #: `costs` per cost model (models are frozen values): the schedulers and the delay solver ask for the same
    #: model's costs many times per graph. Not an argument, so `dataclasses.replace` starts a new one.
    _costs: dict[object, dict[Task, int]] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __hash__(self) -> int:
        """The dataclass's hash of the compared fields, computed once per graph: graphs are memo keys of the
        scheduling passes (`TaskTable.graph`), and hashing one walks every task and edge (~90 µs for resnet18,
        ~300 times in issue 14's sweep). Equal graphs still hash alike: the same fields, the same tuple."""
        known: int | None = self.__dict__.get("_hash")
        if known is None:
            known = self.__dict__["_hash"] = hash((self.network, self.options, self.tasks, self.edges))
        return known

    def __getstate__(self) -> dict[str, object]:
        """The fields without the remembered hash: a str hashes differently in another process (a worker)."""
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def with_network(self, network: Network) -> TrainingGraph:
        """This graph naming `network`, a network equal to its own (the caller's object: results name the network
        they were given), with the costs already computed."""
        assert network == self.network, "with_network takes an equal network"
        graph = replace(self, network=network)
        graph._costs.update(self._costs)
        return graph

    def task_of(self, layer: int, atomic: str) -> Task | None:
        """The task that performs atomic kind `atomic` of `layer` (fused or not), or None."""
        return self._owner.get((layer, atomic))

    def costs(self, model: CostModel) -> dict[Task, int]:
        """Cycles of every task under `model` (a new dict each call: the caller may change it)."""
        try:
            known = self._costs.get(model)
        except TypeError:  # a model that is not hashable is not remembered
            known, model_key = None, None
        else:
            model_key = model
        if known is None:
            known = {t: task_cost(model, self.network.layer(t.layer), t.kind, self.network.batch) for t in self.tasks}
            if model_key is not None:
                self._costs[model_key] = known
        return dict(known)

    def layer_tasks(self, layer: int) -> list[Task]:
        return [t for t in self.tasks if t.layer == layer]

    @cached_property
    def successors(self) -> dict[Task, list[Edge]]:
        out: dict[Task, list[Edge]] = {t: [] for t in self.tasks}
        for e in self.edges:
            out[e.src].append(e)
        return out

    @cached_property
    def predecessors(self) -> dict[Task, list[Edge]]:
        out: dict[Task, list[Edge]] = {t: [] for t in self.tasks}
        for e in self.edges:
            out[e.dst].append(e)
        return out

    @cached_property
    def task_index(self) -> dict[Task, int]:
        """Task → its position in `tasks` (built once: hashing `Task`s is what graph passes spend on)."""
        return {t: i for i, t in enumerate(self.tasks)}

    @cached_property
    def edge_ends(self) -> tuple[list[int], list[int]]:
        """Per edge (edge order), the task indices of its source and its destination."""
        index = self.task_index
        return [index[e.src] for e in self.edges], [index[e.dst] for e in self.edges]

    def intra_iteration_order(self) -> list[Task]:
        """Tasks in a topological order of the delay-0 edges (a valid sequential execution order).

        networkx's order (`networkx.topological_sort` of the delay-0 `DiGraph` over task indices: Kahn's,
        generation by generation, nodes and successors in insertion order) — deterministic, the same graph
        always gives the same order — computed by `topological_order` without importing networkx (~0.1 s of
        every `explore` process's CPU, issue 14; tests hold it to networkx's).
        """
        src, dst = self.edge_ends
        zero = [(u, v) for u, v, e in zip(src, dst, self.edges, strict=True) if e.delay == 0]
        order = topological_order(len(self.tasks), zero)
        if order is None:
            raise AssertionError("training graph has a delay-free cycle")
        return [self.tasks[i] for i in order]

    def to_networkx(self, model: CostModel | None = None) -> nx.MultiDiGraph[Task]:
        """The DFG as a networkx multigraph (a fresh copy: editing it does not touch this graph).

        Nodes are the `Task`s, in task order, with attributes `layer`, `kind`, `label` (e.g. "AEG3") and,
        with a cost `model`, `cost` (cycles). Edges keep their order and carry `words`, `delay` and `role`
        (parallel edges are distinct: under PipeDream's fused backward F_l feeds AEG_l three things).
        """
        import networkx as nx

        costs = self.costs(model) if model is not None else None
        graph: nx.MultiDiGraph[Task] = nx.MultiDiGraph(
            network=self.network.name, batch=self.network.batch, intra=self.options.intra, inter=self.options.inter,
            weight_mode=self.options.weight_mode)
        for t in self.tasks:
            attrs: dict[str, object] = {"layer": t.layer, "kind": t.kind, "label": str(t)}
            if costs is not None:
                attrs["cost"] = costs[t]
            graph.add_node(t, **attrs)
        for e in self.edges:
            graph.add_edge(e.src, e.dst, words=e.words, delay=e.delay, role=e.role)
        return graph

    def gradient_edge(self, layer: int) -> Edge:
        """The G_l → U_l edge, where delayed-gradient delays D_l go."""
        g, u = self.task_of(layer, "G"), self.task_of(layer, "U")
        if g is None or u is None:
            raise KeyError(layer)
        for e in self.successors[g]:
            if e.dst == u:
                return e
        raise KeyError(layer)


def topological_order(n: int, edges: Iterable[tuple[int, int]]) -> list[int] | None:
    """`list(networkx.topological_sort(G))` for the `DiGraph` G with nodes 0 … n−1 added in order, then `edges`
    in order (None where networkx raises `NetworkXUnfeasible`: a cycle). Kahn's algorithm as networkx runs it:
    the nodes of in-degree 0 in node order, then generation by generation each node's children in the order
    their edges were first added, a child joining the next generation when its last parent is taken; parallel
    edges count once (a `DiGraph` keeps one). One queue gives the same sequence as the generations: a
    generation's nodes are all queued before any of the next one's."""
    children: list[dict[int, None]] = [{} for _ in range(n)]  # a dict per node: insertion order, one per child
    for u, v in edges:
        children[u][v] = None
    indegree = [0] * n
    for kids in children:
        for v in kids:
            indegree[v] += 1
    order = [v for v in range(n) if indegree[v] == 0]
    at = 0
    while at < len(order):
        for v in children[order[at]]:
            indegree[v] -= 1
            if indegree[v] == 0:
                order.append(v)
        at += 1
    return order if len(order) == n else None


def build_training_graph(network: Network, options: GraphOptions | None = None) -> TrainingGraph:
    """Build the DFG of one training iteration of `network` under `options`."""
    options = options or GraphOptions()
    batch = network.batch
    tasks: list[Task] = []
    owner: dict[tuple[int, str], Task] = {}

    def add(layer: int, kind: str) -> None:
        task = Task(layer, kind)
        tasks.append(task)
        for atomic in kind:
            owner[(layer, atomic)] = task

    for layer in network.layers:
        add(layer.index, "F")
        for kind in backward_groups(layer, options):
            add(layer.index, kind)
        if layer.has_weights:
            add(layer.index, "U")

    edges: list[Edge] = []

    def connect(src: Task | None, dst: Task | None, words: int, role: str, delay: int = 0) -> None:
        if src is None or dst is None or src == dst:
            return  # absent task, or both ends fused into one task
        edges.append(Edge(src, dst, words, delay, role))

    def backward_entry(layer: Layer) -> Task | None:
        """The task that consumes e_l: A for weight layers, E for weightless ones."""
        return owner.get((layer.index, "A" if layer.has_weights else "E"))

    last = network.layers[-1]
    for layer in network.layers:
        i = layer.index
        f = owner[(i, "F")]
        for src in layer.inputs:
            if src != INPUT:
                connect(owner[(src, "F")], f, batch * network.layer(src).out_size, "activation")
        entry = backward_entry(layer)
        if layer is last:
            # The loss derivative needs a_L (and z_L, the same words when the output is linear).
            factor = 1 if layer.activation == "identity" or not layer.has_weights else 2
            connect(f, entry, factor * batch * layer.out_size, "loss")
        if layer.has_weights:
            a, e, g, u = (owner.get((i, k)) for k in "AEGU")
            w = layer.weight_count
            if layer is not last:
                connect(f, a, batch * layer.out_size, "kept")  # z_l
            connect(f, g, batch * layer.in_size, "kept")  # a_{l-1}
            connect(a, e, batch * layer.out_size, "delta")
            if g is not e:  # with E and G fused into one task, δ_l travels to it once
                connect(a, g, batch * layer.out_size, "delta")
            connect(g, u, w, "gradient")
            connect(u, f, w, "weights", delay=1)
            if options.weight_mode == "stash":
                connect(f, e, w, "stash")
            else:
                connect(u, e, w, "weights", delay=1)
        else:
            connect(f, owner.get((i, "E")), batch * layer.in_size, "kept")  # masks / pooling indices
        # e_{l-1}: this layer's E feeds the backward entry of every producer.
        e_task = owner.get((i, "E"))
        for src in layer.inputs:
            if src != INPUT:
                connect(e_task, backward_entry(network.layer(src)), batch * network.layer(src).out_size, "error")

    graph = TrainingGraph(network, options, tuple(tasks), tuple(edges), owner)
    graph.intra_iteration_order()  # asserts acyclicity of one iteration
    return graph


def iter_loops(graph: TrainingGraph) -> Iterator[tuple[int, Edge]]:
    """The weight loops: (layer, U_l → F_l edge) for every layer with weights."""
    for e in graph.edges:
        if e.role == "weights" and e.dst.has("F"):
            yield e.src.layer, e

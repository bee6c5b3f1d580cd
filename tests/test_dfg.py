"""The training dataflow graph: hand-checked edges, the four split variants, weight modes, DAG errors, and
invariants over random chains and residual DAGs."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.dfg import (
    ROLES,
    GraphOptions,
    Task,
    TrainingGraph,
    backward_groups,
    build_training_graph,
    iter_loops,
    topological_order,
)
from layerpipe.errors import InputError
from layerpipe.network import Network, load_network
from tests.strategies import networks

VARIANTS = {
    "layerpipe": GraphOptions(intra=True, inter=True),
    "intra-only": GraphOptions(intra=True, inter=False),
    "inter-only": GraphOptions(intra=False, inter=True),
    "pipedream": GraphOptions.pipedream(),
}


def _edges(graph: TrainingGraph) -> set[tuple[str, str, int, int, str]]:
    out = [(str(e.src), str(e.dst), e.words, e.delay, e.role) for e in graph.edges]
    assert len(out) == len(set(out)), "no edge may appear twice"
    return set(out)


def test_mlp_7_6_5_3_by_hand() -> None:
    """LayerPipe split, stash, B = 2: every edge and its words worked out from design notes §2."""
    graph = build_training_graph(load_network("mlp:7-6-5-3", batch=2))
    assert [str(t) for t in graph.tasks] == ["F1", "A1", "G1", "U1",
                                             "F2", "A2", "E2", "G2", "U2",
                                             "F3", "A3", "E3", "G3", "U3"]
    assert _edges(graph) == {
        # fc1 (7 -> 6): reads the network input, so it has no E
        ("F1", "A1", 12, 0, "kept"), ("F1", "G1", 14, 0, "kept"), ("A1", "G1", 12, 0, "delta"),
        ("G1", "U1", 42, 0, "gradient"), ("U1", "F1", 42, 1, "weights"),
        # fc2 (6 -> 5)
        ("F1", "F2", 12, 0, "activation"),
        ("F2", "A2", 10, 0, "kept"), ("F2", "G2", 12, 0, "kept"), ("F2", "E2", 30, 0, "stash"),
        ("A2", "E2", 10, 0, "delta"), ("A2", "G2", 10, 0, "delta"),
        ("G2", "U2", 30, 0, "gradient"), ("U2", "F2", 30, 1, "weights"), ("E2", "A1", 12, 0, "error"),
        # fc3 (5 -> 3), the output: the loss derivative e_3 = a_3 - y needs a_3 (identity: a_3 = z_3)
        ("F2", "F3", 10, 0, "activation"),
        ("F3", "A3", 6, 0, "loss"), ("F3", "G3", 10, 0, "kept"), ("F3", "E3", 15, 0, "stash"),
        ("A3", "E3", 6, 0, "delta"), ("A3", "G3", 6, 0, "delta"),
        ("G3", "U3", 15, 0, "gradient"), ("U3", "F3", 15, 1, "weights"), ("E3", "A2", 10, 0, "error"),
    }


@pytest.mark.parametrize(("variant", "tasks", "fc2_backward"), [
    ("layerpipe", "F1 A1 G1 U1 F2 A2 E2 G2 U2 F3 A3 E3 G3 U3",
     {("A2", "E2", 10, 0, "delta"), ("A2", "G2", 10, 0, "delta"), ("E2", "A1", 12, 0, "error"),
      ("E3", "A2", 10, 0, "error"), ("F2", "E2", 30, 0, "stash"), ("G2", "U2", 30, 0, "gradient")}),
    ("intra-only", "F1 A1 G1 U1 F2 AE2 G2 U2 F3 AE3 G3 U3",
     {("AE2", "G2", 10, 0, "delta"), ("AE2", "A1", 12, 0, "error"), ("AE3", "AE2", 10, 0, "error"),
      ("F2", "AE2", 30, 0, "stash"), ("G2", "U2", 30, 0, "gradient")}),
    ("inter-only", "F1 A1 G1 U1 F2 A2 EG2 U2 F3 A3 EG3 U3",
     {("A2", "EG2", 10, 0, "delta"), ("EG2", "A1", 12, 0, "error"), ("EG3", "A2", 10, 0, "error"),
      ("F2", "EG2", 30, 0, "stash"), ("EG2", "U2", 30, 0, "gradient")}),
    ("pipedream", "F1 AG1 U1 F2 AEG2 U2 F3 AEG3 U3",
     {("AEG2", "AG1", 12, 0, "error"), ("AEG3", "AEG2", 10, 0, "error"), ("F2", "AEG2", 30, 0, "stash"),
      ("AEG2", "U2", 30, 0, "gradient")}),
])
def test_four_variants_by_hand(variant: str, tasks: str, fc2_backward: set) -> None:
    graph = build_training_graph(load_network("mlp:7-6-5-3", batch=2), VARIANTS[variant])
    assert " ".join(str(t) for t in graph.tasks) == tasks
    edges = _edges(graph)
    layer2 = {e for e in edges if "2" in e[0] + e[1] and e[4] in ("delta", "error", "stash", "gradient")}
    assert layer2 == fc2_backward
    # What crosses layers does not depend on the split: activations forward, errors backward, same words.
    crossing = Counter((e.src.layer, e.dst.layer, e.words, e.role) for e in graph.edges if e.src.layer != e.dst.layer)
    assert crossing == Counter({(1, 2, 12, "activation"): 1, (2, 3, 10, "activation"): 1,
                                (2, 1, 12, "error"): 1, (3, 2, 10, "error"): 1})
    # task_of finds the (possibly fused) owner of every atomic part.
    assert str(graph.task_of(2, "G")) == {"layerpipe": "G2", "intra-only": "G2", "inter-only": "EG2",
                                          "pipedream": "AEG2"}[variant]
    assert graph.task_of(1, "E") is None
    assert graph.gradient_edge(2).words == 30 and graph.gradient_edge(2).dst == Task(2, "U")


@pytest.mark.parametrize("mode", ["latest", "ema"])
def test_stash_versus_latest_weight_edges(mode: str) -> None:
    net = load_network("mlp:7-6-5-3", batch=2)
    stash = _edges(build_training_graph(net, GraphOptions(weight_mode="stash")))
    other = _edges(build_training_graph(net, GraphOptions(weight_mode=mode)))
    assert stash - other == {("F2", "E2", 30, 0, "stash"), ("F3", "E3", 15, 0, "stash")}
    assert other - stash == {("U2", "E2", 30, 1, "weights"), ("U3", "E3", 15, 1, "weights")}
    with pytest.raises(InputError, match="weight_mode 'newest' is not one of stash, latest, ema"):
        GraphOptions(weight_mode="newest")


def test_nonlinear_output_layer_loss_needs_a_and_z() -> None:
    from layerpipe.network import Linear, NetworkBuilder

    net = NetworkBuilder("n", (3,), batch=2).add("fc", Linear(4, activation="sigmoid")).build()
    (loss,) = [e for e in build_training_graph(net).edges if e.role == "loss"]
    assert (str(loss.src), str(loss.dst), loss.words) == ("F1", "A1", 2 * 2 * 4)


def test_resnet18_add_backward_feeds_both_producers() -> None:
    net = load_network("resnet18", batch=2)
    for options in VARIANTS.values():
        graph = build_training_graph(net, options)
        adds = [layer for layer in net.layers if layer.kind == "add"]
        assert len(adds) == 8
        for layer in adds:
            e_add = graph.task_of(layer.index, "E")
            errors = {(e.dst, e.words) for e in graph.successors[e_add] if e.role == "error"}
            want = set()
            for src in layer.inputs:
                producer = net.layer(src)
                entry = graph.task_of(src, "A" if producer.has_weights else "E")
                want.add((entry, 2 * producer.out_size))
            assert errors == want and len(want) == 2, layer.name
            # ... and the forward activations of both producers reach the add.
            assert {e.src.layer for e in graph.predecessors[graph.task_of(layer.index, "F")]
                    if e.role == "activation"} == set(layer.inputs)
        # A block input that feeds both the residual branch and the shortcut gets two error edges.
        pool1 = net.index_of("pool1")
        assert sum(e.role == "error" for e in graph.predecessors[graph.task_of(pool1, "E")]) == 2


@pytest.mark.parametrize("spec", ["resnet50", "vgg16", "lenet5"])
def test_one_iteration_is_acyclic(spec: str) -> None:
    net = load_network(spec)
    for options in VARIANTS.values():
        graph = build_training_graph(net, options)
        _check_invariants(net, graph)


def test_backward_groups() -> None:
    net = load_network("lenet5")
    conv1, pool1, conv2 = net.layer(1), net.layer(2), net.layer(3)
    assert backward_groups(conv1, VARIANTS["pipedream"]) == ["AG"]
    assert backward_groups(conv2, VARIANTS["pipedream"]) == ["AEG"]
    assert backward_groups(conv2, VARIANTS["intra-only"]) == ["AE", "G"]
    assert backward_groups(pool1, VARIANTS["layerpipe"]) == ["E"]
    assert {r for e in build_training_graph(net).edges for r in [e.role]} <= set(ROLES)


def _check_invariants(net: Network, graph: TrainingGraph) -> None:
    # One iteration is acyclic: the order is topological over every delay-0 edge.
    order = graph.intra_iteration_order()
    position = {t: i for i, t in enumerate(order)}
    assert len(order) == len(graph.tasks) == len(set(graph.tasks))
    for e in graph.edges:
        assert e.src != e.dst and e.words > 0 and e.role in ROLES
        if e.delay == 0:
            assert position[e.src] < position[e.dst], (e.src, e.dst)
        else:
            assert e.delay == 1 and e.role == "weights" and e.src.kind == "U"
    # Every task is reachable from some F over delay-0 edges.
    seen = [t for t in graph.tasks if t.kind == "F"]
    reached = set(seen)
    while seen:
        t = seen.pop()
        for e in graph.successors[t]:
            if e.delay == 0 and e.dst not in reached:
                reached.add(e.dst)
                seen.append(e.dst)
    assert reached == set(graph.tasks)
    # The atomic parts of each layer are partitioned among its tasks.
    loops = dict(iter_loops(graph))
    for layer in net.layers:
        parts = "".join(t.kind for t in graph.layer_tasks(layer.index))
        want = ("FAEGU" if layer.has_weights else "FE").replace("E", "" if layer.takes_network_input else "E")
        assert sorted(parts) == sorted(want), layer.name
        units = [t for t in graph.layer_tasks(layer.index) if t.kind == "U"]
        if layer.has_weights:
            # exactly one U and one weight loop U -> F with one delay, carrying |W|
            assert len(units) == 1
            loop = loops[layer.index]
            assert (loop.src, loop.dst, loop.delay, loop.words) == (units[0], Task(layer.index, "F"), 1,
                                                                    layer.weight_count)
            assert graph.gradient_edge(layer.index).words == layer.weight_count
        else:
            assert not units and layer.index not in loops
    # Exactly one loss edge, at the output layer.
    assert [e.src.layer for e in graph.edges if e.role == "loss"] == [len(net)] or (
        net.layers[-1].takes_network_input and not net.layers[-1].has_weights)


@settings(max_examples=250, deadline=None)
@given(networks(max_layers=10, dag=True, max_batch=3), st.sampled_from(list(VARIANTS.values())),
       st.sampled_from(["stash", "latest", "ema"]))
def test_invariants_on_random_chains_and_dags(net: Network, options: GraphOptions, mode: str) -> None:
    options = GraphOptions(options.intra, options.inter, mode)
    graph = build_training_graph(net, options)
    _check_invariants(net, graph)
    # Words on the cross-layer edges equal the producer's activation size, whatever the variant.
    for e in graph.edges:
        if e.role in ("activation", "error"):
            producer = e.src.layer if e.role == "activation" else e.dst.layer
            assert e.words == net.batch * net.layer(producer).out_size


# --- the networkx view ----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(networks(max_layers=8), st.sampled_from(list(VARIANTS.values())), st.sampled_from(["stash", "latest", "ema"]))
def test_to_networkx_carries_every_task_and_edge(net: Network, options: GraphOptions, mode: str) -> None:
    import networkx as nx

    from layerpipe.costs import PEModel

    options = GraphOptions(options.intra, options.inter, mode)
    graph = build_training_graph(net, options)
    model = PEModel(lanes=4, overhead=1)
    g = graph.to_networkx(model)
    assert list(g.nodes) == list(graph.tasks)
    costs = graph.costs(model)
    assert all(g.nodes[t] == {"layer": t.layer, "kind": t.kind, "label": str(t), "cost": costs[t]} for t in g)
    edges = Counter((u, v, d["words"], d["delay"], d["role"]) for u, v, d in g.edges(data=True))
    assert edges == Counter((e.src, e.dst, e.words, e.delay, e.role) for e in graph.edges)
    # The order is a topological order of the delay-0 edges, and networkx agrees the rest is a DAG.
    order = {t: i for i, t in enumerate(graph.intra_iteration_order())}
    assert all(order[e.src] < order[e.dst] for e in graph.edges if e.delay == 0)
    zero = nx.MultiDiGraph([(u, v) for u, v, d in g.edges(data=True) if d["delay"] == 0])
    assert nx.is_directed_acyclic_graph(zero)
    g.remove_node(graph.tasks[0])  # a copy: the training graph is untouched
    assert graph.to_networkx().number_of_nodes() == len(graph.tasks)


def test_network_to_networkx_by_hand() -> None:
    net = load_network("resnet18")
    g = net.to_networkx()
    assert g.number_of_nodes() == len(net) + 1 and g.nodes[0]["kind"] == "input"
    assert g.number_of_edges() == sum(len(layer.inputs) for layer in net.layers)
    adds = [v for v, d in g.nodes(data=True) if d["kind"] == "add"]
    assert len(adds) == 8 and all(g.in_degree(v) == 2 for v in adds)
    for layer in net.layers:
        assert g.nodes[layer.index]["weights"] == layer.weight_count
        for src in layer.inputs:
            words = net.batch * (net.input_size if src == 0 else net.layer(src).out_size)
            assert next(d["words"] for d in g.get_edge_data(src, layer.index).values()) == words


def test_costs_are_remembered_per_model_and_handed_out_as_copies() -> None:
    """`TrainingGraph.costs` keeps each (hashable) cost model's costs: a caller changing its dict does not change
    the next caller's, two models keep their own, and a graph derived by `dataclasses.replace` recomputes."""
    import dataclasses

    from layerpipe.costs import MacsModel, PEModel, task_cost

    graph = build_training_graph(load_network("lenet5"))
    for model in (MacsModel(), PEModel(), PEModel(16, 4)):
        fresh = {t: task_cost(model, graph.network.layer(t.layer), t.kind, 1) for t in graph.tasks}
        first = graph.costs(model)
        assert first == fresh
        first[graph.tasks[0]] = -1
        assert graph.costs(model) == fresh
    batched = dataclasses.replace(graph, network=load_network("lenet5", 4))
    assert batched.costs(MacsModel()) == {
        t: task_cost(MacsModel(), batched.network.layer(t.layer), t.kind, 4) for t in batched.tasks}


@settings(max_examples=40, deadline=None)
@given(networks(max_layers=6), st.booleans(), st.booleans())
def test_graph_hash_is_remembered_and_stays_the_fields_hash(network, intra: bool, inter: bool) -> None:
    """`TrainingGraph.__hash__` computes the dataclass's hash once: equal graphs hash alike, the value is the hash of
    the compared fields, and a pickled graph (a worker's) carries no remembered hash from this process."""
    import pickle

    graph = build_training_graph(network, GraphOptions(intra, inter))
    fields_hash = hash((graph.network, graph.options, graph.tasks, graph.edges))
    assert hash(graph) == fields_hash and hash(graph) == fields_hash  # computed, then remembered
    again = build_training_graph(network, GraphOptions(intra, inter))
    assert again == graph and hash(again) == hash(graph)
    copy = pickle.loads(pickle.dumps(graph))
    assert "_hash" not in copy.__dict__ and copy == graph and hash(copy) == fields_hash


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 12), data=st.data())
def test_topological_order_is_networkx_topological_sort(n: int, data: st.DataObject) -> None:
    """`topological_order` gives `networkx.topological_sort`'s very order (or fails where it raises) on digraphs
    with parallel edges, self-loops and cycles, edges added in any order."""
    import networkx as nx

    node = st.integers(0, max(n - 1, 0))
    edges = data.draw(st.lists(st.tuples(node, node), max_size=3 * n)) if n else []
    graph: nx.DiGraph[int] = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(edges)
    try:
        expected: list[int] | None = list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:
        expected = None
    assert topological_order(n, edges) == expected


@pytest.mark.parametrize("name", ["lenet5", "resnet18", "mlp:8-6-4"])
@pytest.mark.parametrize("options", [GraphOptions(), GraphOptions.pipedream(), GraphOptions(intra=False)])
def test_intra_iteration_order_is_networkx_order(name: str, options: GraphOptions) -> None:
    """The training graph's order is networkx's topological sort of its delay-0 edges over task indices."""
    import networkx as nx

    graph = build_training_graph(load_network(name), options)
    index = {t: i for i, t in enumerate(graph.tasks)}
    dag: nx.DiGraph[int] = nx.DiGraph()
    dag.add_nodes_from(range(len(graph.tasks)))
    dag.add_edges_from((index[e.src], index[e.dst]) for e in graph.edges if e.delay == 0)
    assert graph.intra_iteration_order() == [graph.tasks[i] for i in nx.topological_sort(dag)]

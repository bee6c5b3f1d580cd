"""`layerpipe graph`: table and JSON output, DOT and GraphML graph files, and one-line exit-2 errors."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.cli import main
from layerpipe.costs import MacsModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.network import Network, NetworkBuilder, to_dot, to_graphml
from layerpipe.network._ops import Add, Linear
from tests.conftest import run_cli
from tests.strategies import networks

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "residual_mlp.yaml")


def test_json_mlp_by_hand(capsys) -> None:
    assert main(["graph", "mlp:7-6-5-3", "--batch", "2", "--cost-model", "macs", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["network"], doc["batch"], doc["cost_model"]) == ("mlp:7-6-5-3", 2, "macs")
    assert (doc["num_layers"], doc["num_tasks"], doc["num_edges"]) == (3, 14, 23)  # see test_dfg
    # fc1: 84+12+84+42, fc2: 60+10+60+60+30, fc3: 30+6+30+30+15 (see test_costs)
    assert doc["total_cycles_per_iteration"] == 222 + 220 + 111
    fc2 = doc["layers"][1]
    assert fc2 == {"index": 2, "name": "fc2", "type": "linear", "activation": "relu", "inputs": ["fc1"],
                   "out_shape": [5], "weight_words": 30, "forward_macs": 60,
                   "task_cycles": {"F": 60, "A": 10, "E": 60, "G": 60, "U": 30}}


def test_json_variants_and_pe_model(capsys) -> None:
    assert main(["graph", "mlp:7-6-5-3", "--no-intra", "--no-inter", "--format", "json", "--lanes", "4",
                 "--overhead", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cost_model"] == "pe" and doc["num_tasks"] == 9
    assert doc["layers"][1]["task_cycles"] == {"F": 11, "AEG": 5 + 11 + 11, "U": 11}
    assert main(["graph", "mlp:7-6-5-3", "--no-inter", "--format", "json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["layers"][2]["task_cycles"]) == {"F", "AE", "G", "U"}


def test_json_is_byte_identical_across_runs(capsys) -> None:
    outputs = []
    for _ in range(2):
        assert main(["graph", "resnet18", "--format", "json"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    doc = json.loads(outputs[0])
    add = next(layer for layer in doc["layers"] if layer["name"] == "layer2.0.add")
    assert add["inputs"] == ["layer2.0.conv2", "layer2.0.downsample"] and set(add["task_cycles"]) == {"F", "E"}


def test_table_of_a_yaml_dag(capsys) -> None:
    assert main(["graph", EXAMPLE, "--cost-model", "macs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("residual_mlp: 8 layers, 33 tasks, batch 1, cost model macs, ")
    assert out[1].split() == ["#", "name", "type", "act", "out_shape", "weights", "tasks", "(cycles)"]
    rows = {line.split()[1]: line.split() for line in out[3:]}
    assert rows["block1.add"][2:5] == ["add", "relu", "32"]
    assert rows["stem"][5:] == ["512", "F=512", "A=32", "G=512", "U=512"]


def test_subprocess_table() -> None:
    proc = run_cli("graph", "lenet5", timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("lenet5: 8 layers, 30 tasks, batch 1, cost model pe, ")


def test_help(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["graph", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--format {table,json,dot,graphml}" in out and "--level {training,network}" in out


@pytest.mark.parametrize(("args", "message"), [
    (["graph", "nonet"], "unknown network 'nonet'; allowed: lenet5, alexnet, vgg16, resnet18, resnet50"),
    (["graph", "mlp:7-0-3"], "mlp widths must be positive integers, got 0"),
    (["graph", "mlp:7"], "mlp needs at least two widths"),
    (["graph", "lenet5", "--batch", "0"], "--batch must be a positive integer (>= 1), got 0"),
    (["graph", "lenet5", "--batch", "two"], "--batch must be a positive integer, got 'two'"),
    (["graph", "lenet5", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["graph", "lenet5", "--cost-model", "gpu"], "unknown cost model 'gpu'; allowed: macs, pe, profiled, rtl"),
    (["graph", "lenet5", "--cost-model", "profiled"], "needs --profile FILE.json"),
    (["graph", "lenet5", "--cost-model", "profiled", "--profile", "/no/such.json"], "profile file /no/such.json"),
    (["graph", "lenet5", "--lanes", "0"], "--lanes must be a positive integer"),
    (["graph", "lenet5", "--overhead", "-1"], "overhead must be >= 0, got -1"),
    (["graph", "lenet5", "--bogus"], "unrecognized arguments: --bogus"),
    (["graph"], "the following arguments are required: network"),
    (["graph", "no/such/file.yaml"], "no/such/file.yaml"),
    (["graph", "lenet5", "--level", "network"], "--level applies to --format dot or graphml, not 'table'"),
    (["graph", "lenet5", "--format", "dot", "--level", "layers"], "argument --level: invalid choice: 'layers'"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], message: str, capsys) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("layerpipe: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_subprocess_bad_input_has_no_traceback() -> None:
    proc = run_cli("graph", "resnet51", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "layerpipe: error: unknown network 'resnet51'; allowed: lenet5, alexnet, vgg16, resnet18, " \
                          "resnet50, mlp:W0-W1-..., FILE.yaml\n"


# --- graph files ------------------------------------------------------------------------------------------


def _graphviz_json(dot_text: str) -> dict:
    """Graphviz's own parse of a DOT text (dot -Tjson): the real reader, not a regex."""
    proc = subprocess.run(["dot", "-Tjson"], input=dot_text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _same_multigraph(read: nx.MultiDiGraph, graph: nx.MultiDiGraph) -> None:
    """`read` (from a file, nodes named by label) has exactly `graph`'s nodes, edges and attributes."""
    label = {v: d["label"] for v, d in graph.nodes(data=True)}
    assert list(read.nodes) == [label[v] for v in graph.nodes]
    for v, data in graph.nodes(data=True):
        assert read.nodes[label[v]] == {k: x for k, x in data.items() if k != "label"}
    expected = sorted((label[u], label[v], tuple(sorted(d.items()))) for u, v, d in graph.edges(data=True))
    got = sorted((u, v, tuple(sorted(d.items()))) for u, v, d in read.edges(data=True))
    assert got == expected
    # networkx's reader adds empty node/edge defaults GraphML had no <default> for
    assert {k: v for k, v in read.graph.items() if k not in ("node_default", "edge_default")} == graph.graph


@settings(max_examples=25, deadline=None)
@given(networks(max_layers=6), st.booleans(), st.booleans(), st.sampled_from(["stash", "latest"]))
def test_graphml_round_trips_every_training_graph(net: Network, intra: bool, inter: bool, mode: str) -> None:
    graph = build_training_graph(net, GraphOptions(intra, inter, mode)).to_networkx(MacsModel())
    read = nx.read_graphml(io_text(to_graphml(graph)), force_multigraph=True)
    _same_multigraph(read, graph)


@settings(max_examples=25, deadline=None)
@given(networks(max_layers=6))
def test_graphml_round_trips_every_network(net: Network) -> None:
    graph = net.to_networkx()
    _same_multigraph(nx.read_graphml(io_text(to_graphml(graph)), force_multigraph=True), graph)


def io_text(text: str) -> io.BytesIO:
    return io.BytesIO(text.encode())


@settings(max_examples=8, deadline=None)
@given(networks(max_layers=5), st.booleans())
def test_dot_is_read_by_graphviz_with_every_node_and_edge(net: Network, fused: bool) -> None:
    options = GraphOptions.pipedream() if fused else GraphOptions()
    dfg = build_training_graph(net, options)
    doc = _graphviz_json(to_dot(dfg.to_networkx(MacsModel())))
    names = [o["name"] for o in doc.get("objects", [])]
    assert names == [str(t) for t in dfg.tasks]
    assert len(doc.get("edges", [])) == len(dfg.edges)  # parallel edges stay distinct
    loops = [e for e in doc.get("edges", []) if e.get("style") == "dashed"]
    assert len(loops) == sum(e.delay > 0 for e in dfg.edges)


def test_dot_quotes_names_graphviz_would_split() -> None:
    # '.', '-' and digits first are legal layer names; unquoted DOT would read `conv-1.a` as several tokens.
    net = (NetworkBuilder('odd "net"', [4]).add("1st-layer.a", Linear(4, "relu"))
           .add("b", Linear(4)).add("sum", Add(), ["1st-layer.a", "b"]).add("out", Linear(2)).build())
    doc = _graphviz_json(to_dot(net.to_networkx()))
    assert [o["name"] for o in doc["objects"]] == ["input", "1st-layer.a", "b", "sum", "out"]
    assert doc["name"] == 'odd "net"'
    assert len(doc["edges"]) == 5


def test_cli_writes_dot_and_graphml_files(tmp_path: Path) -> None:
    dot, graphml = tmp_path / "g.dot", tmp_path / "g.graphml"
    assert main(["graph", EXAMPLE, "--format", "dot", "-o", str(dot)]) == 0
    assert main(["graph", EXAMPLE, "--format", "graphml", "--level", "network", "-o", str(graphml)]) == 0
    net_graph = nx.read_graphml(graphml, force_multigraph=True)
    assert net_graph.graph["batch"] == 1 and "input" in net_graph
    assert _graphviz_json(dot.read_text())["name"] == "residual_mlp"
    first = dot.read_bytes()
    assert main(["graph", EXAMPLE, "--format", "dot", "-o", str(dot)]) == 0
    assert dot.read_bytes() == first  # same inputs, same bytes

"""`layerpipe graph NETWORK`: layers, tasks and costs of a network's training graph.

`--format table|json` describe the layers and their task costs; `--format dot|graphml` write the graph
itself for Graphviz or Gephi, at `--level training` (the DFG of one iteration: tasks with costs, edges
with words, delays and roles; the default) or `--level network` (the layer DAG with shapes and words).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from layerpipe.commands._common import (
    add_cost_args,
    add_network_args,
    add_output_arg,
    add_split_args,
    cost_model_from_args,
    emit,
    format_table,
    to_json,
)
from layerpipe.errors import InputError

if TYPE_CHECKING:  # the DFG and the networks import numpy: load them in the handler, not when the parser is built
    from layerpipe.costs import CostModel
    from layerpipe.dfg import TrainingGraph
    from layerpipe.network import Network


FORMATS = ("table", "json", "dot", "graphml")
LEVELS = ("training", "network")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graph", help="layers, tasks and costs of a network's training graph")
    p.add_argument("network", help="zoo name (lenet5, alexnet, vgg16, resnet18, resnet50), mlp:W0-W1-..., or FILE.yaml")
    add_network_args(p)
    add_cost_args(p)
    add_split_args(p)
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table or json (layers and task costs), dot or graphml (the graph, for Graphviz/Gephi)")
    p.add_argument("--level", choices=LEVELS, default=None,
                   help="with dot/graphml: the training graph (tasks, default) or the network (layers)")
    add_output_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from layerpipe.dfg import GraphOptions, build_training_graph
    from layerpipe.network import load_network

    net = load_network(args.network, args.batch)
    model = cost_model_from_args(args, net)
    graph = build_training_graph(net, GraphOptions(intra=not args.no_intra, inter=not args.no_inter))
    if args.format in ("dot", "graphml"):
        return _write_graph(args, net, graph, model)
    if args.level is not None:
        raise InputError(f"--level applies to --format dot or graphml, not '{args.format}'")
    costs = graph.costs(model)
    layers: list[dict[str, Any]] = []
    for layer in net.layers:
        tasks = {t.kind: costs[t] for t in graph.layer_tasks(layer.index)}
        layers.append({
            "index": layer.index,
            "name": layer.name,
            "type": layer.kind,
            "activation": layer.activation,
            "inputs": [net.layer(i).name if i else "input" for i in layer.inputs],
            "out_shape": list(layer.out_shape),
            "weight_words": layer.weight_count,
            "forward_macs": layer.forward_macs * net.batch,
            "task_cycles": tasks,
        })
    if args.format == "json":
        doc = {
            "network": net.name,
            "batch": net.batch,
            "cost_model": model.name,
            "num_layers": len(net),
            "num_tasks": len(graph.tasks),
            "num_edges": len(graph.edges),
            "total_cycles_per_iteration": sum(costs.values()),
            "layers": layers,
        }
        emit(to_json(doc), args.output)
        return 0
    headers = ["#", "name", "type", "act", "out_shape", "weights", "tasks (cycles)"]
    rows = [[d["index"], d["name"], d["type"], d["activation"], "x".join(map(str, d["out_shape"])),
             d["weight_words"], " ".join(f"{k}={v}" for k, v in d["task_cycles"].items())] for d in layers]
    head = (f"{net.name}: {len(net)} layers, {len(graph.tasks)} tasks, batch {net.batch}, "
            f"cost model {model.name}, {sum(costs.values())} cycles per iteration\n")
    emit(head + format_table(headers, rows), args.output)
    return 0


def _write_graph(args: argparse.Namespace, net: Network, graph: TrainingGraph, model: CostModel) -> int:
    from layerpipe.network import to_dot, to_graphml

    nx_graph = net.to_networkx() if args.level == "network" else graph.to_networkx(model)
    if args.level != "network":
        nx_graph.graph["cost_model"] = model.name
    emit(to_dot(nx_graph) if args.format == "dot" else to_graphml(nx_graph), args.output)
    return 0

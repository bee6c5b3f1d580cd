"""`layerpipe delays NETWORK --stages SPEC`: the gradient delays D_l and lags that pipeline a network."""

from __future__ import annotations

import argparse
from fractions import Fraction
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
from layerpipe.commands._names import WEIGHT_MODES

if TYPE_CHECKING:  # retiming imports numpy: load it in the handler, not when the CLI builds its parser
    from layerpipe.retiming import DelaySolution, IterationBound


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("delays", help="per-layer gradient delays and iteration lags for a stage map (retiming)")
    p.add_argument("network", help="zoo name (lenet5, alexnet, vgg16, resnet18, resnet50), mlp:W0-W1-..., or FILE.yaml")
    p.add_argument("--stages", required=True,
                   help="a stage per layer in layer order (0,0,1,2,2) or even:M (M stages of balanced forward cost)")
    add_network_args(p)
    add_cost_args(p)
    add_split_args(p)
    p.add_argument("--weight-mode", choices=WEIGHT_MODES, default="stash", help="what backward E reads (default stash)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_output_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from layerpipe.dfg import GraphOptions, build_training_graph
    from layerpipe.network import load_network
    from layerpipe.retiming import solve_delays
    from layerpipe.stages import parse_stage_map

    net = load_network(args.network, args.batch)
    model = cost_model_from_args(args, net)
    stages = parse_stage_map(args.stages, net, model)
    options = GraphOptions(intra=not args.no_intra, inter=not args.no_inter, weight_mode=args.weight_mode)
    solution = solve_delays(build_training_graph(net, options), stages, model)
    doc = solution_document(solution, cost_model=model.name)
    emit(to_json(doc) if args.format == "json" else _table(doc), args.output)
    return 0


def _cycles(bound: IterationBound | None) -> float | None:
    """A bound in cycles per iteration as a JSON number (exact value in the *_exact keys)."""
    return None if bound is None else round(float(bound.bound), 6)


def _exact(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def solution_document(solution: DelaySolution, cost_model: str) -> dict[str, Any]:
    """The JSON document of `layerpipe delays` (contract keys first, extras after)."""
    graph, net = solution.graph, solution.graph.network
    layers = [{
        "name": layer.name,
        "stage": solution.stage_of_layer(layer.index),
        "delay": solution.delays.get(layer.index),  # null for layers without weights
        "stages_after": solution.stages_after(layer.index),
    } for layer in net.layers]
    before, after = solution.bound_before, solution.bound_after
    doc: dict[str, Any] = {
        "layers": layers,
        "iteration_bound_before": _cycles(before),
        "iteration_bound_after": _cycles(after),
        "num_stages": solution.num_stages,
        "network": net.name,
        "batch": net.batch,
        "cost_model": cost_model,
        "weight_mode": graph.options.weight_mode,
        "intra": graph.options.intra,
        "inter": graph.options.inter,
        "total_delay": sum(solution.delays.values()),
    }
    if before is not None and after is not None:
        doc["iteration_bound_before_exact"] = _exact(before.bound)
        doc["iteration_bound_after_exact"] = _exact(after.bound)
        doc["critical_cycle_after"] = [str(t) for t in after.cycle]
    doc["skip_buffers"] = [{"src": net.layer(e.src.layer).name, "dst": net.layer(e.dst.layer).name,
                            "depth_iterations": depth} for e, depth in solution.skip_buffers()]
    doc["lags"] = {str(t): solution.lags[t] for t in graph.tasks}
    return doc


def _table(doc: dict[str, Any]) -> str:
    lags = doc["lags"]
    rows = []
    for index, layer in enumerate(doc["layers"], start=1):
        rows.append([index, layer["name"], layer["stage"], layer["stages_after"],
                     "-" if layer["delay"] is None else layer["delay"], lags[f"F{index}"]])
    head = (f"{doc['network']}: {doc['num_stages']} stages, weight mode {doc['weight_mode']}, "
            f"total delay {doc['total_delay']} iterations\n"
            f"iteration bound {doc['iteration_bound_before_exact']} -> {doc['iteration_bound_after_exact']} "
            f"cycles per iteration (cost model {doc['cost_model']})\n")
    text = head + format_table(["#", "name", "stage", "stages_after", "delay", "forward_lag"], rows)
    if doc["skip_buffers"]:
        text += "\n" + format_table(["skip src", "skip dst", "buffer (iterations)"],
                                    [[b["src"], b["dst"], b["depth_iterations"]] for b in doc["skip_buffers"]])
    return text

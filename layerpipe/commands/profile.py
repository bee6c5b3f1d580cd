"""`layerpipe profile NETWORK --batch B [--repeats R] -o FILE.json`: measure per-task times with PyTorch.

The JSON it writes is what `--cost-model profiled --profile FILE.json` reads (`ProfiledModel.from_json`).
Without `-o` the JSON goes to stdout; with it, a table of the times (µs) is printed instead.
"""

from __future__ import annotations

import argparse

from layerpipe.commands._common import (
    add_network_args,
    emit,
    format_table,
    non_negative_int,
    output_file,
    positive_int,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="time every layer's F, A, E, G, U with PyTorch on this CPU (profiled costs)")
    p.add_argument("network", help="zoo name (lenet5, alexnet, vgg16, resnet18, resnet50), mlp:W0-W1-..., or FILE.yaml")
    add_network_args(p)
    # limits: a median of 1000 runs is already stable; more threads than 1024 is no CPU this runs on
    p.add_argument("--repeats", type=positive_int("--repeats", 1000), default=5, help="timed runs per task (median)")
    p.add_argument("--warmup", type=non_negative_int("--warmup", 1000), default=1,
                   help="untimed runs per task first (default 1)")
    p.add_argument("--threads", type=positive_int("--threads", 1024), default=1,
                   help="torch intra-op threads (default 1: one core per task, stable times)")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0, help="seed of the random tensors (default 0)")
    p.add_argument("-o", "--output", type=output_file, default=None, help="write the profile JSON here (atomically)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from layerpipe.commands._common import require_extras

    require_extras("profile", "torch")
    from layerpipe.network import load_network  # numpy: at run time, not when the parser is built
    from layerpipe.profile import profile_network

    net = load_network(args.network, args.batch)
    model = profile_network(net, repeats=args.repeats, warmup=args.warmup, seed=args.seed, threads=args.threads)
    if not args.output:
        emit(model.to_json(), None)
        return 0
    emit(model.to_json(), args.output)
    kinds = "FAEGU"
    rows = [[layer.name, *(_us(model.times_ns[layer.name].get(k)) for k in kinds)] for layer in net.layers]
    total_ns = sum(sum(t.values()) for t in model.times_ns.values())
    print(f"{net.name}: batch {net.batch}, median of {args.repeats} runs, {total_ns / 1e3:.1f} µs per iteration "
          f"(all tasks, one after another) -> {args.output}")
    print(format_table(["layer", *(f"{k} µs" for k in kinds)], rows), end="")
    return 0


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:.1f}"

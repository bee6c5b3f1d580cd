"""`layerpipe schedule`: one policy's schedule of a network on N processors, with its metrics.

    layerpipe schedule resnet18 --policy layerpipe -n 8 [--max-staleness 4] [--format text|csv|torch-csv|json]
    layerpipe schedule --policy 1f1b --stages 4 --microbatches 8 [--stage-costs 1,1,1]    (no network)

Policy options are only accepted by the policies that have them (else exit 2 naming the option and the
policy). Periodic schedules print as their body (text, json) or unrolled for `--iterations` (csv);
torch-csv is for stage-level (synchronous) schedules.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from layerpipe.commands._common import (
    add_cost_args,
    add_interconnect_arg,
    add_network_args,
    add_output_arg,
    check_registry_names,
    cost_model_from_args,
    emit,
    interconnect_from_args,
    non_negative_int,
    positive_float,
    positive_int,
    to_json,
)
from layerpipe.commands._names import MAX_PROCS, POLICY_NAMES
from layerpipe.errors import InputError

if TYPE_CHECKING:  # the schedule package imports numpy and networkx: the handler loads it, not the parser
    from layerpipe.schedule import ScheduleResult

#: Most iterations `--format csv` unrolls a periodic schedule for.
MAX_ITERATIONS = 100_000

#: Policy option → its command-line flag, for messages.
OPTION_FLAGS = {
    "intra": "--no-intra",
    "inter": "--no-inter",
    "max_staleness": "--max-staleness",
    "keep_weights_together": "--keep-weights-together",
    "group_size": "-g/--group-size",
    "virtual_stages": "--virtual-stages",
    "microbatches": "--microbatches",
    "push": "--push",
    "allocation": "--allocation",
    "time_limit_s": "--time-limit",
    "reverse_first_k": "--reverse-first-k",
    "bucket_words": "--bucket-words",
    "streams": "--streams",
    "defer": "--defer",
    "comm_priority": "--comm-priority",
    "max_traffic": "--max-traffic",
    "split_layers": "--no-split-layers",
    "replication": "--no-replication",
    "unfold": "--unfold",
}


# Type functions raise ArgumentTypeError: argparse shows its message (a ValueError becomes "invalid value").


def non_negative_float(field: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field} must be a number >= 0, got '{text}'") from None
        if not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"{field} must be a finite number >= 0 (the least any placement "
                                             f"needs is 0: every task on one processor), got {text}")
        return value

    return parse


def stage_costs(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    # F and B >= 1: a stage without forward or input-gradient work has no pipeline to schedule (all zeros gave
    # "cycles_per_sample=0"); W may be 0 (no separate weight-gradient work).
    if len(values) != 3 or min(values[:2]) < 1 or values[2] < 0:
        raise argparse.ArgumentTypeError(f"--stage-costs must be three integers F,B,W like 2,2,1 (cycles; F, B >= 1, "
                                         f"W >= 0), got '{text}'")
    return values


def add_policy_option_args(p: argparse.ArgumentParser) -> None:
    """The policy option flags; each defaults to None so only the flags given reach `policy_options`."""
    g = p.add_argument_group("policy options (only for the policies that have them)")
    g.add_argument("--no-intra", dest="intra", action="store_const", const=False, default=None,
                   help="layerpipe, optimal: keep E and G of a layer in one task")
    g.add_argument("--no-inter", dest="inter", action="store_const", const=False, default=None,
                   help="layerpipe, optimal: keep A and E of a layer in one task")
    g.add_argument("--max-staleness", dest="max_staleness", type=non_negative_int("--max-staleness"),
                   default=None, help="layerpipe: bound on the updates a weight read may lag")
    g.add_argument("--keep-weights-together", dest="keep_weights_together", action="store_const", const=True,
                   default=None, help="layerpipe, optimal: a layer's F, E, G, U on one processor")
    g.add_argument("--max-traffic", dest="max_traffic", type=non_negative_float("--max-traffic"), default=None,
                   metavar="WORDS", help="layerpipe: bound on words moved between processors per sample")
    g.add_argument("--no-split-layers", dest="split_layers", action="store_const", const=False, default=None,
                   help="layerpipe: do not try heavy layers split by output rows/channels over processors")
    g.add_argument("--no-replication", dest="replication", action="store_const", const=False, default=None,
                   help="pipedream: one processor per stage (no replicated stages; the planner's ablation); "
                        "layerpipe: leave PipeDream's replicated plan out of the search (one iteration per period)")
    g.add_argument("--unfold", dest="unfold", type=positive_int("--unfold"), default=None, metavar="J",
                   help="layerpipe: J iterations per period (a task's copies may sit on different processors)")
    g.add_argument("-g", "--group-size", dest="group_size", type=positive_int("-g/--group-size"), default=None,
                   help="ooo: layers per modulo-allocation group (default: the fastest)")
    g.add_argument("--push", dest="push", action="store_const", const=True, default=None,
                   help="ooo: at most N micro-batches in flight (OOO BackProp's push)")
    g.add_argument("--allocation", dest="allocation", choices=("auto", "modulo", "contiguous"), default=None,
                   help="ooo: modulo layer groups, contiguous balanced stages, or the faster (auto, default)")
    g.add_argument("--virtual-stages", dest="virtual_stages", type=positive_int("--virtual-stages"), default=None,
                   help="interleaved-1f1b, zb-h1, looped-bfs: chunks per processor")
    g.add_argument("--microbatches", dest="microbatches", type=positive_int("--microbatches"), default=None,
                   help="synchronous policies, pipedream-2bw: micro-batches per step / update")
    g.add_argument("--time-limit", dest="time_limit_s", type=positive_float("--time-limit"), default=None,
                   help="optimal: HiGHS time limit in seconds")
    # OOO BackProp's data-parallel and single-device schemes (layerpipe.schedule._dataparallel, _streams)
    g.add_argument("--reverse-first-k", dest="reverse_first_k", type=_first_k, default=None,
                   help="dp-ooo: weight layers whose gradients run in forward order, or 'auto' (default)")
    g.add_argument("--bucket-words", dest="bucket_words", type=non_negative_int("--bucket-words"), default=None,
                   help="dp, dp-ooo: gradient bucket size in words (0: one all-reduce per layer)")
    g.add_argument("--streams", dest="streams", type=positive_int("--streams"), default=None,
                   help="stream-ooo: concurrent streams on the device (default 2)")
    g.add_argument("--defer", dest="defer", type=non_negative_int("--defer"), default=None,
                   help="stream-ooo: last weight layers whose gradients run beside the next forward")
    g.add_argument("--comm-priority", dest="comm_priority", action="store_const", const=True, default=None,
                   help="dp, dp-ooo: waiting all-reduce chunks leave lowest layer first (default: first ready)")


def _first_k(text: str) -> int | str:
    if text == "auto":
        return text
    return non_negative_int("--reverse-first-k (or 'auto')")(text)


def given_options(args: argparse.Namespace) -> dict[str, object]:
    return {name: getattr(args, name) for name in OPTION_FLAGS if getattr(args, name, None) is not None}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="one policy's schedule of a network on N processors",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("network", nargs="?", help="zoo name, mlp:W0-W1-..., or FILE.yaml (omit with --stages)")
    p.add_argument("--policy", required=True, help=f"one of {', '.join(POLICY_NAMES)}")
    p.add_argument("-n", "--num-procs", dest="num_procs", type=positive_int("-n/--num-procs", MAX_PROCS), default=None,
                   help="number of processors N")
    p.add_argument("--stages", type=positive_int("--stages", MAX_PROCS), default=None,
                   help="synchronous policies without a network: number of processors (stages per chunk)")
    p.add_argument("--stage-costs", type=stage_costs, default=None,
                   help="with --stages: F,B,W cycles per stage, B the input-gradient part (default 1,1,1)")
    add_policy_option_args(p)
    add_network_args(p)
    add_cost_args(p)
    add_interconnect_arg(p)
    p.add_argument("--format", choices=("text", "csv", "torch-csv", "json"), default="text")
    # capped: unrolling is linear in iterations (lenet5 on 4 processors: 100000 take ~40 s and 0.7 GB)
    p.add_argument("--iterations", type=positive_int("--iterations", MAX_ITERATIONS), default=None,
                   help=f"iterations to unroll a periodic schedule for csv (default 2 x deepest lag + 2, at most "
                        f"{MAX_ITERATIONS})")
    add_output_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # The policy's name first, as before; the cost model's (used with a NETWORK only) before the NETWORK is read.
    check_registry_names(policies=(args.policy,), cost_model=args.cost_model if args.stages is None else None)
    from layerpipe.network import load_network
    from layerpipe.schedule._sync_policies import schedule_stages
    from layerpipe.schedule.policies import POLICIES, get_policy, make_schedule, policy_options

    policy = get_policy(args.policy)
    options = policy_options(args.policy, given_options(args), OPTION_FLAGS)
    if args.stages is not None:
        if args.network is not None:
            raise InputError("give a NETWORK or --stages, not both")
        if not policy.synchronous:
            sync = ", ".join(name for name, pol in POLICIES.items() if pol.synchronous)
            raise InputError(f"--stages takes a synchronous policy ({sync}); '{args.policy}' needs a NETWORK")
        if args.num_procs is not None and args.num_procs != args.stages:
            raise InputError("--stages counts the processors; -n must be left out or equal to it")
        result = schedule_stages(args.policy, args.stages, options, args.stage_costs or (1, 1, 1))
    else:
        if args.network is None:
            raise InputError("NETWORK is required (or --stages for a synchronous policy with uniform stage costs)")
        if args.stage_costs is not None:
            raise InputError("--stage-costs goes with --stages; with a NETWORK the cost model gives stage costs")
        if args.num_procs is None:
            raise InputError("-n/--num-procs is required with a NETWORK")
        network = load_network(args.network, args.batch)
        model = cost_model_from_args(args, network)
        result = make_schedule(args.policy, network, args.num_procs, model, options,
                               interconnect_from_args(args, model))
    emit(render(result, args.format, args.iterations), args.output)
    return 0


def describe(result: ScheduleResult) -> dict[str, object]:
    """The result's identity, options and metrics as a JSON-ready document (stable key order)."""
    return {
        "policy": result.policy,
        "network": result.network.name if result.network is not None else None,
        "batch": result.network.batch if result.network is not None else 1,
        "num_procs": result.num_procs,
        "interconnect": result.interconnect.describe(),
        "options": result.options_dict(),
        **result.metrics.row(),
        "staleness_per_layer": {str(k): v for k, v in sorted(result.metrics.staleness_per_layer.items())},
        "weight_versions_per_layer": {str(k): v for k, v in
                                      sorted(result.metrics.weight_versions_per_layer.items())},
        "stage_layers": [list(layers) for layers in result.stages.layers] if result.stages is not None else None,
        "notes": list(result.notes),
    }


def render(result: ScheduleResult, fmt: str, iterations: int | None = None) -> str:
    from layerpipe.schedule import dump_schedule

    if fmt == "json":
        doc = describe(result)
        doc["schedule"] = json.loads(dump_schedule(result.schedule, "json"))
        return to_json(doc)
    if fmt == "torch-csv":
        if result.explicit is None:
            raise InputError(f"--format torch-csv is for stage-level (synchronous) schedules; '{result.policy}' is "
                             "layer-level: use text, csv or json")
        return dump_schedule(result.explicit, "torch-csv")
    if fmt == "csv":
        return dump_schedule(result.ops(iterations), "csv")
    m = result.metrics
    where = result.network.name if result.network is not None else "uniform stages"
    head = (f"# {result.policy} on {where}, {result.num_procs} processors, interconnect {result.interconnect}: "
            f"cycles_per_sample={m.cycles_per_sample:g} "
            f"lower_bound_cycles={m.lower_bound_cycles:g} utilization_pct={m.utilization_pct:g} "
            f"traffic_words_per_sample={m.traffic_words_per_sample:g} weight_versions={m.weight_versions} "
            f"max_staleness={m.max_staleness}\n")
    notes = "".join(f"# {note}\n" for note in result.notes)
    return head + notes + dump_schedule(result.schedule, "text")

"""`layerpipe simulate`: time a schedule cycle by cycle, optionally run its numerics, write the results.

    layerpipe simulate NETWORK --policy NAME -n N --samples T [--functional float64|fixed] [--mode stash|latest|ema]
        [--lr LR] [--interconnect SPEC] [--seed S] [--cost-model ...] --out DIR
    layerpipe simulate --schedule FILE.csv --stage-costs F,B,W --out DIR            (stage-level, no network)
    layerpipe simulate NETWORK --schedule FILE.csv --out DIR                        (layer-level schedule file)

Policies: asynchronous ones repeat their periodic body for the T samples (T / B iterations); synchronous ones
run ceil(T / (m·B)) steps of m micro-batches, expanded to layer tasks (`expand_stages`) so every layer's F,
A, E, G and U are timed on their own. DIR receives metrics.json, versions.json, trace.json, gantt.png and
gantt.svg, and with --functional also init.npz (W{layer}), data.npz (x, y), final.npz and losses.json. DIR
is written as a temporary sibling and renamed into place, so it is never seen half-written. On a terminal a
progress bar on stderr shows the phase (schedule, compile, simulate, functional, write).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerpipe._files import owns_names, read_text_limited, staged_folder
from layerpipe.commands._common import (
    add_cost_args,
    add_interconnect_arg,
    add_network_args,
    check_registry_names,
    cost_model_from_args,
    interconnect_from_args,
    make_parent,
    non_negative_int,
    positive_float,
    positive_int,
    replaceable_folder,
    to_json,
)
from layerpipe.commands._names import WEIGHT_MODES
from layerpipe.errors import InputError

if TYPE_CHECKING:  # numpy, the schedule package and the simulator load in the handler, not with the parser
    import numpy as np

    from layerpipe.dfg import GraphOptions
    from layerpipe.network import Network
    from layerpipe.schedule import OpSchedule
    from layerpipe.sim import SimConfig, SimResult, Workload

    #: What a run simulates: the schedule, its workload (or, for the policies the stream engine times, the timed
    #: result itself), the network (None for a stage-level schedule file) and the fields metrics.json starts with.
    SimInputs = tuple[OpSchedule, Workload | SimResult, Network | None, dict[str, object]]


def register(sub: argparse._SubParsersAction) -> None:
    from layerpipe.commands.schedule import add_policy_option_args, stage_costs

    p = sub.add_parser("simulate", help="time a schedule cycle by cycle (and run its numerics); write traces",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("network", nargs="?", help="zoo name, mlp:W0-W1-..., or FILE.yaml (omit for stage-level files)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--policy", help="scheduling policy (see `layerpipe schedule --help`)")
    what.add_argument("--schedule", help="explicit schedule file: .csv (layerpipe or torch), .json or text")
    p.add_argument("--schedule-format", choices=("auto", "text", "csv", "torch-csv", "json"), default="auto",
                   help="format of --schedule (default: by suffix; torch CSV recognised by its cells)")
    p.add_argument("--stage-costs", type=stage_costs, default=None,
                   help="stage-level --schedule: F,B,W cycles of every stage, B the input-gradient part")
    p.add_argument("-n", "--num-procs", dest="num_procs", type=positive_int("-n/--num-procs"), default=None,
                   help="number of processors N (with --policy)")
    p.add_argument("--samples", type=positive_int("--samples", MAX_SIM_ITERATIONS * 64), default=None,
                   help="training samples T to run (with --policy; default 8 iterations' worth)")
    p.add_argument("--functional", choices=("float64", "fixed"), default=None,
                   help="also execute the numerics in the simulated order and versions")
    p.add_argument("--mode", default="stash", help=f"weight mode: {', '.join(WEIGHT_MODES)} (default stash)")
    p.add_argument("--lr", type=positive_float("--lr"), default=2.0 ** -4,
                   help="learning rate (fixed point: a power of two 2^-k; default 2^-4)")
    p.add_argument("--total-bits", type=int, default=16, help="fixed point: total bits n (default 16)")
    p.add_argument("--frac-bits", type=int, default=8, help="fixed point: fraction bits f (default 8)")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0,
                   help="seed of the initial weights and data (default 0)")
    for gone in ("--shared-memory", "--link-latency", "--link-words-per-cycle"):
        p.add_argument(gone, nargs=0 if gone == "--shared-memory" else None, action=_Gone, help=argparse.SUPPRESS)
    add_policy_option_args(p)
    add_network_args(p)
    add_cost_args(p)
    add_interconnect_arg(p)
    p.add_argument("--out", required=True,
                   type=replaceable_folder("metrics.json", "layerpipe simulate output", SIM_OUTPUTS),
                   help="output directory (new, empty or an earlier run's; replaced atomically)")
    p.set_defaults(handler=run)


class _Gone(argparse.Action):
    """The interconnect flags before `--interconnect`: one line naming the spelling that replaced them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        raise InputError(f"{option_string} is gone; give --interconnect shared, links:LATENCY:WORDS_PER_CYCLE, "
                         "bus:LATENCY:WORDS_PER_CYCLE or rtl")


def _stage_costs_only(args: argparse.Namespace) -> bool:
    """A stage-level schedule file with its own stage costs: no cost model is read."""
    return args.schedule is not None and args.stage_costs is not None and args.network is None


def _check_names(args: argparse.Namespace) -> None:
    """The weight mode, the cost model and the policy, checked against the static names before the handler imports
    the simulator and the scheduler (issue 14 item 3: ~30 ms, not ~300, for a misspelt name). The mode and the cost
    model come first, as `sim_config` reads them; the policy, which `_from_policy` reads after the NETWORK, comes
    before the NETWORK here."""
    if args.mode not in WEIGHT_MODES:  # = layerpipe.sim.MODES (tests/test_cli_names.py)
        raise InputError(f"--mode '{args.mode}' is not one of {', '.join(WEIGHT_MODES)}")
    check_registry_names(cost_model=None if _stage_costs_only(args) else args.cost_model,
                         policies=() if args.policy is None else (args.policy,))


def sim_config(args: argparse.Namespace) -> SimConfig:
    """The simulator's configuration: the weight mode (`_check_names` checked it) and the interconnect (`rtl` at
    the cost model's lanes)."""
    from layerpipe.sim import SimConfig

    model = None if _stage_costs_only(args) else cost_model_from_args(args)  # None: `rtl` means one lane
    return SimConfig.of(interconnect_from_args(args, model), args.mode)


def run(args: argparse.Namespace) -> int:
    _check_names(args)
    from tqdm import tqdm

    from layerpipe.sim import SimResult, compile_schedule, simulate_compiled

    config = sim_config(args)
    fmt = _fixed_format(args) if args.functional == "fixed" else None
    # Phases of the run on stderr; tqdm shows the bar on a terminal only (disable=None).
    phases = ["schedule", "compile", "simulate", *(["functional"] if args.functional else []), "write"]
    with tqdm(total=len(phases), desc="simulate", unit="phase", disable=None, leave=False) as bar:

        def phase(name: str) -> None:
            bar.set_postfix_str(name)
            bar.update(0 if name == phases[0] else 1)

        phase("schedule")
        if args.schedule is not None:
            schedule, workload, network, info = _from_file(args, config)
        else:
            schedule, workload, network, info = _from_policy(args, config)
        phase("compile")
        if isinstance(workload, SimResult):  # dp, dp-ooo, stream, stream-ooo: timed on the stream engine
            result = workload
        else:
            compiled = compile_schedule(schedule, workload)
            phase("simulate")
            result = simulate_compiled(compiled, workload, config)
        files: dict[str, bytes | Callable[[Path], None]] = {}
        metrics: dict[str, object] = {**info, **result.metrics()}
        if args.functional is not None:
            phase("functional")
            if network is None or schedule.level != "layer":
                raise InputError("--functional needs a NETWORK and a layer-level schedule")
            metrics.update(_functional(args, network, schedule, result, fmt, files))
        phase("write")
        files["metrics.json"] = to_json(metrics).encode()
        files["versions.json"] = to_json({"level": schedule.level, "mode": config.mode,
                                          "versions": result.version_records()}).encode()
        make_parent(args.out)
        _write_outputs(result, files, Path(args.out))
        bar.update(1)
    print(f"{result.total_cycles} cycles, {result.cycles_per_sample:g} cycles/sample, "
          f"{result.utilization_pct:.1f}% utilization, {result.traffic_words} words of traffic -> {args.out}")
    return 0


# --------------------------------------------------------------------------------------------- inputs


def _from_policy(args: argparse.Namespace, config: SimConfig) -> SimInputs:
    from layerpipe.commands.schedule import OPTION_FLAGS, given_options
    from layerpipe.network import load_network
    from layerpipe.schedule.policies import STREAM_ENGINE_POLICIES, make_schedule, policy_options
    from layerpipe.sim import policy_ops, simulate_policy_result, simulated_network

    if args.network is None:
        raise InputError("NETWORK is required with --policy")
    if args.num_procs is None:
        raise InputError("-n/--num-procs is required with --policy")
    if args.stage_costs is not None:
        raise InputError("--stage-costs goes with a stage-level --schedule; with --policy the cost model gives costs")
    network = load_network(args.network, args.batch)
    model = cost_model_from_args(args)
    options = policy_options(args.policy, given_options(args), OPTION_FLAGS)
    result = make_schedule(args.policy, network, args.num_procs, model, options, config.model)
    samples = args.samples or 8 * network.batch
    iterations = -(-samples // network.batch)
    tasks = len(result.graph.tasks) if result.graph is not None else len(network) * 5
    check_run_size(iterations, iterations * tasks, "--samples")
    if args.functional is not None:
        check_functional_size(network, samples)
    workload: Workload | SimResult
    if result.policy in STREAM_ENGINE_POLICIES:  # overlapping kernels: the stream engine times them here
        timed = simulate_policy_result(result, network, model, iterations, config)
        schedule, workload = timed.schedule, timed
    else:
        schedule, workload = policy_ops(result, network, model, iterations, config.mode)
        network = simulated_network(result, network)  # the split variant the policy scheduled, if it split a layer
    info: dict[str, object] = {"network": network.name, "policy": result.policy, "cost_model": model.name,
                               "time_unit": _unit(model), "samples": samples,
                               "interconnect": result.interconnect.spec,
                               "scheduler_cycles_per_sample": result.metrics.cycles_per_sample}
    return schedule, workload, network, info


def _from_file(args: argparse.Namespace, config: SimConfig) -> SimInputs:
    from layerpipe.dfg import build_training_graph
    from layerpipe.network import load_network
    from layerpipe.schedule import PeriodicSchedule, StageInfo, load_schedule
    from layerpipe.sim import Workload

    if args.num_procs is not None or args.samples is not None:
        raise InputError("-n and --samples go with --policy; a --schedule file fixes processors and iterations")
    path = Path(args.schedule)
    text = read_text_limited(path, "--schedule")
    parsed = load_schedule(text, _schedule_format(path, text, args.schedule_format))
    if isinstance(parsed, PeriodicSchedule):  # before the size check: a periodic schedule has no iteration count
        raise InputError(f"--schedule {path}: a periodic schedule; unroll it (`layerpipe schedule --format csv`)")
    check_run_size(parsed.num_iterations, sum(len(row) for row in parsed.procs), f"--schedule {path}")
    if parsed.level == "stage":
        if args.stage_costs is None:
            raise InputError("a stage-level --schedule needs --stage-costs F,B,W")
        if args.network is not None:
            raise InputError("a stage-level --schedule is timed from --stage-costs; leave out NETWORK")
        stages = 1 + max((op.unit for op in parsed.ops()), default=0)
        info: dict[str, object] = {"schedule": path.name, "stage_costs": list(args.stage_costs)}
        workload = Workload.of_stages([args.stage_costs] * stages, StageInfo(stages))
        check_complete(parsed, workload, f"--schedule {path}")
        return parsed, workload, None, info
    if args.network is None:
        raise InputError("a layer-level --schedule needs the NETWORK its ops belong to")
    network = load_network(args.network, args.batch)
    model = cost_model_from_args(args)
    graph = build_training_graph(network, _graph_options(parsed, config.mode))
    info = {"network": network.name, "schedule": path.name, "cost_model": model.name, "time_unit": _unit(model)}
    workload = Workload.of_graph(graph, model)
    check_complete(parsed, workload, f"--schedule {path}")
    if args.functional is not None:
        check_functional_size(network, parsed.num_iterations * network.batch)
    return parsed, workload, network, info


#: Limits of one simulation (issue 12 item 5), checked before any work. The event-driven simulator takes about
#: 30 µs and 1.5 kB per op here (lenet5, 350,000 ops: 12 s, 0.5 GB), so a million ops is about half a minute.
MAX_SIM_ITERATIONS = 100_000
MAX_SIM_OPS = 1_000_000
#: Largest functional run: float64 words of data (x and y of every sample) plus weights. 50M words = 400 MB.
MAX_FUNCTIONAL_WORDS = 50_000_000


def check_run_size(iterations: int, ops: int, field: str) -> None:
    if iterations > MAX_SIM_ITERATIONS:
        raise InputError(f"{field}: {iterations} iterations; the limit is {MAX_SIM_ITERATIONS}")
    if ops > MAX_SIM_OPS:
        raise InputError(f"{field}: {ops} ops to simulate; the limit is {MAX_SIM_OPS} (fewer samples)")


def check_functional_size(network: Network, samples: int) -> None:
    import math

    words = samples * (network.input_size + math.prod(network.output_shape))
    words += 4 * sum(layer.weight_count for layer in network.layers)  # init, final, versions in flight
    if words > MAX_FUNCTIONAL_WORDS:
        raise InputError(f"--functional: {words} float64 words of data and weights; the limit is "
                         f"{MAX_FUNCTIONAL_WORDS} (fewer --samples, a smaller network or --batch)")


def check_complete(schedule: OpSchedule, workload: Workload, field: str) -> None:
    """A schedule file must hold every task of every iteration it names (issue 12 item 7: an empty or
    forward-only schedule 'succeeded'). Layer level: the training graph's tasks for each iteration 0..T-1
    (a synchronous schedule's U ops count steps); stage level: per stage and iteration an F and a backward
    (B, or I and W)."""
    from collections import defaultdict

    ops = list(schedule.ops())
    if not ops:
        raise InputError(f"{field}: the schedule has no ops")
    seen: dict[int, set[tuple[str, int]]] = defaultdict(set)
    steps: dict[int, set[int]] = defaultdict(set)
    for op in ops:
        if schedule.level == "layer" and schedule.synchronous and op.kind == "U":
            steps[op.iteration].add(op.unit)
        else:
            seen[op.iteration].add((op.kind, op.unit))
    if schedule.level == "stage":
        units = sorted({unit for _, unit in workload.durations})
        for t in range(schedule.num_iterations):
            for unit in units:
                have = {kind for kind, u in seen[t] if u == unit}
                if "F" not in have or not ("B" in have or {"I", "W"} <= have):
                    lacks = "F" if "F" not in have else "a backward (B, or I and W)"
                    raise InputError(f"{field}: stage {unit}, micro-batch {t} has no {lacks}; a schedule must "
                                     "hold every task of every micro-batch it runs")
        return
    expected = set(workload.durations)
    if schedule.synchronous:
        updates = {unit for kind, unit in expected if kind == "U"}
        expected = {key for key in expected if key[0] != "U"}
        for step in range(schedule.num_steps):
            if steps[step] != updates:
                lost = sorted(updates - steps[step])
                raise InputError(f"{field}: step {step} has no update U{lost[0] if lost else '?'}; "
                                 "a synchronous schedule updates every weight layer once per step")
    for t in range(schedule.num_iterations):
        missing = sorted(expected - seen[t], key=lambda key: (key[1], key[0]))
        if missing:
            kind, unit = missing[0]
            raise InputError(f"{field}: iteration {t} has no {kind}{unit} ({len(missing)} tasks missing); "
                             "a schedule must hold every task of every iteration it runs")


def _unit(model) -> str:
    """What one unit of every *_cycles field counts (issue 12 item 9): measured nanoseconds for a profile."""
    return "ns" if getattr(model, "name", "") == "profiled" else "cycles"


def _schedule_format(path: Path, text: str, given: str) -> str:
    if given != "auto":
        return given
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix != ".csv":
        return "text"
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            first = next((cell for cell in line.split(",") if cell.strip()), "")
            return "torch-csv" if first.strip()[:1].isdigit() else "csv"
    return "csv"


def _graph_options(schedule: OpSchedule, mode: str) -> GraphOptions:
    """The DFG switches a layer-level schedule's kinds imply (a fused kind says which split is off)."""
    from layerpipe.dfg import GraphOptions

    kinds = {op.kind for op in schedule.ops()}
    intra = not kinds & {"EG", "AEG"}
    inter = not kinds & {"AE", "AEG"}
    return GraphOptions(intra, inter, mode)


# --------------------------------------------------------------------------------------------- numerics


def _fixed_format(args: argparse.Namespace):
    from layerpipe.fixedpoint import FixedFormat

    return FixedFormat(args.total_bits, args.frac_bits)


def _functional(args: argparse.Namespace, network: Network, schedule: OpSchedule, result: SimResult, fmt,
                files: dict[str, bytes | Callable[[Path], None]]) -> dict[str, object]:
    from layerpipe.numerics import init_weights, make_data
    from layerpipe.sim._streams import functional_order
    from layerpipe.sim.functional import FunctionalConfig, order_by_start, run_functional

    config = FunctionalConfig(mode=args.mode, lr=args.lr, fmt=fmt, synchronous=schedule.synchronous,
                              microbatches=max(schedule.microbatches, 1), groups=schedule.groups)
    init = init_weights(network, args.seed, fmt)
    data = make_data(network, result.num_iterations * network.batch, args.seed)
    if schedule.synchronous and len({op.key for op in result.ops}) < len(result.ops):
        order = functional_order(result)  # data-parallel replicas: one update of the one weight set per step
    else:
        order = order_by_start(zip(result.ops, result.start.tolist(), strict=True))
    out = run_functional(network, order, result.version_map, init, data, config)
    files["init.npz"] = _npz(init)
    files["data.npz"] = _npz(data)
    files["final.npz"] = _npz(out.weights)
    losses = [float(v) for v in out.losses]
    files["losses.json"] = to_json({"losses": losses}).encode()
    doc: dict[str, object] = {"functional": args.functional, "lr": args.lr,
                              "final_loss": losses[-1] if losses else None}
    if fmt is not None:
        doc["fixed_format"] = fmt.name
    if args.mode == "ema":
        doc["ema_error_max"] = out.ema_error_max
        doc["ema_error_mean"] = out.ema_error_mean
    return doc


def _npz(arrays: dict[str, np.ndarray]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import numpy as np

        # allow_pickle is savez's default, named so no array name can be matched to it (mypy checks that)
        np.savez(path, allow_pickle=True, **{k: arrays[k] for k in sorted(arrays)})

    return write


# --------------------------------------------------------------------------------------------- output


#: Every file a simulate run writes: an existing --out holding anything else is refused, never deleted.
SIM_OUTPUTS = owns_names("metrics.json", "versions.json", "trace.json", "gantt.png", "gantt.svg", "init.npz",
                         "data.npz", "final.npz", "losses.json")


def _write_outputs(result: SimResult, files: dict[str, bytes | Callable[[Path], None]], out: Path) -> None:
    """Write every file into a temporary sibling of `out`, then swap it into place (`staged_folder`)."""
    from layerpipe.sim.gantt import write_gantt
    from layerpipe.sim.trace import trace_json

    with staged_folder(out, SIM_OUTPUTS) as tmp:
        for name, data in files.items():
            _write_one(tmp / name, data)
        (tmp / "trace.json").write_text(trace_json(result))
        write_gantt(result, tmp / "gantt.png")
        write_gantt(result, tmp / "gantt.svg")


def _write_one(path: Path, data: bytes | Callable[[Path], None]) -> None:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        data(path)


def load_metrics(out: str | Path) -> dict[str, object]:
    """metrics.json of a finished run (for tests and scripts)."""
    return json.loads((Path(out) / "metrics.json").read_text())

"""`layerpipe compare`: cycles per sample of every policy on one cost model, side by side.

    layerpipe compare mlp:784-256-128-10 resnet18 -n 7,8,9 [--policies a,b] [--baseline pipedream]

One row per (network, N, policy). `speedup_vs_baseline` is the baseline's cycles per sample divided by the
policy's (the baseline runs even when it is not listed). Without `--policies`, every policy that runs on
the network is compared: `optimal` only on graphs within its size limit, chunked synchronous policies only
when the network has enough layers. The output depends only on the inputs (byte-identical reruns).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from typing import TYPE_CHECKING

from layerpipe.commands._common import (
    add_cost_args,
    add_interconnect_arg,
    add_network_args,
    add_output_arg,
    check_registry_names,
    cost_model_from_args,
    emit,
    int_list,
    interconnect_from_args,
    to_json,
)
from layerpipe.commands._names import MAX_PROCS, POLICY_NAMES
from layerpipe.errors import InputError

if TYPE_CHECKING:  # the handler imports what the work needs (the schedule package: numpy, networkx); not the parser
    from layerpipe.interconnect import Interconnect

COLUMNS = ("network", "batch", "interconnect", "num_procs", "policy", "cycles_per_sample", "lower_bound_cycles",
           "utilization_pct", "speedup_vs_baseline", "traffic_words_per_sample", "weight_versions", "max_staleness")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="cycles per sample of every policy on one cost model",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("networks", nargs="+", metavar="NETWORK", help="zoo names, mlp:W0-W1-..., FILE.yaml")
    p.add_argument("-n", "--num-procs", dest="num_procs", type=int_list("-n/--num-procs", maximum=MAX_PROCS),
                   required=True, help="processor counts, e.g. 7,8,9 or 2-16")
    p.add_argument("--policies", default=None, help=f"comma-separated subset of {', '.join(POLICY_NAMES)}")
    p.add_argument("--baseline", default="pipedream", help="policy the speedups are relative to (default pipedream)")
    add_network_args(p)
    add_cost_args(p)
    add_interconnect_arg(p)
    from layerpipe.commands.schedule import add_policy_option_args

    add_policy_option_args(p)  # each applies to the compared policies that have it
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    add_output_arg(p)
    p.set_defaults(handler=run)


def compare_rows(networks: list[str], procs: list[int], policies: list[str] | None, baseline: str, model,
                 batch: int | None = None, progress: bool = True,
                 interconnect: Interconnect | None = None,
                 options: dict[str, object] | None = None,
                 skipped: list[dict[str, object]] | None = None) -> list[dict[str, object]]:
    """The comparison rows; `policies=None` means every policy that runs on each network. Every policy is
    scheduled on `interconnect` (default `shared`), and each row names it. `options` (option name → value)
    go to every compared policy that has them; one that no compared policy has is an error."""
    from layerpipe.interconnect import SHARED
    from layerpipe.network import load_network
    from layerpipe.schedule.policies import POLICIES, get_policy, make_schedule, policy_options

    interconnect = interconnect or SHARED
    given = dict(options or {})
    for option in given:
        if not any(option in get_policy(name).option_names for name in (policies or POLICIES)):
            raise InputError(f"option {option} does not apply to any compared policy")

    def chosen(name: str) -> object:
        own = get_policy(name).option_names
        return policy_options(name, {k: v for k, v in given.items() if k in own})
    get_policy(baseline)
    for name in policies or ():
        get_policy(name)
    nets = [load_network(spec, batch) for spec in networks]
    for net in nets:
        check = getattr(model, "check_network", None)  # a profiled model times one network only
        if check is not None:
            check(net)
    jobs = [(net, n, name) for net in nets for n in procs for name in (policies or list(POLICIES))]
    rows: list[dict[str, object]] = []
    baselines: dict[tuple[str, int], float] = {}
    from tqdm import tqdm

    bar = tqdm(jobs, desc="compare", unit="schedule", file=sys.stderr, delay=1.0, leave=False,
               disable=not progress or None)
    for net, n, name in bar:
        bar.set_postfix_str(f"{net.name} N={n} {name}", refresh=False)
        try:
            result = make_schedule(name, net, n, model, chosen(name), interconnect=interconnect)
        except InputError as exc:
            if policies is None and skipped is not None:  # this policy refuses this network or N: say why
                skipped.append({"network": net.name, "num_procs": n, "policy": name, "reason": str(exc)})
                continue
            raise
        key = (net.name, n)
        if key not in baselines:
            baselines[key] = (result.metrics.cycles_per_sample if name == baseline
                              else make_schedule(baseline, net, n, model, chosen(baseline), interconnect=interconnect)
                              .metrics.cycles_per_sample)
        m = result.metrics
        unfolded_bound = m.lower_bound_unfolded_cycles
        # the bound of the schedule's own form: with several iterations per period (replicated stages) the
        # unfolded bound, which such a schedule can reach; otherwise the one-iteration-per-period bound
        own_bound = (unfolded_bound if result.periodic is not None and result.periodic.unfold > 1 and unfolded_bound
                     else m.lower_bound_cycles)
        rows.append({
            "network": net.name,
            "batch": net.batch,
            "interconnect": interconnect.spec,
            "num_procs": n,
            "policy": name,
            "cycles_per_sample": round(m.cycles_per_sample, 1),
            "lower_bound_cycles": round(own_bound, 1),
            "utilization_pct": round(m.utilization_pct, 1),
            "speedup_vs_baseline": round(baselines[key] / m.cycles_per_sample, 3),
            "traffic_words_per_sample": round(m.traffic_words_per_sample, 1),
            "weight_versions": m.weight_versions,
            "max_staleness": m.max_staleness,
        })
    return rows


def run(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies is not None else None
    if policies is not None and not policies:
        raise InputError(f"--policies must name at least one of {', '.join(POLICY_NAMES)}")
    # Before the scheduler is imported (issue 14 item 3); the cost model is read next, the policies' names after
    # it, when the rows are scheduled: a command line with both wrong now names the policy first.
    check_registry_names(policies=policies or (), cost_model=args.cost_model)
    from layerpipe.schedule.policies import POLICIES, get_policy

    model = cost_model_from_args(args)
    interconnect = interconnect_from_args(args, model)
    from layerpipe.commands.schedule import OPTION_FLAGS, given_options

    options = given_options(args)
    for key in options:
        if not any(key in get_policy(name).option_names for name in (policies or POLICIES)):
            raise InputError(f"option {OPTION_FLAGS[key]} does not apply to any compared policy")
    skipped: list[dict[str, object]] = []
    rows = compare_rows(args.networks, args.num_procs, policies, args.baseline, model, args.batch,
                        interconnect=interconnect, options=options, skipped=skipped)
    if not rows:  # issue 12 item 7: an empty table was exit 0
        first = skipped[0] if skipped else {"reason": "no policy ran"}
        raise InputError(f"no policy could be scheduled; the first refusal: {first['reason']}")
    text = render(rows, args.format, args.baseline, describe_model(model), model_fields(model), interconnect)
    emit(_with_skips(_in_time_unit(text, args.format, model), args.format, skipped), args.output)
    return 0


def _with_skips(text: str, fmt: str, skipped: list[dict[str, object]]) -> str:
    """The skipped policies and why, where the reader sees them: under the table, or JSON's `skipped`
    (the CSV holds rows only: the run that wrote it printed nothing else, so it names none)."""
    if not skipped:
        return text
    if fmt == "json":
        import json

        doc = json.loads(text)
        doc["skipped"] = skipped
        return to_json(doc)
    lines = [f"skipped: {s['policy']} on {s['network']} N={s['num_procs']}: {s['reason']}" for s in skipped]
    if fmt == "table":  # after the tables, before the two-line legend (which stays last)
        body = text.splitlines(keepends=True)
        return "".join(body[:-2]) + "\n".join(lines) + "\n\n" + "".join(body[-2:])
    for line in lines:  # CSV: rows only on stdout or in the file; the skips go to stderr
        print(f"layerpipe: note: {line}", file=sys.stderr)
    return text


#: Fields that carry a time, and their names when the cost model counts nanoseconds (profiled), not cycles.
_NS_NAMES = {"cycles_per_sample": "ns_per_sample", "lower_bound_cycles": "lower_bound_ns",
             "cycles/sample": "ns/sample"}


def _in_time_unit(text: str, fmt: str, model) -> str:
    """Issue 12 item 9: `--cost-model profiled` times are nanoseconds; every field and header says so."""
    if getattr(model, "name", "") != "profiled":
        return text
    if fmt == "json":
        import json

        doc = json.loads(text)
        doc["columns"] = [_NS_NAMES.get(c, c) for c in doc["columns"]]
        doc["rows"] = [{_NS_NAMES.get(k, k): v for k, v in row.items()} for row in doc["rows"]]
        doc["time_unit"] = "ns"
        return to_json(doc)
    if fmt == "csv":
        head, _, body = text.partition("\n")
        return ",".join(_NS_NAMES.get(c, c) for c in head.split(",")) + "\n" + body
    legend = text.replace("cycles/sample:", "ns/sample (measured nanoseconds, bound too):")
    return legend.replace("cycles/sample", "    ns/sample")  # same width: the column stays aligned


def model_fields(model) -> dict[str, object]:
    """The cost model as JSON fields: its name and the parameters it has (lanes, overhead)."""
    return {"name": model.name, **{k: getattr(model, k) for k in ("lanes", "overhead") if hasattr(model, k)}}


def describe_model(model) -> str:
    """The cost model in words, for the table's legend (fields the model has: lanes, overhead)."""
    details = [f"{name} {getattr(model, name)}" for name in ("lanes", "overhead") if hasattr(model, name)]
    return f"cost model {model.name}" + (f" ({', '.join(details)})" if details else "")


def render(rows: list[dict[str, object]], fmt: str, baseline: str, model: str = "",
           model_json: dict[str, object] | None = None, interconnect: Interconnect | None = None) -> str:
    from layerpipe.interconnect import SHARED

    interconnect = interconnect or SHARED
    if fmt == "json":
        # the model as fields, not the table legend's prose ("cost model pe (lanes 64, overhead 16)")
        return to_json({"baseline": baseline, "cost_model": model_json if model_json is not None else model,
                        "interconnect": interconnect.describe(),
                        "columns": list(COLUMNS), "rows": [{k: r[k] for k in COLUMNS} for r in rows]})
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in rows)
        return out.getvalue()
    blocks = []
    headers = ["N", "policy", "cycles/sample", "bound", "util %", f"x vs {baseline}", "traffic words/sample",
               "versions", "staleness"]
    keys = ["num_procs", "policy", "cycles_per_sample", "lower_bound_cycles", "utilization_pct",
            "speedup_vs_baseline", "traffic_words_per_sample", "weight_versions", "max_staleness"]
    left = {1}  # the policy column; numbers align right
    for network in dict.fromkeys(r["network"] for r in rows):
        cells = [[_cell(key, r[key]) for key in keys] for r in rows if r["network"] == network]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

        def line(items: list[str], widths: list[int] = widths) -> str:
            return "  ".join(s.ljust(w) if i in left else s.rjust(w) for i, (s, w) in enumerate(zip(items, widths,
                                                                                                 strict=True)))

        batch = next(r["batch"] for r in rows if r["network"] == network)
        text = [f"{network} (batch {batch}, interconnect {interconnect})", line(headers),
                line(["-" * w for w in widths])]
        previous = None
        for c in cells:
            if previous is not None and c[0] != previous:
                text.append("")
            text.append(line(c))
            previous = c[0]
        blocks.append("\n".join(text) + "\n")
    legend = (f"{model}; cycles/sample: steady state per training sample, bound: the policy's lower bound,\n"
              f"x vs {baseline}: speedup, versions: weight versions held at once, staleness: updates a read lags\n")
    return "\n".join(blocks) + "\n" + legend


def _cell(key: str, value: object) -> str:
    if key == "speedup_vs_baseline":
        return f"{value:.2f}x"
    if key == "utilization_pct":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.1f}"
    return str(value)

"""`layerpipe report`: regenerate `reports/` from scratch, deterministically.

Everything in the folder is computed here from the code and fixed inputs (no wall-clock figures, no
randomness without a seed), so a second run gives the same bytes and `tests/test_report.py` can fail
when the committed reports are stale. The folder holds:

- `README.md` — the paper-style comparison (LayerPipe vs PipeDream at N = 7, 8, 9 over the zoo) next to
  GPipe, 1F1B, Zero Bubble and OOO; the intra/inter ablation; Gantt charts; the RTL verification and
  synthesis summary (when the toolchain is present); the cost model and assumptions.
- `compare.csv`, `ablation.csv`, `rtl.json` — the rows behind the tables.
- `speedup.png`, `gantt_*.png` — pictures.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerpipe import __version__
from layerpipe._files import owns_names, staged_folder, write_atomic
from layerpipe.costs import PEModel
from layerpipe.dse._store import write_csv
from layerpipe.interconnect import SHARED, Interconnect, parse_interconnect
from layerpipe.network import load_network
from layerpipe.report_ooo import COLUMNS as OOO_COLUMNS
from layerpipe.report_ooo import ooo_section
from layerpipe.schedule.policies import POLICIES, make_schedule, policy_options

ZOO_NETWORKS: tuple[str, ...] = ("mlp:784-256-128-10", "lenet5", "alexnet", "vgg16", "resnet18", "resnet50")
PAPER_PROCS: tuple[int, ...] = (7, 8, 9)
OTHER_POLICIES: tuple[str, ...] = ("gpipe", "1f1b", "zb-h1", "zb-h2", "ooo")
ABLATION_PROCS = 8
ABLATION = (  # label, layerpipe options
    ("none (PipeDream-like tasks)", {"intra": False, "inter": False}),
    ("intra only", {"intra": True, "inter": False}),
    ("inter only", {"intra": False, "inter": True}),
    ("both (LayerPipe)", {"intra": True, "inter": True}),
    ("both, weights together", {"intra": True, "inter": True, "keep_weights_together": True}),
)
GANTT_NETWORK = "lenet5"
GANTT_PROCS = 4
GANTT_POLICIES = ("layerpipe", "pipedream", "1f1b")


#: The headline's interconnects: free communication (the idealisation earlier figures assumed), the generated
#: hardware's links, and a GPU-like compute:link ratio (1/16 word per cycle per link).
PAPER_INTERCONNECTS: tuple[str, ...] = ("shared", "rtl", "links:2:1/16")
PAPER_BATCHES: tuple[int, ...] = (1, 32)
#: The LayerPipe abstract (arXiv 2108.06629), quoted as written.
ABSTRACT_CLAIM = ("an average speedup of 25% and upwards of 80% with 7 to 9 processors with less communication "
                  "overhead when compared to PipeDream")


@dataclass(frozen=True)
class ReportConfig:
    networks: tuple[str, ...] = ZOO_NETWORKS
    procs: tuple[int, ...] = PAPER_PROCS
    lanes: int = 64
    overhead: int = 16
    rtl: bool = True
    #: The interconnect of every section but the headline's three (`rtl`: the hardware's links, latency 2,
    #: `lanes` words per cycle).
    interconnect: str = "rtl"
    paper_interconnects: tuple[str, ...] = PAPER_INTERCONNECTS
    paper_batches: tuple[int, ...] = PAPER_BATCHES

    @property
    def model(self) -> PEModel:
        return PEModel(self.lanes, self.overhead)

    def link(self, spec: str | None = None) -> Interconnect:
        return parse_interconnect(spec or self.interconnect, lanes=self.lanes)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    rule = "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"
    lines = ["| " + " | ".join(headers) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _schedule_row(network: str, n: int, policy: str, model: PEModel, options: dict | None = None,
                  interconnect: Interconnect | None = None, batch: int | None = None) -> dict:
    net = load_network(network, batch)
    ic = interconnect or SHARED
    result = make_schedule(policy, net, n, model, policy_options(policy, options or {}), ic)
    return {"network": net.name, "batch": net.batch, "interconnect": ic.spec, "num_procs": n, "policy": policy,
            **result.metrics.row()}


def comparison_rows(cfg: ReportConfig, tick: Callable[[], object]) -> list[dict]:
    """Every policy at the paper's processor counts on the report's interconnect, batch 1."""
    rows = []
    for network in cfg.networks:
        for n in cfg.procs:
            for policy in ("layerpipe", "pipedream", *OTHER_POLICIES):
                rows.append(_schedule_row(network, n, policy, cfg.model, interconnect=cfg.link()))
                tick()
    return rows


#: PipeDream without its replicated stages (the planner of earlier versions), when the policy has the switch.
NO_REPLICATION = {"replication": False}


def _has_replication_switch() -> bool:
    return "replication" in POLICIES["pipedream"].option_names


def headline_rows(cfg: ReportConfig, tick: Callable[[], object]) -> list[dict]:
    """LayerPipe against the strongest PipeDream (and, labelled, PipeDream without replication) on each of
    the headline's interconnects and batches, at the paper's processor counts."""
    rows = []
    variants: list[tuple[str, str, dict]] = [("layerpipe", "layerpipe", {}), ("pipedream", "pipedream", {})]
    if _has_replication_switch():
        variants.append(("pipedream (no replication)", "pipedream", NO_REPLICATION))
    for spec in cfg.paper_interconnects:
        ic = cfg.link(spec)
        for batch in cfg.paper_batches:
            for network in cfg.networks:
                for n in cfg.procs:
                    for label, policy, options in variants:
                        row = _schedule_row(network, n, policy, cfg.model, options, ic, batch)
                        rows.append({**row, "policy": label})
                        tick()
    return rows


def paper_section(rows: list[dict], cfg: ReportConfig) -> str:
    """Per interconnect and batch: LayerPipe vs PipeDream, cycles and words per sample, and whether LayerPipe
    was also the one that moved fewer words; then which rows bear out the abstract's claim."""
    by = {(r["interconnect"], r["batch"], r["network"], r["num_procs"], r["policy"]): r for r in rows}
    replication = _has_replication_switch()
    blocks, verdict = [], []
    for spec in cfg.paper_interconnects:
        label = str(cfg.link(spec))
        for batch in cfg.paper_batches:
            table, speedups, fewer, both = [], [], 0, 0
            keys = [k for k in by if k[:2] == (cfg.link(spec).spec, batch) and k[4] == "layerpipe"]
            for ic, b, net, n, _ in keys:
                lp, pd = by[(ic, b, net, n, "layerpipe")], by[(ic, b, net, n, "pipedream")]
                s = pd["cycles_per_sample"] / lp["cycles_per_sample"]
                less = lp["traffic_words_per_sample"] < pd["traffic_words_per_sample"]
                speedups.append(s)
                fewer += less
                both += less and s >= 1.25
                cells = [net, n, _fmt(lp["cycles_per_sample"]), _fmt(pd["cycles_per_sample"]), f"{s:.2f}x"]
                if replication:
                    plain = by[(ic, b, net, n, "pipedream (no replication)")]
                    ratio = plain["cycles_per_sample"] / lp["cycles_per_sample"]
                    cells += [_fmt(plain["cycles_per_sample"]), f"{ratio:.2f}x"]
                cells += [_fmt(lp["traffic_words_per_sample"]), _fmt(pd["traffic_words_per_sample"]),
                          "yes" if less else "no", lp["max_staleness"], pd["max_staleness"]]
                table.append(cells)
            headers = ["network", "N", "LayerPipe cycles/sample", "PipeDream cycles/sample", "speedup"]
            if replication:
                headers += ["PipeDream w/o replication", "speedup vs it"]
            headers += ["LP words/sample", "PD words/sample", "LP fewer words", "LP staleness", "PD staleness"]
            mean = sum(speedups) / len(speedups)
            blocks.append(f"### Interconnect {label}, batch {batch}\n\n" + _md_table(headers, table) +
                          f"\nMean speedup {mean:.2f}x (min {min(speedups):.2f}x, max {max(speedups):.2f}x); "
                          f"LayerPipe moved fewer words in {fewer} of {len(speedups)} rows, and was at least 25% "
                          f"faster with fewer words in {both}.\n")
            verdict.append((label, batch, mean, max(speedups), fewer, both, len(speedups)))
    lines = [f"- {label}, batch {batch}: mean {mean:.2f}x, max {top:.2f}x; fewer words in {fewer}/{count} rows; "
             f"faster by ≥ 25% *and* with fewer words in {both}/{count}."
             for label, batch, mean, top, fewer, both, count in verdict]
    claim = (f"The LayerPipe abstract claims \"{ABSTRACT_CLAIM}\". Against PipeDream's planner "
             + ("(contiguous stages and replicas) " if replication else "(contiguous stages, no replication) ")
             + "on the same cost model, interconnect and batch, our rows give:\n\n" + "\n".join(lines) + "\n")
    return claim + "\n" + "\n".join(blocks)


def others_section(rows: list[dict]) -> str:
    """Cycles per sample of every policy (one interconnect and batch: the rows name them)."""
    policies = ("layerpipe", "pipedream", *OTHER_POLICIES)
    table = []
    for net in dict.fromkeys(r["network"] for r in rows):
        for n in sorted({r["num_procs"] for r in rows if r["network"] == net}):
            cells = {r["policy"]: r for r in rows if r["network"] == net and r["num_procs"] == n}
            table.append([net, n, *(_fmt(cells[p]["cycles_per_sample"]) for p in policies)])
    return _md_table(["network", "N", *policies], table)


def ablation_rows(cfg: ReportConfig, tick: Callable[[], object]) -> list[dict]:
    rows = []
    for network in cfg.networks:
        for label, options in ABLATION:
            row = _schedule_row(network, ABLATION_PROCS, "layerpipe", cfg.model, options, cfg.link())
            rows.append({"variant": label, **row})
            tick()
        row = _schedule_row(network, ABLATION_PROCS, "pipedream", cfg.model, interconnect=cfg.link())
        rows.append({"variant": "PipeDream (stages)", **row})
        tick()
    return rows


def ablation_section(rows: list[dict]) -> str:
    table = [[r["network"], r["variant"], _fmt(r["cycles_per_sample"]), _fmt(r["lower_bound_cycles"]),
              f"{r['utilization_pct']:.1f}", _fmt(r["traffic_words_per_sample"]), r["max_staleness"]] for r in rows]
    return _md_table(["network", "variant", "cycles/sample", "lower bound", "util %", "traffic words/sample",
                      "max staleness"], table)


def speedup_plot(rows: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    policies = ("layerpipe", *OTHER_POLICIES)
    nets = list(dict.fromkeys(r["network"] for r in rows))
    by = {(r["network"], r["num_procs"], r["policy"]): r["cycles_per_sample"] for r in rows}
    n_mid = sorted({r["num_procs"] for r in rows})[len({r["num_procs"] for r in rows}) // 2]
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        ys = [by[(net, n_mid, "pipedream")] / by[(net, n_mid, policy)] for net in nets]
        ax.bar([i + k * width for i in range(len(nets))], ys, width, label=policy)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(nets))], nets, fontsize=8)
    ax.set_ylabel(f"speedup vs PipeDream (N = {n_mid})")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_atomic(path, buf.getvalue())


def gantt_section(cfg: ReportConfig, out: Path) -> str:
    from layerpipe.dse._evaluate import simulated_iterations
    from layerpipe.sim import SimConfig, simulate_policy_result
    from layerpipe.sim.gantt import write_gantt

    lines = []
    net = load_network(GANTT_NETWORK)
    ic = cfg.link()
    for policy in GANTT_POLICIES:
        result = make_schedule(policy, net, GANTT_PROCS, cfg.model, interconnect=ic)
        sim = simulate_policy_result(result, net, cfg.model, simulated_iterations(result), SimConfig.of(ic))
        name = f"gantt_{policy}.png"
        write_gantt(sim, out / name, title=f"{GANTT_NETWORK}, {policy}, N = {GANTT_PROCS}")
        lines.append(f"**{policy}** — {sim.cycles_per_sample:,.0f} cycles/sample simulated "
                     f"({result.metrics.cycles_per_sample:,.0f} scheduled), "
                     f"{sim.utilization_pct:.1f}% utilization\n\n![{policy}]({name})\n")
    return "\n".join(lines)


@dataclass(frozen=True)
class RTLPoint:
    """A design point of the RTL section: an MLP on `num_pes` PEs of `lanes` lanes, `samples` iterations of
    micro-batches of `batch` samples."""

    network: str
    num_pes: int
    lanes: int
    samples: int
    batch: int = 1
    #: LayerPipe may pick its heavy-layer split variants here (`--split-layers`: parts of a layer on several PEs,
    #: their outputs concatenated and errors summed in hardware, hdl/_split.py); they are weight-stationary, so
    #: they compete in the "weights together" schedule
    split_layers: bool = False

    def label(self) -> str:
        return (f"{self.network} N={self.num_pes} lanes={self.lanes}" + (f" B={self.batch}" if self.batch > 1 else "")
                + (" split layers" if self.split_layers else ""))

    def as_dict(self) -> dict:
        """The point as rtl.json keeps it (`split_layers` only when set, so earlier points read the same)."""
        return {k: v for k, v in vars(self).items() if k != "split_layers" or v}


#: The RTL section's design points (issue 11, Build 5): small MLPs (cheap to simulate in Icarus) where
#: LayerPipe's split placement (a layer's F, E, G, U on different PEs: weight versions and gradients on the links)
#: beats both its weights-together placement and PipeDream under the `rtl` cost model on the `rtl` interconnect.
#: The first point is the one earlier reports measured (then with weights together only); area (ECP5 place and
#: route) is of the first point (minutes per design).
RTL_POINTS: tuple[RTLPoint, ...] = (
    RTLPoint("mlp:32-24-16-8", 3, 4, 24),
    RTLPoint("mlp:24-16-8", 2, 4, 24),
    RTLPoint("mlp:16-16-16-8", 4, 4, 24),
    # A wide first layer: with split layers allowed, LayerPipe's weights-together schedule is the split variant
    # (fc1 in 3 parts over 3 PEs, their outputs concatenated for fc2).
    RTLPoint("mlp:64-8-4", 4, 4, 24, split_layers=True),
)
#: What runs on each point's hardware: (label, policy, keep_weights_together). LayerPipe may split placements;
#: the hardware runs one iteration per period, so replication is off, and the heavy-layer split is off unless the
#: point allows it (`RTLPoint.split_layers`); the model's prediction is taken with the same options.
RTL_VARIANTS: tuple[tuple[str, str, bool], ...] = (
    ("layerpipe", "layerpipe", False),
    ("layerpipe, weights together", "layerpipe", True),
    ("pipedream", "pipedream", True),
)
RTL_BASELINE = "pipedream"


def rtl_model_cycles_per_sample(point: RTLPoint, policy: str, keep_weights_together: bool) -> float:
    """The model's steady-state cycles per sample for `policy` at `point`: the `rtl` cost model on the `rtl`
    interconnect, the options the hardware runs (what `layerpipe compare NETWORK -n N --cost-model rtl --lanes V
    --interconnect rtl --no-split-layers --no-replication [--keep-weights-together]` prints)."""
    from layerpipe._rtl_costs import RTLCostModel
    from layerpipe.schedule.policies import get_policy

    wanted: dict[str, object] = {"replication": False, "split_layers": point.split_layers,
                                 "keep_weights_together": keep_weights_together}
    names = get_policy(policy).option_names
    result = make_schedule(policy, load_network(point.network, point.batch), point.num_pes, RTLCostModel(point.lanes),
                           policy_options(policy, {k: v for k, v in wanted.items() if k in names}),
                           interconnect=Interconnect.rtl(point.lanes))
    return float(result.metrics.cycles_per_sample)


#: Worker processes of the RTL section: its Icarus runs and place-and-route runs are independent (CI has 2 cores).
RTL_WORKERS = 2


def _rtl_verify(point: RTLPoint, k: int, label: str, policy: str, keep: bool) -> tuple[dict, str, float]:
    """One schedule at one point, verified (a worker's job): its row, its Verilog, the simulator's steady
    cycles per sample."""
    import hashlib

    from layerpipe.hdl import make_design
    from layerpipe.hdl._flow import export_verilog
    from layerpipe.hdl._verify import verify_design

    design = make_design(point.network, policy, point.num_pes, point.lanes, point.samples,
                         keep_weights_together=keep, batch=point.batch, split_layers=point.split_layers)
    verilog = export_verilog(design)
    doc = verify_design(design)
    batch = design.network.batch
    doc.update(point=k, variant=label, keep_weights_together=keep,
               verilog_sha256_16=hashlib.sha256(verilog.encode()).hexdigest()[:16])
    doc["cycles_per_sample_rtl"] = round(doc["cycles_rtl"] / (design.samples * batch), 2)
    doc["steady_cycles_per_sample_rtl"] = (round(doc["period_rtl"] / batch, 2)
                                           if doc["period_rtl"] is not None else None)
    doc["steady_cycles_per_sample_sim"] = round(float(design.sim.cycles_per_sample), 2)
    doc["model_cycles_per_sample"] = round(rtl_model_cycles_per_sample(point, policy, keep), 2)
    return doc, verilog, float(design.sim.cycles_per_sample)


def _run_jobs(jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], workers: int) -> list[Any]:
    """The jobs' results in the jobs' order (so the output does not depend on which worker finished first);
    in this process when there is at most one job or one worker. Workers are spawned, not forked: a forked
    child of a process that has run torch's thread pool can hang in its first parallel region."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(*args) for fn, args in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(fn, *args) for fn, args in jobs]
        return [f.result() for f in futures]


def rtl_results(previous: dict | None, points: Sequence[RTLPoint] = RTL_POINTS, area: bool = True,
                workers: int = RTL_WORKERS) -> dict:
    """Verify every `RTL_VARIANTS` schedule at each point (Icarus, monitored op by op) next to the model's
    prediction; with `area`, place and route the first point's designs on `RTL_PART` (ECP5, the PyPI yowasp
    tools). The independent runs go to `workers` processes; results are kept in the points' order.

    The RTL's steady state is measured in the run: the cycles between the issues of every op in the run's two
    middle iterations (`period_rtl`, from the bench's command monitor). Place and route is a pure function of
    the Verilog text and the tools, and takes minutes, so its figures are reused from `previous` (the committed
    `rtl.json`) when the Verilog hashes the same; anything else reruns.
    """
    import hashlib

    jobs = [(_rtl_verify, (point, k, label, policy, keep)) for k, point in enumerate(points)
            for label, policy, keep in RTL_VARIANTS]
    verified = _run_jobs(jobs, workers)
    docs = [doc for doc, _, _ in verified]
    fpga: dict[str, dict] = {}
    if area:
        # The previous figures by the full hash of the Verilog they are of (whatever key they were filed under).
        prior = {f.get("verilog_sha256"): f for f in (previous or {}).get("fpga", {}).values()}
        first = [(doc["verilog_sha256_16"], verilog, rate) for doc, verilog, rate in verified if doc["point"] == 0]
        figures = _run_jobs([(_fpga_point, (verilog, rate, prior.get(hashlib.sha256(verilog.encode()).hexdigest())))
                             for _, verilog, rate in first]
                            + [(_conv_area, ((previous or {}).get("fpga_conv"),))], workers)
        fpga = {key: f for (key, _, _), f in zip(first, figures[:-1], strict=True) if f is not None}
        conv = figures[-1]
    else:
        conv = None
    doc = {"design_points": [p.as_dict() for p in points], "points": docs, "fpga": fpga}
    if conv is not None:
        doc["fpga_conv"] = conv
    return doc


#: The convolutional design whose area and speed the RTL section shows (issue 16 item 4): LeNet-5's shape at
#: 12×12 inputs, `examples/lenet5_12x12.yaml` embedded here so the report runs from a wheel (a test holds the two
#: equal). tests/test_hw_conv_rtl.py verifies this design bit- and cycle-exact on Icarus and Verilator.
RTL_CONV_YAML = """version: 1
name: lenet5_12x12
input_shape: [1, 12, 12]
layers:
  - {name: conv1, type: conv2d, out_channels: 4, kernel_size: 3, activation: relu}
  - {name: pool1, type: maxpool, kernel_size: 2}
  - {name: conv2, type: conv2d, out_channels: 8, kernel_size: 2, activation: relu}
  - {name: pool2, type: maxpool, kernel_size: 2}
  - {name: flatten, type: flatten}
  - {name: fc1, type: linear, out_features: 16, activation: relu}
  - {name: fc2, type: linear, out_features: 12, activation: relu}
  - {name: fc3, type: linear, out_features: 10}
"""
#: (policy, PEs, lanes, samples T) of the convolutional design.
RTL_CONV_DESIGN = ("pipedream", 2, 4, 2)


def rtl_conv_design() -> Any:
    """The convolutional design of the RTL section's area table (`make_design`'s Design)."""
    from layerpipe.hdl import make_design
    from layerpipe.network import parse_yaml_network

    policy, pes, lanes, samples = RTL_CONV_DESIGN
    return make_design(parse_yaml_network(RTL_CONV_YAML, "RTL_CONV_YAML"), policy, pes, lanes, samples)


def _conv_area(previous: dict | None) -> dict | None:
    """Place and route of `rtl_conv_design()` on `RTL_PART` (a worker's job), with what it is of; None without
    the PyPI tools. `previous` is reused by `_fpga_point`'s own rule (the same Verilog and flow)."""
    from layerpipe.hdl._flow import export_verilog

    design = rtl_conv_design()
    rate = float(design.sim.cycles_per_sample)
    figures = _fpga_point(export_verilog(design), rate, previous)
    if figures is None:
        return None
    policy, pes, lanes, samples = RTL_CONV_DESIGN
    return {**figures, "network": design.network.name, "policy": policy, "num_pes": pes, "lanes": lanes,
            "samples": samples, "cycles_per_sample_sim": round(rate, 2)}


#: The FPGA part of the RTL section: the same flow as `layerpipe rtl --part` (hdl/_fpga.py, issue 16 item 1).
RTL_PART = "ecp5-85k"
#: Wall seconds the report gives one design's synthesis, place and route. yosys's synth_ecp5 sat for over
#: 30 minutes in one ABC9 techmap pass on the split-placement design of mlp:32-24-16-8 (N=3, 4 lanes); the
#: table says when a design ran out of this time instead of waiting without end. 20 minutes: the free-placement
#: design, once its memories mapped to block RAM (one write port each), took 18.7 min of CPU to place and route.
RTL_PNR_LIMIT_S = 1200


def _fpga_point(verilog: str, cycles_per_sample: float, previous: dict | None) -> dict | None:
    """Place and route on `RTL_PART`; None without the PyPI tools. The previous run's entry (figures, a failure
    or a time-out) is reused when it is of the same Verilog AND the same flow (`flow_id`: version, tools, script,
    options): place and route takes minutes (the flow's own disk cache also has the figures), and a failure of
    an older flow is retried rather than kept forever."""
    import hashlib

    from layerpipe.hdl._fpga import FlowTimeout, flow_id, fpga_tools_missing, get_part, run_fpga_flow

    part = get_part(RTL_PART)
    if fpga_tools_missing(part) is not None:
        return None
    digest = hashlib.sha256(verilog.encode()).hexdigest()
    flow = flow_id(part)
    if previous and previous.get("verilog_sha256") == digest and previous.get("flow") == flow:
        return previous
    try:
        result = run_fpga_flow(verilog, part, time_limit_s=RTL_PNR_LIMIT_S)
    except FlowTimeout:
        # Kept in rtl.json under the Verilog's hash and the flow, so the next report does not wait again.
        return {"part": part.name, "verilog_sha256": digest, "flow": flow, "timed_out_after_s": RTL_PNR_LIMIT_S}
    except RuntimeError as failure:  # a tool failed on this design: the table says so, the report goes on
        return {"part": part.name, "verilog_sha256": digest, "flow": flow, "failed": str(failure).splitlines()[0]}
    doc = result.to_dict()
    rate = result.samples_per_second(cycles_per_sample)
    doc["samples_per_second"] = round(rate, 1) if rate is not None else None
    return doc


def _fpga_row(label: str, f: dict) -> tuple[list[str], str, str]:
    """One design's row of the FPGA table, and the part's title and the flow when the figures have them."""
    if "timed_out_after_s" in f:
        return [label, f"did not finish in {f['timed_out_after_s'] // 60} min", *["-"] * 6], "", ""
    if "failed" in f:
        return [label, f["failed"].rstrip(":"), *["-"] * 6], "", ""
    title = f"{f['part']} ({f['device']}, {f['package']}; {f['tools']['yosys']}, {f['tools']['nextpnr']})"
    flow = f.get("flow", "")
    if f.get("fits") is False and f.get("ff_memories"):
        # Stopped early (the flip-flop memories alone overflow the part): only the verdict is known.
        return [label, f"does not fit: {'; '.join(f['overflow'])}, memories in flip-flops: "
                f"{', '.join(f['ff_memories'])}", *["-"] * 6], title, flow
    u = f["utilization"]
    cells = [f"{u[r]['used']:,} ({u[r]['percent']:.1f}%)" for r in ("luts", "ffs", "brams", "dsps", "ios")]
    rate = f.get("samples_per_second")
    return [label, *cells, f"{f['fmax_mhz']:.1f}" if f["fmax_mhz"] else "does not fit",
            f"{rate:,.0f}" if rate else "-"], title, flow


def _fpga_table(rtl: dict) -> str:
    """Utilization and Fmax of each design on the report's part, or '' when the flow did not run."""
    rows, title, flow = [], "", ""
    labelled = [(d["variant"], rtl.get("fpga", {}).get(d["verilog_sha256_16"])) for d in rtl["points"]]
    conv = rtl.get("fpga_conv")
    if conv:
        labelled.append((f"{conv['policy']}, convolutional: {conv['network']} N={conv['num_pes']} "
                         f"lanes={conv['lanes']} T={conv['samples']}", conv))
    for label, f in labelled:
        if not f:
            continue
        row, row_title, row_flow = _fpga_row(label, f)
        rows.append(row)
        title, flow = row_title or title, row_flow or flow
    if not rows:
        return ""
    table = _md_table(["schedule", "LUTs", "FFs", "DP16KD", "MULT18X18D", "I/O", "Fmax MHz", "samples/s"], rows)
    conv_note = (f" The last row is a convolutional network (conv, max pool, conv, max pool, flatten, three linear "
                 f"layers: `examples/lenet5_12x12.yaml`), PipeDream's schedule on the same hardware generator "
                 f"(`layerpipe rtl examples/lenet5_12x12.yaml --policy {conv['policy']} -n {conv['num_pes']} "
                 f"--lanes {conv['lanes']} --samples {conv['samples']} --part {RTL_PART}`); its conv and pooling "
                 "layers run on the PEs' window engine." if conv else "")
    return (f"\nArea and speed of the first point on {title}: the flow of `layerpipe rtl --part {RTL_PART}` "
            "(yosys `synth_ecp5`, then nextpnr-ecp5 place and route" + (f"; {flow}" if flow else "") + "): "
            "utilization of the part per resource, Fmax after routing (register to register), samples/s = Fmax / "
            "steady-state cycles per sample." + conv_note + "\n\n" + table)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def rtl_speedups(rtl: dict) -> list[dict]:
    """Per design point and schedule: the speedup over `RTL_BASELINE` measured in RTL (steady-state cycles per
    sample from the run's issue cycles) and predicted by the model, and whether they are equal."""
    out = []
    for k in range(len(rtl["design_points"])):
        docs = {d["variant"]: d for d in rtl["points"] if d["point"] == k}
        base = docs[RTL_BASELINE]
        for label, d in docs.items():
            measured = _ratio(base["steady_cycles_per_sample_rtl"], d["steady_cycles_per_sample_rtl"])
            model = _ratio(base["model_cycles_per_sample"], d["model_cycles_per_sample"])
            out.append({"point": k, "variant": label, "rtl": measured, "model": model,
                        "equal": measured is not None and model is not None and abs(measured - model) < 1e-9})
    return out


def rtl_section(rtl: dict) -> str:
    points = [RTLPoint(**p) for p in rtl["design_points"]]
    speedups = {(s["point"], s["variant"]): s for s in rtl_speedups(rtl)}

    def times(x: float | None) -> str:
        return f"{x:.2f}x" if x is not None else "-"

    rows = []
    for d in rtl["points"]:
        s = speedups[(d["point"], d["variant"])]
        steady = d["steady_cycles_per_sample_rtl"]
        rows.append([points[d["point"]].label(), d["variant"], "yes" if d["bit_exact"] else "NO",
                     "yes" if d["cycle_exact"] else "NO", f"{d['cycles_rtl']:,}", f"{d['cycles_sim']:,}",
                     f"{steady:,.1f}" if steady is not None else "-", f"{d['model_cycles_per_sample']:,.1f}",
                     times(s["rtl"]), times(s["model"])])
    table = _md_table(["design point", "schedule", "bit-exact", "cycle-exact", "RTL cycles", "simulator cycles",
                       "RTL cycles/sample (steady, measured)", "model cycles/sample (rtl interconnect)",
                       f"RTL speedup vs {RTL_BASELINE}", f"model speedup vs {RTL_BASELINE}"], rows)
    notes = []
    for k, point in enumerate(points):
        split, together = (next(d for d in rtl["points"] if d["point"] == k and d["variant"] == v)
                           for v in ("layerpipe", "layerpipe, weights together"))
        rtl_gain = _ratio(together["steady_cycles_per_sample_rtl"], split["steady_cycles_per_sample_rtl"])
        model_gain = _ratio(together["model_cycles_per_sample"], split["model_cycles_per_sample"])
        notes.append(f"- `{point.network}`, N = {point.num_pes}, {point.lanes} lanes: the split placement runs "
                     f"{times(rtl_gain)} faster than weights together in RTL, {times(model_gain)} in the model; "
                     f"{times(speedups[(k, 'layerpipe')]['rtl'])} faster than PipeDream."
                     + (f" With split layers allowed, weights together is the split variant `{together['network']}` "
                        f"(each part's tasks on one PE), {times(speedups[(k, 'layerpipe, weights together')]['rtl'])} "
                        "faster than PipeDream in RTL." if together["network"] != point.network else ""))
    equal = all(s["equal"] for s in speedups.values())
    verdict = ("On every point the RTL-measured speedups equal the model's prediction on the `rtl` interconnect."
               if equal else "On some point the RTL-measured speedup differs from the model's prediction "
               "(see the last two columns).")
    first = points[0]
    return ("LayerPipe (its placement may split a layer's F, E, G and U over PEs: weight versions and gradients "
            "cross the links), LayerPipe with each layer's tasks on its weights' PE, and PipeDream, each on the "
            "same generated hardware: Q8.8 fixed point, "
            + ("per-sample SGD" if first.batch == 1 else f"micro-batches of {first.batch}")
            + f", {first.samples} " + ("samples" if first.batch == 1 else "iterations")
            + "; Icarus through cocotb against the integer PyTorch reference (`layerpipe verify`), watched op by "
            "op. RTL cycles include the pipeline's fill and drain; the "
            "steady-state cycles per sample are measured in the run (the bench's command monitor: the cycles "
            "between an op's issues in the run's two middle iterations, the slowest PE's, over the micro-batch). "
            "The model column is the schedule's prediction under the `rtl` cost "
            "model on the `rtl` interconnect with the options the hardware runs (whole layers, one iteration per "
            "period).\n\n" + table + "\n" + "\n".join(notes) + f"\n\n{verdict} Reproduce a row with "
            f"`layerpipe verify {first.network} --policy layerpipe --no-keep-weights-together -n {first.num_pes} "
            f"--lanes {first.lanes} --samples {first.samples}` (`--keep-weights-together` for the second "
            f"schedule) and its model figure with `layerpipe compare {first.network} -n {first.num_pes} "
            f"--policies layerpipe,pipedream --cost-model rtl --lanes {first.lanes} --interconnect rtl "
            "--no-split-layers --no-replication`.\n" + _fpga_table(rtl))


def assumptions(cfg: ReportConfig) -> str:
    m = cfg.model
    return f"""- Cost model `pe`: a processor does {m.lanes} MACs per cycle plus {m.overhead} cycles of fixed overhead
  per atomic task (F, A, E, G, U); a fused task (PipeDream's backward AEG) costs the sum of its parts. Convolution
  F, E and G each cost B·H_o·W_o·C_out·C_in·K² MACs; A and weightless layers are elementwise. Batch B = 1
  except in the headline's batch-32 blocks (compute grows with B, weight and gradient traffic does not).
- Networks follow torchvision's shapes without batch norm and dropout; residual networks are real DAGs.
- Asynchronous policies (LayerPipe, PipeDream, PipeDream-2BW) are periodic: cycles per sample is the
  period ÷ B. Synchronous ones (GPipe, 1F1B, ZB-H1/H2, OOO BackProp's pipeline) run steps of m = 2N
  micro-batches with one update per step; cycles per sample is the step time ÷ (m·B), the step timed by the
  simulator on the section's interconnect.
- Communication is part of every schedule (`layerpipe.interconnect`): a transfer of v words holds its link
  ⌈v / w⌉ cycles and arrives `latency` later; every section names its interconnect. Outside the headline it is
  `{cfg.link()}` — the generated hardware's links at {m.lanes} lanes. Traffic counts the words that cross
  processors per sample (activations and errors; weights and gradients when a layer's tasks are apart).
- LayerPipe balances fine-grained tasks freely by default, so its weights may travel between processors
  (traffic) and its staleness is whatever the balance needs; `--keep-weights-together` and
  `--max-staleness` trade some speed for neither (the ablation shows the cost).
- The lower bound is max(⌈Σc/N⌉, max c, c₍N₎ + c₍N+1₎) over the items a policy places."""


def generate(out: str | Path, cfg: ReportConfig | None = None, progress: bool = True,
             synthesis_cache: str | Path | None = None) -> list[Path]:
    """Regenerate the report folder `out` (built in a temporary sibling, then swapped into place by
    `layerpipe._files.staged_folder`: a crash leaves the old or the new folder, never a mix).

    Place-and-route figures are reused from `synthesis_cache` (default: `out/rtl.json`, the previous run) for
    Verilog that hashes the same; see `rtl_results`.
    """
    from tqdm import tqdm

    cfg = cfg or ReportConfig()
    out = Path(out)
    variants = 3 if _has_replication_switch() else 2
    headline_total = len(cfg.paper_interconnects) * len(cfg.paper_batches) * len(cfg.networks) * len(cfg.procs)
    total = (len(cfg.networks) * (len(cfg.procs) * (2 + len(OTHER_POLICIES)) + len(ABLATION) + 1)
             + headline_total * variants)
    with staged_folder(out, REPORT_OUTPUTS) as tmp:
        with tqdm(total=total, desc="report", unit="schedule", disable=not progress, leave=False) as bar:
            headline = headline_rows(cfg, lambda: bar.update(1))
            rows = comparison_rows(cfg, lambda: bar.update(1))
            ablation = ablation_rows(cfg, lambda: bar.update(1))
        columns = ["network", "num_procs", "policy", *[k for k in rows[0] if k not in ("network", "num_procs",
                                                                                       "policy")]]
        write_csv(tmp / "headline.csv", columns, headline)
        write_csv(tmp / "compare.csv", columns, rows)
        write_csv(tmp / "ablation.csv", ["variant", *columns], ablation)
        speedup_plot(rows, tmp / "speedup.png")
        gantt = gantt_section(cfg, tmp)
        ooo_text, ooo_rows = ooo_section(cfg.model, tmp)  # OOO BackProp's other two schedules (issue 15)
        write_csv(tmp / "ooo.csv", list(OOO_COLUMNS), ooo_rows)
        if cfg.rtl:
            previous = Path(synthesis_cache) if synthesis_cache else out / "rtl.json"
            prior = json.loads(previous.read_text()) if previous.exists() else None
            rtl_doc = rtl_results(prior)
            write_atomic(tmp / "rtl.json", json.dumps(rtl_doc, indent=1, sort_keys=True) + "\n")
            rtl = rtl_section(rtl_doc)
        else:
            rtl = "Skipped (`--no-rtl`).\n"
        readme = f"""# layerpipe report

Generated by `layerpipe report --out reports/` (layerpipe {__version__}); do not edit by hand —
`tests/test_report.py` fails when this folder is stale. Rows: `compare.csv`, `ablation.csv`.

## LayerPipe vs PipeDream at N = {", ".join(map(str, cfg.procs))}, on three interconnects

Cycles and words per training sample on the `pe` cost model; every policy is scheduled *on* the interconnect
of its block (transfers planned, and the simulator agrees with the plan). Rows: `headline.csv`.

{paper_section(headline, cfg)}

## Every policy, cycles per sample ({cfg.link()}, batch 1)

![speedup](speedup.png)

{others_section(rows)}
## Ablation: which split buys what (N = {ABLATION_PROCS}, {cfg.link()}, batch 1)

{ablation_section(ablation)}
## Gantt charts ({GANTT_NETWORK}, N = {GANTT_PROCS}, {cfg.link()}, simulated)

{gantt}
## RTL: verification and synthesis

{rtl}
## OOO BackProp: data-parallel and single-device orders

{ooo_text}
## Cost model and assumptions

{assumptions(cfg)}
"""
        write_atomic(tmp / "README.md", readme)
    return sorted(out.iterdir())


#: Every file a report folder holds: an existing --out holding anything else is refused, never deleted.
REPORT_OUTPUTS = owns_names("README.md", "headline.csv", "compare.csv", "ablation.csv", "rtl.json", "speedup.png",
                            "gantt_*.png",
                            "ooo.csv", "ooo_speedup.png")


__all__ = ["POLICIES", "ReportConfig", "generate"]

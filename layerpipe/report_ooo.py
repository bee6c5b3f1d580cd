"""The report's OOO BackProp section: its data-parallel and single-device orders against their baselines.

Out-Of-Order BackProp (Oh et al., EuroSys'22) reports 1.10–1.27× for data-parallel training (reverse
first-k over BytePS/Horovod-style all-reduce) and 1.03–1.58× for single-GPU training (multi-stream weight
gradients over TensorFlow/XLA). `ooo_section` puts our figures for the same two reorderings next to those
ranges, on our cost model and interconnects, and says where and why they differ:

- data parallel: `dp` vs `dp-ooo` (`reverse_first_k` = auto) on N = 4, 8, 16 replicas, on ring links and on
  one bus (`layerpipe.schedule._dataparallel`);
- single device: `stream` vs `stream-ooo` (2 streams; and with the last 2 weight layers' gradients deferred)
  over the zoo at batch 32, on the report's `pe` device and on a GPU-sized one (`layerpipe.schedule._streams`).

Everything here is simulated by `layerpipe.sim._streams`; the function returns markdown and the rows (the
caller writes `ooo.csv`) and, given a folder, draws `ooo_speedup.png`. Same inputs give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict

from layerpipe._files import write_atomic
from layerpipe.costs import PEModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule._dataparallel import DPOOOOptions
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule.policies import make_schedule, policy_options

#: Networks of the data-parallel part: one with large fully connected weights (alexnet: 61 M words, most of
#: them in fc6–fc8, next to the input of the step's last all-reduces) and a deep convolutional one.
DP_NETWORKS: tuple[str, ...] = ("alexnet", "resnet18")
DP_PROCS: tuple[int, ...] = (4, 8, 16)
#: 1/16 word per cycle: the GPU-like compute:link ratio of `layerpipe.interconnect`; 1000 cycles per hop.
DP_INTERCONNECTS: tuple[str, ...] = ("links:1000:1/16", "bus:1000:1/16")
STREAM_NETWORKS: tuple[str, ...] = ("mlp:784-256-128-10", "lenet5", "alexnet", "vgg16", "resnet18", "resnet50")
BATCH = 32
#: A GPU-sized device: V100's 5120 FP32 lanes, a ~5 µs kernel launch at 1.4 GHz ≈ 7000 cycles (assumed).
WIDE_DEVICE = PEModel(5120, 7000)
PAPER_DP = (1.10, 1.27)
PAPER_SINGLE = (1.03, 1.58)
DEFER = 2

COLUMNS = ("part", "network", "batch", "num_procs", "where", "policy", "options", "cycles_per_sample",
           "utilization_pct", "speedup_vs_baseline")


class OOORow(TypedDict):
    """A row of the section (and of `ooo.csv`): the keys of COLUMNS."""

    part: str
    network: str
    batch: int
    num_procs: int
    where: str
    policy: str
    options: str
    cycles_per_sample: float
    utilization_pct: float
    speedup_vs_baseline: float


def ooo_rows(model: PEModel, tick: Callable[[], object] = lambda: None) -> list[OOORow]:
    """Every row of the section: baseline and OOO order per point, speedups against the baseline."""
    rows: list[OOORow] = []
    for name in DP_NETWORKS:
        net = load_network(name, BATCH)
        for spec in DP_INTERCONNECTS:
            ic = parse_interconnect(spec)
            for n in DP_PROCS:
                base = make_schedule("dp", net, n, model, None, ic)
                ooo = make_schedule("dp-ooo", net, n, model, None, ic)
                assert isinstance(ooo.options, DPOOOOptions)  # make_schedule gives dp-ooo its own options
                k = ooo.options.reverse_first_k
                for result, options in ((base, ""), (ooo, f"reverse_first_k={k}")):
                    rows.append(_row("data-parallel", name, n, spec, result, options,
                                     base.metrics.cycles_per_sample))
                tick()
    for device, label in ((model, f"pe {model.lanes} lanes, overhead {model.overhead}"),
                          (WIDE_DEVICE, f"pe {WIDE_DEVICE.lanes} lanes, overhead {WIDE_DEVICE.overhead}")):
        for name in STREAM_NETWORKS:
            net = load_network(name, BATCH)
            base = make_schedule("stream", net, 1, device)
            variants = [(base, ""), (make_schedule("stream-ooo", net, 1, device), "streams=2")]
            variants.append((make_schedule("stream-ooo", net, 1, device,
                                           policy_options("stream-ooo", {"defer": DEFER})), f"streams=2 defer={DEFER}"))
            for result, options in variants:
                rows.append(_row("single-device", name, 1, label, result, options, base.metrics.cycles_per_sample))
            tick()
    return rows


def _row(part: str, network: str, n: int, where: str, result: ScheduleResult, options: str, base: float) -> OOORow:
    m = result.metrics
    return {"part": part, "network": network, "batch": BATCH, "num_procs": n, "where": where,
            "policy": result.policy, "options": options, "cycles_per_sample": round(m.cycles_per_sample, 1),
            "utilization_pct": round(m.utilization_pct, 1),
            "speedup_vs_baseline": round(base / m.cycles_per_sample, 3)}


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _x(value: float) -> str:
    return f"{value:.3f}×"


PLOT = "ooo_speedup.png"


def speedup_plot(rows: Sequence[OOORow], path: Path) -> None:
    """Each OOO order's speedup over its baseline, one bar per point, the paper's range shaded behind."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    parts = (("data-parallel", "dp-ooo", PAPER_DP), ("single-device", "stream-ooo", PAPER_SINGLE))
    for k, (part, policy, paper) in enumerate(parts):
        ax = fig.add_subplot(1, 2, k + 1)
        mine = [r for r in rows if r["part"] == part and r["policy"] == policy
                and r["options"] != f"streams=2 defer={DEFER}"]
        labels = [f"{r['network']}\n{str(r['where']).split(':')[0]} N={r['num_procs']}" if part == "data-parallel"
                  else f"{r['network']}\n{str(r['where']).split(' lanes')[0]} lanes" for r in mine]
        ax.axhspan(*paper, color="tab:green", alpha=0.15, label=f"paper {paper[0]:.2f}–{paper[1]:.2f}×")
        ax.bar(range(len(mine)), [float(r["speedup_vs_baseline"]) for r in mine], color="tab:blue",
               label="ours")
        ax.axhline(1.0, color="black", linewidth=0.8)
        top = max([paper[1], *(float(r["speedup_vs_baseline"]) for r in mine)])
        ax.set_ylim(0.9, top + 0.05)
        ax.set_xticks(range(len(mine)), labels, fontsize=5, rotation=90)
        ax.set_title(f"{policy} over {'dp' if part == 'data-parallel' else 'stream'}", fontsize=9)
        ax.set_ylabel("speedup", fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_atomic(path, buf.getvalue())


def ooo_section(model: PEModel, out: Path | None = None,
                tick: Callable[[], object] = lambda: None) -> tuple[str, list[OOORow]]:
    """Markdown of the OOO section and its rows; with `out`, the plot `ooo_speedup.png` is drawn there and
    the markdown shows it."""
    rows = ooo_rows(model, tick)
    if out is not None:
        speedup_plot(rows, Path(out) / PLOT)
    dp = [r for r in rows if r["part"] == "data-parallel"]
    by = {(r["network"], r["where"], r["num_procs"], r["policy"]): r for r in dp}
    dp_table = []
    for name in DP_NETWORKS:
        for spec in DP_INTERCONNECTS:
            for n in DP_PROCS:
                base, ooo = by[(name, spec, n, "dp")], by[(name, spec, n, "dp-ooo")]
                dp_table.append([name, spec, str(n), f"{base['cycles_per_sample']:,.0f}",
                                 f"{ooo['cycles_per_sample']:,.0f}", str(ooo["options"]).split("=")[1],
                                 _x(ooo["speedup_vs_baseline"])])
    single = [r for r in rows if r["part"] == "single-device"]
    sb = {(r["network"], r["where"], r["options"]): r for r in single}
    single_table = []
    for where in dict.fromkeys(r["where"] for r in single):
        for name in STREAM_NETWORKS:
            base = sb[(name, where, "")]
            single_table.append([name, str(where), f"{base['cycles_per_sample']:,.0f}",
                                 f"{base['utilization_pct']:.1f}",
                                 _x(sb[(name, where, "streams=2")]["speedup_vs_baseline"]),
                                 _x(sb[(name, where, f"streams=2 defer={DEFER}")]["speedup_vs_baseline"])])
    dp_speedups = [r["speedup_vs_baseline"] for r in dp if r["policy"] == "dp-ooo"]
    sd_speedups = [r["speedup_vs_baseline"] for r in single if r["policy"] == "stream-ooo"]
    text = f"""Out-Of-Order BackProp's other two schedules (Oh et al., EuroSys'22, §5 and §6; rows in `ooo.csv`),
each against its baseline on our cost model: data-parallel reverse first-k (`dp-ooo`, K chosen by
simulation) over the usual order (`dp`), and single-device multi-stream weight gradients (`stream-ooo`)
over one stream (`stream`). Batch {BATCH} per replica or device; cost model pe ({model.lanes} lanes,
overhead {model.overhead}) unless the table says otherwise.

**Data parallel** (ring all-reduce per layer, N replicas, each a micro-batch per step):

{_table(["network", "interconnect", "N", "dp cycles/sample", "dp-ooo cycles/sample", "K", "speedup"], dp_table)}
Ours: {min(dp_speedups):.2f}–{max(dp_speedups):.2f}×; the paper: {PAPER_DP[0]:.2f}–{PAPER_DP[1]:.2f}×.
Where they differ and why: reverse first-k only pays when the all-reduce of the first layers is on the
critical path and there is compute left to hide it behind. On ring links at 1/16 word per cycle
resnet18's all-reduces (11 M words) are hidden by its convolutions in either order (1.00×), while
alexnet's large fully connected layers leave the usual order waiting at the end of the step and reverse
first-k wins within the paper's range. On one bus every word of every replica shares the medium: N·|W|
words a step, so the step is the bus time for alexnet in either order and reordering moves little, while
resnet18's all-reduce is then just long enough to matter at N = 8 and 16 (at N = 4 the bus keeps up) and
reverse first-k, with K chosen by simulation, hides a good part of it.
The rows here send waiting all-reduce chunks first ready, first sent; `--comm-priority` (lowest layer
first, as ByteScheduler and P3 order tensors over BytePS, which OOO builds on) is an option of both
policies. The reductions cost no compute cycles here.

**Single device** (`stream-ooo`: weight gradients on a second stream; `defer {DEFER}`: also the last
{DEFER} weight layers' gradients beside the next forward):

{_table(["network", "device", "stream cycles/sample", "lane util %", "stream-ooo", f"+ defer {DEFER}"], single_table)}
Ours: {min(sd_speedups):.2f}–{max(sd_speedups):.2f}×; the paper: {PAPER_SINGLE[0]:.2f}–{PAPER_SINGLE[1]:.2f}×.
Where they differ and why: a second stream helps only where one kernel leaves lanes idle (fewer
independent outputs than lanes) or where a launch overhead leaves the device idle. On the report's
{model.lanes}-lane PE every kernel of the zoo at batch 32 fills the lanes and a launch costs
{model.overhead} cycles, so there is nothing to fill (1.00×). On the GPU-sized device (an assumption:
{WIDE_DEVICE.lanes} lanes, {WIDE_DEVICE.overhead}-cycle launches) the small networks gain in the paper's
range, but the convolutional ones fill the lanes in our model, whereas a real GPU at batch 32 also loses
time to memory-bound kernels and synchronisation that this lane model does not have (OOO's largest gains
are on DenseNet and MobileNet, with many small kernels, which the zoo lacks).
"""
    if out is not None:
        text += f"\n![OOO speedups]({PLOT})\n"
    return text, rows


__all__ = ["COLUMNS", "PLOT", "OOORow", "ooo_rows", "ooo_section", "speedup_plot"]

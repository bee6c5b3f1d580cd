"""Pareto fronts and plots of sweep results.

The front is over objectives all to be minimised: cycles per sample, peak memory, staleness and (when the
sweep measured it) area. A point is on the front when no other point of the same network is at least as
good in every objective and better in one: one front per network (points of different networks solve
different problems). Files beside the results are written only over this sweep's own earlier ones.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from layerpipe.dse._store import write_csv

OBJECTIVES: tuple[str, ...] = ("cycles_per_sample", "peak_memory_words", "max_staleness", "area_luts")


def _value(row: dict[str, str], key: str) -> float | None:
    text = row.get(key, "")
    return float(text) if text not in ("", None) else None


def objectives_present(rows: Sequence[dict[str, str]]) -> list[str]:
    """Objectives with a value in every row (area only when the sweep measured it)."""
    return [k for k in OBJECTIVES if rows and all(_value(r, k) is not None for r in rows)]


def pareto_front(rows: Sequence[dict[str, str]], objectives: Sequence[str] | None = None) -> list[dict[str, str]]:
    """Non-dominated rows, in input order."""
    keys = list(objectives or objectives_present(rows))
    vecs = [tuple(_value(r, k) or 0.0 for k in keys) for r in rows]
    front = []
    for i, v in enumerate(vecs):
        dominated = any(
            all(o <= s for o, s in zip(w, v, strict=True)) and any(o < s for o, s in zip(w, v, strict=True))
            for j, w in enumerate(vecs) if j != i
        )
        if not dominated:
            front.append(rows[i])
    return front


def fronts_by_network(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Each network's own Pareto front, networks in order of first appearance: points of different networks
    do not compete (a small MLP would dominate every ResNet point), so one front per network."""
    by_network: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        by_network[r["network"]].append(r)
    keys = objectives_present(rows)
    return [r for net in by_network for r in pareto_front(by_network[net], keys)]


#: The files `save_pareto` writes into its folder.
PARETO_FILES: tuple[str, ...] = ("pareto.csv", "pareto.png", "speedup_vs_n.png")


def check_pareto_dir(out_dir: str | Path, sweep_id: str, columns: Sequence[str]) -> None:
    """Before any work: the Pareto files may replace only an earlier pareto.csv of this very sweep and the plots
    beside it; a file of the user's (or of another sweep) at one of those names is refused, never overwritten."""
    import csv

    from layerpipe._files import read_text_limited
    from layerpipe.errors import InputError

    out = Path(out_dir)
    present = [name for name in PARETO_FILES if (out / name).exists()]
    if not present:
        return
    ours = False
    if (out / "pareto.csv").is_file():
        lines = read_text_limited(out / "pareto.csv", "pareto file").splitlines()
        rows = list(csv.DictReader(lines))
        ours = bool(lines) and lines[0] == ",".join(columns) and {r.get("sweep_id") for r in rows} == {sweep_id}
    if not ours:
        raise InputError(f"{out / present[0]} exists and is not this sweep's Pareto output; give --pareto-dir "
                         "a folder without pareto.csv, pareto.png, speedup_vs_n.png (nothing is overwritten)")


#: The plots `save_pareto` can draw (`explore --plots`): name → file.
PLOTS: dict[str, str] = {"pareto": "pareto.png", "speedup": "speedup_vs_n.png"}


def save_pareto(rows: Sequence[dict[str, str]], out_dir: str | Path, columns: Sequence[str],
                plots: Sequence[str] = tuple(PLOTS)) -> list[Path]:
    """pareto.csv (one front per network) and the plots asked for in out_dir: pareto.png (cycles vs memory per
    network, front highlighted), speedup_vs_n.png. Called once, after the sweep: drawing is ~1 s per call
    (matplotlib), as much as a hundred points (issue 14), so it stays off the per-point path."""
    out = Path(out_dir)
    front = fronts_by_network(rows)
    write_csv(out / "pareto.csv", columns, front)
    files = [out / "pareto.csv"]
    if "pareto" in plots:
        files.append(plot_pareto(rows, front, out / PLOTS["pareto"]))
    if "speedup" in plots:
        files.append(plot_speedup_vs_n(rows, out / PLOTS["speedup"]))
    return files


def _save(fig, path: Path) -> None:
    """Render to memory, then write atomically (a killed run leaves the old picture or the new one)."""
    import io

    from layerpipe._files import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_atomic(path, buf.getvalue())


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "layerpipe"
    return plt


#: Margins of every panel, inches: room for the tick labels and axis titles of these plots. Fixed rather than
#: `tight_layout`, which lays out every tick label's text to measure it: ~40 % of a plot's drawing time (issue 14:
#: the plots were ~1 s of an `explore` run, as much as a hundred design points).
_MARGINS_IN = {"left": 0.95, "right": 0.15, "bottom": 0.55, "top": 0.6, "between": 1.05}


def _layout(fig, panels: int, panel_width_in: float, height_in: float) -> None:
    """`_MARGINS_IN` around `panels` axes side by side, each panel `panel_width_in` of the figure's width."""
    m = _MARGINS_IN
    total = panels * panel_width_in
    axis_width = (total - m["left"] - m["right"] - (panels - 1) * m["between"]) / panels
    fig.subplots_adjust(left=m["left"] / total, right=1 - m["right"] / total, bottom=m["bottom"] / height_in,
                        top=1 - m["top"] / height_in, wspace=m["between"] / axis_width)


#: Exponents as superscript characters: "10³" in plain text.
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power_label(x: float) -> str:
    """"10³", "2×10³": a log axis's tick label in plain text."""
    exponent = math.floor(math.log10(x) + 1e-9)
    coeff = x / 10.0**exponent
    power = "10" + str(exponent).translate(_SUPERSCRIPT)
    return power if round(coeff, 6) == 1 else f"{coeff:g}×{power}"


def _log_axes(ax) -> None:
    """Both axes logarithmic, labelled in plain text. matplotlib's own log labels are mathtext, whose parser
    (pyparsing, imported and run on the first label) was ~0.15 s of the two plots' ~0.55 s (issue 14); its
    `LogFormatter` keeps the default's choice of which minor ticks to label (as `LogScale` sets it up: every
    decade, and some minor ticks when the axis spans few decades); only the text changes."""
    from matplotlib.ticker import LogFormatter

    class PlainPowers(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return _power_label(x)

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(PlainPowers(labelOnlyBase=False))
        axis.set_minor_formatter(PlainPowers(labelOnlyBase=False))


def _context(rows: Sequence[dict[str, str]]) -> str:
    """What the figures belong to: the sweep's interconnects, batches and cost models (each a set: a sweep may
    vary them, and then its points of one policy mix them)."""
    def values(key: str) -> str:
        return ", ".join(sorted({r.get(key) or "-" for r in rows})) or "-"
    return f"interconnect {values('interconnect')} · batch {values('batch')} · cost model {values('cost_model')}"


def plot_pareto(rows: Sequence[dict[str, str]], front: Sequence[dict[str, str]], path: Path) -> Path:
    """One panel per network: its points by policy and its own front."""
    plt = _figure()
    networks = list(dict.fromkeys(r["network"] for r in rows))
    panels = max(1, len(networks))
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 4.2), dpi=100, squeeze=False)
    for ax, net in zip(axes[0], networks, strict=False):
        by_policy: dict[str, list[dict[str, str]]] = defaultdict(list)
        for r in rows:
            if r["network"] == net:
                by_policy[r["policy"]].append(r)
        for policy in sorted(by_policy):
            pts = by_policy[policy]
            ax.scatter([float(r["cycles_per_sample"]) for r in pts], [float(r["peak_memory_words"]) for r in pts],
                       label=policy, s=18, alpha=0.7)
        f = sorted((r for r in front if r["network"] == net), key=lambda r: float(r["cycles_per_sample"]))
        ax.plot([float(r["cycles_per_sample"]) for r in f], [float(r["peak_memory_words"]) for r in f],
                "k--", linewidth=1, label="Pareto front")
        _log_axes(ax)
        ax.set_title(net, fontsize=9)
        ax.set_xlabel("cycles per sample")
        ax.set_ylabel("peak memory (words, max over processors)")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(_context(rows), fontsize=8)
    _layout(fig, panels, 4.6, 4.2)
    _save(fig, path)
    plt.close(fig)
    return path


def plot_speedup_vs_n(rows: Sequence[dict[str, str]], path: Path, baseline: str = "pipedream") -> Path:
    """Per network, speedup of each policy over the baseline at each N (first matching baseline row)."""
    plt = _figure()
    networks = sorted({r["network"] for r in rows})
    panels = max(1, len(networks))
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), dpi=100, squeeze=False)
    for ax, net in zip(axes[0], networks, strict=False):
        net_rows = [r for r in rows if r["network"] == net]
        base: dict[int, float] = {}
        for r in net_rows:
            if r["policy"] == baseline:
                base.setdefault(int(r["num_procs"]), float(r["cycles_per_sample"]))
        series: dict[str, dict[int, float]] = defaultdict(dict)
        for r in net_rows:
            n = int(r["num_procs"])
            if n in base:
                label = r["policy"] + (f" (D≤{r['max_staleness_bound']})" if r.get("max_staleness_bound") else "")
                series[label].setdefault(n, base[n] / float(r["cycles_per_sample"]))
        for label in sorted(series):
            ns = sorted(series[label])
            ax.plot(ns, [series[label][n] for n in ns], marker="o", markersize=3, label=label)
        ax.set_title(net, fontsize=9)
        ax.set_xlabel("processors N")
        ax.set_ylabel(f"speedup vs {baseline}")
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=6)
        else:  # legend() on no lines prints a matplotlib warning on stderr
            ax.text(0.5, 0.5, f"no {baseline} rows to compare with", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)
    fig.suptitle(_context(rows), fontsize=8)
    _layout(fig, panels, 4.2, 3.6)
    _save(fig, path)
    plt.close(fig)
    return path

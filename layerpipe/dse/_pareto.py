"""Pareto fronts and plots of sweep results.

The front is over objectives all to be minimised: cycles per sample, peak memory, staleness and (when the
sweep measured it) area. A point is on the front when no other point of the same network is at least as
good in every objective and better in one: one front per network (points of different networks solve
different problems). Files beside the results are written only over this sweep's own earlier ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from layerpipe._files import write_atomic
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
PARETO_FILES: tuple[str, ...] = ("pareto.csv", "pareto.svg", "speedup_vs_n.svg")


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
                         "a folder without pareto.csv, pareto.svg, speedup_vs_n.svg (nothing is overwritten)")


#: The plots `save_pareto` can draw (`explore --plots`): name → file.
PLOTS: dict[str, str] = {"pareto": "pareto.svg", "speedup": "speedup_vs_n.svg"}


def save_pareto(rows: Sequence[dict[str, str]], out_dir: str | Path, columns: Sequence[str],
                plots: Sequence[str] = tuple(PLOTS)) -> list[Path]:
    """pareto.csv (one front per network) and the plots asked for in out_dir: pareto.svg (cycles vs memory per
    network, front highlighted), speedup_vs_n.svg. Called once, after the sweep. The plots are SVG written by
    `_svg` (milliseconds); drawn with matplotlib they were ~0.9 s of CPU, import included, as much as issue 14's
    hundred design points."""
    out = Path(out_dir)
    front = fronts_by_network(rows)
    write_csv(out / "pareto.csv", columns, front)
    files = [out / "pareto.csv"]
    if "pareto" in plots:
        files.append(plot_pareto(rows, front, out / PLOTS["pareto"]))
    if "speedup" in plots:
        files.append(plot_speedup_vs_n(rows, out / PLOTS["speedup"]))
    return files


def _context(rows: Sequence[dict[str, str]]) -> str:
    """What the figures belong to: the sweep's interconnects, batches and cost models (each a set: a sweep may
    vary them, and then its points of one policy mix them)."""
    def values(key: str) -> str:
        return ", ".join(sorted({r.get(key) or "-" for r in rows})) or "-"
    return f"interconnect {values('interconnect')} · batch {values('batch')} · cost model {values('cost_model')}"


def plot_pareto(rows: Sequence[dict[str, str]], front: Sequence[dict[str, str]], path: Path) -> Path:
    """One panel per network: its points by policy and its own front (log axes)."""
    from layerpipe.dse._svg import COLOURS, Panel, Series, render

    networks = list(dict.fromkeys(r["network"] for r in rows))
    policies = sorted({r["policy"] for r in rows})
    panels = []
    for net in networks:
        panel = Panel(net, "cycles per sample", "peak memory (words, max over processors)", xlog=True, ylog=True)
        by_policy: dict[str, list[dict[str, str]]] = defaultdict(list)
        for r in rows:
            if r["network"] == net:
                by_policy[r["policy"]].append(r)
        for policy in sorted(by_policy):
            pts = by_policy[policy]
            panel.series.append(Series(policy, [float(r["cycles_per_sample"]) for r in pts],
                                       [float(r["peak_memory_words"]) for r in pts],
                                       COLOURS[policies.index(policy) % len(COLOURS)]))
        f = sorted((r for r in front if r["network"] == net), key=lambda r: float(r["cycles_per_sample"]))
        panel.series.append(Series("Pareto front", [float(r["cycles_per_sample"]) for r in f],
                                   [float(r["peak_memory_words"]) for r in f], "black", line=True, dashed=True,
                                   markers=False))
        panels.append(panel)
    write_atomic(path, render(panels, _context(rows), 460, 420).encode())
    return path


def plot_speedup_vs_n(rows: Sequence[dict[str, str]], path: Path, baseline: str = "pipedream") -> Path:
    """Per network, speedup of each policy over the baseline at each N (first matching baseline row)."""
    from layerpipe.dse._svg import COLOURS, Panel, Series, render

    networks = sorted({r["network"] for r in rows})
    panels = []
    for net in networks:
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
        panel = Panel(net, "processors N", f"speedup vs {baseline}", integer_x=True,
                      note="" if series else f"no {baseline} rows to compare with")
        for k, label in enumerate(sorted(series)):
            ns = sorted(series[label])
            panel.series.append(Series(label, [float(n) for n in ns], [series[label][n] for n in ns],
                                       COLOURS[k % len(COLOURS)], line=True))
        panels.append(panel)
    write_atomic(path, render(panels, _context(rows), 420, 360).encode())
    return path

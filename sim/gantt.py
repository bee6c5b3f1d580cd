"""Gantt charts of a simulation: processors as rows, one bar per op coloured by task kind, PNG and SVG.

Long runs are drawn through a window of iterations (by default a few from the middle of the run, where
the pipeline is in steady state): the time axis spans the cycles in which those iterations complete (from
the completion of the iteration before the first to the completion of the last, about one period per
iteration in steady state), and every op that overlaps that span is drawn, whatever its iteration — in a
deep pipeline one period holds ops of many iterations. Ops are labelled with their names when few enough
are visible to read.

Output is deterministic: matplotlib's Agg backend through a private canvas (no pyplot state), a fixed
`svg.hashsalt`, and fixed file metadata, so the same result gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from layerpipe.sim._report import SimResult

#: Colours by task kind; fused kinds and stage kinds get their own.
KIND_COLOURS: dict[str, str] = {
    "F": "#4e79a7", "A": "#f28e2b", "E": "#e15759", "G": "#59a14f", "U": "#9c755f",
    "AE": "#ff9da7", "EG": "#edc948", "AG": "#b07aa1", "AEG": "#76b7b2",
    "B": "#e15759", "I": "#ff9da7", "W": "#59a14f",
}
FALLBACK_COLOUR = "#bab0ac"
#: Runs with more iterations than this are drawn through a window.
DEFAULT_WINDOW = 6
#: Op labels are drawn when at most this many ops are visible.
MAX_LABELS = 120
#: Above this many visible ops bars are drawn without separating edges (they would hide the colours).
DENSE_BARS = 400

_SVG_METADATA = {"Date": None, "Creator": "layerpipe"}
_PNG_METADATA = {"Software": "layerpipe"}


def default_window(result: SimResult, width: int = DEFAULT_WINDOW) -> tuple[int, int]:
    """Iterations [first, last] to draw: all of a short run, else `width` from the middle."""
    count = result.num_iterations
    if count <= width:
        return 0, max(count - 1, 0)
    first = (count - width) // 2
    return first, first + width - 1


def gantt_figure(result: SimResult, window: tuple[int, int] | None = None, title: str | None = None) -> Figure:
    """The chart as a matplotlib Figure (not attached to pyplot)."""
    first, last = window if window is not None else default_window(result)
    t0, t1 = _time_span(result, first, last)
    visible = np.flatnonzero((result.end > t0) & (result.start < t1))
    procs = result.num_procs
    fig = Figure(figsize=(12, 0.5 * procs + 1.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    by_kind: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for i in visible.tolist():
        op = result.ops[i]
        s, e = int(result.start[i]), int(result.end[i])
        by_kind.setdefault(op.kind, {}).setdefault(op.proc, []).append((s, max(e - s, 0)))
    edge = 0.4 if len(visible) <= DENSE_BARS else 0.0  # thin white gaps between bars, unless they would be all
    for kind in sorted(by_kind):
        colour = KIND_COLOURS.get(kind, FALLBACK_COLOUR)
        for p, bars in sorted(by_kind[kind].items()):
            ax.broken_barh(bars, (p - 0.4, 0.8), facecolors=colour, edgecolors="white", linewidth=edge)
    if len(visible) <= MAX_LABELS:
        for i in visible.tolist():
            op = result.ops[i]
            mid = (max(int(result.start[i]), t0) + min(int(result.end[i]), t1)) / 2
            ax.text(mid, op.proc, str(op), ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_xlim(t0, t1 if t1 > t0 else t0 + 1)
    ax.set_ylim(procs - 0.5, -0.5)
    ax.set_yticks(range(procs), [f"p{p}" for p in range(procs)])
    ax.set_xlabel("cycle")
    span = f", iterations {first}–{last} completing" if window is not None or result.num_iterations > DEFAULT_WINDOW \
        else ""
    ax.set_title(title or f"{procs} processors, {result.cycles_per_iteration:,.0f} cycles/iteration{span}")
    handles = [Patch(facecolor=KIND_COLOURS.get(k, FALLBACK_COLOUR), label=k) for k in sorted(by_kind)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, title="task")
    fig.tight_layout()
    return fig


def _time_span(result: SimResult, first: int, last: int) -> tuple[int, int]:
    """Cycles from the completion of iteration first − 1 (or the start of the run) to that of `last`."""
    done = result.completion_times
    if result.schedule.synchronous:  # completion times are per step
        m = max(result.schedule.microbatches, 1)
        first, last = first // m, last // m
    last = min(last, len(done) - 1)
    if last < 0:
        return 0, max(result.total_cycles, 1)
    t0 = int(done[first - 1]) if 0 < first <= last else 0
    return t0, max(int(done[last]), t0 + 1)


def write_gantt(result: SimResult, path: str | Path, window: tuple[int, int] | None = None,
                title: str | None = None) -> None:
    """Write the chart; the format follows the suffix (.png or .svg)."""
    path = Path(path)
    fig = gantt_figure(result, window, title)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ValueError(f"gantt format must be .png or .svg, got {path.name}")
    with matplotlib.rc_context({"svg.hashsalt": "layerpipe", "svg.fonttype": "path"}):
        fig.savefig(path, format=suffix[1:], metadata=_SVG_METADATA if suffix == ".svg" else _PNG_METADATA)

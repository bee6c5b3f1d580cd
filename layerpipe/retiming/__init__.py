"""Retiming (design notes §4): timed graphs, iteration bounds, Leiserson–Saxe, and the delayed-gradient
solver for training graphs.

Layers, lowest first, each importing only the ones above it (no circle):
- `_cycle_ratio`     — Howard's maximum cycle ratio (the iteration bound), exact.
- `_leiserson_saxe`  — `TimedGraph`, legality, clock period, W/D matrices, retiming to a period, and
                       `solve_difference_constraints`, the one solver of r(dst) ≥ r(src) + b systems.
- `_delays`          — training graphs: `timed_graph`, `loop_bounds`, `solve_delays` (D_l by HiGHS,
                       lags r by the difference-constraint solver), `delays_feasible`.

The scheduler's longest paths (`layerpipe.schedule._lags`: ASAP times, remaining paths, weight-loop
lengths, the least legal lags of a placement) call `solve_difference_constraints` with one constraint per
delay-0 edge (r(dst) ≥ r(src) + b, b from costs, start times and the period) and a topological order.
"""

from layerpipe.retiming._cycle_ratio import ZeroDelayCycleError, max_cycle_ratio
from layerpipe.retiming._delays import (
    DelaySolution,
    LoopBound,
    delays_feasible,
    loop_bounds,
    min_added_delays,
    solve_delays,
    timed_graph,
)
from layerpipe.retiming._leiserson_saxe import (
    IterationBound,
    TimedEdge,
    TimedGraph,
    clock_period,
    is_legal_retiming,
    iteration_bound,
    least_retiming,
    min_period_retiming,
    retime_to_period,
    retimed_delays,
    retiming_violations,
    solve_difference_constraints,
    wd_matrices,
)

__all__ = [
    "DelaySolution",
    "IterationBound",
    "LoopBound",
    "TimedEdge",
    "TimedGraph",
    "ZeroDelayCycleError",
    "clock_period",
    "delays_feasible",
    "is_legal_retiming",
    "iteration_bound",
    "least_retiming",
    "loop_bounds",
    "max_cycle_ratio",
    "min_added_delays",
    "min_period_retiming",
    "retime_to_period",
    "retimed_delays",
    "retiming_violations",
    "solve_delays",
    "solve_difference_constraints",
    "timed_graph",
    "wd_matrices",
]

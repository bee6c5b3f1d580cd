"""The `optimal` policy: the exact minimum period by integer programming (scipy's HiGHS), for small graphs.

Why the problem is an assignment problem: in a periodic schedule without a staleness bound every delay-0
edge can be met by lags (`minimal_lags` always succeeds for gap-free bodies), and weight edges are version
reads, not precedence. So a period P is achievable exactly when the tasks (or, under
`keep_weights_together`, each layer's weight-task group) can be assigned to N processors with every load
≤ P. The MILP: x[i,p] ∈ {0,1} item i on processor p, Σ_p x[i,p] = 1, Σ_i c_i·x[i,p] ≤ P, minimise P. Items
are sorted by cost and item i may only use processors 0..i (symmetry breaking: any assignment can be
relabelled into that form). The relative MIP gap is 0, so status "optimal" is a proof. Body order and lags
then come from the same passes as the `layerpipe` policy.

What it proves, and what not (issue 10 item 5): optimality among periodic schedules of ONE iteration per
period (J = 1), where every task has one slot. Unfolded schedules (J iterations per period, a task's copies
on different processors — replicated `pipedream`, `layerpipe --unfold J`) are outside the model and can be
faster: their bound is `ScheduleMetrics.lower_bound_unfolded_cycles` (Σc/N per iteration), and the result's
note says so. The assignment also ignores the interconnect (transfers are planned afterwards by the passes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from layerpipe.costs import CostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule._bodies import asap_keys, best_ordering, default_targets
from layerpipe.schedule._comm import Comm, busiest_channel
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._layerpipe import candidate_placements, group_items, loads_of, place_items, weight_groups
from layerpipe.schedule._result import ScheduleResult, periodic_result
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule.metrics import period_lower_bound

#: Largest graph the policy accepts, in placement items and items × processors: beyond it HiGHS may need
#: hours to prove optimality (alexnet's 47 tasks on 4 processors already take over a minute).
MAX_ITEMS = 32
MAX_VARIABLES = 256


@dataclass(frozen=True)
class OptimalOptions:
    intra: bool = True
    inter: bool = True
    keep_weights_together: bool = False
    time_limit_s: float = 60.0  #: HiGHS time limit; past it the best schedule found is returned, marked unproven

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise InputError(f"time_limit_s must be > 0, got {self.time_limit_s}")


@contextmanager
def _stdout_silenced() -> Iterator[None]:
    """Point file descriptor 1 at /dev/null for the duration.

    HiGHS (scipy 1.17) prints some internal messages with C printf whatever `disp` says — e.g.
    "HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();" for residual_mlp on 3
    processors without the intra split — which would corrupt `layerpipe schedule --format json` on stdout.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def optimal_assignment(costs: list[int], num_procs: int, time_limit_s: float,
                       upper: int | None = None) -> tuple[list[int], int, bool]:
    """(processor per item, minimum largest load, proven optimal) for P||Cmax by MILP; `upper` is a known
    achievable period (a heuristic's), which prunes the search."""
    # numpy and scipy load here, not at import: the CLI builds its parser from this package, and scipy.optimize
    # alone takes ~0.5 s to import.
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    n = len(costs)
    order = sorted(range(n), key=lambda i: (-costs[i], i))
    procs = [min(r, num_procs - 1) + 1 for r in range(n)]  # item of rank r may use processors 0..r
    cols: list[tuple[int, int]] = [(order[r], p) for r in range(n) for p in range(procs[r])]
    nx = len(cols)
    c = np.zeros(nx + 1)
    c[-1] = 1.0  # minimise P, the last variable
    assign = np.zeros((n, nx + 1))
    load = np.zeros((num_procs, nx + 1))
    for k, (i, p) in enumerate(cols):
        assign[i, k] = 1.0
        load[p, k] = costs[i]
    load[:, -1] = -1.0
    lower = np.zeros(nx + 1)
    high = np.ones(nx + 1)
    lower[-1] = period_lower_bound(costs, num_procs)
    high[-1] = sum(costs) if upper is None else upper
    integrality = np.ones(nx + 1)
    integrality[-1] = 0
    with _stdout_silenced():
        res = milp(c, integrality=integrality, bounds=Bounds(lower, high),
                   constraints=[LinearConstraint(assign, 1, 1), LinearConstraint(load, -np.inf, 0)],
                   options={"time_limit": time_limit_s, "mip_rel_gap": 0.0})
    if res.x is None:
        raise InputError(f"optimal: HiGHS found no schedule within time_limit_s={time_limit_s}: {res.message}")
    proc = [0] * n
    for k, (i, p) in enumerate(cols):
        if res.x[k] > 0.5:
            proc[i] = p
    loads = [0] * num_procs
    for i, p in enumerate(proc):
        loads[p] += costs[i]
    return proc, max(loads), res.status == 0


def schedule_optimal(network: Network, num_procs: int, model: CostModel, options: OptimalOptions,
                     interconnect: Interconnect = SHARED) -> ScheduleResult:
    graph = build_training_graph(network, GraphOptions(intra=options.intra, inter=options.inter))
    table = TaskTable.of(graph, model)
    group = weight_groups(table, options.keep_weights_together)
    item_costs, members = group_items(table, group)
    size = len(item_costs) * num_procs
    if len(item_costs) > MAX_ITEMS or size > MAX_VARIABLES:
        raise InputError(f"optimal: graph has {len(item_costs)} tasks × {num_procs} processors = {size}, limit is "
                         f"{MAX_ITEMS} tasks and {MAX_VARIABLES} task-processor pairs; use --policy layerpipe")
    asap = asap_times(table)
    placement = min(candidate_placements(table, num_procs, group, asap)[0],
                    key=lambda p: max(loads_of(table, p, num_procs)))
    heuristic = max(loads_of(table, placement, num_procs))
    if heuristic == period_lower_bound(item_costs, num_procs):
        period, proven, how = heuristic, True, "the period equals the lower bound"
    else:
        item_proc, period, proven = optimal_assignment(item_costs, num_procs, options.time_limit_s, heuristic)
        placement = place_items(members, item_proc, len(table))
        how = "HiGHS proved the period optimal"
    # The MILP minimises the busiest processor; off `shared` the period also fits the placement's busiest
    # channel and the transfers are planned, so the figure holds on the interconnect (optimality is then
    # proven for the processors only, and the note says so).
    channel = busiest_channel(table, Comm(placement, interconnect, num_procs))
    if channel > period:
        period, how = channel, how + " for the processors; its placement's busiest channel then sets the period"
    timing = best_ordering(table, placement, num_procs, period, asap_keys(asap, period),
                           default_targets(table, placement, num_procs, asap), interconnect)
    note = f"optimal: {how}" if proven else f"time limit {options.time_limit_s}s hit: period not proven optimal"
    note += (" (among schedules of one iteration per period, J = 1; unfolded schedules, e.g. replicated pipedream, "
             "may be faster: see lower_bound_unfolded_cycles)")
    return periodic_result("optimal", options, table, num_procs, placement, timing.start, timing.lag, period,
                           item_costs, notes=(note,), interconnect=interconnect, arrival=timing.arrival)

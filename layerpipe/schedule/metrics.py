"""Bounds and figures of merit of a schedule (design notes §5), in stable snake_case names with units.

- `period_lower_bound` — P ≥ max(⌈Σc/N⌉, max c, pigeonhole bounds) for asynchronous periodic schedules (c
  over the items a policy places as a whole: tasks, or a layer's weight tasks under `keep_weights_together`), plus the
  loop bounds ⌈T_loop(l)/(D_max + 1)⌉ under a staleness bound D_max: the weight loop of layer l carries
  D_max + 1 delays, so it cannot turn around faster than that.
- `traffic_words` — words on DFG edges whose ends run on different processors (weight edges included, so
  splitting a layer's weight tasks costs |W_l| words per crossing).
- `stash_versions` — weight versions of a layer held at once under weight stashing: the one E_l(t) needs
  plus every newer version written while F_l(t) … E_l(t) is in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from layerpipe.dfg import Task, TrainingGraph


@dataclass(frozen=True)
class ScheduleMetrics:
    """Figures of one schedule. Cycle figures are per sample unless the name says otherwise."""

    cycles_per_sample: float
    lower_bound_cycles: float  #: per sample, the bound for this policy's problem
    utilization_pct: float
    traffic_words_per_sample: float
    weight_versions: int  #: the most versions of one layer's weights held at once
    max_staleness: int  #: the most updates a weight read lags behind (0 for synchronous policies)
    period_cycles: int  #: period (asynchronous) or step time (synchronous) in cycles
    samples_per_period: int  #: batch (asynchronous) or microbatches × batch (synchronous)
    staleness_per_layer: dict[int, int] = field(default_factory=dict)
    weight_versions_per_layer: dict[int, int] = field(default_factory=dict)
    #: per sample, the bound when iterations may be unfolded (J per period, a task's copies on different
    #: processors, as replication does): Σc / N for schedules of one iteration per period — no single task
    #: bounds it any more — and, for an unfolded schedule, max(Σc_J / N, max c, busiest channel) / (J·batch)
    #: for its own J. `lower_bound_cycles` is the bound for one iteration per period. None: the same.
    lower_bound_unfolded_cycles: float | None = None

    def __post_init__(self) -> None:
        if self.lower_bound_unfolded_cycles is None:
            object.__setattr__(self, "lower_bound_unfolded_cycles", self.lower_bound_cycles)

    def row(self) -> dict[str, float | int]:
        """The scalar figures, in the column order of `layerpipe compare`."""
        doc = asdict(self)
        doc.pop("staleness_per_layer")
        doc.pop("weight_versions_per_layer")
        return doc


def period_lower_bound(item_costs: Sequence[int], num_procs: int, loop_lengths: Mapping[int, int] | None = None,
                       max_staleness: int | None = None) -> int:
    """max(⌈Σc/N⌉, max c, pigeonhole bounds), and ⌈T_loop(l)/(D_max+1)⌉ per weight loop under a staleness
    bound D_max.

    Pigeonhole: of the kN + 1 largest items some processor holds k + 1, so P is at least the sum of the
    k + 1 smallest of them, c₍kN−k+1₎ + … + c₍kN+1₎ (c₍i₎ the i-th largest; k = 1 gives c₍N₎ + c₍N+1₎).
    """
    ranked = sorted(item_costs, reverse=True)
    bound = max(-(-sum(ranked) // num_procs), ranked[0] if ranked else 0)
    k = 1
    while k * num_procs < len(ranked):
        top = k * num_procs + 1
        bound = max(bound, sum(ranked[top - k - 1 : top]))
        k += 1
    if max_staleness is not None and loop_lengths:
        bound = max(bound, max(-(-t // (max_staleness + 1)) for t in loop_lengths.values()))
    return bound


def utilization_pct(work: int, num_procs: int, cycles: int) -> float:
    return round(100.0 * work / (num_procs * cycles), 3) if cycles else 0.0


def traffic_words(graph: TrainingGraph, placement: Mapping[Task, int]) -> int:
    """Words per iteration on DFG edges between tasks on different processors (weight edges included)."""
    return sum(e.words for e in graph.edges if placement[e.src] != placement[e.dst])


def stash_versions(graph: TrainingGraph, timing: Mapping[Task, tuple[int, int]], period: int) -> dict[int, int]:
    """Versions of W_l held at once per weight layer, from each task's (absolute start, cost) in iteration 0.

    Updates U_l end at τ_k = end(U_l) + k·P. The version F_l(t) read is needed until E_l(t) ends; every
    update ending strictly inside (start F_l, end E_l) adds a newer version that is live at the same time.
    Without a stash edge (no E_l, or weight mode `latest`) one version is held.
    """
    out: dict[int, int] = {}
    stashing = {e.dst.layer for e in graph.edges if e.role == "stash"}
    for layer in graph.network.layers:
        if not layer.has_weights:
            continue
        if layer.index not in stashing:
            out[layer.index] = 1
            continue
        f, e, u = (graph.task_of(layer.index, k) for k in "FEU")
        assert f is not None and e is not None and u is not None, "a stashed weight layer has F, E and U"
        f_start = timing[f][0]
        e_end = sum(timing[e])
        u_end = sum(timing[u])
        # integers k with f_start < u_end + kP < e_end
        lo = (f_start - u_end) // period + 1
        hi = -(-(e_end - u_end) // period) - 1
        out[layer.index] = 1 + max(0, hi - lo + 1)
    return out

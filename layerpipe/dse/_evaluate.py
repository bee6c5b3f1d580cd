"""Evaluate one design point: schedule it, simulate it, and (optionally) synthesise its RTL.

The scheduler gives the period, bounds, staleness and versions; the cycle-accurate simulator gives the
cycles per sample on the point's interconnect (the one the schedule was planned on: `layerpipe.interconnect`)
and the peak memory per processor. Area comes from the RTL synthesis flow for MLP points.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from layerpipe._memo import BoundedMemo
from layerpipe.costs import make_cost_model
from layerpipe.dse._sweep import DesignPoint
from layerpipe.errors import unknown_name
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import _dataparallel, _streams
from layerpipe.schedule._periodic import slot_order
from layerpipe.schedule._stream_engine import SIM_ITERATIONS_MIN  # dp times its step over it: defined below
from layerpipe.schedule._sync_policies import simulated_microbatches, steady_run_kept, steady_state_steps

if TYPE_CHECKING:
    from layerpipe.sim import SimResult


def simulated_iterations(result) -> int:
    """Enough iterations for the steady state to show: past the prologue of the largest lag (async), or
    three whole steps (sync)."""
    if result.periodic is not None:
        # Whole periods (J iterations each, whole update groups), long enough that a fill which ran ahead of
        # the plan has given its slack back before the simulator's middle-half window.
        max_lag = max((s.lag for body in result.periodic.bodies for s in body), default=0)
        unfold = max(result.periodic.unfold, 1)
        return max(-(-SIM_ITERATIONS_MIN // unfold), 4 * max_lag + 12) * unfold
    return simulated_microbatches(result.explicit.microbatches)


#: Policies timed by the stream engine (kernels overlap: `layerpipe.sim._streams`), which measures its own
#: steady state; every other policy runs on the one-op-at-a-time simulator.
STREAM_POLICIES = (*_dataparallel.POLICY_NAMES, *_streams.POLICY_NAMES)


def steady_utilization_pct(sim, cycles_per_iteration: float | None = None) -> float:
    """Busy share of the processors in the steady state: work per iteration ÷ (N × cycles per iteration).

    The row's `cycles_per_sample` is the steady-state figure, so its utilization must be too; the simulator's
    own `utilization_pct` is over the whole run, prologue and drain included (97.4 % instead of `layerpipe
    compare`'s 100 % for mlp:7-6-5-3 on 2 processors, whose period is exactly its work ÷ N).
    `cycles_per_iteration` is the steady state the row reports (`steady_simulation`); default the run's own.
    """
    per_iteration = sum(sim.busy_cycles) / max(sim.num_iterations, 1)
    if cycles_per_iteration is None:
        cycles_per_iteration = sim.cycles_per_iteration
    capacity = sim.num_procs * cycles_per_iteration
    return 100.0 * per_iteration / capacity if capacity else 0.0


def steady_simulation(result, network, model, config) -> tuple[SimResult, float]:
    """Simulate a schedule twice, K and 2K iterations (K = `simulated_iterations`: whole periods, whole
    steps), and return the longer run with the steady-state cycles per iteration (per micro-batch for
    synchronous schedules) that `SimResult.steady_cycles_per_iteration` measures from the pair.

    One finite run can look faster than the steady state: a processor that carries most of a bus-bound
    period runs ahead during the fill (initial weights need no transfer) and gives the slack back a cycle at
    a time for many periods, inside the middle-half window (pipedream, one Linear 5→8, N=5, profiled
    F50 A3 G50 U3, bus:1:2: 29.5 cycles/sample in 64 iterations, 30 in 128, scheduled at 30). The extra K
    iterations of the longer run cost what K periods of the steady state cost once that slack is spent.
    """
    from layerpipe.sim import simulate_policy_pair, simulate_policy_result

    iterations = simulated_iterations(result)
    if result.policy in STREAM_POLICIES:  # the stream engine's own steady-state measure, one run
        sim = simulate_policy_result(result, network, model, iterations, config)
        return sim, sim.cycles_per_iteration
    if result.explicit is not None:  # whole steps: K of `steady_state_steps` (the scheduler may have timed the 2K run)
        m = max(result.explicit.microbatches, 1)
        iterations = steady_state_steps(m)[0] * m
    # The shorter run read off the longer one where it is its start, else cut out of it (`simulate_policy_pair`).
    longer, shorter_iterations, shorter_total = simulate_policy_pair(result, network, model, 2 * iterations,
                                                                     iterations, config)
    return longer, longer.steady_cycles_per_iteration_of(shorter_iterations, shorter_total)


def check_points(points: Sequence[DesignPoint]) -> None:
    """Fail fast, before any work, on names that cannot resolve (one line, exit 2 through the CLI)."""
    from layerpipe.schedule.policies import POLICIES

    for net in sorted({p.network for p in points}):
        load_network(net)
    for policy in sorted({p.policy for p in points}):
        if policy not in POLICIES:
            raise unknown_name("policy", policy, POLICIES)
    for model in sorted({p.cost_model for p in points}):
        make_cost_model(model, lanes=1)


def evaluate_point(point: DesignPoint, area: bool = False) -> dict[str, object]:
    from layerpipe.schedule.policies import make_schedule, policy_options

    network = load_network(point.network, point.batch)
    model = make_cost_model(point.cost_model, lanes=point.lanes)
    given: dict[str, object] = {"max_staleness": point.max_staleness} if point.max_staleness is not None else {}
    if point.max_traffic is not None:
        given["max_traffic"] = point.max_traffic
    if point.reverse_first_k is not None:
        given["reverse_first_k"] = "auto" if point.reverse_first_k == "auto" else int(point.reverse_first_k)
    interconnect = parse_interconnect(point.interconnect, lanes=getattr(model, "lanes", None) or 1)
    with steady_run_kept():  # a synchronous step is timed on the 2K run simulated below, which then reads it
        result = make_schedule(point.policy, network, point.num_procs, model, policy_options(point.policy, given),
                               interconnect)
    m = result.metrics
    # The steady state from two runs (K and 2K iterations); every other per-run figure (busy cycles, peak
    # memory) is the longer run's, and the utilization is over the same steady state as cycles_per_sample.
    # A schedule simulated before on the same network, costs and interconnect (LayerPipe's search returns
    # PipeDream's replicated plan wherever that wins: a third of issue 14's sweep) is not simulated again.
    content = simulated_content(result)
    key = None if content is None else (point.network, point.batch, point.cost_model, point.lanes, interconnect,
                                        content)
    figures = _SIMULATED.get(key) if key is not None else None
    if figures is None:
        figures = _simulated_figures(result, network, model, interconnect)
        if key is not None:
            _SIMULATED.add(key, figures)
    per_sample, utilization, peak = figures
    row: dict[str, object] = {
        "network": point.network,
        "num_procs": point.num_procs,
        "policy": point.policy,
        "max_staleness_bound": point.max_staleness,
        "lanes": point.lanes,
        "interconnect": interconnect.spec,
        "max_traffic_bound": point.max_traffic,
        "batch": point.batch,
        "cost_model": point.cost_model,
        "cycles_per_sample": round(per_sample, 3),
        "lower_bound_cycles_per_sample": round(m.lower_bound_cycles, 3),
        "utilization_pct": round(utilization, 3),
        "traffic_words_per_sample": round(m.traffic_words_per_sample, 3),
        "peak_memory_words": peak,
        "weight_versions": m.weight_versions,
        "max_staleness": m.max_staleness,
    }
    if area:
        row.update(_area(point))
    return row


def _simulated_figures(result, network, model, interconnect) -> tuple[float, float, int]:
    """(cycles per sample, utilization %, peak memory words over processors) of the steady-state simulation."""
    from layerpipe.sim import SimConfig

    sim, per_iteration = steady_simulation(result, network, model, SimConfig.of(interconnect))
    per_sample = per_iteration / sim.batch  # as `SimResult.cycles_per_sample` from `cycles_per_iteration`
    return per_sample, steady_utilization_pct(sim, per_iteration), max(sim.peak_memory_words)


def simulated_content(result) -> tuple[object, ...] | None:
    """Everything of a periodic result the simulator reads (`layerpipe.sim.policy_ops`: the network it runs on,
    its graph switches, and the whole periodic schedule, costs and read delays included), as a hashable value;
    None for other results (synchronous steps and stream policies: not memoised). Two results with equal
    content simulate to the same figures whatever their policy's name."""
    periodic = result.periodic
    if periodic is None or result.graph is None or result.policy in STREAM_POLICIES:
        return None
    return (result.network, result.graph.options, periodic.period, periodic.unfold, periodic.groups,
            periodic.read_floor, tuple(tuple(map(slot_order, body)) for body in periodic.bodies),
            frozenset(periodic.costs.items()), frozenset(periodic.read_delays.items()))


#: The simulated figures of the recent points (`evaluate_point`; a sweep's batches group every policy of a
#: network and processor count, so a few entries suffice).
_SIMULATED: BoundedMemo[tuple[object, ...], tuple[float, float, int]] = BoundedMemo(8)


def _area(point: DesignPoint) -> dict[str, object]:
    """Synthesis figures of the point's RTL (MLPs on policies the hardware runs); empty cells otherwise."""
    try:
        from layerpipe.hdl import synthesize_design
    except ImportError:
        return {}
    figures = synthesize_design(point.network, point.policy, point.num_procs, point.lanes)
    if figures is None:
        return {}
    # The part names what the figures mean (place and route on it, or Debian yosys's iCE40 mapping without one).
    return {"area_luts": figures.get("luts"), "area_ffs": figures.get("ffs"), "area_dsps": figures.get("dsps"),
            "area_brams": figures.get("brams"), "area_part": figures.get("part") or "ice40-yosys",
            "fmax_mhz": figures.get("fmax_mhz")}

"""The property fuzz of issue 12 (Done when): over random chains, residual DAGs and small CNNs with zero-cost
layers, N 1..16, every policy, every cost model and every interconnect kind,

    schedule → validate → simulate never deadlocks, and the simulated period (or step) equals the scheduled one.

A policy may refuse a case with `InputError` (its documented limits: `optimal`'s size limit, stages > layers,
the stream policies' N = 1, the RTL cost model's MLP-only shapes); that is not a schedule, so nothing more is
asked of it. Anything else — an exception that is not `InputError`, a validator rejecting the policy's own
schedule, a simulator deadlock, a simulated cycles-per-sample different from the scheduled one — fails.

"Equal" is exact up to float rounding (relative 1e-9): the scheduled figure is what `compare` prints, the
simulated one the self-timed steady state on the same interconnect (`SimResult.steady_cycles_per_iteration`:
the run of the iterations `explore` simulates, `layerpipe.dse._evaluate.simulated_iterations`, in whole
periods or steps, and a run twice as long). The simulator runs self-timed (an op starts when its inputs and its
processor are free), so a periodic body with slack may run faster than its period: that is a mismatch too. The
stream policies (dp, dp-ooo, stream, stream-ooo) are held to their engine's own figure for `explore`'s run.

Budget: one test per policy (17), `EXAMPLES` each (≥ 2,000 in all); networks of at most 6 layers (3 for
`optimal`). It is the suite's one slow file.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from layerpipe.costs import COST_MODELS, MacsModel, PEModel, ProfiledModel, network_costs
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Activation, Conv2d, Flatten, Linear, Network, NetworkBuilder, Pool2d
from layerpipe.schedule.policies import POLICIES, make_schedule
from tests.strategies import networks

#: Examples per policy: 17 policies × 120 = 2,040.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "120"))
INTERCONNECTS = ("shared", "links:1:1", "links:2:1/2", "bus:1:2", "rtl")
#: Policies whose schedules run on the stream engine (kernels overlap), not the one-op-at-a-time simulator.
STREAM_POLICIES = ("dp", "dp-ooo", "stream", "stream-ooo")


@st.composite
def cnns(draw: st.DrawFn) -> Network:
    """conv → [pool] → [relu layer] → flatten → linear [→ linear]: flatten costs 0 MACs (and 0 cycles under
    `pe` with overhead 0), a standalone activation has no weights — the zero-cost layers of issue 12 item 1."""
    c, hw = draw(st.integers(1, 3)), draw(st.integers(4, 7))
    b = NetworkBuilder("cnn", (c, hw, hw), 1)
    k = draw(st.integers(1, 3))
    b.add("conv", Conv2d(draw(st.integers(1, 4)), k, activation=draw(st.sampled_from(("relu", "identity")))))
    prev = "conv"
    if draw(st.booleans()) and hw - k + 1 >= 2:
        b.add("pool", Pool2d(draw(st.sampled_from(("max", "avg"))), 2), [prev])
        prev = "pool"
    if draw(st.booleans()):
        b.add("act", Activation("relu"), [prev])
        prev = "act"
    b.add("flat", Flatten(), [prev])
    b.add("fc", Linear(draw(st.integers(1, 8))), ["flat"])
    if draw(st.booleans()):
        b.add("fc2", Linear(draw(st.integers(1, 8))), ["fc"])
    return b.build()


@dataclass(frozen=True)
class Case:
    network: Network
    num_procs: int
    model: object
    interconnect: str
    options: object = None


@st.composite
def cases(draw: st.DrawFn, policy: str) -> Case:
    max_layers = 3 if policy == "optimal" else 6
    family = draw(st.sampled_from(("chain", "dag", "cnn")))
    if family == "cnn" and policy != "optimal":
        net = draw(cnns())
    else:
        net = draw(networks(max_layers=max_layers, dag=family == "dag", max_width=12))
    name = draw(st.sampled_from(tuple(COST_MODELS)))
    if name == "macs":
        model: object = MacsModel()
    elif name == "pe":
        model = PEModel(draw(st.integers(1, 64)), draw(st.sampled_from((0, 0, 1, 16))))  # overhead 0: zero costs
    elif name == "rtl":
        from layerpipe._rtl_costs import RTLCostModel

        model = RTLCostModel(draw(st.sampled_from((1, 2, 4))))
    else:  # a measured profile, zeros included
        times: dict[str, dict[str, int]] = {}
        for (index, kind) in network_costs(MacsModel(), net):
            times.setdefault(net.layer(index).name, {})[kind] = draw(st.sampled_from((0, 0, 1, 3, 50, 777)))
        model = ProfiledModel(net.name, net.batch, times)
    return Case(net, draw(st.integers(1, 16)), model, draw(st.sampled_from(INTERCONNECTS)))


def _validate(result, iterations: int) -> None:
    from layerpipe.schedule._validate import validate_explicit, validate_periodic

    if result.periodic is not None and result.graph is not None:
        validate_periodic(result.periodic, result.graph)
        validate_explicit(result.periodic.unroll(iterations), result.graph)
    elif result.explicit is not None:
        validate_explicit(result.explicit, stages=result.stages)


@st.composite
def bounded_cases(draw: st.DrawFn) -> Case:
    """`layerpipe` under a staleness bound (its bounded search, `_layerpipe._bounded`, and the re-timings
    after it), weights together or free."""
    from layerpipe.schedule import LayerPipeOptions

    case = draw(cases("layerpipe"))
    options = LayerPipeOptions(max_staleness=draw(st.integers(0, 3)), keep_weights_together=draw(st.booleans()))
    return Case(case.network, case.num_procs, case.model, case.interconnect, options)


def check_case(policy: str, case: Case) -> None:
    """The property for one case; raises AssertionError (or the simulator's error) when it does not hold."""
    from layerpipe.dse._evaluate import simulated_iterations
    from layerpipe.sim import SimConfig, simulate_policy_result

    lanes = getattr(case.model, "lanes", None) or 1
    interconnect = parse_interconnect(case.interconnect, lanes=lanes)
    note(f"{policy} N={case.num_procs} model={case.model!r} interconnect={case.interconnect} "
         f"options={case.options}\n"
         f"network layers: {[(layer.name, type(layer.op).__name__) for layer in case.network.layers]}")
    try:
        result = make_schedule(policy, case.network, case.num_procs, case.model, case.options,
                               interconnect=interconnect)
    except InputError:
        return  # a documented refusal: no schedule, nothing to hold it to
    iterations = simulated_iterations(result)
    config = SimConfig.of(interconnect)
    scheduled = result.metrics.cycles_per_sample
    if policy in STREAM_POLICIES:  # the stream engine's own measure (`layerpipe.sim._streams`)
        sim = simulate_policy_result(result, case.network, case.model, iterations, config)
        simulated = sim.cycles_per_sample
    else:
        _validate(result, iterations)
        if result.explicit is not None:  # whole steps
            m = result.explicit.microbatches
            iterations = -(-iterations // m) * m
        short = simulate_policy_result(result, case.network, case.model, iterations, config)
        long = simulate_policy_result(result, case.network, case.model, 2 * iterations, config)
        simulated = long.steady_cycles_per_iteration(short) / long.batch
    assert math.isclose(simulated, scheduled, rel_tol=1e-9, abs_tol=1e-9), (
        f"simulated {simulated} cycles/sample, scheduled {scheduled}")


#: Deterministic examples (the same cases every run); no shrinking under CI, where a failing policy's shrink
#: would cost minutes — run locally to get the minimal example.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate) if os.environ.get("CI") else tuple(Phase)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_schedule_validate_simulate(policy: str) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, phases=_PHASES,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases(policy))
    def run(case: Case) -> None:
        check_case(policy, case)

    run()


@pytest.mark.slow
def test_layerpipe_staleness_bound_schedule_validate_simulate() -> None:
    """The same property for `layerpipe --max-staleness K` (K 0..3): a bounded schedule's period is the
    self-timed run's (`_self_timed.settled` takes out the slack the search leaves)."""
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, phases=_PHASES,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=bounded_cases())
    def run(case: Case) -> None:
        check_case("layerpipe", case)

    run()


@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in ("stream", "stream-ooo")])
def test_the_fuzz_is_not_vacuous(policy: str) -> None:
    """Every policy schedules a plain case the fuzz draws (so a fuzz run is not all refusals)."""
    net = NetworkBuilder("plain", (8,), 1)
    net.add("fc1", Linear(6, activation="relu"))
    net.add("fc2", Linear(4))
    result = make_schedule(policy, net.build(), 2, PEModel(4, 2), None, interconnect=parse_interconnect("shared"))
    assert result.metrics.cycles_per_sample > 0

"""layerpipe: model, schedule, simulate and generate RTL for LayerPipe-style training accelerators.

The names a script needs (docs/api.md walks through them):

    net = layerpipe.load_network("mlp:8-8-4")                # or a YAML file, or from_torch(module, shape)
    model = layerpipe.make_cost_model("pe", lanes=4)
    link = layerpipe.parse_interconnect("links:2:4")          # what moves data between processors
    result = layerpipe.make_schedule("layerpipe", net, 2, model, interconnect=link)
    run = layerpipe.simulate(result, net, model, iterations=8)
    table = layerpipe.compare(net, 2, ["layerpipe", "pipedream"], model=model, interconnect=link)
    design = layerpipe.make_design(net, "layerpipe", 2, lanes=4, samples=4)   # needs the hdl extra
    verilog = layerpipe.export_verilog(design)

Everything but `InputError` and `__version__` loads on first use (PEP 562): the CLI imports this package
at every start, and numpy, scipy, networkx and amaranth together take seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerpipe._lazy import lazy_names
from layerpipe.errors import InputError

__version__ = "0.1.0"

if TYPE_CHECKING:
    from layerpipe.costs import COST_MODELS, CostModel, make_cost_model
    from layerpipe.dfg import GraphOptions, TrainingGraph, build_training_graph
    from layerpipe.hdl import Design, make_design
    from layerpipe.hdl._flow import export_verilog
    from layerpipe.interconnect import SHARED, Interconnect, parse_interconnect
    from layerpipe.network import Network, NetworkBuilder, from_torch, load_network
    from layerpipe.retiming import DelaySolution, solve_delays
    from layerpipe.schedule import POLICIES, ScheduleResult, make_schedule
    from layerpipe.sim import SimConfig, SimResult

#: Public name → the module that defines it (imported when the name is first used).
_LAZY: dict[str, str] = {
    "COST_MODELS": "layerpipe.costs",
    "CostModel": "layerpipe.costs",
    "make_cost_model": "layerpipe.costs",
    "GraphOptions": "layerpipe.dfg",
    "TrainingGraph": "layerpipe.dfg",
    "build_training_graph": "layerpipe.dfg",
    "Design": "layerpipe.hdl",
    "export_verilog": "layerpipe.hdl._flow",  # the design exporter (one component: hdl.component_verilog)
    "make_design": "layerpipe.hdl",
    "SHARED": "layerpipe.interconnect",
    "Interconnect": "layerpipe.interconnect",
    "parse_interconnect": "layerpipe.interconnect",
    "Network": "layerpipe.network",
    "NetworkBuilder": "layerpipe.network",
    "from_torch": "layerpipe.network",
    "load_network": "layerpipe.network",
    "DelaySolution": "layerpipe.retiming",
    "solve_delays": "layerpipe.retiming",
    "POLICIES": "layerpipe.schedule",
    "ScheduleResult": "layerpipe.schedule",
    "make_schedule": "layerpipe.schedule",
    "SimConfig": "layerpipe.sim",
    "SimResult": "layerpipe.sim",
}


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


def simulate(result: ScheduleResult, network: Network, model: CostModel, iterations: int = 8, *,
             mode: str = "stash", interconnect: Interconnect | None = None) -> SimResult:
    """Time `iterations` iterations of a schedule on the cycle-accurate simulator.

    The interconnect is the one the schedule was made for (`result.interconnect`) unless another is
    given, so a schedule's figures are checked on the machine they claim; `mode` is what backward reads
    (stash, latest, ema).
    """
    from layerpipe.sim import SimConfig, simulate_policy_result

    config = SimConfig.of(interconnect or result.interconnect, mode)
    return simulate_policy_result(result, network, model, iterations, config)


def compare(network: Network | str, num_procs: int, policies: list[str] | tuple[str, ...] | None = None, *,
            model: CostModel | None = None, interconnect: Interconnect | None = None) -> dict[str, ScheduleResult]:
    """Schedule one network on `num_procs` processors under several policies, one cost model, one
    interconnect: {policy: result}, in the order asked (default: every policy that runs on it).

    `model` defaults to `pe` (64 lanes, 16 cycles overhead) and `interconnect` to `shared`, as in
    `make_schedule`. Compare `result.metrics.cycles_per_sample` (and traffic, staleness, memory) across
    the results; `layerpipe compare` prints the same figures as a table.
    """
    from layerpipe.costs import make_cost_model
    from layerpipe.network import load_network
    from layerpipe.schedule import POLICIES, make_schedule

    net = load_network(network) if isinstance(network, str) else network
    model = model or make_cost_model("pe")
    out: dict[str, ScheduleResult] = {}
    for name in policies if policies is not None else POLICIES:
        try:
            out[name] = make_schedule(name, net, num_procs, model, interconnect=interconnect)
        except InputError:
            if policies is not None:
                raise  # a policy asked for by name must run
            # by default, skip a policy that does not run on this network (size limit, too few layers)
    return out


__all__ = [
    "COST_MODELS",
    "POLICIES",
    "SHARED",
    "CostModel",
    "DelaySolution",
    "Design",
    "GraphOptions",
    "InputError",
    "Interconnect",
    "Network",
    "NetworkBuilder",
    "ScheduleResult",
    "SimConfig",
    "SimResult",
    "TrainingGraph",
    "__version__",
    "build_training_graph",
    "compare",
    "export_verilog",
    "from_torch",
    "load_network",
    "make_cost_model",
    "make_design",
    "make_schedule",
    "parse_interconnect",
    "simulate",
    "solve_delays",
]

"""The registry names and limits the command parsers show, written out so building a parser imports no registry.

Issue 14 item 3: `layerpipe CMD --help` and an argument error must start in well under 100 ms, but the registries
live in modules that import numpy, networkx and scipy (the policies, the cost models, the simulator) or hashlib
and importlib.metadata (the FPGA flow). The parsers take the names from here; the handlers still import the real
registries to do the work. tests/test_cli_names.py checks that every tuple here equals its registry, in order,
so the two cannot drift.
"""

from __future__ import annotations

#: `layerpipe.schedule.policies.POLICIES`, in its order (`--policy` and `--policies` help).
POLICY_NAMES: tuple[str, ...] = (
    "layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv",
    "dualpipev", "looped-bfs", "ooo", "optimal", "dp", "dp-ooo", "stream", "stream-ooo",
)

#: `layerpipe.schedule.policies.MAX_PROCS`: the most processors `-n` takes.
MAX_PROCS = 4096

#: `layerpipe.costs.COST_MODELS`, each name with the parameters it `takes` from the command line, in its order.
COST_MODEL_TAKES: dict[str, tuple[str, ...]] = {
    "macs": (),
    "pe": ("lanes", "overhead"),
    "profiled": ("profile",),
    "rtl": ("lanes",),
}

#: `layerpipe.dfg.WEIGHT_MODES`, which is also the simulator's `layerpipe.sim.MODES` (what backward E reads).
WEIGHT_MODES: tuple[str, ...] = ("stash", "latest", "ema")

#: `layerpipe.hdl._fpga.PARTS` and `ROUTERS` (`rtl --part`, `--router`).
FPGA_PARTS: tuple[str, ...] = ("ecp5-25k", "ecp5-45k", "ecp5-85k", "ice40-up5k", "ice40-hx8k")
FPGA_ROUTERS: tuple[str, ...] = ("router1", "router2")

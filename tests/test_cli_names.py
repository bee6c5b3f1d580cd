"""The parsers' static copies of the registry names (`layerpipe/commands/_names.py`) equal the registries.

The copies exist so that `layerpipe CMD --help` imports no registry (issue 14 item 3); these checks make them
impossible to drift: a policy, cost model, weight mode or FPGA part added to its registry fails here until the
copy names it too, in the same order (the order `--help` lists them in).
"""

from __future__ import annotations

from layerpipe.commands import _names


def test_policy_names_are_the_registry() -> None:
    from layerpipe.schedule.policies import MAX_PROCS, POLICIES

    assert tuple(POLICIES) == _names.POLICY_NAMES
    assert _names.MAX_PROCS == MAX_PROCS


def test_cost_models_and_what_they_take_are_the_registry() -> None:
    from layerpipe.costs import COST_MODELS

    assert {name: tuple(kind.takes) for name, kind in COST_MODELS.items()} == _names.COST_MODEL_TAKES
    assert list(_names.COST_MODEL_TAKES) == list(COST_MODELS)


def test_weight_modes_are_the_graphs_and_the_simulators() -> None:
    from layerpipe.dfg import WEIGHT_MODES
    from layerpipe.sim import MODES

    assert _names.WEIGHT_MODES == tuple(WEIGHT_MODES) == tuple(MODES)


def test_fpga_parts_and_routers_are_the_flows() -> None:
    from layerpipe.hdl._fpga import PARTS, ROUTERS

    assert tuple(PARTS) == _names.FPGA_PARTS
    assert tuple(ROUTERS) == _names.FPGA_ROUTERS

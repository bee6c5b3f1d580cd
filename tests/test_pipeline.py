"""The pipelined datapath's structure (issue 16 item 2): multipliers only in the lanes, address arithmetic by
shifts and adds, the op overhead the pipeline's depth, the sequencer's search settling within an op.

Cycle- and bit-exactness of the pipelined hardware are the unit benches' (tests/test_pe.py) and the whole
accelerator's (tests/test_rtl_accel.py) business; Fmax is tests/test_fpga.py's."""

from __future__ import annotations

import re

import pytest
from amaranth.hdl import Fragment, Module, Signal, unsigned
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.fixedpoint import DEFAULT_FORMAT
from layerpipe.hdl import PEConfig, op_overhead
from layerpipe.hdl._datapath import latency, mul_const, saturate, tree_stages
from layerpipe.hdl._flow import export_verilog, make_design
from layerpipe.hdl._sequencer import Sequencer


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 300), st.lists(st.integers(0, 255), min_size=1, max_size=6))
def test_mul_const_is_the_product(factor: int, values: list[int]) -> None:
    a = Signal(unsigned(8))
    out = Signal(unsigned(17))
    m = Module()
    m.d.comb += out.eq(mul_const(a, factor))
    sim = Simulator(m)
    seen: list[int] = []

    async def bench(ctx) -> None:  # type: ignore[no-untyped-def]
        for v in values:
            ctx.set(a, v)
            seen.append(ctx.get(out))

    sim.add_testbench(bench)
    sim.run()
    assert seen == [v * factor for v in values]


def test_mul_const_refuses_a_negative_factor() -> None:
    with pytest.raises(ValueError, match="factor >= 0"):
        mul_const(Signal(4), -3)


@pytest.mark.parametrize("width", [4, 8])
def test_saturate_clamps_like_the_spec(width: int) -> None:
    """The sign-extension test is the clamp to [−2^(w−1), 2^(w−1) − 1], over every 12-bit signed value."""
    from amaranth.hdl import signed

    a = Signal(signed(12))
    out = Signal(signed(width))
    m = Module()
    m.d.comb += out.eq(saturate(a, width))
    sim = Simulator(m)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    wrong: list[tuple[int, int]] = []

    async def bench(ctx) -> None:  # type: ignore[no-untyped-def]
        for v in range(-2048, 2048):
            ctx.set(a, v)
            if ctx.get(out) != min(hi, max(lo, v)):
                wrong.append((v, ctx.get(out)))

    sim.add_testbench(bench)
    sim.run()
    assert not wrong


@pytest.mark.slow  # three accelerators elaborated: ~2 s of CPU each
@pytest.mark.parametrize(("network", "policy", "n", "lanes"), [
    ("mlp:9-8-4-6-2", "pipedream", 2, 4), ("mlp:9-8-4-6-2", "layerpipe", 3, 1), ("mlp:7-6-5-3", "layerpipe", 2, 3)])
def test_the_only_multipliers_are_the_lanes(network: str, policy: str, n: int, lanes: int) -> None:
    """Ring slots, link slots and the sample loader multiply by constants as shifts and adds: the Verilog's
    only multiplications are the PEs' lane multipliers (one DSP each)."""
    verilog = export_verilog(make_design(network, policy, n, lanes, 8))
    products = re.findall(r"^\s*assign (\S+) = .* \* .*;$", verilog, flags=re.MULTILINE)
    assert len(products) == n * lanes
    assert all(re.fullmatch(r"product\d+", name) for name in products)


def test_op_overhead_is_the_pipeline_depth() -> None:
    # accept (1) + address, read and read-data registers (3) + the datapath's stages
    for lanes in (1, 2, 4, 5, 8, 16, 17, 64, 256):
        assert op_overhead(lanes) == 1 + 3 + latency(lanes)
        assert latency(lanes) == 5 + tree_stages(lanes)
    assert [tree_stages(lanes) for lanes in (1, 2, 4, 5, 16, 17, 64, 65, 256)] == [1, 1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.slow  # over 1 s of CPU on a busy 2-core run (tests/cpu_times.json)
def test_sequencer_search_settles_within_the_shortest_op() -> None:
    """The next-row search registers every comparator level while that fits in the shortest op (one beat),
    two levels per stage beyond; either way the successor and its command are ready before the PE is free."""
    design = make_design("mlp:9-8-4-6-2", "layerpipe", 2, 4, 8)
    config = PEConfig(lanes=4, fmt=DEFAULT_FORMAT)
    for pe in design.program.pes:
        seq = Sequencer(pe, config, 4)
        assert seq.tree_levels_per_stage == 1
        assert seq.settle_cycles + 2 < op_overhead(4) + 1
        Fragment.get(seq, None)  # elaborates (its own check of the settling passes)
    big = Sequencer(design.program.pes[0], config, 4)
    big.rows = big.rows * 40  # a program of many rows: the search takes two levels per stage
    assert big.tree_levels_per_stage == 2 and big.settle_cycles + 2 < op_overhead(4) + 1
    Fragment.get(big, None)

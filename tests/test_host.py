"""The narrow host interface (hdl/_host.py, issue 16 item 3): the top's pin count against the parts' I/O, the
register map, the interface alone in Amaranth's simulator (beats ↔ words, back-pressure both ways, CSR chunks,
the protocol guards) and the bounded sample rings of the compiled design (depth rules, memory saved). The whole
accelerator on the interface, bit- and cycle-exact, is in tests/test_rtl_accel.py (slow)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from amaranth.hdl import Shape
from amaranth.lib import data
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.hdl._flow import make_design
from layerpipe.hdl._fpga import PARTS
from layerpipe.hdl._host import CTRL, STATUS, HostConfig, HostInterface, host_port_bits, register_map
from layerpipe.hdl._top import Accelerator, min_sample_depth


def _top_bits(acc: Accelerator) -> int:
    """The top's I/O pins: every port's bits, and clk and rst."""
    return 2 + sum(Shape.cast(m.shape).width for _, m in acc.signature.members.flatten() if m.is_port)


# The report's first design point (reports/README.md's RTL section) and smaller ones with other shapes.
DESIGNS = [("mlp:32-24-16-8", "layerpipe", 3, 4, 24, False), ("mlp:32-24-16-8", "layerpipe", 3, 4, 24, True),
           ("mlp:6-5-3", "pipedream", 2, 1, 5, True), ("mlp:9-8-4-6-2", "layerpipe", 3, 4, 64, True)]


@pytest.mark.parametrize(("network", "policy", "n", "lanes", "samples", "keep"), DESIGNS)
def test_the_top_fits_the_smallest_parts_io(network: str, policy: str, n: int, lanes: int, samples: int,
                                            keep: bool) -> None:
    """With the default 8-bit stream and 4-bit CSR the top needs at most 39 pins, the iCE40 UP5K's in SG48 (the
    smallest I/O of the parts the flow supports); the debug top's taps are not among them."""
    design = make_design(network, policy, n, lanes, samples, keep_weights_together=keep)
    acc = Accelerator(design.program, design.lr_shift, design.host)
    smallest = min(part.ios for part in PARTS.values())
    assert smallest == PARTS["ice40-up5k"].ios == 39
    bits = _top_bits(acc)
    assert bits == host_port_bits(design.host, acc.register_map) <= smallest
    debug = Accelerator(design.program, design.lr_shift, design.host, debug=True)
    assert _top_bits(debug) > bits  # link_stall, cycles and the monitors' taps
    for top in (acc, debug):
        top._MustUse__silence = True  # type: ignore[attr-defined]


def test_the_report_point_pin_count() -> None:
    """The report's design point (mlp:32-24-16-8, N=3, 4 lanes, T=24, split placement): 37 pins (the wide
    parallel host buses before it: 283, 324 with the bench's taps)."""
    design = make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 24, keep_weights_together=False)
    acc = Accelerator(design.program, design.lr_shift, design.host)
    acc._MustUse__silence = True  # type: ignore[attr-defined]
    assert _top_bits(acc) == 37
    wide = Accelerator(design.program, design.lr_shift, HostConfig(stream_bits=16))
    wide._MustUse__silence = True  # type: ignore[attr-defined]
    assert _top_bits(wide) == 37 + 2 * 8  # both streams widen
    # An iteration's samples: (8 + 2) words of 64 bits, 8 beats each, well within the period of 416 cycles.
    assert design.host_map()["beats_per_iteration"] == 80 < design.program.period == 416


def test_verilog_ports_are_the_signatures() -> None:
    """The exported Verilog's module ports are exactly the signature's (and clk, rst)."""
    from layerpipe.hdl._flow import export_verilog

    design = make_design("mlp:5-3-2", "layerpipe", 1, 1, 4)
    verilog = export_verilog(design)
    module = verilog[verilog.index("module layerpipe_accel("):]
    module = module[: module.index("endmodule")]
    ports = module[module.index("(") + 1: module.index(")")].replace(" ", "").split(",")
    declared = re.findall(r"^\s*(input|output)\s+(?:wire\s+|reg\s+)?(?:\[(\d+):0\]\s+)?(\w+)\s*;", module,
                          flags=re.MULTILINE)
    names = {name for _, _, name in declared}
    assert names == set(ports)
    assert {"clk", "rst", "stream_in__valid", "stream_in__ready", "stream_in__payload", "stream_out__valid",
            "stream_out__ready", "stream_out__payload", "csr_addr", "csr_we", "csr_wdata", "csr_rdata"} <= names
    acc = Accelerator(design.program, design.lr_shift, design.host)
    acc._MustUse__silence = True  # type: ignore[attr-defined]
    assert sum(int(msb) + 1 if msb else 1 for _, msb, _ in declared) == _top_bits(acc)


@settings(max_examples=30)
@given(st.sampled_from([4, 8, 16]), st.integers(1, 20), st.integers(1, 16), st.integers(1, 65536),
       st.integers(1, 64))
def test_register_map_is_dense_and_disjoint(csr_bits: int, addr_bits: int, iteration_bits: int, max_samples: int,
                                            depth: int) -> None:
    widths = {"PE": 2, "ADDR": addr_bits, "COUNT": addr_bits + 1, "SAMPLES": iteration_bits,
              "MAX_SAMPLES": max_samples.bit_length(), "DEPTH": depth.bit_length(), "LOADED": iteration_bits}
    regs = register_map(HostConfig(csr_bits=csr_bits), widths)
    covered: list[int] = []
    for reg in regs.registers:
        covered += range(reg.address, reg.address + reg.chunks(csr_bits))
    assert covered == list(range(regs.size))  # consecutive chunks, no overlap, no hole
    assert 1 << regs.addr_bits >= regs.size
    assert regs.to_json()["registers"]["CYCLES"][1] == 32


@pytest.mark.parametrize(("stream_bits", "csr_bits"), [(0, 4), (8, 3), (8, 64), (True, 4)])
def test_host_config_refuses_bad_widths(stream_bits: int, csr_bits: int) -> None:
    with pytest.raises(InputError, match="must be an integer in"):
        HostConfig(stream_bits, csr_bits)


# ---- the interface alone, in Amaranth's simulator ----------------------------------------------------

WORD = data.ArrayLayout(16, 3)  # 3 lanes of Q16: a 48-bit memory word


def _bench(stream_bits: int, seed: int) -> dict:
    """Drive a HostInterface with a fake top: a weight memory behind `r_data` (one cycle late), a loader that
    is ready every other cycle. Returns what reached the top and what came out."""
    host = HostInterface(HostConfig(stream_bits=stream_bits), WORD, pe_bits=1, addr_bits=6, iteration_bits=4,
                         max_samples=9, depth=4)
    rng = random.Random(seed)
    memory = {a: rng.getrandbits(48) for a in range(64)}
    words_in = [rng.getrandbits(48) for _ in range(5)]
    got: dict = {"weights": [], "samples": [], "out": [], "errors": []}
    regs, c = host.map, host.config.csr_bits
    beats = host.beats
    mask = (1 << stream_bits) - 1

    async def bench(ctx: Any) -> None:
        async def write(name: str, value: int) -> None:
            reg = regs[name]
            for k in range(reg.chunks(c)):
                ctx.set(host.csr_addr, reg.address + k)
                ctx.set(host.csr_wdata, (value >> (k * c)) & ((1 << c) - 1))
                ctx.set(host.csr_we, 1)
                await ctx.tick()
            ctx.set(host.csr_we, 0)

        async def read(name: str) -> int:
            reg, value = regs[name], 0
            for k in range(reg.chunks(c)):
                ctx.set(host.csr_addr, reg.address + k)
                await ctx.tick()
                value |= ctx.get(host.csr_rdata) << (k * c)
            return value

        async def send(words: list[int]) -> None:
            for word in words:
                for b in range(beats):
                    while rng.random() < 0.3:  # a valid gap
                        ctx.set(host.stream_in.valid, 0)
                        await ctx.tick()
                    ctx.set(host.stream_in.payload, (word >> (b * stream_bits)) & mask)
                    ctx.set(host.stream_in.valid, 1)
                    while True:
                        ctx.set(host.sample_ready, rng.random() < 0.5)  # the loader's ready in this cycle
                        ready = ctx.get(host.stream_in.ready)
                        if ctx.get(host.w_en):
                            got["weights"].append((ctx.get(host.addr), ctx.get(host.w_data.as_value())))
                        if ctx.get(host.sample_en):
                            got["samples"].append(ctx.get(host.sample_data.as_value()))
                        await ctx.tick()
                        if ready:
                            break
            ctx.set(host.stream_in.valid, 0)

        await write("MODE", 1)
        await write("ADDR", 10)
        await send(words_in)
        await write("MODE", 0)
        await send(words_in[:2])
        assert await read("ADDR") == 15  # auto-incremented per word written
        await write("ADDR", 20)
        await write("COUNT", 3)
        await write("CTRL", CTRL["read"])
        assert await read("STATUS") & STATUS["reading"]
        out_beats: list[int] = []
        while len(out_beats) < 3 * beats:
            ctx.set(host.r_data.as_value(), memory[ctx.get(host.addr)])  # registered in the fake: see below
            ready = rng.random() < 0.6  # ready low at random beats
            ctx.set(host.stream_out.ready, ready)
            if ready and ctx.get(host.stream_out.valid):
                out_beats.append(ctx.get(host.stream_out.payload))
            await ctx.tick()
        ctx.set(host.stream_out.ready, 0)
        got["out"] = [sum(out_beats[w * beats + b] << (b * stream_bits) for b in range(beats)) & (2**48 - 1)
                      for w in range(3)]
        # The guards: a sample word once the run's T are all taken; a READ while busy; a START with T > max.
        ctx.set(host.sample_over, 1)
        ctx.set(host.sample_ready, 0)  # as the top's loader, once all T are taken
        ctx.set(host.stream_in.valid, 1)
        got["errors"].append(ctx.get(host.misuse))
        ctx.set(host.stream_in.valid, 0)
        ctx.set(host.sample_over, 0)
        got["errors"].append(ctx.get(host.misuse))
        ctx.set(host.busy, 1)
        ctx.set(host.csr_addr, regs["CTRL"].address)
        ctx.set(host.csr_wdata, CTRL["read"])
        ctx.set(host.csr_we, 1)
        got["errors"].append(ctx.get(host.misuse))
        ctx.set(host.csr_we, 0)
        ctx.set(host.busy, 0)
        await write("SAMPLES", 10)
        ctx.set(host.csr_addr, regs["CTRL"].address)
        ctx.set(host.csr_wdata, CTRL["start"])
        ctx.set(host.csr_we, 1)
        got["errors"].append((ctx.get(host.misuse), ctx.get(host.start)))
        ctx.set(host.csr_we, 0)
        assert await read("MAX_SAMPLES") == 9 and await read("DEPTH") == 4

    sim = Simulator(host)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    got["words_in"] = words_in
    got["memory"] = memory
    return got


@pytest.mark.parametrize("stream_bits", [8, 16, 48, 64])
def test_interface_beats_words_and_guards(stream_bits: int) -> None:
    """Weights in at ADDR, ADDR + 1, …; sample words to the loader only when it is ready; COUNT words out
    from ADDR, whatever the stream's width, the valid gaps and the ready-low beats; the guards."""
    got = _bench(stream_bits, seed=stream_bits)
    assert got["weights"] == [(10 + k, w) for k, w in enumerate(got["words_in"])]
    assert got["samples"] == got["words_in"][:2]
    # r_data follows the address by a cycle; the fake drives it from the address of the current cycle, which
    # the FSM holds from FETCH through LOAD, so the word read is memory[ADDR + k].
    assert got["out"] == [got["memory"][20 + k] for k in range(3)]
    assert got["errors"] == [1, 0, 1, (1, 0)]


# ---- the sample rings of the compiled design --------------------------------------------------------------

def test_sample_depth_rules() -> None:
    """A power of two, at least the deadlock bound (unless it holds all T); by default the smallest power of two
    above the bound; the rings' memory shrinks from T's slots to D's."""
    design = make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 24, keep_weights_together=False)
    bound = min_sample_depth(design.program)
    assert bound == 4 and design.sample_depth == 8
    whole = make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 24, keep_weights_together=False, sample_depth=32)
    assert whole.sample_depth == 32
    saved = {pe.index: pe.memory_words("samples") for pe in whole.program.pes if "samples" in pe.memories}
    now = {pe.index: pe.memory_words("samples") for pe in design.program.pes if "samples" in pe.memories}
    assert saved == {0: 256, 2: 64} and now == {0: 64, 2: 16}  # x: 8 words a slot, y: 2
    with pytest.raises(InputError, match="must be a power of two"):
        make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 24, keep_weights_together=False, sample_depth=6)
    with pytest.raises(InputError, match=r"deadlocks this schedule.*at least 4"):
        make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 24, keep_weights_together=False, sample_depth=2)
    # A ring that holds all T iterations never needs a release: any depth ≥ T goes.
    assert make_design("mlp:32-24-16-8", "layerpipe", 3, 4, 2, keep_weights_together=False,
                       sample_depth=2).sample_depth == 2
    # One PE runs every op of iteration t in period t: a ring of one iteration cannot deadlock.
    assert make_design("mlp:6-5-3", "layerpipe", 1, 1, 6, sample_depth=1).sample_depth == 1

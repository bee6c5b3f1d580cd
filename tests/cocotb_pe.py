"""cocotb bench of one ProcessingElement on Icarus/Verilator: load, run commands, check results and cycles.

Everything it needs comes from the JSON file named by LP_PE_VECTORS (written by tests/test_pe_cocotb.py):
    weights: [[addr, word], ...]          through the host port
    recv:    [[port, addr, word], ...]    through the receive ports
    ops:     [{"command": int, "cycles": int}, ...]   run in order, each checked for its busy cycles
    expect:  [[addr, word], ...]          bank 0 words read back through send port 0 at the end
    expect_weights: [[addr, word], ...]   weight words read back through the host port at the end
No numpy or torch in here: the expected values were computed in the pytest process.
"""

from __future__ import annotations

import json
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge


async def _reset(dut: object) -> None:
    dut.rst.value = 1
    for name in ("cmd__valid", "host__w_en"):
        getattr(dut, name).value = 0
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


async def _run_op(dut: object, command: int) -> int:
    """Offer the command; return the cycles from its acceptance until the PE is ready again."""
    dut.cmd__payload.value = command
    dut.cmd__valid.value = 1
    await ReadOnly()
    assert dut.cmd__ready.value == 1, "PE busy when a command is offered"
    await RisingEdge(dut.clk)  # accepted at this edge
    dut.cmd__valid.value = 0
    cycles = 1
    while True:
        await ReadOnly()
        if dut.cmd__ready.value == 1:
            break
        await RisingEdge(dut.clk)
        cycles += 1
    await RisingEdge(dut.clk)
    return cycles


@cocotb.test()
async def pe_ops_match_reference(dut: object) -> None:
    with open(os.environ["LP_PE_VECTORS"]) as f:
        vectors = json.load(f)
    Clock(dut.clk, 10, unit="ns", impl="gpi").start()  # toggled in C by the GPI, no Python task per edge
    await _reset(dut)

    for addr, word in vectors["weights"]:
        dut.host__addr.value, dut.host__w_data.value, dut.host__w_en.value = addr, word, 1
        await RisingEdge(dut.clk)
    dut.host__w_en.value = 0
    for port, addr, word in vectors["recv"]:
        getattr(dut, f"recv__{port}__addr").value = addr
        getattr(dut, f"recv__{port}__data").value = word
        getattr(dut, f"recv__{port}__en").value = 1
        await RisingEdge(dut.clk)
        getattr(dut, f"recv__{port}__en").value = 0

    for index, op in enumerate(vectors["ops"]):
        cycles = await _run_op(dut, op["command"])
        assert cycles == op["cycles"], f"op {index}: {cycles} cycles, the cost model says {op['cycles']}"

    for addr, word in vectors["expect"]:
        dut.send__0__addr.value, dut.send__0__en.value = addr, 1
        await RisingEdge(dut.clk)
        await ReadOnly()
        got = int(dut.send__0__data.value)
        assert got == word, f"bank 0 word {addr}: {got:#x}, expected {word:#x}"
        await RisingEdge(dut.clk)
    for addr, word in vectors["expect_weights"]:
        dut.host__addr.value = addr
        await RisingEdge(dut.clk)
        await ReadOnly()
        got = int(dut.host__r_data.value)
        assert got == word, f"weight word {addr}: {got:#x}, expected {word:#x}"
        await RisingEdge(dut.clk)

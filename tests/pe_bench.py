"""Drive a ProcessingElement in Amaranth's simulator, and the naive reference of every PE op.

Shared by the unit benches (`tests/test_pe*.py`): operands are placed straight into the PE's memories
(`ctx.set` on memory rows), the command goes through the `cmd` stream, the result is read back from the
memories, and the cycles the op kept the engine busy are counted at the ports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from amaranth.sim import Simulator

from layerpipe.fixedpoint import FixedFormat
from layerpipe.hdl import (
    Opcode,
    PEConfig,
    PEOp,
    ProcessingElement,
    VectorAddr,
    pack_matrix,
    pack_vector,
    unpack_matrix,
    unpack_vector,
)

IntArray = npt.NDArray[np.int64]


def reference(op: Opcode, fmt: FixedFormat, lr_shift: int, operands: dict[str, IntArray]) -> IntArray:
    """The op's result by `layerpipe.fixedpoint` (the bit-exact spec)."""
    if op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU):
        z = fmt.matvec(operands["w"], operands["x"])
        return fmt.relu(z) if op == Opcode.FWD_RELU else z
    if op == Opcode.ACT_RELU:
        return operands["x"] * fmt.relu_grad_mask(operands["y"])
    if op == Opcode.OUT_ERR:
        return fmt.output_error(operands["x"], operands["y"])
    if op == Opcode.ERR:
        return fmt.matvec(operands["w"].T, operands["y"])
    if op == Opcode.GRAD:
        return fmt.outer_gradient(operands["y"], operands["x"])
    if op == Opcode.UPD:
        return fmt.sgd_update(operands["w"], operands["g"], lr_shift)
    raise ValueError(op)


@dataclass
class OpCase:
    """One op with its operands placed in memory; filled with the result and cycles by the bench."""

    op: PEOp
    operands: dict[str, IntArray]
    result: IntArray | None = None
    raw_words: list[int] = field(default_factory=list)  # the memory words holding the result
    cycles: int | None = None
    done_cycles: list[int] = field(default_factory=list)


def random_operands(rng: np.random.Generator, op: Opcode, rows: int, cols: int, fmt: FixedFormat,
                    extremes: bool = False) -> dict[str, IntArray]:
    """Operands whose magnitude is small, medium or full range (the last saturates sums and differences);
    with `extremes`, only the corner values MIN, MIN+1, −1, 0, 1, MAX−1, MAX."""
    bound = int(rng.choice([8, 1 << (fmt.total_bits // 2 + 1), -fmt.min_int]))
    corners = np.array([fmt.min_int, fmt.min_int + 1, -1, 0, 1, fmt.max_int - 1, fmt.max_int], dtype=np.int64)
    def draw(*shape: int) -> IntArray:
        if extremes:
            return rng.choice(corners, size=shape)
        values = rng.integers(-bound, bound, size=shape, endpoint=True)
        return np.clip(values, fmt.min_int, fmt.max_int).astype(np.int64)
    if op in (Opcode.ACT_RELU, Opcode.OUT_ERR):
        return {"x": draw(cols), "y": draw(cols)}
    if op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU):
        return {"w": draw(rows, cols), "x": draw(cols)}
    if op == Opcode.ERR:
        return {"w": draw(rows, cols), "y": draw(rows)}
    if op == Opcode.GRAD:
        return {"x": draw(cols), "y": draw(rows)}
    return {"w": draw(rows, cols), "g": draw(rows, cols)}


def place(rng: np.random.Generator, config: PEConfig, op: Opcode, rows: int, cols: int,
          operands: dict[str, IntArray]) -> PEOp:
    """A command with its operands at random, non-overlapping (bank, address) places in the memories."""
    lanes = config.lanes
    cw = -(-cols // lanes)
    row_words = -(-rows // lanes)
    free = [0] * config.banks  # bump allocator per bank: next free word
    def vector_at(words: int, bank: int | None = None) -> VectorAddr:
        choices = [bank] if bank is not None else list(rng.permutation(config.banks))
        for b in choices:
            start = free[b] + int(rng.integers(3))
            if start + words <= config.bank_depths[b]:
                free[b] = start + words
                return VectorAddr(int(b), start)
        raise ValueError(f"bench memories too small for {words} words")
    def base(words: int, depth: int) -> int:
        return int(rng.integers(depth - words + 1))
    x = y = VectorAddr()
    w = g = dst = 0
    if "x" in operands:
        x = vector_at(cw)
    if "y" in operands:
        y = vector_at(cw if op in (Opcode.ACT_RELU, Opcode.OUT_ERR) else row_words)
    if "w" in operands:
        w = base(rows * cw, config.weight_depth)
    if op == Opcode.UPD:
        g = base(rows * cw, config.grad_depth)
        dst = w  # in place, or to another version (which must not overlap the source)
        if rng.integers(2) and w >= rows * cw:
            dst = base(rows * cw, w)
        elif rng.integers(2) and w + 2 * rows * cw <= config.weight_depth:
            dst = w + rows * cw + base(rows * cw, config.weight_depth - w - rows * cw)
    elif op == Opcode.GRAD:
        dst = base(rows * cw, config.grad_depth)
    else:
        dst = vector_at(row_words if op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU) else cw, bank=0).addr
    return PEOp(op, rows, cols, x, y, w, g, dst)


class PEBench:
    """Runs a list of OpCases on one PE; operands are loaded before each op, garbage in every padding lane."""

    def __init__(self, config: PEConfig, seed: int = 0) -> None:
        self.config = config
        self.pe = ProcessingElement(config)
        self.rng = np.random.default_rng(seed)

    def _noisy(self, words: list[int], cols: int) -> list[int]:
        """Fill the padding lanes of each row's last word with random bits: the hardware must ignore them."""
        lanes, bits = self.config.lanes, self.config.fmt.total_bits
        used = cols - (len(words) - 1) * lanes if cols % lanes else lanes
        if used == lanes:
            return words
        noise = int(self.rng.integers(1 << 62)) & ((1 << (bits * lanes)) - 1)
        keep = (1 << (bits * used)) - 1
        return [*words[:-1], (words[-1] & keep) | (noise & ~keep)]

    def _load(self, ctx: object, case: OpCase) -> None:
        cfg, op, ops = self.config, case.op, case.operands
        lanes, bits = cfg.lanes, cfg.fmt.total_bits
        def write(memory: object, base: int, words: list[int]) -> None:
            for k, word in enumerate(words):
                ctx.set(memory.data[base + k].as_value(), word)
        def matrix(values: IntArray) -> list[int]:
            return [w for row in values for w in self._noisy(pack_vector(row, lanes, bits), values.shape[1])]
        if "x" in ops:
            write(self.pe.banks[op.x.bank], op.x.addr, self._noisy(pack_vector(ops["x"], lanes, bits), len(ops["x"])))
        if "y" in ops:
            write(self.pe.banks[op.y.bank], op.y.addr, self._noisy(pack_vector(ops["y"], lanes, bits), len(ops["y"])))
        if "w" in ops:
            write(self.pe.weights, op.w, matrix(ops["w"]))
        if "g" in ops:
            write(self.pe.grads, op.g, pack_matrix(ops["g"], lanes, bits))

    def _read(self, ctx: object, case: OpCase) -> tuple[IntArray, list[int]]:
        """The result, and the raw words holding it (to check the padding lanes are zero)."""
        cfg, op = self.config, case.op
        lanes, bits = cfg.lanes, cfg.fmt.total_bits
        cw = -(-op.cols // lanes)
        def words(memory: object, base: int, count: int) -> list[int]:
            return [ctx.get(memory.data[base + k].as_value()) for k in range(count)]
        if op.op in (Opcode.GRAD, Opcode.UPD):
            memory = self.pe.grads if op.op == Opcode.GRAD else self.pe.weights
            raw = words(memory, op.dst, op.rows * cw)
            return np.array(unpack_matrix(raw, op.rows, op.cols, lanes, bits), dtype=np.int64), raw
        length = op.rows if op.op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU) else op.cols
        raw = words(self.pe.banks[0], op.dst, -(-length // lanes))
        return np.array(unpack_vector(raw, length, lanes, bits), dtype=np.int64), raw

    def run(self, cases: list[OpCase], back_to_back: bool = False) -> int:
        """Execute the cases one after another; returns the total cycles from the first accept to idle.

        With `back_to_back`, all operands are loaded first and each command is offered the cycle the
        previous op frees the engine (the cases must then not overwrite each other's operands)."""
        pe = self.pe
        total = 0

        async def bench(ctx: object) -> None:
            nonlocal total
            if back_to_back:
                for case in cases:
                    self._load(ctx, case)
            cycle = 0
            for case in cases:
                if not back_to_back:
                    self._load(ctx, case)
                ctx.set(pe.cmd.payload.as_value(), case.op.encode(self.config))
                ctx.set(pe.cmd.valid, 1)
                assert ctx.get(pe.cmd.ready), "PE not idle when the next command is offered"
                await ctx.tick()  # the command is taken at this edge
                cycle += 1
                ctx.set(pe.cmd.valid, 0)
                start = cycle - 1
                while not ctx.get(pe.cmd.ready):
                    if ctx.get(pe.done):
                        case.done_cycles.append(cycle - start)
                    await ctx.tick()
                    cycle += 1
                case.cycles = cycle - start
                if not back_to_back:
                    case.result, case.raw_words = self._read(ctx, case)
            if back_to_back:
                for case in cases:
                    case.result, case.raw_words = self._read(ctx, case)
            total = cycle

        sim = Simulator(pe)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        return total

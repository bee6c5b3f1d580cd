"""Unit benches of every PE operation in Amaranth's simulator: bit-exact against `layerpipe.fixedpoint`,
cycle-exact against the `rtl` cost model's formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat
from layerpipe.hdl import (
    Opcode,
    PEConfig,
    PEOp,
    VectorAddr,
    op_cycles,
    op_overhead,
    pack_matrix,
    unpack_matrix,
)
from tests.pe_bench import OpCase, PEBench, place, random_operands, reference

ALL_OPS = list(Opcode)


def small_config(lanes: int, fmt: FixedFormat = DEFAULT_FORMAT, lr_shift: int = 3) -> PEConfig:
    return PEConfig(lanes=lanes, fmt=fmt, lr_shift=lr_shift, weight_depth=128, grad_depth=128, local_depth=48,
                    recv_depths=(28, 14), send_ports=1, max_dim=16)


def random_cases(config: PEConfig, rng: np.random.Generator, per_op: int, extremes: bool = False) -> list[OpCase]:
    cases = []
    for op in ALL_OPS:
        for _ in range(per_op):
            rows = 1 if op in (Opcode.ACT_RELU, Opcode.OUT_ERR) else int(rng.integers(1, 8))
            cols = int(rng.integers(1, 14))
            operands = random_operands(rng, op, rows, cols, config.fmt, extremes)
            cases.append(OpCase(place(rng, config, op, rows, cols, operands), operands))
    rng.shuffle(cases)
    return cases


def check_case(config: PEConfig, case: OpCase) -> None:
    op = case.op
    expected = reference(op.op, config.fmt, config.lr_shift, case.operands)
    assert case.result is not None
    np.testing.assert_array_equal(case.result, expected, err_msg=f"{op}")
    assert case.cycles == op_cycles(op.rows, op.cols, config.lanes), f"{op}: {case.cycles} cycles"
    assert case.done_cycles == [case.cycles - 1], f"{op}: done in cycles {case.done_cycles}"
    if op.op != Opcode.UPD:  # every op but U writes zeros into the padding lanes of its last word(s)
        bits, lanes = config.fmt.total_bits, config.lanes
        length = op.rows if op.op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU) else op.cols
        raw = case.raw_words
        words_per_row = -(-length // lanes) if op.op != Opcode.GRAD else -(-op.cols // lanes)
        used = length % lanes if op.op != Opcode.GRAD else op.cols % lanes
        if used:
            for word in raw[words_per_row - 1::words_per_row]:
                assert word >> (bits * used) == 0, f"{op}: padding lanes not zero in {word:#x}"


@pytest.mark.parametrize("lanes", [1, 2, 4, 8, 16])  # 8, 16: the adder tree in two pipeline stages
def test_every_op_bit_and_cycle_exact(lanes: int) -> None:
    config = small_config(lanes)
    rng = np.random.default_rng(100 + lanes)
    cases = random_cases(config, rng, per_op=6)
    PEBench(config, seed=lanes).run(cases)
    for case in cases:
        check_case(config, case)


@pytest.mark.parametrize(("lanes", "lr_shift"), [(1, 0), (4, 15)])
def test_corner_values_saturate_like_the_spec(lanes: int, lr_shift: int) -> None:
    """Only MIN, MAX and their neighbours: sums of MIN·MIN products, MIN − MAX, g = MIN with k = 0 or
    k ≥ the width — every saturation and rounding corner of the format."""
    config = small_config(lanes, lr_shift=lr_shift)
    rng = np.random.default_rng(33 + lanes)
    cases = random_cases(config, rng, per_op=3, extremes=True)
    PEBench(config, seed=4).run(cases)
    for case in cases:
        check_case(config, case)


@pytest.mark.parametrize(("fmt", "lr_shift"), [(FixedFormat(8, 3), 0), (FixedFormat(12, 1), 7)])
def test_other_formats_and_learning_rates(fmt: FixedFormat, lr_shift: int) -> None:
    config = small_config(3, fmt, lr_shift)  # 3 lanes: not a power of two either
    rng = np.random.default_rng(7)
    cases = random_cases(config, rng, per_op=2)
    PEBench(config, seed=3).run(cases)
    for case in cases:
        check_case(config, case)


def test_back_to_back_ops_take_the_sum_of_their_cycles() -> None:
    """A command offered the cycle the engine frees starts then: no hidden gap between ops."""
    config = small_config(2)
    fmt = config.fmt
    rng = np.random.default_rng(5)
    w, a, y = (rng.integers(-400, 400, shape) for shape in [(5, 7), 7, 5])
    ops = [  # F writes a'; A reads it; E reads δ; the operands of each op live apart
        OpCase(PEOp(Opcode.FWD_RELU, 5, 7, x=VectorAddr(1, 0), w=0, dst=0), {"w": w, "x": a}),
        OpCase(PEOp(Opcode.OUT_ERR, 1, 5, x=VectorAddr(2, 0), y=VectorAddr(2, 4), dst=4), {"x": y, "y": a[:5]}),
        OpCase(PEOp(Opcode.ERR, 5, 7, y=VectorAddr(1, 8), w=40, dst=10), {"w": w, "y": y}),
    ]
    total = PEBench(config, seed=1).run(ops, back_to_back=True)
    assert total == sum(op_cycles(c.op.rows, c.op.cols, 2) for c in ops)
    for case in ops:
        np.testing.assert_array_equal(case.result, reference(case.op.op, fmt, config.lr_shift, case.operands))


def test_f_then_a_reads_what_f_wrote() -> None:
    """The op after F may read F's output at once (everything written is readable when ready rises)."""
    config = small_config(2)
    w, a, e = np.arange(-6, 6).reshape(3, 4) * 97, np.array([300, -200, 100, 50]), np.array([11, -12, 13])
    f = OpCase(PEOp(Opcode.FWD_RELU, 3, 4, x=VectorAddr(1, 0), w=0, dst=0), {"w": w, "x": a})
    act = OpCase(PEOp(Opcode.ACT_RELU, 1, 3, x=VectorAddr(2, 0), y=VectorAddr(0, 0), dst=6), {"x": e})
    PEBench(config).run([f, act], back_to_back=True)
    fwd = reference(Opcode.FWD_RELU, config.fmt, 0, f.operands)
    np.testing.assert_array_equal(act.result, e * (fwd > 0))


def test_cost_formula() -> None:
    assert op_cycles(5, 7, 2) == 5 * 4 + op_overhead(2)
    assert op_cycles(1, 8, 4) == 2 + op_overhead(4)
    # accept + address, read and read-data registers + the datapath (operands, product, adder tree two levels
    # per stage, accumulate, round, saturate)
    assert [op_overhead(lanes) for lanes in (1, 2, 3, 4, 5, 8, 16, 17, 64, 65, 256)] == [
        10, 10, 10, 10, 11, 11, 11, 12, 12, 13, 13]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lanes": 0}, "lanes must be >= 1, got 0"),
    ({"lanes": 300}, "lanes must be an integer in 1..256, got 300"),
    ({"lr_shift": 70}, "lr_shift must be an integer in 0..61, got 70"),
    ({"weight_depth": 0}, "weight_depth must be an integer in 1..1048576 words, got 0"),
    ({"recv_depths": (8, 1 << 21)}, "recv_depths[1] must be an integer in 1..1048576 words, got 2097152"),
    ({"max_dim": 70000}, "max_dim must be an integer in 1..65535 elements, got 70000"),
    ({"recv_depths": [8]}, "recv_depths must be a tuple of word counts, got [8]"),
])
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(InputError) as info:
        PEConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(("op", "message"), [
    (PEOp(Opcode.FWD_RELU, 20, 4), "FWD_RELU rows must be an integer in 1..16 elements (max_dim 16), got 20"),
    (PEOp(Opcode.ACT_RELU, 2, 4), "ACT_RELU works on a vector: rows must be 1 (cols = its length), got rows=2"),
    (PEOp(Opcode.FWD_LINEAR, 16, 16, w=0), "FWD_LINEAR w (weights): words 0..63 exceed the memory of 32 words"),
    (PEOp(Opcode.ERR, 2, 4, y=VectorAddr(3, 0)), "ERR y.bank must be in 0..2, got 3"),
    (PEOp(Opcode.GRAD, 2, 4, x=VectorAddr(1, 7)), "GRAD x (bank 1): words 7..7 exceed the memory of 7 words"),
    (PEOp(Opcode.UPD, 2, 4, w=3, g=0, dst=4),
     "UPD dst (weights) words 4..5 overlap its source words 3..4: update in place or into a disjoint version"),
    (PEOp(Opcode.FWD_RELU, 9, 4, dst=6), "FWD_RELU dst (bank 0): words 6..8 exceed the memory of 7 words"),
])
def test_command_validation(op: PEOp, message: str) -> None:
    config = PEConfig(lanes=4, weight_depth=32, grad_depth=32, local_depth=7, recv_depths=(7, 7), max_dim=16)
    with pytest.raises(InputError) as info:
        op.check(config)
    assert str(info.value) == message


def test_ports_load_run_and_read_back() -> None:
    """The outside world's view: weights in through `host`, x through `recv[0]`, F, a' out through `send[0]`,
    weights read back through `host` (served while idle)."""
    from amaranth.sim import Simulator

    from layerpipe.hdl import ProcessingElement, pack_matrix, pack_vector, unpack_vector

    config = small_config(4)
    fmt, lanes, bits = config.fmt, 4, config.fmt.total_bits
    w = np.arange(-15, 15).reshape(5, 6) * 41
    a = np.array([256, -128, 512, 77, -300, 1000])
    w_words, a_words = pack_matrix(w, lanes, bits), pack_vector(a, lanes, bits)
    pe = ProcessingElement(config)
    out: dict[str, list[int]] = {}

    async def bench(ctx: object) -> None:
        for k, word in enumerate(w_words):
            ctx.set(pe.host.addr, 10 + k)
            ctx.set(pe.host.w_data.as_value(), word)
            ctx.set(pe.host.w_en, 1)
            await ctx.tick()
        ctx.set(pe.host.w_en, 0)
        for k, word in enumerate(a_words):
            ctx.set(pe.recv[0].addr, 3 + k)
            ctx.set(pe.recv[0].data.as_value(), word)
            ctx.set(pe.recv[0].en, 1)
            await ctx.tick()
        ctx.set(pe.recv[0].en, 0)
        op = PEOp(Opcode.FWD_RELU, 5, 6, x=VectorAddr(1, 3), w=10, dst=2)
        ctx.set(pe.cmd.payload.as_value(), op.encode(config))
        ctx.set(pe.cmd.valid, 1)
        await ctx.tick()
        ctx.set(pe.cmd.valid, 0)
        await ctx.tick().until(pe.cmd.ready)
        out["a"] = []
        for k in range(2):
            ctx.set(pe.send[0].addr, 2 + k)
            ctx.set(pe.send[0].en, 1)
            await ctx.tick()
            out["a"].append(ctx.get(pe.send[0].data.as_value()))
        out["w"] = []
        for k in range(len(w_words)):
            ctx.set(pe.host.addr, 10 + k)
            await ctx.tick()
            out["w"].append(ctx.get(pe.host.r_data.as_value()))

    sim = Simulator(pe)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    np.testing.assert_array_equal(unpack_vector(out["a"], 5, lanes, bits), fmt.relu(fmt.matvec(w, a)))
    assert out["w"] == w_words


def test_rtl_cost_model_is_the_pe_formula() -> None:
    from layerpipe.costs import COST_MODELS, make_cost_model, task_cost
    from layerpipe.network import load_network

    model = make_cost_model("rtl", lanes=4)
    assert "rtl" in COST_MODELS
    net = load_network("mlp:7-6-5-3")
    fc1, fc3 = net.layer(1), net.layer(3)
    assert task_cost(model, fc1, "F", 1) == 6 * 2 + op_overhead(4)  # 6 rows × ⌈7/4⌉ words
    assert task_cost(model, fc3, "A", 1) == 1 + op_overhead(4)
    assert task_cost(model, fc3, "AEG", 1) == (1 + 3 * 2 + 3 * 2) + 3 * op_overhead(4)
    # A micro-batch of B samples: F, A, E, G walk B times (G sums over them), U runs once.
    assert task_cost(model, fc1, "F", 3) == 3 * 6 * 2 + op_overhead(4)
    assert task_cost(model, fc1, "G", 3) == 3 * 6 * 2 + op_overhead(4)
    assert task_cost(model, fc3, "A", 3) == 3 + op_overhead(4)
    assert task_cost(model, fc1, "U", 3) == 6 * 2 + op_overhead(4)
    with pytest.raises(InputError, match=r"micro-batch of 1\.\.256 samples, got batch 257"):
        model.atomic_cost(fc1, "F", 257)
    with pytest.raises(InputError, match="lanes must be >= 1, got 0"):
        make_cost_model("rtl", lanes=0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(2, 32), st.data())
def test_pack_unpack_round_trip(lanes: int, bits: int, draw: st.DataObject) -> None:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    rows = draw.draw(st.lists(st.lists(st.integers(lo, hi), min_size=3, max_size=3), min_size=1, max_size=4))
    words = pack_matrix(rows, lanes, bits)
    assert len(words) == len(rows) * -(-3 // lanes)
    assert all(0 <= word < 1 << (bits * lanes) for word in words)
    assert unpack_matrix(words, len(rows), 3, lanes, bits) == rows


@pytest.mark.parametrize("lanes", [1, 3])
def test_one_layer_training_step_back_to_back(lanes: int) -> None:
    """F, A (output error), E, G and U of one identity layer chained through the PE's own memories, each
    command offered the cycle the previous one frees the engine: every intermediate and the updated W
    are the fixed-point reference's, and the step takes the sum of the op formulas."""
    config = small_config(lanes)
    fmt, k = config.fmt, config.lr_shift
    rng = np.random.default_rng(21)
    w, x, target = rng.integers(-900, 900, (5, 7)), rng.integers(-900, 900, 7), rng.integers(-300, 300, 5)
    vec5, vec7 = -(-5 // lanes), -(-7 // lanes)
    a_at, delta_at, e_at = 0, vec5, 2 * vec5  # bank 0 layout of the step's vectors
    chain = [
        OpCase(PEOp(Opcode.FWD_LINEAR, 5, 7, x=VectorAddr(1, 0), w=0, dst=a_at), {"w": w, "x": x}),
        OpCase(PEOp(Opcode.OUT_ERR, 1, 5, x=VectorAddr(0, a_at), y=VectorAddr(2, 0), dst=delta_at), {"y": target}),
        OpCase(PEOp(Opcode.ERR, 5, 7, y=VectorAddr(0, delta_at), w=0, dst=e_at), {}),
        OpCase(PEOp(Opcode.GRAD, 5, 7, x=VectorAddr(1, 0), y=VectorAddr(0, delta_at), dst=0), {}),
        OpCase(PEOp(Opcode.UPD, 5, 7, w=0, g=0, dst=0), {}),
    ]
    total = PEBench(config, seed=2).run(chain, back_to_back=True)
    a = fmt.matvec(w, x)
    delta = fmt.output_error(a, target)
    g = fmt.outer_gradient(delta, x)
    expected = [a, delta, fmt.matvec(w.T, delta), g, fmt.sgd_update(w, g, k)]
    for case, want in zip(chain, expected, strict=True):
        np.testing.assert_array_equal(case.result, want, err_msg=str(case.op.op))
    assert total == 4 * 5 * vec7 + 1 * vec5 + 5 * op_overhead(lanes)


def test_reset_in_the_middle_of_an_op() -> None:
    """A reset while an op runs leaves the PE idle with nothing pending (no late `done`, no stray write);
    the next op runs as if nothing happened."""
    from amaranth.hdl import ClockDomain, Module
    from amaranth.sim import Simulator

    config = small_config(1)
    rng = np.random.default_rng(8)
    long_op = OpCase(PEOp(Opcode.FWD_RELU, 7, 13, x=VectorAddr(1, 0), w=0, dst=0),
                     {"w": rng.integers(-500, 500, (7, 13)), "x": rng.integers(-500, 500, 13)})
    after = OpCase(PEOp(Opcode.ERR, 4, 6, y=VectorAddr(2, 0), w=100, dst=20),
                   {"w": rng.integers(-500, 500, (4, 6)), "y": rng.integers(-500, 500, 4)})
    bench = PEBench(config)
    pe = bench.pe
    top = Module()
    top.domains.sync = sync = ClockDomain("sync")
    top.submodules.pe = pe
    observed: dict[str, object] = {}

    async def testbench(ctx: object) -> None:
        bench._load(ctx, long_op)
        bench._load(ctx, after)
        before = [ctx.get(pe.banks[0].data[k].as_value()) for k in range(8)]
        ctx.set(pe.cmd.payload.as_value(), long_op.op.encode(config))
        ctx.set(pe.cmd.valid, 1)
        await ctx.tick()
        ctx.set(pe.cmd.valid, 0)
        await ctx.tick().repeat(20)  # F is 7·13 + 4 cycles long: well inside it
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        stray = 0
        for _ in range(10):
            stray += ctx.get(pe.done) + (not ctx.get(pe.cmd.ready))
            await ctx.tick()
        observed["stray"] = stray
        # F's first rows were written before the reset; nothing after it: words past row 20 are untouched.
        observed["tail_untouched"] = [ctx.get(pe.banks[0].data[k].as_value()) for k in range(5, 8)] == before[5:]
        ctx.set(pe.cmd.payload.as_value(), after.op.encode(config))
        ctx.set(pe.cmd.valid, 1)
        await ctx.tick()
        ctx.set(pe.cmd.valid, 0)
        cycles = 1
        while not ctx.get(pe.cmd.ready):
            await ctx.tick()
            cycles += 1
        observed["cycles"] = cycles
        observed["result"] = bench._read(ctx, after)[0]

    sim = Simulator(top)
    sim.add_clock(1e-8, domain="sync")
    sim.add_testbench(testbench)
    sim.run()
    assert observed["stray"] == 0 and observed["tail_untouched"]
    assert observed["cycles"] == op_cycles(4, 6, 1)
    np.testing.assert_array_equal(observed["result"], reference(Opcode.ERR, config.fmt, 0, after.operands))


@pytest.mark.slow  # an Amaranth simulation per micro-batch: ~1.1 s of CPU
@settings(max_examples=12, deadline=None)
@given(op=st.sampled_from([Opcode.FWD_RELU, Opcode.FWD_LINEAR, Opcode.ACT_RELU, Opcode.OUT_ERR, Opcode.ERR,
                           Opcode.GRAD]),
       lanes=st.sampled_from([1, 2, 3]), rows=st.integers(1, 5), cols=st.integers(1, 6), batch=st.integers(2, 3),
       seed=st.integers(0, 2**16))
def test_micro_batch_ops_bit_and_cycle_exact(op: Opcode, lanes: int, rows: int, cols: int, batch: int,
                                             seed: int) -> None:
    """A command over a micro-batch of B samples (vectors one after another, each padded to whole words): F, A,
    E per sample, G summed over the samples at full width and rescaled once — the batched `layerpipe.fixedpoint`
    rules — in B·rows·⌈cols/lanes⌉ + 4 cycles."""
    from amaranth.sim import Simulator

    from layerpipe.hdl import ProcessingElement, pack_vector, unpack_vector

    rows = 1 if op in (Opcode.ACT_RELU, Opcode.OUT_ERR) else rows
    config = PEConfig(lanes=lanes, weight_depth=64, grad_depth=64, local_depth=64, recv_depths=(64,), max_dim=16)
    fmt, bits = config.fmt, config.fmt.total_bits
    rng = np.random.default_rng(seed)
    cw, rw = -(-cols // lanes), -(-rows // lanes)
    vec_len = {"x": cols, "y": cols if op in (Opcode.ACT_RELU, Opcode.OUT_ERR) else rows}
    used = {"x"} if op in (Opcode.FWD_RELU, Opcode.FWD_LINEAR) else {"y"} if op == Opcode.ERR else {"x", "y"}
    operands = {name: rng.integers(-600, 600, (batch, n)) for name, n in vec_len.items() if name in used}
    w = rng.integers(-300, 300, (rows, cols))
    if op in (Opcode.FWD_RELU, Opcode.FWD_LINEAR):
        expected = fmt.matvec(w, operands["x"])
        expected = fmt.relu(expected) if op == Opcode.FWD_RELU else expected
    elif op == Opcode.ACT_RELU:
        expected = operands["x"] * fmt.relu_grad_mask(operands["y"])
    elif op == Opcode.OUT_ERR:
        expected = fmt.output_error(operands["x"], operands["y"])
    elif op == Opcode.ERR:
        expected = fmt.matmul(operands["y"], w)
    else:
        expected = fmt.outer_gradient(operands["y"], operands["x"])
    command = PEOp(op, rows, cols, x=VectorAddr(1, 0), y=VectorAddr(1, 32), w=0, dst=0, batch=batch)
    pe = ProcessingElement(config)
    out: dict[str, object] = {}

    async def bench(ctx: object) -> None:
        for name, base in (("x", 0), ("y", 32)):
            if name in operands:
                per = -(-vec_len[name] // lanes)
                for b, vector in enumerate(operands[name]):
                    for k, word in enumerate(pack_vector(vector, lanes, bits)):
                        ctx.set(pe.banks[1].data[base + b * per + k].as_value(), word)
        for k, word in enumerate(pack_matrix(w, lanes, bits)):
            ctx.set(pe.weights.data[k].as_value(), word)
        ctx.set(pe.cmd.payload.as_value(), command.encode(config))
        ctx.set(pe.cmd.valid, 1)
        await ctx.tick()
        ctx.set(pe.cmd.valid, 0)
        cycles = 1
        while not ctx.get(pe.cmd.ready):
            await ctx.tick()
            cycles += 1
        out["cycles"] = cycles
        if op == Opcode.GRAD:
            raw = [ctx.get(pe.grads.data[k].as_value()) for k in range(rows * cw)]
            out["result"] = np.array(unpack_matrix(raw, rows, cols, lanes, bits))
        else:
            length, per = (rows, rw) if op in (Opcode.FWD_RELU, Opcode.FWD_LINEAR) else (cols, cw)
            out["result"] = np.array([unpack_vector([ctx.get(pe.banks[0].data[b * per + k].as_value())
                                                     for k in range(per)], length, lanes, bits)
                                      for b in range(batch)])

    sim = Simulator(pe)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    np.testing.assert_array_equal(out["result"], expected, err_msg=f"{command}")
    assert out["cycles"] == op_cycles(rows, cols, lanes, batch) == command.cycles(lanes)

"""The window engine's loop nests (hdl/_conv.py) against the integer reference and PyTorch, and their cycles.

Rung (a)/(b) of the ladder for convolution in hardware: the nest the address generator issues, executed beat
by beat with the fixed-point rules, equals the integer reference's conv2d / pooling (`layerpipe._torch_fixed`,
written with torch's own conv ops) and the functional simulator's (`sim/_arith.py`) on generated shapes; the
reference itself follows PyTorch's float conv on exactly representable data; the `rtl` cost model's cycles are
the nests' beat counts plus the op overhead.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerpipe._rtl_costs import RTLCostModel
from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT
from layerpipe.hdl._conv import Window, nest, run_window, window_cycles, window_of
from layerpipe.hdl._pe import op_overhead
from layerpipe.network import Conv2d, Flatten, Linear, NetworkBuilder, Pool2d

torch = pytest.importorskip("torch")
from layerpipe._torch_fixed import TorchFixed  # noqa: E402  (needs torch)

FMT = DEFAULT_FORMAT


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple[Conv2d, tuple[int, int, int], int]:
    kernel = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 3))
    padding = draw(st.integers(0, kernel - 1))
    c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(max(1, kernel - 2 * padding), 7))
    w = draw(st.integers(max(1, kernel - 2 * padding), 7))
    relu = draw(st.booleans())
    return Conv2d(o, kernel, stride, padding, activation="relu" if relu else "identity"), (c, h, w), draw(
        st.integers(1, 3))


def _layer(op: Conv2d | Pool2d, shape: tuple[int, int, int], batch: int):
    net = NetworkBuilder("t", shape, batch).add("l", op).add("flat", Flatten()).add("fc", Linear(2)).build()
    return net.layers[0]


def _ints(rng: np.random.Generator, shape: tuple[int, ...], scale: int = 600) -> np.ndarray:
    return rng.integers(-scale, scale + 1, size=shape).astype(np.int64)


@given(conv_cases(), st.integers(0, 2**32 - 1))
def test_conv_nests_equal_the_integer_reference(case: tuple[Conv2d, tuple[int, int, int], int], seed: int) -> None:
    op, (c, h, w), batch = case
    layer = _layer(op, (c, h, w), batch)
    o, ho, wo = layer.out_shape
    rng = np.random.default_rng(seed)
    x, weights = _ints(rng, (batch, c, h, w)), _ints(rng, (o, c, op.kernel_size, op.kernel_size))
    delta = _ints(rng, (batch, o, ho, wo))
    q = TorchFixed(FMT)
    tx, tw, td = (torch.as_tensor(v) for v in (x, weights, delta))
    z = q.conv(tw, tx, None, op)
    want_f = (z.clamp(min=0) if op.activation == "relu" else z).numpy().reshape(batch, -1)
    want_e = q.conv_input_grad(tw, td, op, (c, h, w)).numpy().reshape(batch, -1)
    want_g = q.conv_weight_grad(td, tx, op)[0].numpy().reshape(o, -1)
    flat_w = weights.reshape(o, -1)
    got_f, _ = run_window(window_of(layer, "F", batch), FMT, x.reshape(batch, -1), flat_w)
    got_e, _ = run_window(window_of(layer, "E", batch), FMT, delta.reshape(batch, -1), flat_w)
    got_g, _ = run_window(window_of(layer, "G", batch), FMT, delta.reshape(batch, -1), x.reshape(batch, -1))
    np.testing.assert_array_equal(got_f, want_f)
    np.testing.assert_array_equal(got_e, want_e)
    np.testing.assert_array_equal(got_g, want_g)


@st.composite
def pool_cases(draw: st.DrawFn) -> tuple[Pool2d, tuple[int, int, int], int]:
    mode = draw(st.sampled_from(["max", "avg"]))
    kernel = draw(st.sampled_from([2, 4]) if mode == "avg" else st.integers(2, 3))
    stride = draw(st.integers(1, 3))
    padding = draw(st.integers(0, kernel // 2))
    c = draw(st.integers(1, 3))
    h = draw(st.integers(max(1, kernel - 2 * padding), 7))
    w = draw(st.integers(max(1, kernel - 2 * padding), 7))
    return Pool2d(mode, kernel, stride, padding), (c, h, w), draw(st.integers(1, 3))


@given(pool_cases(), st.integers(0, 2**32 - 1), st.booleans())
def test_pool_nests_equal_the_integer_reference(case: tuple[Pool2d, tuple[int, int, int], int], seed: int,
                                                ties: bool) -> None:
    op, (c, h, w), batch = case
    layer = _layer(op, (c, h, w), batch)
    _, ho, wo = layer.out_shape
    rng = np.random.default_rng(seed)
    x = _ints(rng, (batch, c, h, w), 2 if ties else 30000)  # few distinct values: ties decide the arg max
    e = _ints(rng, (batch, c, ho, wo), 30000)
    q = TorchFixed(FMT)
    value, winner = q.pool(torch.as_tensor(x), op)
    want_e = q.pool_backward(torch.as_tensor(e), winner, op, (c, h, w)).numpy().reshape(batch, -1)
    got, mask = run_window(window_of(layer, "F", batch), FMT, x.reshape(batch, -1))
    np.testing.assert_array_equal(got, value.numpy().reshape(batch, -1))
    if op.mode == "max":
        assert mask is not None
        np.testing.assert_array_equal(mask, winner.numpy().reshape(batch, -1))
    got_e, _ = run_window(window_of(layer, "E", batch), FMT, e.reshape(batch, -1), mask)
    np.testing.assert_array_equal(got_e, want_e)


@pytest.mark.slow  # over 1 s of CPU on a busy 2-core run (tests/cpu_times.json)
@given(conv_cases(), st.integers(0, 2**32 - 1))
def test_the_integer_reference_is_pytorchs_conv_on_exact_data(case: tuple[Conv2d, tuple[int, int, int], int],
                                                               seed: int) -> None:
    """On values whose products and sums are exact in the format (fraction bits split so nothing rounds), the
    integer conv, its input and weight gradients equal torch's float conv2d and autograd."""
    op, (c, h, w), batch = case
    op = Conv2d(op.out_channels, op.kernel_size, op.stride, op.padding)
    layer = _layer(op, (c, h, w), batch)
    o = layer.out_shape[0]
    rng = np.random.default_rng(seed)
    half = FMT.frac_bits // 2  # x, W, δ multiples of 2^-half: every product is a multiple of 2^-frac
    x = rng.integers(-8, 9, size=(batch, c, h, w)) << (FMT.frac_bits - half)
    weights = rng.integers(-8, 9, size=(o, c, op.kernel_size, op.kernel_size)) << (FMT.frac_bits - half)
    fx, fw = (torch.tensor(v / 2.0**FMT.frac_bits, requires_grad=True) for v in (x, weights))
    z = torch.nn.functional.conv2d(fx, fw, None, op.stride, op.padding)
    delta = rng.integers(-8, 9, size=z.shape) << (FMT.frac_bits - half)
    z.backward(torch.tensor(delta / 2.0**FMT.frac_bits))
    flat_w = weights.reshape(o, -1)
    got_f, _ = run_window(window_of(layer, "F", batch), FMT, x.reshape(batch, -1), flat_w)
    got_e, _ = run_window(window_of(layer, "E", batch), FMT, delta.reshape(batch, -1), flat_w)
    got_g, _ = run_window(window_of(layer, "G", batch), FMT, delta.reshape(batch, -1), x.reshape(batch, -1))
    scale = 2.0**FMT.frac_bits
    np.testing.assert_array_equal(got_f, (z.detach().numpy() * scale).reshape(batch, -1))
    np.testing.assert_array_equal(got_e, (fx.grad.numpy() * scale).reshape(batch, -1))
    np.testing.assert_array_equal(got_g, (fw.grad.numpy() * scale).reshape(o, -1))


def test_nest_counts_every_beat_padding_and_stride_holes_included() -> None:
    wd = Window("conv_e", 2, 5, 5, 3, 2, 2, 3, 2, 1, batch=2)
    beats = nest(wd)
    assert beats.valid.size == wd.beats == 2 * 2 * 5 * 5 * 3 * 3 * 3
    # Of the 9 taps of an input position only those at the forward's strides, inside the output, count.
    assert 0 < beats.valid.sum() < beats.valid.size


@pytest.mark.parametrize("lanes", [1, 2, 4, 16])
@pytest.mark.parametrize("batch", [1, 3])
def test_rtl_cost_model_is_the_nests_closed_formula(lanes: int, batch: int) -> None:
    net = (NetworkBuilder("n", (2, 9, 9), batch).add("conv", Conv2d(3, 3, 2, 1, activation="relu"))
           .add("pool", Pool2d("max", 2)).add("pool2", Pool2d("avg", 2, 1)).add("flat", Flatten())
           .add("fc", Linear(4)).build())
    conv, pool, pool2, flat, _ = net.layers
    model = RTLCostModel(lanes)
    ovh = op_overhead(lanes)
    (c, h, w), (o, ho, wo) = conv.in_shapes[0], conv.out_shape
    assert model.atomic_cost(conv, "F", batch) == batch * o * ho * wo * c * 9 + ovh
    assert model.atomic_cost(conv, "E", batch) == batch * c * h * w * o * 9 + ovh
    assert model.atomic_cost(conv, "G", batch) == o * c * 9 * batch * ho * wo + ovh
    assert model.atomic_cost(conv, "U", batch) == o * math.ceil(c * 9 / lanes) + ovh
    assert model.atomic_cost(conv, "A", batch) == batch * math.ceil(o * ho * wo / lanes) + ovh
    (pc, ph, pw), (_, pho, pwo) = pool.in_shapes[0], pool.out_shape
    assert model.atomic_cost(pool, "F", batch) == batch * pc * pho * pwo * 4 + ovh + 1  # + the mask write
    assert model.atomic_cost(pool, "E", batch) == batch * pc * ph * pw * 4 + ovh
    assert model.atomic_cost(pool2, "F", batch) == window_cycles(window_of(pool2, "F", batch), lanes)
    assert model.atomic_cost(pool2, "F", batch) == batch * math.prod(pool2.out_shape) * 4 + ovh
    assert model.atomic_cost(flat, "F", batch) == model.atomic_cost(flat, "E", batch) == batch * flat.out_size + ovh
    with pytest.raises(ValueError, match="A"):
        model.atomic_cost(pool, "A", batch)


def test_average_pooling_needs_a_power_of_two_window() -> None:
    layer = _layer(Pool2d("avg", 3), (1, 6, 6), 1)
    with pytest.raises(InputError, match="power-of-two"):
        run_window(window_of(layer, "F", 1), FMT, np.zeros((1, 36), dtype=np.int64))

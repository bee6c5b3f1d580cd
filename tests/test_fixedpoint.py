"""layerpipe.fixedpoint against hand-worked edge cases and a slow pure-Python reference written from the spec."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat

# -- a slow reference on Python integers, one element at a time ---------------------------------------------


def ref_sat(v: int, n: int) -> int:
    return max(-(2 ** (n - 1)), min(2 ** (n - 1) - 1, v))


def ref_round_shift(v: int, k: int) -> int:
    """Round half up of v / 2^k with exact rationals: floor(v/2^k + 1/2)."""
    return math.floor(Fraction(v, 2**k) + Fraction(1, 2))


def ref_rescale(v: int, n: int, f: int) -> int:
    return ref_sat(ref_round_shift(v, f), n)


def ref_quantize(x: float, n: int, f: int) -> int:
    return ref_sat(math.floor(Fraction(x) * 2**f + Fraction(1, 2)), n)


def formats() -> st.SearchStrategy[FixedFormat]:
    return st.integers(2, 16).flatmap(lambda n: st.builds(FixedFormat, st.just(n), st.integers(0, n - 1)))


def ints_in(fmt: FixedFormat) -> st.SearchStrategy[int]:
    return st.integers(fmt.min_int, fmt.max_int)


# -- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "frac", "field"),
    [(1, 0, "total_bits"), (33, 8, "total_bits"), (16, 16, "frac_bits"), (16, -1, "frac_bits"),
     (16.0, 8, "total_bits")],
)
def test_format_validation_names_the_field_and_range(total: int, frac: int, field: str) -> None:
    with pytest.raises(InputError, match=rf"^{field} must be an integer in \d+\.\.\d+"):
        FixedFormat(total, frac)


def test_default_format_is_q16_8() -> None:
    assert (DEFAULT_FORMAT.total_bits, DEFAULT_FORMAT.frac_bits) == (16, 8)
    assert (DEFAULT_FORMAT.min_int, DEFAULT_FORMAT.max_int, DEFAULT_FORMAT.scale) == (-32768, 32767, 256)
    assert DEFAULT_FORMAT.name == "q16.8"


@pytest.mark.parametrize("shift", [-1, 62, 1.5, True])
def test_bad_lr_shift_is_rejected(shift: object) -> None:
    with pytest.raises(InputError, match=r"^lr_shift must be an integer in 0\.\.61"):
        DEFAULT_FORMAT.sgd_update(np.zeros(2, np.int64), np.zeros(2, np.int64), shift)  # type: ignore[arg-type]


def test_float_operands_are_refused() -> None:
    with pytest.raises(TypeError, match="integer arrays"):
        DEFAULT_FORMAT.rescale(np.array([1.5]))


# -- edge cases worked by hand (Q16.8) ----------------------------------------------------------------------


def test_quantize_rounds_half_up_and_saturates_both_ends() -> None:
    lsb = 1 / 256
    got = DEFAULT_FORMAT.quantize([0.5 * lsb, -0.5 * lsb, -1.5 * lsb, 1.5 * lsb, -2.5 * lsb, 127.998, 128.0, -128.0,
                                   -128.002, 1e300, -np.inf, np.inf, 0.49999999999999994 * lsb])
    assert got.tolist() == [1, 0, -1, 2, -2, 32767, 32767, -32768, -32768, 32767, -32768, 32767, 0]
    assert got.dtype == np.int64


def test_quantize_rejects_nan() -> None:
    with pytest.raises(InputError, match="NaN"):
        DEFAULT_FORMAT.quantize([0.0, np.nan])


def test_rescale_round_half_up_on_negative_values() -> None:
    # acc / 256: −2.5 → −2 (half up, not away from zero), −2.5 − 1/256 → −3, +2.5 → 3, −0.5 → 0, −0.5−ε → −1.
    got = DEFAULT_FORMAT.rescale([-640, -641, 640, -128, -129, 127, 0])
    assert got.tolist() == [-2, -3, 3, 0, -1, 0, 0]


def test_rescale_saturates_both_ends() -> None:
    big = 2**40
    assert DEFAULT_FORMAT.rescale([big, -big, 32767 * 256 + 127, 32767 * 256 + 128]).tolist() == [
        32767, -32768, 32767, 32767]


def test_relu_and_its_mask_treat_zero_as_inactive() -> None:
    z = np.array([-3, 0, 5])
    assert DEFAULT_FORMAT.relu(z).tolist() == [0, 0, 5]
    assert DEFAULT_FORMAT.relu_grad_mask(z).tolist() == [0, 0, 1]


def test_matvec_accumulates_at_full_width_before_one_rounding() -> None:
    # Each product 0.5·0.5 = 0.25 (64 at scale 2^16 → 64/256 ≈ 0.25 LSB); rounding each product would give 0.
    half = 128
    w = np.full((1, 4), 1, np.int64)  # 1 LSB each
    a = np.full(4, half, np.int64)
    assert DEFAULT_FORMAT.matvec(w, a).tolist() == [2]  # (4·128 + 128) >> 8 = 2
    assert DEFAULT_FORMAT.matvec(w, np.stack([a, -a])).tolist() == [[2], [-2]]


def test_affine_adds_the_bias_inside_the_accumulator() -> None:
    w = np.array([[1]], np.int64)
    a = np.array([128], np.int64)  # product 128 → 0.5 LSB: rounds up to 1
    assert DEFAULT_FORMAT.affine(w, a, np.array([-1])).tolist() == [0]  # (128 − 256 + 128) >> 8
    assert DEFAULT_FORMAT.affine(w, a, np.array([32767])).tolist() == [32767]


def test_outer_gradient_sums_the_batch_before_rescale() -> None:
    delta = np.array([[1], [1], [1]], np.int64)
    a = np.array([[64], [64], [0]], np.int64)  # each product 0.25 LSB; rounded alone → 0, summed → 0.5 → 1
    assert DEFAULT_FORMAT.outer_gradient(delta, a).tolist() == [[1]]
    assert DEFAULT_FORMAT.outer_gradient(np.array([2, -3]), np.array([256, 128])).tolist() == [[2, 1], [-3, -1]]


def test_sgd_update_rounds_the_shifted_gradient_half_up_and_saturates() -> None:
    w = np.array([0, 0, 0, -32768, 32767, 10], np.int64)
    g = np.array([3, -3, -2, 8, -8, 5], np.int64)
    # k = 1: (3+1)>>1 = 2, (−3+1)>>1 = −1, (−2+1)>>1 = −1, (8+1)>>1 = 4, (−8+1)>>1 = −4, (5+1)>>1 = 3
    assert DEFAULT_FORMAT.sgd_update(w, g, 1).tolist() == [-2, 1, 1, -32768, 32767, 7]
    assert DEFAULT_FORMAT.sgd_update(w, g, 0).tolist() == [-3, 3, 2, -32768, 32767, 5]


def test_output_error_add_and_bias_gradient_saturate() -> None:
    assert DEFAULT_FORMAT.output_error([32767, -32768, 5], [-32768, 32767, 7]).tolist() == [32767, -32768, -2]
    assert DEFAULT_FORMAT.add([30000, -30000], [30000, -30000], [1, 1]).tolist() == [32767, -32768]
    assert DEFAULT_FORMAT.add([32000, 5], [1000, -3], [-1000, 1]).tolist() == [32000, 3]  # one saturation
    assert DEFAULT_FORMAT.bias_gradient(np.array([[20000, 1], [20000, -3]])).tolist() == [32767, -2]


def test_to_float_inverts_quantize_on_the_grid() -> None:
    fmt = FixedFormat(12, 5)
    q = np.arange(fmt.min_int, fmt.max_int + 1)
    assert np.array_equal(fmt.quantize(fmt.to_float(q)), q)


# -- properties against the slow reference ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(fmt=formats(), x=st.floats(allow_nan=False, width=64))
def test_quantize_matches_reference(fmt: FixedFormat, x: float) -> None:
    if math.isinf(x):
        expect = fmt.max_int if x > 0 else fmt.min_int
    else:
        expect = ref_quantize(x, fmt.total_bits, fmt.frac_bits)
    assert int(fmt.quantize(x)) == expect


@settings(max_examples=200, deadline=None)
@given(fmt=formats(), acc=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=8))
def test_rescale_matches_reference(fmt: FixedFormat, acc: list[int]) -> None:
    expect = [ref_rescale(v, fmt.total_bits, fmt.frac_bits) for v in acc]
    assert fmt.rescale(np.array(acc, np.int64)).tolist() == expect


@settings(max_examples=100, deadline=None)
@given(data=st.data(), fmt=formats(), n_out=st.integers(1, 4), n_in=st.integers(1, 5), batch=st.integers(1, 3))
def test_matvec_and_gradients_match_reference(data: st.DataObject, fmt: FixedFormat, n_out: int, n_in: int,
                                              batch: int) -> None:
    n, f = fmt.total_bits, fmt.frac_bits
    w = [[data.draw(ints_in(fmt)) for _ in range(n_in)] for _ in range(n_out)]
    a = [[data.draw(ints_in(fmt)) for _ in range(n_in)] for _ in range(batch)]
    d = [[data.draw(ints_in(fmt)) for _ in range(n_out)] for _ in range(batch)]
    b = [data.draw(ints_in(fmt)) for _ in range(n_out)]
    z = [[ref_rescale(sum(w[i][j] * a[s][j] for j in range(n_in)), n, f) for i in range(n_out)] for s in range(batch)]
    zb = [[ref_rescale(sum(w[i][j] * a[s][j] for j in range(n_in)) + b[i] * 2**f, n, f) for i in range(n_out)]
          for s in range(batch)]
    e = [[ref_rescale(sum(w[i][j] * d[s][i] for i in range(n_out)), n, f) for j in range(n_in)] for s in range(batch)]
    g = [[ref_rescale(sum(d[s][i] * a[s][j] for s in range(batch)), n, f) for j in range(n_in)] for i in range(n_out)]
    gb = [ref_sat(sum(d[s][i] for s in range(batch)), n) for i in range(n_out)]
    W, A, D = (np.array(v, np.int64) for v in (w, a, d))
    assert fmt.matvec(W, A).tolist() == z
    assert fmt.affine(W, A, np.array(b, np.int64)).tolist() == zb
    assert fmt.matvec(W.T, D).tolist() == e
    assert fmt.outer_gradient(D, A).tolist() == g
    assert fmt.bias_gradient(D).tolist() == gb


@settings(max_examples=200, deadline=None)
@given(data=st.data(), fmt=formats(), k=st.integers(0, 20), size=st.integers(1, 6))
def test_sgd_update_matches_reference(data: st.DataObject, fmt: FixedFormat, k: int, size: int) -> None:
    w = data.draw(st.lists(ints_in(fmt), min_size=size, max_size=size))
    g = data.draw(st.lists(ints_in(fmt), min_size=size, max_size=size))
    expect = [ref_sat(wi - ref_round_shift(gi, k), fmt.total_bits) for wi, gi in zip(w, g, strict=True)]
    assert fmt.sgd_update(np.array(w), np.array(g), k).tolist() == expect


def test_ema_average_and_reconstruct_by_hand() -> None:
    # m = 2 (β = 3/4): ḡ = 0 + ((10 − 0 + 2) >> 2) = 3; then 3 + ((−6 − 3 + 2) >> 2) = 3 − 2 = 1.
    avg = DEFAULT_FORMAT.ema_average(np.array([0]), np.array([10]), 2)
    assert avg.tolist() == [3]
    assert DEFAULT_FORMAT.ema_average(avg, np.array([-6]), 2).tolist() == [1]
    assert DEFAULT_FORMAT.ema_average(avg, np.array([-6]), 0).tolist() == [-6]
    # Ŵ = W + ((s·ḡ + 2^(k−1)) >> k): s = 3, ḡ = −5, k = 2 → (−15 + 2) >> 2 = −4.
    assert DEFAULT_FORMAT.ema_reconstruct(np.array([100, 32767]), np.array([-5, 40]), 3, 2).tolist() == [96, 32767]
    assert DEFAULT_FORMAT.ema_reconstruct(np.array([7]), np.array([9]), 0, 3).tolist() == [7]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), fmt=formats(), m=st.integers(0, 6), k=st.integers(0, 8), s=st.integers(0, 6))
def test_ema_matches_reference(data: st.DataObject, fmt: FixedFormat, m: int, k: int, s: int) -> None:
    avg, g, w = (data.draw(ints_in(fmt)) for _ in range(3))
    n = fmt.total_bits
    assert int(fmt.ema_average(np.array(avg), np.array(g), m)) == ref_sat(avg + ref_round_shift(g - avg, m), n)
    assert int(fmt.ema_reconstruct(np.array(w), np.array(avg), s, k)) == ref_sat(w + ref_round_shift(s * avg, k), n)


def test_divide_rounds_half_up_by_hand() -> None:
    # 13/9 = 1.44 → 1; 14/9 = 1.56 → 2; −13/9 → −1; −14/9 → −2; 9/18 = 0.5 → 1; −9/18 = −0.5 → 0.
    assert DEFAULT_FORMAT.divide(np.array([13, 14, -13, -14]), 9).tolist() == [1, 2, -1, -2]
    assert DEFAULT_FORMAT.divide(np.array([9, -9, 27]), 18).tolist() == [1, 0, 2]
    with pytest.raises(InputError, match="divisor must be a positive integer"):
        DEFAULT_FORMAT.divide(np.array([1]), 0)


@settings(max_examples=200, deadline=None)
@given(fmt=formats(), v=st.integers(-(2**40), 2**40), d=st.integers(1, 64))
def test_divide_matches_reference(fmt: FixedFormat, v: int, d: int) -> None:
    expect = ref_sat(math.floor(Fraction(v, d) + Fraction(1, 2)), fmt.total_bits)
    assert int(fmt.divide(np.array(v), d)) == expect

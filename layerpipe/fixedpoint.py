"""The fixed-point arithmetic shared by the numpy functional simulator, the integer PyTorch reference and the RTL.

This docstring is the specification the hardware follows; every function below is written to it bit for bit.

Format
------
A value is a signed two's-complement integer q of `n = total_bits` bits standing for the real number
q / 2^f, with `f = frac_bits` (Q(n−f).f). Default n = 16, f = 8. Representable integers are
[MIN, MAX] = [−2^(n−1), 2^(n−1) − 1]. Arrays of such integers are numpy int64.

Primitive operations (all exact integer arithmetic; `>>` is the arithmetic shift right, i.e. floor
division by a power of two, also for negative numbers)
------------------------------------------------------------------------------------------------
- sat(v)         = min(max(v, MIN), MAX).
- quantize(x)    = sat(floor(x · 2^f + 1/2)) for a real x (round half up, i.e. toward +∞ on ties:
                   −0.5 LSB rounds to 0, −1.5 LSB rounds to −1). x·2^f is exact in float64 (a power-of-two
                   scale); +∞ saturates to MAX, −∞ to MIN; NaN is an error.
- to_float(q)    = q / 2^f (exact in float64).
- rescale(acc)   = sat((acc + 2^(f−1)) >> f) for f ≥ 1, and sat(acc) for f = 0. Round half up: the tie
                   −2.5 LSB → −2, +2.5 LSB → +3.
- Accumulators are 64-bit two's complement (int64). Products of two n-bit values and their sums are
  formed at that full width and rescaled once at the end. They are exact while the sum of |products|
  stays below 2^63 (for n = 16: any length below 2^33); beyond that they wrap modulo 2^64, like a 64-bit
  hardware accumulator would, and numpy and torch int64 arithmetic wrap the same way.

Training operations (rows are samples: an activation batch has shape (B, width); one sample may be 1-D)
------------------------------------------------------------------------------------------------------
- matvec(W, a)          = rescale(Σ_j W[i, j] · a[..., j])               forward  z = W a
                          (E uses matvec(Wᵀ, δ): e_prev[j] = rescale(Σ_i W[i, j] δ[i]))
- affine(W, a, b)       = rescale(Σ_j W[i, j] · a[..., j] + b[i] · 2^f)  forward with bias: the bias is
                          aligned to the product scale and added inside the accumulator, before the
                          single rounding.
- matmul(A, B)          = rescale(A @ B) at full width.
- relu(z)               = max(z, 0).
- relu_grad_mask(z)     = 1 where z > 0 else 0 (f'(0) = 0).
- A for ReLU            δ = e · relu_grad_mask(z) (no rescale: the mask is the integer 0 or 1);
                          for the identity activation δ = e.
- output_error(a, y)    = sat(a − y)                                     e_L of the loss ½‖a_L − y‖²
- outer_gradient(δ, a)  = rescale(Σ_b δ[b, i] · a[b, j])                 G: the whole micro-batch is
                          summed at full width before the one rescale.
- bias_gradient(δ)      = sat(Σ_b δ[b, i])                                (already at scale 2^f)
- add(x1, x2, ...)      = sat(x1 + x2 + ...) summed at full width and saturated once, so the result
                          does not depend on the order of the operands. Used for the residual add (its
                          backward passes e to every input unchanged), for the error of a layer read by
                          several consumers (e = add of their contributions) and for a synchronous step's
                          gradient (add of its micro-batches' rescaled gradients).
- divide(v, d)          = sat(floor((2·v + d) / (2·d))) for a positive integer d: v / d rounded half up
                          (average pooling divides window sums and errors by d = K²).
- conv2d and pooling (batch first (B, C, H, W), weights (O, C/groups, K, K), stride s, padding p):
    F  z[b,o,h,w] = rescale(Σ_{c,i,j} W[o,c,i,j]·x_pad[b,c',h·s+i,w·s+j] + bias[o]·2^f), zero padding;
    E  e_in[b,c,y,x] = rescale(Σ over every (o,h,w,i,j) whose window reads (c,y,x) of W[o,c,i,j]·δ[b,o,h,w]);
    G  g[o,c,i,j] = rescale(Σ_{b,h,w} δ[b,o,h,w]·x_pad[b,c',h·s+i,w·s+j]);  g_b[o] = sat(Σ_{b,h,w} δ[b,o,h,w]);
    max pool: a = the window maximum (padding never wins); backward: each window sends its error to the
      first maximal position in row-major window order; an input sums what it receives, sat once;
    avg pool: a = divide(Σ window, K²) with zero padding counted; backward: each window sends
      divide(e, K²) to each of its positions; an input sums what it receives, sat once.
- sgd_update(W, g, k)   = sat(W − ((g + 2^(k−1)) >> k)) for k ≥ 1, sat(W − g) for k = 0: learning rate
                          2^−k applied as a round-half-up shift.

Weight history by moving average (the `ema` weight mode; m = ema_shift, β = 1 − 2^−m)
------------------------------------------------------------------------------------
- ema_average(ḡ, g, m)        = sat(ḡ + ((g − ḡ + 2^(m−1)) >> m))   ḡ ← β ḡ + (1 − β) g, once per update
                                (m = 0 gives ḡ = g).
- ema_reconstruct(W, ḡ, s, k) = sat(W + ((s·ḡ + 2^(k−1)) >> k))   the version s updates older than W,
                                Ŵ = W + η·s·ḡ with η = 2^−k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from layerpipe.errors import InputError

__all__ = [
    "DEFAULT_FORMAT",
    "MAX_LR_SHIFT",
    "MAX_TOTAL_BITS",
    "MIN_TOTAL_BITS",
    "FixedFormat",
    "check_lr_shift",
    "lr_shift_of",
]

MIN_TOTAL_BITS = 2
MAX_TOTAL_BITS = 32
# A shift of 62 or more would make 2^(k-1) overflow int64's positive range in the rounding term.
MAX_LR_SHIFT = 61

IntArray = npt.NDArray[np.int64]


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_lr_shift(lr_shift: object, field: str = "lr_shift") -> int:
    """Validate a shift k (a factor 2^−k: learning rate, moving-average weight); return it as an int."""
    if not _is_int(lr_shift) or not 0 <= int(lr_shift) <= MAX_LR_SHIFT:
        raise InputError(f"{field} must be an integer in 0..{MAX_LR_SHIFT}, got {lr_shift!r}")
    return int(lr_shift)


def lr_shift_of(lr: float) -> int:
    """k for a learning rate 2^−k; any other value (fixed point applies the rate as a shift) is an InputError."""
    if isinstance(lr, float | int) and not isinstance(lr, bool) and 0 < lr <= 1:
        mantissa, exponent = math.frexp(lr)
        if mantissa == 0.5 and 1 - exponent <= MAX_LR_SHIFT:
            return 1 - exponent
    raise InputError(f"lr must be a power of two 2^-k with k in 0..{MAX_LR_SHIFT} in fixed point, got {lr!r}")


def _as_int64(values: npt.ArrayLike) -> IntArray:
    array = np.asarray(values)
    if array.dtype.kind not in "iu" and array.dtype != np.bool_:
        raise TypeError(f"fixed-point operands must be integer arrays, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _round_shift(values: IntArray, shift: int) -> IntArray:
    """(v + 2^(shift−1)) >> shift: round half up; `>>` on int64 floors, also for negative values."""
    if shift == 0:
        return values
    return (values + np.int64(1 << (shift - 1))) >> np.int64(shift)


@dataclass(frozen=True)
class FixedFormat:
    """Signed Q(total_bits − frac_bits).frac_bits fixed point; see the module docstring for the exact rules."""

    total_bits: int = 16
    frac_bits: int = 8

    def __post_init__(self) -> None:
        if not _is_int(self.total_bits) or not MIN_TOTAL_BITS <= self.total_bits <= MAX_TOTAL_BITS:
            raise InputError(
                f"total_bits must be an integer in {MIN_TOTAL_BITS}..{MAX_TOTAL_BITS}, got {self.total_bits!r}"
            )
        if not _is_int(self.frac_bits) or not 0 <= self.frac_bits < self.total_bits:
            raise InputError(
                f"frac_bits must be an integer in 0..{self.total_bits - 1} (below total_bits), got {self.frac_bits!r}"
            )

    @property
    def min_int(self) -> int:
        """Most negative representable integer, −2^(n−1)."""
        return -(1 << (self.total_bits - 1))

    @property
    def max_int(self) -> int:
        """Most positive representable integer, 2^(n−1) − 1."""
        return (1 << (self.total_bits - 1)) - 1

    @property
    def scale(self) -> int:
        """2^f: the integer that stands for 1.0 (may itself be out of range when f = n − 1)."""
        return 1 << self.frac_bits

    @property
    def name(self) -> str:
        """Compact name like 'q16.8' used in file names and reports."""
        return f"q{self.total_bits}.{self.frac_bits}"

    # -- conversions ----------------------------------------------------------------------------------

    def quantize(self, x: npt.ArrayLike) -> IntArray:
        """sat(floor(x·2^f + 1/2)); NaN raises InputError."""
        values = np.asarray(x, dtype=np.float64)
        if np.isnan(values).any():
            raise InputError("cannot quantize NaN to fixed point")
        # Exact (a power-of-two scale); bounding to one LSB past the range keeps ±inf out of the arithmetic.
        with np.errstate(over="ignore"):  # a product overflowing to ±inf saturates like any big value
            scaled = np.clip(values * float(self.scale), self.min_int - 1.0, self.max_int + 1.0)
        # floor(v + 1/2) computed without the rounding error of the float addition (0.49999999999999994 + 0.5
        # rounds to 1.0): v − floor(v) is exact, so compare the fraction with 1/2 instead.
        whole = np.floor(scaled)
        scaled = whole + (scaled - whole >= 0.5)
        clipped = np.clip(scaled, float(self.min_int), float(self.max_int))
        return clipped.astype(np.int64)

    def to_float(self, q: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """q / 2^f as float64 (exact)."""
        return _as_int64(q).astype(np.float64) / float(self.scale)

    # -- primitives -----------------------------------------------------------------------------------

    def saturate(self, values: npt.ArrayLike) -> IntArray:
        """Clamp to [−2^(n−1), 2^(n−1) − 1]."""
        return np.clip(_as_int64(values), self.min_int, self.max_int)

    def rescale(self, acc: npt.ArrayLike) -> IntArray:
        """A full-width accumulator at scale 2^(2f) back to the format: sat((acc + 2^(f−1)) >> f)."""
        return self.saturate(_round_shift(_as_int64(acc), self.frac_bits))

    # -- training operations --------------------------------------------------------------------------

    def matmul(self, a: npt.ArrayLike, b: npt.ArrayLike) -> IntArray:
        """rescale(A @ B) with the products summed at full int64 width."""
        return self.rescale(np.matmul(_as_int64(a), _as_int64(b)))

    def matvec(self, weights: npt.ArrayLike, a: npt.ArrayLike) -> IntArray:
        """z[..., i] = rescale(Σ_j W[i, j]·a[..., j]); `a` is one sample (1-D) or a batch of rows."""
        return self.matmul(a, _as_int64(weights).T)

    def affine(self, weights: npt.ArrayLike, a: npt.ArrayLike, bias: npt.ArrayLike) -> IntArray:
        """rescale(Σ_j W[i, j]·a[..., j] + b[i]·2^f): the bias joins the accumulator before the rounding."""
        acc = np.matmul(_as_int64(a), _as_int64(weights).T)
        return self.rescale(acc + (_as_int64(bias) << np.int64(self.frac_bits)))

    @staticmethod
    def relu(z: npt.ArrayLike) -> IntArray:
        """max(z, 0)."""
        return np.maximum(_as_int64(z), 0)

    @staticmethod
    def relu_grad_mask(z: npt.ArrayLike) -> IntArray:
        """f'(z) of ReLU as the integer 1 where z > 0, else 0 (so f'(0) = 0)."""
        return (_as_int64(z) > 0).astype(np.int64)

    def output_error(self, a_out: npt.ArrayLike, target: npt.ArrayLike) -> IntArray:
        """e_L = sat(a_L − y), the derivative of ½‖a_L − y‖²."""
        return self.saturate(_as_int64(a_out) - _as_int64(target))

    def add(self, *operands: npt.ArrayLike) -> IntArray:
        """Residual add: sat(x1 + x2 + ...), summed at full width and saturated once."""
        total = _as_int64(operands[0])
        for operand in operands[1:]:
            total = total + _as_int64(operand)
        return self.saturate(total)

    def outer_gradient(self, delta: npt.ArrayLike, a_in: npt.ArrayLike) -> IntArray:
        """g[i, j] = rescale(Σ_b δ[b, i]·a[b, j]); 1-D inputs are one sample."""
        d = np.atleast_2d(_as_int64(delta))
        a = np.atleast_2d(_as_int64(a_in))
        return self.rescale(np.matmul(d.T, a))

    def bias_gradient(self, delta: npt.ArrayLike) -> IntArray:
        """g_b[i] = sat(Σ_b δ[b, i]); already at scale 2^f, so no rescale."""
        return self.saturate(np.atleast_2d(_as_int64(delta)).sum(axis=0))

    def divide(self, values: npt.ArrayLike, divisor: int) -> IntArray:
        """sat(floor((2·v + d) / (2·d))): v / d rounded half up, for a positive integer divisor d."""
        if not _is_int(divisor) or divisor < 1:
            raise InputError(f"divisor must be a positive integer, got {divisor!r}")
        d = np.int64(divisor)
        return self.saturate((2 * _as_int64(values) + d) // (2 * d))

    def sgd_update(self, weights: npt.ArrayLike, gradient: npt.ArrayLike, lr_shift: int) -> IntArray:
        """W ← sat(W − ((g + 2^(k−1)) >> k)) for learning rate 2^−k (k = lr_shift; k = 0 subtracts g)."""
        k = check_lr_shift(lr_shift)
        return self.saturate(_as_int64(weights) - _round_shift(_as_int64(gradient), k))

    def ema_average(self, average: npt.ArrayLike, gradient: npt.ArrayLike, ema_shift: int) -> IntArray:
        """ḡ ← sat(ḡ + ((g − ḡ + 2^(m−1)) >> m)): the moving average with β = 1 − 2^−m (m = ema_shift)."""
        m = check_lr_shift(ema_shift, "ema_shift")
        avg = _as_int64(average)
        return self.saturate(avg + _round_shift(_as_int64(gradient) - avg, m))

    def ema_reconstruct(
        self, weights: npt.ArrayLike, average: npt.ArrayLike, staleness: int, lr_shift: int
    ) -> IntArray:
        """Ŵ = sat(W + ((s·ḡ + 2^(k−1)) >> k)): the weights s updates before W, rebuilt from the average ḡ."""
        k = check_lr_shift(lr_shift)
        return self.saturate(_as_int64(weights) + _round_shift(np.int64(staleness) * _as_int64(average), k))


DEFAULT_FORMAT = FixedFormat()

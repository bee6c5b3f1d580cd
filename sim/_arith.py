"""The two arithmetics of functional mode: float64 and the shared fixed-point format.

Both implement one small interface over batch-major numpy arrays (rows are the samples of a micro-batch),
so the executor in `functional.py` is written once. The fixed-point side only composes
`layerpipe.fixedpoint.FixedFormat` operations: that module is the bit-exact specification.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat
from layerpipe.network import Conv2d, Pool2d
from layerpipe.sim._conv import conv_forward_sum, conv_input_sum, conv_weight_sum, pool_backward, pool_forward

__all__ = ["Arithmetic", "FixedArithmetic", "FloatArithmetic"]


def _row_sums(values: np.ndarray) -> np.ndarray:
    return values.reshape(len(values), -1).sum(axis=1)


class Arithmetic(ABC):
    """Operations of one training step, in one number representation."""

    @abstractmethod
    def encode(self, values: np.ndarray) -> np.ndarray:
        """Floats (or already encoded integers) into this representation."""

    @abstractmethod
    def decode(self, values: np.ndarray) -> np.ndarray:
        """This representation as float64."""

    @abstractmethod
    def linear(self, weights: np.ndarray, a_in: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        """z = a_in Wᵀ (+ b)."""

    @abstractmethod
    def add(self, operands: Sequence[np.ndarray]) -> np.ndarray:
        """Elementwise sum (residual add, error contributions, gradients of a step)."""

    @abstractmethod
    def activate(self, z: np.ndarray, function: str) -> np.ndarray:
        """a = f(z)."""

    @abstractmethod
    def activation_grad(self, e: np.ndarray, z: np.ndarray, a: np.ndarray, function: str) -> np.ndarray:
        """δ = e ⊙ f'(z) (a = f(z) is given for functions whose derivative uses it)."""

    @abstractmethod
    def input_gradient(self, weights: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """e_in = δ W."""

    @abstractmethod
    def weight_gradient(self, delta: np.ndarray, a_in: np.ndarray, bias: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(δᵀ a_in, Σ_rows δ or None), summed over the micro-batch."""

    @abstractmethod
    def output_error(self, a: np.ndarray, y: np.ndarray) -> np.ndarray:
        """e_L = a_L − y."""

    @abstractmethod
    def sgd(self, weights: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        """W − η g."""

    @abstractmethod
    def ema_average(self, average: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        """ḡ + 2^−m (g − ḡ)."""

    @abstractmethod
    def ema_reconstruct(self, weights: np.ndarray, average: np.ndarray, staleness: int) -> np.ndarray:
        """W + η·s·ḡ: the weights `staleness` updates older than `weights`."""

    # Hooks that turn exact window sums (`_conv`) into this representation's results.

    @abstractmethod
    def finish_products(self, acc: np.ndarray) -> np.ndarray:
        """A sum of products of two encoded values, as an encoded value."""

    @abstractmethod
    def finish_sum(self, total: np.ndarray) -> np.ndarray:
        """A sum of encoded values, as an encoded value."""

    @abstractmethod
    def bias_term(self, bias: np.ndarray) -> np.ndarray:
        """The bias at the scale of a sum of products."""

    @abstractmethod
    def divide(self, total: np.ndarray, count: int) -> np.ndarray:
        """total / count (average pooling)."""

    # conv2d and pooling, one implementation for both representations

    def conv(self, weights: np.ndarray, a_in: np.ndarray, bias: np.ndarray | None, op: Conv2d) -> np.ndarray:
        acc = conv_forward_sum(a_in, weights, op.stride, op.padding, op.groups)
        if bias is not None:
            acc = acc + self.bias_term(bias)[None, :, None, None]
        return self.finish_products(acc)

    def conv_input_gradient(
        self, weights: np.ndarray, delta: np.ndarray, op: Conv2d, in_shape: tuple[int, ...]
    ) -> np.ndarray:
        return self.finish_products(conv_input_sum(delta, weights, in_shape, op.stride, op.padding, op.groups))

    def conv_weight_gradient(
        self, delta: np.ndarray, a_in: np.ndarray, op: Conv2d
    ) -> tuple[np.ndarray, np.ndarray | None]:
        g = self.finish_products(conv_weight_sum(delta, a_in, op.kernel_size, op.stride, op.padding, op.groups))
        return g, (self.finish_sum(delta.sum(axis=(0, 2, 3))) if op.bias else None)

    def pool(self, a_in: np.ndarray, op: Pool2d) -> tuple[np.ndarray, np.ndarray]:
        """(output, arg max per window — empty for average pooling)."""
        total, argmax = pool_forward(a_in, op.mode, op.kernel_size, op.effective_stride, op.padding)
        return (total if op.mode == "max" else self.divide(total, op.kernel_size**2)), argmax

    def pool_backward(self, e: np.ndarray, argmax: np.ndarray, op: Pool2d, in_shape: tuple[int, ...]) -> np.ndarray:
        share = e if op.mode == "max" else self.divide(e, op.kernel_size**2)
        total = pool_backward(share, argmax, op.mode, in_shape, op.kernel_size, op.effective_stride, op.padding)
        return self.finish_sum(total)

    def sum_gradients(self, gradients: Sequence[np.ndarray]) -> np.ndarray:
        return self.add(gradients)

    def loss(self, a: np.ndarray, y: np.ndarray) -> np.ndarray:
        """½‖a − y‖² per sample, float64 (from the decoded values in fixed point)."""
        diff = self.decode(a) - self.decode(y)
        return 0.5 * _row_sums(diff * diff)


class FloatArithmetic(Arithmetic):
    def __init__(self, lr: float, ema_shift: int) -> None:
        self.lr = float(lr)
        self.ema_weight = 2.0**-ema_shift

    def encode(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def decode(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def linear(self, weights: np.ndarray, a_in: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        z = a_in @ weights.T
        return z if bias is None else z + bias

    def add(self, operands: Sequence[np.ndarray]) -> np.ndarray:
        total = operands[0]
        for operand in operands[1:]:
            total = total + operand
        return total

    def activate(self, z: np.ndarray, function: str) -> np.ndarray:
        if function == "relu":
            return np.maximum(z, 0.0)
        if function == "sigmoid":
            return 1.0 / (1.0 + np.exp(-z))
        if function == "tanh":
            return np.tanh(z)
        return z

    def activation_grad(self, e: np.ndarray, z: np.ndarray, a: np.ndarray, function: str) -> np.ndarray:
        if function == "relu":
            return np.where(z > 0, e, 0.0)
        if function == "sigmoid":
            return e * (1.0 - a) * a
        if function == "tanh":
            return e * (1.0 - a * a)
        return e

    def input_gradient(self, weights: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return delta @ weights

    def weight_gradient(self, delta: np.ndarray, a_in: np.ndarray, bias: bool) -> tuple[np.ndarray, np.ndarray | None]:
        return delta.T @ a_in, (delta.sum(axis=0) if bias else None)

    def output_error(self, a: np.ndarray, y: np.ndarray) -> np.ndarray:
        return a - y

    def sgd(self, weights: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        return weights - self.lr * gradient

    def ema_average(self, average: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        return average + self.ema_weight * (gradient - average)

    def ema_reconstruct(self, weights: np.ndarray, average: np.ndarray, staleness: int) -> np.ndarray:
        return weights + (self.lr * staleness) * average

    def finish_products(self, acc: np.ndarray) -> np.ndarray:
        return acc

    def finish_sum(self, total: np.ndarray) -> np.ndarray:
        return total

    def bias_term(self, bias: np.ndarray) -> np.ndarray:
        return bias

    def divide(self, total: np.ndarray, count: int) -> np.ndarray:
        return total / count


class FixedArithmetic(Arithmetic):
    def __init__(self, fmt: FixedFormat, lr_shift: int, ema_shift: int) -> None:
        self.fmt, self.lr_shift, self.ema_shift = fmt, lr_shift, ema_shift

    def encode(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if values.dtype.kind in "iu":
            return self.fmt.saturate(values)
        return self.fmt.quantize(values)

    def decode(self, values: np.ndarray) -> np.ndarray:
        return self.fmt.to_float(values)

    def linear(self, weights: np.ndarray, a_in: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        return self.fmt.matvec(weights, a_in) if bias is None else self.fmt.affine(weights, a_in, bias)

    def add(self, operands: Sequence[np.ndarray]) -> np.ndarray:
        return self.fmt.add(*operands)

    def activate(self, z: np.ndarray, function: str) -> np.ndarray:
        if function == "relu":
            return self.fmt.relu(z)
        if function != "identity":
            raise InputError(f"fixed-point mode supports activations identity, relu; got {function}")
        return z

    def activation_grad(self, e: np.ndarray, z: np.ndarray, a: np.ndarray, function: str) -> np.ndarray:
        return e * self.fmt.relu_grad_mask(z) if function == "relu" else e

    def input_gradient(self, weights: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return self.fmt.matvec(weights.T, delta)

    def weight_gradient(self, delta: np.ndarray, a_in: np.ndarray, bias: bool) -> tuple[np.ndarray, np.ndarray | None]:
        return self.fmt.outer_gradient(delta, a_in), (self.fmt.bias_gradient(delta) if bias else None)

    def output_error(self, a: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.fmt.output_error(a, y)

    def sgd(self, weights: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        return self.fmt.sgd_update(weights, gradient, self.lr_shift)

    def ema_average(self, average: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        return self.fmt.ema_average(average, gradient, self.ema_shift)

    def ema_reconstruct(self, weights: np.ndarray, average: np.ndarray, staleness: int) -> np.ndarray:
        return self.fmt.ema_reconstruct(weights, average, staleness, self.lr_shift)

    def finish_products(self, acc: np.ndarray) -> np.ndarray:
        return self.fmt.rescale(acc)

    def finish_sum(self, total: np.ndarray) -> np.ndarray:
        return self.fmt.saturate(total)

    def bias_term(self, bias: np.ndarray) -> np.ndarray:
        return bias << np.int64(self.fmt.frac_bits)

    def divide(self, total: np.ndarray, count: int) -> np.ndarray:
        return self.fmt.divide(total, count)

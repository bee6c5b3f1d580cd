"""`layerpipe.fixedpoint` re-implemented on int64 torch tensors, for the integer path of the PyTorch reference.

Written from the specification in `layerpipe.fixedpoint`'s docstring with torch operations only — it never
calls the numpy implementation (nor `layerpipe.sim`), so that the reference and the functional simulator
agreeing bit for bit is evidence. Window operations take different routes from the simulator's on purpose:
conv forward is torch's integer `conv2d`, its input gradient `conv_transpose2d`, its weight gradient a loop
over kernel offsets; pooling stacks the K² offset slices. Imported only when torch is (lazily).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as tf

from layerpipe.fixedpoint import FixedFormat
from layerpipe.network import Conv2d, Pool2d

__all__ = ["TorchFixed"]

_LOWEST = torch.iinfo(torch.int64).min  # max-pool padding: loses to every value


class TorchFixed:
    def __init__(self, fmt: FixedFormat) -> None:
        self.frac = fmt.frac_bits
        self.low = -(2 ** (fmt.total_bits - 1))
        self.high = 2 ** (fmt.total_bits - 1) - 1

    # -- scalar rules ---------------------------------------------------------------------------------

    def sat(self, v: torch.Tensor) -> torch.Tensor:
        return v.clamp(self.low, self.high)

    @staticmethod
    def shift_round(v: torch.Tensor, k: int) -> torch.Tensor:
        """Round half up of v / 2^k (`>>` on int64 tensors is arithmetic, i.e. floor)."""
        return v if k == 0 else (v + 2 ** (k - 1)) >> k

    def rescale(self, acc: torch.Tensor) -> torch.Tensor:
        return self.sat(self.shift_round(acc, self.frac))

    def divide(self, v: torch.Tensor, d: int) -> torch.Tensor:
        return self.sat(torch.div(2 * v + d, 2 * d, rounding_mode="floor"))

    def quantize(self, x: np.ndarray) -> torch.Tensor:
        values = torch.as_tensor(np.asarray(x))
        if not values.dtype.is_floating_point:
            return self.sat(values.to(torch.int64))
        scaled = (values.to(torch.float64) * 2.0**self.frac).clamp(self.low - 1.0, self.high + 1.0)
        whole = scaled.floor()
        rounded = whole + (scaled - whole >= 0.5).to(torch.float64)
        return rounded.clamp(self.low, self.high).to(torch.int64)

    def to_float(self, q: torch.Tensor) -> torch.Tensor:
        return q.to(torch.float64) / 2.0**self.frac

    # -- linear ---------------------------------------------------------------------------------------

    def linear(self, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        acc = a @ w.T
        return self.rescale(acc if b is None else acc + (b << self.frac))

    def linear_input_grad(self, w: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.rescale(delta @ w)

    def linear_weight_grad(self, delta: torch.Tensor, a: torch.Tensor,
                           bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        g_b = self.sat(delta.sum(dim=0)) if bias else None
        return self.rescale(delta.T @ a), g_b

    # -- conv2d ---------------------------------------------------------------------------------------

    def conv(self, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None, op: Conv2d) -> torch.Tensor:
        acc = tf.conv2d(a, w, None, op.stride, op.padding, 1, op.groups)
        if b is not None:
            acc = acc + (b << self.frac)[None, :, None, None]
        return self.rescale(acc)

    def conv_input_grad(self, w: torch.Tensor, delta: torch.Tensor, op: Conv2d, in_shape: tuple[int, ...]):
        # conv_transpose2d maps each output position back over its window; output_padding restores the
        # input rows/columns that no window's last stride step reached.
        extra = tuple((size + 2 * op.padding - op.kernel_size) % op.stride for size in in_shape[1:])
        acc = tf.conv_transpose2d(delta, w, None, op.stride, op.padding, extra, op.groups)
        return self.rescale(acc)

    def conv_weight_grad(self, delta: torch.Tensor, a: torch.Tensor,
                         op: Conv2d) -> tuple[torch.Tensor, torch.Tensor | None]:
        k, s, groups = op.kernel_size, op.stride, op.groups
        padded = tf.pad(a, (op.padding,) * 4)
        out_ch, in_ch = delta.shape[1], a.shape[1]
        og, cg = out_ch // groups, in_ch // groups
        acc = torch.zeros((out_ch, cg, k, k), dtype=torch.int64)
        ho, wo = delta.shape[2], delta.shape[3]
        for i in range(k):
            for j in range(k):
                seen = padded[:, :, i : i + s * (ho - 1) + 1 : s, j : j + s * (wo - 1) + 1 : s]
                for g in range(groups):
                    acc[g * og : (g + 1) * og, :, i, j] = torch.einsum(
                        "bohw,bchw->oc", delta[:, g * og : (g + 1) * og], seen[:, g * cg : (g + 1) * cg]
                    )
        g_b = self.sat(delta.sum(dim=(0, 2, 3))) if op.bias else None
        return self.rescale(acc), g_b

    # -- pooling --------------------------------------------------------------------------------------

    @staticmethod
    def _offsets(op: Pool2d, ho: int, wo: int):
        k, s = op.kernel_size, op.effective_stride
        for i in range(k):
            for j in range(k):
                yield (
                    i * k + j,
                    (slice(None), slice(None), slice(i, i + s * (ho - 1) + 1, s), slice(j, j + s * (wo - 1) + 1, s)),
                )

    @staticmethod
    def _out(size: int, op: Pool2d) -> int:
        return (size + 2 * op.padding - op.kernel_size) // op.effective_stride + 1

    def pool(self, a: torch.Tensor, op: Pool2d) -> tuple[torch.Tensor, torch.Tensor | None]:
        ho, wo = self._out(a.shape[2], op), self._out(a.shape[3], op)
        fill = _LOWEST if op.mode == "max" else 0
        padded = tf.pad(a, (op.padding,) * 4, value=fill)
        stacked = torch.stack([padded[where] for _, where in self._offsets(op, ho, wo)])
        if op.mode == "max":
            values, winner = stacked.max(dim=0)  # ties: the first offset in row-major order
            return values, winner
        return self.divide(stacked.sum(dim=0), op.kernel_size**2), None

    def pool_backward(
        self, e: torch.Tensor, winner: torch.Tensor | None, op: Pool2d, in_shape: tuple[int, ...]
    ) -> torch.Tensor:
        channels, height, width = in_shape
        p = op.padding
        padded = torch.zeros((e.shape[0], channels, height + 2 * p, width + 2 * p), dtype=torch.int64)
        share = e if op.mode == "max" else self.divide(e, op.kernel_size**2)
        for q, where in self._offsets(op, e.shape[2], e.shape[3]):
            padded[where] += share * (winner == q) if winner is not None else share
        return self.sat(padded[:, :, p : p + height, p : p + width])

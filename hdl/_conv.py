"""Convolution, pooling and flatten on the processing element: the loop nests, their cycles and their values.

A window op (conv2d F / E / G, pooling F / E) runs on the PE's *window engine*: a loop-nest address generator
that issues one beat per cycle, each beat one scalar product (or compare, or add) of two elements gathered
from word memories (element n of a vector lives in word n // lanes, lane n % lanes). Every beat of the nest is
issued, also those that fall into the zero padding or, for E, between the strides of the forward (they are
masked to 0: a regular nest keeps the cycle count a closed formula). The nests, outer loops → inner
(reduction) loops, for input (C, H, W), output (O, Ho, Wo), kernel K, stride s, padding p, micro-batch B:

    conv F   b, o, h, w | c, i, j    a[b,o,h,w] = act(rescale(Σ W[o,c,i,j] · x[b, c, h·s+i−p, w·s+j−p]))
    conv E   b, c, y, x | o, i, j    e[b,c,y,x] = rescale(Σ W[o,c,i,j] · δ[b, o, (y+p−i)/s, (x+p−j)/s])
                                     (a correlation with the flipped kernel: a gather; terms whose division is
                                     not exact or falls outside the output are masked)
    conv G   o, c, i, j | b, h, w    g[o,c,i,j] = rescale(Σ δ[b,o,h,w] · x[b, c, h·s+i−p, w·s+j−p])
                                     (the micro-batch summed at full width before one rounding)
    pool F   b, c, h, w | i, j       max: the window's maximum and its first arg max (row-major), kept as the
                                     argmax mask m[b,c,h,w] = i·K+j; avg: round(Σ / K²) (K² a power of two)
    pool E   b, c, y, x | i, j       max: Σ e[b,c,h,w] over the windows (h, w) that contain (y, x) at offset
                                     (i, j) with m[b,c,h,w] = i·K+j; avg: Σ round(e[b,c,h,w] / K²); saturated

so one op takes `beats` = B · |outer| · |inner| cycles (G: |outer| · B · |inner|) plus the PE's op overhead
(`op_overhead(lanes)`), plus one cycle for max-pool F, which writes the argmax mask the cycle after its last
value. The engine multiplies on one lane: lanes widen the word memories and the linear layers' ops, not a
window op. Flatten is a copy of the (C·H·W, row-major) vector in both directions, through the same engine:
B·n beats (nest b, n | one beat). The arithmetic is `layerpipe.fixedpoint`'s (full-width sums, one rounding): the same
rules as the integer reference (`layerpipe._torch_fixed`) and the functional simulator (`sim/_conv.py`).

`nest(window)` gives the beats as index tables (what the address generator computes, beat by beat);
`run_window` executes them on element arrays (the microcode model's semantics of the op).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from layerpipe._rtl_costs import Window, copy_window, flatten_cycles, window_cycles, window_of
from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat
from layerpipe.network import Conv2d, Layer, Pool2d

__all__ = ["Nest", "Window", "check_window_layer", "copy_window", "flatten_cycles", "matrix_shape", "nest",
           "run_window", "window_cycles", "window_of"]

@dataclass(frozen=True)
class Nest:
    """The beats of a window op as tables of shape (outputs, reduction): what the address generator issues.

    `p` and `q` are the two operands' element indices (vectors: (sample, element); conv weights: (row o, column
    c·K·K + i·K + j)), `valid` masks padding and stride holes, `tap` is the window offset i·K+j of pooling
    beats; outputs are (sample, element) of the result in issue order (G: (row, column) of g)."""

    p: tuple[np.ndarray, np.ndarray]
    q: tuple[np.ndarray, np.ndarray]
    valid: np.ndarray
    tap: np.ndarray
    out: tuple[np.ndarray, np.ndarray]


def nest(window: Window) -> Nest:
    """The beats of `window`'s loop nest (see the module docstring), as index tables."""
    wd = window
    k, s, p = wd.kernel, wd.stride, wd.padding
    if wd.op == "copy":
        b, n = (g.reshape(-1, 1) for g in np.meshgrid(np.arange(wd.batch), np.arange(wd.in_elements), indexing="ij"))
        return Nest((b, n), (b, n), np.ones_like(b, dtype=bool), np.zeros_like(b), (b[:, 0], n[:, 0]))
    if wd.op == "conv_g":
        grid = np.meshgrid(*(np.arange(n) for n in (*wd.outer, *wd.inner)), indexing="ij")
        o, c, i, j, b, h, w = (g.reshape(math.prod(wd.outer), wd.reduction) for g in grid)
        row, col = h * s + i - p, w * s + j - p
        valid = (row >= 0) & (row < wd.height) & (col >= 0) & (col < wd.width)
        x_el = (c * wd.height + row.clip(0, wd.height - 1)) * wd.width + col.clip(0, wd.width - 1)
        delta = (o * wd.out_h + h) * wd.out_w + w
        cij = (c * k + i) * k + j
        return Nest((b, delta), (b, x_el), valid, i * k + j, (o[:, 0], cij[:, 0]))
    grid = np.meshgrid(*(np.arange(n) for n in (wd.batch, *wd.outer, *wd.inner)), indexing="ij")
    rows = wd.batch * math.prod(wd.outer)
    b, a0, a1, a2, *red = (g.reshape(rows, wd.reduction) for g in grid)
    if wd.op in ("conv_f", "pool_f"):
        c, i, j = (red[0], red[1], red[2]) if wd.op == "conv_f" else (a0, red[0], red[1])
        h, w = a1, a2
        row, col = h * s + i - p, w * s + j - p
        valid = (row >= 0) & (row < wd.height) & (col >= 0) & (col < wd.width)
        x_el = (c * wd.height + row.clip(0, wd.height - 1)) * wd.width + col.clip(0, wd.width - 1)
        out_el = (a0 * wd.out_h + h) * wd.out_w + w
        if wd.op == "conv_f":
            return Nest((b, x_el), (a0, (c * k + i) * k + j), valid, i * k + j, (b[:, 0], out_el[:, 0]))
        return Nest((b, x_el), (b, out_el), valid, i * k + j, (b[:, 0], out_el[:, 0]))
    # E of conv and pooling: input position (c, y, x) gathers from the outputs whose window holds it.
    y, x = a1, a2
    if wd.op == "conv_e":
        o, i, j = red
        c = a0
    else:
        i, j = red
        c = o = a0
    row, col = y + p - i, x + p - j
    valid = (row >= 0) & (row % s == 0) & (row // s < wd.out_h) & (col >= 0) & (col % s == 0) & (col // s < wd.out_w)
    h, w = (row // s).clip(0, wd.out_h - 1), (col // s).clip(0, wd.out_w - 1)
    out_el = (o * wd.out_h + h) * wd.out_w + w
    in_el = (a0 * wd.height + y) * wd.width + x
    if wd.op == "conv_e":
        return Nest((b, out_el), (o, (c * k + i) * k + j), valid, i * k + j, (b[:, 0], in_el[:, 0]))
    return Nest((b, out_el), (b, out_el), valid, i * k + j, (b[:, 0], in_el[:, 0]))


def _log2_exact(value: int, what: str) -> int:
    shift = value.bit_length() - 1
    if value != 1 << shift:
        raise InputError(f"{what}: average pooling over a {value}-element window needs a power-of-two window "
                         "(the PE divides by shifting)")
    return shift


def run_window(window: Window, fmt: FixedFormat, p_operand: np.ndarray, q_operand: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Execute a window op beat by beat on element arrays; returns (result, argmax mask or None).

    Operands by op: conv F (x (B, C·H·W), W (O, C·K·K)); conv E (δ (B, O·Ho·Wo), W); conv G (δ, x); pool F (x);
    pool E (e (B, C·Ho·Wo), mask (B, C·Ho·Wo) for max). Results: (B, n) vectors, G an (O, C·K·K) matrix."""
    beats = nest(window)
    first = np.asarray(p_operand, dtype=np.int64)[beats.p]
    if window.op == "copy":
        return np.asarray(p_operand, dtype=np.int64).copy(), None
    shape = (window.out_channels, window.taps) if window.op == "conv_g" else (window.batch, -1)
    n_out = window.out_elements if window.op in ("conv_f", "pool_f") else window.in_elements
    out = np.zeros((window.batch, n_out) if window.op != "conv_g" else shape, dtype=np.int64)
    if window.op.startswith("conv"):
        assert q_operand is not None
        second = np.asarray(q_operand, dtype=np.int64)[beats.q]
        acc = np.where(beats.valid, first * second, 0).sum(axis=1)
        values = fmt.rescale(acc)
        if window.relu:
            values = np.maximum(values, 0)
        out[beats.out] = values
        return out, None
    if window.op == "pool_f":
        if window.mode == "max":
            lowest = np.iinfo(np.int64).min
            masked = np.where(beats.valid, first, lowest)
            winner = masked.argmax(axis=1)  # the first maximum in issue (row-major window) order
            out[beats.out] = masked.max(axis=1)
            mask = np.zeros_like(out)
            mask[beats.out] = beats.tap[np.arange(len(winner)), winner]
            return out, mask
        shift = _log2_exact(window.kernel**2, "pool")
        out[beats.out] = fmt.saturate(_round_shift(np.where(beats.valid, first, 0).sum(axis=1), shift))
        return out, None
    # pool E
    if window.mode == "max":
        assert q_operand is not None
        won = beats.valid & (np.asarray(q_operand, dtype=np.int64)[beats.q] == beats.tap)
        out[beats.out] = fmt.saturate(np.where(won, first, 0).sum(axis=1))
        return out, None
    shift = _log2_exact(window.kernel**2, "pool")
    out[beats.out] = fmt.saturate(np.where(beats.valid, _round_shift(first, shift), 0).sum(axis=1))
    return out, None


def _round_shift(values: np.ndarray, shift: int) -> np.ndarray:
    """(v + 2^(shift−1)) >> shift: round half up, as `fixedpoint` (and the reference's divide by 2^shift)."""
    return values if shift == 0 else (values + (1 << (shift - 1))) >> shift


def matrix_shape(layer: Layer) -> tuple[int, int]:
    """(rows, cols) of a weight layer's W as the PE stores it: linear (n_out, n_in), conv2d (O, C·K·K)."""
    if isinstance(layer.op, Conv2d):
        return layer.out_shape[0], layer.in_shapes[0][0] * layer.op.kernel_size ** 2
    return layer.out_size, layer.in_size


def check_window_layer(layer: Layer, last: bool) -> None:
    """Refuse, in one line, a conv2d / pooling / flatten layer the window engine cannot run."""
    op = layer.op
    if last:
        raise InputError(f"the RTL needs a linear output layer; layer '{layer.name}' is {layer.kind}")
    if isinstance(op, Conv2d):
        if op.groups != 1:
            raise InputError(f"the RTL runs conv2d with groups = 1; layer '{layer.name}' has groups={op.groups}")
        if len(layer.inputs) != 1:
            raise InputError(f"the RTL runs chains; layer '{layer.name}' reads {len(layer.inputs)} inputs")
    elif isinstance(op, Pool2d):
        if layer.takes_network_input:
            raise InputError(f"the RTL runs pooling on a layer's output, not on the network input "
                             f"(layer '{layer.name}')")
        if op.mode == "avg":
            _log2_exact(op.kernel_size**2, f"layer '{layer.name}'")
        elif op.kernel_size < 2:
            raise InputError(f"the RTL runs max pooling over windows of at least 2x2; layer '{layer.name}' has "
                             f"kernel_size={op.kernel_size}")
    elif layer.kind == "flatten":
        if layer.takes_network_input:
            raise InputError(f"the RTL flattens a layer's output, not the network input (layer '{layer.name}')")
    else:
        raise InputError(f"the RTL runs linear, conv2d, pooling and flatten layers; layer '{layer.name}' is "
                         f"{layer.kind}")

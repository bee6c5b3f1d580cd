"""Window arithmetic of conv2d and pooling on numpy arrays, exact sums for either number representation.

Every function returns raw sums: for float64 arrays the real values, for int64 fixed-point arrays the
full-width accumulators that `_arith.FixedArithmetic` then rescales once (the rule of
`layerpipe.fixedpoint`: products and their sums at full width, one rounding at the end). Arrays are batch
first, (B, C, H, W); weights (O, C / groups, K, K); zero padding for conv and average pooling (torch's
count_include_pad), padding that never wins for max pooling. Window positions are scanned row-major, and
max pooling routes the error to the first maximal position of a window (torch's CPU kernel does the same).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "conv_forward_sum",
    "conv_input_sum",
    "conv_weight_sum",
    "out_size",
    "pool_backward",
    "pool_forward",
]


def out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _pad(x: np.ndarray, padding: int, value: float | int = 0) -> np.ndarray:
    if padding == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=value)


def _windows(x: np.ndarray, kernel: int, stride: int, padding: int, value: float | int = 0) -> np.ndarray:
    """(B, C, Ho, Wo, K, K) view of the padded input's windows."""
    ho, wo = out_size(x.shape[2], kernel, stride, padding), out_size(x.shape[3], kernel, stride, padding)
    view = sliding_window_view(_pad(x, padding, value), (kernel, kernel), axis=(2, 3))
    return view[:, :, ::stride, ::stride][:, :, :ho, :wo]


def _offset_slices(kernel: int, stride: int, ho: int, wo: int) -> Iterator[tuple[int, int, tuple[slice, ...]]]:
    """For each kernel offset (i, j): the padded-input positions its column of windows touches."""
    for i in range(kernel):
        for j in range(kernel):
            yield (
                i,
                j,
                (
                    slice(None),
                    slice(None),
                    slice(i, i + stride * (ho - 1) + 1, stride),
                    slice(j, j + stride * (wo - 1) + 1, stride),
                ),
            )


def conv_forward_sum(x: np.ndarray, weights: np.ndarray, stride: int, padding: int, groups: int) -> np.ndarray:
    """z_sum[b, o, h, w] = Σ_{c, i, j} W[o, c, i, j] · x_pad[b, g(o)·C/g + c, h·s + i, w·s + j]."""
    windows = _windows(x, weights.shape[2], stride, padding)
    cg, og = x.shape[1] // groups, weights.shape[0] // groups
    parts = [
        np.einsum("bchwij,ocij->bohw", windows[:, g * cg : (g + 1) * cg], weights[g * og : (g + 1) * og])
        for g in range(groups)
    ]
    return np.concatenate(parts, axis=1)


def conv_weight_sum(
    delta: np.ndarray, x: np.ndarray, kernel: int, stride: int, padding: int, groups: int
) -> np.ndarray:
    """g_sum[o, c, i, j] = Σ_{b, h, w} δ[b, o, h, w] · x_pad[b, g(o)·C/g + c, h·s + i, w·s + j]."""
    windows = _windows(x, kernel, stride, padding)
    cg, og = x.shape[1] // groups, delta.shape[1] // groups
    parts = [
        np.einsum("bohw,bchwij->ocij", delta[:, g * og : (g + 1) * og], windows[:, g * cg : (g + 1) * cg])
        for g in range(groups)
    ]
    return np.concatenate(parts, axis=0)


def conv_input_sum(
    delta: np.ndarray, weights: np.ndarray, in_shape: tuple[int, ...], stride: int, padding: int, groups: int
) -> np.ndarray:
    """e_sum[b, c, y, x] = Σ over every (o, h, w, i, j) whose window reads input (c, y, x) of W[o, c', i, j]·δ."""
    batch, (channels, height, width) = delta.shape[0], in_shape
    kernel = weights.shape[2]
    ho, wo = delta.shape[2], delta.shape[3]
    cg, og = channels // groups, weights.shape[0] // groups
    padded = np.zeros((batch, channels, height + 2 * padding, width + 2 * padding), dtype=delta.dtype)
    for i, j, where in _offset_slices(kernel, stride, ho, wo):
        for g in range(groups):
            # contribution of offset (i, j): Σ_o δ[b, o, h, w] · W[o, c, i, j]
            part = np.einsum("bohw,oc->bchw", delta[:, g * og : (g + 1) * og], weights[g * og : (g + 1) * og, :, i, j])
            padded[:, g * cg : (g + 1) * cg, where[2], where[3]] += part
    return padded[:, :, padding : padding + height, padding : padding + width]


def pool_forward(x: np.ndarray, mode: str, kernel: int, stride: int, padding: int) -> tuple[np.ndarray, np.ndarray]:
    """(window max, first arg max in row-major window order) for `max`; (window sum, unused) for `avg`."""
    if mode == "max":
        lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(np.int64).min
        windows = _windows(x, kernel, stride, padding, lowest)
        flat = windows.reshape(*windows.shape[:4], kernel * kernel)
        return flat.max(axis=-1), flat.argmax(axis=-1)
    windows = _windows(x, kernel, stride, padding)
    return windows.sum(axis=(-2, -1)), np.empty(0, dtype=np.int64)


def pool_backward(
    share: np.ndarray, argmax: np.ndarray, mode: str, in_shape: tuple[int, ...], kernel: int, stride: int, padding: int
) -> np.ndarray:
    """Σ over the windows that contain each input position of what each window sends it: `share` to the
    arg max (max pooling) or to every position (average pooling, `share` already divided by K²)."""
    batch, (channels, height, width) = share.shape[0], in_shape
    ho, wo = share.shape[2], share.shape[3]
    padded = np.zeros((batch, channels, height + 2 * padding, width + 2 * padding), dtype=share.dtype)
    for i, j, where in _offset_slices(kernel, stride, ho, wo):
        padded[where] += np.where(argmax == i * kernel + j, share, 0) if mode == "max" else share
    return padded[:, :, padding : padding + height, padding : padding + width]

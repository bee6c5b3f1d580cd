"""The `rtl` cost model: the closed per-op cycle formula of the processing element.

Each atomic task of a fully connected layer is one PE command (see `hdl/_pe.py`), busy for
B·rows·⌈cols/lanes⌉ + op_overhead(lanes) cycles (`op_cycles`; 10 up to 4 lanes) on a micro-batch of B samples:

    F, E, G      rows = n_out, cols = n_in        (a matrix walk of W or δaᵀ per sample; G sums over B)
    U            rows = n_out, cols = n_in, B = 1 (one update per micro-batch)
    A            rows = 1,     cols = n_out       (an elementwise pass over B vectors)

A layer reading a split layer's parts as one concatenation (`hdl/_split.py`) stores each part padded to whole
words: its F, E, G, U walk Σ_j ⌈r_j/lanes⌉ words per row instead of ⌈n_in/lanes⌉ (`padded_cols`).

Conv2d and pooling layers run F, E (and conv G) on the window engine (`hdl/_conv.py`): the loop nest's beats
plus the overhead (`window_cycles`); conv A and U are the vector and matrix walks above over the flattened
output (O·Ho·Wo elements) and weights (O rows of C·K·K); flatten's F and E copy B vectors on the window
engine, one element per beat (B·n beats).

The unit benches check that the hardware takes exactly these cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerpipe.errors import InputError
from layerpipe.hdl._conv import flatten_cycles, window_cycles, window_of
from layerpipe.hdl._pe import MAX_BATCH, MAX_LANES, op_cycles
from layerpipe.network import Layer

__all__ = ["RTLCostModel", "conv_task_cost", "padded_cols", "task_shape"]


def task_shape(layer: Layer, kind: str) -> tuple[int, int]:
    """(rows, cols) of the PE command that runs atomic task `kind` of `layer`."""
    if layer.kind != "linear":
        raise InputError(f"the rtl cost model covers linear, conv2d, pooling and flatten layers; layer "
                         f"'{layer.name}' is {layer.kind}")
    if kind == "A":
        return 1, layer.out_size
    if kind in "FEGU" and len(kind) == 1:
        return layer.out_size, layer.in_size
    raise ValueError(f"atomic task kind must be one of F, A, E, G, U, got {kind!r}")


@dataclass(frozen=True)
class RTLCostModel:
    """Cycles of one atomic task on a PE of `lanes` multipliers, for a micro-batch of `batch` samples."""

    lanes: int = 4
    name: str = "rtl"

    def __post_init__(self) -> None:
        if not isinstance(self.lanes, int) or isinstance(self.lanes, bool) or self.lanes < 1:
            raise InputError(f"lanes must be >= 1, got {self.lanes}")
        if self.lanes > MAX_LANES:
            raise InputError(f"lanes must be <= {MAX_LANES}, got {self.lanes}")

    def atomic_cost(self, layer: Layer, kind: str, batch: int) -> int:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
            raise InputError(f"the rtl cost model takes a micro-batch of 1..{MAX_BATCH} samples, got batch {batch}")
        if layer.kind in ("conv2d", "pool", "flatten"):
            return conv_task_cost(layer, kind, batch, self.lanes)
        rows, cols = task_shape(layer, kind)
        if kind != "A":
            cols = padded_cols(layer, self.lanes)
        return op_cycles(rows, cols, self.lanes, 1 if kind == "U" else batch)


def padded_cols(layer: Layer, lanes: int) -> int:
    """Columns of W as the PE stores it: n_in, or, for several inputs read as one concatenation, each input
    padded to whole words of `lanes` elements."""
    if len(layer.in_shapes) == 1:
        return layer.in_size
    return lanes * sum(-(-math.prod(shape) // lanes) for shape in layer.in_shapes)


def conv_task_cost(layer: Layer, kind: str, batch: int, lanes: int) -> int:
    """Cycles of atomic task `kind` of a conv2d, pooling or flatten layer (see the module docstring)."""
    if kind not in "FAEGU" or len(kind) != 1:
        raise ValueError(f"atomic task kind must be one of F, A, E, G, U, got {kind!r}")
    if layer.kind == "flatten":
        if kind not in "FE":
            raise ValueError(f"a flatten layer has F and E tasks only, got {kind!r}")
        return flatten_cycles(layer.out_size, lanes, batch)
    if layer.kind == "conv2d" and kind in "AU":
        (c, _, _), op = layer.in_shapes[0], layer.op
        taps = c * op.kernel_size ** 2  # type: ignore[union-attr]
        return op_cycles(1, layer.out_size, lanes, batch) if kind == "A" else op_cycles(layer.out_shape[0], taps, lanes)
    return window_cycles(window_of(layer, kind, batch), lanes)

"""The `rtl` cost model: the closed per-op cycle formula of the generated processing element.

The formula lives here, on the cost layer, with the few structural constants of the hardware it follows (the
datapath's pipeline depth, the PE's front stages, the window ops' geometry), so that `layerpipe.costs` and the
schedulers need neither amaranth nor anything above the schedule layer. `layerpipe.hdl` builds its PE from
these constants (`hdl/_datapath.py`, `hdl/_pe.py`, `hdl/_conv.py` import them), and its unit benches check
that the hardware takes exactly these cycles.

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

"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerpipe.errors import InputError
from layerpipe.network import Conv2d, Layer, Pool2d

__all__ = [
    "FRONT_STAGES",
    "MAX_BATCH",
    "MAX_LANES",
    "WINDOW_OPS",
    "RTLCostModel",
    "Window",
    "conv_task_cost",
    "copy_window",
    "flatten_cycles",
    "latency",
    "op_cycles",
    "op_overhead",
    "padded_cols",
    "task_shape",
    "tree_levels",
    "tree_stages",
    "window_cycles",
    "window_of",
]

# -- the datapath's pipeline (hdl/_datapath.py) -------------------------------------------------------------

#: Adder-tree levels per pipeline stage (two carry chains of the product width fit a 10 ns cycle on ECP5).
TREE_LEVELS_PER_STAGE = 2


def tree_levels(lanes: int) -> int:
    """Levels of the balanced adder tree over `lanes` products: ⌈log2 lanes⌉."""
    return max(0, (lanes - 1).bit_length())


def tree_stages(lanes: int) -> int:
    """Pipeline stages of the adder tree (at least one: the stage also selects each lane's addend)."""
    return max(1, -(-tree_levels(lanes) // TREE_LEVELS_PER_STAGE))


def latency(lanes: int) -> int:
    """Cycles from a beat's operands on the datapath's inputs (D0) to its result on `out_data`."""
    return 5 + tree_stages(lanes)


# -- the processing element's op timing (hdl/_pe.py) --------------------------------------------------------

#: Cycles from a beat's issue (S0) to its operands on the datapath's inputs: address registers (1), memory
#: read (1), read-data registers (1).
FRONT_STAGES = 3
MAX_LANES = 256
MAX_BATCH = 256  #: largest micro-batch of one op, in samples (the command's batch field)


def op_overhead(lanes: int) -> int:
    """Cycles an op takes beyond its beats on a PE of `lanes` multipliers: accept (1) + the front of the
    pipeline (`FRONT_STAGES`) + the datapath (`latency(lanes)`: 6 up to 4 lanes, one more per two adder-tree
    levels beyond)."""
    return 1 + FRONT_STAGES + latency(lanes)


def op_cycles(rows: int, cols: int, lanes: int, batch: int = 1) -> int:
    """Cycles the PE is busy with one op over a rows × cols operand (A: rows = 1, cols = n) for `batch`
    samples (U: batch 1, it runs once per micro-batch)."""
    return batch * rows * math.ceil(cols / lanes) + op_overhead(lanes)


# -- the window engine's ops (hdl/_conv.py) ------------------------------------------------------------------

#: The op kinds of the window engine (copy: flatten's F and E, one element per beat).
WINDOW_OPS = ("conv_f", "conv_e", "conv_g", "pool_f", "pool_e", "copy")


@dataclass(frozen=True)
class Window:
    """The geometry of one window op: input (channels, height, width), output (out_channels, out_h, out_w)."""

    op: str  #: one of WINDOW_OPS
    channels: int
    height: int
    width: int
    out_channels: int
    out_h: int
    out_w: int
    kernel: int
    stride: int
    padding: int
    mode: str = ""  #: pooling: "max" or "avg"
    relu: bool = False  #: conv F of a ReLU layer
    batch: int = 1

    @property
    def in_elements(self) -> int:
        return self.channels * self.height * self.width

    @property
    def out_elements(self) -> int:
        return self.out_channels * self.out_h * self.out_w

    @property
    def taps(self) -> int:
        """C·K·K: the columns of a conv layer's weight matrix (row o = W[o] flattened)."""
        return self.channels * self.kernel * self.kernel

    @property
    def outer(self) -> tuple[int, ...]:
        """Counts of the output loops (without the batch, which is outermost except for G)."""
        k = self.kernel
        return {"conv_f": (self.out_channels, self.out_h, self.out_w),
                "conv_e": (self.channels, self.height, self.width),
                "conv_g": (self.out_channels, self.channels, k, k),
                "pool_f": (self.channels, self.out_h, self.out_w),
                "pool_e": (self.channels, self.height, self.width),
                "copy": (self.in_elements,)}[self.op]

    @property
    def inner(self) -> tuple[int, ...]:
        """Counts of the reduction loops (G: the batch is its outermost reduction loop)."""
        k = self.kernel
        return {"conv_f": (self.channels, k, k), "conv_e": (self.out_channels, k, k),
                "conv_g": (self.batch, self.out_h, self.out_w), "pool_f": (k, k), "pool_e": (k, k),
                "copy": (1,)}[self.op]

    @property
    def reduction(self) -> int:
        return math.prod(self.inner)

    @property
    def beats(self) -> int:
        """Beats of the whole op (every sample of the micro-batch)."""
        samples = 1 if self.op == "conv_g" else self.batch
        return samples * math.prod(self.outer) * self.reduction

    @property
    def extra_cycles(self) -> int:
        """Cycles after the last value's write: max-pool F writes its argmax mask word one cycle later."""
        return 1 if self.op == "pool_f" and self.mode == "max" else 0


def window_of(layer: Layer, kind: str, batch: int) -> Window:
    """The window op that runs atomic task `kind` (F, E or G) of a conv2d or pooling layer."""
    op = layer.op
    (c, h, w), (o, ho, wo) = layer.in_shapes[0], layer.out_shape
    if isinstance(op, Conv2d):
        if kind not in "FEG" or len(kind) != 1:
            raise ValueError(f"a conv2d layer's window ops are F, E, G, got {kind!r}")
        return Window(f"conv_{kind.lower()}", c, h, w, o, ho, wo, op.kernel_size, op.stride, op.padding,
                      relu=kind == "F" and op.activation == "relu", batch=batch)
    if isinstance(op, Pool2d):
        if kind not in "FE" or len(kind) != 1:
            raise ValueError(f"a pooling layer's window ops are F, E, got {kind!r}")
        return Window(f"pool_{kind.lower()}", c, h, w, o, ho, wo, op.kernel_size, op.effective_stride, op.padding,
                      mode=op.mode, batch=batch)
    raise InputError(f"layer '{layer.name}' is {layer.kind}, not a conv2d or pooling layer")


def window_cycles(window: Window, lanes: int) -> int:
    """Cycles the PE is busy with a window op: its beats, the op overhead, the mask write of max pooling."""
    return window.beats + op_overhead(lanes) + window.extra_cycles


def copy_window(elements: int, batch: int) -> Window:
    """Flatten's F or E: a copy of B vectors of `elements` (C·H·W row-major is already the flat order)."""
    return Window("copy", elements, 1, 1, elements, 1, 1, 1, 1, 0, batch=batch)


def flatten_cycles(elements: int, lanes: int, batch: int) -> int:
    """Cycles of flatten's F or E: the window engine's copy, one element per beat."""
    return window_cycles(copy_window(elements, batch), lanes)


# -- the cost model --------------------------------------------------------------------------------------------

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

"""Layer operations and their shape rules.

Each operation is a small frozen dataclass; the network graph (`_graph.py`) holds them with their inputs.
Shapes are per sample: `(features,)` for vectors, `(channels, height, width)` for feature maps. The
micro-batch size B is a property of the network, not of a layer.

Linear, conv2d and add carry a fused activation: in the design notes' terms a layer computes
z = op(inputs) and a = f(z); A_l is the activation backward δ = e ⊙ f'(z). Linear and conv2d read several
inputs as their concatenation (features, or channels), which is how the consumer of a layer split by
`split_layer` (`_split.py`) reads the parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from layerpipe.errors import InputError

ACTIVATIONS: tuple[str, ...] = ("identity", "relu", "sigmoid", "tanh")

Shape = tuple[int, ...]


def _check_activation(activation: str, where: str) -> None:
    if activation not in ACTIVATIONS:
        raise InputError(f"{where}: activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")


def concat_width(in_shapes: list[Shape]) -> int:
    """The leading size of the inputs' concatenation: features of flat inputs, channels of feature maps."""
    return sum(shape[0] for shape in in_shapes)


def _positive(value: int, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{field} must be a positive integer, got {value!r}")


def _non_negative(value: int, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{field} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class Linear:
    """Fully connected: z = W a (+ b), W of shape (out_features, in_features)."""

    out_features: int
    bias: bool = False
    activation: str = "identity"
    kind: ClassVar[str] = "linear"
    has_weights: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _positive(self.out_features, "linear.out_features")
        _check_activation(self.activation, "linear")

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        # Several inputs mean their concatenation (the consumer of a split layer, `split_layer`).
        for shape in in_shapes:
            if len(shape) != 1:
                raise InputError(f"{where}: linear needs a flat input, got shape {shape} (add a flatten layer)")
        return (self.out_features,)

    def weight_count(self, in_shapes: list[Shape]) -> int:
        return concat_width(in_shapes) * self.out_features + (self.out_features if self.bias else 0)

    def macs(self, in_shapes: list[Shape]) -> int:
        """MACs of one forward pass for one sample."""
        return concat_width(in_shapes) * self.out_features


@dataclass(frozen=True)
class Conv2d:
    """2-D convolution, square kernel, zero padding."""

    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    groups: int = 1
    bias: bool = False
    activation: str = "identity"
    kind: ClassVar[str] = "conv2d"
    has_weights: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _positive(self.out_channels, "conv2d.out_channels")
        _positive(self.kernel_size, "conv2d.kernel_size")
        _positive(self.stride, "conv2d.stride")
        _non_negative(self.padding, "conv2d.padding")
        _positive(self.groups, "conv2d.groups")
        _check_activation(self.activation, "conv2d")

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        # Several inputs mean their concatenation along channels (the consumer of a split layer).
        for shape in in_shapes:
            if len(shape) != 3:
                raise InputError(f"{where}: conv2d needs a (channels, height, width) input, got shape {shape}")
        if len(in_shapes) > 1:
            if len({s[1:] for s in in_shapes}) > 1:
                shapes = ", ".join(str(s) for s in in_shapes)
                raise InputError(f"{where}: conv2d inputs are concatenated by channels and must share height and "
                                 f"width, got {shapes}")
            if self.groups != 1:
                raise InputError(f"{where}: conv2d with several (concatenated) inputs needs groups=1, "
                                 f"got {self.groups}")
        c, (h, w) = concat_width(in_shapes), in_shapes[0][1:]
        if c % self.groups or self.out_channels % self.groups:
            raise InputError(f"{where}: conv2d.groups={self.groups} must divide in ({c}) and out channels")
        ho = (h + 2 * self.padding - self.kernel_size) // self.stride + 1
        wo = (w + 2 * self.padding - self.kernel_size) // self.stride + 1
        if ho < 1 or wo < 1:
            raise InputError(f"{where}: conv2d kernel {self.kernel_size} does not fit input {h}x{w}")
        return (self.out_channels, ho, wo)

    def weight_count(self, in_shapes: list[Shape]) -> int:
        c = concat_width(in_shapes)
        k2 = self.kernel_size * self.kernel_size
        return self.out_channels * (c // self.groups) * k2 + (self.out_channels if self.bias else 0)

    def macs(self, in_shapes: list[Shape]) -> int:
        _, ho, wo = self.out_shape(in_shapes, "conv2d")
        c = concat_width(in_shapes)
        return ho * wo * self.out_channels * (c // self.groups) * self.kernel_size * self.kernel_size


@dataclass(frozen=True)
class Pool2d:
    """Max or average pooling, square window."""

    mode: str
    kernel_size: int
    stride: int | None = None
    padding: int = 0
    kind: ClassVar[str] = "pool"
    has_weights: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.mode not in ("max", "avg"):
            raise InputError(f"pool.mode '{self.mode}' is not one of max, avg")
        _positive(self.kernel_size, "pool.kernel_size")
        if self.stride is not None:
            _positive(self.stride, "pool.stride")
        _non_negative(self.padding, "pool.padding")

    @property
    def effective_stride(self) -> int:
        return self.kernel_size if self.stride is None else self.stride

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        (shape,) = in_shapes
        if len(shape) != 3:
            raise InputError(f"{where}: {self.mode}pool needs a (channels, height, width) input, got {shape}")
        c, h, w = shape
        s = self.effective_stride
        ho = (h + 2 * self.padding - self.kernel_size) // s + 1
        wo = (w + 2 * self.padding - self.kernel_size) // s + 1
        if ho < 1 or wo < 1:
            raise InputError(f"{where}: {self.mode}pool window {self.kernel_size} does not fit input {h}x{w}")
        return (c, ho, wo)

    def weight_count(self, in_shapes: list[Shape]) -> int:
        return 0

    def macs(self, in_shapes: list[Shape]) -> int:
        """One compare/add per window element per output."""
        return math.prod(self.out_shape(in_shapes, "pool")) * self.kernel_size * self.kernel_size


@dataclass(frozen=True)
class Flatten:
    kind: ClassVar[str] = "flatten"
    has_weights: ClassVar[bool] = False

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        return (math.prod(in_shapes[0]),)

    def weight_count(self, in_shapes: list[Shape]) -> int:
        return 0

    def macs(self, in_shapes: list[Shape]) -> int:
        return 0


@dataclass(frozen=True)
class Activation:
    """A standalone elementwise activation (linear, conv2d and add can also fuse one)."""

    function: str
    kind: ClassVar[str] = "activation"
    has_weights: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_activation(self.function, "activation")

    @property
    def activation(self) -> str:
        return self.function

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        return in_shapes[0]

    def weight_count(self, in_shapes: list[Shape]) -> int:
        return 0

    def macs(self, in_shapes: list[Shape]) -> int:
        return math.prod(in_shapes[0])


@dataclass(frozen=True)
class Add:
    """Elementwise sum of two or more inputs of one shape (residual joins), with a fused activation."""

    activation: str = "identity"
    kind: ClassVar[str] = "add"
    has_weights: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_activation(self.activation, "add")

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        if len(in_shapes) < 2:
            raise InputError(f"{where}: add needs at least two inputs, got {len(in_shapes)}")
        if any(s != in_shapes[0] for s in in_shapes):
            shapes = ", ".join(str(s) for s in in_shapes)
            raise InputError(f"{where}: add inputs must have one shape, got {shapes}")
        return in_shapes[0]

    def weight_count(self, in_shapes: list[Shape]) -> int:
        return 0

    def macs(self, in_shapes: list[Shape]) -> int:
        return math.prod(in_shapes[0]) * (len(in_shapes) - 1)


LayerOp = Linear | Conv2d | Pool2d | Flatten | Activation | Add

#: Every layer type name a user may write (YAML `type:`), with the class that implements it.
LAYER_TYPES: dict[str, type] = {
    "linear": Linear,
    "conv2d": Conv2d,
    "maxpool": Pool2d,
    "avgpool": Pool2d,
    "flatten": Flatten,
    "relu": Activation,
    "identity": Activation,
    "sigmoid": Activation,
    "tanh": Activation,
    "add": Add,
}


def fused_activation(op: LayerOp) -> str:
    """The activation f applied at the end of this layer ('identity' when none)."""
    return getattr(op, "activation", "identity")

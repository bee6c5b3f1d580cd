"""Built-in networks: `mlp:784-256-128-10` specs, LeNet-5, AlexNet, VGG-16, ResNet-18 and ResNet-50.

The CNNs follow the torchvision layer shapes without batch norm and dropout (which have no weights to
pipeline in our model, or whose weights we do not model); residual networks are real DAGs whose joins are
`add` layers with a fused ReLU.
"""

from __future__ import annotations

from collections.abc import Callable

from layerpipe.errors import InputError
from layerpipe.network._graph import Network, NetworkBuilder
from layerpipe.network._ops import Add, Conv2d, Flatten, Linear, Pool2d


def mlp(widths: list[int], batch: int = 1, name: str | None = None) -> Network:
    """Linear layers without bias, ReLU between them, identity at the output (design notes §2)."""
    if len(widths) < 2:
        raise InputError(f"mlp needs at least two widths (input and output), got {widths}")
    for w in widths:
        if w < 1:
            raise InputError(f"mlp widths must be positive integers, got {w}")
    b = NetworkBuilder(name or "mlp:" + "-".join(map(str, widths)), (widths[0],), batch)
    last = len(widths) - 1
    for i, w in enumerate(widths[1:], start=1):
        b.add(f"fc{i}", Linear(w, activation="identity" if i == last else "relu"))
    return b.build()


def lenet5(batch: int = 1) -> Network:
    b = NetworkBuilder("lenet5", (1, 32, 32), batch)
    b.add("conv1", Conv2d(6, 5, activation="relu"))
    b.add("pool1", Pool2d("max", 2))
    b.add("conv2", Conv2d(16, 5, activation="relu"))
    b.add("pool2", Pool2d("max", 2))
    b.add("flatten", Flatten())
    b.add("fc1", Linear(120, activation="relu"))
    b.add("fc2", Linear(84, activation="relu"))
    b.add("fc3", Linear(10))
    return b.build()


def alexnet(batch: int = 1) -> Network:
    b = NetworkBuilder("alexnet", (3, 224, 224), batch)
    b.add("conv1", Conv2d(64, 11, stride=4, padding=2, activation="relu"))
    b.add("pool1", Pool2d("max", 3, stride=2))
    b.add("conv2", Conv2d(192, 5, padding=2, activation="relu"))
    b.add("pool2", Pool2d("max", 3, stride=2))
    b.add("conv3", Conv2d(384, 3, padding=1, activation="relu"))
    b.add("conv4", Conv2d(256, 3, padding=1, activation="relu"))
    b.add("conv5", Conv2d(256, 3, padding=1, activation="relu"))
    b.add("pool5", Pool2d("max", 3, stride=2))
    b.add("flatten", Flatten())
    b.add("fc6", Linear(4096, activation="relu"))
    b.add("fc7", Linear(4096, activation="relu"))
    b.add("fc8", Linear(1000))
    return b.build()


def vgg16(batch: int = 1) -> Network:
    b = NetworkBuilder("vgg16", (3, 224, 224), batch)
    config = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    for block, channels in enumerate(config, start=1):
        for i, c in enumerate(channels, start=1):
            b.add(f"conv{block}_{i}", Conv2d(c, 3, padding=1, activation="relu"))
        b.add(f"pool{block}", Pool2d("max", 2))
    b.add("flatten", Flatten())
    b.add("fc6", Linear(4096, activation="relu"))
    b.add("fc7", Linear(4096, activation="relu"))
    b.add("fc8", Linear(1000))
    return b.build()


def _resnet(name: str, blocks: list[int], bottleneck: bool, batch: int) -> Network:
    b = NetworkBuilder(name, (3, 224, 224), batch)
    b.add("conv1", Conv2d(64, 7, stride=2, padding=3, activation="relu"))
    b.add("pool1", Pool2d("max", 3, stride=2, padding=1))
    prev, channels = "pool1", 64
    expansion = 4 if bottleneck else 1
    for stage, count in enumerate(blocks, start=1):
        width = 64 * 2 ** (stage - 1)
        for block in range(count):
            stride = 2 if stage > 1 and block == 0 else 1
            p = f"layer{stage}.{block}"
            if bottleneck:
                b.add(f"{p}.conv1", Conv2d(width, 1, activation="relu"), [prev])
                b.add(f"{p}.conv2", Conv2d(width, 3, stride=stride, padding=1, activation="relu"))
                b.add(f"{p}.conv3", Conv2d(width * expansion, 1))
            else:
                b.add(f"{p}.conv1", Conv2d(width, 3, stride=stride, padding=1, activation="relu"), [prev])
                b.add(f"{p}.conv2", Conv2d(width, 3, padding=1))
            main = f"{p}.conv3" if bottleneck else f"{p}.conv2"
            shortcut = prev
            if stride != 1 or channels != width * expansion:
                shortcut = f"{p}.downsample"
                b.add(shortcut, Conv2d(width * expansion, 1, stride=stride), [prev])
            b.add(f"{p}.add", Add(activation="relu"), [main, shortcut])
            prev, channels = f"{p}.add", width * expansion
    b.add("avgpool", Pool2d("avg", 7), [prev])
    b.add("flatten", Flatten())
    b.add("fc", Linear(1000))
    return b.build()


def resnet18(batch: int = 1) -> Network:
    return _resnet("resnet18", [2, 2, 2, 2], bottleneck=False, batch=batch)


def resnet50(batch: int = 1) -> Network:
    return _resnet("resnet50", [3, 4, 6, 3], bottleneck=True, batch=batch)


ZOO: dict[str, Callable[[int], Network]] = {
    "lenet5": lenet5,
    "alexnet": alexnet,
    "vgg16": vgg16,
    "resnet18": resnet18,
    "resnet50": resnet50,
}


def parse_mlp_spec(spec: str, batch: int = 1) -> Network:
    body = spec.split(":", 1)[1]
    try:
        widths = [int(part) for part in body.split("-")]
    except ValueError:
        raise InputError(f"network spec '{spec}': mlp widths must be integers like mlp:784-256-10") from None
    return mlp(widths, batch, name=spec)

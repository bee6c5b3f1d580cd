"""Every zoo network equals what PyTorch computes for the same network written with `torch.nn` layers.

Each zoo network is rewritten here as a plain `nn.Module` (no torchvision), in a different style per
network so that the fx importer's module, function and method paths are all exercised. The modules are
built on the meta device (no weight memory, no init time). For every network:
- importing it through `from_torch` gives the zoo network layer for layer (type, fused activation,
  inputs, shapes, weights, MACs);
- every layer's output shape equals the shape torch propagates (fx `ShapeProp` on meta tensors);
- every weight layer's MACs and weight count equal a count made from the torch module's own attributes
  and torch's output shape (Linear in·out; Conv2d Cout·Cin/groups·K²·Ho·Wo).
"""

from __future__ import annotations

import itertools
import math
import re

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from torch.fx.passes.shape_prop import ShapeProp  # noqa: E402

from layerpipe.network import ZOO, Network, from_torch, mlp  # noqa: E402

# ------------------------------------------------------------------------------------------ torch models


class TorchMLP(nn.Module):
    """nn.Sequential of Linear/ReLU, the zoo's mlp:... spec."""

    def __init__(self, widths: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(widths)):
            layers.append(nn.Linear(a, b, bias=False))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


class TorchLeNet5(nn.Module):
    """Functional style: F.relu, F.max_pool2d-free (pool modules), torch.flatten."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, bias=False)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5, bias=False)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(400, 120, bias=False)
        self.fc2 = nn.Linear(120, 84, bias=False)
        self.fc3 = nn.Linear(84, 10, bias=False)

    def forward(self, x):
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x), inplace=True)
        x = self.fc2(x).relu()
        return self.fc3(x)


class TorchAlexNet(nn.Module):
    """torchvision's layout (features / flatten / classifier) without dropout and biases."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2, bias=False), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(64, 192, 5, padding=2, bias=False), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(192, 384, 3, padding=1, bias=False), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1, bias=False), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1, bias=False), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(256 * 6 * 6, 4096, bias=False), nn.ReLU(inplace=True),
            nn.Linear(4096, 4096, bias=False), nn.ReLU(inplace=True),
            nn.Linear(4096, 1000, bias=False),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class TorchVGG16(nn.Module):
    """Configuration-list style, with an nn.Identity that the importer must see through."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for block in [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]:
            for c in block:
                layers += [nn.Conv2d(channels, c, 3, padding=1, bias=False), nn.Identity(), nn.ReLU()]
                channels = c
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        self.features = nn.Sequential(*layers)
        self.fc6 = nn.Linear(512 * 7 * 7, 4096, bias=False)
        self.fc7 = nn.Linear(4096, 4096, bias=False)
        self.fc8 = nn.Linear(4096, 1000, bias=False)

    def forward(self, x):
        x = self.features(x).flatten(1)
        return self.fc8(torch.relu(self.fc7(torch.relu(self.fc6(x)))))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock without batch norm: one ReLU module used twice, `out += identity`."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Conv2d(cin, width, 1, stride=stride, bias=False) if stride != 1 or cin != width \
            else None

    def forward(self, x):
        identity = x
        out = self.relu(self.conv1(x))
        out = self.conv2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (stride on the 3x3) without batch norm, written with torch.add / F.relu."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.downsample = nn.Conv2d(cin, out, 1, stride=stride, bias=False) if stride != 1 or cin != out else None

    def forward(self, x):
        out = F.relu(self.conv1(x))
        out = F.relu(self.conv2(out))
        out = self.conv3(out)
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(torch.add(out, shortcut))


class TorchResNet(nn.Module):
    def __init__(self, block: type[nn.Module], counts: list[int]) -> None:
        super().__init__()
        expansion = getattr(block, "expansion", 1)
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.pool1 = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        cin = 64
        for stage, count in enumerate(counts, start=1):
            width = 64 * 2 ** (stage - 1)
            blocks = []
            for i in range(count):
                blocks.append(block(cin, width, 2 if stage > 1 and i == 0 else 1))
                cin = width * expansion
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, 1000, bias=False)

    def forward(self, x):
        x = self.pool1(self.relu(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


TORCH_MODELS = {
    "mlp:784-256-128-10": (lambda: TorchMLP([784, 256, 128, 10]), (784,)),
    "lenet5": (TorchLeNet5, (1, 32, 32)),
    "alexnet": (TorchAlexNet, (3, 224, 224)),
    "vgg16": (TorchVGG16, (3, 224, 224)),
    "resnet18": (lambda: TorchResNet(BasicBlock, [2, 2, 2, 2]), (3, 224, 224)),
    "resnet50": (lambda: TorchResNet(Bottleneck, [3, 4, 6, 3]), (3, 224, 224)),
}
assert set(ZOO) <= set(TORCH_MODELS), "every zoo network needs a torch twin here"


def _zoo(name: str, batch: int) -> Network:
    return mlp([784, 256, 128, 10], batch) if name.startswith("mlp:") else ZOO[name](batch)


def _torch_shapes(module: nn.Module, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Per-sample output shape of every fx node, keyed as the importer names layers."""
    gm = torch.fx.symbolic_trace(module)
    ShapeProp(gm).propagate(torch.empty((2, *input_shape), device="meta"))
    shapes = {}
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta")
        if meta is not None and node.op != "output":
            assert meta.shape[0] == 2, "batch dimension must survive every layer"
            shapes[node.target if node.op == "call_module" else node.name] = tuple(meta.shape[1:])
    return shapes


def _torch_macs_and_weights(module: nn.Module, out_shape: tuple[int, ...]) -> tuple[int, int]:
    weights = sum(p.numel() for p in module.parameters())
    if isinstance(module, nn.Linear):
        return module.in_features * module.out_features, weights
    assert isinstance(module, nn.Conv2d)
    cout, ho, wo = out_shape
    kh, kw = module.kernel_size
    return cout * (module.in_channels // module.groups) * kh * kw * ho * wo, weights


@pytest.mark.parametrize("name", list(TORCH_MODELS))
def test_fx_import_equals_zoo_and_torch(name: str) -> None:
    factory, input_shape = TORCH_MODELS[name]
    with torch.device("meta"):
        module = factory()
    net = from_torch(module, input_shape, batch=3, name=name)
    zoo = _zoo(name, 3)

    # Layer for layer the same network as the zoo's (names differ only for function layers like adds).
    assert len(net) == len(zoo)
    assert net.batch == zoo.batch == 3 and net.input_shape == zoo.input_shape
    for got, want in zip(net.layers, zoo.layers, strict=True):
        assert (got.kind, got.activation, got.inputs) == (want.kind, want.activation, want.inputs), got.name
        assert got.op == want.op, got.name
        assert (got.out_shape, got.weight_count, got.forward_macs) == \
               (want.out_shape, want.weight_count, want.forward_macs), got.name

    # Shapes, MACs and weights against torch itself.
    shapes = _torch_shapes(module, input_shape)
    modules = dict(module.named_modules())
    total_macs = 0
    for layer in net.layers:
        assert layer.out_shape == shapes[layer.name], layer.name
        if layer.has_weights:
            macs, weights = _torch_macs_and_weights(modules[layer.name], shapes[layer.name])
            assert layer.forward_macs == macs, layer.name
            assert layer.weight_count == weights, layer.name
            total_macs += macs
    assert net.output_shape == (1000,) or name.startswith(("mlp", "lenet"))
    assert total_macs == sum(layer.forward_macs for layer in zoo.layers if layer.has_weights)
    assert sum(p.numel() for p in module.parameters()) == zoo.total_weights


def test_known_totals() -> None:
    """Public reference figures (no batch norm, no biases): ResNet-50 ≈ 4.1 GMAC, VGG-16 ≈ 15.5 GMAC."""
    def weight_macs(net: Network) -> int:
        return sum(layer.forward_macs for layer in net.layers if layer.has_weights)

    assert math.isclose(weight_macs(ZOO["resnet50"](1)), 4.09e9, rel_tol=0.01)
    assert math.isclose(weight_macs(ZOO["resnet18"](1)), 1.81e9, rel_tol=0.01)
    assert math.isclose(weight_macs(ZOO["vgg16"](1)), 15.47e9, rel_tol=0.01)
    # torchvision's parameter counts minus biases and batch-norm parameters.
    assert ZOO["vgg16"](1).total_weights == 138_357_544 - 13_416
    assert ZOO["resnet18"](1).total_weights == 11_689_512 - 1000 - 9600


def test_real_forward_matches_propagated_shapes() -> None:
    """One real forward pass (lenet5, CPU) gives the shapes the importer inferred."""
    module = TorchLeNet5()
    seen: dict[str, tuple[int, ...]] = {}
    hooks = [m.register_forward_hook(lambda mod, _i, out, n=n: seen.__setitem__(n, tuple(out.shape[1:])))
             for n, m in module.named_modules() if n]
    module(torch.zeros(1, 1, 32, 32))
    for h in hooks:
        h.remove()
    net = from_torch(module, (1, 32, 32))
    for layer in net.layers:
        if layer.name in seen:
            assert layer.out_shape == seen[layer.name]
    assert {layer.name for layer in net.layers if layer.has_weights} <= set(seen)


# ------------------------------------------------------------------- batch norm and dropout (issue 13)


class TVBasicBlock(nn.Module):
    """torchvision's BasicBlock as written there: conv-bn-relu-conv-bn, downsample = Sequential(conv, bn)."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = None
        if stride != 1 or cin != width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TVResNet18(nn.Module):
    """torchvision's resnet18 layout (bn after every conv, fc with bias), without torchvision."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.0) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        cin = 64
        for stage in range(1, 5):
            width = 64 * 2 ** (stage - 1)
            blocks = [TVBasicBlock(cin, width, 2 if stage > 1 else 1), TVBasicBlock(width, width, 1)]
            cin = width
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


def test_torchvision_style_resnet18_with_batch_norm_imports_and_schedules() -> None:
    from layerpipe.costs import PEModel
    from layerpipe.schedule import make_schedule, validate

    with torch.device("meta"):
        module = TVResNet18(dropout=0.2)
    net = from_torch(module, (3, 224, 224), name="tv-resnet18")
    zoo = ZOO["resnet18"](1)
    # Batch norm folds into the conv before it: the same layers, shapes and MACs as the zoo's resnet18,
    # and every conv gains a bias (the BN shift); the fc keeps torchvision's bias. Dropout vanishes.
    assert len(net) == len(zoo)
    for got, want in zip(net.layers, zoo.layers, strict=True):
        assert (got.kind, got.activation, got.inputs, got.out_shape, got.forward_macs) == \
               (want.kind, want.activation, want.inputs, want.out_shape, want.forward_macs), got.name
        if got.kind == "conv2d":
            assert got.op.bias and got.weight_count == want.weight_count + got.out_shape[0], got.name
    bn_channels = sum(m.num_features for m in module.modules() if isinstance(m, nn.BatchNorm2d))
    # torchvision's 11,689,512 parameters: BN's γ and β (2 per channel) become one bias per channel.
    assert sum(p.numel() for p in module.parameters()) == 11_689_512
    assert net.total_weights == 11_689_512 - bn_channels
    model = PEModel()
    for policy in ("layerpipe", "pipedream"):
        result = make_schedule(policy, net, 4, model)
        assert result.periodic is not None and result.graph is not None
        validate(result.periodic, result.graph)  # precedence, overlap, counts, lags on the imported network
        assert result.metrics.cycles_per_sample > 0


class _Head(nn.Module):
    def __init__(self, norm: bool, drop: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 8, bias=False)
        self.bn = nn.BatchNorm1d(8) if norm else nn.Identity()
        self.drop = nn.Dropout(0.3) if drop else nn.Identity()
        self.fc2 = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.fc2(F.dropout(self.drop(F.relu(self.bn(self.fc1(x)))), 0.1, self.training))


@pytest.mark.parametrize("drop", [False, True])
def test_batchnorm1d_folds_into_linear_and_dropout_is_the_identity(drop: bool) -> None:
    plain = from_torch(_Head(norm=False, drop=False), (12,))
    got = from_torch(_Head(norm=True, drop=drop), (12,))
    assert [(la.name, la.kind, la.activation, la.inputs) for la in got.layers] == \
           [(la.name, la.kind, la.activation, la.inputs) for la in plain.layers]
    assert got.layer(1).op.bias and not plain.layer(1).op.bias  # the folded BN shift; relu still fused
    assert got.layer(1).weight_count == plain.layer(1).weight_count + 8


class _BNAfterAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x) + x)


class _BNSharedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


@pytest.mark.parametrize(("module", "shape", "message"), [
    (nn.Sequential(nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1)), (4, 5, 5), "but its input is the network input"),
    (_BNAfterAdd(), (4, 5, 5), "but its input is 'add' (add)"),
    (_BNSharedConv(), (4, 5, 5), "whose output has other users too"),
    (nn.Sequential(nn.Conv2d(4, 6, 1), nn.BatchNorm2d(5)), (4, 5, 5), "batch norm over 5 channels"),
    (nn.Sequential(nn.Linear(4, 6), nn.BatchNorm2d(6)), (4,), "BatchNorm2d needs a (channels, height, width)"),
])
def test_batch_norm_without_a_layer_to_fold_into_is_refused(module: nn.Module, shape, message: str) -> None:
    from layerpipe.errors import InputError

    with pytest.raises(InputError, match=re.escape(message)) as info:
        from_torch(module, shape)
    assert "\n" not in str(info.value)

"""`from_torch`: what the fx importer accepts, how it fuses activations, and its one-line refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from layerpipe.errors import InputError  # noqa: E402
from layerpipe.network import Activation, Add, Conv2d, Flatten, Linear, Pool2d, from_torch  # noqa: E402


class Lambda(nn.Module):
    """A module whose forward is the given function of (self, x); submodules are passed as keywords."""

    def __init__(self, fn, **modules: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        for name, m in modules.items():
            setattr(self, name, m)

    def forward(self, x):
        return self.fn(self, x)


def test_core_imports_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; import layerpipe, layerpipe.network, layerpipe.costs, "
            "layerpipe.dfg, layerpipe.profile, layerpipe.cli; "
            "from layerpipe.network import from_torch\n"
            "try:\n    from_torch(object(), (3,))\nexcept Exception as e:\n    print(type(e).__name__, e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "InputError importing a torch module needs PyTorch: pip install 'layerpipe[torch]'"


def test_fusion_rules() -> None:
    def fwd(m, x):
        a = m.fc1(x)
        b = torch.sigmoid(a)  # a has two users below: not fused
        c = m.fc2(a)
        d = torch.tanh(c)  # c has one user: fused into fc2
        s = b + d
        return m.out(torch.relu(s))  # fused into the add

    module = Lambda(fwd, fc1=nn.Linear(4, 6, bias=False), fc2=nn.Linear(6, 6), out=nn.Linear(6, 2, bias=False))
    net = from_torch(module, (4,), batch=3, name="fusion")
    assert net.name == "fusion" and net.batch == 3
    assert [(layer.name, layer.op) for layer in net.layers] == [
        ("fc1", Linear(6)),
        ("sigmoid", Activation("sigmoid")),
        ("fc2", Linear(6, bias=True, activation="tanh")),
        ("add", Add(activation="relu")),
        ("out", Linear(2)),
    ]
    assert net.layer(4).inputs == (2, 3) and net.layer(3).inputs == (1,)


def test_activation_on_input_and_on_pool_stays_a_layer() -> None:
    module = Lambda(lambda m, x: m.pool(torch.tanh(x)).relu().flatten(1), pool=nn.AvgPool2d(2, stride=2))
    net = from_torch(module, (2, 4, 4))
    assert [layer.op for layer in net.layers] == [Activation("tanh"), Pool2d("avg", 2), Activation("relu"),
                                                  Flatten()]


def test_unused_modules_and_dead_code_are_ignored() -> None:
    def fwd(m, x):
        m.unused(x)  # traced, but nothing uses the result
        return m.fc(x)

    net = from_torch(Lambda(fwd, fc=nn.Linear(3, 2), unused=nn.Linear(3, 5), bn=nn.BatchNorm1d(3)), (3,))
    assert [layer.name for layer in net.layers] == ["fc"]


def test_reused_weightless_module_gets_unique_names() -> None:
    module = Lambda(lambda m, x: m.relu(m.relu(x) + x), relu=nn.ReLU())
    net = from_torch(module, (3,))
    # relu(x) on the input is a layer; the second relu fuses into the add
    assert [layer.name for layer in net.layers] == ["relu", "add"]
    module = Lambda(lambda m, x: m.pool(m.pool(x)), pool=nn.MaxPool2d(2))
    assert [layer.name for layer in from_torch(module, (1, 8, 8)).layers] == ["pool", "pool_2"]


def test_adaptive_avg_pool_as_plain_pool() -> None:
    module = Lambda(lambda m, x: m.p(x), p=nn.AdaptiveAvgPool2d(2))
    assert from_torch(module, (3, 8, 8)).layers[0].op == Pool2d("avg", 4)
    with pytest.raises(InputError, match=r"AdaptiveAvgPool2d\(2\) on a 7x7 input is not a plain square"):
        from_torch(module, (3, 7, 7))


def test_conv_options_are_carried() -> None:
    module = Lambda(lambda m, x: m.c(x), c=nn.Conv2d(4, 8, (3, 3), stride=(2, 2), padding=1, groups=2))
    (layer,) = from_torch(module, (4, 9, 9)).layers
    assert layer.op == Conv2d(8, 3, stride=2, padding=1, groups=2, bias=True)
    assert layer.weight_count == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("module", "shape", "message"), [
    (Lambda(lambda m, x: m.bn1(x), bn1=nn.BatchNorm2d(3)), (3, 4, 4),
     "torch module 'bn1': batch norm is folded into the Linear or Conv2d before it, but its input is the network "
     "input"),
    (Lambda(lambda m, x: m.d(x), d=nn.Dropout()), (3,), "computes no layer"),  # dropout is the identity
    (Lambda(lambda m, x: m.n(x), n=nn.LayerNorm(3)), (3,), "call_module LayerNorm (n)"),
    (Lambda(lambda m, x: F.gelu(x), ), (3,), "unsupported op in torch module: call_function "
                                             "torch._C._nn.gelu (gelu); supported:"),
    (Lambda(lambda m, x: torch.cat([x, x], 1)), (3,), "call_function torch.cat (cat)"),
    (Lambda(lambda m, x: x * 2), (3,), "call_function operator.mul (mul)"),
    (Lambda(lambda m, x: x + 1), (3,), "takes a non-tensor argument 1"),
    (Lambda(lambda m, x: x.view(x.size(0), -1)), (3,), "call_method size (size)"),
    (Lambda(lambda m, x: torch.flatten(x)), (3, 2, 2), "flatten(start_dim=0, end_dim=-1) (flatten); only"),
    (Lambda(lambda m, x: m.fc(m.fc(x)), fc=nn.Linear(3, 3)), (3,), "'fc' is called more than once"),
    (Lambda(lambda m, x: m.c(x), c=nn.Conv2d(3, 3, (3, 1))), (3, 8, 8), "kernel_size=(3, 1) is not supported"),
    (Lambda(lambda m, x: m.c(x), c=nn.Conv2d(3, 3, 3, dilation=2)), (3, 8, 8), "dilation (2, 2) is not supported"),
    (Lambda(lambda m, x: m.c(x), c=nn.Conv2d(3, 3, 3, padding="same")), (3, 8, 8), "padding='same'"),
    (Lambda(lambda m, x: m.p(x), p=nn.MaxPool2d(2, ceil_mode=True)), (3, 8, 8), "ceil_mode=True"),
    (Lambda(lambda m, x: m.f(x), f=nn.Flatten(2)), (3, 8, 8), "Flatten(start_dim=2, end_dim=-1)"),
    (Lambda(lambda m, x: (m.fc(x), x), fc=nn.Linear(3, 3)), (3,), "must return exactly one tensor"),
    (Lambda(lambda m, x: x), (3,), "computes no layer"),
    (Lambda(lambda m, x: m.fc(x), fc=nn.Linear(4, 3)), (5,), "'fc': Linear expects 4 input features, the traced "
                                                             "input has 5"),
    (Lambda(lambda m, x: m.c(x), c=nn.Conv2d(4, 3, 1)), (5, 2, 2), "Conv2d expects 4 input channels"),
    (Lambda(lambda m, x: x if x.sum() > 0 else -x), (3,), "torch.fx cannot trace Lambda: TraceError"),
])
def test_refusals_are_one_line(module: nn.Module, shape, message: str | None) -> None:
    with pytest.raises(InputError) as info:
        from_torch(module, shape)
    text = str(info.value)
    assert "\n" not in text
    if message is not None:
        assert message in text


def test_shape_mismatch_inside_the_module_is_reported_by_layer() -> None:
    module = Lambda(lambda m, x: m.a(x) + m.b(x), a=nn.Linear(3, 4), b=nn.Linear(3, 5))
    with pytest.raises(InputError, match=r"layer 'add': add inputs must have one shape, got \(4,\), \(5,\)"):
        from_torch(module, (3,))


def test_bad_arguments() -> None:
    with pytest.raises(InputError, match=r"needs a torch\.nn\.Module, got int"):
        from_torch(3, (3,))
    with pytest.raises(InputError, match="input_shape must be positive integers"):
        from_torch(nn.Linear(3, 2), (0,))

"""Import a PyTorch `nn.Module` as a `Network`, through `torch.fx.symbolic_trace`.

Supported (everything else is an `InputError` naming the op and listing these):
- modules: Linear, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d (when the traced input divides evenly
  into its output, i.e. it is a plain average pool), ReLU, Sigmoid, Tanh, Identity, Flatten, BatchNorm1d,
  BatchNorm2d, Dropout;
- functions and tensor methods: relu, sigmoid, tanh, flatten (from dim 1), add / `+` of two tensors,
  dropout.

Batch norm is *folded* into the Linear or Conv2d that feeds it (the model chosen for issue 13, as
inference compilers fold it): per channel, y = γ·(z − μ)/σ + β is a scale of the layer's weights and a
shift that becomes its bias, so the layer gains a bias (C words) and the network keeps its layer count.
What this simplifies: in training, BN's batch statistics and its own backward are elementwise work of
about 4·C·H·W operations per sample and its γ, β gradients 2·C words — under 1 % of the 3×3 convolution it
follows in a ResNet (C·9·C·H·W MACs) — and the folding leaves them out of the costs. A batch norm whose
input is not a Linear/Conv2d used by it alone (the network input, a pool, an add, a shared output) has
nothing to fold into and is refused. Dropout is the identity in costs (its mask is elementwise work the
cost models do not count; at inference it is the identity exactly).

An activation is fused into the linear, conv2d or add that feeds it when that layer has no other user,
as the zoo networks are written (conv → ReLU is one layer with activation "relu"). Layer names are the
module paths (`layer1.0.conv1`) for modules and the fx node names (`add_3`) for functions, made unique.
A module called twice would share its weights between two layers, which the model has no notion of, so
a weight module may be called once only.

torch is imported when `from_torch` is called, never when this module is imported.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from layerpipe.errors import InputError
from layerpipe.network._graph import Network, NetworkBuilder
from layerpipe.network._ops import Activation, Add, Conv2d, Flatten, LayerOp, Linear, Pool2d, Shape

if TYPE_CHECKING:  # pragma: no cover
    import torch

SUPPORTED = ("Linear, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, ReLU, Sigmoid, Tanh, Identity, Flatten, "
             "BatchNorm1d, BatchNorm2d, Dropout modules; relu, sigmoid, tanh, flatten, add, dropout functions and "
             "methods")

_INPUT = "input"  # the builder's name for the network input


@dataclass(frozen=True)
class _BatchNorm:
    """A batch norm before folding: keeps the shape; `channels` must be the producer's output channels."""

    channels: int
    kind: str = "batchnorm"

    def out_shape(self, in_shapes: list[Shape], where: str) -> Shape:
        (shape,) = in_shapes
        if shape[0] != self.channels:
            raise InputError(f"{where}: batch norm over {self.channels} channels gets an input of shape {shape}")
        return shape


@dataclass
class _Pending:
    """A layer before activation fusion: its op and the names of its inputs."""

    name: str
    op: LayerOp | _BatchNorm
    inputs: list[str]


def _unsupported(node: Any, what: str, ident: str | None = None) -> InputError:
    return InputError(f"unsupported op in torch module: {node.op} {what} ({ident or node.name}); "
                      f"supported: {SUPPORTED}")


def _square(value: Any, field: str, module_name: str) -> int:
    """A square kernel/stride/padding as one int (torch allows int or a pair)."""
    if isinstance(value, int):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] == value[1] and isinstance(value[0], int):
        return value[0]
    raise InputError(f"torch module '{module_name}': {field}={value!r} is not supported; only square "
                     f"(equal height and width) integer values are")


def _require(condition: bool, module_name: str, message: str) -> None:
    if not condition:
        raise InputError(f"torch module '{module_name}': {message}")


def _conv2d(m: torch.nn.Conv2d, name: str) -> Conv2d:
    _require(m.padding_mode == "zeros", name, f"padding_mode '{m.padding_mode}' is not supported; only 'zeros'")
    _require(_square(m.dilation, "dilation", name) == 1, name, f"dilation {m.dilation} is not supported; only 1")
    padding = 0 if m.padding == "valid" else m.padding
    if padding == "same":
        raise InputError(f"torch module '{name}': padding='same' is not supported; give the padding as an integer")
    return Conv2d(m.out_channels, _square(m.kernel_size, "kernel_size", name), stride=_square(m.stride, "stride", name),
                  padding=_square(padding, "padding", name), groups=m.groups, bias=m.bias is not None)


def _pool2d(m: Any, mode: str, name: str) -> Pool2d:
    _require(not m.ceil_mode, name, "ceil_mode=True is not supported")
    if mode == "max":
        _require(_square(m.dilation, "dilation", name) == 1, name, f"dilation {m.dilation} is not supported; only 1")
        _require(not m.return_indices, name, "return_indices=True is not supported")
    else:
        _require(m.divisor_override is None, name, "divisor_override is not supported")
    kernel = _square(m.kernel_size, "kernel_size", name)
    padding = _square(m.padding, "padding", name)
    if mode == "avg":
        _require(m.count_include_pad or padding == 0, name, "count_include_pad=False with padding is not supported")
    stride = kernel if m.stride is None or m.stride == [] else _square(m.stride, "stride", name)
    # The default stride is the window, written as stride None in the network model (as the zoo does).
    return Pool2d(mode, kernel, stride=None if stride == kernel else stride, padding=padding)


def _adaptive_avg(m: Any, in_shape: Shape, name: str) -> Pool2d:
    out = m.output_size if isinstance(m.output_size, (tuple, list)) else (m.output_size, m.output_size)
    if len(in_shape) != 3 or None in out:
        raise InputError(f"torch module '{name}': AdaptiveAvgPool2d({m.output_size}) on shape {in_shape} is not "
                         "supported")
    _, h, w = in_shape
    oh, ow = out
    if h % oh or w % ow or h // oh != w // ow:
        raise InputError(f"torch module '{name}': AdaptiveAvgPool2d({m.output_size}) on a {h}x{w} input is not a "
                         "plain square average pool; only output sizes that divide the input evenly are supported")
    return Pool2d("avg", h // oh)


class _Importer:
    """Walks an fx graph in order, turning nodes into pending layers (aliases for identities)."""

    def __init__(self, torch_mod: Any, gm: Any, input_shape: Shape) -> None:
        self.torch = torch_mod
        self.modules = dict(gm.named_modules())
        self.value: dict[Any, str] = {}  # fx node -> layer name (or "input")
        self.shape: dict[str, Shape] = {_INPUT: input_shape}
        self.pending: dict[str, _Pending] = {}
        self.called: set[str] = set()
        nn, f = torch_mod.nn, torch_mod.nn.functional
        self.activation_modules = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}
        self.activation_functions = {f.relu: "relu", torch_mod.relu: "relu", torch_mod.sigmoid: "sigmoid",
                                     f.sigmoid: "sigmoid", torch_mod.tanh: "tanh", f.tanh: "tanh"}
        self.add_functions = {operator.add, torch_mod.add}

    def unique(self, name: str) -> str:
        candidate, k = name, 2
        while candidate in self.pending or candidate == _INPUT:
            candidate, k = f"{name}_{k}", k + 1
        return candidate

    def emit(self, node: Any, name: str, op: LayerOp | _BatchNorm, inputs: list[str]) -> None:
        name = self.unique(name)
        shape = op.out_shape([self.shape[i] for i in inputs], f"layer '{name}'")
        self.pending[name] = _Pending(name, op, inputs)
        self.shape[name] = shape
        self.value[node] = name

    def tensor_arg(self, node: Any, arg: Any) -> str:
        if arg not in self.value:
            raise InputError(f"unsupported op in torch module: {node.op} {node.target} ({node.name}) takes a "
                             f"non-tensor argument {arg!r}; only tensor-to-tensor layers are supported")
        return self.value[arg]

    def visit(self, node: Any) -> None:
        if node.op == "placeholder":
            if _INPUT in self.value.values():
                raise InputError("torch module must take exactly one tensor input")
            self.value[node] = _INPUT
        elif node.op == "call_module":
            self.visit_module(node)
        elif node.op in ("call_function", "call_method"):
            self.visit_function(node)
        else:  # get_attr: a parameter or buffer used directly
            raise _unsupported(node, str(node.target))

    def visit_module(self, node: Any) -> None:
        nn = self.torch.nn
        target: str = node.target
        m = self.modules[target]
        if len(node.args) != 1 or node.kwargs:
            raise _unsupported(node, f"{type(m).__name__} with {len(node.args)} arguments", target)
        src = self.tensor_arg(node, node.args[0])
        kind = type(m)
        if kind in (nn.Linear, nn.Conv2d):
            if target in self.called:
                raise InputError(f"torch module '{target}' is called more than once; layers sharing weights "
                                 "are not supported")
            # The network model derives weight shapes from the traced input; they must be the module's.
            expected = m.in_features if kind is nn.Linear else m.in_channels
            got = self.shape[src][0]
            _require(len(self.shape[src]) != (1 if kind is nn.Linear else 3) or got == expected, target,
                     f"{kind.__name__} expects {expected} input {'features' if kind is nn.Linear else 'channels'}, "
                     f"the traced input has {got}")
            op: LayerOp = (Linear(m.out_features, bias=m.bias is not None) if kind is nn.Linear
                           else _conv2d(m, target))
        elif kind is nn.MaxPool2d:
            op = _pool2d(m, "max", target)
        elif kind is nn.AvgPool2d:
            op = _pool2d(m, "avg", target)
        elif kind is nn.AdaptiveAvgPool2d:
            op = _adaptive_avg(m, self.shape[src], target)
        elif kind in self.activation_modules:
            op = Activation(self.activation_modules[kind])
        elif kind in (nn.Identity, nn.Dropout):
            self.value[node] = src  # dropout: the identity in costs (module docstring)
            return
        elif kind in (nn.BatchNorm1d, nn.BatchNorm2d):
            dims = 1 if kind is nn.BatchNorm1d else 3
            _require(len(self.shape[src]) == dims, target,
                     f"{kind.__name__} needs a {'flat' if dims == 1 else '(channels, height, width)'} input, "
                     f"the traced input has shape {self.shape[src]}")
            self.emit(node, target, _BatchNorm(m.num_features), [src])
            return
        elif kind is nn.Flatten:
            _require(m.start_dim == 1 and m.end_dim == -1, target,
                     f"Flatten(start_dim={m.start_dim}, end_dim={m.end_dim}) is not supported; only (1, -1)")
            op = Flatten()
        else:
            raise _unsupported(node, kind.__name__, target)
        self.called.add(target)
        self.emit(node, target, op, [src])

    def visit_function(self, node: Any) -> None:
        fn, args, kwargs = node.target, list(node.args), dict(node.kwargs)
        kwargs.pop("inplace", None)  # in-place variants compute the same values
        if len(args) == 2 and not kwargs and isinstance(args[1], bool):
            args = args[:1]  # F.relu(x, True): the positional `inplace`
        is_method = node.op == "call_method"
        activation = (fn if fn in ("relu", "sigmoid", "tanh") else None) if is_method else \
            self.activation_functions.get(fn)
        if activation is not None and len(args) == 1 and not kwargs:
            self.emit(node, node.name, Activation(activation), [self.tensor_arg(node, args[0])])
        elif (fn == "dropout" if is_method else fn is self.torch.nn.functional.dropout) and args:
            self.value[node] = self.tensor_arg(node, args[0])  # the identity in costs
        elif (fn == "add" if is_method else fn in self.add_functions) and len(args) == 2 and not kwargs:
            inputs = [self.tensor_arg(node, a) for a in args]
            self.emit(node, node.name, Add(), inputs)
        elif (fn == "flatten" if is_method else fn is self.torch.flatten):
            start = kwargs.pop("start_dim", args[1] if len(args) > 1 else 0)
            end = kwargs.pop("end_dim", args[2] if len(args) > 2 else -1)
            if start != 1 or end != -1 or kwargs:
                raise InputError(f"unsupported op in torch module: flatten(start_dim={start}, end_dim={end}) "
                                 f"({node.name}); only flatten(x, 1) keeps the batch dimension")
            self.emit(node, node.name, Flatten(), [self.tensor_arg(node, args[0])])
        else:
            raise _unsupported(node, fn if is_method else self.function_name(fn))

    def function_name(self, fn: Any) -> str:
        """`torch.cat`, `operator.mul`: how a user would write the function."""
        try:
            name = self.torch.fx.node._get_qualified_name(fn)
        except Exception:  # a private helper of fx: fall back to the plain name if it changes
            name = getattr(fn, "__name__", repr(fn))
        return name.replace("_operator.", "operator.", 1)


def _users(pending: dict[str, _Pending], output: str) -> dict[str, int]:
    users: dict[str, int] = {name: 0 for name in pending}
    users[_INPUT] = 0
    for p in pending.values():
        for i in p.inputs:
            users[i] += 1
    users[output] += 1
    return users


def _fold_batch_norms(pending: dict[str, _Pending], output: str) -> tuple[dict[str, _Pending], str]:
    """Fold each batch norm into the Linear/Conv2d feeding it (which gains a bias); see the module docs."""
    users = _users(pending, output)
    renamed: dict[str, str] = {}
    kept: dict[str, _Pending] = {}
    for p in pending.values():
        p.inputs = [renamed.get(i, i) for i in p.inputs]
        if not isinstance(p.op, _BatchNorm):
            kept[p.name] = p
            continue
        producer = kept.get(p.inputs[0])
        what = "the network input" if producer is None else f"'{producer.name}' ({producer.op.kind})"
        if producer is None or not isinstance(producer.op, (Linear, Conv2d)) or producer.op.activation != "identity":
            raise InputError(f"torch module '{p.name}': batch norm is folded into the Linear or Conv2d before it, "
                             f"but its input is {what}")
        if users[producer.name] != 1:
            raise InputError(f"torch module '{p.name}': batch norm is folded into '{producer.name}', whose output "
                             "has other users too (they would see the unnormalised values)")
        producer.op = replace(producer.op, bias=True)  # the shift β − γ·μ/σ; the scale γ/σ goes into W
        renamed[p.name] = producer.name
    return kept, renamed.get(output, output)


def _fuse_activations(pending: dict[str, _Pending], output: str) -> tuple[list[_Pending], str]:
    """Fold each activation into its producer (linear, conv2d or add with identity) when it is the sole user."""
    users = _users(pending, output)
    renamed: dict[str, str] = {}
    kept: list[_Pending] = []
    for p in pending.values():
        p.inputs = [renamed.get(i, i) for i in p.inputs]
        if isinstance(p.op, Activation) and p.inputs[0] != _INPUT:
            producer = pending[p.inputs[0]]
            op = producer.op
            if isinstance(op, (Linear, Conv2d, Add)) and op.activation == "identity" and users[producer.name] == 1:
                producer.op = replace(op, activation=p.op.function)
                renamed[p.name] = producer.name
                continue
        kept.append(p)
    return kept, renamed.get(output, output)


def from_torch(module: Any, input_shape: Sequence[int], batch: int = 1, name: str | None = None) -> Network:
    """The `Network` computed by `module` on inputs of per-sample shape `input_shape` (see module docs)."""
    try:
        import torch
        import torch.fx
    except ImportError:
        raise InputError("importing a torch module needs PyTorch: pip install 'layerpipe[torch]'") from None
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    shape = tuple(input_shape)
    # The builder checks the shape too, but its message is better than a failure inside the importer.
    NetworkBuilder("check", shape, batch)
    try:
        gm = torch.fx.symbolic_trace(module)
    except Exception as exc:  # tracing runs user code: any failure is a bad input, said in one line
        reason = " ".join(str(exc).split())[:200]
        raise InputError(f"torch.fx cannot trace {type(module).__name__}: {type(exc).__name__}: {reason}") from None
    gm.graph.eliminate_dead_code()
    importer = _Importer(torch, gm, shape)
    output = None
    for node in gm.graph.nodes:
        if node.op == "output":
            result = node.args[0]
            if result not in importer.value:
                raise InputError("torch module must return exactly one tensor")
            output = importer.value[result]
        else:
            importer.visit(node)
    if output is None or output == _INPUT:
        raise InputError("torch module computes no layer (its output is its input)")
    folded, output = _fold_batch_norms(importer.pending, output)
    layers, output = _fuse_activations(folded, output)
    if layers[-1].name != output:
        raise InputError(f"torch module's output '{output}' must be its last layer; '{layers[-1].name}' comes "
                         "after it")
    builder = NetworkBuilder(name or type(module).__name__, shape, batch)
    for p in layers:
        assert not isinstance(p.op, _BatchNorm), "every batch norm was folded or refused"
        builder.add(p.name, p.op, p.inputs)
    return builder.build()

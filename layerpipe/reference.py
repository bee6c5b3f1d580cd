"""The PyTorch reference: train a network sample by sample with delayed weight versions (design notes §3).

`train_reference` is the numerics' source of truth. It runs the iterations in order (iteration t = rows
t·B .. t·B + B − 1 of the data) from the same initial weights and data as the functional simulator and
reads the same weight versions — given as a full version map {(kind, layer, t): version} or as per-layer
`Lags` — under a weight mode (`stash`, `latest`, `ema`; formulas in `layerpipe.numerics`).

- Linear and conv2d layers with several inputs (a split layer's consumer, `layerpipe.network.split_layer`)
  read their concatenation (features or channels); E hands each input its slice of Wᵀδ.
- Float path (float64, `fmt=None`): autograd computes the gradients. Each linear layer is a custom
  `torch.autograd.Function` whose forward uses W at the version F reads and whose backward computes the
  weight gradient, hands it to the layer's version history, then computes the input gradient with W at the
  version E reads under the mode. Activations, residual adds, flatten and the loss ½‖a_L − y‖² are plain
  torch ops, so autograd does the rest of backpropagation.
- Integer path (`fmt` given): int64 tensors, forward and backward written out with torch integer ops that
  emulate `layerpipe.fixedpoint` bit for bit. It deliberately does not call the numpy implementation, so
  agreement between the two is evidence, not tautology.

Versions are computed on demand: version k + 1 = update(version k, Σ gradients of the iterations of
update k). A backward read may therefore see its own iteration's update (E after U, backward lag −1);
reading a version that needs a later iteration's gradient is an InputError, as is a forward read of a
version not yet written.

torch is imported lazily: `import layerpipe.reference` works without it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat, check_lr_shift, lr_shift_of
from layerpipe.network import INPUT, Conv2d, Linear, Network, Pool2d
from layerpipe.numerics import (
    DEFAULT_EMA_SHIFT,
    Lags,
    VersionMap,
    check_groups,
    check_mode,
    check_supported,
    init_weights,
    make_data,
    normalize_versions,
    num_updates,
    update_iterations,
    weight_shape,
)

if TYPE_CHECKING:
    import torch

    from layerpipe._torch_fixed import TorchFixed

__all__ = ["ReferenceResult", "expected_fixed_run", "train_reference"]


@dataclass
class ReferenceResult:
    """Final weights (keys `W{l}`, `b{l}`; float64 or int64 numpy arrays) and per-sample losses."""

    weights: dict[str, np.ndarray]
    losses: np.ndarray


# -- weight versions ----------------------------------------------------------------------------------------


class _History:
    """The versions of one layer's weights, computed on demand from the gradients handed in so far."""

    def __init__(
        self,
        layer: int,
        w0: torch.Tensor,
        b0: torch.Tensor | None,
        group: Callable[[int], range],
        update: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        average: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        import torch

        self.layer, self.group, self.update, self.average = layer, group, update, average
        self.weights = [w0]
        self.biases = [b0]
        self.averages = [torch.zeros_like(w0)]
        self.grads: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def add_gradient(self, t: int, g_w: torch.Tensor, g_b: torch.Tensor | None) -> None:
        self.grads[t] = (g_w, g_b)

    def version(self, k: int, reader: str) -> int:
        """Make version k exist; return k."""
        while len(self.weights) <= k:
            u = len(self.weights) - 1
            its = self.group(u)
            missing = [t for t in its if t not in self.grads]
            if missing:
                raise InputError(
                    f"reference: {reader} reads version {k} of layer {self.layer}, which needs the "
                    f"gradient of iteration {missing[0]}, not computed yet in sample order"
                )
            g_w = _left_sum([self.grads[t][0] for t in its])
            self.weights.append(self.update(self.weights[u], g_w))
            self.averages.append(self.average(self.averages[u], g_w))
            b = self.biases[u]
            self.biases.append(None if b is None else self.update(b, _left_sum([self.grads[t][1] for t in its])))
        return k


def _left_sum(values: list[Any]) -> Any:
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def _initial(init: Mapping[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
    value = init.get(key)
    if value is None or np.shape(value) != shape:
        got = "nothing" if value is None else f"shape {np.shape(value)}"
        raise InputError(f"initial weights '{key}': the network needs shape {shape}, got {got}")
    return np.asarray(value)


class _Reads:
    """Which version each read of each layer and iteration sees."""

    def __init__(self, versions: VersionMap | Lags) -> None:
        self.lags: Lags | None = None
        self.map: dict[tuple[str, int, int], int] = {}  # the full map, when not given as lags
        if isinstance(versions, Lags):
            self.lags = versions
        else:
            self.map = normalize_versions(versions)

    def __call__(self, kind: str, layer: int, t: int) -> int:
        if self.lags is not None:
            return self.lags.version(kind, layer, t)
        try:
            return self.map[(kind, layer, t)]
        except KeyError:
            raise InputError(f"version map has no entry for {kind}{layer}.{t}") from None


# -- the trainer --------------------------------------------------------------------------------------------


class _Trainer:
    def __init__(
        self,
        network: Network,
        init: Mapping[str, np.ndarray],
        data: Mapping[str, np.ndarray],
        versions: VersionMap | Lags,
        mode: str,
        lr: float,
        fmt: FixedFormat | None,
        synchronous: bool,
        microbatches: int,
        iterations: int | None,
        ema_shift: int,
        groups: tuple[tuple[int, int], ...] = (),
    ) -> None:
        import torch

        self.network, self.mode, self.lr = network, check_mode(mode), float(lr)
        self.ema_weight = 2.0 ** -check_lr_shift(ema_shift, "ema_shift")
        self.ema_shift = ema_shift
        self.int: TorchFixed | None = None
        if fmt is not None:
            from layerpipe._torch_fixed import TorchFixed

            self.int = TorchFixed(fmt)
        self.lr_shift = lr_shift_of(lr) if fmt is not None else 0
        self.reads = _Reads(versions)
        self.synchronous, self.microbatches = synchronous, microbatches
        batch = network.batch
        rows = len(data["x"])
        self.iterations = rows // batch if iterations is None else iterations
        if self.iterations * batch > rows:
            raise InputError(f"data has {rows} samples; {self.iterations} iterations of batch {batch} need more")
        rows = self.iterations * batch
        self.x, self.y = (self._encode(np.asarray(data[key][:rows])) for key in ("x", "y"))
        self.losses = torch.zeros(rows, dtype=torch.float64)
        self.histories: dict[int, _History] = {}

        self.groups = check_groups(groups)

        def group_of(layer: int) -> Callable[[int], range]:
            size = self.groups.get(layer, 1)
            return lambda u: update_iterations(u, self.iterations, synchronous, microbatches, size)

        for layer in network.layers:
            if layer.has_weights:
                shape = weight_shape(layer)
                w0 = self._encode(_initial(init, f"W{layer.index}", shape))
                b0 = self._encode(_initial(init, f"b{layer.index}", shape[:1])) if layer.has_bias else None
                self.histories[layer.index] = _History(layer.index, w0, b0, group_of(layer.index), self._sgd,
                                                       self._ema_average)

    # representation-specific pieces

    def _encode(self, values: np.ndarray) -> torch.Tensor:
        import torch

        if self.int is not None:
            return self.int.quantize(values)
        return torch.as_tensor(values, dtype=torch.float64).clone()

    def _sgd(self, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.int is None:
            return w - self.lr * g
        return self.int.sat(w - self.int.shift_round(g, self.lr_shift))

    def _ema_average(self, avg: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.int is None:
            return avg + self.ema_weight * (g - avg)
        return self.int.sat(avg + self.int.shift_round(g - avg, self.ema_shift))

    def forward_weights(self, layer: int, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        history = self.histories[layer]
        k = history.version(self.reads("F", layer, t), f"F{layer}.{t}")
        return history.weights[k], history.biases[k]

    def backward_weights(self, layer: int, t: int) -> torch.Tensor:
        """W as E_l(t) reads it under the weight mode."""
        history = self.histories[layer]
        v_f = self.reads("F", layer, t)
        if self.mode == "stash":
            return history.weights[history.version(v_f, f"E{layer}.{t}")]
        c = history.version(self.reads("E", layer, t), f"E{layer}.{t}")
        if self.mode == "latest":
            return history.weights[c]
        w, avg, s = history.weights[c], history.averages[c], c - v_f
        if self.int is None:
            return w + (self.lr * s) * avg
        return self.int.sat(w + self.int.shift_round(s * avg, self.lr_shift))

    def run(self) -> ReferenceResult:
        step = self._float_iteration if self.int is None else self._int_iteration
        for t in range(self.iterations):
            step(t)
        weights: dict[str, np.ndarray] = {}
        for l, history in self.histories.items():
            updates = num_updates(self.iterations, self.synchronous, self.microbatches, self.groups.get(l, 1))
            last = history.version(updates, "the final weights")  # updates nobody read are applied here
            weights[f"W{l}"] = history.weights[last].numpy().copy()
            bias = history.biases[last]
            if bias is not None:
                weights[f"b{l}"] = bias.numpy().copy()
        return ReferenceResult(weights, self.losses.numpy().copy())

    def _rows(self, t: int) -> slice:
        b = self.network.batch
        return slice(t * b, (t + 1) * b)

    # float64 path: autograd

    def _float_iteration(self, t: int) -> None:
        import torch
        import torch.nn.functional as tf

        function = _delayed_weights()
        outputs: dict[int, torch.Tensor] = {INPUT: self.x[self._rows(t)]}
        for layer in self.network.layers:
            inputs = [outputs[i] for i in layer.inputs]
            op = layer.op
            if isinstance(op, Linear | Conv2d):
                w, b = self.forward_weights(layer.index, t)
                w = w.detach().clone().requires_grad_(True)  # a leaf, so autograd calls this layer's backward
                kernel = _LinearKernel() if isinstance(op, Linear) else _ConvKernel(op)
                # Several inputs are read concatenated (a split layer's parts); autograd slices the error back.
                a_in = inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=1)
                z = function.apply(a_in, w, b, _BackwardHook(self, layer.index, t), kernel)
            elif isinstance(op, Pool2d):
                pool = tf.max_pool2d if op.mode == "max" else tf.avg_pool2d
                z = pool(inputs[0], op.kernel_size, op.effective_stride, op.padding)
            elif layer.kind == "add":
                z = _left_sum(inputs)
            elif layer.kind == "flatten":
                z = inputs[0].reshape(len(inputs[0]), -1)
            else:
                z = inputs[0]
            outputs[layer.index] = _torch_activation(z, layer.activation)
        diff = outputs[len(self.network)] - self.y[self._rows(t)]
        per_sample = 0.5 * (diff * diff).reshape(len(diff), -1).sum(dim=1)
        self.losses[self._rows(t)] = per_sample.detach()
        per_sample.sum().backward()

    # integer path: backpropagation written out

    def _int_iteration(self, t: int) -> None:
        import torch

        q = self.int
        assert q is not None
        net = self.network
        outputs: dict[int, torch.Tensor] = {INPUT: self.x[self._rows(t)]}
        kept: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}  # layer → z, a_in, winner
        for layer in net.layers:
            inputs = [outputs[i] for i in layer.inputs]
            op, winner = layer.op, None
            if isinstance(op, Linear | Conv2d):
                w, b = self.forward_weights(layer.index, t)
                if len(inputs) > 1:  # read concatenated (features or channels): a split layer's parts
                    inputs = [torch.cat(inputs, dim=1)]
                z = q.linear(w, inputs[0], b) if isinstance(op, Linear) else q.conv(w, inputs[0], b, op)
            elif isinstance(op, Pool2d):
                z, winner = q.pool(inputs[0], op)
            elif layer.kind == "add":
                z = q.sat(_left_sum(inputs))
            elif layer.kind == "flatten":
                z = inputs[0].reshape(len(inputs[0]), -1)
            else:
                z = inputs[0]
            outputs[layer.index] = z.clamp(min=0) if layer.activation == "relu" else z
            kept[layer.index] = (z, inputs[0], winner)
        last = len(net)
        y = self.y[self._rows(t)]
        diff = q.to_float(outputs[last]) - q.to_float(y)
        self.losses[self._rows(t)] = 0.5 * (diff * diff).reshape(len(diff), -1).sum(dim=1)
        errors: dict[int, list[torch.Tensor]] = {last: [q.sat(outputs[last] - y)]}
        for layer in reversed(net.layers):
            z, a_in, winner = kept[layer.index]
            e = q.sat(_left_sum(errors.pop(layer.index)))
            delta = e * (z > 0).to(torch.int64) if layer.activation == "relu" else e
            op = layer.op
            if isinstance(op, Linear | Conv2d):
                if isinstance(op, Linear):
                    g_w, g_b = q.linear_weight_grad(delta, a_in, op.bias)
                else:
                    g_w, g_b = q.conv_weight_grad(delta, a_in, op)
                self.histories[layer.index].add_gradient(t, g_w, g_b)
                if layer.takes_network_input:
                    continue
                w_e = self.backward_weights(layer.index, t)
                if isinstance(op, Linear):
                    e_in = [q.linear_input_grad(w_e, delta)]
                else:
                    shape = (sum(s[0] for s in layer.in_shapes), *layer.in_shapes[0][1:])
                    e_in = [q.conv_input_grad(w_e, delta, op, shape)]
                if len(layer.inputs) > 1:  # concatenated inputs: each gets its slice of Wᵀδ
                    e_in = list(torch.split(e_in[0], [s[0] for s in layer.in_shapes], dim=1))
            elif isinstance(op, Pool2d):
                e_in = [q.pool_backward(delta, winner, op, layer.in_shapes[0])]
            else:
                e_in = [delta.reshape(len(delta), *shape) for shape in layer.in_shapes]
            for src, e_src in zip(layer.inputs, e_in * len(layer.inputs) if len(e_in) == 1 else e_in, strict=True):
                if src != INPUT:
                    errors.setdefault(src, []).append(e_src)


class _BackwardHook:
    """What the custom Function's backward calls: hand in the weight gradient, get the weights E reads."""

    def __init__(self, trainer: _Trainer, layer: int, t: int) -> None:
        self.trainer, self.layer, self.t = trainer, layer, t

    def gradient(self, g_w: torch.Tensor, g_b: torch.Tensor | None) -> None:
        self.trainer.histories[self.layer].add_gradient(self.t, g_w.detach(), None if g_b is None else g_b.detach())

    def weights_for_e(self) -> torch.Tensor:
        return self.trainer.backward_weights(self.layer, self.t)


def _torch_activation(z: torch.Tensor, function: str) -> torch.Tensor:
    import torch

    if function == "relu":
        return torch.relu(z)
    if function == "sigmoid":
        return torch.sigmoid(z)
    if function == "tanh":
        return torch.tanh(z)
    return z


class _LinearKernel:
    """z = a Wᵀ + b and its two gradients, for `DelayedWeights`."""

    @staticmethod
    def forward(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        z = a @ w.T
        return z if b is None else z + b

    @staticmethod
    def weight_grad(delta: torch.Tensor, a: torch.Tensor, w_shape: torch.Size) -> torch.Tensor:
        return delta.T @ a

    @staticmethod
    def bias_grad(delta: torch.Tensor) -> torch.Tensor:
        return delta.sum(dim=0)

    @staticmethod
    def input_grad(delta: torch.Tensor, w: torch.Tensor, a_shape: torch.Size) -> torch.Tensor:
        return delta @ w


class _ConvKernel:
    """conv2d and its two gradients (torch.nn.grad), for `DelayedWeights`."""

    def __init__(self, op: Conv2d) -> None:
        self.op = op

    def forward(self, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        import torch.nn.functional as tf

        return tf.conv2d(a, w, b, self.op.stride, self.op.padding, 1, self.op.groups)

    def weight_grad(self, delta: torch.Tensor, a: torch.Tensor, w_shape: torch.Size) -> torch.Tensor:
        from torch.nn import grad as nn_grad  # a submodule torch.nn's __init__ does not import itself

        op = self.op
        return nn_grad.conv2d_weight(a, w_shape, delta, op.stride, op.padding, 1, op.groups)

    @staticmethod
    def bias_grad(delta: torch.Tensor) -> torch.Tensor:
        return delta.sum(dim=(0, 2, 3))

    def input_grad(self, delta: torch.Tensor, w: torch.Tensor, a_shape: torch.Size) -> torch.Tensor:
        from torch.nn import grad as nn_grad

        op = self.op
        return nn_grad.conv2d_input(a_shape, w, delta, op.stride, op.padding, 1, op.groups)


_FUNCTION: Any = None


def _delayed_weights() -> Any:
    """The custom autograd Function (built on first use so torch stays an optional import)."""
    global _FUNCTION
    if _FUNCTION is None:
        import torch

        class DelayedWeights(torch.autograd.Function):
            """Forward with W_F; backward: the weight gradient goes to the layer's history first, then the input
            gradient uses W_E, the weights E reads under the mode (which may be the version that gradient writes).
            """

            @staticmethod
            def forward(
                ctx: Any,
                a: torch.Tensor,
                w: torch.Tensor,
                b: torch.Tensor | None,
                hook: _BackwardHook,
                kernel: _LinearKernel | _ConvKernel,
            ) -> torch.Tensor:
                ctx.save_for_backward(a)
                ctx.hook, ctx.kernel, ctx.has_bias, ctx.w_shape = hook, kernel, b is not None, w.shape
                return kernel.forward(a, w, b)

            @staticmethod
            def backward(ctx: Any, delta: torch.Tensor) -> tuple[Any, ...]:
                (a,) = ctx.saved_tensors
                kernel = ctx.kernel
                g_w = kernel.weight_grad(delta, a, ctx.w_shape)
                g_b = kernel.bias_grad(delta) if ctx.has_bias else None
                ctx.hook.gradient(g_w, g_b)
                e = kernel.input_grad(delta, ctx.hook.weights_for_e(), a.shape) if ctx.needs_input_grad[0] else None
                return e, g_w, None, None, None

        _FUNCTION = DelayedWeights
    return _FUNCTION


def train_reference(
    network: Network,
    init: Mapping[str, np.ndarray],
    data: Mapping[str, np.ndarray],
    versions: VersionMap | Lags,
    mode: str = "stash",
    lr: float = 2.0**-4,
    fmt: FixedFormat | None = None,
    synchronous: bool = False,
    microbatches: int = 1,
    iterations: int | None = None,
    ema_shift: int = DEFAULT_EMA_SHIFT,
    groups: tuple[tuple[int, int], ...] = (),
) -> ReferenceResult:
    """Train `network` sample by sample with the weight versions of `versions` (a map or `Lags`).

    `groups` (layer, g) sums g iterations' gradients into each update of that layer (an asynchronous
    schedule's update groups: PipeDream's replicated stages, PipeDream-2BW), as the functional mode does.

    `fmt` None trains in float64 with autograd; a `FixedFormat` trains on int64 tensors bit-exact with
    `layerpipe.fixedpoint` (then `lr` must be 2^−k). Synchronous training sums each step's `microbatches`
    gradients into one update. `iterations` defaults to all the micro-batches the data holds.
    """
    check_supported(network, fixed=fmt is not None)
    if not (isinstance(lr, float | int) and math.isfinite(lr) and lr > 0):
        raise InputError(f"lr must be a positive finite number, got {lr!r}")
    if synchronous and (not isinstance(microbatches, int) or microbatches < 1):
        raise InputError(f"microbatches must be a positive integer, got {microbatches!r}")
    import torch

    # One thread: the tensors are tiny, and torch's thread pool costs more than it saves (on a busy
    # machine, 10x more). The integer path builds no autograd graph; the float path needs one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad() if fmt is not None else contextlib.nullcontext():
            trainer = _Trainer(
                network, init, data, versions, mode, lr, fmt, synchronous, microbatches, iterations, ema_shift,
                tuple(groups),
            )
            return trainer.run()
    finally:
        torch.set_num_threads(threads)


def expected_fixed_run(
    network: Network,
    versions: VersionMap | Lags,
    samples: int,
    seed: int,
    fmt: FixedFormat,
    lr_shift: int,
    mode: str = "stash",
    synchronous: bool = False,
    microbatches: int = 1,
) -> dict[str, np.ndarray]:
    """Everything an RTL bench needs to check a fixed-point run, computed by the integer reference.

    Data and initial weights come from `make_data(network, samples, seed)` / `init_weights(network, seed,
    fmt)`. Returns int64 arrays ready for `np.savez`: `x`, `y` (quantized samples, rows in stream order),
    `init_W{l}` / `init_b{l}` and `final_W{l}` / `final_b{l}` (weights before and after training), and
    `losses` (float64 per sample).
    """
    data = make_data(network, samples, seed)
    init = init_weights(network, seed, fmt)
    lr = 2.0 ** -check_lr_shift(lr_shift)
    result = train_reference(
        network, init, data, versions, mode, lr, fmt, synchronous, microbatches, iterations=samples // network.batch
    )
    out: dict[str, np.ndarray] = {"x": fmt.quantize(data["x"]), "y": fmt.quantize(data["y"]), "losses": result.losses}
    out.update({f"init_{key}": value for key, value in init.items()})
    out.update({f"final_{key}": value for key, value in result.weights.items()})
    return out

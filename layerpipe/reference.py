"""The PyTorch reference: train a network sample by sample with delayed weight versions (design notes §3).

`train_reference` is the numerics' source of truth. It runs the iterations in order (iteration t = rows
t·B .. t·B + B − 1 of the data) from the same initial weights and data as the functional simulator and
reads the same weight versions — given as a full version map {(kind, layer, t): version} or as per-layer
`Lags` — under a weight mode (`stash`, `latest`, `ema`; formulas in `layerpipe.numerics`).

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
from layerpipe.network import INPUT, Network
from layerpipe.numerics import (
    Lags,
    VersionMap,
    check_mode,
    check_supported,
    init_weights,
    make_data,
    normalize_versions,
    num_updates,
    update_iterations,
)

if TYPE_CHECKING:
    import torch

__all__ = ["ReferenceResult", "expected_fixed_run", "train_reference"]


@dataclass
class ReferenceResult:
    """Final weights (keys `W{l}`, `b{l}`; float64 or int64 numpy arrays) and per-sample losses."""

    weights: dict[str, np.ndarray]
    losses: np.ndarray


# -- integer arithmetic in torch, written from the fixed-point spec -----------------------------------------


class _TorchFixed:
    """`layerpipe.fixedpoint` re-implemented on int64 tensors (independently, from its docstring)."""

    def __init__(self, fmt: FixedFormat) -> None:
        self.frac = fmt.frac_bits
        self.low = -(2 ** (fmt.total_bits - 1))
        self.high = 2 ** (fmt.total_bits - 1) - 1

    def sat(self, v: torch.Tensor) -> torch.Tensor:
        return v.clamp(self.low, self.high)

    @staticmethod
    def shift_round(v: torch.Tensor, k: int) -> torch.Tensor:
        return v if k == 0 else (v + 2 ** (k - 1)) >> k

    def rescale(self, acc: torch.Tensor) -> torch.Tensor:
        return self.sat(self.shift_round(acc, self.frac))

    def quantize(self, x: np.ndarray) -> torch.Tensor:
        import torch

        values = torch.as_tensor(np.asarray(x))
        if not values.dtype.is_floating_point:
            return self.sat(values.to(torch.int64))
        scaled = (values.to(torch.float64) * 2.0**self.frac).clamp(self.low - 1.0, self.high + 1.0)
        whole = scaled.floor()
        rounded = whole + (scaled - whole >= 0.5).to(torch.float64)
        return rounded.clamp(self.low, self.high).to(torch.int64)

    def to_float(self, q: torch.Tensor) -> torch.Tensor:
        import torch

        return q.to(torch.float64) / 2.0**self.frac


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
        self.lags = versions if isinstance(versions, Lags) else None
        self.map = None if isinstance(versions, Lags) else normalize_versions(versions)

    def __call__(self, kind: str, layer: int, t: int) -> int:
        if self.lags is not None:
            return self.lags.version(kind, layer, t)
        try:
            return self.map[(kind, layer, t)]  # type: ignore[index]
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
    ) -> None:
        import torch

        self.network, self.mode, self.lr = network, check_mode(mode), float(lr)
        self.ema_weight = 2.0 ** -check_lr_shift(ema_shift, "ema_shift")
        self.ema_shift = ema_shift
        self.int = _TorchFixed(fmt) if fmt is not None else None
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

        def group(u: int) -> range:
            return update_iterations(u, self.iterations, synchronous, microbatches)

        for layer in network.layers:
            if layer.has_weights:
                w0 = self._encode(_initial(init, f"W{layer.index}", (layer.out_size, layer.in_size)))
                b0 = self._encode(_initial(init, f"b{layer.index}", (layer.out_size,))) if layer.op.bias else None
                self.histories[layer.index] = _History(layer.index, w0, b0, group, self._sgd, self._ema_average)

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
        updates = num_updates(self.iterations, self.synchronous, self.microbatches)
        for l, history in self.histories.items():
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

        function = _delayed_linear()
        outputs: dict[int, torch.Tensor] = {INPUT: self.x[self._rows(t)]}
        for layer in self.network.layers:
            inputs = [outputs[i] for i in layer.inputs]
            if layer.kind == "linear":
                w, b = self.forward_weights(layer.index, t)
                w = w.detach().clone().requires_grad_(True)  # a leaf, so autograd calls this layer's backward
                z = function.apply(inputs[0], w, b, _BackwardHook(self, layer.index, t))
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
        kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer → (z, a_in)
        for layer in net.layers:
            inputs = [outputs[i] for i in layer.inputs]
            if layer.kind == "linear":
                w, b = self.forward_weights(layer.index, t)
                acc = inputs[0] @ w.T
                if b is not None:
                    acc = acc + (b << q.frac)
                z = q.rescale(acc)
            elif layer.kind == "add":
                z = q.sat(_left_sum(inputs))
            elif layer.kind == "flatten":
                z = inputs[0].reshape(len(inputs[0]), -1)
            else:
                z = inputs[0]
            outputs[layer.index] = z.clamp(min=0) if layer.activation == "relu" else z
            kept[layer.index] = (z, inputs[0])
        last = len(net)
        y = self.y[self._rows(t)]
        diff = q.to_float(outputs[last]) - q.to_float(y)
        self.losses[self._rows(t)] = 0.5 * (diff * diff).reshape(len(diff), -1).sum(dim=1)
        errors: dict[int, list[torch.Tensor]] = {last: [q.sat(outputs[last] - y)]}
        for layer in reversed(net.layers):
            z, a_in = kept[layer.index]
            e = q.sat(_left_sum(errors.pop(layer.index)))
            delta = e * (z > 0).to(torch.int64) if layer.activation == "relu" else e
            if layer.has_weights:
                g_w = q.rescale(delta.T @ a_in)
                g_b = q.sat(delta.sum(dim=0)) if layer.op.bias else None
                self.histories[layer.index].add_gradient(t, g_w, g_b)
                if layer.takes_network_input:
                    continue
                e_in = [q.rescale(delta @ self.backward_weights(layer.index, t))]
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


_FUNCTION: Any = None


def _delayed_linear() -> Any:
    """The custom autograd Function (built on first use so torch stays an optional import)."""
    global _FUNCTION
    if _FUNCTION is None:
        import torch

        class DelayedLinear(torch.autograd.Function):
            """z = a W_Fᵀ + b forward; backward: g = δᵀ a (to the history), e = δ W_E with W_E per the mode."""

            @staticmethod
            def forward(
                ctx: Any, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, hook: _BackwardHook
            ) -> torch.Tensor:
                ctx.save_for_backward(a)
                ctx.hook, ctx.has_bias = hook, b is not None
                z = a @ w.T
                return z if b is None else z + b

            @staticmethod
            def backward(ctx: Any, delta: torch.Tensor) -> tuple[Any, ...]:
                (a,) = ctx.saved_tensors
                g_w = delta.T @ a
                g_b = delta.sum(dim=0) if ctx.has_bias else None
                ctx.hook.gradient(g_w, g_b)  # first: E may read the version this very gradient writes
                e = delta @ ctx.hook.weights_for_e() if ctx.needs_input_grad[0] else None
                return e, g_w, None, None

        _FUNCTION = DelayedLinear
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
    ema_shift: int = 3,
) -> ReferenceResult:
    """Train `network` sample by sample with the weight versions of `versions` (a map or `Lags`).

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

    # The integer path builds no autograd graph; the float path needs one.
    with torch.no_grad() if fmt is not None else contextlib.nullcontext():
        trainer = _Trainer(
            network, init, data, versions, mode, lr, fmt, synchronous, microbatches, iterations, ema_shift
        )
        return trainer.run()


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

"""The measuring side of the `profiled` cost model: time each layer's F, A, E, G, U with PyTorch on this CPU.

Each atomic task is timed as the explicit torch computation it stands for in design notes §2, on random
float32 tensors of the layer's shapes at the network's micro-batch size B, without autograd:

| task | linear                      | conv2d                               | weightless layer             |
|------|-----------------------------|--------------------------------------|------------------------------|
| F    | f(x Wᵀ + b)                 | f(conv2d(x, W) + b)                  | pool / flatten / f / f(Σ xᵢ) |
| A    | δ = e ⊙ f'(z) (output: e = a − y first)                            | —                            |
| E    | δ W                         | conv2d_input(δ, W)                   | pool backward, f', reshape   |
| G    | δᵀ x (+ Σ δ for the bias)   | conv2d_weight(x, δ) (+ Σ δ)          | —                            |
| U    | W ← W − η g (in place)      | same                                 | —                            |

A task's time is the median of `repeats` runs after `warmup` runs, in integer nanoseconds (at least 1).
Exactly the tasks the cost models know are measured (`layerpipe.costs.network_costs`), so every task of
every training graph of the network has a time. torch is imported only when profiling runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from layerpipe.costs import MacsModel, ProfiledModel, network_costs
from layerpipe.errors import InputError
from layerpipe.network import Conv2d, Flatten, Layer, Linear, Network, Pool2d

_LEARNING_RATE = 2.0**-8  # any value: U's time does not depend on it


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise InputError("profiling needs PyTorch: pip install 'layerpipe[torch]'") from None
    return torch


def median_ns(fn: Callable[[], Any], repeats: int, warmup: int) -> int:
    """Median wall time of `fn()` over `repeats` runs, after `warmup` untimed runs, in ns (>= 1)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return max(1, round(statistics.median(times)))


def _activation_fns(torch: Any, name: str) -> tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]:
    """(f, backward) where backward(e, z) = e ⊙ f'(z) computed as hardware would, from z."""
    if name == "relu":
        return torch.relu, lambda e, z: e * (z > 0)
    if name == "sigmoid":
        def sigmoid_backward(e: Any, z: Any) -> Any:
            s = torch.sigmoid(z)
            return e * s * (1 - s)
        return torch.sigmoid, sigmoid_backward
    if name == "tanh":
        def tanh_backward(e: Any, z: Any) -> Any:
            t = torch.tanh(z)
            return e * (1 - t * t)
        return torch.tanh, tanh_backward
    # identity: the backward still hands δ on as a new tensor (a copy), like the hardware's write of δ_l.
    return (lambda z: z), (lambda e, _z: e.clone())


def layer_benchmarks(torch: Any, network: Network, layer: Layer,
                     generator: Any) -> dict[str, Callable[[], Any]]:
    """The computation of each atomic task of `layer`, as zero-argument callables over prepared tensors."""
    batch = network.batch
    rand = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    xs = [rand(batch, *shape) for shape in layer.in_shapes]
    x = xs[0]
    e = rand(batch, *layer.out_shape)
    f, f_backward = _activation_fns(torch, layer.activation)
    fn = torch.nn.functional
    op = layer.op
    benches: dict[str, Callable[[], Any]] = {}

    if isinstance(op, (Linear, Conv2d)):
        weight_shape = (op.out_features, x.shape[1]) if isinstance(op, Linear) else \
            (op.out_channels, x.shape[1] // op.groups, op.kernel_size, op.kernel_size)
        w = rand(*weight_shape)
        b = rand(weight_shape[0]) if op.bias else None
        if isinstance(op, Linear):
            forward = lambda: fn.linear(x, w, b)  # noqa: E731
            input_grad = lambda d: d @ w  # noqa: E731
            weight_grad = lambda d: d.t() @ x  # noqa: E731
            bias_dims: tuple[int, ...] = (0,)
        else:
            conv = {"stride": op.stride, "padding": op.padding, "groups": op.groups}
            forward = lambda: fn.conv2d(x, w, b, **conv)  # noqa: E731
            input_grad = lambda d: torch.nn.grad.conv2d_input(x.shape, w, d, **conv)  # noqa: E731
            weight_grad = lambda d: torch.nn.grad.conv2d_weight(x, w.shape, d, **conv)  # noqa: E731
            bias_dims = (0, 2, 3)
        z = forward()
        delta = f_backward(e, z)
        is_output = layer.index == len(network)
        target = rand(*z.shape)

        def a_task() -> Any:
            err = f(z) - target if is_output else e  # the output layer's e_L = a_L − y comes first
            return f_backward(err, z)

        def g_task() -> Any:
            g = weight_grad(delta)
            return (g, delta.sum(bias_dims)) if b is not None else g

        grad_w, grad_b = weight_grad(delta), (delta.sum(bias_dims) if b is not None else None)

        def u_task() -> None:
            w.sub_(grad_w, alpha=_LEARNING_RATE)
            if b is not None:
                b.sub_(grad_b, alpha=_LEARNING_RATE)

        benches.update(F=lambda: f(forward()), A=a_task, E=lambda: input_grad(delta), G=g_task, U=u_task)
    elif isinstance(op, Pool2d):
        k, s, p = op.kernel_size, op.effective_stride, op.padding
        if op.mode == "max":
            _, indices = fn.max_pool2d(x, k, s, p, return_indices=True)
            benches["F"] = lambda: fn.max_pool2d(x, k, s, p)
            benches["E"] = lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                e, x, [k, k], [s, s], [p, p], [1, 1], False, indices)
        else:
            benches["F"] = lambda: fn.avg_pool2d(x, k, s, p)
            benches["E"] = lambda: torch.ops.aten.avg_pool2d_backward(e, x, [k, k], [s, s], [p, p], False, True, None)
    elif isinstance(op, Flatten):
        benches["F"] = lambda: x.flatten(1)
        benches["E"] = lambda: e.reshape(x.shape)
    else:  # Activation and Add: elementwise, with the (fused) activation
        z = sum(xs[1:], start=x)  # the add's sum (a single input for a standalone activation)
        benches["F"] = lambda: f(sum(xs[1:], start=x))
        benches["E"] = lambda: f_backward(e, z)
    return benches


def profile_network(network: Network, repeats: int = 5, warmup: int = 1, seed: int = 0,
                    threads: int | None = 1) -> ProfiledModel:
    """Measure every task of every layer of `network` (see module docs).

    `threads` defaults to 1: one task runs on one core, as one processor of the modelled accelerator runs
    one task at a time; on a shared machine torch's thread pool also turns µs-scale ops into
    scheduler-quantum (~8 ms) steps. None keeps torch's own setting.
    """
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    torch = _import_torch()
    wanted: dict[int, list[str]] = {}
    for index, kind in network_costs(MacsModel(), network):
        wanted.setdefault(index, []).append(kind)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise InputError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(seed)
    times: dict[str, dict[str, int]] = {}
    try:
        with torch.no_grad():
            for layer in network.layers:
                benches = layer_benchmarks(torch, network, layer, generator)
                times[layer.name] = {kind: median_ns(benches[kind], repeats, warmup) for kind in wanted[layer.index]}
                del benches  # free this layer's tensors before the next one's (vgg16's fc6 is 400 MB)
    finally:
        torch.set_num_threads(saved_threads)
    return ProfiledModel(network.name, network.batch, times)

"""What the functional simulator and the PyTorch reference share: inputs and the version semantics.

Both train the same network from the same initial weights on the same data, given which weight version
every weight-reading task reads (design notes §3). This module defines those inputs once so the two
implementations cannot drift apart in anything but the arithmetic they are meant to cross-check.

- `make_data(network, samples, seed)` → {"x": (samples, *input_shape), "y": (samples, *output_shape)},
  float64: x uniform in [−1, 1), y = tanh(x T) for a fixed random teacher T (a learnable target in
  (−1, 1)). Iteration t trains on rows t·B .. t·B + B − 1 (B = network.batch).
- `init_weights(network, seed, fmt=None)` → {"W{l}": `weight_shape(layer)`, "b{l}": (out,)} per linear or
  conv2d layer (b only with a bias), uniform in ±1/√fan_in like torch's default; quantized to int64 when
  `fmt` is given.
- Version maps: {(kind, layer, t): version}. Keys with kind "F" are forward reads; any other kind that
  contains "E" (E, AE, EG, AEG) is the backward read of that layer and iteration. `Lags` is the compact
  form: F_l(t) reads version max(0, t − lag_F(l)), E_l(t) reads max(0, t − lag_E(l)).
- Updates: update k of layer l writes version k + 1 from version k and the gradient of
  `update_iterations(k)`: iteration k alone (asynchronous), or every micro-batch of step k summed
  (synchronous, m micro-batches per step: k·m .. k·m + m − 1), or, for a layer of an asynchronous schedule
  with update group g (`groups`: PipeDream's replicated stages sum a round of g micro-batches, PipeDream-2BW
  coalesces g = m), iterations k·g .. k·g + g − 1 summed — the same notion, per layer. The last group of a
  run may be cut short.
- Weight modes (what E reads): `stash` — the version F read; `latest` — the version in the map; `ema` —
  LayerPipe2's reconstruction of the version F read (v) from the version E sees (c):
      Ŵ^(v) = W^(c) + η·(c − v)·ḡ^(c),   ḡ^(k+1) = ḡ^(k) + 2^−m·(g_k − ḡ^(k)),  ḡ^(0) = 0,
  where g_k is the gradient update k applied and m = ema_shift (β = 1 − 2^−m). In fixed point the same
  with `FixedFormat.ema_average` / `ema_reconstruct` (η = 2^−lr_shift). When c = v it reads exactly
  what `stash` reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from layerpipe.dfg import WEIGHT_MODES
from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat
from layerpipe.network import Conv2d, Layer, Linear, Network, split_weights

__all__ = [
    "DEFAULT_EMA_SHIFT",
    "FUNCTIONAL_LAYER_KINDS",
    "WEIGHT_MODES",
    "Lags",
    "VersionMap",
    "check_groups",
    "check_mode",
    "check_supported",
    "init_weights",
    "make_data",
    "normalize_versions",
    "num_updates",
    "read_kind",
    "update_iterations",
    "versions_from_lags",
    "weight_shape",
]

#: (kind, layer, iteration) → weight version read.
VersionMap = Mapping[tuple[str, int, int], int]

#: m of the moving average's β = 1 − 2^−m. In `benchmarks/bench_ema.py`'s sweep β = 0.75 ended nearest the
#: stash run's final weights (per-read error 0.64x that of reading the current weights; β = 0.5 reads
#: better, 0.49x, but ends a little farther; β = 0.875 gives 0.80x and ends 4x farther).
DEFAULT_EMA_SHIFT = 2

FUNCTIONAL_LAYER_KINDS: tuple[str, ...] = ("linear", "conv2d", "pool", "activation", "add", "flatten")
FIXED_ACTIVATIONS: tuple[str, ...] = ("identity", "relu")


def check_mode(mode: str) -> str:
    if mode not in WEIGHT_MODES:
        raise InputError(f"mode '{mode}' is not one of {', '.join(WEIGHT_MODES)}")
    return mode


def check_supported(network: Network, fixed: bool) -> None:
    """Raise InputError unless the numerics implement every layer of `network`."""
    for layer in network.layers:
        if layer.kind not in FUNCTIONAL_LAYER_KINDS:
            raise InputError(
                f"functional mode supports {', '.join(FUNCTIONAL_LAYER_KINDS)} layers; got {layer.kind}"
                f" (layer '{layer.name}')"
            )
        if fixed and layer.activation not in FIXED_ACTIVATIONS:
            raise InputError(
                f"fixed-point mode supports activations {', '.join(FIXED_ACTIVATIONS)}; got {layer.activation}"
                f" (layer '{layer.name}')"
            )


def make_data(network: Network, samples: int, seed: int) -> dict[str, np.ndarray]:
    """Deterministic inputs and targets, float64 uniform in [−1, 1)."""
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise InputError(f"samples must be a positive integer, got {samples!r}")
    rng = np.random.default_rng([seed, 1])  # stream 1: data; init_weights uses stream 0
    x = rng.uniform(-1.0, 1.0, size=(samples, *network.input_shape))
    # A learnable target: a fixed random "teacher" y = tanh(x T) with T ~ N(0, 1/n_in), so losses fall and
    # gradients of successive samples are correlated, as in real training (pure noise targets are not).
    n_in, n_out = network.input_size, math.prod(network.output_shape)
    teacher = rng.normal(0.0, 1.0 / math.sqrt(n_in), size=(n_in, n_out))
    y = np.tanh(x.reshape(samples, n_in) @ teacher).reshape(samples, *network.output_shape)
    return {"x": x, "y": y}


def init_weights(network: Network, seed: int, fmt: FixedFormat | None = None) -> dict[str, np.ndarray]:
    """Initial weights keyed `W{layer}` (and `b{layer}`), float64, or int64 quantized to `fmt`.

    A split network (`split_layer`, `network.origin` set) starts from its source network's initial weights,
    sliced by rows (`split_weights`), so it can be compared with the unsplit run.
    """
    if network.origin is not None:
        out = split_weights(network, init_weights(network.origin.source, seed))
        return out if fmt is None else {key: fmt.quantize(value) for key, value in out.items()}
    rng = np.random.default_rng([seed, 0])
    out = {}
    for layer in network.layers:
        if not layer.has_weights:
            continue
        shape = weight_shape(layer)
        bound = 1.0 / math.sqrt(math.prod(shape[1:]))  # 1/√fan_in
        out[f"W{layer.index}"] = rng.uniform(-bound, bound, size=shape)
        if layer.has_bias:
            out[f"b{layer.index}"] = rng.uniform(-bound, bound, size=(shape[0],))
    if fmt is not None:
        out = {key: fmt.quantize(value) for key, value in out.items()}
    return out


def weight_shape(layer: Layer) -> tuple[int, ...]:
    """W's shape: (out, in) for linear, (out_channels, in_channels / groups, K, K) for conv2d."""
    op = layer.op
    if isinstance(op, Linear):
        return (layer.out_size, layer.in_size)
    if isinstance(op, Conv2d):
        # Several inputs are concatenated by channels (the consumer of a split layer).
        channels = sum(shape[0] for shape in layer.in_shapes)
        return (op.out_channels, channels // op.groups, op.kernel_size, op.kernel_size)
    raise InputError(f"layer '{layer.name}' ({layer.kind}) has no weight tensor the numerics know")


def read_kind(kind: str) -> str:
    """The read a task kind performs: "F" for forward, "E" for any backward kind containing E."""
    if kind == "F":
        return "F"
    if "E" in kind:
        return "E"
    raise InputError(f"version map: kind '{kind}' does not read weights (F or a kind containing E)")


def normalize_versions(versions: VersionMap) -> dict[tuple[str, int, int], int]:
    """The map with fused backward kinds (AE, EG, AEG) folded into "E"; non-reading kinds are an error."""
    out: dict[tuple[str, int, int], int] = {}
    for (kind, layer, t), version in versions.items():
        if version < 0:
            raise InputError(f"version map: {kind}{layer}.{t} reads version {version}; versions are >= 0")
        out[(read_kind(kind), layer, t)] = version
    return out


@dataclass(frozen=True)
class Lags:
    """Per-layer version lags: F_l(t) reads max(0, t − forward[l]), E_l(t) reads max(0, t − backward[l]).

    Missing layers have lag 0. A backward lag of −1 means E reads the version its own iteration's update
    writes (E ran after U); smaller values would need gradients of later iterations.
    """

    forward: Mapping[int, int] = field(default_factory=dict)
    backward: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, lags, low in (("forward", self.forward, 0), ("backward", self.backward, -1)):
            for layer, lag in lags.items():
                if not isinstance(lag, int) or isinstance(lag, bool) or lag < low:
                    raise InputError(f"lags.{name}[{layer}] must be an integer >= {low}, got {lag!r}")

    @staticmethod
    def uniform(network: Network, forward: Mapping[int, int], backward: Mapping[int, int] | None = None) -> Lags:
        """Lags given for F; E gets `backward` or the same lags."""
        return Lags(dict(forward), dict(forward if backward is None else backward))

    def version(self, kind: str, layer: int, t: int) -> int:
        lag = (self.forward if kind == "F" else self.backward).get(layer, 0)
        return max(0, t - lag)


def versions_from_lags(
    network: Network, lags: Lags, iterations: int, synchronous: bool = False, microbatches: int = 1
) -> dict[tuple[str, int, int], int]:
    """The full version map of `lags` for iterations 0..T−1 (synchronous: every read of step j reads j).

    Entries exist for F of every weight layer and E of every weight layer that has an E task.
    """
    if synchronous and microbatches < 1:
        raise InputError(f"microbatches must be a positive integer, got {microbatches!r}")
    out: dict[tuple[str, int, int], int] = {}
    for layer in network.layers:
        if not layer.has_weights:
            continue
        kinds = ("F",) if layer.takes_network_input else ("F", "E")
        for t in range(iterations):
            for kind in kinds:
                out[(kind, layer.index, t)] = t // microbatches if synchronous else lags.version(kind, layer.index, t)
    return out


def update_iterations(update: int, iterations: int, synchronous: bool, microbatches: int, group: int = 1) -> range:
    """The iterations whose summed gradient update number `update` applies (see the module docstring);
    `group` is the layer's update group g of an asynchronous schedule."""
    size = microbatches if synchronous else group
    return range(update * size, min((update + 1) * size, iterations))


def num_updates(iterations: int, synchronous: bool, microbatches: int, group: int = 1) -> int:
    """Updates per weight layer over a run of `iterations`: one per (partial) step or group of g iterations."""
    return -(-iterations // (microbatches if synchronous else group))


def check_groups(groups: object) -> dict[int, int]:
    """Update groups as {layer: g >= 1} from pairs or a mapping; anything else is an InputError."""
    pairs = groups.items() if isinstance(groups, Mapping) else groups
    if not isinstance(pairs, Iterable):
        raise InputError(f"groups must be (layer, g) pairs, got {groups!r}")
    try:
        out: dict[int, int] = dict(pairs)
    except (TypeError, ValueError):
        raise InputError(f"groups must be (layer, g) pairs, got {groups!r}") from None
    for layer, g in out.items():
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise InputError(f"groups: layer {layer} has group {g!r}; a group is a positive integer")
    return out

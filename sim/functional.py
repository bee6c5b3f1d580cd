"""Functional mode: the numerics of a schedule, op by op, in the simulated order and with the simulated versions.

`run_functional` executes layer-level ops (DFG task kinds F, A, E, G, U and the fused AE, EG, AG, AEG) in
the order given — the simulator's order: ops sorted by start time (`order_by_start` breaks ties) —
and every F and E reads the weight version the version map gives (design notes §3, `layerpipe.numerics`).
Stage-level synchronous schedules run through `layerpipe.schedule.expand_stages` first, which turns them
into layer tasks with one explicit U_l(j) per layer and step j.

Arithmetic is float64, or the fixed-point format of `layerpipe.fixedpoint` (bit for bit what the integer
PyTorch reference and the RTL compute). What each task does, for a micro-batch of B rows:

| task | linear / conv2d layer l (W, optional b, act. f)    | weightless layer (pool, activation, add, flatten) |
|------|----------------------------------------------------|---------------------------------------------------|
| F    | z = a_in Wᵀ + b (or conv), a = f(z); keep a_in, z  | z = pool(input), Σ inputs (add) or input; a = f(z) |
|      | (several inputs: a_in is their concatenation)      |                                                   |
| A    | δ = e ⊙ f'(z), e = Σ of the consumers' errors      | —                                                 |
| E    | e_in = δ W (conv: transposed conv), W per the mode | e_in = pool backward of e ⊙ f'(z), or it reshaped |
|      | (several inputs: each its slice of e_in)           |                                                   |
| G    | g = δᵀ a_in (conv: Σ over positions), g_b = Σ δ    | —                                                 |
| U    | update k: version k+1 = version k − η·Σ g over the iterations of update k (one, a step, or a group) |

The output layer's error is e_L = a_L − y (loss ½‖a_L − y‖² per sample, recorded at F_L). Weight modes:
`stash` — E reads the version F read; `latest` — the version the map gives E; `ema` — LayerPipe2's
reconstruction Ŵ^(v) = W^(c) + η·(c − v)·ḡ^(c) of the version v that F read, from the version c the map
gives E and the moving average ḡ ← ḡ + 2^−m·(g − ḡ) of the applied gradients (see `layerpipe.numerics`).
In `ema` mode every E read also measures ‖Ŵ^(v) − W^(v)‖ / ‖W^(v)‖ against the exact stashed weights
(`FunctionalResult.ema_error`); `latest` and `ema` record the uncorrected ‖W^(c) − W^(v)‖ / ‖W^(v)‖
(`stale_error`) for comparison.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from layerpipe.dfg import GraphOptions, backward_groups
from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat, check_lr_shift, lr_shift_of
from layerpipe.network import INPUT, Conv2d, Layer, Linear, Network, Pool2d
from layerpipe.numerics import (
    DEFAULT_EMA_SHIFT,
    VersionMap,
    check_groups,
    check_mode,
    check_supported,
    normalize_versions,
    update_iterations,
    weight_shape,
)
from layerpipe.schedule import Op
from layerpipe.sim._arith import Arithmetic, FixedArithmetic, FloatArithmetic

__all__ = [
    "FunctionalConfig",
    "FunctionalResult",
    "order_by_start",
    "run_functional",
    "sequential_ops",
]


@dataclass(frozen=True)
class FunctionalConfig:
    """How to execute: arithmetic (`fmt` None = float64), weight mode, learning rate, update grouping.

    In fixed point `lr` must be 2^−k (applied as a rounded shift by k). `ema_shift` m sets the moving
    average's β = 1 − 2^−m.
    """

    mode: str = "stash"
    lr: float = 2.0**-4
    fmt: FixedFormat | None = None
    ema_shift: int = DEFAULT_EMA_SHIFT
    synchronous: bool = False
    microbatches: int = 1
    #: (layer, g): update groups of an asynchronous schedule (`OpSchedule.groups`): U_l(k) applies the summed
    #: gradients of iterations k·g … k·g + g − 1 (PipeDream's replicas, PipeDream-2BW).
    groups: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_groups(self.groups)
        check_lr_shift(self.ema_shift, "ema_shift")
        if not (isinstance(self.lr, float | int) and math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.fmt is not None:
            lr_shift_of(self.lr)
        if self.synchronous and (not isinstance(self.microbatches, int) or self.microbatches < 1):
            raise InputError(f"microbatches must be a positive integer, got {self.microbatches!r}")

    def arithmetic(self) -> Arithmetic:
        if self.fmt is None:
            return FloatArithmetic(self.lr, self.ema_shift)
        return FixedArithmetic(self.fmt, lr_shift_of(self.lr), self.ema_shift)


@dataclass
class FunctionalResult:
    """Final weights (keys like `init_weights`), per-sample losses in sample order, and EMA error figures."""

    weights: dict[str, np.ndarray]
    losses: np.ndarray
    updates: dict[int, int]  #: layer → updates applied
    #: per E read in `ema` mode: ‖Ŵ^(v) − W^(v)‖ / ‖W^(v)‖, the reconstruction against the stashed weights
    ema_error: list[float] = field(default_factory=list)
    #: per E read in `latest` and `ema` modes: ‖W^(c) − W^(v)‖ / ‖W^(v)‖, the error of reading W^(c) as is
    stale_error: list[float] = field(default_factory=list)

    @property
    def ema_error_max(self) -> float:
        return max(self.ema_error, default=0.0)

    @property
    def ema_error_mean(self) -> float:
        return float(np.mean(self.ema_error)) if self.ema_error else 0.0


def order_by_start(starts: Iterable[tuple[Op, int] | tuple[Op, int, int]]) -> list[Op]:
    """The simulated order: ops by start time; ties by end time, then dataflow rank, processor, order given.

    Takes (op, start) or (op, start, end) pairs. Ties matter only behind zero-cycle ops (a flatten costs
    nothing): a consumer may then start at the very cycle its producer starts and ends. Ending first and,
    among ops that start and end together, the order of one iteration's dataflow (`_dataflow_rank`) put
    the producer first; otherwise the processor, then the order given (program order) decide.
    """
    keyed = []
    for index, item in enumerate(starts):
        op, start = item[0], item[1]
        end = item[2] if len(item) == 3 else start
        keyed.append(((start, end, op.iteration, _dataflow_rank(op), op.proc, index), op))
    keyed.sort(key=lambda pair: pair[0])
    return [op for _, op in keyed]


def _dataflow_rank(op: Op) -> tuple[int, int, int]:
    """A topological order of one iteration's tasks: forwards by layer, then backwards by reverse layer
    (consumers before producers), A before E before G before U within a layer."""
    if op.kind == "F":
        return (0, op.unit, 0)
    return (1, -op.unit, "AEGU".index(op.kind[0]))


def sequential_ops(
    network: Network,
    iterations: int,
    options: GraphOptions | None = None,
    synchronous: bool = False,
    microbatches: int = 1,
) -> list[Op]:
    """Plain sequential training as an op list on processor 0 (a reference order for hand-made version maps).

    Iteration by iteration: F in layer order, then per layer in reverse order its backward tasks (the
    graph's groups under `options`). Asynchronous: U_l(t) follows G_l(t) and comes before a separate E_l(t),
    so E may read its own iteration's update (a backward lag of −1). Synchronous: U_l(j) follows the layer's
    backward of the last micro-batch of step j.
    """
    options = options or GraphOptions()
    ops: list[Op] = []
    for t in range(iterations):
        ops += [Op(0, "F", layer.index, t) for layer in network.layers]
        step_ends = t == min(iterations, (t // microbatches + 1) * microbatches) - 1
        for layer in reversed(network.layers):
            groups = backward_groups(layer, options)
            l = layer.index
            if not layer.has_weights:
                ops += [Op(0, kind, l, t) for kind in groups]
            elif synchronous:
                ops += [Op(0, kind, l, t) for kind in groups]
                if step_ends:
                    ops.append(Op(0, "U", l, t // microbatches))
            else:
                ops += [Op(0, kind, l, t) for kind in groups if kind != "E"]
                ops.append(Op(0, "U", l, t))
                ops += [Op(0, kind, l, t) for kind in groups if kind == "E"]
    return ops


_T = TypeVar("_T")


@dataclass(frozen=True)
class _Kept:
    """What a layer's forward keeps for its backward: z, a = f(z) and (linear layers) the input."""

    z: np.ndarray
    a: np.ndarray
    a_in: np.ndarray | None = None  # linear, conv2d and pool layers keep their input
    argmax: np.ndarray | None = None  # max pooling: the winning position of every window


@dataclass
class _Version:
    weights: np.ndarray
    bias: np.ndarray | None
    average: np.ndarray  # ḡ^(k) of W (the EMA mode reconstructs W only: E never reads the bias)


class _Executor:
    """State of one functional run; `run` executes the ops one by one."""

    def __init__(
        self,
        network: Network,
        init: Mapping[str, np.ndarray],
        data: Mapping[str, np.ndarray],
        versions: VersionMap,
        config: FunctionalConfig,
        ops: Sequence[Op],
    ) -> None:
        self.network, self.config, self.ops = network, config, ops
        self.arith = config.arithmetic()
        self.versions = normalize_versions(versions)
        self.iterations = 1 + max((op.iteration for op in ops if op.kind == "F"), default=-1)
        batch = network.batch
        rows = self.iterations * batch
        for key in ("x", "y"):
            if key not in data:
                raise InputError(f"data has no '{key}' array")
            if len(data[key]) < rows:
                raise InputError(
                    f"data '{key}' has {len(data[key])} samples; {self.iterations} iterations of "
                    f"batch {batch} need {rows}"
                )
        self.x = self.arith.encode(np.asarray(data["x"][:rows]))
        self.y = self.arith.encode(np.asarray(data["y"][:rows]))
        self.losses = np.zeros(rows)
        self.history: dict[int, dict[int, _Version]] = {}
        self.current: dict[int, int] = {}
        for layer in network.layers:
            if layer.has_weights:
                shape = weight_shape(layer)
                w = self.arith.encode(_require(init, f"W{layer.index}", shape))
                b = None
                if layer.has_bias:
                    b = self.arith.encode(_require(init, f"b{layer.index}", shape[:1]))
                self.history[layer.index] = {0: _Version(w, b, np.zeros_like(w))}
                self.current[layer.index] = 0
        # Per iteration: outputs, kept values, incoming errors, deltas, gradients; freed when it is done.
        self.outputs: dict[tuple[int, int], np.ndarray] = {}
        self.kept: dict[tuple[int, int], _Kept] = {}
        self.errors: dict[tuple[int, int], list[np.ndarray]] = {}
        self.deltas: dict[tuple[int, int], np.ndarray] = {}
        self.grads: dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]] = {}
        # Ops still to run per iteration (U ops count updates, not iterations), to free an iteration's data.
        self.pending = Counter(op.iteration for op in ops if op.kind != "U")
        # Error contributions a layer's backward waits for: one per consumer input slot, plus the loss.
        self.error_sources = {layer.index: 0 for layer in network.layers}
        self.error_sources[len(network)] += 1
        for layer in network.layers:
            for src in layer.inputs:
                if src != INPUT:
                    self.error_sources[src] += 1
        self.last_read = self._last_reads()
        self.ema_error: list[float] = []
        self.stale_error: list[float] = []

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _read_version(self, kind: str, layer: int, t: int) -> int:
        try:
            return self.versions[(kind, layer, t)]
        except KeyError:
            raise InputError(f"version map has no entry for {kind}{layer}.{t}") from None

    def _backward_reads(self, layer: int, t: int) -> tuple[int, int]:
        """(version whose weights E uses as its base, version F read)."""
        v_f = self._read_version("F", layer, t)
        if self.config.mode == "stash":
            return v_f, v_f
        return self._read_version("E", layer, t), v_f

    def _last_reads(self) -> dict[tuple[int, int], int]:
        """(layer, version) → index of the last op that reads it, so older versions can be dropped."""
        last: dict[tuple[int, int], int] = {}
        for i, op in enumerate(self.ops):
            if op.unit not in self.history or op.kind == "U":
                continue
            if op.kind == "F":
                last[(op.unit, self._read_version("F", op.unit, op.iteration))] = i
            elif "E" in op.kind:
                for v in self._backward_reads(op.unit, op.iteration):
                    last[(op.unit, v)] = i
        return last

    def _version(self, layer: int, v: int, op: Op) -> _Version:
        try:
            return self.history[layer][v]
        except KeyError:
            raise InputError(
                f"functional mode: {op} reads version {v} of layer {layer}, but {self.current[layer]} updates "
                "have been applied when it runs"
            ) from None

    def _drop_unread(self, layer: int, index: int) -> None:
        history = self.history[layer]
        for v in [v for v in history if v != self.current[layer] and self.last_read.get((layer, v), -1) <= index]:
            del history[v]

    def _get(self, store: Mapping[tuple[int, int], _T], layer: int, t: int, what: str, op: Op) -> _T:
        try:
            return store[(layer, t)]
        except KeyError:
            raise InputError(
                f"functional mode: {op} ran before {what} of layer {layer}, iteration {t} existed "
                "(the op order breaks a dependency)"
            ) from None

    # -- execution ------------------------------------------------------------------------------------

    def run(self) -> FunctionalResult:
        for index, op in enumerate(self.ops):
            layer = self.network.layer(op.unit)
            if op.kind == "U":
                self._update(layer, op, index)
                continue
            if op.kind == "F":
                self._forward(layer, op)
            else:
                for atomic in op.kind:
                    {"A": self._activation_backward, "E": self._input_gradient, "G": self._weight_gradient}[atomic](
                        layer, op
                    )
            if layer.has_weights:
                self._drop_unread(layer.index, index)
            self.pending[op.iteration] -= 1
            if self.pending[op.iteration] == 0:
                self._free(op.iteration)
        return FunctionalResult(
            self._final_weights(), self.losses, dict(self.current), self.ema_error, self.stale_error
        )

    def _forward(self, layer: Layer, op: Op) -> None:
        t, arith = op.iteration, self.arith
        batch = self.network.batch
        inputs = [
            self.x[t * batch : (t + 1) * batch] if src == INPUT else self._get(self.outputs, src, t, "the output", op)
            for src in layer.inputs
        ]
        a_in, argmax, op_ = inputs[0], None, layer.op
        if isinstance(op_, Linear | Conv2d):
            if len(inputs) > 1:  # several inputs are read concatenated (features or channels): a split layer's parts
                a_in = np.concatenate(inputs, axis=1)
            version = self._version(layer.index, self._read_version("F", layer.index, t), op)
            if isinstance(op_, Linear):
                z = arith.linear(version.weights, a_in, version.bias)
            else:
                z = arith.conv(version.weights, a_in, version.bias, op_)
        elif isinstance(op_, Pool2d):
            z, argmax = arith.pool(a_in, op_)
        elif layer.kind == "add":
            z = arith.add(inputs)
        elif layer.kind == "flatten":
            z = inputs[0].reshape(batch, -1)
        else:
            z = inputs[0]
        a = arith.activate(z, layer.activation)
        self.outputs[(layer.index, t)] = a
        self.kept[(layer.index, t)] = _Kept(z, a, a_in, argmax)
        if layer.index == len(self.network):
            y = self.y[t * batch : (t + 1) * batch]
            self.losses[t * batch : (t + 1) * batch] = arith.loss(a, y)
            self.errors[(layer.index, t)] = [arith.output_error(a, y)]

    def _incoming_error(self, layer: Layer, op: Op) -> np.ndarray:
        parts = self._get(self.errors, layer.index, op.iteration, "the error", op)
        expected = self.error_sources[layer.index]
        if len(parts) != expected:
            raise InputError(
                f"functional mode: {op} ran with {len(parts)} of {expected} error contributions "
                "(the op order breaks a dependency)"
            )
        return self.arith.add(parts)

    def _activation_backward(self, layer: Layer, op: Op) -> None:
        kept = self._get(self.kept, layer.index, op.iteration, "the kept forward values", op)
        self.deltas[(layer.index, op.iteration)] = self.arith.activation_grad(
            self._incoming_error(layer, op), kept.z, kept.a, layer.activation
        )

    def _input_gradient(self, layer: Layer, op: Op) -> None:
        t, arith = op.iteration, self.arith
        if layer.has_weights:
            delta = self._get(self.deltas, layer.index, t, "δ", op)
            weights = self._backward_weights(layer.index, op)
            if isinstance(layer.op, Conv2d):
                shape = (sum(s[0] for s in layer.in_shapes), *layer.in_shapes[0][1:])
                e_in = [arith.conv_input_gradient(weights, delta, layer.op, shape)]
            else:
                e_in = [arith.input_gradient(weights, delta)]
            if len(layer.inputs) > 1:  # concatenated inputs: each gets its slice of Wᵀδ
                cuts = np.cumsum([s[0] for s in layer.in_shapes])[:-1]
                e_in = np.split(e_in[0], cuts, axis=1)
        else:
            kept = self._get(self.kept, layer.index, t, "the kept forward values", op)
            delta = arith.activation_grad(self._incoming_error(layer, op), kept.z, kept.a, layer.activation)
            if isinstance(layer.op, Pool2d):
                assert kept.argmax is not None
                e_in = [arith.pool_backward(delta, kept.argmax, layer.op, layer.in_shapes[0])]
            else:  # flatten, activation, add: the error keeps its values, in each input's shape
                e_in = [delta.reshape((len(delta), *shape)) for shape in layer.in_shapes]
        for src, error in zip(layer.inputs, e_in * len(layer.inputs) if len(e_in) == 1 else e_in, strict=True):
            if src != INPUT:
                self.errors.setdefault((src, t), []).append(error)

    def _backward_weights(self, layer: int, op: Op) -> np.ndarray:
        current, v_f = self._backward_reads(layer, op.iteration)
        base = self._version(layer, current, op)
        if self.config.mode == "stash":
            return base.weights
        exact = self._version(layer, v_f, op).weights
        self.stale_error.append(self._relative_error(base.weights, exact))
        if self.config.mode == "latest":
            return base.weights
        rebuilt = self.arith.ema_reconstruct(base.weights, base.average, current - v_f)
        self.ema_error.append(self._relative_error(rebuilt, exact))
        return rebuilt

    def _relative_error(self, approx: np.ndarray, exact: np.ndarray) -> float:
        """‖approx − exact‖ / ‖exact‖ in real units (the absolute error when exact is 0)."""
        exact_f = self.arith.decode(exact)
        norm = float(np.linalg.norm(exact_f))
        diff = float(np.linalg.norm(self.arith.decode(approx) - exact_f))
        return diff / norm if norm else diff

    def _weight_gradient(self, layer: Layer, op: Op) -> None:
        delta = self._get(self.deltas, layer.index, op.iteration, "δ", op)
        a_in = self._get(self.kept, layer.index, op.iteration, "the kept input", op).a_in
        assert a_in is not None
        if isinstance(layer.op, Conv2d):
            self.grads[(layer.index, op.iteration)] = self.arith.conv_weight_gradient(delta, a_in, layer.op)
        else:
            self.grads[(layer.index, op.iteration)] = self.arith.weight_gradient(delta, a_in, layer.has_bias)

    def _update(self, layer: Layer, op: Op, index: int) -> None:
        l, k = layer.index, op.iteration
        if k != self.current[l]:
            raise InputError(
                f"functional mode: {op} is update {k} of layer {l}, but {self.current[l]} updates "
                "have been applied (updates run in order)"
            )
        cfg = self.config
        its = update_iterations(k, self.iterations, cfg.synchronous, cfg.microbatches, dict(cfg.groups).get(l, 1))
        try:
            grads = [self.grads.pop((l, t)) for t in its]
        except KeyError:
            raise InputError(
                f"functional mode: {op} ran before the gradients of iterations {list(its)} existed"
            ) from None
        g_w = self.arith.sum_gradients([g for g, _ in grads])
        old = self.history[l][k]
        new = _Version(self.arith.sgd(old.weights, g_w), None, self.arith.ema_average(old.average, g_w))
        if old.bias is not None:
            new.bias = self.arith.sgd(old.bias, self.arith.sum_gradients([gb for _, gb in grads if gb is not None]))
        self.history[l][k + 1] = new
        self.current[l] = k + 1
        self._drop_unread(l, index)

    def _free(self, t: int) -> None:
        for store in (self.outputs, self.kept, self.errors, self.deltas):
            for key in [key for key in store if key[1] == t]:
                del store[key]

    def _final_weights(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for l, v in self.current.items():
            version = self.history[l][v]
            out[f"W{l}"] = version.weights
            if version.bias is not None:
                out[f"b{l}"] = version.bias
        return out


def _require(init: Mapping[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
    if key not in init:
        raise InputError(f"initial weights have no '{key}'")
    value = np.asarray(init[key])
    if value.shape != shape:
        raise InputError(f"initial weights '{key}' have shape {value.shape}, the network needs {shape}")
    return value


def run_functional(
    network: Network,
    ops: Sequence[Op],
    versions: VersionMap,
    init: Mapping[str, np.ndarray],
    data: Mapping[str, np.ndarray],
    config: FunctionalConfig | None = None,
) -> FunctionalResult:
    """Execute layer-level `ops` in the order given, reading the versions of `versions`.

    `ops` are layer-level (a stage-level synchronous schedule goes through `expand_stages` first); U ops
    carry the update number (the iteration for asynchronous runs, the step for synchronous ones).
    `init` and `data` come from `layerpipe.numerics.init_weights` / `make_data` (float arrays are
    quantized in fixed point; integer arrays are taken as already quantized). Raises InputError when the
    network has layers the numerics do not support, when a version is read before it is written, or when
    the order breaks a data dependency.
    """
    config = config or FunctionalConfig()
    check_supported(network, fixed=config.fmt is not None)
    for op in ops:
        if op.kind not in ("F", "A", "E", "G", "U", "AE", "EG", "AG", "AEG"):
            raise InputError(f"functional mode runs layer-level ops; got kind '{op.kind}' in {op}")
        if not 1 <= op.unit <= len(network):
            raise InputError(f"op {op}: layer {op.unit} is not in 1..{len(network)}")
    return _Executor(network, init, data, versions, config, ops).run()

"""Splitting one layer by output rows (linear) or output channels (conv2d): an equivalent network.

Issue 9's third placement family: a heavy layer's F, E, G (and U) split over several processors with the
weights stationary, so only activations and errors cross processors. As a network transform that is exact
model parallelism in the Megatron-LM sense (Shoeybi et al. 2019, §3: a linear layer's weight split by
output rows, each part computing its slice of the output): layer l (W of shape n_out × n_in) becomes
`parts` layers l.0 … l.(k−1), part j holding rows r_j … r_{j+1} − 1 of W (and of the bias), with the same
inputs and activation; every consumer of l reads all the parts as its inputs, which linear and conv2d take
as their concatenation (features, or channels: `_ops.py`). So

    F:  a_l = f(W a_in) = concat_j f(W_j a_in)            (each part one slice of the output)
    E:  e_in = Wᵀ δ_l = Σ_j W_jᵀ δ_j                      (the producer sums the parts' errors)
    G:  g = δ_l a_inᵀ = stack_j δ_j a_inᵀ                 (each part its own rows, no sum)

and the consumer's F, E, G see exactly the unsplit tensors (its input is the concatenation; its E hands each
part its slice of Wᵀδ). In float64 only E's sum is reordered, so training equals the unsplit network's to
rounding; in fixed point each part's E is rescaled and saturated on its own before the producer sums them,
so a split network is its own bit-exact network (the same in the numpy simulator and the integer reference),
not the unsplit one bit for bit.

Where it simplifies: the output layer is not split (the loss ½‖a_L − y‖² reads one layer's output and there
is no concatenation layer for it), nor a layer feeding add, pooling, flatten or an activation (they do not
read concatenations); conv2d only with groups = 1. Parts are contiguous and as even as possible (the first
n_out mod k parts one row larger). Initial weights of a split network are the unsplit network's initial
weights sliced (`split_weights`), so the two runs start from the same point and can be compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from layerpipe.errors import InputError
from layerpipe.network._graph import INPUT, Network, NetworkBuilder, Origin
from layerpipe.network._ops import Conv2d, LayerOp, Linear

__all__ = ["merge_weights", "part_name", "part_rows", "split_layer", "split_refusal", "split_weights"]

#: Layer kinds that read several inputs as their concatenation, so they may consume a split layer.
CONCATENATING_KINDS: tuple[str, ...] = ("linear", "conv2d")


def part_name(layer: str, part: int) -> str:
    """The name of part `part` of split layer `layer`."""
    return f"{layer}.{part}"


def part_rows(rows: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) row ranges of `parts` parts of `rows` rows, as even as possible."""
    base, extra = divmod(rows, parts)
    out, start = [], 0
    for j in range(parts):
        stop = start + base + (1 if j < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _rows_of(network: Network, index: int) -> int:
    op = network.layer(index).op
    if isinstance(op, Linear):
        return op.out_features
    if isinstance(op, Conv2d):
        return op.out_channels
    raise TypeError(f"layer {index} is {type(op).__name__}: only linear and conv2d layers have rows to split")


def split_refusal(network: Network, layer: str | int, parts: int) -> str | None:
    """Why `split_layer(network, layer, parts)` is refused (a one-line reason), or None if it is allowed."""
    index = network.index_of(layer) if isinstance(layer, str) else layer
    if not 1 <= index <= len(network):
        return f"split layer {index} is not in 1..{len(network)}"
    target = network.layer(index)
    name = target.name
    if target.kind not in CONCATENATING_KINDS or not target.has_weights:
        return (f"split layer '{name}' is a {target.kind} layer without weights to split; only linear (by output "
                "rows) and conv2d (by output channels) layers split")
    if isinstance(target.op, Conv2d) and target.op.groups != 1:
        return f"split layer '{name}': conv2d splits only with groups=1, got groups={target.op.groups}"
    rows = _rows_of(network, index)
    if not isinstance(parts, int) or isinstance(parts, bool) or not 2 <= parts <= rows:
        return f"split parts of layer '{name}' must be an integer in 2..{rows} (its output rows), got {parts!r}"
    if index == len(network):
        return (f"split layer '{name}' is the output layer: the loss reads one layer's output and no layer "
                "concatenates the parts for it")
    for consumer in network.consumers(index):
        kind = network.layer(consumer).kind
        if kind not in CONCATENATING_KINDS:
            return (f"split layer '{name}' feeds '{network.layer(consumer).name}' ({kind}), which cannot read "
                    f"a concatenation; only {', '.join(CONCATENATING_KINDS)} consumers can")
    taken = {layer_.name for layer_ in network.layers}
    clash = [part_name(name, j) for j in range(parts) if part_name(name, j) in taken]
    if clash:
        return f"split layer '{name}': the network already has a layer named '{clash[0]}'"
    return None


def split_layer(network: Network, layer: str | int, parts: int) -> Network:
    """The network with linear or conv2d layer `layer` (name or 1-based index) split into `parts` layers by
    output rows / channels; its consumers read the parts concatenated. Named `<name>|split <layer>x<parts>`,
    with `origin` recording the network it came from. Raises InputError (one line) when refused."""
    reason = split_refusal(network, layer, parts)
    if reason is not None:
        raise InputError(reason)
    index = network.index_of(layer) if isinstance(layer, str) else layer
    target = network.layer(index)
    names = {INPUT: "input"}
    builder = NetworkBuilder(f"{network.name}|split {target.name}x{parts}", network.input_shape, network.batch)
    for old in network.layers:
        sources = [names[i] for i in old.inputs]
        if old.index == index:
            for j, (start, stop) in enumerate(part_rows(_rows_of(network, index), parts)):
                builder.add(part_name(old.name, j), _part_op(old.op, stop - start), sources)
            names[old.index] = target.name
            continue
        expanded: list[str] = []
        for i, src in zip(old.inputs, sources, strict=True):
            expanded += [part_name(src, j) for j in range(parts)] if i == index else [src]
        builder.add(old.name, old.op, expanded)
        names[old.index] = old.name
    built = builder.build()
    return Network(built.name, built.input_shape, built.layers, built.batch,
                   origin=Origin(network, target.name, parts))


def _part_op(op: LayerOp, rows: int) -> Linear | Conv2d:
    """`op` (linear or conv2d) with `rows` output rows / channels."""
    if isinstance(op, Linear):
        return replace(op, out_features=rows)
    assert isinstance(op, Conv2d), "split_refusal admits linear and conv2d only"
    return replace(op, out_channels=rows)


def split_weights(network: Network, source_weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights of split network `network` (keys `W{l}`, `b{l}`) from its source network's weights: each part
    its rows of the split layer's W and b, every other layer its own weights (its index may have moved)."""
    origin = _origin(network)
    source = origin.source
    out: dict[str, np.ndarray] = {}
    for layer in network.layers:
        if not layer.has_weights:
            continue
        rows: tuple[int, int] | None = None
        name = layer.name
        for j, span in enumerate(part_rows(_rows_of(source, source.index_of(origin.layer)), origin.parts)):
            if name == part_name(origin.layer, j):
                name, rows = origin.layer, span
        k = source.index_of(name)
        for prefix in ("W", "b"):
            key = f"{prefix}{k}"
            if key in source_weights:
                value = np.asarray(source_weights[key])
                out[f"{prefix}{layer.index}"] = value if rows is None else value[rows[0]:rows[1]].copy()
    return out


def merge_weights(network: Network, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of `split_weights`: a split network's weights keyed as its source network's (parts stacked
    back by rows), so runs of the two can be compared."""
    origin = _origin(network)
    source = origin.source
    out: dict[str, np.ndarray] = {}
    for layer in source.layers:
        if not layer.has_weights:
            continue
        if layer.name == origin.layer:
            indices = [network.index_of(part_name(layer.name, j)) for j in range(origin.parts)]
        else:
            indices = [network.index_of(layer.name)]
        for prefix in ("W", "b"):
            found = [np.asarray(weights[f"{prefix}{i}"]) for i in indices if f"{prefix}{i}" in weights]
            if found:
                out[f"{prefix}{layer.index}"] = np.concatenate(found, axis=0)
    return out


def _origin(network: Network) -> Origin:
    if network.origin is None:
        raise InputError(f"network '{network.name}' is not a split network (it has no origin)")
    return network.origin

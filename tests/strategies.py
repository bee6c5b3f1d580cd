"""Hypothesis strategies shared by the test suite.

`networks()` draws valid `Network`s of linear layers: chains with random widths and, when `dag=True`,
residual blocks whose `add` joins the block's input with its output (a real DAG, like a ResNet block).
Other engineers' property tests build on it, so its output is always a network `NetworkBuilder` accepts.

`stage_maps(network, max_stages)` draws a non-decreasing stage assignment of a network's layers.
"""

from __future__ import annotations

from hypothesis import strategies as st

from layerpipe.network import ACTIVATIONS, Add, Linear, Network, NetworkBuilder

__all__ = ["networks", "stage_maps"]


@st.composite
def networks(
    draw: st.DrawFn,
    max_layers: int = 8,
    dag: bool = True,
    min_width: int = 1,
    max_width: int = 16,
    max_batch: int = 1,
    activations: tuple[str, ...] = ("relu", "identity"),
) -> Network:
    """A random valid network of at most `max_layers` layers (at least 1).

    Chains are sequences of `linear` layers. With `dag=True` the strategy may also emit residual blocks:
    one or two linear layers that return to the block's input width, then an `add` (with a fused
    activation) of the block's input and its output. A block may start at the network input, so the
    network input can feed several layers.
    """
    if max_layers < 1:
        raise ValueError("max_layers must be >= 1")
    for a in activations:
        if a not in ACTIVATIONS:
            raise ValueError(f"unknown activation {a!r}")
    width = st.integers(min_width, max_width)
    act = st.sampled_from(activations)
    in_width = draw(width)
    batch = draw(st.integers(1, max_batch))
    builder = NetworkBuilder("random", (in_width,), batch)
    prev, prev_width, count = "input", in_width, 0
    target = draw(st.integers(1, max_layers))
    while count < target:
        room = target - count
        # A residual block needs 2 or 3 layers (1 or 2 linears + the add).
        if dag and room >= 2 and draw(st.booleans()):
            inner = draw(st.integers(1, min(2, room - 1)))
            block_in, name = prev, f"b{count}"
            cur = prev
            for j in range(inner):
                out = prev_width if j == inner - 1 else draw(width)
                builder.add(f"{name}.fc{j}", Linear(out, activation=draw(act)), [cur])
                cur = f"{name}.fc{j}"
            builder.add(f"{name}.add", Add(activation=draw(act)), [cur, block_in])
            prev, count = f"{name}.add", count + inner + 1
        else:
            out = draw(width)
            builder.add(f"fc{count}", Linear(out, activation=draw(act)), [prev])
            prev, prev_width, count = f"fc{count}", out, count + 1
    return builder.build()


@st.composite
def stage_maps(draw: st.DrawFn, network: Network, max_stages: int = 4) -> list[int]:
    """A stage per layer (layer order), starting at 0, non-decreasing, each step +0 or +1."""
    stages = [0]
    for _ in network.layers[1:]:
        stages.append(stages[-1] + (1 if stages[-1] + 1 < max_stages and draw(st.booleans()) else 0))
    return stages

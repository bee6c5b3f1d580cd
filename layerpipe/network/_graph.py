"""The network graph: a DAG of layers with inferred shapes.

Layers are numbered 1..L in topological order (the order they were added, which must respect their
inputs); index 0 is the network input. A chain is the common case; residual and branching networks are
DAGs whose `add` layers take several inputs. The last layer is the output; the loss is ½‖a_L − y‖².
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from layerpipe.errors import InputError
from layerpipe.network._ops import LayerOp, Shape, fused_activation

if TYPE_CHECKING:
    import networkx as nx

INPUT = 0  #: index of the network input in `Layer.inputs`
#: Layer kinds that take several inputs: add sums them; linear and conv2d read their concatenation.
MULTI_INPUT_KINDS: tuple[str, ...] = ("add", "linear", "conv2d")


@dataclass(frozen=True)
class Origin:
    """What a derived network came from: `source` with layer `layer` split into `parts` (`split_layer`)."""

    source: Network
    layer: str
    parts: int


@dataclass(frozen=True)
class Layer:
    """One layer of a network, with shapes resolved."""

    index: int
    name: str
    op: LayerOp
    inputs: tuple[int, ...]
    in_shapes: tuple[Shape, ...]
    out_shape: Shape

    @property
    def kind(self) -> str:
        return self.op.kind

    @property
    def has_weights(self) -> bool:
        return self.op.has_weights

    @property
    def activation(self) -> str:
        return fused_activation(self.op)

    @property
    def in_size(self) -> int:
        """Words of input activation per sample (summed over inputs)."""
        return sum(math.prod(s) for s in self.in_shapes)

    @property
    def out_size(self) -> int:
        """Words of output activation per sample."""
        return math.prod(self.out_shape)

    @property
    def has_bias(self) -> bool:
        """Whether the layer adds a bias (only linear and conv2d layers can)."""
        return bool(getattr(self.op, "bias", False))

    @property
    def weight_count(self) -> int:
        """|W_l| in words, bias included."""
        return self.op.weight_count(list(self.in_shapes))

    @property
    def forward_macs(self) -> int:
        """MACs (or elementwise ops for weightless layers) of the forward pass for one sample."""
        return self.op.macs(list(self.in_shapes))

    @property
    def takes_network_input(self) -> bool:
        """True when every input is the network input: such a layer has no E task (no e_{l-1} needed)."""
        return all(i == INPUT for i in self.inputs)


@dataclass(frozen=True)
class Network:
    """A validated network: layers in topological order, with a micro-batch size."""

    name: str
    input_shape: Shape
    layers: tuple[Layer, ...]
    batch: int = 1
    _by_name: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    #: The network this one was derived from (a layer split), None for a network as the user gave it.
    origin: Origin | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < 1:
            raise InputError(f"batch must be a positive integer, got {self.batch!r}")
        self._by_name.update({layer.name: layer.index for layer in self.layers})

    def __len__(self) -> int:
        return len(self.layers)

    def layer(self, index: int) -> Layer:
        """Layer by 1-based index."""
        return self.layers[index - 1]

    def index_of(self, name: str) -> int:
        try:
            return self._by_name[name]
        except KeyError:
            raise InputError(f"no layer named '{name}' in network {self.name}") from None

    @property
    def output_shape(self) -> Shape:
        return self.layers[-1].out_shape

    @property
    def input_size(self) -> int:
        return math.prod(self.input_shape)

    def consumers(self, index: int) -> list[int]:
        """Layers that read the output of layer `index` (0 = the network input)."""
        return [layer.index for layer in self.layers if index in layer.inputs]

    @property
    def is_chain(self) -> bool:
        return all(layer.inputs == (layer.index - 1,) for layer in self.layers)

    def with_batch(self, batch: int) -> Network:
        origin = self.origin
        if origin is not None:
            origin = Origin(origin.source.with_batch(batch), origin.layer, origin.parts)
        return Network(self.name, self.input_shape, self.layers, batch, origin=origin)

    def derives_from(self, name: str) -> bool:
        """True when this network is `name` or was derived from it (through any number of splits)."""
        net: Network | None = self
        while net is not None:
            if net.name == name:
                return True
            net = net.origin.source if net.origin is not None else None
        return False

    @property
    def total_weights(self) -> int:
        return sum(layer.weight_count for layer in self.layers)

    def to_networkx(self) -> nx.MultiDiGraph[int]:
        """The layer DAG as a networkx multigraph: node 0 is the input, nodes 1..L the layers (layer order).

        Node attributes: `name` (also as `label`, the id graph files use), `kind` (layer type, "input" for
        node 0), `activation`, `out_shape` (a string like "16x8x8", so GraphML can hold it), `out_words`
        (activation words per micro-batch), `weights` (|W_l|) and `macs` (forward MACs per micro-batch).
        An edge src → layer carries `words`, the activation words that cross it per micro-batch; an `add`
        fed twice by one layer has two edges.
        """
        import networkx as nx  # ~0.1 s of import: only when asked for, not at every CLI start

        graph: nx.MultiDiGraph[int] = nx.MultiDiGraph(name=self.name, batch=self.batch)
        graph.add_node(INPUT, label="input", name="input", kind="input", activation="identity",
                       out_shape="x".join(map(str, self.input_shape)), out_words=self.batch * self.input_size,
                       weights=0, macs=0)
        for layer in self.layers:
            graph.add_node(layer.index, label=layer.name, name=layer.name, kind=layer.kind,
                           activation=layer.activation, out_shape="x".join(map(str, layer.out_shape)),
                           out_words=self.batch * layer.out_size, weights=layer.weight_count,
                           macs=self.batch * layer.forward_macs)
        for layer in self.layers:
            for src in layer.inputs:
                graph.add_edge(src, layer.index, words=graph.nodes[src]["out_words"])
        return graph


class NetworkBuilder:
    """Builds a `Network` layer by layer, inferring and checking shapes as it goes.

    `add(name, op, inputs)` takes input names (or None for "the previous layer"); the network input is
    called "input".
    """

    def __init__(self, name: str, input_shape: Sequence[int], batch: int = 1) -> None:
        shape = tuple(input_shape)
        if not shape or any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in shape):
            raise InputError(f"input_shape must be positive integers, got {list(input_shape)}")
        if len(shape) not in (1, 3):
            raise InputError(f"input_shape must be [features] or [channels, height, width], got {list(shape)}")
        self._name = name
        self._input_shape: Shape = shape
        self._batch = batch
        self._layers: list[Layer] = []
        self._names: dict[str, int] = {"input": INPUT}

    def add(self, name: str, op: LayerOp, inputs: Iterable[str] | None = None) -> NetworkBuilder:
        if name == "input":
            raise InputError("layer name 'input' is reserved for the network input")
        if name in self._names:
            raise InputError(f"layer name '{name}' is used twice")
        if not name or not name.replace("_", "").replace(".", "").replace("-", "").isalnum():
            raise InputError(f"layer name {name!r} must be letters, digits, '_', '.', '-'")
        if inputs is None:
            input_ids: tuple[int, ...] = (len(self._layers),)
        else:
            ids = []
            for src in inputs:
                if src not in self._names:
                    raise InputError(f"layer '{name}': input '{src}' is not an earlier layer or 'input'")
                ids.append(self._names[src])
            input_ids = tuple(ids)
            if not input_ids:
                raise InputError(f"layer '{name}': inputs must not be empty")
        in_shapes = tuple(self._shape_of(i) for i in input_ids)
        if len(in_shapes) > 1 and op.kind not in MULTI_INPUT_KINDS:
            raise InputError(f"layer '{name}': only {', '.join(MULTI_INPUT_KINDS)} layers take several inputs "
                             f"(add sums them, linear and conv2d concatenate them), {op.kind} got {len(in_shapes)}")
        out_shape = op.out_shape(list(in_shapes), f"layer '{name}'")
        index = len(self._layers) + 1
        self._layers.append(Layer(index, name, op, input_ids, in_shapes, out_shape))
        self._names[name] = index
        return self

    def _shape_of(self, index: int) -> Shape:
        return self._input_shape if index == INPUT else self._layers[index - 1].out_shape

    def build(self) -> Network:
        if not self._layers:
            raise InputError(f"network '{self._name}' has no layers")
        used = {i for layer in self._layers for i in layer.inputs}
        dangling = [layer.name for layer in self._layers[:-1] if layer.index not in used]
        if dangling:
            raise InputError(f"network '{self._name}': layers {', '.join(dangling)} feed nothing; "
                             "only the last layer may be the output")
        return Network(self._name, self._input_shape, tuple(self._layers), self._batch)

"""Networks: layer operations, the layer DAG with inferred shapes, the built-in zoo and loaders.

`from_torch` (torch.fx import) needs torch only when called. The YAML functions and `from_torch` load on
first use (PEP 562 `__getattr__`): every CLI start imports this package, and PyYAML alone is ~30 ms of it.
"""

import importlib
from typing import TYPE_CHECKING, Any

from layerpipe.network._export import to_dot, to_graphml
from layerpipe.network._graph import INPUT, Layer, Network, NetworkBuilder, Origin
from layerpipe.network._load import load_network
from layerpipe.network._ops import (
    ACTIVATIONS,
    LAYER_TYPES,
    Activation,
    Add,
    Conv2d,
    Flatten,
    LayerOp,
    Linear,
    Pool2d,
)
from layerpipe.network._split import merge_weights, part_name, split_layer, split_refusal, split_weights
from layerpipe.network._zoo import ZOO, alexnet, lenet5, mlp, resnet18, resnet50, vgg16

if TYPE_CHECKING:
    from layerpipe.network._fx import from_torch
    from layerpipe.network._yaml import dump_yaml, load_yaml_network, parse_yaml_network

_LAZY = {"from_torch": "_fx", "dump_yaml": "_yaml", "load_yaml_network": "_yaml", "parse_yaml_network": "_yaml"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"layerpipe.network.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ACTIVATIONS",
    "INPUT",
    "LAYER_TYPES",
    "ZOO",
    "Activation",
    "Add",
    "Conv2d",
    "Flatten",
    "Layer",
    "LayerOp",
    "Linear",
    "Network",
    "NetworkBuilder",
    "Origin",
    "Pool2d",
    "alexnet",
    "dump_yaml",
    "from_torch",
    "lenet5",
    "load_network",
    "load_yaml_network",
    "merge_weights",
    "mlp",
    "parse_yaml_network",
    "part_name",
    "resnet18",
    "resnet50",
    "split_layer",
    "split_refusal",
    "split_weights",
    "to_dot",
    "to_graphml",
    "vgg16",
]

"""Resolve a NETWORK argument: a zoo name, an `mlp:...` spec, or a YAML file."""

from __future__ import annotations

import os

from layerpipe.errors import InputError
from layerpipe.network._graph import Network
from layerpipe.network._zoo import ZOO, parse_mlp_spec


def load_network(spec: str, batch: int | None = None) -> Network:
    """A network from a zoo name (`resnet18`), an MLP spec (`mlp:784-256-10`) or a YAML path.

    `batch` None means the network's own: 1 for built-ins, the file's `batch` (default 1) for YAML.
    """
    if spec.startswith("mlp:"):
        return parse_mlp_spec(spec, batch or 1)
    if spec in ZOO:
        return ZOO[spec](batch or 1)
    if spec.endswith((".yaml", ".yml")) or os.path.sep in spec:
        from layerpipe.network._yaml import load_yaml_network

        return load_yaml_network(spec, batch)
    allowed = ", ".join([*ZOO, "mlp:W0-W1-...", "FILE.yaml"])
    raise InputError(f"unknown network '{spec}'; allowed: {allowed}")

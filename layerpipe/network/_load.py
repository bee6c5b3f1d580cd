"""Resolve a NETWORK argument: a zoo name, an `mlp:...` spec, or a YAML file."""

from __future__ import annotations

import os

from layerpipe._memo import BoundedMemo
from layerpipe.errors import InputError
from layerpipe.network._graph import Network
from layerpipe.network._zoo import ZOO, parse_mlp_spec


def load_network(spec: str, batch: int | None = None) -> Network:
    """A network from a zoo name (`resnet18`), an MLP spec (`mlp:784-256-10`) or a YAML path.

    `batch` None means the network's own: 1 for built-ins, the file's `batch` (default 1) for YAML.
    """
    if spec.startswith("mlp:") or spec in ZOO:
        return _builtin(spec, batch or 1)
    if spec.endswith((".yaml", ".yml")) or os.path.sep in spec:
        from layerpipe.network._yaml import load_yaml_network

        return load_yaml_network(spec, batch)
    allowed = ", ".join([*ZOO, "mlp:W0-W1-...", "FILE.yaml"])
    raise InputError(f"unknown network '{spec}'; allowed: {allowed}")


def _builtin(spec: str, batch: int) -> Network:
    """A zoo network or an MLP spec, built once per (spec, batch): a `Network` is immutable, and a sweep loads
    the same one for every policy of every point (a file is read every time: it may change)."""
    key = (spec, batch)
    found = _BUILT.get(key)
    if found is None:
        found = _BUILT.add(key, parse_mlp_spec(spec, batch) if spec.startswith("mlp:") else ZOO[spec](batch))
    return found


#: `_builtin`'s networks.
_BUILT: BoundedMemo[tuple[str, int], Network] = BoundedMemo(64)

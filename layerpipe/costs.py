"""Cost models: how many cycles one task of one layer takes.

`task_cost` is the one function that computes a task's cost; schedulers, the DFG, the simulator and the
reports all call it (directly or through `TrainingGraph.costs`). A fused task ("AEG", PipeDream's whole
backward) costs the sum of its atomic parts.

Models:
- `macs`     — the MAC (or elementwise-op) count of the task; one MAC = one cycle.
- `pe`       — a processor of `lanes` MACs per cycle plus a fixed per-op overhead: ⌈macs/lanes⌉ + overhead
               per atomic part.
- `profiled` — per-layer, per-task times measured with PyTorch on this CPU, saved to and loaded from JSON
               (`layerpipe.profile`), in nanoseconds.
- `rtl`      — the closed cycle formula of the generated hardware (`layerpipe/_rtl_costs.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from layerpipe._rtl_costs import RTLCostModel
from layerpipe.errors import InputError, unknown_name
from layerpipe.network import Layer, Network

ATOMIC_KINDS = "FAEGU"


def atomic_work(layer: Layer, kind: str, batch: int) -> int:
    """Work of one atomic task (F, A, E, G or U) in MACs or elementwise operations, for a micro-batch."""
    if kind not in ATOMIC_KINDS or len(kind) != 1:
        raise ValueError(f"atomic task kind must be one of {ATOMIC_KINDS}, got {kind!r}")
    if kind == "F":
        return batch * layer.forward_macs
    if layer.has_weights:
        if kind == "A":
            return batch * layer.out_size
        if kind in "EG":
            return batch * layer.forward_macs
        return layer.weight_count  # U
    if kind == "E":
        # Backward of a weightless layer: as much work as its forward, plus its fused activation (a standalone
        # activation layer's forward already is that elementwise work, so it is not counted twice).
        fused = layer.activation != "identity" and layer.kind != "activation"
        return batch * layer.forward_macs + (batch * layer.out_size if fused else 0)
    raise ValueError(f"layer '{layer.name}' has no weights and no {kind} task")


class CostModel(Protocol):
    """Cycles of one atomic task; `name` identifies the model in reports.

    `name` is a read-only property here: the models are frozen dataclasses, whose fields a Protocol's
    plain (settable) attribute would not match.
    """

    @property
    def name(self) -> str: ...

    def atomic_cost(self, layer: Layer, kind: str, batch: int) -> int: ...


@dataclass(frozen=True)
class MacsModel:
    name: str = "macs"

    def atomic_cost(self, layer: Layer, kind: str, batch: int) -> int:
        return atomic_work(layer, kind, batch)


@dataclass(frozen=True)
class PEModel:
    """A processor with `lanes` multipliers and a fixed per-op overhead (fill/drain, address setup)."""

    lanes: int = 64
    overhead: int = 16
    name: str = "pe"

    def __post_init__(self) -> None:
        if self.lanes < 1:
            raise InputError(f"lanes must be >= 1, got {self.lanes}")
        if self.overhead < 0:
            raise InputError(f"overhead must be >= 0, got {self.overhead}")

    def atomic_cost(self, layer: Layer, kind: str, batch: int) -> int:
        return math.ceil(atomic_work(layer, kind, batch) / self.lanes) + self.overhead


@dataclass(frozen=True)
class ProfiledModel:
    """Measured per-layer task times (nanoseconds), keyed by layer name and atomic kind."""

    network: str
    batch: int
    times_ns: dict[str, dict[str, int]] = field(default_factory=dict)
    name: str = "profiled"

    def atomic_cost(self, layer: Layer, kind: str, batch: int) -> int:
        if batch != self.batch:
            raise InputError(f"profile was measured at batch {self.batch}, asked for batch {batch}")
        try:
            return self.times_ns[layer.name][kind]
        except KeyError:
            raise InputError(f"profile of '{self.network}' has no time for {kind} of layer '{layer.name}'") from None

    def check_network(self, network: Network) -> None:
        """A profile times one network's layers; another network's same-named layers (mlp:8-6-3 against a
        profile of mlp:7-6-3: both have fc1, fc2) would silently get the wrong times."""
        if network.name != self.network:
            raise InputError(f"--profile was measured on network '{self.network}', not '{network.name}'; "
                             f"profile '{network.name}' with `layerpipe profile`")

    def to_json(self) -> str:
        doc = {"version": 1, "network": self.network, "batch": self.batch, "unit": "ns",
               "layers": self.times_ns}
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(path: str | Path) -> ProfiledModel:
        from layerpipe._files import read_json_limited  # size-limited, regular files only, one-line errors

        doc = read_json_limited(path, "profile file")
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise InputError(f"profile file {path}: field 'version' must be 1")
        for key in ("network", "batch", "layers"):
            if key not in doc:
                raise InputError(f"profile file {path}: missing field '{key}'")
        def count(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 0

        layers = doc["layers"]
        shape_ok = count(doc["batch"]) and doc["batch"] >= 1 and isinstance(layers, dict) and all(
            isinstance(d, dict) and all(k in ATOMIC_KINDS and len(k) == 1 and count(v) for k, v in d.items())
            for d in layers.values())
        if not shape_ok:
            raise InputError(f"profile file {path}: 'batch' must be an integer >= 1 and 'layers' a mapping "
                             f"{{layer: {{task kind ({', '.join(ATOMIC_KINDS)}): nanoseconds >= 0}}}}")
        return ProfiledModel(str(doc["network"]), doc["batch"], {str(k): dict(d) for k, d in layers.items()})


def task_cost(model: CostModel, layer: Layer, kind: str, batch: int) -> int:
    """Cycles of a (possibly fused) task: the sum over its atomic parts. The one place costs are made."""
    return sum(model.atomic_cost(layer, k, batch) for k in kind)


def _profiled(profile: str | None) -> CostModel:
    if profile is None:
        raise InputError("cost model 'profiled' needs --profile FILE.json (made by `layerpipe profile`)")
    return ProfiledModel.from_json(profile)


def _rtl(lanes: int) -> CostModel:
    return RTLCostModel(lanes=lanes)


@dataclass(frozen=True)
class CostModelKind:
    """A registered cost model: its factory and the parameters (of lanes, overhead, profile) it takes."""

    make: Callable[..., CostModel]
    takes: tuple[str, ...]


#: The one registry of cost models: the CLI's --cost-model, `make_cost_model`, the DSE sweeps and the
#: error messages all list and build models from it.
COST_MODELS: dict[str, CostModelKind] = {
    "macs": CostModelKind(MacsModel, ()),
    "pe": CostModelKind(PEModel, ("lanes", "overhead")),
    "profiled": CostModelKind(_profiled, ("profile",)),
    "rtl": CostModelKind(_rtl, ("lanes",)),
}


def make_cost_model(name: str, *, lanes: int = 64, overhead: int = 16, profile: str | None = None) -> CostModel:
    """A cost model by name (a key of `COST_MODELS`), given the parameters it takes."""
    kind = COST_MODELS.get(name)
    if not isinstance(kind, CostModelKind):
        raise unknown_name("cost model", name, COST_MODELS)
    given = {"lanes": lanes, "overhead": overhead, "profile": profile}
    return kind.make(**{key: given[key] for key in kind.takes})


def network_costs(model: CostModel, network: Network, kinds: str = ATOMIC_KINDS) -> dict[tuple[int, str], int]:
    """Atomic costs of every task of every layer, keyed (layer index, kind)."""
    out: dict[tuple[int, str], int] = {}
    for layer in network.layers:
        for kind in kinds:
            if kind == "F" or (kind == "E" and not layer.takes_network_input) or (
                    layer.has_weights and kind in "AGU"):
                out[(layer.index, kind)] = model.atomic_cost(layer, kind, network.batch)
    return out

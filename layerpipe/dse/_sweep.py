"""Sweep specifications: the design space of `layerpipe explore`, and its points.

A sweep is the cartesian product networks × num_procs × policies × max_staleness × max_traffic × lanes ×
interconnects (`layerpipe.interconnect` specs), given as CLI flags or a versioned YAML file. Options that do
not apply to a policy are not multiplied in for it (PipeDream has no staleness or traffic bound, so it gets
one point per (network, N, lanes, interconnect) instead of one per bound). Every point has a stable
`point_id` (its parameters as text), and the sweep a
`sweep_id` (a hash of its normalised spec) that `--resume` checks against the results file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from layerpipe.costs import COST_MODELS
from layerpipe.errors import InputError

#: Policies whose schedules take a staleness bound, and those that take a bound on words per sample.
STALENESS_POLICIES = frozenset({"layerpipe"})
TRAFFIC_POLICIES = frozenset({"layerpipe"})
#: One device with concurrent streams (OOO BackProp's single-GPU scheme): points at N = 1 only.
SINGLE_DEVICE_POLICIES = frozenset({"stream", "stream-ooo"})

#: Cost models a sweep can use: each point builds its model from its own `lanes` (no profile file to give),
#: i.e. every registered model that takes no profile.
SWEEP_COST_MODELS = tuple(name for name, kind in COST_MODELS.items() if "profile" not in kind.takes)


#: Most points one sweep may have (a point takes 10 ms to 10 s): a results file of at most ~100 MB.
MAX_SWEEP_POINTS = 200_000


@dataclass(frozen=True, order=True)
class DesignPoint:
    """One point of a sweep. Fields are the sweep axes; `None` means "not applicable to this policy"."""

    network: str
    num_procs: int
    policy: str
    max_staleness: int | None = None
    lanes: int = 64
    interconnect: str = "rtl"  #: an interconnect spec (`rtl` resolves at the point's lanes)
    max_traffic: float | None = None  #: bound on words per sample (layerpipe), None: unbounded
    batch: int = 1
    cost_model: str = "pe"
    reverse_first_k: str | None = None  #: dp-ooo's K ("auto" or an integer), None for other policies

    @property
    def point_id(self) -> str:
        # a field added later stays out of the id while unused, so earlier results files keep their ids
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if not (f.name == "reverse_first_k" and self.reverse_first_k is None)]
        return ";".join(parts)


@dataclass(frozen=True)
class SweepSpec:
    networks: tuple[str, ...]
    num_procs: tuple[int, ...]
    policies: tuple[str, ...]
    max_staleness: tuple[int | None, ...] = (None,)
    lanes: tuple[int, ...] = (64,)
    interconnects: tuple[str, ...] = ("rtl",)
    max_traffic: tuple[float | None, ...] = (None,)
    batch: int = 1
    cost_model: str = "pe"
    area: bool = False
    reverse_first_k: tuple[str, ...] = ("auto",)  #: dp-ooo's K values (OOO BackProp's reverse first-k)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("networks", "num_procs", "policies", "max_staleness", "lanes", "interconnects", "max_traffic"):
            if not getattr(self, name):
                raise InputError(f"sweep is empty: '{name}' has no values")
        for n in self.num_procs:
            if n < 1:
                raise InputError(f"sweep num_procs must be >= 1, got {n}")
        for v in self.lanes:
            if v < 1:
                raise InputError(f"sweep lanes must be >= 1, got {v}")
        from layerpipe.interconnect import parse_interconnect

        for spec in self.interconnects:
            parse_interconnect(spec, lanes=1, field="sweep interconnects")
        for t in self.max_traffic:
            if t is not None and not 0 <= t < float("inf"):
                raise InputError(f"sweep max_traffic must be >= 0 words per sample, got {t}")
        for k in self.reverse_first_k:
            if not (isinstance(k, str) and (k == "auto" or k.isdigit())):
                raise InputError(f"sweep reverse_first_k takes integers >= 0 or 'auto', got {k!r}")
        for s in self.max_staleness:
            if s is not None and s < 0:
                raise InputError(f"sweep max_staleness must be >= 0, got {s}")
        if self.cost_model not in SWEEP_COST_MODELS:
            raise InputError(f"sweep cost_model must be one of {', '.join(SWEEP_COST_MODELS)}, got '{self.cost_model}'")
        import math

        most = math.prod(len(getattr(self, name)) for name in ("networks", "num_procs", "policies", "max_staleness",
                                                                "max_traffic", "lanes", "interconnects"))
        if most > MAX_SWEEP_POINTS:  # before points() builds them (issue 12 item 5: every size has a limit)
            raise InputError(f"sweep has up to {most} points (the product of its axes); the limit is "
                             f"{MAX_SWEEP_POINTS}: split it into several sweeps")

    def points(self) -> list[DesignPoint]:
        """All points, in a stable order (the order of the axes as given)."""
        out: list[DesignPoint] = []
        seen: set[DesignPoint] = set()
        for net in self.networks:
            for n in self.num_procs:
                for policy in self.policies:
                    if policy in SINGLE_DEVICE_POLICIES and n != 1:
                        continue
                    bounds = self.max_staleness if policy in STALENESS_POLICIES else (None,)
                    traffic = self.max_traffic if policy in TRAFFIC_POLICIES else (None,)
                    for bound in bounds:
                        for words in traffic:
                            for lanes in self.lanes:
                                for ic in self.interconnects:
                                    for k in (self.reverse_first_k if policy == "dp-ooo" else (None,)):
                                        p = DesignPoint(net, n, policy, bound, lanes, ic, words, self.batch,
                                                        self.cost_model, k)
                                        if p not in seen:
                                            seen.add(p)
                                            out.append(p)
        return out

    @cached_property  # every row carries it: hashed once per spec, not once per row
    def sweep_id(self) -> str:
        doc = {k: v for k, v in asdict(self).items() if k != "extra"}
        if self.reverse_first_k == ("auto",):
            del doc["reverse_first_k"]  # the default: sweeps from before this axis keep their id
        text = json.dumps(doc, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


#: YAML sweep keys and what they take.
SWEEP_KEYS: dict[str, str] = {
    "version": "1",
    "networks": "list of network specs",
    "num_procs": "list of positive integers",
    "policies": "list of policy names",
    "max_staleness": "list of non-negative integers (or null for unbounded)",
    "lanes": "list of positive integers",
    "interconnects": "list of interconnect specs (shared, links:L:W, bus:L:W, rtl)",
    "max_traffic": "list of non-negative numbers of words per sample (or null for unbounded)",
    "reverse_first_k": "list of integers >= 0 or 'auto' (dp-ooo)",
    "batch": "positive integer",
    "cost_model": ", ".join(SWEEP_COST_MODELS),
    "area": "true/false: add RTL synthesis figures (MLPs only)",
}


def _as_tuple(value: Any, key: str, kind: type | tuple[type, ...]) -> tuple[Any, ...]:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not (item is None and key in ("max_staleness", "max_traffic")) and not isinstance(item, kind):
            raise InputError(f"sweep key '{key}' takes {SWEEP_KEYS[key]}, got {item!r}")
        if isinstance(item, bool) and kind is int:
            raise InputError(f"sweep key '{key}' takes {SWEEP_KEYS[key]}, got {item!r}")
    return tuple(items)


def load_sweep_yaml(path: str | Path) -> SweepSpec:
    """Read a `version: 1` sweep file; unknown keys are an error that lists the valid keys."""
    from layerpipe._files import read_text_limited  # regular files only, size-limited, strict UTF-8
    from layerpipe.network._yaml import _parse_yaml  # the strict loader: duplicate keys are errors

    text = read_text_limited(path, "sweep file")
    doc = _parse_yaml(text, str(path))
    if not isinstance(doc, dict):
        raise InputError(f"sweep file {path}: must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = sorted(set(doc) - set(SWEEP_KEYS))
    if unknown:
        raise InputError(f"sweep file {path}: unknown key '{unknown[0]}'; valid keys: {', '.join(SWEEP_KEYS)}")
    if doc.get("version") != 1:
        raise InputError(f"sweep file {path}: field 'version' must be 1, got {doc.get('version')!r}")
    for key in ("networks", "num_procs", "policies"):
        if key not in doc:
            raise InputError(f"sweep file {path}: missing key '{key}' ({SWEEP_KEYS[key]})")
    kwargs: dict[str, Any] = {
        "networks": _as_tuple(doc["networks"], "networks", str),
        "num_procs": _as_tuple(doc["num_procs"], "num_procs", int),
        "policies": _as_tuple(doc["policies"], "policies", str),
    }
    for key in ("max_staleness", "lanes"):
        if key in doc:
            kwargs[key] = _as_tuple(doc[key], key, int)
    if "interconnects" in doc:
        kwargs["interconnects"] = _as_tuple(doc["interconnects"], "interconnects", str)
    if "max_traffic" in doc:
        kwargs["max_traffic"] = tuple(None if v is None else float(v)
                                      for v in _as_tuple(doc["max_traffic"], "max_traffic", (int, float)))
    if "reverse_first_k" in doc:
        kwargs["reverse_first_k"] = tuple(str(v) for v in _as_tuple(doc["reverse_first_k"], "reverse_first_k",
                                                                   (int, str)))
    if "batch" in doc:
        if not isinstance(doc["batch"], int) or isinstance(doc["batch"], bool) or doc["batch"] < 1:
            raise InputError(f"sweep key 'batch' takes {SWEEP_KEYS['batch']}, got {doc['batch']!r}")
        kwargs["batch"] = doc["batch"]
    if "cost_model" in doc:
        kwargs["cost_model"] = str(doc["cost_model"])
    if "area" in doc:
        if not isinstance(doc["area"], bool):  # bool("no") is True: a quoted "no" would start synthesis
            raise InputError(f"sweep key 'area' takes {SWEEP_KEYS['area']}, got {doc['area']!r}")
        kwargs["area"] = doc["area"]
    return SweepSpec(**kwargs)

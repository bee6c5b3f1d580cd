"""Scheduling policies by name (design notes §5, contract 5).

`make_schedule(name, network, num_procs, model, options)` runs one policy; `options` is that policy's own
frozen dataclass (`POLICIES[name].options`), or None for its defaults. `policy_options(name, given)` builds
that dataclass from a mapping of option names to values and rejects options the policy does not have,
naming the option and the policy — so the CLI and the DSE never pass an untyped bag of keywords.

| policy            | kind            | options                                                        |
|-------------------|-----------------|----------------------------------------------------------------|
| layerpipe         | async, periodic | intra, inter, max_staleness, keep_weights_together, unfold     |
| pipedream         | async, periodic | replication (PipeDream's planner: stages × replicas, SOSP'19)  |
| pipedream-2bw     | async, periodic | microbatches                                                   |
| ooo               | sync, explicit stage-level | group_size, microbatches, push, allocation          |
| optimal           | async, periodic | intra, inter, keep_weights_together, time_limit_s              |
| gpipe, 1f1b, zb-h2, zbv, dualpipev | sync, explicit stage-level | microbatches               |
| interleaved-1f1b, zb-h1, looped-bfs | sync, explicit stage-level | microbatches, virtual_stages |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from layerpipe._gc import gc_paused
from layerpipe._memo import BoundedMemo
from layerpipe.costs import CostModel, network_costs
from layerpipe.errors import InputError, unknown_name
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.network import Network
from layerpipe.schedule._dataparallel import DPOOOOptions, DPOptions, schedule_dp, schedule_dp_ooo
from layerpipe.schedule._layerpipe import LayerPipeOptions, schedule_layerpipe
from layerpipe.schedule._ooo import OOOOptions, schedule_ooo
from layerpipe.schedule._optimal import OptimalOptions, schedule_optimal
from layerpipe.schedule._pipedream import (
    PipeDream2BWOptions,
    PipeDreamOptions,
    schedule_pipedream,
    schedule_pipedream_2bw,
)
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._streams import StreamOOOOptions, StreamOptions, schedule_stream, schedule_stream_ooo
from layerpipe.schedule._sync_policies import (
    InterleavedOptions,
    NetworkKey,
    SyncOptions,
    ZBH1Options,
    schedule_synchronous,
)

#: Most processors a schedule may use. Every policy's work grows with N (a body per processor), so a typo
#: like `-n 100000000` would otherwise run for minutes instead of failing; 4096 is far beyond any design
#: these models describe (the papers use up to 16).
MAX_PROCS = 4096


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: A policy's options dataclass.
O = TypeVar("O", bound="DataclassInstance")


@dataclass(frozen=True)
class Policy(Generic[O]):
    """A policy by name: its options dataclass `options` and `run`, which takes an instance of exactly that
    class (the registry holds policies of different option types: `Policy[Any]`; `make_schedule` checks the
    type before it calls `run`)."""

    name: str
    options: type[O]
    run: Callable[[Network, int, CostModel, O, Interconnect], ScheduleResult]
    synchronous: bool
    summary: str

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.options))


def _sync(name: str, options: type[SyncOptions | InterleavedOptions],
          summary: str) -> Policy[SyncOptions | InterleavedOptions]:
    return Policy(name, options, partial(schedule_synchronous, name), True, summary)


POLICIES: dict[str, Policy[Any]] = {p.name: p for p in (
    Policy("layerpipe", LayerPipeOptions, schedule_layerpipe, False,
           "fine-grained tasks balanced over N processors, periodic, lags by retiming"),
    Policy("pipedream", PipeDreamOptions, schedule_pipedream, False,
           "PipeDream's planner: contiguous stages x replicas by DP, async 1F1B(-RR), weight stashing"),
    Policy("pipedream-2bw", PipeDream2BWOptions, schedule_pipedream_2bw, False,
           "PipeDream stages, double-buffered weights, gradients coalesced over m micro-batches"),
    _sync("gpipe", SyncOptions, "synchronous fill-drain"),
    _sync("1f1b", SyncOptions, "synchronous 1F1B (PipeDream-Flush)"),
    _sync("interleaved-1f1b", InterleavedOptions, "synchronous interleaved 1F1B, virtual_stages chunks each"),
    _sync("zb-h1", ZBH1Options, "Zero Bubble H1: B split into I and W"),
    _sync("zb-h2", SyncOptions, "Zero Bubble H2: more warm-up, W fills the tail"),
    _sync("zbv", SyncOptions, "Zero Bubble V: two chunks per processor in a V"),
    _sync("dualpipev", SyncOptions, "DualPipeV: two chunks in a V, overlapped F&B pairs run back to back"),
    _sync("looped-bfs", InterleavedOptions, "breadth-first looped stages, virtual_stages chunks each"),
    Policy("ooo", OOOOptions, schedule_ooo, True,
           "OOO BackProp pipeline: synchronous, gradient fast-forwarding, modulo layer allocation"),
    Policy("optimal", OptimalOptions, schedule_optimal, False,
           "exact minimum period by MILP (HiGHS), small graphs only"),
    # OOO BackProp's other two schemes (issue 15): N replicas with a ring all-reduce, and one device's streams.
    Policy("dp", DPOptions, schedule_dp, True,
           "data parallel: N replicas, per-layer ring all-reduce, updates at the end of the step"),
    Policy("dp-ooo", DPOOOOptions, schedule_dp_ooo, True,
           "OOO BackProp data parallel: reverse first-k weight gradients, updates gated before each forward"),
    Policy("stream", StreamOptions, schedule_stream, True,
           "one device, one stream, backprop order (-n 1)"),
    Policy("stream-ooo", StreamOOOOptions, schedule_stream_ooo, True,
           "OOO BackProp single device: weight gradients on other streams beside output gradients (-n 1)"),
)}


#: Policies whose kernels overlap (all-reduces beside compute, streams beside streams): `layerpipe.sim._streams`
#: times them and their explicit schedules are not one-op-at-a-time processor programs, so the validator and
#: the shared event engine do not take them (tests/test_dataparallel.py and tests/test_streams.py check them).
STREAM_ENGINE_POLICIES: tuple[str, ...] = ("dp", "dp-ooo", "stream", "stream-ooo")

#: Policies whose searches run with the cyclic garbage collector paused (`gc_paused`): they build hundreds of
#: thousands of small acyclic lists, tuples and dicts (timings, packings, pins), and each allocation burst would
#: trigger a collection that walks every live object again, the memos included (8-12 % of their scheduling CPU
#: on issue 14's sweep; the stream engine's policies build their programs' Ops and dependency tuples, 15-20 % of the
#: OOO report's CPU). `optimal` is left out: its solver's objects are not ours to vouch for.
GC_PAUSED_POLICIES: frozenset[str] = frozenset({"layerpipe", "pipedream", "pipedream-2bw", *STREAM_ENGINE_POLICIES})


#: `_has_work` by (cost model, network value): a sweep asks it of every point; the oldest dropped past the cap.
_HAS_WORK: BoundedMemo[tuple[object, NetworkKey], bool] = BoundedMemo(64)


def _has_work(model: CostModel, network: Network) -> bool:
    """Does some task of `network` cost cycles under `model`? (Memoised: a pure function of two values.)"""
    key = (model, NetworkKey(network))
    try:
        known = _HAS_WORK.get(key)
    except TypeError:  # a model that is not hashable is not remembered
        return any(network_costs(model, network).values())
    if known is None:
        known = _HAS_WORK.add(key, any(network_costs(model, network).values()))
    return known


def get_policy(name: str) -> Policy[Any]:
    try:
        return POLICIES[name]
    except KeyError:
        raise unknown_name("policy", name, POLICIES) from None


def policy_options(name: str, given: Mapping[str, object] | None = None,
                   labels: Mapping[str, str] | None = None) -> object:
    """The options dataclass of policy `name` from `given` (option name → value); options the policy does
    not have are errors naming the option (by `labels[name]` when given, e.g. the CLI flag) and the policy."""
    policy = get_policy(name)
    given = dict(given or {})
    label = dict(labels or {})
    for key in given:
        if key not in policy.option_names:
            allowed = ", ".join(label.get(k, k) for k in policy.option_names) or "none"
            raise InputError(f"option {label.get(key, key)} does not apply to policy '{name}' (its options: {allowed})")
    return policy.options(**given)


def make_schedule(name: str, network: Network, num_procs: int, model: CostModel,
                  options: object | None = None, interconnect: Interconnect | None = None) -> ScheduleResult:
    """Schedule `network` on `num_procs` processors with policy `name` under cost model `model`, moving data on
    `interconnect` (default `shared`: free communication, an idealisation the result names)."""
    policy = get_policy(name)
    if isinstance(num_procs, bool) or not isinstance(num_procs, int) or not 1 <= num_procs <= MAX_PROCS:
        raise InputError(f"num_procs (-n) must be an integer in 1..{MAX_PROCS}, got {num_procs!r}")
    if options is None:
        options = policy.options()
    elif type(options) is not policy.options:
        raise InputError(f"policy '{name}' takes {policy.options.__name__}, got {type(options).__name__}")
    if not _has_work(model, network):
        raise InputError(f"every task of network '{network.name}' costs 0 cycles under cost model '{model.name}': "
                         "there is nothing to schedule (give the tasks a cost: e.g. --cost-model pe)")
    if interconnect is None:
        interconnect = SHARED
    elif not isinstance(interconnect, Interconnect):
        raise InputError(f"interconnect must be an Interconnect (layerpipe.interconnect), "
                         f"got {type(interconnect).__name__}")
    if name in GC_PAUSED_POLICIES:
        with gc_paused():
            result = policy.run(network, num_procs, model, options, interconnect)
    else:
        result = policy.run(network, num_procs, model, options, interconnect)
    if result.interconnect != interconnect:
        result = replace(result, interconnect=interconnect)
    return result

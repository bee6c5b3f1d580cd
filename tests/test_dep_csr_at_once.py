"""The task-edge dependencies of asynchronous layer-level schedules taken every edge at once
(`layerpipe.schedule._dep_csr._edges_at_once`, below `MAX_AT_ONCE` pairs) and edge by edge (above it) give the
same CSR arrays — values, order and types — and raise the same missing-producer error."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from layerpipe.costs import PEModel
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import _dep_csr
from layerpipe.schedule.policies import make_schedule
from layerpipe.sim import compile_schedule, policy_ops

MODEL = PEModel(64, 16)


def _arrays(schedule, workload) -> tuple:
    c = compile_schedule(schedule, workload)
    return (*((a.dtype.str, a.tobytes()) for a in (c.prod_ptr, c.prod_idx, c.prod_words, c.prod_role)), c.roles)


def _both(schedule, workload, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    out = []
    for limit in (_dep_csr.MAX_AT_ONCE, -1):
        with monkeypatch.context() as m:
            m.setattr(_dep_csr, "MAX_AT_ONCE", limit)
            try:
                out.append(_arrays(schedule, workload))
            except InputError as exc:
                out.append((type(exc), str(exc)))
    return out[0], out[1]


@pytest.mark.parametrize("policy", ["layerpipe", "pipedream", "ooo", "1f1b"])
@pytest.mark.parametrize("net,procs", [("lenet5", 3), ("alexnet", 4), ("mlp:16-12-8-4", 2)])
def test_at_once_and_edge_by_edge_agree(policy: str, net: str, procs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    network = load_network(net, 1)
    schedule, workload = policy_ops(make_schedule(policy, network, procs, MODEL), network, MODEL, 12)
    at_once, by_edge = _both(schedule, workload, monkeypatch)
    assert at_once == by_edge
    rng = random.Random(f"{policy}{net}")
    for _ in range(4):  # an op left out: the same error (or the same arrays, if nothing consumed it)
        ops = [(p, k) for p, row in enumerate(schedule.procs) for k in range(len(row))]
        p, k = rng.choice(ops)
        rows = tuple(row[:k] + row[k + 1:] if q == p else row for q, row in enumerate(schedule.procs))
        broken = replace(schedule, procs=rows)
        at_once, by_edge = _both(broken, workload, monkeypatch)
        assert at_once == by_edge


def test_the_threshold_takes_small_schedules_at_once() -> None:
    assert _dep_csr.MAX_AT_ONCE >= 1 << 12 and np.iinfo(np.int32).max > _dep_csr.MAX_AT_ONCE

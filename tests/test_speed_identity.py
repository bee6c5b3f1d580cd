"""Issue 14's speed work keeps results byte-identical: simulator results, compiled dependency arrays and
`explore` rows of a fixed set of schedules, against digests recorded with the code from before it.

Every case is hashed (sha256) over what a user sees — every op's start, end and version read, the metrics
(JSON), the version records — and, separately, over the compiled schedule's dependency arrays (CSR pointer,
producers, words, roles), so a change that keeps the timing but reorders or renumbers dependencies shows
too. `RECORDED` was printed by `python tests/test_speed_identity.py` at commit 'tests: speed identity
digests recorded' (before dependencies were built as arrays); regenerate it only for an intended change of
results, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from layerpipe.costs import make_cost_model
from layerpipe.dse import DesignPoint
from layerpipe.dse._evaluate import evaluate_point
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import (
    StageInfo,
    dualpipev,
    gpipe,
    interleaved_1f1b,
    looped_bfs,
    make_schedule,
    one_f_one_b,
    policy_options,
    zb_h1,
    zb_h2,
    zbv,
)
from layerpipe.sim import SimConfig, SimResult, Workload, compile_schedule, policy_ops, simulate_compiled

STAGE_CONFIGS = {"shared": SimConfig(), "links": SimConfig.links(latency=2, words_per_cycle=1),
                 "bus": SimConfig("bus", 1, 2)}
STAGE_SCHEDULES: dict[str, Callable[[], object]] = {
    "gpipe-3x6x2": lambda: gpipe(3, 6, steps=2),
    "1f1b-4x8x2": lambda: one_f_one_b(4, 8, steps=2),
    "zb-h1-4x8": lambda: zb_h1(4, 8),
    "zb-h1-2x4x2v": lambda: zb_h1(2, 4, virtual_stages=2, steps=2),
    "zb-h2-3x6": lambda: zb_h2(3, 6),
    "zbv-2x4x2": lambda: zbv(2, 4, steps=2),
    "dualpipev-2x4": lambda: dualpipev(2, 4),
    "interleaved-2x4x2": lambda: interleaved_1f1b(2, 4, steps=2),
    "looped-bfs-2x4": lambda: looped_bfs(2, 4),
}
NETWORKS = ("mlp:16-12-8-4", "lenet5")
POLICIES = ("layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv",
            "dualpipev", "looped-bfs", "ooo")
INTERCONNECTS = ("shared", "links:2:16", "bus:2:16", "rtl")
POINTS = tuple(DesignPoint(net, n, policy, staleness, interconnect=ic)
               for net in ("mlp:16-12-8-4", "lenet5") for n in (2, 3)
               for policy, staleness in (("layerpipe", None), ("layerpipe", 1), ("pipedream", None),
                                         ("pipedream-2bw", None), ("1f1b", None), ("zb-h1", None), ("ooo", None))
               for ic in ("shared", "rtl"))


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:24]


def result_digest(sim: SimResult) -> str:
    return _sha(sim.start.astype(np.int64).tobytes(), sim.end.astype(np.int64).tobytes(),
                sim.versions.astype(np.int64).tobytes(), json.dumps(sim.metrics(), sort_keys=True),
                json.dumps(sim.version_records()), " ".join(map(str, sim.ops)))


def dependency_digest(compiled) -> str:
    return _sha(compiled.prod_ptr.astype(np.int64).tobytes(), compiled.prod_idx.astype(np.int64).tobytes(),
                compiled.prod_words.astype(np.int64).tobytes(), compiled.prod_role.astype(np.int8).tobytes(),
                ",".join(compiled.roles))


def _stage_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    for name, make in STAGE_SCHEDULES.items():
        def run(make: Callable[[], object] = make) -> str:
            schedule = make()
            stages = 1 + max(op.unit for op in schedule.ops())  # type: ignore[attr-defined]
            costs = [(3 + s % 3, 4 + (2 * s) % 5, 2 + s % 2) for s in range(stages)]
            info = StageInfo(stages, tuple(5 + s for s in range(stages)), tuple(3 + 2 * s for s in range(stages)))
            workload = Workload.of_stages(costs, info, activation_words=[7 + s for s in range(stages)],
                                          weight_words=[11 * (s + 1) for s in range(stages)])
            compiled = compile_schedule(schedule, workload)  # type: ignore[arg-type]
            digests = [dependency_digest(compiled)]
            for config in STAGE_CONFIGS.values():
                digests.append(result_digest(simulate_compiled(compiled, workload, config)))
            return "/".join(d[:12] for d in digests)  # which part changed shows
        yield f"stage:{name}", run


def _policy_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    for net in NETWORKS:
        for n in (2, 3):
            for policy in POLICIES:
                def run(net: str = net, n: int = n, policy: str = policy) -> str:
                    network = load_network(net)
                    model = make_cost_model("pe", lanes=16)
                    digests = []
                    for ic in INTERCONNECTS:
                        interconnect = parse_interconnect(ic, lanes=16)
                        result = make_schedule(policy, network, n, model, policy_options(policy, {}), interconnect)
                        iterations = 12 if result.periodic is not None else 2 * max(result.explicit.microbatches, 1)
                        schedule, workload = policy_ops(result, network, model, iterations)
                        compiled = compile_schedule(schedule, workload)
                        sim = simulate_compiled(compiled, workload, SimConfig.of(interconnect))
                        digests += [dependency_digest(compiled), result_digest(sim)]
                    return _sha(*digests)
                yield f"policy:{net}:{n}:{policy}", run


def _explore_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    def run() -> str:
        return _sha(*(json.dumps(evaluate_point(p), sort_keys=True) for p in POINTS))
    yield "explore:rows", run


def cases() -> dict[str, Callable[[], str]]:
    return dict([*_stage_cases(), *_policy_cases(), *_explore_cases()])


RECORDED: dict[str, str] = {
    "explore:rows": "8b081b6df9a5acbc873c7e57",
    "policy:lenet5:2:1f1b": "671f3cf8a30f45706908ed2d",
    "policy:lenet5:2:dualpipev": "e4c53389fc3130b7a85809da",
    "policy:lenet5:2:gpipe": "a2ef6db30d42ffe8faf5d9e8",
    "policy:lenet5:2:interleaved-1f1b": "0fe325c6d2c055385e78e822",
    "policy:lenet5:2:layerpipe": "24160343bee275389e809b6b",
    "policy:lenet5:2:looped-bfs": "30048879d9fc772b1b7d2c40",
    "policy:lenet5:2:ooo": "58a1c113e800d15f8743d26c",
    "policy:lenet5:2:pipedream": "43049158006c8b195c63f518",
    "policy:lenet5:2:pipedream-2bw": "11314be1170eb4c342492b09",
    "policy:lenet5:2:zb-h1": "802786c4ad78d94f44163ea9",
    "policy:lenet5:2:zbv": "9c931be8ce82958bc24469e4",
    "policy:lenet5:3:1f1b": "c8d2a5ccf8cbe45b34e51951",
    "policy:lenet5:3:dualpipev": "f3da59a4dff12121e2bfc8a1",
    "policy:lenet5:3:gpipe": "73888ec5f70df0a8143ef33a",
    "policy:lenet5:3:interleaved-1f1b": "de887bb1534f7144ac4502fd",
    "policy:lenet5:3:layerpipe": "28d1e2e06b6e67c8a019539b",
    "policy:lenet5:3:looped-bfs": "5e1eed64f5312e6ed0b7efb3",
    "policy:lenet5:3:ooo": "61fac13e1cd2c9fbd7683b80",
    "policy:lenet5:3:pipedream": "f210303cc7330568e3f544c1",
    "policy:lenet5:3:pipedream-2bw": "29e08713eb91b976bec51b0e",
    "policy:lenet5:3:zb-h1": "dc9434e30aee300fa4e9010e",
    "policy:lenet5:3:zbv": "98d4773cc0d9751b574fef49",
    "policy:mlp:16-12-8-4:2:1f1b": "c7aa0a2a68b95becdaadf846",
    "policy:mlp:16-12-8-4:2:dualpipev": "c03eb97ed27f2fe9509a6d05",
    "policy:mlp:16-12-8-4:2:gpipe": "362bbcaa62af608af92d9964",
    "policy:mlp:16-12-8-4:2:interleaved-1f1b": "eebc72915c5ef1e68b7908da",
    "policy:mlp:16-12-8-4:2:layerpipe": "7e09c9cbb1121d45dec03168",
    "policy:mlp:16-12-8-4:2:looped-bfs": "f47f07d2cd23e7b4c79a634d",
    "policy:mlp:16-12-8-4:2:ooo": "03a0884c6a5eb332705a2751",
    "policy:mlp:16-12-8-4:2:pipedream": "794fe049d8f30267f06a6d3c",
    "policy:mlp:16-12-8-4:2:pipedream-2bw": "62dc444b4d88e1630ff2f9bb",
    "policy:mlp:16-12-8-4:2:zb-h1": "bda367b0e97c0f469ea09882",
    "policy:mlp:16-12-8-4:2:zbv": "64d9acfa1de85ae7a6784078",
    "policy:mlp:16-12-8-4:3:1f1b": "f6544b74b7c42762da85afbc",
    "policy:mlp:16-12-8-4:3:dualpipev": "d1bb00203e93d21189ea2f0d",
    "policy:mlp:16-12-8-4:3:gpipe": "3d016352c3fd1c10ee18f4cb",
    "policy:mlp:16-12-8-4:3:interleaved-1f1b": "ebdac8c2b4e3732703c0a193",
    "policy:mlp:16-12-8-4:3:layerpipe": "6bf062ab0cc1066d7e296bae",
    "policy:mlp:16-12-8-4:3:looped-bfs": "90a03cfa52a1ef0458717f86",
    "policy:mlp:16-12-8-4:3:ooo": "61010aa908d1d3b952990466",
    "policy:mlp:16-12-8-4:3:pipedream": "cd43d155a43a5f44f39072ae",
    "policy:mlp:16-12-8-4:3:pipedream-2bw": "3712eb46f3d940f09c6f2c8c",
    "policy:mlp:16-12-8-4:3:zb-h1": "41f607402504e8c5ee89faf3",
    "policy:mlp:16-12-8-4:3:zbv": "d144a6bbaa617e82ba643583",
    "stage:1f1b-4x8x2": "3ae0f6ee0a4f/46f062c9a4a0/3ec7fbd8b5ea/7940b31102cf",
    "stage:dualpipev-2x4": "adf154eba788/c2d6093a6152/e94ccb03bfd1/e2bd0f557681",
    "stage:gpipe-3x6x2": "9901d9216d17/8189ab677300/81fe53d83b7b/d46a1bfe2e89",
    "stage:interleaved-2x4x2": "d62d0b61fab2/e506a3d41d54/a2957f11c88c/cd88ba378237",
    "stage:looped-bfs-2x4": "67efe191882c/d6e038f7ce65/843a51ac547b/aa6b8837a51c",
    "stage:zb-h1-2x4x2v": "1f2bdf9a9914/2f10224bd564/223d55e5c274/c0667c10aeb6",
    "stage:zb-h1-4x8": "bead8df7dd31/cb3e356bb969/6253a7a8f75d/eebf880221d3",
    "stage:zb-h2-3x6": "ef4a21517013/f57ea60375d4/cd6a089e6ee3/f721c04dad5a",
    "stage:zbv-2x4x2": "8ab397ec4d4a/7f59ed8a171a/a9a30db7ccf9/f33d81e76835",
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_identical_to_recorded(name: str) -> None:
    assert cases()[name]() == RECORDED[name]


def test_every_case_is_recorded() -> None:
    assert sorted(cases()) == sorted(RECORDED)


if __name__ == "__main__":
    recorded = {name: run() for name, run in sorted(cases().items())}
    json.dump(recorded, sys.stdout, indent=4)
    print()

"""Issue 14's speed work keeps results byte-identical: simulator results, compiled dependency arrays and
`explore` rows of a fixed set of schedules, against digests recorded with the code from before it.

Every case is hashed (sha256) over what a user sees — every op's start, end and version read, the metrics
(JSON), the version records — and, separately, over the compiled schedule's dependency arrays (CSR pointer,
producers, words, roles), so a change that keeps the timing but reorders or renumbers dependencies shows
too. `RECORDED` was printed by `python tests/test_speed_identity.py` with the code of commit d7a0b03
(before dependencies were built as arrays); regenerate it only for an intended change of
results, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest

from layerpipe.costs import make_cost_model
from layerpipe.dse import DesignPoint
from layerpipe.dse._evaluate import evaluate_point
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import (
    Op,
    OpSchedule,
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
#: Not bus: a planned bus's order is the interconnect work's, changing beside this (stage cases run a bus).
INTERCONNECTS = ("shared", "links:2:16", "rtl")
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
    # LayerPipe at max staleness 1 (8 of the 56 rows; the other 48 unchanged): more processors never slower and
    # PipeDream's replicated plan searched under the bound too (tests/test_layerpipe_more_processors.py). lenet5,
    # N = 3, rtl: one processor, 19,437 cycles per sample -> 6,479 (one stage on three replicas, staleness 1);
    # mlp:16-12-8-4, N = 3, rtl: 140 -> 82.667.
    "explore:rows": "b180a262db5b2506662108b6",
    "policy:lenet5:2:1f1b": "16a98144a8b909c2659ae161",
    "policy:lenet5:2:dualpipev": "2b544acc8004fb22ee6dd434",
    "policy:lenet5:2:gpipe": "9a701d3a70dead641c4f76be",
    "policy:lenet5:2:interleaved-1f1b": "e69a94141564202b753dfdc8",
    "policy:lenet5:2:layerpipe": "fe31eed3f1dbeaa392dd5591",
    "policy:lenet5:2:looped-bfs": "ce5117264d19d406faf12f56",
    "policy:lenet5:2:ooo": "fe78a71a6bafd3cded1ecf06",
    "policy:lenet5:2:pipedream": "89d804c006fc3d7522e0ff38",
    "policy:lenet5:2:pipedream-2bw": "a40c1abe697a163fac388f1d",
    "policy:lenet5:2:zb-h1": "358ab35e0cfff7a188535836",
    "policy:lenet5:2:zbv": "72e3a3efb44d20662c40a634",
    "policy:lenet5:3:1f1b": "4397b9b61f6fbdc6fbf7e64c",
    "policy:lenet5:3:dualpipev": "4f3b386337d701f8064938ea",
    "policy:lenet5:3:gpipe": "a7fdc8f1dfdc7bb682c826f4",
    "policy:lenet5:3:interleaved-1f1b": "2ca5c617fc7c246adfab78ad",
    "policy:lenet5:3:layerpipe": "72d9ce0c5349db5d6a9090a7",
    "policy:lenet5:3:looped-bfs": "0633e690fd8c6754a0857df4",
    "policy:lenet5:3:ooo": "e85805783fd58e9f30fdcc62",
    "policy:lenet5:3:pipedream": "63e5a4e329509155e1f8129a",
    "policy:lenet5:3:pipedream-2bw": "50201e4f30bfcbefa1b7d554",
    "policy:lenet5:3:zb-h1": "a0643742bec8c174071e262b",
    "policy:lenet5:3:zbv": "30fe364a37718b7d15420ab3",
    "policy:mlp:16-12-8-4:2:1f1b": "30ac3be32344b29647243976",
    "policy:mlp:16-12-8-4:2:dualpipev": "c8efe8ed3bf983bd8ebc816d",
    "policy:mlp:16-12-8-4:2:gpipe": "01477b2bfbfe0faba405004e",
    "policy:mlp:16-12-8-4:2:interleaved-1f1b": "f5b4f9531f5dbe07e4d3c02d",
    "policy:mlp:16-12-8-4:2:layerpipe": "31d32e7f017d69eed91f2e8e",
    "policy:mlp:16-12-8-4:2:looped-bfs": "4f004bfb377aa56704e9c3b5",
    "policy:mlp:16-12-8-4:2:ooo": "987a4033baa4a4205a3a4441",
    "policy:mlp:16-12-8-4:2:pipedream": "9ff19158185199e9e49bc17c",
    "policy:mlp:16-12-8-4:2:pipedream-2bw": "96d13920fde833b825265cec",
    "policy:mlp:16-12-8-4:2:zb-h1": "4e862f402513c4fc53b9b3b4",
    "policy:mlp:16-12-8-4:2:zbv": "a1c9f5cf1fff6710653c0ce4",
    "policy:mlp:16-12-8-4:3:1f1b": "9fdb4c8a0f96c1e00b39f239",
    "policy:mlp:16-12-8-4:3:dualpipev": "488ce7943bcab64433849681",
    "policy:mlp:16-12-8-4:3:gpipe": "ea08d951f9cee03737808eff",
    "policy:mlp:16-12-8-4:3:interleaved-1f1b": "a50d175fe86c183d72d0418b",
    "policy:mlp:16-12-8-4:3:layerpipe": "fb6acbd9972e05d6556890bc",
    "policy:mlp:16-12-8-4:3:looped-bfs": "c098ba2b16aa26312fe57b6d",
    "policy:mlp:16-12-8-4:3:ooo": "fc98062092a882aa5af30de1",
    "policy:mlp:16-12-8-4:3:pipedream": "9b044b19533f3e4254904d2a",
    "policy:mlp:16-12-8-4:3:pipedream-2bw": "b94da0a000bdf5a17990f2fb",
    "policy:mlp:16-12-8-4:3:zb-h1": "937b4ee1880f58b89c4683c9",
    "policy:mlp:16-12-8-4:3:zbv": "63f68c5771d8d63d85296c01",
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


def _array_and_listed(schedule, workload):
    """The compiled dependency arrays of `schedule` by the array rules and by `dependencies()` op by op."""
    from layerpipe.sim._engine import _array_dependencies, _listed_dependencies

    compiled = compile_schedule(schedule, workload)
    arrays = _array_dependencies(schedule, compiled.tasks, compiled.task, compiled.iteration, workload)
    return arrays, _listed_dependencies(schedule, list(compiled.ops), workload)


def _same(a, b) -> bool:
    """Equal values, and equal types once compiled (`_compile` narrows both paths' arrays with `_narrow`: the array
    path builds int32 producers and words where they fit, the listed path int64)."""
    from layerpipe.schedule._engine import _narrow

    return all(np.array_equal(x, y) and _narrow(x).dtype == _narrow(y).dtype
               for x, y in zip(a[:4], b[:4], strict=True)) and a[4] == b[4]


def _policy_ops(policy: str, net: str, n: int, iterations: int, **given: object):
    network = load_network(net)
    model = make_cost_model("pe", lanes=16)
    rtl = parse_interconnect("rtl", lanes=16)
    result = make_schedule(policy, network, n, model, policy_options(policy, given), rtl)
    return policy_ops(result, network, model, iterations)


@pytest.mark.parametrize("policy", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "pipedream-2bw", "pipedream"])
@pytest.mark.parametrize("net", ["mlp:16-12-8-4", "resnet18"])
def test_array_rules_list_what_dependencies_lists(policy: str, net: str) -> None:
    """Synchronous (expanded stage) and grouped (unfolded) layer-level schedules: the arrays are exactly the
    op-by-op arrays (producers, their order per consumer, words, role numbering), on odd iteration counts too
    (a step or an update group cut short by the run)."""
    for iterations in (1, 7, 13):
        schedule, workload = _policy_ops(policy, net, 3, iterations)
        if schedule.simple and not schedule.synchronous:
            continue  # the engine's own array path (`layer_task_edges`), tested in test_sim
        arrays, listed = _array_and_listed(schedule, workload)
        assert arrays is not None and _same(arrays, listed), (policy, net, iterations)


@pytest.mark.parametrize("name", sorted(STAGE_SCHEDULES))
def test_stage_array_rules_list_what_dependencies_lists(name: str) -> None:
    schedule = STAGE_SCHEDULES[name]()
    stages = 1 + max(op.unit for op in schedule.ops())  # type: ignore[attr-defined]
    for info in (None, StageInfo(stages, tuple(range(1, stages + 1)), tuple(range(2, stages + 2)))):
        workload = Workload.of_stages([(2, 3, 1)] * stages, info)
        arrays, listed = _array_and_listed(schedule, workload)  # type: ignore[arg-type]
        assert arrays is not None and _same(arrays, listed)


def test_asynchronous_stage_schedules_and_unknown_kinds() -> None:
    """A stage-level schedule without steps (no step edges) gives the op-by-op arrays; a kind the stage rules
    do not know fails with the op-by-op error."""
    schedule = replace(one_f_one_b(3, 5), synchronous=False, microbatches=0)
    workload = Workload.of_stages([(2, 3, 1)] * 3)
    arrays, listed = _array_and_listed(schedule, workload)
    assert arrays is not None and _same(arrays, listed)
    rows = list(schedule.procs)
    rows[1] = (*rows[1], Op(1, "U", 1, 0))
    odd = replace(schedule, procs=tuple(rows))
    workload = replace(workload, durations={**workload.durations, ("U", 1): 1})
    with pytest.raises(InputError) as expected:
        workload.dependencies(odd)
    with pytest.raises(type(expected.value), match="^" + re.escape(str(expected.value)) + "$"):
        compile_schedule(odd, workload)


def _drop(schedule: OpSchedule, rng: random.Random) -> OpSchedule:
    """`schedule` with one op left out (its consumers miss a producer, unless nothing consumes it)."""
    ops = [(p, k) for p, row in enumerate(schedule.procs) for k in range(len(row))]
    p, k = rng.choice(ops)
    rows = tuple(row[:k] + row[k + 1:] if q == p else row for q, row in enumerate(schedule.procs))
    return replace(schedule, procs=rows)


@pytest.mark.parametrize("seed", range(6))
def test_missing_producers_raise_what_they_raised(seed: int) -> None:
    """A schedule with an op left out compiles to the same arrays, or fails with the same error message, as
    `dependencies()` gives (the array rules hand every such case back to it)."""
    rng = random.Random(seed)
    made = [(STAGE_SCHEDULES[name](), None) for name in sorted(STAGE_SCHEDULES)]
    made += [_policy_ops(policy, "mlp:16-12-8-4", 3, 9) for policy in ("1f1b", "pipedream-2bw", "gpipe")]
    for schedule, workload in made:
        if workload is None:
            stages = 1 + max(op.unit for op in schedule.ops())  # type: ignore[attr-defined]
            workload = Workload.of_stages([(2, 3, 1)] * stages)
        broken = _drop(schedule, rng)  # type: ignore[arg-type]
        try:
            expected: object = workload.dependencies(broken)
        except InputError as exc:
            expected = exc
        if isinstance(expected, InputError):
            with pytest.raises(type(expected)) as caught:
                compile_schedule(broken, workload)
            assert str(caught.value) == str(expected)
        else:
            arrays, listed = _array_and_listed(broken, workload)
            assert arrays is not None and _same(arrays, listed)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_identical_to_recorded(name: str) -> None:
    assert cases()[name]() == RECORDED[name]


def test_every_case_is_recorded() -> None:
    assert sorted(cases()) == sorted(RECORDED)


if __name__ == "__main__":
    recorded = {name: run() for name, run in sorted(cases().items())}
    json.dump(recorded, sys.stdout, indent=4)
    print()

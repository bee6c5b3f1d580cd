"""DualPipeV and LoopedBFS: compute orders equal to torch 2.13's, and DualPipeV's bubble.

Bubble of one step = makespan − one rank's work (the definition under which the DeepSeek-V3 report's
1F1B figure (PP−1)(F+B) and ZB1P figure (PP−1)(F+B−2W) hold; B there is the full backward I + W). For
DualPipeV on p ranks (PP = 2p stages, two per rank) the report (arXiv 2412.19437, Table 2, and
github:deepseek-ai/DualPipe's README) gives (PP/2 − 1)(F&B + B − 3W), F&B the time of an overlapped
forward-and-backward pair. We measure:

- Timed as the report times it — each overlapped pair one unit of X cycles that starts when both its
  inputs are in — the largest per-rank bubble is exactly (p − 1)(X + B − 3W) whenever F ≤ I and W ≤ I
  (forward and weight-gradient chunks no longer than the input-gradient chunk, the transformer case);
  when F > I or W > I it is larger (the formula's accounting assumes the I chunks cover those gaps).
- Timed as our policy runs it (the pair's F, then its B, on one processor: no overlap is modelled) every
  rank's bubble is (p − 1)(F + B − 2W), ZB1P's, when F = I ≥ W; with other costs it has no closed form we
  found and is never less than that.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import (
    Op,
    OpSchedule,
    dependencies,
    dry_run,
    dualpipev,
    looped_bfs,
    to_torch_actions,
    v_stage_map,
    validate,
)
from layerpipe.schedule._sync_policies import SyncOptions, schedule_stages
from layerpipe.schedule.policies import make_schedule

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
MODEL = make_cost_model("pe")


def stub_stages(p: int, stage_indices: list[int], total: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(num_stages=total, group_size=p, group_rank=0, stage_index=s, submod=None)
            for s in stage_indices]


def torch_compute_order(pipeline_order: dict) -> list[list[str]]:
    """torch's compute actions per rank; an OVERLAP_F_B action is its sub-actions in order (F, then B)."""
    rows = []
    for rank in sorted(pipeline_order):
        row: list[str] = []
        for action in pipeline_order[rank]:
            if action is None:
                continue
            if action.sub_actions is not None:
                row += [str(sub) for sub in action.sub_actions]
            elif action.is_compute_op:
                row.append(str(action))
        rows.append(row)
    return rows


def ours(schedule: OpSchedule) -> list[list[str]]:
    actions = to_torch_actions(schedule)
    return [actions[p] for p in range(schedule.num_procs)]


@pytest.mark.parametrize("p", range(1, 9))
def test_dualpipev_matches_torch(p: int) -> None:
    for m in sorted({2 * p, 2 * p + 1, 3 * p, 4 * p + 1}):
        order = schedules.ScheduleDualPipeV(stub_stages(p, [0, 2 * p - 1], 2 * p), m).pipeline_order
        theirs = torch_compute_order(order)
        schedule = dualpipev(p, m)
        validate(schedule)
        assert ours(schedule) == theirs, (p, m)
        assert schedule.placement() == dict(enumerate(v_stage_map(p)))


def test_dualpipev_refuses_fewer_microbatches_than_stages_as_torch_does() -> None:
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        schedules.ScheduleDualPipeV(stub_stages(3, [0, 5], 6), 5)
    with pytest.raises(InputError, match="microbatches 5: dualpipev on 3 processors needs at least 6"):
        dualpipev(3, 5)


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("v", [1, 2, 3])
def test_looped_bfs_matches_torch(p: int, v: int) -> None:
    for m in sorted({1, 2, p, 2 * p + 1, 3 * p}):
        order = schedules.ScheduleLoopedBFS(stub_stages(p, [k * p for k in range(v)], p * v), m).pipeline_order
        schedule = looped_bfs(p, m, v)
        validate(schedule)
        assert ours(schedule) == torch_compute_order(order), (p, m, v)


def rank_bubbles(schedule: OpSchedule, durations: dict[str, int], fused: int | None = None) -> list[int]:
    """Makespan − work per rank of one step; with `fused`, each overlapped pair (an F followed by a B on a
    rank) is one unit of `fused` cycles that waits for both inputs and delivers both outputs at its end."""
    deps = dict(dependencies(schedule))
    pairs = {}
    if fused is not None:
        for row in schedule.procs:
            for a, b in itertools.pairwise(row):
                if a.kind == "F" and b.kind == "B":
                    pairs[a] = b
        for f, b in pairs.items():  # the pair starts when the B's inputs are in too
            deps[f] = deps[f] + tuple(d for d in deps[b] if d.producer != f)
    backwards = set(pairs.values())

    def duration(op: Op) -> int:
        if op in pairs:
            return fused  # type: ignore[return-value]
        return 0 if op in backwards else durations[op.kind]

    times = dry_run(schedule, deps, duration)
    span = max(end for _, end in times.values())
    return [span - sum(duration(op) for op in row) for row in schedule.procs]


COSTS = list(itertools.product(range(1, 4), range(1, 4), range(0, 3)))  # (F, I, W)


@pytest.mark.parametrize("p", [2, 3, 5])
def test_dualpipev_bubble_is_the_deepseek_formula_where_it_applies(p: int) -> None:
    checked = 0
    for (f, i, w), m in itertools.product(COSTS, (2 * p, 3 * p + 1)):
        b = i + w
        durations = {"F": f, "I": i, "W": w, "B": b}
        for pair in sorted({f + b, max(f, b)}):  # no overlap, and perfect overlap
            worst = max(rank_bubbles(dualpipev(p, m), durations, fused=pair))
            formula = (2 * p // 2 - 1) * (pair + b - 3 * w)  # (PP/2 − 1)(F&B + B − 3W), PP = 2p
            if f <= i and w <= i:
                assert worst == formula, (p, m, f, i, w, pair)
                checked += 1
            else:
                assert worst > formula, (p, m, f, i, w, pair)
    assert checked > 20


@pytest.mark.parametrize("p", [2, 3, 5])
def test_dualpipev_bubble_with_pairs_run_back_to_back_is_zb1p(p: int) -> None:
    for (f, i, w), m in itertools.product(COSTS, (2 * p, 3 * p + 1)):
        b = i + w
        bubbles = rank_bubbles(dualpipev(p, m), {"F": f, "I": i, "W": w, "B": b})
        if f == i >= w:
            assert bubbles == [(p - 1) * (f + b - 2 * w)] * p, (p, m, f, i, w)
        else:  # no closed form: never below ZB1P's
            assert min(bubbles) >= (p - 1) * (f + b - 2 * w), (p, m, f, i, w)


def test_policies_on_a_network_and_on_uniform_stages() -> None:
    net = load_network("mlp:" + "-".join(["16"] * 9))
    for name in ("dualpipev", "looped-bfs"):
        result = make_schedule(name, net, 4, MODEL)
        assert result.synchronous and result.metrics.max_staleness == 0
        assert result.stages is not None and result.stages.num_stages == 8  # two chunks per processor
    assert make_schedule("dualpipev", net, 4, MODEL).explicit.microbatches == 8  # type: ignore[union-attr]
    uniform = schedule_stages("dualpipev", 4, SyncOptions(microbatches=8), (1, 1, 1))
    assert uniform.metrics.period_cycles >= 8 * 2 * 3  # two chunks of F + I + W per micro-batch per rank

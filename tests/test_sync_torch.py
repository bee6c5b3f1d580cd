"""Our synchronous stage-level generators against torch 2.13's own pipeline orders.

torch builds `pipeline_order` (rank → list of `_Action` or None) in each schedule's constructor; the order
builders only read the stage objects' `num_stages`, `group_size`, `group_rank` and `submod`, so plain
namespaces stand in for `PipelineStage`s (no process group is needed). Idle steps (None) and torch's
non-compute actions (REDUCE_GRAD) are dropped before comparing, as the issue allows.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from layerpipe.errors import InputError
from layerpipe.schedule import (
    OpSchedule,
    ScheduleError,
    from_torch_actions,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    to_torch_actions,
    validate,
    zb_h1,
    zbv,
)

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

PROCS = range(1, 9)


def microbatch_counts(p: int) -> list[int]:
    return sorted({1, 2, p, 2 * p - 1, 2 * p, 3 * p + 1, 4 * p} - {0})


def stub_stages(p: int, stage_indices: list[int], total: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(num_stages=total, group_size=p, group_rank=0, stage_index=s, submod=None) for s in stage_indices
    ]


def compute_order(pipeline_order: dict) -> list[list[str]]:
    return [[str(a) for a in pipeline_order[r] if a is not None and a.is_compute_op] for r in sorted(pipeline_order)]


def ours(schedule: OpSchedule) -> list[list[str]]:
    actions = to_torch_actions(schedule)
    return [actions[p] for p in range(schedule.num_procs)]


def torch_or_error(build):
    try:
        return compute_order(build().pipeline_order)
    except ValueError:
        return None


@pytest.mark.parametrize("p", PROCS)
def test_gpipe_matches_torch(p: int) -> None:
    for m in microbatch_counts(p):
        theirs = torch_or_error(lambda m=m: schedules.ScheduleGPipe(stub_stages(p, [0], p)[0], m))
        assert ours(gpipe(p, m)) == theirs, (p, m)


@pytest.mark.parametrize("p", PROCS)
@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_1f1b_matches_torch(p: int, v: int) -> None:
    compared = 0
    for m in microbatch_counts(p):
        theirs = torch_or_error(
            lambda m=m: schedules.ScheduleInterleaved1F1B(stub_stages(p, [k * p for k in range(v)], p * v), m)
        )
        if theirs is None:  # torch refuses m that is not a multiple of its rounds; so do we with chunks
            if v > 1:
                with pytest.raises(InputError, match="multiple of"):
                    interleaved_1f1b(p, m, v)
            continue
        assert ours(interleaved_1f1b(p, m, v)) == theirs, (p, m, v)
        compared += 1
    assert compared >= 3


@pytest.mark.parametrize("p", PROCS)
@pytest.mark.parametrize("v", [1, 2])
def test_zb_h1_matches_torch_interleaved_zero_bubble(p: int, v: int) -> None:
    for m in microbatch_counts(p):
        theirs = torch_or_error(
            lambda m=m: schedules.ScheduleInterleavedZeroBubble(stub_stages(p, [k * p for k in range(v)], p * v), m)
        )
        if theirs is None:
            # torch also checks rounds for one chunk, where they do not change the order: we accept those m.
            if v > 1:
                with pytest.raises(InputError, match="multiple of"):
                    zb_h1(p, m, v)
            continue
        assert ours(zb_h1(p, m, v)) == theirs, (p, m, v)


@pytest.mark.parametrize("p", PROCS)
def test_zbv_matches_torch(p: int) -> None:
    for m in microbatch_counts(p):
        theirs = torch_or_error(lambda m=m: schedules.ScheduleZBVZeroBubble(stub_stages(p, [0, 2 * p - 1], 2 * p), m))
        assert ours(zbv(p, m)) == theirs, (p, m)


@pytest.mark.parametrize("p", PROCS)
def test_1f1b_differs_from_torch_only_in_last_rank_forward_numbers(p: int) -> None:
    """torch 2.13's Schedule1F1B numbers the last rank's forwards 1..m (`3F1 3B0 3F2 …` for 4 ranks)."""
    for m in range(p, 3 * p + 2):  # torch requires m >= p
        theirs = compute_order(schedules.Schedule1F1B(stub_stages(p, [0], p)[0], m).pipeline_order)
        mine = ours(one_f_one_b(p, m))
        assert mine[:-1] == theirs[:-1], (p, m)
        assert mine[-1] != theirs[-1]
        shifted = [f"{p - 1}F{int(a.split('F')[1]) - 1}" if "F" in a else a for a in theirs[-1]]
        assert shifted == mine[-1], (p, m)
        # torch's last rank runs F(m) and never F(0): our validator rejects its order, accepts ours.
        with pytest.raises(ScheduleError):
            validate(from_torch_actions(theirs, microbatches=m))
        validate(one_f_one_b(p, m))


def test_1f1b_four_ranks_last_rank_starts_with_forward_zero() -> None:
    assert ours(one_f_one_b(4, 8))[3][:4] == ["3F0", "3B0", "3F1", "3B1"]
    theirs = compute_order(schedules.Schedule1F1B(stub_stages(4, [0], 4)[0], 8).pipeline_order)
    assert theirs[3][:4] == ["3F1", "3B0", "3F2", "3B1"]


def test_torch_orders_with_idle_steps_import_and_validate() -> None:
    """torch's orders with None (idle) entries and REDUCE_GRAD come in through `from_torch_actions`."""
    order = schedules.ScheduleInterleavedZeroBubble(stub_stages(4, [0, 4], 8), 8).pipeline_order
    assert any(a is None for row in order.values() for a in row)
    imported = from_torch_actions(order, microbatches=8)
    validate(imported)
    assert imported == zb_h1(4, 8, 2)
    gp = schedules.ScheduleGPipe(stub_stages(3, [0], 3)[0], 3).pipeline_order
    assert any("REDUCE_GRAD" in str(a) for row in gp.values() for a in row)
    assert from_torch_actions(gp, microbatches=3) == gpipe(3, 3)

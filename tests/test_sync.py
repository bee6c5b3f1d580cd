"""Synchronous stage-level generators: every one validates, has the documented stage → processor map, and
the Zero Bubble variants have the bubbles the ZB paper gives (unit F = I = W, B = I + W = 2).

Per step, the extra time over the 3m units of work each processor must do is the paper's bubble:
1F1B and GPipe (p−1)(F+B+W) = 3(p−1); ZB-H1 (p−1)(F+B−W) = p−1; ZB-H2 (p−1)(F+B−2W) = 0. We measure it with
the dry run over 1, 2 and 3 steps: the first step also pays the pipeline fill, so the bubble of a later step
is the growth of the makespan minus 3m.
"""

from __future__ import annotations

import pytest

from layerpipe.errors import InputError
from layerpipe.schedule import (
    Op,
    OpSchedule,
    dependencies,
    dry_run,
    dualpipev,
    gpipe,
    interleaved_1f1b,
    looped_bfs,
    looping_stage_map,
    one_f_one_b,
    v_stage_map,
    validate,
    zb_h1,
    zb_h2,
    zbv,
)

UNIT = {"F": 1, "I": 1, "W": 1, "B": 2}


def unit_cost(op: Op) -> int:
    return UNIT[op.kind]


def makespan(schedule: OpSchedule) -> int:
    return max(end for _, end in dry_run(schedule, dependencies(schedule), unit_cost).values())


def generators(p: int, m: int, steps: int) -> dict[str, OpSchedule]:
    out = {
        "gpipe": gpipe(p, m, steps),
        "1f1b": one_f_one_b(p, m, steps),
        "zb-h1": zb_h1(p, m, 1, steps),
        "zb-h2": zb_h2(p, m, steps),
        "zbv": zbv(p, m, steps),
    }
    out["looped-bfs"] = looped_bfs(p, m, 2, steps)
    if m >= 2 * p:  # DualPipeV needs a micro-batch per stage (as torch's)
        out["dualpipev"] = dualpipev(p, m, steps)
    rounds = max(1, m // p)
    if m % rounds == 0:  # interleaved schedules need a whole number of rounds (as torch's)
        out["interleaved-1f1b"] = interleaved_1f1b(p, m, 2, steps)
        out["zb-h1-v2"] = zb_h1(p, m, 2, steps)
    return out


# p = 5, 7, 8 are 0.9-1.7 s of CPU: slow (the fast loop keeps p = 1..4 and 6)
@pytest.mark.parametrize("p", [*range(1, 5), 6, *(pytest.param(p, marks=pytest.mark.slow) for p in (5, 7, 8))])
def test_every_generator_validates(p: int) -> None:
    for m in sorted({p, 2 * p, 3 * p + 1, 1}):
        for steps in (1, 2):
            for name, schedule in generators(p, m, steps).items():
                assert schedule.level == "stage" and schedule.synchronous and schedule.microbatches == m
                assert schedule.num_steps == steps, name
                validate(schedule)  # raises ScheduleError with the grid on any fault
                validate(schedule, durations=unit_cost)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("extra", [0, 1, 4])
def test_bubbles_per_step_match_zero_bubble_paper(p: int, extra: int) -> None:
    m = 2 * p - 1 + extra  # ZB-H2 needs m >= 2p−1 to fill its warm-up
    # generator: (first step's extra time, each later step's bubble)
    expected = {gpipe: (3 * (p - 1), 3 * (p - 1)), one_f_one_b: (3 * (p - 1), 3 * (p - 1)), zb_h1: (p - 1, p - 1)}
    expected[zb_h2] = (p - 1, 0)
    for generator, (first, bubble) in expected.items():
        spans = [makespan(generator(p, m, steps=k)) for k in (1, 2, 3)]
        assert spans[0] - 3 * m == first, generator.__name__
        assert spans[1] - spans[0] - 3 * m == bubble, generator.__name__
        assert spans[2] - spans[1] - 3 * m == bubble, generator.__name__


def test_zb_h2_holds_more_forwards_in_flight_than_zb_h1() -> None:
    """H2 buys its bubble with memory: stage i keeps up to 2(p−1−i)+1 forwards in flight, H1 p−i."""

    def peak_in_flight(schedule: OpSchedule, proc: int) -> int:
        live = peak = 0
        for op in schedule.procs[proc]:
            live += {"F": 1, "I": -1}.get(op.kind, 0)
            peak = max(peak, live)
        return peak

    p, m = 4, 12
    h1, h2 = zb_h1(p, m), zb_h2(p, m)
    assert [peak_in_flight(h1, i) for i in range(p)] == [p - i for i in range(p)]
    assert [peak_in_flight(h2, i) for i in range(p)] == [2 * (p - 1 - i) + 1 for i in range(p)]


def test_stage_to_processor_maps() -> None:
    assert looping_stage_map(3, 2) == [0, 1, 2, 0, 1, 2]
    assert v_stage_map(3) == [0, 1, 2, 2, 1, 0]
    assert interleaved_1f1b(3, 6, 2).placement() == dict(enumerate(looping_stage_map(3, 2)))
    assert zbv(3, 6).placement() == dict(enumerate(v_stage_map(3)))
    assert one_f_one_b(4, 4).placement() == {s: s for s in range(4)}


def test_1f1b_order_by_hand() -> None:
    rows = [" ".join(str(op) for op in row) for row in one_f_one_b(3, 4).procs]
    assert rows == [
        "F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 B0.2 B0.3",
        "F1.0 F1.1 B1.0 F1.2 B1.1 F1.3 B1.2 B1.3",
        "F2.0 B2.0 F2.1 B2.1 F2.2 B2.2 F2.3 B2.3",
    ]


def test_steps_repeat_with_offset_microbatches() -> None:
    two = gpipe(2, 3, steps=2)
    assert " ".join(str(op) for op in two.procs[1]) == "F1.0 F1.1 F1.2 B1.0 B1.1 B1.2 F1.3 F1.4 F1.5 B1.3 B1.4 B1.5"


@pytest.mark.parametrize(
    "call",
    [lambda: gpipe(0, 4), lambda: one_f_one_b(2, 0), lambda: zb_h1(2, 4, 0), lambda: zb_h2(2, 2, steps=0)],
)
def test_bad_arguments_are_input_errors(call) -> None:
    with pytest.raises(InputError, match="must be >= 1"):
        call()

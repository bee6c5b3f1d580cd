"""ZB-H2 against the Zero Bubble paper (Qi et al., ICLR'24, §3.1, Table 1 and Figure 4), measured by the
simulator.

The formulas, for p stages (one per processor), m micro-batches per step, unit costs F = I = W = 1 (the
paper's assumption; its B is our I):

- Bubble per step, after the first: (p − 1)(F + I − 2W) = 0 once m ≥ 2p − 1 (ZB-H1: (p − 1)(F + I − W)
  = p − 1; 1F1B: (p − 1)(F + I + W) = 3(p − 1)). The first step also pays the fill, p − 1.
- Peak activations in flight per stage, an activation being held from its F's start to its W's end (the
  simulator's stage-level memory report): min(m, 2p − 1) on every stage — the paper's (2p − 1)·M_B; stage i
  starts with min(m, 2(p − 1 − i) + 1) forwards before its first I. ZB-H1 peaks at p (the paper's p·M_B;
  its deferred W keeps activations past the I), 1F1B holds p − i at stage i.
  The old ZB-H2 here deferred every W to the end of the step and held m.

torch 2.13 ships no ZB-H2 (only ZB-H1 as ScheduleInterleavedZeroBubble with one chunk, and ZB-V), so the
order is checked against these formulas and the paper's rules, not against torch; ZB-H1's order is checked
against torch in tests/test_sync_torch.py.
"""

from __future__ import annotations

import pytest

from layerpipe.schedule import OpSchedule, one_f_one_b, validate, zb_h1, zb_h2
from layerpipe.sim import SimConfig, Workload, simulate

UNIT = (1, 1, 1)


def simulated(schedule: OpSchedule, costs: tuple[int, int, int] = UNIT):
    stages = 1 + max(op.unit for op in schedule.ops())
    workload = Workload.of_stages([costs] * stages, activation_words=[1] * stages)
    return simulate(schedule, workload, SimConfig())


def step_bubbles(generator, p: int, m: int) -> tuple[int, int]:
    """(first step's time beyond 3m, each later step's): from the simulator's completion times."""
    done = simulated(generator(p, m, steps=4)).completion_times
    later = {int(done[k] - done[k - 1]) - 3 * m for k in range(1, 4)}
    assert len(later) == 1
    return int(done[0]) - 3 * m, later.pop()


@pytest.mark.parametrize("p", [2, 3, 4, 6])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_zb_h2_bubble_is_the_papers(p: int, extra: int) -> None:
    m = 2 * p - 1 + extra
    assert step_bubbles(zb_h2, p, m) == (p - 1, 0)  # (p − 1)(F + I − 2W) = 0
    assert step_bubbles(lambda p, m, steps: zb_h1(p, m, 1, steps), p, m) == (p - 1, p - 1)  # (p − 1)(F + I − W)
    assert step_bubbles(one_f_one_b, p, m) == (3 * (p - 1), 3 * (p - 1))  # (p − 1)(F + I + W)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7])
def test_zb_h2_peak_activations_are_2p_minus_1_not_m(p: int) -> None:
    for m in sorted({1, p, 2 * p - 1, 2 * p, 4 * p + 1}):
        schedule = zb_h2(p, m, steps=2)
        validate(schedule)
        assert simulated(schedule).peak_memory_words == (min(m, 2 * p - 1),) * p, (p, m)
        # ZB-H1's peak is the paper's p·M_B (1F1B's): ZB-H2 buys its bubble with about twice that
        assert max(simulated(zb_h1(p, m, 1, 2)).peak_memory_words) == min(m, p), (p, m)
        assert simulated(one_f_one_b(p, m, 2)).peak_memory_words == tuple(min(m, p - i) for i in range(p))


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_zb_h2_warm_up_forwards_and_w_in_the_steady_state(p: int) -> None:
    m = 4 * p
    schedule = zb_h2(p, m)
    for i, row in enumerate(schedule.procs):
        kinds = [op.kind for op in row]
        assert kinds.index("I") == min(m, 2 * (p - 1 - i) + 1), i  # forwards before the first I
        # W fills the steady state: some W runs before the stage's last forward (not all deferred to the end)
        last_forward = max(k for k, kind in enumerate(kinds) if kind == "F")
        assert kinds[:last_forward].count("W") >= m - (2 * p - 1), i


def test_zb_h2_with_non_unit_costs_keeps_its_memory_bound() -> None:
    """The order is built for unit costs; under other costs the simulator may run ops early, never holding
    more than 2p − 1 activations (the order itself caps F − W)."""
    p, m = 4, 12
    for costs in [(2, 3, 1), (1, 2, 2), (3, 1, 0)]:
        assert max(simulated(zb_h2(p, m, steps=2), costs).peak_memory_words) <= 2 * p - 1

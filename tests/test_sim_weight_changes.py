"""The peak memory's weight changes, every unit and holder at once (`layerpipe.sim._memory._weight_changes`), hold
the same words on every processor at every time as the per-unit steps they replaced (`_weight_steps`): the
peaks of both, with the same activations, are equal on policies with and without update groups, read floors,
remote copies and the `ema` buffer, on `shared` and on distributed interconnects."""

from __future__ import annotations

import numpy as np
import pytest

from layerpipe.costs import PEModel
from layerpipe.network import load_network
from layerpipe.schedule.policies import make_schedule
from layerpipe.sim import SimConfig, simulate_policy_result
from layerpipe.sim import _memory as memory
from layerpipe.sim._memory import _kept_intervals, _weight_changes, _weight_steps, peak_memory
from layerpipe.sim._policy import policy_ops

MODEL = PEModel(64, 16)


def _reference_peaks(sim, workload, mode: str, distributed: bool) -> list[int]:
    """The peaks as computed before: per-unit steps and kept intervals, sorted by (time, delta) per processor."""
    c = sim._compiled
    where, lo, hi, words = _kept_intervals(c, sim.start, sim.end)
    parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for p, t, d in _weight_steps(c, sim.start, sim.end, sim.versions, workload, mode, distributed):
        parts.setdefault(p, []).append((t, d))
    peaks = []
    for p in range(c.num_procs):
        mine = where == p
        times = np.concatenate([lo[mine], hi[mine], *(t for t, _ in parts.get(p, ()))])
        deltas = np.concatenate([words[mine], -words[mine], *(d for _, d in parts.get(p, ()))])
        peaks.append(max(0, int(np.cumsum(deltas[np.lexsort((deltas, times))]).max())) if len(times) else 0)
    return peaks


@pytest.mark.parametrize("policy", ["layerpipe", "pipedream", "pipedream-2bw", "gpipe", "1f1b", "ooo"])
@pytest.mark.parametrize("interconnect,mode", [("shared", "stash"), ("links", "stash"), ("links", "ema"),
                                               ("shared", "ema"), ("links", "latest")])
@pytest.mark.parametrize("at_once", [True, False])
def test_weight_changes_give_the_peaks_of_the_weight_steps(policy: str, interconnect: str, mode: str, at_once: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if not at_once:  # a long run's path: unit by unit
        monkeypatch.setattr(memory, "MAX_AT_ONCE_OPS", 0)
    network = load_network("lenet5", 1)
    result = make_schedule(policy, network, 3, MODEL)
    config = SimConfig(interconnect, mode=mode) if interconnect == "shared" else SimConfig.links(2, 4, mode=mode)
    sim = simulate_policy_result(result, network, MODEL, 24, config)
    workload = policy_ops(result, network, MODEL, 1, mode)[1]
    distributed = interconnect != "shared"
    expected = _reference_peaks(sim, workload, mode, distributed)
    assert peak_memory(sim._compiled, sim.start, sim.end, sim.versions, workload, mode, distributed) == expected
    if at_once:
        assert list(sim.peak_memory_words) == expected
    p, t, d = _weight_changes(sim._compiled, sim.start, sim.end, sim.versions, workload, mode, distributed)
    assert int(d.sum()) == 0 and len(p) == len(t) == len(d)  # every word held is released at the end

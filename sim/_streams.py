"""The simulator's front end to the stream engine (`layerpipe.schedule._stream_engine`).

The engine — `Program`, `run_program`, the lane-sharing rule `share_lanes`, deadlock reports — sits in the
schedule layer (issue 13's layering: the stream and data-parallel policies time their kernels on it without
importing the simulator); its docstring states the rules. This module keeps the names the simulator and its
tests always used, turns a run into a `SimResult` (`sim_result`), and simulates what those policies return
(`simulate_result`).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from layerpipe.costs import CostModel
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED
from layerpipe.network import Network
from layerpipe.schedule import _dataparallel, _streams
from layerpipe.schedule._ir import Op
from layerpipe.schedule._result import ScheduleResult
from layerpipe.schedule._stream_engine import Program, Timing, placed_rows, run_program, share_lanes
from layerpipe.sim._interconnect import SimConfig
from layerpipe.sim._report import SimResult

__all__ = ["Program", "Timing", "functional_order", "run_program", "share_lanes", "sim_result", "simulate_result"]


def sim_result(program: Program, timing: Timing, row: list[int], num_rows: int, config: SimConfig, batch: int,
               microbatches: int, peak_words: tuple[int, ...]) -> SimResult:
    """The run as a `SimResult`: kernels only (transfers become link traffic), on `num_rows` rows (`row[i]`
    per kernel: a replica, or a stream of the one device), each row's ops in start order.

    The schedule is synchronous with `microbatches` micro-batches per step; U ops carry their step. The
    version an F or E op read is observed, not assumed: the number of updates of its layer on its device
    that ended by its start.
    """
    kernels = [i for i in range(program.num_items) if not program.is_transfer(i)]
    updates: dict[tuple[int, int], list[int]] = {}
    for i in kernels:
        op = program.names[i]
        assert op is not None
        if op.kind == "U":
            updates.setdefault((program.device[i], op.unit), []).append(timing.end[i])
    for ends in updates.values():
        ends.sort()
    schedule, items = placed_rows(program, timing, row, num_rows, microbatches)
    ops = tuple(op for r in schedule.procs for op in r)
    versions = []
    for op, i in zip(ops, items, strict=True):
        reads = op.kind in ("F", "E") and (program.device[i], op.unit) in updates
        versions.append(bisect_right(updates[(program.device[i], op.unit)], timing.start[i]) if reads else -1)
    traffic: dict[tuple[int, int], int] = {}
    for i in range(program.num_items):
        if program.is_transfer(i):
            key = (program.device[i], program.stream[i])
            traffic[key] = traffic.get(key, 0) + program.work[i]
    return SimResult(schedule, config, ops, np.asarray([timing.start[i] for i in items], dtype=np.int64),
                     np.asarray([timing.end[i] for i in items], dtype=np.int64),
                     np.asarray(versions, dtype=np.int64), peak_words, traffic, batch)


def functional_order(result: SimResult) -> list[Op]:
    """The simulated ops for `layerpipe.sim.functional`: in start order, with one update per layer and step.

    Data-parallel replicas each apply the same all-reduced gradient, so their N copies of U_l(j) are one
    update of the one set of weights the functional mode keeps; the first copy to start stands for them.
    """
    from layerpipe.sim.functional import order_by_start

    seen: set[tuple[int, int]] = set()
    keep = []
    for op, s, e in sorted(zip(result.ops, result.start.tolist(), result.end.tolist(), strict=True),
                           key=lambda x: (x[1], x[2], x[0])):
        if op.kind == "U":
            if (op.unit, op.iteration) in seen:
                continue
            seen.add((op.unit, op.iteration))
        keep.append((op, s, e))
    return order_by_start(keep)


def simulate_result(result: ScheduleResult, network: Network, model: CostModel, iterations: int,
                    config: SimConfig) -> SimResult:
    """`layerpipe.sim.simulate_policy_result` for stream, stream-ooo, dp and dp-ooo: the run rebuilt from the
    policy's options (stream: `iterations` iterations on one device, no transfers; dp: ⌈iterations / N⌉
    steps on `config`'s interconnect)."""
    if iterations < 1:
        raise InputError(f"iterations must be >= 1, got {iterations}")
    options = result.options
    if result.policy in _streams.POLICY_NAMES:
        sp = _streams.plan(network, model, result.policy == "stream-ooo", getattr(options, "streams", 1),
                           getattr(options, "defer", 0))
        prog = _streams.build_program(sp, iterations)
        return sim_result(prog, run_program(prog, SHARED), list(prog.stream), sp.streams,
                          SimConfig(mode=config.mode), network.batch, 1, (_streams.peak_words(sp),))
    if result.policy not in _dataparallel.POLICY_NAMES:
        raise InputError(f"policy '{result.policy}' is not timed by the stream engine")
    k = getattr(options, "reverse_first_k", 0)
    assert isinstance(k, int), "a dp-ooo result carries its chosen K"
    interconnect = config.model
    _dataparallel.check_interconnect(interconnect)
    dp = _dataparallel.plan(network, result.num_procs, model, k, getattr(options, "bucket_words", 0),
                            getattr(options, "comm_priority", False))
    prog = _dataparallel.build_program(dp, -(-iterations // result.num_procs))
    return sim_result(prog, run_program(prog, interconnect), list(prog.device), dp.num_procs,
                      SimConfig.of(interconnect, config.mode), dp.network.batch, dp.num_procs,
                      _dataparallel.peak_words(dp))

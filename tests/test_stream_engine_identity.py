"""The stream engine's `run_program` gives the same start and end of every item as the oracle it was trimmed from
(tests/stream_engine_reference.py), on generated programs: several devices, streams sharing lanes, launch
overheads, zero-work kernels, transfers with priorities on every kind of interconnect, and the data-parallel
policies' programs of generated networks (built as tests/stream_engine_reference.py builds them); and
`Program.transfers` adds what `Program.transfer` adds one at a time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import PEModel, make_cost_model
from layerpipe.errors import InputError
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import Network
from layerpipe.schedule._dataparallel import build_program, plan, weight_layers
from layerpipe.schedule._ir import Op
from layerpipe.schedule._stream_engine import Program, cycles_per_iteration, run_program
from layerpipe.schedule._streams import build_program as stream_build_program
from layerpipe.schedule._streams import plan as stream_plan
from tests.strategies import networks
from tests.stream_engine_reference import (
    reference_build_program,
    reference_cycles_per_iteration,
    reference_run_program,
    reference_stream_build_program,
)

INTERCONNECTS = ("shared", "links:2:1", "links:0:3", "links:1:1/4", "bus:1:2", "bus:0:1")


@st.composite
def programs(draw: st.DrawFn) -> Program:
    devices = draw(st.integers(1, 4))
    lanes = draw(st.lists(st.integers(1, 8), min_size=devices, max_size=devices))
    streams = draw(st.lists(st.integers(1, 3), min_size=devices, max_size=devices))
    prog = Program(lanes, streams)
    for n in range(draw(st.integers(1, 60))):
        deps = draw(st.lists(st.integers(0, n - 1), max_size=3)) if n else []
        if devices > 1 and draw(st.booleans()):
            src, dst = draw(st.permutations(range(devices)))[:2]
            prog.transfer(src, dst, draw(st.integers(1, 40)), deps, draw(st.integers(0, 3)))
        else:
            d = draw(st.integers(0, devices - 1))
            prog.kernel(Op(d, draw(st.sampled_from("FAEGU")), n, 0), d, draw(st.integers(0, streams[d] - 1)),
                        draw(st.integers(0, 50)), draw(st.integers(1, 8)), draw(st.integers(0, 5)), deps)
    return prog


@settings(max_examples=200, deadline=None)
@given(program=programs(), spec=st.sampled_from(INTERCONNECTS), microbatches=st.integers(1, 4))
def test_run_program_equals_the_reference(program: Program, spec: str, microbatches: int) -> None:
    interconnect = parse_interconnect(spec)
    expected = reference_run_program(program, interconnect)
    got = run_program(program, interconnect)
    assert (got.start, got.end) == (expected.start, expected.end)
    for rows in (list(program.device), list(program.stream)):  # rows as dp (replicas) and stream (streams) place them
        num_rows = max(len(program.lanes), *program.streams)
        assert (cycles_per_iteration(program, got, rows, num_rows, microbatches)
                == reference_cycles_per_iteration(program, got, rows, num_rows, microbatches))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), devices=st.integers(2, 5), rounds=st.integers(1, 4))
def test_transfers_add_what_transfer_adds_one_at_a_time(data: st.DataObject, devices: int, rounds: int) -> None:
    """`Program.transfers` (a collective's round at once) leaves the same program as `transfer` per pair."""
    one, batch = Program([1] * devices, [1] * devices), Program([1] * devices, [1] * devices)
    for prog in (one, batch):
        prog.kernel(Op(0, "G", 0, 0), 0, 0, 5, 1)
    for _ in range(rounds):
        n = one.num_items
        pairs = data.draw(st.lists(st.permutations(range(devices)).map(lambda p: (p[0], p[1])), min_size=1,
                                   max_size=6))
        deps = [tuple(data.draw(st.lists(st.integers(0, n - 1), max_size=3))) for _ in pairs]
        words, priority = data.draw(st.integers(1, 99)), data.draw(st.integers(0, 3))
        firsts = [one.transfer(src, dst, words, ds, priority) for (src, dst), ds in zip(pairs, deps, strict=True)]
        assert batch.transfers(pairs, words, deps, priority) == firsts[0] == n
    assert one == batch


def test_transfers_refuse_what_transfer_refuses() -> None:
    prog = Program([1, 1], [1, 1])
    with pytest.raises(InputError, match=r"^a transfer needs two devices, got 1 -> 1$"):
        prog.transfers([(0, 1), (1, 1)], 4, [(), ()])
    with pytest.raises(InputError, match=r"^item 0 depends on an item that is not an earlier one"):
        prog.transfers([(0, 1)], 4, [(0,)])
    with pytest.raises(InputError, match=r"^2 transfers need 2 dependency lists, got 1$"):
        prog.transfers([(0, 1), (1, 0)], 4, [()])
    assert prog.num_items == 0


@settings(max_examples=60, deadline=None)
@given(net=networks(max_layers=6, max_width=12), num_procs=st.integers(1, 5), spec=st.sampled_from(INTERCONNECTS),
       k=st.integers(0, 6), bucket=st.sampled_from((0, 40, 400)), comm_priority=st.booleans(),
       steps=st.integers(1, 3))
def test_data_parallel_programs_run_as_on_the_reference(net: Network, num_procs: int, spec: str, k: int,
                                                        bucket: int, comm_priority: bool, steps: int) -> None:
    """The programs the data-parallel policies time (devices of one stream and one lane, ring transfers: the
    engine's fast paths for lone streams and channels) are the reference builder's, item for item, and give the
    reference engine's starts and ends, and the reference's steady cycles per micro-batch."""
    if not weight_layers(net):
        return
    p = plan(net, num_procs, make_cost_model("pe"), min(k, len(weight_layers(net))), bucket, comm_priority)
    program = build_program(p, steps)
    assert program == reference_build_program(p, steps)  # the trimmed builder adds the same items
    interconnect = parse_interconnect(spec)
    expected = reference_run_program(program, interconnect)
    got = run_program(program, interconnect)
    assert (got.start, got.end) == (expected.start, expected.end)
    assert (cycles_per_iteration(program, got, list(program.device), num_procs, num_procs)
            == reference_cycles_per_iteration(program, got, list(program.device), num_procs, num_procs))


@settings(max_examples=40, deadline=None)
@given(net=networks(max_layers=6, max_width=12), ooo=st.booleans(), streams=st.integers(1, 3), defer=st.integers(0, 4),
       lanes=st.sampled_from((1, 4, 64)), overhead=st.integers(0, 9), iterations=st.integers(1, 4))
def test_stream_programs_are_the_reference_builders(net: Network, ooo: bool, streams: int, defer: int, lanes: int,
                                                   overhead: int, iterations: int) -> None:
    """The stream policies' builder, which works out a (kind, layer)'s work and width once, adds the reference
    builder's items, and the run gives the reference's figure."""
    defer = min(defer, len(weight_layers(net)))
    p = stream_plan(net, PEModel(lanes, overhead), ooo, streams, defer)
    program = stream_build_program(p, iterations)
    assert program == reference_stream_build_program(p, iterations)
    got = run_program(program)
    expected = reference_run_program(program)
    assert (got.start, got.end) == (expected.start, expected.end)

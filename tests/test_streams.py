"""The stream engine (`layerpipe.sim._streams`) and the single-device policies stream / stream-ooo.

The lane-sharing rule is tested as a rule (generated widths), the engine against the shared event engine
with one stream, two concurrent kernels by hand, and the policies for what OOO's single-GPU scheme
promises: one stream is the baseline, weight gradients never run beside earlier work, deferred ones run
beside the next forward, and the result is plain SGD.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_functional import assert_weights_close

from layerpipe.cli import main
from layerpipe.costs import PEModel, make_cost_model
from layerpipe.errors import InputError
from layerpipe.network import Network, load_network, mlp
from layerpipe.numerics import init_weights, make_data
from layerpipe.reference import train_reference
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.schedule._streams import StreamOOOOptions, build_program, plan
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import SimConfig, Workload, simulate, simulate_policy_result
from layerpipe.sim._streams import Program, functional_order, run_program, share_lanes
from layerpipe.sim.functional import FunctionalConfig, run_functional
from tests.strategies import networks


@settings(max_examples=200, deadline=None)
@given(lanes=st.integers(1, 64), widths=st.lists(st.integers(1, 80), min_size=1, max_size=5))
def test_lane_sharing_is_max_min_fair_and_work_conserving(lanes: int, widths: list[int]) -> None:
    streams = list(range(len(widths)))
    share = share_lanes(lanes, widths, streams)
    assert all(0 <= a <= w for a, w in zip(share, widths, strict=True))
    assert sum(share) == min(lanes, sum(widths))  # lanes left idle only when no kernel can fill them
    if sum(widths) <= lanes:
        assert share == widths  # everyone fits: each kernel runs as if alone
    for a, w in zip(share, widths, strict=True):  # a kernel short of its width got at least anyone else's share - 1
        if a < w:
            assert all(a >= b - 1 for b in share)


def test_two_kernels_split_the_lanes_and_a_narrow_one_leaves_the_rest() -> None:
    prog = Program([8], [2])
    a = prog.kernel(Op(0, "E", 1, 0), 0, 0, work=80, width=8)
    b = prog.kernel(Op(1, "G", 1, 0), 0, 1, work=80, width=8)
    t = run_program(prog)
    assert (t.start[a], t.end[a], t.start[b], t.end[b]) == (0, 20, 0, 20)  # 4 lanes each
    prog = Program([8], [2])
    a = prog.kernel(Op(0, "E", 1, 0), 0, 0, work=60, width=8)
    b = prog.kernel(Op(1, "G", 1, 0), 0, 1, work=20, width=2, overhead=5)
    t = run_program(prog)
    # a alone on 8 lanes for 5 cycles (b launching: 40 MACs), then 6 + 2 lanes: a's last 20 take ⌈20/6⌉ = 4
    # cycles (ends 9); b's 20 MACs on 2 lanes take 10 cycles (ends 15) — after a ends it still fills only 2
    assert (t.end[a], t.end[b]) == (9, 15)


@settings(max_examples=30, deadline=None)
@given(net=networks(max_layers=6, max_batch=3), lanes=st.integers(1, 40), overhead=st.integers(0, 9),
       iterations=st.integers(1, 3))
def test_one_stream_times_like_the_shared_event_engine(net: Network, lanes: int, overhead: int,
                                                       iterations: int) -> None:
    """The `stream` program on the stream engine == the same ops, one processor, on `layerpipe.sim._engine`,
    each op taking what it takes alone (overhead + ⌈work / min(width, lanes)⌉)."""
    p = plan(net, PEModel(lanes, overhead), False, 1, 0)
    prog = build_program(p, iterations)
    mine = run_program(prog)
    ops = [op for op in prog.names if op is not None]
    alone = {(op.kind, op.unit): overhead + -(-prog.work[i] // min(prog.width[i], lanes))
             for i, op in enumerate(prog.names) if op is not None}
    workload = Workload("layer", alone, net.batch, graph=p.graph)
    theirs = simulate(OpSchedule("layer", (tuple(ops),), True, 1), workload, SimConfig())
    assert [(op, s, e) for op, s, e in zip(theirs.ops, theirs.start.tolist(), theirs.end.tolist(), strict=True)] \
        == list(zip(ops, mine.start, mine.end, strict=True))
    if lanes == 64:  # every kernel fills the pe model's lanes: the one-stream step is the cost model's sum
        assert max(mine.end) == sum(make_schedule("stream", net, 1, PEModel(lanes, overhead)).graph  # type: ignore[union-attr]
                                    .costs(PEModel(lanes, overhead)).values()) * iterations


@settings(max_examples=30, deadline=None)
@given(net=networks(max_layers=6, max_batch=3), lanes=st.integers(1, 64), overhead=st.integers(0, 20),
       data=st.data())
def test_stream_ooo_on_one_stream_is_the_baseline(net: Network, lanes: int, overhead: int, data) -> None:
    weights = sum(layer.has_weights for layer in net.layers)
    defer = data.draw(st.integers(0, weights))
    model = PEModel(lanes, overhead)
    base = make_schedule("stream", net, 1, model).metrics
    one = make_schedule("stream-ooo", net, 1, model, StreamOOOOptions(streams=1, defer=defer)).metrics
    assert one.row() == base.row()
    two = make_schedule("stream-ooo", net, 1, model, StreamOOOOptions(streams=2, defer=defer)).metrics
    assert two.lower_bound_cycles <= two.cycles_per_sample


@settings(max_examples=25, deadline=None)
@given(net=networks(max_layers=6, max_batch=3), streams=st.integers(2, 4), data=st.data())
def test_weight_gradients_never_run_beside_earlier_work(net: Network, streams: int, data) -> None:
    """G_l starts after A_l (δ_l) ends, so it shares the device only with output gradients of layers j ≤ l,
    and a deferred G_l(t) ends before F_l(t+1) starts (its update lands first)."""
    weights = [layer.index for layer in net.layers if layer.has_weights]
    defer = data.draw(st.integers(0, len(weights)))
    result = make_schedule("stream-ooo", net, 1, PEModel(16, 4), StreamOOOOptions(streams, defer))
    sim = simulate_policy_result(result, net, PEModel(16, 4), 3)
    for layer in weights:
        for t in range(3):
            assert sim.start_of("G", layer, t) >= sim.end_of("A", layer, t)
            if t < 2:
                assert sim.end_of("U", layer, t) <= sim.start_of("F", layer, t + 1)
    for op in sim.ops:
        if op.kind == "G":
            assert op.proc != 0 or streams == 1  # weight gradients are off the critical stream


def test_deferred_weight_gradients_overlap_the_next_forward() -> None:
    net = load_network("mlp:784-256-128-10", 32)
    model = PEModel(4096, 2000)
    result = make_schedule("stream-ooo", net, 1, model, StreamOOOOptions(2, 1))
    sim = simulate_policy_result(result, net, model, 3)
    assert sim.start_of("G", 3, 0) < sim.start_of("F", 2, 1)  # the last layer's G runs beside F of t + 1
    assert sim.start_of("G", 3, 0) > sim.end_of("A", 1, 0)


def test_wide_device_gains_from_the_second_stream_and_the_pe_device_barely() -> None:
    """Kernels of a small MLP at batch 32 fill 4096 lanes only partly and launch overheads are long: the
    second stream fills the gaps. On 64 lanes every kernel fills the device and only 16-cycle launches hide."""
    net = load_network("mlp:784-256-128-10", 32)
    wide = PEModel(4096, 2000)
    speedup = (make_schedule("stream", net, 1, wide).metrics.cycles_per_sample
               / make_schedule("stream-ooo", net, 1, wide).metrics.cycles_per_sample)
    assert speedup > 1.10
    pe = make_cost_model("pe")
    narrow = (make_schedule("stream", net, 1, pe).metrics.cycles_per_sample
              / make_schedule("stream-ooo", net, 1, pe).metrics.cycles_per_sample)
    assert 1.0 <= narrow < 1.001


@pytest.mark.parametrize("options", [{"streams": 2}, {"streams": 3, "defer": 2}])
def test_functional_mode_is_plain_sgd(options: dict) -> None:
    net = mlp([6, 8, 8, 3], batch=2)
    model = PEModel(8, 3)
    result = make_schedule("stream-ooo", net, 1, model, policy_options("stream-ooo", options))
    iterations = 4
    sim = simulate_policy_result(result, net, model, iterations, SimConfig(mode="latest"))
    plain = {(kind, layer, t): t for t in range(iterations) for layer in (1, 2, 3) for kind in "FE"
             if (kind, layer, t) in sim.index}
    assert sim.version_map == plain
    data, init = make_data(net, iterations * net.batch, 3), init_weights(net, 3)
    got = run_functional(net, functional_order(sim), sim.version_map, init, data,
                         FunctionalConfig("latest", 2.0**-3, synchronous=True, microbatches=1))
    want = train_reference(net, init, data, plain, "latest", 2.0**-3, synchronous=True, microbatches=1)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9, atol=1e-12)
    assert_weights_close(got.weights, want.weights)


def test_bad_options_are_input_errors() -> None:
    net = mlp([4, 4, 4])
    with pytest.raises(InputError, match=r"--streams must be an integer in 1\.\.128, got 0"):
        StreamOOOOptions(streams=0)
    with pytest.raises(InputError, match=r"--defer must be in 0\.\.2"):
        make_schedule("stream-ooo", net, 1, PEModel(), StreamOOOOptions(2, 3))
    with pytest.raises(InputError, match=r"models one device with concurrent streams: -n must be 1, got 2"):
        make_schedule("stream", net, 2, PEModel())


@pytest.mark.parametrize("argv,words", [
    (["--streams", "0"], ["--streams", ">= 1", "got 0"]),
    (["--defer", "-1"], ["--defer", ">= 0"]),
    (["-n", "4"], ["-n must be 1, got 4"]),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv: list[str], words: list[str], capsys) -> None:
    base = ["schedule", "mlp:4-4-4", "--policy", "stream-ooo"]
    assert main([*base, *(argv if "-n" in argv else ["-n", "1", *argv])]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and all(w in lines[0] for w in words), captured.err


@pytest.mark.parametrize("priorities,order", [((0, 0, 0), (0, 10, 13)), ((0, 5, 1), (0, 13, 10))])
def test_waiting_transfers_leave_first_ready_or_by_priority(priorities: tuple[int, ...], order: tuple) -> None:
    """One link: A holds it 0..10; B is ready at 2, C at 4. First ready first sent: B at 10, C at 13; with
    C's priority lower (1 < 5), C overtakes B when the link frees (non-preemptive: A is not interrupted)."""
    from layerpipe.interconnect import Interconnect

    prog = Program([1, 1], [1, 1])
    b_dep = prog.kernel(Op(0, "G", 2, 0), 0, 0, work=2, width=1)
    c_dep = prog.kernel(Op(0, "G", 1, 0), 0, 0, work=2, width=1)  # ends at 4
    a = prog.transfer(0, 1, 10, (), priorities[0])
    b = prog.transfer(0, 1, 3, (b_dep,), priorities[1])
    c = prog.transfer(0, 1, 3, (c_dep,), priorities[2])
    t = run_program(prog, Interconnect.links(5, 1))
    assert (t.start[a], t.start[b], t.start[c]) == order
    assert t.end[a] == 15 and t.end[b] == order[1] + 3 + 5


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """Random kernels on 1..3 streams of one device, each depending on a few earlier kernels."""
    lanes, streams = draw(st.integers(1, 16)), draw(st.integers(1, 3))
    prog = Program([lanes], [streams])
    for i in range(draw(st.integers(1, 12))):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=2)) if i else []
        prog.kernel(Op(0, "F", i + 1, 0), 0, draw(st.integers(0, streams - 1)), draw(st.integers(0, 60)),
                    draw(st.integers(1, 20)), draw(st.integers(0, 5)), deps)
    return prog


@settings(max_examples=150, deadline=None)
@given(prog=programs())
def test_engine_keeps_stream_order_dependencies_and_the_lane_budget(prog: Program) -> None:
    t = run_program(prog)
    lanes = prog.lanes[0]
    for i in range(prog.num_items):
        assert all(t.start[i] >= t.end[d] for d in prog.deps[i])  # inputs first
        alone = prog.overhead[i] + -(-prog.work[i] // min(prog.width[i], lanes))
        assert t.end[i] - t.start[i] >= alone  # sharing never makes a kernel faster than running alone
    for s in range(prog.streams[0]):
        mine = [i for i in range(prog.num_items) if prog.stream[i] == s]
        assert all(t.end[a] <= t.start[b] for a, b in pairwise(mine))  # one kernel at a time, in order
    # the lanes do at most `lanes` MACs a cycle, so the run is at least the work over the lanes
    assert t.total_cycles >= -(-sum(prog.work) // lanes)

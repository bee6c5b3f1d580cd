"""The schedule-to-microcode compiler: memory maps, transfers, weight versions, and what it refuses.

The ring-buffer depths and the weight versions are checked against the Python simulator's timing and version
map on the policies' schedules: no slot is overwritten before its last reader has run, and every F and E reads
exactly the version the simulator says it reads.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe._rtl_costs import RTLCostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.hdl._compiler import compile_program
from layerpipe.hdl._flow import Design, make_design
from layerpipe.hdl._program import HardwareLimits, Program
from layerpipe.network import Linear, NetworkBuilder, load_network, mlp
from layerpipe.schedule import PeriodicSchedule, Slot
from tests.rtl_placements import placed_design, placed_schedule, placements


def two_pe_schedule() -> PeriodicSchedule:
    """mlp 5-3-2: layer 1 on PE 0, layer 2 on PE 1, the backward of layer 1 two periods late."""
    b0 = (Slot(0, "F", 1, 0), Slot(10, "A", 1, 2), Slot(20, "G", 1, 2), Slot(30, "U", 1, 2))
    b1 = (Slot(0, "F", 2, 1), Slot(10, "A", 2, 1), Slot(20, "E", 2, 1), Slot(30, "G", 2, 1), Slot(40, "U", 2, 1))
    return PeriodicSchedule(50, (b0, b1))


def compile_two_pe(lanes: int = 2, **kwargs: object) -> Program:
    net = mlp([5, 3, 2])
    return compile_program(net, build_training_graph(net), two_pe_schedule(), lanes, 8, **kwargs)  # type: ignore[arg-type]


def test_memory_map_and_transfers_of_a_hand_made_schedule() -> None:
    prog = compile_two_pe()
    pe0, pe1 = prog.pes
    # Samples land where they are read: x with layer 1, y with the output layer's A.
    assert pe0.buffer("x").memory == "samples" and pe1.buffer("y").memory == "samples"
    # a1 is produced on PE 0 (bank 0) and received on PE 1 (the bank of the link from PE 0).
    assert pe0.buffer("a1").memory == "local" and pe1.buffer("a1@0").memory == "from0"
    assert pe1.bank("from0") == 2 and pe1.receive_banks == ("samples", "from0")
    # Vectors take ceil(n / lanes) words per slot: a1 has 3 elements, 2 lanes.
    assert pe0.buffer("a1").slot_words == 2
    # A1(t) runs two periods after F1(t) and F1(t + 3) is the first that cannot overtake it: depth 4.
    assert pe0.buffer("a1").depth == 4
    # One transfer each way, queued on the link of its producer and counted at the consumer.
    (f1, a1, _, _) = pe0.entries
    assert [(s.dest, s.src, s.dst, s.elements, s.consumer) for s in f1.sends] == [(1, "a1", "a1@0", 3, "F2")]
    assert a1.waits == ((0, 0),) and pe0.counters == ("E2->A1",)
    assert prog.links() == ((0, 1), (1, 0))
    # W1: F1(t) follows U1(t') for t' < t − 2, so it reads version t − 2; U reads t.
    assert f1.steps[0].version == -2
    assert pe0.buffer("W1").depth == 1  # no update between F2(t) and E2(t): no ring of versions


def test_stash_keeps_a_ring_of_versions_and_latest_does_not() -> None:
    # E2 two periods after F2 with U2 in between: under stash E2(t) reads F2(t)'s version.
    net = mlp([4, 3, 2])
    body = (Slot(0, "F", 1, 0), Slot(5, "F", 2, 0), Slot(10, "A", 2, 2), Slot(15, "E", 2, 2), Slot(20, "G", 2, 2),
            Slot(25, "U", 2, 2), Slot(30, "A", 1, 2), Slot(35, "G", 1, 2), Slot(40, "U", 1, 2))
    sched = PeriodicSchedule(50, (body,))
    stash = compile_program(net, build_training_graph(net), sched, 1, 4)
    latest = compile_program(net, build_training_graph(net, GraphOptions(weight_mode="latest")), sched, 1, 4)
    e_stash = next(e for e in stash.pes[0].entries if e.kind == "E")
    e_latest = next(e for e in latest.pes[0].entries if e.kind == "E")
    assert e_stash.steps[0].version == -2 and e_latest.steps[0].version == 0
    assert stash.pes[0].buffer("W2").depth == 4  # versions t − 2 .. t live at once: 3, rounded up
    assert latest.pes[0].buffer("W2").depth == 1


def test_microcode_text_is_deterministic_and_complete() -> None:
    text = compile_two_pe().to_text()
    assert text == compile_two_pe().to_text()
    assert text.startswith("# layerpipe microcode v1 network=mlp:5-3-2 pes=2 lanes=2 period=50")
    assert "send a1->pe1.a1@0 3 elements counter 0 for F2" in text
    assert "F1 3x5 relu x=x w=W1 dst=a1 version=t-2" in text
    assert "link pe0->pe1: queue depth" in text


@pytest.mark.parametrize(("network", "message"), [
    ("resnet18", "not a chain"),  # conv2d, pooling and flatten compile (tests/test_hw_conv*.py)
])
def test_rejects_networks_that_are_not_mlps(network: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        make_design(network, "pipedream", 2, 4, 4)


def test_rejects_bias_activation_batch_and_widths() -> None:
    biased = NetworkBuilder("b", (4,)).add("fc1", Linear(3, bias=True, activation="relu")).add("fc2", Linear(2))
    with pytest.raises(InputError, match="no biases"):
        make_design(biased.build(), "pipedream", 1, 1, 4)
    tanh = NetworkBuilder("t", (4,)).add("fc1", Linear(3, activation="tanh")).add("fc2", Linear(2))
    with pytest.raises(InputError, match="ReLU hidden layers"):
        make_design(tanh.build(), "pipedream", 1, 1, 4)
    net = mlp([5, 3, 2], batch=300)
    with pytest.raises(InputError, match="--batch 300 is beyond the RTL's micro-batch limit of 256 samples"):
        compile_program(net, build_training_graph(net), two_pe_schedule(), 2, 8)
    # B beyond what the memories hold names the limit and the batch.
    with pytest.raises(InputError, match=r"PE 0 needs \d+ words of \w+ memory, beyond the RTL limit of 64 words; "
                                         r"use fewer --samples, a smaller --batch \(now 8\)"):
        compile_program(mlp([5, 3, 2], batch=8), build_training_graph(mlp([5, 3, 2], batch=8)), two_pe_schedule(),
                         1, 8, limits=HardwareLimits(max_memory_words=64))
    # Vectors crossing PEs with B > 1 must fill whole words (each sample is padded to whole words).
    with pytest.raises(InputError, match=r"task F2 on PE 1 receives a vector of 3 elements per sample from F1 on PE 0: "
                                         r"with --batch 2"):
        compile_program(mlp([5, 3, 2], batch=2), build_training_graph(mlp([5, 3, 2], batch=2)), two_pe_schedule(),
                         2, 8)
    with pytest.raises(InputError, match="layer width 5 exceeds the RTL limit of 4"):
        compile_two_pe(limits=HardwareLimits(max_width=4))
    with pytest.raises(InputError, match="PE 0 needs 24 words of samples memory, beyond the RTL limit of 20 words"):
        compile_two_pe(limits=HardwareLimits(max_memory_words=20))


@pytest.mark.parametrize("lanes", [0, -1, 10_000])
def test_rejects_lanes_out_of_range(lanes: int) -> None:
    with pytest.raises(InputError, match=r"lanes must be an integer in 1\.\."):
        compile_two_pe(lanes)


def test_weight_tasks_away_from_their_owner_stream_versions() -> None:
    # E2 and G2 on PE 0, away from W2's owner (PE 1, which runs U2): under stash E2 receives F2's version (S2),
    # no copy from U2; G2 sends g2 to U2; F1 on PE 1 reads copies of W1 (C1) sent by U1 on PE 0.
    where = {"F1": 1, "A1": 0, "G1": 0, "U1": 0, "F2": 1, "A2": 1, "E2": 0, "G2": 0, "U2": 1}
    prog = placed_design([4, 4, 2], where, 2, 2, 8).program
    pe0, pe1 = prog.pes
    e2 = next(e for e in pe0.entries if e.kind == "E")
    assert e2.steps[0].w == "S2" and pe0.buffer("S2").memory == "weights"
    g2 = next(e for e in pe0.entries if (e.kind, e.layer) == ("G", 2))
    assert [(s.dest, s.src, s.dst) for s in g2.sends] == [(1, "g2", "g2")]
    u2 = next(e for e in pe1.entries if e.kind == "U" and e.layer == 2)
    assert u2.sends == ()
    f2 = next(e for e in pe1.entries if (e.kind, e.layer) == ("F", 2))
    assert ("W2", "S2") in [(s.src, s.dst) for s in f2.sends]
    u1 = next(e for e in pe0.entries if (e.kind, e.layer) == ("U", 1))
    (copy,) = u1.sends
    assert (copy.src, copy.dst, copy.src_offset, copy.dst_offset) == ("W1", "C1", 1, 1) and copy.delay >= 1
    f1 = next(e for e in pe1.entries if (e.kind, e.layer) == ("F", 1))
    assert f1.steps[0].w == "C1" and (pe1.counters.index("U1->F1"), copy.delay) in f1.waits
    assert prog.weight_copies(1) == ((1, pe1.buffer("C1")),)
    assert set(prog.link_targets(0, 1)) >= {"grads", "weights"}
    assert "send W1->pe1.C1 16 elements counter" in prog.to_text()


def test_rejects_placements_the_hardware_cannot_run() -> None:
    # W2 has 3 columns: with 2 lanes its padded rows take 2 beats each, the model counts ⌈6/2⌉ = 3 beats.
    where = {"F1": 0, "A1": 0, "G1": 0, "U1": 0, "F2": 1, "A2": 1, "E2": 0, "G2": 1, "U2": 1}
    with pytest.raises(InputError, match=r"task E2 on PE 0 needs W2 from F2 on PE 1, but W2 has 3 columns, not a "
                                         r"multiple of --lanes 2"):
        placed_design([5, 3, 2], where, 2, 2, 8)
    # Without task costs the schedule pins no versions, so there is nothing to stream.
    result = placed_schedule([4, 4, 2], {**where, "F2": 0}, 2, 1)
    assert result.periodic is not None and result.graph is not None
    bare = PeriodicSchedule(result.periodic.period, result.periodic.bodies)
    with pytest.raises(InputError, match=r"task F2 runs on PE 0, away from W2's owner PE 1, but the schedule pins no "
                                         "version for it"):
        compile_program(result.graph.network, result.graph, bare, 1, 8)
    # A fused backward (PipeDream's AEG) away from its U.
    net = mlp([5, 3, 2])
    fused = build_training_graph(net, GraphOptions(intra=False, inter=False))
    c0 = (Slot(0, "F", 1, 0), Slot(10, "AEG", 2, 1), Slot(20, "AG", 1, 2), Slot(30, "U", 1, 2))
    c1 = (Slot(0, "F", 2, 1), Slot(40, "U", 2, 1))
    with pytest.raises(InputError, match=r"places fused task AEG2 on PE 0, away from W2's owner \(PE 1, which runs "
                                         r"U2\)"):
        compile_program(net, fused, PeriodicSchedule(50, (c0, c1)), 1, 8, policy="pipedream")


def test_rejects_unsupported_policies_and_weight_modes() -> None:
    with pytest.raises(InputError, match="supported: layerpipe, pipedream"):
        make_design("mlp:5-3-2", "gpipe", 2, 2, 4)
    net = mlp([5, 3, 2])
    with pytest.raises(InputError, match="weight mode 'ema' is not supported by the RTL; supported: stash, latest"):
        compile_program(net, build_training_graph(net, GraphOptions(weight_mode="ema")), two_pe_schedule(), 2, 8)


# ---- against the simulator's timing and version map, on the policies' schedules -------------------------

def _check_against_simulator(network: str, policy: str, n: int, lanes: int, samples: int) -> None:
    _check_design(make_design(network, policy, n, lanes, samples))


def _check_design(design: Design) -> None:
    """Versions and ring depths of a compiled design against the simulator's run of the same ops."""
    prog, sim, samples = design.program, design.sim, design.samples
    # Every F and E reads the version the simulator observed: max(0, t + offset) of its ring (W on the owner,
    # C elsewhere); an E reading S (stash, received) reads F's version.
    versions = sim.version_map
    offset_of = {}
    for pe in prog.pes:
        for entry in pe.entries:
            for step in entry.steps:
                if step.kind in "FE" and step.w:
                    offset_of[(step.kind, entry.layer)] = step
    for pe in prog.pes:
        for entry in pe.entries:
            for step in entry.steps:
                if step.kind not in "FE" or (step.kind == "E" and step.layer == 1):
                    continue
                source = offset_of[("F", step.layer)] if step.w.startswith("S") else step
                for t in range(samples):
                    key = (entry.kind, entry.layer, t)
                    assert versions[key] == max(0, t + source.version), (key, step)
    # No vector ring slot is rewritten before its last reader of the older iteration has ended: writers are
    # the local producer or the producers whose transfers land in it; readers are local steps and the
    # consumers of transfers sourced from it.
    start = {op.key: int(s) for op, s in zip(sim.ops, sim.start, strict=True)}
    end = {op.key: int(e) for op, e in zip(sim.ops, sim.end, strict=True)}
    owner_of = {(e.kind, e.layer): (pe, e) for pe in prog.pes for e in pe.entries}
    for pe in prog.pes:
        for buf in pe.buffers:
            if buf.memory in ("samples", "weights", "grads") or buf.depth >= samples:
                continue
            # A local producer writes while it runs (from its start); a transfer lands after its producer ends.
            writers = [(e, start) for e in pe.entries if any(s.dst == buf.name for s in e.steps)]
            writers += [(e, end) for p2 in prog.pes for e in p2.entries
                        if any(s.dest == pe.index and s.dst == buf.name for s in e.sends)]
            readers = [e for e in pe.entries if any(buf.name in (s.x, s.y) for s in e.steps)]
            readers += [owner_of[_task_of(s.consumer)][1] for e in pe.entries for s in e.sends if s.src == buf.name]
            assert writers and readers, (pe.index, buf)
            for writer, when in writers:
                for t in range(samples - buf.depth):
                    rewrite = when[(writer.kind, writer.layer, t + buf.depth)]
                    last_read = max(end[(r.kind, r.layer, t)] for r in readers)
                    assert rewrite >= last_read, (pe.index, buf, t)


def _task_of(name: str) -> tuple[str, int]:
    kind = name.rstrip("0123456789")
    return kind, int(name[len(kind):])


@pytest.mark.parametrize(("network", "policy", "n", "lanes", "samples"), [
    ("mlp:7-6-5-3", "layerpipe", 3, 1, 24),
    ("mlp:7-6-5-3", "pipedream", 3, 2, 24),
    ("mlp:9-8-4-6-2", "layerpipe", 2, 4, 24),
    ("mlp:9-8-4-6-2", "pipedream", 4, 4, 24),
    # The prologue runs F2 further ahead of G3 than the steady state does (found by hypothesis): the ring of
    # a2 on PE 0 needs 4 slots, not the steady state's 2. With 80 samples the unrolled window is a prefix.
    ("mlp:1-2-5-6", "layerpipe", 2, 3, 16),
    ("mlp:1-2-5-6", "layerpipe", 2, 3, 80),
])
def test_versions_and_ring_depths_match_the_simulator(network: str, policy: str, n: int, lanes: int,
                                                      samples: int) -> None:
    _check_against_simulator(network, policy, n, lanes, samples)


@settings(max_examples=12, deadline=None)
@given(widths=st.lists(st.integers(1, 9), min_size=3, max_size=5), n=st.integers(1, 4),
       lanes=st.sampled_from([1, 3, 4]), policy=st.sampled_from(["layerpipe", "pipedream"]))
def test_random_mlps_compile_consistently(widths: list[int], n: int, lanes: int, policy: str) -> None:
    spec = "mlp:" + "-".join(map(str, widths))
    _check_against_simulator(spec, policy, n, lanes, 16)
    net = load_network(spec)
    assert RTLCostModel(lanes).atomic_cost(net.layers[0], "F", 1) > 0


@settings(max_examples=40, deadline=None)
@given(point=placements(), samples=st.integers(1, 12), mode=st.sampled_from(["stash", "latest"]),
       batch=st.sampled_from([1, 2, 4]))
def test_generated_placements_compile_consistently(point: tuple[list[int], dict[str, int], int, int],
                                                   samples: int, mode: str, batch: int) -> None:
    """Any task → PE map, timed by the project's passes on the rtl interconnect, compiles to a program whose
    versions and ring depths agree with the simulator's run."""
    widths, where, n, lanes = point
    _check_design(placed_design(widths, where, n, lanes, samples, mode, batch))


def test_heavy_layer_split_runs_or_is_refused_naming_the_tasks_and_why() -> None:
    """The layerpipe policy's split variants run in hardware (tests/test_hw_split.py): a first-layer split
    (mlp:96-8-4 on 2 PEs, 4 lanes: fc1 as fc1.0 and fc1.1) and a hidden-layer split (mlp:8-32-64-4 on 3 PEs: fc2
    in 3 parts, their errors summed by A1), also with micro-batches; with B = 4 a part whose rows the lanes do not
    divide (mlp:64-8-4 on 3 PEs: 3, 3, 2 rows on 4 lanes) is refused in one line, as any such vector transfer.
    `make_design` asks for split variants only with `split_layers=True`."""
    from layerpipe.hdl._flow import check_runnable
    from layerpipe.interconnect import Interconnect
    from layerpipe.schedule.policies import make_schedule, policy_options

    options = policy_options("layerpipe", {"replication": False, "split_layers": True})
    for network, n, batch, split in (("mlp:96-8-4", 2, 1, ["fc1.0", "fc1.1", "fc2"]),
                                     ("mlp:8-32-64-4", 3, 1, ["fc1", "fc2.0", "fc2.1", "fc2.2", "fc3"]),
                                     ("mlp:64-8-4", 3, 4, ["fc1.0", "fc1.1", "fc1.2", "fc2"])):
        net = load_network(network, batch)
        result = make_schedule("layerpipe", net, n, RTLCostModel(4), options, interconnect=Interconnect.rtl(4))
        assert [layer.name for layer in result.graph.network.layers] == split
        check_runnable(net, result, "layerpipe")
    with pytest.raises(InputError) as info:  # 3, 3, 2 rows per sample: padded samples take more link beats
        compile_program(result.graph.network, result.graph, result.periodic, 4, 4)
    message = str(info.value)
    assert "\n" not in message and "per sample" in message and "--batch 4" in message
    design = make_design("mlp:96-8-4", "layerpipe", 2, 4, 2, keep_weights_together=False)  # whole layers
    assert [layer.name for layer in design.schedule.graph.network.layers] == ["fc1", "fc2"]

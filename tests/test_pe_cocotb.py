"""The PE alone as Verilog on Icarus through cocotb (`run_cocotb`): F, E, G
and U ops, results and cycles as the fixed-point reference and the `rtl` cost model say."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from layerpipe.fixedpoint import DEFAULT_FORMAT as FMT
from layerpipe.hdl import (
    Opcode,
    PEConfig,
    PEOp,
    ProcessingElement,
    VectorAddr,
    component_verilog,
    op_cycles,
    pack_matrix,
    pack_vector,
)
from layerpipe.hdl._cocotb import available_simulators, run_cocotb

LANES, BITS, LR_SHIFT = 2, FMT.total_bits, 3
CONFIG = PEConfig(lanes=LANES, lr_shift=LR_SHIFT, weight_depth=64, grad_depth=64, local_depth=16,
                  recv_depths=(16,), send_ports=1, max_dim=16)


def vectors(seed: int) -> dict:
    """F (ReLU) of a 5×7 layer, E of the same W with a δ, G of δ and a, U of W into a new version."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-600, 600, (5, 7))
    a = rng.integers(-700, 700, 7)
    delta = rng.integers(-900, 900, 5)
    ops = [
        PEOp(Opcode.FWD_RELU, 5, 7, x=VectorAddr(1, 0), w=0, dst=0),
        PEOp(Opcode.ERR, 5, 7, y=VectorAddr(1, 4), w=0, dst=3),
        PEOp(Opcode.GRAD, 5, 7, x=VectorAddr(1, 0), y=VectorAddr(1, 4), dst=7),
        PEOp(Opcode.UPD, 5, 7, w=0, g=7, dst=30),
    ]
    a_out = FMT.relu(FMT.matvec(w, a))
    e_prev = FMT.matvec(w.T, delta)
    w_words = pack_matrix(w, LANES, BITS)
    w_next = FMT.sgd_update(w, FMT.outer_gradient(delta, a), LR_SHIFT)
    return {
        "weights": list(enumerate(w_words)),
        "recv": [[0, k, word] for k, word in enumerate(pack_vector(a, LANES, BITS))]
                + [[0, 4 + k, word] for k, word in enumerate(pack_vector(delta, LANES, BITS))],
        "ops": [{"command": op.encode(CONFIG), "cycles": op_cycles(op.rows, op.cols, LANES)} for op in ops],
        "expect": list(enumerate(pack_vector(a_out, LANES, BITS)))
                  + [[3 + k, word] for k, word in enumerate(pack_vector(e_prev, LANES, BITS))],
        "expect_weights": list(enumerate(w_words)) + [[30 + k, word] for k, word in
                                                       enumerate(pack_matrix(w_next, LANES, BITS))],
    }


@pytest.fixture(scope="module")
def pe_verilog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pe_rtl") / "pe.v"
    path.write_text(component_verilog(ProcessingElement(CONFIG), "pe"))
    return path


# Icarus only: the runner's Verilator path is exercised by the whole-accelerator bench
# (tests/test_rtl_accel.py), and a Verilator build costs about a minute of CI time.
@pytest.mark.slow  # over 1 s of CPU on a busy 2-core run (tests/cpu_times.json)
@pytest.mark.parametrize("simulator", ["icarus"])
def test_pe_on_hdl_simulator(simulator: str, pe_verilog: Path, tmp_path: Path) -> None:
    if simulator not in available_simulators():
        pytest.skip(f"{simulator} is not installed here")
    vector_file = tmp_path / "vectors.json"
    vector_file.write_text(json.dumps(vectors(seed=11)))
    result = run_cocotb(verilog_sources=[pe_verilog], toplevel="pe", test_module="tests.cocotb_pe",
                        build_dir=tmp_path / f"sim_{simulator}", simulator=simulator,
                        extra_env={"LP_PE_VECTORS": str(vector_file)})
    assert result.passed, f"{result.failed}/{result.tests} failed; see {result.log}:\n" + (
        result.log.read_text()[-3000:] if result.log.exists() else "no log")


@pytest.mark.slow  # over 1 s of CPU on a busy 2-core run (tests/cpu_times.json)
@pytest.mark.skipif("icarus" not in available_simulators(), reason="iverilog is not installed")
def test_runner_reports_a_failing_bench(pe_verilog: Path, tmp_path: Path) -> None:
    """A bench whose expectation is wrong comes back as a failed result (not an exception, not a pass)."""
    doc = vectors(seed=11)
    cycles = doc["ops"][1]["cycles"]
    doc["ops"][1]["cycles"] += 1
    vector_file = tmp_path / "vectors.json"
    vector_file.write_text(json.dumps(doc))
    result = run_cocotb(verilog_sources=[pe_verilog], toplevel="pe", test_module="tests.cocotb_pe",
                        build_dir=tmp_path / "sim", extra_env={"LP_PE_VECTORS": str(vector_file)})
    assert (result.passed, result.tests, result.failed) == (False, 1, 1)
    assert f"op 1: {cycles} cycles, the cost model says {cycles + 1}" in result.log.read_text()

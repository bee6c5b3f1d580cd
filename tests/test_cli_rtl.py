"""`layerpipe rtl` and `layerpipe verify`: outputs, determinism, one-line exit-2 errors, verdict and exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerpipe.cli import main
from tests.conftest import run_cli


@pytest.mark.slow  # two RTL exports: ~3 s of CPU
def test_rtl_writes_deterministic_verilog_microcode_and_design(tmp_path: Path, capsys) -> None:
    args = ["rtl", "mlp:6-5-3", "--policy", "pipedream", "-n", "2", "--lanes", "4", "--samples", "8", "--no-synth"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "mlp:6-5-3 pipedream N=2 lanes=4" in out
    for name in ("layerpipe_accel.v", "microcode.txt", "design.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    verilog = (tmp_path / "a" / "layerpipe_accel.v").read_text()
    assert "module layerpipe_accel(" in verilog and "stream_in__valid" in verilog and "/work" not in verilog
    microcode = (tmp_path / "a" / "microcode.txt").read_text()
    assert microcode.startswith("# layerpipe microcode v1 network=mlp:6-5-3 pes=2 lanes=4")
    assert "AEG2" in microcode and "send a1->pe1.a1@0 5 elements" in microcode
    design = json.loads((tmp_path / "a" / "design.json").read_text())
    assert (design["num_pes"], design["lanes"], design["samples"], design["links"]) == (2, 4, 8, [[0, 1], [1, 0]])
    assert design["cycles_sim"] > design["period_cycles"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "gpipe", "-n", "2", "--lanes", "4"], "supported: layerpipe, pipedream"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "0"], "--lanes must be a positive integer"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--batch", "300"],
     "--batch 300 is beyond the RTL's micro-batch limit of 256 samples"),
])
def test_rtl_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_cli("rtl", "mlp:6-5-4-3", *args, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow  # two fresh processes: ~1.6 s of CPU
def test_rtl_width_beyond_the_limit_exits_2(tmp_path: Path) -> None:
    proc = run_cli("rtl", "mlp:4-70000-2", "--policy", "pipedream", "-n", "1", "--lanes", "4", "--out", str(tmp_path))
    assert proc.returncode == 2 and "exceeds the RTL limit of 65535" in proc.stderr
    proc = run_cli("verify", "resnet18", "--policy", "pipedream", "-n", "1", "--lanes", "4", "--samples", "2")
    assert proc.returncode == 2 and "not a chain" in proc.stderr  # lenet5 runs (tests/test_hw_conv_rtl.py)
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_verify_reports_bit_and_cycle_exact_json() -> None:
    pytest.importorskip("torch")
    proc = run_cli("verify", "mlp:5-4-3", "--policy", "layerpipe", "-n", "2", "--lanes", "2", "--samples", "4",
                "--keep-weights-together", "--seed", "3", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["bit_exact"] is True and doc["cycle_exact"] is True
    assert doc["cycles_rtl"] == doc["cycles_sim"] > 0
    assert 0 <= doc["max_abs_weight_error"] < 64  # LSBs of rounding against float64, a handful of samples
    assert (doc["num_pes"], doc["lanes"], doc["samples"], doc["sim"]) == (2, 2, 4, "icarus")

"""`layerpipe rtl` and `layerpipe verify`: outputs, determinism, one-line exit-2 errors, verdict and exit status."""

from __future__ import annotations

import json
import re
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
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--stream-bits", "0"],
     "--stream-bits must be an integer in 1..1024, got 0"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--stream-bits", "wide"],
     "--stream-bits must be an integer in 1..1024, got 'wide'"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--csr-bits", "33"],
     "--csr-bits must be an integer in 4..32, got 33"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--part", "ecp5-25k", "--router", "fast"],
     "must be one of router1, router2, got 'fast'"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--sample-depth", "3"],
     "--sample-depth must be a power of two (1, 2, 4, ...), got 3"),
    (["--policy", "pipedream", "-n", "2", "--lanes", "1", "--sample-depth", "1", "--samples", "8"],
     "a sample buffer of 1 iterations deadlocks this schedule"),
])
def test_rtl_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_cli("rtl", "mlp:6-5-4-3", *args, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow  # three RTL exports: ~4 s of CPU
@pytest.mark.parametrize(("stream_bits", "csr_bits", "depth"), [(8, 4, None), (32, 8, 4), (3, 32, 8)])
def test_rtl_host_interface_widths_and_sample_depth(tmp_path: Path, stream_bits: int, csr_bits: int,
                                                     depth: int | None) -> None:
    """--stream-bits, --csr-bits and --sample-depth shape the top's host ports and sample rings: design.json
    states them, the Verilog's stream and CSR data ports have those widths, and the pins are the closed form's
    (`hdl._host.host_port_bits`)."""
    from layerpipe.hdl._flow import make_design
    from layerpipe.hdl._host import HostConfig, host_port_bits
    from layerpipe.hdl._top import Accelerator

    extra = ["--stream-bits", str(stream_bits), "--csr-bits", str(csr_bits)]
    extra += [] if depth is None else ["--sample-depth", str(depth)]
    args = ["rtl", "mlp:6-5-3", "--policy", "pipedream", "-n", "2", "--lanes", "2", "--samples", "8", "--no-synth"]
    assert main([*args, *extra, "--out", str(tmp_path)]) == 0
    host = json.loads((tmp_path / "design.json").read_text())["host"]
    default = make_design("mlp:6-5-3", "pipedream", 2, 2, 8).sample_depth
    assert host == {"stream_bits": stream_bits, "csr_bits": csr_bits, "sample_depth": depth or default}
    text = (tmp_path / "layerpipe_accel.v").read_text()
    start = text.index("module layerpipe_accel(")
    verilog = text[start:text.index("endmodule", start)]  # the top's ports, not its submodules'

    def width(port: str) -> int:
        found = re.search(rf"(?:input|output) (?:\[(\d+):0\] )?{port};", verilog)
        assert found, port
        return int(found.group(1)) + 1 if found.group(1) else 1
    assert width("stream_in__payload") == width("stream_out__payload") == stream_bits
    assert width("csr_wdata") == width("csr_rdata") == csr_bits
    ports = re.findall(r"^\s*(?:input|output) (?:\[(\d+):0\] )?(\w+);", verilog, re.M)
    pins = sum(int(hi) + 1 if hi else 1 for hi, _ in ports)
    config = HostConfig(stream_bits, csr_bits)
    design = make_design("mlp:6-5-3", "pipedream", 2, 2, 8, sample_depth=depth, host=config)
    top = Accelerator(design.program, design.lr_shift, config)
    top._MustUse__silence = True  # type: ignore[attr-defined]  (only its register map is read)
    assert pins == host_port_bits(config, top.register_map)


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
                "--keep-weights-together", "--seed", "3", "--format", "json",
                "--stream-bits", "5", "--csr-bits", "8", "--sample-depth", "2")  # the host's words in 5-bit beats
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["bit_exact"] is True and doc["cycle_exact"] is True
    assert doc["cycles_rtl"] == doc["cycles_sim"] > 0
    assert 0 <= doc["max_abs_weight_error"] < 64  # LSBs of rounding against float64, a handful of samples
    assert (doc["num_pes"], doc["lanes"], doc["samples"], doc["sim"]) == (2, 2, 4, "icarus")

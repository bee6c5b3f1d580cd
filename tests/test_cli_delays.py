"""`layerpipe delays`: JSON contract, determinism, tables and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from layerpipe.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_contract_on_a_chain(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "delays", "mlp:4-3-2", "--stages", "0,1", "--cost-model", "macs",
                         "--format", "json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert list(doc)[:4] == ["layers", "iteration_bound_before", "iteration_bound_after", "num_stages"]
    assert doc["layers"] == [
        {"name": "fc1", "stage": 0, "delay": 2, "stages_after": 1},
        {"name": "fc2", "stage": 1, "delay": 0, "stages_after": 0},
    ]
    # Hand values (tests/test_retiming_delays.py): loop of layer 1 is 53 cycles, of layer 2 is 20.
    assert doc["iteration_bound_before"] == 53 and doc["iteration_bound_after"] == 20
    assert doc["num_stages"] == 2
    assert doc["lags"]["F2"] == 1 and doc["lags"]["A1"] == 2


def test_resnet_json_is_byte_identical_and_has_skip_buffers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("delays", "resnet18", "--stages", "even:4", "--format", "json")
    first, second = run(capsys, *argv), run(capsys, *argv)
    assert first == second and first[0] == 0
    doc = json.loads(first[1])
    weightless = [layer for layer in doc["layers"] if layer["delay"] is None]
    assert weightless and all(layer["name"].endswith(("add", "pool1", "pool", "flatten")) for layer in weightless)
    assert doc["skip_buffers"] and {"src", "dst", "depth_iterations"} == set(doc["skip_buffers"][0])
    assert doc["iteration_bound_after"] < doc["iteration_bound_before"]
    assert max(layer["stage"] for layer in doc["layers"]) == doc["num_stages"] - 1 == 3


def test_table_and_output_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "delays", "mlp:8-7-6-5-4", "--stages", "0,0,1,2")
    assert code == 0
    assert "total delay 10 iterations" in out and "stages_after" in out
    target = tmp_path / "d.json"
    code, out, _ = run(capsys, "delays", "mlp:8-7-6-5-4", "--stages", "even:2", "--format", "json", "-o", str(target))
    assert code == 0 and out == ""
    assert [layer["delay"] for layer in json.loads(target.read_text())["layers"]] == [2, 2, 0, 0]


@pytest.mark.parametrize(("stages", "needle"), [
    ("0,1", "expected 4 stages"),
    ("0,1,0,1", "non-decreasing"),
    ("even:0", "1 <= M <= 4"),
    ("even:9", "1 <= M <= 4"),
    ("0,a,1,1", "comma list"),
])
def test_bad_stage_maps_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], stages: str, needle: str) -> None:
    code, out, err = run(capsys, "delays", "mlp:8-7-6-5-4", "--stages", stages)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and "--stages" in err


def test_console_script_reports_errors_without_traceback() -> None:
    exe = Path(sys.executable).parent / "layerpipe"
    proc = subprocess.run([str(exe), "delays", "mlp:8-7-6-5-4", "--stages", "even:0"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr

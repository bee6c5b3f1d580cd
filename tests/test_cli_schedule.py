"""`layerpipe schedule`: formats that parse back, options checked per policy, one-line exit-2 errors."""

from __future__ import annotations

import json

import pytest

from layerpipe.cli import main
from layerpipe.schedule import OpSchedule, PeriodicSchedule, from_csv, from_torch_csv, validate
from tests.conftest import run_cli


def test_text_is_a_periodic_schedule_with_a_metrics_header(capsys) -> None:
    assert main(["schedule", "mlp:7-6-5-3", "--policy", "layerpipe", "-n", "3", "--lanes", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# layerpipe on mlp:7-6-5-3, 3 processors, interconnect rtl (links:2:4): cycles_per_sample=")
    schedule = PeriodicSchedule.from_text(out)
    assert schedule.num_procs == 3
    assert f"cycles_per_sample={schedule.period / schedule.unfold:g}" in out.splitlines()[0]


def test_json_has_metrics_options_and_the_schedule(capsys, tmp_path) -> None:
    target = tmp_path / "s.json"
    assert main(["schedule", "lenet5", "--policy", "layerpipe", "-n", "4", "--max-staleness", "3",
                 "--keep-weights-together", "--format", "json", "-o", str(target)]) == 0
    assert capsys.readouterr().out == ""
    doc = json.loads(target.read_text())
    assert doc["options"] == {"intra": True, "inter": True, "max_staleness": 3, "keep_weights_together": True,
                              "max_traffic": None, "split_layers": True, "replication": True, "unfold": 1}
    assert doc["max_staleness"] <= 3 and doc["num_procs"] == 4
    assert doc["schedule"]["format"] == "layerpipe-periodic-schedule"
    assert doc["schedule"]["period_cycles"] == doc["period_cycles"]


def test_csv_unrolls_a_periodic_schedule_into_valid_ops(capsys) -> None:
    assert main(["schedule", "mlp:7-6-5-3", "--policy", "pipedream", "-n", "2", "--format", "csv",
                 "--iterations", "5"]) == 0
    explicit = from_csv(capsys.readouterr().out)
    assert isinstance(explicit, OpSchedule) and explicit.num_iterations == 5


def test_stage_level_without_a_network_and_torch_csv(capsys) -> None:
    assert main(["schedule", "--policy", "zb-h1", "--stages", "4", "--microbatches", "8", "--virtual-stages", "2",
                 "--stage-costs", "2,2,1", "--format", "torch-csv"]) == 0
    schedule = from_torch_csv(capsys.readouterr().out, microbatches=8)
    validate(schedule)
    assert schedule.num_procs == 4 and {op.unit for op in schedule.ops()} == set(range(8))


def test_sync_policy_on_a_network_prints_its_step(capsys) -> None:
    assert main(["schedule", "resnet18", "--policy", "1f1b", "-n", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert "32 micro-batches" not in out and "8 micro-batches per step" in out
    assert OpSchedule.from_text(out).microbatches == 8


@pytest.mark.slow  # fresh processes: ~2 s of CPU
def test_output_is_byte_identical_across_runs() -> None:
    args = ("schedule", "resnet18", "--policy", "layerpipe", "-n", "7", "--format", "json")
    first, second = run_cli(*args, timeout=120), run_cli(*args, timeout=120)
    assert first.returncode == 0 and first.stdout == second.stdout


@pytest.mark.parametrize("args,message", [
    (["mlp:7-6-3", "--policy", "nope", "-n", "2"], "unknown policy 'nope'; allowed: layerpipe, pipedream"),
    (["mlp:7-6-3", "--policy", "layerpipe", "-n", "0"], "-n/--num-procs must be a positive integer"),
    (["mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "-g", "2"],
     "option -g/--group-size does not apply to policy 'layerpipe'"),
    (["mlp:7-6-3", "--policy", "gpipe", "-n", "2", "--virtual-stages", "2"],
     "option --virtual-stages does not apply to policy 'gpipe'"),
    (["mlp:7-6-3", "--policy", "pipedream", "-n", "2", "--max-staleness", "1"],
     "option --max-staleness does not apply to policy 'pipedream'"),
    (["alexnet", "--policy", "optimal", "-n", "4"], "optimal: graph has 47 tasks × 4 processors"),
    (["--policy", "layerpipe", "--stages", "4"], "--stages takes a synchronous policy"),
    (["mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "--format", "torch-csv"], "--format torch-csv is for"),
    (["--policy", "gpipe", "--stages", "2", "--stage-costs", "1,x,1"], "--stage-costs must be three integers"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], message: str, capsys) -> None:
    assert main(["schedule", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err


def test_bad_input_from_a_real_process_has_no_traceback() -> None:
    proc = run_cli("schedule", "mlp:7-6-3", "--policy", "ooo", "-n", "2", "--keep-weights-together", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("layerpipe: error: option --keep-weights-together does not apply to policy 'ooo' "
                           "(its options: -g/--group-size, --microbatches, --push, --allocation)\n")

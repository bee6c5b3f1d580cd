"""`layerpipe simulate`: outputs of policy and file runs, functional mode, one-line errors, atomic DIR."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerpipe.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_policy_run_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "simulate", "mlp:8-6-4", "--policy", "layerpipe", "-n", "2", "--samples", "12",
                           "--functional", "float64", "--out", out)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["data.npz", "final.npz", "gantt.png", "gantt.svg", "init.npz", "losses.json", "metrics.json",
                     "trace.json", "versions.json"]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("total_cycles", "cycles_per_sample", "utilization_pct", "traffic_words", "peak_memory_words",
                "bubbles", "final_loss"):
        assert key in metrics
    assert len(metrics["peak_memory_words"]) == 2 and metrics["iterations"] == 12
    trace = json.loads((out / "trace.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == metrics["num_ops"]
    versions = json.loads((out / "versions.json").read_text())["versions"]
    assert {v["kind"] for v in versions} <= {"F", "E"} and len(versions) == 12 * 3  # F1, F2, E2 per iteration
    assert sorted(np.load(out / "init.npz").files) == ["W1", "W2"]
    assert sorted(np.load(out / "data.npz").files) == ["x", "y"]
    assert len(json.loads((out / "losses.json").read_text())["losses"]) == 12
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary sibling left


def test_synchronous_policy_fixed_point_with_links(tmp_path, capsys):
    out = tmp_path / "sync"
    code, _, err = run_cli(capsys, "simulate", "mlp:8-6-5-4", "--policy", "1f1b", "-n", "2", "--samples", "6",
                           "--microbatches", "4", "--functional", "fixed", "--lr", "0.0625",
                           "--interconnect", "links:3:2", "--out", out)
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["interconnect"] == "links" and metrics["link_latency_cycles"] == 3
    assert metrics["interconnect_spec"] == "links:3:2"
    assert metrics["fixed_format"] == "q16.8"
    final = np.load(out / "final.npz")
    assert final["W1"].dtype == np.int64
    versions = json.loads((out / "versions.json").read_text())["versions"]
    assert {(v["iteration"], v["version"]) for v in versions} == {(t, t // 4) for t in range(6)}


GPIPE_CSV = "# layerpipe schedule v1 level=stage procs=2 synchronous microbatches=2\nF0.0,F0.1,B0.0,B0.1\n" \
            ",F1.0,F1.1,B1.0,B1.1\n"


@pytest.mark.slow  # ~1 s of CPU
def test_stage_level_csv_with_stage_costs(tmp_path, capsys):
    csv = tmp_path / "gpipe.csv"
    csv.write_text(GPIPE_CSV)
    code, _, err = run_cli(capsys, "simulate", "--schedule", csv, "--stage-costs", "1,2,0",
                           "--interconnect", "shared", "--out", tmp_path / "g")
    assert code == 0, err
    metrics = json.loads((tmp_path / "g" / "metrics.json").read_text())
    assert metrics["total_cycles"] == 9 and metrics["bubble_cycles"] == [3, 0]  # see tests/test_sim.py
    torch_csv = tmp_path / "torch.csv"
    torch_csv.write_text("0F0,0F1,0B0,0B1\r\n,1F0,1F1,1B0,1B1\r\n")
    code, _, err = run_cli(capsys, "simulate", "--schedule", torch_csv, "--stage-costs", "1,2,0",
                           "--interconnect", "shared", "--out", tmp_path / "t")
    assert code == 0, err
    assert json.loads((tmp_path / "t" / "metrics.json").read_text())["total_cycles"] == 9


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "BAD", "--stage-costs", "1,2,0"], "row 3, cell 2"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--mode", "fresh"], "--mode 'fresh' is not one of"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--samples", "0"], "--samples must be a positive integer"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--functional", "fixed", "--total-bits", "99"],
     "total_bits must be an integer in"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--functional", "fixed", "--frac-bits", "16"],
     "frac_bits must be an integer in"),
    (["--schedule", "GOOD"], "needs --stage-costs"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--shared-memory"],
     "--shared-memory is gone; give --interconnect"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--link-latency", "2"], "--link-latency is gone"),
    (["mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--interconnect", "links:1:1/0"], "divides by zero"),
    (["mlp:4-3-2", "--policy", "nope", "-n", "2"], "unknown policy 'nope'"),
])
def test_bad_input_exits_2_with_one_line_and_leaves_dir_alone(tmp_path, capsys, argv, message):
    (tmp_path / "BAD.csv").write_text(GPIPE_CSV.replace("F1.0", "X1.0"))
    (tmp_path / "GOOD.csv").write_text(GPIPE_CSV)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")  # an earlier run: --out accepts it
    argv = [str(tmp_path / f"{a}.csv") if a in ("BAD", "GOOD") else a for a in argv]
    code, _, err = run_cli(capsys, "simulate", *argv, "--out", out)
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    assert [p.name for p in out.iterdir()] == ["metrics.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BAD.csv", "GOOD.csv", "out"]


def test_existing_dir_is_replaced_whole(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")  # an older run's
    (out / "final.npz").write_text("from an older functional run")  # a file simulate writes: replaced
    csv = tmp_path / "s.csv"
    csv.write_text(GPIPE_CSV)
    code, _, err = run_cli(capsys, "simulate", "--schedule", csv, "--stage-costs", "1,2,0", "--out", out)
    assert code == 0, err
    assert not (out / "final.npz").exists() and (out / "metrics.json").read_text() != "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.csv"]


def test_a_file_the_user_added_to_an_earlier_run_is_refused_not_deleted(tmp_path, capsys):
    """Issue 12 item 8: the folder is replaced whole, so a file simulate does not write would be lost."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    (out / "notes.txt").write_text("the user's")
    csv = tmp_path / "s.csv"
    csv.write_text(GPIPE_CSV)
    code, _, err = run_cli(capsys, "simulate", "--schedule", csv, "--stage-costs", "1,2,0", "--out", out)
    assert code == 2 and "'notes.txt'" in err and err.count("\n") == 1, err
    assert (out / "notes.txt").read_text() == "the user's" and (out / "metrics.json").read_text() == "{}"


def test_out_folder_of_other_files_is_refused_untouched(tmp_path, capsys):
    """The run replaces --out whole: a folder that is not an earlier run (or the current folder) is refused."""
    out = tmp_path / "work"
    out.mkdir()
    (out / "precious.txt").write_text("user data")
    csv = tmp_path / "s.csv"
    csv.write_text(GPIPE_CSV)
    code, _, err = run_cli(capsys, "simulate", "--schedule", csv, "--stage-costs", "1,2,0", "--out", out)
    assert code == 2 and "holds files but no layerpipe simulate output" in err and err.count("\n") == 1
    assert [p.name for p in out.iterdir()] == ["precious.txt"]


def test_a_periodic_schedule_file_is_refused_in_one_line(tmp_path, capsys):
    """A periodic schedule has no iteration count: it is refused (unroll it) before the run-size check that
    reads one (that check ran first and a periodic JSON file ended in an AttributeError traceback)."""
    from layerpipe.costs import MacsModel
    from layerpipe.network import load_network
    from layerpipe.schedule._formats import to_json
    from layerpipe.schedule.policies import make_schedule

    periodic = make_schedule("layerpipe", load_network("mlp:4-3-2"), 2, MacsModel()).periodic
    assert periodic is not None
    path = tmp_path / "periodic.json"
    path.write_text(to_json(periodic))
    code, _, err = run_cli(capsys, "simulate", "mlp:4-3-2", "--schedule", path, "--out", tmp_path / "out")
    assert code == 2
    assert err.count("\n") == 1 and "a periodic schedule; unroll it" in err, err
    assert not (tmp_path / "out").exists()

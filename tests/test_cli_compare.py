"""`layerpipe compare`: one row per (network, N, policy), speedups against the baseline, stable output."""

from __future__ import annotations

import csv
import io
import json

import pytest

from layerpipe.cli import main
from layerpipe.commands.compare import COLUMNS
from layerpipe.costs import make_cost_model
from layerpipe.interconnect import Interconnect
from layerpipe.network import load_network
from layerpipe.schedule import POLICIES, make_schedule
from layerpipe.schedule.policies import STREAM_ENGINE_POLICIES
from tests.conftest import run_cli


def test_csv_rows_and_speedups(capsys) -> None:
    assert main(["compare", "mlp:7-6-5-3", "lenet5", "-n", "2,3", "--policies", "layerpipe,pipedream,zb-h2",
                 "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == list(COLUMNS)
    assert [(r["network"], r["num_procs"], r["policy"]) for r in rows] == [
        (net, n, pol) for net in ("mlp:7-6-5-3", "lenet5") for n in ("2", "3") for pol in ("layerpipe", "pipedream",
                                                                                              "zb-h2")]
    model = make_cost_model("pe")
    rtl = Interconnect.rtl(64)  # the default interconnect: the hardware's links at the model's lanes
    for r in rows:
        net = load_network(r["network"])
        assert r["interconnect"] == "rtl" and r["batch"] == "1"
        mine = make_schedule(r["policy"], net, int(r["num_procs"]), model, interconnect=rtl).metrics.cycles_per_sample
        base = make_schedule("pipedream", net, int(r["num_procs"]), model,
                             interconnect=rtl).metrics.cycles_per_sample
        assert float(r["cycles_per_sample"]) == round(mine, 1)
        assert float(r["speedup_vs_baseline"]) == round(base / mine, 3)
        if r["policy"] == "pipedream":
            assert float(r["speedup_vs_baseline"]) == 1.0


def test_default_policies_are_those_that_run(capsys) -> None:
    assert main(["compare", "mlp:784-256-128-10", "-n", "8", "--format", "json", "--baseline", "gpipe"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"] == "gpipe" and doc["columns"] == list(COLUMNS)
    # a 3-layer MLP is small enough for optimal; dp/dp-ooo refuse the default rtl and stream policies need -n 1
    assert [r["policy"] for r in doc["rows"]] == [p for p in POLICIES if p not in STREAM_ENGINE_POLICIES]
    assert main(["compare", "alexnet", "-n", "4", "--format", "json"]) == 0
    assert "optimal" not in [r["policy"] for r in json.loads(capsys.readouterr().out)["rows"]]


@pytest.mark.slow  # two fresh processes scheduling resnet18 with every policy at N = 7, 8, 9: ~8 s of CPU
def test_the_readme_command_is_byte_identical_and_readable() -> None:
    first = run_cli("compare", "mlp:784-256-128-10", "resnet18", "-n", "7,8,9")
    second = run_cli("compare", "mlp:784-256-128-10", "resnet18", "-n", "7,8,9")
    assert first.returncode == 0 and first.stdout == second.stdout
    lines = first.stdout.splitlines()
    assert lines[0] == "mlp:784-256-128-10 (batch 1, interconnect rtl (links:2:64))"
    assert "resnet18 (batch 1, interconnect rtl (links:2:64))" in lines
    assert lines[-2].startswith("cost model pe (lanes 64, overhead 16)")
    assert sum(1 for line in lines if " layerpipe " in f" {line} " and not line.startswith("skipped:")) == 6
    assert any(line.startswith("skipped: optimal on resnet18") for line in lines)  # skips say why (issue 12 item 7)


def test_bad_input_exits_2_with_one_line(capsys) -> None:
    for args, message in [(["mlp:7-6-3", "-n", "0"], "-n/--num-procs values must be in 1.."),
                          (["mlp:7-6-3", "-n", "2", "--policies", "layerpipe,bogus"], "unknown policy 'bogus'"),
                          (["mlp:7-6-3", "-n", "2", "--baseline", "bogus"], "unknown policy 'bogus'"),
                          (["alexnet", "-n", "4", "--policies", "optimal"], "optimal: graph has"),
                          (["mlp:7-6-3", "-n", "2", "--interconnect", "links:2"], "links:LATENCY:WORDS_PER_CYCLE"),
                          (["mlp:7-6-3", "-n", "2", "--interconnect", "bus:1:0"], "WORDS_PER_CYCLE must be > 0"),
                          (["mlp:7-6-3", "-n", "2", "--interconnect", "links:2:1/0"], "divides by zero"),
                          (["mlp:7-6-3", "-n", "2", "--interconnect", "mesh"], "is not one of the forms shared")]:
        assert main(["compare", *args]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], captured.err

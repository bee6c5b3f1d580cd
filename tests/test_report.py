"""`layerpipe report`: the committed reports/ are current.

The committed folder came from one run of `layerpipe report` and the fixture here is another, so the
staleness check is also the check that two runs give the same bytes.
"""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from layerpipe.report import ReportConfig, generate

ROOT = Path(__file__).resolve().parent.parent

# One regeneration of the whole report (every policy, the simulations, the RTL section): minutes, not seconds.
pytestmark = pytest.mark.slow


def _same_tree(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    return [n for n in names if not ((a / n).exists() and (b / n).exists()
                                     and filecmp.cmp(a / n, b / n, shallow=False))]


@pytest.fixture(scope="module")
def fresh_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "reports"
    generate(out, ReportConfig(), progress=False, synthesis_cache=ROOT / "reports" / "rtl.json")
    return out


def test_committed_reports_are_current(fresh_report: Path) -> None:
    differing = _same_tree(fresh_report, ROOT / "reports")
    assert not differing, f"reports/ is stale ({', '.join(differing)}): run `layerpipe report --out reports/`"


def test_report_contents(fresh_report: Path) -> None:
    readme = (fresh_report / "README.md").read_text()
    for heading in ("LayerPipe vs PipeDream at N = 7, 8, 9", "Every policy", "Ablation", "Gantt charts",
                    "RTL: verification and synthesis", "Cost model and assumptions"):
        assert heading in readme
    for name in ("compare.csv", "ablation.csv", "rtl.json", "speedup.png", "gantt_layerpipe.png",
                 "gantt_pipedream.png"):
        assert (fresh_report / name).stat().st_size > 0
    rtl = json.loads((fresh_report / "rtl.json").read_text())
    assert len(rtl["design_points"]) >= 2  # issue 11: the comparison measured in RTL on several points
    assert {p["variant"] for p in rtl["points"]} == {"layerpipe", "layerpipe, weights together", "pipedream"}
    assert all(p["bit_exact"] and p["cycle_exact"] for p in rtl["points"])
    header = (fresh_report / "compare.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["network", "num_procs", "policy", "batch", "interconnect", "cycles_per_sample"]
    assert {row.split(",")[4] for row in (fresh_report / "compare.csv").read_text().splitlines()[1:]} == {"rtl"}
    headline = (fresh_report / "headline.csv").read_text().splitlines()
    assert {row.split(",")[4] for row in headline[1:]} == {"shared", "rtl", "links:2:1/16"}

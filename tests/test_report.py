"""`layerpipe report`: the committed reports/ are current.

The committed folder came from one run of `layerpipe report` and these tests are another, so the staleness
check is also the check that two runs give the same bytes.

One regeneration is minutes of CPU in one place, so it is checked in pieces that xdist spreads over its
workers, each piece against the committed file it writes, computed the way `generate` computes it:
- the headline's rows, one interconnect per test; compare.csv with speedup.png; ablation.csv; the OOO section
  (ooo.csv, ooo_speedup.png); rtl.json (Icarus verification, ECP5 place and route reused by Verilog hash);
- then the whole folder: the real `generate` — staged folder, Gantt simulations, every plot, README.md — fed
  the committed rows in place of the section computations above (each checked by its own test; the fakes
  also check that `generate` asks for exactly what those tests computed). The tree it writes must equal the
  committed one byte for byte, which also proves that the rows read back from the CSVs are the rows written.
So a stale section fails its own test, a stale README or Gantt chart fails the folder test.

The schedule sections' `make_schedule` calls go through `tests.conftest.cached_schedule` (`_cached` below): the
same function on the same arguments, computed once per test run, since test_comm_schedule's and
test_policies' zoo sweeps schedule most of the headline's and the comparison's points too.
"""

from __future__ import annotations

import csv
import dataclasses
import filecmp
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import layerpipe.report as report
import layerpipe.report_ooo as report_ooo
from layerpipe.dse._store import write_csv
from layerpipe.report import ReportConfig, generate
from tests.conftest import cached_schedule

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "reports"
CFG = ReportConfig()
STALE = "reports/ is stale ({}): run `layerpipe report --out reports/`"


def _same_tree(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    return [n for n in names if not ((a / n).exists() and (b / n).exists()
                                     and filecmp.cmp(a / n, b / n, shallow=False))]


def _columns(rows: list[dict]) -> list[str]:
    """The CSV columns `generate` writes (from the comparison's first row; every table shares them)."""
    return ["network", "num_procs", "policy", *[k for k in rows[0] if k not in ("network", "num_procs", "policy")]]


def _csv_lines(tmp: Path, columns: list[str], rows: list[dict]) -> list[str]:
    write_csv(tmp / "rows.csv", columns, rows)
    return (tmp / "rows.csv").read_text().splitlines()


def _value(text: str) -> object:
    """A CSV cell as `write_csv` wrote it: an int, a float (shortest round-trip repr), or text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _committed_rows(name: str) -> list[dict]:
    with open(COMMITTED / name, newline="") as f:
        return [{k: _value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _interconnect(line: str) -> str:
    return next(csv.reader([line]))[4]


NO_TICK: Callable[[], None] = lambda: None  # noqa: E731


@pytest.fixture
def _cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "make_schedule", cached_schedule)


@pytest.mark.slow
@pytest.mark.parametrize("spec", CFG.paper_interconnects)
def test_headline_rows_of_one_interconnect_are_current(spec: str, tmp_path: Path, _cached: None) -> None:
    rows = report.headline_rows(dataclasses.replace(CFG, paper_interconnects=(spec,)), NO_TICK)
    fresh = _csv_lines(tmp_path, _columns(rows), rows)
    committed = (COMMITTED / "headline.csv").read_text().splitlines()
    ic = rows[0]["interconnect"]
    assert fresh[0] == committed[0], STALE.format("headline.csv header")
    assert fresh[1:] == [line for line in committed[1:] if _interconnect(line) == ic], \
        STALE.format(f"headline.csv, {ic} rows")


def test_headline_holds_the_interconnects_in_order_and_nothing_else() -> None:
    """With the test above: the committed headline.csv is exactly the concatenation of the fresh blocks."""
    lines = (COMMITTED / "headline.csv").read_text().splitlines()[1:]
    variants = 3 if report._has_replication_switch() else 2
    block = variants * len(CFG.paper_batches) * len(CFG.networks) * len(CFG.procs)
    expected = [CFG.link(spec).spec for spec in CFG.paper_interconnects for _ in range(block)]
    assert [_interconnect(line) for line in lines] == expected, STALE.format("headline.csv rows")


@pytest.mark.slow
def test_comparison_and_its_plot_are_current(tmp_path: Path, _cached: None) -> None:
    rows = report.comparison_rows(CFG, NO_TICK)
    write_csv(tmp_path / "compare.csv", _columns(rows), rows)
    report.speedup_plot(rows, tmp_path / "speedup.png")
    for name in ("compare.csv", "speedup.png"):
        assert filecmp.cmp(tmp_path / name, COMMITTED / name, shallow=False), STALE.format(name)
    header = (tmp_path / "compare.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["network", "num_procs", "policy", "batch", "interconnect", "cycles_per_sample"]
    assert {row["interconnect"] for row in rows} == {"rtl"}


@pytest.mark.slow
def test_ablation_is_current(tmp_path: Path, _cached: None) -> None:
    rows = report.ablation_rows(CFG, NO_TICK)
    columns = _columns([{k: v for k, v in rows[0].items() if k != "variant"}])  # a schedule row's keys
    write_csv(tmp_path / "ablation.csv", ["variant", *columns], rows)
    assert filecmp.cmp(tmp_path / "ablation.csv", COMMITTED / "ablation.csv", shallow=False), STALE.format(
        "ablation.csv")


@pytest.mark.slow
def test_ooo_section_is_current(tmp_path: Path) -> None:
    _, rows = report_ooo.ooo_section(CFG.model, tmp_path)
    write_csv(tmp_path / "ooo.csv", list(report_ooo.COLUMNS), rows)
    for name in ("ooo.csv", report_ooo.PLOT):
        assert filecmp.cmp(tmp_path / name, COMMITTED / name, shallow=False), STALE.format(name)


#: The rows of rtl.json rerun on Icarus in the suite, as (point, variant): every design point and every variant at
#: least once (the headline LayerPipe split placement, PipeDream, weights together, and the heavy-layer split), 4 of
#: the 12 runs. Every row's model-side figures are recomputed all the same, and the place-and-route figures are
#: checked against the Verilog they are of. `--exhaustive` reruns all 12 (test_rtl_results_are_all_current).
RTL_RERUN = ((0, "layerpipe"), (1, "pipedream"), (2, "layerpipe, weights together"),
             (3, "layerpipe, weights together"))


def test_the_rtl_rerun_covers_every_point_and_variant() -> None:
    assert {k for k, _ in RTL_RERUN} == set(range(len(report.RTL_POINTS)))
    assert {label for _, label in RTL_RERUN} == {label for label, _, _ in report.RTL_VARIANTS}


@pytest.mark.slow
def test_rtl_results_are_current(shared_verilog: None) -> None:
    """rtl.json's rows of `RTL_RERUN` rerun for real (Icarus, monitored op by op: the whole row, byte for byte);
    every other row's model-side figures (the simulator's cycles, period and steady state, the model's prediction)
    recomputed; the ECP5 figures are of the Verilog that the first point's designs export today (place and route
    reused by its hash, as `generate` does), and so are the convolutional design's."""
    import hashlib

    from layerpipe.hdl import make_design
    from layerpipe.hdl._flow import export_verilog

    committed = json.loads((COMMITTED / "rtl.json").read_text())
    assert committed["design_points"] == [p.as_dict() for p in report.RTL_POINTS], STALE.format("rtl.json")
    rows = {(row["point"], row["variant"]): row for row in committed["points"]}
    assert sorted(rows) == sorted((k, label) for k in range(len(report.RTL_POINTS)) for label, _, _ in
                                  report.RTL_VARIANTS), STALE.format("rtl.json")
    prior = {f.get("verilog_sha256"): f for f in committed["fpga"].values()}
    fpga: dict[str, dict] = {}
    for k, point in enumerate(report.RTL_POINTS):
        for label, policy, keep in report.RTL_VARIANTS:
            row = rows[(k, label)]
            if (k, label) in RTL_RERUN:
                doc, verilog, rate = report._rtl_verify(point, k, label, policy, keep)
                assert doc == row, STALE.format(f"rtl.json, point {k} {label}")
                assert doc["bit_exact"] and doc["cycle_exact"]
            else:
                design = make_design(point.network, policy, point.num_pes, point.lanes, point.samples,
                                     keep_weights_together=keep, batch=point.batch, split_layers=point.split_layers)
                rate = float(design.sim.cycles_per_sample)
                model = round(report.rtl_model_cycles_per_sample(point, policy, keep), 2)
                assert (design.network.name, design.program.period, int(design.sim.total_cycles),
                        round(rate, 2), model) == (row["network"], row["period_sim"], row["cycles_sim"],
                                                   row["steady_cycles_per_sample_sim"],
                                                   row["model_cycles_per_sample"]), STALE.format(
                    f"rtl.json, point {k} {label}")
                verilog = export_verilog(design) if k == 0 else ""
            if k == 0:  # the designs that are placed and routed
                digest = hashlib.sha256(verilog.encode()).hexdigest()
                assert digest[:16] == row["verilog_sha256_16"], STALE.format(f"rtl.json, point 0 {label}")
                figures = report._fpga_point(verilog, rate, prior.get(digest))
                if figures is not None:
                    fpga[row["verilog_sha256_16"]] = figures
    assert fpga == committed["fpga"], STALE.format("rtl.json (place and route)")
    assert report._conv_area(committed.get("fpga_conv")) == committed.get("fpga_conv"), STALE.format(
        "rtl.json (the convolutional design's place and route)")


@pytest.mark.slow
@pytest.mark.exhaustive
def test_rtl_results_are_all_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """All 12 runs of the RTL section on Icarus for real, and the whole rtl.json as `generate` writes it;
    place-and-route figures reused from the committed rtl.json when the Verilog hashes the same.

    The jobs run in this process (workers=1: the same jobs in the same order, and test_report_rtl checks that
    worker processes return them in that order), so two spawned interpreters do not import everything again,
    and each design's Verilog is exported once per top: `_rtl_verify` exports the synthesized top for its hash,
    `verify_design` the debug top for its run (`export_verilog` is a pure function of the design; ~2 s of
    amaranth per design)."""
    import layerpipe.hdl._flow as flow

    # (id, debug) -> (the design, kept alive so its id is not reused; Verilog)
    exported: dict[tuple[int, bool], tuple[object, str]] = {}
    export_verilog = flow.export_verilog

    def export_once(design: flow.Design, *, debug: bool = False) -> str:
        hit = exported.get((id(design), debug))
        if hit is None or hit[0] is not design:
            hit = exported[(id(design), debug)] = (design, export_verilog(design, debug=debug))
        return hit[1]

    monkeypatch.setattr(flow, "export_verilog", export_once)
    committed = (COMMITTED / "rtl.json").read_text()
    doc = report.rtl_results(json.loads(committed), workers=1)
    # one synthesized top (hashed) and one debug top (run by the cocotb bench) per verified design, and the
    # synthesized top of the convolutional design of the area table
    assert sorted(debug for _, debug in exported) == sorted([False, True] * len(doc["points"]) + [False])
    assert json.dumps(doc, indent=1, sort_keys=True) + "\n" == committed, STALE.format("rtl.json")
    assert {"layerpipe", "pipedream"} <= {p["policy"] for p in doc["points"]}
    assert all(p["bit_exact"] and p["cycle_exact"] for p in doc["points"])


@pytest.mark.slow
def test_the_whole_folder_is_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rtl = json.loads((COMMITTED / "rtl.json").read_text())

    def committed(name: str) -> Callable[..., list[dict]]:
        def rows(cfg: ReportConfig, tick: Callable[[], object]) -> list[dict]:
            assert cfg == CFG, "generate asked for other rows than the section tests check"
            return _committed_rows(name)
        return rows

    def ooo_rows(model: object, tick: Callable[[], object] = NO_TICK) -> list[dict]:
        assert model == CFG.model, "generate asked for other OOO rows than test_ooo_section_is_current checks"
        return _committed_rows("ooo.csv")

    def rtl_results(previous: dict | None, *args: object, **kwargs: object) -> dict:
        assert previous == rtl and not args and not kwargs, "generate asked for other RTL results"
        return rtl

    monkeypatch.setattr(report, "headline_rows", committed("headline.csv"))
    monkeypatch.setattr(report, "comparison_rows", committed("compare.csv"))
    monkeypatch.setattr(report, "ablation_rows", committed("ablation.csv"))
    monkeypatch.setattr(report_ooo, "ooo_rows", ooo_rows)
    monkeypatch.setattr(report, "rtl_results", rtl_results)
    out = tmp_path / "reports"
    generate(out, CFG, progress=False, synthesis_cache=COMMITTED / "rtl.json")
    differing = _same_tree(out, COMMITTED)
    assert not differing, STALE.format(", ".join(differing))

    readme = (out / "README.md").read_text()
    for heading in ("LayerPipe vs PipeDream at N = 7, 8, 9", "Every policy", "Ablation", "Gantt charts",
                    "RTL: verification and synthesis", "Cost model and assumptions"):
        assert heading in readme
    for name in ("compare.csv", "ablation.csv", "rtl.json", "speedup.png", "gantt_layerpipe.png",
                 "gantt_pipedream.png"):
        assert (out / name).stat().st_size > 0
    headline = (out / "headline.csv").read_text().splitlines()
    assert {row.split(",")[4] for row in headline[1:]} == {"shared", "rtl", "links:2:1/16"}

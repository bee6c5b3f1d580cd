"""Design-space exploration: sweeps, crash-safe resume, local vs Dask, Pareto fronts, bad input."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerpipe.cli import main
from layerpipe.dse import COLUMNS, DesignPoint, ResultsFile, SweepSpec, load_sweep_yaml, pareto_front, run_sweep
from layerpipe.errors import InputError

NETS = ("mlp:16-12-8-4", "lenet5")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _small_spec(**kw) -> SweepSpec:
    base = {"networks": NETS, "num_procs": (1, 2, 3), "policies": ("layerpipe", "pipedream", "1f1b"),
            "max_staleness": (None, 2)}
    base.update(kw)
    return SweepSpec(**base)


def test_points_expand_only_applicable_options() -> None:
    spec = _small_spec()
    points = spec.points()
    # layerpipe gets both staleness bounds, the others only "not applicable".
    assert len(points) == len(NETS) * 3 * (2 + 1 + 1)
    assert all(p.max_staleness is None for p in points if p.policy != "layerpipe")
    assert len({p.point_id for p in points}) == len(points)


@pytest.mark.slow  # two worker processes: ~1.3 s of CPU
def test_jobs_2_gives_one_row_per_point(tmp_path: Path) -> None:
    spec = _small_spec()
    out = tmp_path / "r.csv"
    run_sweep(spec, out, jobs=2, progress=False)
    rows = _rows(out)
    assert [int(r["point_index"]) for r in rows] == list(range(len(spec.points())))
    assert list(rows[0]) == list(COLUMNS)
    for r, p in zip(rows, spec.points(), strict=True):
        assert (r["network"], int(r["num_procs"]), r["policy"]) == (p.network, p.num_procs, p.policy)
        assert float(r["cycles_per_sample"]) > 0
        # the column is the bound for one iteration per period: unfolded schedules (layerpipe's replicated or
        # split plans, replicated pipedream) may beat it
        assert float(r["cycles_per_sample"]) >= float(r["lower_bound_cycles_per_sample"]) * 0.999 or \
            r["policy"] in ("layerpipe", "pipedream")
    # One worker or two: the finished file has the same bytes.
    out1 = tmp_path / "r1.csv"
    run_sweep(spec, out1, jobs=1, progress=False)
    assert out1.read_bytes() == out.read_bytes()


@pytest.mark.slow  # a worker process and three small sweeps: ~1.5 s of CPU
@pytest.mark.parametrize("jobs", [2, 3])
def test_jobs_share_the_batches_between_this_process_and_the_workers(tmp_path: Path, jobs: int) -> None:
    """`--jobs N`: this process evaluates points too, beside N − 1 workers (`_share`); every point once, the
    largest batches handed out first, and the file byte for byte the one-job file."""
    import json
    import os

    import layerpipe.dse._evaluate as evaluate
    import layerpipe.dse._runner as runner

    spec = SweepSpec(networks=("mlp:8-8-4", "mlp:4-4"), num_procs=(1, 2, 3), policies=("layerpipe", "gpipe"))
    log = tmp_path / "pids.jsonl"
    real = evaluate.evaluate_point

    def logged(point, area=False):  # forked workers inherit this patch, and append to the same file
        with open(log, "a") as fh:
            fh.write(json.dumps([os.getpid(), point.network, point.num_procs]) + "\n")
        return real(point, area)

    handed: list[int] = []
    share = runner._share

    def spy(spec_, batches, *args):
        handed.extend(runner._batch_work(b) for b in batches)
        return share(spec_, batches, *args)

    mp = pytest.MonkeyPatch()
    mp.setattr(runner, "evaluate_point", logged)
    mp.setattr(runner, "_share", spy)
    interval = sys.getswitchinterval()
    try:
        run_sweep(spec, tmp_path / "r.csv", jobs=jobs, progress=False)
    finally:
        mp.undo()
    assert sys.getswitchinterval() == interval  # the shorter GIL interval of the run, handed back
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(seen) == len(spec.points())
    assert os.getpid() in {pid for pid, *_ in seen}  # this process took points
    assert len({pid for pid, *_ in seen}) >= 2  # and a worker did
    assert handed == sorted(handed, reverse=True) and handed[0] > handed[-1]  # the largest batches first
    run_sweep(spec, tmp_path / "r1.csv", jobs=1, progress=False)
    assert (tmp_path / "r1.csv").read_bytes() == (tmp_path / "r.csv").read_bytes()


@pytest.mark.slow  # ~7 s of CPU: three sweeps; test_faults kills explore --jobs 2 twenty times (slow too)
def test_killed_sweep_resumes_without_duplicates_or_gaps(tmp_path: Path) -> None:
    out = tmp_path / "k.csv"
    args = [sys.executable, "-m", "layerpipe.cli", "explore", *NETS, "-n", "1-8",
            "--policies", "layerpipe,pipedream,ooo", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 6:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "sweep finished before it could be killed; make it longer"
    partial = ResultsFile(out).read_rows()
    assert 5 <= len(partial) < 48
    rc = subprocess.call([*args, "--resume"], stdout=subprocess.DEVNULL)
    assert rc == 0
    resumed = _rows(out)
    indices = [int(r["point_index"]) for r in resumed]
    assert indices == list(range(2 * 8 * 3))
    clean = tmp_path / "clean.csv"
    assert main([*args[3:-3], "--out", str(clean), "--no-progress"]) == 0  # the clean run: in process is enough
    assert clean.read_bytes() == out.read_bytes()


def test_one_job_writes_each_row_before_the_next_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, every finished point's row is in the file before the next point starts (a run killed mid-way
    keeps them), and a point that raises leaves the rows before it."""
    import layerpipe.dse._runner as runner

    out = tmp_path / "r.csv"
    spec = _small_spec(num_procs=(2, 3), networks=("mlp:16-12-8-4",))
    seen: list[int] = []
    evaluate = runner.evaluate_point

    def counting(point, area=False):
        seen.append(len(ResultsFile(out).read_rows()))
        if len(seen) == 4:
            raise InputError("point 4 fails")
        return evaluate(point, area=area)

    monkeypatch.setattr(runner, "evaluate_point", counting)
    with pytest.raises(InputError, match="point 4 fails"):
        run_sweep(spec, out, progress=False)
    assert seen == [0, 1, 2, 3]
    assert [int(r["point_index"]) for r in ResultsFile(out).read_rows()] == [0, 1, 2]


def test_appended_rows_are_fsynced_at_most_once_an_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row is written whole at once (a killed run keeps it); fsyncs come FSYNC_INTERVAL apart, from row one."""
    import layerpipe.dse._store as store

    synced: list[float] = []
    clock = [100.0]
    monkeypatch.setattr(store.os, "fsync", lambda fd: synced.append(clock[0]))
    monkeypatch.setattr(store.time, "monotonic", lambda: clock[0])
    results = ResultsFile(tmp_path / "r.csv")
    results.start("s1", resume=False)
    for k, step in enumerate([0.0, 0.3, 0.3, 0.3, 0.2, 5.0, 0.1]):
        clock[0] += step
        results.append({"sweep_id": "s1", "point_index": k})
        assert len(results.read_rows()) == k + 1  # in the file before any fsync
    assert synced == [100.0, 101.1, 106.1]
    assert store.FSYNC_INTERVAL == 1.0


def test_torn_last_line_is_dropped_on_resume(tmp_path: Path) -> None:
    spec = _small_spec(num_procs=(2,), networks=("mlp:16-12-8-4",))
    out = tmp_path / "t.csv"
    run_sweep(spec, out, progress=False)
    full = out.read_bytes()
    lines = full.splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:-1]) + lines[-1][:7])  # a killed writer's half line
    run_sweep(spec, out, resume=True, progress=False)
    assert out.read_bytes() == full


@pytest.mark.slow  # a two-process dask cluster: ~3.3 s of CPU and seconds of start-up
def test_dask_cluster_gives_the_same_rows(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    spec = _small_spec(networks=("mlp:16-12-8-4",))
    local = tmp_path / "local.csv"
    run_sweep(spec, local, jobs=1, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        remote = tmp_path / "dask.csv"
        run_sweep(spec, remote, scheduler=cl.scheduler_address, progress=False)
    assert remote.read_bytes() == local.read_bytes()


def test_pareto_front_by_hand() -> None:
    rows = [
        {"cycles_per_sample": "10", "peak_memory_words": "5", "max_staleness": "1"},
        {"cycles_per_sample": "8", "peak_memory_words": "9", "max_staleness": "1"},
        {"cycles_per_sample": "12", "peak_memory_words": "6", "max_staleness": "1"},  # dominated by the first
        {"cycles_per_sample": "10", "peak_memory_words": "5", "max_staleness": "0"},  # dominates the first
    ]
    front = pareto_front(rows)
    assert front == [rows[1], rows[3]]


def test_cli_writes_results_and_pareto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res" / "r.csv"
    rc = main(["explore", "mlp:16-12-8-4", "-n", "2,3", "--policies", "layerpipe,pipedream", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    assert len(_rows(out)) == 4
    for name in ("pareto.csv", "pareto.svg", "speedup_vs_n.svg"):
        assert (out.parent / name).stat().st_size > 0
    assert "4 points" in capsys.readouterr().out


@pytest.mark.parametrize(("plots", "drawn"), [("none", ()), ("speedup", ("speedup_vs_n.svg",)),
                                              ("pareto", ("pareto.svg",)), (" pareto , speedup ",
                                                                            ("pareto.svg", "speedup_vs_n.svg"))])
def test_only_the_plots_asked_for_are_drawn(tmp_path: Path, plots: str, drawn: tuple[str, ...]) -> None:
    out = tmp_path / "r.csv"
    assert main(["explore", "mlp:16-12-8-4", "-n", "2", "--out", str(out), "--no-progress", "--plots", plots]) == 0
    assert (tmp_path / "pareto.csv").stat().st_size > 0  # the front is always written
    assert tuple(sorted(f.name for f in tmp_path.glob("*.svg"))) == drawn


@pytest.mark.parametrize("plots", ["", "gantt", "none,pareto", "pareto,,x"])
def test_bad_plots_exit_2_naming_the_choices(tmp_path: Path, plots: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    assert main(["explore", "mlp:16-12-8-4", "-n", "2", "--out", str(out), "--no-progress", "--plots", plots]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--plots" in err and "pareto, speedup" in err
    assert not out.exists()  # refused before any work


def test_sweep_yaml(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("version: 1\nnetworks: [mlp:16-12-8-4]\nnum_procs: [2, 4]\npolicies: [layerpipe]\n"
                 "max_staleness: [1, 3]\n")
    spec = load_sweep_yaml(f)
    assert [p.max_staleness for p in spec.points()] == [1, 3, 1, 3]
    assert spec.points()[0] == DesignPoint("mlp:16-12-8-4", 2, "layerpipe", 1)


@pytest.mark.parametrize(("text", "message"), [
    ("version: 1\nnetworks: [lenet5]\nnum_procs: [2]\npolicies: [layerpipe]\nprocs: [3]\n",
     "unknown key 'procs'; valid keys: version, networks, num_procs"),
    ("version: 1\nnetworks: []\nnum_procs: [2]\npolicies: [layerpipe]\n", "sweep is empty: 'networks'"),
    ("version: 2\nnetworks: [lenet5]\nnum_procs: [2]\npolicies: [layerpipe]\n", "'version' must be 1"),
    ("version: 1\nnetworks: [lenet5]\nnetworks: [vgg16]\nnum_procs: [2]\npolicies: [layerpipe]\n",
     "duplicate key 'networks' at line 3"),
    ("version: 1\nnetworks: [lenet5]\nnum_procs: [2]\npolicies: [nope]\n", "unknown policy 'nope'; allowed:"),
])
def test_bad_sweep_files_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                              message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    out = tmp_path / "r.csv"
    assert main(["explore", "--sweep", str(f), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert not out.exists()


def test_resume_of_a_different_sweep_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    assert main(["explore", "mlp:16-12-8-4", "-n", "2", "--out", str(out), "--no-progress"]) == 0
    before = out.read_bytes()
    assert main(["explore", "mlp:16-12-8-4", "-n", "3", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "holds results of a different sweep" in err and err.count("\n") == 1
    assert out.read_bytes() == before


#: What a one-job `explore --no-progress --plots none` process does not load: tqdm (no bar), multiprocessing (no
#: workers), numpy.ma (`sorted_unique` instead of `np.unique`, whose first call imports the masked arrays).
NOT_LOADED = ("tqdm", "multiprocessing", "numpy.ma")


def test_explore_without_bar_or_workers_loads_neither(tmp_path: Path) -> None:
    code = ("import sys; from layerpipe.cli import main; "
            f"main(['explore', 'mlp:8-6-4', '-n', '2,3', '--policies', 'layerpipe,pipedream,1f1b,ooo', "
            f"'--max-staleness', '1', '--out', {str(tmp_path / 'r.csv')!r}, '--no-progress', '--plots', 'none']); "
            f"print([m for m in {NOT_LOADED!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@given(exponent=st.integers(-6, 12), coeff=st.integers(1, 9))
def test_log_tick_labels_are_plain_text_powers(exponent: int, coeff: int) -> None:
    """The plots' log axes are labelled "10³", "2×10³": the label names the tick's value."""
    from layerpipe.dse._svg import power_label

    label = power_label(coeff * 10.0**exponent)
    digits = label.split("10", 1)[1] if coeff == 1 else label.split("×10", 1)[1]
    assert int(digits.translate(str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789"))) == exponent
    assert label.startswith("10") if coeff == 1 else label.startswith(f"{coeff}×")


def _plot_rows(points: list[tuple[str, str, int, float, float]]) -> list[dict[str, str]]:
    return [{"network": net, "policy": policy, "num_procs": str(n), "cycles_per_sample": str(c),
             "peak_memory_words": str(m), "max_staleness_bound": "", "interconnect": "rtl", "batch": "1",
             "cost_model": "pe"} for net, policy, n, c, m in points]


@given(st.lists(st.tuples(st.sampled_from(("lenet5", "a&<b>")), st.sampled_from(("pipedream", "layerpipe", "1f1b")),
                          st.integers(1, 16), st.floats(1.0, 1e9), st.floats(1.0, 1e9)), min_size=1, max_size=40))
def test_plots_are_well_formed_svg_with_every_point(points) -> None:
    """Both plots parse as SVG (names escaped), draw one marker per row in the pareto plot and one panel per
    network, label every axis with at least one tick, and the same rows give the same bytes."""
    import tempfile
    import xml.etree.ElementTree as ET

    from layerpipe.dse._pareto import fronts_by_network, plot_pareto, plot_speedup_vs_n

    rows = _plot_rows(points)
    ns = "{http://www.w3.org/2000/svg}"
    with tempfile.TemporaryDirectory() as tmp:
        pareto = plot_pareto(rows, fronts_by_network(rows), Path(tmp) / "p.svg")
        text = pareto.read_bytes()
        assert plot_pareto(rows, fronts_by_network(rows), Path(tmp) / "q.svg").read_bytes() == text
        root = ET.fromstring(text)
        networks = {r["network"] for r in rows}
        panels = root.findall(f"{ns}g")
        assert len(panels) == len(networks)
        legend_markers = sum(len({r["policy"] for r in rows if r["network"] == net}) for net in networks)
        assert len(root.findall(f".//{ns}circle")) == len(rows) + legend_markers
        titles = {t.text for t in root.iter(f"{ns}text")}
        assert networks <= titles and "cycles per sample" in titles
        for panel in panels:  # tick labels on both axes: end-anchored (y) and middle-anchored below the axes (x)
            labels = [t for t in panel.iter(f"{ns}text") if t.get("font-size") == "10" and t.text]
            assert any(t.get("text-anchor") == "end" for t in labels)
            assert any(t.get("text-anchor") == "middle" for t in labels)
        ET.fromstring(plot_speedup_vs_n(rows, Path(tmp) / "s.svg").read_bytes())


def test_explore_plots_without_matplotlib_or_networkx(tmp_path: Path) -> None:
    """The plots are written without importing matplotlib (issue 14: its import and PNG rendering were ~0.9 s of
    CPU per run, as much as a hundred design points), and issue 14's sweep runs without networkx (~0.1 s of
    import: the one topological order it needs is `layerpipe.dfg.topological_order`)."""
    code = ("import sys; from layerpipe.cli import main; "
            f"main(['explore', 'lenet5', '-n', '2,3', '--policies', 'layerpipe,pipedream,gpipe,1f1b,zb-h1,ooo', "
            f"'--max-staleness', '4', '--out', {str(tmp_path / 'r.csv')!r}, '--no-progress']); "
            "print('matplotlib' in sys.modules, 'networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "False False"
    assert (tmp_path / "pareto.svg").stat().st_size > 0 and (tmp_path / "speedup_vs_n.svg").stat().st_size > 0


def _fresh_figures(point: DesignPoint) -> tuple[object, tuple[float, float, int]]:
    """(simulated_content, simulated figures) of a point's schedule, simulated now (no memo)."""
    from layerpipe.costs import make_cost_model
    from layerpipe.dse._evaluate import _simulated_figures, simulated_content
    from layerpipe.interconnect import parse_interconnect
    from layerpipe.network import load_network
    from layerpipe.schedule.policies import make_schedule, policy_options

    network = load_network(point.network)
    model = make_cost_model(point.cost_model, lanes=point.lanes)
    interconnect = parse_interconnect(point.interconnect, lanes=point.lanes)
    given = {} if point.max_staleness is None else {"max_staleness": point.max_staleness}
    result = make_schedule(point.policy, network, point.num_procs, model, policy_options(point.policy, given),
                           interconnect)
    return simulated_content(result), _simulated_figures(result, network, model, interconnect)


@pytest.mark.parametrize("network", ["mlp:16-12-8-4", "lenet5"])
@pytest.mark.parametrize("interconnect", ["shared", "rtl", "links:1:2", "bus:1:2"])
def test_equal_simulated_content_simulates_alike(network: str, interconnect: str) -> None:
    """`evaluate_point` reuses the simulated figures of a schedule with the same `simulated_content`: over
    policies, bounds and processor counts, points whose schedules have equal content have equal figures simulated
    afresh, and a sweep's rows (memo on) are those of points evaluated one by one from empty memos."""
    from layerpipe._memo import clear_memos
    from layerpipe.dse._evaluate import evaluate_point

    points = [DesignPoint(network, n, policy, bound, 1, interconnect)
              for n in (2, 3) for policy, bound in [("layerpipe", None), ("layerpipe", 4), ("layerpipe", 0),
                                                    ("pipedream", None), ("pipedream-2bw", None), ("gpipe", None)]]
    by_content: dict[object, tuple[float, float, int]] = {}
    for point in points:
        clear_memos()
        content, figures = _fresh_figures(point)
        if content is not None:
            assert by_content.setdefault(content, figures) == figures
    clear_memos()
    swept = [evaluate_point(p) for p in points]  # the memo on: later points may reuse earlier figures
    for point, row in zip(points, swept, strict=True):
        clear_memos()
        assert evaluate_point(point) == row

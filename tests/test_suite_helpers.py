"""The suite's own machinery (tests/conftest.py): xdist hands tests out longest first, by the CPU seconds
`tools/test_times.py --write-order` records in tests/cpu_times.json; `cached_schedule` is `make_schedule`
computed once per run."""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import conftest

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class _Mark:
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Item:
    """What `longest_first` reads of a pytest.Item: its node id and its marks."""
    nodeid: str
    marks: dict[str, _Mark] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> _Mark | None:
        return self.marks.get(name)


def _order(items: list[_Item], recorded: dict[str, float]) -> list[str]:
    return [i.nodeid for i in conftest.longest_first(cast(list[pytest.Item], items), recorded)]


def test_recorded_longest_first_then_collection_order() -> None:
    items = [_Item("a"), _Item("b"), _Item("c"), _Item("d"), _Item("e")]
    assert _order(items, {"c": 3.0, "e": 40.0, "a": 0.1}) == ["e", "c", "a", "b", "d"]
    assert _order(items, {}) == ["a", "b", "c", "d", "e"]  # nothing recorded: the collection order


def test_an_unrecorded_slow_test_goes_before_the_fast_ones_and_after_heavier_recorded_ones() -> None:
    slow = {"slow": _Mark()}
    items = [_Item("fast"), _Item("new_slow", dict(slow)), _Item("heavy"), _Item("light")]
    recorded = {"heavy": conftest.UNRECORDED_SLOW_S + 1, "light": 1.0}
    assert _order(items, recorded) == ["heavy", "new_slow", "light", "fast"]


def test_an_xdist_group_moves_as_one_block_in_its_own_order() -> None:
    group = {"xdist_group": _Mark(("wheel",))}
    items = [_Item("w1", dict(group)), _Item("x"), _Item("w2", dict(group)), _Item("y"),
             _Item("w3", {"xdist_group": _Mark((), {"name": "wheel"})})]
    # the group's cost is its dearest member's; its members keep their collection order, adjacent
    assert _order(items, {"w2": 9.0, "y": 5.0, "x": 1.0}) == ["w1", "w2", "w3", "y", "x"]


def test_written_order_file_is_what_the_conftest_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = tmp_path / "cpu.jsonl"
    lines = [{"nodeid": "<startup+collection>", "slow": False, "cpu": 7.0, "wall": None, "worker": "gw0"},
             {"nodeid": "tests/test_x.py::test_a[1-\"q\"]", "slow": True, "cpu": 12.5, "wall": 30.0, "worker": "gw0"},
             {"nodeid": "tests/test_x.py::test_b", "slow": False, "cpu": 0.2, "wall": 0.3, "worker": "gw1"},
             {"nodeid": "tests/test_x.py::test_b", "slow": False, "cpu": 0.7, "wall": 0.9, "worker": "gw1"}]
    records.write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "cpu_times.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "test_times.py"), str(records), "--write-order",
                           str(out), "--min-cpu", "0.5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setattr(conftest, "CPU_TIMES", str(out))
    # the startup line is no test; the later record of test_b wins and clears the threshold
    assert conftest._recorded_cpu() == {"tests/test_x.py::test_a[1-\"q\"]": 12.5, "tests/test_x.py::test_b": 0.7}
    monkeypatch.setattr(conftest, "CPU_TIMES", str(tmp_path / "missing.json"))
    assert conftest._recorded_cpu() == {}  # no file: no reordering


def test_the_committed_order_file_is_readable_and_names_this_suites_tests() -> None:
    recorded = conftest._recorded_cpu()
    assert recorded, "tests/cpu_times.json is missing or unreadable"
    assert all(nodeid.startswith("tests/test_") and "::" in nodeid and cpu >= 0 for nodeid, cpu in recorded.items())


def test_cached_schedule_is_make_schedule_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import layerpipe.schedule.policies as policies
    from layerpipe.costs import PEModel
    from layerpipe.interconnect import SHARED, parse_interconnect
    from layerpipe.network import load_network

    monkeypatch.setenv(conftest.SCHEDULE_CACHE_ENV, str(tmp_path))
    net, model, ic = load_network("lenet5"), PEModel(), parse_interconnect("links:2:1")
    fresh = policies.make_schedule("layerpipe", net, 4, model, interconnect=ic)
    first = conftest.cached_schedule("layerpipe", net, 4, model, interconnect=ic)
    assert first.metrics == fresh.metrics and first.periodic == fresh.periodic and first.interconnect == ic
    assert len(list(tmp_path.glob("*.pickle"))) == 1 and not list(tmp_path.glob("*.tmp"))

    calls: list[tuple[object, ...]] = []
    real = policies.make_schedule

    def counting(*args: object) -> object:
        calls.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(policies, "make_schedule", counting)
    again = conftest.cached_schedule("layerpipe", load_network("lenet5"), 4, PEModel(), None, ic)
    assert calls == [] and again.metrics == fresh.metrics and again is not first  # read back: its own copy
    # the defaults spelled out or left out are one entry; another N, option or interconnect is another
    conftest.cached_schedule("pipedream", net, 4, model)
    conftest.cached_schedule("pipedream", net, 4, model, policies.POLICIES["pipedream"].options(), SHARED)
    conftest.cached_schedule("layerpipe", net, 5, model, interconnect=ic)
    assert len(calls) == 2 and len(list(tmp_path.glob("*.pickle"))) == 3


@pytest.mark.slow  # four exports of a 1-PE design: ~1.5 s of CPU
def test_cached_verilog_is_export_verilog_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same text as `export_verilog`; computed once per (design inputs, debug) — an equal design made again
    is a hit, another T or the debug top is another entry; through `shared_verilog` the library's own calls hit
    it too."""
    pytest.importorskip("amaranth")
    import layerpipe.hdl._flow as flow

    monkeypatch.setenv(conftest.SCHEDULE_CACHE_ENV, str(tmp_path))
    design = flow.make_design("mlp:5-4-3", "layerpipe", 1, 1, 4)
    calls: list[bool] = []
    real = flow.export_verilog

    def counting(d: flow.Design, *, debug: bool = False) -> str:
        calls.append(debug)
        return real(d, debug=debug)

    monkeypatch.setattr(flow, "export_verilog", counting)
    text = conftest.cached_verilog(design)
    assert text == real(design) and calls == [False]
    assert conftest.cached_verilog(flow.make_design("mlp:5-4-3", "layerpipe", 1, 1, 4)) == text and calls == [False]
    assert conftest.cached_verilog(design, debug=True) != text and calls == [False, True]
    conftest.cached_verilog(flow.make_design("mlp:5-4-3", "layerpipe", 1, 1, 8))
    assert calls == [False, True, False] and len(list(tmp_path.glob("*.v"))) == 3 and not list(tmp_path.glob("*.tmp"))
    # as `shared_verilog` installs it: the library's own calls read the cache, a miss goes to `export`
    monkeypatch.setattr(flow, "export_verilog", functools.partial(conftest.cached_verilog, export=counting))
    assert flow.export_verilog(design) == text and calls == [False, True, False]
    flow.export_verilog(flow.make_design("mlp:5-4-3", "layerpipe", 1, 1, 6))
    assert calls == [False, True, False, False] and len(list(tmp_path.glob("*.v"))) == 4


def test_cached_schedule_does_not_cache_errors_or_run_without_its_folder(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from layerpipe.costs import PEModel
    from layerpipe.errors import InputError
    from layerpipe.network import load_network

    monkeypatch.setenv(conftest.SCHEDULE_CACHE_ENV, str(tmp_path))
    with pytest.raises(InputError):
        conftest.cached_schedule("layerpipe", load_network("lenet5"), 0, PEModel())
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv(conftest.SCHEDULE_CACHE_ENV)
    result = conftest.cached_schedule("layerpipe", load_network("mlp:8-6-4"), 2, PEModel())
    assert result.metrics.cycles_per_sample > 0 and list(tmp_path.iterdir()) == []


def test_this_run_has_one_schedule_folder_of_its_own() -> None:
    folder = os.environ.get(conftest.SCHEDULE_CACHE_ENV)
    assert folder and Path(folder).is_dir() and Path(folder).name.startswith("layerpipe-test-schedules-")


def test_fast_over_lists_the_fast_tests_past_the_budget_and_fails(tmp_path: Path) -> None:
    records = tmp_path / "cpu.jsonl"
    lines = [{"nodeid": "tests/test_x.py::test_heavy", "slow": False, "cpu": 3.5, "wall": 9.0, "worker": "main"},
             {"nodeid": "tests/test_x.py::test_light", "slow": False, "cpu": 0.2, "wall": 0.3, "worker": "main"},
             {"nodeid": "tests/test_x.py::test_marked", "slow": True, "cpu": 40.0, "wall": 90.0, "worker": "main"}]
    records.write_text("".join(json.dumps(r) + "\n" for r in lines))
    tool = [sys.executable, str(ROOT / "tools" / "test_times.py"), str(records), "--top", "0", "--fast-over"]
    over = subprocess.run([*tool, "1"], capture_output=True, text=True, timeout=60)
    assert over.returncode == 1, over.stderr
    listed = over.stdout.split("fast tests over 1 s of CPU", 1)[1].strip().splitlines()
    assert [line.split()[-1] for line in listed[1:]] == ["tests/test_x.py::test_heavy"]  # not the slow one
    assert subprocess.run([*tool, "5"], capture_output=True, text=True, timeout=60).returncode == 0


def _all_pairs(points: list[tuple[object, ...]]) -> set[tuple[int, object, int, object]]:
    return set().union(*(conftest._pairs(p) for p in points)) if points else set()


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("abc"), st.integers(0, 2), st.booleans()),
                min_size=1, max_size=40, unique=True),
       st.integers(0, 3))
def test_pairwise_keeps_every_pair_of_the_grid_in_fewer_points(points: list[tuple[object, ...]], given_k: int) -> None:
    """Any grid, any points run elsewhere: the subset is of the grid, in its order, covers every value pair the
    grid has (with the points run elsewhere), and is the same on a second call."""
    covered, keep = points[:given_k], points[-given_k:] if given_k else []
    kept = conftest.pairwise(points, covered)
    assert kept == [p for p in points if p in kept] and kept == conftest.pairwise(points, covered)
    assert _all_pairs(points) <= _all_pairs(kept) | _all_pairs(covered)
    # greedy picks a point only while it adds a pair: never more points than pairs left to cover
    assert len(kept) <= len(_all_pairs(points) - _all_pairs(covered))
    # points to keep are kept, and the cover is still whole
    with_keep = conftest.pairwise(points, covered, keep)
    assert set(keep) <= set(with_keep) and _all_pairs(points) <= _all_pairs(with_keep) | _all_pairs(covered)


def test_pairwise_cuts_a_full_product_to_a_covering_array() -> None:
    full = list(itertools.product((2, 3, 4), (1, 2, 4), (1, 4)))
    kept = conftest.pairwise(full)
    assert len(kept) == 9 < len(full)  # 3 x 3 (N, lanes) pairs need 9 points; every (x, batch) pair fits in them
    params = conftest.grid(full)
    marked = [tuple(p.values) for p in params if any(m.name == "exhaustive" for m in p.marks)]  # type: ignore[attr-defined]
    assert sorted(marked) == sorted(set(full) - set(kept))


def test_exhaustive_tests_are_skipped_unless_asked_for(tmp_path: Path) -> None:
    """The real hooks (tests/conftest.py as a plugin) on a two-test file: the exhaustive one is skipped with its
    reason by default, and runs with --exhaustive or LAYERPIPE_EXHAUSTIVE=1."""
    (tmp_path / "test_tiers.py").write_text(
        "import pytest\n\n\ndef test_kept():\n    pass\n\n\n@pytest.mark.exhaustive\ndef test_grid():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERPIPE_EXHAUSTIVE", "PYTEST_XDIST_WORKER",
                                                            "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(ROOT)

    def run(*args: str, **extra: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                               "-q", "-rs", "-W", "ignore::pytest.PytestUnknownMarkWarning", *args,
                               str(tmp_path / "test_tiers.py")], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env={**env, **extra})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    default = run()
    assert "1 passed, 1 skipped" in default and "exhaustive tier (--exhaustive" in default
    assert "2 passed" in run("--exhaustive")
    assert "2 passed" in run(LAYERPIPE_EXHAUSTIVE="1")

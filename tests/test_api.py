"""The public face (issue 13): `import layerpipe` names what a script needs, stays cheap, and the project
has one registry per concept and one parser per kind of option value."""

from __future__ import annotations

import argparse
import math
import re
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerpipe.commands._common import COST_MODEL_OPTIONS, positive_float
from layerpipe.costs import COST_MODELS, make_cost_model
from layerpipe.errors import InputError


def test_one_cost_model_registry_feeds_the_cli_the_sweeps_and_the_errors() -> None:
    from layerpipe.dse._sweep import SWEEP_COST_MODELS

    assert list(COST_MODELS) == ["macs", "pe", "profiled", "rtl"]
    assert list(COST_MODEL_OPTIONS) == list(COST_MODELS)
    assert COST_MODEL_OPTIONS["pe"] == ("--lanes", "--overhead")
    assert SWEEP_COST_MODELS == ("macs", "pe", "rtl")  # every model without a profile file
    with pytest.raises(InputError, match="unknown cost model 'gpu'; allowed: macs, pe, profiled, rtl"):
        make_cost_model("gpu")
    assert make_cost_model("pe", lanes=8, overhead=2).atomic_cost.__self__.lanes == 8  # type: ignore[attr-defined]


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_positive_float_takes_finite_positive_numbers_only(value: float) -> None:
    parse = positive_float("--lr")
    if value > 0 and math.isfinite(value):
        assert parse(repr(value)) == value
        return
    with pytest.raises(argparse.ArgumentTypeError, match="--lr must be a finite number > 0") as info:
        parse(repr(value))
    assert isinstance(info.value, InputError)  # outside argparse it is the project's one-line error


def test_positive_float_names_the_field_on_text() -> None:
    message = "--time-limit must be a number > 0 such as 0.0625 or 2e-4, got 'soon'"
    with pytest.raises(InputError, match=re.escape(message)):
        positive_float("--time-limit")("soon")


# --- the public face ------------------------------------------------------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _assert_lazy_face(imported: str, heavy: tuple[str, ...], package: ModuleType) -> None:
    """Importing `imported` in a fresh interpreter loads none of `heavy`; every name of `package.__all__` resolves
    and is in its dir(); an unknown name is an AttributeError naming it."""
    import subprocess
    import sys

    code = f"import sys, {imported}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018


def test_import_layerpipe_is_cheap_and_every_public_name_resolves() -> None:
    import layerpipe

    _assert_lazy_face("layerpipe", ("numpy", "scipy", "networkx", "amaranth", "torch", "yaml"), layerpipe)


def test_the_cocotb_bench_imports_nothing_heavy_and_every_hdl_name_resolves() -> None:
    """The bench is imported in every Icarus and Verilator process; `layerpipe.hdl` loads its names on first use,
    so importing the bench (a submodule, which imports the package first) pulls in none of the RTL generator."""
    pytest.importorskip("amaranth")
    pytest.importorskip("cocotb")
    import layerpipe.hdl

    _assert_lazy_face("layerpipe.hdl.cocotb_accel", ("numpy", "networkx", "amaranth", "scipy", "torch",
                                                     "layerpipe.hdl._compiler"), layerpipe.hdl)


def test_policy_option_classes_are_on_the_schedule_face() -> None:
    import layerpipe
    from layerpipe import schedule

    for name in ("LayerPipeOptions", "PipeDreamOptions", "PipeDream2BWOptions", "SyncOptions",
                 "InterleavedOptions", "ZBH1Options", "OOOOptions", "OptimalOptions"):
        assert name in schedule.__all__ and isinstance(getattr(schedule, name), type)
    net = layerpipe.load_network("mlp:8-8-4")
    model = layerpipe.make_cost_model("macs")
    bounded = layerpipe.make_schedule("layerpipe", net, 2, model, schedule.LayerPipeOptions(max_staleness=1))
    assert bounded.metrics.max_staleness <= 1


def test_py_typed_ships_with_the_package() -> None:
    import tomllib

    import layerpipe

    assert (ROOT / "layerpipe" / "py.typed").exists()
    assert __import__("pathlib").Path(layerpipe.__file__).with_name("py.typed").exists()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["layerpipe"]


@pytest.mark.slow  # the example in a fresh process and again here: ~2.7 s of CPU
def test_api_tour_example_runs_and_its_figures_agree(tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "api_tour.py"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    claimed = float(re.search(r"^layerpipe: ([\d.]+) cycles/sample", out, re.M).group(1))  # type: ignore[union-attr]
    steady = float(re.search(r"steady state ([\d.]+) cycles/iteration", out).group(1))  # type: ignore[union-attr]
    assert steady == claimed  # the simulator confirms the schedule's period on its interconnect (batch 1)
    assert "delays for stages [0, 1]: {1: 2, 2: 0}" in out  # D_l = 2·S(l) on a chain
    assert (tmp_path / "out" / "training.dot").read_text().startswith('digraph "mlp:8-8-4"')
    verilog = (tmp_path / "out" / "accel.v").read_text()
    lines = int(re.search(r"accel\.v \((\d+) lines\)", out).group(1))  # type: ignore[union-attr]
    assert verilog.count("endmodule") >= 1 and len(verilog.splitlines()) == lines

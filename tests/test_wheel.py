"""The package as a user installs it: build the wheel, install it into a fresh venv outside the checkout,
run `layerpipe compare` and `layerpipe verify` from there (issue 13, items 5 and 8).

No network: the wheel is built without build isolation (setuptools is pinned in requirements.txt) and
installed with `--no-deps --no-index`; its dependencies come from this interpreter's site-packages,
added to the fresh venv by a `.pth` path line. A path line puts the folder on sys.path without running
the `.pth` files inside it, so the checkout's editable-install finder stays off and `import layerpipe`
can only find the wheel's copy — the test checks that it does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]  # one worker builds the venv


def _tracked_files() -> list[str]:
    # tracked and untracked-but-not-ignored: the working tree as `pip wheel .` would see it, minus build debris
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip("not a git checkout: the wheel test builds from the checkout's files")
    return [f for f in proc.stdout.split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv outside the checkout with only the wheel installed (dependencies from this interpreter)."""
    work = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the working tree's files: setuptools writes build/ and *.egg-info next to
    # the sources, which must not land in a checkout other runs share.
    src = work / "src"
    for name in _tracked_files():
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest)
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(dist)], check=True, timeout=600)
    (wheel,) = dist.glob("layerpipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("layerpipe/py.typed", "layerpipe/retiming/__init__.py", "layerpipe/sim/__init__.py",
                   "layerpipe/hdl/__init__.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith("tests/")], "the test folder must not ship"

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "_layerpipe_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, timeout=600)
    return venv


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("AMARANTH_USE_YOSYS", "builtin")
    return env


def test_the_wheel_is_what_runs(wheel_venv: Path, tmp_path: Path) -> None:
    code = "import layerpipe, layerpipe.hdl, layerpipe.sim; print(layerpipe.__file__); print(layerpipe.hdl.__file__)"
    proc = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    for path in proc.stdout.split():
        assert Path(path).is_relative_to(wheel_venv), path  # not the checkout


def test_compare_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    proc = subprocess.run([str(wheel_venv / "bin" / "layerpipe"), "compare", "mlp:8-8-4", "-n", "2"],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    policies = {line.split()[1] for line in proc.stdout.splitlines() if line[:1].isdigit()}
    assert {"layerpipe", "pipedream"} <= policies, proc.stdout


def test_verify_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    if shutil.which("iverilog") is None:
        pytest.skip("verify runs the accelerator on Icarus Verilog (setup.sh --dev installs it)")
    proc = subprocess.run([str(wheel_venv / "bin" / "layerpipe"), "verify", "mlp:5-4-3", "--policy", "layerpipe",
                           "-n", "2", "--lanes", "2", "--samples", "4", "--format", "json"],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["bit_exact"] is True and doc["cycle_exact"] is True, doc  # weights and cycle count vs the sim
    assert doc["cycles_rtl"] == doc["cycles_sim"] > 0 and doc["sim"] == "icarus"

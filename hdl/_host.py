"""The accelerator's narrow host interface (issue 16 item 3): one stream port and a small CSR bus.

Top-level ports (with the default `HostConfig`: 8-bit stream, 4-bit CSR data):

- `stream_in`  (`stream_in__valid`, `__ready`, `__payload`): AXI4-Stream-style beats of `stream_bits` bits
               into the accelerator. A memory word (`lanes` elements, lane 0 in the low bits) is
               ⌈word bits / stream_bits⌉ beats, lowest bits first. In mode SAMPLES the words are the
               samples, x(t) then y(t) for t = 0, 1, …, written into the bounded sample rings (the top's
               loader, `ready` low while the ring is full: back-pressure, not an error); in mode WEIGHTS
               they go to the weight memory of PE `PE` from address `ADDR` on (auto-incremented; only while
               no run is going).
- `stream_out` (`stream_out__valid`, `__ready`, `__payload`): beats of the words that a READ command
               fetches: `COUNT` words of PE `PE`'s weight memory from `ADDR` on (`ready` may drop at any
               beat).
- `csr_addr`, `csr_we`, `csr_wdata`, `csr_rdata`: registers of `csr_bits`-bit chunks (a register wider
               than that spans consecutive addresses, lowest chunk first, see `register_map`); a write
               takes effect in its cycle, `csr_rdata` follows `csr_addr` by one cycle.

Registers: CTRL (write 1s: START begins a run, CLEAR rewinds the sample loader and clears done, error and
the cycle counter, READ starts a read-out), STATUS (BUSY, DONE, ERROR, READING), MODE, PE, ADDR, COUNT,
SAMPLES (T of the next run), CYCLES and OPS (the run's cycle and command counters), MAX_SAMPLES, DEPTH (the
sample ring's slots) and LOADED (iterations of samples taken in this run). ERROR (sticky until reset or
CLEAR) flags a beat offered past the run's T samples or in mode WEIGHTS during a run, READ during a run,
a START with SAMPLES > MAX_SAMPLES, and the top's own checks (a link queue overflow).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amaranth.hdl import Cat, Const, Module, Shape, ShapeCastable, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.errors import InputError

__all__ = ["CTRL", "MODE", "STATUS", "HostConfig", "HostInterface", "Register", "RegisterMap", "host_port_bits",
           "host_widths", "register_map"]

#: CTRL bits (write 1 to act), STATUS bits, MODE values.
CTRL = {"start": 1, "clear": 2, "read": 4}
STATUS = {"busy": 1, "done": 2, "error": 4, "reading": 8}
MODE = {"samples": 0, "weights": 1}


@dataclass(frozen=True)
class HostConfig:
    """Widths of the host interface: the stream's data bits and the CSR bus's data bits."""

    stream_bits: int = 8
    csr_bits: int = 4

    def __post_init__(self) -> None:
        for name, value, lo, hi in (("stream_bits", self.stream_bits, 1, 1024), ("csr_bits", self.csr_bits, 4, 32)):
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise InputError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")


@dataclass(frozen=True)
class Register:
    name: str
    address: int  #: of its lowest chunk
    width: int
    writable: bool

    def chunks(self, csr_bits: int) -> int:
        return -(-self.width // csr_bits)


@dataclass(frozen=True)
class RegisterMap:
    csr_bits: int
    registers: tuple[Register, ...]

    def __getitem__(self, name: str) -> Register:
        for reg in self.registers:
            if reg.name == name:
                return reg
        raise KeyError(name)

    @property
    def size(self) -> int:
        last = self.registers[-1]
        return last.address + last.chunks(self.csr_bits)

    @property
    def addr_bits(self) -> int:
        return max(1, (self.size - 1).bit_length())

    def to_json(self) -> dict[str, Any]:
        """What a host driver needs (the benches read it from the vectors file)."""
        return {"csr_bits": self.csr_bits, "addr_bits": self.addr_bits,
                "registers": {r.name: [r.address, r.width, r.writable] for r in self.registers}}


def register_map(config: HostConfig, widths: Mapping[str, int]) -> RegisterMap:
    """The CSR map: fixed order, each register `widths[name]` bits wide (CTRL, STATUS, MODE 4; CYCLES, OPS 32)."""
    layout = [("CTRL", 4, True), ("STATUS", 4, False), ("MODE", 1, True), ("PE", widths["PE"], True),
              ("ADDR", widths["ADDR"], True), ("COUNT", widths["COUNT"], True), ("SAMPLES", widths["SAMPLES"], True),
              ("CYCLES", 32, False), ("OPS", 32, False), ("MAX_SAMPLES", widths["MAX_SAMPLES"], False),
              ("DEPTH", widths["DEPTH"], False), ("LOADED", widths["LOADED"], False)]
    regs, address = [], 0
    for name, width, writable in layout:
        reg = Register(name, address, width, writable)
        regs.append(reg)
        address += reg.chunks(config.csr_bits)
    return RegisterMap(config.csr_bits, tuple(regs))


def host_widths(*, pe_bits: int, addr_bits: int, iteration_bits: int, max_samples: int,
                depth: int) -> dict[str, int]:
    """The widths of the design-dependent registers (see `register_map`)."""
    return {"PE": pe_bits, "ADDR": addr_bits, "COUNT": addr_bits + 1, "SAMPLES": iteration_bits,
            "MAX_SAMPLES": max_samples.bit_length(), "DEPTH": depth.bit_length(), "LOADED": iteration_bits}


def host_port_bits(config: HostConfig, regs: RegisterMap) -> int:
    """I/O pins of the host side (with clk and rst): two streams of `stream_bits` + valid + ready, the CSR bus."""
    return 2 + 2 * (config.stream_bits + 2) + regs.addr_bits + 1 + 2 * config.csr_bits


class HostInterface(wiring.Component):
    """The CSR registers, the stream beats ↔ memory words, and the read-out; the top wires the rest:

    to the top: `start` / `clear` pulses, `samples_count`, the weight port (`pe`, `addr`, `w_en`, `w_data`),
    a sample word (`sample_en`, `sample_data`), `misuse` (a protocol error this cycle);
    from the top: `busy`, `done`, `error`, `cycles`, `ops`, `r_data` (PE `pe`'s weight word at `addr`, the
    cycle after), `sample_ready` (the loader takes a word now), `sample_over` (the run's T are all taken),
    `loaded` (for LOADED)."""

    def __init__(self, config: HostConfig, word: ShapeCastable, *, pe_bits: int, addr_bits: int,
                 iteration_bits: int, max_samples: int, depth: int) -> None:
        self.config = config
        self.word_bits = Shape.cast(word).width
        self.beats = -(-self.word_bits // config.stream_bits)
        self.max_samples = max_samples
        self.depth = depth
        self.map = register_map(config, host_widths(pe_bits=pe_bits, addr_bits=addr_bits,
                                                    iteration_bits=iteration_bits, max_samples=max_samples,
                                                    depth=depth))
        w, c = config.stream_bits, config.csr_bits
        super().__init__({
            "stream_in": In(stream.Signature(w)),
            "stream_out": Out(stream.Signature(w)),
            "csr_addr": In(self.map.addr_bits),
            "csr_we": In(1),
            "csr_wdata": In(c),
            "csr_rdata": Out(c),
            "start": Out(1), "clear": Out(1), "samples_count": Out(iteration_bits),
            "pe": Out(pe_bits), "addr": Out(addr_bits), "w_en": Out(1), "w_data": Out(word),
            "sample_en": Out(1), "sample_data": Out(word), "misuse": Out(1),
            "busy": In(1), "done": In(1), "error": In(1), "cycles": In(32), "ops": In(32), "r_data": In(word),
            "sample_ready": In(1), "sample_over": In(1), "loaded": In(iteration_bits),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        w, c, k_beats = self.config.stream_bits, self.config.csr_bits, self.beats
        mode = Signal()
        pe = Signal.like(self.pe)
        addr = Signal.like(self.addr)
        count = Signal(len(self.addr) + 1)
        samples = Signal.like(self.samples_count)
        reading = Signal()
        m.d.comb += [self.pe.eq(pe), self.addr.eq(addr), self.samples_count.eq(samples)]

        # ---- stream in: beats → words (the first beat in the low bits) --------------------------------
        beat = Signal(range(max(2, k_beats)))
        held = Signal(max(1, (k_beats - 1) * w))  # beats 0 .. K−2 of the word being assembled
        word = Signal(self.word_bits)
        if k_beats > 1:
            m.d.comb += word.eq(Cat(held[: (k_beats - 1) * w], self.stream_in.payload))
        else:
            m.d.comb += word.eq(self.stream_in.payload)
        weights = mode == MODE["weights"]
        ready = Signal()
        m.d.comb += ready.eq(weights & ~self.busy & ~reading | ~weights & self.sample_ready)
        take = self.stream_in.valid & ready
        last_beat = beat == k_beats - 1
        m.d.comb += [self.stream_in.ready.eq(ready), self.w_data.eq(word), self.sample_data.eq(word),
                     self.w_en.eq(take & last_beat & weights), self.sample_en.eq(take & last_beat & ~weights)]
        with m.If(take):
            m.d.sync += beat.eq(0 if k_beats == 1 else beat + 1)
            if k_beats > 1:
                m.d.sync += held.eq(Cat(held[w:], self.stream_in.payload))
                with m.If(last_beat):
                    m.d.sync += beat.eq(0)
        with m.If(self.w_en):
            m.d.sync += addr.eq(addr + 1)

        # ---- stream out: COUNT words from ADDR on, each the word read the cycle after its address --------
        out_word = Signal(k_beats * w)
        out_beat = Signal(range(max(2, k_beats)))
        left = Signal.like(count)
        read_cmd = Signal()
        with m.FSM() as fsm:
            with m.State("IDLE"), m.If(read_cmd & ~self.busy & (count != 0)):
                m.d.sync += left.eq(count)
                m.next = "FETCH"
            with m.State("FETCH"):  # the address is on the memory's port this cycle
                m.next = "LOAD"
                with m.If(self.clear):
                    m.next = "IDLE"
            with m.State("LOAD"):
                m.d.sync += [out_word.eq(self.r_data), out_beat.eq(0)]
                m.next = "EMIT"
                with m.If(self.clear):
                    m.next = "IDLE"
            with m.State("EMIT"):
                m.d.comb += [self.stream_out.valid.eq(1), self.stream_out.payload.eq(out_word[:w])]
                with m.If(self.stream_out.ready):
                    m.d.sync += [out_word.eq(out_word >> w), out_beat.eq(out_beat + 1)]
                    with m.If(out_beat == k_beats - 1):
                        m.d.sync += [addr.eq(addr + 1), left.eq(left - 1)]
                        m.next = "FETCH"
                        with m.If(left == 1):
                            m.next = "IDLE"
                with m.If(self.clear):
                    m.next = "IDLE"
        m.d.comb += reading.eq(~fsm.ongoing("IDLE"))

        # ---- CSR writes (after the auto-increments above: a written ADDR wins) ------------------------
        start_cmd = Signal()
        # Such a START does not start (the rings would never fill); no check when the register cannot exceed it.
        too_many = samples > self.max_samples if self.max_samples < (1 << len(samples)) - 1 else Const(0, 1)
        m.d.comb += self.start.eq(start_cmd & ~too_many)
        targets = {"MODE": mode, "PE": pe, "ADDR": addr, "COUNT": count, "SAMPLES": samples}
        with m.If(self.csr_we), m.Switch(self.csr_addr):
            with m.Case(self.map["CTRL"].address):
                m.d.comb += [start_cmd.eq(self.csr_wdata[0]), self.clear.eq(self.csr_wdata[1]),
                             read_cmd.eq(self.csr_wdata[2])]
            for name, target in targets.items():
                reg = self.map[name]
                for k in range(reg.chunks(c)):
                    with m.Case(reg.address + k):
                        bits = min(c, reg.width - k * c)
                        m.d.sync += target[k * c: k * c + bits].eq(self.csr_wdata[:bits])
                        if name in ("MODE", "ADDR"):  # a new destination drops a partial word
                            m.d.sync += beat.eq(0)
        with m.If(self.clear):
            m.d.sync += beat.eq(0)

        # ---- CSR reads: the chunk at csr_addr, registered ----------------------------------------------
        status = Cat(self.busy, self.done, self.error, reading)
        sources = {"CTRL": 0, "STATUS": status, "MODE": mode, "PE": pe, "ADDR": addr, "COUNT": count,
                   "SAMPLES": samples, "CYCLES": self.cycles, "OPS": self.ops, "MAX_SAMPLES": self.max_samples,
                   "DEPTH": self.depth, "LOADED": self.loaded}
        with m.Switch(self.csr_addr):
            for reg in self.map.registers:
                value = sources[reg.name]
                if isinstance(value, int):
                    value = Const(value, reg.width)
                for k in range(reg.chunks(c)):
                    with m.Case(reg.address + k):
                        m.d.sync += self.csr_rdata.eq(value[k * c: min(reg.width, (k + 1) * c)])
            with m.Default():
                m.d.sync += self.csr_rdata.eq(0)

        # ---- protocol errors ------------------------------------------------------------------------------
        m.d.comb += self.misuse.eq(
            self.stream_in.valid & ~ready & (weights & self.busy | ~weights & self.sample_over)
            | read_cmd & self.busy
            | start_cmd & too_many)
        return m

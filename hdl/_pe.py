"""The processing element: local memories and an op engine that runs one command (F, A, E, G or U of one
layer) at a time with `lanes` multipliers.

Memory layout (wide words)
--------------------------
Every memory word holds `lanes` signed elements of the fixed-point format, lane 0 in the low bits. A
vector of n elements takes ⌈n/lanes⌉ consecutive words, zero-padded. A matrix W (rows × cols, row-major)
takes rows·⌈cols/lanes⌉ words: each row starts on a word boundary and its last word is zero-padded.

Memories of one PE (all `amaranth.lib.memory.Memory`, synchronous read, one cycle latency)
- weights  `weight_depth` words: the owned layers' W (and stashed versions — U writes `dst`, so a ring of
           versions needs no copies). Host port (load / read back) while the PE is idle.
- grads    `grad_depth` words: G's output, U's input.
- bank 0   `local_depth` words: everything the op engine writes (a' from F, δ from A, e_prev from E);
           read by the op engine and by `send_ports` sender read ports (the links out of the PE).
- bank k   (k = 1..len(recv_depths)) `recv_depths[k-1]` words, written only through `recv[k-1]` (a link
           receiver or the host's sample stream), read by the op engine.
Vector operands are addressed (bank, word); the compiler assigns all addresses (the memory map).

One write port per memory. Block RAM (ECP5 DP16KD, iCE40 EBR) takes one write port; yosys keeps a memory with
more in flip-flops. So a link receiver that writes weights (a received copy C_l or stash ring S_l: `wwrite`),
gradients (`gwrite`) or bank 0 (a split layer's part: `lwrite`) writes a memory of its own — `weights_in<k>`,
`grads_in<k>`, `bank0_in<k>` — as deep as the memory it extends, at the same addresses. The compiler's memory map
gives every buffer exactly one writer and never reuses a word for another buffer, so each word is written in
one of these memories only and stays zero (its initial value) in the others: a read of the address space is the
OR of all of them, with no select and no address decode on the read paths, in the same cycle as before (timing
unchanged, cycle for cycle). The host's loads of version 0 into a received copy go to that receiver's memory
(`PEConfig.weight_write_regions`, the copy rings' word ranges; its write port is the host's whenever the link
does not write, and the host loads weights only while no run is going); all other host words go to `weights`.

Commands (`command_layout(config)`; build them with `PEOp(...).as_const(config)`)
----------------------------------------------------------------------------------
    op        rows    cols    x (bank,addr)   y (bank,addr)   w        g     dst (bank 0 / grads / weights)
    FWD_*     n_out   n_in    a_{l-1}         -               W        -     a'_l or z_l      (bank 0)
    ACT_RELU  1       n       e_l             a'_l            -        -     δ_l              (bank 0)
    OUT_ERR   1       n       a_L             y (target)      -        -     δ_L = e_L        (bank 0)
    ERR       n_out   n_in    -               δ_l             W        -     e_{l-1}          (bank 0)
    GRAD      n_out   n_in    a_{l-1}         δ_l             -        -     g_l              (grads)
    UPD       n_out   n_in    -               -               W (src)  g_l   W (dst)          (weights)
`col_words` = ⌈cols/lanes⌉ and `row_words` = ⌈rows/lanes⌉ are carried precomputed (no divider in hardware).
`batch` = B samples of a micro-batch: each vector operand is B vectors one after another; F, A, E repeat
their walk per sample, G sums δ_b a_bᵀ over the samples at full width before rescaling once (the reference's
batched weight gradient), U runs once.

Timing (the `rtl` cost model): a command is accepted when `cmd.valid & cmd.ready` in cycle s; the engine
issues one beat per cycle from s+1 for rows·col_words beats (row-major; ERR walks column words outer so
its `lanes` accumulators finish one output word at a time), each beat's result is written
FRONT_STAGES + latency(lanes) cycles after its issue, `done` is high in the cycle of the last write and
`cmd.ready` rises the cycle after: the op occupies exactly B·rows·⌈cols/lanes⌉ + op_overhead(lanes) cycles
(U: B = 1), and everything it wrote is readable from then on. Host accesses to the weight memory are only
served while the PE is idle (`cmd.ready`).

Pipeline of a beat (every stage ends in a register, for the FPGA's clock): S0 the loop counters give the
addresses → address registers; S1 the memories read (block RAM: no output register of its own) → read-data
registers; S2 = the datapath's D0 (bank and operand muxes) … its D+3 (`hdl/_datapath.py`) → the result
registers, written in the next cycle. op_overhead(lanes) = 1 (accept) + FRONT_STAGES (3) + latency(lanes)
= 10 cycles up to 4 lanes (11 up to 16, 12 up to 64, 13 up to 256).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from amaranth.hdl import Cat, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from layerpipe._rtl_costs import FRONT_STAGES, MAX_BATCH, MAX_LANES, op_cycles, op_overhead
from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat, check_lr_shift
from layerpipe.hdl._conv import Window
from layerpipe.hdl._datapath import Datapath, Opcode, word_layout

__all__ = [
    "FRONT_STAGES", "MAX_BATCH", "MAX_DEPTH", "MAX_DIM", "MAX_LANES", "PEConfig", "PEOp", "ProcessingElement",
    "VectorAddr", "command_layout", "op_cycles", "op_overhead", "pack_matrix", "pack_vector", "unpack_matrix",
    "unpack_vector",
]

MAX_DIM = 65535  #: largest rows / cols of one op, in elements
MAX_DEPTH = 1 << 20  #: largest memory, in words


def _bits(count: int) -> int:
    """Bits of an unsigned field holding 0..count-1 (at least 1)."""
    return max(1, (count - 1).bit_length())


def _check_int(name: str, value: object, lo: int, hi: int, unit: str = "") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        suffix = f" {unit}" if unit else ""
        raise InputError(f"{name} must be an integer in {lo}..{hi}{suffix}, got {value!r}")
    return value


@dataclass(frozen=True)
class PEConfig:
    """Generation parameters of one PE. Depths are in words of `lanes` elements."""

    lanes: int = 4  #: multipliers, and elements per memory word
    fmt: FixedFormat = DEFAULT_FORMAT  #: element format (total and fraction bits)
    lr_shift: int = 4  #: learning rate 2^-lr_shift, applied by UPD
    weight_depth: int = 1024  #: weight memory (all owned W_l and their versions)
    grad_depth: int = 1024  #: gradient memory (G's output, U's input)
    local_depth: int = 256  #: bank 0: every vector the op engine writes
    recv_depths: tuple[int, ...] = (256,)  #: banks 1..: one per receive port (links in, sample stream)
    send_ports: int = 1  #: read ports of bank 0 for link senders
    #: further sender read ports, by memory: "bank<k>" (a receive bank passed on), "weights", "grads"
    extra_reads: tuple[str, ...] = ()
    #: link receivers writing weight copies (C_l, S_l): each its own memory beside `weights` (see "One write
    #: port per memory" above)
    weight_writes: int = 0
    #: per `weight_writes` port, the (first, end) word ranges it owns in the weights address space: the host's
    #: loads there (version 0 of a received copy) go to that port's memory, all others to `weights`
    weight_write_regions: tuple[tuple[tuple[int, int], ...], ...] = ()
    grad_writes: int = 0  #: link receivers writing gradients (g from another PE), each its own memory
    #: link receivers writing bank 0, each its own memory: a split layer's parts computed elsewhere, written into
    #: the concatenation the consumer reads (`hdl/_split.py`), beside the parts the op engine writes
    local_writes: int = 0
    #: ACT_RELU may add other banks' x words to its x operand (`x_sum`, a bank mask): the errors of a split
    #: layer's parts, summed at full width and saturated once (`hdl/_split.py`); the banks read in parallel
    sum_banks: bool = False
    #: per-sample strides of the vector operands come from the command (`x_stride`, `y_stride`, `d_stride`, in
    #: words) instead of the operands' lengths: a micro-batch's vectors inside a split layer's concatenation,
    #: each sample's parts side by side (`hdl/_split.py`)
    strided: bool = False
    max_dim: int = 1024  #: largest rows / cols of an op; sets counter and accumulator widths
    #: geometries of the window ops (conv2d, pooling, flatten: `hdl/_window.py`) the PE runs; a window command
    #: names its row (`geom`). Empty: no window engine, and the command has no window fields.
    windows: tuple[Window, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.lanes, int) and not isinstance(self.lanes, bool) and self.lanes < 1:
            raise InputError(f"lanes must be >= 1, got {self.lanes}")
        _check_int("lanes", self.lanes, 1, MAX_LANES)
        if not isinstance(self.fmt, FixedFormat):
            raise InputError(f"fmt must be a FixedFormat, got {self.fmt!r}")
        check_lr_shift(self.lr_shift)
        for name in ("weight_depth", "grad_depth", "local_depth"):
            _check_int(name, getattr(self, name), 1, MAX_DEPTH, "words")
        if not isinstance(self.recv_depths, tuple):
            raise InputError(f"recv_depths must be a tuple of word counts, got {self.recv_depths!r}")
        for k, depth in enumerate(self.recv_depths):
            _check_int(f"recv_depths[{k}]", depth, 1, MAX_DEPTH, "words")
        _check_int("send_ports", self.send_ports, 0, 64)
        if not isinstance(self.extra_reads, tuple):
            raise InputError(f"extra_reads must be a tuple of memory names, got {self.extra_reads!r}")
        for k, target in enumerate(self.extra_reads):
            banks = [f"bank{b}" for b in range(1 + len(self.recv_depths))]
            if target not in (*banks, "weights", "grads"):
                raise InputError(f"extra_reads[{k}] must be one of {', '.join((*banks, 'weights', 'grads'))}, "
                                 f"got {target!r}")
        _check_int("weight_writes", self.weight_writes, 0, 64)
        regions = self.weight_write_regions
        if not isinstance(regions, tuple) or len(regions) not in (0, self.weight_writes) or not all(
                isinstance(r, tuple) and all(isinstance(a, tuple) and len(a) == 2 and 0 <= a[0] <= a[1]
                                             <= self.weight_depth for a in r) for r in regions):
            raise InputError(f"weight_write_regions must give each of the {self.weight_writes} weight write ports "
                             f"its (first, end) word ranges within 0..{self.weight_depth}, got {regions!r}")
        _check_int("grad_writes", self.grad_writes, 0, 64)
        _check_int("local_writes", self.local_writes, 0, 64)
        _check_int("max_dim", self.max_dim, 1, MAX_DIM, "elements")
        if self.windows:
            from layerpipe.hdl._window import check_window_lanes

            check_window_lanes(self.lanes)

    # -- derived widths --------------------------------------------------------------------------------

    @property
    def banks(self) -> int:
        """Vector banks: bank 0 (local) and one per receive port."""
        return 1 + len(self.recv_depths)

    @property
    def bank_depths(self) -> tuple[int, ...]:
        return (self.local_depth, *self.recv_depths)

    @property
    def vector_addr_bits(self) -> int:
        return _bits(max(self.bank_depths))

    @property
    def weight_addr_bits(self) -> int:
        return _bits(self.weight_depth)

    @property
    def grad_addr_bits(self) -> int:
        return _bits(self.grad_depth)

    @property
    def max_col_words(self) -> int:
        return math.ceil(self.max_dim / self.lanes)

    @property
    def acc_bits(self) -> int:
        """Accumulator width: exact for max_dim products of two n-bit values; capped at the spec's int64."""
        return min(64, 2 * self.fmt.total_bits + self.max_dim.bit_length())

    @property
    def word(self) -> data.ArrayLayout:
        return word_layout(self.lanes, self.fmt)


class VectorAddr(NamedTuple):
    """A vector operand's place: bank 0 = local, bank k = receive port k-1; addr in words."""

    bank: int = 0
    addr: int = 0


_LOCAL = VectorAddr(0, 0)


def vector_addr_layout(config: PEConfig) -> data.StructLayout:
    return data.StructLayout({"addr": unsigned(config.vector_addr_bits), "bank": unsigned(_bits(config.banks))})


def command_layout(config: PEConfig) -> data.StructLayout:
    """The command the PE executes (fields pack low bits first, in this order)."""
    dim = unsigned(config.max_dim.bit_length())
    return data.StructLayout({
        "op": Opcode,
        "rows": dim,
        "cols": dim,
        "col_words": unsigned(config.max_col_words.bit_length()),
        "row_words": unsigned(config.max_col_words.bit_length()),  # ⌈rows/lanes⌉: a row-length vector
        "batch": unsigned(MAX_BATCH.bit_length()),
        "x": vector_addr_layout(config),
        "y": vector_addr_layout(config),
        "w": unsigned(config.weight_addr_bits),
        "g": unsigned(config.grad_addr_bits),
        "dst": unsigned(max(config.vector_addr_bits, config.weight_addr_bits, config.grad_addr_bits)),
        # Banks whose word at x's address is added to x's (a split layer's partial errors): only when enabled.
        **({"x_sum": unsigned(config.banks)} if config.sum_banks else {}),
        **({f"{k}_stride": unsigned(config.vector_addr_bits) for k in "xyd"} if config.strided else {}),
        # A window op (the engine of `hdl/_window.py`) and its geometry; only on a PE that has window ops.
        **({"window": unsigned(1), "geom": unsigned(_bits(len(config.windows)))} if config.windows else {}),
    })


_VECTOR_OPS = (Opcode.ACT_RELU, Opcode.OUT_ERR)


@dataclass(frozen=True)
class PEOp:
    """One command in Python form, checked against a `PEConfig`'s limits; see the module docstring."""

    op: Opcode
    rows: int
    cols: int
    x: VectorAddr = _LOCAL
    y: VectorAddr = _LOCAL
    w: int = 0
    g: int = 0
    dst: int = 0
    batch: int = 1  #: samples of the micro-batch (vectors one after another); U runs once whatever it is
    x_sum: int = 0  #: ACT_RELU: mask of further banks whose words at x's address add into x (`PEConfig.sum_banks`)

    def col_words(self, lanes: int) -> int:
        return math.ceil(self.cols / lanes)

    @property
    def samples(self) -> int:
        return 1 if self.op == Opcode.UPD else self.batch

    def beats(self, lanes: int) -> int:
        return self.samples * self.rows * self.col_words(lanes)

    def cycles(self, lanes: int) -> int:
        return op_cycles(self.rows, self.cols, lanes, self.samples)

    def check(self, config: PEConfig) -> None:
        """Raise InputError naming the limit when the op does not fit the PE's formats or memories."""
        name = self.op.name
        _check_int(f"{name} rows", self.rows, 1, config.max_dim, f"elements (max_dim {config.max_dim})")
        _check_int(f"{name} cols", self.cols, 1, config.max_dim, f"elements (max_dim {config.max_dim})")
        if self.op in _VECTOR_OPS and self.rows != 1:
            raise InputError(f"{name} works on a vector: rows must be 1 (cols = its length), got rows={self.rows}")
        _check_int(f"{name} batch", self.batch, 1, MAX_BATCH, "samples")
        lanes, b = config.lanes, self.samples
        cw, rw = self.col_words(lanes), math.ceil(self.rows / lanes)
        matrix_words = self.rows * cw
        out_words = {Opcode.FWD_LINEAR: b * rw, Opcode.FWD_RELU: b * rw, Opcode.ACT_RELU: b * cw,
                     Opcode.OUT_ERR: b * cw, Opcode.ERR: b * cw}
        reads: list[tuple[str, VectorAddr, int]] = []
        if self.op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU, Opcode.GRAD, *_VECTOR_OPS):
            reads.append(("x", self.x, b * cw))
        if self.op in _VECTOR_OPS:
            reads.append(("y", self.y, b * cw))
        if self.op in (Opcode.ERR, Opcode.GRAD):
            reads.append(("y", self.y, b * rw))
        for field, where, words in reads:
            if not 0 <= where.bank < config.banks:
                raise InputError(f"{name} {field}.bank must be in 0..{config.banks - 1}, got {where.bank}")
            _check_range(f"{name} {field} (bank {where.bank})", where.addr, words, config.bank_depths[where.bank])
        if self.op in (Opcode.FWD_LINEAR, Opcode.FWD_RELU, Opcode.ERR, Opcode.UPD):
            _check_range(f"{name} w (weights)", self.w, matrix_words, config.weight_depth)
        if self.op == Opcode.UPD:
            _check_range(f"{name} g (grads)", self.g, matrix_words, config.grad_depth)
            _check_range(f"{name} dst (weights)", self.dst, matrix_words, config.weight_depth)
            # Word k is read at beat k and written cycles later: a shifted overlap would read new values.
            if self.dst != self.w and abs(self.dst - self.w) < matrix_words:
                raise InputError(f"{name} dst (weights) words {self.dst}..{self.dst + matrix_words - 1} overlap its "
                                 f"source words {self.w}..{self.w + matrix_words - 1}: update in place or into a "
                                 "disjoint version")
        elif self.op == Opcode.GRAD:
            _check_range(f"{name} dst (grads)", self.dst, matrix_words, config.grad_depth)
        else:
            _check_range(f"{name} dst (bank 0)", self.dst, out_words[self.op], config.local_depth)

    def fields(self, config: PEConfig) -> dict[str, object]:
        """The command as a dict of `command_layout(config)` fields (after `check`)."""
        self.check(config)
        fields: dict[str, object] = {
            "op": self.op, "rows": self.rows, "cols": self.cols, "col_words": self.col_words(config.lanes),
            "row_words": math.ceil(self.rows / config.lanes), "batch": self.batch,
            "x": {"bank": self.x.bank, "addr": self.x.addr}, "y": {"bank": self.y.bank, "addr": self.y.addr},
            "w": self.w, "g": self.g, "dst": self.dst}
        if self.x_sum:
            if not config.sum_banks or self.op != Opcode.ACT_RELU or self.x_sum >> config.banks:
                raise InputError(f"{self.op.name} x_sum {self.x_sum:#x}: only ACT_RELU sums banks, on a PE with "
                                 f"sum_banks (banks 0..{config.banks - 1})")
            fields["x_sum"] = self.x_sum
        return fields

    def as_const(self, config: PEConfig) -> data.Const:
        return command_layout(config).const(self.fields(config))

    def encode(self, config: PEConfig) -> int:
        """The command's bits as an integer (for a microcode ROM's init or a cocotb bench)."""
        return self.as_const(config).as_bits()


def _check_range(what: str, base: int, words: int, depth: int) -> None:
    if not isinstance(base, int) or base < 0 or base + words > depth:
        raise InputError(f"{what}: words {base}..{base + words - 1} exceed the memory of {depth} words")


# -- the wide-word layout in Python (loading weights and samples, reading results) --------------------------


def pack_vector(values: Sequence[int], lanes: int, bits: int) -> list[int]:
    """A vector as ⌈n/lanes⌉ words (ints), lane 0 in the low bits, the last word zero-padded."""
    mask = (1 << bits) - 1
    words = []
    for start in range(0, len(values), lanes):
        word = 0
        for j, value in enumerate(values[start:start + lanes]):
            word |= (int(value) & mask) << (bits * j)
        words.append(word)
    return words


def unpack_vector(words: Sequence[int], length: int, lanes: int, bits: int) -> list[int]:
    """The first `length` elements of packed words, as signed ints."""
    out = []
    for index in range(length):
        raw = (words[index // lanes] >> (bits * (index % lanes))) & ((1 << bits) - 1)
        out.append(raw - (1 << bits) if raw >> (bits - 1) else raw)
    return out


def pack_matrix(rows: Sequence[Sequence[int]], lanes: int, bits: int) -> list[int]:
    """A row-major matrix: each row starts a word and is zero-padded to ⌈cols/lanes⌉ words."""
    return [word for row in rows for word in pack_vector(row, lanes, bits)]


def unpack_matrix(words: Sequence[int], rows: int, cols: int, lanes: int, bits: int) -> list[list[int]]:
    per_row = math.ceil(cols / lanes)
    return [unpack_vector(words[r * per_row:(r + 1) * per_row], cols, lanes, bits) for r in range(rows)]


def read_port_signature(addr_bits: int, word: data.ArrayLayout) -> wiring.Signature:
    """A synchronous read port seen from its user: data is valid the cycle after addr/en."""
    return wiring.Signature({"addr": Out(addr_bits), "en": Out(1), "data": In(word)})


def write_port_signature(addr_bits: int, word: data.ArrayLayout) -> wiring.Signature:
    return wiring.Signature({"addr": Out(addr_bits), "en": Out(1), "data": Out(word)})


def host_port_signature(addr_bits: int, word: data.ArrayLayout) -> wiring.Signature:
    """Weight memory access for the host (load before a run, read back after): r_data follows addr by a cycle."""
    return wiring.Signature({"addr": Out(addr_bits), "w_en": Out(1), "w_data": Out(word), "r_data": In(word)})


class ProcessingElement(wiring.Component):
    """One PE: memories + op engine. Ports (directions as seen from the PE):

    - `cmd`   In(stream of `command_layout(config)`): ready while idle; a transfer starts the op.
    - `done`  Out(1): high in the op's last cycle (its last write); `cmd.ready` rises the cycle after.
    - `host`  In(host port): weight memory load / read back, served while idle.
    - `recv`  In(write port) × len(recv_depths): writes into bank k+1 (link receivers, sample stream).
    - `send`  In(read port) × (send_ports + len(extra_reads)): reads for link senders, data the cycle after
              addr/en: bank 0 for the first `send_ports`, then the memories `extra_reads` names.
    - `wwrite`, `gwrite`  In(write port) × weight_writes / grad_writes: link receivers writing weight copies
              and gradients (disjoint regions from the op engine's: the compiler's memory map).
    - `lwrite`  In(write port) × local_writes: link receivers writing bank 0 (a split layer's parts from
              other PEs into the concatenation; words the op engine does not write).
    """

    def __init__(self, config: PEConfig) -> None:
        self.config = config
        word = config.word
        members: dict[str, object] = {
            "cmd": In(stream.Signature(command_layout(config))),
            "done": Out(1),
            "host": In(host_port_signature(config.weight_addr_bits, word)),
        }
        if config.recv_depths:
            members["recv"] = In(write_port_signature(config.vector_addr_bits, word)).array(len(config.recv_depths))
        reads = config.send_ports + len(config.extra_reads)
        if reads:
            abits = max(config.vector_addr_bits, config.weight_addr_bits, config.grad_addr_bits)
            members["send"] = In(read_port_signature(abits, word)).array(reads)
        if config.weight_writes:
            members["wwrite"] = In(write_port_signature(config.weight_addr_bits, word)).array(config.weight_writes)
        if config.grad_writes:
            members["gwrite"] = In(write_port_signature(config.grad_addr_bits, word)).array(config.grad_writes)
        if config.local_writes:
            members["lwrite"] = In(write_port_signature(config.vector_addr_bits, word)).array(config.local_writes)
        super().__init__(members)
        self.weights = Memory(shape=word, depth=config.weight_depth, init=[])
        self.grads = Memory(shape=word, depth=config.grad_depth, init=[])
        self.banks = [Memory(shape=word, depth=depth, init=[]) for depth in config.bank_depths]
        # One memory per link receiver that writes weights, gradients or bank 0, as deep as the memory it
        # extends (same addresses): each memory then has one write port, which block RAM needs.
        self.weight_copies = [Memory(shape=word, depth=config.weight_depth, init=[])
                              for _ in range(config.weight_writes)]
        self.grad_copies = [Memory(shape=word, depth=config.grad_depth, init=[]) for _ in range(config.grad_writes)]
        self.local_copies = [Memory(shape=word, depth=config.local_depth, init=[])
                             for _ in range(config.local_writes)]

    def memory_groups(self) -> dict[str, list[Memory]]:
        """Each memory the op engine and the senders address, as the memories that hold its words: the first
        written by the op engine (and the host), each further one by one link receiver."""
        groups = {f"bank{k}": [bank] for k, bank in enumerate(self.banks)}
        groups["bank0"] += self.local_copies
        groups.update(weights=[self.weights, *self.weight_copies], grads=[self.grads, *self.grad_copies])
        return groups

    def elaborate(self, platform: object) -> Module:
        m = Module()
        cfg = self.config
        lanes = cfg.lanes
        m.submodules.weights = self.weights
        m.submodules.grads = self.grads
        for k, bank in enumerate(self.banks):
            m.submodules[f"bank{k}"] = bank
        for prefix, copies in (("weights_in", self.weight_copies), ("grads_in", self.grad_copies),
                               ("bank0_in", self.local_copies)):
            for k, memory in enumerate(copies):
                m.submodules[f"{prefix}{k}"] = memory
        groups = self.memory_groups()
        m.submodules.datapath = dp = Datapath(lanes, cfg.fmt, cfg.lr_shift, cfg.acc_bits)

        # ---- accept a command ------------------------------------------------------------------------
        cmd = Signal(command_layout(cfg))  # the op being issued
        busy = Signal()  # from accept to the last write
        issuing = Signal()  # S0 has a beat this cycle
        m.d.comb += self.cmd.ready.eq(~busy)

        # Loop counters of S0. Row-major walk: col (word of the row) inner, row outer; ERR swaps them. A
        # micro-batch of `batch` samples (vectors stored one after another, each ⌈n/lanes⌉ words) repeats the
        # walk per sample (sample outermost) for F, A, E; G accumulates over the samples (sample innermost, one
        # gradient word per (row, col)); U ignores the batch.
        row = Signal(range(cfg.max_dim + 1))
        row_lane = Signal(range(lanes))  # row % lanes: lane of element `row` in a vector
        row_word = Signal(cfg.vector_addr_bits)  # row // lanes: word of element `row` in a vector
        col = Signal(range(cfg.max_col_words + 1))
        col_elem = Signal(range(cfg.max_col_words * lanes + 1))  # col · lanes: first element of the word
        lin = Signal(range(max(cfg.weight_depth, cfg.grad_depth) + 1))  # word in the matrix
        w_col = Signal(cfg.weight_addr_bits)  # ERR: address of word `col` of row 0
        w_err = Signal(cfg.weight_addr_bits)  # ERR: address of word `col` of row `row`
        sample = Signal(range(MAX_BATCH + 1))  # sample of the micro-batch
        x_off = Signal(cfg.vector_addr_bits)  # sample · x stride (words)
        y_off = Signal(cfg.vector_addr_bits)
        d_off = Signal(cfg.vector_addr_bits)

        # While idle the command and the loop counters are loaded every cycle (the payload of a command that is
        # not offered is loaded and then ignored): only `busy` and `issuing` depend on `cmd.valid`, so the
        # sequencer's issue decision drives two flip-flops, not the whole command register.
        engine = None
        if cfg.windows:  # the window engine takes window commands; the matrix walk does not issue for them
            from layerpipe.hdl._window import WindowEngine

            abits = max(cfg.vector_addr_bits, cfg.weight_addr_bits, cfg.grad_addr_bits)
            m.submodules.window = engine = WindowEngine(cfg.windows, lanes, cfg.fmt, cfg.banks, cfg.vector_addr_bits,
                                                        cfg.weight_addr_bits, abits)
            payload = self.cmd.payload
            m.d.comb += [engine.start.eq(~busy & self.cmd.valid & payload.window), engine.geom.eq(payload.geom),
                         engine.x_base.eq(payload.x.addr), engine.y_base.eq(payload.y.addr),
                         engine.x_bank.eq(payload.x.bank), engine.y_bank.eq(payload.y.bank),
                         engine.w_base.eq(payload.w), engine.dst.eq(payload.dst)]
        walk = self.cmd.valid & ~self.cmd.payload.window if cfg.windows else self.cmd.valid
        with m.If(~busy):
            payload = self.cmd.payload
            m.d.sync += [cmd.eq(payload), busy.eq(self.cmd.valid), issuing.eq(walk), row.eq(0),
                         row_lane.eq(0), row_word.eq(0), col.eq(0), col_elem.eq(0), lin.eq(0), w_col.eq(payload.w),
                         w_err.eq(payload.w), sample.eq(0), x_off.eq(0), y_off.eq(0), d_off.eq(0)]

        is_err = cmd.op == Opcode.ERR
        is_fwd = (cmd.op == Opcode.FWD_LINEAR) | (cmd.op == Opcode.FWD_RELU)
        is_grad = cmd.op == Opcode.GRAD
        last_col = col == cmd.col_words - 1
        last_row = row == cmd.rows - 1
        last_sample = (sample == cmd.batch - 1) | (cmd.op == Opcode.UPD)
        walk_done = last_col & last_row  # the (row, col) walk of one sample (G: of the matrix)
        final = walk_done & last_sample
        # Per-sample strides (words): vectors of `cols` elements take col_words, of `rows` elements row_words.
        x_stride = cmd.col_words
        y_stride = Mux(is_err | is_grad, cmd.row_words, cmd.col_words)
        d_stride = Mux(is_fwd, cmd.row_words, cmd.col_words)
        if cfg.strided:  # a micro-batch inside a concatenation: the compiler's strides
            x_stride, y_stride, d_stride = cmd.x_stride, cmd.y_stride, cmd.d_stride

        def next_row() -> list:
            wrap = row_lane == lanes - 1
            return [row.eq(row + 1), row_lane.eq(Mux(wrap, 0, row_lane + 1)), row_word.eq(row_word + wrap)]

        def restart_rows() -> list:
            return [row.eq(0), row_lane.eq(0), row_word.eq(0)]

        def next_col() -> list:
            return [col.eq(col + 1), col_elem.eq(col_elem + lanes)]

        def advance_walk() -> None:
            """The next (row, col) beat of the walk (ERR: column words outer)."""
            with m.If(is_err):
                with m.If(last_row):
                    m.d.sync += [*restart_rows(), *next_col(), w_col.eq(w_col + 1), w_err.eq(w_col + 1)]
                with m.Else():
                    m.d.sync += [*next_row(), w_err.eq(w_err + cmd.col_words)]
            with m.Elif(last_col):
                m.d.sync += [*next_row(), col.eq(0), col_elem.eq(0)]
            with m.Else():
                m.d.sync += next_col()

        with m.If(issuing):
            with m.If(final):
                m.d.sync += issuing.eq(0)
            with m.Elif(is_grad):
                # G: the samples of one (row, col) word back to back, accumulated in the datapath.
                with m.If(last_sample):
                    m.d.sync += [sample.eq(0), x_off.eq(0), y_off.eq(0), lin.eq(lin + 1)]
                    advance_walk()
                with m.Else():
                    m.d.sync += [sample.eq(sample + 1), x_off.eq(x_off + x_stride), y_off.eq(y_off + y_stride)]
            with m.Elif(walk_done):
                # F, A, E: the next sample's walk (the same matrix, the next vectors).
                m.d.sync += [*restart_rows(), col.eq(0), col_elem.eq(0), lin.eq(0), w_col.eq(cmd.w),
                             w_err.eq(cmd.w), sample.eq(sample + 1), x_off.eq(x_off + x_stride),
                             y_off.eq(y_off + y_stride), d_off.eq(d_off + d_stride)]
            with m.Else():
                m.d.sync += lin.eq(lin + 1)
                advance_walk()

        # ---- S0: addresses and the beat's control, registered (stage A) --------------------------------
        per_row_y = is_err | is_grad  # Y holds δ, one element per row
        x_addr = cmd.x.addr + x_off + col
        y_addr = cmd.y.addr + y_off + Mux(per_row_y, row_word, col)
        w_addr = Mux(is_err, w_err, cmd.w + lin)
        g_addr = cmd.g + lin
        dst_addr = Signal(len(cmd.dst))
        with m.Switch(cmd.op):
            with m.Case(Opcode.FWD_LINEAR, Opcode.FWD_RELU):
                m.d.comb += dst_addr.eq(cmd.dst + d_off + row_word)
            with m.Case(Opcode.ACT_RELU, Opcode.OUT_ERR, Opcode.ERR):
                m.d.comb += dst_addr.eq(cmd.dst + d_off + col)
            with m.Default():
                m.d.comb += dst_addr.eq(cmd.dst + lin)
        mask = Signal(lanes)
        m.d.comb += mask.eq(Cat(col_elem + j < cmd.cols for j in range(lanes)))

        tag_layout = data.StructLayout({
            "valid": 1, "op": Opcode, "first": 1, "last": 1, "emit": 1, "lane": range(lanes), "mask": lanes,
            "x_bank": len(cmd.x.bank), "y_bank": len(cmd.y.bank), "dst": len(cmd.dst), "final": 1,
            **({"x_sum": cfg.banks} if cfg.sum_banks else {})})
        s1 = Signal(tag_layout, name="tag1")
        m.d.sync += [
            s1.valid.eq(issuing), s1.op.eq(cmd.op), s1.lane.eq(row_lane), s1.mask.eq(mask),
            s1.first.eq(Mux(is_fwd, col == 0, Mux(is_err, row == 0, Mux(is_grad, sample == 0, 1)))),
            s1.last.eq(Mux(is_fwd, last_col, Mux(is_err, last_row, Mux(is_grad, last_sample, 1)))),
            s1.emit.eq(Mux(is_fwd, last_col & ((row_lane == lanes - 1) | last_row),
                           Mux(is_err, last_row, Mux(is_grad, last_sample, 1)))),
            s1.x_bank.eq(cmd.x.bank), s1.y_bank.eq(cmd.y.bank), s1.dst.eq(dst_addr), s1.final.eq(final),
        ]
        if cfg.sum_banks:
            m.d.sync += s1.x_sum.eq(cmd.x_sum)
        # As wide as the memories' address ports (a one-word memory has none).
        x_addr_r = Signal(max((d - 1).bit_length() for d in cfg.bank_depths))
        y_addr_r = Signal(len(x_addr_r))
        w_addr_r = Signal((cfg.weight_depth - 1).bit_length())
        g_addr_r = Signal((cfg.grad_depth - 1).bit_length())
        if engine is not None:  # a window op's beats: the engine's addresses
            x_addr = Mux(engine.issuing, engine.x_addr, x_addr)
            y_addr = Mux(engine.issuing, engine.y_addr, y_addr)
            w_addr = Mux(engine.issuing, engine.w_addr, w_addr)
        m.d.sync += [x_addr_r.eq(x_addr), y_addr_r.eq(y_addr), w_addr_r.eq(w_addr), g_addr_r.eq(g_addr)]
        reading = s1.valid if engine is None else s1.valid | engine.beat_valid

        # ---- S1: the memories read at the registered addresses; S2: their words are registered ----------
        s2 = Signal(tag_layout, name="tag2")
        s3 = Signal(tag_layout, name="tag3")
        m.d.sync += [s2.eq(s1), s3.eq(s2)]
        x_words = []
        for k in range(cfg.banks):
            x_word, y_word = Signal(cfg.word, name=f"x_word{k}"), Signal(cfg.word, name=f"y_word{k}")
            m.d.sync += [x_word.eq(_read(m, groups[f"bank{k}"], x_addr_r, reading)),
                         y_word.eq(_read(m, groups[f"bank{k}"], y_addr_r, reading))]
            x_words.append(x_word)
            if engine is not None:
                m.d.comb += [engine.x_words[k].eq(x_word), engine.y_words[k].eq(y_word)]
            if not cfg.sum_banks:
                with m.If(s3.x_bank == k):
                    m.d.comb += dp.x.eq(x_word)
            with m.If(s3.y_bank == k):
                m.d.comb += dp.y.eq(y_word)
        if cfg.sum_banks:
            _sum_banks(m, dp.x, x_words, s3.x_bank, s3.x_sum, lanes, cfg.fmt.total_bits)
        # The host reads the weight memory while idle, its data the cycle after its address (no register).
        w_data = _read(m, groups["weights"], Mux(busy, w_addr_r, self.host.addr), 1)
        m.d.comb += self.host.r_data.eq(w_data)
        w_word, g_word = Signal(cfg.word), Signal(cfg.word)
        m.d.sync += [w_word.eq(w_data), g_word.eq(_read(m, groups["grads"], g_addr_r, s1.valid))]
        if engine is not None:
            m.d.comb += engine.w_word.eq(w_word)
        # ---- S3: the datapath's D0 ------------------------------------------------------------------
        m.d.comb += [dp.valid.eq(s3.valid), dp.op.eq(s3.op), dp.first.eq(s3.first), dp.last.eq(s3.last),
                     dp.emit.eq(s3.emit), dp.lane.eq(s3.lane), dp.mask.eq(s3.mask), dp.w.eq(w_word),
                     dp.g.eq(g_word)]

        # ---- write back (the write address and end-of-op flag travel alongside the datapath) ------------
        tag = s3
        for stage in range(dp.latency):
            delayed = Signal(tag_layout, name=f"tag{stage + 4}")
            m.d.sync += delayed.eq(tag)
            tag = delayed
        bank0_write = self.banks[0].write_port()
        grad_write = self.grads.write_port()
        weight_write = self.weights.write_port()
        for port in (bank0_write, grad_write):
            if engine is None:
                m.d.comb += [port.addr.eq(tag.dst), port.data.eq(dp.out_data)]
            else:  # the engine writes only while the matrix walk is idle (one op at a time)
                m.d.comb += [port.addr.eq(Mux(engine.we, engine.waddr, tag.dst)),
                             port.data.eq(Mux(engine.we, engine.wdata, dp.out_data))]
        m.d.comb += [bank0_write.en.eq(dp.out_valid & (tag.op != Opcode.GRAD) & (tag.op != Opcode.UPD)),
                     grad_write.en.eq(dp.out_valid & (tag.op == Opcode.GRAD))]
        if engine is not None:
            m.d.comb += [bank0_write.en.eq(engine.we & ~engine.w_grads),
                         grad_write.en.eq(engine.we & engine.w_grads)]
            with m.If(~engine.we):
                m.d.comb += [bank0_write.en.eq(dp.out_valid & (tag.op != Opcode.GRAD) & (tag.op != Opcode.UPD)),
                             grad_write.en.eq(dp.out_valid & (tag.op == Opcode.GRAD))]
        # The weight memory's one write port is the op engine's while busy and the host's while idle. A host
        # word in a region a link receiver owns goes to that receiver's memory instead (its write port is the
        # host's whenever the link does not write: the host loads weights only while no run is going).
        host_in = [_in_regions(self.host.addr, regions) for regions in cfg.weight_write_regions]
        host_main = self.host.w_en
        for inside in host_in:
            host_main = host_main & ~inside
        with m.If(busy):
            m.d.comb += [weight_write.addr.eq(tag.dst), weight_write.data.eq(dp.out_data),
                         weight_write.en.eq(dp.out_valid & (tag.op == Opcode.UPD))]
        with m.Else():
            m.d.comb += [weight_write.addr.eq(self.host.addr), weight_write.data.eq(self.host.w_data),
                         weight_write.en.eq(host_main)]
        done = tag.valid & tag.final
        if engine is not None:
            done = done | engine.done
        m.d.comb += self.done.eq(done)
        with m.If(done):
            m.d.sync += busy.eq(0)

        # ---- ports to the outside: receivers fill banks 1.., senders read bank 0 ----------------------
        for k, port in enumerate(getattr(self, "recv", [])):
            recv_write = self.banks[k + 1].write_port()
            m.d.comb += [recv_write.addr.eq(port.addr), recv_write.data.eq(port.data), recv_write.en.eq(port.en)]
        targets = ("bank0",) * cfg.send_ports + cfg.extra_reads
        for port, target in zip(getattr(self, "send", []), targets, strict=True):
            m.d.comb += port.data.eq(_read(m, groups[target], port.addr, port.en))
        for k, port in enumerate(getattr(self, "wwrite", [])):
            write = self.weight_copies[k].write_port()
            host = ~busy & self.host.w_en & host_in[k] if host_in else Value.cast(0)
            m.d.comb += [write.addr.eq(Mux(port.en, port.addr, self.host.addr)),
                         write.data.eq(Mux(port.en, port.data.as_value(), self.host.w_data.as_value())),
                         write.en.eq(port.en | host)]
        for ports, copies in ((getattr(self, "gwrite", []), self.grad_copies),
                              (getattr(self, "lwrite", []), self.local_copies)):
            for port, memory in zip(ports, copies, strict=True):
                write = memory.write_port()
                m.d.comb += [write.addr.eq(port.addr), write.data.eq(port.data), write.en.eq(port.en)]
        return m


def _read(m: Module, memories: Sequence[Memory], addr: Value, en: Value | int) -> Value:
    """A synchronous read of one address space held by several memories: each word is written in exactly one
    of them (the compiler's memory map gives every buffer one writer) and stays zero in the others, so the
    word is the OR of their read data — no select, no address decode on the read paths."""
    out: Value | None = None
    for memory in memories:
        port = memory.read_port()
        m.d.comb += [port.addr.eq(addr), port.en.eq(en)]
        out = port.data.as_value() if out is None else out | port.data.as_value()
    assert out is not None
    return out


def _in_regions(addr: Value, regions: Sequence[tuple[int, int]]) -> Value:
    """addr lies in one of the (first, end) word ranges."""
    inside: Value = Value.cast(0)
    for first, end in regions:
        if first < end:  # bounds the address cannot cross are left out (a constant comparison is a lint warning)
            term: Value = Value.cast(1)
            if first > 0:
                term = term & (addr >= first)
            if end < 1 << len(addr):
                term = term & (addr < end)
            inside = inside | term
    return inside


def _sum_banks(m: Module, out: data.View, words: Sequence[data.View], bank: Value, mask: Value, lanes: int,
               bits: int) -> None:
    """out = sat(x word of `bank` + Σ the x words of the banks in `mask`), lane by lane: a split layer's partial
    errors summed at full width and saturated once (the reference's sat(Σ_j e_j)); x itself when `mask` is 0."""
    from layerpipe.hdl._datapath import saturate

    wide = bits + max(1, (len(words) - 1).bit_length()) + 1
    for j in range(lanes):
        terms = [Mux((bank == k) | mask[k], word[j], 0) for k, word in enumerate(words)]
        total = Signal(signed(wide), name=f"x_sum_lane{j}")
        m.d.comb += total.eq(sum(terms[1:], terms[0]))
        m.d.comb += out[j].eq(saturate(total, bits))

"""The compiled program of an accelerator: per PE a microcode ROM (`Entry`s of `Step`s, `Send`s to other PEs) and a
memory map (`Buffer`s), with the limits one generated accelerator can hold. `layerpipe.hdl._compiler` builds it
from a periodic schedule (its docstring says how the microcode runs and how buffers are sized); the sequencer, the
link model, the top level and the Python model of the RTL read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat
from layerpipe.hdl._conv import Window
from layerpipe.hdl._pe import MAX_BATCH, MAX_DEPTH, MAX_DIM, MAX_LANES
from layerpipe.network import Network


@dataclass(frozen=True)
class HardwareLimits:
    """What one generated accelerator can hold; exceeding one is an `InputError` naming it.

    Defaults are the PE's own limits (`hdl/_pe.py`): operand dimensions, lanes, words per memory.
    """

    max_width: int = MAX_DIM
    max_lanes: int = MAX_LANES
    max_memory_words: int = MAX_DEPTH
    max_samples: int = 65536
    max_batch: int = MAX_BATCH


DEFAULT_LIMITS = HardwareLimits()


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Buffer:
    """A region of one PE memory: `depth` slots of `slot_words` words.

    Vectors: iteration t uses slot t mod depth. Weights: slot v mod depth holds version v of W_l (a ring of
    versions: U_l(t) reads version t and writes version t+1, so stashing needs no copies).
    """

    name: str  #: value it holds: x, y, a3, d3 (δ), e2, W3, g3
    memory: str  #: "local" (bank 0), "samples" or "from<p>" (receive banks), "weights", "grads"
    base: int
    slot_words: int
    depth: int
    #: A view: part of each slot of the buffer named here (a split layer's part inside the concatenation its
    #: consumer reads, `hdl/_split.py`); it takes no words of its own and its slots are `stride` words apart.
    view_of: str = ""
    stride: int = 0

    @property
    def pitch(self) -> int:
        """Words from one slot to the next."""
        return self.stride or self.slot_words

    @property
    def words(self) -> int:
        return 0 if self.view_of else self.slot_words * self.depth

    def address(self, index: int) -> int:
        return self.base + (index % self.depth) * self.pitch


@dataclass(frozen=True)
class Step:
    """One atomic operation (F, A, E, G or U) of layer `layer`: one PE command.

    Operands by kind (buffer names):
      F: x=a_{l-1} (x for layer 1), w=W_l (C_l away from the owner), dst=a_l
      A: x=e_l, y=a_l (the ReLU mask) — output layer: x=a_L, y=target — dst=δ_l
      E: y=δ_l, w=W_l / C_l (or S_l: F_l's version received under stash), dst=e_{l-1}
      G: x=a_{l-1}, y=δ_l, dst=g_l
      U: w=W_l, g=g_l, dst=W_l
    Weight versions: the op of iteration t reads slot max(0, t + version) of its ring (a version of W_l for
    W_l and C_l, iteration t for S_l); U reads version t and writes t+1.
    """

    kind: str
    layer: int
    n_in: int
    n_out: int
    relu: bool  #: hidden layer (ReLU) vs output layer (identity, loss derivative in A)
    x: str = ""
    y: str = ""
    w: str = ""
    g: str = ""
    dst: str = ""
    version: int = 0
    batch: int = 1  #: samples of the micro-batch the op walks (U: 1, once per micro-batch)
    #: A of a split layer's producer: the other parts' partial errors, added into x (same address, other banks)
    x_sum: tuple[str, ...] = ()
    #: conv2d / pooling F, E, G: the window engine's loop nest (`hdl/_conv.py`); None for the matrix walks
    window: Window | None = None
    mask: str = ""  #: max-pooling F: where it writes the argmax mask (E reads it as y)

    @property
    def rows(self) -> int:
        return 1 if self.kind == "A" else self.n_out

    @property
    def cols(self) -> int:
        return self.n_out if self.kind == "A" else self.n_in


@dataclass(frozen=True)
class Send:
    """After the producer of iteration t ends: move `elements` from buffer `src` to buffer `dst` on PE `dest`.

    The consumer is `consumer` of iteration t + `delay` (a weight copy U_l(i) → F_l(i + s + 1) has delay s + 1);
    the send is skipped when that iteration is ≥ T. The source slot is max(0, t + `src_offset`) of `src` (a
    version index for weight rings), the destination slot t + `dst_offset` of `dst`. Arrival increments
    counter `counter` of the destination PE.
    """

    dest: int
    src: str
    dst: str
    elements: int
    counter: int
    consumer: str
    delay: int = 0
    src_offset: int = 0
    dst_offset: int = 0


@dataclass(frozen=True)
class Entry:
    """One task of the periodic body: runs iteration j − lag in period j."""

    kind: str
    layer: int
    lag: int
    start: int
    steps: tuple[Step, ...]
    #: (counter, delay): arrival counter of this PE that must exceed t − delay before the entry starts
    waits: tuple[tuple[int, int], ...]
    sends: tuple[Send, ...]  #: in link-queue order (destination, then consumer program order)


@dataclass(frozen=True)
class PEProgram:
    index: int
    entries: tuple[Entry, ...]
    buffers: tuple[Buffer, ...]
    counters: tuple[str, ...]  #: incoming transfer streams, by counter index (names for the dump)
    queues: tuple[tuple[int, int], ...] = ()  #: (destination PE, link queue depth in producer ops)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def memory_words(self, memory: str) -> int:
        return sum(b.words for b in self.buffers if b.memory == memory)

    @property
    def memories(self) -> tuple[str, ...]:
        """Memories in PE order: local bank, receive banks (samples first, then by source PE), weights, grads."""
        recv = sorted({b.memory for b in self.buffers if b.memory.startswith("from")}, key=lambda m: int(m[4:]))
        samples = ("samples",) if any(b.memory == "samples" for b in self.buffers) else ()
        return ("local", *samples, *recv, "weights", "grads")

    @property
    def receive_banks(self) -> tuple[str, ...]:
        """Vector banks 1.. of the PE (bank 0 is "local")."""
        return tuple(m for m in self.memories if m == "samples" or m.startswith("from"))

    def bank(self, memory: str) -> int:
        return 0 if memory == "local" else 1 + self.receive_banks.index(memory)

    @property
    def senders(self) -> tuple[int, ...]:
        return tuple(q for q, _ in self.queues)

    def queue_depth(self, dest: int) -> int:
        return dict(self.queues)[dest]

    @property
    def max_lag(self) -> int:
        return max((e.lag for e in self.entries), default=0)


@dataclass(frozen=True)
class Program:
    """The compiled accelerator: one PE program per processor, plus the shapes every PE shares."""

    network: Network
    widths: tuple[int, ...]
    lanes: int
    max_samples: int
    period: int
    weight_mode: str
    pes: tuple[PEProgram, ...]
    fmt: FixedFormat = DEFAULT_FORMAT
    limits: HardwareLimits = field(default=DEFAULT_LIMITS, compare=False)
    #: per layer (index l − 1), the columns of W_l as stored: n_{l−1}, or a split layer's consumer's padded
    #: concatenation (`hdl/_split.py`); empty: a chain, widths[l − 1]
    cols: tuple[int, ...] = ()

    def layer_cols(self, layer: int) -> int:
        """Columns of W_layer as stored (padding included)."""
        return self.cols[layer - 1] if self.cols else self.widths[layer - 1]

    @property
    def max_dim(self) -> int:
        return max((*self.widths, *self.cols))

    @property
    def num_pes(self) -> int:
        return len(self.pes)

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    def owner(self, layer: int) -> int:
        """The PE that holds W_layer."""
        for pe in self.pes:
            if any(b.name == f"W{layer}" for b in pe.buffers):
                return pe.index
        raise KeyError(layer)

    def holder(self, value: str) -> int:
        """The PE whose sample bank holds `value` ("x" or "y")."""
        for pe in self.pes:
            if any(b.name == value and b.memory == "samples" for b in pe.buffers):
                return pe.index
        raise KeyError(value)

    def links(self) -> tuple[tuple[int, int], ...]:
        """Ordered PE pairs that carry data."""
        return tuple((pe.index, q) for pe in self.pes for q in pe.senders)

    def link_sources(self, p: int, q: int) -> tuple[str, ...]:
        """Memories of PE p that the link p→q reads from, in PE memory order."""
        src = self.pes[p]
        used = {src.buffer(s.src).memory for e in src.entries for s in e.sends if s.dest == q}
        return tuple(m for m in src.memories if m in used)

    def link_targets(self, p: int, q: int) -> tuple[str, ...]:
        """Memories of PE q that the link p→q writes into."""
        dst = self.pes[q]
        used = {dst.buffer(s.dst).memory for e in self.pes[p].entries for s in e.sends if s.dest == q}
        return tuple(m for m in dst.memories if m in used)

    def weight_copies(self, layer: int) -> tuple[tuple[int, Buffer], ...]:
        """(PE, ring) of every received copy C_layer: the host loads version 0 into each, as into W_layer."""
        return tuple((pe.index, b) for pe in self.pes for b in pe.buffers if b.name == f"C{layer}")

    def to_text(self) -> str:
        """The microcode and memory maps as text (deterministic: a pure function of the program)."""
        lines = [f"# layerpipe microcode v1 network={self.network.name} pes={self.num_pes} lanes={self.lanes} "
                 f"period={self.period} weight_mode={self.weight_mode} max_samples={self.max_samples} "
                 f"format=Q{self.fmt.total_bits - self.fmt.frac_bits}.{self.fmt.frac_bits}"]
        for pe in self.pes:
            lines.append(f"pe{pe.index}:")
            for mem in pe.memories:
                where = f" (bank {pe.bank(mem)})" if mem not in ("weights", "grads") else ""
                lines.append(f"  memory {mem}{where}: {pe.memory_words(mem)} words")
                for b in pe.buffers:
                    if b.memory == mem:
                        view = f" view of {b.view_of} stride={b.pitch}" if b.view_of else ""
                        lines.append(f"    {b.name:<4} base={b.base:<6} slot_words={b.slot_words:<5} "
                                     f"depth={b.depth}{view}")
            for i, name in enumerate(pe.counters):
                lines.append(f"  counter {i}: {name}")
            for q, depth in pe.queues:
                lines.append(f"  link pe{pe.index}->pe{q}: queue depth {depth}")
            for i, e in enumerate(pe.entries):
                waits = ",".join(f"{c}" + (f"-{d}" if d else "") for c, d in e.waits) or "-"
                lines.append(f"  {i:>3}: {e.kind}{e.layer} lag={e.lag} start={e.start} waits={waits}")
                for s in e.steps:
                    ops = " ".join(f"{k}={v}" for k, v in (("x", s.x), ("y", s.y), ("w", s.w), ("g", s.g),
                                                           ("dst", s.dst)) if v)
                    version = f" version=t{s.version:+d}" if s.w else ""
                    version += f" x+={'+'.join(s.x_sum)}" if s.x_sum else ""
                    if s.window is not None:  # the window engine's nest: op, input → output, kernel/stride/pad
                        wd = s.window
                        version += (f" {wd.op}{'.' + wd.mode if wd.mode else ''} {wd.channels}x{wd.height}x{wd.width}"
                                    f"->{wd.out_channels}x{wd.out_h}x{wd.out_w} k{wd.kernel}s{wd.stride}p{wd.padding}"
                                    f"{' mask=' + s.mask if s.mask else ''}")
                    lines.append(f"       {s.kind}{s.layer} {s.rows}x{s.cols}{f' b{s.batch}' if s.batch > 1 else ''}"
                                 f"{' relu' if s.relu and s.kind in 'FAE' else ''} "
                                 f"{ops}{version}")
                for snd in e.sends:
                    shift = f" delay={snd.delay}" if snd.delay else ""
                    shift += f" src=t{snd.src_offset:+d}" if snd.src_offset else ""
                    shift += f" dst=t{snd.dst_offset:+d}" if snd.dst_offset else ""
                    lines.append(f"       send {snd.src}->pe{snd.dest}.{snd.dst} {snd.elements} elements counter "
                                 f"{snd.counter} for {snd.consumer}{shift}")
        return "\n".join(lines) + "\n"

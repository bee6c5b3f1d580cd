"""The schedule IR shared by every policy and backend (design notes §6).

An `Op` is (processor, kind, unit, iteration): `unit` is a layer index for layer-level schedules (kinds
are DFG task kinds: F, A, E, G, U and fused groups such as AEG) or a stage index for stage-level
schedules (kinds F, B, I, W as in torch.distributed.pipelining: B = full backward, I = input gradient,
W = weight gradient). `iteration` is the iteration (async) or micro-batch (sync) number.

Two schedule forms:
- `OpSchedule`: explicit per-processor ordered op lists, no times (the simulator times them).
- `PeriodicSchedule`: period P and, per processor, a body of `Slot`s (task, lag, start). In period j the
  processor starts task v of iteration j − lag at time j·P + start. `unroll(T)` gives the explicit ops for
  iterations 0..T−1 (prologue and epilogue skip iterations < 0 or ≥ T).

Text form of an op: `KIND UNIT . ITERATION`, e.g. `F3.7`, `AEG2.0`; a schedule is one line per processor:
`p0: F1.0 F2.0 A2.0`. Slots print as `F3.7` style with the lag in place of the iteration and the start
offset after `@`: `F3-2@15` is F3, lag 2, start 15 (the iteration is j − lag).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from layerpipe.errors import InputError

KINDS_LAYER = ("F", "A", "E", "G", "U", "AE", "EG", "AG", "AEG")
KINDS_STAGE = ("F", "B", "I", "W")
LEVELS = ("layer", "stage")


@dataclass(frozen=True, order=True)
class Op:
    proc: int
    kind: str
    unit: int
    iteration: int

    def __str__(self) -> str:
        return f"{self.kind}{self.unit}.{self.iteration}"

    @property
    def key(self) -> OpKey:
        """The op without its processor: what it computes, not where."""
        return (self.kind, self.unit, self.iteration)


#: (kind, unit, iteration): an op's identity independent of placement.
OpKey = tuple[str, int, int]


class ScheduleError(InputError):
    """A schedule breaks a rule (precedence, overlap, counts, lags, staleness).

    `str(error)` is one summary line (the CLI prints it and exits 2, as for any `InputError`). The
    step × processor picture with the failing step marked is in `grid` and is also attached as an
    exception note, so tracebacks and test failures show it while the CLI stays one line.
    """

    def __init__(self, summary: str, grid: str = "", step: int | None = None, proc: int | None = None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.grid = grid
        self.step = step
        self.proc = proc
        if grid:
            self.add_note(grid)

    def __reduce__(self) -> tuple:
        # Exceptions pickle as cls(*args); ours has more than the message (dask workers send them back).
        return (type(self), (self.summary, self.grid, self.step, self.proc))


_OP_RE = re.compile(r"^([A-Z]+)(\d+)\.(\d+)$")
_SLOT_RE = re.compile(r"^([A-Z]+)(\d+)-(\d+)@(\d+)$")


def parse_op(text: str, proc: int) -> Op:
    m = _OP_RE.match(text)
    if not m:
        raise InputError(f"op '{text}' is not KIND UNIT.ITERATION like F3.7")
    return Op(proc, m.group(1), int(m.group(2)), int(m.group(3)))


@dataclass(frozen=True)
class OpSchedule:
    """Explicit per-processor ordered op lists."""

    level: str
    procs: tuple[tuple[Op, ...], ...]
    synchronous: bool = False
    microbatches: int = 0  #: micro-batches per step (synchronous schedules), 0 for asynchronous
    #: Weight reads the schedule pins, as (kind, layer, s): op (kind, layer, t) reads version t − s, so it
    #: waits for the update U_l(t − s − 1) that writes it. `PeriodicSchedule.unroll` derives them from the
    #: periodic timing, which keeps self-timed execution (simulator, RTL) within the designed staleness;
    #: hand-written schedules leave it empty and their reads are whatever is current.
    read_staleness: tuple[tuple[str, int, int], ...] = ()

    @property
    def num_procs(self) -> int:
        return len(self.procs)

    def read_staleness_map(self) -> dict[tuple[str, int], int]:
        return {(kind, layer): s for kind, layer, s in self.read_staleness}

    def ops(self) -> Iterable[Op]:
        for row in self.procs:
            yield from row

    @property
    def num_iterations(self) -> int:
        """Iterations (micro-batches for synchronous schedules) the ops cover: the largest index + 1.

        Update ops of synchronous layer-level schedules count steps, not micro-batches, so they are left out.
        """
        return 1 + max((op.iteration for op in self.ops() if not (self.synchronous and op.kind == "U")), default=-1)

    @property
    def num_steps(self) -> int:
        """Synchronous steps of `microbatches` micro-batches each (1 for asynchronous schedules)."""
        if not self.synchronous or self.microbatches < 1:
            return 1
        return max(1, -(-self.num_iterations // self.microbatches))

    def placement(self) -> dict[int, int]:
        """unit (layer or stage) → processor of its forward op, for the units that have one."""
        return {op.unit: op.proc for op in self.ops() if op.kind == "F"}

    def to_text(self) -> str:
        head = f"# layerpipe schedule v1 level={self.level} procs={self.num_procs}"
        if self.synchronous:
            head += f" synchronous microbatches={self.microbatches}"
        if self.read_staleness:
            head += " reads=" + ",".join(f"{k}{layer}:{s}" for k, layer, s in self.read_staleness)
        lines = [head]
        for p, row in enumerate(self.procs):
            lines.append(f"p{p}: " + " ".join(str(op) for op in row))
        return "\n".join(lines) + "\n"

    @staticmethod
    def from_text(text: str) -> OpSchedule:
        level, sync, m = "layer", False, 0
        reads: list[tuple[str, int, int]] = []
        header, lines = _split_text(text, "schedule")
        for n, word in header:
            if word.startswith("level="):
                level = word.split("=", 1)[1]
            elif word == "synchronous":
                sync = True
            elif word.startswith("microbatches="):
                m = _header_int(word, n)
            elif word.startswith("reads="):
                reads = parse_reads(word, n)
        rows: list[tuple[Op, ...]] = []
        for n, tokens in lines:
            try:
                rows.append(tuple(parse_op(tok, len(rows)) for tok in tokens))
            except InputError as exc:
                raise InputError(f"schedule line {n}: {exc}") from None
        if level not in LEVELS:
            raise InputError(f"schedule header: level '{level}' is not one of {', '.join(LEVELS)}")
        kinds = KINDS_STAGE if level == "stage" else KINDS_LAYER
        for row in rows:
            for op in row:
                if op.kind not in kinds:
                    allowed = ", ".join(kinds)
                    raise InputError(f"schedule p{op.proc}: op '{op}' kind is not a {level}-level kind ({allowed})")
        return OpSchedule(level, tuple(rows), sync, m, tuple(reads))


def _split_text(text: str, what: str) -> tuple[list[tuple[int, str]], list[tuple[int, list[str]]]]:
    """The text forms' shared layout: `#` header lines of words, then one `pN: tok tok ...` line per processor
    in order. Returns (line, header word) pairs and (line, tokens) per processor."""
    header: list[tuple[int, str]] = []
    rows: list[tuple[int, list[str]]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            header.extend((n, word) for word in line.split())
            continue
        name, _, body = line.partition(":")
        if name != f"p{len(rows)}":
            raise InputError(f"{what} line {n}: expected 'p{len(rows)}:', got '{name}:'")
        rows.append((n, body.split()))
    return header, rows


_READ_RE = re.compile(r"^([A-Z]+)(\d+):(-?\d+)$")


def parse_reads(word: str, line: int) -> list[tuple[str, int, int]]:
    out = []
    for item in word.split("=", 1)[1].split(","):
        m = _READ_RE.match(item)
        if not m:
            raise InputError(f"schedule line {line}: field 'reads' entry '{item}' is not KIND LAYER:STALENESS "
                             "like F3:2")
        out.append((m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def _header_int(word: str, line: int) -> int:
    key, _, value = word.partition("=")
    if not value.isdigit():
        raise InputError(f"schedule line {line}: field '{key}' must be a non-negative integer, got '{value}'")
    return int(value)


@dataclass(frozen=True, order=True)
class Slot:
    """One entry of a periodic body: task `kind`/`layer` of iteration j − lag starts at j·P + start."""

    start: int
    kind: str
    layer: int
    lag: int

    def __str__(self) -> str:
        return f"{self.kind}{self.layer}-{self.lag}@{self.start}"


@dataclass(frozen=True)
class PeriodicSchedule:
    """A modulo schedule: every processor repeats its body every `period` cycles."""

    period: int
    bodies: tuple[tuple[Slot, ...], ...]
    costs: dict[tuple[str, int], int] = field(default_factory=dict, compare=False)
    #: Cycles from the end of U_l to its new weights being readable by slot (kind, layer) when the reader sits
    #: on another processor: the planned transfer of |W_l| words (hold, queueing, latency). The version a read
    #: pins counts only updates whose weights have arrived (`read_staleness`).
    read_delays: dict[tuple[str, int], int] = field(default_factory=dict, compare=False)

    @property
    def num_procs(self) -> int:
        return len(self.bodies)

    def placement(self) -> dict[tuple[str, int], int]:
        """(kind, layer) → processor."""
        return {(s.kind, s.layer): p for p, body in enumerate(self.bodies) for s in body}

    def lags(self) -> dict[tuple[str, int], int]:
        return {(s.kind, s.layer): s.lag for body in self.bodies for s in body}

    def unroll(self, iterations: int) -> OpSchedule:
        """Explicit ops for iterations 0..T−1, each processor's ops in start-time order."""
        rows = []
        max_lag = max((s.lag for body in self.bodies for s in body), default=0)
        for p, body in enumerate(self.bodies):
            timed = []
            for j in range(iterations + max_lag):
                for s in body:
                    t = j - s.lag
                    if 0 <= t < iterations:
                        timed.append((j * self.period + s.start, s.layer, s.kind, Op(p, s.kind, s.layer, t)))
            timed.sort(key=lambda x: x[:3])
            rows.append(tuple(x[3] for x in timed))
        return OpSchedule("layer", tuple(rows), read_staleness=self.read_staleness())

    def read_staleness(self) -> tuple[tuple[str, int, int], ...]:
        """Staleness s of every slot that reads a layer's weights (kinds with F or E), from the timing.

        X_l(t) starts at (t + lag_X)·P + start_X and U_l(i) ends at (i + lag_U)·P + start_U + c_U, so the
        updates ended by X_l(t)'s start are i ≤ t + k with k = lag_X − lag_U + ⌊(start_X − start_U − c_U)/P⌋:
        it reads version t + k + 1, staleness s = −k − 1 (−1 for an E that runs after its own update, under
        `latest`). Needs the update's cost; without `costs` nothing is pinned.
        """
        slots = {(s.kind, s.layer): s for body in self.bodies for s in body}
        updates = {s.layer: s for s in slots.values() if "U" in s.kind}
        out = []
        for (kind, layer), x in sorted(slots.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            u = updates.get(layer)
            if u is None or u is x or not ("F" in kind or "E" in kind) or (u.kind, layer) not in self.costs:
                continue
            delay = self.read_delays.get((kind, layer), 0)
            k = x.lag - u.lag + (x.start - u.start - self.costs[(u.kind, layer)] - delay) // self.period
            out.append((kind, layer, -k - 1))
        return tuple(out)

    def start_time(self, kind: str, layer: int, iteration: int) -> int:
        for body in self.bodies:
            for s in body:
                if (s.kind, s.layer) == (kind, layer):
                    return (iteration + s.lag) * self.period + s.start
        raise KeyError((kind, layer))

    def to_text(self) -> str:
        lines = [f"# layerpipe periodic schedule v1 period={self.period} procs={self.num_procs}"]
        for p, body in enumerate(self.bodies):
            lines.append(f"p{p}: " + " ".join(str(s) for s in sorted(body)))
        return "\n".join(lines) + "\n"

    @staticmethod
    def from_text(text: str) -> PeriodicSchedule:
        period = None
        header, lines = _split_text(text, "periodic schedule")
        for n, word in header:
            if word.startswith("period="):
                period = _header_int(word, n)
        bodies: list[tuple[Slot, ...]] = []
        for n, tokens in lines:
            slots = []
            for tok in tokens:
                m = _SLOT_RE.match(tok)
                if not m:
                    raise InputError(f"periodic schedule line {n}: slot '{tok}' is not KIND LAYER-LAG@START")
                slots.append(Slot(int(m.group(4)), m.group(1), int(m.group(2)), int(m.group(3))))
            bodies.append(tuple(slots))
        if period is None or period < 1:
            raise InputError("periodic schedule header: field 'period' must be a positive integer")
        return PeriodicSchedule(period, tuple(bodies))

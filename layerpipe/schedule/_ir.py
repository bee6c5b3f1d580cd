"""The schedule IR shared by every policy and backend (design notes §6).

An `Op` is (processor, kind, unit, iteration): `unit` is a layer index for layer-level schedules (kinds
are DFG task kinds: F, A, E, G, U and fused groups such as AEG) or a stage index for stage-level
schedules (kinds F, B, I, W as in torch.distributed.pipelining: B = full backward, I = input gradient,
W = weight gradient). `iteration` is the iteration (async) or micro-batch (sync) number.

Two schedule forms:
- `OpSchedule`: explicit per-processor ordered op lists, no times (the simulator times them).
- `PeriodicSchedule`: period P and, per processor, a body of `Slot`s (task, lag, start, phase). In period j
  the processor starts task v of iteration j − lag at time j·P + start. `unroll(T)` gives the explicit ops
  for iterations 0..T−1 (prologue and epilogue skip iterations < 0 or ≥ T).
- Unfolded periodic schedules (Parhi, VLSI DSP Systems ch. 5: unfolding by J) hold J iterations per period:
  in period j a slot of phase k of a non-U task runs iteration J·(j − lag) + k. Updates may be grouped per
  layer (`groups`, layer → g with g | J): update u of that layer applies the summed gradients of iterations
  u·g … u·g + g − 1 (PipeDream's replicas all-reduce and update once per round, SOSP'19 §3.1; PipeDream-2BW
  coalesces m micro-batches, ICML'21 §3), and a U slot of phase k runs update (J/g)·(j − lag) + k. A period
  then trains J·batch samples. J = 1 and g = 1 are today's schedules, unchanged.

Ties: ops that start at the same cycle on one processor (behind zero-cycle tasks such as a flatten) run
zero-cycle ops first, then in `tie_rank` order — one iteration's dataflow order — then by iteration
(`op_order_key`). `unroll`, the explicit validator (which dry-runs the order `unroll` emits) and the periodic
validator (which checks equal-start precedences against `tie_rank`, a precedence of one start being always out
of a zero-cycle producer) use that one rule, so a periodic schedule the validator accepts unrolls into one that
runs, in the order its timing assumed.

Text form of an op: `KIND UNIT . ITERATION`, e.g. `F3.7`, `AEG2.0`; a schedule is one line per processor:
`p0: F1.0 F2.0 A2.0`. Slots print as `F3.7` style with the lag in place of the iteration and the start
offset after `@`: `F3-2@15` is F3, lag 2, start 15 (the iteration is j − lag); a slot of phase k > 0 prints
`F3.1-2@15`. Headers name `unfold=J` and `groups=3:2,5:2` only when they are not trivial, so schedules of one
iteration per period print as they always did.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from layerpipe._gc import gc_paused
from layerpipe.errors import InputError

if TYPE_CHECKING:
    import numpy as np

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
_SLOT_RE = re.compile(r"^([A-Z]+)(\d+)(?:\.([1-9]\d*))?-(\d+)@(\d+)$")


def parse_op(text: str, proc: int) -> Op:
    m = _OP_RE.match(text)
    if not m:
        raise InputError(f"op '{text}' is not KIND UNIT.ITERATION like F3.7")
    return Op(proc, m.group(1), int(m.group(2)), int(m.group(3)))


def numbered_by_first_appearance(task: np.ndarray, num_tasks: int) -> bool:
    """Do the ops' task ids 0 … num_tasks − 1 all occur, numbered in order of their first op? That is: the first op
    is task 0 and each op's task is at most one more than the largest before it — a running maximum, no sort
    (the check `compile_schedule` makes on every schedule of columns)."""
    import numpy as np

    if not len(task):
        return num_tasks == 0
    highest = np.maximum.accumulate(task)
    return (int(task[0]) == 0 and int(highest[-1]) == num_tasks - 1
            and (len(task) == 1 or int((highest[1:] - highest[:-1]).max()) <= 1))


#: Ops per row up to which column passes take the whole column at once (per-row passes cost more than they save).
SMALL_COLUMNS = 2048


@dataclass(frozen=True, eq=False)
class OpColumns:
    """A schedule's ops as columns, no object per op (issue 14: generators, expansions and the timing engine
    work on these; `OpSchedule.procs` materializes the `Op`s only when something reads them).

    Processor p runs ops bounds[p] … bounds[p+1] − 1 in that order; op i is task `tasks[task[i]]` = (kind,
    unit) of iteration `iteration[i]` (int64 arrays)."""

    bounds: tuple[int, ...]
    tasks: tuple[tuple[str, int], ...]
    task: np.ndarray
    iteration: np.ndarray

    @property
    def num_procs(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_ops(self) -> int:
        return self.bounds[-1]

    def rows(self) -> tuple[tuple[Op, ...], ...]:
        """The `Op`s, processor by processor (Python ints, as `parse_op` and the generators make them)."""
        kinds = [kind for kind, _ in self.tasks]
        units = [unit for _, unit in self.tasks]
        task, iteration = self.task.tolist(), self.iteration.tolist()
        with gc_paused():  # one Op per op: collections would walk every Op built so far, again and again
            return tuple(tuple(Op(p, kinds[k], units[k], t) for k, t in zip(task[lo:hi], iteration[lo:hi], strict=True))
                         for p, (lo, hi) in enumerate(itertools.pairwise(self.bounds)))

    def first_positions(self) -> np.ndarray:
        """Per task id, the position of its first op (`num_ops` for a task without ops). Row by row, each row's
        missing tasks looked for in blocks that double in length: a periodic row shows all its tasks within its
        first period, so this reads a few blocks per row, not every op (no sort of the whole column)."""
        import numpy as np

        n, k = self.num_ops, len(self.tasks)
        first = np.full(k, n, dtype=np.int64)
        if n <= SMALL_COLUMNS * max(self.num_procs, 1):  # short rows: one pass beats a pass per row
            np.minimum.at(first, self.task, np.arange(n, dtype=np.int64))  # no sort (`np.unique`: 4x the time)
            return first
        for lo, hi in itertools.pairwise(self.bounds):
            if hi <= lo:
                continue
            missing = (np.bincount(self.task[lo:hi], minlength=k) > 0) & (first == n)
            left, a, block = int(missing.sum()), lo, 4096
            while left and a < hi:
                b = min(a + block, hi)
                found, at = np.unique(self.task[a:b], return_index=True)
                new = missing[found]
                first[found[new]] = a + at[new]
                missing[found[new]] = False
                left -= int(new.sum())
                a, block = b, block * 2
        return first

    def numbered_by_first_appearance(self) -> bool:
        """Is every task present, with ids numbered in order of first appearance (`in_first_appearance_order`
        would return the columns themselves)?"""
        return numbered_by_first_appearance(self.task, len(self.tasks))

    def in_first_appearance_order(self) -> OpColumns:
        """The same ops with task ids numbered in order of first appearance (tasks without ops last, in their
        order): what `compile_schedule` numbers them by, so it can share this column instead of renumbering."""
        import numpy as np

        first = self.first_positions()
        order = np.argsort(first, kind="stable")
        if (order == np.arange(len(order))).all():
            return self
        renumber = np.empty(len(order), dtype=np.int64)
        renumber[order] = np.arange(len(order), dtype=np.int64)
        return OpColumns(self.bounds, tuple(self.tasks[int(t)] for t in order), renumber[self.task], self.iteration)

    def padded(self, num_procs: int) -> OpColumns:
        """The same ops with idle processors appended up to `num_procs`."""
        extra = (self.bounds[-1],) * max(0, num_procs - self.num_procs)
        return OpColumns(self.bounds + extra, self.tasks, self.task, self.iteration)


@dataclass(frozen=True)
class OpSchedule:
    """Explicit per-processor ordered op lists.

    A schedule made by `from_columns` holds its ops as `OpColumns` and builds `procs` on first read (the same
    `Op`s, equal and printed alike); code that can work on columns asks `columns` first."""

    level: str
    procs: tuple[tuple[Op, ...], ...]
    synchronous: bool = False
    microbatches: int = 0  #: micro-batches per step (synchronous schedules), 0 for asynchronous
    #: Weight reads the schedule pins, as (kind, layer, s): op (kind, layer, t) reads version t − s, so it
    #: waits for the update U_l(t − s − 1) that writes it. `PeriodicSchedule.unroll` derives them from the
    #: periodic timing, which keeps self-timed execution (simulator, RTL) within the designed staleness;
    #: hand-written schedules leave it empty and their reads are whatever is current.
    read_staleness: tuple[tuple[str, int, int], ...] = ()
    #: Iterations per period of the periodic schedule this was unrolled from (J): op (kind, l, t) is of phase
    #: t mod J, and `read_phases` pins reads of phases k ≥ 1 as (kind, layer, k, s).
    unfold: int = 1
    #: Grouped updates (layer, g): U_l(u) applies the summed gradients of iterations u·g … u·g + g − 1 and an
    #: op (kind, l, t) that reads pinned weights reads version ⌊t/g⌋ − s. Layers not named have g = 1.
    groups: tuple[tuple[int, int], ...] = ()
    read_phases: tuple[tuple[str, int, int, int], ...] = ()
    #: Reads pinned by design (`PeriodicSchedule.read_floor`, PipeDream-2BW's double buffer), (kind, layer,
    #: phase, s): the op reads version ⌊t/g⌋ − s even when a newer one has been written by the time it starts.
    read_floor: tuple[tuple[str, int, int, int], ...] = ()
    #: The ops as columns when the schedule was made from them (`from_columns`), else None. Not compared: a
    #: schedule equals another with the same ops however either holds them. Not an argument either, so
    #: `dataclasses.replace(schedule, procs=...)` makes a schedule of the new rows, without stale columns.
    columns: OpColumns | None = field(default=None, init=False, compare=False, repr=False)

    def __getattr__(self, name: str) -> tuple[tuple[Op, ...], ...]:
        # Only reached when normal lookup fails: `procs` of a schedule made from columns, never read before.
        columns = self.__dict__.get("columns")
        if name != "procs" or columns is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        rows = columns.rows()
        object.__setattr__(self, "procs", rows)
        return rows

    @classmethod
    def from_columns(cls, level: str, columns: OpColumns, **given: object) -> OpSchedule:
        """A schedule of `columns`' ops; `given` are the other fields (defaults otherwise). `procs` is built
        when first read."""
        made = cls.__new__(cls)
        for f in fields(cls):
            if f.name not in ("procs", "level", "columns"):
                object.__setattr__(made, f.name, given.pop(f.name, f.default))
        if given:
            raise TypeError(f"OpSchedule.from_columns: unknown fields {sorted(given)}")
        object.__setattr__(made, "level", level)
        object.__setattr__(made, "columns", columns)
        return made

    @property
    def materialized(self) -> bool:
        """Are the `Op`s of `procs` built (always, unless made by `from_columns` and never read)?"""
        return "procs" in self.__dict__

    @property
    def num_procs(self) -> int:
        if self.columns is not None:
            return self.columns.num_procs
        return len(self.procs)

    def row_lengths(self) -> list[int]:
        """Ops per processor."""
        if self.columns is not None:
            b = self.columns.bounds
            return [hi - lo for lo, hi in itertools.pairwise(b)]
        return [len(row) for row in self.procs]

    def read_staleness_map(self) -> dict[tuple[str, int], int]:
        return {(kind, layer): s for kind, layer, s in self.read_staleness}

    def read_pins(self) -> dict[tuple[str, int, int], int]:
        """(kind, layer, phase) → s for every pinned weight read (phase 0 from `read_staleness`)."""
        pins = {(kind, layer, 0): s for kind, layer, s in self.read_staleness}
        pins.update({(kind, layer, k): s for kind, layer, k, s in self.read_phases})
        return pins

    def groups_map(self) -> dict[int, int]:
        return dict(self.groups)

    @property
    def simple(self) -> bool:
        """One iteration per period and one update per iteration: the rules of the fast paths apply."""
        return self.unfold == 1 and not self.groups and not self.read_phases and not self.read_floor

    def ops(self) -> Iterable[Op]:
        for row in self.procs:
            yield from row

    def as_columns(self) -> OpColumns:
        """The ops as columns: the ones it was made from, else built from `procs` (tasks numbered in order of
        first appearance)."""
        if self.columns is not None:
            return self.columns
        import numpy as np

        task_id: dict[tuple[str, int], int] = {}
        ops = list(self.ops())
        task = np.fromiter((task_id.setdefault((op.kind, op.unit), len(task_id)) for op in ops), np.int64, len(ops))
        iteration = np.fromiter((op.iteration for op in ops), np.int64, len(ops))
        bounds = tuple(itertools.accumulate(self.row_lengths(), initial=0))
        return OpColumns(bounds, tuple(task_id), task, iteration)

    @cached_property
    def num_iterations(self) -> int:
        """Iterations (micro-batches for synchronous schedules) the ops cover: the largest index + 1.

        Update ops of synchronous layer-level schedules count steps, not micro-batches, so they are left out.
        Kept once computed (the ops never change; `dataclasses.replace` makes a new schedule): a full
        `simulate()` reads it, and on columns it is a pass over every op.
        """
        c = self.columns
        if c is not None:
            counted = c.iteration
            if self.synchronous:
                updates = [k for k, (kind, _) in enumerate(c.tasks) if kind == "U"]
                if updates:
                    import numpy as np

                    counted = counted[~np.isin(c.task, updates)]
            return 1 + (int(counted.max()) if len(counted) else -1)
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
        if self.unfold != 1:
            head += f" unfold={self.unfold}"
        if self.groups:
            head += " groups=" + format_groups(self.groups)
        pins = [f"{k}{layer}:{s}" for k, layer, s in self.read_staleness]
        pins += [f"{k}{layer}.{phase}:{s}" for k, layer, phase, s in self.read_phases]
        if pins:
            head += " reads=" + ",".join(pins)
        if self.read_floor:
            head += " floor=" + format_pins(self.read_floor)
        lines = [head]
        for p, row in enumerate(self.procs):
            lines.append(f"p{p}: " + " ".join(str(op) for op in row))
        return "\n".join(lines) + "\n"

    @staticmethod
    def from_text(text: str) -> OpSchedule:
        level, sync, m, unfold = "layer", False, 0, 1
        reads: list[tuple[str, int, int, int]] = []
        groups: tuple[tuple[int, int], ...] = ()
        floor: tuple[tuple[str, int, int, int], ...] = ()
        header, lines = _split_text(text, "schedule")
        for n, word in header:
            if word.startswith("level="):
                level = word.split("=", 1)[1]
            elif word == "synchronous":
                sync = True
            elif word.startswith("microbatches="):
                m = _header_int(word, n)
            elif word.startswith("reads="):
                reads = parse_phase_reads(word, n)
            elif word.startswith("unfold="):
                unfold = _header_int(word, n)
            elif word.startswith("groups="):
                groups = parse_groups(word, n)
            elif word.startswith("floor="):
                floor = tuple(parse_phase_reads("reads=" + word.split("=", 1)[1], n))
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
        check_unfolding(unfold, groups)
        phase0 = tuple((k, layer, st) for k, layer, phase, st in reads if phase == 0)
        phased = tuple(r for r in reads if r[2] > 0)
        return OpSchedule(level, tuple(rows), sync, m, phase0, unfold, groups, phased, floor)


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


_READ_RE = re.compile(r"^([A-Z]+)(\d+)(?:\.([1-9]\d*))?:(-?\d+)$")
_GROUP_RE = re.compile(r"^(\d+):([1-9]\d*)$")

#: Most iterations one period may hold (J): every body holds J copies of its tasks.
MAX_UNFOLD = 64


def parse_phase_reads(word: str, line: int) -> list[tuple[str, int, int, int]]:
    """`reads=F3:2,F3.1:1` → [(kind, layer, phase, s)] (phase 0 when no `.k`)."""
    out = []
    for item in word.split("=", 1)[1].split(","):
        m = _READ_RE.match(item)
        if not m:
            raise InputError(f"schedule line {line}: field 'reads' entry '{item}' is not KIND LAYER[.PHASE]:STALENESS "
                             "like F3:2 or F3.1:2")
        out.append((m.group(1), int(m.group(2)), int(m.group(3) or 0), int(m.group(4))))
    return out


def parse_reads(word: str, line: int) -> list[tuple[str, int, int]]:
    """Phase-0 entries of `reads=` (the form every schedule of one iteration per period uses)."""
    out = []
    for kind, layer, phase, s in parse_phase_reads(word, line):
        if phase:
            raise InputError(f"schedule line {line}: field 'reads' entry '{kind}{layer}.{phase}:{s}' names a phase, "
                             "which only unfolded schedules have")
        out.append((kind, layer, s))
    return out


def format_pins(pins: Iterable[tuple[str, int, int, int]]) -> str:
    """(kind, layer, phase, s) entries as `F3:2,F3.1:1` (the `reads=` and `floor=` forms)."""
    return ",".join(f"{k}{layer}{f'.{phase}' if phase else ''}:{st}" for k, layer, phase, st in pins)


def format_groups(groups: Iterable[tuple[int, int]]) -> str:
    return ",".join(f"{layer}:{g}" for layer, g in groups)


def parse_groups(word: str, line: int) -> tuple[tuple[int, int], ...]:
    """`groups=3:2,5:2` → ((3, 2), (5, 2)): layer → update group size g."""
    out = []
    for item in word.split("=", 1)[1].split(","):
        m = _GROUP_RE.match(item)
        if not m:
            raise InputError(f"schedule line {line}: field 'groups' entry '{item}' is not LAYER:G like 3:2 (G >= 1)")
        out.append((int(m.group(1)), int(m.group(2))))
    return tuple(sorted(out))


def check_unfolding(unfold: int, groups: Iterable[tuple[int, int]]) -> None:
    """J in 1..MAX_UNFOLD and every group size g a divisor of J (a period holds whole update groups)."""
    if isinstance(unfold, bool) or not isinstance(unfold, int) or not 1 <= unfold <= MAX_UNFOLD:
        raise InputError(f"unfold must be an integer in 1..{MAX_UNFOLD}, got {unfold!r}")
    seen = set()
    for layer, g in groups:
        if layer in seen:
            raise InputError(f"groups: layer {layer} is named twice")
        seen.add(layer)
        if not isinstance(g, int) or g < 1 or unfold % g:
            raise InputError(f"groups: layer {layer} has group {g!r}; a group must be a divisor of unfold={unfold}")


def _header_int(word: str, line: int) -> int:
    key, _, value = word.partition("=")
    if not value.isdigit():
        raise InputError(f"schedule line {line}: field '{key}' must be a non-negative integer, got '{value}'")
    return int(value)


def tie_rank(kind: str, unit: int) -> tuple[int, int, int]:
    """The one order of ops that start together on one processor (issue 12: zero-cycle tasks).

    A topological order of one iteration's training graph for any network whose layers are numbered in
    topological order (they are: `layerpipe.network` checks it): forwards by layer, then backwards by reverse
    layer, within a layer A before E before G before U (fused kinds by their first task). Every precedence
    between ops that can start in the same cycle is a delay-0 edge out of a zero-cycle task (weight tasks
    never cost 0), so this order puts every producer before its consumer; `op_order_key` breaks the
    remaining ties by iteration.
    """
    if kind == "F":
        return (0, unit, 0)
    return (1, -unit, "AEGU".index(kind[0]))


def op_order_key(start: int, op: Op, busy: bool = True) -> tuple[int, bool, tuple[int, int, int], int]:
    """Program order of ops on one processor: start time, then zero-cycle ops (`busy` False) before ops that
    take time, then `tie_rank`, then iteration.

    A plan that starts an op of c > 0 cycles at s on a processor has every zero-cycle op it starts at s done
    by then (they end at s), so they run first: a zero-cycle task packed at the end of a full body (offset P)
    shares its cycle with the next period's first task and must not wait behind it (it did: its transfer then
    left c cycles late and, on a bus, pushed the next one past its consumer). A precedence between ops of one
    start is always out of a zero-cycle producer (a valid plan never starts a consumer before a producer of
    c > 0 cycles ends), so this order keeps every producer first, as `tie_rank` alone did.
    """
    return (start, busy, tie_rank(op.kind, op.unit), op.iteration)


@dataclass(frozen=True, order=True)
class Slot:
    """One entry of a periodic body: task `kind`/`layer` of iteration J·(j − lag) + phase starts at j·P + start
    (J = 1, phase 0: iteration j − lag). A U slot of a layer with update group g runs update
    (J/g)·(j − lag) + phase."""

    start: int
    kind: str
    layer: int
    lag: int
    phase: int = 0

    def __str__(self) -> str:
        phase = f".{self.phase}" if self.phase else ""
        return f"{self.kind}{self.layer}{phase}-{self.lag}@{self.start}"


def make_slot(start: int, kind: str, layer: int, lag: int, phase: int = 0) -> Slot:
    """`Slot(start, kind, layer, lag, phase)` without the frozen dataclass's `object.__setattr__` per field (a
    `Slot` has nothing else to set up or check): the timing passes make one per task of every timing they
    score, several times the cost of the rest of building a schedule."""
    slot = object.__new__(Slot)
    state = slot.__dict__
    state["start"], state["kind"], state["layer"], state["lag"], state["phase"] = start, kind, layer, lag, phase
    return slot


#: The key of `Slot`'s own order (its fields in turn, as `order=True` compares them): sorting by it compares
#: tuples in C instead of calling the generated `__lt__` per comparison (bodies are sorted on every timing).
slot_order = operator.attrgetter("start", "kind", "layer", "lag", "phase")


def read_offset(update_cost: int, reader_cost: int, same_proc: bool) -> int:
    """Cycles from an update copy's start to its weights being readable, before any transfer: its cost, and
    one more for a zero-cycle update on a zero-cycle reader's processor — it ends in the cycle the reader
    starts but comes after it in program order (`op_order_key`: `tie_rank` puts U after F and E), so the
    reader does not see it (a reader that takes time runs after every zero-cycle op of its cycle)."""
    return update_cost + (update_cost == 0 and reader_cost == 0 and same_proc)


def latest_update(reader_start: int, reader_lag: int, copies: Sequence[tuple[int, int, int, int]], per: int,
                  period: int, delay: int) -> tuple[int, int]:
    """The newest update a periodic reader sees, and which update copy writes it — the one rule of pinned
    weight reads (`PeriodicSchedule.read_pins`, and the weight transfers `_comm.channel_timing` plans).

    `copies[q]` = (start, lag, phase, `read_offset`) of the layer's update slots; their weights reach the
    reader `delay` cycles after that offset. The reader of period j sees update (J/g)·(j + f_q − lag_q) + phase_q
    of copy q, f_q = ⌊(reader_start − start_q − offset_q − delay)/P⌋; returns best = max_q ((J/g)·(f_q − lag_q +
    reader_lag) + phase_q) (relative to the reader's lag) and the first copy attaining it.
    """
    seen = seen_updates(reader_start, reader_lag, copies, per, period, delay)
    assert seen, "a reader needs an update copy"
    best = max(seen)
    return best, seen.index(best)


def seen_updates(reader_start: int, reader_lag: int, copies: Sequence[tuple[int, int, int, int]], per: int,
                 period: int, delay: int) -> list[int]:
    """Per update copy, the update of it a periodic reader sees (relative to the reader's lag; `latest_update`
    takes the newest)."""
    return [per * ((reader_start - start - offset - delay) // period - lag + reader_lag) + phase
            for start, lag, phase, offset in copies]


class RunPlan(Protocol):
    """The timing a run's ops were made from (`layerpipe.sim.Workload.plan`): a planned start per op. A bus
    serves a planned run's transfers in the plan's order, no earlier than the plan's bus does (a compiled bus,
    `layerpipe.sim._engine`); `PeriodicSchedule` is one."""

    def planned_start(self, kind: str, unit: int, iteration: int) -> int | None:
        """Planned start cycle of op (kind, unit, iteration), or None when the plan does not hold it."""
        ...

    def planned_starts(self, tasks: Sequence[tuple[str, int]], task: Any, iteration: Any) -> list[int] | None:
        """`planned_start` of every op (`tasks[task[i]]`, `iteration[i]`: int64 arrays), None when the plan
        misses one."""
        ...


@dataclass(frozen=True)
class PeriodicSchedule:
    """A modulo schedule: every processor repeats its body every `period` cycles, `unfold` iterations each."""

    period: int
    bodies: tuple[tuple[Slot, ...], ...]
    costs: dict[tuple[str, int], int] = field(default_factory=dict, compare=False)
    #: Cycles from the end of U_l to its new weights being readable by slot (kind, layer) when the reader sits
    #: on another processor: the planned transfer of |W_l| words (hold, queueing, latency). The version a read
    #: pins counts only updates whose weights have arrived (`read_staleness`). Readers of phase k ≥ 1 of an
    #: unfolded schedule are keyed (kind, layer, k).
    read_delays: dict[tuple[str, int] | tuple[str, int, int], int] = field(default_factory=dict, compare=False)
    #: J: iterations per period (1: not unfolded).
    unfold: int = 1
    #: (layer, g): update groups of g iterations (g divides J); layers not named have g = 1.
    groups: tuple[tuple[int, int], ...] = ()
    #: Reads pinned by design rather than by the timing, (kind, layer, phase, s): PipeDream-2BW's double
    #: buffer reads the version one update back even when a newer one has been written. A pin never reads
    #: newer than the timing allows (the larger s wins).
    read_floor: tuple[tuple[str, int, int, int], ...] = ()

    def __post_init__(self) -> None:
        check_unfolding(self.unfold, self.groups)

    @property
    def num_procs(self) -> int:
        return len(self.bodies)

    def group(self, layer: int) -> int:
        return dict(self.groups).get(layer, 1)

    def phases(self, kind: str, layer: int) -> int:
        """Copies of a task per period: J, or J/g for the updates of a layer with group g."""
        return self.unfold // self.group(layer) if kind == "U" else self.unfold

    def iteration(self, slot: Slot, j: int) -> int:
        """The iteration (update number for U) slot runs in period j (negative in the prologue)."""
        return self.phases(slot.kind, slot.layer) * (j - slot.lag) + slot.phase

    def placement(self) -> dict[tuple[str, int], int]:
        """(kind, layer) → processor of its phase-0 slot."""
        return {(s.kind, s.layer): p for p, body in enumerate(self.bodies) for s in body if s.phase == 0}

    def slot_placement(self) -> dict[tuple[str, int, int], int]:
        """(kind, layer, phase) → processor."""
        return {(s.kind, s.layer, s.phase): p for p, body in enumerate(self.bodies) for s in body}

    def lags(self) -> dict[tuple[str, int], int]:
        return {(s.kind, s.layer): s.lag for body in self.bodies for s in body if s.phase == 0}

    def cycles_per_iteration(self) -> float:
        return self.period / self.unfold

    def unroll(self, iterations: int) -> OpSchedule:
        """Explicit ops for iterations 0..T−1 (and updates 0..⌈T/g⌉−1), each processor's ops in `op_order_key`
        order of their start times.

        Built as columns (`OpColumns`): per processor, the (period, slot) grid of iterations is sorted by the
        key's parts with one stable lexsort — the order of sorting the keys as tuples, which is this one rule —
        and the `Op`s are made only if something reads `procs`."""
        import numpy as np

        max_lag = max((s.lag for body in self.bodies for s in body), default=0)
        periods = -(-iterations // self.unfold) + max_lag + 1
        limit = {layer: -(-iterations // g) for layer, g in self.groups}
        task_id: dict[tuple[str, int], int] = {}
        task_parts: list[np.ndarray] = []
        iteration_parts: list[np.ndarray] = []
        bounds = [0]
        j = np.arange(periods, dtype=np.int64)
        for body in self.bodies:
            if not body:
                bounds.append(bounds[-1])
                continue
            # Per slot: its task, start, lag, phase, copies per period, iteration limit, busy, tie rank.
            ids = np.asarray([task_id.setdefault((s.kind, s.layer), len(task_id)) for s in body], dtype=np.int64)
            start = np.asarray([s.start for s in body], dtype=np.int64)
            lag = np.asarray([s.lag for s in body], dtype=np.int64)
            phase = np.asarray([s.phase for s in body], dtype=np.int64)
            per = np.asarray([self.phases(s.kind, s.layer) for s in body], dtype=np.int64)
            cap = np.asarray([limit.get(s.layer, iterations) if s.kind == "U" else iterations for s in body],
                             dtype=np.int64)
            # Without costs (a schedule read from text) every task counts as busy.
            busy = np.asarray([self.costs.get((s.kind, s.layer), 1) > 0 for s in body], dtype=np.int64)
            rank = np.asarray([tie_rank(s.kind, s.layer) for s in body], dtype=np.int64).reshape(len(body), 3)
            # The grid in the order the ops were listed before sorting: period by period, the body's slots.
            t = per[None, :] * (j[:, None] - lag[None, :]) + phase[None, :]
            live = (t >= 0) & (t < cap[None, :])
            slot = np.broadcast_to(np.arange(len(body)), t.shape)[live]
            t = t[live]
            when = (j[:, None] * self.period + start[None, :])[live]
            order = np.lexsort((t, rank[slot, 2], rank[slot, 1], rank[slot, 0], busy[slot], when))
            task_parts.append(ids[slot[order]])
            iteration_parts.append(t[order])
            bounds.append(bounds[-1] + len(order))
        empty = np.zeros(0, dtype=np.int64)
        columns = OpColumns(tuple(bounds), tuple(task_id), np.concatenate(task_parts) if task_parts else empty,
                            np.concatenate(iteration_parts) if iteration_parts else empty).in_first_appearance_order()
        pins = self.read_pins()
        phase0 = tuple((k, layer, st) for (k, layer, phase), st in pins.items() if phase == 0)
        phased = tuple((k, layer, phase, st) for (k, layer, phase), st in pins.items() if phase > 0)
        return OpSchedule.from_columns("layer", columns, read_staleness=phase0, unfold=self.unfold,
                                       groups=self.groups, read_phases=phased, read_floor=self.read_floor)

    def read_staleness(self) -> tuple[tuple[str, int, int], ...]:
        """(kind, layer, s) of the phase-0 reads `read_pins` pins (every read when J = 1)."""
        return tuple((k, layer, st) for (k, layer, phase), st in self.read_pins().items() if phase == 0)

    def read_pins(self) -> dict[tuple[str, int, int], int]:
        """Staleness s of every slot that reads a layer's weights (kinds with F or E), from the timing:
        X_l(t) reads version ⌊t/g⌋ − s, s in updates.

        X of phase k starts at j·P + start_X in the period j where it runs iteration t = J·(j − lag_X) + k.
        The U slot of phase q ends update (J/g)·(j' − lag_U) + q at j'·P + start_U + c_U, readable d cycles
        later on X's processor (`read_delays`), so the last one X sees has j' = j + f_q,
        f_q = ⌊(start_X − start_U − c_U − d)/P⌋, and X reads version 1 + max_q ((J/g)·(j + f_q − lag_U) + q).
        With ⌊t/g⌋ = (J/g)·(j − lag_X) + ⌊k/g⌋ that is s = ⌊k/g⌋ − 1 − max_q ((J/g)·(f_q − lag_U + lag_X) + q),
        the same for every t once the pipeline is full (J = g = 1: s = −k − 1 with k = lag_X − lag_U + f; −1
        for an E that runs after its own update, under `latest`). Needs the update's cost; without `costs`
        nothing is pinned. `read_floor` raises a pin to the staleness the policy designed.

        Computed once per schedule (a pure function of its frozen fields: scoring, validating, unrolling and
        compiling a schedule each read them); each call hands out its own dict.
        """
        return dict(self._read_pins)

    @cached_property
    def _read_pins(self) -> dict[tuple[str, int, int], int]:
        return self._pins(vectorised=self.period > 0)

    def forward_pins(self) -> dict[tuple[str, int, int], int]:
        """`read_pins` of the forward slots alone (kind F): all that staleness (`periodic_staleness`) and the
        versions held (`periodic_versions`) read, for scoring timings whose other pins are never asked for.
        The full `read_pins`, once computed, is used instead."""
        if "_read_pins" in self.__dict__:
            return {key: s for key, s in self._read_pins.items() if key[0] == "F"}
        return self._pins(vectorised=self.period > 0, forward_only=True)

    def _pins(self, vectorised: bool, forward_only: bool = False) -> dict[tuple[str, int, int], int]:
        """`read_pins` (`forward_only`: of the F readers alone), computed by `_validate.schedule_pins`."""
        from layerpipe.schedule._validate import schedule_pins  # _validate imports this module

        return schedule_pins(self, vectorised, forward_only)

    def start_time(self, kind: str, layer: int, iteration: int) -> int:
        """Start of the op of `iteration` (update number for U) of task kind/layer."""
        start = self.planned_start(kind, layer, iteration)
        if start is None:
            raise KeyError((kind, layer))
        return start

    @cached_property
    def slot_by_key(self) -> dict[tuple[str, int, int], Slot]:
        """(kind, layer, phase) → its slot (built once: the passes that read the timing look slots up)."""
        return {(s.kind, s.layer, s.phase): s for body in self.bodies for s in body}

    def planned_start(self, kind: str, unit: int, iteration: int) -> int | None:
        """`RunPlan`: the planned start j·P + start of the op of `iteration` (update number for U), None for a
        task the bodies do not hold. Op (kind, l, t) is the slot of phase t mod J (updates: mod J/g) and runs in
        period j = t div J + lag (updates: div J/g)."""
        per = self.phases(kind, unit)
        slot = self.slot_by_key.get((kind, unit, iteration % per))
        if slot is None:
            return None
        return (iteration // per + slot.lag) * self.period + slot.start

    def planned_starts(self, tasks: Sequence[tuple[str, int]], task: Any, iteration: Any) -> list[int] | None:
        """`planned_start` of every op at once, on arrays: per task its copies per period and, per phase, its
        slot's lag and start (what the simulator's compiler asks for each of ~10⁵–10⁶ ops)."""
        import numpy as np

        width = max(1, self.unfold)
        per = np.ones(len(tasks), dtype=np.int64)
        lag = np.zeros((len(tasks), width), dtype=np.int64)
        start = np.zeros((len(tasks), width), dtype=np.int64)
        held = np.zeros((len(tasks), width), dtype=bool)
        slots = self.slot_by_key
        for k, (kind, unit) in enumerate(tasks):
            per[k] = self.phases(kind, unit)
            for q in range(int(per[k])):
                slot = slots.get((kind, unit, q))
                if slot is not None:
                    lag[k, q], start[k, q], held[k, q] = slot.lag, slot.start, True
        task = np.asarray(task, dtype=np.int64)
        iteration = np.asarray(iteration, dtype=np.int64)
        copies = per[task]
        phase = iteration % copies
        if not held[task, phase].all():
            return None
        return ((iteration // copies + lag[task, phase]) * self.period + start[task, phase]).tolist()

    def to_text(self) -> str:
        head = f"# layerpipe periodic schedule v1 period={self.period} procs={self.num_procs}"
        if self.unfold != 1:
            head += f" unfold={self.unfold}"
        if self.groups:
            head += " groups=" + format_groups(self.groups)
        if self.read_floor:
            head += " floor=" + format_pins(self.read_floor)
        lines = [head]
        for p, body in enumerate(self.bodies):
            lines.append(f"p{p}: " + " ".join(str(s) for s in sorted(body, key=slot_order)))
        return "\n".join(lines) + "\n"

    @staticmethod
    def from_text(text: str) -> PeriodicSchedule:
        period, unfold = None, 1
        groups: tuple[tuple[int, int], ...] = ()
        floor: tuple[tuple[str, int, int, int], ...] = ()
        header, lines = _split_text(text, "periodic schedule")
        for n, word in header:
            if word.startswith("period="):
                period = _header_int(word, n)
            elif word.startswith("unfold="):
                unfold = _header_int(word, n)
            elif word.startswith("groups="):
                groups = parse_groups(word, n)
            elif word.startswith("floor="):
                floor = tuple(parse_phase_reads("reads=" + word.split("=", 1)[1], n))
        check_unfolding(unfold, groups)
        bodies: list[tuple[Slot, ...]] = []
        for n, tokens in lines:
            slots = []
            for tok in tokens:
                m = _SLOT_RE.match(tok)
                if not m:
                    raise InputError(f"periodic schedule line {n}: slot '{tok}' is not KIND LAYER[.PHASE]-LAG@START")
                slot = Slot(int(m.group(5)), m.group(1), int(m.group(2)), int(m.group(4)), int(m.group(3) or 0))
                if slot.phase >= unfold:
                    raise InputError(f"periodic schedule line {n}: slot '{tok}' has phase {slot.phase}; "
                                     f"phases are 0..{unfold - 1} (unfold={unfold})")
                slots.append(slot)
            bodies.append(tuple(slots))
        if period is None or period < 1:
            raise InputError("periodic schedule header: field 'period' must be a positive integer")
        return PeriodicSchedule(period, tuple(bodies), unfold=unfold, groups=groups, read_floor=floor)

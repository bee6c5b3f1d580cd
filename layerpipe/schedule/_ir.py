"""The schedule IR shared by every policy and backend (design notes §6).

An `Op` is (processor, kind, unit, iteration): `unit` is a layer index for layer-level schedules (kinds
are DFG task kinds: F, A, E, G, U and fused groups such as AEG) or a stage index for stage-level
schedules (kinds F, B, I, W as in torch.distributed.pipelining: B = full backward, I = input gradient,
W = weight gradient). `iteration` is the iteration (async) or micro-batch (sync) number.

Two schedule forms:
- `OpSchedule`: explicit per-processor ordered op lists, no times (the simulator times them).
- `PeriodicSchedule` (`_periodic`, which imports this module): period P and, per processor, a body of `Slot`s
  (task, lag, start, phase). In period j the processor starts task v of iteration j − lag at time j·P + start.
  `unroll(T)` gives the explicit ops for iterations 0..T−1 (prologue and epilogue skip iterations < 0 or ≥ T).
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

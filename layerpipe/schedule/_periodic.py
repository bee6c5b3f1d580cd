"""Periodic (modulo) schedules of the schedule IR (design notes §6): `Slot`, `PeriodicSchedule` and the one rule
of pinned weight reads (`latest_update`). `layerpipe.schedule._ir` holds the ops, explicit schedules and the text
form's shared parts; its docstring describes both forms.

A periodic body's slot `F3-2@15` is F3 of iteration j − 2 started at j·P + 15 in period j; `unroll(T)` gives the
explicit `OpSchedule` of iterations 0..T−1.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from layerpipe.errors import InputError
from layerpipe.schedule._ir import (
    OpColumns,
    OpSchedule,
    _header_int,
    _split_text,
    check_unfolding,
    format_groups,
    format_pins,
    parse_groups,
    parse_phase_reads,
    tie_rank,
)

if TYPE_CHECKING:
    import numpy as np

_SLOT_RE = re.compile(r"^([A-Z]+)(\d+)(?:\.([1-9]\d*))?-(\d+)@(\d+)$")


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
            # Per slot: its task, lag, phase, copies per period, iteration limit, busy, tie rank.
            ids = np.asarray([task_id.setdefault((s.kind, s.layer), len(task_id)) for s in body], dtype=np.int64)
            lag = np.asarray([s.lag for s in body], dtype=np.int64)
            phase = np.asarray([s.phase for s in body], dtype=np.int64)
            per = np.asarray([self.phases(s.kind, s.layer) for s in body], dtype=np.int64)
            cap = np.asarray([limit.get(s.layer, iterations) if s.kind == "U" else iterations for s in body],
                             dtype=np.int64)
            # Without costs (a schedule read from text) every task counts as busy.
            busy = [int(self.costs.get((s.kind, s.layer), 1) > 0) for s in body]
            ranks = [tie_rank(s.kind, s.layer) for s in body]
            within = _period_order(body, busy, ranks, per.tolist(), self.period)
            if within is not None:  # every period in the same slot order: the grid in that order, no sort
                t = per[within][None, :] * (j[:, None] - lag[within][None, :]) + phase[within][None, :]
                live = (t >= 0) & (t < cap[within][None, :])
                task_parts.append(ids[np.broadcast_to(within, t.shape)[live]])
                iteration_parts.append(t[live])
                bounds.append(bounds[-1] + len(task_parts[-1]))
                continue
            # The grid in the order the ops were listed before sorting: period by period, the body's slots.
            t = per[None, :] * (j[:, None] - lag[None, :]) + phase[None, :]
            live = (t >= 0) & (t < cap[None, :])
            slot = np.broadcast_to(np.arange(len(body)), t.shape)[live]
            t = t[live]
            start = np.asarray([s.start for s in body], dtype=np.int64)
            when = (j[:, None] * self.period + start[None, :])[live]
            rank = np.asarray(ranks, dtype=np.int64).reshape(len(body), 3)
            order = np.lexsort((t, rank[slot, 2], rank[slot, 1], rank[slot, 0], np.asarray(busy)[slot], when))
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


def _period_order(body: Sequence[Slot], busy: list[int], ranks: list[tuple[int, int, int]], per: list[int],
                  period: int) -> np.ndarray | None:
    """The order `PeriodicSchedule.unroll` sorts one period's slots in, when it is every period's: the slots by
    (start, busy, tie rank, iteration), stably; None where the unroll must sort its whole grid.

    The cells of period j start at j·P + start: with every start in [0, P) they all come before period j + 1's,
    and within the period the order compares (start, busy, tie rank) — the same in every period — then the
    iterations t = c·(j − lag) + phase (c copies per period): with one c among the slots tied on the rest, two
    slots' iterations differ by c·(lag' − lag) + phase − phase', the same in every period. A stable sort of the
    slots by those keys at j = 0 is then every period's order (the grid's cells were listed period by period,
    slot by slot, so stable ties keep slot order in both); the unroll keeps the live cells of that order."""
    import numpy as np

    if not all(0 <= slot.start < period for slot in body):
        return None
    keys = []
    copies: dict[tuple[int, int, tuple[int, int, int]], int] = {}
    for slot, b, rank, c in zip(body, busy, ranks, per, strict=True):
        tied = (slot.start, b, rank)
        if copies.setdefault(tied, c) != c:
            return None  # tied slots with different copies per period: their order can change with the period
        keys.append((*tied, c * -slot.lag + slot.phase))
    return np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


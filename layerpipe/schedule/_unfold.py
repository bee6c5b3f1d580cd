"""Unfolding the training graph by J: J iterations per period (Parhi, VLSI Digital Signal Processing Systems,
ch. 5, "Unfolding").

A periodic schedule of one iteration per period gives every task one slot, so a heavy task bounds the period
from below by its own cost. Unfolded by J, the graph has J copies (phases) of every task, and the copies may
sit on different processors: a stage's alternate iterations on different processors is exactly what
PipeDream's replication is (SOSP'19 §3.1), and it lets the period per iteration fall below the heaviest
task. Phase k of period j is iteration J·j + k (before lags).

Parhi's rule for the edges: an edge U → V with w delays becomes, for every phase i, U_i → V_((i+w) mod J)
with ⌊(i+w)/J⌋ delays. Two kinds of edge of the training graph need more than that rule, because updates
may be grouped (layer → g, g | J: update u applies the summed gradients of iterations u·g … u·g + g − 1):
- the gradient edge G_l → U_l: G of phase k feeds the update of its group, U of phase ⌊k/g⌋, delay 0;
- the update order U_l(u−1) → U_l(u): U phase q → q + 1 with delay 0, the last phase (J/g − 1) → phase 0 of
  the next period with delay 1. It carries |W_l| words: when the copies sit on different processors the
  weights travel to the next updater (on one processor it costs nothing).
With g = 1 for every layer and J = 1 this is the plain graph, edge for edge.

`unfold_table` turns a `TaskTable` into one over the copies, so every placement, ordering and lag pass of
`_balance`, `_bodies`, `_lags` and `_comm_timing` runs unchanged on it; `periodic_from` then emits the phases
and groups into the IR.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from layerpipe._memo import BoundedMemo
from layerpipe.dfg import TrainingGraph
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._balance import balance
from layerpipe.schedule._bodies import asap_keys, best_ordering, default_targets
from layerpipe.schedule._comm import Comm, busiest_channel
from layerpipe.schedule._comm_timing import Timing, timing_of
from layerpipe.schedule._deps import ROLE_ORDER, layer_task_edges
from layerpipe.schedule._ir import check_unfolding
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._periodic import PeriodicSchedule, Slot, make_slot, read_offset, seen_updates, slot_order
from layerpipe.schedule._task_table import TaskTable

#: (kind, layer, phase): one copy of a task in an unfolded graph.
PhaseTask = tuple[str, int, int]


@dataclass(frozen=True)
class PhaseEdge:
    """dst (of its phase) in period j needs src (of its phase) of period j − delay."""

    src: PhaseTask
    dst: PhaseTask
    delay: int
    words: int
    role: str


def copies(kind: str, layer: int, unfold: int, groups: Mapping[int, int]) -> int:
    """Phases of a task: J, or J/g for the update of a layer with group g."""
    return unfold // groups.get(layer, 1) if kind == "U" else unfold


def unfolded_edges(graph: TrainingGraph, unfold: int, groups: Mapping[int, int] | None = None) -> list[PhaseEdge]:
    """The precedence edges of `graph` unfolded by J with update groups (module docstring)."""
    return [PhaseEdge(*edge) for edge in unfolded_edge_tuples(graph, unfold, groups)]


def unfolded_edge_tuples(graph: TrainingGraph, unfold: int, groups: Mapping[int, int] | None = None
                         ) -> list[tuple[PhaseTask, PhaseTask, int, int, str]]:
    """`unfolded_edges` as (src, dst, delay, words, role) tuples: the validator reads every edge of every periodic
    schedule it checks once, and making a frozen `PhaseEdge` per edge cost as much as the check itself."""
    groups = dict(groups or {})
    check_unfolding(unfold, groups.items())
    out: list[tuple[PhaseTask, PhaseTask, int, int, str]] = []
    for e in layer_task_edges(graph):
        (sk, sl), (dk, dl) = e.src, e.dst
        if e.role == ROLE_ORDER:
            per = copies(sk, sl, unfold, groups)
            words = graph.network.layer(sl).weight_count
            for q in range(per):
                out.append(((sk, sl, q), (dk, dl, (q + 1) % per), (q + 1) // per, words, e.role))
        elif e.role == "gradient":
            g = groups.get(dl, 1)
            out += [((sk, sl, k), (dk, dl, k // g), 0, e.words, e.role) for k in range(unfold)]
        else:
            out += [((sk, sl, i), (dk, dl, (i + e.delay) % unfold), (i + e.delay) // unfold, e.words, e.role)
                    for i in range(unfold)]
    return out


def _delay_free_edges(graph: TrainingGraph, unfold: int,
                      groups: Mapping[int, int]) -> Iterator[tuple[PhaseTask, PhaseTask, int]]:
    """(source, destination, words) of the delay-0 edges of `unfolded_edges`, in its order, without making an
    edge object for every edge of every phase (`unfold_table` reads only these)."""
    for e in layer_task_edges(graph):
        (sk, sl), (dk, dl) = e.src, e.dst
        if e.role == ROLE_ORDER:
            per = copies(sk, sl, unfold, groups)
            words = graph.network.layer(sl).weight_count
            for q in range(per - 1):  # the last copy's edge wraps into the next period: delay 1
                yield (sk, sl, q), (dk, dl, q + 1), words
        elif e.role == "gradient":
            g = groups.get(dl, 1)
            for k in range(unfold):
                yield (sk, sl, k), (dk, dl, k // g), e.words
        else:
            for i in range(unfold - e.delay):  # i + delay < J: the same period
                yield (sk, sl, i), (dk, dl, i + e.delay), e.words


@dataclass(frozen=True)
class UnfoldedTable(TaskTable):
    """A `TaskTable` over the phase copies of another: `tasks[v]` is the base task, `phase[v]` its phase."""

    phase: tuple[int, ...] = ()
    base: tuple[int, ...] = ()  #: index of each copy's task in the table it was unfolded from
    unfold: int = 1
    groups: tuple[tuple[int, int], ...] = ()

    @cached_property
    def _pin_arrays(self) -> Any:
        """`pinned_weight_sources`' arrays of this table (`_pin_arrays`)."""
        return _pin_arrays(self)

    @cached_property
    def update_copies(self) -> dict[int, list[int]]:
        """Layer → its update copies, in index order (read, never changed, by every pinning pass)."""
        return _update_copies_by_layer(self)

    @cached_property
    def update_chains(self) -> tuple[tuple[int, ...], ...]:
        """Each layer's update copies in phase order, the layers by their first copy (the cycles
        `update_chain_lags` raises the lags of, on every trial timing of a layout)."""
        chains: dict[int, dict[int, int]] = {}
        for v, t in enumerate(self.tasks):
            if t.kind == "U":
                chains.setdefault(t.layer, {})[self.phase[v]] = v
        return tuple(tuple(chain[q] for q in range(len(chain))) for chain in chains.values())

    @cached_property
    def _weight_loops(self) -> tuple[tuple[int, int, int], ...]:
        """(layer, F copy, U copy applying its group) per F phase. Callers keyed by layer keep the last phase's
        loop: the staleness scores of `_comm_timing` are then a heuristic of one phase, which is all they steer."""
        where = {(t.layer, a, self.phase[i]): i for i, t in enumerate(self.tasks) for a in t.kind}
        groups = dict(self.groups)
        out = []
        for i, t in enumerate(self.tasks):
            if t.has("F") and (t.layer, "U", 0) in where:
                out.append((t.layer, i, where[(t.layer, "U", self.phase[i] // groups.get(t.layer, 1))]))
        return tuple(out)


def unfold_table(table: TaskTable, unfold: int, groups: Mapping[int, int] | None = None) -> UnfoldedTable:
    """`table` unfolded by J = `unfold` with update groups (layer → g, g | J; layers not named have g = 1).

    Copies are numbered phase by phase, each phase in the base table's topological order, and the update of a
    group right after the last gradient of its group — a topological order of the delay-0 unfolded edges. The
    weight read of a copy of phase k is planned from the update of the previous group (phase
    (⌊k/g⌋ − 1) mod J/g): the version it reads in a pipeline without lag, the simplification the transfer
    plan makes (the version really read follows from the timing, `PeriodicSchedule.read_pins`).
    """
    groups = {layer: g for layer, g in (groups or {}).items() if g != 1}
    check_unfolding(unfold, groups.items())
    order: list[tuple[int, int]] = []  # (base index, phase)
    for k in range(unfold):
        for v in table.topo:
            t = table.tasks[v]
            if t.kind != "U":
                order.append((v, k))
            elif (k + 1) % groups.get(t.layer, 1) == 0:
                order.append((v, k // groups.get(t.layer, 1)))
    index = {(table.tasks[v].kind, table.tasks[v].layer, k): i for i, (v, k) in enumerate(order)}
    words: list[dict[int, int]] = [{} for _ in order]
    for head, tail, carried in _delay_free_edges(table.graph, unfold, groups):
        producer, consumer = index.get(head), index.get(tail)
        if producer is not None and consumer is not None:
            words[consumer][producer] = words[consumer].get(producer, 0) + carried
    preds = tuple(tuple(sorted(w)) for w in words)
    reads = []
    for u, x, w in table.weight_reads:
        layer = table.tasks[u].layer
        g = groups.get(layer, 1)
        per = unfold // g
        for k in range(unfold):
            src = index[("U", layer, (k // g - 1) % per)]
            reads.append((src, index[(table.tasks[x].kind, table.tasks[x].layer, k)], w))
    return UnfoldedTable(
        table.graph,
        tuple(table.tasks[v] for v, _ in order),
        tuple(table.cost[v] for v, _ in order),
        preds,
        tuple(range(len(order))),
        tuple(tuple(words[v][u] for u in ps) for v, ps in enumerate(preds)),
        tuple(sorted(reads)),
        phase=tuple(k for _, k in order),
        base=tuple(v for v, _ in order),
        unfold=unfold,
        groups=tuple(sorted(groups.items())),
    )


def pinned_weight_sources(table: UnfoldedTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int],
                          period: int, delay: Mapping[int, int],
                          newest: Mapping[tuple[int, int], int] | None = None) -> dict[tuple[int, int], int]:
    """The update copy each weight read (u, x) of `table.weight_reads` really reads from under a timing: the
    copy `layerpipe.schedule._periodic.latest_update` picks — the rule `PeriodicSchedule.read_pins` pins the
    unrolled reads with, so the planned transfer is the one the simulator makes. `delay[x]` is the cycles from
    that copy's end to its weights reaching reader x (its planned transfer; 0 when local or unknown).

    `newest[(u, x)]`, when given, is a copy the read may not be newer than: the newest update the reader sees
    among those no newer than that copy's (`channel_timing` moves pins only to older copies, so that its
    re-planning converges). Ties go to the first copy, as in `latest_update`.

    Large tables are pinned on arrays (`_pinned_on_arrays`, the same formula), small ones read by read."""
    arrays = table._pin_arrays
    if arrays is not None and arrays.size >= LARGE_PINS and period < _EXACT:
        found = _pinned_on_arrays(table, arrays, placement, start, lag, period, delay, newest)
        if found is not None:
            return found
    by_layer, groups = table.update_copies, dict(table.groups)
    cost, phase, tasks, unfold = table.cost, table.phase, table.tasks, table.unfold
    out = {}
    # Per layer, each copy's (end, lag, phase), read by every reader of the layer; a zero-cycle copy is read one
    # cycle later by a zero-cycle reader on its processor (`read_offset`): such layers take the general formula
    ends: dict[int, tuple[list[tuple[int, int, int]], bool]] = {}
    for u, x, _ in table.weight_reads:
        # `seen_updates` over `_reader_copies`, inlined (every weight read, every round of `channel_timing`)
        layer = tasks[x].layer
        us = by_layer[layer]
        if len(us) == 1:  # one update copy (a group of the whole period): the read's source, capped or not
            out[(u, x)] = us[0]
            continue
        per = unfold // groups.get(layer, 1)
        at, x_lag, zero, x_proc = start[x] - delay.get(x, 0), lag[x], cost[x] == 0, placement[x]
        known = ends.get(layer)
        if known is None:
            known = ends[layer] = ([(start[q] + cost[q], lag[q], phase[q]) for q in us],
                                   any(cost[q] == 0 for q in us))
        copies, zero_copy = known
        if zero_copy and zero:
            seen = [per * ((at - start[q] - (cost[q] + (cost[q] == 0 and placement[q] == x_proc))) // period
                           - lag[q] + x_lag) + phase[q] for q in us]
        else:
            seen = [per * ((at - end) // period - q_lag + x_lag) + q_phase for end, q_lag, q_phase in copies]
        if newest is None:
            best = max(seen)
        else:
            cap = seen[us.index(newest[(u, x)])]
            best = max(v for v in seen if v <= cap)
        out[(u, x)] = us[seen.index(best)]
    return out


#: Weight reads × update copies from which `pinned_weight_sources` works on arrays: the channel re-planning pins
#: every read of a large unfolded table several times per timing, and numpy's per-call cost outweighs a few
#: hundred integer formulas only below this.
LARGE_PINS = 1024

#: Periods and starts below which the arrays' int64 formulas are exact (lags and phases are small).
_EXACT = 1 << 40


def _pin_arrays(table: UnfoldedTable) -> Any:
    """Per weight read of `table`: its reader, its layer's update copies (a row padded with the first copy, and
    the padding's mask) and J/g, as arrays; None without weight reads."""
    import numpy as np

    if not table.weight_reads:
        return None
    by_layer, groups = table.update_copies, dict(table.groups)
    rows = [by_layer[table.tasks[x].layer] for _, x, _ in table.weight_reads]
    width = max(len(us) for us in rows)
    copies = np.array([us + [us[0]] * (width - len(us)) for us in rows], dtype=np.int64)
    pad = np.array([[False] * len(us) + [True] * (width - len(us)) for us in rows])
    reader = np.array([x for _, x, _ in table.weight_reads], dtype=np.int64)
    per = np.array([table.unfold // groups.get(table.tasks[x].layer, 1) for _, x, _ in table.weight_reads],
                   dtype=np.int64)
    return _PinArrays(copies.size, reader, copies, pad, per, np.array(table.cost, dtype=np.int64),
                      np.array(table.phase, dtype=np.int64), [(u, x) for u, x, _ in table.weight_reads])


class _PinArrays(NamedTuple):
    size: int
    reader: Any
    copies: Any
    pad: Any
    per: Any
    cost: Any
    phase: Any
    pairs: list[tuple[int, int]]


def _pinned_on_arrays(table: UnfoldedTable, arrays: _PinArrays, placement: Sequence[int], start: Sequence[int],
                      lag: Sequence[int], period: int, delay: Mapping[int, int],
                      newest: Mapping[tuple[int, int], int] | None) -> dict[tuple[int, int], int] | None:
    """`pinned_weight_sources` on arrays: seen = (J/g)·(⌊(at − start_q − c_q − z)/P⌋ − lag_q + lag_x) + phase_q per
    read and copy (z = 1 for a zero-cycle copy on a zero-cycle reader's processor, `read_offset`), the first
    largest (under the newest copy's, when capped) picked by `argmax`. None when a start is too large for the
    int64 formulas to be exact."""
    import numpy as np

    x, q, cost = arrays.reader, arrays.copies, arrays.cost
    try:
        s, lags, place = (np.array(a, dtype=np.int64) for a in (start, lag, placement))
    except OverflowError:
        return None
    if len(s) and max(-s.min(), s.max()) >= _EXACT:
        return None
    at = s[x] - np.array([delay.get(v, 0) for v in x.tolist()], dtype=np.int64)
    zero = (cost[q] == 0) & (cost[x] == 0)[:, None] & (place[q] == place[x][:, None])
    seen = (arrays.per[:, None] * ((at[:, None] - s[q] - cost[q] - zero) // period - lags[q] + lags[x][:, None])
            + arrays.phase[q])
    low = np.iinfo(np.int64).min
    seen[arrays.pad] = low
    if newest is not None:
        cap_copy = np.array([newest[(u, v)] for u, v, _ in table.weight_reads], dtype=np.int64)
        cap = seen[np.arange(len(x)), ((q == cap_copy[:, None]) & ~arrays.pad).argmax(axis=1)]
        seen[seen > cap[:, None]] = low
    picked = q[np.arange(len(x)), seen.argmax(axis=1)].tolist()
    return dict(zip(arrays.pairs, picked, strict=True))


def pinning_delay(table: UnfoldedTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int],
                  period: int, x: int, source: int, delay: int) -> int:
    """The least delay d >= `delay` under which reader x's pin (`latest_update`, the rule of `read_pins`) is the
    update `source` writes when its weights arrive `delay` cycles after its end: the read delay to report for x
    when the transfer plan holds x to an older copy than its arrival alone would pin (a newer copy's weights
    might arrive in time once the bus no longer carries them, but the plan does not send them). Every copy's
    seen update drops as d grows, the newest seen one by one (updates end in order), so the search stops at
    the source's update."""
    us, copies, per = _reader_copies(table, placement, start, lag, table.update_copies, dict(table.groups),
                                     x)
    target = seen_updates(start[x], lag[x], copies, per, period, delay)[us.index(source)]
    d = delay
    for _ in range(per * (len(us) + 2) + 2):
        if max(seen_updates(start[x], lag[x], copies, per, period, d)) <= target:
            return d
        # The next delay at which some copy's seen update drops: (X - d) // P falls when d passes X mod P.
        d += min((start[x] - s - o - d) % period + 1 for s, _, _, o in copies)
    raise AssertionError(f"no delay pins reader {x} to copy {source}")  # updates out of order: not a timing


def _update_copies_by_layer(table: UnfoldedTable) -> dict[int, list[int]]:
    copies: dict[int, list[int]] = {}
    for v, t in enumerate(table.tasks):
        if t.kind == "U":
            copies.setdefault(t.layer, []).append(v)
    return copies


def _reader_copies(table: UnfoldedTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int],
                   by_layer: Mapping[int, list[int]], groups: Mapping[int, int],
                   x: int) -> tuple[list[int], list[tuple[int, int, int, int]], int]:
    """Reader x's layer's update copies, their (start, lag, phase, `read_offset`) and J/g."""
    layer = table.tasks[x].layer
    us = by_layer[layer]
    copies = [(start[q], lag[q], table.phase[q],
               read_offset(table.cost[q], table.cost[x], placement[q] == placement[x])) for q in us]
    return us, copies, table.unfold // groups.get(layer, 1)


#: `periodic_of`'s schedules by their inputs (table content, placement, timing, arrivals, floor): a policy scores
#: its candidate timings on their schedules and then builds the winner's result from the same inputs, so the
#: winner's schedule — and the read pins it keeps — is the one already scored. Bounded; oldest dropped first.
_SCHEDULES: BoundedMemo[tuple[object, ...], PeriodicSchedule] = BoundedMemo(16)


def periodic_of(table: TaskTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int], period: int,
                num_procs: int, arrival: Mapping[tuple[int, int], int] | None = None,
                floor: Sequence[tuple[str, int, int, int]] = ()) -> PeriodicSchedule:
    """The IR form of a timing of a plain or unfolded table: slots with their phases, the table's unfolding and
    groups, the delay of every remote weight read (`arrival`, the planned transfers) and designed pins
    (`floor`, `PeriodicSchedule.read_floor`). Memoised: results share one schedule, which is frozen and which
    no pass changes in place (`dataclasses.replace` makes the variants, e.g. other costs)."""
    key = (table.token, tuple(placement), tuple(start), tuple(lag), period, num_procs,
           tuple(sorted(arrival.items())) if arrival else (), tuple(floor))
    found = _SCHEDULES.get(key)
    if found is None:
        found = _SCHEDULES.add(key, _periodic_of(table, placement, start, lag, period, num_procs, arrival, floor))
    return found


def _periodic_of(table: TaskTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int], period: int,
                 num_procs: int, arrival: Mapping[tuple[int, int], int] | None,
                 floor: Sequence[tuple[str, int, int, int]]) -> PeriodicSchedule:
    phase = table.phase if isinstance(table, UnfoldedTable) else (0,) * len(table)
    bodies: list[list[Slot]] = [[] for _ in range(num_procs)]
    for v, t in enumerate(table.tasks):
        bodies[placement[v]].append(make_slot(start[v], t.kind, t.layer, lag[v], phase[v]))
    costs = {(t.kind, t.layer): c for t, c in zip(table.tasks, table.cost, strict=True)}
    delays: dict[tuple[str, int] | tuple[str, int, int], int] = {}
    for u, x, _ in table.weight_reads:
        if arrival and (u, x) in arrival:
            t = table.tasks[x]
            key = (t.kind, t.layer, phase[x]) if phase[x] else (t.kind, t.layer)
            delays[key] = arrival[(u, x)] - start[u] - table.cost[u]
    unfold = table.unfold if isinstance(table, UnfoldedTable) else 1
    groups = table.groups if isinstance(table, UnfoldedTable) else ()
    return PeriodicSchedule(period, tuple(tuple(sorted(b, key=slot_order)) for b in bodies), costs, delays, unfold,
                            groups, tuple(floor))


def update_chain_lags(table: TaskTable, start: Sequence[int], lag: Sequence[int], period: int) -> list[int] | None:
    """`lag` raised until the update order holds around the period: U phase q − 1 before phase q (delay 0)
    and the last phase before phase 0 of the next period (delay 1) — the one cycle of the unfolded graph the
    passes of `_lags` (a longest path over delay-0 edges) do not see. Only update lags change (no delay-0
    edge leaves an update except to the next one; weight reads are versions, not precedence). None when the
    body order of a layer's update copies admits no lags (they are out of cyclic order in the period)."""
    if not isinstance(table, UnfoldedTable):
        return list(lag)
    out = list(lag)
    cost = table.cost
    for order in table.update_chains:
        for _ in range(len(order) + 2):
            changed = False
            for k, v in enumerate(order):
                u = order[k - 1]
                wrap = 1 if k == 0 else 0
                need = out[u] - wrap - ((start[v] - start[u] - cost[u]) // period)
                if need > out[v]:
                    out[v], changed = need, True
            if not changed:
                break
        else:
            return None
    return out


def balanced_unfolded(table: TaskTable, unfold: int, num_procs: int, interconnect: Interconnect = SHARED,
                      together: bool = False) -> tuple[UnfoldedTable, list[int], int, Timing]:
    """LayerPipe's load balancing on `table` unfolded by J (`--unfold J`, issue 10 item 5): the copies are the
    items (LPT + moves and swaps, `balance`), so a heavy task's copies of alternate iterations may land on
    different processors; a layer's update copies stay together (one processor holds W_l and applies its
    updates in order), and under `together` every weight task copy of the layer with them. The period is the
    busiest processor or channel; bodies are ordered and packed by `best_ordering` (ASAP orders and target
    packings), lags are the minimal ones on the interconnect, raised where the update order wraps around the
    period (`update_chain_lags`). Simplification: one update per iteration (no groups), the placement is
    chosen for load, not traffic."""
    unfolded = unfold_table(table, unfold)
    weighted = {t.layer for t in table.tasks if t.kind == "U"}
    keys: dict[object, int] = {}
    item_of = []
    for v, t in enumerate(unfolded.tasks):
        if t.kind == "U" or (together and t.layer in weighted and any(t.has(k) for k in "FEGU")):
            key: object = ("layer", t.layer)
        else:
            key = v
        item_of.append(keys.setdefault(key, len(keys)))
    weights = [0] * len(keys)
    for v, i in enumerate(item_of):
        weights[i] += unfolded.cost[v]
    item_proc = balance(weights, num_procs)
    placement = [item_proc[i] for i in item_of]
    loads = [0] * num_procs
    for v, p in enumerate(placement):
        loads[p] += unfolded.cost[v]
    period = max(max(loads), busiest_channel(unfolded, Comm(placement, interconnect, num_procs)))
    asap = asap_times(unfolded)
    candidates = []
    keyed = [[key] for key in asap_keys(asap, period)]
    for keys_, targets in [*[(k, []) for k in keyed], ([], default_targets(unfolded, placement, num_procs, asap))]:
        found = best_ordering(unfolded, placement, num_procs, period, keys_, targets, interconnect=interconnect)
        lags = update_chain_lags(unfolded, found.start, found.lag, period)
        if lags is not None:
            candidates.append(timing_of(unfolded, found.start, lags, period, found.arrival))
    if not candidates:
        raise InputError(f"unfold={unfold}: no body order keeps a layer's update copies in order; try another J")
    return unfolded, placement, period, min(candidates, key=Timing.score)

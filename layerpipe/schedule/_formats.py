"""Schedule file formats: text, CSV, JSON, and torch.distributed.pipelining's action strings and CSV.

- text: `OpSchedule.to_text` / `from_text` (one line per processor, ops like `F3.7`), and the periodic form.
- CSV: one row per processor, one column per time step or op slot, an empty cell is idle; an optional first
  line `# layerpipe schedule v1 ...` (the text form's header) carries level, synchronous and micro-batches.
  Cells are op texts; errors name the row (the file's line) and the cell (1-based), e.g.
  "schedule CSV row 3, cell 5: 'X9' is not an op".
- torch: `_Action` strings `2F0` (stage 2, forward, micro-batch 0); kinds F, I, W, B map one to one. On import,
  torch's communication and memory actions (SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD)
  are dropped — our simulator models transfers itself and the update is implicit at the end of a step —
  and OVERLAP_F_B `(0F1;1B0)OVERLAP_F_B` becomes its sub-actions in order. The torch CSV is exactly what
  torch 2.13's `_dump_csv` writes (csv.writer's default dialect, CRLF, one row per rank, `str(action)` per
  cell, "" for an idle step) and what its `_load_csv` reads.

Everything here is pure text: torch itself is never imported (torch `_Action`s may be passed in; their
`str()` is the action string).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence

from layerpipe.errors import InputError
from layerpipe.schedule._ir import (
    KINDS_LAYER,
    KINDS_STAGE,
    LEVELS,
    Op,
    OpSchedule,
    _header_int,
    check_unfolding,
    format_groups,
    format_pins,
    parse_groups,
    parse_op,
    parse_phase_reads,
)
from layerpipe.schedule._periodic import PeriodicSchedule, slot_order

#: Names of the formats `dump_schedule` and `load_schedule` take.
FORMATS = ("text", "csv", "torch-csv", "json")

_OP_TEXT = re.compile(r"([A-Z]+)(\d+)\.(\d+)")
_TORCH_ACTION = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
_TORCH_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")
_TORCH_COMPUTE = ("F", "I", "B", "W")
_TORCH_IGNORED = ("UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_F", "SEND_B", "RECV_B")


# ------------------------------------------------------------------------------------------------- CSV


def _header(schedule: OpSchedule) -> str:
    return schedule.to_text().splitlines()[0]


def _grid_rows(schedule: OpSchedule, columns: Mapping[Op, int] | None) -> list[list[Op | None]]:
    """Per processor, the ops at their columns (idle = None); without `columns`, packed in program order."""
    if columns is None:
        return [list(row) for row in schedule.procs]
    rows: list[list[Op | None]] = []
    for p, row in enumerate(schedule.procs):
        cells: list[Op | None] = []
        for op in row:
            col = columns[op]
            if col < len(cells):
                raise InputError(f"CSV columns: {op} on p{p} is at column {col}, at or before the op before it")
            cells += [None] * (col - len(cells)) + [op]
        rows.append(cells)
    return rows


def to_csv(schedule: OpSchedule, columns: Mapping[Op, int] | None = None) -> str:
    """The CSV form: header comment, then one row per processor (rows padded to one width).

    `columns` places each op at a column (a time step, e.g. the start times of a unit-time `dry_run`);
    the cells between are idle. Without it, ops are packed in program order.
    """
    rows = _grid_rows(schedule, columns)
    width = max((len(r) for r in rows), default=0)
    out = io.StringIO()
    out.write(_header(schedule) + "\n")
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow([str(op) if op is not None else "" for op in row] + [""] * (width - len(row)))
    return out.getvalue()


def _read_header(line: str) -> dict[str, str]:
    fields = {}
    for word in line.lstrip("#").split():
        key, eq, value = word.partition("=")
        fields[key] = value if eq else "true"
    return fields


def from_csv(text: str) -> OpSchedule:
    """Parse the CSV form exactly: every non-empty cell must be an op of the schedule's level."""
    level, sync, m, unfold = "layer", False, 0, 1
    reads: tuple[tuple[str, int, int], ...] = ()
    phased: tuple[tuple[str, int, int, int], ...] = ()
    groups: tuple[tuple[int, int], ...] = ()
    floor: tuple[tuple[str, int, int, int], ...] = ()
    lines = text.splitlines()
    first_row = 1
    if lines and lines[0].startswith("#"):
        fields = _read_header(lines[0])
        level = fields.get("level", "layer")
        sync = "synchronous" in fields
        try:
            m = int(fields.get("microbatches", "0"))
        except ValueError:
            raise InputError(f"schedule CSV row 1: microbatches '{fields['microbatches']}' is not an integer") from None
        if level not in LEVELS:
            raise InputError(f"schedule CSV row 1: level '{level}' is not one of {', '.join(LEVELS)}")
        if "reads" in fields:
            pins = parse_phase_reads(f"reads={fields['reads']}", 1)
            reads = tuple((k, layer, st) for k, layer, phase, st in pins if phase == 0)
            phased = tuple(r for r in pins if r[2] > 0)
        if "unfold" in fields:  # unfolded schedules (J iterations per period) with update groups
            unfold = _header_int(f"unfold={fields['unfold']}", 1)
        if "groups" in fields:
            groups = parse_groups(f"groups={fields['groups']}", 1)
        if "floor" in fields:
            floor = tuple(parse_phase_reads(f"reads={fields['floor']}", 1))
        check_unfolding(unfold, groups)
        first_row = 2
    kinds = KINDS_STAGE if level == "stage" else KINDS_LAYER
    procs: list[tuple[Op, ...]] = []
    for r, cells in enumerate(csv.reader(lines[first_row - 1 :]), start=first_row):
        p = len(procs)
        row: list[Op] = []
        for c, cell in enumerate(cells, start=1):
            if cell == "":
                continue
            match = _OP_TEXT.fullmatch(cell)
            if not match:
                raise InputError(f"schedule CSV row {r}, cell {c}: '{cell}' is not an op (like F3.7)")
            if match.group(1) not in kinds:
                raise InputError(
                    f"schedule CSV row {r}, cell {c}: '{cell}' has kind '{match.group(1)}', "
                    f"not one of the {level}-level kinds {', '.join(kinds)}"
                )
            row.append(Op(p, match.group(1), int(match.group(2)), int(match.group(3))))
        procs.append(tuple(row))
    return OpSchedule(level, tuple(procs), sync, m, reads, unfold, groups, phased, floor)


# ----------------------------------------------------------------------------------------------- torch


def _step_rows(schedule: OpSchedule, step: int | None) -> tuple[list[list[Op]], int]:
    """Per processor, the ops of one step (all ops when `step` is None), and the step's first micro-batch."""
    if schedule.level != "stage":
        raise InputError("torch actions need a stage-level schedule; this one is layer-level")
    if step is None:
        if schedule.synchronous and schedule.num_steps > 1:
            raise InputError(f"schedule has {schedule.num_steps} steps; torch takes one: choose a step")
        return [list(row) for row in schedule.procs], 0
    if not schedule.synchronous or schedule.microbatches < 1:
        raise InputError("step: only synchronous schedules have steps")
    lo, hi = step * schedule.microbatches, (step + 1) * schedule.microbatches
    return [[op for op in row if lo <= op.iteration < hi] for row in schedule.procs], lo


def to_torch_actions(schedule: OpSchedule, step: int | None = None) -> dict[int, list[str]]:
    """Per rank, the `_Action` strings of one step of a stage-level schedule.

    torch schedules are one step of micro-batches 0..m−1: a multi-step schedule needs `step`, whose
    micro-batches are renumbered from 0.
    """
    rows, base = _step_rows(schedule, step)
    return {p: [f"{op.unit}{op.kind}{op.iteration - base}" for op in row] for p, row in enumerate(rows)}


def _parse_torch_action(text: str, where: str) -> list[tuple[str, int, int]]:
    """(kind, stage, micro-batch) of the compute ops in one action string; [] for an ignored action."""
    overlap = _TORCH_OVERLAP.fullmatch(text)
    if overlap:
        return [op for sub in overlap.group(1).split(";") if sub for op in _parse_torch_action(sub, where)]
    match = _TORCH_ACTION.fullmatch(text)
    if not match:
        raise InputError(f"{where}: '{text}' is not a torch action (stage, type, micro-batch like 2F0)")
    stage, kind, mb = match.groups()
    if kind in _TORCH_IGNORED:
        return []
    if not mb:
        raise InputError(f"{where}: compute action '{text}' has no micro-batch index")
    return [(kind, int(stage), int(mb))]


def from_torch_actions(
    actions: Mapping[int, Sequence[object | None]] | Sequence[Sequence[object | None]],
    microbatches: int | None = None,
) -> OpSchedule:
    """A synchronous stage-level schedule from torch's per-rank actions (strings, `_Action`s or None).

    `microbatches` defaults to the largest micro-batch index + 1.
    """
    ranks = actions if isinstance(actions, Mapping) else dict(enumerate(actions))
    if sorted(ranks) != list(range(len(ranks))):
        raise InputError(f"torch actions: ranks must be 0..{len(ranks) - 1}, got {sorted(ranks)}")
    procs = []
    for p in range(len(ranks)):
        row = []
        for i, action in enumerate(ranks[p]):
            text = "" if action is None else str(action)
            if text.strip() == "":
                continue
            for kind, stage, mb in _parse_torch_action(text, f"torch actions rank {p}, step {i}"):
                row.append(Op(p, kind, stage, mb))
        procs.append(tuple(row))
    m = microbatches if microbatches is not None else 1 + max((op.iteration for r in procs for op in r), default=0)
    return OpSchedule("stage", tuple(procs), synchronous=True, microbatches=m)


def to_torch_csv(schedule: OpSchedule, columns: Mapping[Op, int] | None = None, step: int | None = None) -> str:
    """torch's `_dump_csv` text of one step: csv.writer's default dialect, one row per rank, "" = idle.

    `columns` places ops at time steps as in `to_csv` (torch's pipeline orders hold None for idle steps).
    """
    rows, base = _step_rows(schedule, step)
    out = io.StringIO()
    writer = csv.writer(out)
    for row in rows:
        cells = _grid_rows(OpSchedule("stage", (tuple(row),)), columns)[0] if columns is not None else row
        writer.writerow([f"{op.unit}{op.kind}{op.iteration - base}" if op is not None else "" for op in cells])
    return out.getvalue()


def from_torch_csv(text: str, microbatches: int | None = None) -> OpSchedule:
    """Read what torch's `_dump_csv` writes; errors name the CSV row (rank + 1) and cell."""
    rows = []
    for r, cells in enumerate(csv.reader(io.StringIO(text, newline="")), start=1):
        row: list[str] = []
        for c, cell in enumerate(cells, start=1):
            if cell.strip() == "":
                row.append("")
                continue
            _parse_torch_action(cell.strip(), f"torch CSV row {r}, cell {c}")
            row.append(cell.strip())
        rows.append(row)
    return from_torch_actions(rows, microbatches)


# ----------------------------------------------------------------------------------------- JSON, dispatch


def to_json(schedule: OpSchedule | PeriodicSchedule) -> str:
    """A stable JSON document (sorted keys, ops as text)."""
    if isinstance(schedule, PeriodicSchedule):
        doc: dict[str, object] = {
            "format": "layerpipe-periodic-schedule",
            "version": 1,
            "period_cycles": schedule.period,
            "bodies": [[str(s) for s in sorted(body, key=slot_order)] for body in schedule.bodies],
        }
        _unfolding_fields(doc, schedule.unfold, schedule.groups)
        if schedule.read_floor:
            doc["read_floor"] = format_pins(schedule.read_floor)
    else:
        doc = {
            "format": "layerpipe-schedule",
            "version": 1,
            "level": schedule.level,
            "synchronous": schedule.synchronous,
            "microbatches": schedule.microbatches,
            "procs": [[str(op) for op in row] for row in schedule.procs],
        }
        pins = [f"{k}{layer}:{st}" for k, layer, st in schedule.read_staleness]
        pins += [f"{k}{layer}.{ph}:{st}" for k, layer, ph, st in schedule.read_phases]
        if pins:
            doc["read_staleness"] = pins
        _unfolding_fields(doc, schedule.unfold, schedule.groups)
        if schedule.read_floor:
            doc["read_floor"] = format_pins(schedule.read_floor)
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _unfolding_fields(doc: dict[str, object], unfold: int, groups: tuple[tuple[int, int], ...]) -> None:
    """`unfold` and `groups` only when not trivial, so schedules of one iteration per period keep their JSON."""
    if unfold != 1:
        doc["unfold"] = unfold
    if groups:
        doc["groups"] = format_groups(groups)


def _unfolding_header(doc: dict) -> str:
    """The text header words of a JSON document's `unfold`, `groups` and `read_floor` (parsed by the text
    readers, which check them)."""
    words = ""
    if "unfold" in doc:
        words += f" unfold={doc['unfold']}"
    if "groups" in doc:
        words += f" groups={doc['groups']}"
    if "read_floor" in doc:
        floor = doc["read_floor"]
        if not isinstance(floor, str) or " " in floor:
            raise InputError("schedule JSON: field 'read_floor' must be a string like 'F3:1,F3.1:1'")
        words += " floor=" + floor
    return words


def from_json(text: str) -> OpSchedule | PeriodicSchedule:
    """Parse `to_json`'s output exactly."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"schedule JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    kind = doc.get("format") if isinstance(doc, dict) else None
    if kind == "layerpipe-periodic-schedule":
        lines = [f"# layerpipe periodic schedule v1 period={doc.get('period_cycles')}{_unfolding_header(doc)}"]
        lines += [f"p{p}: " + " ".join(_json_tokens(body, "bodies")) for p, body in enumerate(doc.get("bodies", []))]
        return PeriodicSchedule.from_text("\n".join(lines))
    if kind != "layerpipe-schedule":
        raise InputError("schedule JSON: field 'format' must be 'layerpipe-schedule' or 'layerpipe-periodic-schedule'")
    level = doc.get("level")
    if level not in LEVELS:
        raise InputError(f"schedule JSON: field 'level' must be one of {', '.join(LEVELS)}, got {level!r}")
    m = doc.get("microbatches", 0)
    if not isinstance(m, int) or m < 0:
        raise InputError(f"schedule JSON: field 'microbatches' must be an integer >= 0, got {m!r}")
    procs = tuple(
        tuple(parse_op(tok, p) for tok in _json_tokens(row, "procs")) for p, row in enumerate(doc.get("procs", []))
    )
    reads = doc.get("read_staleness", [])
    if not isinstance(reads, list) or not all(isinstance(r, str) for r in reads):
        raise InputError("schedule JSON: field 'read_staleness' must be a list of strings like 'F3:2'")
    pins = parse_phase_reads("reads=" + ",".join(reads), 1) if reads else []
    head = OpSchedule.from_text("#" + _unfolding_header(doc))
    return OpSchedule(level, procs, bool(doc.get("synchronous", False)), m,
                      tuple((k, layer, st) for k, layer, ph, st in pins if ph == 0), head.unfold, head.groups,
                      tuple(r for r in pins if r[2] > 0), head.read_floor)


def _json_tokens(row: object, field: str) -> list[str]:
    if not isinstance(row, list) or not all(isinstance(t, str) and t and " " not in t for t in row):
        raise InputError(f"schedule JSON: field '{field}' must be a list of lists of op strings")
    return row


def dump_schedule(schedule: OpSchedule | PeriodicSchedule, fmt: str) -> str:
    """`schedule` in format `fmt` (one of FORMATS; periodic schedules: text or json)."""
    if fmt not in FORMATS:
        raise InputError(f"format '{fmt}' is not one of {', '.join(FORMATS)}")
    if fmt == "json":
        return to_json(schedule)
    if fmt == "text":
        return schedule.to_text()
    if isinstance(schedule, PeriodicSchedule):
        raise InputError(f"format '{fmt}' takes explicit schedules; periodic ones are text or json (or unroll first)")
    return to_csv(schedule) if fmt == "csv" else to_torch_csv(schedule)


def load_schedule(text: str, fmt: str) -> OpSchedule | PeriodicSchedule:
    """Parse `text` in format `fmt`; a text document is periodic when its header says so."""
    if fmt not in FORMATS:
        raise InputError(f"format '{fmt}' is not one of {', '.join(FORMATS)}")
    if fmt == "json":
        return from_json(text)
    if fmt == "csv":
        return from_csv(text)
    if fmt == "torch-csv":
        return from_torch_csv(text)
    if text.lstrip().startswith("# layerpipe periodic schedule"):
        return PeriodicSchedule.from_text(text)
    return OpSchedule.from_text(text)

"""Schedule formats: exact round trips (text, CSV, JSON, torch actions and torch CSV), parser errors that
name the row and cell, and byte-for-byte interop with torch 2.13's own `_dump_csv` / `_load_csv`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.schedule import (
    KINDS_LAYER,
    KINDS_STAGE,
    Op,
    OpSchedule,
    PeriodicSchedule,
    Slot,
    dump_schedule,
    from_csv,
    from_torch_actions,
    from_torch_csv,
    gpipe,
    load_schedule,
    to_csv,
    to_torch_actions,
    to_torch_csv,
    zb_h1,
)


@st.composite
def op_schedules(draw: st.DrawFn, level: str | None = None, one_step: bool = False) -> OpSchedule:
    level = level or draw(st.sampled_from(["layer", "stage"]))
    kinds = KINDS_STAGE if level == "stage" else KINDS_LAYER
    sync = True if one_step else draw(st.booleans())
    m = draw(st.integers(1, 8)) if sync else 0
    max_it = m - 1 if one_step else 40
    procs = draw(st.integers(1, 5))
    rows = []
    for p in range(procs):
        ops = draw(
            st.lists(
                st.tuples(st.sampled_from(kinds), st.integers(0, 12), st.integers(0, max_it)), max_size=12, unique=True
            )
        )
        rows.append(tuple(Op(p, k, u, t) for k, u, t in ops))
    return OpSchedule(level, tuple(rows), sync, m)


@st.composite
def columns_for(draw: st.DrawFn, schedule: OpSchedule) -> dict[Op, int]:
    """Increasing columns per processor with random idle gaps."""
    cols = {}
    for row in schedule.procs:
        col = -1
        for op in row:
            col += 1 + draw(st.integers(0, 2))
            cols[op] = col
    return cols


@settings(max_examples=60, deadline=None)
@given(op_schedules())
def test_text_csv_json_round_trip(schedule: OpSchedule) -> None:
    assert OpSchedule.from_text(schedule.to_text()) == schedule
    assert from_csv(to_csv(schedule)) == schedule
    for fmt in ("text", "csv", "json"):
        assert load_schedule(dump_schedule(schedule, fmt), fmt) == schedule


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_csv_with_idle_cells_round_trip(data: st.DataObject) -> None:
    schedule = data.draw(op_schedules())
    cols = data.draw(columns_for(schedule))
    text = to_csv(schedule, cols)
    assert from_csv(text) == schedule
    for p, line in enumerate(text.splitlines()[1:]):  # each op sits in its column
        cells = line.split(",")
        for op in schedule.procs[p]:
            assert cells[cols[op]] == str(op)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_torch_actions_and_csv_round_trip(data: st.DataObject) -> None:
    schedule = data.draw(op_schedules(level="stage", one_step=True))
    m = schedule.microbatches
    assert from_torch_actions(to_torch_actions(schedule), microbatches=m) == schedule
    assert from_torch_csv(to_torch_csv(schedule), microbatches=m) == schedule
    assert from_torch_csv(to_torch_csv(schedule, data.draw(columns_for(schedule))), microbatches=m) == schedule
    assert load_schedule(dump_schedule(schedule, "torch-csv"), "torch-csv").procs == schedule.procs


def test_periodic_text_and_json_round_trip() -> None:
    periodic = PeriodicSchedule(7, ((Slot(0, "F", 1, 0), Slot(3, "AEG", 1, 2)), (Slot(5, "U", 1, 1),)))
    for fmt in ("text", "json"):
        assert load_schedule(dump_schedule(periodic, fmt), fmt) == periodic
    with pytest.raises(InputError, match="periodic ones are text or json"):
        dump_schedule(periodic, "csv")


# -------------------------------------------------------------------------------------------- parser errors


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "# layerpipe schedule v1 level=stage\nF0.0,B0.0\nF1.0,,,,X9\n",
            "schedule CSV row 3, cell 5: 'X9' is not an op",
        ),
        ("F1.0,F2.0 \n", "schedule CSV row 1, cell 2: 'F2.0 ' is not an op"),
        (
            "# layerpipe schedule v1 level=stage\nF0.0,A1.0\n",
            "row 2, cell 2: 'A1.0' has kind 'A', not one of the stage",
        ),
        ("F1.0\nB1.0\n", "schedule CSV row 2, cell 1: 'B1.0' has kind 'B'"),
        (
            "# layerpipe schedule v1 level=stage synchronous microbatches=x\n",
            "row 1: microbatches 'x' is not an integer",
        ),
        ("# layerpipe schedule v1 level=chunk\n", "level 'chunk' is not one of layer, stage"),
    ],
)
def test_csv_errors_name_row_and_cell(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        from_csv(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,0Q1\n", "torch CSV row 1, cell 2: '0Q1' is not a torch action"),
        ("0F0\n1F0,1F\n", "torch CSV row 2, cell 2: compute action '1F' has no micro-batch index"),
        ("0F0,0F0x\n", "torch CSV row 1, cell 2: '0F0x' is not a torch action"),
    ],
)
def test_torch_csv_errors_name_row_and_cell(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        from_torch_csv(text)


def test_text_form_errors() -> None:
    with pytest.raises(InputError, match=r"schedule line 2: op 'F1' is not KIND UNIT\.ITERATION"):
        OpSchedule.from_text("# layerpipe schedule v1 level=layer\np0: F1\n")
    with pytest.raises(InputError, match="field 'microbatches' must be a non-negative integer"):
        OpSchedule.from_text("# layerpipe schedule v1 level=stage synchronous microbatches=-2\n")
    with pytest.raises(InputError, match="kind is not a stage-level kind"):
        OpSchedule.from_text("# layerpipe schedule v1 level=stage\np0: A0.0\n")


def test_torch_non_compute_actions_are_dropped_and_overlap_expands() -> None:
    row = ["0UNSHARD", "0F0", "0SEND_F0", "1RECV_B0", "(0F1;0B0)OVERLAP_F_B", None, "0B1", "0REDUCE_GRAD", "0RESHARD"]
    schedule = from_torch_actions([row], microbatches=2)
    assert [str(op) for op in schedule.procs[0]] == ["F0.0", "F0.1", "B0.0", "B0.1"]


def test_torch_export_rules() -> None:
    with pytest.raises(InputError, match="stage-level"):
        to_torch_actions(OpSchedule("layer", ((Op(0, "F", 1, 0),),)))
    two_steps = gpipe(2, 2, steps=2)
    with pytest.raises(InputError, match="2 steps; torch takes one"):
        to_torch_actions(two_steps)
    assert to_torch_actions(two_steps, step=1) == to_torch_actions(gpipe(2, 2))


# ------------------------------------------------------------------------------------------ torch itself


def test_torch_csv_is_byte_identical_to_torch_dump_and_loads_in_torch(tmp_path) -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    stages = [SimpleNamespace(num_stages=8, group_size=4, group_rank=0, stage_index=s, submod=None) for s in (0, 4)]
    torch_schedule = schedules.ScheduleInterleavedZeroBubble(stages, 8)
    order = torch_schedule.pipeline_order
    theirs = tmp_path / "theirs.csv"
    torch_schedule._dump_csv(str(theirs), format="compute_only")

    ours = from_torch_actions(order, microbatches=8)
    assert ours == zb_h1(4, 8, 2)
    positions = {}
    for p, row in enumerate(ours.procs):
        steps = [i for i, a in enumerate(order[p]) if a is not None]
        positions.update(zip(row, steps, strict=True))
        assert order[p][-1] is not None  # no trailing idle steps, so the rows end alike
    text = to_torch_csv(ours, positions)
    assert text.encode() == theirs.read_bytes()
    assert from_torch_csv(theirs.read_bytes().decode(), microbatches=8) == ours

    mine = tmp_path / "ours.csv"
    mine.write_bytes(to_torch_csv(zb_h1(4, 8, 2)).encode())
    torch_schedule._load_csv(str(mine), format="compute_only")
    reloaded = {r: [str(a) for a in acts] for r, acts in torch_schedule.pipeline_order.items()}
    assert reloaded == to_torch_actions(zb_h1(4, 8, 2))

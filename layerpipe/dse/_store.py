"""The results file of a sweep: one CSV, a row appended as each point finishes.

Crash safety: the parent process is the only writer; each row is one `write` of one whole line on a file
opened with O_APPEND, followed by fsync, so a run killed at any moment leaves every finished row intact and
at most one torn last line, which `read_rows` drops (and `--resume` truncates) because it lacks its
newline. Every row carries the `sweep_id`, so `--resume` refuses a file made by a different sweep. When a
run completes, the file is rewritten atomically in point order, so a finished sweep's file has the same
bytes however many workers produced it (no wall-clock figures in it, for the same reason).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path

from layerpipe._files import write_atomic
from layerpipe.errors import InputError

#: Result columns, with units in their names. Stable: downstream scripts read these.
COLUMNS: tuple[str, ...] = (
    "sweep_id",
    "point_index",
    "network",
    "num_procs",
    "policy",
    "max_staleness_bound",
    "lanes",
    "link_latency_cycles",
    "link_words_per_cycle",
    "batch",
    "cost_model",
    "cycles_per_sample",
    "lower_bound_cycles_per_sample",
    "utilization_pct",
    "traffic_words_per_sample",
    "peak_memory_words",
    "weight_versions",
    "max_staleness",
    "area_luts",
    "area_ffs",
    "area_dsps",
)


def _line(row: dict[str, object]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(row.get(c)) for c in COLUMNS])
    return buf.getvalue()


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def header() -> str:
    return ",".join(COLUMNS) + "\n"


class ResultsFile:
    """Append-only CSV of finished points."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def start(self, sweep_id: str, resume: bool) -> set[int]:
        """Prepare the file; returns the point indices already done (resume) or an empty set."""
        if resume and self.path.exists():
            rows = self.read_rows(truncate_torn=True)
            other = {r["sweep_id"] for r in rows} - {sweep_id}
            if other:
                raise InputError(f"--resume: {self.path} holds results of a different sweep "
                                 f"(sweep_id {sorted(other)[0]}, this sweep is {sweep_id})")
            return {int(r["point_index"]) for r in rows}
        write_atomic(self.path, header())
        return set()

    def append(self, row: dict[str, object]) -> None:
        data = _line(row).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_rows(self, truncate_torn: bool = False) -> list[dict[str, str]]:
        raw = self.path.read_bytes()
        if not raw.startswith(header().encode()):
            raise InputError(f"{self.path}: not a layerpipe results file (header differs)")
        if not raw.endswith(b"\n"):  # a torn last line from a killed run: drop it
            cut = raw.rfind(b"\n") + 1
            raw = raw[:cut]
            if truncate_torn:
                with open(self.path, "r+b") as fh:
                    fh.truncate(cut)
        reader = csv.DictReader(io.StringIO(raw.decode()))
        return list(reader)

    def finalize(self) -> None:
        """Rewrite in point order (deterministic bytes), one row per point (last wins)."""
        rows = {int(r["point_index"]): r for r in self.read_rows()}
        body = "".join(_line(rows[i]) for i in sorted(rows))
        write_atomic(self.path, header() + body)


def write_csv(path: str | Path, columns: Iterable[str], rows: Iterable[dict[str, object]]) -> None:
    cols = list(columns)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in cols])
    write_atomic(path, buf.getvalue())

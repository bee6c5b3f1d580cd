"""The results file of a sweep: one CSV, a row appended as each point finishes.

Crash safety: the parent process is the only writer; each row is one `write` of one whole line on a file
opened with O_APPEND, so a run killed at any moment leaves every finished row intact (a finished `write` is
the kernel's, whatever becomes of the process) and at most one torn last line, which `read_rows` drops (and
`--resume` truncates) because it lacks its newline. Every row carries the `sweep_id`, so `--resume` refuses a
file made by a different sweep. When a run completes, the file is rewritten atomically in point order, so a
finished sweep's file has the same bytes however many workers produced it (no wall-clock figures in it, for
the same reason).

Against power loss the rows are fsynced at most `FSYNC_INTERVAL` seconds apart, not one by one: an fsync per
row was ~1 % of an `explore` run's CPU and ~0.4 ms of wall clock per point on a local disk (issue 14), far more
on a network file system, for a guarantee (`docs/guarantees.md`) about killed processes, which needs none.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from layerpipe._files import read_bytes_limited, write_atomic
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
    "interconnect",
    "max_traffic_bound",
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
    "area_brams",
    "area_part",  # the FPGA part the area figures were placed and routed on (hdl/_fpga.py)
    "fmax_mhz",  # after routing on area_part
)


#: Largest results file read back (a million points is about 300 MB).
MAX_RESULTS_BYTES = 1 << 30


def _line(row: Mapping[str, object]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(row.get(c)) for c in COLUMNS])
    return buf.getvalue()


def _cell(value: object) -> str:
    """Exact text of a value: a float as its shortest round-trip repr (24720992.0 → '24720992', never the
    6-digit '2.4721e+07' that lost data, issue 12 item 4), so a reader gets back the very number written."""
    if value is None:
        return ""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    return str(value)


def header() -> str:
    return ",".join(COLUMNS) + "\n"


#: Seconds between fsyncs of appended rows (`ResultsFile.append`).
FSYNC_INTERVAL = 1.0


class ResultsFile:
    """Append-only CSV of finished points."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._synced_at: float | None = None  # monotonic time of the last fsync of appended rows

    def check(self, sweep_id: str) -> list[dict[str, str]]:
        """Before any work: an existing --out must be a results file of this sweep (or hold no rows yet).

        A file belongs to one sweep (every row's `sweep_id` says which); another file, or another sweep's, is
        refused with one line rather than overwritten or mixed (issue 12 item 4)."""
        if not self.path.exists():
            return []
        rows = self.read_rows()
        other = {r["sweep_id"] for r in rows} - {sweep_id}
        if other:
            raise InputError(f"--out {self.path} holds results of a different sweep (sweep_id {sorted(other)[0]}, "
                             f"this sweep is {sweep_id}); one file holds one sweep: give another --out")
        return rows

    def start(self, sweep_id: str, resume: bool) -> set[int]:
        """Prepare the file; returns the point indices already done (resume) or an empty set."""
        self.check(sweep_id)
        if resume and self.path.exists():
            rows = self.read_rows(truncate_torn=True)
            return {int(r["point_index"]) for r in rows}
        write_atomic(self.path, header())  # this sweep's own file, run again from the start
        return set()

    def append(self, row: dict[str, object]) -> None:
        """One whole line, one `write`; fsynced if `FSYNC_INTERVAL` has passed since the last fsync (or none yet)."""
        data = _line(row).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
            now = time.monotonic()
            if self._synced_at is None or now - self._synced_at >= FSYNC_INTERVAL:
                os.fsync(fd)
                self._synced_at = now
        finally:
            os.close(fd)

    def read_rows(self, truncate_torn: bool = False) -> list[dict[str, str]]:
        raw = read_bytes_limited(self.path, "results file", MAX_RESULTS_BYTES)
        if not raw.startswith(header().encode()):
            raise InputError(f"{self.path} exists and is not a layerpipe results file (its header differs); "
                             "give a new --out or the results file of this sweep")
        if not raw.endswith(b"\n"):  # a torn last line from a killed run: drop it
            cut = raw.rfind(b"\n") + 1
            raw = raw[:cut]
            if truncate_torn:
                with open(self.path, "r+b") as fh:
                    fh.truncate(cut)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"results file {self.path}: not UTF-8 text (byte {exc.start})") from None
        rows = list(csv.DictReader(io.StringIO(text)))
        for number, row in enumerate(rows, start=2):
            if None in row or not row.get("point_index", "").isdigit():
                raise InputError(f"results file {self.path}: line {number} is not a row of {len(COLUMNS)} "
                                 "columns with a point_index")
        return rows

    def finalize(self) -> None:
        """Rewrite in point order (deterministic bytes), one row per point (last wins)."""
        rows = {int(r["point_index"]): r for r in self.read_rows()}
        body = "".join(_line(rows[i]) for i in sorted(rows))
        write_atomic(self.path, header() + body)


def write_csv(path: str | Path, columns: Iterable[str], rows: Iterable[Mapping[str, object]]) -> None:
    cols = list(columns)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in cols])
    write_atomic(path, buf.getvalue())

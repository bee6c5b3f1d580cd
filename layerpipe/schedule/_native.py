"""The simulator's hot loops compiled from C (`_kernels.c`), where they are built: the timing sweep (`sweep`), the
dependency rules applied to every op (`apply_rules`), a compiled run's pairs and `links` transfers (`pairs`,
`link_inputs`), a layer-level run's peak memory (`peaks`) and the `ooo` policy's list simulation (`ooo_order`).
Their numpy and Python versions stay the reference, the fallback and the error reporters (issue 14: these loops
were half of `explore`'s sweep).

    python -c 'import layerpipe.schedule._native as n; n.main()'    # build it (./setup.sh does), or say why not

The library is built next to its source with the machine's C compiler (`$CC`, else `cc`) and carries the SHA-256 of
the source it was built from: a library of another source (an edited `_kernels.c`, a stale build) is not loaded, and
neither is any library when LAYERPIPE_NATIVE=0 — the Python versions then run, with the same results (tests compare
the two on generated schedules: tests/test_native_kernels.py). Without a C compiler nothing changes but the speed.
Each function here returns None where its kernel does not run (not built, or a case it leaves to Python).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import ctypes

SOURCE = Path(__file__).with_name("_kernels.c")
LIBRARY = Path(__file__).with_name("_kernels.so")

#: Off with LAYERPIPE_NATIVE=0 (read once, at the first sweep).
ENV = "LAYERPIPE_NATIVE"

_loaded: list[ctypes.CDLL | None] = []  # [] until the first `library()`; then [the library or None]


def source_sha() -> str:
    import hashlib

    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def build(cc: str | None = None) -> Path:
    """Compile `_kernels.c` into `LIBRARY` (atomically: concurrent builds leave one whole library). Raises OSError
    (no compiler) or `subprocess.CalledProcessError` (it failed)."""
    import shutil
    import subprocess
    import tempfile

    compiler = cc or os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise OSError(f"no C compiler '{compiler}' on PATH (set CC)")
    fd, tmp = tempfile.mkstemp(prefix=".kernels-", suffix=".so", dir=LIBRARY.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", f'-DLP_SOURCE_SHA="{source_sha()}"', "-o", tmp,
                        str(SOURCE)], check=True, capture_output=True, text=True)
        os.replace(tmp, LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _loaded.clear()  # loaded again on the next sweep
    return LIBRARY


def library() -> ctypes.CDLL | None:
    """The built library of this very source, or None (not built, another source's, or LAYERPIPE_NATIVE=0)."""
    if not _loaded:
        _loaded.append(_load())
    return _loaded[0]


def _load() -> ctypes.CDLL | None:
    if os.environ.get(ENV, "1") == "0" or not LIBRARY.exists():
        return None
    import ctypes  # here: the CLI's start (`layerpipe --help`) imports this module, not ctypes

    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    try:
        lib = ctypes.CDLL(str(LIBRARY))
        lib.lp_source_sha.restype = ctypes.c_char_p
        if lib.lp_source_sha().decode() != source_sha():  # built from another source: stale
            import warnings

            warnings.warn(f"{LIBRARY} was built from another {SOURCE.name}: the Python versions of its kernels run "
                          "(rebuild it: ./setup.sh)", RuntimeWarning, stacklevel=2)
            return None
    except (OSError, AttributeError):
        return None
    lib.lp_sweep.restype = i64
    lib.lp_sweep.argtypes = [i64, i64, ptr, ptr, ptr, i64, ptr, i64, i64, ptr, ptr, ptr, ptr, i64, i64, ptr, ptr]
    lib.lp_apply_count.restype = i64
    lib.lp_apply_count.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, i64, i64, ptr]
    lib.lp_apply_fill.restype = None
    lib.lp_apply_fill.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ptr]
    lib.lp_pairs.restype = i64
    lib.lp_pairs.argtypes = [i64, ptr, i64, ptr, i64, ptr, i64, ptr, ptr, ptr]
    lib.lp_link_inputs.restype = i64
    lib.lp_link_inputs.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.lp_scratch_peak.restype = i64
    lib.lp_scratch_peak.argtypes = [i64]
    lib.lp_ooo_order.restype = i64
    lib.lp_ooo_order.argtypes = [i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, ptr, ptr]
    lib.lp_peaks.restype = i64
    lib.lp_peaks.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, ptr, i64, i64, ptr, i64, ptr, i64, ptr,
                             i64, ptr, i64, ptr, ptr]
    return lib


#: Largest time the C sweep may reach: past it int64 arithmetic could overflow, so the Python sweep (exact
#: integers) runs instead.
TIME_LIMIT = 1 << 62


def _i64(values: object) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def _ints(values: np.ndarray) -> tuple[np.ndarray, int]:
    """A signed integer array as the kernels read it, with its width in bytes (`at` in `_kernels.c`): the compiled
    schedule's narrow CSR arrays (int32, int8) as they are, anything else as int64."""
    if values.dtype.kind == "i" and values.dtype.itemsize in (1, 2, 4, 8) and values.flags.c_contiguous:
        return values, values.dtype.itemsize
    return _i64(values), 8


def sweep(bounds: list[int], dur: np.ndarray, in_ptr: np.ndarray, in_src: np.ndarray,
          sends: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None = None, num_procs: int = 0
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """(start, end) of every op by the C sweep (see `_kernels.c`), or None where it does not run: not built, a negative
    duration or hold, times that could leave int64, or a deadlock (the Python sweep reports it). `sends`: on
    `links`, (send_ptr per op, send_input, send_link, hold per transfer, latency)."""
    lib = library()
    if lib is None:
        return None
    n = bounds[-1]
    dur = _i64(dur)
    if n and int(dur.min()) < 0:
        return None
    reach = int(dur.sum()) if n else 0
    send_ptr = send_input = send_link = hold = None
    latency, links, transfers = 0, 0, 0
    if sends is not None:
        send_ptr, send_input, send_link, hold = (_i64(a) for a in sends[:4])
        latency, transfers, links = int(sends[4]), len(hold), num_procs * num_procs
        if transfers and (int(hold.min()) < 0 or latency < 0):
            return None
        reach += int(hold.sum()) + transfers * latency if transfers else 0
    if reach >= TIME_LIMIT:
        return None
    start = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    cuts, (ptr, ptr_width), (src, src_width) = _i64(bounds), _ints(in_ptr), _ints(in_src)

    def at(a: np.ndarray | None) -> int | None:
        return None if a is None else a.ctypes.data

    status = lib.lp_sweep(n, len(bounds) - 1, cuts.ctypes.data, dur.ctypes.data, ptr.ctypes.data, ptr_width,
                          src.ctypes.data, src_width, transfers, at(send_ptr), at(send_input), at(send_link), at(hold),
                          latency, links, start.ctypes.data, end.ctypes.data)
    return (start, end) if status == 0 else None


def apply_rules(task: np.ndarray, iteration: np.ndarray, first_row: np.ndarray, per_task: np.ndarray,
                table: np.ndarray, total: int, use_mod: bool, index: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(producers per consumer, producer, words, role) of every entry the rule rows `table` give (see `_kernels.c`
    and `layerpipe.schedule._deps._apply`, which it stands in for), int64; None where the C rules do not run: not
    built, or a row whose div or mod is not positive (C's / and % would differ from Python's // and %)."""
    lib = library()
    if lib is None:
        return None
    rows = _i64(table)
    if len(rows) and (int(rows[:, 3].min()) < 1 or int(rows[:, 7].min()) < 1):
        return None
    n = len(task)
    task, iteration = _i64(task), _i64(iteration)
    first, per = _i64(first_row), _i64(per_task)
    counts = np.empty(n, dtype=np.int64)
    entries = lib.lp_apply_count(n, task.ctypes.data, iteration.ctypes.data, first.ctypes.data, per.ctypes.data,
                                 rows.ctypes.data, total, int(use_mod), counts.ctypes.data)
    producer = np.empty(entries, dtype=np.int64)
    words = np.empty(entries, dtype=np.int64)
    role = np.empty(entries, dtype=np.int64)
    flat = np.ascontiguousarray(index.reshape(-1))
    narrow = flat.dtype == np.int32
    if not narrow:
        flat = _i64(flat)
    lib.lp_apply_fill(n, task.ctypes.data, iteration.ctypes.data, first.ctypes.data, per.ctypes.data,
                      rows.ctypes.data, total, int(use_mod), index.shape[1] if index.ndim == 2 else 0,
                      flat.ctypes.data if narrow else None, None if narrow else flat.ctypes.data,
                      producer.ctypes.data, words.ctypes.data, role.ctypes.data)
    return counts, producer, words, role


def pairs(n: int, prod_ptr: np.ndarray, prod_idx: np.ndarray, prod_words: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`CompiledSchedule.pairs` from C (see `_kernels.c`), int64; None where the library is not built. Integer
    words only (the caller's float words keep numpy's sums)."""
    lib = library()
    if lib is None or prod_words.dtype.kind not in "iu":
        return None
    entries = len(prod_idx)
    (ptr, ptr_width), (idx, idx_width), (words, words_width) = _ints(prod_ptr), _ints(prod_idx), _ints(prod_words)
    producer, consumer, summed = (np.empty(entries, dtype=np.int64) for _ in range(3))
    count = lib.lp_pairs(n, ptr.ctypes.data, ptr_width, idx.ctypes.data, idx_width, words.ctypes.data, words_width,
                         producer.ctypes.data, consumer.ctypes.data, summed.ctypes.data)
    if count < 0:
        return None
    return producer[:count], consumer[:count], summed[:count]


def link_inputs(n: int, producer: np.ndarray, consumer: np.ndarray, proc: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(input pointer per op, inputs, the pair of each transfer) of `CompiledSchedule.link_plan` from its pairs, by
    C (see `_kernels.c`); None where the library is not built."""
    lib = library()
    if lib is None:
        return None
    producer, consumer, proc = _i64(producer), _i64(consumer), _i64(proc)
    in_ptr = np.empty(n + 1, dtype=np.int64)
    in_src = np.empty(len(producer), dtype=np.int64)
    transfer_pair = np.empty(len(producer), dtype=np.int64)
    transfers = lib.lp_link_inputs(n, len(producer), producer.ctypes.data, consumer.ctypes.data, proc.ctypes.data,
                                   in_ptr.ctypes.data, in_src.ctypes.data, transfer_pair.ctypes.data)
    if transfers < 0:
        return None
    return in_ptr, in_src, transfer_pair[:transfers]


def peaks(bounds: list[int], task: np.ndarray, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
          task_flags: list[int], task_unit: list[int], unit_size: list[int], ema: bool, distributed: bool,
          prod_ptr: np.ndarray, prod_idx: np.ndarray, prod_words: np.ndarray, prod_role: np.ndarray,
          role_kept: list[bool]) -> list[int] | None:
    """Peak words per processor of a layer-level run by C (`lp_peaks` in `_kernels.c`; the caller,
    `layerpipe.sim._memory.peak_memory`, says what is counted and passes its tables); None where it does not run:
    not built, a negative time, keys past 64 bits, a version table too large, out of memory."""
    lib = library()
    if lib is None:
        return None
    n, procs = bounds[-1], len(bounds) - 1
    start, end = _i64(start), _i64(end)
    if n and (int(start.min()) < 0 or int(end.min()) < 0):
        return None
    span = max(int(start.max()), int(end.max())) + 2 if n else 2
    if 2 * (procs + 1) * span >= 1 << 62:
        return None
    out = np.zeros(max(procs, 1), dtype=np.int64)
    arrays = [_i64(a) for a in (bounds, task, start, end, versions, task_flags, task_unit, unit_size,
                                [int(k) for k in role_kept] or [0])]
    cuts, task_, start_, end_, versions_, flags, unit, size, kept = arrays
    csr = [_ints(a) for a in (prod_ptr, prod_idx, prod_words, prod_role)]
    status = lib.lp_peaks(n, procs, cuts.ctypes.data, task_.ctypes.data, start_.ctypes.data, end_.ctypes.data,
                          versions_.ctypes.data, flags.ctypes.data, unit.ctypes.data, len(size), size.ctypes.data,
                          int(ema), int(distributed), *(x for a, width in csr for x in (a.ctypes.data, width)),
                          kept.ctypes.data, out.ctypes.data)
    return out[:procs].tolist() if status == 0 else None


#: What `ooo_order` returns from C: "cutoff" (the makespan exceeds the caller's bound), "cycle" (no op is ready), or
#: (each placement as (processor, kind 0/1/2, stage, micro-batch) in placement order, the makespan).
OOOResult = str | tuple[list[list[int]], int]


def ooo_order(microbatches: int, num_procs: int, into_f: list[int], into_i: list[int], dur_f: list[int],
              dur_i: list[int], dur_w: list[int], update: list[int], push: bool, left: list[int],
              cutoff: int | None) -> OOOResult | None:
    """`layerpipe.schedule._ooo_order.ooo_order`'s list simulation by C (`lp_ooo_order`); None where it does not run
    (not built, or times that could leave int64)."""
    lib = library()
    if lib is None:
        return None
    count = len(dur_f)
    reach = microbatches * (sum(dur_f) + sum(dur_i) + sum(dur_w) + sum(into_f) + sum(into_i)) + sum(update)
    if reach >= TIME_LIMIT or min((*dur_f, *dur_i, *dur_w, *update, *into_f, *into_i), default=0) < 0:
        return None
    tables = [_i64(a) for a in (into_f, into_i, dur_f, dur_i, dur_w, update, left)]
    placed = np.empty(max(4 * 3 * microbatches * count, 1), dtype=np.int64)
    makespan = np.zeros(1, dtype=np.int64)
    status = lib.lp_ooo_order(count, microbatches, num_procs, *(a.ctypes.data for a in tables[:6]), int(push),
                              int(cutoff is not None), cutoff or 0, tables[6].ctypes.data, placed.ctypes.data,
                              makespan.ctypes.data)
    if status < 0:
        return None
    if status:
        return "cutoff" if status == 1 else "cycle"
    return placed[:12 * microbatches * count].reshape(-1, 4).tolist(), int(makespan[0])


def scratch_peak(reset: bool = False) -> int:
    """The most bytes of scratch the kernels held at once since the last reset (0 without the library): memory
    that tracemalloc does not see, freed before each kernel returns. `reset`: count from now on."""
    lib = library()
    return int(lib.lp_scratch_peak(int(reset))) if lib is not None else 0


def main() -> int:
    import subprocess

    try:
        path = build()
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        print(f"layerpipe: the C sweep was not built ({detail.strip().splitlines()[-1] if detail.strip() else exc}); "
              "the Python engine runs instead", file=sys.stderr)
        return 1
    print(f"built {path}")
    return 0



"""The engine's lists of Python ints as int64 arrays: the op sweeps time ops in Python lists (`_op_sweep`), and their
start and end times leave as arrays.

`np.asarray(values, dtype=np.int64)` converts a list of ints at ~13 ns an element (it inspects every element's type
first); `struct.pack_into` writes them straight into the array's buffer at ~6 (issue 14: 20 µs vs 9 for ZB-H1 at
p = 8, m = 64, a twentieth of a full `simulate()`). Anything `struct` does not take as a native int64 — a float,
a value out of range — falls back to `np.asarray`, so the result (or the error) is what numpy gives.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

#: Values written per `struct.pack_into` call: its arguments are one tuple, so this bounds that tuple's memory.
CHUNK = 1 << 14


def int64_array(values: Sequence[int]) -> np.ndarray:
    """`np.asarray(values, dtype=np.int64)` of a list (or tuple) of ints, written through `struct`."""
    n = len(values)
    out = np.empty(n, dtype=np.int64)
    try:
        for lo in range(0, n, CHUNK):
            part = values[lo:lo + CHUNK] if n > CHUNK else values
            struct.pack_into(f"{len(part)}q", out.data, 8 * lo, *part)  # native byte order and size: int64's
    except struct.error:  # not all native int64s (floats, out of range): numpy's conversion, or its error
        return np.asarray(values, dtype=np.int64)
    return out

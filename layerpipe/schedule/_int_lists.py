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

#: int32's range as Python ints: `np.iinfo(np.int32)` builds an object per call (~0.7 µs), and the engine asks
#: it for every array it narrows (issue 14: ~15,000 calls in a 105-point sweep).
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

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


#: Keys below which `stable_argsort` is numpy's own sort: under ~700 keys timsort is as fast as the two reductions
#: and the cast the radix path needs.
SMALL_SORT = 768


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` of an integer array: the same permutation (a stable sort's is unique), faster.

    numpy's stable sort is a radix sort only for keys of 16 bits or fewer, timsort otherwise (issue 14: 70 µs for
    2,000 op numbers, 9 as uint16; 2.6 ms for 40,000, 0.35). Keys whose range fits 16 bits are sorted as uint16
    offsets from their least value; keys whose range fits 32 bits in two such passes, the low halves first (LSD radix:
    the second pass, stable, keeps the first's order among equal high halves). Wider ranges, other dtypes and short
    arrays go to numpy as they are (so do uint64 keys, which int64 cannot hold)."""
    kind, size = keys.dtype.kind, keys.dtype.itemsize
    if len(keys) < max(SMALL_SORT, 1) or size <= 2 or not (kind == "i" or (kind == "u" and size <= 4)):
        return np.argsort(keys, kind="stable")  # short, already radix-sorted (16 bits), or not an integer array
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo < 1 << 16:
        return np.argsort((keys.astype(np.int64) - lo).astype(np.uint16), kind="stable")
    if hi - lo < 1 << 32:
        off = keys.astype(np.int64) - lo
        order = np.argsort((off & 0xFFFF).astype(np.uint16), kind="stable")
        return order.take(np.argsort((off >> 16).astype(np.uint16).take(order), kind="stable"))
    return np.argsort(keys, kind="stable")


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` of an integer array: its distinct values sorted, in its dtype, flattened. numpy's asks
    `np.ma.is_masked` first, and that first call imports `numpy.ma` (~12 ms of every `explore` process, which
    has no masked arrays); integers have no NaN to merge, so a sort and a neighbour test are the whole of it."""
    ordered = np.sort(values, axis=None)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]

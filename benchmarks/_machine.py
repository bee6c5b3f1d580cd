"""What every benchmark prints beside its figures: the machine's load and whether the C kernels ran."""

from __future__ import annotations

import os


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def kernels() -> str:
    """Whether the simulator's C kernels (`layerpipe/schedule/_kernels.c`) are built and loaded, or their Python
    versions run (no C compiler, or LAYERPIPE_NATIVE=0)."""
    from layerpipe.schedule import _native

    return "C kernels loaded" if _native.library() is not None else "C kernels NOT loaded (the Python versions run)"

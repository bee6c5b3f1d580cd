"""The cyclic garbage collector paused while a pass builds many small acyclic objects.

Unrolling, dependency building and compiling make hundreds of thousands of Ops, tuples and int lists; each
allocation burst would trigger a collection that walks every live object again (65–88 % of a resnet50
simulate at 64k–320k ops, issue 14). None of these objects form cycles, so pausing loses nothing.
Below every layer: the schedule IR and the simulator both use it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector paused, and restored as it was (a caller that disabled it keeps it disabled)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

"""The cyclic garbage collector paused while a pass builds many small acyclic objects.

Unrolling, dependency building and compiling make hundreds of thousands of Ops, tuples and int lists; each
allocation burst would trigger a collection that walks every live object again (65–88 % of a resnet50
simulate at 64k–320k ops, issue 14). None of these objects form cycles, so pausing loses nothing.
Below every layer: the schedule IR and the simulator both use it.
"""

from __future__ import annotations

import gc

__all__ = ["gc_paused"]


class gc_paused:  # lower case: used as the function it was, `with gc_paused():`
    """The collector paused, and restored as it was (a caller that disabled it keeps it disabled).

    A class, not a `contextlib.contextmanager` generator: 0.2 µs a use rather than 0.7 (a full stage-level
    `simulate()` enters it four times, and is a 0.4 ms call at p = 8: issue 14)."""

    __slots__ = ("_enabled",)

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            gc.enable()

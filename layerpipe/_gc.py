"""The cyclic garbage collector paused while a pass builds many small acyclic objects.

Unrolling, dependency building and compiling make hundreds of thousands of Ops, tuples and int lists; each
allocation burst would trigger a collection that walks every live object again (65–88 % of a resnet50
simulate at 64k–320k ops, issue 14). None of these objects form cycles, so pausing loses nothing.
Below every layer: the schedule IR and the simulator both use it.
"""

from __future__ import annotations

import gc

__all__ = ["gc_paused", "survivors_frozen"]


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


#: Points after which `survivors_frozen` hands what it froze back to the collector for one full collection.
FREEZE_SPAN = 256


class survivors_frozen:  # lower case: used like `gc_paused`, `with survivors_frozen() as frozen:`
    """What a loop of independent steps (a sweep's points) keeps from each step, frozen out of the collector's
    walks (`gc.freeze`): a step's survivors — the scheduler's memo entries, hundreds of thousands of small objects —
    were walked by the collections the next allocations set off, finding nothing (issue 14: 33 young and 2 middle
    collections in a 105-point sweep, ~2 % of its CPU, 0 objects collected). Call `step()` after each step.

    Frozen objects are still freed by reference counting; only a reference cycle among them waits: every
    FREEZE_SPAN steps, and on leaving, they are handed back (`gc.unfreeze`) and, every FREEZE_SPAN steps, collected
    in full. Inert when something else has frozen objects (the caller's freeze is its own to undo)."""

    __slots__ = ("_active", "_steps")

    def __enter__(self) -> survivors_frozen:
        self._active = gc.get_freeze_count() == 0
        self._steps = 0
        return self

    def step(self) -> None:
        if not self._active:
            return
        self._steps += 1
        if self._steps % FREEZE_SPAN == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self._active:
            gc.unfreeze()

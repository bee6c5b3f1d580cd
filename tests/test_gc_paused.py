"""`layerpipe._gc.gc_paused` pauses the cyclic collector and restores it as it was: nested, on an exception, and
left disabled for a caller that had disabled it. `survivors_frozen` freezes what each step of a loop keeps out of the
collector's walks, collects in full every FREEZE_SPAN steps and hands everything back on leaving."""

from __future__ import annotations

import gc
import weakref

import pytest

from layerpipe import _gc
from layerpipe._gc import gc_paused, survivors_frozen


def test_paused_nested_and_restored() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause does not end the outer one
    assert gc.isenabled()


def test_restored_after_an_exception() -> None:
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_caller_that_disabled_it_keeps_it_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Node:
    """An object that can sit in a reference cycle (a weak reference tells when it is freed)."""

    def __init__(self) -> None:
        self.other: object = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_survivors_are_frozen_between_steps_and_handed_back() -> None:
    """`survivors_frozen`: what each step keeps leaves the collector's walks (nothing left young for the next
    allocations to walk); leaving hands everything back, and a cycle frozen meanwhile is then collectable."""
    gc.collect()
    with survivors_frozen() as frozen:
        dead = _cycle()  # cyclic garbage made during a step
        frozen.step()
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert dead() is not None  # frozen: the collector does not see it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert dead() is None


def test_a_full_collection_every_span_of_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long loop does not keep its cycles: every FREEZE_SPAN steps the frozen objects are collected in full."""
    monkeypatch.setattr(_gc, "FREEZE_SPAN", 3)
    gc.collect()
    with survivors_frozen() as frozen:
        dead = _cycle()
        frozen.step()
        frozen.step()
        gc.collect()
        assert dead() is not None
        frozen.step()  # the third: handed back, collected, frozen again
        assert dead() is None


def test_a_callers_freeze_is_left_alone() -> None:
    """Inert when something else has frozen objects: their freeze is theirs to undo."""
    keep = [_Node()]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with survivors_frozen() as frozen:
            keep.append(_Node())
            frozen.step()
            assert gc.get_freeze_count() == before
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()


def test_a_sweep_hands_back_what_it_froze(tmp_path) -> None:
    from layerpipe.dse import SweepSpec, run_sweep

    gc.collect()
    for jobs in (1, 2):
        run_sweep(SweepSpec(networks=("mlp:4-4",), num_procs=(1, 2), policies=("layerpipe", "gpipe")),
                  tmp_path / f"r{jobs}.csv", jobs=jobs, progress=False)
        assert gc.get_freeze_count() == 0

"""`layerpipe._gc.gc_paused` pauses the cyclic collector and restores it as it was: nested, on an exception, and
left disabled for a caller that had disabled it."""

from __future__ import annotations

import gc

import pytest

from layerpipe._gc import gc_paused


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

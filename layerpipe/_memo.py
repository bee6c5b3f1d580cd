"""Memos of pure passes, registered in one place so a benchmark can time a cold start (a fresh process's) or a
test can start from none (`clear_memos`); results never depend on them.

Every layer registers here (the network loader, the scheduling passes, the design-space sweep), so this module
imports nothing of layerpipe's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["BoundedMemo", "clear_memos", "memo"]

#: How to empty each registered memo (`memo`).
_CLEARS: list[Callable[[], None]] = []


M = TypeVar("M", bound=dict[Any, Any])  # any memo dict
K = TypeVar("K")
V = TypeVar("V")


def memo(table: M, clear: Callable[[], None] | None = None) -> M:
    """Register a module's memo dict (or, with `clear`, how to empty it and what it counts) for `clear_memos`."""
    _CLEARS.append(clear or table.clear)
    return table


class BoundedMemo(dict[K, V]):
    """A registered memo of at most `kept` entries, the oldest dropped first (a long-lived process, such as an
    `explore` worker, keeps only the recent ones)."""

    def __init__(self, kept: int) -> None:
        super().__init__()
        self.kept = kept
        memo(self)

    def add(self, key: K, value: V) -> V:
        """Remember `value` under `key` (a new key drops the oldest entry when full) and return it."""
        if key not in self and len(self) >= self.kept:
            self.pop(next(iter(self)))
        self[key] = value
        return value


def clear_memos() -> None:
    """Empty every registered memo: the state of a fresh process (what `benchmarks/` time from)."""
    for clear in _CLEARS:
        clear()

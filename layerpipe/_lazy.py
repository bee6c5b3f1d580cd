"""Public names loaded on first use (PEP 562), for a package face whose modules are heavy to import.

`layerpipe` (the CLI imports it at every start) and `layerpipe.hdl` (the cocotb bench, a submodule, is imported
in every simulator process) keep a table of public name → defining module and install the two module hooks this
returns: `__getattr__` imports the module the first time a name is read and keeps the value in the package's
globals (later reads skip the hook); `__dir__` lists the loaded and the lazy names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, namespace: dict[str, Any],
               table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`, whose globals are `namespace`, over `table` (name → module)."""
    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table))

    return getattr_, dir_

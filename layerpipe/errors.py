"""The one exception type for bad user input.

The CLI turns it into a single line on stderr and exit status 2; nothing else in the package prints.
Messages name the field and the values it allows.
"""

from __future__ import annotations

from collections.abc import Iterable


class InputError(ValueError):
    """Bad input from a user: a spec, a file, a flag. The message is one line, shown as is."""


def unknown_name(kind: str, name: str, allowed: Iterable[str]) -> InputError:
    """The error for a name that is not in a registry, "unknown policy 'x'; allowed: a, b": one wording for the
    registries themselves and for the command line's early check of their names, so the two cannot differ."""
    return InputError(f"unknown {kind} '{name}'; allowed: {', '.join(allowed)}")

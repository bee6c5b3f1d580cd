"""The one exception type for bad user input.

The CLI turns it into a single line on stderr and exit status 2; nothing else in the package prints.
Messages name the field and the values it allows.
"""


class InputError(ValueError):
    """Bad input from a user: a spec, a file, a flag. The message is one line, shown as is."""

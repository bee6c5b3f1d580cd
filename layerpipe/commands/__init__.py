"""CLI subcommands; each module has `register(subparsers)`. Shared helpers live in `_common`."""

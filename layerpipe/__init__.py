"""layerpipe: model, schedule, simulate and generate RTL for LayerPipe-style training accelerators."""

__version__ = "0.1.0"

from layerpipe.errors import InputError

__all__ = ["InputError", "__version__"]

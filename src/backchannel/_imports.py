"""Loading objects named ``module:attribute`` (agents to serve, models and tools in the configuration)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["import_object"]


def import_object(reference: str) -> Any:
    """The object ``module:attribute`` names (the attribute may be dotted).

    Modules beside the working directory are found, as uvicorn finds them.
    Raises :class:`ValueError` for a reference not in that form, and
    :class:`ImportError` or :class:`AttributeError` for one that names nothing.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{reference!r} should be 'module:attribute'")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    value: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        value = getattr(value, name)
    return value

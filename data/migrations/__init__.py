"""Ordered, named schema migrations.

Each module here named ``mNNNN_name.py`` defines ``up(db)``; they run in name order on open
and are recorded in the ``migrations`` table. Add a new module for every schema change, never
edit one that has landed.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any


def discover() -> list[tuple[str, Callable[[Any], None]]]:
    """All migrations as ``(name, up)`` pairs in order, ``name`` without the ``m`` prefix."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("m") and info.name[1:5].isdigit():
            module = importlib.import_module(f"{__name__}.{info.name}")
            found.append((info.name[1:], module.up))
    found.sort(key=lambda item: item[0])
    return found

"""Where a user's own Python code (``--model-path mod:build``, ``apply --loader mod:fn``) is
imported from.

The folder greenctl is run in: ``greenctl profile --model-path mymodels:build`` finds
``mymodels.py`` there. Daemons (executors, the dispatcher) run in their state folder with no
folder of the caller on their import path, so that a file there named like a module they
import (``httptools.py``) is never executed inside them; their spawner tells them the
caller's folder in :data:`CALLER_DIR_ENV` instead, and only the user's module is looked up
there, only while it is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

#: the folder user modules are imported from, set for daemons by the process that starts them
CALLER_DIR_ENV = "GREENCTL_CALLER_DIR"


def caller_dir() -> str:
    """The folder greenctl was run from: :data:`CALLER_DIR_ENV`, else the current folder."""
    return os.environ.get(CALLER_DIR_ENV) or os.getcwd()


def import_user_module(name: str) -> ModuleType:
    """Import module ``name``: as installed (on the import path as it is) when it is, else
    from :func:`caller_dir`, which is on the import path only during this import.

    Raises:
        ImportError: neither has it (or one of its own imports failed).
        Exception: whatever the module raises while it runs.
    """
    top = name.partition(".")[0]
    try:
        found = top in sys.modules or importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return importlib.import_module(name)
    folder = caller_dir()
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            sys.path.remove(folder)


def user_path(path: str) -> str:
    """A file path the user gave, relative to :func:`caller_dir` unless absolute."""
    return os.path.join(caller_dir(), os.path.expanduser(path))

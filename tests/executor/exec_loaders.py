"""Loaders for executor tests, with the signature of ``greenctl.profiler.models.load_model``.

Spawned daemons import this file by path (``--loader /path/exec_loaders.py:broken_loader``).
"""

from __future__ import annotations

from typing import Any


def broken_loader(variant: Any, *, device: str = "cpu") -> Any:
    """Fails for variants named ``broken*`` (as a corrupt checkpoint would); no-op otherwise."""
    if variant.name.startswith("broken"):
        raise RuntimeError(f"weights of {variant.name} are corrupt")
    from greenctl.executor.daemon import noop_loader

    return noop_loader(variant, device=device)

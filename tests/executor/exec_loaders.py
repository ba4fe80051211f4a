"""Loaders for executor tests, with the signature of ``greenctl.profiler.models.load_model``.

Spawned daemons import this file by path (``--loader /path/exec_loaders.py:tiny_loader``).
"""

from __future__ import annotations

from typing import Any


class TinyLoaded:
    """A LoadedModel look-alike around a small torch MLP (same attributes the daemon uses)."""

    def __init__(self, variant: Any, device: str) -> None:
        import torch

        torch.manual_seed(0)
        width = 8 if "small" in variant.name else 16
        self.input_shape = (4,)
        self.module = torch.nn.Sequential(
            torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 3)
        ).eval()
        self.device = device

    def example(self, batch: int) -> Any:
        import torch

        return torch.ones(batch, *self.input_shape)

    def run(self, x: Any) -> Any:
        return self.module(x)


def tiny_loader(variant: Any, *, device: str = "cpu") -> TinyLoaded:
    return TinyLoaded(variant, device)


def broken_loader(variant: Any, *, device: str = "cpu") -> Any:
    if variant.name.startswith("broken"):
        raise RuntimeError(f"weights of {variant.name} are corrupt")
    from greenctl.executor.daemon import noop_loader

    return noop_loader(variant, device=device)

"""Loaders for executor tests, with the signature of ``greenctl.profiler.models.load_model``.

Spawned daemons import this file by path (``--loader /path/exec_loaders.py:broken_loader``).
"""

from __future__ import annotations

from typing import Any


def broken_loader(variant: Any, *, device: str = "cpu") -> Any:
    """Fails for variants named ``broken*`` (as a corrupt checkpoint would); no-op otherwise."""
    if variant.name.startswith("broken"):
        raise RuntimeError(f"weights of {variant.name} are corrupt")
    from greenctl.executor.runtime.daemon import noop_loader

    return noop_loader(variant, device=device)


def slow_loader(variant: Any, *, device: str = "cpu") -> Any:
    """A no-op model that takes ``GREENCTL_TEST_LOAD_S`` seconds (default 2) to load, so a
    test can interrupt an apply while its executors start."""
    import os
    import time

    time.sleep(float(os.environ.get("GREENCTL_TEST_LOAD_S", "2")))
    from greenctl.executor.runtime.daemon import noop_loader

    return noop_loader(variant, device=device)


def crashy_loader(variant: Any, *, device: str = "cpu") -> Any:
    """A no-op model whose process exits 1 s after loading while the file named by
    ``GREENCTL_TEST_CRASH_FLAG`` exists when it loads (a crash loop the test can end by
    removing the file)."""
    import os
    import threading
    import time

    flag = os.environ.get("GREENCTL_TEST_CRASH_FLAG", "")
    if flag and os.path.exists(flag):

        def crash() -> None:
            time.sleep(1.0)
            os._exit(3)

        threading.Thread(target=crash, daemon=True).start()
    from greenctl.executor.runtime.daemon import noop_loader

    return noop_loader(variant, device=device)

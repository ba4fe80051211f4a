"""The dispatcher's process watch: a supervised process's exit wakes the supervision loop at
once (a pidfd on the event loop), so an idle dispatcher need not poll ``/proc``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from greenctl.executor.runtime.dispatch_supervision import ProcessWatch
from greenctl.executor.runtime.procs import run_async

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds on this platform"),
]


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_an_exit_wakes_the_loop_and_a_forgotten_process_does_not() -> None:
    first, second = _sleeper(), _sleeper()

    async def scenario() -> tuple[bool, bool, bool, dict[int, int]]:
        wake = asyncio.Event()
        watch = ProcessWatch(wake)
        watch.sync({first.pid, second.pid})
        unwatched = watch.unwatched
        await asyncio.sleep(0.2)
        woke_early = wake.is_set()
        watch.sync({first.pid})  # the second leaves the table: its exit means nothing
        second.kill()
        second.wait()
        await asyncio.sleep(0.2)
        woke_by_forgotten = wake.is_set()
        first.kill()
        await asyncio.wait_for(wake.wait(), 20)  # raises when the exit is not seen
        watch.close()
        return unwatched, woke_early, woke_by_forgotten, watch.fds

    try:
        unwatched, woke_early, woke_by_forgotten, left = run_async(scenario())
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    assert not unwatched
    assert not woke_early
    assert not woke_by_forgotten
    assert left == {}


def test_a_process_already_gone_is_unwatched_so_the_loop_polls() -> None:
    gone = _sleeper()
    gone.kill()
    gone.wait()

    async def scenario() -> tuple[bool, bool]:
        watch = ProcessWatch(asyncio.Event())
        watch.sync({gone.pid})
        missing = watch.unwatched
        watch.sync(set())
        return missing, watch.unwatched

    assert run_async(scenario()) == (True, False)

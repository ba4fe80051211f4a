"""The dispatcher's supervision of its executors and of its pair's supervisor.

A crashed executor is restarted with the command line it was started with: at once, then
with a back-off that doubles while it keeps crashing, never giving up
(:func:`~greenctl.executor.runtime.procs.restart_delay`); each restart is recorded in the
store. An instance whose connection failed but whose process lives is routed to again once
its health check passes. In a supervisor pair (:mod:`greenctl.executor.runtime.supervisor`),
the dispatcher restarts its supervisor when that dies.

aiohttp is imported where used: this module is imported by commands that never serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.store import open_store
from greenctl.executor.runtime.dispatch_admin import RoutingTable
from greenctl.executor.runtime.dispatch_routes import Backend, ModelRoute
from greenctl.executor.runtime.procs import (
    STABLE_S,
    backoff_settings,
    find_processes,
    is_alive,
    proc_start_ticks,
    read_json,
    restart_delay,
    spawn_detached,
    terminate,
)
from greenctl.executor.runtime.supervisor import supervisor_argv
from greenctl.executor.runtime.upstream import UpstreamPool

#: seconds between the supervision loop's looks while all is well: a watched process's exit,
#: a suspected instance or a new table wakes it sooner
IDLE_LOOK_S = 1.0


class ProcessWatch:
    """Process descriptors (pidfds) of the processes a dispatcher supervises, registered with
    the event loop: a watched process's exit sets ``wake`` at once, so the supervision loop
    need not poll ``/proc`` several times a second to notice it. Where pidfds are missing
    (an old kernel) or a process cannot be watched, ``unwatched`` says so: the loop polls."""

    def __init__(self, wake: asyncio.Event) -> None:
        self.wake = wake
        self.fds: dict[int, int] = {}  # pid -> its pidfd
        self.unwatched = False

    def sync(self, pids: set[int]) -> None:
        """Watch exactly ``pids``."""
        loop = asyncio.get_running_loop()
        for pid in set(self.fds) - pids:
            self._forget(loop, pid)
        self.unwatched = False
        for pid in pids - set(self.fds):
            try:
                fd = os.pidfd_open(pid)
            except (AttributeError, OSError):  # no pidfds here, or it is gone already
                self.unwatched = True
                continue
            self.fds[pid] = fd
            loop.add_reader(fd, self._exited, pid)

    def _exited(self, pid: int) -> None:
        """``pid`` exited: wake the loop (once: its descriptor stays readable)."""
        asyncio.get_running_loop().remove_reader(self.fds[pid])
        self.wake.set()

    def _forget(self, loop: asyncio.AbstractEventLoop, pid: int) -> None:
        fd = self.fds.pop(pid)
        loop.remove_reader(fd)
        os.close(fd)

    def close(self) -> None:
        """Stop watching (the loop may be closing: descriptors are closed regardless)."""
        for pid in list(self.fds):
            fd = self.fds.pop(pid)
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


class ExecutorSupervision(RoutingTable):
    """Restarts the routing table's crashed executors and the pair's supervisor."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: executors this dispatcher restarted (reaped when they exit)
        self.children: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self.backoff = backoff_settings()
        #: the listening socket inherited from the supervisor (handed to a new one)
        self.listen_fd: int | None = None
        # the supervisor: its process, and how often it died soon after starting
        self.supervisor_pid: int | None = None
        self.supervisor_ticks: str | None = None
        self.supervisor_proc: subprocess.Popen[bytes] | None = None
        self.supervisor_started = time.monotonic()
        self.supervisor_failures = 0
        self.supervisor_retry_at = 0.0

    async def supervise(self, interval_s: float = 0.1) -> None:
        """Restart crashed executors (backing off while they keep crashing), bring
        suspected-but-alive ones back after a health check, and restart the supervisor of
        this dispatcher's pair when it dies.

        It looks every ``interval_s`` while something needs it (an instance down, a process
        it cannot watch); else it sleeps until a watched process exits, an instance is
        suspected or the table changes, or :data:`IDLE_LOOK_S` passes: an idle dispatcher
        does not wake ten times a second."""
        watch = ProcessWatch(self.recheck)
        try:
            while True:
                watch.sync(self._watched_pids())
                await self._until_due(watch, interval_s)
                await self._look()
        finally:
            watch.close()

    def _watched_pids(self) -> set[int]:
        """The processes whose exit wakes the loop: each instance's not being restarted,
        and the pair's supervisor."""
        pids = {
            b.pid for r in self.routes.values() for b in r.backends if b.pid and not b.restarting
        }
        if self.pair is not None and self.supervisor_pid:
            pids.add(self.supervisor_pid)
        return pids

    async def _until_due(self, watch: ProcessWatch, interval_s: float) -> None:
        """Wait for the next look: ``interval_s`` while an instance is down or a process
        is not watched, else until :attr:`recheck` is set or :data:`IDLE_LOOK_S` passes."""
        urgent = watch.unwatched or any(
            not b.up and not b.restarting for r in self.routes.values() for b in r.backends
        )
        if urgent:
            await asyncio.sleep(interval_s)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.recheck.wait(), IDLE_LOOK_S)
        self.recheck.clear()

    async def _look(self) -> None:
        """One pass: reap, then restart, health-check or forgive each instance."""
        for child in list(self.children):  # reap executors we restarted
            if child.poll() is not None:
                self.children.remove(child)
        if self.stopping():
            return
        if self.pair is not None:
            await self._watch_supervisor()
        for route in list(self.routes.values()):
            for b in list(route.backends):
                if b.restarting:
                    continue
                if not is_alive(b.pid, b.pid_start):
                    if b.recoverable:
                        self._schedule_restart(route, b)
                elif not b.up and await self._healthy(b.url):
                    b.up = True
                    route.wake()
                elif b.failures and time.monotonic() - b.started_at >= STABLE_S:
                    b.failures = 0  # up a while: the crash loop is over

    def _schedule_restart(self, route: ModelRoute, b: Backend) -> None:
        """Take ``b`` out of routing and restart it: at once, or after the back-off of a
        crash loop."""
        now = time.monotonic()
        if now - b.started_at >= STABLE_S:
            b.failures = 0  # it ran a while: not a crash loop
        base, cap = self.backoff
        delay = restart_delay(b.failures, base=base, cap=cap)
        b.failures += 1
        b.up = False
        b.restarting = True
        b.retry_at = now + delay if delay else None
        if delay:
            print(
                f"supervisor: {b.id} failed {b.failures} times in a row; "
                f"restarting it in {delay:.1f} s",
                flush=True,
            )
        route.fail_waiters()
        task = asyncio.get_running_loop().create_task(self._restart(route, b, delay))
        self.restart_tasks[b] = task

        def forget(_: asyncio.Task[None]) -> None:
            if self.restart_tasks.get(b) is task:
                del self.restart_tasks[b]

        task.add_done_callback(forget)

    async def _healthy(self, url: str) -> bool:
        """Whether the executor at ``url`` answers its readiness check within a second."""
        import aiohttp

        try:
            async with self.session.get(
                url + "/v2/health/ready", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                return resp.status == 200
        except Exception:
            return False

    async def _restart(self, route: ModelRoute, b: Backend, delay: float = 0.0) -> None:
        """Restart ``b``'s executor after ``delay`` seconds and route to it once it is ready;
        a failed restart leaves it down for :meth:`supervise` to try again, backing off."""
        assert b.spawn is not None
        if delay:
            await asyncio.sleep(delay)
        b.retry_at = None
        if self.stopping():
            return  # stays down (restarting=True keeps the loop off it)
        old_pid = b.pid
        state_file = Path(b.spawn["state_file"])
        started = await self._start_executor(b, state_file)
        if started is None:
            return
        pid, ticks, proc = started
        # recorded before it is ready: whoever stops this plan finds it
        b.pid, b.pid_start, b.started_at = pid, ticks, time.monotonic()
        self.persist_routes()
        doc = await self._await_ready(b, state_file, pid, ticks, proc)
        if not doc or not doc.get("ready") or doc.get("pid") != pid:
            b.last_error = (doc or {}).get("error") or "exited before it was ready"
            print(f"supervisor: restart of {b.id} failed: {b.last_error}", flush=True)
            if is_alive(pid, ticks):  # not ready in time: stop it, the loop tries again
                await asyncio.to_thread(terminate, pid, ticks)
            b.restarting = False  # the loop sees it dead and tries again, backing off
            return
        b.url = doc["url"]
        b.pool.close()
        b.pool = UpstreamPool(b.url)
        b.started_at = time.monotonic()  # its time up counts from here
        b.restarts += 1
        b.last_error = None
        self.restarts += 1
        b.up = True
        b.restarting = False
        route.wake()
        self.persist_routes()
        print(f"supervisor: restarted {b.id} (pid {old_pid} -> {b.pid}, {b.url})", flush=True)
        await asyncio.to_thread(self._record_restart, b, old_pid, int(doc["port"]))

    async def _start_executor(
        self, b: Backend, state_file: Path
    ) -> tuple[int, str | None, subprocess.Popen[bytes] | None] | None:
        """A new process for ``b``: ``(pid, start ticks, the child or None)``, or None when
        none could be started. A restart a killed dispatcher left under way is adopted (a
        second executor must not start on the same cores); else one is started with ``b``'s
        command line."""
        assert b.spawn is not None
        found = [
            p for p in await asyncio.to_thread(find_processes, str(state_file)) if p[0] != b.pid
        ]
        if found:
            pid, ticks = found[0]
            print(f"supervisor: adopting {b.id}'s restart under way (pid {pid})", flush=True)
            return pid, ticks, None
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
        env = await self.executor_env(b)
        try:
            proc = spawn_detached(b.spawn["argv"], env=env, log_file=b.spawn["log_file"])
        except OSError as exc:
            print(f"supervisor: cannot restart {b.id}: {exc}", flush=True)
            b.last_error = str(exc)
            b.started_at = time.monotonic()
            b.restarting = False
            return None
        self.children.append(proc)
        return proc.pid, proc_start_ticks(proc.pid), proc

    async def executor_env(self, b: Backend) -> dict[str, str]:
        """The environment ``b``'s executor restarts with: the one it was started with."""
        return dict((b.spawn or {}).get("env") or {})

    async def _await_ready(
        self,
        b: Backend,
        state_file: Path,
        pid: int,
        ticks: str | None,
        proc: subprocess.Popen[bytes] | None,
    ) -> dict[str, Any] | None:
        """The state file of ``b``'s new process once it reports ready or an error, or
        exits, or its ``ready_timeout_s`` passes (then what it last held). Cancelled (the
        dispatcher stops, or the table dropped ``b``), it stops the process: nobody else
        knows it."""
        assert b.spawn is not None
        deadline = time.monotonic() + float(b.spawn.get("ready_timeout_s") or 120)
        doc = None
        try:
            await asyncio.to_thread(self._record_process, b)
            while time.monotonic() < deadline and not self.stopping():
                doc = read_json(state_file)
                if doc and doc.get("pid") == pid and (doc.get("ready") or doc.get("error")):
                    break
                if not is_alive(pid, ticks):
                    break
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            await asyncio.to_thread(terminate, pid, ticks)
            if proc is not None:
                proc.poll()
            raise
        return doc

    def _record_process(self, b: Backend) -> None:
        """Record ``b``'s new process in the store (before it is ready: ``down`` finds it)."""
        if not self.db:
            return
        try:
            with open_store(self.db) as store, store.transaction():
                deployments.set_instance_process(store, b.id, pid=b.pid, pid_start=b.pid_start)
        except Exception as exc:  # the store is a record, not a dependency of serving
            print(f"supervisor: could not record the new process of {b.id}: {exc}", flush=True)

    def _record_restart(self, b: Backend, old_pid: int | None, port: int) -> None:
        """Record a finished restart of ``b`` in the store."""
        if not self.db:
            return
        try:
            with open_store(self.db) as store, store.transaction():
                deployments.record_restart(
                    store,
                    b.id,
                    old_pid=old_pid,
                    new_pid=b.pid,
                    pid_start=b.pid_start,
                    port=port,
                    restarts=b.restarts,
                )
        except Exception as exc:  # the store is a record, not a dependency of serving
            print(f"supervisor: could not record the restart of {b.id}: {exc}", flush=True)

    async def _watch_supervisor(self) -> None:
        """Start a new supervisor when this dispatcher's dies (it adopts this process)."""
        if self.supervisor_proc is not None and self.supervisor_proc.poll() is not None:
            self.supervisor_proc = None  # reaped
        if is_alive(self.supervisor_pid, self.supervisor_ticks):
            return
        now = time.monotonic()
        if now < self.supervisor_retry_at:
            return
        if now - self.supervisor_started >= STABLE_S:
            self.supervisor_failures = 0
        base, cap = self.backoff
        self.supervisor_failures += 1
        self.supervisor_retry_at = now + restart_delay(self.supervisor_failures, base=base, cap=cap)
        assert self.pair is not None and self.pair_file is not None and self.db
        me = os.getpid()
        extra = ["--adopt-pid", str(me), "--adopt-ticks", str(proc_start_ticks(me) or "")]
        fds: tuple[int, ...] = ()
        if self.listen_fd is not None:
            extra += ["--listen-fd", str(self.listen_fd)]
            fds = (self.listen_fd,)
        try:
            proc = spawn_detached(
                supervisor_argv(self.pair_file, self.db, *extra),
                env={"GREENCTL_DB": self.db},
                log_file=self.pair["supervisor_log_file"],
                pass_fds=fds,
            )
        except OSError as exc:
            print(f"dispatcher: cannot start a supervisor: {exc}", flush=True)
            return
        old = self.supervisor_pid
        self.supervisor_proc = proc
        self.supervisor_pid, self.supervisor_ticks = proc.pid, proc_start_ticks(proc.pid)
        self.supervisor_started = now
        print(f"dispatcher: supervisor pid {old} is gone; started pid {proc.pid}", flush=True)

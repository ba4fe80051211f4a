"""The supervisor: keeps one dispatcher serving on one listening socket.

Run as ``python -m greenctl.executor.runtime.supervisor --pair FILE --db STORE`` (``greenctl
apply`` starts it detached; the 0600 pair file names the address, token and files).
The dispatcher restarts executors and the supervisor; the supervisor restarts the
dispatcher, handing every new one the same bound socket so the port never closes and
connections wait in the accept queue. Both back off while a child keeps dying
(``$GREENCTL_RESTART_BACKOFF`` = ``BASE,CAP``); only both dying at once is not repaired
(``status`` says so). ``down`` creates the stop file before SIGTERM so neither restarts the
other. Started processes are recorded in the store, best effort: the store is a record,
not a dependency of serving. See docs/serving.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.store import open_store
from greenctl.executor.runtime.procs import (
    STABLE_S,
    backoff_settings,
    is_alive,
    proc_start_ticks,
    python_module_argv,
    read_json,
    restart_delay,
    spawn_detached,
    terminate,
    write_json_atomic,
)


def stop_requested(pair: dict[str, Any]) -> bool:
    """Whether the pair is being stopped (its stop file exists)."""
    return os.path.exists(str(pair.get("stop_file") or ""))


def supervisor_argv(pair_file: str, db: str, *extra: str) -> list[str]:
    """The supervisor's command line (``extra``: ``--adopt-pid`` and the like)."""
    return python_module_argv(
        "greenctl.executor.runtime.supervisor", "--pair", pair_file, "--db", db, *extra
    )


def record_pair(db: str | None, dispatcher_id: int | None, **fields: Any) -> None:
    """Record where the pair's processes run now (best effort)."""
    if not db or dispatcher_id is None:
        return
    try:
        with open_store(db) as store, store.transaction():
            deployments.set_dispatcher_process(store, int(dispatcher_id), **fields)
    except Exception as exc:  # the store is a record, not a dependency of serving
        print(f"supervisor: could not record {fields} in the store: {exc}", flush=True)


class Supervisor:
    """One supervisor process: the listening socket and the dispatcher on it."""

    def __init__(self, pair_file: str, pair: dict[str, Any], db: str) -> None:
        self.pair_file = pair_file
        self.pair = pair
        self.db = db
        self.state_file = Path(pair["supervisor_state_file"])
        self.stopping = False
        self.sock: socket.socket | None = None
        self.port = 0
        self.child: subprocess.Popen[bytes] | None = None
        self.dpid: int | None = None
        self.dticks: str | None = None
        self.started_at = time.monotonic()
        self.failures = 0
        self.restarts = 0
        self.base, self.cap = backoff_settings()
        #: read end of the pipe a signal writes to (``signal.set_wakeup_fd``): SIGTERM ends
        #: a wait at once instead of at its next look
        self.wakeup: int | None = None

    # -- state ---------------------------------------------------------------------------
    def stop_requested(self) -> bool:
        return self.stopping or stop_requested(self.pair)

    def report(self, **extra: Any) -> None:
        me = os.getpid()
        doc = {
            "ready": True,
            "pid": me,
            "pid_start": proc_start_ticks(me),
            "host": self.pair["host"],
            "port": self.port,
            "dispatcher_pid": self.dpid,
            "dispatcher_pid_start": self.dticks,
            "restarts": self.restarts,
            "failures": self.failures,
            "retry_at": None,
        }
        doc.update(extra)
        write_json_atomic(self.state_file, doc)

    def fail(self, error: str) -> None:
        me = os.getpid()
        write_json_atomic(
            self.state_file, {"error": error, "pid": me, "pid_start": proc_start_ticks(me)}
        )

    # -- the socket ------------------------------------------------------------------------
    def bind(self) -> socket.socket:
        """The dispatcher's listening socket: the address asked for, or (``any_port``: a
        remembered port another program took since) any free port.

        Raises:
            OSError: the address cannot be bound.
        """
        host, port = str(self.pair["host"]), int(self.pair.get("port") or 0)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        for attempt in (port, 0) if port and self.pair.get("any_port") else (port,):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, attempt))
            except OSError:
                sock.close()
                if attempt == 0 or not self.pair.get("any_port"):
                    raise
                continue
            sock.listen(2048)
            return sock
        raise AssertionError("unreachable")

    # -- the dispatcher --------------------------------------------------------------------
    def start_dispatcher(self) -> bool:
        """Start a dispatcher on the socket and wait until it serves; False when it failed
        (it is stopped) or a stop was asked for meanwhile."""
        assert self.sock is not None
        pair = self.pair
        state_file = Path(pair["dispatcher_state_file"])
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
        fd = self.sock.fileno()
        argv = python_module_argv(
            "greenctl.executor.runtime.dispatcher",
            "--host", str(pair["host"]), "--port", str(self.port),
            "--state-file", str(state_file), "--db", self.db,
            "--timeout-s", str(pair.get("timeout_s") or 60.0),
            "--listen-fd", str(fd), "--routes-state", str(pair["routes_file"]),
            "--pair", self.pair_file,
            "--supervisor-pid", str(os.getpid()),
            "--supervisor-ticks", str(proc_start_ticks(os.getpid()) or ""),
            # without one in the pair, the dispatcher's own default bound
            *(("--max-queue", str(pair["max_queue"])) if pair.get("max_queue") else ()),
        )  # fmt: skip
        try:
            proc = spawn_detached(
                argv,
                env={"GREENCTL_DB": self.db},
                log_file=pair["dispatcher_log_file"],
                pass_fds=(fd,),
            )
        except OSError as exc:
            print(f"supervisor: cannot start the dispatcher: {exc}", flush=True)
            return False
        self.child, self.dpid = proc, proc.pid
        self.dticks = proc_start_ticks(proc.pid)
        self.started_at = time.monotonic()
        record_pair(self.db, pair.get("id"), pid=self.dpid, pid_start=self.dticks)
        deadline = time.monotonic() + float(pair.get("ready_timeout_s") or 60.0)
        while time.monotonic() < deadline and not self.stop_requested():
            doc = read_json(state_file)
            if doc and doc.get("ready") and doc.get("pid") == proc.pid:
                self.started_at = time.monotonic()  # its time up counts from here
                return True
            if (doc and doc.get("error")) or proc.poll() is not None:
                print(f"supervisor: the dispatcher failed: {(doc or {}).get('error')}", flush=True)
                break
            time.sleep(0.02)
        terminate(proc.pid, self.dticks)
        proc.poll()
        return False

    def wait_exit(self) -> None:
        """Return when the dispatcher has exited (or a stop is asked for).

        Its pidfd and the signal pipe wake the wait the moment either happens; it looks at
        the stop file and the process once a second besides (every 50 ms without pidfds),
        so an idle pair does not wake several times a second."""
        pid, ticks = self.dpid, self.dticks
        if pid is None or not is_alive(pid, ticks):
            return
        try:
            fd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            fd = None  # no pidfd here: look every 50 ms
        try:
            poller = select.poll()
            if fd is not None:
                poller.register(fd, select.POLLIN)
            if self.wakeup is not None:
                poller.register(self.wakeup, select.POLLIN)
            while not self.stop_requested():
                ready = {got for got, _ in poller.poll(1000 if fd is not None else 50)}
                if fd in ready:
                    return
                if self.wakeup in ready:
                    with contextlib.suppress(OSError):
                        os.read(self.wakeup, 512)  # drained: the handler set what it sets
                if not is_alive(pid, ticks):
                    return
        finally:
            if fd is not None:
                os.close(fd)

    def sleep(self, seconds: float) -> bool:
        """Sleep unless a stop is asked for; False when it is."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stop_requested():
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return not self.stop_requested()

    def watch(self) -> None:
        """Restart the dispatcher whenever it dies, backing off while it keeps dying."""
        while not self.stop_requested():
            self.wait_exit()
            if self.child is not None:
                self.child.poll()  # reap it
            if self.stop_requested():
                return
            old = self.dpid
            if time.monotonic() - self.started_at >= STABLE_S:
                self.failures = 0
            delay = restart_delay(self.failures, base=self.base, cap=self.cap)
            self.failures += 1
            print(
                f"supervisor: dispatcher pid {old} exited; starting a new one"
                + (f" in {delay:.1f} s (failure {self.failures} in a row)" if delay else ""),
                flush=True,
            )
            self.report(dispatcher_pid=None, retry_at=time.time() + delay)
            if not self.sleep(delay):
                return
            if self.start_dispatcher():
                self.restarts += 1
                self.report()
                print(f"supervisor: dispatcher restarted (pid {old} -> {self.dpid})", flush=True)

    def shutdown(self) -> None:
        """Stop the dispatcher (it must not outlive its supervisor unasked)."""
        if self.dpid is not None:
            terminate(self.dpid, self.dticks)
        if self.child is not None:
            self.child.poll()

    def run(self, *, adopt_pid: int | None, adopt_ticks: str | None, listen_fd: int | None) -> int:
        def on_signal(signum: int, frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.wakeup, wake_w = os.pipe()
        for end in (self.wakeup, wake_w):
            os.set_blocking(end, False)
        signal.set_wakeup_fd(wake_w)
        try:
            if listen_fd is not None:
                self.sock = socket.socket(fileno=listen_fd)
            else:
                self.sock = self.bind()
        except OSError as exc:
            host, port = self.pair["host"], self.pair.get("port") or 0
            self.fail(f"cannot bind {host}:{port}: {exc.strerror or exc}")
            return 4
        self.port = int(self.sock.getsockname()[1])
        me, ticks = os.getpid(), proc_start_ticks(os.getpid())
        if adopt_pid is not None:
            self.dpid, self.dticks = adopt_pid, adopt_ticks or proc_start_ticks(adopt_pid)
            self.report()
            record_pair(self.db, self.pair.get("id"), supervisor_pid=me, supervisor_pid_start=ticks)
            print(f"supervisor: adopted dispatcher pid {adopt_pid}", flush=True)
        elif not self.start_dispatcher():
            self.fail(
                "the dispatcher did not start; see its log " + self.pair["dispatcher_log_file"]
            )
            return 3
        else:
            self.report()
            print(f"supervisor: dispatcher pid {self.dpid} serves port {self.port}", flush=True)
        try:
            self.watch()
        finally:
            self.shutdown()
        return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m greenctl.executor.runtime.supervisor", description=__doc__
    )
    p.add_argument("--pair", required=True, help="the pair's JSON file (written by apply)")
    p.add_argument("--db", required=True, help="greenctl store (records the pair's processes)")
    p.add_argument("--adopt-pid", type=int, default=None, help="a running dispatcher to watch")
    p.add_argument("--adopt-ticks", default=None, help="its start time (ticks since boot)")
    p.add_argument("--listen-fd", type=int, default=None, help="inherited listening socket")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pair = read_json(args.pair)
    if pair is None:
        print(f"supervisor: cannot read {args.pair}", flush=True)
        return 2
    sup = Supervisor(args.pair, pair, args.db)
    return sup.run(adopt_pid=args.adopt_pid, adopt_ticks=args.adopt_ticks, listen_fd=args.listen_fd)


if __name__ == "__main__":
    sys.exit(main())

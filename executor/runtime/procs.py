"""Process and file plumbing shared by apply, the dispatcher and the daemons.

Detached daemons, liveness checks that survive pid reuse and zombies, atomic state files, the
per-store state directory and the apply lock. Of greenctl it imports only ``data`` and
:mod:`greenctl.profiler.user_code`.

Daemons are isolated from the folder they start from: ``python -P`` keeps it off their import
path (``PYTHONPATH`` still works; ``-I`` would drop it, and greenctl installed with ``pip
install --target`` lives there); they run in their state folder, with relative paths made
absolute, and are told the caller's folder (:data:`~greenctl.profiler.user_code.CALLER_DIR_ENV`)
for the user's modules and loaders. State folder 0700; logs, state files, store 0600, any umask.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from greenctl.data.errors import ExecutorError, LockedError
from greenctl.profiler.user_code import CALLER_DIR_ENV, caller_dir

STATE_DIR_ENV = "GREENCTL_STATE_DIR"
#: ``BASE,CAP`` seconds: how supervisors back off a process that keeps crashing
BACKOFF_ENV = "GREENCTL_RESTART_BACKOFF"
#: a process that served this long before dying was not crash-looping (its failures reset)
STABLE_S = 5.0
#: the daemons greenctl starts (``down`` looks for leftovers of these)
DAEMON_MODULES = (
    "greenctl.executor.runtime.daemon",
    "greenctl.executor.runtime.dispatcher",
    "greenctl.executor.runtime.supervisor",
    "greenctl.executor.deploy.georouter",
    "greenctl.executor.runtime.llm_executor",
)
#: options of daemon command lines whose values are paths (made absolute when built)
PATH_OPTIONS = ("--db", "--state-file", "--routes")
#: environment variables holding a path, made absolute for a daemon
PATH_ENV = ("GREENCTL_DB", STATE_DIR_ENV, "GREENCTL_FAKE_NVML")


def settle_heap() -> None:
    """Collect garbage once, then freeze every object alive now out of the collector's sight.

    Call it when a process has loaded what it keeps (torch, the model) and is about to serve
    or time requests. Python's full collection walks every tracked object, and it fires on
    allocation counts, so in the middle of some request: with torch imported that is about
    170,000 objects and 85 ms on the 2-core CI VM, enough to dominate a p99. Frozen objects
    are never walked again; later garbage is still collected.
    """
    gc.collect()
    gc.freeze()


def run_async(main: Any) -> Any:
    """Run a coroutine on uvloop when it is installed (less CPU per request), else asyncio.

    ``GREENCTL_NO_UVLOOP=1`` forces the standard loop (for A/B measurements).
    """
    factory = None
    if not os.environ.get("GREENCTL_NO_UVLOOP"):
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def state_dir_for(db_path: str | os.PathLike[str]) -> Path:
    """The folder for daemon state files, logs and the apply lock of one store.

    ``$GREENCTL_STATE_DIR`` when set, else ``<store>.run`` beside the store file, so every
    store (and every test) gets its own.

    Returned absolute (daemons run in it and are handed paths inside it). It is made 0700
    and the store beside it, which holds the command lines the supervisor runs, 0600 (with
    its WAL files), whatever the umask.
    """
    env = os.environ.get(STATE_DIR_ENV)
    path = Path(os.path.abspath(env if env else str(db_path) + ".run"))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    make_private(path)
    for suffix in ("", "-wal", "-shm"):
        make_private(str(db_path) + suffix)
    return path


def make_private(path: str | os.PathLike[str]) -> None:
    """Take group and other permissions off a file or folder of ours (0700 / 0600).

    Left alone: what does not exist or belongs to another user (a shared folder someone
    named as ``$GREENCTL_STATE_DIR``).
    """
    try:
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    except OSError:
        pass


def _stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (state first), read as bytes
    with one system call (supervisors ask several times a second; a text read costs ~4x).

    Raises:
        OSError: no such process, or it cannot be read.
    """
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    # the command name (field 2) may contain spaces: split after its closing parenthesis
    return data.rpartition(b")")[2].split()


def kill_session(sid: int) -> list[int]:
    """SIGKILL every process of session ``sid`` (a daemon started with its own session, such
    as a Ray head, and whatever it forked); the pids killed."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            session = int(_stat_fields(int(entry.name))[3])  # state, ppid, pgrp, session
        except (OSError, IndexError, ValueError):
            continue
        if session == sid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def proc_start_ticks(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None if unknown."""
    try:
        rest = _stat_fields(pid)
    except OSError:
        return None
    return rest[19].decode() if len(rest) > 19 else None


def is_alive(pid: int | None, start_ticks: str | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, started at ``start_ticks``."""
    if not pid or pid <= 0:
        return False
    try:
        rest = _stat_fields(pid)
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if rest and rest[0] in (b"Z", b"X"):
        return False
    return not (start_ticks and len(rest) > 19 and rest[19].decode() != start_ticks)


def spawn_detached(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_file: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start a daemon in its own session (it outlives the caller), output to ``log_file``.

    It runs in ``cwd`` (default: the log file's folder, its state folder), with the caller's
    folder in :data:`CALLER_DIR_ENV` (kept when the caller is itself a daemon restarting an
    executor), relative paths in ``PYTHONPATH`` and :data:`PATH_ENV` made absolute against
    that folder and empty ``PYTHONPATH`` entries (the current folder, usually by accident of
    ``$PYTHONPATH:...``) dropped. The log is created 0600. ``pass_fds`` stay open in it
    (a listening socket handed from supervisor to dispatcher and back).
    """
    caller = env.get(CALLER_DIR_ENV) or _caller_dir()
    full_env = dict(os.environ)
    full_env.update(env)
    full_env[CALLER_DIR_ENV] = caller
    for key in PATH_ENV:
        if full_env.get(key):
            full_env[key] = os.path.join(caller, full_env[key])
    if "PYTHONPATH" in full_env:
        entries = [os.path.join(caller, e) for e in full_env["PYTHONPATH"].split(os.pathsep) if e]
        if entries:
            full_env["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            del full_env["PYTHONPATH"]
    log_path = os.path.join(caller, log_file)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o600)  # created under another umask, or by an older greenctl
    with os.fdopen(fd, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=os.path.join(caller, cwd) if cwd is not None else os.path.dirname(log_path),
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )


def python_module_argv(module: str, *args: str) -> list[str]:
    """``python -P -m module args...`` with this interpreter: the folder it starts in is not
    on its import path, and the values of :data:`PATH_OPTIONS` are made absolute (daemons run
    in their state folder)."""
    out = [sys.executable, "-P", "-m", module]
    caller = _caller_dir()
    take_path = False
    for arg in args:
        if take_path:
            arg = os.path.join(caller, arg)
            take_path = False
        elif arg in PATH_OPTIONS:
            take_path = True
        elif arg.startswith(tuple(f"{o}=" for o in PATH_OPTIONS)):
            option, _, value = arg.partition("=")
            arg = f"{option}={os.path.join(caller, value)}"
        out.append(arg)
    return out


def _caller_dir() -> str:
    """:func:`caller_dir`, or ``/`` when the current folder no longer exists."""
    try:
        return os.path.abspath(caller_dir())
    except OSError:
        return "/"


def terminate(pid: int | None, start_ticks: str | None = None, *, timeout_s: float = 5.0) -> bool:
    """SIGTERM ``pid`` (if it is still the same process), SIGKILL after ``timeout_s``.

    Returns True when the process is gone (or was never there).
    """
    if not is_alive(pid, start_ticks):
        return True
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_dead(pid, timeout_s):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return wait_dead(pid, 2.0)


def process_argv(pid: int) -> list[str] | None:
    """The command line of ``pid`` (None when it is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _own_processes() -> Iterator[tuple[int, list[str]]]:
    """This user's live processes (not zombies) other than this one, with command lines."""
    me, uid = os.getpid(), os.getuid()
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        argv = process_argv(pid)
        if argv and is_alive(pid):
            yield pid, argv


def find_processes(argument: str) -> list[tuple[int, str | None]]:
    """``(pid, start ticks)`` of this user's live processes with ``argument`` as one element
    of their command line: a daemon found by its own state file when its pid was never
    recorded (its starter was killed between spawning it and writing the pid down)."""
    return [(pid, proc_start_ticks(pid)) for pid, argv in _own_processes() if argument in argv[1:]]


def stray_daemons(state_dir: str | os.PathLike[str], db: str) -> list[tuple[int, str | None]]:
    """``(pid, start ticks)`` of greenctl daemons of one store still running: this user's
    ``python -m`` one of :data:`DAEMON_MODULES` with ``--db`` the store and a file of
    ``state_dir`` on their command line. ``down`` stops them whatever the journal says."""
    folder = os.path.join(os.path.abspath(state_dir), "")
    db = os.path.abspath(db)
    found = []
    for pid, argv in _own_processes():
        if not any(m in argv for m in DAEMON_MODULES):
            continue
        dbs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--db"]
        if db not in dbs or not any(a.startswith(folder) for a in argv):
            continue
        found.append((pid, proc_start_ticks(pid)))
    return found


def backoff_settings() -> tuple[float, float]:
    """``(base, cap)`` seconds of crash-loop back-off: ``$GREENCTL_RESTART_BACKOFF``
    (``BASE,CAP``), else 0.5 s doubling up to 30 s."""
    text = os.environ.get(BACKOFF_ENV, "")
    try:
        base, cap = (float(x) for x in text.split(","))
        if 0 < base <= cap:
            return base, cap
    except ValueError:
        pass
    return 0.5, 30.0


def restart_delay(failures: int, *, base: float, cap: float) -> float:
    """Seconds to wait before restarting a process that failed ``failures`` times in a row
    (each time it died within :data:`STABLE_S` of becoming ready): none for the first two
    (a process killed once, or twice by bad luck, comes back at once), then ``base``
    doubling up to ``cap``. There is no last try: a crash loop is retried every ``cap``
    seconds for good."""
    if failures <= 1:
        return 0.0
    return float(min(cap, base * 2.0 ** min(failures - 2, 30)))


def process_age_s(pid: int | None) -> float | None:
    """Seconds since ``pid`` started (Linux), or None when it is gone or unknown."""
    ticks = proc_start_ticks(pid) if pid else None
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(ticks or "") / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None


def wait_dead(pid: int, timeout_s: float) -> bool:
    """Wait for ``pid`` to exit (reaping it when it is our child)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        if not is_alive(pid):
            return True
        time.sleep(0.02)
    return not is_alive(pid)


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, mode: int = 0o600) -> None:
    """Write JSON so readers never see half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, p)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A JSON state file, or None when it is missing or half written."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) != 0


def log_tail(path: str | os.PathLike[str], lines: int = 8) -> str:
    """The last lines of a daemon log, for error messages."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def apply_lock(
    state_dir: Path, *, wait: bool = False, timeout_s: float | None = None
) -> Iterator[None]:
    """Serialise applies (and downs) of one store with ``fcntl.flock``.

    Raises:
        LockedError: another apply holds the lock and ``wait`` is False (or the wait timed
            out); the message names the holder's pid.
    """
    path = state_dir / "apply.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait or (deadline is not None and time.monotonic() > deadline):
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    raise LockedError(
                        f"another greenctl apply is running (pid {holder}; lock {path})",
                        hint="wait for it to finish, or pass --wait to queue behind it",
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def wait_for_state_file(
    path: Path,
    *,
    proc: subprocess.Popen[bytes] | None,
    pid: int | None = None,
    timeout_s: float,
    what: str,
    log_file: Path | None = None,
) -> dict[str, Any]:
    """Wait until a daemon writes its state file with ``ready`` (or an ``error``).

    Raises:
        ExecutorError: the daemon exited, reported an error, or was not ready in time; the
            message carries the tail of its log.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        doc = read_json(path)
        if doc is not None and doc.get("error"):
            raise ExecutorError(f"{what} failed: {doc['error']}", hint=_log_hint(log_file))
        if doc is not None and doc.get("ready"):
            return doc
        exited = proc.poll() if proc is not None else None
        if exited is not None or (proc is None and pid is not None and not is_alive(pid)):
            doc = read_json(path)
            reason = (doc or {}).get("error") or f"exited with status {exited}"
            raise ExecutorError(f"{what} failed: {reason}", hint=_log_hint(log_file))
        if time.monotonic() > deadline:
            raise ExecutorError(
                f"{what} was not ready after {timeout_s:.0f} s", hint=_log_hint(log_file)
            )
        time.sleep(0.03)


def _log_hint(log_file: Path | None) -> str | None:
    if log_file is None:
        return None
    tail = log_tail(log_file, 6)
    return f"log {log_file}:\n{tail}" if tail else f"see the log {log_file}"

"""The MPS control daemon of one profiling run: use the one that runs, or start and stop one.

``greenctl profile --gpus --emulate-mig`` measures MIG slices as MPS active-thread shares
(:func:`greenctl.data.mig_geometry.mps_percentage`), which needs the control daemon;
greenctl never changes a GPU's settings for it. :func:`mps_session` uses a running daemon
(:func:`greenctl.profiler.hw.mps_pipe`) and leaves it, or starts a private one in a fresh
temporary folder and its own session, and stops it however the run ends, waiting up to
:data:`STOP_WAIT_S`. A client that misses the daemon silently runs on the whole GPU, so
:meth:`MpsDaemon.verify_client` refuses to go on unless one reached it
(``GREENCTL_MPS_VERIFY=0`` skips it). ``GREENCTL_MPS_CONTROL`` names the control program.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.errors import GreenctlError, HardwareError, InputError

CONTROL = "nvidia-cuda-mps-control"
MPS_CONTROL_ENV = "GREENCTL_MPS_CONTROL"
VERIFY_ENV = "GREENCTL_MPS_VERIFY"
#: How long the daemon may take to open its control pipe after ``-d`` returns.
START_TIMEOUT_S = 15.0
#: How long one control command (``get_server_list``, ``quit``) may take.
COMMAND_TIMEOUT_S = 15.0
#: How long a daemon found running may take to answer before it counts as gone.
PROBE_TIMEOUT_S = 5.0
#: How long the daemon and its servers may take to exit after ``quit``.
STOP_WAIT_S = 5.0
#: How long after a client's exit the session looks for signs that it used MPS.
VERIFY_WAIT_S = 3.0
PID_FILE = "nvidia-cuda-mps-control.pid"


def control_binary() -> str:
    """The path of ``nvidia-cuda-mps-control`` (``$GREENCTL_MPS_CONTROL`` overrides it).

    Raises:
        InputError: the program is not installed (or the override is not an executable).
    """
    override = os.environ.get(MPS_CONTROL_ENV)
    if override:
        path = shutil.which(override)
        if path is None:
            raise InputError(
                f"{MPS_CONTROL_ENV}={override} is not an executable program",
                hint=f"point {MPS_CONTROL_ENV} at {CONTROL}, or unset it to use the one on PATH",
            )
        return path
    path = shutil.which(CONTROL)
    if path is None:
        raise InputError(
            f"--emulate-mig needs NVIDIA's MPS control program '{CONTROL}', which is not on PATH",
            hint="it comes with the NVIDIA driver's compute utilities (on Ubuntu the package "
            "nvidia-compute-utils-<driver version>); install them or put the folder that holds "
            f"{CONTROL} on PATH, or set {MPS_CONTROL_ENV} to its path",
        )
    return path


@dataclass
class MpsDaemon:
    """An MPS control daemon a run's clients use (``owned``: started by greenctl)."""

    binary: str | None  # None: a running daemon whose control program is not installed here
    pipe_dir: str
    log_dir: str | None = None  # known for a daemon greenctl started
    owned: bool = False
    root: str | None = None  # the temporary folder holding pipe/ and log/ (owned)
    gpu_uuids: tuple[str, ...] = ()
    pids: set[int] = field(default_factory=set)  # the daemon and the servers seen
    verified: bool = False

    def client_env(self) -> dict[str, str]:
        """What a client's environment needs to reach this daemon."""
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir}
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def command(self, text: str, *, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """Send one command, ``echo TEXT | nvidia-cuda-mps-control``; returns its output.

        Raises:
            HardwareError: the program failed, or no daemon answered within ``timeout_s``.
        """
        if self.binary is None:
            raise HardwareError(f"cannot send `{text}` to the MPS daemon: no {CONTROL} here")
        env = {**os.environ, **self.client_env()}
        try:
            proc = subprocess.run(
                [self.binary],
                input=text + "\n",
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise HardwareError(
                f"`echo {text} | {CONTROL}` got no answer within {timeout_s:g} s "
                f"(CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir})"
            ) from None
        except OSError as exc:
            raise HardwareError(f"cannot run {self.binary}: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
            raise HardwareError(
                f"`echo {text} | {CONTROL}` failed (exit {proc.returncode}): {said[0]}".rstrip(": ")
            )
        return proc.stdout

    def server_pids(self, *, timeout_s: float = COMMAND_TIMEOUT_S) -> list[int]:
        """The MPS servers the daemon runs now (``get_server_list``)."""
        out = self.command("get_server_list", timeout_s=timeout_s)
        return [int(t) for t in re.findall(r"\b\d+\b", out)]

    def log_text(self, name: str = "control.log") -> str:
        if not self.log_dir:
            return ""
        try:
            return Path(self.log_dir, name).read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 6) -> str:
        """The last lines of the daemon's control and server logs, one string (may be empty)."""
        parts = []
        for name in ("control.log", "server.log"):
            tail = [ln for ln in self.log_text(name).splitlines() if ln.strip()][-lines:]
            if tail:
                parts.append(f"{name}: " + " | ".join(tail))
        return "; ".join(parts)

    def clients_logged(self) -> int:
        """How many client connections the daemon logged (``NEW CLIENT`` lines)."""
        return len(re.findall(r"new client", self.log_text(), flags=re.IGNORECASE))

    def verify_client(self, *, wait_s: float | None = None) -> None:
        """Check, after a client ran, that it used MPS; once per daemon.

        A client that cannot reach the daemon runs on the whole GPU without MPS. Evidence that
        it did reach it: the daemon runs an MPS server (servers stay up while the daemon
        does), or its log holds a new client.

        Raises:
            HardwareError: no evidence within ``wait_s`` (unless ``GREENCTL_MPS_VERIFY=0``).
        """
        skip = os.environ.get(VERIFY_ENV, "").strip() == "0"
        if self.verified or skip or (self.binary is None and not self.log_dir):
            self.verified = True  # (no control program: nothing to ask; the session said so)
            return
        deadline = time.monotonic() + (VERIFY_WAIT_S if wait_s is None else wait_s)
        last_error = ""
        while True:
            try:
                servers = self.server_pids()
            except HardwareError as exc:
                servers, last_error = [], exc.message
            if servers or self.clients_logged():
                self.pids.update(servers)
                self.verified = True
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        tail = self.log_tail()
        raise HardwareError(
            "the MPS child ran without reaching the MPS control daemon (no MPS server runs and "
            "the daemon logged no client): its figures would be the whole GPU's, not a share "
            f"of it, so nothing was stored (CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}"
            + (f"; {last_error}" if last_error else "")
            + (f"; {tail}" if tail else "")
            + ")",
            hint="check the daemon's logs above and that the GPU's compute mode allows MPS "
            "(`nvidia-smi -q -d COMPUTE`; greenctl does not change it); to measure anyway, "
            f"set {VERIFY_ENV}=0",
        )

    def thread_cap(self) -> float | None:
        """The daemon's default active-thread percentage (None when it does not say)."""
        try:
            out = self.command("get_default_active_thread_percentage")
        except HardwareError:
            return None
        found = re.findall(r"\d+(?:\.\d+)?", out)
        return float(found[-1]) if found else None


# -- processes ---------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which an init that does not reap leaves, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        stat = ""
    if stat:
        state = stat.rsplit(")", 1)[-1].split()[:1]
        return not state or state[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes_with_pipe(pipe_dir: str) -> set[int]:
    """Processes (other than this one) whose environment names ``pipe_dir`` as their MPS
    pipe directory: the daemon greenctl started, its servers, clients still running."""
    needle = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    found: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            env = Path("/proc", name, "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or another user's
        if needle in env.split(b"\0"):
            found.add(int(name))
    return found


def _pid_file(pipe_dir: str) -> int | None:
    try:
        return int(Path(pipe_dir, PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _tmp_base() -> str | None:
    # the pipe directory holds UNIX sockets, whose paths are limited to 107 bytes: prefer a
    # short base over a long $TMPDIR
    base = "/tmp"
    if os.path.isdir(base) and os.access(base, os.W_OK):
        return base
    return None


# -- a private daemon ---------------------------------------------------------------------------
def start_private(
    gpu_uuids: Sequence[str],
    *,
    binary: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> MpsDaemon:
    """Start ``nvidia-cuda-mps-control -d`` in a fresh temporary pipe and log folder.

    Raises:
        InputError: the control program is not installed.
        HardwareError: it did not start (its logs are in the message); nothing is left
            running.
    """
    binary = binary or control_binary()
    root = tempfile.mkdtemp(prefix="greenctl-mps-", dir=_tmp_base())
    pipe, log = os.path.join(root, "pipe"), os.path.join(root, "log")
    os.mkdir(pipe, 0o700)
    os.mkdir(log, 0o700)
    daemon = MpsDaemon(
        binary=binary,
        pipe_dir=pipe,
        log_dir=log,
        owned=True,
        root=root,
        gpu_uuids=tuple(gpu_uuids),
    )
    env = {**os.environ, **daemon.client_env()}
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)  # the daemon's servers get 100 %
    if gpu_uuids:
        # UUIDs, as NVIDIA advises: device indices would be remapped by the server
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)
    out_path = os.path.join(root, "start.out")
    try:
        with open(out_path, "w") as out:
            # output to a file, not a pipe: a daemon that kept a pipe open would block us
            proc = subprocess.run(
                [binary, "-d"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=start_timeout_s,
                start_new_session=True,
            )
        if proc.returncode != 0:
            raise HardwareError(
                f"`{CONTROL} -d` failed (exit {proc.returncode}): {_said(out_path, daemon)}"
            )
        control = os.path.join(pipe, "control")
        deadline = time.monotonic() + start_timeout_s
        while not os.path.exists(control):
            if time.monotonic() >= deadline:
                raise HardwareError(
                    f"the MPS control daemon did not open {control} within "
                    f"{start_timeout_s:g} s: {_said(out_path, daemon)}"
                )
            time.sleep(0.05)
        pid = _pid_file(pipe)
        daemon.pids = ({pid} if pid else set()) | processes_with_pipe(pipe)
        while True:  # it answers (and runs no server yet); it may need a moment after -d
            try:
                daemon.server_pids(timeout_s=PROBE_TIMEOUT_S)
                break
            except HardwareError as exc:
                if time.monotonic() >= deadline:
                    raise HardwareError(
                        f"the MPS control daemon does not answer: {exc.message}",
                        hint=_said(out_path, daemon),
                    ) from None
                time.sleep(0.2)
        daemon.pids |= processes_with_pipe(pipe)
    except subprocess.TimeoutExpired:
        _give_up(daemon)
        raise HardwareError(
            f"`{CONTROL} -d` did not return within {start_timeout_s:g} s: {_said(out_path, daemon)}"
        ) from None
    except BaseException:
        _give_up(daemon)
        raise
    return daemon


def _said(out_path: str, daemon: MpsDaemon) -> str:
    try:
        text = Path(out_path).read_text(errors="replace").strip()
    except OSError:
        text = ""
    tail = daemon.log_tail()
    return " | ".join(t for t in (text.splitlines()[-1] if text else "", tail) if t) or (
        "no output"
    )


def _give_up(daemon: MpsDaemon) -> None:
    """After a failed start: ask whatever started to quit, best effort."""
    with suppress(HardwareError):
        daemon.command("quit", timeout_s=5.0)
    _wait_gone(daemon, STOP_WAIT_S)


def _wait_gone(daemon: MpsDaemon, wait_s: float) -> set[int]:
    """Wait until the daemon's processes are gone; returns those still running."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {p for p in daemon.pids if _alive(p)} | processes_with_pipe(daemon.pipe_dir)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def stop_private(daemon: MpsDaemon, *, wait_s: float = STOP_WAIT_S, keep: bool = False) -> str:
    """Quit a daemon greenctl started and check that it and its servers are gone.

    Removes its temporary folder once they are, unless ``keep`` (a failed run: its logs stay
    for a look). Returns a line for the run's notes: stopped, or what still runs and how to
    stop it. Never raises.
    """
    pid = _pid_file(daemon.pipe_dir)
    if pid:
        daemon.pids.add(pid)
    daemon.pids |= processes_with_pipe(daemon.pipe_dir)
    with suppress(HardwareError):
        daemon.pids.update(daemon.server_pids())
    quit_error = ""
    try:
        daemon.command("quit")
    except HardwareError as exc:
        quit_error = exc.message
    left = _wait_gone(daemon, wait_s)
    if left:
        return (
            f"warning: the MPS control daemon greenctl started is not gone {wait_s:g} s after "
            f"`quit`: process(es) {', '.join(str(p) for p in sorted(left))} still run"
            + (f" ({quit_error})" if quit_error else "")
            + f"; stop them with `echo quit | CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir} "
            f"{CONTROL}`"
        )
    where = ""
    if keep and daemon.root:
        where = f"; its logs are kept in {daemon.log_dir}"
    elif daemon.root:
        shutil.rmtree(daemon.root, ignore_errors=True)
    return f"MPS: stopped the control daemon greenctl started for this run{where}"


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt while the body runs (main thread only),
    so that the ``finally`` that stops the daemon runs when a run is killed politely."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old: dict[int, Any] = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None:
            continue
        try:
            old[sig] = signal.signal(sig, interrupt)
        except (ValueError, OSError):
            continue
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextmanager
def mps_session(
    *,
    existing_pipe: str | None,
    gpu_uuids: Sequence[str],
    notes: list[str],
) -> Iterator[MpsDaemon]:
    """The daemon for a run's MPS clients, for the duration of the ``with`` body.

    Args:
        existing_pipe: the control pipe of a daemon that runs already (used and left
            running), or None to start a private one (stopped when the body ends, however).
        gpu_uuids: the GPUs the clients use (a private daemon sees only these).
        notes: the run's notes; what the session did and anything left running go here.

    Raises:
        InputError: no control program (private daemon only).
        HardwareError: the private daemon did not start.
    """
    if existing_pipe:
        try:
            binary: str | None = control_binary()
        except InputError:
            binary = None  # a daemon of another container or user: use it unchecked
        daemon = MpsDaemon(binary=binary, pipe_dir=os.path.dirname(existing_pipe))
        answers = True
        if binary is not None:
            try:
                daemon.server_pids(timeout_s=PROBE_TIMEOUT_S)
            except HardwareError as exc:  # a pipe a dead daemon left behind
                answers = False
                notes.append(
                    f"MPS: the control pipe {existing_pipe} does not answer ({exc.message}); "
                    "started a private daemon instead"
                )
        if answers:
            notes.append(
                f"MPS: used the control daemon that already runs (pipe {daemon.pipe_dir}); "
                "left it running"
                + ("" if binary else f" (without {CONTROL} here, unchecked that clients reach it)")
            )
            cap = daemon.thread_cap()
            if cap is not None and cap < 100:
                notes.append(
                    f"warning: that MPS daemon's default active-thread percentage is {cap:g}: "
                    "shares above it ran at it"
                )
            yield daemon
            return
    with _terminate_as_interrupt():
        daemon = start_private(gpu_uuids)
        notes.append(
            f"MPS: started a private control daemon for this run (pipe {daemon.pipe_dir}, "
            f"GPUs {', '.join(gpu_uuids) or 'all'})"
        )
        try:
            yield daemon
        except BaseException as exc:
            note = stop_private(daemon, keep=True)
            notes.append(note)
            if isinstance(exc, GreenctlError) and note.startswith("warning"):
                exc.hint = f"{exc.hint}; {note}" if exc.hint else note  # a failed run says it too
            raise
        notes.append(stop_private(daemon))

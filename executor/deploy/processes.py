"""The processes ``apply`` starts and stops on this machine: executor daemons, and each
dispatcher with its supervisor (a pair).

Every process is found by its recorded pid and start time (a reused pid is never
signalled), by the pid its state file names, or by its state or pair file on its command
line (started, never recorded). The process primitives (spawn, wait until ready, terminate)
are called here only, so fault tests can stand in for them in one place.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.errors import InputError
from greenctl.data.records import utcnow_iso
from greenctl.data.resources import PIN_GPU, PIN_MIG_INSTANCE, parse_resource
from greenctl.data.store import Store
from greenctl.executor.deploy import partition
from greenctl.executor.deploy.instances import InstanceSpec
from greenctl.executor.runtime.procs import (
    find_processes,
    is_alive,
    proc_start_ticks,
    process_argv,
    python_module_argv,
    read_json,
    spawn_detached,
    terminate,
    wait_for_state_file,
    write_json_atomic,
)
from greenctl.executor.runtime.supervisor import supervisor_argv

SUPERVISOR_MODULE = "greenctl.executor.runtime.supervisor"

#: a step that undoes what was done, and its description
Undo = tuple[str, Callable[[], object]]


# -- executors ---------------------------------------------------------------------------------
def executor_spawn(
    s: InstanceSpec,
    inst_id: str,
    cores: list[int],
    *,
    state_dir: Path,
    store: Store,
    loader: str,
    max_wait_ms: float,
    mps_env: dict[str, str],
    ready_timeout_s: float,
) -> dict[str, Any]:
    """How to start the executor of ``s`` (argv, environment, state and log files): pinned
    to its cores, GPU or MIG slice (MPS executors join the daemon of ``mps_env``); its
    batches wait ``max_wait_ms`` unless the spec sets its own.

    Raises:
        InputError: a MIG deployment without a placement.
    """
    state_file = state_dir / f"executor-{inst_id}.json"
    if state_file.exists():
        state_file.unlink()
    wait_ms = max_wait_ms if s.max_wait_ms is None else s.max_wait_ms  # a glet's: its cycle
    argv = python_module_argv(
        "greenctl.executor.runtime.daemon",
        *("--model", s.model, "--variant", s.variant, "--resource", s.resource),
        *("--cores", ",".join(map(str, cores)), "--batch", str(s.batch)),
        *("--max-wait-ms", str(wait_ms), "--host", "127.0.0.1", "--port", "0"),
        *("--state-file", str(state_file), "--db", str(store.path)),
        *("--loader", loader, "--instance-id", inst_id),
    )
    env = {"GREENCTL_DB": str(store.path), "GREENCTL_STATE_DIR": str(state_dir)}
    spawn: dict[str, Any] = {
        "argv": argv,
        "env": env,
        "state_file": str(state_file),
        "log_file": str(state_dir / f"executor-{inst_id}.log"),
        "ready_timeout_s": ready_timeout_s,
    }
    r = parse_resource(s.resource)
    device: str | None = None
    if r.spec.pinning == PIN_MIG_INSTANCE:
        if s.mig is None:
            raise InputError(
                f"deployment {s.variant} on {s.resource} names no MIG placement",
                hint="MIG plans need a gpus layout (greenctl plan mig) or placement {gpu, start}",
            )
        device = partition.mig_uuid(partition.gpu_backend(), s.mig)
        spawn["mig"] = {"gpu": s.mig.gpu, "profile": s.mig.profile, "start": s.mig.start}
    elif r.spec.pinning == PIN_GPU:
        backend = partition.gpu_backend()
        uuid = next((g.uuid for g in backend.gpus() if g.index == s.gpu), None)
        device = str(uuid if uuid else s.gpu)
    env.update(r.spec.pin_env(r.size, device=device))
    if r.spec.thread_percentage:
        env.update(mps_env)
    return spawn


def launch(spawn: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start a daemon as its spawn document says (detached: it outlives the apply)."""
    return spawn_detached(spawn["argv"], env=spawn["env"], log_file=spawn["log_file"])


def wait_ready(
    spawn: dict[str, Any], proc: subprocess.Popen[bytes], *, timeout_s: float, what: str
) -> dict[str, Any]:
    """Wait until a launched daemon reports ready; its state document."""
    return wait_for_state_file(
        Path(spawn["state_file"]),
        proc=proc,
        timeout_s=timeout_s,
        what=what,
        log_file=Path(spawn["log_file"]),
    )


def instance_processes(row: dict[str, Any]) -> list[tuple[int, str | None]]:
    """The processes of an instance row that run now: its recorded pid, the pid its state
    file names, and any process with its state file on the command line (started but not
    recorded)."""
    found: dict[int, str | None] = {}
    candidates: list[tuple[Any, Any]] = [(row.get("pid"), row.get("pid_start"))]
    state_file = json.loads(row.get("spawn") or "{}").get("state_file")
    if state_file:
        doc = read_json(state_file) or {}
        candidates.append((doc.get("pid"), doc.get("pid_start")))
        candidates += find_processes(str(state_file))
    for pid, ticks in candidates:
        if pid and int(pid) not in found and is_alive(int(pid), ticks):
            found[int(pid)] = ticks
    return list(found.items())


def stop_instance(row: dict[str, Any]) -> bool:
    """Stop every process of an instance row; True when none is left."""
    ok = True
    for pid, ticks in instance_processes(row):
        ok = terminate(pid, ticks) and ok
    return ok


def instance_stopper(store: Store, row: dict[str, Any]) -> Callable[[], object]:
    """The undo step of a journaled executor: stop it and forget its record."""

    def stop() -> None:
        current = deployments.instance_row(store, row["id"])
        stop_instance(current)
        deployments.forget_instance(store, row["id"])

    return stop


# -- the dispatcher and its supervisor (a pair) ------------------------------------------------
def start_pair(
    store: Store,
    state_dir: Path,
    *,
    apply_id: int,
    undo: list[Undo],
    host: str,
    port: int | None,
    any_port: bool,
    max_queue: int,
    ready_timeout_s: float,
) -> dict[str, Any]:
    """Journal a dispatcher pair, start its supervisor (which binds ``host:port``, another
    port too with ``any_port``, and starts the dispatcher), and wait until the dispatcher
    serves; returns its row.

    Raises:
        ExecutorError: the address cannot be bound or the dispatcher did not start (nothing
            of it is left running).
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    base = state_dir / f"dispatcher-{stamp}"
    pair: dict[str, Any] = {
        "db": str(store.path),
        "host": host,
        "port": int(port or 0),
        "any_port": any_port,
        "max_queue": max_queue,
        "ready_timeout_s": min(ready_timeout_s, 60.0),
        "token": secrets.token_hex(16),
        "dispatcher_state_file": f"{base}.json",
        "dispatcher_log_file": f"{base}.log",
        "supervisor_state_file": f"{base}.supervisor.json",
        "supervisor_log_file": f"{base}.supervisor.log",
        "routes_file": f"{base}.routes.json",
        "stop_file": f"{base}.stop",
    }
    row: dict[str, Any] = {
        "apply_id": apply_id,
        "host": host,
        "port": int(port or 0),
        "state_file": pair["dispatcher_state_file"],
        "log_file": pair["dispatcher_log_file"],
        "pair_file": f"{base}.pair.json",
        "started_at": utcnow_iso(),
    }
    row["id"] = deployments.journal_dispatcher(store, row)
    pair["id"] = row["id"]
    write_json_atomic(row["pair_file"], pair)

    def stop() -> None:
        stop_pair(row)
        deployments.forget_dispatcher(store, row["id"])

    undo.append(("stop the new dispatcher and its supervisor", stop))
    proc = spawn_detached(
        supervisor_argv(row["pair_file"], str(store.path)),
        env={"GREENCTL_DB": str(store.path)},
        log_file=pair["supervisor_log_file"],
    )
    ticks = proc_start_ticks(proc.pid)
    deployments.set_dispatcher_process(
        store, row["id"], supervisor_pid=proc.pid, supervisor_pid_start=ticks
    )
    doc = wait_for_state_file(
        Path(pair["supervisor_state_file"]),
        proc=proc,
        timeout_s=float(pair["ready_timeout_s"]) + 5.0,
        what="the dispatcher",
        log_file=Path(pair["dispatcher_log_file"]),
    )
    row.update(
        port=int(doc["port"]),
        pid=doc.get("dispatcher_pid"),
        pid_start=doc.get("dispatcher_pid_start"),
        supervisor_pid=proc.pid,
        supervisor_pid_start=ticks,
        state="starting",
    )
    deployments.set_dispatcher_process(
        store, row["id"], port=row["port"], pid=row["pid"], pid_start=row["pid_start"]
    )
    return row


def pair_of(row: dict[str, Any]) -> dict[str, Any]:
    """The pair file of a dispatcher row (empty for a dispatcher without a supervisor)."""
    return (read_json(row["pair_file"]) if row.get("pair_file") else None) or {}


def touch_stop_file(row: dict[str, Any]) -> None:
    """Create a pair's stop file: from then on neither process restarts anything."""
    stop_file = pair_of(row).get("stop_file")
    if stop_file:
        os.close(os.open(stop_file, os.O_WRONLY | os.O_CREAT, 0o600))


def dispatcher_process(row: dict[str, Any]) -> tuple[int, str | None] | None:
    """The dispatcher process of a pair that runs now (its supervisor may have replaced the
    one the row names), or None."""
    doc = read_json(row["state_file"]) if row.get("state_file") else None
    for pid, ticks in (
        ((doc or {}).get("pid"), (doc or {}).get("pid_start")),
        (row.get("pid"), row.get("pid_start")),
    ):
        if pid and is_alive(int(pid), ticks):
            return int(pid), ticks
    return None


def supervisor_process(row: dict[str, Any]) -> tuple[int, str | None] | None:
    """The supervisor process of a pair that runs now, or None."""
    doc = read_json(pair_of(row).get("supervisor_state_file") or os.devnull)
    for pid, ticks in (
        ((doc or {}).get("pid"), (doc or {}).get("pid_start")),
        (row.get("supervisor_pid"), row.get("supervisor_pid_start")),
    ):
        if pid and is_alive(int(pid), ticks):
            return int(pid), ticks
    return None


def pair_serves(row: dict[str, Any], wait_s: float = 5.0) -> bool:
    """Whether a recorded dispatcher runs: its process, or (while it is being replaced) its
    supervisor and a new dispatcher within ``wait_s``."""
    if dispatcher_process(row) is not None:
        return True
    deadline = time.monotonic() + wait_s
    while supervisor_process(row) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        if dispatcher_process(row) is not None:
            return True
    return False


def _pair_processes(row: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    """``(kind, pid, start ticks)`` of a pair's live processes, by every trace it left."""
    found: list[tuple[str, int, str | None]] = []
    seen: set[int] = set()

    def add(kind: str, pid: Any, ticks: Any) -> None:
        if pid and int(pid) not in seen and is_alive(int(pid), ticks):
            seen.add(int(pid))
            found.append((kind, int(pid), ticks))

    sup = supervisor_process(row)
    if sup is not None:
        add("supervisor", *sup)
    add("supervisor", row.get("supervisor_pid"), row.get("supervisor_pid_start"))
    disp = dispatcher_process(row)
    if disp is not None:
        add("dispatcher", *disp)
    add("dispatcher", row.get("pid"), row.get("pid_start"))
    if row.get("pair_file"):  # processes started but never recorded
        for pid, ticks in find_processes(str(row["pair_file"])):
            argv = process_argv(pid) or []
            add("supervisor" if SUPERVISOR_MODULE in argv else "dispatcher", pid, ticks)
    if row.get("state_file"):
        for pid, ticks in find_processes(str(row["state_file"])):
            add("dispatcher", pid, ticks)
    return found


def stop_pair(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Stop a dispatcher and its supervisor, whatever state the row is in: the stop file
    first (neither restarts anything once it exists), then the supervisor (which stops its
    dispatcher), then any process of the pair left (found by pid and start time, or by the
    pair's files on its command line when no pid was recorded). Returns what was running."""
    touch_stop_file(row)
    stopped = []
    # supervisors first: each stops its dispatcher on SIGTERM
    for kind, pid, ticks in sorted(_pair_processes(row), key=lambda f: f[0] != "supervisor"):
        terminate(pid, ticks)
        stopped.append({kind: row["id"], "pid": pid})
    return stopped

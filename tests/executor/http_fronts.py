"""The three HTTP fronts started for real, for the strict and fuzz tests of the HTTP layer.

:func:`start_fronts` applies a one-executor plan (the no-op model, input ``[-1, 4]``) with
``apply_plan`` (a supervised dispatcher and an executor launched as ``apply`` launches them)
and starts a geo router in front of that dispatcher (one site, gateway ``g1`` by default);
:func:`raw_exchange` speaks HTTP/1.1 over a socket and reads every answer the server sends.
Loaded by path (the suite imports test modules in importlib mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import processes_of

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
ROW = 4
FRONTS = ("dispatcher", "executor", "georouter")


@dataclass
class Front:
    """One HTTP front: its port, the admin path it serves and the token that opens it."""

    name: str
    port: int
    admin_path: str
    token: str
    state_file: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _wait_ready(state: Path, proc: subprocess.Popen[bytes] | None, log: Path) -> dict[str, Any]:
    from greenctl.executor.runtime.procs import read_json

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        doc = read_json(state)
        if doc and (doc.get("ready") or doc.get("error")):
            assert doc.get("ready"), doc
            return doc
        assert proc is None or proc.poll() is None, log.read_text() if log.exists() else ""
        time.sleep(0.05)
    raise AssertionError(f"{state} did not become ready")


def _geo_router(folder: Path, site_url: str) -> tuple[subprocess.Popen[bytes], Front]:
    from greenctl.executor.runtime.procs import python_module_argv, write_json_atomic

    folder.mkdir()
    token = "geo-" + os.urandom(8).hex()
    table = {
        "start": "2024-01-01T00:00:00Z",
        "step_h": 1.0,
        "slots": [{"g1": {"s1": 1.0}}],
        "overall": {"g1": {"s1": 1.0}},
        "gateways": ["g1"],
        "allowed": {"g1": ["s1"]},
    }
    write_json_atomic(
        folder / "router.json",
        {"sites": {"s1": site_url}, "token": token, "gateway": "g1", "health_interval_s": 0.25},
    )
    write_json_atomic(folder / "table.json", {"table": table, "at": "2024-01-01T00:30:00Z"})
    argv = python_module_argv(
        "greenctl.executor.deploy.georouter", "--state-dir", str(folder), "--port", "0"
    )
    log = folder / "router.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    doc = _wait_ready(folder / "state.json", proc, log)
    return proc, Front("georouter", int(doc["port"]), "/admin/geo", token)


@contextlib.contextmanager
def start_fronts(folder: Path) -> Iterator[dict[str, Front]]:
    """The dispatcher, the executor and the geo router of one applied plan; all stopped
    (and any process left naming ``folder`` killed) on exit."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.executor.runtime.procs import read_json

    saved = {k: os.environ.get(k) for k in ("GREENCTL_STATE_DIR", "GREENCTL_NOOP_SERVICE_MS")}
    os.environ["GREENCTL_STATE_DIR"] = str(folder / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    store = open_store(folder / "fronts.db")
    router = None
    try:
        plan = Plan(
            kind="mix",
            deployments=[Deployment(model="m", variant="v", resource="cpu:1", count=1, batch=2)],
        )
        result = apply_plan(plan, store=store, loader=NOOP)
        disp_port = int((result.dispatcher_url or "").rsplit(":", 1)[1])
        states = folder / "state"
        disp_token = next(
            t for f in states.glob("dispatcher-*.json") if (t := (read_json(f) or {}).get("token"))
        )
        exec_state = next(states.glob("executor-*.json"))
        exec_doc = read_json(exec_state) or {}
        router, geo = _geo_router(folder / "geo", str(result.dispatcher_url))
        yield {
            "dispatcher": Front("dispatcher", disp_port, "/admin/routes", disp_token),
            "executor": Front(
                "executor",
                int(exec_doc["port"]),
                "/admin/carbon",
                str(exec_doc.get("token") or ""),
                state_file=exec_state,
            ),
            "georouter": geo,
        }
    finally:
        if router is not None:
            router.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                router.wait(10)
        with contextlib.suppress(Exception):
            down(store, wait=True)
        store.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for pid in processes_of(str(folder)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _parse_answers(data: bytes) -> tuple[list[Answer], bytes]:
    """The whole answers at the start of ``data`` and the bytes after them."""
    answers = []
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        if len(rest) < length:
            break
        status = int(lines[0].split()[1])
        data = rest[length:]
        if status == 100:  # an interim answer: the final one follows
            continue
        answers.append(Answer(status, headers, rest[:length]))
    return answers, data


def raw_exchange(
    port: int, raw: bytes, *, expect: int = 1, timeout_s: float = 8.0, half_close: bool = False
) -> tuple[list[Answer], bool]:
    """Send ``raw`` in one send and read answers until ``expect`` of them came or the server
    closed; the answers, and whether it closed. ``half_close`` shuts our side for writing
    after the send (a truncated request: the server sees the end of it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(raw)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        answers: list[Answer] = []
        closed = False
        while len(answers) < expect:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
            answers, _ = _parse_answers(data)
        return answers, closed


def request_bytes(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """One HTTP/1.1 request with ``Content-Length`` (unless ``headers`` set their own)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: t"]
    hdrs = dict(headers or {})
    if body or method == "POST":
        hdrs.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in hdrs.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def infer_body(rows: int = 1, **extra: Any) -> bytes:
    """A valid JSON inference request for the no-op model (``rows`` rows of ``[4]``)."""
    doc = {
        "inputs": [
            {
                "name": "input",
                "shape": [rows, ROW],
                "datatype": "FP32",
                "data": [float(i % 7) for i in range(rows * ROW)],
            }
        ],
        **extra,
    }
    return json.dumps(doc).encode()


def infer(port: int, body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    """One inference request on a fresh connection, and its answer."""
    raw = request_bytes(
        "POST",
        "/v2/models/m/infer",
        infer_body() if body is None else body,
        {"Content-Type": "application/json", **(headers or {})},
    )
    answers, _ = raw_exchange(raw=raw, port=port)
    assert answers, f"no answer to {raw[:200]!r}"
    return answers[0]

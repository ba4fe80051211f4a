"""Talking to a running dispatcher: its admin API (``/admin/routes``), the routing table
``apply`` hands it, and plain health and metrics reads.

A dispatcher row is the store's record of it (:mod:`greenctl.data.deployments`): its host,
port and state file (where its admin token is).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from greenctl.data.errors import ExecutorError
from greenctl.executor.runtime.dispatcher import TOKEN_HEADER
from greenctl.executor.runtime.offers import MODEL_KEYS as OFFER_MODEL_KEYS
from greenctl.executor.runtime.procs import read_json


def connect_host(host: str) -> str:
    """The address to connect to for a listening ``host`` (a wildcard: loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def url_of(row: dict[str, Any]) -> str:
    """The base URL of a dispatcher or instance row."""
    return f"http://{connect_host(row['host'])}:{row['port']}"


def dispatcher_token(row: dict[str, Any]) -> str:
    """The admin token a dispatcher wrote to its state file."""
    doc = (read_json(row["state_file"]) if row.get("state_file") else None) or {}
    return str(doc.get("token", ""))


def admin(
    row: dict[str, Any], method: str, doc: dict[str, Any] | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """GET or POST a dispatcher's routing table.

    Raises:
        ExecutorError: the dispatcher refused the change or cannot be reached.
    """
    url = f"{url_of(row)}/admin/routes"
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header(TOKEN_HEADER, dispatcher_token(row))
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        raise ExecutorError(
            f"the dispatcher refused the routing change: {exc.read().decode(errors='replace')}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ExecutorError(
            f"cannot reach the dispatcher at {url}: {getattr(exc, 'reason', exc)}"
        ) from None


def routes_doc(
    rows: list[dict[str, Any]], policy: str, max_queue: int, generation: int | None
) -> dict[str, Any]:
    """The dispatcher's routing table for instance rows (``model``, ``batch``,
    ``quota_rps``, address and process, ``spawn``)."""
    models: dict[str, Any] = {}
    for row in rows:
        m = models.setdefault(
            row["model"], {"policy": policy, "max_queue": max_queue, "instances": []}
        )
        m["instances"].append(
            {
                "id": row["id"],
                "variant": row["variant"],  # model-less requests route by variant name
                "url": url_of(row),
                "weight": row["quota_rps"] if row["quota_rps"] else 1.0,
                # batch + 1: one request travels while a full batch runs, so the executor
                # does not idle for the dispatcher's round trip (fifo/batch policies)
                "slots": int(row["batch"]) + 1,
                "pid": row["pid"],
                "pid_start": row["pid_start"],
                "spawn": json.loads(row["spawn"]) if row.get("spawn") else None,
                "restarts": row.get("restarts") or 0,
            }
        )
    return {"generation": generation, "models": models}


def strip_runtime(doc: dict[str, Any]) -> dict[str, Any]:
    """A routing table as read back, without the live fields the dispatcher adds, so it
    can be posted again (to undo a switch)."""
    models = {}
    for name, m in (doc.get("models") or {}).items():
        models[name] = {
            "policy": m["policy"],
            "max_queue": m["max_queue"],
            "instances": m["instances"],
            **{k: m[k] for k in OFFER_MODEL_KEYS if k in m},  # model-less requests' offers
        }
    out: dict[str, Any] = {"generation": doc.get("generation"), "models": models}
    if "carbon" in doc:  # the grid intensity the dispatcher counts with
        out["carbon"] = doc["carbon"]
    return out


def routed_ids(doc: dict[str, Any]) -> list[str]:
    """The instance ids a routing table routes to, sorted."""
    return sorted(b["id"] for m in (doc.get("models") or {}).values() for b in m["instances"])


def get_ok(url: str, timeout_s: float) -> bool:
    """Whether ``url`` answers 200 within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def get_text(url: str, timeout_s: float) -> str | None:
    """The body ``url`` answers with, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None

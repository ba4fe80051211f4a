"""What the running executors' energy counters say: a snapshot of every ready instance's
``greenctl_energy_joules_total`` (see :mod:`greenctl.executor.runtime.metrics`), and the energy
between two snapshots, split into CPU and accelerator energy (``apply --verify`` records it
beside a run, ``report emissions`` reads it)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

from greenctl.data import deployments
from greenctl.data.resources import kind_of
from greenctl.data.store import Store
from greenctl.executor.runtime.metrics import ENERGY_TOTAL, label_value, parse_prometheus


def _get_text(url: str, timeout_s: float) -> str | None:
    """The body of ``url`` (a ``/metrics`` page), None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def energy_snapshot(store: Store, *, timeout_s: float = 2.0) -> dict[str, Any]:
    """``{"t": monotonic seconds, "instances": {id: {"resource", "source", "joules"}}}`` of
    every ready executor that answers; one that does not, or exports no energy, is left out
    and named in ``missing``."""
    out: dict[str, Any] = {"t": time.monotonic(), "instances": {}, "missing": []}
    for row in deployments.ready_instances(store):
        host = "127.0.0.1" if row["host"] in (None, "", "0.0.0.0") else row["host"]
        text = _get_text(f"http://{host}:{row['port']}/metrics", timeout_s)
        flat = parse_prometheus(text) if text else {}
        hits = [(k, v) for k, v in flat.items() if k.startswith(ENERGY_TOTAL + "{")]
        if not hits:
            out["missing"].append(row["id"])
            continue
        key, joules = hits[0]
        out["instances"][row["id"]] = {
            "resource": row["resource"],
            "source": label_value(key, "source"),
            "joules": joules,
        }
    return out


def energy_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Energy the executors used between two snapshots: ``cpu_j``, ``gpu_j`` (accelerators),
    ``window_s``, ``sources`` and the instances left out (``missing``: not in both, or whose
    counter went back, i.e. it restarted). None when no instance is in both."""
    cpu_j = gpu_j = 0.0
    sources: set[str] = set()
    missing = sorted(set(before.get("missing", [])) | set(after.get("missing", [])))
    counted = 0
    for inst_id, b in before["instances"].items():
        a = after["instances"].get(inst_id)
        if a is None or a["joules"] < b["joules"]:
            missing.append(inst_id)
            continue
        d = a["joules"] - b["joules"]
        if kind_of(a["resource"]).accelerator:
            gpu_j += d
        else:
            cpu_j += d
        sources.add(str(a["source"]))
        counted += 1
    if not counted:
        return None
    return {
        "cpu_j": cpu_j,
        "gpu_j": gpu_j,
        "window_s": max(after["t"] - before["t"], 0.0),
        "sources": sorted(sources),
        "instances": counted,
        "missing": sorted(set(missing)),
    }

"""What the local backend runs now, with live figures, and whether the plan fully serves
(:func:`status`): the dispatcher and its supervisor, each instance as the dispatcher sees
it (it restarts them), and the problems in words.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from greenctl.data import deployments
from greenctl.data.errors import ExecutorError, LockedError
from greenctl.data.store import Store
from greenctl.executor.deploy.actions import BACKEND
from greenctl.executor.deploy.admin import admin, get_ok, get_text, url_of
from greenctl.executor.deploy.instances import instance_view
from greenctl.executor.deploy.processes import dispatcher_process, pair_of, supervisor_process
from greenctl.executor.deploy.teardown import recover
from greenctl.executor.runtime.metrics import parse_prometheus
from greenctl.executor.runtime.procs import apply_lock, is_alive, read_json, state_dir_for


def status(store: Store, *, timeout_s: float = 1.0) -> dict[str, Any]:
    """What runs now, with live figures, and whether the plan fully serves.

    ``state`` is ``idle`` (nothing applied, or taken down), ``serving`` (the dispatcher, its
    supervisor and every instance up), ``degraded`` (the dispatcher serves, but an instance
    is down, restarting or crash-looping, or the supervisor is gone) or ``down`` (no
    dispatcher serves); ``problems`` says why in words. What an interrupted apply left is
    stopped first (``recovered``), unless an apply runs now (``apply_running``).
    """
    recovered: list[dict[str, Any]] = []
    apply_running = False
    if deployments.unsettled(store):
        try:
            with apply_lock(state_dir_for(store.path)):
                recovered = recover(store)
        except LockedError:
            apply_running = True  # what it started is its own to finish or undo
    problems: list[str] = []
    disp = deployments.running_dispatcher(store)
    disp_view: dict[str, Any] | None = None
    routed: dict[str, dict[str, Any]] = {}  # instance id -> the dispatcher's view of it
    if disp is not None:
        disp_view, routed = _dispatcher_view(disp, timeout_s, problems)
    serving = disp_view is not None and disp_view["alive"]
    instances = []
    for row in deployments.ready_instances(store):
        view = _instance_view(row, routed.get(row["id"]), timeout_s, problems)
        if serving and routed and row["id"] not in routed:
            problems.append(f"{_what(row)} is not in the dispatcher's routes")
        instances.append(view)
    if disp is None and instances:
        problems.insert(0, f"no dispatcher runs for the {len(instances)} instance(s)")
    if disp is None and not instances:
        state = "idle"
    elif not serving:
        state = "down"
    else:
        state = "degraded" if problems else "serving"
    last = deployments.last_apply(store)
    tiers = llm_tiers(instances, routed)
    return {
        "backend": BACKEND,
        "state": state,
        "problems": problems,
        "dispatcher": disp_view,
        "instances": instances,
        "restarts": deployments.restart_count(store),
        "last_apply": None
        if last is None
        else {
            k: last[k] for k in ("id", "plan_id", "status", "started_at", "finished_at", "error")
        },
        "apply_running": apply_running,
        "recovered": recovered,
        **({"llm": {"tiers": tiers}} if tiers else {}),
    }


def llm_tiers(
    instances: list[dict[str, Any]], routed: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The LLM tiers that run: per tier its engine, share, quality, predicted TTFT (at the
    plan's percentile) and instances (as the dispatcher routes them, else as started)."""
    out: dict[str, dict[str, Any]] = {}
    for view in instances:
        llm = (routed.get(view["id"]) or {}).get("llm") or view.get("engine") or {}
        if not view.get("engine"):
            continue
        tier = out.setdefault(
            view["variant"],
            {
                "variant": view["variant"],
                "model": view["model"],
                "engine": view["engine"]["engine"],
                "model_path": view["engine"]["model"],
                "share": llm.get("share"),
                "quality": llm.get("quality"),
                "ttft_ms": llm.get("ttft_ms"),
                "percentile": llm.get("percentile"),
                "instances": 0,
                "ready": 0,
            },
        )
        tier["instances"] += 1
        tier["ready"] += int(bool(view["ready"]))
    return list(out.values())


def _dispatcher_view(
    disp: dict[str, Any], timeout_s: float, problems: list[str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The dispatcher pair's view and its routes by instance id (when it answers); its
    problems are added to ``problems``."""
    url = url_of(disp)
    proc = dispatcher_process(disp)
    sup = supervisor_process(disp)
    pair = pair_of(disp)
    alive = proc is not None
    view: dict[str, Any] = {
        "url": url,
        "port": disp["port"],
        "pid": proc[0] if proc else disp["pid"],
        "alive": alive,
        "ready": alive and get_ok(url + "/v2/health/ready", timeout_s),
        "plan_id": disp["plan_id"],
        "log_file": disp["log_file"],
        "supervisor": None,
    }
    if pair:
        sup_doc = read_json(pair["supervisor_state_file"]) or {}
        retry_at = sup_doc.get("retry_at")
        view["supervisor"] = {
            "pid": sup[0] if sup else disp.get("supervisor_pid"),
            "alive": sup is not None,
            "log_file": pair.get("supervisor_log_file"),
            "dispatcher_restarts": int(sup_doc.get("restarts") or 0),
            "dispatcher_failures": int(sup_doc.get("failures") or 0),
            "retry_in_s": None if not retry_at else max(0.0, retry_at - time.time()),
        }
    routed: dict[str, dict[str, Any]] = {}
    if alive:
        with contextlib.suppress(ExecutorError):
            doc = admin(disp, "GET", timeout_s=max(timeout_s, 1.0))
            for name, m in (doc.get("models") or {}).items():
                for b in m.get("instances") or []:
                    routed[b["id"]] = {**b, "model": name}
        if pair and sup is None:
            problems.append(
                f"the dispatcher's supervisor (pid {disp.get('supervisor_pid')}) is gone; "
                "the dispatcher starts a new one"
            )
    elif sup is not None:
        sv = view["supervisor"] or {}
        looping = (
            f" in {sv['retry_in_s']:.0f} s (crash loop: {sv['dispatcher_failures']} "
            "failures in a row)"
            if sv.get("retry_in_s")
            else ""
        )
        problems.append(
            f"the dispatcher at {url} is down; its supervisor (pid {sup[0]}) restarts it{looping}"
        )
    else:
        problems.append(
            f"the dispatcher at {url} and its supervisor are gone: nothing answers there; "
            "`greenctl apply PLAN` starts them again on the same port (`greenctl down` "
            "stops the executors)"
        )
    return view, routed


def _what(row: dict[str, Any]) -> str:
    return f"instance {row['id']} ({row['variant']} on {row['resource']})"


def _instance_view(
    row: dict[str, Any], b: dict[str, Any] | None, timeout_s: float, problems: list[str]
) -> dict[str, Any]:
    """An instance's view: where it runs (the dispatcher's entry ``b`` knows best: it
    restarts them), whether it is alive and ready, its live figures and its state; its
    problem, if any, is added to ``problems``."""
    view = instance_view(row)
    pid, ticks, url = row["pid"], row["pid_start"], url_of(row)
    if b is not None:
        pid, ticks, url = b.get("pid"), b.get("pid_start"), b.get("url") or url
        view["pid"] = pid
        port = url.rsplit(":", 1)[-1]
        view["port"] = int(port) if port.isdigit() else None
        view["restarts"] = max(view["restarts"], int(b.get("restarts") or 0))
    view["url"] = url
    view["alive"] = is_alive(pid, ticks)
    engine = json.loads(row.get("spawn") or "{}").get("llm")  # an LLM tier's engine
    view["engine"] = engine
    ready_path = "/v1/models" if engine else "/v2/health/ready"
    view["ready"] = view["alive"] and get_ok(url + ready_path, timeout_s)
    view.update(_live_figures(url, timeout_s) if view["alive"] else _NO_FIGURES)
    view["p95"] = view["p95_ms"]  # the field name scripts read; milliseconds
    failures = int((b or {}).get("failures") or 0)
    state = _instance_state(view, b, failures)
    view.update(
        state=state,
        up=None if b is None else bool(b.get("up")),  # the dispatcher routes to it
        failures=failures,
        retry_in_s=(b or {}).get("retry_in_s"),
        last_error=(b or {}).get("last_error"),
    )
    problem = _instance_problem(view, b)
    if problem:
        problems.append(f"{_what(row)} {problem}")
    return view


_NO_FIGURES: dict[str, Any] = {"requests": None, "p95_ms": None}


def _live_figures(url: str, timeout_s: float) -> dict[str, Any]:
    """Requests served and the windowed p95 latency, from an instance's metrics."""
    text = get_text(url + "/metrics", timeout_s)
    if not text:
        return _NO_FIGURES
    flat = parse_prometheus(text)
    p95 = [
        v
        for k, v in flat.items()
        if k.startswith("greenctl_request_latency_window_ms{") and 'quantile="0.95"' in k
    ]
    return {
        "requests": int(
            sum(v for k, v in flat.items() if k.startswith("greenctl_requests_total{"))
        ),
        "p95_ms": p95[0] if p95 else None,
    }


def _instance_state(view: dict[str, Any], b: dict[str, Any] | None, failures: int) -> str:
    if failures >= 2:  # died soon after its last restarts (even if up again, for now)
        return "crash-loop"
    if b is not None and b.get("restarting"):
        return "restarting"
    if view["ready"]:
        return "ready"
    return "not ready" if view["alive"] else "down"


def _instance_problem(view: dict[str, Any], b: dict[str, Any] | None) -> str | None:
    """What is wrong with an instance, in words after its name, or None."""
    state = view["state"]
    if state == "crash-loop":
        retry = view["retry_in_s"]
        if retry:
            now = f"the supervisor restarts it in {retry:.0f} s"
        elif b is not None and b.get("restarting"):
            now = "the supervisor is restarting it"
        else:
            now = "it is up again, for now"
        return (
            f"is crash-looping: {view['failures']} failures in a row, each soon after it "
            f"started; {now} (backing off, never giving up)"
            + (f"; last error: {view['last_error']}" if view["last_error"] else "")
        )
    if state == "restarting":
        return "is restarting after its process exited"
    if state != "ready":
        return f"is {state}"
    return None

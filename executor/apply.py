"""Make a plan real on this machine: ``apply_plan``, ``status`` and ``down``, the local
backend (:class:`greenctl.executor.backends.LocalBackend` is its face to the CLI and to
``replan --apply``; the state it keeps is in :mod:`greenctl.data.deployments`).

``apply_plan`` validates a plan against this machine, diffs it against what runs now (state
in the store), and then acts in an order that keeps serving: MIG layout (with a checkpoint),
MPS control daemon, dispatcher, new executors (waiting until ready), one atomic routing switch
on the dispatcher, the store commit, and only then stopping what the plan no longer needs.
Any failure before the commit undoes every step already taken, in reverse, so the previous
configuration keeps serving. Applying the running plan again does nothing. A lock file
serialises concurrent applies. Nothing here prints: results are returned.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.errors import (
    ExecutorError,
    GreenctlError,
    HardwareError,
    InputError,
    NotFoundError,
)
from greenctl.data.plan import Plan, check_families
from greenctl.data.records import utcnow_iso
from greenctl.data.resources import (
    PIN_GPU,
    PIN_MIG_INSTANCE,
    parse_resource,
    runnable_resource,
)
from greenctl.data.store import Store
from greenctl.executor import partition
from greenctl.executor.kinds import get_kind
from greenctl.executor.procs import (
    apply_lock,
    is_alive,
    log_tail,
    python_module_argv,
    spawn_detached,
    state_dir_for,
    terminate,
    wait_for_state_file,
)

DEFAULT_LOADER = "greenctl.profiler.models:load_model"
BACKEND = "local"  # this module is the local backend (executor/backends.py)
MPS_SERVICE = "mps-control"


@dataclass
class InstanceSpec:
    """One executor the plan wants."""

    model: str
    variant: str
    resource: str
    batch: int
    quota_rps: float | None
    mig: partition.MigSlot | None = None
    gpu: int | None = None  # whole GPU or MPS share: NVML index

    @property
    def key(self) -> str:
        where = ""
        if self.mig is not None:
            where = f"mig{self.mig.gpu}:{self.mig.profile}@{self.mig.start}"
        elif self.gpu is not None:
            where = f"gpu{self.gpu}"
        return f"{self.model}|{self.variant}|{self.resource}|b{self.batch}|{where}"


@dataclass
class ApplyResult:
    """What ``apply_plan`` did (or, with ``dry_run``, would do)."""

    plan_id: int | None
    changed: bool
    dry_run: bool
    actions: list[dict[str, Any]]
    dispatcher_url: str | None = None
    instances: list[dict[str, Any]] = field(default_factory=list)
    verify: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    history_id: int | None = None
    policy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "changed": self.changed,
            "dry_run": self.dry_run,
            "actions": self.actions,
            "dispatcher": {"url": self.dispatcher_url},
            "instances": self.instances,
            "verify": self.verify,
            "warnings": self.warnings,
            "history_id": self.history_id,
            "policy": self.policy,
        }


# -- reading the plan --------------------------------------------------------------------
def desired_instances(plan: Plan) -> list[InstanceSpec]:
    """Expand a plan into one spec per executor instance.

    MIG plans with a ``gpus`` list place one executor on each listed GPU instance; other
    deployments give ``count`` instances each.
    """
    specs: list[InstanceSpec] = []
    mig_deps: dict[tuple[str, str], Any] = {}
    gpus = plan.extra.get("gpus") if isinstance(plan.extra.get("gpus"), list) else None
    for d in plan.deployments:
        r = parse_resource(d.resource)
        per = None if d.quota_rps is None else d.quota_rps / max(d.count, 1)
        if r.spec.pinning == PIN_MIG_INSTANCE and gpus:
            mig_deps[(d.variant, r.size)] = d
            continue
        for i in range(d.count):
            gpu = None
            if r.spec.pinning == PIN_GPU:
                gpu = _gpu_index(d.device, d.placement, i)
            mig = None
            if r.spec.pinning == PIN_MIG_INSTANCE:
                start = _placement_start(d.placement, i)
                mig = (
                    partition.MigSlot(_gpu_index(d.device, d.placement) or 0, r.size, start)
                    if start is not None
                    else None
                )
            specs.append(
                InstanceSpec(d.model, d.variant, d.resource, d.batch, per, mig=mig, gpu=gpu)
            )
    if gpus:
        for gi, g in enumerate(gpus):
            index = int(g.get("index", gi))
            for j, slot in enumerate(g.get("layout") or []):
                profile = str(slot.get("profile", "")).removeprefix("mig:")
                variant = slot.get("variant")
                if not variant:
                    continue  # an idle slice
                d = mig_deps.get((variant, profile))
                if d is None:
                    raise InputError(
                        f"plan gpus[{gi}].layout[{j}] runs {variant} on {profile}, but no deployment "
                        f"has variant {variant} on mig:{profile}"
                    )
                per = None if d.quota_rps is None else d.quota_rps / max(d.count, 1)
                specs.append(
                    InstanceSpec(
                        d.model,
                        variant,
                        d.resource,
                        d.batch,
                        per,
                        mig=partition.MigSlot(index, profile, int(slot.get("start", 0))),
                    )
                )
    return specs


def _gpu_index(device: Any, placement: Any, i: int = 0) -> int | None:
    """The GPU of instance ``i``: ``placement.gpus[i]`` (glet plans), ``placement.gpu``,
    a numeric ``device``, else GPU 0."""
    if isinstance(placement, dict):
        gpus = placement.get("gpus")
        if isinstance(gpus, list) and i < len(gpus) and isinstance(gpus[i], int):
            return int(gpus[i])
        if isinstance(placement.get("gpu"), int):
            return int(placement["gpu"])
    if isinstance(device, int) or (isinstance(device, str) and device.isdigit()):
        return int(device)
    return 0


def _placement_start(placement: Any, i: int) -> int | None:
    if isinstance(placement, dict) and "start" in placement:
        return int(placement["start"])
    if isinstance(placement, list) and i < len(placement):
        item = placement[i]
        return int(item["start"]) if isinstance(item, dict) else int(item)
    return None


# -- the dispatcher's admin API ---------------------------------------------------------
def _dispatcher_token(row: dict[str, Any]) -> str:
    from greenctl.executor.procs import read_json

    doc = read_json(row["state_file"]) or {}
    return str(doc.get("token", ""))


def _admin(
    row: dict[str, Any], method: str, doc: dict[str, Any] | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    from greenctl.executor.dispatcher import TOKEN_HEADER

    url = f"http://{_connect_host(row['host'])}:{row['port']}/admin/routes"
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header(TOKEN_HEADER, _dispatcher_token(row))
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


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


# -- apply -------------------------------------------------------------------------------
def apply_plan(
    plan: Plan,
    *,
    store: Store,
    dry_run: bool = False,
    verify: bool = False,
    mig_parted: bool = False,
    wait: bool = False,
    lock_timeout_s: float | None = None,
    loader: str | None = None,
    policy: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    cores: list[int] | None = None,
    max_queue: int = 256,
    max_wait_ms: float = 2.0,
    ready_timeout_s: float = 120.0,
    verify_duration_s: float = 10.0,
    verify_rate_rps: float | None = None,
) -> ApplyResult:
    """Make ``plan`` the running configuration.

    Args:
        plan: the plan document.
        store: the open store (executor state lives there).
        dry_run: compute and return the actions only; change nothing.
        verify: after applying, run an open-loop load at the plan's rate and record the
            measured numbers beside its predictions (``store.add_run(kind="verify")``).
        mig_parted: leave the MIG layout to NVIDIA mig-parted / the GPU operator; only use the
            MIG instances that exist.
        wait: wait for a concurrent apply to finish instead of failing with LockedError.
        loader: ``module:function`` that loads a variant (default: the built-in catalog).
        policy: dispatch policy (fifo, wrr, batch), wins over the plan's own; default
            the plan kind's (:meth:`~greenctl.executor.kinds.PlanKind.dispatch_policy`, the
            one rule), the policy ``simulate`` assumes.
        host / port: the dispatcher's address (loopback and any free port by default).
        cores: CPU cores usable by executors (default: this process's affinity mask).
        max_queue: bounded queue per model in the dispatcher.
        max_wait_ms: executors' longest wait for a batch to fill.
        ready_timeout_s: how long a new daemon may take to become ready.
        verify_duration_s / verify_rate_rps: the verification load.

    Raises:
        InputError: a plan whose kind does not describe instances (geo), or a bad plan.
        InfeasiblePlan / HardwareError: the plan does not fit this machine (nothing changed).
        LockedError: another apply runs.
        ExecutorError: a step failed; every step taken was undone and the previous
            configuration still serves.
    """
    state_dir = state_dir_for(store.path)
    loader = loader or DEFAULT_LOADER
    kind = get_kind(plan.kind)  # the registry of plan kinds: policy, instances, sharing
    if not kind.serves:
        raise kind.refuse("apply")
    pol = kind.dispatch_policy(plan, policy)
    # what `replan --apply` applies again with (executor/backends.py): the address asked for
    backend_options = {"host": host, "port": port}
    for i, d in enumerate(plan.deployments):
        runnable_resource(d.resource, field=f"deployments[{i}].resource")
    with apply_lock(state_dir, wait=wait, timeout_s=lock_timeout_s):
        specs = (kind.instances or desired_instances)(plan)
        if not specs:
            raise InputError(
                "the plan has no deployments to run", hint="plan with `greenctl plan ...` first"
            )
        variants = _resolve_variants(specs, store, loader)
        check_families(plan.deployments, {name: v.family for name, v in variants.items()})
        running = _reconcile_dead(store, deployments.ready_instances(store), record=not dry_run)
        disp = deployments.running_dispatcher(store)
        if disp is not None and not is_alive(disp["pid"], disp["pid_start"]):
            if not dry_run:  # it died: record that; this apply starts a new one
                deployments.end_dispatcher(store, disp["id"], state="failed")
            disp = None
        kept, new_specs, to_stop = _diff(running, specs)
        usable = cores if cores is not None else partition.available_cores()
        cpu_needs = [parse_resource(s.resource).cpu_cores or 0 for s in specs]
        partition.assign_cores(cpu_needs, usable)  # validates the whole plan fits
        taken = {c for row in kept for c in json.loads(row["cores"] or "[]")}
        new_cores = partition.assign_cores(
            [parse_resource(s.resource).cpu_cores or 0 for s in new_specs], usable, taken
        )
        _validate_gpu(specs, time_shared=kind.time_shared)
        want_port = port if port is not None else (plan.extra.get("dispatcher") or {}).get("port")
        new_dispatcher = (
            disp is None
            or disp["host"] != host
            or (want_port not in (None, 0) and disp["port"] != want_port)
        )
        routes_changed = disp is None or _route_signature(disp, kept, specs, pol) is None
        actions = _describe(new_specs, new_cores, to_stop, disp, new_dispatcher, host, want_port)
        mig_gpus = sorted({s.mig.gpu for s in specs if s.mig is not None})
        mig_actions = _describe_mig(specs, mig_gpus, mig_parted)
        actions = mig_actions + actions
        needs_mps = any(parse_resource(s.resource).spec.thread_percentage for s in specs)
        mps_running = deployments.service_running(store, MPS_SERVICE)
        if needs_mps and not mps_running:
            actions.insert(0, {"action": "start-mps-control"})
        changed = bool(actions) or routes_changed or _quotas_changed(kept, specs)
        if changed and not any(a["action"] == "switch-routes" for a in actions):
            actions.append({"action": "switch-routes", "models": sorted({s.model for s in specs})})
        if dry_run or not changed:
            result = ApplyResult(
                plan_id=plan.id,
                changed=changed,
                dry_run=dry_run,
                actions=actions if changed else [],
                dispatcher_url=None
                if disp is None
                else f"http://{_connect_host(disp['host'])}:{disp['port']}",
                instances=[_instance_view(r) for r in kept],
                policy=pol,
            )
            if not dry_run:  # it runs here already: the local backend runs the plan
                with store.transaction():
                    deployments.record_backend(
                        store,
                        BACKEND,
                        plan_id=disp["plan_id"] if plan.id is None and disp else plan.id,
                        options=backend_options,
                    )
        else:
            if plan.id is None:
                store.save_plan(plan, source="apply")
            result = _execute(
                plan,
                store=store,
                state_dir=state_dir,
                specs=specs,
                kept=kept,
                new_specs=new_specs,
                new_cores=new_cores,
                to_stop=to_stop,
                disp=disp,
                new_dispatcher=new_dispatcher,
                host=host,
                port=want_port,
                policy=pol,
                loader=loader,
                max_queue=max_queue,
                max_wait_ms=max_wait_ms,
                ready_timeout_s=ready_timeout_s,
                mig_gpus=[] if mig_parted else mig_gpus,
                needs_mps=needs_mps and not mps_running,
                planned_actions=actions,
                variants=variants,
                backend_options=backend_options,
            )
    if verify and not dry_run and result.dispatcher_url:  # also when it was already running
        result.verify = verify_plan(
            plan,
            store=store,
            endpoint=result.dispatcher_url,
            duration_s=verify_duration_s,
            rate_rps=verify_rate_rps,
        )
    return result


def _resolve_variants(specs: list[InstanceSpec], store: Store, loader: str) -> dict[str, Any]:
    """The Variant record of every planned variant, handed to its daemons (so they need not
    open the store). With the default loader a variant must be in the store or built in.

    Raises:
        NotFoundError: an unknown variant (default loader only).
    """
    from greenctl.data.records import Variant

    out: dict[str, Any] = {}
    for s in specs:
        if s.variant in out:
            continue
        try:
            out[s.variant] = store.get_variant(s.variant)
            continue
        except NotFoundError:
            pass
        if loader != DEFAULT_LOADER:
            out[s.variant] = Variant(name=s.variant, family=s.model)
            continue
        try:
            from greenctl.profiler.models import builtin_variant

            out[s.variant] = builtin_variant(s.variant)
        except (ImportError, NotFoundError):
            raise NotFoundError(
                f"the plan runs variant '{s.variant}', which is neither in the store nor built in",
                hint="profile it (`greenctl profile`) or import it before applying",
            ) from None
    return out


def _validate_gpu(specs: list[InstanceSpec], *, time_shared: bool = False) -> None:
    """GPU/MPS resources need a GPU; MPS shares on one GPU must not exceed 100 % (except in
    glet plans, where models time-share one partition and each executor carries its cap)."""
    gpu_specs = [s for s in specs if parse_resource(s.resource).spec.accelerator]
    if not gpu_specs:
        return
    backend = partition.gpu_backend()
    found = {g.index: g for g in backend.gpus()}
    indices = set(found)
    share: dict[int, int] = {}
    for s in gpu_specs:
        r = parse_resource(s.resource)
        gpu = s.mig.gpu if s.mig is not None else s.gpu
        if gpu is not None and gpu not in indices:
            raise HardwareError(
                f"the plan uses GPU {gpu} ({s.resource}) but this machine has GPUs "
                f"{sorted(indices) or 'none'}",
                hint="see `greenctl hw`",
            )
        if r.spec.size_is_gpu_model and gpu is not None and not _same_gpu(r.size, found[gpu].label):
            # its profile, so its predictions, are of another GPU model
            raise HardwareError(
                f"the plan puts {s.variant} on {s.resource}, but GPU {gpu} here is "
                f"gpu:{found[gpu].label}",
                hint="plan for this machine's GPUs (`greenctl hw`), or place the deployment "
                "on a GPU of that model (its `device`)",
            )
        if r.spec.thread_percentage and s.gpu is not None and not time_shared:
            share[s.gpu] = share.get(s.gpu, 0) + (r.mps_percent or 0)
    for gpu, pct in share.items():
        if pct > 100:
            from greenctl.data.errors import InfeasiblePlan

            raise InfeasiblePlan(f"MPS shares on GPU {gpu} add up to {pct} % (> 100 %)")


def _same_gpu(planned: str, here: str) -> bool:
    """Whether a plan's ``gpu:MODEL`` size names the GPU model here: the same label, or a
    shorter name inside it (``A100`` for ``A100-SXM4-40GB``), ignoring case."""
    a, b = planned.lower(), here.lower()
    return a == b or a in b.split("-") or b.startswith(f"{a}-")


def _reconcile_dead(
    store: Store, rows: list[dict[str, Any]], *, record: bool = True
) -> list[dict[str, Any]]:
    """The instances whose process still runs; the others are marked failed (``record``)."""
    alive = []
    for row in rows:
        if is_alive(row["pid"], row["pid_start"]):
            alive.append(row)
        elif record:
            deployments.end_instance(store, row["id"], state="failed")
    return alive


def _diff(
    running: list[dict[str, Any]], specs: list[InstanceSpec]
) -> tuple[list[dict[str, Any]], list[InstanceSpec], list[dict[str, Any]]]:
    """Kept rows (with the spec they now serve in ``_spec``), specs to start, rows to stop."""
    pool: dict[str, list[dict[str, Any]]] = {}
    for row in running:
        pool.setdefault(row["key"], []).append(row)
    kept, new = [], []
    for s in specs:
        rows = pool.get(s.key)
        if rows:
            row = dict(rows.pop(0))
            row["_spec"] = s
            kept.append(row)
        else:
            new.append(s)
    to_stop = [r for rows in pool.values() for r in rows]
    return kept, new, to_stop


def _quotas_changed(kept: list[dict[str, Any]], specs: list[InstanceSpec]) -> bool:
    return any((row["quota_rps"] or None) != (row["_spec"].quota_rps or None) for row in kept)


def _route_signature(
    disp: dict[str, Any], kept: list[dict[str, Any]], specs: list[InstanceSpec], policy: str
) -> Any:
    """None when the dispatcher's table differs from what the kept instances need."""
    try:
        doc = _admin(disp, "GET", timeout_s=3.0)
    except ExecutorError:
        return None
    have = sorted(
        (name, m["policy"], b["id"])
        for name, m in (doc.get("models") or {}).items()
        for b in m["instances"]
    )
    want = sorted((row["model"], policy, row["id"]) for row in kept)
    if len(kept) != len(specs) or have != want:
        return None
    return have


def _describe(
    new_specs: list[InstanceSpec],
    new_cores: list[list[int]],
    to_stop: list[dict[str, Any]],
    disp: dict[str, Any] | None,
    new_dispatcher: bool,
    host: str,
    port: int | None,
) -> list[dict[str, Any]]:
    actions: list[dict[str, Any]] = []
    if new_dispatcher:
        actions.append({"action": "start-dispatcher", "host": host, "port": port or "any"})
    for s, cores in zip(new_specs, new_cores, strict=True):
        a: dict[str, Any] = {
            "action": "start-executor",
            "model": s.model,
            "variant": s.variant,
            "resource": s.resource,
            "batch": s.batch,
        }
        if cores:
            a["cores"] = cores
        if s.mig is not None:
            a["mig"] = {"gpu": s.mig.gpu, "profile": s.mig.profile, "start": s.mig.start}
        actions.append(a)
    if new_specs or to_stop or new_dispatcher:
        actions.append({"action": "switch-routes"})
    for row in to_stop:
        actions.append(
            {
                "action": "stop-executor",
                "id": row["id"],
                "variant": row["variant"],
                "resource": row["resource"],
                "pid": row["pid"],
            }
        )
    if new_dispatcher and disp is not None:
        actions.append({"action": "stop-dispatcher", "pid": disp["pid"], "port": disp["port"]})
    return actions


def _describe_mig(
    specs: list[InstanceSpec], gpus: list[int], mig_parted: bool
) -> list[dict[str, Any]]:
    if not gpus:
        return []
    if mig_parted:
        return [{"action": "mig-external", "gpus": gpus, "note": "layout owned by mig-parted"}]
    backend = partition.gpu_backend()
    out: list[dict[str, Any]] = []
    for gpu in gpus:
        partition.check_mig_gpu(backend, gpu)
        partition.check_layout(
            backend, gpu, [s.mig for s in specs if s.mig is not None and s.mig.gpu == gpu]
        )
        have = {(c["profile"], c["start"]) for c in partition.current_layout(backend, gpu)}
        want = {
            (s.mig.profile, s.mig.start) for s in specs if s.mig is not None and s.mig.gpu == gpu
        }
        if have == want:
            continue
        out.append({"action": "mig-checkpoint", "gpu": gpu, "layout": sorted(have)})
        out += [
            {"action": "mig-destroy", "gpu": gpu, "profile": p, "start": st}
            for p, st in sorted(have - want)
        ]
        out += [
            {"action": "mig-create", "gpu": gpu, "profile": p, "start": st}
            for p, st in sorted(want - have)
        ]
    return out


def _execute(
    plan: Plan,
    *,
    store: Store,
    state_dir: Path,
    specs: list[InstanceSpec],
    kept: list[dict[str, Any]],
    new_specs: list[InstanceSpec],
    new_cores: list[list[int]],
    to_stop: list[dict[str, Any]],
    disp: dict[str, Any] | None,
    new_dispatcher: bool,
    host: str,
    port: int | None,
    policy: str,
    loader: str,
    max_queue: int,
    max_wait_ms: float,
    ready_timeout_s: float,
    mig_gpus: list[int],
    needs_mps: bool,
    planned_actions: list[dict[str, Any]],
    variants: dict[str, Any],
    backend_options: dict[str, Any],
) -> ApplyResult:
    history_id = deployments.start_apply(store, plan_id=plan.id, actions=planned_actions)
    undo: list[tuple[str, Callable[[], object]]] = []
    done: list[dict[str, Any]] = []
    new_rows: list[dict[str, Any]] = []
    new_disp_row: dict[str, Any] | None = None
    mps_env: dict[str, str] = {}
    step = "starting"
    try:
        # 1. MIG layout (checkpoint first; executors on slices that go away stop first)
        if mig_gpus:
            step = "changing the MIG layout"
            backend = partition.gpu_backend()
            for gpu in mig_gpus:
                partition.check_mig_gpu(backend, gpu)
                want = [s.mig for s in specs if s.mig is not None and s.mig.gpu == gpu]
                layout = partition.current_layout(backend, gpu)
                if {(c["profile"], c["start"]) for c in layout} == {
                    (m.profile, m.start) for m in want
                }:
                    continue
                if not deployments.has_open_mig_checkpoint(store, gpu):
                    deployments.add_mig_checkpoint(
                        store,
                        apply_id=history_id,
                        gpu_index=gpu,
                        gpu_uuid=next((g.uuid for g in backend.gpus() if g.index == gpu), None),
                        layout=[{"profile": c["profile"], "start": c["start"]} for c in layout],
                    )
                done.append({"action": "mig-checkpoint", "gpu": gpu})
                going = {(c["profile"], c["start"]) for c in layout} - {
                    (m.profile, m.start) for m in want
                }
                freeing = [
                    row
                    for row in to_stop
                    if (mig := json.loads(row["spawn"] or "{}").get("mig"))
                    and mig["gpu"] == gpu
                    and (mig["profile"], mig["start"]) in going
                ]
                if freeing:
                    # free the slices they hold before destroying them; first take them out of
                    # the dispatcher's routes so its supervisor does not restart them. Undoing
                    # restores the routes, and the supervisor restarts them on the re-created
                    # instances (it resolves their MIG UUIDs afresh).
                    if disp is not None:
                        _drop_from_routes(disp, {row["id"] for row in freeing}, undo)
                    for row in freeing:
                        terminate(row["pid"], row["pid_start"])
                        done.append({"action": "stop-executor", "id": row["id"]})
                done += partition.reconcile_mig(backend, gpu, want, undo)
        # 2. MPS control daemon
        if needs_mps:
            step = "starting the MPS control daemon"
            mps_env = partition.start_mps(state_dir)
            undo.append(("stop the MPS control daemon", lambda: partition.stop_mps(state_dir)))
            done.append({"action": "start-mps-control"})
        elif any(parse_resource(s.resource).spec.thread_percentage for s in specs):
            mps_env = partition.mps_dirs(state_dir)
        # 3. a new dispatcher when none runs (or its address changes)
        if new_dispatcher:
            step = "starting the dispatcher"
            new_disp_row = _start_dispatcher(
                store, state_dir, host, port, max_queue, history_id, ready_timeout_s
            )
            row = new_disp_row
            undo.append(
                ("stop the new dispatcher", lambda: terminate(row["pid"], row["pid_start"]))
            )
            done.append(
                {
                    "action": "start-dispatcher",
                    "url": f"http://{_connect_host(row['host'])}:{row['port']}",
                }
            )
        target = new_disp_row or disp
        assert target is not None
        # 4. new executors, all started at once, then each waited for
        step = "starting executors"
        launching = []
        for n, (s, cores) in enumerate(zip(new_specs, new_cores, strict=True)):
            inst_id = f"{history_id}-{n}"
            spawn = _spawn_spec(
                s, inst_id, cores, state_dir, store, loader, max_wait_ms, mps_env, ready_timeout_s
            )
            spawn["argv"] += ["--variant-json", json.dumps(asdict(variants[s.variant]))]
            proc = spawn_detached(spawn["argv"], env=spawn["env"], log_file=spawn["log_file"])
            undo.append((f"stop executor {inst_id}", _stopper(proc)))
            launching.append((s, inst_id, cores, spawn, proc))
        for s, inst_id, cores, spawn, proc in launching:
            step = f"starting executor {inst_id} ({s.variant} on {s.resource})"
            doc = wait_for_state_file(
                Path(spawn["state_file"]),
                proc=proc,
                timeout_s=ready_timeout_s,
                what=f"executor {inst_id} ({s.variant} on {s.resource})",
                log_file=Path(spawn["log_file"]),
            )
            new_rows.append(
                {
                    "id": inst_id,
                    "apply_id": history_id,
                    "plan_id": plan.id,
                    "model": s.model,
                    "variant": s.variant,
                    "resource": s.resource,
                    "batch": s.batch,
                    "quota_rps": s.quota_rps,
                    "key": s.key,
                    "cores": json.dumps(cores),
                    "device": spawn["env"].get("CUDA_VISIBLE_DEVICES"),
                    "spawn": json.dumps(spawn),
                    "host": doc["host"],
                    "port": int(doc["port"]),
                    "pid": int(doc["pid"]),
                    "pid_start": doc.get("pid_start"),
                    "state": "ready",
                    "restarts": 0,
                    "started_at": utcnow_iso(),
                }
            )
            done.append(
                {
                    "action": "start-executor",
                    "id": inst_id,
                    "variant": s.variant,
                    "resource": s.resource,
                    "port": int(doc["port"]),
                }
            )
        # 5. one routing switch
        step = "switching the dispatcher's routes"
        final = [(row, row["_spec"]) for row in kept] + [
            (row, _spec_of(row, new_specs, new_rows)) for row in new_rows
        ]
        routes = _routes_doc(final, policy, max_queue, history_id)
        previous = None
        if new_disp_row is None:
            previous = _admin(target, "GET")
        _admin(target, "POST", routes)
        if previous is not None:
            prev = _strip_runtime(previous)
            undo.append(("restore the previous routes", lambda: _admin(target, "POST", prev)))
        done.append({"action": "switch-routes", "generation": history_id})
        # 6. commit the new state in one transaction
        step = "recording the new state"
        with store.transaction():
            deployments.add_instances(store, new_rows)
            for row in kept:
                deployments.reassign_instance(
                    store, row["id"], plan_id=plan.id, quota_rps=row["_spec"].quota_rps
                )
            for row in to_stop:
                deployments.end_instance(store, row["id"])
            if new_disp_row is not None:
                new_disp_row["plan_id"] = plan.id
                deployments.add_dispatcher(store, new_disp_row)
                if disp is not None:
                    deployments.end_dispatcher(store, disp["id"])
            else:
                deployments.point_dispatcher(
                    store, target["id"], plan_id=plan.id, apply_id=history_id
                )
            if needs_mps:
                deployments.start_service(store, MPS_SERVICE, info=mps_env)
            deployments.record_backend(store, BACKEND, plan_id=plan.id, options=backend_options)
            deployments.finish_apply(store, history_id, status="applied", actions=done)
    except (GreenctlError, OSError) as exc:
        undone = _undo(undo)
        deployments.finish_apply(
            store, history_id, status="failed", actions=done, undone=undone, error=str(exc)
        )
        message = exc.message if isinstance(exc, GreenctlError) else str(exc)
        raise ExecutorError(
            f"apply failed while {step}: {message}; undid {len(undone)} step(s), the previous "
            "configuration is still serving",
            hint=getattr(exc, "hint", None),
        ) from None
    # 7. retire what the plan no longer needs (after the switch: no gap in service)
    warnings: list[str] = []
    for row in to_stop:
        if not terminate(row["pid"], row["pid_start"]):
            warnings.append(f"executor {row['id']} (pid {row['pid']}) did not stop")
        else:
            done.append(
                {
                    "action": "stop-executor",
                    "id": row["id"],
                    "variant": row["variant"],
                    "resource": row["resource"],
                }
            )
    if new_disp_row is not None and disp is not None:
        terminate(disp["pid"], disp["pid_start"])
        done.append({"action": "stop-dispatcher", "pid": disp["pid"]})
    deployments.set_apply_actions(store, history_id, done)
    url = f"http://{_connect_host(target['host'])}:{target['port']}"
    return ApplyResult(
        plan_id=plan.id,
        changed=True,
        dry_run=False,
        actions=done,
        dispatcher_url=url,
        instances=[_instance_view(r) for r in deployments.ready_instances(store)],
        warnings=warnings,
        history_id=history_id,
        policy=policy,
    )


def _drop_from_routes(
    disp: dict[str, Any], ids: set[str], undo: list[tuple[str, Callable[[], object]]]
) -> None:
    previous = _strip_runtime(_admin(disp, "GET"))
    interim = json.loads(json.dumps(previous))
    for name in list(interim["models"]):
        model = interim["models"][name]
        model["instances"] = [b for b in model["instances"] if b["id"] not in ids]
        if not model["instances"]:
            del interim["models"][name]
    _admin(disp, "POST", interim)
    undo.append(
        ("restore the routes before the MIG change", lambda: _admin(disp, "POST", previous))
    )


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], object]:
    def stop() -> None:
        terminate(proc.pid)
        proc.poll()

    return stop


def _undo(undo: list[tuple[str, Callable[[], object]]]) -> list[str]:
    undone = []
    for what, fn in reversed(undo):
        try:
            fn()
            undone.append(what)
        except Exception as exc:  # keep undoing the rest
            undone.append(f"{what} (failed: {exc})")
    return undone


def _spec_of(
    row: dict[str, Any], new_specs: list[InstanceSpec], new_rows: list[dict[str, Any]]
) -> InstanceSpec:
    return new_specs[new_rows.index(row)]


def _strip_runtime(doc: dict[str, Any]) -> dict[str, Any]:
    models = {}
    for name, m in (doc.get("models") or {}).items():
        models[name] = {
            "policy": m["policy"],
            "max_queue": m["max_queue"],
            "instances": m["instances"],
        }
    return {"generation": doc.get("generation"), "models": models}


def _routes_doc(
    final: list[tuple[dict[str, Any], InstanceSpec]], policy: str, max_queue: int, generation: int
) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for row, spec in final:
        m = models.setdefault(
            spec.model, {"policy": policy, "max_queue": max_queue, "instances": []}
        )
        m["instances"].append(
            {
                "id": row["id"],
                "url": f"http://{_connect_host(row['host'])}:{row['port']}",
                "weight": spec.quota_rps if spec.quota_rps else 1.0,
                # batch + 1: one request travels while a full batch runs, so the executor
                # does not idle for the dispatcher's round trip (fifo/batch policies)
                "slots": spec.batch + 1,
                "pid": row["pid"],
                "pid_start": row["pid_start"],
                "spawn": json.loads(row["spawn"]) if row.get("spawn") else None,
                "restarts": row.get("restarts") or 0,
            }
        )
    return {"generation": generation, "models": models}


def _spawn_spec(
    s: InstanceSpec,
    inst_id: str,
    cores: list[int],
    state_dir: Path,
    store: Store,
    loader: str,
    max_wait_ms: float,
    mps_env: dict[str, str],
    ready_timeout_s: float,
) -> dict[str, Any]:
    state_file = state_dir / f"executor-{inst_id}.json"
    log_file = state_dir / f"executor-{inst_id}.log"
    if state_file.exists():
        state_file.unlink()
    argv = python_module_argv(
        "greenctl.executor.daemon",
        "--model",
        s.model,
        "--variant",
        s.variant,
        "--resource",
        s.resource,
        "--cores",
        ",".join(map(str, cores)),
        "--batch",
        str(s.batch),
        "--max-wait-ms",
        str(max_wait_ms),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--state-file",
        str(state_file),
        "--db",
        str(store.path),
        "--loader",
        loader,
        "--instance-id",
        inst_id,
    )
    env = {"GREENCTL_DB": str(store.path), "GREENCTL_STATE_DIR": str(state_dir)}
    r = parse_resource(s.resource)
    spawn: dict[str, Any] = {
        "argv": argv,
        "env": env,
        "state_file": str(state_file),
        "log_file": str(log_file),
        "ready_timeout_s": ready_timeout_s,
    }
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


def _start_dispatcher(
    store: Store,
    state_dir: Path,
    host: str,
    port: int | None,
    max_queue: int,
    apply_id: int,
    ready_timeout_s: float,
) -> dict[str, Any]:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    state_file = state_dir / f"dispatcher-{stamp}.json"
    log_file = state_dir / f"dispatcher-{stamp}.log"
    argv = python_module_argv(
        "greenctl.executor.dispatcher",
        "--host",
        host,
        "--port",
        str(port or 0),
        "--state-file",
        str(state_file),
        "--db",
        str(store.path),
        "--max-queue",
        str(max_queue),
    )
    proc = spawn_detached(argv, env={"GREENCTL_DB": str(store.path)}, log_file=log_file)
    try:
        doc = wait_for_state_file(
            state_file,
            proc=proc,
            timeout_s=min(ready_timeout_s, 60.0),
            what="the dispatcher",
            log_file=log_file,
        )
    except ExecutorError:
        terminate(proc.pid)
        proc.poll()
        raise
    return {
        "apply_id": apply_id,
        "host": host,
        "port": int(doc["port"]),
        "pid": int(doc["pid"]),
        "pid_start": doc.get("pid_start"),
        "state_file": str(state_file),
        "log_file": str(log_file),
        "state": "running",
        "started_at": utcnow_iso(),
    }


def _instance_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "model": row["model"],
        "variant": row["variant"],
        "resource": row["resource"],
        "batch": row["batch"],
        "quota_rps": row["quota_rps"],
        "cores": json.loads(row["cores"] or "[]"),
        "device": row["device"],
        "pid": row["pid"],
        "port": row["port"],
        "restarts": row.get("restarts") or 0,
    }


# -- verify ------------------------------------------------------------------------------
def verify_plan(
    plan: Plan,
    *,
    store: Store,
    endpoint: str,
    duration_s: float = 10.0,
    rate_rps: float | None = None,
) -> dict[str, Any]:
    """Load the running plan at its predicted rate and record measured vs predicted numbers."""
    import numpy as np
    from greenctl.executor.loadgen import run_load

    started_at = utcnow_iso()
    models: dict[str, float] = {}
    for d in plan.deployments:
        models[d.model] = models.get(d.model, 0.0) + float(d.quota_rps or 0.0)
    total = rate_rps or float(plan.predicted.get("rate_rps") or 0.0) or sum(models.values())
    if total <= 0:
        raise InputError(
            "cannot verify: the plan predicts no rate", hint="pass a verification rate"
        )
    quota_sum = sum(models.values())
    per_model = {
        m: (total * q / quota_sum if quota_sum > 0 else total / len(models))
        for m, q in models.items()
    }
    lat: list[float] = []
    agg = {"sent": 0, "ok": 0, "errors": 0, "rejected_503": 0}
    details = {}
    for i, (model, rate) in enumerate(sorted(per_model.items())):
        res = run_load(endpoint, model, duration_s=duration_s, rate_rps=rate, seed=i)
        lat += res.latencies_ms
        for k in agg:
            agg[k] += getattr(res, k)
        details[model] = res.to_dict()
    arr = np.asarray(lat) if lat else None
    measured: dict[str, Any] = {
        "rate_rps": round(agg["ok"] / duration_s, 3),
        "offered_rps": round(total, 3),
        "p50_ms": None if arr is None else float(np.percentile(arr, 50)),
        "p95_ms": None if arr is None else float(np.percentile(arr, 95)),
        "p99_ms": None if arr is None else float(np.percentile(arr, 99)),
        "errors": agg["errors"],
        "rejected_503": agg["rejected_503"],
        "sent": agg["sent"],
        "duration_s": duration_s,
        "models": details,
    }
    run_id = store.add_run(
        plan.id, kind="verify", predicted=plan.predicted, measured=measured, started_at=started_at
    )
    pred_p95 = plan.predicted.get("p95_ms")
    ratio = None
    if isinstance(pred_p95, int | float) and pred_p95 > 0 and measured["p95_ms"] is not None:
        ratio = measured["p95_ms"] / pred_p95
    return {"run_id": run_id, "predicted": plan.predicted, "measured": measured, "p95_ratio": ratio}


# -- status and down ---------------------------------------------------------------------
def status(store: Store, *, timeout_s: float = 1.0) -> dict[str, Any]:
    """What runs now: the dispatcher's address and every instance with its live figures."""
    from greenctl.executor.daemon import parse_prometheus

    disp = deployments.running_dispatcher(store)
    disp_view: dict[str, Any] | None = None
    if disp is not None:
        url = f"http://{_connect_host(disp['host'])}:{disp['port']}"
        disp_view = {
            "url": url,
            "pid": disp["pid"],
            "alive": is_alive(disp["pid"], disp["pid_start"]),
            "ready": _get_ok(url + "/v2/health/ready", timeout_s),
            "plan_id": disp["plan_id"],
            "log_file": disp["log_file"],
        }
    instances = []
    for row in deployments.ready_instances(store):
        view = _instance_view(row)
        url = f"http://{_connect_host(row['host'])}:{row['port']}"
        view["url"] = url
        view["alive"] = is_alive(row["pid"], row["pid_start"])
        view["ready"] = view["alive"] and _get_ok(url + "/v2/health/ready", timeout_s)
        view["requests"] = None
        view["p95_ms"] = None
        if view["alive"]:
            text = _get_text(url + "/metrics", timeout_s)
            if text:
                flat = parse_prometheus(text)
                view["requests"] = int(
                    sum(v for k, v in flat.items() if k.startswith("greenctl_requests_total{"))
                )
                p95 = [
                    v
                    for k, v in flat.items()
                    if k.startswith("greenctl_request_latency_window_ms{")
                    and 'quantile="0.95"' in k
                ]
                view["p95_ms"] = p95[0] if p95 else None
        view["p95"] = view["p95_ms"]  # the field name; milliseconds
        instances.append(view)
    last = deployments.last_apply(store)
    return {
        "backend": BACKEND,
        "dispatcher": disp_view,
        "instances": instances,
        "restarts": deployments.restart_count(store),
        "last_apply": None
        if last is None
        else {
            k: last[k] for k in ("id", "plan_id", "status", "started_at", "finished_at", "error")
        },
    }


def _get_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _get_text(url: str, timeout_s: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def down(store: Store, *, restore_mig: bool = False, wait: bool = True) -> dict[str, Any]:
    """Stop everything greenctl started for this store (dispatcher first, so its supervisor
    does not restart the executors), and restore the checkpointed MIG layout if asked."""
    state_dir = state_dir_for(store.path)
    stopped: list[dict[str, Any]] = []
    with apply_lock(state_dir, wait=wait, timeout_s=60.0):
        for row in deployments.running_dispatchers(store):
            terminate(row["pid"], row["pid_start"])
            deployments.end_dispatcher(store, row["id"])
            stopped.append({"dispatcher": row["id"], "pid": row["pid"]})
        for row in deployments.ready_instances(store):
            ok = terminate(row["pid"], row["pid_start"])
            deployments.end_instance(store, row["id"])
            stopped.append({"instance": row["id"], "pid": row["pid"], "stopped": ok})
        if deployments.service_running(store, MPS_SERVICE):
            with contextlib.suppress(HardwareError):
                partition.stop_mps(state_dir)
            deployments.stop_service(store, MPS_SERVICE)
            stopped.append({"service": MPS_SERVICE})
        deployments.stop_backend(store, BACKEND)
        restored = []
        if restore_mig:
            checkpoints = deployments.open_mig_checkpoints(store)
            if checkpoints:
                backend = partition.gpu_backend()
                for cp in checkpoints:
                    partition.restore_layout(backend, cp["gpu_index"], cp["layout"])
                    deployments.mark_mig_checkpoint_restored(store, cp["id"])
                    restored.append({"gpu": cp["gpu_index"], "layout": cp["layout"]})
    return {"stopped": stopped, "restored_mig": restored, "logs": str(state_dir)}


def executor_log(store: Store, instance_id: str, lines: int = 20) -> str:
    """The tail of an instance's log (for error reports)."""
    row = deployments.instance_row(store, instance_id)
    spawn = json.loads(row["spawn"] or "{}")
    return log_tail(spawn.get("log_file", os.devnull), lines)

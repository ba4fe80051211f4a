"""Make a plan real on this machine: ``apply_plan``, ``status`` and ``down``, the local
backend (:class:`greenctl.executor.deploy.backends.LocalBackend` is its face to the CLI and to
``replan --apply``; the state it keeps is in :mod:`greenctl.data.deployments`).

``apply_plan`` validates a plan against this machine, diffs it against what runs now (state
in the store), and then acts in an order that keeps serving: MIG layout (with a checkpoint),
MPS control daemon, dispatcher, new executors (waiting until ready), one atomic routing switch
on the dispatcher, the store commit, and only then stopping what the plan no longer needs.
Any failure before the commit undoes every step already taken, in reverse, so the previous
configuration keeps serving; so does SIGTERM or SIGINT (^C) part-way. Applying the running
plan again does nothing. A lock file serialises concurrent applies. Nothing here prints:
results are returned.

Crash consistency: every process is journaled in the store before it starts (``starting``,
with the state file it reports to; its pid as soon as it is spawned) and joins the running
configuration only in the commit; what an apply retires is ``stopping`` until it is stopped.
An apply killed at any step (even ``kill -9``) leaves only journaled processes, and the next
``apply``, ``status`` or ``down`` (:func:`recover`, under the apply lock) puts the
dispatcher's routes back to what the store records and stops the rest. Pids are checked with
their start times (a reused pid is never signalled), and a process whose pid was never
written down is found by the state file on its command line.

Supervision (:mod:`greenctl.executor.runtime.supervisor`): each dispatcher runs beside a supervisor
that holds its listening socket and restarts it; the dispatcher restarts its executors and
its supervisor. ``down`` stops the pair first (its stop file, then SIGTERM), then the
executors, then any greenctl daemon of the store the records missed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.batching import DEFAULT_MAX_WAIT_MS
from greenctl.data.emissions import executor_energy_args, routes_carbon
from greenctl.data.errors import (
    ExecutorError,
    GreenctlError,
    HardwareError,
    InputError,
    LockedError,
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
from greenctl.executor.deploy import partition
from greenctl.executor.kinds import get_kind
from greenctl.executor.runtime.energy import energy_delta, energy_snapshot
from greenctl.executor.runtime.offers import MODEL_KEYS as OFFER_MODEL_KEYS
from greenctl.executor.runtime.offers import add_offers, carry_offers
from greenctl.executor.runtime.procs import (
    apply_lock,
    find_processes,
    is_alive,
    log_tail,
    proc_start_ticks,
    process_argv,
    python_module_argv,
    read_json,
    spawn_detached,
    state_dir_for,
    stray_daemons,
    terminate,
    wait_for_state_file,
    write_json_atomic,
)

DEFAULT_LOADER = "greenctl.profiler.models:load_model"
BACKEND = "local"  # this module is the local backend (executor/deploy/backends.py)
MPS_SERVICE = "mps-control"
SUPERVISOR_MODULE = "greenctl.executor.runtime.supervisor"


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
    #: how long its batches wait to fill: a glet's planned duty cycle (``placement``'s
    #: ``duty_cycle_ms``), as ``simulate`` predicts it; None: apply's ``max_wait_ms``. Not
    #: part of the key: a kept glet keeps its executor (and wait) when only its cycle moves
    max_wait_ms: float | None = None

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
        cycle = d.placement.get("duty_cycle_ms") if isinstance(d.placement, dict) else None
        wait = float(cycle) if isinstance(cycle, int | float) and cycle > 0 else None
        glet_slots = isinstance(d.placement, dict) and isinstance(d.placement.get("starts"), list)
        if r.spec.pinning == PIN_MIG_INSTANCE and gpus and not glet_slots:
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
                    partition.MigSlot(_gpu_index(d.device, d.placement, i) or 0, r.size, start)
                    if start is not None
                    else None
                )
            specs.append(
                InstanceSpec(
                    d.model, d.variant, d.resource, d.batch, per, mig=mig, gpu=gpu, max_wait_ms=wait
                )
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
    if isinstance(placement, dict) and isinstance(placement.get("starts"), list):
        starts = placement["starts"]  # a glet plan's MIG glets: instance i's slot
        return int(starts[i]) if i < len(starts) else None
    if isinstance(placement, dict) and "start" in placement:
        return int(placement["start"])
    if isinstance(placement, list) and i < len(placement):
        item = placement[i]
        return int(item["start"]) if isinstance(item, dict) else int(item)
    return None


# -- the dispatcher's admin API ---------------------------------------------------------
def _dispatcher_token(row: dict[str, Any]) -> str:
    from greenctl.executor.runtime.procs import read_json

    doc = (read_json(row["state_file"]) if row.get("state_file") else None) or {}
    return str(doc.get("token", ""))


def _admin(
    row: dict[str, Any], method: str, doc: dict[str, Any] | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    from greenctl.executor.runtime.dispatcher import TOKEN_HEADER

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
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
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
    # what `replan --apply` applies again with (executor/deploy/backends.py): the address asked for
    backend_options = {"host": host, "port": port}
    if loader != DEFAULT_LOADER:  # `replan --apply` loads the variants the same way
        backend_options["loader"] = loader
    for i, d in enumerate(plan.deployments):
        runnable_resource(d.resource, field=f"deployments[{i}].resource")
    with apply_lock(state_dir, wait=wait, timeout_s=lock_timeout_s):
        if not dry_run:  # what an interrupted apply left: routes put back, processes stopped
            recover(store)
        with _SignalGuard() as signals:
            try:
                specs = (kind.instances or desired_instances)(plan)
                if not specs:
                    raise InputError(
                        "the plan has no deployments to run",
                        hint="plan with `greenctl plan ...` first",
                    )
                variants = _resolve_variants(specs, store, loader)
                check_families(plan.deployments, {name: v.family for name, v in variants.items()})
                running = _reconcile_dead(
                    store, deployments.ready_instances(store), record=not dry_run
                )
                disp = deployments.running_dispatcher(store)
                reuse_port = None
                if disp is not None and not _pair_serves(disp):
                    # both dispatcher and supervisor are gone: a new pair starts, on the
                    # same port (clients keep their URL) unless another program took it
                    reuse_port = disp["port"]
                    if not dry_run:
                        _stop_pair(disp)
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
                if kind.time_shared:  # glets: one GPU's executors must fit its memory
                    _validate_glet_memory(plan, others_count=not running)
                want_port = (
                    port if port is not None else (plan.extra.get("dispatcher") or {}).get("port")
                )
                any_port = False
                if want_port in (None, 0) and reuse_port:
                    want_port, any_port = reuse_port, True
                new_dispatcher = (
                    disp is None
                    or disp["host"] != host
                    or (want_port not in (None, 0) and disp["port"] != want_port)
                )
                routes_changed = (
                    disp is None
                    or _route_signature(disp, kept, specs, pol, routes_carbon(plan)) is None
                )
                actions = _describe(
                    new_specs, new_cores, to_stop, disp, new_dispatcher, host, want_port
                )
                mig_gpus = sorted({s.mig.gpu for s in specs if s.mig is not None})
                mig_actions = _describe_mig(specs, mig_gpus, mig_parted)
                actions = mig_actions + actions
                needs_mps = any(parse_resource(s.resource).spec.thread_percentage for s in specs)
                mps_running = deployments.service_running(store, MPS_SERVICE)
                if needs_mps and not mps_running:
                    actions.insert(0, {"action": "start-mps-control"})
                changed = bool(actions) or routes_changed or _quotas_changed(kept, specs)
                if changed and not any(a["action"] == "switch-routes" for a in actions):
                    actions.append(
                        {"action": "switch-routes", "models": sorted({s.model for s in specs})}
                    )
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
                        any_port=any_port,
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
                        signals=signals,
                    )
            except _Interrupted as sig:
                raise ExecutorError(
                    f"apply interrupted by {sig.name} before it started anything; nothing changed"
                ) from None

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


def _validate_glet_memory(plan: Plan, *, others_count: bool) -> None:
    """A glet plan's executors on each GPU must fit the GPU's memory (the figures its
    planner recorded against the GPUs here; with ``others_count``, nothing of greenctl's
    running, the memory other processes use now is not available).

    Raises:
        InputError: naming the GPU, its executors and the MiB needed and available.
    """
    from greenctl.planner.glet.memory import check_gpu_memory, gpu_needs

    needs = gpu_needs(plan.extra.get("gpus"))
    if not any(n.executors for n in needs):
        return
    backend = partition.gpu_backend()
    available: dict[int, tuple[str, float, float]] = {}
    for g in backend.gpus():
        used = 0.0
        if others_count:
            try:
                used = float(backend.memory_used_mb(g.index))
            except HardwareError:
                used = 0.0  # not readable: the total only
        available[g.index] = (g.name, float(g.memory_mb), used)
    check_gpu_memory(plan.extra.get("gpus"), available)


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
    disp: dict[str, Any],
    kept: list[dict[str, Any]],
    specs: list[InstanceSpec],
    policy: str,
    carbon: dict[str, float] | None = None,
) -> Any:
    """None when the dispatcher's table differs from what the kept instances need, or
    carries another grid intensity than ``carbon`` (a replan with a new signal)."""
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
    if len(kept) != len(specs) or have != want or doc.get("carbon") != carbon:
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
        partition.check_layout(  # one slot per GPU instance (a glet's models share theirs)
            backend, gpu, list(dict.fromkeys(s.mig for s in specs if s.mig and s.mig.gpu == gpu))
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


class _Interrupted(BaseException):
    """SIGTERM or SIGINT arrived while an apply was changing things (not an Exception, so no
    ``except Exception`` on the way swallows it before the apply is undone)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class _SignalGuard:
    """SIGTERM and SIGINT during an apply: the first raises :class:`_Interrupted` where the
    apply is (it then undoes what it did); while it undoes, or once it has committed, they are
    only remembered (an apply never stops half-way through undoing or retiring). Only in the
    main thread (elsewhere signals are not ours to handle)."""

    def __init__(self) -> None:
        self.armed = True
        self.pending: int | None = None
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.pending is None:
            self.pending = signum
        if self.armed:
            self.armed = False
            raise _Interrupted(signum)

    def hold(self) -> None:
        """From now on, remember signals instead of raising them."""
        self.armed = False

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


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
    any_port: bool,
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
    signals: _SignalGuard,
) -> ApplyResult:
    history_id = deployments.start_apply(store, plan_id=plan.id, actions=planned_actions)
    undo: list[tuple[str, Callable[[], object]]] = []
    done: list[dict[str, Any]] = []
    new_rows: list[dict[str, Any]] = []
    new_disp_row: dict[str, Any] | None = None
    mps_env: dict[str, str] = {}
    gap: tuple[float, list[str]] | None = None  # (since, models) left unrouted for a MIG change
    step = "starting"
    try:
        # 1. MIG layout (checkpoint first; executors on slices that go away stop first)
        if mig_gpus:
            step = "changing the MIG layout"
            backend = partition.gpu_backend()
            for gpu in mig_gpus:
                partition.check_mig_gpu(backend, gpu)
                # one slot per GPU instance (a time-shared glet's models share theirs)
                want = list(dict.fromkeys(s.mig for s in specs if s.mig and s.mig.gpu == gpu))
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
                        unrouted = _drop_from_routes(disp, {row["id"] for row in freeing}, undo)
                        if unrouted:  # no instance left: a gap until the switch, measured
                            since = gap[0] if gap else time.monotonic()
                            gap = (since, sorted({*(gap[1] if gap else []), *unrouted}))
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
        # 3. a new dispatcher, with its supervisor, when none runs (or its address changes)
        if new_dispatcher:
            step = "starting the dispatcher"
            new_disp_row = _start_pair(
                store,
                state_dir,
                host=host,
                port=port,
                any_port=any_port,
                max_queue=max_queue,
                apply_id=history_id,
                ready_timeout_s=ready_timeout_s,
                undo=undo,
            )
            row = new_disp_row
            done.append(
                {
                    "action": "start-dispatcher",
                    "url": f"http://{_connect_host(row['host'])}:{row['port']}",
                }
            )
        target = new_disp_row or disp
        assert target is not None
        # 4. new executors, each journaled before it starts, all started, then waited for
        step = "starting executors"
        launching = []
        for n, (s, cores) in enumerate(zip(new_specs, new_cores, strict=True)):
            inst_id = f"{history_id}-{n}"
            spawn = _spawn_spec(
                s, inst_id, cores, state_dir, store, loader, max_wait_ms, mps_env, ready_timeout_s
            )
            spawn["argv"] += ["--variant-json", json.dumps(asdict(variants[s.variant]))]
            spawn["argv"] += executor_energy_args(  # its energy and carbon counters' figures
                store, plan, variant=s.variant, resource=s.resource, batch=s.batch
            )
            row = {
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
                "restarts": 0,
            }
            deployments.journal_instance(store, row)
            undo.append((f"stop executor {inst_id}", _instance_stopper(store, row)))
            proc = spawn_detached(spawn["argv"], env=spawn["env"], log_file=spawn["log_file"])
            deployments.set_instance_process(
                store, inst_id, pid=proc.pid, pid_start=proc_start_ticks(proc.pid)
            )
            launching.append((s, row, spawn, proc))
        for s, row, spawn, proc in launching:
            inst_id = row["id"]
            step = f"starting executor {inst_id} ({s.variant} on {s.resource})"
            doc = wait_for_state_file(
                Path(spawn["state_file"]),
                proc=proc,
                timeout_s=ready_timeout_s,
                what=f"executor {inst_id} ({s.variant} on {s.resource})",
                log_file=Path(spawn["log_file"]),
            )
            row.update(
                host=doc["host"],
                port=int(doc["port"]),
                pid=int(doc["pid"]),
                pid_start=doc.get("pid_start"),
                started_at=utcnow_iso(),
            )
            deployments.set_instance_process(
                store,
                inst_id,
                host=row["host"],
                port=row["port"],
                pid=row["pid"],
                pid_start=row["pid_start"],
            )
            new_rows.append(row)
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
        final = [{**row, "quota_rps": row["_spec"].quota_rps} for row in kept] + new_rows
        routes = _routes_doc(final, policy, max_queue, history_id)
        # model-less requests (issue 19): each instance's offer, the plan's preference
        routes = add_offers(routes, final, store, plan, max_wait_ms=max_wait_ms)
        routes["carbon"] = routes_carbon(plan)  # exported, and handed to executors (issue 19)
        previous = None
        if new_disp_row is None:
            previous = _admin(target, "GET")
        _admin(target, "POST", routes)
        if gap is not None:
            gap_ms = round((time.monotonic() - gap[0]) * 1000.0, 1)
            done.append({"action": "serving-gap", "models": gap[1], "gap_ms": gap_ms})
        if previous is not None:
            prev = _strip_runtime(previous)
            undo.append(("restore the previous routes", lambda: _admin(target, "POST", prev)))
        done.append({"action": "switch-routes", "generation": history_id})
        # 6. commit the new state in one transaction
        step = "recording the new state"
        with store.transaction():
            for row in new_rows:
                deployments.commit_instance(store, row["id"], started_at=row["started_at"])
            for row in kept:
                deployments.reassign_instance(
                    store, row["id"], plan_id=plan.id, quota_rps=row["_spec"].quota_rps
                )
            for row in to_stop:
                deployments.retire_instance(store, row["id"])
            if new_disp_row is not None:
                deployments.commit_dispatcher(store, new_disp_row["id"], plan_id=plan.id)
                if disp is not None:
                    deployments.retire_dispatcher(store, disp["id"])
            else:
                deployments.point_dispatcher(
                    store, target["id"], plan_id=plan.id, apply_id=history_id
                )
            if needs_mps:
                deployments.start_service(store, MPS_SERVICE, info=mps_env)
            deployments.record_backend(store, BACKEND, plan_id=plan.id, options=backend_options)
            deployments.finish_apply(store, history_id, status="applied", actions=done)
        signals.hold()  # committed: a signal from now on lets the apply finish retiring
    except (Exception, _Interrupted) as exc:
        signals.hold()
        undone = _undo(undo)
        hint = None
        if isinstance(exc, _Interrupted):
            what = f"apply interrupted by {exc.name} while {step}"
        elif isinstance(exc, GreenctlError):
            what, hint = f"apply failed while {step}: {exc.message}", exc.hint
        else:
            what = f"apply failed while {step}: {exc}"
        deployments.finish_apply(
            store, history_id, status="failed", actions=done, undone=undone, error=what
        )
        if not isinstance(exc, GreenctlError | OSError | _Interrupted):
            raise  # a bug: undone and recorded, and shown as it is
        raise ExecutorError(
            f"{what}; undid {len(undone)} step(s), the previous configuration is still serving",
            hint=hint,
        ) from None
    # 7. retire what the plan no longer needs (after the switch: no gap in service)
    warnings: list[str] = [
        f"{', '.join(a['models'])} had no executor for {a['gap_ms']:g} ms while the MIG "
        "slices they ran on were re-created (no room to start the new ones first)"
        for a in done
        if a["action"] == "serving-gap"
    ]
    for row in to_stop:
        if not _stop_instance(row):
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
        deployments.end_instance(store, row["id"])
    if new_disp_row is not None and disp is not None:
        _stop_pair(disp)
        deployments.end_dispatcher(store, disp["id"])
        done.append({"action": "stop-dispatcher", "pid": disp["pid"]})
    deployments.set_apply_actions(store, history_id, done)
    if signals.pending is not None:
        warnings.append(
            f"{signal.Signals(signals.pending).name} arrived after the new configuration was "
            "committed; the apply finished retiring the old one first"
        )
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
) -> list[str]:
    """Take executors ``ids`` out of the dispatcher's routes; returns the models left with
    none (not served until the next switch)."""
    previous = _strip_runtime(_admin(disp, "GET"))
    interim = json.loads(json.dumps(previous))
    unrouted = []
    for name in list(interim["models"]):
        model = interim["models"][name]
        model["instances"] = [b for b in model["instances"] if b["id"] not in ids]
        if not model["instances"]:
            del interim["models"][name]
            unrouted.append(name)
    _admin(disp, "POST", interim)
    undo.append(
        ("restore the routes before the MIG change", lambda: _admin(disp, "POST", previous))
    )
    return unrouted


def _undo(undo: list[tuple[str, Callable[[], object]]]) -> list[str]:
    undone = []
    for what, fn in reversed(undo):
        try:
            fn()
            undone.append(what)
        except Exception as exc:  # keep undoing the rest
            undone.append(f"{what} (failed: {exc})")
    return undone


def _strip_runtime(doc: dict[str, Any]) -> dict[str, Any]:
    models = {}
    for name, m in (doc.get("models") or {}).items():
        models[name] = {
            "policy": m["policy"],
            "max_queue": m["max_queue"],
            "instances": m["instances"],
            **{k: m[k] for k in OFFER_MODEL_KEYS if k in m},  # model-less requests (issue 19)
        }
    out: dict[str, Any] = {"generation": doc.get("generation"), "models": models}
    if "carbon" in doc:  # the intensity the dispatcher counts with (issue 19)
        out["carbon"] = doc["carbon"]
    return out


def _routes_doc(
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
                "variant": row["variant"],  # routing by variant name (issue 19)
                "url": f"http://{_connect_host(row['host'])}:{row['port']}",
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
        "greenctl.executor.runtime.daemon",
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
        str(max_wait_ms if s.max_wait_ms is None else s.max_wait_ms),  # a glet's: its cycle
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


# -- the dispatcher and its supervisor (a pair) ------------------------------------------------
def _start_pair(
    store: Store,
    state_dir: Path,
    *,
    host: str,
    port: int | None,
    any_port: bool,
    max_queue: int,
    apply_id: int,
    ready_timeout_s: float,
    undo: list[tuple[str, Callable[[], object]]],
) -> dict[str, Any]:
    """Journal a dispatcher pair, start its supervisor (which binds the address and starts
    the dispatcher), and wait until the dispatcher serves; returns its row.

    Raises:
        ExecutorError: the address cannot be bound or the dispatcher did not start (nothing
            of it is left running).
    """
    import secrets

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
        _stop_pair(row)
        deployments.forget_dispatcher(store, row["id"])

    undo.append(("stop the new dispatcher and its supervisor", stop))
    from greenctl.executor.runtime.supervisor import supervisor_argv

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


def _pair(row: dict[str, Any]) -> dict[str, Any]:
    """The pair file of a dispatcher row (empty for a dispatcher without a supervisor)."""
    return (read_json(row["pair_file"]) if row.get("pair_file") else None) or {}


def _dispatcher_process(row: dict[str, Any]) -> tuple[int, str | None] | None:
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


def _supervisor_process(row: dict[str, Any]) -> tuple[int, str | None] | None:
    """The supervisor process of a pair that runs now, or None."""
    doc = read_json(_pair(row).get("supervisor_state_file") or os.devnull)
    for pid, ticks in (
        ((doc or {}).get("pid"), (doc or {}).get("pid_start")),
        (row.get("supervisor_pid"), row.get("supervisor_pid_start")),
    ):
        if pid and is_alive(int(pid), ticks):
            return int(pid), ticks
    return None


def _pair_serves(row: dict[str, Any], wait_s: float = 5.0) -> bool:
    """Whether a recorded dispatcher runs: its process, or (while it is being replaced) its
    supervisor and a new dispatcher within ``wait_s``."""
    if _dispatcher_process(row) is not None:
        return True
    deadline = time.monotonic() + wait_s
    while _supervisor_process(row) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        if _dispatcher_process(row) is not None:
            return True
    return False


def _stop_pair(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Stop a dispatcher and its supervisor, whatever state the row is in: the stop file
    first (neither restarts anything once it exists), then the supervisor (which stops its
    dispatcher), then any process of the pair left (found by pid and start time, or by the
    pair's files on its command line when no pid was recorded). Returns what was running."""
    pair = _pair(row)
    if pair.get("stop_file"):
        fd = os.open(pair["stop_file"], os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
    found: list[tuple[str, int, str | None]] = []
    seen: set[int] = set()

    def add(kind: str, pid: Any, ticks: Any) -> None:
        if pid and int(pid) not in seen and is_alive(int(pid), ticks):
            seen.add(int(pid))
            found.append((kind, int(pid), ticks))

    sup = _supervisor_process(row)
    if sup is not None:
        add("supervisor", *sup)
    add("supervisor", row.get("supervisor_pid"), row.get("supervisor_pid_start"))
    disp = _dispatcher_process(row)
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
    stopped = []
    # supervisors first: each stops its dispatcher on SIGTERM
    for kind, pid, ticks in sorted(found, key=lambda f: f[0] != "supervisor"):
        terminate(pid, ticks)
        stopped.append({kind: row["id"], "pid": pid})
    return stopped


def _instance_processes(row: dict[str, Any]) -> list[tuple[int, str | None]]:
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


def _stop_instance(row: dict[str, Any]) -> bool:
    """Stop every process of an instance row; True when none is left."""
    ok = True
    for pid, ticks in _instance_processes(row):
        ok = terminate(pid, ticks) and ok
    return ok


def _instance_stopper(store: Store, row: dict[str, Any]) -> Callable[[], object]:
    def stop() -> None:
        current = deployments.instance_row(store, row["id"])
        _stop_instance(current)
        deployments.forget_instance(store, row["id"])

    return stop


# -- crash consistency -------------------------------------------------------------------------
def recover(store: Store) -> list[dict[str, Any]]:
    """Finish what interrupted applies left, under the apply lock (the caller holds it, so
    no apply runs): their records are closed as failed, the running dispatcher's routes are
    put back to the instances the store records as running (a killed apply may have
    switched them before it committed), and every process journaled as ``starting`` (never
    committed) or ``stopping`` (retired, not yet stopped) is stopped. Returns what it did.
    """
    done: list[dict[str, Any]] = []
    interrupted = deployments.open_applies(store)
    for rec in interrupted:
        deployments.finish_apply(
            store,
            rec["id"],
            status="failed",
            actions=json.loads(rec["actions"] or "[]"),
            error="interrupted: the apply ended before it finished (killed?); what it had "
            "started was stopped by the next greenctl command",
        )
        done.append({"action": "close-interrupted-apply", "id": rec["id"]})
    if interrupted:
        done += _resync_routes(store)
    # never committed (``starting``): stopped and forgotten; retired (``stopping``): stopped
    for row in deployments.dispatchers_in(store, [deployments.STARTING, deployments.STOPPING]):
        stopped = _stop_pair(row)
        if row["state"] == deployments.STARTING:
            deployments.forget_dispatcher(store, row["id"])
        else:
            deployments.end_dispatcher(store, row["id"])
        done.append({"action": "stop-dispatcher", "id": row["id"], "processes": stopped})
    for row in deployments.instances_in(store, [deployments.STARTING, deployments.STOPPING]):
        pids = [pid for pid, _ in _instance_processes(row)]
        _stop_instance(row)
        if row["state"] == deployments.STARTING:
            deployments.forget_instance(store, row["id"])
        else:
            deployments.end_instance(store, row["id"])
        done.append({"action": "stop-executor", "id": row["id"], "pids": pids})
    from greenctl.executor.deploy.georouter_procs import recover_routers

    return done + recover_routers(store)  # a geo router's apply interrupted likewise


def _resync_routes(store: Store) -> list[dict[str, Any]]:
    """Point the running dispatcher at the instances the store records as ready, if a
    killed apply left it routing elsewhere."""
    disp = deployments.running_dispatcher(store)
    if disp is None or _dispatcher_process(disp) is None:
        return []
    try:
        doc = _admin(disp, "GET", timeout_s=3.0)
    except ExecutorError:
        return []
    rows = deployments.ready_instances(store)
    have = sorted(b["id"] for m in (doc.get("models") or {}).values() for b in m["instances"])
    if have == sorted(r["id"] for r in rows):
        return []
    models: dict[str, Any] = doc.get("models") or {}
    first: dict[str, Any] = next(iter(models.values()), {})
    policy = str(first.get("policy") or "fifo")
    max_queue = int(first.get("max_queue") or 256)
    routes = _routes_doc(rows, policy, max_queue, disp.get("apply_id"))
    _admin(disp, "POST", carry_offers(doc, routes))  # keeps the offers (issue 19)
    return [{"action": "restore-routes", "instances": [r["id"] for r in rows]}]


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
    from greenctl.executor.runtime.loadgen import client_lag_note, latency_breakdown, run_load
    from greenctl.planner.core.simulator import served_model_slos

    started_at = utcnow_iso()
    slos = served_model_slos(plan)  # a glet plan: each model held to its own SLO
    late = 0
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
    server: list[tuple[float, float, float]] = []
    agg = {"sent": 0, "ok": 0, "errors": 0, "rejected_503": 0}
    details = {}
    energy_before = energy_snapshot(store)  # the executors' energy counters (issue 19)
    for i, (model, rate) in enumerate(sorted(per_model.items())):
        res = run_load(endpoint, model, duration_s=duration_s, rate_rps=rate, seed=i)
        lat += res.latencies_ms
        server += zip(res.server_queue_ms, res.server_infer_ms, res.server_batch_rows, strict=True)
        for k in agg:
            agg[k] += getattr(res, k)
        details[model] = res.to_dict()
        if model in slos:  # late, failed or refused requests miss the SLO
            miss = sum(x > slos[model] for x in res.latencies_ms) + res.sent - res.ok
            late += miss
            details[model].update(slo_ms=slos[model], slo_violation_frac=miss / max(res.sent, 1))
    energy = energy_delta(energy_before, energy_snapshot(store))
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
        # where the time went: the executors' batch queue, the batch run, the rest
        "breakdown": latency_breakdown(lat, server),
        "models": details,
    }
    if slos:
        measured["slo_violation_frac"] = late / max(agg["sent"], 1)
    if energy is not None:
        measured["energy"] = energy
    lags = [r["client_lag_p95_ms"] for r in details.values() if r.get("client_lag_p95_ms")]
    measured["client_lag_p95_ms"] = max(lags) if lags else None
    note = client_lag_note(measured["client_lag_p95_ms"], measured["p95_ms"])
    if note:
        measured["note"] = note
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
    """What runs now, with live figures, and whether the plan fully serves.

    ``state`` is ``idle`` (nothing applied, or taken down), ``serving`` (the dispatcher, its
    supervisor and every instance up), ``degraded`` (the dispatcher serves, but an instance
    is down, restarting or crash-looping, or the supervisor is gone) or ``down`` (no
    dispatcher serves); ``problems`` says why in words. What an interrupted apply left is
    stopped first (``recovered``), unless an apply runs now (``apply_running``).
    """
    from greenctl.executor.runtime.metrics import parse_prometheus

    problems: list[str] = []
    recovered: list[dict[str, Any]] = []
    apply_running = False
    if deployments.unsettled(store):
        try:
            with apply_lock(state_dir_for(store.path)):
                recovered = recover(store)
        except LockedError:
            apply_running = True  # what it started is its own to finish or undo
    disp = deployments.running_dispatcher(store)
    disp_view: dict[str, Any] | None = None
    routed: dict[str, dict[str, Any]] = {}  # instance id -> the dispatcher's view of it
    if disp is not None:
        url = f"http://{_connect_host(disp['host'])}:{disp['port']}"
        proc = _dispatcher_process(disp)
        sup = _supervisor_process(disp)
        pair = _pair(disp)
        sup_doc = read_json(pair["supervisor_state_file"]) if pair else None
        alive = proc is not None
        disp_view = {
            "url": url,
            "port": disp["port"],
            "pid": proc[0] if proc else disp["pid"],
            "alive": alive,
            "ready": alive and _get_ok(url + "/v2/health/ready", timeout_s),
            "plan_id": disp["plan_id"],
            "log_file": disp["log_file"],
            "supervisor": None,
        }
        if pair:
            retry_at = (sup_doc or {}).get("retry_at")
            disp_view["supervisor"] = {
                "pid": sup[0] if sup else disp.get("supervisor_pid"),
                "alive": sup is not None,
                "log_file": pair.get("supervisor_log_file"),
                "dispatcher_restarts": int((sup_doc or {}).get("restarts") or 0),
                "dispatcher_failures": int((sup_doc or {}).get("failures") or 0),
                "retry_in_s": None if not retry_at else max(0.0, retry_at - time.time()),
            }
        if alive:
            with contextlib.suppress(ExecutorError):
                doc = _admin(disp, "GET", timeout_s=max(timeout_s, 1.0))
                for name, m in (doc.get("models") or {}).items():
                    for b in m.get("instances") or []:
                        routed[b["id"]] = {**b, "model": name}
            if pair and sup is None:
                problems.append(
                    f"the dispatcher's supervisor (pid {disp.get('supervisor_pid')}) is gone; "
                    "the dispatcher starts a new one"
                )
        elif sup is not None:
            sv = disp_view["supervisor"] or {}
            looping = (
                f" in {sv['retry_in_s']:.0f} s (crash loop: {sv['dispatcher_failures']} "
                "failures in a row)"
                if sv.get("retry_in_s")
                else ""
            )
            problems.append(
                f"the dispatcher at {url} is down; its supervisor (pid {sup[0]}) restarts "
                f"it{looping}"
            )
        else:
            problems.append(
                f"the dispatcher at {url} and its supervisor are gone: nothing answers there; "
                "`greenctl apply PLAN` starts them again on the same port (`greenctl down` "
                "stops the executors)"
            )
    instances = []
    for row in deployments.ready_instances(store):
        view = _instance_view(row)
        b = routed.get(row["id"])
        pid, ticks = row["pid"], row["pid_start"]
        url = f"http://{_connect_host(row['host'])}:{row['port']}"
        if b is not None:  # the dispatcher knows best: it restarts them
            pid, ticks, url = b.get("pid"), b.get("pid_start"), b.get("url") or url
            view["pid"] = pid
            view["port"] = int(url.rsplit(":", 1)[-1]) if url.rsplit(":", 1)[-1].isdigit() else None
            view["restarts"] = max(view["restarts"], int(b.get("restarts") or 0))
        view["url"] = url
        view["alive"] = is_alive(pid, ticks)
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
        failures = int((b or {}).get("failures") or 0)
        retry = (b or {}).get("retry_in_s")
        if failures >= 2:  # died soon after its last restarts (even if up again, for now)
            state = "crash-loop"
        elif b is not None and b.get("restarting"):
            state = "restarting"
        elif view["ready"]:
            state = "ready"
        elif view["alive"]:
            state = "not ready"
        else:
            state = "down"
        view.update(
            state=state,
            up=None if b is None else bool(b.get("up")),  # the dispatcher routes to it
            failures=failures,
            retry_in_s=retry,
            last_error=(b or {}).get("last_error"),
        )
        what = f"instance {row['id']} ({row['variant']} on {row['resource']})"
        if state == "crash-loop":
            if retry:
                now = f"the supervisor restarts it in {retry:.0f} s"
            elif b is not None and b.get("restarting"):
                now = "the supervisor is restarting it"
            else:
                now = "it is up again, for now"
            problems.append(
                f"{what} is crash-looping: {failures} failures in a row, each soon after it "
                f"started; {now} (backing off, never giving up)"
                + (f"; last error: {view['last_error']}" if view["last_error"] else "")
            )
        elif state == "restarting":
            problems.append(f"{what} is restarting after its process exited")
        elif state != "ready":
            problems.append(f"{what} is {state}")
        if disp_view is not None and disp_view["alive"] and routed and b is None:
            problems.append(f"{what} is not in the dispatcher's routes")
        instances.append(view)
    if disp is None and instances:
        problems.insert(0, f"no dispatcher runs for the {len(instances)} instance(s)")
    if disp is None and not instances:
        state = "idle"
    elif disp_view is None or not disp_view["alive"]:
        state = "down"
    else:
        state = "degraded" if problems else "serving"
    last = deployments.last_apply(store)
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
    """Stop everything greenctl started for this store, and restore the checkpointed MIG
    layout if asked.

    Every dispatcher pair is told to stop first (its stop file: nothing is restarted from
    then on), then what interrupted applies left is stopped (:func:`recover`), then the
    pairs, the executors, and last any greenctl daemon of this store still running that the
    records missed. ``stopped`` lists each process that was running.
    """
    state_dir = state_dir_for(store.path)
    stopped: list[dict[str, Any]] = []
    with apply_lock(state_dir, wait=wait, timeout_s=60.0):
        pairs = deployments.dispatchers_in(
            store, [deployments.STARTING, deployments.RUNNING, deployments.STOPPING]
        )
        for row in pairs:
            stop_file = _pair(row).get("stop_file")
            if stop_file:
                os.close(os.open(stop_file, os.O_WRONLY | os.O_CREAT, 0o600))
        for action in recover(store):
            stopped += action.get("processes") or []
            stopped += [{"instance": action["id"], "pid": p} for p in action.get("pids") or []]
        for row in deployments.running_dispatchers(store):
            stopped += _stop_pair(row)
            deployments.end_dispatcher(store, row["id"])
        for row in deployments.ready_instances(store):
            pids = [pid for pid, _ in _instance_processes(row)]
            ok = _stop_instance(row)
            deployments.end_instance(store, row["id"])
            stopped += [{"instance": row["id"], "pid": pid, "stopped": ok} for pid in pids]
        from greenctl.executor.deploy.georouter_procs import stop_routers

        stopped += stop_routers(store)  # the geo router and its supervisor
        for pid, ticks in stray_daemons(state_dir, str(store.path)):
            terminate(pid, ticks)
            stopped.append({"stray": (process_argv(pid) or ["?"])[0], "pid": pid})
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

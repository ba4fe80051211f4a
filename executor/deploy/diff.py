"""The diff at the heart of ``apply``: the plan's instances against what runs now (state in
the store), giving what to keep, start and stop, whether the dispatcher, its routes, the
MIG layouts and the MPS daemon must change, and the actions that say so (:class:`Change`).

Nothing here changes the machine; only records of instances found dead are closed.
"""

from __future__ import annotations

import json
from typing import Any

from greenctl.data import deployments
from greenctl.data.emissions import routes_carbon
from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.plan import Plan, check_families
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.deploy import partition
from greenctl.executor.deploy.actions import (
    MPS_SERVICE,
    Action,
    ApplyOptions,
    Change,
    MigCheckpoint,
    MigCreate,
    MigDestroy,
    MigExternal,
    StartMpsControl,
    SwitchRoutes,
    describe,
)
from greenctl.executor.deploy.admin import admin
from greenctl.executor.deploy.checks import (
    resolve_variants,
    validate_glet_memory,
    validate_gpu,
)
from greenctl.executor.deploy.instances import InstanceSpec, desired_instances
from greenctl.executor.deploy.processes import pair_serves, stop_pair
from greenctl.executor.kinds import PlanKind
from greenctl.executor.runtime.procs import is_alive


def plan_change(
    plan: Plan, store: Store, kind: PlanKind, policy: str, options: ApplyOptions
) -> Change:
    """Decide what applying ``plan`` changes here (with ``options.dry_run``, nothing is
    recorded; otherwise dead instances and a dispatcher pair found gone are closed).

    Raises:
        InputError: the plan has no deployments to run, or names a bad layout.
        NotFoundError / InfeasiblePlan / HardwareError: it does not fit this machine.
    """
    specs = (kind.instances or desired_instances)(plan)
    if not specs:
        raise InputError(
            "the plan has no deployments to run", hint="plan with `greenctl plan ...` first"
        )
    variants = resolve_variants(specs, store, options.loader_name)
    check_families(plan.deployments, {name: v.family for name, v in variants.items()})
    record = not options.dry_run
    running = reconcile_dead(store, deployments.ready_instances(store), record=record)
    disp, reuse_port = _serving_dispatcher(store, record=record)
    kept, new_specs, to_stop = diff_instances(running, specs)
    change = Change(specs, kept, new_specs, to_stop, disp=disp, policy=policy, variants=variants)
    change.new_cores = _assign_cores(change, options.cores)
    validate_gpu(specs, time_shared=kind.time_shared)
    if kind.time_shared:  # glets: one GPU's executors must fit its memory
        validate_glet_memory(plan, others_count=not running)
    _choose_dispatcher(change, plan, options, reuse_port)
    _plan_actions(change, plan, store, options)
    return change


def reconcile_dead(
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


def _serving_dispatcher(store: Store, *, record: bool) -> tuple[dict[str, Any] | None, int | None]:
    """The recorded dispatcher if its pair still serves, and the port to reuse when both
    dispatcher and supervisor are gone (a new pair starts there, so clients keep their URL,
    unless another program took it)."""
    disp = deployments.running_dispatcher(store)
    if disp is None or pair_serves(disp):
        return disp, None
    if record:
        stop_pair(disp)
        deployments.end_dispatcher(store, disp["id"], state="failed")
    return None, disp["port"]


def diff_instances(
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


def _assign_cores(change: Change, cores: list[int] | None) -> list[list[int]]:
    """Cores for the new instances, preferring those no kept instance holds, after checking
    the whole plan fits the usable cores."""
    usable = cores if cores is not None else partition.available_cores()
    partition.assign_cores(
        [parse_resource(s.resource).cpu_cores or 0 for s in change.specs], usable
    )
    taken = {c for row in change.kept for c in json.loads(row["cores"] or "[]")}
    needs = [parse_resource(s.resource).cpu_cores or 0 for s in change.new_specs]
    return partition.assign_cores(needs, usable, taken)


def _choose_dispatcher(
    change: Change, plan: Plan, options: ApplyOptions, reuse_port: int | None
) -> None:
    """The port a dispatcher asks for (the option, the plan's, else a gone pair's) and
    whether a new one starts (none runs, or its address changes)."""
    port = options.port
    if port is None:
        port = (plan.extra.get("dispatcher") or {}).get("port")
    if port in (None, 0) and reuse_port:
        port, change.any_port = reuse_port, True
    change.port = port
    disp = change.disp
    change.new_dispatcher = (
        disp is None
        or disp["host"] != options.host
        or (port not in (None, 0) and disp["port"] != port)
    )


def _plan_actions(change: Change, plan: Plan, store: Store, options: ApplyOptions) -> None:
    """The actions of a change (MPS daemon, MIG layouts, dispatcher and executors, routing
    switch) and whether anything changes at all (routes, quotas or carbon included)."""
    specs, kept = change.specs, change.kept
    disp = change.disp
    routes_changed = (
        disp is None
        or route_signature(disp, kept, specs, change.policy, routes_carbon(plan)) is None
    )
    mig_gpus = sorted({s.mig.gpu for s in specs if s.mig is not None})
    actions = describe_mig(specs, mig_gpus, options.mig_parted) + describe(change, options)
    needs_mps = any(parse_resource(s.resource).spec.thread_percentage for s in specs)
    mps_running = deployments.service_running(store, MPS_SERVICE)
    if needs_mps and not mps_running:
        actions.insert(0, StartMpsControl())
    changed = bool(actions) or routes_changed or quotas_changed(kept)
    if changed and not any(isinstance(a, SwitchRoutes) for a in actions):
        actions.append(SwitchRoutes(models=sorted({s.model for s in specs})))
    change.actions = actions
    change.changed = changed
    change.mig_gpus = [] if options.mig_parted else mig_gpus
    change.needs_mps = needs_mps and not mps_running


def quotas_changed(kept: list[dict[str, Any]]) -> bool:
    """Whether a kept instance's request quota moves."""
    return any((row["quota_rps"] or None) != (row["_spec"].quota_rps or None) for row in kept)


def route_signature(
    disp: dict[str, Any],
    kept: list[dict[str, Any]],
    specs: list[InstanceSpec],
    policy: str,
    carbon: dict[str, float] | None = None,
) -> Any:
    """None when the dispatcher's table differs from what the kept instances need, or
    carries another grid intensity than ``carbon`` (a replan with a new signal)."""
    try:
        doc = admin(disp, "GET", timeout_s=3.0)
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


def describe_mig(specs: list[InstanceSpec], gpus: list[int], mig_parted: bool) -> list[Action]:
    """The MIG actions: per GPU whose layout differs, a checkpoint, the instances to destroy
    and those to create (after checking the GPU and the layout); with ``mig_parted``, only a
    note that the layout is not ours."""
    if not gpus:
        return []
    if mig_parted:
        return [MigExternal(gpus)]
    backend = partition.gpu_backend()
    out: list[Action] = []
    for gpu in gpus:
        want_slots = mig_slots(specs, gpu)
        partition.check_mig_gpu(backend, gpu)
        partition.check_layout(backend, gpu, want_slots)
        have = {(c["profile"], c["start"]) for c in partition.current_layout(backend, gpu)}
        want = {(m.profile, m.start) for m in want_slots}
        if have == want:
            continue
        out.append(MigCheckpoint(gpu, sorted(have)))
        out += [MigDestroy(gpu, p, st) for p, st in sorted(have - want)]
        out += [MigCreate(gpu, p, st) for p, st in sorted(want - have)]
    return out


def mig_slots(specs: list[InstanceSpec], gpu: int) -> list[partition.MigSlot]:
    """The GPU instances the plan wants on ``gpu``: one slot per GPU instance (a
    time-shared glet's models share theirs)."""
    return list(dict.fromkeys(s.mig for s in specs if s.mig is not None and s.mig.gpu == gpu))

"""The steps that carry out a :class:`~greenctl.executor.deploy.actions.Change`, in an order
that keeps serving: MIG layout (with a checkpoint), MPS control daemon, dispatcher, new
executors (waiting until ready), one atomic routing switch on the dispatcher, the store
commit, and only then stopping what the plan no longer needs.

Each step records how to undo it; a failure (or SIGTERM / SIGINT, see :class:`SignalGuard`)
before the commit undoes every step taken, in reverse, so the previous configuration keeps
serving. Every process is journaled in the store before it starts and joins the running
configuration only in the commit.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.emissions import executor_energy_args, routes_carbon
from greenctl.data.errors import ExecutorError, GreenctlError
from greenctl.data.plan import Plan
from greenctl.data.records import utcnow_iso
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.deploy import partition
from greenctl.executor.deploy.actions import (
    BACKEND,
    MPS_SERVICE,
    ApplyOptions,
    ApplyResult,
    Change,
)
from greenctl.executor.deploy.admin import admin, routes_doc, strip_runtime, url_of
from greenctl.executor.deploy.diff import mig_slots
from greenctl.executor.deploy.instances import InstanceSpec, instance_view
from greenctl.executor.deploy.llm_plan import add_llm_routes, llm_spawn
from greenctl.executor.deploy.processes import (
    Undo,
    executor_spawn,
    instance_stopper,
    launch,
    start_pair,
    stop_instance,
    stop_pair,
    wait_ready,
)
from greenctl.executor.runtime.offers import add_offers
from greenctl.executor.runtime.procs import proc_start_ticks


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived while an apply was changing things (not an Exception, so no
    ``except Exception`` on the way swallows it before the apply is undone)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class SignalGuard:
    """SIGTERM and SIGINT during an apply: the first raises :class:`Interrupted` where the
    apply is (it then undoes what it did); while it undoes, or once it has committed, they are
    only remembered (an apply never stops half-way through undoing or retiring). Only in the
    main thread (elsewhere signals are not ours to handle)."""

    def __init__(self) -> None:
        self.armed = True
        self.pending: int | None = None
        self.old: dict[int, Any] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.pending is None:
            self.pending = signum
        if self.armed:
            self.armed = False
            raise Interrupted(signum)

    def hold(self) -> None:
        """From now on, remember signals instead of raising them."""
        self.armed = False

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


@dataclass
class Rollout:
    """One apply while it runs: what it changes, what it did (``done``, journaled), how to
    undo it, and the step it is at (named in errors)."""

    plan: Plan
    store: Store
    state_dir: Path
    change: Change
    options: ApplyOptions
    history_id: int
    undo: list[Undo] = field(default_factory=list)
    done: list[dict[str, Any]] = field(default_factory=list)
    new_rows: list[dict[str, Any]] = field(default_factory=list)
    new_disp: dict[str, Any] | None = None
    mps_env: dict[str, str] = field(default_factory=dict)
    #: (since, models) left unrouted while their MIG slices are re-created
    gap: tuple[float, list[str]] | None = None
    step: str = "starting"

    @property
    def target(self) -> dict[str, Any]:
        """The dispatcher that serves the plan: the new one, else the running one."""
        target = self.new_disp or self.change.disp
        assert target is not None
        return target


def execute(
    plan: Plan,
    *,
    store: Store,
    state_dir: Path,
    change: Change,
    options: ApplyOptions,
    signals: SignalGuard,
) -> ApplyResult:
    """Carry out ``change``, undoing every step if one fails before the commit.

    Raises:
        ExecutorError: a step failed or a signal arrived; what was done is undone and the
            previous configuration still serves.
    """
    history_id = deployments.start_apply(store, plan_id=plan.id, actions=change.action_dicts())
    run = Rollout(plan, store, state_dir, change, options, history_id)
    try:
        change_mig(run)
        start_mps(run)
        start_dispatcher(run)
        start_executors(run)
        switch_routes(run)
        commit(run)
        signals.hold()  # committed: a signal from now on lets the apply finish retiring
    except (Exception, Interrupted) as exc:
        signals.hold()
        _fail(run, exc)
    warnings = retire(run, signals)
    return ApplyResult(
        plan_id=plan.id,
        changed=True,
        dry_run=False,
        actions=run.done,
        dispatcher_url=url_of(run.target),
        instances=[instance_view(r) for r in deployments.ready_instances(store)],
        warnings=warnings,
        history_id=history_id,
        policy=change.policy,
    )


def _fail(run: Rollout, exc: BaseException) -> None:
    """Undo what ``run`` did, record the apply as failed, and raise.

    Raises:
        ExecutorError: for greenctl's errors, OS errors and signals; anything else (a bug)
            is raised as it is.
    """
    undone = undo_all(run.undo)
    hint = None
    if isinstance(exc, Interrupted):
        what = f"apply interrupted by {exc.name} while {run.step}"
    elif isinstance(exc, GreenctlError):
        what, hint = f"apply failed while {run.step}: {exc.message}", exc.hint
    else:
        what = f"apply failed while {run.step}: {exc}"
    deployments.finish_apply(
        run.store, run.history_id, status="failed", actions=run.done, undone=undone, error=what
    )
    if not isinstance(exc, GreenctlError | OSError | Interrupted):
        raise exc  # a bug: undone and recorded, and shown as it is
    raise ExecutorError(
        f"{what}; undid {len(undone)} step(s), the previous configuration is still serving",
        hint=hint,
    ) from None


def undo_all(undo: list[Undo]) -> list[str]:
    """Run the undo steps in reverse; what each undid (or how it failed)."""
    undone = []
    for what, fn in reversed(undo):
        try:
            fn()
            undone.append(what)
        except Exception as exc:  # keep undoing the rest
            undone.append(f"{what} (failed: {exc})")
    return undone


# -- 1. MIG layouts ----------------------------------------------------------------------------
def change_mig(run: Rollout) -> None:
    """Lay out each GPU as the plan wants: checkpoint its layout first, stop the executors
    on slices that go away, then destroy and create GPU instances."""
    if not run.change.mig_gpus:
        return
    run.step = "changing the MIG layout"
    backend = partition.gpu_backend()
    for gpu in run.change.mig_gpus:
        partition.check_mig_gpu(backend, gpu)
        want = mig_slots(run.change.specs, gpu)
        layout = partition.current_layout(backend, gpu)
        have = {(c["profile"], c["start"]) for c in layout}
        if have == {(m.profile, m.start) for m in want}:
            continue
        if not deployments.has_open_mig_checkpoint(run.store, gpu):
            deployments.add_mig_checkpoint(
                run.store,
                apply_id=run.history_id,
                gpu_index=gpu,
                gpu_uuid=next((g.uuid for g in backend.gpus() if g.index == gpu), None),
                layout=[{"profile": c["profile"], "start": c["start"]} for c in layout],
            )
        run.done.append({"action": "mig-checkpoint", "gpu": gpu})
        _free_slices(run, gpu, have - {(m.profile, m.start) for m in want})
        run.done += partition.reconcile_mig(backend, gpu, want, run.undo)


def _free_slices(run: Rollout, gpu: int, going: set[tuple[str, int]]) -> None:
    """Stop the executors on slices of ``gpu`` that go away, first taking them out of the
    dispatcher's routes so its supervisor does not restart them. Undoing restores the
    routes, and the supervisor restarts them on the re-created instances (it resolves their
    MIG UUIDs afresh)."""
    freeing = [
        row
        for row in run.change.to_stop
        if (mig := json.loads(row["spawn"] or "{}").get("mig"))
        and mig["gpu"] == gpu
        and (mig["profile"], mig["start"]) in going
    ]
    if not freeing:
        return
    if run.change.disp is not None:
        unrouted = drop_from_routes(run.change.disp, {row["id"] for row in freeing}, run.undo)
        if unrouted:  # no instance left: a gap until the switch, measured
            since = run.gap[0] if run.gap else time.monotonic()
            run.gap = (since, sorted({*(run.gap[1] if run.gap else []), *unrouted}))
    for row in freeing:
        stop_instance(row)
        run.done.append({"action": "stop-executor", "id": row["id"]})


def drop_from_routes(disp: dict[str, Any], ids: set[str], undo: list[Undo]) -> list[str]:
    """Take executors ``ids`` out of the dispatcher's routes; returns the models left with
    none (not served until the next switch)."""
    previous = strip_runtime(admin(disp, "GET"))
    interim = json.loads(json.dumps(previous))
    unrouted = []
    for name in list(interim["models"]):
        model = interim["models"][name]
        model["instances"] = [b for b in model["instances"] if b["id"] not in ids]
        if not model["instances"]:
            del interim["models"][name]
            unrouted.append(name)
    admin(disp, "POST", interim)
    undo.append(("restore the routes before the MIG change", lambda: admin(disp, "POST", previous)))
    return unrouted


# -- 2. MPS and 3. the dispatcher --------------------------------------------------------------
def start_mps(run: Rollout) -> None:
    """Start the MPS control daemon when the plan needs it and none runs; otherwise find
    the running one's folders for the MPS executors."""
    if run.change.needs_mps:
        run.step = "starting the MPS control daemon"
        state_dir = run.state_dir
        run.mps_env = partition.start_mps(state_dir)
        run.undo.append(("stop the MPS control daemon", lambda: partition.stop_mps(state_dir)))
        run.done.append({"action": "start-mps-control"})
    elif any(parse_resource(s.resource).spec.thread_percentage for s in run.change.specs):
        run.mps_env = partition.mps_dirs(run.state_dir)


def start_dispatcher(run: Rollout) -> None:
    """A new dispatcher, with its supervisor, when none runs (or its address changes)."""
    if not run.change.new_dispatcher:
        return
    run.step = "starting the dispatcher"
    run.new_disp = start_pair(
        run.store,
        run.state_dir,
        apply_id=run.history_id,
        undo=run.undo,
        host=run.options.host,
        port=run.change.port,
        any_port=run.change.any_port,
        max_queue=run.options.max_queue,
        ready_timeout_s=run.options.ready_timeout_s,
    )
    run.done.append({"action": "start-dispatcher", "url": url_of(run.new_disp)})


# -- 4. executors ------------------------------------------------------------------------------
def start_executors(run: Rollout) -> None:
    """Start the new executors, each journaled before it starts, all started before any is
    waited for."""
    run.step = "starting executors"
    launching = []
    for n, (s, cores) in enumerate(zip(run.change.new_specs, run.change.new_cores, strict=True)):
        row, spawn = _journal_executor(run, s, f"{run.history_id}-{n}", cores)
        proc = launch(spawn)
        deployments.set_instance_process(
            run.store, row["id"], pid=proc.pid, pid_start=proc_start_ticks(proc.pid)
        )
        launching.append((s, row, spawn, proc))
    for s, row, spawn, proc in launching:
        what = f"executor {row['id']} ({s.variant} on {s.resource})"
        run.step = f"starting {what}"
        doc = wait_ready(spawn, proc, timeout_s=run.options.ready_timeout_s, what=what)
        row.update(
            host=doc["host"],
            port=int(doc["port"]),
            pid=int(doc["pid"]),
            pid_start=doc.get("pid_start"),
            started_at=utcnow_iso(),
        )
        deployments.set_instance_process(
            run.store,
            row["id"],
            host=row["host"],
            port=row["port"],
            pid=row["pid"],
            pid_start=row["pid_start"],
        )
        run.new_rows.append(row)
        run.done.append(
            {
                "action": "start-executor",
                "id": row["id"],
                "variant": s.variant,
                "resource": s.resource,
                "port": int(doc["port"]),
            }
        )


def _journal_executor(
    run: Rollout, s: InstanceSpec, inst_id: str, cores: list[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Record a new executor as ``starting`` (with how it starts) and how to undo it."""
    opts = run.options
    spawn = executor_spawn(
        s,
        inst_id,
        cores,
        state_dir=run.state_dir,
        store=run.store,
        loader=opts.loader_name,
        max_wait_ms=opts.max_wait_ms,
        mps_env=run.mps_env,
        ready_timeout_s=opts.ready_timeout_s,
    )
    if s.engine is not None:  # an LLM tier: its engine is the executor
        spawn = llm_spawn(spawn, s, inst_id, cores, store=run.store)
    else:
        spawn["argv"] += ["--variant-json", json.dumps(asdict(run.change.variants[s.variant]))]
        spawn["argv"] += executor_energy_args(  # its energy and carbon counters' figures
            run.store, run.plan, variant=s.variant, resource=s.resource, batch=s.batch
        )
    row = {
        "id": inst_id,
        "apply_id": run.history_id,
        "plan_id": run.plan.id,
        "model": s.model,
        "variant": s.variant,
        "resource": s.resource,
        "batch": s.batch,
        "quota_rps": s.quota_rps,
        "key": s.key,
        "cores": json.dumps(cores),
        "device": spawn["env"].get("CUDA_VISIBLE_DEVICES") or None,
        "spawn": json.dumps(spawn),
        "restarts": 0,
    }
    deployments.journal_instance(run.store, row)
    run.undo.append((f"stop executor {inst_id}", instance_stopper(run.store, row)))
    return row, spawn


# -- 5. the switch and 6. the commit -----------------------------------------------------------
def switch_routes(run: Rollout) -> None:
    """One routing switch on the dispatcher: the kept and new executors, each instance's
    offer for model-less requests, and the plan's grid intensity."""
    run.step = "switching the dispatcher's routes"
    change, opts = run.change, run.options
    final = [{**row, "quota_rps": row["_spec"].quota_rps} for row in change.kept] + run.new_rows
    routes = routes_doc(final, change.policy, opts.max_queue, run.history_id)
    routes = add_offers(routes, final, run.store, run.plan, max_wait_ms=opts.max_wait_ms)
    routes = add_llm_routes(routes, final, run.plan, run.store)  # tiers' shares and figures
    routes["carbon"] = routes_carbon(run.plan)  # exported, and handed to executors
    target = run.target
    previous = None if run.new_disp is not None else admin(target, "GET")
    admin(target, "POST", routes)
    if run.gap is not None:
        gap_ms = round((time.monotonic() - run.gap[0]) * 1000.0, 1)
        run.done.append({"action": "serving-gap", "models": run.gap[1], "gap_ms": gap_ms})
    if previous is not None:
        prev = strip_runtime(previous)
        run.undo.append(("restore the previous routes", lambda: admin(target, "POST", prev)))
    run.done.append({"action": "switch-routes", "generation": run.history_id})


def commit(run: Rollout) -> None:
    """Record the new configuration in one transaction: new executors and dispatcher
    running, kept ones reassigned, retired ones ``stopping``, the apply applied."""
    run.step = "recording the new state"
    store, plan, change = run.store, run.plan, run.change
    with store.transaction():
        for row in run.new_rows:
            deployments.commit_instance(store, row["id"], started_at=row["started_at"])
        for row in change.kept:
            deployments.reassign_instance(
                store, row["id"], plan_id=plan.id, quota_rps=row["_spec"].quota_rps
            )
        for row in change.to_stop:
            deployments.retire_instance(store, row["id"])
        if run.new_disp is not None:
            deployments.commit_dispatcher(store, run.new_disp["id"], plan_id=plan.id)
            if change.disp is not None:
                deployments.retire_dispatcher(store, change.disp["id"])
        else:
            deployments.point_dispatcher(
                store, run.target["id"], plan_id=plan.id, apply_id=run.history_id
            )
        if change.needs_mps:
            deployments.start_service(store, MPS_SERVICE, info=run.mps_env)
        deployments.record_backend(
            store, BACKEND, plan_id=plan.id, options=run.options.backend_options()
        )
        deployments.finish_apply(store, run.history_id, status="applied", actions=run.done)


# -- 7. retiring -------------------------------------------------------------------------------
def retire(run: Rollout, signals: SignalGuard) -> list[str]:
    """Stop what the plan no longer needs (after the switch: no gap in service); returns
    the warnings to show."""
    store, change = run.store, run.change
    warnings: list[str] = [
        f"{', '.join(a['models'])} had no executor for {a['gap_ms']:g} ms while the MIG "
        "slices they ran on were re-created (no room to start the new ones first)"
        for a in run.done
        if a["action"] == "serving-gap"
    ]
    for row in change.to_stop:
        if not stop_instance(row):
            warnings.append(f"executor {row['id']} (pid {row['pid']}) did not stop")
        else:
            run.done.append(
                {
                    "action": "stop-executor",
                    "id": row["id"],
                    "variant": row["variant"],
                    "resource": row["resource"],
                }
            )
        deployments.end_instance(store, row["id"])
    if run.new_disp is not None and change.disp is not None:
        stop_pair(change.disp)
        deployments.end_dispatcher(store, change.disp["id"])
        run.done.append({"action": "stop-dispatcher", "pid": change.disp["pid"]})
    deployments.set_apply_actions(store, run.history_id, run.done)
    if signals.pending is not None:
        warnings.append(
            f"{signal.Signals(signals.pending).name} arrived after the new configuration was "
            "committed; the apply finished retiring the old one first"
        )
    return warnings

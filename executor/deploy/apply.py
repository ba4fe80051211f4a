"""Make a plan real on this machine: ``apply_plan``, ``status`` and ``down``, the local backend.

:class:`greenctl.executor.deploy.backends.LocalBackend` is its face to the CLI and
``replan --apply``; its state is in :mod:`greenctl.data.deployments`. ``apply_plan``
validates a plan, diffs it against what runs (:mod:`~greenctl.executor.deploy.diff`) and
carries out the steps in an order that keeps serving (:mod:`~greenctl.executor.deploy.steps`);
a failure or ^C before the commit undoes every step, so the previous configuration serves.
Applying the running plan again does nothing; a lock file serialises applies. Processes are
journaled before they start, so the next command finishes what a killed apply left
(:func:`~greenctl.executor.deploy.teardown.recover`). Each dispatcher runs beside a
supervisor (:mod:`greenctl.executor.runtime.supervisor`). Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from greenctl.data import deployments
from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.plan import Plan
from greenctl.data.resources import runnable_resource
from greenctl.data.store import Store
from greenctl.executor.deploy.actions import (
    BACKEND,
    DEFAULT_LOADER,
    MPS_SERVICE,
    ApplyOptions,
    ApplyResult,
    Change,
)
from greenctl.executor.deploy.admin import url_of
from greenctl.executor.deploy.checks import check_apply
from greenctl.executor.deploy.diff import plan_change
from greenctl.executor.deploy.instances import InstanceSpec, desired_instances, instance_view
from greenctl.executor.deploy.llm_plan import check_engines
from greenctl.executor.deploy.processes import SUPERVISOR_MODULE
from greenctl.executor.deploy.status import status
from greenctl.executor.deploy.steps import Interrupted, SignalGuard, execute
from greenctl.executor.deploy.teardown import down, recover
from greenctl.executor.deploy.verify import verify_plan
from greenctl.executor.kinds import get_kind
from greenctl.executor.runtime.procs import apply_lock, log_tail, state_dir_for

__all__ = [
    "BACKEND",
    "DEFAULT_LOADER",
    "MPS_SERVICE",
    "SUPERVISOR_MODULE",
    "ApplyOptions",
    "ApplyResult",
    "InstanceSpec",
    "apply_plan",
    "desired_instances",
    "down",
    "executor_log",
    "recover",
    "status",
    "verify_plan",
]


def apply_plan(
    plan: Plan, *, store: Store, options: ApplyOptions | None = None, **fields: Any
) -> ApplyResult:
    """Make ``plan`` the running configuration.

    ``options`` (:class:`ApplyOptions`) says how to apply; ``fields`` override any of its fields
    by name (``apply_plan(plan, store=s, dry_run=True)``). The dispatch policy defaults to the
    plan kind's (:meth:`~greenctl.executor.kinds.PlanKind.dispatch_policy`), the one
    ``simulate`` assumes. Executor state lives in ``store``.

    Raises:
        TypeError: a field :class:`ApplyOptions` does not have.
        InputError: a plan whose kind does not describe instances (geo), a bad plan, or an
            option it cannot run with (a port taken or privileged, a loader that does not
            import): refused before anything changes.
        InfeasiblePlan / HardwareError: the plan does not fit this machine (nothing changed).
        LockedError: another apply runs.
        ExecutorError: a step failed; every step was undone and the previous configuration
            still serves.
    """
    opts = dataclasses.replace(options or ApplyOptions(), **fields)
    kind = get_kind(plan.kind)  # the registry of plan kinds: policy, instances, sharing
    if not kind.serves:
        raise kind.refuse("apply")
    policy = kind.dispatch_policy(plan, opts.policy)
    for i, d in enumerate(plan.deployments):
        runnable_resource(d.resource, field=f"deployments[{i}].resource")
    check_apply(plan, store, opts)  # before the lock, the recovery or any process
    if check_engines(plan, store) and opts.verify:  # an LLM tier's engine and model folder
        raise InputError(
            "--verify measures a plan with Open Inference Protocol requests; an LLM plan's "
            "tiers answer OpenAI's API",
            hint="apply without --verify, then measure the dispatcher's OpenAI front: "
            "greenctl profile llm --engine openai --endpoint URL",
        )
    state_dir = state_dir_for(store.path)
    with apply_lock(state_dir, wait=opts.wait, timeout_s=opts.lock_timeout_s):
        if not opts.dry_run:  # what an interrupted apply left: routes put back, processes stopped
            recover(store)
        with SignalGuard() as signals:
            try:
                change = plan_change(plan, store, kind, policy, opts)
                if opts.dry_run or not change.changed:
                    result = _unchanged(plan, store, change, opts)
                else:
                    if plan.id is None:
                        store.save_plan(plan, source="apply")
                    result = execute(
                        plan,
                        store=store,
                        state_dir=state_dir,
                        change=change,
                        options=opts,
                        signals=signals,
                    )
            except Interrupted as sig:
                raise ExecutorError(
                    f"apply interrupted by {sig.name} before it started anything; nothing changed"
                ) from None
    if opts.verify and not opts.dry_run and result.dispatcher_url:  # also when already running
        result.verify = verify_plan(
            plan,
            store=store,
            endpoint=result.dispatcher_url,
            duration_s=opts.verify_duration_s,
            rate_rps=opts.verify_rate_rps,
        )
    return result


def _unchanged(plan: Plan, store: Store, change: Change, opts: ApplyOptions) -> ApplyResult:
    """The result of a dry run, or of applying the plan that already runs (then recorded as
    what the local backend runs)."""
    disp = change.disp
    if not opts.dry_run:
        with store.transaction():
            deployments.record_backend(
                store,
                BACKEND,
                plan_id=disp["plan_id"] if plan.id is None and disp else plan.id,
                options=opts.backend_options(),
            )
    return ApplyResult(
        plan_id=plan.id,
        changed=change.changed,
        dry_run=opts.dry_run,
        actions=change.action_dicts() if change.changed else [],
        dispatcher_url=None if disp is None else url_of(disp),
        instances=[instance_view(r) for r in change.kept],
        policy=change.policy,
    )


def executor_log(store: Store, instance_id: str, lines: int = 20) -> str:
    """The tail of an instance's log (for error reports)."""
    row = deployments.instance_row(store, instance_id)
    spawn = json.loads(row["spawn"] or "{}")
    return log_tail(spawn.get("log_file", os.devnull), lines)

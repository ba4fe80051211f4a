"""The backends that run plans, behind one interface, and the one place that picks one.

A :class:`Backend` makes a plan real and answers for it: ``apply`` (its own options,
:attr:`Backend.option_names`; other backends' are left out so one set of flags serves all),
``status``, ``down`` and ``serving`` (:class:`Serving`: whether and which plan really serves,
what ``replan`` decides on). Two backends exist: ``local``
(:mod:`greenctl.executor.deploy.apply`) and ``ray``
(:mod:`greenctl.executor.deploy.ray_backend`); the Kubernetes export only writes manifests.
Every apply records its backend in the store
(:func:`greenctl.data.deployments.record_backend`), so :func:`backend_for` picks the one
that runs the plan for ``status``, ``down`` and ``replan --apply``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from greenctl.data import deployments
from greenctl.data.errors import ExecutorError, InputError, shown
from greenctl.data.plan import Plan
from greenctl.data.store import Store
from greenctl.executor.deploy import apply as local
from greenctl.executor.deploy import ray_backend
from greenctl.executor.deploy.georouter_procs import stop_routers
from greenctl.executor.kinds import get_kind


@dataclass(frozen=True)
class Serving:
    """Whether a plan really serves on a backend (live processes or replicas, not the rows
    of the last apply)."""

    backend: str
    live: bool
    plan_id: int | None  # the plan that serves (None when nothing does)
    why: str | None = None  # why nothing serves

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "live": self.live,
            "plan_id": self.plan_id,
            "why": self.why,
        }


class Applied(Protocol):
    """What a backend's ``apply`` returns (its own result type, with these in common)."""

    plan_id: int | None
    changed: bool
    policy: str | None
    verify: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]: ...


class Backend(Protocol):
    """One way of running plans."""

    name: str
    address: str | None
    #: how plans are applied here unless told otherwise (recorded, and used again by
    #: ``replan --apply``): local ``host``/``port``, Ray ``http_port``
    options: dict[str, Any]
    option_names: ClassVar[frozenset[str]]

    def apply(
        self,
        plan: Plan,
        *,
        store: Store,
        dry_run: bool = False,
        verify: bool = False,
        verify_duration_s: float = 10.0,
        policy: str | None = None,
        **options: Any,
    ) -> Applied: ...

    def status(self, store: Store) -> dict[str, Any]: ...

    def down(self, store: Store, **options: Any) -> dict[str, Any]: ...

    def serving(self, store: Store) -> Serving: ...


# -- local daemons ----------------------------------------------------------------------------
class LocalBackend:
    """Executor daemons and a dispatcher on this machine (:mod:`greenctl.executor.deploy.apply`)."""

    name = "local"
    option_names: ClassVar[frozenset[str]] = frozenset(
        {
            "mig_parted",
            "wait",
            "lock_timeout_s",
            "loader",
            "host",
            "port",
            "cores",
            "max_queue",
            "max_wait_ms",
            "ready_timeout_s",
            "verify_rate_rps",
        }
    )

    def __init__(self, address: str | None = None, options: Mapping[str, Any] | None = None):
        if address is not None:
            raise InputError(
                f"--address {shown(address)} names a Ray cluster; the local backend runs on "
                "this machine",
                hint="drop --address, or give --backend ray with it",
            )
        self.address: str | None = None  # this machine
        self.options = dict(options or {})

    def apply(
        self,
        plan: Plan,
        *,
        store: Store,
        dry_run: bool = False,
        verify: bool = False,
        verify_duration_s: float = 10.0,
        policy: str | None = None,
        **options: Any,
    ) -> Applied:
        return local.apply_plan(
            plan,
            store=store,
            dry_run=dry_run,
            verify=verify,
            verify_duration_s=verify_duration_s,
            policy=policy,
            **_own(self, options),
        )

    def status(self, store: Store) -> dict[str, Any]:
        return local.status(store)

    def down(self, store: Store, **options: Any) -> dict[str, Any]:
        return {"backend": self.name, **local.down(store, **options)}

    def serving(self, store: Store) -> Serving:
        st = local.status(
            store, timeout_s=1.0
        )  # its state and problems say more (`greenctl status`)
        disp = st["dispatcher"]
        plan_id = None if disp is None or disp["plan_id"] is None else int(disp["plan_id"])
        why = None
        if disp is None:
            why = "no dispatcher runs, after `greenctl down` or before any apply"
        elif not disp["alive"]:
            why = (
                f"the dispatcher of plan {plan_id}, pid {disp['pid']}, is gone after a restart "
                "or a kill"
            )
        elif not any(i["alive"] for i in st["instances"]):
            why = f"no executor of plan {plan_id} is alive"
        return Serving(self.name, why is None, plan_id if why is None else None, why)


# -- Ray Serve --------------------------------------------------------------------------------
class RayBackend:
    """Ray Serve on a cluster (:mod:`greenctl.executor.deploy.ray_backend`). ``address`` None: the
    cluster greenctl last applied on (``status``, ``down``); ``apply`` needs one."""

    name = "ray"
    option_names: ClassVar[frozenset[str]] = frozenset({"http_port", "max_wait_ms", "timeout_s"})

    def __init__(self, address: str | None = None, options: Mapping[str, Any] | None = None):
        self.address: str | None = address
        self.options = dict(options or {})

    def apply(
        self,
        plan: Plan,
        *,
        store: Store,
        dry_run: bool = False,
        verify: bool = False,
        verify_duration_s: float = 10.0,
        policy: str | None = None,
        **options: Any,
    ) -> Applied:
        if not self.address:
            raise InputError("--backend ray needs --address HOST:PORT of the Ray cluster")
        # the kind's policy (the one rule); a bad --policy is refused before anything is saved
        policy = get_kind(plan.kind).dispatch_policy(plan, policy)
        if plan.id is None:
            store.save_plan(plan, source="apply")
        result = ray_backend.apply_ray(
            plan,
            store=store,
            address=self.address,
            dry_run=dry_run,
            policy=policy,
            **_own(self, options),
        )
        if verify and not dry_run:
            result.verify = local.verify_plan(
                plan, store=store, endpoint=result.url, duration_s=verify_duration_s
            )
        return result

    def status(self, store: Store) -> dict[str, Any]:
        return ray_backend.status_ray(store=store, address=self.address)

    def down(self, store: Store, **options: Any) -> dict[str, Any]:
        deleted = ray_backend.down_ray(store=store, address=self.address)
        # a geo router runs on this host whichever backend serves its sites (the local
        # backend's down stops it with its other processes)
        return {"backend": self.name, "deleted": deleted, "stopped": stop_routers(store)}

    def serving(self, store: Store) -> Serving:
        if deployments.active_ray_app(store) is None:
            return Serving(
                self.name,
                False,
                None,
                "no greenctl application is active on Ray, after `greenctl down` or before "
                "any apply",
            )
        try:
            doc = ray_backend.status_ray(store=store, address=self.address)
        except ExecutorError as exc:
            return Serving(
                self.name, False, None, f"the Ray cluster does not answer: {exc.message}"
            )
        plan_id = None if doc["plan_id"] is None else int(doc["plan_id"])
        why = None
        if not doc["running"]:
            why = (
                f"Ray application {doc['app']} of plan {plan_id} is not on the cluster at "
                f"{doc['address']}: deleted, or the cluster restarted"
            )
        elif not any(i["ready"] for i in doc["instances"]):
            why = f"no replica of plan {plan_id} runs on the Ray cluster at {doc['address']}"
        return Serving(self.name, why is None, plan_id if why is None else None, why)


def _own(backend: Backend, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options ``backend`` takes: its recorded ones, overridden by ``options``; the
    options of another backend are left out (``apply --port`` means nothing to Ray).

    Raises:
        TypeError: an option no backend takes.
    """
    unknown = set(options) - {n for cls in BACKENDS.values() for n in cls.option_names}
    if unknown:
        raise TypeError(f"no backend takes the option(s) {', '.join(sorted(unknown))}")
    mine = {k: v for k, v in options.items() if k in backend.option_names}
    return {**backend.options, **mine}


#: name -> backend class: the backends ``--backend`` names
BACKENDS: dict[str, type[LocalBackend] | type[RayBackend]] = {
    "local": LocalBackend,
    "ray": RayBackend,
}
DEFAULT = "local"


# -- the one place a backend is picked ----------------------------------------------------------
def get_backend(
    name: str, *, address: str | None = None, options: Mapping[str, Any] | None = None
) -> Backend:
    """The backend called ``name`` (at ``address``: a Ray cluster).

    Raises:
        InputError: no such backend.
    """
    cls = BACKENDS.get(name)
    if cls is None:
        raise InputError(
            f"--backend {name!r} is not known",
            hint=f"use {' or '.join(BACKENDS)}; for Kubernetes, `greenctl export k8s` writes "
            "manifests",
        )
    return cls(address, options)


def recorded_backend(store: Store, *, running_only: bool = True) -> Backend | None:
    """The backend the store records as running the plan (the newest apply that is not taken
    down), with its address and options; with ``running_only=False`` also the backend a plan
    ran on last when nothing runs now. None: nothing recorded."""
    row = deployments.running_backend(store)
    if row is None and not running_only:
        row = deployments.last_backend(store)
    if row is None or row["backend"] not in BACKENDS:
        return None
    return get_backend(row["backend"], address=row["address"], options=row["options"])


def backend_for(store: Store, name: str | None = None, *, address: str | None = None) -> Backend:
    """The backend to ask: ``name`` when given (at ``address``), else the one that runs the
    plan (:func:`recorded_backend`), else ``local``.

    Raises:
        InputError: an unknown ``name``, or an ``address`` given to the local backend.
    """
    if name is not None:
        return get_backend(name, address=address)
    recorded = recorded_backend(store)
    if recorded is None:
        return get_backend(DEFAULT, address=address)
    if address is not None:
        if recorded.name != "ray":
            get_backend(recorded.name, address=address)  # refuses the address it cannot use
        recorded.address = address
    return recorded


# -- the library twins of `greenctl status` and `down`, and what `replan` needs -----------------
def status(
    store: Store, *, backend: str | None = None, address: str | None = None
) -> dict[str, Any]:
    """What runs on ``backend`` (default: the backend that runs the plan)."""
    return backend_for(store, backend, address=address).status(store)


def down(
    store: Store, *, backend: str | None = None, address: str | None = None, **options: Any
) -> dict[str, Any]:
    """Stop what greenctl started on ``backend`` (default: the backend that runs the plan);
    ``options``: the backend's own (local: ``restore_mig``, ``wait``)."""
    return backend_for(store, backend, address=address).down(store, **options)


def not_serving(doc: dict[str, Any]) -> list[str]:
    """Why the plan a ``status`` document describes does not fully serve, empty only when it
    does: what makes ``greenctl status`` exit 1 (nothing applied included)."""
    idle = ["nothing is applied (`greenctl apply PLAN.json` serves a plan)"]
    if doc.get("backend") == "ray":
        if doc.get("app") is None:
            return idle
        if not doc.get("running"):
            return [f"Ray application {doc['app']} is not on the cluster at {doc.get('address')}"]
        return [
            f"deployment {i.get('variant')} on {i.get('resource')} has no running replica "
            f"({i.get('status')})"
            for i in doc.get("instances") or []
            if not i.get("ready")
        ]
    state = doc.get("state")
    if state == "serving":
        return []
    if state == "idle":
        return idle
    return list(doc.get("problems") or [f"the plan is {state}"])


def serving(store: Store) -> Serving:
    """Whether a plan really serves on the backend that runs it, or ran one last (after
    ``down`` or a reboot: the backend :func:`apply_where_running` applies on), and which
    plan; local when none is recorded."""
    target = recorded_backend(store, running_only=False) or get_backend(DEFAULT)
    return target.serving(store)


def apply_where_running(plan: Plan, *, store: Store, **options: Any) -> Applied:
    """Apply ``plan`` on the backend that runs the plan now, or that ran one last (after
    ``down`` or a reboot), with the options it was applied with there; local when none is
    recorded (``replan --apply``). ``options`` (:meth:`Backend.apply`'s) another backend
    takes are left out.

    Raises:
        TypeError: an option no backend takes.
    """
    target = recorded_backend(store, running_only=False) or get_backend(DEFAULT)
    return target.apply(plan, store=store, **options)

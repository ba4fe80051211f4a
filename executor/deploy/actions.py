"""The records of an apply: the options it runs with (:class:`ApplyOptions`), the actions it
plans (one typed record per kind of step, shown by ``--dry-run`` and journaled in the
store), the change it decided (:class:`Change`) and what it returns (:class:`ApplyResult`).

Planned actions become plain dicts (``{"action": "start-executor", ...}``) in results and in
the store; :meth:`Action.to_dict` is that form, its fields in declaration order, optional
fields left out when unset.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from greenctl.data.batching import DEFAULT_MAX_WAIT_MS
from greenctl.executor.deploy.instances import InstanceSpec
from greenctl.executor.runtime.dispatch_routes import MAX_QUEUE

DEFAULT_LOADER = "greenctl.profiler.models:load_model"
#: the backend this apply is (:mod:`greenctl.executor.deploy.backends`), as the store records it
BACKEND = "local"
#: the MPS control daemon, as the store records it among the services
MPS_SERVICE = "mps-control"


@dataclass(frozen=True)
class ApplyOptions:
    """How ``apply_plan`` makes a plan real (see :func:`greenctl.executor.deploy.apply.apply_plan`
    for each option's meaning)."""

    dry_run: bool = False
    verify: bool = False
    mig_parted: bool = False
    wait: bool = False
    lock_timeout_s: float | None = None
    loader: str | None = None
    policy: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    cores: list[int] | None = None
    max_queue: int = MAX_QUEUE
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS
    ready_timeout_s: float = 120.0
    verify_duration_s: float = 10.0
    verify_rate_rps: float | None = None

    @property
    def loader_name(self) -> str:
        """The variant loader, the built-in catalog's unless another is named."""
        return self.loader or DEFAULT_LOADER

    def backend_options(self) -> dict[str, Any]:
        """What ``replan --apply`` applies again with: the address asked for, and a loader
        other than the built-in one (the variants load the same way)."""
        out: dict[str, Any] = {"host": self.host, "port": self.port}
        if self.loader_name != DEFAULT_LOADER:
            out["loader"] = self.loader_name
        return out


# -- planned actions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    """One step apply plans; ``name`` is its ``action`` in the dict form."""

    name: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.name}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None or f.default is not None:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class StartMpsControl(Action):
    name: ClassVar[str] = "start-mps-control"


@dataclass(frozen=True)
class MigExternal(Action):
    """The MIG layout belongs to NVIDIA mig-parted / the GPU operator."""

    name: ClassVar[str] = "mig-external"
    gpus: list[int]
    note: str = "layout owned by mig-parted"


@dataclass(frozen=True)
class MigCheckpoint(Action):
    name: ClassVar[str] = "mig-checkpoint"
    gpu: int
    layout: list[tuple[str, int]]


@dataclass(frozen=True)
class MigDestroy(Action):
    name: ClassVar[str] = "mig-destroy"
    gpu: int
    profile: str
    start: int


@dataclass(frozen=True)
class MigCreate(Action):
    name: ClassVar[str] = "mig-create"
    gpu: int
    profile: str
    start: int


@dataclass(frozen=True)
class StartDispatcher(Action):
    name: ClassVar[str] = "start-dispatcher"
    host: str
    port: int | str


@dataclass(frozen=True)
class StartExecutor(Action):
    name: ClassVar[str] = "start-executor"
    model: str
    variant: str
    resource: str
    batch: int
    cores: list[int] | None = None
    mig: dict[str, Any] | None = None


@dataclass(frozen=True)
class SwitchRoutes(Action):
    name: ClassVar[str] = "switch-routes"
    models: list[str] | None = None


@dataclass(frozen=True)
class StopExecutor(Action):
    name: ClassVar[str] = "stop-executor"
    id: str
    variant: str
    resource: str
    pid: int | None


@dataclass(frozen=True)
class StopDispatcher(Action):
    name: ClassVar[str] = "stop-dispatcher"
    pid: int | None
    port: int


def describe(change: Change, options: ApplyOptions) -> list[Action]:
    """The dispatcher and executor actions of a change: start what is new, one routing
    switch, then stop what the plan no longer needs."""
    actions: list[Action] = []
    if change.new_dispatcher:
        actions.append(StartDispatcher(options.host, change.port or "any"))
    for s, cores in zip(change.new_specs, change.new_cores, strict=True):
        mig = None
        if s.mig is not None:
            mig = {"gpu": s.mig.gpu, "profile": s.mig.profile, "start": s.mig.start}
        actions.append(
            StartExecutor(s.model, s.variant, s.resource, s.batch, cores=cores or None, mig=mig)
        )
    if change.new_specs or change.to_stop or change.new_dispatcher:
        actions.append(SwitchRoutes())
    for row in change.to_stop:
        actions.append(StopExecutor(row["id"], row["variant"], row["resource"], row["pid"]))
    if change.new_dispatcher and change.disp is not None:
        actions.append(StopDispatcher(change.disp["pid"], change.disp["port"]))
    return actions


# -- the change and the result -----------------------------------------------------------------
@dataclass
class Change:
    """What an apply decided to do: the plan's instances against the running ones (kept,
    started, stopped), the dispatcher, the MIG GPUs to lay out, the MPS daemon, and the
    actions that say so.

    ``kept`` rows carry the spec they serve from now on in ``_spec``.
    """

    specs: list[InstanceSpec]
    kept: list[dict[str, Any]]
    new_specs: list[InstanceSpec]
    to_stop: list[dict[str, Any]]
    new_cores: list[list[int]] = field(default_factory=list)
    disp: dict[str, Any] | None = None  # the dispatcher that runs now
    new_dispatcher: bool = False
    port: int | None = None  # the port a new dispatcher asks for
    any_port: bool = False  # another port will do when that one is taken
    policy: str = "fifo"
    mig_gpus: list[int] = field(default_factory=list)  # layouts apply changes (not mig-parted)
    needs_mps: bool = False  # the MPS control daemon must start
    variants: dict[str, Any] = field(default_factory=dict)  # variant name -> Variant record
    actions: list[Action] = field(default_factory=list)
    changed: bool = False

    def action_dicts(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.actions]


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

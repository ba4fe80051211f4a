"""Apply plans on a Ray cluster with Ray Serve (``greenctl apply --backend ray``).

Each plan version is one Serve application (namespace ``greenctl``): a deployment per planned
(variant, resource), replicas pinned by ``ray_actor_options`` (``num_cpus``, ``num_gpus``, or
``mig-<profile>``: MIG nodes declare one custom resource per profile with ``ray start
--resources`` and expose their MIG UUIDs), and a group deployment holding the plan's routes
and energy sums. A stable router application serves the Open Inference Protocol over HTTP
itself (Serve's proxy is off), routes by model straight to the active version's replicas and
exports energy and carbon at ``GET /metrics``. A new version is deployed beside the old and
switched to once RUNNING; a failed one is deleted and the old keeps serving; same replicas
apply in place. Logic: :mod:`~.ray_routes`, deployments: :mod:`~.ray_serve`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from greenctl.data import deployments
from greenctl.data.emissions import routes_carbon
from greenctl.data.errors import ExecutorError, GreenctlError, InputError
from greenctl.data.plan import Deployment, Plan, check_families
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.deploy.checks import check_address
from greenctl.executor.deploy.llm_plan import engine_tiers
from greenctl.executor.deploy.ray_routes import (
    PlanRoutes,
    ReplicaEnergy,
    RouteEntry,
    energy_spec,
)
from greenctl.executor.deploy.ray_serve import (
    REPLICA_ENV,
    ROUTER_ENV,
    VERSION_PREFIX,
    on_request_path,
    replica_ongoing,
    serve_classes,
)
from greenctl.executor.kinds import get_kind
from greenctl.executor.runtime.offers import instance_offers
from greenctl.profiler.models import builtin_variant, builtin_variants

__all__ = [
    "BACKEND",
    "NAMESPACE",
    "ROUTER_APP",
    "PlanRoutes",
    "RayApplyResult",
    "ReplicaEnergy",
    "RouteEntry",
    "actor_options",
    "apply_ray",
    "deployment_name",
    "down_ray",
    "energy_spec",
    "parse_address",
    "probe_address",
    "status_ray",
]

BACKEND = "ray"  # the backend's name (executor/deploy/backends.py)
NAMESPACE = "greenctl"
ROUTER_APP = "greenctl-router"
INSTALL_HINT = "install the Ray extra: pip install 'greenctl[ray]'"


def _ray() -> Any:
    """The ``ray`` module, Serve included (InputError saying how to install it)."""
    try:
        import ray
        from ray import serve  # noqa: F401
    except ImportError:
        raise InputError(
            "the ray backend needs Ray Serve, which is not installed", hint=INSTALL_HINT
        ) from None
    return ray


def actor_options(resource: str) -> dict[str, Any]:
    """``ray_actor_options`` that pin one replica to the resource a plan names (the
    resource-kind table says how)."""
    res = parse_resource(resource)
    return res.spec.ray_actor_options(res.size)


def deployment_name(dep: Deployment) -> str:
    """The Serve deployment of a planned (variant, resource)."""
    return f"{dep.variant}--{dep.resource.replace(':', '-')}"


@dataclass
class RayApplyResult:
    """What a Ray apply did."""

    address: str
    app: str
    url: str
    plan_id: int | None
    actions: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    changed: bool = True
    policy: str | None = None
    verify: dict[str, Any] | None = None  # apply --verify: measured against predicted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------
# apply / status / down


START_HINT = (
    "start a cluster with `ray start --head` (it prints the address to pass, host:6379), "
    "or check --address"
)
PROBE_TIMEOUT_S = 3.0  # in total: an unreachable cluster must fail fast, not hang in ray.init


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of a Ray cluster address: ``host:port`` of the head's GCS, or
    ``ray://host:port`` of a Ray Client server; ``[v6-address]:port`` for IPv6.

    Raises:
        InputError: not such an address.
    """
    text = address.strip()
    rest = text[len("ray://") :] if text.startswith("ray://") else text
    host, sep, port_text = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # [IPv6]:port
        host = host[1:-1] if re.fullmatch(r"[0-9A-Fa-f:.]+", host[1:-1]) else ""
    elif not re.fullmatch(r"[A-Za-z0-9._-]+", host):
        host = ""
    port = int(port_text) if re.fullmatch(r"[0-9]{1,5}", port_text) else -1
    if not sep or not host or not 0 < port < 65536:
        raise InputError(
            f"--address {address!r} is not a Ray cluster address",
            hint="write HOST:PORT of the head node, e.g. 127.0.0.1:6379 (or ray://HOST:10001)",
        )
    return host, port


def probe_address(address: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast when nothing listens at a Ray cluster address (a TCP connect, ``timeout_s``
    in total), instead of letting ``ray.init`` retry the GCS for minutes.

    Raises:
        InputError: a malformed address.
        ExecutorError: nothing answers there.
    """
    host, port = parse_address(address)
    deadline = time.monotonic() + timeout_s
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:  # (an IDNA label too long is a UnicodeError)
        raise ExecutorError(
            f"cannot reach the Ray cluster at {address}: host {host!r} is unknown ({exc})",
            hint=START_HINT,
        ) from None
    reason = "no address to try"
    for family, kind, proto, _name, sockaddr in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            reason = f"timed out after {timeout_s:g} s"
            break
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(left)
            try:
                sock.connect(sockaddr)
                return
            except TimeoutError:
                reason = f"timed out after {timeout_s:g} s"
            except OSError as exc:
                reason = exc.strerror or str(exc)
    raise ExecutorError(
        f"no Ray cluster answers at {address} ({reason})",
        hint=START_HINT,
    )


def _connected_to(ray: Any) -> tuple[str, int] | None:
    """(host, port) of the cluster this process's Ray is connected to, when it says."""
    try:
        return parse_address(str(ray.get_runtime_context().gcs_address))
    except Exception:  # a Ray Client connection or an older Ray: unknown
        return None


def _same_cluster(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Whether two cluster addresses name the same head: the same port, and the same host or
    two addresses of this machine (Ray may report a loopback head by the node's address)."""
    if a[1] != b[1]:
        return False
    return a[0] == b[0] or (_is_local(a[0]) and _is_local(b[0]))


def _is_local(host: str) -> bool:
    """Whether ``host`` is an address of this machine (one a socket can bind to)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((sockaddr[0], 0))
            return True
    return False


def _connect(address: str) -> Any:
    loaded = sys.modules.get("ray")
    connected = loaded is not None and loaded.is_initialized()
    if loaded is not None and connected and address not in ("auto", "local"):
        current = _connected_to(loaded)
        if current is not None and not _same_cluster(current, parse_address(address)):
            # connected to another cluster (a library caller, or a test, went before):
            # deploying there would silently serve the plan on the wrong cluster
            loaded.shutdown()
            connected = False
    if not connected and address not in ("auto", "local"):  # Ray resolves these itself, fast
        probe_address(address)  # before importing Ray: a wrong address fails in a blink
    ray = _ray()
    if not ray.is_initialized():
        try:
            # Ray's own log lines go to stderr (never stdout: --json output stays one document)
            with contextlib.redirect_stdout(sys.stderr):
                ray.init(
                    address=address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ExecutorError(
                f"cannot connect to the Ray cluster at {address}: {exc}",
                hint=START_HINT,
            ) from None
        _forget_serve_controller()
    return ray


def _forget_serve_controller() -> None:
    """Drop the Serve controller handle this process cached on a cluster it was connected to
    before. Serve keeps it across ``ray.shutdown`` and trusts it while the job id matches,
    but job ids start again at 1 on every cluster: the first driver of a second cluster
    would call the first cluster's controller ("can't find actor")."""
    context = sys.modules.get("ray.serve.context")
    if context is not None:
        with contextlib.suppress(Exception):  # a Ray without this private hook: nothing cached
            context._set_global_client(None)


def _app_name(plan: Plan) -> str:
    digest = hashlib.sha1(
        json.dumps([d.to_dict() for d in plan.deployments], sort_keys=True).encode()
    ).hexdigest()[:8]
    return f"{VERSION_PREFIX}{plan.id if plan.id is not None else 0}-{digest}"


def _variants(store: Store, plan: Plan) -> dict[str, dict[str, Any]]:
    out = {}
    for dep in plan.deployments:
        if dep.variant in out:
            continue
        try:
            v = store.get_variant(dep.variant)
        except InputError:
            v = builtin_variant(dep.variant)
        out[dep.variant] = asdict(v)
    return out


def _needs(plan: Plan) -> dict[str, float]:
    need: dict[str, float] = {}
    for dep in plan.deployments:
        opts = actor_options(dep.resource)
        for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if key in opts:
                need[name] = need.get(name, 0.0) + opts[key] * dep.count
        for key, amount in opts.get("resources", {}).items():
            need[key] = need.get(key, 0.0) + amount * dep.count
    return need


def _check_cluster(ray: Any, plan: Plan) -> None:
    """The plan must fit the cluster, and (blue/green) fit beside the version now serving."""
    need = _needs(plan)
    total = ray.cluster_resources()
    missing = [
        f"{k}: needs {v:g}, cluster has {total.get(k, 0):g}"
        for k, v in need.items()
        if v > total.get(k, 0) + 1e-9
    ]
    if missing:
        raise InputError(
            "the Ray cluster lacks resources for this plan: " + "; ".join(missing),
            hint="add nodes, or declare MIG instances with `ray start --resources '{\"mig-<profile>\": N}'`",
        )
    free = ray.available_resources()
    short = [
        f"{k}: needs {v:g}, {free.get(k, 0):g} free"
        for k, v in need.items()
        if v > free.get(k, 0) + 1e-9
    ]
    if short:
        raise InputError(
            "the new plan version does not fit beside the one serving now: " + "; ".join(short),
            hint="Ray apply is blue/green (the old version serves until the new one is ready); "
            "add capacity, or `greenctl down --backend ray` first and accept a gap in service",
        )


def _check_families(plan: Plan, store: Store) -> None:
    """The local backend's rule: each deployment's model is its variant's family."""
    known = {v.name: v.family for v in builtin_variants()}
    known.update({v.name: v.family for v in store.variants()})
    check_families(plan.deployments, known)


@dataclass
class _RayApply:
    """One apply on a Ray cluster: the plan, where it goes, how, and what it did so far."""

    plan: Plan
    store: Store
    address: str
    http_port: int
    max_wait_ms: float
    timeout_s: float
    result: RayApplyResult
    t0: float = field(default_factory=time.perf_counter)

    def record(self, app: str) -> RayApplyResult:
        """``app`` serves the plan now: recorded, and the result timed."""
        _record(
            self.store,
            self.plan,
            address=self.address,
            app=app,
            url=self.result.url,
            http_port=self.http_port,
        )
        self.result.elapsed_s = time.perf_counter() - self.t0
        return self.result


def apply_ray(
    plan: Plan,
    *,
    store: Store,
    address: str,
    http_port: int = 8000,
    max_wait_ms: float = 2.0,
    dry_run: bool = False,
    timeout_s: float = 300.0,
    policy: str | None = None,
) -> RayApplyResult:
    """Deploy ``plan`` on the Ray cluster at ``address``; roll back on failure.

    Requests are routed with ``policy`` when given, else the plan kind's
    (:meth:`~greenctl.executor.kinds.PlanKind.dispatch_policy`, as the local backend and
    ``simulate``).

    Raises:
        InputError: Ray missing, a geo plan, or the cluster lacks the plan's resources.
        ExecutorError: the deploy failed (the previous version keeps serving).
    """
    kind = get_kind(plan.kind)
    if not kind.serves:
        raise kind.refuse("apply")
    if kind.local_engines or engine_tiers(plan, store):
        raise kind.refuse_elsewhere("Ray backend")
    if not plan.deployments:
        raise InputError("the plan has no deployments")
    _check_families(plan, store)
    policy = kind.dispatch_policy(plan, policy)
    app = _app_name(plan)
    url = f"http://127.0.0.1:{http_port}"
    result = RayApplyResult(address=address, app=app, url=url, plan_id=plan.id, policy=policy)
    run = _RayApply(plan, store, address, http_port, max_wait_ms, timeout_s, result)
    for dep in plan.deployments:
        result.actions.append(
            f"deploy {deployment_name(dep)}: {dep.count} replica(s) with {actor_options(dep.resource)}"
        )
    result.actions.append(f"route requests by model with policy {policy}")
    ray = _connect(address)
    from ray import serve

    previous = _active_app(serve)  # (serve.status() reads; it starts nothing)
    if previous is not None:  # the router listens where it was started
        result.url = _router_url(serve, timeout_s=timeout_s)
    if previous == app:
        result.changed = False
        result.actions = ["the running plan version is this plan: nothing to do"]
        if not dry_run:  # it runs there already: Ray is the backend that runs the plan
            with store.transaction():
                deployments.record_backend(
                    store,
                    BACKEND,
                    plan_id=plan.id,
                    address=address,
                    options={"http_port": http_port},
                )
        return result
    order = None if previous is None else _same_replicas(store, previous, plan)
    if previous is not None and order is not None:  # the very replicas: its routes only
        return _reroute(run, serve, previous, order, dry_run=dry_run)
    _check_cluster(ray, plan)
    if dry_run:  # a dry run leaves the cluster as it was: Serve is not started or asked
        return result
    if previous is None and ROUTER_APP not in serve.status().applications:
        _check_router_port(address, http_port)
    _deploy(run, serve, previous)
    return run.record(app)


def _reroute(
    run: _RayApply, serve: Any, previous: str, order: list[int], *, dry_run: bool
) -> RayApplyResult:
    """Re-apply the routes of the version serving, whose replicas ``plan`` keeps: quotas,
    policy, offers and grid intensity; no replica restarts."""
    result, policy = run.result, run.result.policy
    result.app = previous
    result.actions = [
        f"re-apply the routes of {previous} (the same replicas): quotas, policy {policy}, "
        f"offers and grid intensity"
    ]
    if dry_run:
        return result
    variants = _variants(run.store, run.plan)
    routes = _plan_routes(run.store, run.plan, variants, max_wait_ms=run.max_wait_ms, order=order)
    doc = {"routes": routes, "policy": policy, **_plan_config(run.plan)}
    try:
        handle = serve.get_app_handle(previous)
        result.changed = bool(handle.configure.remote(doc).result(timeout_s=run.timeout_s))
        # the router routes with the version's routes: it reads them again
        serve.get_app_handle(ROUTER_APP).switch.remote(previous).result(timeout_s=run.timeout_s)
    except Exception as exc:
        raise ExecutorError(
            f"re-applying the routes of {previous} on Ray failed: {exc}",
            hint="it keeps serving with its routes as they were",
        ) from None
    return run.record(previous)


def _deploy(run: _RayApply, serve: Any, previous: str | None) -> None:
    """Deploy the plan as a new version beside ``previous``, wait until it runs, switch the
    router to it and delete ``previous`` (blue/green); a version that fails is deleted.

    Raises:
        ExecutorError: the new version did not run (``previous`` keeps serving).
    """
    plan, store, result = run.plan, run.store, run.result
    app = result.app
    serve.start(proxy_location="Disabled")  # the router serves HTTP itself
    replica_cls, group_cls, router_cls = serve_classes()
    variants = _variants(store, plan)
    handles = [
        replica_cls.options(
            name=deployment_name(dep),
            num_replicas=dep.count,
            max_ongoing_requests=replica_ongoing(dep.batch),
            ray_actor_options=on_request_path(actor_options(dep.resource), REPLICA_ENV),
        ).bind(variants[dep.variant], dep.batch, run.max_wait_ms, energy_spec(store, plan, dep))
        for dep in plan.deployments
    ]
    routes = _plan_routes(store, plan, variants, max_wait_ms=run.max_wait_ms)
    try:
        serve.run(
            group_cls.bind(routes, result.policy, _plan_config(plan), *handles),
            name=app,
            route_prefix=None,
            blocking=False,
        )
        _wait_running(serve, app, timeout_s=run.timeout_s)
    except Exception as exc:
        try:
            serve.delete(app)
        finally:
            result.actions.append(
                f"rolled back: deleted {app}; {previous or 'nothing'} keeps serving"
            )
        raise ExecutorError(
            f"deploying the plan on Ray failed: {exc}",
            hint=f"the previous version ({previous or 'none'}) keeps serving; see `ray status` and the Serve logs",
        ) from None
    try:
        _start_router(run, serve, router_cls)
    except Exception as exc:
        serve.delete(app)
        result.actions.append(f"rolled back: deleted {app}; {previous or 'nothing'} keeps serving")
        raise ExecutorError(
            f"starting the Ray router on 127.0.0.1:{run.http_port} failed: {exc}",
            hint="is the port taken? pass another --ray-http-port",
        ) from None
    serve.get_app_handle(ROUTER_APP).switch.remote(app).result(timeout_s=run.timeout_s)
    if previous:
        serve.delete(previous)
        result.actions.append(f"deleted previous version {previous}")


def _start_router(run: _RayApply, serve: Any, router_cls: Any) -> None:
    """The stable endpoint, started once: the router replica serves HTTP on loopback at the
    apply's port, on this node; the result's URL is where it listens."""
    if ROUTER_APP not in serve.status().applications:
        import ray

        options = on_request_path({"num_cpus": 0}, ROUTER_ENV)
        here = ray.get_runtime_context().get_node_id()
        ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == here), None)
        if ip is not None:  # pinned where 127.0.0.1 means this machine
            options["resources"] = {f"node:{ip}": 0.001}
        bound = router_cls.options(ray_actor_options=options).bind("127.0.0.1", run.http_port)
        serve.run(bound, name=ROUTER_APP, route_prefix=None, blocking=False)
        try:
            _wait_running(serve, ROUTER_APP, timeout_s=run.timeout_s)
        except ExecutorError:
            serve.delete(ROUTER_APP)
            raise
    run.result.url = _router_url(serve, timeout_s=run.timeout_s)


def _router_url(serve: Any, *, timeout_s: float) -> str:
    """Where the running router listens."""
    port = serve.get_app_handle(ROUTER_APP).address.remote().result(timeout_s=timeout_s)
    return f"http://127.0.0.1:{port}"


def _check_router_port(address: str, http_port: int) -> None:
    """The router will listen on ``127.0.0.1:http_port`` of this machine: refused before
    anything is deployed when the port is taken (a Ray Client's router runs elsewhere).

    Raises:
        InputError: naming ``--ray-http-port``.
    """
    if not address.startswith("ray://"):
        check_address("127.0.0.1", http_port, option="--ray-http-port")


def _plan_routes(
    store: Store,
    plan: Plan,
    variants: dict[str, dict[str, Any]],
    *,
    max_wait_ms: float,
    order: list[int] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The group's routes of ``plan`` (:class:`PlanRoutes`): per model, each deployment's
    handle index (its position in the plan, or in ``order``: the version it is applied to),
    quota and model-less offer (:func:`greenctl.executor.runtime.offers.instance_offers`, without a
    serving path: the Ray path is not measured)."""
    keys = {(d.variant, d.resource, d.batch) for d in plan.deployments}
    offers = instance_offers(store, plan, keys, max_wait_ms=max_wait_ms, serving_path=None)
    routes: dict[str, list[dict[str, Any]]] = {}
    for i, dep in enumerate(plan.deployments):
        routes.setdefault(dep.model, []).append(
            {
                "handle_index": i if order is None else order[i],
                "variant": dep.variant,
                "resource": dep.resource,
                "input_shape": [
                    int(x) for x in str(variants[dep.variant]["input_shape"] or "").split(",") if x
                ],
                "replicas": dep.count,
                "batch": dep.batch,
                "weight": float(dep.quota_rps if dep.quota_rps is not None else dep.count),
                "offer": offers[(dep.variant, dep.resource, dep.batch)].to_dict(),
            }
        )
    return routes


def _plan_config(plan: Plan) -> dict[str, Any]:
    """What model-less requests prefer (the plan's objective) and the grid intensity its
    carbon is counted with (:func:`greenctl.data.emissions.routes_carbon`, as the local
    dispatcher's table carries it)."""
    prefer = "carbon" if get_kind(plan.kind).carbon_aware(plan) else "cost"
    return {"prefer": prefer, "carbon": routes_carbon(plan)}


def _same_replicas(store: Store, app: str, plan: Plan) -> list[int] | None:
    """When ``plan`` runs the very replicas of ``app`` (the version serving, as the store
    records it: same models, variants, resources, batches and counts), each of its
    deployments' position in that version's plan; else None."""
    row = deployments.active_ray_app(store)
    if row is None or row["app"] != app or row["plan_id"] is None:
        return None
    try:
        running = store.get_plan(int(row["plan_id"]))
    except GreenctlError:
        return None

    def key(d: Deployment) -> tuple[str, str, str, int, int]:
        return (d.model, d.variant, d.resource, d.batch, d.count)

    free: dict[tuple[str, str, str, int, int], list[int]] = {}
    for i, d in enumerate(running.deployments):
        free.setdefault(key(d), []).append(i)
    order = []
    for d in plan.deployments:
        slots = free.get(key(d))
        if not slots:
            return None
        order.append(slots.pop(0))
    return order if not any(free.values()) else None


def _wait_running(serve: Any, app: str, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = serve.status().applications.get(app)
        state = str(getattr(status, "status", ""))
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED") or state.endswith("UNHEALTHY"):
            raise ExecutorError(
                f"application {app} is {state.rsplit('.', 1)[-1]}: {getattr(status, 'message', '')}"
            )
        time.sleep(0.5)
    raise ExecutorError(f"application {app} was not running after {timeout_s:.0f} s")


def _active_app(serve: Any) -> str | None:
    if ROUTER_APP not in serve.status().applications:
        return None
    return serve.get_app_handle(ROUTER_APP).active.remote().result(timeout_s=30)  # type: ignore[no-any-return]


def _record(store: Store, plan: Plan, *, address: str, app: str, url: str, http_port: int) -> None:
    """``app`` is the active version, and Ray the backend that runs the plan."""
    with store.transaction():
        deployments.record_ray_app(store, plan_id=plan.id, address=address, app=app, url=url)
        deployments.record_backend(
            store, BACKEND, plan_id=plan.id, address=address, options={"http_port": http_port}
        )


def status_ray(*, store: Store, address: str | None = None) -> dict[str, Any]:
    """The active Ray deployment: router URL and each deployment's replica states.

    ``running`` says whether the application greenctl last applied is on the cluster;
    ``state`` and ``problems`` say what the local backend's status says
    (:func:`greenctl.executor.deploy.status.status`): ``idle`` (nothing applied), ``down``
    (the application is gone), ``degraded`` (a deployment has no running replica) or
    ``serving``, and why in words.

    Raises:
        InputError: a malformed address.
        ExecutorError: the cluster (``address``, else the one recorded) does not answer.
    """
    row = deployments.active_ray_app(store)
    if row is None:
        if address is not None:  # nothing recorded: still say whether the cluster answers
            _connect(address)
        return {
            "backend": "ray",
            "state": "idle",
            "problems": [],
            "address": address,
            "plan_id": None,
            "app": None,
            "running": False,
            "dispatcher": None,
            "instances": [],
        }
    _connect(address or row["address"])
    from ray import serve

    status = serve.status().applications.get(row["app"])
    instances = []
    if status is not None:
        for name, dep in status.deployments.items():
            if "--" not in name:
                continue
            variant, resource = name.split("--", 1)
            counts = {str(k).rsplit(".", 1)[-1]: v for k, v in (dep.replica_states or {}).items()}
            instances.append(
                {
                    "variant": variant,
                    "resource": resource.replace("-", ":", 1),
                    "replicas": counts,
                    "ready": counts.get("RUNNING", 0) > 0,
                    "status": str(dep.status).rsplit(".", 1)[-1],
                }
            )
    problems = [
        f"deployment {i['variant']} on {i['resource']} has no running replica ({i['status']})"
        for i in instances
        if not i["ready"]
    ]
    if status is None:
        problems = [f"Ray application {row['app']} is not on the cluster at {row['address']}"]
    return {
        "backend": "ray",
        "state": "down" if status is None else ("degraded" if problems else "serving"),
        "problems": problems,
        "address": row["address"],
        "plan_id": row["plan_id"],
        "app": row["app"],
        "running": status is not None,
        "dispatcher": {"url": row["url"]},
        "instances": instances,
    }


def down_ray(*, store: Store, address: str | None = None) -> list[str]:
    """Delete every greenctl Serve application on the cluster; returns what was deleted."""
    last = deployments.last_ray_app(store)
    addr = address or (last["address"] if last else None)
    if addr is None:
        return []
    _connect(addr)
    from ray import serve

    deleted = []
    for app in list(serve.status().applications):
        if app.startswith("greenctl-"):
            serve.delete(app)
            deleted.append(app)
    with store.transaction():
        deployments.deactivate_ray_apps(store)
        deployments.stop_backend(store, BACKEND)
    return deleted

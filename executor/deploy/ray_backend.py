"""Apply plans on a Ray cluster with Ray Serve (``greenctl apply --backend ray``).

Layout on the cluster (namespace ``greenctl``):

- one Serve *application per applied plan version* (``greenctl-p<plan id>-<digest>``): a
  deployment per planned (variant, resource) whose replicas are the plan's instances, pinned
  by ``ray_actor_options`` (``num_cpus`` for ``cpu:N``, ``num_gpus`` for a whole GPU or an MPS
  share, a custom resource ``mig-<profile>`` for a MIG instance), plus a small per-version
  group deployment that routes by model name with the plan's policy;
- one stable *router* application on the HTTP route ``/`` speaking the Open Inference
  Protocol (KServe v2 REST), which forwards to the active plan version.

Applying deploys the new version beside the old one, waits until it is RUNNING, then
switches the router and deletes the old version; a version that fails to deploy is deleted
and the router keeps serving the previous one (the same rollback promise as local apply).
A plan with the very replicas of the version serving (a replan that keeps the configuration
at a new grid intensity) is applied in place instead: the version's routes (quotas, policy,
offers, preference, grid intensity) are re-applied, as the local dispatcher's routing table
is, and no replica restarts.

Energy and carbon (issue 19): each replica counts its energy with the executors' counter
(:func:`greenctl.profiler.energy.serving_counter`: NVML on GPUs, RAPL on CPUs where readable,
else the profile's figures) and reports it to its version's group deployment every
:func:`~greenctl.executor.runtime.dispatcher.energy_scrape_s` seconds; the group sums the increases
per model and counts their carbon at the plan's grid intensity (:class:`PlanRoutes`), and the
router exports them at ``GET /metrics`` as the local dispatcher does
(``greenctl_energy_joules_total``, ``greenctl_carbon_grams_total`` by model and source,
``greenctl_grid_intensity_grams_per_kwh``). A new plan version starts its sums from zero (a
counter reset, which Prometheus's ``increase()`` counts).

Model-less requests (issue 19, INFaaS): the router reads a request's ``latency_slo_ms`` and
``min_accuracy`` as the local dispatcher does, and the group picks the variant with
:func:`greenctl.planner.core.choice.choose` over each deployment's offer
(:mod:`greenctl.executor.runtime.offers`, without a serving path: the Ray path is not measured) and
its replicas' requests in flight; ``/v2/models/{variant}/infer`` routes to that variant.

Declaring MIG instances to Ray: start each node with one custom resource per MIG profile and
make the node's MIG UUIDs visible to its workers, for example::

    CUDA_VISIBLE_DEVICES=MIG-<uuid1>,MIG-<uuid2> ray start --address HEAD:6379 \\
        --resources '{"mig-3g.40gb": 1, "mig-1g.10gb": 1}'

Ray is an optional extra: ``pip install 'greenctl[ray]'``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from greenctl.data import deployments
from greenctl.data.errors import ExecutorError, GreenctlError, InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Variant
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.kinds import get_kind

BACKEND = "ray"  # the backend's name (executor/deploy/backends.py)
NAMESPACE = "greenctl"
ROUTER_APP = "greenctl-router"
INSTALL_HINT = "install the Ray extra: pip install 'greenctl[ray]'"


def _ray() -> Any:
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
# What a plan version's group and replicas do, in plain Python (no Ray: unit-testable)


class RouteEntry:
    """One deployment of a plan version, as its group routes to it: its replicas share one
    Serve handle, so the requests in flight are counted for the deployment, and per replica
    (``inflight``, what :func:`~greenctl.planner.core.choice.choose` reads) as Serve
    spreads them."""

    up = True  # Serve restarts failed replicas; a deployment is routed to while it runs

    def __init__(self, doc: dict[str, Any]) -> None:
        from greenctl.planner.core.choice import Offer

        self.index = int(doc["handle_index"])
        self.variant = str(doc["variant"])
        self.resource = str(doc.get("resource") or "")
        self.input_shape = list(doc.get("input_shape") or [])
        self.replicas = max(int(doc.get("replicas") or 1), 1)
        self.weight = float(doc.get("weight") or 1.0)  # a zero quota counts as one
        offer = doc.get("offer")
        self.offer = Offer(self.variant) if offer is None else Offer.from_dict(self.variant, offer)
        self.total = 0
        self.inflight = 0

    def take(self) -> None:
        self.total += 1
        self.inflight = self.total // self.replicas

    def give(self) -> None:
        self.total = max(self.total - 1, 0)
        self.inflight = self.total // self.replicas


class PlanRoutes:
    """A plan version's routing and energy sums (the Serve group deployment holds one).

    Args:
        routes: per model, its deployments (``handle_index``, ``variant``, ``resource``,
            ``input_shape``, ``replicas``, ``weight``, and ``offer`` for model-less requests).
        policy: how requests without requirements are routed: ``wrr`` by quota, else to the
            deployment with the fewest requests in flight per replica.
        prefer: ``carbon`` or ``cost``, what model-less requests prefer (the plan's objective).
        carbon: ``{"carbon_g_per_kwh": G, "pue": P}``, the grid intensity carbon is counted
            with (None: none).
        clock: seconds, to forget replicas that stopped reporting.
    """

    #: a replica silent for this many report intervals is forgotten (its sums stay)
    STALE_REPORTS = 10

    def __init__(
        self,
        routes: dict[str, list[dict[str, Any]]],
        policy: str,
        *,
        prefer: str | None = None,
        carbon: dict[str, float] | None = None,
        interval_s: float = 2.0,
        clock: Any = time.monotonic,
    ) -> None:
        from greenctl.executor.runtime.metrics import IncreaseSum

        self.entries = {m: [RouteEntry(e) for e in es] for m, es in routes.items()}
        self.by_variant: dict[str, list[RouteEntry]] = {}
        for es in self.entries.values():
            for e in es:
                self.by_variant.setdefault(e.variant, []).append(e)
        self.policy = policy
        self.prefer = prefer
        self.carbon = carbon
        self.interval_s = interval_s
        self._clock = clock
        self.energy = IncreaseSum()
        self.seen: dict[str, float] = {}  # replica -> when it last reported
        self.silent: dict[str, str] = {}  # replica -> why it counts no energy
        self._rank()

    def _rank(self) -> None:
        from greenctl.planner.core.policy import SmoothWRR

        self.wrr = {m: SmoothWRR([e.weight for e in es]) for m, es in self.entries.items()}
        prefer = self.prefer or "cost"
        self.candidates = {
            m: [(e.offer, [e]) for e in sorted(es, key=lambda e: (e.offer.rank(prefer), e.variant))]
            for m, es in self.entries.items()
        }

    def models(self) -> dict[str, Any]:
        return {
            m: [
                {"variant": e.variant, "weight": e.weight, "input_shape": e.input_shape} for e in es
            ]
            for m, es in self.entries.items()
        }

    def configure(self, doc: dict[str, Any]) -> bool:
        """Re-apply the routes of the same deployments (a plan with the very replicas of this
        version): quotas, offers, ``policy``, ``prefer`` and ``carbon``. Returns whether
        anything changed. Raises ValueError for a document of other deployments."""
        routes = doc.get("routes") or {}
        fresh = {m: [RouteEntry(e) for e in es] for m, es in routes.items()}

        def shape(table: dict[str, list[RouteEntry]]) -> list[tuple[str, int, str, int]]:
            return sorted(
                (m, e.index, e.variant, e.replicas) for m, es in table.items() for e in es
            )

        if shape(fresh) != shape(self.entries):
            raise ValueError("the routes name other deployments than this plan version's")
        changed = False
        for m, es in fresh.items():
            for old, new in zip(
                sorted(self.entries[m], key=lambda e: e.index),
                sorted(es, key=lambda e: e.index),
                strict=True,
            ):
                if (old.weight, old.offer) != (new.weight, new.offer):
                    old.weight, old.offer = new.weight, new.offer
                    changed = True
        for key in ("policy", "prefer", "carbon"):
            if key in doc and doc[key] != getattr(self, key):
                setattr(self, key, doc[key])
                changed = True
        self._rank()
        return changed

    def pick(self, model: str, variant: str | None = None, req: Any = None) -> RouteEntry:
        """The deployment a request goes to: by the policy, or, for a model-less request (or
        one naming ``variant``), the preferred variant that meets ``req``
        (:func:`~greenctl.planner.core.choice.choose`).

        Raises:
            KeyError: an unknown model or variant.
            NoVariant: no deployment meets ``req`` (names the closest).
        """
        from greenctl.executor.runtime.dispatcher import NoVariant
        from greenctl.planner.core.choice import Requirements, choose, closest

        if variant is None and req is None:
            entries = self.entries[model]
            if self.policy == "wrr":  # smooth weighted round robin by quota (InfAdapter)
                return entries[self.wrr[model].pick() or 0]
            # fifo / batch: the deployment with the fewest requests in flight per replica
            return min(entries, key=lambda e: e.total / e.replicas)
        if variant is not None:
            cands = [(e.offer, [e]) for e in self.by_variant[variant]]
        else:
            cands = self.candidates[model]
        want = req if req is not None else Requirements()
        got = choose(cands, want)
        if got is None:
            near = closest(cands, want)
            assert near is not None  # every deployment counts as up
            raise NoVariant(variant or model, want, *near)
        entry = got[1]
        assert isinstance(entry, RouteEntry)
        return entry

    def report(self, doc: dict[str, Any]) -> None:
        """A replica's energy report (:meth:`ReplicaEnergy.report`): the increase of its
        counter since its last report is added to its model's energy, and its carbon at the
        grid intensity in force now."""
        from greenctl.executor.runtime.metrics import CARBON_TOTAL, ENERGY_TOTAL, carbon_g

        replica = str(doc["replica"])
        now = self._clock()
        self.seen[replica] = now
        if doc.get("joules") is None:
            self.silent[replica] = f"{doc.get('variant')}: {doc.get('why') or 'no energy source'}"
        else:
            self.silent.pop(replica, None)
            model, source = str(doc["model"]), str(doc.get("source") or "unknown")
            into = (ENERGY_TOTAL, model, source)
            before = self.energy.totals.get(into, 0.0)
            self.energy.observe((replica, ENERGY_TOTAL), float(doc["joules"]), into)
            grown = self.energy.totals[into] - before
            if self.carbon is not None:
                key = (CARBON_TOTAL, model, source)
                grams = carbon_g(grown, self.carbon["carbon_g_per_kwh"], self.carbon["pue"])
                self.energy.totals[key] = self.energy.totals.get(key, 0.0) + grams
        gone = now - self.STALE_REPORTS * self.interval_s
        for r in [r for r, t in self.seen.items() if t < gone]:
            del self.seen[r]
            self.silent.pop(r, None)
        self.energy.keep(lambda series: isinstance(series, tuple) and series[0] in self.seen)

    def metrics_text(self) -> str:
        """The energy and carbon series of this version, as the local dispatcher exports
        them (:func:`~greenctl.executor.runtime.metrics.model_energy_lines`)."""
        from greenctl.executor.runtime.metrics import model_energy_lines

        lines = model_energy_lines(
            self.energy.totals, None if self.carbon is None else self.carbon["carbon_g_per_kwh"]
        )
        lines += [
            f"# greenctl: replica {r} counts no energy: {why}"
            for r, why in sorted(self.silent.items())
        ]
        return "\n".join(lines) + "\n"


class ReplicaEnergy:
    """A replica's energy counter (the executors': :func:`greenctl.profiler.energy.
    serving_counter` and :class:`~greenctl.executor.runtime.metrics.EnergyExport`'s power sampler),
    fed with the replica's busy time and rows served.

    Args:
        spec: ``model``, ``variant``, ``resource`` and the profile's figures for a modeled
            source (``busy_w``, ``idle_w``, ``energy_j_per_request``; see
            :func:`energy_spec`).
        env: the environment the device is named in (default the process's).
    """

    def __init__(self, spec: dict[str, Any], *, env: dict[str, str] | None = None) -> None:
        import os

        from greenctl.executor.runtime.metrics import EnergyExport
        from greenctl.profiler.energy import serving_counter

        self.spec = spec
        self.busy_s = 0.0
        self.rows = 0
        cores = parse_resource(spec["resource"]).cpu_cores or 0
        counter, notes = serving_counter(
            spec["resource"],
            cores=int(cores),
            env=dict(os.environ) if env is None else env,
            busy_s=lambda: self.busy_s,
            requests=lambda: self.rows,
            busy_w=spec.get("busy_w"),
            idle_w=spec.get("idle_w"),
            energy_j_per_request=spec.get("energy_j_per_request"),
        )
        self.export = EnergyExport(counter, notes=notes)

    def ran(self, seconds: float, rows: int) -> None:
        """A batch of ``rows`` ran for ``seconds``."""
        self.busy_s += max(seconds, 0.0)
        self.rows += rows

    def report(self, replica: str) -> dict[str, Any]:
        """What the group sums (:meth:`PlanRoutes.report`); ``joules`` None, with ``why``,
        when nothing can say."""
        doc: dict[str, Any] = {
            "replica": replica,
            "model": self.spec["model"],
            "variant": self.spec["variant"],
            "resource": self.spec["resource"],
        }
        counter = self.export.counter
        if counter is None:
            return {**doc, "joules": None, "why": "; ".join(self.export.notes)}
        self.export.sample()
        return {
            **doc,
            "source": str(counter.source),
            "joules": float(counter.joules()),
            "power_w": self.export.power_w,
        }


def energy_spec(store: Store, plan: Plan, dep: Deployment) -> dict[str, Any]:
    """A deployment's :class:`ReplicaEnergy` spec: the figures a local executor of it gets
    (:func:`greenctl.data.emissions.executor_energy_args`, the one rule)."""
    from greenctl.data.emissions import executor_energy_args

    args = executor_energy_args(
        store, plan, variant=dep.variant, resource=dep.resource, batch=dep.batch
    )
    flags = dict(zip(args[::2], args[1::2], strict=True))
    spec: dict[str, Any] = {"model": dep.model, "variant": dep.variant, "resource": dep.resource}
    for flag, key in (
        ("--power-w", "busy_w"),
        ("--idle-power-w", "idle_w"),
        ("--energy-j-per-request", "energy_j_per_request"),
    ):
        if flag in flags:
            spec[key] = float(flags[flag])
    return spec


# --------------------------------------------------------------------------------------
# Serve deployments (defined lazily so importing this module never needs Ray)


def _serve_classes() -> tuple[Any, Any, Any]:
    from ray import serve

    @serve.deployment
    class Replica:
        """One planned instance: loads the variant, runs dynamically batched inference, and
        reports its energy to its version's group (:class:`ReplicaEnergy`)."""

        def __init__(
            self,
            variant: dict[str, Any],
            batch: int,
            max_wait_ms: float,
            energy: dict[str, Any] | None = None,
        ) -> None:
            from greenctl.profiler.models import load_model

            self.loaded = load_model(Variant(**variant))
            self.variant = variant["name"]
            self.infer_batch.set_max_batch_size(max(1, batch))  # type: ignore[attr-defined]
            self.infer_batch.set_batch_wait_timeout_s(max_wait_ms / 1000.0)  # type: ignore[attr-defined]
            self.loaded.run(self.loaded.example(1))  # warm-up
            self.energy = ReplicaEnergy(energy) if energy is not None else None
            if self.energy is not None:
                self._report_energy()

        def _report_energy(self) -> None:
            """Report the energy counter to the group every scrape interval (a thread: its
            blocking handle calls stay off the replica's event loop)."""
            import threading

            from greenctl.executor.runtime.dispatcher import ENERGY_SCRAPE_S, energy_scrape_s
            from ray import serve as _serve

            ctx = _serve.get_replica_context()
            replica = str(getattr(ctx, "replica_id", None) or getattr(ctx, "replica_tag", ""))
            interval = energy_scrape_s() or ENERGY_SCRAPE_S  # (0 turns the dispatcher's off)
            energy = self.energy
            assert energy is not None

            def loop() -> None:
                group = None
                while True:
                    time.sleep(interval)
                    try:  # the group may not be deployed yet, or be restarting
                        if group is None:
                            group = _serve.get_app_handle(ctx.app_name)
                        group.report.remote(energy.report(replica)).result(
                            timeout_s=max(5 * interval, 5.0)
                        )
                    except Exception:
                        group = None

            threading.Thread(target=loop, name="greenctl-energy", daemon=True).start()

        @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.002)
        async def infer_batch(self, inputs: list[Any]) -> list[Any]:
            import numpy as np
            import torch

            counts = [len(x) for x in inputs]
            x = torch.from_numpy(np.concatenate(inputs).astype(np.float32))
            t0 = time.perf_counter()
            out = self.loaded.run(x).cpu().numpy()
            if self.energy is not None:
                self.energy.ran(time.perf_counter() - t0, sum(counts))
            parts, start = [], 0
            for n in counts:
                parts.append(out[start : start + n])
                start += n
            return parts

        async def infer(self, rows: Any) -> tuple[str, Any]:
            return self.variant, await self.infer_batch(rows)

        def input_shape(self) -> list[int]:
            return list(self.loaded.input_shape)

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class Group:
        """One plan version's routing (:class:`PlanRoutes`): by model with the plan's policy,
        model-less requests by their requirements; and its replicas' energy sums."""

        def __init__(
            self,
            routes: dict[str, list[dict[str, Any]]],
            policy: str,
            config: dict[str, Any],
            *handles: Any,
        ) -> None:
            from greenctl.executor.runtime.dispatcher import ENERGY_SCRAPE_S, energy_scrape_s

            self.table = PlanRoutes(
                routes,
                policy,
                prefer=config.get("prefer"),
                carbon=config.get("carbon"),
                interval_s=energy_scrape_s() or ENERGY_SCRAPE_S,
            )
            self.handles = handles

        def models(self) -> dict[str, Any]:
            return self.table.models()

        def configure(self, doc: dict[str, Any]) -> bool:
            return self.table.configure(doc)

        def report(self, doc: dict[str, Any]) -> None:
            self.table.report(doc)

        def metrics(self) -> str:
            return self.table.metrics_text()

        async def route(
            self, model: str, rows: Any, variant: str | None = None, req: Any = None
        ) -> tuple[int, str | None, Any]:
            """``(200, variant, outputs)``, or ``(status, None, error document)``."""
            from greenctl.executor.runtime.dispatcher import NoVariant

            try:
                entry = self.table.pick(model, variant, req)
            except KeyError:
                return 404, None, {"error": f"unknown model '{variant or model}'"}
            except NoVariant as none:
                return 422, None, none.doc()
            entry.take()
            try:
                served, out = await self.handles[entry.index].infer.remote(rows)
            finally:
                entry.give()
            return 200, served, out

        async def infer(self, model: str, rows: Any) -> tuple[str, Any]:
            code, variant, out = await self.route(model, rows)
            if code != 200:
                raise KeyError(model)
            return variant or "", out

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class Router:
        """The stable Open Inference Protocol endpoint; forwards to the active plan version."""

        def __init__(self) -> None:
            self.app: str | None = None
            self.models: dict[str, Any] = {}
            self.variant_of: dict[str, str] = {}  # a variant's name -> its model

        async def switch(self, app: str) -> dict[str, Any]:
            from ray import serve as _serve

            handle = _serve.get_app_handle(app)
            self.models = await handle.models.remote()
            self.variant_of = {
                e["variant"]: m for m, es in self.models.items() for e in es if e["variant"] != m
            }
            self.app = app
            return self.models

        def active(self) -> str | None:
            return self.app

        async def __call__(self, request: Any) -> Any:
            from starlette.responses import JSONResponse

            path = request.url.path.rstrip("/")
            parts = path.split("/")
            if path in ("/v2/health/live",):
                return JSONResponse({"live": True})
            if path == "/v2/health/ready":
                return JSONResponse(
                    {"ready": self.app is not None}, status_code=200 if self.app else 503
                )
            if path == "/v2":
                return JSONResponse({"name": "greenctl", "version": "1", "extensions": []})
            if path == "/metrics" and request.method == "GET":
                return await self._metrics()
            if len(parts) >= 4 and parts[1] == "v2" and parts[2] == "models":
                model = parts[3]
                if model in self.variant_of and len(parts) == 5 and parts[4] == "ready":
                    return JSONResponse({"name": model, "ready": True})
                named = model in self.variant_of and len(parts) == 5 and parts[4] == "infer"
                if named and request.method == "POST":  # a variant's own name: it alone
                    return await self._infer(self.variant_of[model], request, variant=model)
                if model not in self.models:
                    return JSONResponse({"error": f"unknown model '{model}'"}, status_code=404)
                if len(parts) == 4 and request.method == "GET":
                    return JSONResponse(
                        {
                            "name": model,
                            "versions": ["1"],
                            "platform": "greenctl-ray",
                            "variants": self.models[model],
                            "inputs": [
                                {
                                    "name": "input0",
                                    "datatype": "FP32",
                                    "shape": [-1, *self.models[model][0]["input_shape"]],
                                }
                            ],
                            "outputs": [{"name": "output0", "datatype": "FP32", "shape": [-1, -1]}],
                        }
                    )
                if len(parts) == 5 and parts[4] == "ready":
                    return JSONResponse({"name": model, "ready": True})
                if len(parts) == 5 and parts[4] == "infer" and request.method == "POST":
                    return await self._infer(model, request)
            return JSONResponse({"error": f"no route {request.method} {path}"}, status_code=404)

        async def _metrics(self) -> Any:
            """The active version's energy and carbon series (:class:`PlanRoutes`)."""
            from ray import serve as _serve
            from starlette.responses import Response

            text = "# greenctl: no plan version is active\n"
            if self.app is not None:
                text = await _serve.get_app_handle(self.app).metrics.remote()
            return Response(text, media_type="text/plain; version=0.0.4")

        async def _infer(self, model: str, request: Any, *, variant: str | None = None) -> Any:
            import json

            from greenctl.data.errors import InputError as _InputError
            from greenctl.executor.runtime.dispatcher import VARIANT_HEADER, requirements_of
            from greenctl.executor.runtime.oip import HEADER_LENGTH, decode_request, encode_response
            from ray import serve as _serve
            from starlette.responses import JSONResponse, Response

            header = request.headers.get(HEADER_LENGTH)
            raw = await request.body()
            try:
                req = requirements_of(raw, header)  # as the local dispatcher reads them
            except _InputError as exc:
                return JSONResponse({"error": exc.message}, status_code=400)
            try:
                doc, tensors = decode_request(raw, int(header) if header else None)
            except (_InputError, ValueError) as exc:
                return JSONResponse({"error": f"bad inference request: {exc}"}, status_code=400)
            assert self.app is not None
            rows = tensors[0][1].astype("float32")
            code, served, out = await _serve.get_app_handle(self.app).route.remote(
                model, rows, variant, req
            )
            if code != 200:
                return JSONResponse(out, status_code=code)
            body, headers = encode_response(
                variant or model, [("output0", out)], request=doc, model_version=served
            )
            if req is not None or variant is not None:  # say which variant served it
                n = int(headers.get(HEADER_LENGTH) or len(body))
                head = json.loads(body[:n])
                head["parameters"] = {"variant": served}
                new = json.dumps(head, separators=(",", ":")).encode()
                body = new + body[n:]
                if HEADER_LENGTH in headers:
                    headers[HEADER_LENGTH] = str(len(new))
            headers[VARIANT_HEADER] = str(served)
            return Response(body, headers=headers)

    return Replica, Group, Router


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
    import socket

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


def _connect(address: str) -> Any:
    loaded = sys.modules.get("ray")
    connected = loaded is not None and loaded.is_initialized()
    if loaded is not None and connected and address not in ("auto", "local"):
        current = _connected_to(loaded)
        if current is not None and current != parse_address(address):
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
    return ray


def _app_name(plan: Plan) -> str:
    digest = hashlib.sha1(
        json.dumps([d.to_dict() for d in plan.deployments], sort_keys=True).encode()
    ).hexdigest()[:8]
    return f"greenctl-p{plan.id if plan.id is not None else 0}-{digest}"


def _variants(store: Store, plan: Plan) -> dict[str, dict[str, Any]]:
    from greenctl.profiler.models import builtin_variant

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
    from greenctl.data.plan import check_families
    from greenctl.profiler.models import builtin_variants

    known = {v.name: v.family for v in builtin_variants()}
    known.update({v.name: v.family for v in store.variants()})
    check_families(plan.deployments, known)


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
    if not plan.deployments:
        raise InputError("the plan has no deployments")
    _check_families(plan, store)
    policy = kind.dispatch_policy(plan, policy)
    t0 = time.perf_counter()
    app = _app_name(plan)
    url = f"http://127.0.0.1:{http_port}"
    result = RayApplyResult(address=address, app=app, url=url, plan_id=plan.id, policy=policy)
    for dep in plan.deployments:
        result.actions.append(
            f"deploy {deployment_name(dep)}: {dep.count} replica(s) with {actor_options(dep.resource)}"
        )
    result.actions.append(f"route requests by model with policy {policy}")
    ray = _connect(address)
    from ray import serve

    previous = _active_app(serve)  # (serve.status() reads; it starts nothing)
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
    if order is not None:  # the very replicas of the version serving: its routes only
        assert previous is not None
        result.app = previous
        result.actions = [
            f"re-apply the routes of {previous} (the same replicas): quotas, policy {policy}, "
            f"offers and grid intensity"
        ]
        if dry_run:
            return result
        variants = _variants(store, plan)
        doc = {
            "routes": _plan_routes(store, plan, variants, max_wait_ms=max_wait_ms, order=order),
            "policy": policy,
            **_plan_config(plan),
        }
        try:
            result.changed = bool(
                serve.get_app_handle(previous).configure.remote(doc).result(timeout_s=timeout_s)
            )
        except Exception as exc:
            raise ExecutorError(
                f"re-applying the routes of {previous} on Ray failed: {exc}",
                hint="it keeps serving with its routes as they were",
            ) from None
        _record(store, plan, address=address, app=previous, url=url, http_port=http_port)
        result.elapsed_s = time.perf_counter() - t0
        return result
    _check_cluster(ray, plan)
    if dry_run:  # a dry run leaves the cluster as it was: Serve is not started
        return result
    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    replica_cls, group_cls, router_cls = _serve_classes()
    variants = _variants(store, plan)
    handles: list[Any] = []
    for dep in plan.deployments:
        handles.append(
            replica_cls.options(
                name=deployment_name(dep),
                num_replicas=dep.count,
                ray_actor_options=actor_options(dep.resource),
            ).bind(variants[dep.variant], dep.batch, max_wait_ms, energy_spec(store, plan, dep))
        )
    routes = _plan_routes(store, plan, variants, max_wait_ms=max_wait_ms)
    config = _plan_config(plan)
    try:
        serve.run(
            group_cls.bind(routes, policy, config, *handles),
            name=app,
            route_prefix=None,
            blocking=False,
        )
        _wait_running(serve, app, timeout_s=timeout_s)
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
    if ROUTER_APP not in serve.status().applications:
        serve.run(router_cls.bind(), name=ROUTER_APP, route_prefix="/", blocking=False)
        _wait_running(serve, ROUTER_APP, timeout_s=timeout_s)
    serve.get_app_handle(ROUTER_APP).switch.remote(app).result(timeout_s=timeout_s)
    if previous:
        serve.delete(previous)
        result.actions.append(f"deleted previous version {previous}")
    _record(store, plan, address=address, app=app, url=url, http_port=http_port)
    result.elapsed_s = time.perf_counter() - t0
    return result


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
    from greenctl.executor.runtime.offers import instance_offers

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
                "weight": float(dep.quota_rps if dep.quota_rps is not None else dep.count),
                "offer": offers[(dep.variant, dep.resource, dep.batch)].to_dict(),
            }
        )
    return routes


def _plan_config(plan: Plan) -> dict[str, Any]:
    """What model-less requests prefer (the plan's objective) and the grid intensity its
    carbon is counted with (:func:`greenctl.data.emissions.routes_carbon`, as the local
    dispatcher's table carries it)."""
    from greenctl.data.emissions import routes_carbon

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

    ``running`` says whether the application greenctl last applied is on the cluster.

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
    return {
        "backend": "ray",
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

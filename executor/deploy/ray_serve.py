"""The Ray Serve deployments of ``apply --backend ray``: a replica per planned instance
(dynamically batched), a group per plan version (its routes, and its energy sums:
:class:`~greenctl.executor.deploy.ray_routes.PlanRoutes`) and the stable router, which serves
the Open Inference Protocol over HTTP itself and forwards each request's body straight to a
replica, which decodes and answers it (one Ray hop: no Serve proxy, no group, on the path).

The classes are plain Python here; :func:`serve_classes` makes them Serve deployments, so
importing this module never needs Ray.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.records import Variant
from greenctl.executor.deploy.ray_routes import PlanRoutes, ReplicaEnergy
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.daemon import INPUT_NAME, OUTPUT_NAME, model_rows
from greenctl.executor.runtime.dispatcher import (
    ENERGY_SCRAPE_S,
    MAX_QUEUE,
    VARIANT_HEADER,
    NoVariant,
    QueueFull,
    busy_response,
    energy_scrape_s,
    requirements_of,
)
from greenctl.executor.runtime.oip import (
    HEADER_LENGTH,
    decode_request,
    encode_response,
    header_length,
)
from greenctl.profiler.models import load_model


def replica_ongoing(batch: int) -> int:
    """Calls a replica of ``batch`` takes at once: more than the router's :class:`Sender`
    sends it (two), so that Serve never holds one back for room."""
    return max(2 * max(batch, 1), 8)


#: The largest gRPC message between the router and a replica: gRPC's own ceiling, not
#: Serve's 4 MiB default, which a single request of a few images in JSON outgrows.
GRPC_MAX_MESSAGE = 2**31 - 1
#: The most request bytes one call carries (a group closes before it would pass them; a
#: request alone always goes): well under :data:`GRPC_MAX_MESSAGE`, answers included.
CALL_MAX_BYTES = 256 * 1024 * 1024
#: Serve's settings for the replicas on the request path (their ``runtime_env``): user code
#: runs on the replica's own event loop, not a thread of its own, so no call crosses
#: threads (part of what Serve's ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` sets for a whole cluster;
#: here for greenctl's deployments only, on any cluster), and gRPC takes messages of up to
#: :data:`GRPC_MAX_MESSAGE` bytes.
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(GRPC_MAX_MESSAGE),
}
#: the router's: its handles route on that same loop too
ROUTER_ENV = {**REPLICA_ENV, "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


def on_request_path(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """``ray_actor_options`` with Serve's settings ``env`` for a request-path process."""
    return {**options, "runtime_env": {"env_vars": dict(env)}}


def direct(handle: Any) -> Any:
    """``handle`` calling over Serve's gRPC data plane, straight to the replica's port (no
    Ray task, object or rejection stream per call: 1.5x the throughput of the by-reference
    path on two cores), where this Ray has it; the plain handle where it does not."""
    try:
        return handle.options(_by_reference=False)
    except TypeError:  # a Ray older than the option
        return handle


def serve_classes() -> tuple[Any, Any, Any]:
    """The Serve deployments ``(Replica, Group, Router)``.

    Raises:
        ImportError: Ray Serve is not installed.
    """
    from ray import serve

    class Replica(ReplicaServer):
        # Serve's dynamic batching; each replica sets its size and wait when it starts
        infer_batch = serve.batch(max_batch_size=1, batch_wait_timeout_s=0.002)(  # type: ignore[assignment]
            ReplicaServer.infer_batch
        )

    # no line per request: Serve's access log costs a replica as much as decoding a tensor
    logs = {"enable_access_log": False, "log_level": "WARNING"}
    no_cpu = {"num_cpus": 0}
    group = serve.deployment(
        name="Group", num_replicas=1, ray_actor_options=no_cpu, logging_config=logs
    )
    router = serve.deployment(
        name="Router", num_replicas=1, ray_actor_options=no_cpu, logging_config=logs
    )
    return serve.deployment(logging_config=logs)(Replica), group(GroupServer), router(RouterServer)


class ReplicaServer:
    """One planned instance: loads the variant, runs dynamically batched inference, and
    reports its energy to its version's group (:class:`ReplicaEnergy`)."""

    def __init__(
        self,
        variant: dict[str, Any],
        batch: int,
        max_wait_ms: float,
        energy: dict[str, Any] | None = None,
    ) -> None:
        self.loaded = load_model(Variant(**variant))
        self.variant = variant["name"]
        self.shape = list(self.loaded.input_shape)
        self.infer_batch.set_max_batch_size(max(1, batch))  # type: ignore[attr-defined]
        self.infer_batch.set_batch_wait_timeout_s(max_wait_ms / 1000.0)  # type: ignore[attr-defined]
        self.loaded.run(self.loaded.example(1))  # warm-up
        self.energy = ReplicaEnergy(energy) if energy is not None else None
        if self.energy is not None:
            self._report_energy()

    def _report_energy(self) -> None:
        """Report the energy counter to the group every scrape interval (a thread: its
        blocking handle calls stay off the replica's event loop)."""
        from ray import serve

        ctx = serve.get_replica_context()
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
                        group = serve.get_app_handle(ctx.app_name)
                    group.report.remote(energy.report(replica)).result(
                        timeout_s=max(5 * interval, 5.0)
                    )
                except Exception:
                    group = None

        threading.Thread(target=loop, name="greenctl-energy", daemon=True).start()

    async def infer_batch(self, inputs: list[Any]) -> list[Any]:
        """One batch of requests' rows (Serve's dynamic batching calls it)."""
        import numpy as np
        from greenctl.profiler.runner import run_eager

        counts = [len(x) for x in inputs]
        arr = np.concatenate(inputs).astype(np.float32)
        t0 = time.perf_counter()
        out = run_eager(self.loaded, arr, numpy_native=getattr(self.loaded, "numpy_native", False))
        if self.energy is not None:
            self.energy.ran(time.perf_counter() - t0, sum(counts))
        parts, start = [], 0
        for n in counts:
            parts.append(out[start : start + n])
            start += n
        return parts

    async def answer_all(self, requests: list[tuple[Any, ...]]) -> list[Any]:
        """Several requests' :meth:`answer`, batched together by Serve's batching."""
        return list(await asyncio.gather(*(self.answer(*r) for r in requests)))

    async def answer(
        self, name: str, raw: bytes, header: str | None, tag: bool
    ) -> tuple[int, bytes, dict[str, str]]:
        """One Open Inference Protocol request to ``name`` (this replica's model, or its
        variant by name), as its body came: ``(status, body, headers)``. The tensor is
        decoded here, once, and the answer encoded here (the router only forwards bytes);
        ``tag`` says which variant served it in the answer's ``parameters``."""
        try:
            doc, tensors = decode_request(raw, header_length(header))
            rows, squeeze = model_rows(name, doc, tensors, self.shape)
        except InputError as exc:
            return (
                400,
                json.dumps({"error": exc.message}).encode(),
                {"Content-Type": "application/json"},
            )
        one: Any = self.infer_batch  # Serve's batching: one request's rows in, its outputs out
        out = await one(rows.astype("float32", copy=False))
        body, headers = encode_response(
            name,
            [(OUTPUT_NAME, out[0] if squeeze else out)],
            request=doc,
            model_version=self.variant,
        )
        if tag:
            n = int(headers.get(HEADER_LENGTH) or len(body))
            head = json.loads(body[:n])
            head["parameters"] = {"variant": self.variant}
            new = json.dumps(head, separators=(",", ":")).encode()
            body = new + body[n:]
            if HEADER_LENGTH in headers:
                headers[HEADER_LENGTH] = str(len(new))
        headers[VARIANT_HEADER] = self.variant
        return 200, body, headers


class GroupServer:
    """One plan version: its routes (what the router routes with, :meth:`spec`), its
    replicas' deployments, and their energy sums (:class:`PlanRoutes`, off the request
    path)."""

    def __init__(
        self,
        routes: dict[str, list[dict[str, Any]]],
        policy: str,
        config: dict[str, Any],
        *handles: Any,
    ) -> None:
        self.table = PlanRoutes(
            routes,
            policy,
            prefer=config.get("prefer"),
            carbon=config.get("carbon"),
            interval_s=energy_scrape_s() or ENERGY_SCRAPE_S,
        )
        self.doc = {"routes": routes, "policy": policy, **config}
        self.deployments = [str(h.deployment_name) for h in handles]

    def spec(self) -> dict[str, Any]:
        """The routes in force (``routes``, ``policy``, ``prefer``, ``carbon``) and the
        replicas' deployment names by handle index (``deployments``)."""
        return {**self.doc, "deployments": self.deployments}

    def models(self) -> dict[str, Any]:
        return self.table.models()

    def configure(self, doc: dict[str, Any]) -> bool:
        changed = self.table.configure(doc)
        self.doc.update({k: v for k, v in doc.items() if k in ("routes", *ROUTE_KEYS)})
        return changed

    def report(self, doc: dict[str, Any]) -> None:
        self.table.report(doc)

    def metrics(self) -> str:
        return self.table.metrics_text()


#: what a routes document may set beside its routes (:meth:`PlanRoutes.configure`)
ROUTE_KEYS = ("policy", "prefer", "carbon")


#: how the Serve applications of plan versions are named (``greenctl-p<plan id>-<digest>``)
VERSION_PREFIX = "greenctl-p"


class Sender:
    """The requests a router sends one deployment, grouped: at most ``calls`` Ray calls in
    flight (one running and one forming per replica), and the requests that arrive meanwhile
    go together, up to ``most`` (the plan's batch) and :data:`CALL_MAX_BYTES`, in the next call
    (:meth:`ReplicaServer.answer_all`). No timer: a request to an idle deployment goes at
    once; under load one Ray call carries a batch instead of a request. At most ``limit``
    requests wait (the local dispatcher's queue bound): past it a request is refused
    (:class:`QueueFull`, answered 503) rather than held without end."""

    def __init__(
        self, handle: Any, *, calls: int = 2, most: int = 1, limit: int = MAX_QUEUE
    ) -> None:
        self.handle, self.calls, self.most, self.limit = handle, calls, most, limit
        self.waiting: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self.inflight = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def send(self, *args: Any) -> Any:
        """``args`` answered by :meth:`ReplicaServer.answer`.

        Raises:
            QueueFull: ``limit`` requests wait already.
        """
        if len(self.waiting) >= self.limit:
            raise QueueFull(f"{self.limit} requests wait for this deployment; retry later")
        done = asyncio.get_running_loop().create_future()
        self.waiting.append((args, done))
        self._pump()
        return await done

    def _pump(self) -> None:
        while self.waiting and self.inflight < self.calls:
            n, size = 1, _size(self.waiting[0][0])
            while n < min(self.most, len(self.waiting)):
                size += _size(self.waiting[n][0])
                if size > CALL_MAX_BYTES:
                    break
                n += 1
            group, self.waiting = self.waiting[:n], self.waiting[n:]
            self.inflight += 1
            task = asyncio.get_running_loop().create_task(self._call(group))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _call(self, group: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            answers = await self.handle.answer_all.remote([args for args, _ in group])
        except Exception as exc:  # each request of the call fails with it
            for _, done in group:
                if not done.done():
                    done.set_exception(exc)
        else:
            for (_, done), answer in zip(group, answers, strict=True):
                if not done.done():  # (a client gone meanwhile cancelled its own)
                    done.set_result(answer)
        finally:
            self.inflight -= 1
            self._pump()


def _size(args: tuple[Any, ...]) -> int:
    """The bytes a request's arguments carry (its body)."""
    return sum(len(a) for a in args if isinstance(a, bytes | bytearray | memoryview))


class RouterServer:
    """The stable Open Inference Protocol endpoint, served by the router replica itself
    (greenctl's lean HTTP server on ``host:port``, Serve's proxy not in the path): each
    request is routed with the active plan version's routes and its body forwarded as it
    came to a replica of the chosen deployment (:meth:`ReplicaServer.answer`), one hop; the
    version's group is asked only for its energy series."""

    async def __init__(self, host: str, port: int) -> None:  # type: ignore[misc]  # Serve awaits it
        self.app: str | None = None
        self.group: Any = None  # the active version's group (energy series)
        self.table: PlanRoutes | None = None
        self.replicas: list[Sender] = []  # each deployment's, by the routes' handle index
        self.models: dict[str, Any] = {}
        self.variant_of: dict[str, str] = {}  # a variant's name -> its model
        router = hs.Router()
        oip.add_protocol_routes(
            router, server_meta=self.server_meta, live=self.live, ready=self.ready,
            model_meta=self.model_meta, model_ready=self.model_ready, infer=self.infer,
            metrics=self.metrics,
        )  # fmt: skip
        self.server = hs.Server(router)
        self.port = await self.server.start(host, port)
        await self._resume()

    async def _resume(self) -> None:
        """A router Serve restarted routes again with the one plan version running (none
        chosen while two run: the apply switching between them says which)."""
        from ray import serve

        versions = [
            name
            for name, app in serve.status().applications.items()
            if name.startswith(VERSION_PREFIX) and str(app.status).endswith("RUNNING")
        ]
        if len(versions) == 1:
            await self.switch(versions[0])

    async def switch(self, app: str) -> dict[str, Any]:
        """Route with ``app``'s routes (again, after its group is reconfigured)."""
        from ray import serve

        group = serve.get_app_handle(app)
        spec = await group.spec.remote()
        handles = [
            direct(serve.get_deployment_handle(name, app, _check_exists=False))
            for name in spec["deployments"]
        ]
        self.replicas = [Sender(h) for h in handles]
        for doc in (d for ds in spec["routes"].values() for d in ds):
            self.replicas[int(doc["handle_index"])] = Sender(
                handles[int(doc["handle_index"])],
                calls=2 * max(int(doc.get("replicas") or 1), 1),
                most=max(int(doc.get("batch") or 1), 1),
            )
        self.table = PlanRoutes(
            spec["routes"],
            spec["policy"],
            prefer=spec.get("prefer"),
            carbon=spec.get("carbon"),
        )
        self.models = self.table.models()
        self.variant_of = {
            e["variant"]: m for m, es in self.models.items() for e in es if e["variant"] != m
        }
        self.group, self.app = group, app
        return self.models

    def active(self) -> str | None:
        return self.app

    def address(self) -> int:
        """The port the endpoint listens on."""
        return self.port

    async def server_meta(self, request: hs.Request) -> hs.Response:
        return hs.json_response({"name": "greenctl", "version": "1", "extensions": []})

    async def live(self, request: hs.Request) -> hs.Response:
        return hs.json_response({"live": True})

    async def ready(self, request: hs.Request) -> hs.Response:
        ready = self.app is not None
        return hs.json_response({"ready": ready}, status=200 if ready else 503)

    def _model_of(self, name: str) -> tuple[str | None, str | None]:
        """``(model, variant)`` a path's name means: a model (variant None), a variant by
        its own name, or neither (None, None)."""
        if name in self.variant_of:
            return self.variant_of[name], name
        return (name, None) if name in self.models else (None, None)

    async def model_meta(self, request: hs.Request) -> hs.Response:
        name = request.match_info["name"]
        model, variant = self._model_of(name)
        if model is None:
            return hs.json_response({"error": f"unknown model '{name}'"}, status=404)
        doc = self._model_doc(model)
        if variant is not None:  # as the local dispatcher answers
            doc.update(name=name, parameters={"family": model})
        return hs.json_response(doc)

    async def model_ready(self, request: hs.Request) -> hs.Response:
        name = request.match_info["name"]
        if self._model_of(name)[0] is None:
            return hs.json_response({"error": f"unknown model '{name}'"}, status=404)
        return hs.json_response({"name": name, "ready": True})

    def _model_doc(self, model: str) -> dict[str, Any]:
        """A model's metadata (its variants, and the Open Inference Protocol tensors)."""
        return {
            "name": model,
            "versions": ["1"],
            "platform": "greenctl-ray",
            "variants": self.models[model],
            "inputs": [
                {
                    "name": INPUT_NAME,
                    "datatype": "FP32",
                    "shape": [-1, *self.models[model][0]["input_shape"]],
                }
            ],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, -1]}],
        }

    async def metrics(self, request: hs.Request) -> hs.Response:
        """The active version's energy and carbon series (:class:`PlanRoutes`)."""
        text = "# greenctl: no plan version is active\n"
        if self.group is not None:
            text = await self.group.metrics.remote()
        return hs.Response(text=text, content_type="text/plain; version=0.0.4")

    async def infer(self, request: hs.Request) -> hs.Response:
        """Route a request with the plan's policy, or the model-less choice for its
        requirements, and forward its body as it came to a replica of that deployment."""
        name = request.match_info["name"]
        model, variant = self._model_of(name)
        if model is None or self.table is None:
            return hs.json_response({"error": f"unknown model '{name}'"}, status=404)
        header = request.headers.get(HEADER_LENGTH)
        raw = bytes(request.body)
        try:
            req = requirements_of(raw, header)  # as the local dispatcher reads them
            entry = self.table.pick(model, variant, req)
        except InputError as exc:
            return hs.json_response({"error": exc.message}, status=400)
        except NoVariant as none:
            return hs.json_response(none.doc(), status=422)
        entry.take()
        try:
            tag = req is not None or variant is not None  # say which variant served it
            code, body, headers = await self.replicas[entry.index].send(name, raw, header, tag)
        except QueueFull as full:
            return busy_response(full, model)
        finally:
            entry.give()
        return hs.Response(status=code, body=body, headers=headers)

"""The Ray Serve deployments of ``apply --backend ray``: a replica per planned instance, a
group per plan version (its routing, :class:`~greenctl.executor.deploy.ray_routes.PlanRoutes`)
and the stable router speaking the Open Inference Protocol.

The classes are plain Python here; :func:`serve_classes` makes them Serve deployments, so
importing this module never needs Ray.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.records import Variant
from greenctl.executor.deploy.ray_routes import PlanRoutes, ReplicaEnergy
from greenctl.executor.runtime.daemon import INPUT_NAME, OUTPUT_NAME, model_rows
from greenctl.executor.runtime.dispatcher import (
    ENERGY_SCRAPE_S,
    VARIANT_HEADER,
    NoVariant,
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

    no_cpu = {"num_cpus": 0}
    group = serve.deployment(name="Group", num_replicas=1, ray_actor_options=no_cpu)
    router = serve.deployment(name="Router", num_replicas=1, ray_actor_options=no_cpu)
    return serve.deployment(Replica), group(GroupServer), router(RouterServer)


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

    async def infer(self, rows: Any) -> tuple[str, Any]:
        return self.variant, await self.infer_batch(rows)

    def input_shape(self) -> list[int]:
        return list(self.loaded.input_shape)


class GroupServer:
    """One plan version's routing (:class:`PlanRoutes`): by model with the plan's policy,
    model-less requests by their requirements; and its replicas' energy sums."""

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


class RouterServer:
    """The stable Open Inference Protocol endpoint; forwards to the active plan version."""

    def __init__(self) -> None:
        self.app: str | None = None
        self.models: dict[str, Any] = {}
        self.variant_of: dict[str, str] = {}  # a variant's name -> its model

    async def switch(self, app: str) -> dict[str, Any]:
        from ray import serve

        handle = serve.get_app_handle(app)
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
            answer = await self._model_call(parts, request)
            if answer is not None:
                return answer
        return JSONResponse({"error": f"no route {request.method} {path}"}, status_code=404)

    async def _model_call(self, parts: list[str], request: Any) -> Any:
        """``/v2/models/{name}[/ready|/infer]``: a model, or a variant by its own name;
        None for a path of neither."""
        from starlette.responses import JSONResponse

        model = parts[3]
        if model in self.variant_of and len(parts) == 4 and request.method == "GET":
            doc = self._model_doc(self.variant_of[model])  # as the local dispatcher answers
            doc.update(name=model, parameters={"family": self.variant_of[model]})
            return JSONResponse(doc)
        if model in self.variant_of and len(parts) == 5 and parts[4] == "ready":
            return JSONResponse({"name": model, "ready": True})
        named = model in self.variant_of and len(parts) == 5 and parts[4] == "infer"
        if named and request.method == "POST":  # a variant's own name: it alone
            return await self._infer(self.variant_of[model], request, variant=model)
        if model not in self.models:
            return JSONResponse({"error": f"unknown model '{model}'"}, status_code=404)
        if len(parts) == 4 and request.method == "GET":
            return JSONResponse(self._model_doc(model))
        if len(parts) == 5 and parts[4] == "ready":
            return JSONResponse({"name": model, "ready": True})
        if len(parts) == 5 and parts[4] == "infer" and request.method == "POST":
            return await self._infer(model, request)
        return None

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

    async def _metrics(self) -> Any:
        """The active version's energy and carbon series (:class:`PlanRoutes`)."""
        from ray import serve
        from starlette.responses import Response

        text = "# greenctl: no plan version is active\n"
        if self.app is not None:
            text = await serve.get_app_handle(self.app).metrics.remote()
        return Response(text, media_type="text/plain; version=0.0.4")

    async def _infer(self, model: str, request: Any, *, variant: str | None = None) -> Any:
        from ray import serve
        from starlette.responses import JSONResponse, Response

        header = request.headers.get(HEADER_LENGTH)
        raw = await request.body()
        try:
            req = requirements_of(raw, header)  # as the local dispatcher reads them
        except InputError as exc:
            return JSONResponse({"error": exc.message}, status_code=400)
        try:
            doc, tensors = decode_request(raw, header_length(header))
            entries = self.models[model]
            shape = next((e for e in entries if e["variant"] == variant), entries[0])["input_shape"]
            rows, squeeze = model_rows(variant or model, doc, tensors, shape)
            rows = rows.astype("float32")
        except InputError as exc:
            return JSONResponse({"error": exc.message}, status_code=400)
        assert self.app is not None
        code, served, out = await serve.get_app_handle(self.app).route.remote(
            model, rows, variant, req
        )
        if code != 200:
            return JSONResponse(out, status_code=code)
        body, headers = encode_response(
            variant or model,
            [(OUTPUT_NAME, out[0] if squeeze else out)],
            request=doc,
            model_version=served,
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

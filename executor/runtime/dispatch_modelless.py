"""Model-less requests: a request that states requirements (``latency_slo_ms``,
``min_accuracy`` in its ``parameters``) or names a variant goes to the plan's preferred
variant that meets them, and its answer names the variant that served it (INFaaS).

Reading the requirements is on every request's path: a body is only parsed when it names a
greenctl-looking word, and a large one only in its ``parameters`` objects.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor.runtime.dispatch_routes import Backend, ModelRoute, QueueFull
from greenctl.planner.core.choice import (
    REQUIREMENT_KEYS,
    Offer,
    Requirements,
    check_requirement,
    choose,
    closest,
)


class NoVariant(Exception):
    """No running variant meets a model-less request: the closest, and what it offers."""

    def __init__(
        self, name: str, req: Requirements, offer: Offer, latency_ms: float | None
    ) -> None:
        self.name, self.req, self.offer, self.latency_ms = name, req, offer, latency_ms
        ms = "unknown" if latency_ms is None else f"{latency_ms:.3g} ms"
        acc = "unknown" if offer.accuracy is None else f"{offer.accuracy:g}"
        path = self.path_ms
        held = "with the requests it holds now" + (
            f" and {path:.3g} ms of measured serving path" if path else ""
        )
        super().__init__(
            f"no running variant of '{name}' meets {req.describe()}: the closest is "
            f"'{offer.variant}', predicted latency {ms} (p95, {held}), accuracy {acc}"
        )

    @property
    def path_ms(self) -> float:
        """How much of the predicted latency is the measured serving path (0: none)."""
        return 0.0 if self.offer.latency is None else self.offer.latency.path_ms

    def doc(self) -> dict[str, Any]:
        """The 422 response's body."""
        return {
            "error": str(self),
            "requirements": {
                k: v
                for k, v in (
                    ("latency_slo_ms", self.req.latency_slo_ms),
                    ("min_accuracy", self.req.min_accuracy),
                )
                if v is not None
            },
            "closest": {
                "variant": self.offer.variant,
                "predicted_latency_ms": self.latency_ms,
                "serving_path_ms": self.path_ms,
                "accuracy": self.offer.accuracy,
                "carbon_g_per_request": self.offer.carbon_g_per_request,
                "energy_j_per_request": self.offer.energy_j_per_request,
            },
        }


#: a request with no requirement (one naming a variant)
ANY = Requirements()
#: words of a request parameter that greenctl would read: an unknown one is refused (a typo
#: must not pass silently as a request without requirements)
_OURS = ("slo", "latency", "accuracy", "carbon", "energy", "cost", "variant", "greenctl")
_OURS_BYTES = tuple(w.encode() for w in _OURS)
#: finds any of them in one pass (on every request's path)
_OURS_RX = re.compile(b"|".join(re.escape(w) for w in _OURS_BYTES))
#: above this size a request's JSON is not parsed whole to find its parameters: each
#: parameters object is, read from at most ``_WINDOW`` bytes
_PARSE_LIMIT = 8192
_WINDOW = 2048


#: small JSON heads found to state no requirement: a client sends the same head with every
#: tensor of one shape (its data follows it), so most are read once (at most this many kept)
_PLAIN_HEADS: set[bytes] = set()
_PLAIN_HEADS_MAX = 256


def _remember_plain(head: bytes | bytearray) -> None:
    if len(_PLAIN_HEADS) >= _PLAIN_HEADS_MAX:
        _PLAIN_HEADS.clear()
    _PLAIN_HEADS.add(bytes(head))


def requirements_of(body: bytes, header_length: str | None) -> Requirements | None:
    """A request's requirements (``latency_slo_ms``, ``min_accuracy`` in its
    ``parameters``), None when it states none (it routes by its model's policy).

    Only the JSON part is read, and only when it names a greenctl-looking word at all; a
    large JSON body (tensor data inline) is not parsed whole: each ``"parameters"`` object
    in it (of at most 2 KiB) is, and those holding greenctl-looking keys count.

    Raises:
        InputError: a requirement that is not a number in range, or an unknown key that
            looks like greenctl's (names it).
    """
    head = body
    if header_length is not None:
        try:  # noqa: SIM105 (on every request's path: a plain try costs less)
            head = body[: int(header_length)]
        except ValueError:
            pass
    params: list[Any] = []
    if len(head) <= _PARSE_LIMIT:
        if (type(head) is bytes and head in _PLAIN_HEADS) or head.find(b'"parameters"') < 0:
            return None
        if _OURS_RX.search(head) is None:
            _remember_plain(head)
            return None
        try:
            doc = json.loads(head)
        except (ValueError, RecursionError):
            return None  # the executor answers a malformed request
        params = [doc.get("parameters")] if isinstance(doc, dict) else []
    else:  # one pass over the body, then only the parameters objects
        decoder = json.JSONDecoder()
        at = head.find(b'"parameters"')
        while at >= 0:
            window = head[at + 12 : at + 12 + _WINDOW]
            if _OURS_RX.search(window) is not None:
                text = window.decode("utf-8", errors="replace").lstrip()
                with contextlib.suppress(ValueError, RecursionError):
                    params.append(decoder.raw_decode(text.removeprefix(":").lstrip())[0])
            at = head.find(b'"parameters"', at + 12)
    found: dict[str, float] = {}
    for p in params:
        if not isinstance(p, dict):
            continue
        for key, value in p.items():
            low = str(key).lower()
            if key in REQUIREMENT_KEYS:
                found[key] = check_requirement(key, value)
            elif any(w in low for w in _OURS):
                raise InputError(
                    f"unknown request parameter {key!r}: greenctl reads latency_slo_ms "
                    "(ms, > 0) and min_accuracy (a fraction, 0 to 1)"
                    + (
                        "; to pick a variant, name it: POST /v2/models/{variant}/infer"
                        if "variant" in low
                        else ""
                    )
                )
    if not found:
        return None
    return Requirements(found.get("latency_slo_ms"), found.get("min_accuracy"))


def name_variant(
    data: bytes, head_len: str | None, variant: str, family: str, named: str | None
) -> tuple[bytes, str | None]:
    """An executor's answer with the variant that served it in its ``parameters`` and, for
    a request that named the variant, as its ``model_name`` (the executor answers with its
    family's name). Our executors write no top-level ``parameters``."""
    if not data.startswith(b"{") or data.startswith(b"{}"):
        return data, head_len
    grown = len(data)
    lead = b'{"parameters":{"variant":' + json.dumps(variant).encode() + b"},"
    skip = 1
    prefix = b'{"model_name":' + json.dumps(family).encode()
    if named is not None and data.startswith(prefix):
        lead += b'"model_name":' + json.dumps(named).encode()
        skip = len(prefix)
    data = b"".join((lead, memoryview(data)[skip:]))  # one copy of the (binary) answer
    if head_len is not None:
        with contextlib.suppress(ValueError):
            head_len = str(int(head_len) + len(data) - grown)
    return data, head_len


def choose_backend(route: ModelRoute, variant: str | None, req: Requirements) -> Backend:
    """The instance a model-less request (or one naming ``variant``) goes to, its slot
    taken: among the variants that meet ``req``, the plan's preferred, and of its
    instances the one predicted fastest (:func:`~greenctl.planner.core.choice.choose`).
    It goes straight to that instance's queue, past the model's central queue.

    Raises:
        NoVariant: no instance that is up meets ``req`` (names the closest).
        QueueFull: none is up, or the chosen one holds ``max_queue`` requests beyond its
            slots.
    """
    cands = route.candidates if variant is None else route.variants.get(variant, [])
    got = choose(cands, req)
    if got is None:
        near = closest(cands, req)
        if near is None:
            if variant is None:
                raise QueueFull(route.down_reason())
            raise QueueFull(f"no instance of variant '{variant}' is up")
        raise NoVariant(route.name if variant is None else variant, req, *near)
    b = got[1]
    assert isinstance(b, Backend)
    if b.inflight >= b.slots + route.max_queue:
        raise QueueFull(f"variant '{b.variant}' of '{route.name}' is at capacity; retry later")
    b.inflight += 1
    return b

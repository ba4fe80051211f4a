"""Model-less requests (INFaaS): what each running variant offers, and the rule that picks one.

A request names its family and may set ``latency_slo_ms`` and ``min_accuracy``.
:func:`choose` keeps the running instances accurate enough whose predicted latency, with the
requests they hold now, meets the SLO, and prefers the least carbon or cost per request (the
plan's objective), then the fastest. Predictions are precomputed per (variant, resource,
batch) as a :class:`QueueLatency` table so a request costs one look-up. Pure: ``apply``
builds the offers (:mod:`greenctl.executor.runtime.offers`), the dispatcher calls
:func:`choose`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from greenctl.data.errors import InputError
from greenctl.planner.core.queueing import mgc_model, with_overhead

if TYPE_CHECKING:
    from greenctl.planner.core.latency import BatchService

#: The quantile of a request's latency that its SLO is checked at.
SLO_QUANTILE = 0.95
#: What a plan prefers among the variants that meet a request (by its objective).
PREFERENCES = ("carbon", "cost")
#: The requirements a request may state in its parameters.
REQUIREMENT_KEYS = ("latency_slo_ms", "min_accuracy")


@dataclass(frozen=True)
class QueueLatency:
    """Predicted latency (ms) of a request sent to an instance holding ``ahead`` requests:
    ``(ahead // rows) * per_run_ms + own_ms[ahead % rows]`` (module docstring).

    ``path_ms`` says how much of ``own_ms[0]`` is the measured serving path's overhead (0:
    none measured, the model's latency alone); it is already in ``own_ms``.
    """

    own_ms: tuple[float, ...]
    per_run_ms: float
    path_ms: float = 0.0

    def at(self, ahead: int) -> float:
        k, r = divmod(max(ahead, 0), len(self.own_ms))
        return k * self.per_run_ms + self.own_ms[r]

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"own_ms": list(self.own_ms), "per_run_ms": self.per_run_ms}
        if self.path_ms:
            doc["path_ms"] = self.path_ms
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> QueueLatency:
        """Raises ValueError for a malformed table (the dispatcher's admin answers 400)."""
        own = tuple(float(x) for x in doc["own_ms"])
        per = float(doc["per_run_ms"])
        path = float(doc.get("path_ms") or 0.0)
        if not own or not all(math.isfinite(x) and x >= 0 for x in (*own, per, path)):
            raise ValueError(f"bad latency table {dict(doc)!r}")
        return cls(own, per, path)


def queue_latency(
    service: BatchService,
    *,
    q: float = SLO_QUANTILE,
    overhead_ms: Sequence[float] | None = None,
) -> QueueLatency:
    """The :class:`QueueLatency` of an instance with the service model ``service``.

    Args:
        service: the instance's service model.
        q: the quantile each row is predicted at.
        overhead_ms: the measured serving path's overhead samples
            (:attr:`~greenctl.planner.core.evaluate.ServingPath.overhead_ms`): each row is
            then the ``q`` quantile of its run plus the overhead, as ``predict`` adds it
            (:func:`~greenctl.planner.core.queueing.with_overhead`); None or empty: the
            model's latency alone.
    """
    rows = service.batch
    wait = service.batching.max_wait_ms if rows > 1 else 0.0
    runs = [service.at(r + 1) for r in range(rows)]
    own = tuple(run.quantile(q) + wait for run in runs)
    if overhead_ms is None or len(overhead_ms) == 0:
        return QueueLatency(own, service.full.mean_ms)
    served = []
    for run in runs:
        alone = mgc_model(0.0, [run])  # the run by itself: no queue ahead of it
        assert alone is not None  # (no load cannot overload it)
        served.append(with_overhead(alone, overhead_ms).quantile(q) + wait)
    return QueueLatency(tuple(served), service.full.mean_ms, max(served[0] - own[0], 0.0))


@dataclass(frozen=True)
class Offer:
    """What one variant of a running plan offers a request.

    Attributes:
        variant: its name.
        accuracy: its accuracy (fraction), None when unknown (it then meets no floor).
        carbon_g_per_request / energy_j_per_request / cost_per_request: per request at the
            instance's capacity, None when unknown.
        latency: its instances' :class:`QueueLatency`, None when it has no service model (it
            then meets no SLO).
    """

    variant: str
    accuracy: float | None = None
    energy_j_per_request: float | None = None
    carbon_g_per_request: float | None = None
    cost_per_request: float | None = None
    latency: QueueLatency | None = None

    def rank(self, prefer: str) -> tuple[float, ...]:
        """Smaller is preferred: the plan's objective first, the other, then accuracy."""
        inf = math.inf
        carbon = (
            self.carbon_g_per_request
            if self.carbon_g_per_request is not None
            else (inf if self.energy_j_per_request is None else self.energy_j_per_request)
        )
        energy = inf if self.energy_j_per_request is None else self.energy_j_per_request
        cost = inf if self.cost_per_request is None else self.cost_per_request
        acc = -(self.accuracy or 0.0)
        if prefer == "carbon":
            return (carbon, energy, cost, acc)
        return (cost, carbon, energy, acc)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "energy_j_per_request": self.energy_j_per_request,
            "carbon_g_per_request": self.carbon_g_per_request,
            "cost_per_request": self.cost_per_request,
            "latency": None if self.latency is None else self.latency.to_dict(),
        }

    @classmethod
    def from_dict(cls, variant: str, doc: Mapping[str, Any]) -> Offer:
        """Raises ValueError for a malformed offer (the dispatcher's admin answers 400)."""

        def num(key: str) -> float | None:
            value = doc.get(key)
            if value is None:
                return None
            out = float(value)
            if not math.isfinite(out) or out < 0:
                raise ValueError(f"variant {variant!r}: {key} must be a number >= 0")
            return out

        lat = doc.get("latency")
        return cls(
            variant,
            num("accuracy"),
            num("energy_j_per_request"),
            num("carbon_g_per_request"),
            num("cost_per_request"),
            None if lat is None else QueueLatency.from_dict(lat),
        )


@dataclass(frozen=True)
class Requirements:
    """What a request needs; None: no requirement of that kind."""

    latency_slo_ms: float | None = None
    min_accuracy: float | None = None

    def describe(self) -> str:
        parts = []
        if self.latency_slo_ms is not None:
            parts.append(f"latency_slo_ms={self.latency_slo_ms:g}")
        if self.min_accuracy is not None:
            parts.append(f"min_accuracy={self.min_accuracy:g}")
        return " and ".join(parts)


def check_requirement(key: str, value: Any) -> float:
    """A requirement's value, checked.

    Raises:
        InputError: not a finite number, or out of range (names the parameter).
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if key == "latency_slo_ms":
        if not ok or value <= 0:
            raise InputError(
                f"request parameter latency_slo_ms must be a number of milliseconds > 0, "
                f"got {value!r}"
            )
    elif key == "min_accuracy":
        if not ok or not 0 <= value <= 1:
            raise InputError(
                f"request parameter min_accuracy must be a fraction from 0 to 1, got {value!r}",
                hint="for example 0.75 for 75 % top-1",
            )
    else:
        raise InputError(
            f"unknown request requirement {key!r}",
            hint=f"greenctl reads {' and '.join(REQUIREMENT_KEYS)}",
        )
    return float(value)


class Queued(Protocol):
    """A running instance as :func:`choose` sees it: up or not, and the requests it holds."""

    up: bool
    inflight: int


Candidates = Sequence[tuple[Offer, Sequence[Queued]]]


def choose(candidates: Candidates, req: Requirements) -> tuple[Offer, Queued] | None:
    """The variant and instance a request goes to, or None when no instance that is up meets
    ``req``.

    Args:
        candidates: per variant, in the plan's order of preference (:meth:`Offer.rank`), its
            offer and its instances.
        req: the request's requirements.
    """
    slo, floor = req.latency_slo_ms, req.min_accuracy
    for offer, instances in candidates:
        if floor is not None and (offer.accuracy is None or offer.accuracy < floor):
            continue
        lat = offer.latency
        if slo is None:
            if lat is None:
                up = [i for i in instances if i.up]
                if up:
                    return offer, min(up, key=lambda i: i.inflight)
                continue
            best, best_ms = None, math.inf
        elif lat is None:
            continue
        else:
            best, best_ms = None, slo
        for inst in instances:
            if inst.up:
                ms = lat.at(inst.inflight)
                if ms <= best_ms:
                    best, best_ms = inst, ms
        if best is not None:
            return offer, best
    return None


def closest(candidates: Candidates, req: Requirements) -> tuple[Offer, float | None] | None:
    """The variant nearest to meeting ``req`` and its predicted latency (its fastest instance
    that is up, now): the least relative shortfall, latency and accuracy added up; None when
    no instance is up."""
    best: tuple[float, Offer, float | None] | None = None
    for offer, instances in candidates:
        up = [i for i in instances if i.up]
        if not up:
            continue
        lat = offer.latency
        ms = None if lat is None else min(lat.at(i.inflight) for i in up)
        gap = 0.0
        if req.latency_slo_ms is not None:
            slo = req.latency_slo_ms
            gap += math.inf if ms is None else max(ms - slo, 0.0) / slo
        if req.min_accuracy is not None:
            acc, floor = offer.accuracy, req.min_accuracy
            gap += math.inf if acc is None else max(floor - acc, 0.0) / max(floor, 1e-9)
        if best is None or gap < best[0]:
            best = (gap, offer, ms)
    return None if best is None else (best[1], best[2])

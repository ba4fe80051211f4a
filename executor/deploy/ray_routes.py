"""What a Ray plan version's group and replicas do, in plain Python (no Ray, so it is
unit-testable): the group's routing table and energy sums (:class:`PlanRoutes`, one entry per
deployment: :class:`RouteEntry`) and a replica's energy counter (:class:`ReplicaEnergy`).

Routing follows the local dispatcher's rules: ``wrr`` by quota, else the deployment with the
fewest requests in flight per replica; model-less requests pick a variant with
:func:`greenctl.planner.core.choice.choose`. Each replica reports its energy counter to its
group, which sums the increases per model and counts their carbon at the plan's grid
intensity, exported as the local dispatcher exports them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from greenctl.data.emissions import executor_energy_args
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.runtime.dispatcher import NoVariant
from greenctl.executor.runtime.metrics import (
    CARBON_TOTAL,
    ENERGY_TOTAL,
    EnergyExport,
    IncreaseSum,
    carbon_g,
    model_energy_lines,
)
from greenctl.planner.core.choice import Offer, Requirements, choose, closest
from greenctl.planner.core.policy import SmoothWRR
from greenctl.profiler.energy import serving_counter


class RouteEntry:
    """One deployment of a plan version, as its group routes to it: its replicas share one
    Serve handle, so the requests in flight are counted for the deployment, and per replica
    (``inflight``, what :func:`~greenctl.planner.core.choice.choose` reads) as Serve
    spreads them."""

    up = True  # Serve restarts failed replicas; a deployment is routed to while it runs

    def __init__(self, doc: dict[str, Any]) -> None:
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

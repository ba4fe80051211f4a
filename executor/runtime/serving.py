"""The serving path: what a request spends outside the model, as measured and as plans use it.

A model's profile times inference in-process. A served request also crosses the client's
HTTP stack, the dispatcher (parse, route, forward) and the executor daemon (parse, batch
queue, worker thread, encode) and back. :func:`greenctl.executor.deploy.serving_measure.measure_serving`
measures exactly that part (see there); this module holds the measurement record
(:class:`ServingMeasurement`), stores and lists them, and picks the rows a plan's families
and rates use (:func:`serving_overheads`).

Each row keeps 100 quantiles of the serving path, which
:func:`greenctl.planner.core.evaluate.predict` adds to a plan's model latency.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from greenctl.data import serving_rows as serving_rows_db
from greenctl.data.records import utcnow_iso
from greenctl.data.resources import kind_of
from greenctl.data.store import Store
from greenctl.planner.core.evaluate import ServingPath
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.service import service_time

DEFAULT_RATES = (10.0, 40.0, 160.0)
PATHS = ("dispatcher", "direct")
STAND_INS = ("model", "noop")
QUANTILE_POINTS = 100


@dataclass
class ServingMeasurement:
    """One measured (variant shape, path, rate) point of the serving path."""

    family: str
    variant: str
    path: str
    stand_in: str
    policy: str
    rate_rps: float
    input_bytes: int
    output_elements: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    quantiles_ms: list[float]
    executor_cpu_ms_per_request: float | None  # the daemon's own, model runs excluded
    dispatcher_cpu_ms_per_request: float | None
    samples: int
    #: median model run inside the served executor (model stand-in; None for noop)
    infer_p50_ms: float | None = None
    #: ... and its tail (served runs at low load have a longer one than back-to-back runs)
    infer_p95_ms: float | None = None
    infer_p99_ms: float | None = None
    #: where the executor ran and the batch size it was given (None: cpu:1 and 1, a row
    #: measured without ``--resource``/``--batch``), and the median rows its batches carried
    resource: str | None = None
    batch: int | None = None
    infer_rows_p50: float | None = None
    hardware: str | None = None
    hostname: str = field(default_factory=platform.node)
    source: str = "measured"
    created_at: str = field(default_factory=utcnow_iso)
    id: int | None = None

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["quantiles_ms"] = json.dumps([round(x, 4) for x in self.quantiles_ms])
        if row.get("id") is None:
            row.pop("id")
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ServingMeasurement:
        doc = dict(row)
        doc["quantiles_ms"] = [float(x) for x in json.loads(doc.get("quantiles_ms") or "[]")]
        known: dict[str, Any] = {k: doc.get(k) for k in cls.__dataclass_fields__}
        return cls(**known)


def save_serving(store: Store, rows: Iterable[ServingMeasurement]) -> list[int]:
    """Store measurements in one transaction; returns their ids."""
    ids = []
    with store.transaction():
        for r in rows:
            r.id = serving_rows_db.add_serving_row(store, r.to_row())
            ids.append(r.id if r.id is not None else 0)
    return ids


def serving_rows(store: Store, *, variant: str | None = None) -> list[ServingMeasurement]:
    """Stored measurements, newest first."""
    return [
        ServingMeasurement.from_row(r)
        for r in serving_rows_db.serving_profile_rows(store, variant=variant)
    ]


def _off_cpu(row: ServingMeasurement) -> str | None:
    """The GPU, MIG or MPS resource a row was measured on; None for a CPU core (older rows,
    without a resource, were all measured on ``cpu:1``)."""
    where = row.resource or "cpu:1"
    return None if kind_of(where).pins_cores else where


def _borrowed(path: ServingPath) -> ServingPath:
    """A path as a variant never measured borrows it from its family (the family's entry).

    A path measured on a GPU, MIG or MPS resource lends only its overhead samples, its rate
    and the dispatcher's figure: its executor CPU and its served-run ratios are the measured
    variant's at the rows its batches carried there (on the H200, resnet152's executor spent
    1.2-1.6 ms per request in batches of one; resnet50's served at batch 8, 0.39 ms), and as
    another variant's executor front they capped a resnet50 plan at batch 32 below half its
    load. A CPU path is lent whole: its executor CPU shares the instance's cores whatever
    the model (:func:`greenctl.planner.core.evaluate.served_service`)."""
    if path.resource is None:
        return path
    return replace(path, executor_cpu_ms=0.0, service_scale=None, tail_scale=None)


class _ServedRuns:
    """How much slower a variant runs inside the served executor than back-to-back in its
    profile (:attr:`ServingPath.service_scale`, :attr:`ServingPath.tail_scale`), with the
    profiles read once per (variant, resource)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.profiles: dict[tuple[str, str], dict[int, Any]] = {}

    def profile_run(self, row: ServingMeasurement) -> tuple[float, ServiceTime] | None:
        """The profile's back-to-back p50 (ms) and service time for the served batches: at
        the median rows they carried, between two profiled batch sizes linearly
        interpolated."""
        key = (row.variant, row.resource or "cpu:1")
        if key not in self.profiles:
            self.profiles[key] = {
                p.batch: p
                for p in self.store.latest_profiles(variant=key[0], resource=key[1])
                if p.latency_p50_ms
            }
        by_batch = self.profiles[key]
        size = float(row.infer_rows_p50 or row.batch or 1)
        if not by_batch:
            return None
        near = min(by_batch, key=lambda b: (abs(math.log(b / size)), b))
        lower = max((b for b in by_batch if b <= size), default=None)
        upper = min((b for b in by_batch if b >= size), default=None)
        p50 = float(by_batch[near].latency_p50_ms or 0.0)
        if lower is not None and upper is not None and upper > lower:
            lo, hi = (float(by_batch[b].latency_p50_ms or 0.0) for b in (lower, upper))
            p50 = lo + (hi - lo) * (size - lower) / (upper - lower)
        hot = service_time(by_batch[near])
        if hot.mean_ms > 0 and by_batch[near].latency_p50_ms:
            hot = hot.scaled(p50 / float(by_batch[near].latency_p50_ms))
        return p50, hot

    def ratios(self, row: ServingMeasurement) -> tuple[float | None, tuple[float, float] | None]:
        """A row's served run time over the profile's at the median (never a speed-up),
        and at its p95 and p99 (None where the row lacks them)."""
        if not row.infer_p50_ms:
            return None, None
        prof = self.profile_run(row)
        if prof is None or prof[0] <= 0:
            return None, None
        p50, hot = prof
        scale = max(float(row.infer_p50_ms) / p50, 1.0)
        if not (row.infer_p95_ms and row.infer_p99_ms):
            return scale, None
        return scale, (
            float(row.infer_p95_ms) / hot.quantile(0.95),
            float(row.infer_p99_ms) / hot.quantile(0.99),
        )

    def as_path(
        self, row: ServingMeasurement, run: list[ServingMeasurement], total_rps: float
    ) -> ServingPath:
        """The serving path a row gives, with the dispatcher's CPU and the tail ratios
        taken from the whole run it belongs to."""
        # the dispatcher carries every family's requests: its CPU per request is taken at
        # the run's rate nearest the plan's total (it falls as the rate rises, its idle
        # wake-ups spread over more requests: resnet152 on the H200 host, 1.15 ms at 100
        # req/s, 0.81 at 300), from a row of this run that measured it (dispatcher path)
        timed = [r for r in run if (r.dispatcher_cpu_ms_per_request or 0.0) > 0]
        disp = None
        if timed:
            near = min(timed, key=lambda r: abs(math.log(r.rate_rps / total_rps)))
            disp = float(near.dispatcher_cpu_ms_per_request or 0.0)
        scale, _ = self.ratios(row)
        tail = None
        if scale is not None:
            # The tail ratios are pooled over every rate of the run (their median), not
            # taken at the one rate: a p99 of a few hundred served runs rests on a handful
            # of them, and one host stall there (tiny-l at 40 req/s on the H100 host: p99
            # 19.3 ms against 4.4-13.4 at the other rates) fitted a service tail so heavy
            # that a 0.21-utilisation plan was predicted at a 629 ms p95 (measured 17 ms).
            tails = [t for t in (self.ratios(r)[1] for r in run) if t is not None]
            if tails:
                tail = (
                    max(statistics.median(t[0] for t in tails), scale),
                    max(statistics.median(t[1] for t in tails), scale),
                )
        return ServingPath(
            tuple(row.quantiles_ms),
            float(row.executor_cpu_ms_per_request or 0.0),
            scale,
            tail,
            resource=_off_cpu(row),
            dispatcher_cpu_ms=disp,
            rate_rps=float(row.rate_rps),
        )


def _newest_runs(rows: list[ServingMeasurement]) -> dict[str, list[ServingMeasurement]]:
    """Of a family's rows (newest first), each variant's newest run (its rows at every
    rate) on the CPU, under the variant's name, and on each GPU, MIG or MPS resource, under
    ``variant@resource``."""
    runs: dict[str, list[ServingMeasurement]] = {}
    for r in rows:
        off = _off_cpu(r)
        run = runs.setdefault(r.variant if off is None else f"{r.variant}@{off}", [])
        if not run or run[0].created_at == r.created_at:
            run.append(r)
    return runs


def serving_overheads(
    store: Store,
    rates: Mapping[str, float],
    *,
    path: str = "dispatcher",
    stand_in: str | None = None,
) -> dict[str, ServingPath]:
    """The serving path for ``{family: rate}``, keyed by family, variant and ``variant@resource``.

    Each measured variant gets its newest run on ``path`` at the measured rate nearest its
    family's (in ratio): CPU runs under the variant's name, GPU, MIG or MPS runs under
    ``variant@resource``; a family's own entry (the fallback) is its newest run of any variant.
    ``stand_in`` limits runs to ``model`` or ``noop``; unmeasured families are left out.
    The dispatcher's CPU per request (a serial stage, ``evaluate.DispatcherStage``) is taken at
    the rate nearest the total of ``rates``; ``direct`` runs have none. ``service_scale`` is the
    served over the profiled run time at the served batch size; ``tail_scale`` the median over
    all rates, so one stalled rate cannot drag it.
    """
    served = _ServedRuns(store)
    out: dict[str, ServingPath] = {}
    total = max(sum(float(r) for r in rates.values()), 1e-9)
    for family, rate in rates.items():
        rows = [
            ServingMeasurement.from_row(r)
            for r in serving_rows_db.family_serving_rows(
                store, path=path, family=family, stand_in=stand_in
            )
        ]
        target = max(float(rate), 1e-9)
        for key, run in _newest_runs(rows).items():
            best = min(run, key=lambda r: abs(math.log(r.rate_rps / target)))
            if best.quantiles_ms:
                out[key] = served.as_path(best, run, total)
                if run[0] is rows[0]:  # the family's newest run of all
                    out[family] = _borrowed(out[key])
    return out

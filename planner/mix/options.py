"""One option of a mix plan: a (variant, resource, batch) with its capacity at the SLO, its
cost, the energy the evaluation core accounts for it and the budgets one instance uses.

:func:`make_option` sizes an option from its profile rows (a load test at the SLO, else the
queueing model of :mod:`greenctl.planner.core.queueing` over the profile's service time and
the serving path), :func:`price_energy` prices it as the evaluation core will, and
:func:`prune_dominated` drops the options that others of the same variant replace without
loss. The evaluation core and the queueing model are imported where used: they load numpy,
and ``greenctl --help`` imports this module through the ``plan mix`` command.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from greenctl.data.errors import InputError
from greenctl.data.limits import SLO_QUANTILES
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.data.resources import Resource, hourly_cost
from greenctl.planner.mix.model import MixOption

if TYPE_CHECKING:
    from greenctl.planner.core.latency import ServiceTime
    from greenctl.planner.core.serving_path import DispatcherStage, ServingPath

__all__ = [
    "budget_usage",
    "latency_capacities",
    "lowest_reachable_slo",
    "make_option",
    "operating_point",
    "path_quantile",
    "price_energy",
    "prune_dominated",
    "served_service_of",
    "size_row",
]

_EPS = 1e-9


def budget_usage(resource: Resource, budgets: dict[str, float]) -> dict[str, float]:
    """How much of each budget one instance on ``resource`` uses.

    A kind budget (``cpu``) counts the kind's amount: cores for cpu, percent for mps,
    compute slices for mig, the numeric size or one unit otherwise. A label budget
    (``mig:1g.10gb``) counts instances of exactly that label.
    """
    usage = {}
    for key in budgets:
        if ":" in key:
            if key == resource.label:
                usage[key] = 1.0
        elif key == resource.kind:
            usage[key] = resource.amount  # the kind's budget unit (cores, slices, percent)
    return usage


def _percentile_latency(p: Profile, pct: str) -> float | None:
    """The profile's latency at ``pct``, else the nearest higher percentile recorded."""
    order = list(SLO_QUANTILES)
    lat = p.latency_ms
    for key in order[order.index(pct) :]:
        if key in lat:
            return lat[key]
    return None


def _capacity_from_latency(
    p: Profile,
    *,
    slo_ms: float,
    q: float,
    path: ServingPath | Sequence[float] | None = None,
    res: Resource | None = None,
    sizes: Mapping[int, Profile] | None = None,
    known: Mapping[tuple[ServiceTime, float], float] | None = None,
) -> tuple[float, float, str]:
    """Capacity (rps) of one instance at the SLO, from its latency profile.

    The evaluation core's queueing model: ``capacity_at_slo`` (batch 1) or
    ``batch_capacity_at_slo`` (dynamic batching, its service built from the measured batch
    ``sizes`` up to ``p.batch``). A served CPU instance's service is longer
    (:func:`served_service_of`); an accelerator with measured executor CPU has its front in
    series (at most ``1000 / executor_cpu_ms`` req/s, its wait counted).

    Returns:
        (capacity_rps, latency at quantile ``q`` in ms: the service's, or a lone request's for
        a batching instance, source)
    """
    from greenctl.planner.core.evaluate import front_cpu_ms
    from greenctl.planner.core.queueing import batch_capacity_at_slo, capacity_at_slo, dynamic_batch
    from greenctl.planner.core.service import batch_service

    service, stretch = served_service_of(path, res, p)
    source = f"queueing, served x{stretch:.2f}" if stretch > 1.0 else "queueing"
    front = front_cpu_ms(path, res.label) if res is not None else 0.0
    if p.batch > 1:
        rows = {n: r for n, r in (sizes or {}).items() if n <= p.batch}
        rows[p.batch] = p
        model = batch_service(rows, p.resource, p.batch).map(
            lambda n, _svc: served_service_of(path, res, rows[n])[0]
        )
        alone = dynamic_batch(0.0, model)
        lat = float(alone.latency.quantile(q)) if alone is not None else math.inf
        if lat > slo_ms:
            return 0.0, lat, source
        cap = batch_capacity_at_slo(model, slo_ms=slo_ms, percentile=q, front_ms=front)
        return max(float(cap), 0.0), lat, source
    lat = float(service.quantile(q))
    if lat > slo_ms:
        return 0.0, lat, source
    got = (known or {}).get((service, slo_ms)) if front <= 0 else None
    if got is None:
        got = capacity_at_slo(service, servers=1, slo_ms=slo_ms, percentile=q, front_ms=front)
    return max(float(got), 0.0), lat, source


def served_service_of(
    path: ServingPath | Sequence[float] | None, res: Resource | None, p: Profile
) -> tuple[ServiceTime, float]:
    """The service time of a profile as served, and its mean over the profile's.

    On CPU with a serving path measured on a CPU core: the served run
    (``ServingPath.service_scale`` and ``tail_scale``, see ``evaluate.stretched_service``),
    then stretched by the executor's own CPU per request (``executor_cpu_ms``, which also
    lands on the request's own latency here: on the safe side by that much). On a GPU, MIG
    or MPS resource with a path measured on that same resource: the served run alone.
    Otherwise the profile's back-to-back service and 1.
    """
    from greenctl.planner.core.evaluate import ServingPath, path_serves, stretched_service
    from greenctl.planner.core.service import service_time

    hot = service_time(p)
    if not isinstance(path, ServingPath) or res is None or not path_serves(path, res.label):
        return hot, 1.0
    served = stretched_service(hot, path)
    demand = max(path.executor_cpu_ms, 0.0) if path.resource is None else 0.0
    if demand > 0 and served.mean_ms > 0:
        served = served.scaled((served.mean_ms + demand) / served.mean_ms)
    stretch = served.mean_ms / hot.mean_ms if hot.mean_ms > 0 else 1.0
    return served, max(stretch, 1.0)


def _energy(p: Profile) -> float | None:
    """A profile's own energy per request: the fallback when the evaluation core cannot
    price an option (:func:`price_energy`)."""
    if p.energy_j is not None:
        return float(p.energy_j)
    if p.power_w is not None and p.throughput_rps > 0:
        return float(p.power_w) / float(p.throughput_rps)
    return None


def operating_point(o: MixOption, rate_rps: float, headroom: float) -> float:
    """The per-instance rate (req/s) an option's energy is first priced at: its family's
    rate spread over the instances that would serve the family alone
    (``ceil(load / capacity)``), so a family served by one option is priced exactly."""
    if rate_rps <= 0:
        return max(o.capacity_rps / (1.0 + headroom), 1e-9)
    load = rate_rps * (1.0 + headroom)
    return rate_rps / max(1, math.ceil(load / o.capacity_rps - 1e-9))


def price_energy(
    o: MixOption,
    model: str,
    rate_rps: float,
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
) -> str | None:
    """Set ``o``'s energy terms (``idle_power_w``, ``energy_j_per_request``) from the
    evaluation core (:func:`greenctl.planner.core.evaluate.energy_terms`) at ``rate_rps``
    per instance, with the serving path ``predict`` will use.

    Returns:
        None, or why the core could not price it (``o`` keeps its profile's own energy per
        request, with no idle power).
    """
    from greenctl.planner.core.evaluate import energy_terms

    if o.profile is None:
        return None
    rows = {(o.variant, o.resource, n): p for n, p in o.sizes.items() if n <= o.batch}
    rows[(o.variant, o.resource, o.batch)] = o.profile
    dep = Deployment(model=model, variant=o.variant, resource=o.resource, batch=o.batch)
    try:
        t = energy_terms(dep, rows, rate_rps=rate_rps, serving=serving or None)
    except InputError as exc:
        return f"{o.variant} on {o.resource} batch {o.batch}: {exc.message}"
    if t is None:
        o.energy_j_per_request, o.idle_power_w = None, 0.0
    else:
        o.energy_j_per_request, o.idle_power_w = t.dynamic_j_per_request, t.idle_w
    o.energy_rate_rps = rate_rps
    o.energy_linear = t is None or t.linear
    return None


def size_row(rows: list[Profile], slo_ms: float) -> Profile:
    """The row one (variant, resource, batch) stands with, as :func:`make_option` picks it:
    its load test at the SLO, else its newest plain measurement."""
    from greenctl.planner.core.service import load_test_row

    row = load_test_row(rows, slo_ms)
    if row is not None and (row.capacity_rps or 0) > 0:
        return row
    return _plain_row(rows)


def _plain_row(rows: list[Profile]) -> Profile:
    """The newest plain measurement of rows (any row when all are load tests): the row a
    latency-derived option is sized from."""
    plain = [p for p in rows if p.capacity_slo_ms is None] or rows
    return max(plain, key=lambda p: (p.created_at or "", p.id or 0))


def latency_capacities(
    wanted: Sequence[tuple[Resource, list[Profile], float, ServingPath | Sequence[float] | None]],
    slo_ms: float,
    q: float,
) -> dict[tuple[ServiceTime, float], float]:
    """The one-server capacities :func:`make_option` will ask the queueing model for, all in
    one vectorised search (``queueing.capacities_at_slo``), keyed by (service, SLO budget).

    ``wanted``: per (variant, resource, batch) its resource, rows, serving path latency
    (``path_ms``) and path. Options sized otherwise (load-tested, batching, behind an
    executor front) are left out; :func:`make_option` computes any capacity not here.
    """
    from greenctl.planner.core.evaluate import front_cpu_ms
    from greenctl.planner.core.queueing import capacities_at_slo
    from greenctl.planner.core.service import load_test_row

    keys: dict[tuple[ServiceTime, float], None] = {}
    for res, rows, path_ms, path in wanted:
        budget = slo_ms - path_ms
        base = _plain_row(rows)
        if load_test_row(rows, slo_ms) is not None or base.batch > 1 or budget <= 0:
            continue
        if front_cpu_ms(path, res.label) > 0:
            continue
        try:
            service = served_service_of(path, res, base)[0]
        except InputError:
            continue  # make_option reports it
        keys[(service, budget)] = None
    caps = capacities_at_slo([s for s, _ in keys], [b for _, b in keys], q)
    return dict(zip(keys, caps, strict=True))


def make_option(
    vname: str,
    res: Resource,
    batch: int,
    hw: str | None,
    rows: list[Profile],
    slo_ms: float,
    pct: str,
    q: float,
    *,
    path_ms: float = 0.0,
    path: ServingPath | Sequence[float] | None = None,
    sizes: Mapping[int, Profile] | None = None,
    known: Mapping[tuple[ServiceTime, float], float] | None = None,
) -> MixOption | str:
    """The option for one (variant, resource, batch), or why it is not eligible.

    ``sizes``: the row chosen at every measured batch size of the (variant, resource), the
    service model of a batching option (:func:`_capacity_from_latency`).

    ``path_ms``: the serving path's latency at the percentile; an option derived from a
    latency profile must meet the SLO less that (load-tested capacities were measured
    through a real server and keep the whole SLO). ``path``: the serving path itself; on
    CPU its served run time and executor CPU lengthen the service (:func:`served_service_of`).
    ``known``: capacities computed beforehand (:func:`latency_capacities`).
    """
    from greenctl.planner.core.service import load_test_row

    row = load_test_row(rows, slo_ms)  # the rule the simulator picks with, too
    base = _plain_row(rows)
    cost, priced = hourly_cost(
        res.label, next((p.cost_per_hour for p in rows if p.cost_per_hour is not None), None)
    )
    energy = next((e for e in (_energy(p) for p in rows) if e is not None), None)
    if row is not None:
        cap = float(row.capacity_rps or 0.0)
        lat = _percentile_latency(row, pct)
        if cap <= 0:
            return f"load-tested capacity is 0 at {row.capacity_slo_ms:g} ms"
        return MixOption(
            variant=vname,
            resource=res.label,
            batch=batch,
            capacity_rps=cap,
            cost_per_hour=cost,
            energy_j_per_request=energy,
            latency_ms=lat,
            capacity_source=f"load-tested@{float(row.capacity_slo_ms or 0):g}ms",
            hardware=hw,
            profile=row,
            priced=priced,
        )
    if any(p.capacity_slo_ms is not None for p in rows) and all(
        p.capacity_slo_ms is not None for p in rows
    ):
        lowest = min(float(p.capacity_slo_ms or 0) for p in rows)
        base_lat = _percentile_latency(base, pct)
        if base_lat is None or base_lat > slo_ms:
            return f"load-tested only at SLOs >= {lowest:g} ms"
    budget = slo_ms - path_ms
    if budget <= 0:
        return f"the serving path alone takes {path_ms:.4g} ms at {pct}"
    cap, lat, source = _capacity_from_latency(
        base, slo_ms=budget, q=q, path=path, res=res, sizes=sizes, known=known
    )
    if lat > budget:
        if path_ms > 0:
            return f"{pct} latency {lat:.4g} ms plus the serving path's {path_ms:.3g} ms exceeds the SLO"
        return f"{pct} latency {lat:.4g} ms exceeds the SLO"
    if cap <= 0:
        return "no capacity within the SLO"
    return MixOption(
        variant=vname,
        resource=res.label,
        batch=batch,
        capacity_rps=cap,
        cost_per_hour=cost,
        energy_j_per_request=energy,
        latency_ms=lat,
        capacity_source=source,
        hardware=hw,
        profile=base,
        priced=priced,
    )


def path_quantile(
    path: ServingPath | Sequence[float] | None, q: float, stage: DispatcherStage | None = None
) -> float:
    """The ``q`` quantile (ms) of a serving path (evaluate.ServingPath or samples); 0 if none.
    With the plan's dispatcher stage, its wait at the plan's rate beyond what the path's
    samples hold (``evaluate.DispatcherStage.overhead_ms``)."""
    from greenctl.planner.core.evaluate import ServingPath

    samples = getattr(path, "overhead_ms", path)
    if stage is not None and isinstance(path, ServingPath):
        samples = stage.overhead_ms(path)
    if not samples:
        return 0.0
    import numpy as np

    return float(np.quantile(np.asarray(samples, dtype=float), q))


def lowest_reachable_slo(
    variants: Sequence[Variant],
    profiles: Sequence[Profile],
    family: str,
    pct: str,
    *,
    path_ms: float = 0.0,
) -> tuple[float, str] | None:
    """The lowest SLO any single instance of ``family`` meets, with the option that does
    (a latency-profile option plus the serving path's ``path_ms``)."""
    names = {v.name for v in variants if v.family == family}
    best: tuple[float, str] | None = None
    for p in profiles:
        if p.variant not in names:
            continue
        cands = []
        if p.capacity_slo_ms is not None and (p.capacity_rps or 0) > 0:
            cands.append(float(p.capacity_slo_ms))
        lat = _percentile_latency(p, pct)
        if lat is not None:
            cands.append(lat + path_ms)
        for c in cands:
            if best is None or c < best[0]:
                best = (c, f"{p.variant} on {p.resource} batch {p.batch}")
    return best


def prune_dominated(options: list[MixOption]) -> tuple[list[MixOption], int]:
    """Drop options that ``k`` instances of another option of the same variant dominate.

    With ``k = ceil(capacity_b / capacity_a)``, ``a`` dominates ``b`` when ``k`` instances of
    ``a`` cost no more than one of ``b``, use no more of any budget, and ``a`` spends no
    more energy per request (unknown only matches unknown). Replacing every instance of
    ``b`` by ``k`` of ``a`` keeps a plan feasible (same quota, no less capacity) and no worse
    under every objective (same variant: same accuracy and loading cost; ``k`` instances of
    ``a`` draw no more idle power than one of ``b``), so pruning keeps
    the optimum exact. ``k = 1`` is plain dominance; ``k > 1`` removes sizes that scale
    sublinearly (two ``cpu:1`` instances that beat one ``cpu:2``), which also leaves the
    solver the finest-grained options and so a tighter relaxation.
    """
    keep: list[MixOption] = []
    by_variant: dict[str, list[MixOption]] = {}
    for o in options:
        by_variant.setdefault(o.variant, []).append(o)
    pruned = 0
    for opts in by_variant.values():
        for i, b in enumerate(opts):
            dominated = False
            for j, a in enumerate(opts):
                if i == j:
                    continue
                if _dominates(a, b) and (not _dominates(b, a) or j < i):
                    dominated = True
                    break
            if dominated:
                pruned += 1
            else:
                keep.append(b)
    return keep, pruned


def _dominates(a: MixOption, b: MixOption) -> bool:
    """Whether ``k = ceil(capacity_b / capacity_a)`` instances of ``a`` replace one of ``b``
    at no more cost, budget use, idle power or energy per request (:func:`prune_dominated`)."""
    if a.capacity_rps <= 0:
        return False
    k = max(1, math.ceil(b.capacity_rps / a.capacity_rps - 1e-9))
    if k * a.cost_per_hour > b.cost_per_hour + _EPS:
        return False
    ea, eb = a.energy_j_per_request, b.energy_j_per_request
    if (ea is None) != (eb is None):
        return False
    if ea is not None and eb is not None and ea > eb + _EPS:
        return False
    if ea is not None and k * a.idle_power_w > b.idle_power_w + _EPS:
        return False
    keys = set(a.usage) | set(b.usage)
    return all(k * a.usage.get(key, 0.0) <= b.usage.get(key, 0.0) + _EPS for key in keys)

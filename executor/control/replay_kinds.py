"""What-if replay of glet and geo plans (``greenctl replay --kind glet|geo``).

:func:`greenctl.executor.control.replay.replay` hands a glet or geo replay here
(:func:`replay_kind`); both answer in its shape (``{"meta", "summary", "intervals"}``) and
write the same files (:func:`greenctl.data.replay_report.write_replay`).

**glet** (gpulet). The plan's models share one load trace as their planned rates share it
(a model's ``rate_rps`` in the request is its weight), or each reads its own trace
(``model_traces``). At each interval every model's peak is forecast (per-interval peaks
before it, through ``replan``'s forecasters) and the running plan is planned again through
the decision ``replan`` itself takes (:func:`greenctl.executor.control.replan.replan_choice`:
the glet kind's own request rewrite, each model at its forecast, and its own rule of when a
new layout is worth a change, with ``threshold``), not sooner than ``min_dwell_s`` after
the last change. A change pays its reconfiguration: each glet that starts loads its models
for their variants' ``load_time_s`` while the running glets serve and the GPUs of both are
held (the new GPUs are numbered after the running ones, so the union counts). Each second
of the trace is evaluated as ``simulate --analytic`` evaluates a glet plan
(:func:`greenctl.executor.kinds.predict_serving`: the evaluation core's
:func:`~greenctl.planner.core.evaluate.predict`, each executor batching over its glet's duty
cycle, each model held to its own SLO), deployment by deployment (the load of a model's
variant split over its glets by their planned quotas, as the dispatcher splits it), exact
at the loads of :data:`EVAL_GRID` and interpolated between them. Accounted per interval: GPUs and GPU-hours, SLO violations per model, energy (the
profiles' power, or an assumed power per GPU when they hold none: idle power for every GPU
in use plus the busy share of each glet's partition), carbon and water. Baseline ``base``:
the glet plan sized for each model's peak of the window (static); gpulet's own scheduler is
greenctl's glet planner, the ``greenctl`` row.

**geo** (eGLB). The sites and demand files are the traces (each site's price, carbon and
water per step; each gateway's load). ``greenctl`` takes eGLB's online step each slot
(:func:`greenctl.planner.geo.solve.online_replan`, warm-started from the state of the slot
before, as ``replan`` of a routed geo plan does each slot); a plan of an offline algorithm
is replayed with its online twin ``eglb``. With ``every`` longer than a slot the step is
taken every so many slots (from the stored state, over the slots since), and the slots
between route each gateway with the last fractions (load over a site's capacity is not
served). Baselines (:data:`GEO_BASELINES`): ``offline``, the eGLB optimum solved once for
the whole window (an oracle that knows the future); ``nearest``, each gateway to its nearest
site (carbon-unaware); ``glb-energy``, the cheapest energy (carbon-unaware). Per slot: load,
energy, cost, carbon and water, and the planner's equity figures (the largest site's carbon
and water so far, and their ratio to the per-site average).

Every figure is modeled; the result says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL_S, REPLAN_THRESHOLD
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import PIN_MIG_INSTANCE, kind_of

#: the kinds this module replays
KINDS = ("glet", "geo")
GLET_BASELINES = ("base",)
GEO_BASELINES = ("offline", "nearest", "glb-energy")
#: the baselines a replay of each kind runs unless told
DEFAULT_BASELINES: dict[str, tuple[str, ...]] = {
    "glet": ("base",),
    "geo": ("offline", "nearest"),
}
#: the mix/mig baselines: asked of a glet or geo replay they are left out with a note
OTHER_BASELINES = ("base", "co2opt", "vpa", "infaas")
#: assumed power of one GPU (idle W, busy W) when the profiles hold none (gpulet's do not)
DEFAULT_GPU_POWER_W = (50.0, 250.0)
#: a glet deployment's figures are interpolated between exact ones at these shares of its
#: capacity: every 5 %, and ``1 - 0.7^i`` towards capacity (where the figures steepen and the
#: analytic model is slow); above the last (1 % short of capacity) its figures hold up to
#: capacity (they move little there; at capacity every request violates)
EVAL_GRID = tuple(
    sorted({round(0.05 * k, 9) for k in range(20)} | {round(1.0 - 0.7**i, 9) for i in range(1, 13)})
)
#: a slot's routing "changes" when some site's share of the load moves more than this
GEO_SHARE_MOVE = 0.01

GLET_INTERVAL_COLUMNS = (
    "policy",
    "interval",
    "time",
    "offset_s",
    "requests",
    "peak_rps",
    "forecast_rps",
    "carbon_g_per_kwh",
    "action",
    "config",
    "units",
    "gpu_hours",
    "reconfig_s",
    "violations",
    "violation_frac",
    "energy_j",
    "carbon_g",
    "water_l",
)
GLET_SUMMARY_COLUMNS = (
    "policy",
    "requests",
    "violations",
    "violation_pct",
    "gpu_hours",
    "mean_units",
    "max_units",
    "energy_kwh",
    "carbon_g",
    "water_l",
    "changes",
)
GEO_INTERVAL_COLUMNS = (
    "policy",
    "interval",
    "time",
    "offset_s",
    "load_mw",
    "carbon_g_per_kwh",
    "action",
    "config",
    "units",
    "unserved_mwh",
    "energy_kwh",
    "cost_usd",
    "carbon_g",
    "water_l",
    "carbon_kg_max_site",
    "carbon_max_over_avg",
    "water_l_max_site",
    "water_max_over_avg",
    "objective_usd",
)
GEO_SUMMARY_COLUMNS = (
    "policy",
    "load_mwh",
    "unserved_mwh",
    "energy_kwh",
    "cost_usd",
    "carbon_g",
    "water_l",
    "carbon_kg_max_site",
    "carbon_max_over_avg",
    "water_l_max_site",
    "water_max_over_avg",
    "objective_usd",
    "changes",
    "mean_units",
)
GLET_MODELED = (
    "modeled: profiles + the evaluation core's analytic predict of the glet plan (as simulate "
    "--analytic: each executor batching over its glet's duty cycle, each model held to its "
    "own SLO) per second of the load trace"
)
GEO_MODELED = (
    "modeled: the sites' price, carbon and water traces and the gateways' load (the geo "
    "planner's accounting: energy cost, carbon, water per site)"
)


# -- which kind, and the entry ------------------------------------------------------------------
def replayed_kind(store: Any, *, kind: str, plan: int | str | None) -> str | None:
    """The kind of this module a replay runs (``plan``: a stored plan's), else None."""
    if plan is not None:
        text = str(plan).strip()
        if not text.isdigit():
            return None  # replay() names the bad id
        stored = store.get_plan(int(text))
        return stored.kind if stored is not None and stored.kind in KINDS else None
    return kind if kind in KINDS else None


def replay_kind(
    store: Any,
    *,
    kind: str,
    load_trace: str | None,
    request: dict[str, Any] | None,
    plan: int | str | None,
    region: str | None,
    carbon_trace: str | None,
    start: str | None,
    hours: float | None,
    every: str | float | int,
    threshold: float,
    margin: float,
    min_dwell_s: float,
    forecaster: str,
    baselines: Sequence[str] | None,
    wue_l_per_kwh: float | None,
    ewif_l_per_kwh: float | None,
    out_dir: str | None,
    progress: Callable[[int, int], None] | None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Replay a glet or geo plan (module docstring) with ``replay``'s options; ``options``:
    the kind's own (glet: ``model_traces``, ``gpu_power_w``, ``carbon_intensity``).
    ``baselines`` None: the kind's defaults (:data:`DEFAULT_BASELINES`)."""
    opts = dict(options or {})
    if kind == "glet":
        unknown = sorted(set(opts) - {"model_traces", "gpu_power_w", "carbon_intensity"})
        if unknown:
            raise InputError(f"a glet replay takes no option {unknown[0]!r}")
        return replay_glet(
            store, request=request, plan=plan, load_trace=load_trace, region=region,
            carbon_trace=carbon_trace, start=start, hours=hours, every=every,
            threshold=threshold, margin=margin, min_dwell_s=min_dwell_s, forecaster=forecaster,
            baselines=baselines, wue_l_per_kwh=wue_l_per_kwh, ewif_l_per_kwh=ewif_l_per_kwh,
            out_dir=out_dir, progress=progress, **opts,
        )  # fmt: skip
    if kind == "geo":
        if opts:
            raise InputError(f"a geo replay takes no option {sorted(opts)[0]!r}")
        ignored = [
            name
            for name, given in (
                ("--load-trace", load_trace),
                ("--region", region),
                ("--carbon-trace", carbon_trace),
            )
            if given is not None
        ]
        if ignored:
            raise InputError(
                f"a geo replay reads its load and carbon from the sites and demand files; "
                f"{ignored[0]} does not apply",
                hint="drop it; pass --sites and --demand (or --plan ID of a geo plan)",
            )
        return replay_geo(
            store, request=request, plan=plan, start=start, hours=hours, every=every,
            baselines=baselines, out_dir=out_dir, progress=progress,
        )  # fmt: skip
    raise InputError(f"replay_kind replays {' and '.join(KINDS)}, not {kind}")


def _check_out_dir(out_dir: str | None) -> None:
    if out_dir is not None:
        from pathlib import Path

        where = Path(out_dir)
        if where.exists() and not where.is_dir():
            raise InputError(f"-o {out_dir} is a file", hint="name a folder (created if absent)")


def _chosen_baselines(
    kind: str, baselines: Sequence[str] | None, notes: list[str]
) -> tuple[str, ...]:
    """The baselines to run of those asked (None: the kind's defaults); the mix/mig ones
    are left out with a note, unknown names refused."""
    if baselines is None:
        return DEFAULT_BASELINES[kind]
    own = GLET_BASELINES if kind == "glet" else GEO_BASELINES
    out = []
    for name in baselines:
        if name in own:
            if name not in out:
                out.append(name)
        elif name in OTHER_BASELINES:
            notes.append(
                f"{name}: not a baseline of a {kind} plan ({kind} baselines: {', '.join(own)})"
            )
        else:
            raise InputError(
                f"--baseline {name!r} is unknown for a {kind} replay",
                hint=f"use one of {', '.join(own)}",
            )
    return tuple(out)


def _load_plan(store: Any, plan: int | str, kind: str) -> Plan:
    text = str(plan).strip()
    if not text.isdigit():
        raise InputError(f"--plan '{plan}' is not a plan id", hint="see `greenctl plan list`")
    got = store.get_plan(int(text))
    if got is None:
        raise InputError(f"no plan {text}", hint="see `greenctl plan list`")
    if got.kind != kind:
        raise InputError(f"plan {text} is a {got.kind} plan, not {kind}")
    return got


# -- forecasts ------------------------------------------------------------------------------------
def forecast_peaks(
    series: np.ndarray, first_s: int, seconds: int, every_s: int, f: Any, name: str
) -> tuple[np.ndarray, np.ndarray, str]:
    """One-step-ahead forecasts of a per-second series' per-interval peaks over the window
    ``[first_s, first_s + seconds)``, each from the peaks before it (the history before the
    window included when the window starts on an interval boundary), as the mix replay
    forecasts its load.

    Returns:
        (forecasts, the window's actual peaks, a note on how they were made).
    """
    from greenctl.planner.core import forecast as fc

    n = -(-seconds // every_s)
    end = first_s + seconds
    peaks = np.asarray(
        [float(series[first_s + k * every_s : min(first_s + (k + 1) * every_s, end)].max())
         for k in range(n)]
    )  # fmt: skip
    first_k = first_s // every_s
    if first_k >= 1 and first_s % every_s == 0:
        before = fc.minute_maxima(series[:first_s], interval_s=every_s)[:first_k]
        history = np.concatenate([before, peaks])
        out = np.asarray(f.predict_series(history, first_k), dtype=float)[:n]
        note = f"{name} over per-{every_s}s peaks (history before --from used)"
    else:
        out = np.empty(n)
        out[0] = float(series[first_s : first_s + min(60, every_s)].max())
        if n > 1:
            out[1:] = np.asarray(f.predict_series(peaks, 1), dtype=float)[: n - 1]
        note = (
            f"{name} over per-{every_s}s peaks (no history before the window: the first "
            "interval plans for its first minute's peak)"
        )
    return np.maximum(out, 0.0), peaks, note


# == glet ==========================================================================================
@dataclass
class _GletStep:
    """What the glet policy does in one interval."""

    plan: Plan
    action: str
    forecast_rps: float | None = None
    previous: Plan | None = None  # serves while the started glets load
    reconfig_s: float = 0.0


def _gpu_indices(plan: Plan) -> set[int]:
    return {int(g.get("index", n)) for n, g in enumerate(plan.extra.get("gpus") or [])}


def _layout_key(plan: Plan) -> tuple[Any, ...]:
    """What a glet plan runs: its glets with their models' variants, batches, rates and
    cycles (a replanning round's outcome depends on nothing else of it)."""
    out = []
    for n, gpu in enumerate(plan.extra.get("gpus") or []):
        for g in gpu.get("glets") or []:
            out.append(
                (
                    int(gpu.get("index", n)),
                    str(g.get("resource")),
                    tuple(
                        (
                            str(m.get("model")),
                            str(m.get("variant")),
                            int(m.get("batch") or 0),
                            round(float(m.get("rate_rps") or 0.0), 6),
                            round(float(m.get("duty_cycle_ms") or 0.0), 6),
                        )
                        for m in g.get("models") or []
                    ),
                )
            )
    return tuple(sorted(out))


def glet_label(plan: Plan) -> str:
    """``GPU0[vgg16@mps:40 b8 + resnet50@mps:60 b8] GPU1[inception@mps:100 b8]``."""
    parts = []
    for n, gpu in enumerate(plan.extra.get("gpus") or []):
        glets = []
        for g in gpu.get("glets") or []:
            names = "/".join(f"{m.get('model')} b{m.get('batch')}" for m in g.get("models") or [])
            glets.append(f"{names}@{g.get('resource')}")
        parts.append(f"GPU{gpu.get('index', n)}[{' + '.join(glets)}]")
    return " ".join(parts)


def _started_load_time_s(
    old: Plan, new: Plan, load_time: Mapping[str, float | None], unmodeled: set[str]
) -> float:
    """The longest load time of the models of the glets ``new`` starts (glets ``old`` does not
    run: :func:`~greenctl.planner.glet.moves.glet_key`)."""
    from collections import Counter

    from greenctl.planner.glet.moves import glet_key

    def keys(plan: Plan) -> Counter[Any]:
        gpus = plan.extra.get("gpus") or []
        return Counter(glet_key(int(g.get("index", n)), gl) for n, g in enumerate(gpus)
                       for gl in g.get("glets") or [])  # fmt: skip

    longest = 0.0
    for _, _, models in keys(new) - keys(old):
        for _, variant, _ in models:
            lt = load_time.get(variant)
            if lt is None:
                unmodeled.add(variant)
            else:
                longest = max(longest, float(lt))
    return longest


class _GletEvaluator:
    """A glet plan's seconds at their rates, deployment by deployment (memoised: traces
    repeat their rates and replans keep deployments)."""

    def __init__(
        self,
        table: Mapping[Any, Any],
        variants: Mapping[str, Any],
        slo: Mapping[str, float],
        policy: Callable[[Plan], str],
        gpu_power_w: tuple[float, float] | None,
    ) -> None:
        self.table, self.variants, self.slo, self.policy = table, variants, dict(slo), policy
        self.gpu_power_w = gpu_power_w  # None: the profiles' own power
        self.memo: dict[Any, tuple[float, ...]] = {}
        self.caps: dict[Any, float] = {}
        self._plans: dict[int, tuple[Plan, str, list[tuple[Deployment, float, float]]]] = {}

    def _parts(self, plan: Plan) -> tuple[str, list[tuple[Deployment, float, float]]]:
        """(policy, [(deployment, its share of its variant's load, GPU share per instance)])."""
        from greenctl.data.resources import kind_of

        got = self._plans.get(id(plan))
        if got is not None and got[0] is plan:
            return got[1], got[2]
        by_variant: dict[str, float] = {}
        for d in plan.deployments:
            by_variant[d.variant] = by_variant.get(d.variant, 0.0) + max(d.quota_rps or 0.0, 0.0)
        count: dict[str, int] = {}
        for d in plan.deployments:
            count[d.variant] = count.get(d.variant, 0) + 1
        parts = []
        for d in plan.deployments:
            total = by_variant[d.variant]
            share = (d.quota_rps or 0.0) / total if total > 0 else 1.0 / count[d.variant]
            size = d.resource.partition(":")[2]
            try:
                gpu = float(kind_of(d.resource).gpu_fraction(size))
            except InputError:
                gpu = 0.0
            parts.append((d, share, gpu))
        pol = self.policy(plan)
        self._plans[id(plan)] = (plan, pol, parts)
        return pol, parts

    def _exact(self, key: tuple[Any, ...], dep: Deployment, rate: float) -> tuple[float, ...]:
        """(violating share, dropped req/s, utilisation, power W or NaN) at ``rate``."""
        from greenctl.planner.core.evaluate import predict

        got = self.memo.get((key, rate))
        if got is None:
            m = predict(
                [replace(dep, quota_rps=None)],
                self.table,
                self.variants,
                rate_rps=rate,
                policy=key[-1],
                percentile_slo_ms=self.slo or None,
            )
            power = m.get("power_w")
            got = self.memo[(key, rate)] = (
                min(max(float(m.get("slo_violation_frac") or 0.0), 0.0), 1.0),
                float(m.get("dropped_rps") or 0.0),
                float(m.get("utilisation") or 0.0),
                math.nan if power is None else float(power),
            )
        return got

    def _capacity(self, key: tuple[Any, ...], dep: Deployment) -> float:
        from greenctl.planner.core.evaluate import build_instances

        cap = self.caps.get(key)
        if cap is None:
            insts = build_instances([replace(dep, quota_rps=None)], self.table)
            cap = self.caps[key] = float(sum(i.capacity_rps for i in insts))
        return cap

    def _at(self, dep: Deployment, policy: str, rates: np.ndarray) -> np.ndarray:
        """The deployment's figures (``[seconds, 4]``: :meth:`_exact`'s) at each of
        ``rates``: exact at and above its capacity (and at 0), else interpolated linearly
        between the exact figures at the two nearest loads of :data:`EVAL_GRID` (a trace's
        rates are many; the analytic model is smooth below capacity, and slow near it)."""
        cycle = (
            (dep.placement or {}).get("duty_cycle_ms") if isinstance(dep.placement, dict) else None
        )
        key = (dep.variant, dep.resource, dep.batch, dep.count, cycle, policy)
        cap = self._capacity(key, dep)
        out = np.empty((rates.size, 4))
        inside = (rates > 0) & (rates < cap) if cap > 0 else np.zeros(rates.size, dtype=bool)
        for r in np.unique(rates[~inside]).tolist():
            out[rates == r] = self._exact(key, dep, float(r))
        if not inside.any():
            return out
        grid = np.asarray(EVAL_GRID)
        u = rates[inside] / cap
        i = np.searchsorted(grid, u, side="right") - 1
        last = grid.size - 1
        j = np.minimum(i + 1, last)
        points = {int(k): self._exact(key, dep, cap * float(grid[k]))
                  for k in np.unique(np.concatenate([i, j])).tolist()}  # fmt: skip
        lo = np.asarray([points[int(k)] for k in i])
        hi = np.asarray([points[int(k)] for k in j])
        span = grid[j] - grid[i]
        w = np.where(span > 0, (u - grid[i]) / np.where(span > 0, span, 1.0), 0.0)
        out[inside] = lo + w[:, None] * (hi - lo)
        return out

    def seconds(
        self, plan: Plan, variant_rates: Mapping[str, np.ndarray], gpus: int
    ) -> dict[str, Any]:
        """Totals over the seconds of ``variant_rates`` (each variant's rate per second) on
        ``plan`` holding ``gpus`` GPUs: requests and violations per variant, and energy (J;
        None when the profiles hold no power and none is assumed)."""
        pol, parts = self._parts(plan)
        nsec = max((r.size for r in variant_rates.values()), default=0)
        req = {v: float(rates.sum()) for v, rates in variant_rates.items()}
        viol = dict.fromkeys(variant_rates, 0.0)
        energy = 0.0
        power_known = True
        served_by: set[str] = set()
        for dep, share, gpu in parts:
            got = variant_rates.get(dep.variant)
            if got is None or got.size == 0:
                continue
            served_by.add(dep.variant)
            rates = np.asarray(got, dtype=float) * share
            figs = self._at(dep, pol, rates)
            if self.slo.get(dep.variant) is not None:
                viol[dep.variant] += float((figs[:, 0] * rates).sum())
            else:
                viol[dep.variant] += float(np.minimum(figs[:, 1], rates).sum())
            if self.gpu_power_w is None:
                if np.isnan(figs[:, 3]).any():
                    power_known = False
                else:
                    energy += float(figs[:, 3].sum())
            else:
                idle, busy = self.gpu_power_w
                energy += (busy - idle) * gpu * dep.count * float(figs[:, 2].sum())
        for v in variant_rates:  # a variant the plan does not run: every request violates
            if v not in served_by:
                viol[v] = req[v]
        if self.gpu_power_w is not None:
            energy += self.gpu_power_w[0] * gpus * nsec
        return {
            "requests": req,
            "violations": viol,
            "energy_j": energy if power_known else None,
        }


def _glet_models(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    models = request.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(
            "a glet replay needs the plan's models",
            hint="pass --model NAME:RATE:SLO_MS (repeatable) or --spec FILE, as plan glet",
        )
    out = []
    for n, m in enumerate(models):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise InputError(f"request.models[{n}] needs a name")
        out.append(m)
    return out


def replay_glet(
    store: Any,
    *,
    request: dict[str, Any] | None = None,
    plan: int | str | None = None,
    load_trace: str | None = None,
    model_traces: Mapping[str, str] | None = None,
    region: str | None = None,
    carbon_trace: str | None = None,
    carbon_intensity: float | None = None,
    start: str | None = None,
    hours: float | None = None,
    every: str | float | int = 60,
    threshold: float = REPLAN_THRESHOLD,
    margin: float = REPLAN_MARGIN,
    min_dwell_s: float = REPLAN_MIN_DWELL_S,
    forecaster: str | None = None,
    baselines: Sequence[str] | None = None,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    gpu_power_w: tuple[float, float] | None = None,
    out_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Replay a glet plan's replan loop over a load trace (module docstring).

    Args:
        request: a glet request (``plan glet``'s: ``models`` with ``name``, ``rate_rps``,
            ``slo_ms``[, ``variant``], ``partitions``, ``max_gpus``, ...); a model's
            ``rate_rps`` is its share of ``load_trace``; or ``plan``: a stored glet plan's id.
        load_trace: the total requests per second; model_traces: ``{model name: file}``,
            a model's own trace (its share of ``load_trace`` otherwise).
        carbon_intensity: the constant intensity without ``region``/``carbon_trace``
            (default 400 g/kWh). gpu_power_w: (idle W, busy W) of one GPU, used when the
            profiles hold no power (default :data:`DEFAULT_GPU_POWER_W`, labelled assumed).
        Others: as :func:`greenctl.executor.control.replay.replay`.

    Returns:
        ``{"meta", "summary", "intervals"}`` as ``replay``'s, with GPU-hours and per-model
        violations (``per_model``).

    Raises:
        InputError: a bad option (named), a missing trace, a window beyond a trace.
    """
    from greenctl.data.traces import read_rps_trace
    from greenctl.executor.control import forecasters, replan
    from greenctl.executor.control.replay_inputs import iso_at, parse_every, trace_window
    from greenctl.executor.kinds import GLET_MIN_RATE_RPS, get_kind, plan_inputs
    from greenctl.planner.core.simulator import model_slos, pick_profiles, sized_slo_ms
    from greenctl.planner.mix.solve import REFERENCE_CARBON_INTENSITY

    t_wall = time.perf_counter()
    _check_out_dir(out_dir)
    if threshold < 0 or margin < 0:
        raise InputError("--threshold and --margin must be >= 0")
    notes: list[str] = []
    chosen = _chosen_baselines("glet", baselines, notes)
    every_s = parse_every(every)
    if (request is None) == (plan is None):
        raise InputError("replay needs the kind's planning inputs or --plan ID, not both")
    first_plan: Plan | None = None
    if plan is not None:
        first_plan = _load_plan(store, plan, "glet")
        request = dict(first_plan.request)
    assert request is not None
    request = dict(request)
    models = _glet_models(request)
    names = [str(m["name"]) for m in models]
    if len(set(names)) != len(names):
        raise InputError("the glet models' names must differ", hint="one --model per name")
    own = dict(model_traces or {})
    stray = [k for k in own if k not in names]
    if stray:
        raise InputError(
            f"--model-trace {stray[0]}=...: the plan serves no model {stray[0]!r}",
            hint="name one of its models: " + ", ".join(names),
        )
    shared = [n for n in names if n not in own]
    if shared and load_trace is None:
        raise InputError(
            "--load-trace is required: "
            + ", ".join(shared)
            + (" has" if len(shared) == 1 else " have")
            + " no trace of its own (--model-trace NAME=FILE)",
            hint="pass --load-trace FILE (the models share it as their rates do)",
        )
    power = gpu_power_w
    if power is not None:
        idle, busy = (float(x) for x in power)
        if not (math.isfinite(idle) and math.isfinite(busy) and 0 <= idle <= busy):
            raise InputError(
                f"--gpu-power-w {idle:g}:{busy:g} must be IDLE:BUSY watts, 0 <= idle <= busy"
            )
        power = (idle, busy)
    ci0 = float(carbon_intensity or request.get("carbon_intensity") or REFERENCE_CARBON_INTENSITY)
    main_trace = load_trace if load_trace is not None else own[names[0]]
    win = trace_window(
        store, load_trace=main_trace, region=region, carbon_trace=carbon_trace,
        carbon_intensity=ci0, start=start, hours=hours, every_s=every_s,
    )  # fmt: skip
    n = win.intervals
    end = win.first_s + win.seconds
    # each model's rate per second (history before the window included)
    planned = {str(m["name"]): max(float(m.get("rate_rps") or 0.0), 0.0) for m in models}
    weight = sum(planned[x] for x in shared)
    series: dict[str, np.ndarray] = {}
    for name in names:
        if name in own:
            try:
                s = read_rps_trace(own[name])
            except InputError as exc:
                raise InputError(
                    f"--model-trace {name}={own[name]}: {exc.message}", hint=exc.hint
                ) from None
            if s.size < end:
                raise InputError(
                    f"--model-trace {name}={own[name]} holds {s.size / 3600:.2f} h; the window "
                    f"ends at {end / 3600:.2f} h",
                    hint="shorten --hours or start earlier with --from",
                )
            series[name] = np.asarray(s[:end], dtype=float)
        else:
            share = planned[name] / weight if weight > 0 else 1.0 / len(shared)
            series[name] = np.asarray(win.rps[:end], dtype=float) * share
    from greenctl.planner.core.forecast import DEFAULT_FORECASTER

    forecaster = forecaster or DEFAULT_FORECASTER  # the one default, as replay()'s
    f = forecasters.get_forecaster(store, forecaster)
    forecasts: dict[str, np.ndarray] = {}
    peaks: dict[str, np.ndarray] = {}
    forecast_note = ""
    for name in names:
        forecasts[name], peaks[name], forecast_note = forecast_peaks(
            series[name], win.first_s, win.seconds, every_s, f, forecaster
        )
    total = np.sum([series[x][:end] for x in names], axis=0)
    total_peaks = np.asarray(
        [float(total[a : min(a + every_s, end)].max()) for a in range(win.first_s, end, every_s)]
    )
    if shared and own:
        notes.append(
            f"{', '.join(shared)} share the load trace as their planned rates do; "
            f"{', '.join(own)} read their own traces"
        )
    elif shared and len(shared) > 1:
        notes.append(
            "the models share the load trace as their planned rates do ("
            + ", ".join(f"{x} {planned[x] / weight * 100:.0f} %" if weight > 0 else x
                        for x in shared)
            + ")"
        )  # fmt: skip
    pk = get_kind("glet")
    assert pk.plan is not None

    def plan_at(rates: Mapping[str, float]) -> Plan:
        req = {
            **request,
            "simulate_s": 0.0,
            "models": [{**m, "rate_rps": max(float(rates[str(m["name"])]), GLET_MIN_RATE_RPS)}
                       for m in models],
        }  # fmt: skip
        req.pop("carbon_intensity", None)
        return pk.plan(store, req)[0]  # type: ignore[misc]

    if first_plan is None:
        first_plan = plan_at({x: float(forecasts[x][0]) for x in names})
    elif float(first_plan.request.get("simulate_s") or 0.0) > 0:
        # each replan would check its schedule in a Poisson simulation: not in a replay (the
        # plan read from the store is this replay's own copy)
        first_plan.request["simulate_s"] = 0.0
        notes.append("the replans skip the plan's simulated check of each schedule")
    notes.extend(str(x) for x in first_plan.extra.get("notes") or [])
    # the evaluation core's inputs, as `simulate` takes them for a glet plan
    profiles, variant_list = plan_inputs(store, first_plan)
    by_name = {v.name: v for v in variant_list}
    slo = sized_slo_ms(first_plan, by_name) or model_slos(first_plan)
    table = pick_profiles(profiles, slo)
    variant_of = {
        str(m["name"]): str(m.get("variant") or m["name"])
        for m in first_plan.request.get("models") or models
    }
    missing_v = sorted({v for v in variant_of.values() if v not in by_name})
    if missing_v:
        raise InputError(
            f"no variant {missing_v[0]} in the store", hint="import its profiles first"
        )
    measured_power = all(
        p.power_w is not None for (v, _, _), p in table.items() if v in set(variant_of.values())
    )
    if measured_power:
        power_note = "energy: the profiles' power" + (
            "" if power is None else " (--gpu-power-w is for profiles without power: not used)"
        )
        power = None
    else:
        power = power or DEFAULT_GPU_POWER_W
        power_note = (
            f"energy: ASSUMED {power[0]:g} W per GPU in use plus {power[1] - power[0]:g} W x "
            "each glet's partition share x its busy fraction (the profiles hold no power; "
            "--gpu-power-w IDLE:BUSY)"
        )
    notes.append(power_note)
    notes.append(
        "each executor is evaluated on its partition alone, as simulate --analytic evaluates a "
        "glet plan: the turns of models time-sharing a glet and a co-runner's interference are "
        "in the planner's duty-cycle bound (plan glet's p99), not in these figures"
    )
    ev = _GletEvaluator(table, by_name, slo, lambda p: pk.dispatch_policy(p), power)
    load_time = {v: getattr(by_name.get(v), "load_time_s", None) for v in set(variant_of.values())}
    unmodeled: set[str] = set()
    partitions = first_plan.request.get("partitions") or []
    if any(kind_of(str(p)).pinning == PIN_MIG_INSTANCE for p in partitions):
        notes.append(
            "glet on MIG partitions: a MIG layout change's own time (destroying and creating GPU "
            "instances) is not modeled, as in replay --kind mig"
        )

    # -- greenctl: the replan loop ------------------------------------------------------------
    rounds = replan.ReplanRounds(min_dwell_s)
    stats = rounds.stats

    def greenctl_steps() -> list[_GletStep]:
        running = first_plan
        assert running is not None
        last_change: str | None = None
        total0 = float(sum(forecasts[x][0] for x in names))
        out = [_GletStep(running, "start", total0)]
        for k in range(1, n):
            if progress:
                progress(k, n)
            when = iso_at(win.start_time, k * every_s)
            rates = {x: float(forecasts[x][k]) for x in names}
            total = float(sum(rates.values()))
            action, new = rounds.decide(
                (_layout_key(running), tuple(round(rates[x], 6) for x in names)),
                partial(
                    replan.replan_choice, store, running, signal=None, reference=None,
                    threshold=threshold, margin=margin, forecast=rates.get,
                ),
                last_change=last_change, when=when,
            )  # fmt: skip
            if new is None:
                out.append(_GletStep(running, action, total))
            else:
                lt = _started_load_time_s(running, new, load_time, unmodeled)
                out.append(_GletStep(new, "change", total, running, lt))
                running, last_change = new, when
        return out

    policies: dict[str, list[_GletStep]] = {"greenctl": greenctl_steps()}
    t_greenctl = time.perf_counter() - t_wall
    peak_rates = {x: float(series[x][win.first_s : end].max()) for x in names}
    if "base" in chosen:
        try:
            base = plan_at(peak_rates)
            policies["base"] = [_GletStep(base, "start", None)] + [
                _GletStep(base, "keep", None) for _ in range(1, n)
            ]
        except InfeasiblePlan as exc:
            notes.append(f"base: left out, it cannot carry the peak ({exc.message})")

    # -- accounting ---------------------------------------------------------------------------
    pue = float(request.get("pue") or 1.0)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    for k in range(n):
        a = win.first_s + k * every_s
        b = min(a + every_s, end)
        model_rates = {x: series[x][a:b] for x in names}
        t_iso = iso_at(win.start_time, k * every_s)
        for name, steps in policies.items():
            rows[name].append(
                _glet_account(ev, steps[k], model_rates, variant_of, k, t_iso, k * every_s,
                              float(win.carbon[k]), pue, wue_l_per_kwh, ewif_l_per_kwh, name,
                              float(total_peaks[k]))
            )  # fmt: skip
    summary = [_glet_summarise(name, rs, names) for name, rs in rows.items()]
    if unmodeled:
        notes.append(
            "reconfiguration time not modeled for "
            + ", ".join(sorted(unmodeled))
            + " (no load_time_s in the profiles): 0 s"
        )
    if wue_l_per_kwh is None and ewif_l_per_kwh is None:
        notes.append("water not modeled: pass --wue/--ewif (L/kWh)")
    wall = time.perf_counter() - t_wall
    meta = {
        "kind": "glet",
        "family": "glet: " + ", ".join(names),
        "models": [
            {
                "name": x,
                "variant": variant_of[x],
                "slo_ms": slo.get(variant_of[x]),
                "trace": own.get(x) or "load trace",
                "share": None if x in own else (planned[x] / weight if weight > 0 else None),
                "peak_rps": peak_rates[x],
            }
            for x in names
        ],
        "load_trace": None if load_trace is None else str(load_trace),
        "model_traces": {k: str(v) for k, v in own.items()},
        "from_offset_s": win.first_s,
        "start": win.start_time,
        "hours": win.seconds / 3600,
        "every_s": every_s,
        "intervals": n,
        "carbon": win.carbon_source,
        "forecaster": forecaster,
        "forecast": forecast_note + (" per model" if len(names) > 1 else ""),
        "threshold": threshold,
        "margin": margin,
        "min_dwell_s": min_dwell_s,
        "slo_ms": None,
        "slos_ms": {x: slo.get(variant_of[x]) for x in names},
        "percentile": "each model's own SLO",
        "units": "GPUs",
        "first_plan": glet_label(first_plan),
        "first_plan_id": first_plan.id,
        "baselines": list(chosen),
        "peak_rps": float(total_peaks.max()) if n else 0.0,
        "replan": dict(stats),
        "wall_s": round(wall, 3),
        "wall_greenctl_loop_s": round(t_greenctl, 3),
        "evaluations": len(ev.memo),
        "modeled": GLET_MODELED,
        "power": "profiles"
        if power is None
        else {"idle_w": power[0], "busy_w": power[1], "assumed": True},
        "water": None
        if wue_l_per_kwh is None and ewif_l_per_kwh is None
        else {"wue_l_per_kwh": wue_l_per_kwh, "ewif_l_per_kwh": ewif_l_per_kwh},
        "notes": notes,
    }
    columns = list(GLET_INTERVAL_COLUMNS) + [f"violations:{x}" for x in names]
    sum_columns = list(GLET_SUMMARY_COLUMNS) + [f"violation_pct:{x}" for x in names]
    return _finish(meta, summary, rows, out_dir, columns, sum_columns)


def _glet_account(
    ev: _GletEvaluator,
    step: _GletStep,
    model_rates: Mapping[str, np.ndarray],
    variant_of: Mapping[str, str],
    k: int,
    t_iso: str,
    offset_s: float,
    ci: float,
    pue: float,
    wue: float | None,
    ewif: float | None,
    policy: str,
    peak: float,
) -> dict[str, Any]:
    """One interval of one glet policy: the seconds of its reconfiguration on what served
    before (the GPUs of both held), the rest on its plan."""
    size = max((r.size for r in model_rates.values()), default=0)
    split = min(math.ceil(step.reconfig_s), size) if step.reconfig_s > 0 else 0

    def by_variant(a: int, b: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, rates in model_rates.items():
            v = variant_of[name]
            part = rates[a:b]
            out[v] = out[v] + part if v in out else part.copy()
        return out

    parts = []
    gpu_s = 0.0
    new_gpus = _gpu_indices(step.plan)
    if split and step.previous is not None:
        held = len(_gpu_indices(step.previous) | new_gpus)
        parts.append(ev.seconds(step.previous, by_variant(0, split), held))
        gpu_s += held * split
    parts.append(ev.seconds(step.plan, by_variant(split, size), len(new_gpus)))
    gpu_s += len(new_gpus) * (size - split)
    req_v: dict[str, float] = {}
    viol_v: dict[str, float] = {}
    energy: float | None = 0.0
    for p in parts:
        for v, x in p["requests"].items():
            req_v[v] = req_v.get(v, 0.0) + x
        for v, x in p["violations"].items():
            viol_v[v] = viol_v.get(v, 0.0) + x
        energy = None if energy is None or p["energy_j"] is None else energy + p["energy_j"]
    # a variant's violations go to its models as their requests do
    per_model: dict[str, dict[str, float]] = {}
    for name, rates in model_rates.items():
        v = variant_of[name]
        reqs = float(rates.sum())
        share = reqs / req_v[v] if req_v.get(v) else 0.0
        per_model[name] = {"requests": reqs, "violations": viol_v.get(v, 0.0) * share}
    requests = sum(m["requests"] for m in per_model.values())
    violations = sum(m["violations"] for m in per_model.values())
    kwh = None if energy is None else energy / 3.6e6
    water = (
        None
        if kwh is None or (wue is None and ewif is None)
        else kwh * (pue * (ewif or 0.0) + (wue or 0.0))
    )
    row: dict[str, Any] = {
        "policy": policy,
        "interval": k,
        "time": t_iso,
        "offset_s": offset_s,
        "requests": requests,
        "peak_rps": peak,
        "forecast_rps": step.forecast_rps,
        "carbon_g_per_kwh": ci,
        "action": step.action,
        "config": glet_label(step.plan),
        "units": float(len(new_gpus)),
        "gpu_hours": gpu_s / 3600.0,
        "reconfig_s": float(split),
        "violations": violations,
        "violation_frac": violations / requests if requests > 0 else 0.0,
        "accuracy": None,
        "energy_j": energy,
        "carbon_g": None if kwh is None else kwh * pue * ci,
        "water_l": water,
        "cost_usd": None,
        "per_model": per_model,
    }
    for name, m in per_model.items():
        row[f"violations:{name}"] = m["violations"]
    return row


def _glet_summarise(policy: str, rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    req = sum(r["requests"] for r in rows)
    viol = sum(r["violations"] for r in rows)

    def total(key: str) -> float | None:
        vals = [r[key] for r in rows]
        return None if any(v is None for v in vals) else float(sum(vals))

    energy = total("energy_j")
    per_model = {}
    for name in names:
        mr = sum(r["per_model"][name]["requests"] for r in rows)
        mv = sum(r["per_model"][name]["violations"] for r in rows)
        per_model[name] = {
            "requests": mr,
            "violations": mv,
            "violation_pct": 100.0 * mv / mr if mr > 0 else 0.0,
        }
    out = {
        "policy": policy,
        "requests": req,
        "violations": viol,
        "violation_pct": 100.0 * viol / req if req > 0 else 0.0,
        "accuracy": None,
        "gpu_hours": sum(r["gpu_hours"] for r in rows),
        "mean_units": sum(r["units"] for r in rows) / len(rows) if rows else 0.0,
        "max_units": max((r["units"] for r in rows), default=0.0),
        "energy_kwh": None if energy is None else energy / 3.6e6,
        "carbon_g": total("carbon_g"),
        "water_l": total("water_l"),
        "cost_usd": None,
        "changes": sum(1 for r in rows if r["action"] == "change"),
        "per_model": per_model,
    }
    for name in names:
        out[f"violation_pct:{name}"] = per_model[name]["violation_pct"]
    return out


def _finish(
    meta: dict[str, Any],
    summary: list[dict[str, Any]],
    rows: dict[str, list[dict[str, Any]]],
    out_dir: str | None,
    columns: list[str],
    summary_columns: list[str],
) -> dict[str, Any]:
    result: dict[str, Any] = {"meta": meta, "summary": summary, "intervals": rows}
    if out_dir is not None:
        from greenctl.data.replay_report import write_replay

        meta["files"] = write_replay(
            result, out_dir, interval_columns=columns, summary_columns=summary_columns
        )
    return result


# == geo ===========================================================================================
def _geo_slice(problem: Any, a: int, b: int) -> Any:
    """``problem`` cut to its steps ``a .. b - 1``."""
    return replace(
        problem,
        times=list(problem.times[a:b]),
        price_usd_per_mwh=problem.price_usd_per_mwh[a:b],
        carbon_g_per_kwh=problem.carbon_g_per_kwh[a:b],
        wue_l_per_kwh=problem.wue_l_per_kwh[a:b],
        ewif_l_per_kwh=problem.ewif_l_per_kwh[a:b],
        pue=problem.pue[a:b],
        capacity_mw=problem.capacity_mw[a:b],
        load_mw=problem.load_mw[a:b],
        demand_lines=list(problem.demand_lines[a:b]) if problem.demand_lines else [],
    )


def _geo_window(
    problem: Any, start: str | None, hours: float | None, every: str | float | int, notes: list[str]
) -> tuple[int, int, int]:
    """(first slot, slots, slots per replan) of ``--from``, ``--hours`` and ``--every`` on the
    files' steps."""
    from greenctl.data.carbon_io import normalise_time
    from greenctl.executor.control.replay_inputs import parse_every, parse_from

    step_s = problem.step_h * 3600.0
    T = problem.n_steps
    every_s = parse_every(every)
    offset_s, at = parse_from(start)
    if at is not None:
        times = [normalise_time(t) for t in problem.times]
        first = next((i for i, t in enumerate(times) if t >= at), None)
        if first is None or (first == 0 and at < times[0]):
            raise InputError(
                f"--from {start} is outside the sites and demand files ({problem.times[0]} .. "
                f"{problem.times[-1]})",
                hint="start within them",
            )
        if times[first] != at:
            raise InputError(
                f"--from {start} is not a step of the files (the next is {problem.times[first]})",
                hint=f"start on a step ({problem.step_h:g} h apart)",
            )
    else:
        first = round(offset_s / step_s)
        if abs(first * step_s - offset_s) > 1e-6:
            raise InputError(
                f"--from {start} does not fall on a step of the files ({problem.step_h:g} h)",
                hint=f"use a multiple of {problem.step_h:g} h",
            )
    if first >= T:
        raise InputError(
            f"--from {start} is past the end of the files ({T} steps of {problem.step_h:g} h)",
            hint="start within them",
        )
    left = T - first
    if hours is None:
        slots = left
    else:
        if not (math.isfinite(hours) and hours > 0):
            raise InputError(f"--hours must be a number > 0, got {hours:g}")
        slots = round(hours * 3600.0 / step_s)
        if slots < 1 or abs(slots * step_s - hours * 3600.0) > 1e-6:
            raise InputError(
                f"--hours {hours:g} is not a whole number of the files' {problem.step_h:g} h steps",
                hint=f"use a multiple of {problem.step_h:g} h",
            )
        if slots > left:
            raise InputError(
                f"--hours {hours:g} goes beyond the files: {left * problem.step_h:g} h are left "
                f"after --from {start or '0'}",
                hint=f"use --hours {left * problem.step_h:g} or less, or start earlier",
            )
    if every_s <= step_s:
        if every_s < step_s:
            notes.append(
                f"--every {every_s} s is finer than the files' {problem.step_h:g} h steps: "
                "one online step per slot"
            )
        per = 1
    else:
        per = round(every_s / step_s)
        if abs(per * step_s - every_s) > 1e-6:
            raise InputError(
                f"--every {every_s} s is not a whole number of the files' {problem.step_h:g} h "
                "steps",
                hint=f"use a multiple of {problem.step_h:g} h",
            )
    return first, slots, per


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _site_shares(y: np.ndarray) -> np.ndarray:
    total = float(y.sum())
    return y / total if total > 0 else np.zeros_like(y)


def replay_geo(
    store: Any,
    *,
    request: dict[str, Any] | None = None,
    plan: int | str | None = None,
    start: str | None = None,
    hours: float | None = None,
    every: str | float | int = 3600,
    baselines: Sequence[str] | None = None,
    out_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Replay eGLB's online step over a geo plan's files, beside the offline optimum and
    carbon-unaware routing (module docstring).

    Args:
        request: a geo request (``plan geo``'s: ``sites``, ``demand``[, ``routes``] CSVs,
            ``algorithm``, ``mu_carbon_usd_per_kg``, ...); or ``plan``: a stored geo plan's id.
        start / hours / every: the window and the replan interval, on the files' steps.
        baselines: of :data:`GEO_BASELINES` (None: :data:`DEFAULT_BASELINES`).

    Returns:
        ``{"meta", "summary", "intervals"}`` with the geo planner's figures per slot.

    Raises:
        InputError: a bad option (named), a window beyond the files. InfeasiblePlan: a slot
        the sites cannot serve.
    """
    from greenctl.executor.kinds import geo_inputs
    from greenctl.planner.geo import solve as geo

    t_wall = time.perf_counter()
    _check_out_dir(out_dir)
    notes: list[str] = []
    chosen = _chosen_baselines("geo", baselines, notes)
    if (request is None) == (plan is None):
        raise InputError("replay needs the kind's planning inputs or --plan ID, not both")
    if plan is not None:
        request = dict(_load_plan(store, plan, "geo").request)
    assert request is not None
    problem, options, variants = geo_inputs(store, dict(request))
    algorithm = str(options.get("algorithm") or "eglb-off")
    online = algorithm if algorithm in geo.ONLINE_ALGORITHMS else "eglb"
    if online != algorithm:
        notes.append(
            f"the plan's algorithm {algorithm} has no online step: greenctl replays eglb (eGLB's "
            "online dual mirror descent); the offline optimum is the baseline 'offline'"
        )
    opts = geo.check_options(**{**options, "algorithm": online, "variants": variants})
    first, slots, per = _geo_window(problem, start, hours, every, notes)
    sub = _geo_slice(problem, first, first + slots)
    S = len(sub.sites)
    cap = sub.capacity_mw

    # -- greenctl: eGLB's online step, warm-started from the slot before -----------------------
    y_g = np.zeros((slots, S))
    unserved = np.zeros(slots)
    actions: list[str] = []
    state = None
    fractions: dict[str, dict[str, float]] = {}
    ratio = np.ones(S)
    index = {
        s: i for i, s in enumerate(sub.sites)
    }  # power per unit of request load per site (variants), at the last step
    decide_s = 0.0
    steps_taken = 0
    for j in range(slots):
        if progress:
            progress(j, slots)
        if j % per == 0:
            t0 = time.perf_counter()
            step = geo.online_replan(sub, online, opts, slot=j, state=state)
            decide_s += time.perf_counter() - t0
            steps_taken += step.steps
            state, fractions = step.state, step.fractions
            y_g[j] = step.site_load_mw
            z = getattr(step, "variant_load", None)
            if z is not None:
                load = np.asarray(z).sum(axis=1)
                ratio = np.where(load > 0, y_g[j] / np.where(load > 0, load, 1.0), 1.0)
            actions.append("start" if j == 0 else "step")
        else:  # the router keeps the last fractions
            load = np.zeros(S)
            lost = 0.0
            for g, gw in enumerate(sub.gateways):
                mw = float(sub.load_mw[j, g])
                split = fractions.get(gw)
                if not split:
                    lost += mw
                    continue
                for site, frac in split.items():
                    load[index[site]] += mw * frac
            y = load * ratio
            over = np.maximum(y - cap[j], 0.0)
            y_g[j] = y - over
            unserved[j] = (
                lost + float((over / np.where(ratio > 0, ratio, 1.0)).sum())
            ) * sub.step_h
            actions.append("hold")
    policies: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {
        "greenctl": (y_g, unserved, actions)
    }
    t_greenctl = time.perf_counter() - t_wall
    solve_s: dict[str, float] = {"greenctl": decide_s}
    for name in chosen:
        alg = "eglb-off" if name == "offline" else name
        try:
            sol = geo.solve(sub, alg, opts)
        except InputError as exc:
            notes.append(f"{name}: left out ({exc.message})")
            continue
        solve_s[name] = sol.solve_s
        policies[name] = (
            np.asarray(sol.site_load_mw, dtype=float),
            np.zeros(slots),
            ["start"] + ["plan"] * (slots - 1),
        )
    rows: dict[str, list[dict[str, Any]]] = {}
    summary = []
    mu_c, mu_w = opts.mu_carbon_usd_per_kg, opts.mu_water_usd_per_l
    for name, (y, unserved_t, acts) in policies.items():
        rs = _geo_rows(sub, name, y, unserved_t, acts, mu_c, mu_w)
        rows[name] = rs
        sites, total = geo.evaluate(sub, y, mu_carbon=mu_c, mu_water=mu_w)
        summary.append(
            {
                "policy": name,
                "load_mwh": float(sub.load_mw.sum() * sub.step_h),
                "unserved_mwh": float(unserved_t.sum()),
                "energy_kwh": float(sum(r["energy_kwh"] for r in rs)),
                "cost_usd": total["energy_cost_usd_total"],
                "carbon_g": total["carbon_kg_total"] * 1000.0,
                "water_l": total["water_l_total"],
                "carbon_kg_max_site": total["carbon_kg_max"],
                "carbon_max_over_avg": total["carbon_max_over_avg"],
                "water_l_max_site": total["water_l_max"],
                "water_max_over_avg": total["water_max_over_avg"],
                "objective_usd": total["objective"],
                "changes": sum(1 for r in rs if r["action"] == "change"),
                "mean_units": float(y.sum(axis=1).mean()) if slots else 0.0,
                "sites": sites,
                "solve_s": solve_s.get(name),
            }
        )
    wall = time.perf_counter() - t_wall
    meta = {
        "kind": "geo",
        "family": f"geo: {_count(len(sub.gateways), 'gateway')} over {_count(S, 'site')}",
        "sites": list(sub.sites),
        "gateways": list(sub.gateways),
        "inputs": {k: v for k, v in sub.sources.items()},
        "algorithm": online,
        "plan_algorithm": algorithm,
        "from_offset_s": first * problem.step_h * 3600.0,
        "start": sub.times[0],
        "hours": slots * sub.step_h,
        "every_s": per * sub.step_h * 3600.0,
        "step_h": sub.step_h,
        "intervals": slots,
        "carbon": "each site's carbon_g_per_kwh in the sites file",
        "mu_carbon_usd_per_kg": mu_c,
        "mu_water_usd_per_l": mu_w,
        "units": "MW",
        "baselines": list(chosen),
        "replan": {"online_steps": steps_taken, "replans": -(-slots // per), "decide_s": decide_s},
        "wall_s": round(wall, 3),
        "wall_greenctl_loop_s": round(t_greenctl, 3),
        "modeled": GEO_MODELED,
        "notes": notes,
    }
    return _finish(
        meta, summary, rows, out_dir, list(GEO_INTERVAL_COLUMNS), list(GEO_SUMMARY_COLUMNS)
    )


def _geo_rows(
    sub: Any,
    policy: str,
    y: np.ndarray,
    lost: np.ndarray,
    actions: list[str],
    mu_c: float,
    mu_w: float,
) -> list[dict[str, Any]]:
    """Per slot of one policy's ``[T, S]`` site power: the planner's accounting, and the
    equity figures of the slots so far."""
    S = len(sub.sites)
    cum_c = np.zeros(S)
    cum_w = np.zeros(S)
    cum_cost = 0.0
    prev: np.ndarray | None = None
    out = []
    for t in range(y.shape[0]):
        yt = y[t]
        carbon_kg = sub.carbon_kg_per_mw[t] * yt
        water = sub.water_l_per_mw[t] * yt
        cost = float((sub.cost_usd_per_mw[t] * yt).sum())
        energy_kwh = float((yt * sub.pue[t]).sum() * sub.step_h * 1000.0)
        cum_c += carbon_kg
        cum_w += water
        cum_cost += cost
        shares = _site_shares(yt)
        moved = prev is not None and float(np.abs(shares - prev).sum()) / 2 > GEO_SHARE_MOVE
        action = actions[t]
        if action in ("step", "plan"):
            action = "change" if moved else "keep"
        prev = shares
        c_avg, w_avg = float(cum_c.sum()) / S, float(cum_w.sum()) / S
        load = float(sub.load_mw[t].sum())
        order = np.argsort(-shares, kind="stable")
        config = " + ".join(
            f"{sub.sites[i]} {shares[i] * 100:.0f}%" for i in order if shares[i] >= 0.005
        )
        out.append(
            {
                "policy": policy,
                "interval": t,
                "time": sub.times[t],
                "offset_s": t * sub.step_h * 3600.0,
                "load_mw": load,
                "carbon_g_per_kwh": float(carbon_kg.sum() * 1000.0 / (energy_kwh or 1.0))
                if energy_kwh > 0
                else None,
                "action": action,
                "config": config,
                "units": float(yt.sum()),
                "unserved_mwh": float(lost[t]),
                "energy_kwh": energy_kwh,
                "cost_usd": cost,
                "carbon_g": float(carbon_kg.sum()) * 1000.0,
                "water_l": float(water.sum()),
                "carbon_kg_max_site": float(cum_c.max()),
                "carbon_max_over_avg": float(cum_c.max()) / c_avg if c_avg > 0 else None,
                "water_l_max_site": float(cum_w.max()),
                "water_max_over_avg": float(cum_w.max()) / w_avg if w_avg > 0 else None,
                "objective_usd": cum_cost + mu_c * float(cum_c.max()) + mu_w * float(cum_w.max()),
            }
        )
    return out

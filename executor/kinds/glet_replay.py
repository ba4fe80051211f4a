"""The replay step of a glet plan (``greenctl replay glet``).

Models share one load trace by their planned rates (or read their own, ``model_traces``).
Each interval forecasts every model's peak and replans through the decision ``replan`` takes
(:func:`greenctl.executor.control.replan.replan_choice`, glet's own rule, ``threshold``,
``min_dwell_s``); a change pays its glets' model load time with both layouts' GPUs held.
Each second is evaluated as ``simulate --analytic`` evaluates a glet plan
(:func:`greenctl.executor.kinds.predict_serving`), exact at :data:`EVAL_GRID` loads and
interpolated between. Accounted per interval: GPU-hours, SLO violations, energy, carbon and
water. Baseline ``base``: the glet plan sized for each model's peak. Every figure is modeled.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import PIN_MIG_INSTANCE, kind_of
from greenctl.data.traces import read_rps_trace
from greenctl.executor.kinds.base import PlanKind, get_kind, plan_inputs
from greenctl.executor.kinds.glet import GLET_MIN_RATE_RPS
from greenctl.executor.kinds.replaying import (
    TRACE_INTERVAL_COLUMNS,
    Footprint,
    Interval,
    PolicyStep,
    ReplayInputs,
    ReplayLoop,
    ReplayStep,
    Round,
    TraceWindow,
    intervals,
)
from greenctl.planner.core.evaluate import build_instances, predict
from greenctl.planner.core.simulator import model_slos, pick_profiles, sized_slo_ms
from greenctl.planner.glet.moves import glet_key
from greenctl.planner.mix.solve import REFERENCE_CARBON_INTENSITY

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: a glet replay's baselines
BASELINES = ("base",)
#: assumed power of one GPU (idle W, busy W) when the profiles hold none (gpulet's do not)
DEFAULT_GPU_POWER_W = (50.0, 250.0)
#: a glet deployment's figures are interpolated between exact ones at these shares of its
#: capacity: every 5 %, and ``1 - 0.7^i`` towards capacity (where the figures steepen and the
#: analytic model is slow); above the last (1 % short of capacity) its figures hold up to
#: capacity (they move little there; at capacity every request violates)
EVAL_GRID = tuple(
    sorted({round(0.05 * k, 9) for k in range(20)} | {round(1.0 - 0.7**i, 9) for i in range(1, 13)})
)
GLET_INTERVAL_COLUMNS = (
    *TRACE_INTERVAL_COLUMNS,
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
GLET_MODELED = (
    "modeled: profiles + the evaluation core's analytic predict of the glet plan (as simulate "
    "--analytic: each executor batching over its glet's duty cycle, each model held to its "
    "own SLO) per second of the load trace"
)


def gpu_indices(plan: Plan) -> set[int]:
    return {int(g.get("index", n)) for n, g in enumerate(plan.extra.get("gpus") or [])}


def layout_key(plan: Plan) -> tuple[Any, ...]:
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


def started_load_time_s(
    old: Plan, new: Plan, load_time: Mapping[str, float | None], unmodeled: set[str]
) -> float:
    """The longest load time of the models of the glets ``new`` starts (glets ``old`` does not
    run: :func:`~greenctl.planner.glet.moves.glet_key`)."""

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


class GletEvaluator:
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


def glet_models(request: Mapping[str, Any]) -> list[dict[str, Any]]:
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


def glet_account(
    ev: GletEvaluator,
    step: PolicyStep,
    model_rates: Mapping[str, np.ndarray],
    variant_of: Mapping[str, str],
    at: Interval,
    policy: str,
    fp: Footprint,
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

    plan = step.plan
    if plan is None:  # a glet policy always serves a plan (no step of this kind evicts)
        raise ValueError(f"glet policy {policy!r} has no plan at interval {at.k}")
    parts = []
    gpu_s = 0.0
    new_gpus = gpu_indices(plan)
    if split and step.previous is not None:
        held = len(gpu_indices(step.previous) | new_gpus)
        parts.append(ev.seconds(step.previous, by_variant(0, split), held))
        gpu_s += held * split
    parts.append(ev.seconds(plan, by_variant(split, size), len(new_gpus)))
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
    row: dict[str, Any] = {
        "policy": policy,
        "interval": at.k,
        "time": at.time,
        "offset_s": at.offset_s,
        "requests": requests,
        "peak_rps": at.peak_rps,
        "forecast_rps": step.forecast_rps,
        "carbon_g_per_kwh": at.carbon_g_per_kwh,
        "action": step.action,
        "config": glet_label(plan),
        "units": float(len(new_gpus)),
        "gpu_hours": gpu_s / 3600.0,
        "reconfig_s": float(split),
        "violations": violations,
        "violation_frac": violations / requests if requests > 0 else 0.0,
        "accuracy": None,
        "energy_j": energy,
        "carbon_g": None if kwh is None else fp.carbon_g(kwh, at.carbon_g_per_kwh),
        "water_l": fp.water_l(kwh),
        "cost_usd": None,
        "per_model": per_model,
    }
    for name, m in per_model.items():
        row[f"violations:{name}"] = m["violations"]
    return row


def glet_summarise(policy: str, rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
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


# -- the replay -------------------------------------------------------------------------------
@dataclass
class GletLoad:
    """Each model's requests per second (the history before the window included): its own
    trace, or its share of the load trace as its planned rate is."""

    names: list[str]
    own: dict[str, str]  # model -> its own trace
    shared: list[str]  # the models that share the load trace
    planned: dict[str, float]  # model -> its planned rate
    series: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def weight(self) -> float:
        return sum(self.planned[x] for x in self.shared)

    def share(self, name: str) -> float | None:
        """A shared model's share of the load trace (None: its own trace, or no weights)."""
        if name in self.own or self.weight <= 0:
            return None
        return self.planned[name] / self.weight

    def read(self, win: TraceWindow) -> None:
        """Each model's series up to the window's end."""
        end = win.end_s
        for name in self.names:
            if name not in self.own:
                part = self.share(name)
                share = part if part is not None else 1.0 / len(self.shared)
                self.series[name] = np.asarray(win.rps[:end], dtype=float) * share
                continue
            try:
                s = read_rps_trace(self.own[name])
            except InputError as exc:
                raise InputError(
                    f"--model-trace {name}={self.own[name]}: {exc.message}", hint=exc.hint
                ) from None
            if s.size < end:
                raise InputError(
                    f"--model-trace {name}={self.own[name]} holds {s.size / 3600:.2f} h; the "
                    f"window ends at {end / 3600:.2f} h",
                    hint="shorten --hours or start earlier with --from",
                )
            self.series[name] = np.asarray(s[:end], dtype=float)

    def note(self) -> str | None:
        """How the models share the load trace, when some do."""
        if self.shared and self.own:
            return (
                f"{', '.join(self.shared)} share the load trace as their planned rates do; "
                f"{', '.join(self.own)} read their own traces"
            )
        if len(self.shared) > 1:
            return (
                "the models share the load trace as their planned rates do ("
                + ", ".join(f"{x} {self.planned[x] / self.weight * 100:.0f} %"
                            if self.weight > 0 else x for x in self.shared)
                + ")"
            )  # fmt: skip
        return None


def glet_load(request: Mapping[str, Any], inputs: ReplayInputs) -> GletLoad:
    """The models of a glet request and where their load comes from, checked."""
    models = glet_models(request)
    names = [str(m["name"]) for m in models]
    if len(set(names)) != len(names):
        raise InputError("the glet models' names must differ", hint="one --model per name")
    own = dict(inputs.options.kind_options.get("model_traces") or {})
    stray = [k for k in own if k not in names]
    if stray:
        raise InputError(
            f"--model-trace {stray[0]}=...: the plan serves no model {stray[0]!r}",
            hint="name one of its models: " + ", ".join(names),
        )
    shared = [n for n in names if n not in own]
    if shared and inputs.options.load_trace is None:
        raise InputError(
            "--load-trace is required: "
            + ", ".join(shared)
            + (" has" if len(shared) == 1 else " have")
            + " no trace of its own (--model-trace NAME=FILE)",
            hint="pass --load-trace FILE (the models share it as their rates do)",
        )
    planned = {str(m["name"]): max(float(m.get("rate_rps") or 0.0), 0.0) for m in models}
    return GletLoad(names, own, shared, planned)


def gpu_power(given: Any) -> tuple[float, float] | None:
    """``--gpu-power-w`` (idle W, busy W), checked."""
    if given is None:
        return None
    idle, busy = (float(x) for x in given)
    if not (math.isfinite(idle) and math.isfinite(busy) and 0 <= idle <= busy):
        raise InputError(
            f"--gpu-power-w {idle:g}:{busy:g} must be IDLE:BUSY watts, 0 <= idle <= busy"
        )
    return idle, busy


@dataclass
class GletServed:
    """What a glet replay evaluates its plans with."""

    evaluator: GletEvaluator
    variant_of: dict[str, str]  # model -> its variant
    slo: dict[str, float]  # variant -> its SLO
    load_time: dict[str, float | None]  # variant -> its load time
    power: tuple[float, float] | None  # the assumed GPU power (None: the profiles')


def glet_served(
    store: Store,
    pk: PlanKind,
    first: Plan,
    models: list[dict[str, Any]],
    given: Any,
    notes: list[str],
) -> GletServed:
    """The evaluation core's inputs, as ``simulate`` takes them for a glet plan, and how the
    energy is had (the profiles' power, else an assumed power per GPU: notes say which)."""
    profiles, variant_list = plan_inputs(store, first)
    by_name = {v.name: v for v in variant_list}
    slo = sized_slo_ms(first, by_name) or model_slos(first)
    table = pick_profiles(profiles, slo)
    variant_of = {
        str(m["name"]): str(m.get("variant") or m["name"])
        for m in first.request.get("models") or models
    }
    missing = sorted({v for v in variant_of.values() if v not in by_name})
    if missing:
        raise InputError(f"no variant {missing[0]} in the store", hint="import its profiles first")
    used = set(variant_of.values())
    power = gpu_power(given)
    if all(p.power_w is not None for (v, _, _), p in table.items() if v in used):
        notes.append(
            "energy: the profiles' power"
            + ("" if power is None else " (--gpu-power-w is for profiles without power: not used)")
        )
        power = None
    else:
        power = power or DEFAULT_GPU_POWER_W
        notes.append(
            f"energy: ASSUMED {power[0]:g} W per GPU in use plus {power[1] - power[0]:g} W x "
            "each glet's partition share x its busy fraction (the profiles hold no power; "
            "--gpu-power-w IDLE:BUSY)"
        )
    notes.append(
        "each executor is evaluated on its partition alone, as simulate --analytic evaluates a "
        "glet plan: the turns of models time-sharing a glet and a co-runner's interference are "
        "in the planner's duty-cycle bound (plan glet's p99), not in these figures"
    )
    ev = GletEvaluator(table, by_name, slo, pk.dispatch_policy, power)
    load_time = {v: getattr(by_name.get(v), "load_time_s", None) for v in used}
    return GletServed(ev, variant_of, slo, load_time, power)


def replay_glet(store: Store, inputs: ReplayInputs, loop: ReplayLoop) -> dict[str, Any]:
    """Replay a glet plan's replan loop over a load trace (module docstring)."""
    opts, notes = inputs.options, loop.notes
    request = dict(inputs.request)
    load = glet_load(request, inputs)
    models, names = glet_models(request), load.names
    gpu_power(opts.kind_options.get("gpu_power_w"))  # a bad value fails before the traces
    ci0 = opts.kind_options.get("carbon_intensity") or request.get("carbon_intensity")
    trace = opts.load_trace if opts.load_trace is not None else load.own[names[0]]
    win = loop.window(trace, float(ci0 or REFERENCE_CARBON_INTENSITY))
    load.read(win)
    forecasts: dict[str, np.ndarray] = {}
    forecast_note = ""
    for name in names:
        forecasts[name], _, forecast_note = loop.forecast(load.series[name], win)
    end = win.end_s
    total = np.sum([load.series[x][:end] for x in names], axis=0)
    total_peaks = np.asarray(
        [
            float(total[a : min(a + win.every_s, end)].max())
            for a in range(win.first_s, end, win.every_s)
        ]
    )
    if (how := load.note()) is not None:
        notes.append(how)
    pk = get_kind(inputs.kind)

    def plan_at(rates: Mapping[str, float]) -> Plan:
        req = {
            **request,
            "simulate_s": 0.0,
            "models": [{**m, "rate_rps": max(float(rates[str(m["name"])]), GLET_MIN_RATE_RPS)}
                       for m in models],
        }  # fmt: skip
        req.pop("carbon_intensity", None)
        return pk.solve(store, req)[0]

    first = inputs.first_plan
    if first is None:
        first = plan_at({x: float(forecasts[x][0]) for x in names})
    elif float(first.request.get("simulate_s") or 0.0) > 0:
        # each replan would check its schedule in a Poisson simulation: not in a replay (the
        # plan read from the store is this replay's own copy)
        first.request["simulate_s"] = 0.0
        notes.append("the replans skip the plan's simulated check of each schedule")
    notes.extend(str(x) for x in first.extra.get("notes") or [])
    served = glet_served(store, pk, first, models, opts.kind_options.get("gpu_power_w"), notes)
    partitions = first.request.get("partitions") or []
    if any(kind_of(str(p)).pinning == PIN_MIG_INSTANCE for p in partitions):
        notes.append(
            "glet on MIG partitions: a MIG layout change's own time (destroying and creating GPU "
            "instances) is not modeled, as in replay --kind mig"
        )

    def round_of(running: Plan, k: int, reference: float) -> Round:
        rates = {x: float(forecasts[x][k]) for x in names}
        key = (layout_key(running), tuple(round(rates[x], 6) for x in names))
        replan = {"signal": None, "reference": None, "forecast": rates.get}
        return Round(key, replan, float(sum(rates.values())))

    def load_time(old: Plan, new: Plan) -> float:
        return started_load_time_s(old, new, served.load_time, loop.unmodeled)

    policies = {"greenctl": loop.greenctl(store, first, win, round_of, load_time)}
    peak_rates = {x: float(load.series[x][win.first_s : end].max()) for x in names}
    if "base" in inputs.baselines:
        try:
            base = plan_at(peak_rates)
            policies["base"] = [PolicyStep(base, "start", None)] + [
                PolicyStep(base, "keep", None) for _ in range(1, win.intervals)
            ]
        except InfeasiblePlan as exc:
            notes.append(f"base: left out, it cannot carry the peak ({exc.message})")
    fp = Footprint(float(request.get("pue") or 1.0), opts.wue_l_per_kwh, opts.ewif_l_per_kwh)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    for at in intervals(win, total_peaks):
        a = win.first_s + at.k * win.every_s
        model_rates = {x: load.series[x][a : min(a + win.every_s, end)] for x in names}
        for name, steps in policies.items():
            rows[name].append(
                glet_account(
                    served.evaluator, steps[at.k], model_rates, served.variant_of, at, name, fp
                )
            )
    summary = [glet_summarise(name, rs, names) for name, rs in rows.items()]
    per_model = " per model" if len(names) > 1 else ""
    meta = glet_meta(inputs, load, served, first, peak_rates)
    meta.update(loop.window_meta(win, forecast_note + per_model))
    meta["peak_rps"] = float(total_peaks.max()) if win.intervals else 0.0
    columns = list(GLET_INTERVAL_COLUMNS) + [f"violations:{x}" for x in names]
    sum_columns = list(GLET_SUMMARY_COLUMNS) + [f"violation_pct:{x}" for x in names]
    return loop.finish(meta, summary, rows, columns, sum_columns)


def glet_meta(
    inputs: ReplayInputs,
    load: GletLoad,
    served: GletServed,
    first: Plan,
    peak_rates: Mapping[str, float],
) -> dict[str, Any]:
    """A glet replay's meta (the loop adds the window's and the replanning's)."""
    names, v_of, slo = load.names, served.variant_of, served.slo
    power = served.power
    return {
        "kind": "glet",
        "family": "glet: " + ", ".join(names),
        "models": [
            {
                "name": x,
                "variant": v_of[x],
                "slo_ms": slo.get(v_of[x]),
                "trace": load.own.get(x) or "load trace",
                "share": load.share(x),
                "peak_rps": peak_rates[x],
            }
            for x in names
        ],
        "load_trace": None if inputs.options.load_trace is None else str(inputs.options.load_trace),
        "model_traces": {k: str(v) for k, v in load.own.items()},
        "slo_ms": None,
        "slos_ms": {x: slo.get(v_of[x]) for x in names},
        "percentile": "each model's own SLO",
        "units": "GPUs",
        "first_plan": glet_label(first),
        "first_plan_id": first.id,
        "baselines": list(inputs.baselines),
        "evaluations": len(served.evaluator.memo),
        "modeled": GLET_MODELED,
        "power": "profiles"
        if power is None
        else {"idle_w": power[0], "busy_w": power[1], "assumed": True},
    }


#: glet's replay step
STEP = ReplayStep(
    run=replay_glet,
    baselines=BASELINES,
    default_baselines=BASELINES,
    options=("model_traces", "gpu_power_w", "carbon_intensity"),
)

"""The ``plan mig`` serving model that the planner and every solver share.

Configurations (:class:`Config`), their evaluation (:class:`MigModel`), placement onto
GPUs and a solver's answer (:class:`SolveResult`). The model itself is described in
:mod:`greenctl.planner.mig.solve`; the solvers import it from here, not from ``mig``, so that
``mig`` can call them without an import circle.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from greenctl.data.errors import FileFormatError, InfeasiblePlan, InputError
from greenctl.data.mig_geometry import (
    Layout,
    Placement,
    enumerate_layouts,
    is_valid_layout,
    layouts_by_multiset,
    multiset,
)
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.queueing import (
    latency_quantile_ms,
    mgc_model,
    mixture_quantile,
    pooled_latency_quantile_ms,
)
from greenctl.planner.mig.problem import CAPACITY_TOL, J_PER_KWH, MigProblem, SliceOption

# ---------------------------------------------------------------------------------------
# configurations and their evaluation


@dataclass(frozen=True)
class Config:
    """Counts: GPUs per slice multiset (``y``) and instances per (variant, profile) (``n``)."""

    y: tuple[int, ...]
    n: tuple[int, ...]


@dataclass
class Evaluation:
    """What the shared serving model predicts for a configuration."""

    config: Config
    feasible: bool
    split: tuple[float, ...]  # rate per pair
    capacity_rps: float
    p95_ms: float
    accuracy: float
    energy_j_per_request: float
    carbon_g_per_request: float
    power_w: float
    delta_carbon_pct: float
    delta_accuracy_pct: float
    objective: float
    reason: str | None = None

    @property
    def h(self) -> float:
        """Clover's annealing energy ``h = -f * min(1, SLA / p95)`` (lower is better).

        For ``f < 0`` the penalty divides instead, so a violation never looks better.
        """
        return self._h

    _h: float = 0.0


class MigModel:
    """A prepared problem: multisets, pairs, capacities, BASE and objective coefficients."""

    def __init__(self, problem: MigProblem, *, sla_scale: float = 1.0) -> None:
        problem.validate()
        self.problem = problem
        geo = problem.geo
        self.geo = geo
        self.pairs: list[SliceOption] = list(problem.options)
        profiles = list(dict.fromkeys(o.profile for o in self.pairs))
        whole = geo.whole_profile.name
        layouts = enumerate_layouts(geo, profiles=profiles)
        groups = layouts_by_multiset(geo, layouts)
        self.multisets: list[tuple[str, ...]] = list(groups)
        self.layouts: list[Layout] = [groups[m][0] for m in self.multisets]
        self.profiles: list[str] = profiles
        self.cnt: list[dict[str, int]] = [dict(Counter(m)) for m in self.multisets]
        self.pairs_of: dict[str, list[int]] = {p: [] for p in profiles}
        for k, o in enumerate(self.pairs):
            self.pairs_of[o.profile].append(k)
        # BASE: most accurate variant on every whole GPU
        best = max(o.accuracy for o in self.pairs)
        base_opts = [
            k for k, o in enumerate(self.pairs) if o.profile == whole and o.accuracy >= best
        ]
        if not base_opts:
            top = sorted({o.variant for o in self.pairs if o.accuracy >= best})
            raise InputError(
                f"BASE needs a profile of the most accurate variant ({', '.join(top)}) on the "
                f"whole GPU (mig:{whole})",
                hint=f"profile it on mig:{whole} (a 7g instance) of {geo.name}",
            )
        self.base_pair = base_opts[0]
        self.whole_multiset = self.multisets.index((whole,))
        n_gpus = problem.gpus
        rate = problem.rate_rps
        base_opt = self.pairs[self.base_pair]
        self.base_p95_ms = latency_quantile_ms(
            rate / n_gpus, base_opt.service, 1, problem.percentile
        )
        self.base_p95_fifo_ms = latency_quantile_ms(
            rate, base_opt.service, n_gpus, problem.percentile
        )
        if problem.sla_ms is None:
            if not math.isfinite(self.base_p95_ms):
                raise InfeasiblePlan(
                    f"BASE ({base_opt.variant} on {n_gpus} whole GPUs) cannot carry "
                    f"{rate:g} req/s, so the default SLA (BASE's p95) is undefined",
                    hint="give --sla-ms, lower --rate or add GPUs",
                )
            self.sla_ms = self.base_p95_ms
            self.sla_source = "base-p95"
        else:
            self.sla_ms = float(problem.sla_ms)
            self.sla_source = "given"
        self.sla_scale = sla_scale
        self.cap_slo_ms = self.sla_ms * sla_scale
        self.ci = problem.carbon_intensity
        self.ci_base = problem.base_carbon_intensity or problem.carbon_intensity
        self.a_base = base_opt.accuracy
        self.e_base = (n_gpus * problem.gpu_idle_w + rate * base_opt.e_dyn_j) / rate
        self.c_base = self.e_base * self.ci_base / J_PER_KWH
        lam = problem.lam
        # objective = const + sum coef_k x_k   (percentage points)
        self.coef = [
            (
                lam * (-(self.ci / J_PER_KWH) * o.e_dyn_j / rate) / self.c_base
                + (1 - lam) * (o.accuracy / rate) / self.a_base
            )
            * 100.0
            for o in self.pairs
        ]
        e_idle = n_gpus * problem.gpu_idle_w / rate
        self.const = (
            lam * (self.c_base - e_idle * self.ci / J_PER_KWH) / self.c_base * 100.0
            - (1 - lam) * 100.0
        )
        self.floor = (
            None
            if problem.max_accuracy_loss_pct is None
            else self.a_base * (1.0 - problem.max_accuracy_loss_pct / 100.0)
        )
        self._cache: dict[Config, Evaluation] = {}
        self.evaluations = 0

    # -- capacity model ---------------------------------------------------------------------
    def rate_capacity(self, k: int) -> float:
        """``r_k``: the rate (req/s) one instance of pair ``k`` serves within the SLA."""
        cache: dict[tuple[int, float], float] = self.__dict__.setdefault("_cap_cache", {})
        key = (k, self.cap_slo_ms)
        if key not in cache:
            cache[key] = instance_capacity(
                self.pairs[k].service, self.cap_slo_ms, self.problem.percentile
            )
        return cache[key]

    def capacity(self, k: int, n: int) -> float:
        """Capacity of ``n`` instances of pair ``k`` within the SLA, ``n * r_k``."""
        return max(n, 0) * self.rate_capacity(k)

    # -- structure ----------------------------------------------------------------------------
    def max_instances(self, profile: str) -> int:
        """Most instances of a profile that ``N`` GPUs can hold."""
        return self.problem.gpus * max(c.get(profile, 0) for c in self.cnt)

    def slice_totals(self, y: Sequence[int]) -> dict[str, int]:
        out = dict.fromkeys(self.profiles, 0)
        for i, count in enumerate(y):
            for p, c in self.cnt[i].items():
                out[p] += c * count
        return out

    def check(self, config: Config) -> None:
        """Raise ValueError when counts are inconsistent (a bug, not a user error)."""
        if sum(config.y) != self.problem.gpus or min(config.y) < 0 or min(config.n) < 0:
            raise ValueError(f"bad GPU counts {config}")
        totals = self.slice_totals(config.y)
        for p in self.profiles:
            if sum(config.n[k] for k in self.pairs_of[p]) != totals[p]:
                raise ValueError(f"instances of {p} do not fill its slices: {config}")

    # -- evaluation ---------------------------------------------------------------------------
    def split(self, n: Sequence[int]) -> tuple[tuple[float, ...], float, bool]:
        """Best load split for instance counts: (split, capacity, feasible)."""
        rate = self.problem.rate_rps
        caps = [self.capacity(k, c) for k, c in enumerate(n)]
        total = sum(caps)
        if total < rate * (1 - CAPACITY_TOL):
            if total <= 0:
                return tuple(0.0 for _ in n), 0.0, False
            return tuple(rate * c / total for c in caps), total, False
        # within the bisection's precision (BASE sits exactly at the SLA): stretch capacity
        caps = [c * (1 + CAPACITY_TOL) for c in caps]
        if self.floor is not None:
            return self._split_lp(caps, total)
        x = [0.0] * len(n)
        left = rate
        for k in sorted(range(len(n)), key=lambda k: -self.coef[k]):
            take = min(caps[k], left)
            x[k] = take
            left -= take
            if left <= 0:
                break
        return tuple(x), total, True

    def _split_lp(self, caps: list[float], total: float) -> tuple[tuple[float, ...], float, bool]:
        from scipy.optimize import linprog

        rate = self.problem.rate_rps
        acc = [o.accuracy for o in self.pairs]
        assert self.floor is not None
        res = linprog(
            c=[-c for c in self.coef],
            A_ub=[[-a for a in acc]],
            b_ub=[-self.floor * rate],
            A_eq=[[1.0] * len(caps)],
            b_eq=[rate],
            bounds=list(zip([0.0] * len(caps), caps, strict=True)),
            method="highs",
        )
        if res.status != 0:
            # infeasible floor: the most accurate fill, flagged infeasible
            x = [0.0] * len(caps)
            left = rate
            for k in sorted(range(len(caps)), key=lambda k: -acc[k]):
                x[k] = min(caps[k], left)
                left -= x[k]
            return tuple(x), total, False
        return tuple(float(v) for v in res.x), total, True

    def mixture_p95(self, n: Sequence[int], x: Sequence[float]) -> float:
        """The ``percentile`` latency of the plan: the mixture of its M/G/1 queues."""
        q = self.problem.percentile
        parts = []
        for k in range(len(x)):
            if x[k] > 1e-12 and n[k] > 0:
                lm = mgc_model(x[k] / n[k], (self.pairs[k].service,))
                if lm is None:
                    return math.inf
                parts.append((x[k], lm))
        if not parts:
            return math.inf
        return float(mixture_quantile(parts, q))

    def evaluate(self, config: Config, *, with_p95: bool = True) -> Evaluation:
        """Predict a configuration under the shared serving model (cached)."""
        hit = self._cache.get(config)
        if hit is not None:
            return hit
        self.evaluations += 1
        prob = self.problem
        rate = prob.rate_rps
        x, cap, feasible = self.split(config.n)
        served = sum(x)
        acc = sum(x[k] * self.pairs[k].accuracy for k in range(len(x))) / served if served else 0.0
        power = prob.gpus * prob.gpu_idle_w + sum(
            x[k] * self.pairs[k].e_dyn_j for k in range(len(x))
        )
        energy = power / rate
        carbon = energy * self.ci / J_PER_KWH
        d_c = (self.c_base - carbon) / self.c_base * 100.0
        d_a = (acc - self.a_base) / self.a_base * 100.0
        f = prob.lam * d_c + (1 - prob.lam) * d_a
        p95 = self.mixture_p95(config.n, x) if with_p95 else math.nan
        reason = None
        if not feasible:
            reason = (
                f"capacity {cap:.4g} req/s within the SLA is below the rate {rate:g}"
                if cap < rate * (1 - CAPACITY_TOL)
                else "the accuracy floor (--max-accuracy-loss) cannot be met"
            )
        pen = 0.0 if not math.isfinite(p95) else min(1.0, self.sla_ms / p95) if p95 > 0 else 1.0
        if not feasible:
            pen = min(pen, 0.999)
        h = -f * pen if f >= 0 else (-f / pen if pen > 0 else math.inf)
        ev = Evaluation(
            config=config,
            feasible=feasible,
            split=x,
            capacity_rps=cap,
            p95_ms=p95,
            accuracy=acc,
            energy_j_per_request=energy,
            carbon_g_per_request=carbon,
            power_w=power,
            delta_carbon_pct=d_c,
            delta_accuracy_pct=d_a,
            objective=f,
            reason=reason,
            _h=h,
        )
        self._cache[config] = ev
        return ev

    # -- named configurations ---------------------------------------------------------------
    def uniform_config(self, multiset: int, variant_of: Mapping[str, int]) -> Config:
        """Every GPU with one multiset; every slice of profile p holds pair ``variant_of[p]``."""
        y = [0] * len(self.multisets)
        y[multiset] = self.problem.gpus
        n = [0] * len(self.pairs)
        for p, c in self.cnt[multiset].items():
            n[variant_of[p]] += c * self.problem.gpus
        return Config(tuple(y), tuple(n))

    @cached_property
    def base_config(self) -> Config:
        whole = self.geo.whole_profile.name
        return self.uniform_config(self.whole_multiset, {whole: self.base_pair})

    def co2opt_config(self) -> tuple[Config | None, str]:
        """CO2OPT: the most partitioned layout with the smallest variant meeting the SLA.

        Variants are tried from the least to the most accurate (ties: less energy first);
        for each, the layout with the most instances whose every slice fits the variant.
        """
        variants: dict[str, list[int]] = {}
        for k, o in enumerate(self.pairs):
            variants.setdefault(o.variant, []).append(k)
        order = sorted(
            variants,
            key=lambda v: (
                self.pairs[variants[v][0]].accuracy,
                min(self.pairs[k].e_dyn_j for k in variants[v]),
            ),
        )
        for v in order:
            by_profile = {self.pairs[k].profile: k for k in variants[v]}
            fitting = [i for i, m in enumerate(self.multisets) if all(p in by_profile for p in m)]
            if not fitting:
                continue
            best = max(fitting, key=lambda i: (len(self.multisets[i]), -i))
            cfg = self.uniform_config(best, by_profile)
            ev = self.evaluate(cfg)
            if ev.feasible:
                return cfg, f"{v} on {'+'.join(self.multisets[best])}"
        floor = " and the accuracy floor" if self.floor is not None else ""
        return None, f"no single variant on a uniform most-partitioned layout meets the SLA{floor}"


def instance_capacity(service: ServiceTime, slo_ms: float, q: float) -> float:
    """The largest rate (req/s) at which one M/G/1 instance keeps its ``q`` latency within
    ``slo_ms``: :func:`~greenctl.planner.core.queueing.capacity_at_slo` with ``servers=1``,
    computed by bisection (to 0.01 %) on the core's survival function at the SLO.
    0 when the service time alone misses the SLO.
    """
    if service.quantile(q) > slo_ms:
        return 0.0
    mu = 1000.0 / service.mean_ms
    lo, hi = 0.0, mu
    while hi - lo > 1e-4 * mu:
        mid = 0.5 * (lo + hi)
        lm = mgc_model(mid, (service,))
        if lm is not None and float(lm.sf(slo_ms)[0]) <= 1.0 - q:
            lo = mid
        else:
            hi = mid
    return lo


def tidy(model: MigModel, config: Config) -> Config:
    """Give instances that carry no load a useful variant; the objective never drops.

    Many optima differ only in what the spare instances host (they carry no load). Each
    profile keeps the instances its loaded classes need and hands the rest to the class
    with the most load on that profile (so spare capacity absorbs bursts of what is
    served), else to the most accurate variant that can meet the SLA there.
    """
    ev = model.evaluate(config)
    n = list(config.n)
    for p in model.profiles:
        ks = model.pairs_of[p]
        surplus = 0
        for k in ks:
            r = model.rate_capacity(k)
            need = math.ceil(ev.split[k] / r - 1e-9) if ev.split[k] > 0 and r > 0 else 0
            need = min(n[k], max(need, 0))
            surplus += n[k] - need
            n[k] = need
        if not surplus:
            continue
        loaded = [k for k in ks if ev.split[k] > 0]
        if loaded:
            target = max(loaded, key=lambda k: ev.split[k])
        else:
            target = max(
                ks,
                key=lambda k: (model.rate_capacity(k) > 0, model.pairs[k].accuracy, -k),
            )
        n[target] += surplus
    out = Config(config.y, tuple(n))
    model.check(out)
    if model.evaluate(out).objective < ev.objective - 1e-9:  # pragma: no cover - safety net
        return config
    return out


# ---------------------------------------------------------------------------------------
# placements and the plan document


def assign_gpus(
    model: MigModel, config: Config, *, current: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Concrete GPUs: a placement per GPU and a variant per instance.

    Multisets become the representative layout of each (first placement found, by start
    slot). With ``current`` (the ``gpus`` list of a previous plan), GPUs whose current
    multiset is still wanted keep their index and, where counts allow, their variants.
    """
    geo = model.geo
    n_gpus = model.problem.gpus
    left = dict(Counter({i: c for i, c in enumerate(config.y) if c}))
    pool: dict[str, list[str]] = {p: [] for p in model.profiles}
    for k, o in sorted(enumerate(model.pairs), key=lambda ko: -ko[1].accuracy):
        pool[o.profile].extend([o.variant] * config.n[k])
    chosen: list[int | None] = [None] * n_gpus
    keep: list[list[dict[str, Any]] | None] = [None] * n_gpus
    index_of = {m: i for i, m in enumerate(model.multisets)}
    if current:
        for g in current:
            idx = g.get("index")
            if not isinstance(idx, int) or not 0 <= idx < n_gpus:
                continue
            lay = g.get("layout") or []
            try:
                pls = tuple(Placement(int(i["start"]), str(i["profile"])) for i in lay)
                m = index_of.get(multiset(geo, pls))
            except (KeyError, TypeError, ValueError, InputError):
                m = None
            if m is not None and left.get(m, 0) > 0:
                left[m] -= 1
                chosen[idx] = m
                keep[idx] = [dict(i) for i in lay]
    rest = [m for m, c in sorted(left.items()) for _ in range(c)]
    for idx in range(n_gpus):
        if chosen[idx] is None:
            chosen[idx] = rest.pop(0)
    gpus: list[dict[str, Any]] = []
    # first let kept GPUs keep their variants where the pool still has them
    layouts: list[list[dict[str, Any]]] = []
    for idx in range(n_gpus):
        m = chosen[idx]
        assert m is not None
        insts: list[dict[str, Any]]
        if keep[idx] is not None:
            insts = [
                {
                    "profile": str(i["profile"]),
                    "start": int(i["start"]),
                    "variant": None,
                    "_want": i.get("variant"),
                }
                for i in keep[idx] or []
            ]
        else:
            insts = [
                {"profile": pl.profile, "start": pl.start, "variant": None, "_want": None}
                for pl in model.layouts[m]
            ]
        layouts.append(insts)
    for insts in layouts:
        for inst in insts:
            want = inst["_want"]
            if want is not None and want in pool[inst["profile"]]:
                pool[inst["profile"]].remove(want)
                inst["variant"] = want
    for idx, insts in enumerate(layouts):
        for inst in insts:
            if inst["variant"] is None:
                inst["variant"] = pool[inst["profile"]].pop(0)
            del inst["_want"]
        insts.sort(key=lambda i: i["start"])
        gpus.append({"index": idx, "model": geo.name, "layout": insts})
    return gpus


def config_from_gpus(model: MigModel, gpus: Sequence[Mapping[str, Any]], *, source: str) -> Config:
    """Counts of a previous plan's ``gpus`` list (for warm starts).

    GPUs beyond ``N`` are dropped; missing ones are filled with BASE GPUs.

    Raises:
        FileFormatError: a layout or variant the current problem does not know.
    """
    geo = model.geo
    index_of = {m: i for i, m in enumerate(model.multisets)}
    pair_of = {(o.variant, o.profile): k for k, o in enumerate(model.pairs)}
    y = [0] * len(model.multisets)
    n = [0] * len(model.pairs)
    used = 0
    for gi, g in enumerate(sorted(gpus, key=lambda g: int(g.get("index", 0)))):
        if used >= model.problem.gpus:
            break
        where = f"gpus[{gi}]"
        try:
            lay = [(str(i["profile"]), int(i["start"]), str(i["variant"])) for i in g["layout"]]
        except (KeyError, TypeError, ValueError):
            raise FileFormatError(
                source, f"{where}.layout needs profile, start and variant per instance"
            ) from None
        pls = tuple(Placement(s, p) for p, s, _ in lay)
        if not all(geo.has_profile(p) for p, _, _ in lay) or not is_valid_layout(geo, pls):
            raise FileFormatError(source, f"{where}: not a valid {geo.name} layout")
        m = index_of.get(multiset(geo, pls))
        if m is None:
            raise FileFormatError(
                source,
                f"{where}: layout {'+'.join(multiset(geo, pls))} is not a maximal layout "
                "of the profiled profiles",
            )
        y[m] += 1
        for p, _, v in lay:
            k = pair_of.get((v, p))
            if k is None:
                raise FileFormatError(source, f"{where}: no profile of {v} on mig:{p}")
            n[k] += 1
        used += 1
    for _ in range(model.problem.gpus - used):
        y[model.whole_multiset] += 1
        n[model.base_pair] += 1
    cfg = Config(tuple(y), tuple(n))
    model.check(cfg)
    return cfg


FIFO_MAX_INSTANCES = 128


def fifo_p95(model: MigModel, config: Config) -> float | None:
    """For reference: the p95 if every instance pulled from one central FIFO queue (Clover).

    The evaluation core's pooled heterogeneous M/G/c approximation over all instances;
    under that dispatch every instance serves requests, including those the plan gives
    no quota, so it can exceed the SLA the quota dispatch meets. None above
    ``FIFO_MAX_INSTANCES`` mixed instances (the pooled model's cost grows with them).
    """
    used = [k for k, c in enumerate(config.n) if c]
    if len(used) == 1:
        k = used[0]
        return float(
            latency_quantile_ms(
                model.problem.rate_rps,
                model.pairs[k].service,
                config.n[k],
                model.problem.percentile,
            )
        )
    if sum(config.n) > FIFO_MAX_INSTANCES:
        return None
    services = [model.pairs[k].service for k, c in enumerate(config.n) for _ in range(c)]
    return float(
        pooled_latency_quantile_ms(model.problem.rate_rps, services, model.problem.percentile)
    )


def describe_config(model: MigModel, config: Config) -> dict[str, Any]:
    """Human-readable counts: GPUs per multiset and instances per (variant, profile)."""
    return {
        "layouts": {"+".join(model.multisets[i]): c for i, c in enumerate(config.y) if c},
        "instances": {
            f"{model.pairs[k].variant}@{model.pairs[k].profile}": c
            for k, c in enumerate(config.n)
            if c
        },
    }


@dataclass
class SolveResult:
    """A solver's answer: the configuration and how it was found."""

    config: Config | None
    info: dict[str, Any]

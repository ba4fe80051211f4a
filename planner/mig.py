"""``plan mig``: carbon-aware MIG layouts with mixed-quality variants (Clover), solved exactly.

The problem (Clover, SC'23): ``N`` GPUs of one model serve one model family at a Poisson
rate under a p95 SLA. Each GPU is cut into MIG instances (a *layout*), each instance hosts
one variant of the family. Maximise::

    f = lambda * dCarbon + (1 - lambda) * dAccuracy            (percentage points)
    dAccuracy = (A - A_base) / A_base * 100
    dCarbon   = (C_base - E * ci) / C_base * 100,  C_base = E_base * ci_base

with ``A`` the request-weighted accuracy, ``E`` the energy per request and BASE the most
accurate variant on every whole (7g) GPU. The SLA defaults to BASE's p95 at the rate.

Additivity (the configuration graph view): only two things matter for ``f`` and the SLA,
the number of GPUs using each slice *multiset* (layouts with the same profiles are
interchangeable) and the number of instances of each (variant, profile) *pair*. Placement
is reconstructed afterwards (:func:`assign_gpus`). So a configuration is a pair of count
vectors whose length does not depend on ``N``; see :mod:`greenctl.planner.mig_exact`.

Serving model shared by every solver (so their objectives compare):

* Dispatch: requests are routed by quota (the plan's deployments, policy ``wrr``, the
  evaluation core's weighted round-robin) to instances; every instance serves its share
  through its own FIFO queue, an M/G/1 queue of the evaluation core
  (:mod:`greenctl.planner.queueing`). Load is split evenly over a class's instances
  (a class = one (variant, profile) pair).
* Linearised SLA: the p95 of a mixture of queues is nonlinear in the loads, but every
  queue meeting the SLA implies the mixture does, and an M/G/1 queue meets it exactly up to
  its capacity at the SLA, ``r_k = capacity_at_slo(service_k, servers=1, slo_ms=SLA)``
  (computed here by bisection on the core's survival function, same result, 10x faster).
  So ``x_k <= n_k r_k`` is a linear, slightly conservative stand-in for ``p95 <= SLA``.
  The winner is then verified: its mixture p95 with the core's ``mixture_quantile`` and,
  when available, the discrete-event simulator with policy ``wrr``. Poisson arrivals per
  instance are pessimistic for stride dispatch (each instance gets every k-th request, a
  smoother stream), so the simulator usually reports a lower p95 than the analytic model.
  Capacities within ``CAPACITY_TOL`` (0.1 %) count as met: BASE sits exactly at the
  default SLA and the bisection rounds down.
* Load split: for given counts the best split fills classes in order of their objective
  coefficient up to capacity (a continuous knapsack; an LP when an accuracy floor is set).
* Energy: ``E = (N * P_gpu_idle + sum_c x_c * e_c) / rate`` with ``P_gpu_idle`` the GPU's
  idle power (derived from the instances' idle power per compute slice) and ``e_c`` the
  busy energy per request above idle of class ``c``. Carbon per request ``= E / 3.6e6 * ci``.
* BASE's p95 (the default SLA) is computed in the same model: ``N`` M/G/1 queues at
  ``rate / N``. Under one central FIFO queue (Clover's dispatcher) BASE would be faster;
  plans show that figure as ``p95_fifo_ms`` for reference.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.mig_geometry import (
    GpuGeometry,
    Layout,
    enumerate_layouts,
    layouts_by_multiset,
)
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile, Variant
from greenctl.planner.latency import ServiceTime
from greenctl.planner.queueing import latency_quantile_ms, mgc_model, mixture_quantile

J_PER_KWH = 3.6e6
# Relative shortfall of capacity treated as the capacity bisection's rounding, not overload.
CAPACITY_TOL = 1e-3
SOLVERS = ("exact", "anneal", "random")
BASELINES = ("base", "co2opt")


@dataclass(frozen=True)
class SliceOption:
    """One (variant, MIG profile) pair that fits and has a profile."""

    variant: str
    profile: str
    accuracy: float
    service: ServiceTime
    e_dyn_j: float  # busy energy per request above the instance's idle power
    energy_method: str
    source: str
    record: Profile | None = field(default=None, compare=False, repr=False)


@dataclass
class MigProblem:
    """The inputs of ``plan mig`` (plain data; build with :func:`build_problem`)."""

    geo: GpuGeometry
    gpus: int
    family: str
    rate_rps: float
    carbon_intensity: float
    options: list[SliceOption]
    gpu_idle_w: float
    sla_ms: float | None = None
    lam: float = 0.5
    base_carbon_intensity: float | None = None
    max_accuracy_loss_pct: float | None = None
    percentile: float = 0.95
    notes: list[str] = field(default_factory=list)
    variant_records: dict[str, Variant] = field(default_factory=dict, repr=False)

    def validate(self) -> None:
        """Raises InputError naming the bad field."""
        if self.gpus < 1:
            raise InputError(f"--gpus must be >= 1, got {self.gpus}")
        if not (self.rate_rps > 0 and math.isfinite(self.rate_rps)):
            raise InputError(f"--rate must be a positive number of req/s, got {self.rate_rps}")
        if not 0.0 <= self.lam <= 1.0:
            raise InputError(f"--lambda must be between 0 and 1, got {self.lam}")
        for name, v in (
            ("--carbon-intensity", self.carbon_intensity),
            ("--base-carbon-intensity", self.base_carbon_intensity),
        ):
            if v is not None:
                carbon_option(v, name, positive=True)
        if self.sla_ms is not None and not self.sla_ms > 0:
            raise InputError(f"--sla-ms must be > 0, got {self.sla_ms}")
        if self.max_accuracy_loss_pct is not None and not 0 <= self.max_accuracy_loss_pct < 100:
            raise InputError(
                f"--max-accuracy-loss must be a percentage in [0, 100), got "
                f"{self.max_accuracy_loss_pct}"
            )
        if not 0 < self.percentile < 1:
            raise InputError(f"percentile must be in (0, 1), got {self.percentile}")


def _energy_dyn(p: Profile, service: ServiceTime) -> tuple[float, bool]:
    """Busy energy per request above idle (J) and whether idle power was known."""
    mean_s = service.mean_ms / 1000.0
    per_req = p.batch
    if p.power_w is not None and p.idle_power_w is not None:
        return max(p.power_w - p.idle_power_w, 0.0) * mean_s / per_req, True
    if p.energy_j is not None and p.idle_power_w is not None:
        return max(p.energy_j - p.idle_power_w * mean_s / per_req, 0.0), True
    if p.energy_j is not None:
        return float(p.energy_j), False
    if p.power_w is not None:
        return p.power_w * mean_s / per_req, False
    raise InputError(
        f"profile {p.variant} on {p.resource} ({p.hardware}) has no power_w or energy_j",
        hint="re-profile with energy measurement or import power_w/energy_j",
    )


def build_problem(
    geo: GpuGeometry,
    profiles: Iterable[Profile],
    variants: Iterable[Variant],
    *,
    family: str,
    gpus: int,
    rate_rps: float,
    carbon_intensity: float,
    sla_ms: float | None = None,
    lam: float = 0.5,
    base_carbon_intensity: float | None = None,
    max_accuracy_loss_pct: float | None = None,
    percentile: float = 0.95,
) -> MigProblem:
    """Build the problem from store records of one family on one GPU model.

    Uses batch-1 profiles on ``mig:<profile>`` resources of ``geo`` whose ``hardware``
    names ``geo`` (NVML name or alias; profiles without hardware are ignored). Pairs whose
    variant needs more memory than the instance has are excluded.

    Raises:
        NotFoundError/InputError: no variants, no usable profiles, missing accuracy.
    """
    from greenctl.data.errors import NotFoundError
    from greenctl.data.mig_geometry import find_gpu

    vmap = {v.name: v for v in variants if v.family == family}
    if not vmap:
        raise NotFoundError(
            f"no variants of model family '{family}' in the store",
            hint="profile them on MIG instances, import profiles, or try "
            "`greenctl mig synth --gpu MODEL --family efficientnet` for a synthetic demo",
        )
    options: list[SliceOption] = []
    idle_per_slice: list[float] = []
    seen: set[tuple[str, str]] = set()
    notes: list[str] = []
    for p in sorted(profiles, key=lambda r: (r.variant, r.resource, r.created_at), reverse=True):
        if p.variant not in vmap or not p.resource.startswith("mig:") or p.batch != 1:
            continue
        hw = find_gpu(p.hardware)
        if hw is None or hw.name != geo.name or not geo.has_profile(p.resource):
            continue
        key = (p.variant, p.resource[4:])
        if key in seen:
            continue  # an older measurement of the same point
        seen.add(key)
        v = vmap[p.variant]
        prof = geo.profile(p.resource)
        if v.memory_mb is not None and v.memory_mb > prof.memory_gib * 1024.0:
            notes.append(f"{v.name} does not fit {prof.name} ({v.memory_mb:.0f} MB): excluded")
            continue
        if v.accuracy is None:
            raise InputError(
                f"variant {v.name} has no accuracy",
                hint="set it when importing profiles (column 'accuracy')",
            )
        service = ServiceTime.from_profile(p)
        e_dyn, idle_known = _energy_dyn(p, service)
        if idle_known and p.idle_power_w is not None:
            idle_per_slice.append(p.idle_power_w / prof.compute_slices)
        options.append(
            SliceOption(
                variant=v.name,
                profile=prof.name,
                accuracy=float(v.accuracy),
                service=service,
                e_dyn_j=e_dyn,
                energy_method=p.energy_method,
                source=p.source,
                record=p,
            )
        )
    if not options:
        raise NotFoundError(
            f"no batch-1 profiles of family '{family}' on MIG instances of {geo.name}",
            hint="profile rows need resource mig:<profile> and hardware naming the GPU "
            f"(for example '{geo.nvml_names[0] if geo.nvml_names else geo.name}'); "
            "`greenctl mig synth` writes synthetic ones",
        )
    idle_w = statistics.median(idle_per_slice) * geo.compute_slices if idle_per_slice else 0.0
    if not idle_per_slice:
        notes.append("no idle power in the profiles: GPU idle power taken as 0 W")
    options.sort(key=lambda o: (o.variant, -geo.profile(o.profile).compute_slices, o.profile))
    problem = MigProblem(
        geo=geo,
        gpus=gpus,
        family=family,
        rate_rps=rate_rps,
        carbon_intensity=carbon_intensity,
        options=options,
        gpu_idle_w=idle_w,
        sla_ms=sla_ms,
        lam=lam,
        base_carbon_intensity=base_carbon_intensity,
        max_accuracy_loss_pct=max_accuracy_loss_pct,
        percentile=percentile,
        notes=notes,
        variant_records=vmap,
    )
    problem.validate()
    return problem


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
    ``slo_ms``: :func:`~greenctl.planner.queueing.capacity_at_slo` with ``servers=1``,
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
    from greenctl.data.mig_geometry import Placement, multiset

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
    from greenctl.data.errors import FileFormatError
    from greenctl.data.mig_geometry import Placement, is_valid_layout, multiset

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


def _predicted(model: MigModel, ev: Evaluation) -> dict[str, Any]:
    methods = sorted({model.pairs[k].energy_method for k, c in enumerate(ev.config.n) if c})
    sources = sorted({model.pairs[k].source for k, c in enumerate(ev.config.n) if c})
    return {
        "rate_rps": model.problem.rate_rps,
        "sla_ms": model.sla_ms,
        "p95_ms": ev.p95_ms,
        "sla_met": bool(ev.feasible and ev.p95_ms <= model.sla_ms * (1 + CAPACITY_TOL)),
        "capacity_rps": ev.capacity_rps,
        "accuracy": ev.accuracy,
        "energy_j_per_request": ev.energy_j_per_request,
        "carbon_g_per_request": ev.carbon_g_per_request,
        "power_w": ev.power_w,
        "delta_carbon_pct": ev.delta_carbon_pct,
        "delta_accuracy_pct": ev.delta_accuracy_pct,
        "objective": ev.objective,
        "instances": sum(ev.config.n),
        "p95_fifo_ms": fifo_p95(model, ev.config),
        "energy_method": ",".join(methods),
        "source": ",".join(sources),
    }


FIFO_MAX_INSTANCES = 128


def fifo_p95(model: MigModel, config: Config) -> float | None:
    """For reference: the p95 if every instance pulled from one central FIFO queue (Clover).

    The evaluation core's pooled heterogeneous M/G/c approximation over all instances;
    under that dispatch every instance serves requests, including those the plan gives
    no quota, so it can exceed the SLA the quota dispatch meets. None above
    ``FIFO_MAX_INSTANCES`` mixed instances (the pooled model's cost grows with them).
    """
    from greenctl.planner.queueing import latency_quantile_ms, pooled_latency_quantile_ms

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


def plan_mig(
    problem: MigProblem,
    *,
    solver: str = "exact",
    baseline: str | None = None,
    current: Plan | None = None,
    time_limit_s: float | None = None,
    seed: int | None = None,
    verify: bool = True,
    require_feasible: bool = True,
) -> Plan:
    """Plan MIG layouts and variants for one GPU model and one family.

    Args:
        problem: the inputs (:func:`build_problem`).
        solver: ``exact`` (ILP), ``anneal`` (Clover's graph annealing) or ``random``.
        baseline: when ``base`` or ``co2opt``, emit that baseline's configuration instead.
        current: a previous MIG plan: warm start for ``anneal``; GPUs keep their layout
            where it is still wanted.
        time_limit_s: solver time limit.
        seed: random seed of ``anneal``/``random``.
        verify: check the winner with the queueing model's per-instance p95 and the
            simulator; tighten the capacity SLA and re-solve if they disagree (exact only).
        require_feasible: raise InfeasiblePlan when no configuration meets the SLA.

    Raises:
        InputError: bad options; InfeasiblePlan: nothing meets the SLA (and floor).
    """
    if solver not in SOLVERS:
        raise InputError(f"unknown solver '{solver}'", hint=f"use one of {', '.join(SOLVERS)}")
    if baseline is not None and baseline not in BASELINES:
        raise InputError(
            f"unknown baseline '{baseline}'", hint=f"use one of {', '.join(BASELINES)}"
        )
    if time_limit_s is not None and not time_limit_s > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit_s}")
    import time

    t0 = time.perf_counter()
    model = MigModel(problem)
    base_ev = model.evaluate(model.base_config)
    co2_cfg, co2_desc = model.co2opt_config()
    baselines: dict[str, Any] = {
        "base": {
            **_predicted(model, base_ev),
            # BASE defines the default SLA through the pooled M/G/N queue of its N GPUs
            "p95_ms": model.base_p95_ms,
            "sla_met": model.base_p95_ms <= model.sla_ms * (1 + CAPACITY_TOL),
            "description": f"{model.pairs[model.base_pair].variant} on every whole GPU",
            **describe_config(model, model.base_config),
        }
    }
    if co2_cfg is not None:
        baselines["co2opt"] = {
            **_predicted(model, model.evaluate(co2_cfg)),
            "description": co2_desc,
            **describe_config(model, co2_cfg),
        }
    else:
        baselines["co2opt"] = {"feasible": False, "description": co2_desc}
    current_gpus = None
    if current is not None:
        if current.kind != "mig":
            raise InputError(f"--current plan is a '{current.kind}' plan, expected 'mig'")
        current_gpus = current.extra.get("gpus")
        if not isinstance(current_gpus, list):
            raise InputError("--current plan has no 'gpus' list")

    info: dict[str, Any]
    if baseline == "base":
        config: Config | None = model.base_config
        info = {"name": "baseline:base"}
    elif baseline == "co2opt":
        if co2_cfg is None:
            raise InfeasiblePlan(f"CO2OPT: {co2_desc}", hint="relax --sla-ms or add GPUs")
        config, info = co2_cfg, {"name": "baseline:co2opt"}
    elif solver == "exact":
        from greenctl.planner.mig_exact import solve_exact_verified

        res = solve_exact_verified(problem, model, time_limit_s=time_limit_s, verify=verify)
        config, info, model = res.config, res.info, res.info.pop("_model", model)
    else:
        start = (
            config_from_gpus(model, current_gpus, source="--current plan") if current_gpus else None
        )
        if solver == "anneal":
            from greenctl.planner.mig_anneal import anneal

            res = anneal(model, start=start, time_limit_s=time_limit_s, seed=seed)
        else:
            from greenctl.planner.mig_random import random_search

            res = random_search(model, time_limit_s=time_limit_s, seed=seed)
        config, info = res.config, res.info
    if config is None or (require_feasible and not model.evaluate(config).feasible):
        raise InfeasiblePlan(
            f"no MIG configuration of {problem.gpus} x {problem.geo.name} serves "
            f"{problem.rate_rps:g} req/s within the p{round(problem.percentile * 100)} SLA of "
            f"{model.sla_ms:.4g} ms"
            + (f" at accuracy >= {model.floor:.4g}" if model.floor is not None else "")
            + (f" ({info['reason']})" if info.get("reason") else ""),
            hint="add GPUs, lower --rate, relax --sla-ms or --max-accuracy-loss"
            + ("" if solver == "exact" else ", or use --solver exact"),
        )
    ev = model.evaluate(config)
    info["wall_s"] = time.perf_counter() - t0
    info["evaluations"] = model.evaluations
    gpus = assign_gpus(model, config, current=current_gpus)
    deployments = [
        Deployment(
            model=problem.family,
            variant=o.variant,
            resource=f"mig:{o.profile}",
            count=config.n[k],
            batch=1,
            quota_rps=round(ev.split[k], 6),
        )
        for k, o in enumerate(model.pairs)
        if config.n[k] > 0
    ]
    synthetic = any(o.source == "synthetic" for o in model.pairs)
    request = {
        "gpu": problem.geo.name,
        "gpus": problem.gpus,
        "model": problem.family,
        "rate_rps": problem.rate_rps,
        "sla_ms": problem.sla_ms,
        "percentile": problem.percentile,
        "lambda": problem.lam,
        "carbon_intensity": problem.carbon_intensity,
        "base_carbon_intensity": problem.base_carbon_intensity,
        "max_accuracy_loss_pct": problem.max_accuracy_loss_pct,
        "solver": solver,
        "baseline": baseline,
        "seed": seed,
        "time_limit_s": time_limit_s,
        "policy": "wrr",
    }
    predicted = _predicted(model, ev)
    extra: dict[str, Any] = {
        "gpus": gpus,
        "baselines": baselines,
        "solver": info,
        "model": {
            "sla_ms": model.sla_ms,
            "sla_source": model.sla_source,
            "capacity_slo_ms": model.cap_slo_ms,
            "gpu_idle_w": problem.gpu_idle_w,
            "dispatch": "quota per (variant, profile) class split evenly over its instances "
            "(policy wrr); each instance an M/G/1 FIFO queue; p95 = mixture of the queues "
            "(analytic, evaluation core); p95_fifo_ms = one central FIFO queue, for reference",
            "notes": problem.notes,
            **({"label": "synthetic profiles"} if synthetic else {}),
        },
        "configuration": describe_config(model, config),
    }
    return Plan(
        kind="mig", request=request, deployments=deployments, predicted=predicted, extra=extra
    )

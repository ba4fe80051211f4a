"""The ``plan glet`` model that every scheduling algorithm shares.

The problem (:class:`GletProblem`), its compiled tables (:class:`Compiled`), the schedule
state (:class:`State`, :class:`Gpu`, :class:`Glet`) and small helpers on them. The
duty-cycle rule and the algorithms are described in :mod:`greenctl.planner.glet.solve`; the
exhaustive search (:mod:`greenctl.planner.glet.ideal`) imports this, not ``glet``.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.resources import RESOURCE_KINDS, parse_resource
from greenctl.planner.core.interference import InterferenceModel

DEFAULT_PARTITIONS = ("mps:20", "mps:40", "mps:50", "mps:60", "mps:80", "mps:100")
ALGORITHMS = ("glet", "sbp", "greedy", "ideal")
EPS = 1e-9
#: GPU memory an executor process holds beyond the tensors its profile's peak memory counts
#: (``torch.cuda.max_memory_allocated``): the CUDA context, cuBLAS/cuDNN workspaces. An
#: estimate (a PyTorch process with lazy module loading on an A100); a problem may set its own
EXECUTOR_OVERHEAD_MB = 300.0


@dataclass(frozen=True)
class GletModel:
    """One model to serve: its request rate and latency SLO."""

    name: str
    rate_rps: float
    slo_ms: float
    variant: str | None = None  # the profiled variant; defaults to ``name``
    #: the variant's family: what its deployments serve (the model name a client asks the
    #: dispatcher for, as in every plan document); None: ``name``
    family: str | None = None

    @property
    def variant_name(self) -> str:
        return self.variant or self.name

    @property
    def family_name(self) -> str:
        return self.family or self.name


@dataclass
class GletProblem:
    """Everything ``plan_glet`` needs; plain data, no store.

    Attributes:
        latency_ms, memory_mb: ``{variant: {resource: {batch: ...}}}``: solo batch latency (ms)
            and one executor's peak GPU memory (MiB); ``weights_mb`` bounds unprofiled batches.
        partitions: resource labels a glet may have, all ``mps:*`` or all ``mig:*``.
        rate_percentile: the Poisson percentile of one cycle's arrivals a batch holds (0: mean).
        interference, utilisation: the fitted interference model (None: none) and its inputs.
        rate_headroom: pack every model at ``rate x (1 + rate_headroom)`` so a replanned layout
            has room; plans still record the models' own rates.
        gpu_memory_mb: each GPU's memory all its executors must fit (None: not checked).
    """

    models: list[GletModel]
    latency_ms: Mapping[str, Mapping[str, Mapping[int, float]]]
    partitions: Sequence[str] = DEFAULT_PARTITIONS
    max_gpus: int = 8
    rate_percentile: float = 99.0
    interference: InterferenceModel | None = None
    utilisation: Mapping[tuple[str, int, int], tuple[float, float]] = field(default_factory=dict)
    rate_headroom: float = 0.0
    memory_mb: Mapping[str, Mapping[str, Mapping[int, float]]] = field(default_factory=dict)
    weights_mb: Mapping[str, float] = field(default_factory=dict)
    gpu_memory_mb: float | None = None
    executor_overhead_mb: float = EXECUTOR_OVERHEAD_MB


@functools.lru_cache(maxsize=4096)
def poisson_batch_mean(batch: int, percentile: float) -> float:
    """The largest mean arrivals per cycle whose ``percentile`` % quantile fits ``batch``.

    That is the largest ``lam`` with ``P(Poisson(lam) <= batch) >= percentile / 100``
    (bisection); ``batch`` itself when the percentile is 0.
    """
    if percentile <= 0:
        return float(batch)
    q = percentile / 100.0

    def cdf(lam: float) -> float:
        term = math.exp(-lam)
        total = term
        for n in range(1, batch + 1):
            term *= lam / n
            total += term
        return total

    lo, hi = 0.0, float(batch) + 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if cdf(mid) >= q:
            lo = mid
        else:
            hi = mid
    return lo


# -- compiled problem --------------------------------------------------------------------


class Compiled:
    """Index-based, precomputed form of a problem (shared by every algorithm)."""

    def __init__(self, problem: GletProblem) -> None:
        if not problem.models:
            raise InputError("no models to plan", hint="pass --model NAME:RATE:SLO_MS or --spec")
        names = [m.name for m in problem.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InputError(f"model {dup[0]} is given twice", hint="give each model once")
        if problem.max_gpus < 1:
            raise InputError(f"--max-gpus must be >= 1, got {problem.max_gpus}")
        if not 0 <= problem.rate_percentile < 100:
            raise InputError(
                f"--rate-percentile must be in [0, 100), got {problem.rate_percentile}"
            )
        self.problem = problem
        resources = [parse_resource(p) for p in problem.partitions]
        kinds = {r.spec for r in resources}
        if len(kinds) != 1 or any(k.share_capacity is None for k in kinds):
            shares = " or all ".join(
                f"{k.form} labels" for k in RESOURCE_KINDS.values() if k.share_capacity
            )
            raise InputError(
                f"partitions must be all {shares}, got " + ", ".join(problem.partitions)
            )
        spec = kinds.pop()
        self.spec = spec
        self.kind = spec.name
        self.capacity = spec.share_capacity or 0
        units = [spec.share_units(r.size) or 0 for r in resources]
        order = sorted(set(range(len(units))), key=lambda j: (units[j], resources[j].label))
        self.labels = [resources[j].label for j in order]
        self.units = [units[j] for j in order]
        if self.capacity not in self.units:
            raise InputError(
                f"the partitions must include a whole GPU ({spec.whole_share})",
                hint="for example --partitions 20,40,50,60,80,100",
            )
        self.full = self.units.index(self.capacity)
        self.n_parts = len(self.units)
        # complement[j]: the partition filling the rest of a GPU split at j (or None).
        self.complement: list[int | None] = []
        for u in self.units:
            rest = self.capacity - u
            self.complement.append(self.units.index(rest) if rest in self.units else None)
        self.splits = [j for j in range(self.n_parts) if self.complement[j] is not None]

        self.models = list(problem.models)
        self.n = len(self.models)
        self.true_rate = [float(m.rate_rps) for m in self.models]
        for m in self.models:
            if m.rate_rps < 0 or m.slo_ms <= 0 or not math.isfinite(m.rate_rps):
                raise InputError(
                    f"model {m.name}: rate must be >= 0 and SLO > 0 (got {m.rate_rps} req/s, "
                    f"{m.slo_ms} ms)"
                )
        headroom = problem.rate_headroom
        if not (math.isfinite(headroom) and 0 <= headroom <= 10):
            raise InputError(f"the rate headroom must be in [0, 10], got {headroom}")
        # Rates are packed at the Poisson q-percentile of the arrivals in one duty cycle: a
        # batch of b serves a cycle only while its mean arrivals stay below
        # poisson_batch_mean(b, q) (see the module docstring); with a headroom, at
        # rate x (1 + headroom).
        self.rate = [r * (1.0 + headroom) for r in self.true_rate]
        self.cycle_percentile = problem.rate_percentile
        self.slo = [float(m.slo_ms) for m in self.models]
        self._setup_profiles()
        # means[i][j][k]: mean arrivals per cycle batch k can take (see bmean)
        self.means = [
            [[self.bmean(b) for b in self.batches[i][j]] for j in range(self.n_parts)]
            for i in range(self.n)
        ]
        # the same in ms of a 1 req/s stream (a cycle's candidate lengths: divided by a rate)
        self.means_ms = [[[1000.0 * mb for mb in row] for row in rows] for rows in self.means]
        self._setup_interference()
        self._setup_memory()
        self._cap_cache: dict[tuple[int, int, float | None], float] = {}
        self._leff_cache: dict[tuple[int, int, float], list[float]] = {}
        self._config_cache: dict[Any, tuple[float, list[int], list[float]] | None] = {}
        self.ideal_exhaustive: bool | None = None  # set by the ideal search

    def _setup_profiles(self) -> None:
        """Each model's profiled batches and latencies per partition, latency made
        non-decreasing in batch; a model needs its whole-GPU profile."""
        problem = self.problem
        # batches[i][j], lat[i][j]: sorted profiled batches and latencies (ms), [] if missing.
        self.batches: list[list[list[int]]] = []
        self.lat: list[list[list[float]]] = []
        for m in self.models:
            prof = problem.latency_ms.get(m.variant_name)
            if not prof:
                raise InputError(
                    f"model {m.name}: no profiles of variant {m.variant_name}",
                    hint="import or measure them: `greenctl gpulet import DIR`",
                )
            bs_i, ls_i = [], []
            for label in self.labels:
                points = sorted((int(b), float(v)) for b, v in (prof.get(label) or {}).items())
                # keep latency non-decreasing in batch (noisy profiles at tiny batches)
                lats: list[float] = []
                for _, v in points:
                    lats.append(max(v, lats[-1]) if lats else v)
                bs_i.append([b for b, _ in points])
                ls_i.append(lats)
            if not bs_i[self.full]:
                raise InputError(
                    f"model {m.name}: variant {m.variant_name} has no profile on "
                    f"{self.labels[self.full]}",
                    hint="the whole-GPU profile is needed to decide feasibility",
                )
            self.batches.append(bs_i)
            self.lat.append(ls_i)

    def _setup_interference(self) -> None:
        imodel = self.problem.interference
        # interference is measured between MPS shares (thread-percentage kinds)
        self.interference_on = imodel is not None and self.spec.thread_percentage
        self.notes: list[str] = []
        self.base: list[list[list[float]]] = [
            [[0.0] * len(self.batches[i][j]) for j in range(self.n_parts)] for i in range(self.n)
        ]
        self.w_other: list[list[float]] = [[0.0] * self.n_parts for _ in range(self.n)]
        self.w_worst: list[float] = [0.0] * self.n_parts
        self.w_median: list[float] = [0.0] * self.n_parts
        if not self.interference_on or imodel is None:
            return
        util = self.problem.utilisation
        if not util:
            self.interference_on = False
            self.notes.append("no utilisation data in the store: interference not modelled")
            return
        by_part: dict[int, list[tuple[float, float]]] = {}
        for (_, _, p), v in util.items():
            by_part.setdefault(p, []).append(v)
        worst_all = (max(v[0] for v in util.values()), max(v[1] for v in util.values()))
        for i, m in enumerate(self.models):
            vname = m.variant_name
            missing = False
            for j, u in enumerate(self.units):
                worst_here = by_part.get(u)
                worst = (
                    (max(x[0] for x in worst_here), max(x[1] for x in worst_here))
                    if worst_here
                    else worst_all
                )
                seen = []
                for k, b in enumerate(self.batches[i][j]):
                    ut = util.get((vname, b, u))
                    if ut is None:
                        ut, missing = worst, True
                    seen.append(ut)
                    self.base[i][j][k] = imodel.self_term(ut[0] / 100, ut[1] / 100)
                if not seen:
                    seen = [worst]
                self.w_other[i][j] = max(imodel.other_term(ut[0] / 100, ut[1] / 100) for ut in seen)
            if missing:
                self.notes.append(
                    f"{m.name}: no utilisation data for some points; worst case assumed"
                )
        for j in range(self.n_parts):
            self.w_worst[j] = max(self.w_other[i][j] for i in range(self.n))
            self.w_median[j] = sorted(self.w_other[i][j] for i in range(self.n))[self.n // 2]

    def _setup_memory(self) -> None:
        """``mem[i][j][k]``: MiB one executor of model i at batch k of partition j takes on
        its GPU (None: unknown): the profile of that point, else the most any profile of
        the variant at that batch shows, else its weights; plus the executor overhead."""
        p = self.problem
        cap = p.gpu_memory_mb
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise InputError(f"the GPU memory must be a positive number of MiB, got {cap}")
        if not (math.isfinite(p.executor_overhead_mb) and p.executor_overhead_mb >= 0):
            raise InputError(
                f"the executor overhead must be >= 0 MiB, got {p.executor_overhead_mb}"
            )
        self.gpu_memory_mb = cap
        self.mem: list[list[list[float | None]]] = []
        unknown = []
        for i, m in enumerate(self.models):
            table = p.memory_mb.get(m.variant_name) or {}
            by_batch: dict[int, float] = {}
            for points in table.values():
                for b, peak in points.items():
                    if peak is not None and peak > 0:
                        by_batch[int(b)] = max(by_batch.get(int(b), 0.0), float(peak))
            weights = p.weights_mb.get(m.variant_name)
            rows: list[list[float | None]] = []
            missing = False
            for j, label in enumerate(self.labels):
                here = table.get(label) or {}
                row: list[float | None] = []
                for b in self.batches[i][j]:
                    mb: float | None = here.get(b) or by_batch.get(b) or weights
                    row.append(None if not mb else float(mb) + p.executor_overhead_mb)
                    missing = missing or not mb
                rows.append(row)
            self.mem.append(rows)
            if missing and cap is not None:
                unknown.append(m.name)
        if unknown:
            self.notes.append(
                f"{', '.join(unknown)}: no profiled memory at some batches (nor the weights): "
                "not counted against the GPU memory there"
            )

    def glet_memory(self, j: int, entries: Sequence[tuple[int, float]], ks: Sequence[int]) -> float:
        """MiB the executors of a glet take (one per model; unknown ones count 0)."""
        total = 0.0
        for (i, _), k in zip([e for e in entries if e[1] > EPS], ks, strict=True):
            total += self.mem[i][j][k] or 0.0
        return total

    def w_assumed(self, j: int, assume: str) -> float | None:
        """Co-runner term assumed for an empty glet of partition j."""
        if not self.interference_on or assume == "none":
            return None
        return self.w_worst[j] if assume == "worst" else self.w_median[j]

    # -- latency and the duty-cycle rule -------------------------------------------------
    def leffs(self, i: int, j: int, w: float | None) -> list[float]:
        """Latencies (ms) of model i's batches on partition j beside a co-runner term w.

        Made non-decreasing in the batch: a batch planned at b may run with fewer requests,
        and the interference factor can be larger at small batches.
        """
        if w is None or not self.interference_on:
            return self.lat[i][j]
        key = (i, j, w)
        hit = self._leff_cache.get(key)
        if hit is not None:
            return hit
        out: list[float] = []
        for k, lat in enumerate(self.lat[i][j]):
            v = lat * max(1.0, self.base[i][j][k] + w)
            out.append(max(v, out[-1]) if out else v)
        self._leff_cache[key] = out
        return out

    def leff(self, i: int, j: int, k: int, w: float | None) -> float:
        """Latency (ms) of model i's k-th batch on partition j beside a co-runner term w."""
        return self.leffs(i, j, w)[k]

    def cap(self, i: int, j: int, w: float | None) -> float:
        """Most req/s model i can serve alone on partition j (``2 L(b) <= SLO``)."""
        key = (i, j, w)
        hit = self._cap_cache.get(key)
        if hit is not None:
            return hit
        best = 0.0
        for k, le in enumerate(self.leffs(i, j, w)):
            if 2 * le <= self.slo[i] + EPS:
                best = max(best, 1000.0 * self.means[i][j][k] / le)
        self._cap_cache[key] = best
        return best

    def config(
        self, j: int, entries: Sequence[tuple[int, float]], w: float | None
    ) -> tuple[float, list[int], list[float]] | None:
        """Shortest feasible duty cycle of a glet, or None.

        Returns ``(duty_cycle_ms, batch index per entry, latency ms per entry)``.
        """
        entries = [(i, r) for i, r in entries if r > EPS]
        if not entries:
            return (0.0, [], [])
        key = (j, tuple(entries), w)
        if key in self._config_cache:
            return self._config_cache[key]
        # Necessary condition: each model busies at least rate / capacity of the cycle.
        load = 0.0
        for i, r in entries:
            cap = self.cap(i, j, w)
            if cap <= 0:
                self._config_cache[key] = None
                return None
            load += r / cap
        if load > 1 + 1e-9:
            self._config_cache[key] = None
            return None
        out = self._config(j, entries, w)
        self._config_cache[key] = out
        return out

    def _config(
        self, j: int, entries: list[tuple[int, float]], w: float | None
    ) -> tuple[float, list[int], list[float]] | None:
        """The shortest candidate cycle (one that fills some model's batch exactly) that
        holds every model's batch run and keeps ``cycle + run <= SLO``; None if none does."""
        if any(not self.batches[i][j] for i, _ in entries):
            return None
        tables = [(self.means[i][j], self.leffs(i, j, w), r) for i, r in entries]
        # the shortest candidate first: most glets that fail, fail there, before the others
        # are listed and sorted
        dc = min(self.means_ms[i][j][0] / r for i, r in entries)
        cands: list[float] | None = None
        n = 0
        while True:
            ks: list[int] = []
            ls: list[float] = []
            total = 0.0
            for means, lf, r in tables:
                k = bisect.bisect_left(means, r * dc / 1000.0 - 1e-7)
                if k >= len(means):
                    return None  # a larger cycle needs an even larger batch
                le = lf[k]
                ks.append(k)
                ls.append(le)
                total += le
            if any(total + le > self.slo[i] + EPS for (i, _), le in zip(entries, ls, strict=True)):
                return None  # latency only grows with the cycle
            if total <= dc + EPS:
                return (total, ks, ls)
            if cands is None:
                cands = sorted(x / r for i, r in entries for x in self.means_ms[i][j])
            # the runs only grow with the cycle: no cycle shorter than them can hold them
            n = bisect.bisect_left(cands, total - 2 * EPS, n + 1)
            if n >= len(cands):
                return None
            dc = cands[n]

    def bmean(self, batch: int) -> float:
        """Mean arrivals per cycle a batch of ``batch`` can take (see poisson_batch_mean)."""
        return poisson_batch_mean(batch, self.cycle_percentile)

    def feasible_alone(self, i: int) -> bool:
        return self.cap(i, self.full, None) > 0


# -- schedule state ------------------------------------------------------------------------


@dataclass
class Glet:
    """A partition of one GPU and the (model index, planned rate) entries on it."""

    j: int
    entries: list[tuple[int, float]] = field(default_factory=list)
    #: (entries, co-runner term, load) of the last :func:`glet_load`: entries lists are
    #: replaced, never changed in place, so the same list object means the same load
    load_memo: tuple[Any, float | None, float] | None = field(
        default=None, compare=False, repr=False
    )


@dataclass
class Gpu:
    glets: list[Glet] = field(default_factory=list)


class State:
    """A schedule under construction."""

    def __init__(self, c: Compiled, max_gpus: int, *, assume: str = "worst") -> None:
        self.c = c
        self.max_gpus = max_gpus
        # How to size a glet whose GPU-mate is still empty: for the worst co-runner among
        # the problem's models ("worst"), a median one ("median") or none ("none"). Every
        # placement re-checks both glets of the GPU with the actual co-runners, so only
        # the packing quality depends on this, never the SLO.
        self.assume = assume
        self.gpus: list[Gpu] = []

    def copy(self) -> State:
        """An independent copy: its glets are new objects; their entries lists (replaced,
        never changed in place) and remembered loads are shared."""
        s = State(self.c, self.max_gpus, assume=self.assume)
        s.gpus = [Gpu([Glet(g.j, g.entries, g.load_memo) for g in gpu.glets]) for gpu in self.gpus]
        return s

    @property
    def used_gpus(self) -> int:
        return sum(1 for gpu in self.gpus if any(g.entries for g in gpu.glets))

    def mate(self, gi: int, li: int) -> Glet | None:
        gpu = self.gpus[gi]
        return gpu.glets[1 - li] if len(gpu.glets) == 2 else None

    def w_for(self, gi: int, li: int, *, assume_worst: bool) -> float | None:
        """Co-runner term for glet (gi, li): None when alone on the GPU."""
        c = self.c
        if not c.interference_on:
            return None
        mate = self.mate(gi, li)
        if mate is None:
            return None
        if not mate.entries:
            return c.w_assumed(mate.j, self.assume) if assume_worst else None
        return max(c.w_other[i][mate.j] for i, _ in mate.entries)

    def check_with(self, gi: int, li: int, entries: list[tuple[int, float]]) -> bool:
        """Would glet (gi, li) with ``entries`` keep itself and its mate feasible, and the
        GPU's executors fit its memory?"""
        c = self.c
        glet = self.gpus[gi].glets[li]
        cfg = c.config(glet.j, entries, self.w_for(gi, li, assume_worst=True))
        if cfg is None:
            return False
        mate = self.mate(gi, li)
        mate_cfg = None
        if mate is not None and mate.entries:
            w_new = (
                max(c.w_other[i][glet.j] for i, _ in entries)
                if entries and c.interference_on
                else None
            )
            mate_cfg = c.config(mate.j, mate.entries, w_new)
            if mate_cfg is None and c.interference_on:
                return False
        if c.gpu_memory_mb is not None:
            used = c.glet_memory(glet.j, entries, cfg[1])
            if mate is not None and mate_cfg is not None:
                used += c.glet_memory(mate.j, mate.entries, mate_cfg[1])
            if used > c.gpu_memory_mb + EPS:
                return False
        return True

    def gpu_memory(self, gi: int) -> float:
        """MiB the executors of GPU ``gi`` take with their final batches (actual co-runners;
        unknown memory counts 0)."""
        c = self.c
        total = 0.0
        for li, g in enumerate(self.gpus[gi].glets):
            if g.entries:
                cfg = c.config(g.j, g.entries, self.w_for(gi, li, assume_worst=False))
                if cfg is not None:
                    total += c.glet_memory(g.j, g.entries, cfg[1])
        return total

    def fits_memory(self) -> bool:
        """Whether every GPU's executors fit its memory (True when it is not known)."""
        cap = self.c.gpu_memory_mb
        return cap is None or all(self.gpu_memory(gi) <= cap + EPS for gi in range(len(self.gpus)))

    def open_gpu(self, split_j: int | None) -> int | None:
        """Open a new GPU, whole (None / full) or split at ``split_j``; returns its index."""
        if len(self.gpus) >= self.max_gpus:
            return None
        c = self.c
        if split_j is None or split_j == c.full or c.complement[split_j] is None:
            self.gpus.append(Gpu([Glet(c.full)]))
        else:
            comp = c.complement[split_j]
            assert comp is not None
            self.gpus.append(Gpu([Glet(split_j), Glet(comp)]))
        return len(self.gpus) - 1


def solo_cap(c: Compiled, i: int, j: int, assume: str = "worst") -> float:
    """Capacity of model i alone on partition j, next to an assumed co-runner if split."""
    if j == c.full:
        return c.cap(i, j, None)
    comp = c.complement[j]
    return c.cap(i, j, c.w_assumed(comp, assume) if comp is not None else None)


def model_order(c: Compiled, how: str) -> list[int]:
    """The models with a rate, in the order ``how`` names (an algorithm's placement order)."""
    idx = [i for i in range(c.n) if c.rate[i] > EPS]
    if how == "rate_slo_asc":  # gpulet's order
        return sorted(idx, key=lambda i: (c.rate[i] * c.slo[i], i))
    if how == "rate_slo_desc":
        return sorted(idx, key=lambda i: (-c.rate[i] * c.slo[i], i))
    if how == "demand_desc":
        return sorted(idx, key=lambda i: (-c.rate[i] / max(solo_cap(c, i, c.full), EPS), i))
    raise ValueError(how)


def glet_load(c: Compiled, g: Glet, w: float | None) -> float:
    """The share of a duty cycle glet ``g``'s models busy beside co-runner term ``w``
    (``sum rate / capacity``, what :meth:`Compiled.config` checks first; inf when one
    cannot be served there), remembered while the glet's entries and ``w`` stay."""
    memo = g.load_memo
    if memo is not None and memo[0] is g.entries and memo[1] == w:
        return memo[2]
    load = 0.0
    for i, r in g.entries:
        if r > EPS:
            cap = c.cap(i, g.j, w)
            load += r / cap if cap > 0 else math.inf
    g.load_memo = (g.entries, w, load)
    return load


def add_entry(entries: list[tuple[int, float]], i: int, rate: float) -> list[tuple[int, float]]:
    """A copy of a glet's ``(model, rate)`` entries with ``rate`` more of model ``i``."""
    out = list(entries)
    for n, (k, r) in enumerate(out):
        if k == i:
            out[n] = (k, r + rate)
            return out
    out.append((i, rate))
    return out

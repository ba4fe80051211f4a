"""The ``plan mig`` problem: its inputs and how they are built from profiles.

:class:`MigProblem` and :func:`build_problem`, shared by the planner
(:mod:`greenctl.planner.mig.solve`), the serving model and the solvers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.mig_geometry import GpuGeometry, find_gpu
from greenctl.data.records import Profile, Variant, point_preference
from greenctl.data.resources import PIN_MIG_INSTANCE, kind_of
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.service import service_time

J_PER_KWH = 3.6e6
# Relative shortfall of capacity treated as the capacity bisection's rounding, not overload.
CAPACITY_TOL = 1e-3


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
    vmap = {v.name: v for v in variants if v.family == family}
    if not vmap:
        raise NotFoundError(
            f"no variants of model family '{family}' in the store",
            hint="profile them on MIG instances, import profiles, or try "
            "`greenctl mig synth --gpu MODEL --family efficientnet` for a synthetic demo",
        )
    notes: list[str] = []
    options, idle_per_slice = _slice_options(geo, profiles, vmap, notes)
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


def _slice_options(
    geo: GpuGeometry, profiles: Iterable[Profile], vmap: dict[str, Variant], notes: list[str]
) -> tuple[list[SliceOption], list[float]]:
    """The (variant, slice) options of the family's batch-1 MIG profiles of ``geo`` (the
    best row of each), and the idle power per compute slice the profiles measured; a
    variant too big for a slice is left out with a note."""
    options: list[SliceOption] = []
    idle_per_slice: list[float] = []
    seen: set[tuple[str, str]] = set()
    # The rows of one (variant, slice), best first: several points (hardware labels that
    # name this GPU model, capacity SLOs) may remain after the store's choice of each.
    by_preference = sorted(
        profiles, key=lambda r: (r.variant, r.resource, point_preference(r)), reverse=True
    )
    for p in by_preference:
        if p.variant not in vmap or kind_of(p.resource).pinning != PIN_MIG_INSTANCE or p.batch != 1:
            continue
        hw = find_gpu(p.hardware)
        if hw is None or hw.name != geo.name or not geo.has_profile(p.resource):
            continue
        key = (p.variant, p.resource[4:])
        if key in seen:
            continue  # an older or lower-ranked row of the same slice
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
        service = service_time(p)
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
    return options, idle_per_slice

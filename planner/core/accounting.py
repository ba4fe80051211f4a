"""What a plan's instances cost at a load: the load split over models, deployments and
instances, and the accounting of power, energy, carbon, water, money and utilisation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InputError
from greenctl.data.mig_geometry import resolve_gpu
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.data.resources import hourly_cost
from greenctl.planner.core.instances import (
    Instance,
    ProfileKey,
    build_instances,
    instance_busy,
)
from greenctl.planner.core.serving_path import (
    ServingInput,
    serving_path,
)


def split_load(
    instances: Sequence[Instance],
    deployments: Sequence[Deployment],
    rate_rps: float | Mapping[str, float],
) -> tuple[dict[str, float], list[float]]:
    """The rate of each model, and each instance's share (0..1) of its model's rate.

    The per-instance shares are what ``wrr`` and ``batch`` dispatch by (quota, else
    capacity, split evenly over a deployment's instances); ``fifo`` ignores them.
    """
    models = list(dict.fromkeys(i.model for i in instances))
    cap_of_dep: dict[int, float] = {}
    for inst in instances:
        cap_of_dep[inst.deployment] = (
            cap_of_dep.get(inst.deployment, 0.0) + inst.served_capacity_rps
        )
    all_quota = all(d.quota_rps is not None for d in deployments)
    if isinstance(rate_rps, Mapping):
        unknown = sorted(set(rate_rps) - set(models))
        if unknown:
            raise InputError(f"rate given for models not in the plan: {', '.join(unknown)}")
        model_rate = {m: float(rate_rps.get(m, 0.0)) for m in models}
    else:
        weights = {}
        for m in models:
            deps = {i.deployment for i in instances if i.model == m}
            if all_quota:
                weights[m] = sum(float(deployments[d].quota_rps or 0.0) for d in deps)
            else:
                weights[m] = sum(cap_of_dep[d] for d in deps)
        total = sum(weights.values())
        if total <= 0:
            weights = {m: 1.0 for m in models}
            total = float(len(models))
        model_rate = {m: float(rate_rps) * weights[m] / total for m in models}
    for m, r in model_rate.items():
        if not math.isfinite(r) or r < 0:
            raise InputError(f"rate for model '{m}' must be a finite number >= 0, got {r}")
    shares = [0.0] * len(instances)
    for m in models:
        dep_ids = sorted({i.deployment for i in instances if i.model == m})
        model_quota = all(deployments[d].quota_rps is not None for d in dep_ids)
        dep_w = {
            d: (float(deployments[d].quota_rps or 0.0) if model_quota else cap_of_dep[d])
            for d in dep_ids
        }
        total = sum(dep_w.values())
        if total <= 0:
            dep_w = {d: cap_of_dep[d] for d in dep_ids}
            total = sum(dep_w.values())
        for inst in instances:
            if inst.model == m:
                shares[inst.index] = (
                    dep_w[inst.deployment] / total / deployments[inst.deployment].count
                )
    return model_rate, shares


def account(
    instances: Sequence[Instance],
    variants: Mapping[str, Variant],
    *,
    rate_rps: float,
    served_rps: Sequence[float],
    busy_frac: Sequence[float],
    carbon_g_per_kwh: float | None = None,
    pue: float = 1.0,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    device_idle_power_w: float | None = None,
    spare_idle_w: float = 0.0,
) -> dict[str, Any]:
    """Throughput, accuracy, power, energy, carbon, water and cost of a configuration.

    Args:
        served_rps: per instance, the rate it completes.
        busy_frac: per instance, the fraction of time it executes (0..1).
        spare_idle_w: idle power no instance carries (:func:`spare_idle_w`).
    """
    if pue < 1.0 or not math.isfinite(pue):
        raise InputError(f"PUE must be a number >= 1, got {pue}")
    if carbon_g_per_kwh is not None:
        carbon_option(carbon_g_per_kwh, "carbon intensity")
    for name, value in (
        ("WUE", wue_l_per_kwh),
        ("EWIF", ewif_l_per_kwh),
        ("device idle power", device_idle_power_w),
    ):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise InputError(f"{name} must be a number >= 0, got {value}")
    served = float(sum(served_rps))
    out: dict[str, Any] = {
        "rate_rps": float(rate_rps),
        "served_rps": served,
        "dropped_rps": _clean(max(float(rate_rps) - served, 0.0), float(rate_rps)),
    }
    # accuracy, request-weighted
    acc_num, acc_known = 0.0, True
    for inst, s in zip(instances, served_rps, strict=True):
        if s <= 0:
            continue
        variant = variants.get(inst.variant)
        if variant is None or variant.accuracy is None:
            acc_known = False
            continue
        acc_num += s * float(variant.accuracy)
    out["accuracy"] = acc_num / served if acc_known and served > 0 else None
    # power
    power, power_known = 0.0, True
    for inst, u in zip(instances, busy_frac, strict=True):
        busy_w = inst.profile.power_w
        if busy_w is None and inst.profile.energy_j is not None:
            busy_w = inst.profile.energy_j * inst.capacity_rps
        if busy_w is None:
            power_known = False
            continue
        idle_w = inst.profile.idle_power_w or 0.0
        u = min(max(u, 0.0), 1.0)
        power += u * busy_w + (1.0 - u) * idle_w
    if device_idle_power_w:
        power += device_idle_power_w * len({inst.device for inst in instances})
    power += spare_idle_w
    out["power_w"] = power if power_known else None
    energy = power / served if power_known and served > 0 else None
    out["energy_j_per_request"] = energy
    kwh = energy / 3.6e6 if energy is not None else None
    out["carbon_g_per_request"] = (
        kwh * pue * carbon_g_per_kwh if kwh is not None and carbon_g_per_kwh is not None else None
    )
    if kwh is not None and (wue_l_per_kwh is not None or ewif_l_per_kwh is not None):
        out["water_l_per_request"] = kwh * (pue * (ewif_l_per_kwh or 0.0) + (wue_l_per_kwh or 0.0))
    else:
        out["water_l_per_request"] = None
    # priced as the planners price: a profile without cost_per_hour costs its resource amount
    costs = [hourly_cost(i.resource, i.profile.cost_per_hour) for i in instances]
    out["cost_per_hour"] = float(sum(c for c, _ in costs))
    out["cost_priced"] = all(priced for _, priced in costs)
    out["utilisation"] = (
        float(sum(min(max(u, 0.0), 1.0) for u in busy_frac) / len(instances)) if instances else 0.0
    )
    return out


@dataclass(frozen=True)
class EnergyTerms:
    """The power of one instance as linear terms: ``idle_w + dynamic_j_per_request x rate``.

    Summed over a plan's instances they give :func:`predict`'s ``power_w`` (and, divided by the
    rate, its ``energy_j_per_request``), so solvers can price a plan linearly. Exact below
    saturation when ``linear``; otherwise exact at ``rate_rps`` only, the secant from the idle
    point (docs/models.md, "Energy terms").

    Attributes:
        idle_w: power at no load (the profile's ``idle_power_w``), drawn whether it serves or not.
        dynamic_j_per_request: busy minus idle power times busy time per request served.
        rate_rps, linear: the per-instance rate taken at; whether they hold at every rate.
    """

    idle_w: float
    dynamic_j_per_request: float
    rate_rps: float
    linear: bool

    def power_w(self, rate_rps: float) -> float:
        """The instance's power at ``rate_rps`` (req/s) by these terms."""
        return self.idle_w + self.dynamic_j_per_request * rate_rps


def instance_power_w(
    inst: Instance, rate_rps: float, serving: ServingInput | None = None
) -> float | None:
    """The power (W) of ``inst`` serving ``rate_rps`` alone under ``wrr``/``batch``, by the
    rule :func:`predict` accounts with (:func:`account`); None when its profile has no power."""
    path = serving_path(serving, inst.model, inst.variant, inst.resource)
    busy = instance_busy(inst, rate_rps, path)
    return account([inst], {}, rate_rps=rate_rps, served_rps=[rate_rps], busy_frac=[busy])[
        "power_w"
    ]


def energy_terms(
    deployment: Deployment,
    profiles: Mapping[ProfileKey, Profile],
    *,
    rate_rps: float,
    serving: ServingInput | None = None,
    max_wait_ms: float | None = None,
) -> EnergyTerms | None:
    """The linear power terms of one instance of ``deployment`` (its variant, resource and
    batch; its count is ignored) at the operating point ``rate_rps`` (req/s per instance):
    what a solver sums over a plan to get :func:`predict`'s ``power_w`` (:class:`EnergyTerms`).

    ``profiles``, ``serving`` and ``max_wait_ms`` as :func:`predict` takes them (every
    measured batch size of a batching deployment's (variant, resource)). None when the
    profile has neither ``power_w`` nor ``energy_j``.

    Raises:
        InputError: no profile for the deployment, or a rate that is not a finite number > 0.
    """
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise InputError(f"an operating point must be a rate > 0 req/s, got {rate_rps}")
    (inst,) = build_instances(
        [replace(deployment, count=1)], profiles, max_wait_ms=max_wait_ms, serving=serving
    )
    idle = instance_power_w(inst, 0.0, serving)
    power = instance_power_w(inst, rate_rps, serving)
    if idle is None or power is None:
        return None
    dynamic = (power - idle) / rate_rps
    linear = False  # a batching instance: its batches fill with the rate
    if inst.batches is None:
        half = instance_power_w(inst, 0.5 * rate_rps, serving)
        linear = half is not None and math.isclose(
            half, idle + dynamic * 0.5 * rate_rps, rel_tol=1e-9, abs_tol=1e-12
        )
    return EnergyTerms(idle, dynamic, float(rate_rps), linear)


def _clean(value: float, scale: float) -> float:
    """Round float noise (relative to ``scale``) to zero."""
    return 0.0 if abs(value) <= 1e-9 * max(abs(scale), 1.0) else value


def spare_idle_w(plan: Any) -> float:
    """Idle power (W) of the compute slices of a MIG plan's GPUs that no instance holds.

    A partitioned GPU draws its whole idle power whatever its layout, and ``plan mig``
    charges each of its ``gpus`` GPUs that (``extra.model.gpu_idle_w``); the plan's instances
    carry only their own slices' share (their profiles' ``idle_power_w``), so a layout that
    leaves slices empty (3g + 3g leaves one of an A100's seven; a GPU with no instance all
    seven) would look cheaper summed than planned. This is the difference,
    ``(gpus x C - the instances' compute slices) x gpu_idle_w / C`` with ``C`` the GPU's
    compute slices, added to every evaluation of the plan (``simulate``, ``replay``). It
    depends only on the request and the deployments. 0 for a plan without those figures
    (only ``plan mig`` records ``gpu_idle_w``).
    """
    model = plan.extra.get("model")
    idle = model.get("gpu_idle_w") if isinstance(model, dict) else None
    gpus = plan.request.get("gpus")
    gpu = plan.request.get("gpu")
    if not isinstance(idle, int | float) or not isinstance(gpus, int) or not gpu:
        return 0.0
    geo = resolve_gpu(str(gpu))
    used = sum(d.count * geo.profile(d.resource).compute_slices for d in plan.deployments)
    return max(gpus * geo.compute_slices - used, 0) * float(idle) / geo.compute_slices

"""SYNTHETIC per-MIG-slice inference profiles (no public per-slice measurements exist).

Everything here is made up by a documented formula and labelled ``source="synthetic"`` and
``energy_method="synthetic"`` wherever it lands; only the accuracies are real (Clover's
published figures, ``data/datasets/clover_accuracy.json``). Real per-slice profiles come
from ``greenctl profile`` on a MIG GPU. The formulas (saturating speed-up per slice, memory
fit, power from idle and TDP per slice) are in docs/models.md ("Synthetic MIG profiles");
the constants in :func:`synthetic_family`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from greenctl.data import bundled
from greenctl.data.errors import InputError
from greenctl.data.mig_geometry import GpuGeometry, MigProfile
from greenctl.data.provenance import prefixed
from greenctl.data.records import SYNTHETIC, Profile, Variant

ACCURACY_SOURCE = "boringlee24/sc23-clover accuracy.json (MIT), via greenctl clover_accuracy.json"


@dataclass(frozen=True)
class VariantSpec:
    """Synthetic size of a variant: work per request and memory footprint."""

    key: str  # the key in clover_accuracy.json
    name: str  # the greenctl variant name
    gflops: float
    params_m: float
    memory_gib: float


# Published FLOPs/parameter counts (rounded) set the relative sizes; memory at batch 1
# includes ~0.8 GiB of CUDA context. These are assumptions of the synthetic model.
FAMILIES: dict[str, tuple[VariantSpec, ...]] = {
    "efficientnet": (
        VariantSpec("b0", "efficientnet-b0", 0.39, 5.3, 1.0),
        VariantSpec("b1", "efficientnet-b1", 0.70, 7.8, 1.1),
        VariantSpec("b2", "efficientnet-b2", 1.0, 9.2, 1.2),
        VariantSpec("b3", "efficientnet-b3", 1.8, 12.0, 1.4),
        VariantSpec("b4", "efficientnet-b4", 4.2, 19.0, 1.9),
        VariantSpec("b5", "efficientnet-b5", 9.9, 30.0, 2.8),
        VariantSpec("b6", "efficientnet-b6", 19.0, 43.0, 3.8),
        VariantSpec("b7", "efficientnet-b7", 37.0, 66.0, 5.5),
    ),
    "yolo": (
        VariantSpec("yolov5l", "yolov5l", 109.0, 46.5, 2.5),
        VariantSpec("yolov5x", "yolov5x", 205.7, 86.7, 3.5),
        VariantSpec("yolov5x6", "yolov5x6", 839.0, 140.7, 7.0),
    ),
    "albert": (
        VariantSpec("base", "albert-base", 34.0, 12.0, 1.2),
        VariantSpec("large", "albert-large", 120.0, 18.0, 1.5),
        VariantSpec("xlarge", "albert-xlarge", 410.0, 60.0, 2.5),
        VariantSpec("xxlarge", "albert-xxlarge", 1600.0, 235.0, 6.0),
    ),
}

# Synthetic power envelope and per-slice time factor of each GPU model (assumptions close
# to the data sheets' idle/TDP figures).
GPU_POWER: dict[str, tuple[float, float, float]] = {
    # name: (idle W, TDP W, time factor per compute slice vs an A100 slice)
    "A100-40GB": (50.0, 400.0, 1.0),
    "A100-80GB": (60.0, 400.0, 0.95),
    "H100-80GB": (70.0, 700.0, 0.5),
    "H100-NVL-94GB": (70.0, 400.0, 0.55),
    "H200-141GB": (75.0, 700.0, 0.47),
    "A30-24GB": (30.0, 165.0, 1.1),
}


@cache
def clover_accuracy() -> dict[str, Any]:
    """The bundled copy of Clover's published accuracies (percent), with attribution."""
    doc: dict[str, Any] = json.loads(bundled.path_of("clover-accuracy").read_text())
    return doc


def family_names() -> list[str]:
    """The families the synthetic generator knows."""
    return sorted(FAMILIES)


def _speedup(g: int, k: float) -> float:
    return g * (1.0 + k) / (g + k)


def slice_figures(geo: GpuGeometry, profile: MigProfile, spec: VariantSpec) -> dict[str, float]:
    """The synthetic latency (ms), power (W) and energy (J) of one variant on one profile."""
    idle_w, tdp_w, time_factor = GPU_POWER.get(geo.name, (50.0, 400.0, 1.0))
    g = profile.compute_slices
    k = min(max(0.6 * spec.gflops**0.4, 0.3), 12.0)
    s = _speedup(g, k)
    b_mem = ((geo.compute_slices * profile.memory_slices) / (geo.memory_slices * g)) ** -0.1
    latency = 1.5 + 0.5 * spec.memory_gib + time_factor * 1.2 * spec.gflops * b_mem / s
    p_i = idle_w / geo.compute_slices
    p_d = (tdp_w - idle_w) / geo.compute_slices
    u = 0.35 + 0.1 * math.log10(1.0 + spec.gflops)
    idle = g * p_i
    power = idle + p_d * (u * s + 0.12 * (g - s))
    return {
        "latency_ms": latency,
        "idle_power_w": idle,
        "power_w": power,
        "energy_j": power * latency / 1000.0,
    }


def fits(geo: GpuGeometry, profile: MigProfile, spec: VariantSpec) -> bool:
    """Whether the variant fits the instance's memory (90 % usable)."""
    return spec.memory_gib <= 0.9 * profile.memory_gib


def synthetic_family(
    geo: GpuGeometry, family: str, *, include_me: bool = False, prefix: str | None = None
) -> tuple[list[Variant], list[Profile]]:
    """Synthetic variants (real accuracies) and per-slice profiles of ``family`` on GPU ``geo``.

    ``include_me`` also emits ``+me`` instances (same figures). ``prefix`` names every
    non-real variant and the family ``PREFIX-NAME`` (``synthetic`` turns ``efficientnet-b0``
    into ``synthetic-efficientnet-b0``).

    Returns:
        (variants, profiles); every profile has ``source`` and ``energy_method``
        ``"synthetic"`` and ``hardware`` set to the GPU's first NVML name.
    Raises:
        InputError: unknown family, or a prefix that is not a name.
    """
    if family not in FAMILIES:
        raise InputError(
            f"no synthetic model for family '{family}'",
            hint=f"known families: {', '.join(family_names())}",
        )
    acc = clover_accuracy()["families"][family]
    hardware = geo.nvml_names[0] if geo.nvml_names else geo.name

    def name(base: str) -> str:
        return base if prefix is None else prefixed(prefix, base)

    variants = [
        Variant(
            name=name(spec.name),
            family=name(family),
            accuracy=float(acc["variants"][spec.key]) / 100.0,
            accuracy_metric=str(acc["metric"]).removesuffix("-pct"),
            accuracy_source=ACCURACY_SOURCE,
            params=int(spec.params_m * 1e6),
            memory_mb=spec.memory_gib * 1024.0,
            source=SYNTHETIC,
        )
        for spec in FAMILIES[family]
    ]
    profiles = []
    for spec in FAMILIES[family]:
        for prof in geo.profiles:
            if prof.media_extension and not include_me:
                continue
            if not fits(geo, prof, spec):
                continue
            fig = slice_figures(geo, prof, spec)
            lat = fig["latency_ms"]
            profiles.append(
                Profile(
                    variant=name(spec.name),
                    resource=prof.resource,
                    batch=1,
                    throughput_rps=1000.0 / lat,
                    latency_p50_ms=lat,
                    latency_p95_ms=lat * 1.08,
                    latency_p99_ms=lat * 1.15,
                    hardware=hardware,
                    power_w=fig["power_w"],
                    idle_power_w=fig["idle_power_w"],
                    energy_j=fig["energy_j"],
                    energy_method=SYNTHETIC,
                    memory_mb=spec.memory_gib * 1024.0,
                    source=SYNTHETIC,
                )
            )
    return variants, profiles

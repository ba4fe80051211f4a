"""Domain records stored in SQLite: hardware, variants, profiles.

Plain dataclasses with units in field names; the store maps them to rows one to one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any


def utcnow_iso() -> str:
    """The current UTC time as ISO 8601 with a Z suffix, seconds precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


ENERGY_METHODS = ("nvml", "nvml-attributed", "rapl", "modeled", "imported", "synthetic")


@dataclass
class Hardware:
    """One measurable device: a CPU, a whole GPU, a MIG instance or an MPS share."""

    host: str
    kind: str  # cpu | gpu | mig | mps
    model_name: str
    device_index: int = 0
    memory_mb: float | None = None
    compute_share: float = 1.0  # fraction of the parent device's compute
    cores: int | None = None
    mig_profile: str | None = None
    uuid: str | None = None
    parent_uuid: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    rapl_readable: bool | None = None
    id: int | None = None


@dataclass
class Variant:
    """One model variant of a family (task), for example ``resnet50`` of ``resnet``."""

    name: str
    family: str
    accuracy: float | None = None
    accuracy_metric: str | None = None  # e.g. "imagenet-top1", "squad2-f1"
    accuracy_source: str | None = None
    params: int | None = None
    memory_mb: float | None = None
    load_time_s: float | None = None
    source: str = "builtin"  # builtin | module:callable | torchscript:PATH | imported
    input_shape: str | None = None  # "3,224,224" (per request, without the batch dim)


@dataclass
class Profile:
    """A measurement (or an imported figure) of one variant on one resource at one batch."""

    variant: str
    resource: str
    batch: int
    throughput_rps: float
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    hardware: str | None = None  # model name of the device, e.g. "NVIDIA A100-SXM4-40GB"
    hardware_id: int | None = None
    power_w: float | None = None  # average power while busy
    idle_power_w: float | None = None  # power of the instance when idle
    energy_j: float | None = None  # energy per request
    energy_method: str = "imported"  # one of ENERGY_METHODS
    memory_mb: float | None = None  # peak memory
    samples: int | None = None
    duration_s: float | None = None
    cost_per_hour: float | None = None
    capacity_rps: float | None = None  # load-tested capacity at capacity_slo_ms
    capacity_slo_ms: float | None = None
    # Latency of a request that finds the instance idle for a while (open-loop, sparse
    # arrivals): caches and clocks have cooled, so it is often slower than back-to-back runs.
    isolated_p50_ms: float | None = None
    isolated_p95_ms: float | None = None
    isolated_p99_ms: float | None = None
    torch_version: str | None = None
    source: str = "measured"  # measured | imported | synthetic
    created_at: str = field(default_factory=utcnow_iso)
    id: int | None = None

    @property
    def latency_ms(self) -> dict[str, float]:
        """The known latency percentiles, keyed ``p50``/``p95``/``p99``."""
        return self._percentiles("latency")

    @property
    def isolated_ms(self) -> dict[str, float]:
        """The known isolated-run latency percentiles, keyed ``p50``/``p95``/``p99``."""
        return self._percentiles("isolated")

    def _percentiles(self, prefix: str) -> dict[str, float]:
        out = {}
        for key in ("p50", "p95", "p99"):
            value = getattr(self, f"{prefix}_{key}_ms")
            if value is not None:
                out[key] = float(value)
        return out


def record_to_row(record: Any) -> dict[str, Any]:
    """A dataclass record as a store row (``id`` dropped when unset)."""
    row = asdict(record)
    if row.get("id") is None:
        row.pop("id", None)
    return row


def row_to_record(cls: type, row: dict[str, Any]) -> Any:
    """Build a record from a store row, ignoring columns the record does not know."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in row.items() if k in names})

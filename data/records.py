"""Domain records stored in SQLite: hardware, variants, profiles.

Plain dataclasses with units in field names; the store maps them to rows one to one.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from greenctl.data.limits import SLO_QUANTILES

# Names (variants, families, resources, hardware labels) are short identifiers shown in
# tables and plan documents; anything longer is a pasted blob, not a name.
MAX_NAME_CHARS = 200
# The largest batch greenctl measures, imports or plans with.
MAX_BATCH = 65536
# How far ahead of this machine's clock a record's time may be (clock skew between hosts).
# A time further ahead would rank as the newest measurement of its point until that date.
MAX_CLOCK_SKEW = timedelta(days=1)


def utcnow_iso() -> str:
    """The current UTC time as ISO 8601 with a Z suffix, seconds precision."""
    return iso_utc(datetime.now(UTC))


def iso_utc(dt: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ`` of an aware datetime: the one text form of stored times.

    Seconds precision and a fixed width, so that stored times sort as text in time order.
    """
    return dt.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(text: Any) -> datetime:
    """An ISO 8601 time as an aware UTC datetime: the one parser of greenctl's times.

    ``Z``, an offset, or none (UTC); eGLB's ``YYYY-MM-DD HH`` (date and hour) too.

    Raises:
        ValueError: its message is what the text is not ("not an ISO 8601 time",
            "outside years 1-9999 in UTC"), for the caller to name the value.
    """
    if isinstance(text, datetime):
        dt = text
    else:
        s = str(text).strip()
        if s[-1:] in ("Z", "z"):
            s = s[:-1] + "+00:00"
        if len(s) == 13 and s[10] in " T" and s[11:].isdigit():
            s += ":00"
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            raise ValueError("not an ISO 8601 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        return dt.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise ValueError("outside years 1-9999 in UTC") from None


def normalise_time(text: str) -> str:
    """A measurement's time (ISO 8601, see :func:`parse_time`) in the stored form.

    Raises:
        ValueError: not an ISO 8601 time, outside years 1-9999 in UTC, or more than
            :data:`MAX_CLOCK_SKEW` in the future; the message says which.
    """
    dt = parse_time(text)
    if dt > datetime.now(UTC) + MAX_CLOCK_SKEW:
        raise ValueError("in the future")
    return iso_utc(dt)


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a name (too long, a control character), or None if it can."""
    if len(text) > MAX_NAME_CHARS:
        return f"is {len(text)} characters long; names have at most {MAX_NAME_CHARS}"
    for i, c in enumerate(text):
        if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp"):
            return f"holds a control character ({ascii(c)[1:-1]}) at position {i + 1}"
    return None


ENERGY_METHODS = ("nvml", "nvml-attributed", "rapl", "modeled", "imported", "synthetic")

#: Where a profile's figures come from (``Profile.source``): ``measured`` by ``greenctl
#: profile`` on the resource it names, ``imported`` from a file, ``synthetic`` (made up by
#: ``greenctl mig synth``), ``mps-emulated`` (a MIG slice measured as an MPS active-thread
#: share of the whole GPU: ``greenctl profile --gpus --emulate-mig``).
PROFILE_SOURCES = ("measured", "imported", "synthetic", "mps-emulated")
MPS_EMULATED = "mps-emulated"
SYNTHETIC = "synthetic"
#: The one rule of which sources are estimates of the resource they name rather than
#: measurements of it, and what a user is told beside every figure built on them (plans
#: label themselves with :func:`estimate_label`, tables add :func:`estimate_caption`).
#: Listed from the closest to a measurement to the furthest: the order is also the rank
#: of :func:`source_rank`.
ESTIMATE_SOURCES: dict[str, str] = {
    MPS_EMULATED: "MIG slices emulated on the whole GPU with the MPS active-thread percentage "
    "of each slice's share of compute (1g of 7 = 14 %), not measured on MIG instances: MPS "
    "does not isolate memory bandwidth or L2 the way MIG does",
    SYNTHETIC: "made up by greenctl.planner.core.synthetic from a documented formula, not measured",
}


def is_estimate(source: str | None) -> bool:
    """Whether profiles of ``source`` are estimates (see :data:`ESTIMATE_SOURCES`)."""
    return source in ESTIMATE_SOURCES


# The one rule of which stored row represents a measurement point (variant, resource,
# batch, hardware, capacity SLO) when several were stored: rows of the best rank, and the
# newest of those. Real measurements (``measured``, ``imported``) rank 0, then the estimate
# sources in :data:`ESTIMATE_SOURCES` order (``mps-emulated`` 1, ``synthetic`` 2), so that a
# synthetic demo or an emulated run stored after a real measurement of the same point
# never replaces it (a newer real measurement does replace an estimate).
# ``Store.latest_profiles`` (and so ``profile list``, the exports and every planner) and
# the MIG problem's own choice go through it.
def source_rank(source: str | None) -> int:
    """The rank of a profile's source when a point's row is chosen (0 is best)."""
    if not is_estimate(source):
        return 0
    return 1 + list(ESTIMATE_SOURCES).index(str(source))


def source_rank_sql(column: str) -> str:
    """:func:`source_rank` as an SQL expression over ``column`` (a trusted column name)."""
    cases = " ".join(f"when '{s}' then {source_rank(s)}" for s in ESTIMATE_SOURCES)
    return f"(case {column} {cases} else 0 end)"


def point_preference(profile: Profile) -> tuple[int, str, int]:
    """Sort key of the rows of one point: the row with the largest key represents it.

    Best source rank (:func:`source_rank`) first, then the newest (``created_at``, then
    the id: the later stored of two rows of one time).
    """
    return (-source_rank(profile.source), profile.created_at, profile.id or 0)


def estimate_sources(sources: Iterable[str | None]) -> list[str]:
    """The estimate sources among ``sources``, in :data:`ESTIMATE_SOURCES` order."""
    present = set(sources)
    return [s for s in ESTIMATE_SOURCES if s in present]


def estimate_label(sources: Iterable[str | None]) -> str | None:
    """The label of figures built on profiles of ``sources``: ``"synthetic profiles"``,
    ``"mps-emulated profiles"``, ``"mps-emulated and synthetic profiles"``; None when every
    source is a measurement or an import."""
    found = estimate_sources(sources)
    return f"{' and '.join(found)} profiles" if found else None


def estimate_caption(sources: Iterable[str | None]) -> str | None:
    """One line per estimate source among ``sources`` saying what it is; None without any."""
    found = estimate_sources(sources)
    return "\n".join(f"{s}: {ESTIMATE_SOURCES[s]}" for s in found) if found else None


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
    source: str = "measured"  # one of PROFILE_SOURCES
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
        for key in SLO_QUANTILES:  # a column per SLO percentile
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

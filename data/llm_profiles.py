"""LLM profiles: what ``greenctl profile llm`` measured of one model variant served by one
engine on one resource, one :class:`LLMProfile` per concurrency, and the store's queries for
them.

A variant's quality (declared by the user, 0..1) is its ``variants.accuracy`` with the metric
``quality``, so every kind reads one table of variants. Rows of one measurement share a
``run_id``; planning reads the newest run of each (variant, resource).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from greenctl.data.limits import SLO_QUANTILES
from greenctl.data.records import (
    Variant,
    record_to_row,
    row_to_record,
    utcnow_iso,
)

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: the engines ``greenctl profile llm`` drives or reaches
LLM_ENGINES = ("transformers", "llama.cpp", "openai")
#: ``energy_method`` of a server nothing here can meter (a remote endpoint): no J/token
UNKNOWN_ENERGY = "unknown"
#: the metric a declared LLM quality is stored under (``variants.accuracy_metric``)
QUALITY_METRIC = "quality"
#: ``variants.source`` of an LLM variant
LLM_SOURCE = "llm"


def percentiles(values: Sequence[float], *, scale: float = 1.0) -> dict[str, float]:
    """The SLO percentiles (:data:`~greenctl.data.limits.SLO_QUANTILES`: ``p50``, ``p95``,
    ``p99``) of ``values`` times ``scale``; empty for no values.

    Linear interpolation between the two nearest ranks (numpy's default method), in plain
    Python so that the store's readers do not load numpy. The one percentile rule of LLM
    figures: stream timings, trace summaries and the stored profile rows.
    """
    ordered = sorted(float(v) * scale for v in values)
    if not ordered:
        return {}
    out = {}
    for name, q in SLO_QUANTILES.items():
        pos = (len(ordered) - 1) * round(100 * q) / 100.0  # in whole percents: exact ranks
        lo, hi = math.floor(pos), math.ceil(pos)
        out[name] = ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    return out


@dataclass
class LLMProfile:
    """One concurrency level of one LLM profile run (times in ms, energy per token)."""

    variant: str
    resource: str  # cpu:N, gpu:MODEL, ... as for other profiles
    engine: str  # one of LLM_ENGINES
    concurrency: int  # requests kept in flight
    run_id: str  # shared by the rows of one profile run
    prompt_tokens: float | None = None  # mean prompt length served (tokens)
    output_tokens: float | None = None  # mean output length served (tokens)
    requests: int = 0
    errors: int = 0
    duration_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tokens_per_s: float | None = None  # decode throughput of the instance
    requests_per_s: float | None = None  # completed requests per second
    power_w: float | None = None  # mean power while serving at this concurrency
    idle_power_w: float | None = None
    prefill_j_per_token: float | None = None  # per prompt token
    decode_j_per_token: float | None = None  # per output token
    energy_method: str = "modeled"  # nvml | rapl | modeled (ENERGY_METHODS) | UNKNOWN_ENERGY
    hardware: str | None = None
    cost_per_hour: float | None = None
    workload: str | None = None  # JSON: what was asked (tokens, chat, endpoint or model dir)
    source: str = "measured"  # measured | imported | synthetic
    created_at: str = field(default_factory=utcnow_iso)
    id: int | None = None

    @property
    def workload_dict(self) -> dict[str, Any]:
        """The stored workload description as a dict (empty when none)."""
        if not self.workload:
            return {}
        doc = json.loads(self.workload)
        return doc if isinstance(doc, dict) else {}

    def joules_per_request(self, prompt_tokens: float, output_tokens: float) -> float | None:
        """Energy of one request of the given lengths (J), None without both figures."""
        if self.prefill_j_per_token is None or self.decode_j_per_token is None:
            return None
        return prompt_tokens * self.prefill_j_per_token + output_tokens * self.decode_j_per_token


def llm_variant(name: str, family: str, quality: float, *, params: int | None = None) -> Variant:
    """The variant record of an LLM tier: its declared quality stored as its accuracy."""
    return Variant(
        name=name,
        family=family,
        accuracy=quality,
        accuracy_metric=QUALITY_METRIC,
        accuracy_source="declared",
        params=params,
        source=LLM_SOURCE,
    )


def add_llm_profiles(store: Store, variant: Variant, rows: Iterable[LLMProfile]) -> list[int]:
    """Store a variant and the rows of its profile run in one transaction; their ids."""
    ids: list[int] = []
    with store.transaction():
        store.upsert_variant(variant)
        table = store.db.table("llm_profiles")
        for row in rows:
            pk = table.insert(record_to_row(row)).last_pk
            ids.append(int(pk) if pk is not None else -1)
    return ids


def latest_llm_profiles(
    store: Store, *, family: str | None = None, variant: str | None = None
) -> list[LLMProfile]:
    """The newest run of every (variant, resource) (of one family or variant), its rows in
    order of variant, resource and concurrency."""
    where, params = [], []
    if family is not None:
        where.append("v.family = ?")
        params.append(family)
    if variant is not None:
        where.append("p.variant = ?")
        params.append(variant)
    cond = ("where " + " and ".join(where)) if where else ""
    sql = f"""
        select p.* from llm_profiles p join variants v on v.name = p.variant
        join (select variant, resource, max(created_at || ' ' || run_id) as newest
              from llm_profiles group by variant, resource) n
          on n.variant = p.variant and n.resource = p.resource
         and p.created_at || ' ' || p.run_id = n.newest
        {cond}
        order by p.variant, p.resource, p.concurrency, p.id
    """
    return [row_to_record(LLMProfile, r) for r in store.rows(sql, params)]


def llm_families(store: Store) -> list[str]:
    """The families that have LLM profiles, by name."""
    rows = store.rows(
        "select distinct v.family from llm_profiles p join variants v on v.name = p.variant "
        "order by v.family"
    )
    return [str(r["family"]) for r in rows]

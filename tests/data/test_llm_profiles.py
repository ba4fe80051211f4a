"""LLM profile rows: one run per (variant, resource) is the newest; the variant's quality is
its accuracy with the ``quality`` metric."""

from __future__ import annotations

import sqlite3

import pytest
from greenctl.data.llm_profiles import (
    LLMProfile,
    add_llm_profiles,
    latest_llm_profiles,
    llm_families,
    llm_variant,
)
from greenctl.data.store import open_store


def _row(conc: int, run: str, day: str, **figures: float) -> LLMProfile:
    return LLMProfile(
        "tiny",
        "cpu:2",
        "transformers",
        conc,
        run,
        created_at=f"2026-01-0{day}T00:00:00Z",
        **figures,
    )


def test_newest_run_per_variant_and_resource(tmp_path):
    store = open_store(tmp_path / "g.db")
    variant = llm_variant("tiny", "llama", 0.5)
    add_llm_profiles(store, variant, [_row(1, "r1", "1"), _row(4, "r1", "1")])
    add_llm_profiles(store, variant, [_row(1, "r2", "2", ttft_p50_ms=5.0), _row(2, "r2", "2")])
    rows = latest_llm_profiles(store, family="llama")
    assert [(r.run_id, r.concurrency) for r in rows] == [("r2", 1), ("r2", 2)]
    assert rows[0].ttft_p50_ms == 5.0
    assert llm_families(store) == ["llama"]
    stored = store.get_variant("tiny")
    assert (stored.accuracy, stored.accuracy_metric, stored.source) == (0.5, "quality", "llm")
    assert latest_llm_profiles(store, family="other") == []


def test_joules_per_request_needs_both_phases():
    row = _row(1, "r", "1", prefill_j_per_token=0.01, decode_j_per_token=0.1)
    assert row.joules_per_request(64, 32) == 64 * 0.01 + 32 * 0.1
    assert _row(1, "r", "1", decode_j_per_token=0.1).joules_per_request(64, 32) is None


def test_a_failed_write_stores_nothing(tmp_path):
    store = open_store(tmp_path / "g.db")
    bad = _row(1, "r", "1")
    bad.concurrency = None  # type: ignore[assignment]  # not null in the table
    with pytest.raises(sqlite3.IntegrityError):
        add_llm_profiles(store, llm_variant("tiny", "llama", 0.5), [_row(2, "r", "1"), bad])
    assert store.rows("select * from llm_profiles") == []
    assert store.rows("select * from variants where name = 'tiny'") == []

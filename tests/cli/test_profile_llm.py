"""`greenctl profile llm` as a user runs it: a real `transformers serve` of a tiny Llama made
here, the --json document and the table against the store, and bad input refused with one
`Error:` line naming the flag, exit 2, and the store as it was."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from greenctl.profiler.hw import rapl_files

from tests.conftest import free_port

pytestmark = pytest.mark.timeout(300)
SHORT = ("--duration", "1", "--prompt-tokens", "16", "--output-tokens", "8")


def _llm_rows(db: Path) -> list[tuple]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return conn.execute("select variant, concurrency, run_id from llm_profiles").fetchall()


def _variants(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("select * from variants order by name").fetchall()


def test_a_profile_is_measured_stored_and_shown_as_json_and_as_a_table(
    cli, db_path, tiny_llama, monkeypatch
):
    from greenctl.cli import common

    r = cli("profile", "llm", "--engine", "transformers", "--model-dir", tiny_llama, "--name",
            "llama-t", "--family", "llama", "--quality", "0.6", "--concurrency", "2,1", *SHORT,
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # exactly one JSON document
    assert doc["variant"] == {"name": "llama-t", "family": "llama", "quality": 0.6}
    assert doc["resource"] == "cpu:1" and doc["engine"] == "transformers"
    method = "rapl" if rapl_files() else "modeled"
    assert doc["energy_method"] == method
    rows = doc["profiles"]
    assert [p["concurrency"] for p in rows] == [1, 2]
    assert sorted(_llm_rows(db_path)) == sorted(
        (p["variant"], p["concurrency"], p["run_id"]) for p in rows
    )
    for p in rows:
        assert p["requests"] >= 1 and p["ttft_p50_ms"] > 0 and p["output_tokens_per_s"] > 0
        assert p["prefill_j_per_token"] > 0 and p["decode_j_per_token"] > 0
        assert p["energy_method"] == method and p["workload"]["model"] == str(tiny_llama.resolve())

    monkeypatch.setattr(common.console, "width", 260)
    r = cli("profile", "llm", "--engine", "transformers", "--model-dir", tiny_llama, "--name",
            "llama-t", "--family", "llama", "--quality", "0.6", "--concurrency", "1", *SHORT)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "llama-t (llama, quality 0.6) on cpu:1 via transformers" in r.stdout
    for header in ("TTFT p95 ms", "TPOT p99 ms", "tokens/s", "prefill J/tok", "decode J/tok"):
        assert header in r.stdout
    if method == "modeled":  # the estimate is labelled where it is shown
        assert "energy 'modeled' = CPU power model, not measured" in r.stdout
    assert len({run for _v, _c, run in _llm_rows(db_path)}) == 2  # a second run, stored apart


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--concurrency", "0,x"), "--concurrency"),
        (("--quality", "1.5"), "--quality"),
        (("--duration", "nan"), "--duration"),
        (("--endpoint", "http://127.0.0.1:1"), "--model-dir"),
    ],
)
def test_bad_options_name_their_flag_and_store_nothing(cli, db_path, tiny_llama, args, flag):
    base = {"--engine": "transformers", "--model-dir": str(tiny_llama), "--name": "t",
            "--family": "llama", "--quality": "0.5"}  # fmt: skip
    given = dict(zip(args[::2], args[1::2], strict=True))
    r = cli("profile", "llm", *[x for kv in {**base, **given}.items() for x in kv])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("Error: ") and flag in r.output.splitlines()[0]
    assert "Traceback" not in r.output
    assert _llm_rows(db_path) == []


def test_a_folder_that_is_not_a_model_is_refused(cli, db_path, tmp_path):
    r = cli("profile", "llm", "--engine", "transformers", "--model-dir", tmp_path, "--name", "t",
            "--family", "llama", "--quality", "0.5")  # fmt: skip
    assert r.exit_code == 2
    assert r.output.startswith("Error: --model-dir: ") and "Traceback" not in r.output
    assert "is not a transformers model folder (no config.json)" in r.output
    assert not db_path.exists()


def test_a_missing_llama_cpp_names_its_extra(cli, db_path, tmp_path):
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("llama-cpp-python is installed here")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    r = cli("profile", "llm", "--engine", "llama.cpp", "--model-dir", gguf, "--name", "t",
            "--family", "llama", "--quality", "0.5")  # fmt: skip
    assert r.exit_code == 2
    assert "Error: --engine llama.cpp: llama-cpp-python is not installed" in r.output
    assert "greenctl[llamacpp]" in r.output and not db_path.exists()


def test_an_endpoint_with_nothing_behind_it_is_refused_by_flag(cli, db_path):
    port = free_port()  # nothing listens there
    r = cli("profile", "llm", "--engine", "openai", "--endpoint", f"http://127.0.0.1:{port}",
            "--name", "t", "--family", "llama", "--quality", "0.5")  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "Error: --endpoint" in r.output and "did not answer" in r.output
    assert "Traceback" not in r.output and _llm_rows(db_path) == []


def test_a_name_of_another_kinds_variant_leaves_the_store_as_it_was(
    cli, db_path, store, tiny_llama
):
    from greenctl.data.records import Variant

    store.upsert_variant(Variant(name="resnet18", family="resnet", accuracy=0.7))
    before = _variants(db_path)
    r = cli("profile", "llm", "--engine", "transformers", "--model-dir", tiny_llama, "--name",
            "resnet18", "--family", "llama", "--quality", "0.5")  # fmt: skip
    assert r.exit_code == 2
    assert r.output.startswith("Error: --name resnet18 is already a variant of family resnet")
    assert _variants(db_path) == before and _llm_rows(db_path) == []


def test_profiles_model_filter_is_not_handed_to_the_endpoints_model_name(cli, db_path):
    """`profile --model F` filters families; `profile llm --model` names an endpoint's model."""
    r = cli(
        "profile", "--model", "resnet", "llm", "--engine", "openai", "--endpoint",
        "http://127.0.0.1:9", "--name", "a", "--family", "b", "--quality", "0.5",
    )  # fmt: skip
    assert r.exit_code == 2
    assert "`greenctl profile --model` does not apply to `profile llm`" in r.output

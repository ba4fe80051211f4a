"""The LLM kind as a user drives it, every step a command on real processes: ``profile llm``
measures a tiny random Llama served by ``transformers serve``, ``plan llm`` sizes it for a
rate and token SLOs, ``apply`` starts the engine behind the dispatcher, a streamed chat
completion comes back token by token through OpenAI's API, ``/metrics`` counts its tokens by
phase, ``status`` shows the tier and ``down`` leaves no process."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.conftest import processes_of

pytestmark = pytest.mark.timeout(300)


def test_profile_plan_apply_stream_metrics_down(cli, state_dir, tiny_llama, tmp_path):
    r = cli(
        "profile", "llm", "--engine", "transformers", "--model-dir", tiny_llama,
        "--name", "tl", "--family", "tinyllm", "--quality", "0.7", "--concurrency", "1,2",
        "--duration", "1", "--prompt-tokens", "16", "--output-tokens", "8", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["profiles"]
    assert [row["concurrency"] for row in rows] == [1, 2]
    assert all(row["ttft_p95_ms"] > 0 and row["energy_method"] == "modeled" for row in rows)

    plan_file = tmp_path / "plan.json"
    r = cli(
        "plan", "llm", "--model", "tinyllm", "--rate", "0.5", "--ttft-ms", "5000",
        "--tpot-ms", "1000", "--prompt-tokens", "16", "--output-tokens", "8",
        "--budget", "cpu=1", "--carbon-intensity", "300", "-o", plan_file, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = json.loads(plan_file.read_text())
    assert plan["kind"] == "llm" and plan["llm"]["shares"] == {"tl": 1.0}
    assert plan["predicted"]["ttft_p95_ms"] <= 5000

    r = cli("apply", plan_file)
    assert r.exit_code == 0, r.output
    assert "OpenAI API: http://" in r.output
    url = r.output.split("OpenAI API: ")[1].split()[0].removesuffix("/v1")

    body = {"model": "tinyllm", "messages": [{"role": "user", "content": "w1 w2 w3"}],
            "max_tokens": 6, "stream": True}  # fmt: skip
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Greenctl-Variant"] == "tl"
        events = [line for line in resp.read().decode().splitlines() if line.startswith("data:")]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events if e != "data: [DONE]"]
    assert len(chunks) >= 3 and chunks[-1]["choices"][0]["finish_reason"], chunks
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counted = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("greenctl_llm_tokens_total{")
    }
    assert counted.get('greenctl_llm_tokens_total{variant="tl",phase="prefill"}', 0) >= 3
    assert counted.get('greenctl_llm_tokens_total{variant="tl",phase="decode"}', 0) >= 1

    r = cli("status", "--json")
    assert r.exit_code == 0, r.output
    assert [t["variant"] for t in json.loads(r.stdout)["llm"]["tiers"]] == ["tl"]
    r = cli("status")
    assert r.exit_code == 0 and "LLM tiers" in r.output and "transformers" in r.output

    r = cli("down")
    assert r.exit_code == 0, r.output
    assert processes_of(state_dir) == []

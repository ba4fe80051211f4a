"""LLM tiers served end to end on CPU: ``apply`` of an llm plan starts real ``transformers
serve`` engines (a tiny random Llama made locally), the dispatcher's OpenAI front answers
chat and completions (streamed chunk by chunk and whole) by the plan's shares, requirements
pick tiers, ``/metrics`` counts tokens per tier and phase with their modeled energy,
``status`` shows the tiers, a replanned plan's new shares reach the dispatcher without
restarting an engine, and ``down`` leaves no process. A plan whose model folder is gone is
refused before anything starts.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from greenctl.data.llm_profiles import LLMProfile, add_llm_profiles, llm_variant
from greenctl.data.plan import Plan, write_plan_file

pytestmark = pytest.mark.timeout(300)

FAMILY = "tinyllm"
#: (tier, quality, predicted p95 TTFT ms, share)
TIERS = (("tl-small", 0.6, 120.0, 0.5), ("tl-big", 0.9, 400.0, 0.5))


def _store_tiers(store: Any, model_dir: Path) -> None:
    """Two tiers' profile rows (both the tiny model folder), labelled synthetic."""
    for tier, quality, ttft, _ in TIERS:
        workload = {"engine": "transformers", "model": str(model_dir), "endpoint": None,
                    "prompt_tokens": 16, "output_tokens": 8, "chat": False}  # fmt: skip
        row = LLMProfile(
            variant=tier, resource="cpu:1", engine="transformers", concurrency=1,
            run_id=f"run-{tier}", ttft_p95_ms=ttft, tpot_p95_ms=20.0, requests_per_s=2.0,
            output_tokens_per_s=40.0, prefill_j_per_token=0.01, decode_j_per_token=0.05,
            energy_method="modeled", workload=json.dumps(workload), source="synthetic",
        )  # fmt: skip
        add_llm_profiles(store, llm_variant(tier, FAMILY, quality), [row])


def _plan(model_dir: Path, shares: tuple[float, float] = (0.5, 0.5)) -> Plan:
    """An llm plan document as ``plan llm`` writes it: one instance per tier."""
    rate = 2.0
    deps, tiers, engines = [], [], {}
    for (tier, quality, ttft, _), share in zip(TIERS, shares, strict=True):
        deps.append({"model": FAMILY, "variant": tier, "resource": "cpu:1", "count": 1,
                     "batch": 2, "quota_rps": rate * share})  # fmt: skip
        tiers.append({"variant": tier, "quality": quality, "share": share, "instances": 1,
                      "concurrency": 1.0, "ttft_p95_ms": ttft, "tpot_p95_ms": 20.0,
                      "j_per_request": 0.56})  # fmt: skip
        engines[tier] = {"engine": "transformers", "model": str(model_dir), "endpoint": None}
    doc = {
        "schema": "greenctl.plan/v1",
        "kind": "llm",
        "request": {"model": FAMILY, "rate_rps": rate, "ttft_ms": 500, "tpot_ms": 50,
                    "prompt_tokens": 16, "output_tokens": 8, "carbon_intensity": 300.0},
        "deployments": deps,
        "llm": {"shares": dict(zip([t[0] for t in TIERS], shares, strict=True)),
                "engines": engines, "tiers": tiers},
        "predicted": {"rate_rps": rate, "ttft_p95_ms": 400.0, "energy_method": "modeled",
                      "carbon_intensity": 300.0},
    }  # fmt: skip
    return Plan.from_dict(doc)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def _stream(url: str, path: str, body: dict[str, Any]) -> tuple[list[bytes], dict[str, str]]:
    """The pieces of a streamed answer as the socket delivered them (chunk by chunk)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.getheader("Transfer-Encoding") == "chunked"
    pieces = []
    while piece := resp.read1(65536):
        pieces.append(piece)
    conn.close()
    return pieces, dict(resp.getheaders())


def _events(pieces: list[bytes]) -> list[Any]:
    text = b"".join(pieces).decode()
    out = []
    for block in text.split("\n\n"):
        data = block.strip().removeprefix("data:").strip()
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


def _metrics(url: str) -> dict[str, float]:
    from greenctl.executor.runtime.metrics import parse_prometheus

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_prometheus(resp.read().decode())


def test_llm_plan_served_end_to_end(run_store, tiny_llama, leftovers):
    from greenctl.data import deployments
    from greenctl.executor.deploy.admin import admin
    from greenctl.executor.deploy.apply import apply_plan, down, status

    _store_tiers(run_store, tiny_llama)
    result = apply_plan(_plan(tiny_llama), store=run_store)
    url = result.dispatcher_url
    assert url and len([a for a in result.actions if a["action"] == "start-executor"]) == 2

    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        ids = {m["id"] for m in json.loads(resp.read())["data"]}
    assert ids == {FAMILY, "tl-small", "tl-big"}

    # whole answers, by the family's name: the shares (0.5/0.5) alternate the tiers
    served = []
    for _ in range(4):
        code, doc, headers = _post(
            url + "/v1/completions", {"model": FAMILY, "prompt": "hello hello", "max_tokens": 4}
        )
        assert code == 200, doc
        assert doc["model"] == headers["Greenctl-Variant"] in ("tl-small", "tl-big")
        assert doc["usage"]["completion_tokens"] > 0 and doc["choices"][0]["text"]
        served.append(doc["model"])
    assert sorted(served) == ["tl-big", "tl-big", "tl-small", "tl-small"], served

    # a streamed chat answer comes as several chunks of events, without the usage event
    # greenctl asked the engine for (the client did not); long enough that a busy machine
    # cannot hold the dispatcher back until the engine has sent it all
    pieces, headers = _stream(url, "/v1/chat/completions", {
        "model": FAMILY, "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 48, "stream": True})  # fmt: skip
    events = _events(pieces)
    assert len(pieces) >= 2 and len(events) >= 3, pieces
    assert all("usage" not in e for e in events), events
    assert {e["model"] for e in events} == {headers["Greenctl-Variant"]}
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])

    # streamed completions naming a tier, usage asked for: it comes last
    pieces, headers = _stream(url, "/v1/completions", {
        "model": "tl-big", "prompt": "hello", "max_tokens": 5, "stream": True,
        "stream_options": {"include_usage": True}})  # fmt: skip
    events = _events(pieces)
    assert headers["Greenctl-Variant"] == "tl-big"
    assert events[-1]["usage"]["completion_tokens"] > 0, events

    # one keep-alive connection: a stream, then a whole answer, then a stream again (each
    # stream ends with its last chunk, so the next answer on the connection is whole)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    for stream in (True, False, True):
        conn.request("POST", "/v1/completions", json.dumps({
            "model": FAMILY, "prompt": "hello", "max_tokens": 3, "stream": stream}),
            {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        assert (b"data:" in body) == stream, body
    conn.close()

    # a client that leaves mid-stream: its slot is freed, the tiers serve on
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": FAMILY, "prompt": "hello", "max_tokens": 400, "stream": True}),
        {"Content-Type": "application/json"})  # fmt: skip
    assert conn.getresponse().read1(64)
    conn.close()
    disp = deployments.running_dispatcher(run_store)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        inflight = [b["inflight"] for m in admin(disp, "GET")["models"].values()
                    for b in m["instances"]]  # fmt: skip
        if not any(inflight):
            break
        time.sleep(0.2)
    assert not any(inflight), inflight

    # requirements: only tiers meeting them serve; none: 422 naming the closest; bad: 400
    for _ in range(3):
        code, doc, headers = _post(url + "/v1/completions", {
            "model": FAMILY, "prompt": "hi", "max_tokens": 2, "min_quality": 0.8})  # fmt: skip
        assert code == 200 and headers["Greenctl-Variant"] == "tl-big", doc
    code, doc, _ = _post(url + "/v1/completions", {
        "model": FAMILY, "prompt": "hi", "max_tokens": 2, "max_ttft_ms": 100})  # fmt: skip
    assert code == 422 and "the closest is 'tl-small'" in doc["error"]["message"], doc
    assert "predicted p95 TTFT 120 ms" in doc["error"]["message"], doc
    code, doc, _ = _post(url + "/v1/completions", {"model": FAMILY, "prompt": "hi",
                                                   "min_quality": 2})  # fmt: skip
    assert code == 400 and doc["error"]["param"] == "min_quality", doc
    code, doc, _ = _post(url + "/v1/completions", {"model": "nope", "prompt": "hi"})
    assert code == 404 and doc["error"]["code"] == "model_not_found", doc

    flat = _metrics(url)
    for tier in ("tl-small", "tl-big"):
        for phase in ("prefill", "decode"):
            key = f'greenctl_llm_tokens_total{{variant="{tier}",phase="{phase}"}}'
            assert flat.get(key, 0) > 0, (key, flat)
    assert flat[f'greenctl_energy_joules_total{{model="{FAMILY}",source="modeled"}}'] > 0
    assert flat[f'greenctl_carbon_grams_total{{model="{FAMILY}",source="modeled"}}'] > 0

    st = status(run_store)
    assert st["state"] == "serving", st["problems"]
    tiers = {t["variant"]: t for t in st["llm"]["tiers"]}
    assert tiers["tl-small"]["share"] == 0.5 and tiers["tl-big"]["engine"] == "transformers"
    assert all(t["ready"] == t["instances"] == 1 for t in tiers.values())

    # a replanned plan with new shares: the dispatcher's weights move, no engine restarts
    pids = sorted(r["pid"] for r in deployments.ready_instances(run_store))
    again = apply_plan(_plan(tiny_llama, shares=(0.8, 0.2)), store=run_store)
    assert again.changed
    assert not [a for a in again.actions if a["action"] in ("start-executor", "stop-executor")]
    assert sorted(r["pid"] for r in deployments.ready_instances(run_store)) == pids
    disp = deployments.running_dispatcher(run_store)
    routed = {b["variant"]: b for m in admin(disp, "GET")["models"].values()
              for b in m["instances"]}  # fmt: skip
    assert routed["tl-small"]["llm"]["share"] == 0.8 and routed["tl-big"]["weight"] == 0.2

    down(run_store)
    assert leftovers() == []


def test_a_plan_whose_model_folder_is_gone_starts_nothing(cli, run_store, tmp_path, leftovers):
    """exit 2, one Error: line naming the plan field and the folder, nothing started."""
    gone = tmp_path / "gone-model"
    _store_tiers(run_store, gone)
    plan_file = tmp_path / "plan.json"
    write_plan_file(_plan(gone), plan_file)
    r = cli("apply", plan_file)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("Error:") and "Traceback" not in r.output, r.output
    assert "llm.engines.tl-small.model" in r.output and "gone-model" in r.output, r.output
    assert leftovers() == []
    doc = json.loads(cli("status", "--json").stdout)
    assert doc["instances"] == [] and doc["dispatcher"] is None, doc


def test_verify_is_refused_for_an_llm_plan(cli, run_store, tiny_llama, tmp_path, leftovers):
    """--verify measures OIP requests, which engines do not answer: refused before a start."""
    _store_tiers(run_store, tiny_llama)
    plan_file = tmp_path / "plan.json"
    write_plan_file(_plan(tiny_llama), plan_file)
    r = cli("apply", plan_file, "--verify")
    assert r.exit_code == 2 and r.output.startswith("Error: --verify"), r.output
    assert "greenctl profile llm --engine openai" in r.output, r.output
    assert leftovers() == []


def test_a_killed_engine_is_restarted_and_serves_again(run_store, tiny_llama, leftovers):
    """kill -9 of an engine: the supervisor starts it again (a new port), the dispatcher
    routes to it once it answers, and the tier serves again."""
    import os
    import signal

    from greenctl.data import deployments
    from greenctl.executor.deploy.apply import apply_plan, down, status

    _store_tiers(run_store, tiny_llama)
    url = apply_plan(_plan(tiny_llama), store=run_store).dispatcher_url
    row = next(r for r in deployments.ready_instances(run_store) if r["variant"] == "tl-small")
    os.kill(row["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = next(i for i in status(run_store)["instances"] if i["id"] == row["id"])
        if view["ready"] and view["pid"] != row["pid"] and view["restarts"] >= 1:
            break
        time.sleep(0.5)
    assert view["ready"] and view["pid"] != row["pid"], view
    code, doc, headers = _post(url + "/v1/completions", {"model": "tl-small", "prompt": "hi",
                                                         "max_tokens": 2})  # fmt: skip
    assert code == 200 and headers["Greenctl-Variant"] == "tl-small", doc
    down(run_store)
    assert leftovers() == []


def test_routes_rebuilt_from_rows_keep_the_tiers_figures():
    """A table rebuilt from the store's rows (after a killed apply) keeps what the running
    one said of each engine instance: its tier's figures and share-weight."""
    from greenctl.executor.deploy.llm_plan import carry_llm

    fig = {"share": 0.8, "quality": 0.6, "served_model": "/m", "decode_j_per_token": 0.05}
    previous = {"models": {FAMILY: {"instances": [
        {"id": "1-0", "weight": 0.8, "llm": fig}, {"id": "1-1", "weight": 1.0}]}}}  # fmt: skip
    rebuilt = {"models": {FAMILY: {"instances": [
        {"id": "1-0", "weight": 1.6}, {"id": "1-1", "weight": 3.0}, {"id": "2-0", "weight": 1}]}}}  # fmt: skip
    out = carry_llm(previous, rebuilt)["models"][FAMILY]["instances"]
    assert out[0] == {"id": "1-0", "weight": 0.8, "llm": fig}
    assert out[1] == {"id": "1-1", "weight": 3.0} and out[2] == {"id": "2-0", "weight": 1}


def test_tier_figures_at_the_plans_percentile(store, tmp_path):
    """The dispatcher's figures of a tier: TTFT at the request's percentile, joules per token
    from the profile row at the concurrency nearest the planned one (its method kept)."""
    from greenctl.executor.deploy.llm_plan import tier_figures

    rows = [
        LLMProfile(variant="t", resource="cpu:1", engine="transformers", concurrency=c,
                   run_id="r", prefill_j_per_token=pre, decode_j_per_token=dec,
                   energy_method="rapl")
        for c, pre, dec in ((1, 0.01, 0.1), (4, 0.02, 0.2))
    ]  # fmt: skip
    add_llm_profiles(store, llm_variant("t", FAMILY, 0.7), rows)
    plan = Plan.from_dict({
        "schema": "greenctl.plan/v1", "kind": "llm",
        "request": {"model": FAMILY, "rate_rps": 1.0, "percentile": "p99"},
        "deployments": [{"model": FAMILY, "variant": "t", "resource": "cpu:1", "batch": 4}],
        "llm": {"shares": {"t": 1.0}, "tiers": [{"variant": "t", "concurrency": 3.2,
                "ttft_p99_ms": 321.0, "quality": 0.7}]}})  # fmt: skip
    fig = tier_figures(plan, store)["t"]
    assert fig["ttft_ms"] == 321.0 and fig["percentile"] == "p99"
    assert (fig["prefill_j_per_token"], fig["decode_j_per_token"]) == (0.02, 0.2)
    assert fig["energy_method"] == "rapl" and fig["share"] == 1.0 and fig["quality"] == 0.7


def test_streamed_pieces_count_only_events_with_text():
    """Without the engine's usage, output tokens are the events that carry text: a role
    event and a finish event carry none."""
    from greenctl.executor.runtime.llm_front import _Exchange

    ex = _Exchange("tier", asked_usage=False, served="/models/m")
    events = [
        b'data: {"choices":[{"delta":{"role":"assistant"},"index":0}],"model":"/models/m"}\n\n',
        b'data: {"choices":[{"delta":{"content":"w1"},"index":0}],"model":"/models/m"}\n\n'
        b'data: {"choices":[{"delta":{"content": " w2"},"index":0}],"model":"/models/m"}\n\n',
        b'data: {"choices":[{"delta":{"content":""},"finish_reason":"length"}],'
        b'"model":"/models/m"}\n\n',
    ]
    out = [ex.event(e) for e in events]
    assert all(o is not None and b'"model":"tier"' in o for o in out)
    assert ex.tokens() == (0, 2)

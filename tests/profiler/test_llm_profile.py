"""LLM profiling: one percentile rule, the process tree's CPU time, the phase split of
energy, the checks of a request, and whole runs against a real `transformers serve` of a
tiny Llama made here (started by greenctl, and reached black-box as an OpenAI endpoint)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.errors import HardwareError, InputError
from greenctl.data.llm_profiles import LLMProfile, latest_llm_profiles, percentiles
from greenctl.data.llm_traces import synthetic_llm_trace
from greenctl.data.records import Variant
from greenctl.profiler import llm_engines
from greenctl.profiler.energy import EnergyReading, ModeledCpuMeter, RaplMeter
from greenctl.profiler.hw import rapl_files, usable_cores
from greenctl.profiler.llm_client import StreamTiming, summarise
from greenctl.profiler.llm_energy import engine_meter, split_phases, tree_cpu_seconds
from greenctl.profiler.llm_profile import LLMProfileRequest, profile_llm

from tests.conftest import free_port

pytestmark = pytest.mark.timeout(300)
FAKE_NVML = Path(__file__).with_name("fake_a100.json")


def _request(model_dir: Path | str | None = None, **kw) -> LLMProfileRequest:
    fields = {"engine": "transformers", "name": "llama-t", "family": "llama", "quality": 0.5,
              "model_dir": None if model_dir is None else str(model_dir),
              "concurrency": "1,2", "duration_s": 1.0, "prompt_tokens": 16, "output_tokens": 8}  # fmt: skip
    return LLMProfileRequest(**{**fields, **kw})


def _llm_rows(store) -> int:
    return int(store.rows("select count(*) as n from llm_profiles")[0]["n"])


# -- one percentile rule ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_percentiles_are_numpys_linear_ones(n):
    values = np.random.default_rng(n).gamma(2.0, 30.0, n).tolist()
    got = percentiles(values, scale=1000.0)
    want = np.percentile(np.asarray(values) * 1000.0, [50, 95, 99])
    assert [got["p50"], got["p95"], got["p99"]] == pytest.approx(want.tolist(), rel=1e-12)
    assert percentiles([]) == {}


def test_streams_and_traces_are_summarised_by_the_same_rule():
    ttft = [0.01, 0.03, 0.02, 0.2]
    timings = [StreamTiming(t, t / 10, 16, 8, t * 9) for t in ttft]
    result = summarise(timings, errors=0, concurrency=1, wall_s=1.0)
    assert result.ttft_ms == percentiles(ttft, scale=1000.0)
    trace = synthetic_llm_trace(rate_rps=5.0, duration_s=20.0, seed=3)
    summary = trace.summary()["output_tokens"]
    assert {k: summary[k] for k in ("p50", "p95", "p99")} == percentiles(
        trace.output_tokens.tolist()
    )


# -- energy -------------------------------------------------------------------------------------
def test_a_process_trees_cpu_time_counts_its_children():
    """A parent that only waits, over a child that spins: the tree's CPU time is the child's."""
    spin = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass\n"
    code = f"import subprocess,sys\nsubprocess.run([sys.executable,'-c',{spin!r}])\n"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        seen = 0.0
        while parent.poll() is None:
            seen = max(seen, tree_cpu_seconds(parent.pid))
            time.sleep(0.05)
        assert seen >= 0.3  # the spinning child, counted under its parent while it ran
    finally:
        parent.wait()
    assert tree_cpu_seconds(parent.pid) == 0.0  # gone: nothing to count


def test_the_phase_split_gives_back_each_requests_energy():
    full = EnergyReading("modeled", 8.0, 3.0, energy_j=40.0, duration_s=5.0)
    prefill = EnergyReading("modeled", 6.0, 3.0, energy_j=6.0, duration_s=1.0)
    phases = split_phases(full, requests=20, prompt_tokens=64, output_tokens=32,
                          prefill=prefill, prefill_requests=12)  # fmt: skip
    assert phases.prefill_j_per_token == pytest.approx(6.0 / 12 / 64)
    row = LLMProfile("v", "cpu:1", "transformers", 1, "r",
                     prefill_j_per_token=phases.prefill_j_per_token,
                     decode_j_per_token=phases.decode_j_per_token)  # fmt: skip
    assert row.joules_per_request(64, 32) == pytest.approx(40.0 / 20)
    none = split_phases(full, requests=20, prompt_tokens=64, output_tokens=32, prefill=prefill,
                        prefill_requests=0)  # fmt: skip
    assert none.prefill_j_per_token is None and none.decode_j_per_token is None


def _window_w(pid: int, seconds: float = 0.6) -> tuple[str, float]:
    meter = engine_meter(pid=pid, cores=1, gpu_index=None)
    assert meter is not None
    meter.start()
    time.sleep(seconds)
    return meter.method, meter.stop(requests=1).power_w


def test_the_cpu_meter_follows_the_engines_processes_not_this_one():
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        method, busy_w = _window_w(spin.pid)
        _method, idle_w = _window_w(idle.pid)
    finally:
        for proc in (spin, idle):
            proc.kill()
            proc.wait()
    if method == "modeled":  # RAPL reads the package whatever runs: only the model follows
        model = ModeledCpuMeter(1)
        assert idle_w == pytest.approx(model.power_at(0.0), abs=0.5)
        # a spinning process: busy however loaded the machine is (its share of a core)
        assert busy_w > model.power_at(0.05) and busy_w > idle_w


def test_readable_rapl_counters_are_read_before_the_model(tmp_path):
    counter = tmp_path / "intel-rapl:0" / "energy_uj"
    counter.parent.mkdir()
    counter.write_text("1000000\n")
    meter = engine_meter(pid=1, cores=1, gpu_index=None, rapl=[str(counter)])
    assert isinstance(meter, RaplMeter) and meter.share == pytest.approx(1 / len(usable_cores()))
    modeled = engine_meter(pid=1, cores=1, gpu_index=None, rapl=[])
    assert isinstance(modeled, ModeledCpuMeter)


def test_the_meter_is_nvml_on_a_gpu_and_none_for_a_remote_server(monkeypatch):
    assert engine_meter(pid=None, cores=0, gpu_index=None) is None
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE_NVML))
    gpu = engine_meter(pid=1, cores=1, gpu_index=0)
    assert gpu is not None and gpu.method == "nvml"


# -- checks before anything starts --------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"concurrency": "0,x"}, "--concurrency"),
        ({"concurrency": "1,4096"}, "--concurrency"),
        ({"quality": 1.5}, "--quality"),
        ({"quality": float("nan")}, "--quality"),
        ({"duration_s": 0}, "--duration"),
        ({"prompt_tokens": 0}, "--prompt-tokens"),
        ({"name": " "}, "--name"),
        ({"family": "a\nb"}, "--family"),
        ({"engine": "vllm"}, "--engine"),
        ({"cpus": 4096}, "--cpus"),
        ({"endpoint": "http://127.0.0.1:1"}, "--model-dir"),
        ({"model": "m"}, "--model"),
        ({"gpu": -1}, "--gpu"),
    ],
)
def test_a_bad_request_names_its_flag(tiny_llama, change, flag):
    with pytest.raises(InputError) as err:
        _request(tiny_llama, **change)
    assert flag in err.value.message


def test_the_target_must_fit_the_engine(tmp_path):
    with pytest.raises(InputError, match=r"--model-dir: .* is not a transformers model folder"):
        _request(tmp_path)
    with pytest.raises(InputError, match="give --endpoint"):
        _request(tmp_path, engine="openai")
    with pytest.raises(InputError, match=r"--endpoint .* is not an http"):
        _request(engine="openai", endpoint="127.0.0.1:8000")
    with pytest.raises(InputError, match="--cpus applies to engines greenctl starts"):
        _request(engine="openai", endpoint="http://127.0.0.1:8000", cpus=2)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="llama-cpp-python is not installed") as err:
            _request(gguf, engine="llama.cpp")
        assert "greenctl[llamacpp]" in str(err.value.hint)


def test_a_gpu_that_is_not_here_is_refused_before_anything_starts(store, tiny_llama, monkeypatch):
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE_NVML))
    with pytest.raises(InputError, match="--gpu 9: there is no GPU 9"):
        profile_llm(store, _request(tiny_llama, gpu=9))
    assert _llm_rows(store) == 0 and store.variants() == []


def test_a_name_of_another_family_or_kind_is_refused_and_nothing_starts(store, tiny_llama):
    store.upsert_variant(Variant(name="resnet18", family="resnet", accuracy=0.7))
    with pytest.raises(InputError, match="already a variant of family resnet"):
        profile_llm(store, _request(tiny_llama, name="resnet18"))
    assert _llm_rows(store) == 0


# -- whole runs ---------------------------------------------------------------------------------
def test_a_started_engine_is_profiled_at_each_concurrency_and_stored_as_one_run(store, tiny_llama):
    seen: list[str] = []
    run = profile_llm(store, _request(tiny_llama), progress=lambda m, _f: seen.append(m))
    assert [r.concurrency for r in run.rows] == [1, 2] and seen[-1] == "done"
    stored = latest_llm_profiles(store, family="llama")
    assert [(r.variant, r.resource, r.concurrency) for r in stored] == [
        ("llama-t", "cpu:1", 1), ("llama-t", "cpu:1", 2)]  # fmt: skip
    assert len({r.run_id for r in stored}) == 1
    variant = store.get_variant("llama-t")
    assert (variant.accuracy, variant.accuracy_metric, variant.source) == (0.5, "quality", "llm")
    for r in stored:
        assert r.requests >= 1 and r.errors == 0
        assert 0 < r.ttft_p50_ms <= r.ttft_p95_ms <= r.ttft_p99_ms
        assert r.output_tokens_per_s > 0 and r.requests_per_s > 0
        assert r.energy_method == ("rapl" if rapl_files() else "modeled")
        assert r.prefill_j_per_token > 0 and r.decode_j_per_token > 0
        assert r.power_w >= r.idle_power_w > 0
        # the split gives back the run's energy per request (its window: the client's wall
        # time and the setting up of its connections)
        per_request = r.power_w * r.duration_s / r.requests
        assert r.joules_per_request(r.prompt_tokens, r.output_tokens) == pytest.approx(
            per_request, rel=0.25
        )
        work = r.workload_dict
        assert work["engine"] == "transformers" and work["endpoint"] is None
        assert work["model"] == str(tiny_llama.resolve())
        assert (work["prompt_tokens"], work["output_tokens"], work["chat"]) == (16, 8, False)


@pytest.fixture(scope="module")
def served(tiny_llama: Path) -> Iterator[str]:
    """The endpoint of a `transformers serve` greenctl did not start for the profile."""
    command = llm_engines.engine_command("transformers", tiny_llama, port=free_port())
    running = llm_engines.start(command, timeout_s=120)
    try:
        yield command.endpoint
    finally:
        llm_engines.stop(running)


def test_an_endpoint_is_profiled_black_box_with_its_energy_unknown(store, served):
    run = profile_llm(store, _request(engine="openai", endpoint=served + "/v1", concurrency="1"))
    row = latest_llm_profiles(store, variant="llama-t")[0]
    port = served.rsplit(":", 1)[1]
    assert row.resource == f"remote:127.0.0.1-{port}" and row.requests >= 1
    assert row.energy_method == "unknown" and row.prefill_j_per_token is None
    assert any("energy unknown" in n for n in run.notes)
    assert row.workload_dict["endpoint"] == served and row.workload_dict["model"] is None


def test_an_endpoint_on_a_gpu_of_this_machine_is_metered_by_nvml(store, served, monkeypatch):
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE_NVML))
    profile_llm(store, _request(engine="openai", endpoint=served, concurrency="1", gpu=0))
    row = latest_llm_profiles(store, variant="llama-t")[0]
    assert row.resource.startswith("gpu:A100") and row.energy_method == "nvml"
    assert row.prefill_j_per_token is not None and row.decode_j_per_token is not None


def test_a_model_the_endpoint_refuses_stores_nothing(store, served):
    with pytest.raises(HardwareError):
        profile_llm(store, _request(engine="openai", endpoint=served, model="no-such-model"))
    assert _llm_rows(store) == 0 and store.variants() == []


class _NotOpenAI(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"models": ["x"]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        return None


def test_a_server_that_is_not_openais_is_refused_by_flag(store):
    server = HTTPServer(("127.0.0.1", 0), _NotOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(InputError, match=r"--endpoint: .* does not speak OpenAI's API"):
            profile_llm(store, _request(engine="openai", endpoint=url))
    finally:
        server.shutdown()
    assert _llm_rows(store) == 0


def test_levels_whose_streams_were_cut_short_are_noted() -> None:
    """A server that ends a running stream when another request arrives makes rows of
    one-token requests at concurrency > 1: the run says so, naming the level."""
    from greenctl.data.llm_profiles import LLMProfile
    from greenctl.profiler.llm_profile import short_stream_notes

    def row(c: int, tokens: float | None) -> LLMProfile:
        return LLMProfile("v", "cpu:1", "openai", c, "run", output_tokens=tokens)

    notes = short_stream_notes([row(1, 32.0), row(4, 1.01), row(8, 31.5)], 32)
    assert len(notes) == 1
    assert "at concurrency 4 requests streamed 1.0 of 32 tokens" in notes[0]
    assert short_stream_notes([row(1, 12.0), row(4, 1.0)], 32) == []  # the model stops early
    assert short_stream_notes([row(1, 32.0), row(4, None)], 32) == []
    assert short_stream_notes([], 32) == []

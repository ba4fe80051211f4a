"""Starting LLM engines: a model folder is checked before anything starts, the engine is
pinned to its cores and answers OpenAI's model list, and a server that is not OpenAI's is
refused by name."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from greenctl.data.errors import HardwareError, InputError
from greenctl.profiler import llm_engines

from tests.conftest import free_port

pytestmark = pytest.mark.timeout(300)


def test_a_folder_that_is_not_a_model_is_refused(tmp_path: Path):
    with pytest.raises(InputError, match="not a transformers model folder"):
        llm_engines.engine_command("transformers", tmp_path, port=1)
    (tmp_path / "m.gguf").write_bytes(b"not gguf")
    with pytest.raises(InputError, match="not a GGUF model file"):
        llm_engines.engine_command("llama.cpp", tmp_path / "m.gguf", port=1)
    with pytest.raises(InputError, match="does not start"):
        llm_engines.engine_command("vllm", tmp_path, port=1)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_llama_cpp_queues_concurrent_requests_instead_of_cutting_the_running_one(tmp_path: Path):
    """llama-cpp-python's server runs one request at a time and, by default, ends the
    running stream when another arrives: a profile at concurrency 4 would count cut streams
    of one token as finished requests. The engine is started with that off."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    argv = llm_engines.engine_command("llama.cpp", model, port=1, cores=[0]).argv
    at = argv.index("--interrupt_requests")
    assert argv[at + 1] == "False"
    assert argv[argv.index("--n_threads") + 1] == "1"


def test_the_engine_serves_pinned_to_its_cores(tiny_llama: Path):
    core = min(os.sched_getaffinity(0))
    command = llm_engines.engine_command("transformers", tiny_llama, port=free_port(), cores=[core])
    running = llm_engines.start(command, timeout_s=120)
    try:
        assert os.sched_getaffinity(running.proc.pid) == {core}
        assert llm_engines.wait_ready(command.endpoint, timeout_s=5) == [command.model]
    finally:
        llm_engines.stop(running)
    assert running.proc.poll() is not None


def test_a_server_that_is_not_openai_is_named():
    class NotOpenAI(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(HardwareError, match="not a model list"):
            llm_engines.wait_ready(url, timeout_s=5)
    finally:
        server.shutdown()
    with pytest.raises(HardwareError, match="did not answer"):
        llm_engines.wait_ready(f"http://127.0.0.1:{free_port()}", timeout_s=1)


def test_an_engine_that_exits_is_named_with_its_log(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    command = llm_engines.engine_command("transformers", tmp_path, port=free_port())
    with pytest.raises(HardwareError, match=r"exited with code .*engine log: (?!empty)"):
        llm_engines.start(command, timeout_s=120)

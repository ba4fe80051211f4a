"""The LLM engines greenctl starts: their command lines, readiness and stopping.

``transformers`` runs ``transformers serve`` on a model folder; ``llama.cpp`` runs
llama-cpp-python's server on a GGUF file (an optional extra). Both speak OpenAI's streaming
API. An engine runs as ``python -m greenctl.profiler.llm_engines`` which pins itself to its
cores before the engine starts any thread, then hands over to the engine's own entry point.
``openai`` is a server the user runs: greenctl only reaches it (:func:`wait_ready`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from greenctl.data.errors import HardwareError, InputError, shown

#: engines greenctl can start (``openai`` is reached, not started)
STARTABLE = ("transformers", "llama.cpp")
#: how many of an engine's last log lines are kept for error messages
LOG_LINES = 40
#: what each engine needs installed, for the hint when it is missing
INSTALL_HINT = {
    "transformers": "pip install 'greenctl[llm]'",
    "llama.cpp": "pip install 'greenctl[llamacpp]' (builds llama.cpp from source)",
}


@dataclass
class EngineCommand:
    """How to start one engine instance and what to call its model in requests."""

    engine: str
    argv: list[str]
    env: dict[str, str]
    endpoint: str  # http://host:port
    model: str  # the ``model`` field requests name


@dataclass
class RunningEngine:
    """An engine this process started (stopped with :func:`stop`)."""

    command: EngineCommand
    proc: subprocess.Popen[bytes]
    #: its last log lines, read as they come (an engine that logs every request blocks
    #: once a pipe nobody reads is full)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))

    def log_tail(self, lines: int = 3) -> str:
        """Its last ``lines`` log lines on one line (empty: it logged nothing)."""
        return " | ".join(line.strip() for line in list(self.log)[-lines:])


def check_model(engine: str, model: str | Path) -> Path:
    """The model an engine serves, checked: a transformers model folder (``config.json``)
    or a GGUF file for llama.cpp.

    Raises:
        InputError: naming the path and what it should be.
    """
    p = Path(model)
    if engine == "transformers":
        if not p.is_dir() or not (p / "config.json").is_file():
            raise InputError(
                f"{shown(str(p))} is not a transformers model folder (no config.json)",
                hint="name a folder written by save_pretrained (profiler.llm_models.random_llama makes one)",
            )
    elif engine == "llama.cpp":
        if not p.is_file() or _magic(p) != b"GGUF":
            raise InputError(f"{shown(str(p))} is not a GGUF model file", hint="name a .gguf file")
    else:
        raise InputError(f"greenctl does not start {engine!r} engines", hint=", ".join(STARTABLE))
    return p


def _magic(path: Path) -> bytes:
    """A file's first four bytes (a GGUF model is gigabytes: not read whole to check them)."""
    try:
        with path.open("rb") as f:
            return f.read(4)
    except OSError:
        return b""


def engine_command(
    engine: str, model: str | Path, *, port: int, cores: Sequence[int] = (), host: str = "127.0.0.1"
) -> EngineCommand:
    """The command line that serves ``model`` with ``engine`` on ``host:port``, pinned to
    ``cores`` (none: any) with as many compute threads as cores.

    Raises:
        InputError: the model is not one the engine serves (:func:`check_model`).
    """
    path = check_model(engine, model).resolve()
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if cores:
        env.update({k: str(len(cores)) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    pin = ["--cores", ",".join(str(c) for c in cores)] if cores else []
    head = [sys.executable, "-m", "greenctl.profiler.llm_engines", *pin, "--engine", engine, "--"]
    if engine == "transformers":
        args = ["serve", str(path), "--host", host, "--port", str(port), "--log-level", "warning"]
    else:
        threads = ["--n_threads", str(len(cores))] if cores else []
        # its server runs one request at a time; by default a request that arrives meanwhile
        # ends the running stream, which a profile at concurrency > 1 would count as done
        queue = ["--interrupt_requests", "False"]
        args = ["--model", str(path), "--host", host, "--port", str(port), *threads, *queue]
    return EngineCommand(engine, [*head, *args], env, f"http://{host}:{port}", str(path))


def start(command: EngineCommand, *, timeout_s: float = 180.0) -> RunningEngine:
    """Start an engine attached to this process and wait until it serves.

    Raises:
        HardwareError: it exited or did not answer in ``timeout_s`` (its log's tail named).
    """
    proc = subprocess.Popen(
        command.argv,
        env={**os.environ, **command.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    running = RunningEngine(command, proc)
    _drain(proc.stderr, running.log)
    try:
        wait_ready(command.endpoint, proc=proc, timeout_s=timeout_s, what=command.engine)
    except HardwareError as exc:
        stop(running)
        raise HardwareError(
            f"{exc.message} (engine log: {running.log_tail() or 'empty'})", hint=exc.hint
        ) from None
    except BaseException:
        stop(running)
        raise
    return running


def _drain(stream: IO[bytes] | None, into: deque[str]) -> None:
    """Read an engine's log into ``into`` as it comes, on a thread of its own."""

    def read() -> None:
        try:
            for raw in iter(stream.readline, b""):  # type: ignore[union-attr]
                into.append(raw.decode(errors="replace"))
        except (OSError, ValueError):  # closed when the engine is stopped
            return

    if stream is not None:
        threading.Thread(target=read, daemon=True, name="engine-log").start()


def wait_ready(
    endpoint: str,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 180.0,
    what: str = "the engine",
) -> list[str]:
    """Wait until ``endpoint`` answers OpenAI's ``GET /v1/models``; the models it lists.

    Raises:
        HardwareError: ``proc`` exited, nothing answered in ``timeout_s``, or the answer is
            not OpenAI's model list.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/v1/models", timeout=5) as r:
                return _model_ids(r.read(), endpoint)
        except urllib.error.HTTPError as exc:
            raise HardwareError(
                f"{endpoint} does not speak OpenAI's API: GET /v1/models answered {exc.code}",
                hint="name the base URL of an OpenAI-compatible server (without /v1)",
            ) from None
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            raise HardwareError(f"{what} exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise HardwareError(
                f"{what} at {endpoint} did not answer in {timeout_s:g} s",
                hint="is the server running, and is the URL its base (http://host:port)?",
            )
        time.sleep(0.3)


def _model_ids(body: bytes, endpoint: str) -> list[str]:
    try:
        doc = json.loads(body)
        return [str(m["id"]) for m in doc["data"]]
    except (ValueError, KeyError, TypeError):
        raise HardwareError(
            f"{endpoint} does not speak OpenAI's API: GET /v1/models is not a model list",
            hint="name the base URL of an OpenAI-compatible server (without /v1)",
        ) from None


def stop(running: RunningEngine, *, timeout_s: float = 20.0) -> None:
    """Stop an engine this process started (terminate, then kill)."""
    proc = running.proc
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m greenctl.profiler.llm_engines [--cores 0,1] --engine E -- ARGS``: pin,
    then run the engine's own entry point with ARGS."""
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--")
    head, rest = args[:split], args[split + 1 :]
    opts = dict(zip(head[::2], head[1::2], strict=True))
    if opts.get("--cores") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in opts["--cores"].split(",")})
    if opts["--engine"] == "transformers":
        from transformers.cli.transformers import main as engine_main

        sys.argv = ["transformers", *rest]
    else:
        from llama_cpp.server.__main__ import main as engine_main  # type: ignore[import-not-found,no-redef]

        sys.argv = ["llama_cpp.server", *rest]
    result = engine_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

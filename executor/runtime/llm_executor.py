"""An LLM engine as an executor: ``python -m greenctl.executor.runtime.llm_executor``.

``apply`` starts one per instance of an ``llm`` plan's tier. The process pins itself to its
cores, picks a free port, and becomes the engine
(:func:`greenctl.profiler.llm_engines.engine_command`'s ``transformers serve`` or llama.cpp,
run in this process, so its pid is the engine's and stopping it stops the engine). A thread
waits until the engine answers OpenAI's ``GET /v1/models``, sends one token's request so the
model is loaded before any client waits for it, and writes the state file every executor
writes (``ready``, host, port, url, pid and start ticks; or ``error``), which ``apply`` and
the dispatcher's supervisor wait for. A restart picks a new free port. The dispatcher talks
to the engine directly (no hop through greenctl's code per token).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from greenctl.data.errors import GreenctlError
from greenctl.executor.runtime.procs import proc_start_ticks, write_json_atomic
from greenctl.profiler import llm_engines

#: the module ``apply`` runs (``down`` finds its leftovers by it)
MODULE = "greenctl.executor.runtime.llm_executor"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument("--engine", required=True, choices=llm_engines.STARTABLE)
    p.add_argument("--model-path", required=True, help="the model folder (or GGUF file)")
    p.add_argument("--cores", default="", help="cores to pin to, comma-separated")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--state-file", required=True, help="where to write pid/port when ready")
    p.add_argument("--db", default=None, help="the store whose plan this serves (for `down`)")
    p.add_argument("--instance-id", default=None)
    p.add_argument("--variant", default=None, help="the tier this instance serves")
    p.add_argument("--ready-timeout-s", type=float, default=120.0)
    return p


def free_port(host: str) -> int:
    """A port of ``host`` free now (the engine binds it moments later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def warm_up(endpoint: str, model: str, timeout_s: float) -> None:
    """One request of one token: the engine loads its model now, not for a client.

    Raises:
        GreenctlError: the engine refused it or did not answer (the message says which).
    """
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 1}).encode()
    req = urllib.request.Request(
        f"{endpoint}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        why = exc.read().decode(errors="replace")[:300]
        raise GreenctlError(f"the engine refused its warm-up request ({exc.code}): {why}") from None
    except OSError as exc:
        raise GreenctlError(f"the engine did not answer its warm-up request: {exc}") from None


def _watch(command: llm_engines.EngineCommand, args: argparse.Namespace, host: str) -> None:
    """Wait for the engine, warm it up, and report ready (or the error, then stop)."""

    def report(doc: dict[str, Any]) -> None:
        pid = os.getpid()
        doc.update(pid=pid, pid_start=proc_start_ticks(pid), instance_id=args.instance_id)
        write_json_atomic(args.state_file, doc)

    try:
        llm_engines.wait_ready(
            command.endpoint, timeout_s=args.ready_timeout_s, what=f"the {args.engine} engine"
        )
        warm_up(command.endpoint, command.model, args.ready_timeout_s)
    except GreenctlError as exc:
        report({"error": exc.message})
        os.kill(os.getpid(), signal.SIGTERM)  # the engine stops; apply sees the error
        return
    port = int(command.endpoint.rsplit(":", 1)[1])
    report(
        {
            "ready": True,
            "host": host,
            "port": port,
            "url": command.endpoint,
            "engine": args.engine,
            "model": command.model,
            "variant": args.variant,
            "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        }
    )
    print(f"{args.engine} engine of {args.variant} ready at {command.endpoint}", flush=True)


def _not_per_request(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("[Request received]")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cores = [int(c) for c in args.cores.split(",") if c.strip()]
    host = args.host
    try:
        command = llm_engines.engine_command(
            args.engine, args.model_path, port=free_port(host), cores=cores, host=host
        )
        if cores and hasattr(os, "sched_setaffinity"):  # every thread, the watcher's too
            os.sched_setaffinity(0, set(cores))
    except (GreenctlError, OSError) as exc:
        why = exc.message if isinstance(exc, GreenctlError) else str(exc)
        doc = {"error": why, "pid": os.getpid(), "pid_start": proc_start_ticks(os.getpid())}
        write_json_atomic(Path(args.state_file), doc)
        return 3
    os.environ.update(command.env)  # before the engine imports torch (thread counts)
    # no access log: a line per request would grow the log without bound (the dispatcher
    # counts requests); a logger's filters outlive the engine's logging configuration
    logging.getLogger("uvicorn.access").addFilter(lambda record: False)
    for name in ("completion", "chat_completion", "response"):  # transformers' per request
        logging.getLogger(f"transformers.cli.serving.{name}").addFilter(_not_per_request)
    threading.Thread(target=_watch, args=(command, args, host), name="ready", daemon=True).start()
    head = command.argv.index("-m") + 2  # python -m greenctl.profiler.llm_engines ARGS
    try:
        return llm_engines.main(command.argv[head:])
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 1
    except Exception:
        traceback.print_exc()
        return 3


if __name__ == "__main__":
    sys.exit(main())

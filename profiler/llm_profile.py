"""``greenctl profile llm``: measure one LLM variant served by an engine, store its profile.

greenctl starts the engine (``transformers`` on a model folder, ``llama.cpp`` on a GGUF
file) pinned to ``cpus`` cores, or to GPU ``gpu``, or reaches a server the user runs
(``openai``: black-box, nothing started). After a warm-up and an idle window (idle watts) it
keeps each concurrency's streams in flight for ``duration_s``
(:func:`~greenctl.profiler.llm_client.measure`), then runs a prefill-only pass of half as
long at the same concurrency, and splits the energy into prefill and decode joules per token
(:mod:`greenctl.profiler.llm_energy`). One :class:`~greenctl.data.llm_profiles.LLMProfile`
per concurrency is stored in one transaction at the end: any error stores nothing.
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import HardwareError, InputError, NotFoundError, shown
from greenctl.data.limits import bounded, whole
from greenctl.data.llm_profiles import (
    LLM_ENGINES,
    LLM_SOURCE,
    UNKNOWN_ENERGY,
    LLMProfile,
    add_llm_profiles,
    llm_variant,
)
from greenctl.data.records import name_problem, utcnow_iso
from greenctl.profiler import llm_engines
from greenctl.profiler.energy import EnergyMeter, EnergyReading
from greenctl.profiler.hw import choose_cores, usable_cores
from greenctl.profiler.llm_client import ConcurrencyResult, measure
from greenctl.profiler.llm_energy import engine_meter, split_phases
from greenctl.profiler.options import parse_int_list
from greenctl.profiler.progress import Progress, no_progress

if TYPE_CHECKING:
    from greenctl.data.store import Store

DEFAULT_DURATION_S = 10.0
#: the longest warm-up (one stream at a time) before anything is timed
WARMUP_S = 2.0
#: the longest idle window the engine's idle power is read over
IDLE_S = 2.0
#: how long a server the user runs (``--endpoint``) has to answer ``GET /v1/models``
ENDPOINT_TIMEOUT_S = 5.0
#: the most streams one concurrency level keeps in flight
MAX_CONCURRENCY = 1024


@dataclass
class LLMProfileRequest:
    """What one ``greenctl profile llm`` run measures, checked on creation (each error names
    its flag). ``concurrency`` may be given as text (``"1,4"``); ``cpus`` None is 1 core
    for an engine greenctl starts."""

    engine: str
    name: str
    family: str
    quality: float
    model_dir: str | None = None
    endpoint: str | None = None
    model: str | None = None  # the ``model`` field of requests to --endpoint
    cpus: int | None = None
    gpu: int | None = None
    prompt_tokens: int = 64
    output_tokens: int = 32
    concurrency: str | Sequence[int] = (1, 4)
    duration_s: float = DEFAULT_DURATION_S
    chat: bool = False

    def __post_init__(self) -> None:
        if self.engine not in LLM_ENGINES:
            raise InputError(
                f"--engine {shown(self.engine)} is not an LLM engine greenctl knows",
                hint="--engine " + "|".join(LLM_ENGINES),
            )
        for flag, text in (("--name", self.name), ("--family", self.family)):
            problem = name_problem(text.strip()) or ("is empty" if not text.strip() else None)
            if problem:
                raise InputError(
                    f"{flag} '{shown(text)}' {problem}", hint="a short name, e.g. llama-s"
                )
        self.name, self.family = self.name.strip(), self.family.strip()
        self.quality = bounded(
            self.quality,
            "--quality",
            "fraction",
            hint="--quality is the variant's quality in 0..1, e.g. 0.7",
        )
        self.prompt_tokens = whole(self.prompt_tokens, "--prompt-tokens", "count")
        self.output_tokens = whole(self.output_tokens, "--output-tokens", "count")
        self.duration_s = bounded(self.duration_s, "--duration", "time_limit_s")
        text = (
            self.concurrency
            if isinstance(self.concurrency, str)
            else ",".join(map(str, self.concurrency))
        )
        levels = parse_int_list(text, option="--concurrency")
        if max(levels) > MAX_CONCURRENCY:
            raise InputError(
                f"--concurrency {max(levels)} is more than {MAX_CONCURRENCY} streams",
                hint="for example --concurrency 1,4,16",
            )
        self.concurrency = tuple(sorted(set(levels)))
        if self.gpu is not None and self.gpu < 0:
            raise InputError(
                f"--gpu {self.gpu} is not a GPU index", hint="--gpu 0 for the first GPU"
            )
        self._check_target()

    def _check_target(self) -> None:
        """The engine's model or endpoint, and the options that go with it."""
        if self.engine == "openai":
            if self.endpoint is None or self.model_dir is not None:
                raise InputError(
                    "--engine openai profiles a server you run: give --endpoint "
                    "(and no --model-dir)",
                    hint="--endpoint http://127.0.0.1:8000",
                )
            if not self.endpoint.startswith(("http://", "https://")):
                raise InputError(
                    f"--endpoint {shown(self.endpoint)} is not an http(s) URL",
                    hint="for example --endpoint http://127.0.0.1:8000",
                )
            self.endpoint = self.endpoint.rstrip("/").removesuffix("/v1")  # the server's base
            if self.cpus is not None:
                raise InputError(
                    "--cpus applies to engines greenctl starts, not --engine openai",
                    hint="leave out --cpus (the server you run has its own)",
                )
            return
        if self.model_dir is None or self.endpoint is not None:
            raise InputError(
                f"--engine {self.engine} serves a model greenctl starts: give "
                "--model-dir (and no --endpoint)",
                hint="--model-dir FOLDER (a GGUF file for llama.cpp)",
            )
        if self.model is not None:
            raise InputError(
                "--model names the model of an --endpoint (--engine openai)",
                hint="leave out --model: greenctl names the model it serves",
            )
        try:
            llm_engines.check_model(self.engine, self.model_dir)
        except InputError as exc:
            raise InputError(f"--model-dir: {exc.message}", hint=exc.hint) from None
        if self.engine == "llama.cpp" and importlib.util.find_spec("llama_cpp") is None:
            raise InputError(
                "--engine llama.cpp: llama-cpp-python is not installed",
                hint=llm_engines.INSTALL_HINT["llama.cpp"],
            )
        self.cpus = 1 if self.cpus is None else whole(self.cpus, "--cpus", "count")
        try:
            choose_cores(self.cpus)
        except InputError as exc:
            raise InputError(f"--cpus {self.cpus}: {exc.message}", hint=exc.hint) from None

    @property
    def levels(self) -> tuple[int, ...]:
        """The concurrency levels, checked and ascending."""
        return tuple(int(c) for c in self.concurrency)

    def workload(self, served_model: str) -> dict[str, Any]:
        """The workload description stored with every row: what a server must be asked and
        how an engine is started again (its engine and model path, or its endpoint)."""
        model = str(Path(self.model_dir).resolve()) if self.model_dir is not None else None
        return {
            "engine": self.engine,
            "model": model,
            "endpoint": self.endpoint,
            "served_model": served_model,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "chat": self.chat,
            "cpus": self.cpus,
            "gpu": self.gpu,
            "duration_s": self.duration_s,
            "phases": "prefill-only pass (max_tokens 1) at each concurrency",
        }


@dataclass
class LLMProfileRun:
    """What one run measured and stored: its rows (one per concurrency) and notes."""

    variant: str
    family: str
    quality: float
    resource: str
    engine: str
    energy_method: str  # of the meter, or UNKNOWN_ENERGY
    rows: list[LLMProfile]
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class _Target:
    """A server being profiled: where it answers, its model name, and what reads its energy."""

    endpoint: str
    model: str
    resource: str
    hardware: str | None
    meter: EnergyMeter | None


def check_variant(store: Store, request: LLMProfileRequest) -> None:
    """``--name`` may be a new variant or an LLM variant of ``--family``; never another kind's
    variant or another family's (a profile would rewrite that variant).

    Raises:
        InputError: naming the variant, its family and source.
    """
    try:
        known = store.get_variant(request.name)
    except NotFoundError:
        return
    family, source = known.family, known.source
    if source != LLM_SOURCE or family != request.family:
        raise InputError(
            f"--name {shown(request.name)} is already a variant of family {shown(str(family))} "
            f"({source or 'unknown'} source)",
            hint="choose another --name, or give its --family to profile it again",
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpu_info(index: int) -> tuple[str, str]:
    """(``gpu:MODEL`` resource, GPU name) of GPU ``index``.

    Raises:
        InputError: no NVML here, or no such GPU.
    """
    from greenctl.profiler.device import get_backend, no_gpu_reason

    backend = get_backend()
    if backend is None:
        raise InputError(
            f"--gpu {index}: no GPU greenctl can read here ({no_gpu_reason()})",
            hint="leave out --gpu to profile on the CPU",
        )
    for g in backend.gpus():
        if g.index == index:
            return f"gpu:{g.label}", g.name
    raise InputError(
        f"--gpu {index}: there is no GPU {index}",
        hint=f"GPUs here: {', '.join(str(g.index) for g in backend.gpus()) or 'none'}",
    )


def _remote_resource(endpoint: str) -> str:
    """The resource label of a server greenctl only reaches: ``remote:HOST-PORT``."""
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    return "remote:" + (re.sub(r"[^A-Za-z0-9._+-]", "-", host).strip("-.") or "server")


@contextmanager
def _served(request: LLMProfileRequest) -> Iterator[_Target]:
    """The server to profile: an engine started (and stopped after) or the user's endpoint."""
    gpu = _gpu_info(request.gpu) if request.gpu is not None else None
    if request.engine == "openai":
        endpoint = str(request.endpoint)
        models = _reach(endpoint)
        model = request.model or (models[0] if models else None)
        if model is None:
            raise InputError(
                f"--endpoint {shown(endpoint)} lists no model", hint="give --model NAME"
            )
        meter = engine_meter(pid=None, cores=0, gpu_index=request.gpu)
        yield _Target(
            endpoint,
            model,
            gpu[0] if gpu else _remote_resource(endpoint),
            gpu[1] if gpu else None,
            meter,
        )
        return
    cores = choose_cores(int(request.cpus or 1))  # a GPU engine's host threads too
    command = llm_engines.engine_command(
        request.engine, str(request.model_dir), port=_free_port(), cores=cores
    )
    command.env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(request.gpu)
    running = llm_engines.start(command)
    try:
        meter = engine_meter(pid=running.proc.pid, cores=len(cores), gpu_index=request.gpu)
        resource = gpu[0] if gpu else f"cpu:{len(cores)}"
        yield _Target(
            command.endpoint, command.model, resource, gpu[1] if gpu else _cpu_name(), meter
        )
    except HardwareError as exc:
        raise HardwareError(
            f"{exc.message} (engine log: {running.log_tail() or 'empty'})", hint=exc.hint
        ) from None
    finally:
        llm_engines.stop(running)


def _cpu_name() -> str | None:
    from greenctl.profiler.hw import cpu_info

    return cpu_info().model_name or None


def _reach(endpoint: str) -> list[str]:
    """The models a server the user runs lists, once it answers OpenAI's API.

    Raises:
        InputError: it does not answer, or not as OpenAI's API does (naming --endpoint).
    """
    try:
        return llm_engines.wait_ready(endpoint, timeout_s=ENDPOINT_TIMEOUT_S, what="--endpoint")
    except HardwareError as exc:
        message = (
            exc.message if exc.message.startswith("--endpoint") else f"--endpoint: {exc.message}"
        )
        raise InputError(message, hint=exc.hint) from None


def _metered(
    meter: EnergyMeter | None, work: Callable[[], ConcurrencyResult]
) -> tuple[ConcurrencyResult, EnergyReading | None]:
    """Run ``work`` inside ``meter``'s window (no meter: no reading)."""
    if meter is None:
        return work(), None
    meter.start()
    result = work()
    return result, meter.stop(requests=result.requests)


def _idle_power(meter: EnergyMeter | None, seconds: float) -> float | None:
    """The server's power (W) while it holds its model and serves nothing."""
    if meter is None:
        return None
    meter.start()
    time.sleep(seconds)
    return meter.stop(requests=0).power_w


def _row(
    request: LLMProfileRequest,
    target: _Target,
    run: tuple[str, str],
    full: ConcurrencyResult,
    energy: tuple[EnergyReading | None, ConcurrencyResult, EnergyReading | None],
    idle_w: float | None,
) -> LLMProfile:
    """The stored row of one concurrency level (``run``: the run's id and time, shared by
    its rows: the store reads a profile as the rows of its newest run)."""
    full_e, prefill, prefill_e = energy
    prompt = full.mean_prompt_tokens or float(request.prompt_tokens)
    phases = None
    if full_e is not None and prefill_e is not None:
        phases = split_phases(
            full_e,
            requests=full.requests,
            prompt_tokens=prompt,
            output_tokens=full.mean_output_tokens,
            prefill=prefill_e,
            prefill_requests=prefill.requests,
        )
    return LLMProfile(
        variant=request.name,
        resource=target.resource,
        engine=request.engine,
        concurrency=full.concurrency,
        run_id=run[0],
        created_at=run[1],
        prompt_tokens=prompt,
        output_tokens=full.mean_output_tokens,
        requests=full.requests,
        errors=full.errors,
        duration_s=full.requests / full.requests_per_s,
        ttft_p50_ms=full.ttft_ms.get("p50"),
        ttft_p95_ms=full.ttft_ms.get("p95"),
        ttft_p99_ms=full.ttft_ms.get("p99"),
        tpot_p50_ms=full.tpot_ms.get("p50"),
        tpot_p95_ms=full.tpot_ms.get("p95"),
        tpot_p99_ms=full.tpot_ms.get("p99"),
        output_tokens_per_s=full.output_tokens_per_s,
        requests_per_s=full.requests_per_s,
        power_w=full_e.power_w if full_e else None,
        idle_power_w=idle_w,
        prefill_j_per_token=phases.prefill_j_per_token if phases else None,
        decode_j_per_token=phases.decode_j_per_token if phases else None,
        energy_method=target.meter.method if target.meter else UNKNOWN_ENERGY,
        hardware=target.hardware,
        workload=json.dumps(request.workload(target.model)),
    )


def _measure_levels(
    request: LLMProfileRequest, target: _Target, progress: Progress
) -> list[LLMProfile]:
    """Warm up, read idle power, then measure each concurrency (full run and prefill pass)."""

    def run(concurrency: int, output_tokens: int, duration_s: float) -> ConcurrencyResult:
        return measure(
            target.endpoint,
            target.model,
            prompt_tokens=request.prompt_tokens,
            output_tokens=output_tokens,
            concurrency=concurrency,
            duration_s=duration_s,
            chat=request.chat,
        )

    progress("warming up", 0.0)
    run(1, request.output_tokens, min(request.duration_s, WARMUP_S))
    idle_w = _idle_power(target.meter, min(request.duration_s, IDLE_S))
    stamp, rows, levels = (uuid.uuid4().hex, utcnow_iso()), [], request.levels
    for i, c in enumerate(levels):
        progress(f"concurrency {c}", i / len(levels))
        full, full_e = _metered(
            target.meter, partial(run, c, request.output_tokens, request.duration_s)
        )
        prefill, prefill_e = _metered(target.meter, partial(run, c, 1, request.duration_s / 2))
        rows.append(_row(request, target, stamp, full, (full_e, prefill, prefill_e), idle_w))
    progress("done", 1.0)
    return rows


#: a level whose requests streamed less than this share of the tokens asked is noted
SHORT_STREAMS = 0.9


def short_stream_notes(rows: list[LLMProfile], asked: int) -> list[str]:
    """A note per concurrency whose streams ended well short of the ``asked`` tokens while
    the lowest level's did not: a server that ends a running stream when another request
    comes (llama-cpp-python's default) makes such rows, and their per-token figures."""
    first = rows[0].output_tokens if rows else None
    if first is None or first < SHORT_STREAMS * asked:
        return []  # short from the start: the model's own stop, not the concurrency
    return [
        f"at concurrency {row.concurrency} requests streamed {row.output_tokens:.1f} of "
        f"{asked} tokens on average (at {rows[0].concurrency}: {first:.1f}): the server may "
        "end a running stream when another request arrives; its figures at that "
        "concurrency are not of whole requests"
        for row in rows[1:]
        if row.output_tokens is not None and row.output_tokens < SHORT_STREAMS * asked
    ]


def profile_llm(
    store: Store, request: LLMProfileRequest, *, progress: Progress = no_progress
) -> LLMProfileRun:
    """Measure ``request``'s variant at each concurrency and store its rows (one transaction,
    after every level is measured: an error stores nothing).

    Raises:
        InputError: a variant of that name belongs to another family or kind; an endpoint
            that does not answer OpenAI's API.
        HardwareError: the engine did not start, or no request succeeded.
    """
    check_variant(store, request)
    t0 = time.perf_counter()
    with _served(request) as target:
        rows = _measure_levels(request, target, progress)
    from greenctl.profiler.harness import busy_note  # the one rule of a busy machine

    notes = [n for n in [busy_note(len(usable_cores()))] if n]
    if target.meter is None:
        notes.append(
            "energy unknown: the server runs elsewhere and no --gpu of this machine "
            "was named to read it by NVML"
        )
    notes += short_stream_notes(rows, request.output_tokens)
    add_llm_profiles(store, llm_variant(request.name, request.family, request.quality), rows)
    return LLMProfileRun(
        request.name,
        request.family,
        request.quality,
        target.resource,
        request.engine,
        target.meter.method if target.meter else UNKNOWN_ENERGY,
        rows,
        notes,
        time.perf_counter() - t0,
    )

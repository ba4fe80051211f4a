"""``greenctl profile llm``: measure an LLM variant served by an engine (started here or
reached at an OpenAI-compatible endpoint) and store one profile row per concurrency."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Annotated, Any

import typer
from greenctl.cli.common import err_console, print_json, render_table, store_for
from greenctl.cli.options import DbOpt, JsonOpt
from greenctl.data.llm_profiles import LLM_ENGINES, UNKNOWN_ENERGY
from greenctl.profiler.energy import model_caption
from greenctl.profiler.llm_profile import DEFAULT_DURATION_S, LLMProfileRequest, LLMProfileRun

ProgressBar = Callable[[], AbstractContextManager[Callable[[str, float], None]]]

# Each column of the table, defined once: its header and the value it shows.
_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "streams": lambda r: r.concurrency,
    "requests": lambda r: r.requests,
    "TTFT p50 ms": lambda r: r.ttft_p50_ms,
    "TTFT p95 ms": lambda r: r.ttft_p95_ms,
    "TTFT p99 ms": lambda r: r.ttft_p99_ms,
    "TPOT p50 ms": lambda r: r.tpot_p50_ms,
    "TPOT p95 ms": lambda r: r.tpot_p95_ms,
    "TPOT p99 ms": lambda r: r.tpot_p99_ms,
    "tokens/s": lambda r: r.output_tokens_per_s,
    "req/s": lambda r: r.requests_per_s,
    "power W": lambda r: r.power_w,
    "idle W": lambda r: r.idle_power_w,
    "prefill J/tok": lambda r: r.prefill_j_per_token,
    "decode J/tok": lambda r: r.decode_j_per_token,
    "energy": lambda r: r.energy_method,
}


def render_llm_run(run: LLMProfileRun) -> None:
    """The table of one run: a row per concurrency; modeled or unknown energy captioned."""
    title = (
        f"{run.variant} ({run.family}, quality {run.quality:g}) on {run.resource} via "
        f"{run.engine}: {len(run.rows)} concurrency level(s) in {run.wall_s:.1f} s (stored)"
    )
    caption = None
    if run.energy_method == "modeled":
        caption = model_caption()
    elif run.energy_method == UNKNOWN_ENERGY:
        caption = "energy unknown: the server runs elsewhere (no NVML reading of it here)"
    render_table(
        title,
        list(_COLUMNS),
        [[cell(r) for cell in _COLUMNS.values()] for r in run.rows],
        caption=caption,
    )


def llm_run_document(run: LLMProfileRun) -> dict[str, Any]:
    """The ``--json`` document of a run (each row's workload as an object)."""
    return {
        "variant": {"name": run.variant, "family": run.family, "quality": run.quality},
        "resource": run.resource,
        "engine": run.engine,
        "energy_method": run.energy_method,
        "profiles": [{**asdict(r), "workload": r.workload_dict} for r in run.rows],
        "wall_s": run.wall_s,
        "notes": run.notes,
    }


def register(app: typer.Typer, progress_bar: ProgressBar) -> None:
    """Add ``llm`` to the ``profile`` group, drawing progress with ``progress_bar``."""

    @app.command("llm")
    def profile_llm_command(
        engine: Annotated[
            str, typer.Option("--engine", help="Engine: " + "|".join(LLM_ENGINES) + ".")
        ],
        name: Annotated[str, typer.Option("--name", help="Variant name of this model (tier).")],
        family: Annotated[
            str, typer.Option("--family", help="Family the plan serves (the tiers' model).")
        ],
        quality: Annotated[
            float, typer.Option("--quality", help="The variant's quality in 0..1 (declared).")
        ],
        model_dir: Annotated[
            str | None,
            typer.Option(
                "--model-dir",
                help="Model folder (transformers) or GGUF file (llama.cpp) greenctl serves.",
            ),
        ] = None,
        endpoint: Annotated[
            str | None,
            typer.Option("--endpoint", help="Base URL of an OpenAI-compatible server (openai)."),
        ] = None,
        served_model: Annotated[
            str | None,
            typer.Option(
                "--model", help="Model name requests to --endpoint ask (default: its first)."
            ),
        ] = None,
        cpus: Annotated[
            int | None, typer.Option("--cpus", help="Cores the engine is pinned to (default 1).")
        ] = None,
        gpu: Annotated[
            int | None,
            typer.Option(
                "--gpu", help="Run the engine on GPU INDEX (or read --endpoint's by NVML)."
            ),
        ] = None,
        prompt_tokens: Annotated[
            int, typer.Option("--prompt-tokens", help="Prompt length of each request (tokens).")
        ] = 64,
        output_tokens: Annotated[
            int, typer.Option("--output-tokens", help="Tokens asked of each request.")
        ] = 32,
        concurrency: Annotated[
            str, typer.Option("--concurrency", help="Streams kept in flight, e.g. 1,4.")
        ] = "1,4",
        duration: Annotated[
            float,
            typer.Option(
                "--duration",
                help="Seconds to measure each concurrency (then half as long prefill-only).",
            ),
        ] = DEFAULT_DURATION_S,
        chat: Annotated[
            bool,
            typer.Option("--chat", help="Ask /v1/chat/completions instead of /v1/completions."),
        ] = False,
        db: DbOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Measure an LLM variant: TTFT, TPOT, tokens/s and J/token per concurrency, stored.

        Starts the engine on --model-dir pinned to --cpus cores (or --gpu), or profiles a
        server you run at --endpoint black-box. Energy: NVML on a GPU, RAPL where readable,
        else the CPU power model (labelled modeled); unknown for a remote server.
        """
        from greenctl.profiler.llm_profile import check_variant, profile_llm

        request = LLMProfileRequest(
            engine=engine, name=name, family=family, quality=quality, model_dir=model_dir,
            endpoint=endpoint, model=served_model, cpus=cpus, gpu=gpu, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, concurrency=concurrency, duration_s=duration, chat=chat,
        )  # fmt: skip
        # checked against the store as it is (nothing written), so a refused run leaves no trace
        with store_for(db, create=False, missing_ok=True) as store:
            check_variant(store, request)
        with store_for(db) as store, progress_bar() as progress:
            run = profile_llm(store, request, progress=progress)
        if json_out:
            print_json(llm_run_document(run))
            return
        render_llm_run(run)
        for note in run.notes:
            err_console.print(note, markup=False, highlight=False)

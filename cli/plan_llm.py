"""``greenctl plan llm``: instances per quality tier of an LLM family and each tier's share of
requests under TTFT and TPOT SLOs (Quality Time's problem, in tokens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    check_writable,
    input_path_str,
    print_json,
    render_table,
    say,
    store_for,
)
from greenctl.cli.options import AtOpt, DbOpt, JsonOpt, PlanCarbonIntensityOpt, RegionOpt
from greenctl.data.errors import InputError
from greenctl.executor.kinds import get_kind, plan, plan_carbon

#: what ``plan llm`` takes from ``greenctl plan`` (``save_plan``, ``carbon_caption``), handed
#: in by :func:`register`: cli/plan.py registers this command, so importing it here would close
#: an import circle
_PLAN: dict[str, Callable[..., Any]] = {}


def llm_request(
    *,
    model: str | None,
    rate: float | None,
    trace: str | None = None,
    budget: list[str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The llm request of ``plan llm``'s options: ``fields`` given (not None) as they are,
    the budgets ``KIND=N``, and with ``trace`` its mean rate (unless ``rate``) and mean
    token lengths, its summary recorded. The request's own type checks every field.

    Raises:
        InputError: a budget that is not KIND=N, --trace with token lengths, a bad trace.
    """
    request: dict[str, Any] = {"model": model, "rate_rps": rate}
    request.update({k: v for k, v in fields.items() if v is not None})
    if trace is not None:
        from greenctl.data.llm_traces import read_llm_trace  # numpy: not for `--help`

        if fields.get("prompt_tokens") is not None or fields.get("output_tokens") is not None:
            raise InputError(
                "--trace gives the token lengths: drop --prompt-tokens/--output-tokens",
                hint="or drop --trace and give the rate and lengths",
            )
        summary = read_llm_trace(trace).summary()
        if rate is None:
            request["rate_rps"] = summary["rate_rps"]
        request["prompt_tokens"] = max(summary["prompt_tokens"]["mean"], 1.0)
        request["output_tokens"] = max(summary["output_tokens"]["mean"], 1.0)
        request["trace"] = {"file": trace, **summary}
    budgets: dict[str, Any] = {}
    for item in budget or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(
                f"--budget {item!r} is not KIND=N", hint="for example --budget cpu=2 or gpu=1"
            )
        budgets[key.strip()] = value.strip()
    request["budget"] = budgets
    return request


def plan_llm_cmd(
    model: Annotated[str | None, typer.Option("--model", help="LLM family to serve.")] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", help="Request rate (req/s; default: --trace's).")
    ] = None,
    ttft_ms: Annotated[
        float | None, typer.Option("--ttft-ms", help="Time-to-first-token SLO (ms).")
    ] = None,
    tpot_ms: Annotated[
        float | None, typer.Option("--tpot-ms", help="Time-per-output-token SLO (ms).")
    ] = None,
    percentile: Annotated[
        str | None, typer.Option("--percentile", help="SLO percentile: p50, p95 (default), p99.")
    ] = None,
    min_quality: Annotated[
        float | None,
        typer.Option("--min-quality", help="Floor on the request-weighted quality (0..1)."),
    ] = None,
    prompt_tokens: Annotated[
        float | None,
        typer.Option("--prompt-tokens", help="Mean prompt tokens (default: as profiled)."),
    ] = None,
    output_tokens: Annotated[
        float | None,
        typer.Option("--output-tokens", help="Mean output tokens (default: as profiled)."),
    ] = None,
    trace: Annotated[
        str | None,
        typer.Option(
            "--trace",
            help="Azure, BurstGPT or greenctl LLM trace: its mean rate and token lengths.",
            parser=input_path_str,
            metavar="FILE",
        ),
    ] = None,
    budget: Annotated[
        list[str] | None,
        typer.Option("--budget", help="cpu=N cores or gpu=N GPUs (repeat for both)."),
    ] = None,
    objective: Annotated[
        str | None,
        typer.Option("--objective", help="carbon (default) | energy | cost | balanced."),
    ] = None,
    carbon_intensity: PlanCarbonIntensityOpt = None,
    region: RegionOpt = None,
    at: AtOpt = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Also write the plan JSON here.")
    ] = None,
    json_out: JsonOpt = False,
    db: DbOpt = None,
) -> None:
    """Choose instances per tier and each tier's share of requests under token SLOs."""
    check_writable(output)
    request = llm_request(
        model=model, rate=rate, trace=trace, budget=budget, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
        percentile=percentile, min_quality=min_quality, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, objective=objective, carbon_intensity=carbon_intensity,
    )  # fmt: skip
    kind = get_kind("llm")
    kind.check_request(request)  # a bad field is named before the store is opened
    with store_for(db) as store:
        ci = plan_carbon(
            store, kind, intensity=carbon_intensity, region=region, at=at, request=request
        )
        new = plan(store, "llm", request, carbon=ci)
        _PLAN["save_plan"](store, new, output)
    if json_out:
        if ci is not None and ci["note"]:
            say(f"note: {ci['note']}", err=True, highlight=False)
        print_json(new.to_dict())
        return
    _render(new)
    if output is not None:
        say(f"plan written to {output}", highlight=False)


def _render(new: Any) -> None:
    pct = new.request.get("percentile") or "p95"
    tiers = new.extra.get("llm", {}).get("tiers", [])
    render_table(
        f"Plan {new.id} (llm, {new.request.get('model')})",
        ["tier", "resource", "quality", "instances", "share", "req/s", "capacity/inst",
         f"TTFT {pct} ms", f"TPOT {pct} ms", "J/request"],
        [
            [t["variant"], t["resource"], t["quality"], t["instances"], t["share"],
             t["rate_rps"], t["capacity_rps_per_instance"], t.get(f"ttft_{pct}_ms"),
             t.get(f"tpot_{pct}_ms"), t.get("j_per_request")]
            for t in tiers
        ],
    )  # fmt: skip
    pred = new.predicted
    method = pred.get("energy_method")
    render_table(
        f"Predicted ({'modeled energy' if method == 'modeled' else f'energy: {method}'})",
        ["rate req/s", "quality", f"TTFT {pct} ms", f"TPOT {pct} ms", "J/request",
         "J/output token", "gCO2/request", "cost/h", "objective"],
        [[pred.get("rate_rps"), pred.get("quality"), pred.get(f"ttft_{pct}_ms"),
          pred.get(f"tpot_{pct}_ms"), pred.get("energy_j_per_request"),
          pred.get("j_per_output_token"), pred.get("carbon_g_per_request"),
          pred.get("cost_per_hour"), pred.get("objective")]],
        caption=f"objective: {pred.get('objective_name')}; {_PLAN['carbon_caption'](new)}",
    )  # fmt: skip
    for note in new.extra.get("notes", []):
        say(f"note: {note}", highlight=False)


def register(
    plan_app: typer.Typer,
    *,
    save_plan: Callable[..., Any],
    carbon_caption: Callable[..., str],
) -> None:
    """Add ``plan llm`` to the ``plan`` group, with the group's ``save_plan`` (the plan and
    its ``-o`` file in one transaction) and ``carbon_caption``."""
    _PLAN.update(save_plan=save_plan, carbon_caption=carbon_caption)
    plan_app.command("llm")(plan_llm_cmd)

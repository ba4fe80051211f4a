"""``greenctl simulate``: predict what a plan does under a load (simulated or analytic)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from greenctl.cli.common import console, input_path, print_json, render_table, store_for
from greenctl.cli.options import DbOpt, JsonOpt, RateOpt
from greenctl.cli.plan import carbon_caption
from greenctl.data.errors import InputError
from greenctl.data.limits import SLO_QUANTILES, optional, whole
from greenctl.data.plan import Plan, load_plan_file
from greenctl.executor.kinds import get_kind

_ROWS = (
    ("rate_rps", "offered load", "req/s"),
    ("served_rps", "served", "req/s"),
    ("dropped_rps", "dropped / backlog", "req/s"),
    ("p50_ms", "latency p50", "ms"),
    ("p95_ms", "latency p95", "ms"),
    ("p99_ms", "latency p99", "ms"),
    # an llm plan's: at the percentile its request states
    *((f"ttft_{p}_ms", f"time to first token {p}", "ms") for p in SLO_QUANTILES),
    *((f"tpot_{p}_ms", f"time per output token {p}", "ms") for p in SLO_QUANTILES),
    ("slo_violation_frac", "SLO violations", "fraction"),
    ("accuracy", "accuracy (request-weighted)", ""),
    ("power_w", "average power", "W"),
    ("energy_j_per_request", "energy per request", "J"),
    ("carbon_g_per_request", "carbon per request", "g CO2"),
    ("water_l_per_request", "water per request", "L"),
    ("cost_per_hour", "cost", "per hour"),
    ("utilisation", "utilisation (mean of instances)", "fraction"),
    ("overloaded", "overloaded", ""),
)


PlanFileArg = Annotated[
    Path,
    typer.Argument(
        help="Plan JSON written by `greenctl plan ...`.", show_default=False, parser=input_path
    ),
]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Replay a requests-per-second trace (.txt or .txt.gz, or bundled:NAME), "
        "Poisson within seconds.",
        parser=input_path,
        metavar="FILE",
    ),
]
ScaleOpt = Annotated[float, typer.Option("--scale", help="Multiply the trace by F.")]
DurationOpt = Annotated[
    float | None,
    typer.Option("--duration", help="Seconds of load (a trace: its first S seconds)."),
]
RequestsOpt = Annotated[
    int | None, typer.Option("--requests", help="Requests of a Poisson run (default 100000).")
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy",
        help="fifo (central queue), wrr (quotas) or batch (default: what the plan implies).",
    ),
]
CarbonOpt = Annotated[
    float | None,
    typer.Option(
        "--carbon-intensity", help="Grid carbon intensity in g CO2 per kWh (default: the plan's)."
    ),
]
PueOpt = Annotated[
    float | None,
    typer.Option("--pue", help="Power usage effectiveness (>= 1; default: the plan's, else 1)."),
]
WueOpt = Annotated[
    float | None, typer.Option("--wue", help="Direct (on-site) water use, L per kWh.")
]
EwifOpt = Annotated[
    float | None,
    typer.Option("--ewif", help="Indirect water of electricity generation, L per kWh."),
]
IdlePowerOpt = Annotated[
    float | None,
    typer.Option("--device-idle-power", help="Idle watts of each whole device (shared)."),
]
SloMsOpt = Annotated[
    float | None,
    typer.Option("--slo-ms", help="Latency SLO in ms (default: the plan's request.slo_ms)."),
]
QueueLimitOpt = Annotated[
    int | None, typer.Option("--queue-limit", help="Drop arrivals when N requests already wait.")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (reproducible runs).")]
AnalyticOpt = Annotated[
    bool, typer.Option("--analytic", help="Use the fast queueing approximation, not the simulator.")
]


def simulate_cmd(
    plan_file: PlanFileArg,
    rate: RateOpt = None,
    trace: TraceOpt = None,
    scale: ScaleOpt = 1.0,
    duration: DurationOpt = None,
    requests: RequestsOpt = None,
    policy: PolicyOpt = None,
    carbon_intensity: CarbonOpt = None,
    pue: PueOpt = None,
    wue: WueOpt = None,
    ewif: EwifOpt = None,
    idle_power: IdlePowerOpt = None,
    slo_ms: SloMsOpt = None,
    queue_limit: QueueLimitOpt = None,
    seed: SeedOpt = 0,
    analytic: AnalyticOpt = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Predict a plan's latency, accuracy, energy, carbon, water and cost under a load."""
    from greenctl.data.traces import read_rps_trace  # numpy: not for `--help`

    if rate is not None and trace is not None:
        raise InputError("give --rate or --trace, not both")
    if duration is not None and requests is not None:
        raise InputError("give --duration or --requests, not both")
    seed = whole(seed, "--seed", "seed")
    rate = optional(rate, "--rate", "rate_rps")
    plan = load_plan_file(plan_file)
    kind = get_kind(plan.kind)
    if not kind.serves:
        raise kind.refuse("simulate")
    slo_ms = slo_ms if slo_ms is not None else _plan_slo_ms(plan)
    pol = kind.dispatch_policy(plan, policy)
    with store_for(db) as store:  # the kind's prediction: the evaluation core for instances
        result = kind.predict(
            store,
            plan,
            rate_rps=rate,
            trace=read_rps_trace(trace) if trace is not None else None,
            trace_scale=scale,
            duration_s=duration,
            n_requests=requests,
            policy=pol,
            analytic=analytic,
            seed=seed,
            queue_limit=queue_limit,
            percentile_slo_ms=slo_ms,
            carbon_g_per_kwh=carbon_intensity,
            pue=pue,
            wue_l_per_kwh=wue,
            ewif_l_per_kwh=ewif,
            device_idle_power_w=idle_power,
        )
    if json_out:
        method = "analytic" if analytic else "simulated"
        print_json({"method": method, "policy": pol, **{k: _finite(v) for k, v in result.items()}})
        return
    caption = _caption(
        result, plan, policy=pol, trace=trace, seed=seed, slo_ms=slo_ms, analytic=analytic,
        carbon_intensity=carbon_intensity,
    )  # fmt: skip
    rows = [[label, _cell(result[key]), unit] for key, label, unit in _ROWS if key in result]
    render_table(
        f"greenctl simulate {plan_file.name}", ["metric", "value", "unit"], rows, caption=caption
    )
    if result.get("overloaded"):
        console.print(
            "[bold red]Overloaded:[/] the load exceeds the plan's capacity; the queue grows "
            "without bound (latency percentiles are infinite)."
        )


def _plan_slo_ms(plan: Plan) -> float | None:
    """The SLO the plan was asked for (its request's ``slo_ms``), if it names a positive one."""
    asked = plan.request.get("slo_ms") if isinstance(plan.request, dict) else None
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
        return float(asked)
    return None


def _caption(
    result: dict[str, Any],
    plan: Plan,
    *,
    policy: str,
    trace: Path | None,
    seed: int,
    slo_ms: float | None,
    analytic: bool,
    carbon_intensity: float | None,
) -> str:
    """The table's caption: how the figures were had (method, load, policy, SLO, carbon)."""
    if analytic:
        caption = f"modeled: M/G/c queueing approximation, policy {policy}"
    else:
        load = f"trace {trace.name}" if trace is not None else "Poisson arrivals"
        caption = f"simulated: {load}, policy {policy}, seed {seed}; from profiles"
    if result.get("latency_includes"):
        caption += f"; latency: {result['latency_includes']}"
    if slo_ms is not None:
        caption += f"; SLO {slo_ms:g} ms"
    elif "slo_violation_frac" in result:
        caption += "; each model's own SLO"
    if result.get("carbon_g_per_request") is not None:
        caption += (
            f"; carbon at {carbon_intensity:g} gCO2/kWh (--carbon-intensity)"
            if carbon_intensity is not None
            else f"; the plan's {carbon_caption(plan)}"
        )
    if result.get("cost_priced") is False:
        caption += "; cost: resource amount per hour where a profile has no cost_per_hour"
    return caption


def _finite(value: Any) -> Any:
    """JSON has no infinity: an unbounded latency becomes null (see ``overloaded``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "unbounded"
    return value


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)

"""``greenctl plan mix``: variants x resources x counts x quotas for a load (InfAdapter/INFaaS)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    DbOpt,
    JsonOpt,
    fmt,
    input_path_str,
    print_json,
    render_table,
    say,
    store_for,
)
from greenctl.cli.options import PlanCarbonIntensityOpt
from greenctl.cli.plan import AtOpt, RegionOpt, carbon_caption, check_writable, plan_app, save_plan
from greenctl.data.errors import InputError
from greenctl.data.plan import load_plan_file
from greenctl.data.spec_io import read_mix_spec
from greenctl.executor.kinds import get_kind, plan, plan_carbon
from greenctl.planner.mix.solve import OBJECTIVES, SOLVERS, STRATEGIES

# The options a mix request is made of: ``plan mix`` and ``replay --kind mix`` declare them
# once, here (the request itself is built by :func:`mix_request`).
SloMsOpt = Annotated[
    float | None, typer.Option("--slo-ms", help="Latency SLO in ms at --percentile.")
]
PercentileOpt = Annotated[
    str | None, typer.Option("--percentile", help="SLO percentile: p95 (default) or p99.")
]
BudgetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        help="Resource budget KIND=AMOUNT (cpu=14 cores, mig=7 slices) or LABEL=COUNT "
        "(mig:1g.10gb=7 instances); repeat for several.",
    ),
]
ObjectiveOpt = Annotated[
    str | None,
    typer.Option("--objective", help="accuracy | cost | carbon | balanced (default)."),
]
MinAccuracyOpt = Annotated[
    float | None,
    typer.Option("--min-accuracy", help="Floor on the quota-weighted accuracy."),
]
AlphaOpt = Annotated[
    float | None, typer.Option("--alpha", help="Balanced: weight of resource cost (0.05).")
]
BetaOpt = Annotated[
    float | None, typer.Option("--beta", help="Balanced: weight of loading cost (0.001).")
]
GammaOpt = Annotated[
    float | None, typer.Option("--gamma", help="Balanced: weight of carbon (0.05).")
]
HeadroomOpt = Annotated[
    float | None,
    typer.Option("--headroom", help="Spare capacity: cover rate x (1 + F) (default 0)."),
]
StrategyOpt = Annotated[
    str | None, typer.Option("--strategy", help="ilp (exact, default) | greedy | single.")
]


def _parse_budgets(items: list[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(
                f"--budget '{item}' is not KIND=AMOUNT",
                hint="for example --budget cpu=14 or --budget mig:1g.10gb=7",
            )
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise InputError(f"--budget '{item}': '{value}' is not a number") from None
    return out


#: ``plan mix``'s options that go into the request as given, by option -> request key
REQUEST_OPTIONS = {
    "slo_ms": "slo_ms",
    "percentile": "percentile",
    "objective": "objective",
    "min_accuracy": "min_accuracy",
    "alpha": "alpha",
    "beta": "beta",
    "gamma": "gamma",
    "carbon_intensity": "carbon_intensity",
    "headroom": "headroom",
    "time_limit": "time_limit_s",
    "strategy": "strategy",
    "solver": "solver",
}


def mix_request(
    *,
    model: str | None,
    rate: float | None,
    budget: list[str] | None = None,
    spec: str | None = None,
    **options: float | str | None,
) -> dict[str, Any]:
    """The mix request of ``plan mix``'s options (``replay mix`` parses the same): the family
    and rate or a spec file, the budgets, and :data:`REQUEST_OPTIONS` given (not None).

    Raises:
        TypeError: an option that is not one of :data:`REQUEST_OPTIONS`.
    """
    unknown = sorted(set(options) - set(REQUEST_OPTIONS))
    if unknown:
        raise TypeError(f"mix_request() got unexpected options {unknown}")
    request: dict[str, Any] = {}
    if spec is not None:
        request = read_mix_spec(
            spec, choices={"objective": OBJECTIVES, "strategy": STRATEGIES, "solver": SOLVERS}
        )
        if model is not None or rate is not None:
            raise InputError(
                "--model/--rate cannot be combined with --spec",
                hint="list the families in the spec file",
            )
    elif model is None:
        raise InputError("--model FAMILY is required (or --spec FILE)")
    else:
        request = {"model": model, "rate_rps": rate}
    request.update({REQUEST_OPTIONS[k]: v for k, v in options.items() if v is not None})
    if budget:
        request["budgets"] = {**(request.get("budgets") or {}), **_parse_budgets(budget)}
    return request


def plan_mix_cmd(
    model: Annotated[str | None, typer.Option("--model", help="Model family to serve.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Request rate (req/s).")] = None,
    slo_ms: SloMsOpt = None,
    percentile: PercentileOpt = None,
    budget: BudgetOpt = None,
    objective: ObjectiveOpt = None,
    min_accuracy: MinAccuracyOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    gamma: GammaOpt = None,
    carbon_intensity: PlanCarbonIntensityOpt = None,
    region: RegionOpt = None,
    at: AtOpt = None,
    headroom: HeadroomOpt = None,
    current: Annotated[
        str | None,
        typer.Option("--current", help="The plan running now (JSON): no loading cost for it."),
    ] = None,
    strategy: StrategyOpt = None,
    solver: Annotated[str | None, typer.Option("--solver", help="highs (default) | cbc.")] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", help="Solver time limit (s): best plan found + its gap."),
    ] = None,
    spec: Annotated[
        str | None,
        typer.Option(
            "--spec",
            help="TOML/JSON file: many families with shared budgets.",
            parser=input_path_str,
            metavar="FILE",
        ),
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Also write the plan JSON here.")
    ] = None,
    json_out: JsonOpt = False,
    db: DbOpt = None,
) -> None:
    """Choose variants, resources, counts and request quotas for a load under an SLO."""
    check_writable(output)
    request = mix_request(
        model=model, rate=rate, slo_ms=slo_ms, percentile=percentile, budget=budget,
        objective=objective, min_accuracy=min_accuracy, alpha=alpha, beta=beta, gamma=gamma,
        carbon_intensity=carbon_intensity, headroom=headroom, time_limit=time_limit,
        strategy=strategy, solver=solver, spec=spec,
    )  # fmt: skip
    current_plan = load_plan_file(current) if current is not None else None
    with store_for(db) as store:
        ci = plan_carbon(
            store,
            get_kind("mix"),
            intensity=request.get("carbon_intensity"),
            region=region,
            at=at,
            request=request,
        )
        if ci is not None and carbon_intensity is None and "carbon_intensity" in request:
            ci["source"] = {**ci["source"], "kind": "spec", "file": str(spec)}
        new = plan(store, "mix", request, carbon=ci, current=current_plan)  # as `replan` does
        save_plan(store, new, output)
    if json_out:
        if ci is not None and ci["note"]:
            say(f"note: {ci['note']}", err=True, highlight=False)
        print_json(new.to_dict())
        return
    _render(new)


def _families(request: dict[str, Any]) -> list[str]:
    fams = request.get("families")
    if isinstance(fams, list):
        return [str(f.get("model")) for f in fams if isinstance(f, dict)]
    return [str(request.get("model"))]


def _render(plan: Any) -> None:
    pred = plan.predicted
    cap = {(c["variant"], c["resource"], c["batch"]): c for c in plan.extra.get("capacity", [])}
    render_table(
        f"Plan {plan.id} (mix, {plan.extra.get('strategy')})",
        ["model", "variant", "resource", "batch", "count", "quota req/s", "capacity req/s"],
        [
            [
                d.model,
                d.variant,
                d.resource,
                d.batch,
                d.count,
                d.quota_rps,
                d.count
                * cap.get((d.variant, d.resource, d.batch), {}).get(
                    "capacity_rps_per_instance", 0.0
                ),
            ]
            for d in plan.deployments
        ],
    )
    lat_key = f"{plan.request.get('percentile') or 'p95'}_ms"
    render_table(
        "Predicted (modeled)",
        ["rate req/s", "accuracy", "cost/h", lat_key, "J/request", "gCO2/request", "objective"],
        [
            [
                pred.get("rate_rps"),
                pred.get("accuracy"),
                pred.get("cost_per_hour"),
                pred.get(lat_key),
                pred.get("energy_j_per_request"),
                pred.get("carbon_g_per_request"),
                pred.get("objective"),
            ]
        ],
        caption=f"objective: {pred.get('objective_name')}; {carbon_caption(plan)}",
    )
    if plan.extra.get("actions"):
        render_table(
            "Scaling actions vs --current",
            ["model", "variant", "action", "instances before", "instances after"],
            [
                [a["model"], a["variant"], a["action"], a["count_before"], a["count_after"]]
                for a in plan.extra["actions"]
            ],
        )
    s = plan.extra.get("solver", {})
    gap = s.get("gap")
    status = s.get("status")
    label = {"time_limit": "TIME LIMIT: best plan found, not proven optimal"}.get(status, status)
    say(
        f"solver: {s.get('name')} {label}"
        + (f", gap {fmt(float(gap) * 100)} %" if gap is not None else "")
        + (f", {fmt(s.get('total_s'))} s" if s.get("total_s") is not None else "")
        + (f" (within {s['scope']})" if s.get("scope") else ""),
        highlight=False,
    )
    for note in plan.extra.get("notes", []):
        say(f"note: {note}", highlight=False)


def register(app: typer.Typer) -> None:
    plan_app.command("mix")(plan_mix_cmd)

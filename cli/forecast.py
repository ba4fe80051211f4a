"""``greenctl forecast``: fit and query load forecasters (next minute's peak req/s)."""

from __future__ import annotations

from typing import Annotated

import typer
from greenctl.cli.common import (
    DbOpt,
    JsonOpt,
    console,
    input_path_str,
    print_json,
    render_table,
    say,
    store_for,
)
from greenctl.data.limits import optional

forecast_app = typer.Typer(
    no_args_is_help=True,
    help="Load forecasting over a requests-per-second history (a trace file or the store's "
    "measured load): last, moving-max, seasonal-naive, lstm (InfAdapter).",
)

TraceOpt = Annotated[
    str | None,
    typer.Option(
        "--trace",
        help="Requests-per-second trace (whitespace numbers, .gz ok, or CSV with rate_rps), "
        "or bundled:NAME; default: the store's measured load.",
        parser=input_path_str,
        metavar="FILE",
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Only the store's load of this model family.")
]


@forecast_app.command("fit")
def forecast_fit(
    forecaster: Annotated[
        str,
        typer.Option("--forecaster", "-f", help="last | moving-max | seasonal-naive | lstm"),
    ] = "lstm",
    name: Annotated[
        str | None, typer.Option("--name", help="Save under this name (default: the kind).")
    ] = None,
    trace: TraceOpt = None,
    model: ModelOpt = None,
    train_days: Annotated[
        float | None,
        typer.Option(
            "--train-days",
            help="Train on the first D days, score on the rest (default: first 80 %).",
        ),
    ] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="LSTM epochs (default 8).")] = None,
    window: Annotated[
        int | None, typer.Option("--window", help="LSTM / moving-max window in minutes.")
    ] = None,
    quantile: Annotated[
        float | None,
        typer.Option(
            "--quantile",
            help="LSTM: train for this quantile (pinball loss), e.g. 0.9 to under-predict less.",
        ),
    ] = None,
    period: Annotated[
        int | None, typer.Option("--period", help="seasonal-naive period in minutes.")
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Fit a forecaster, score it on held-out minutes and save it in the store."""
    from greenctl.executor.control import forecasters  # numpy: not for `--help`

    train_days = optional(train_days, "--train-days", "days")
    params = {"epochs": epochs, "window": window, "quantile": quantile, "period": period}
    with store_for(db) as store:
        if forecaster == "lstm" and not json_out:
            with console.status("training the LSTM (torch, CPU) ..."):
                out = forecasters.fit_forecaster(
                    store,
                    kind=forecaster,
                    name=name,
                    trace=trace,
                    model=model,
                    train_days=train_days,
                    params=params,
                )
        else:
            out = forecasters.fit_forecaster(
                store,
                kind=forecaster,
                name=name,
                trace=trace,
                model=model,
                train_days=train_days,
                params=params,
            )
    if json_out:
        print_json(out)
        return
    m = out["metrics"]
    say(
        f"Saved forecaster '{out['name']}' ({out['kind']}) trained on {out['trained_on']} "
        f"({out['train_minutes']} minutes)."
    )
    if m:
        render_table(
            f"Held-out score ({out['test_minutes']} minutes, per-minute peaks)",
            ["MAE req/s", "MAPE %", "under-predicted %", "mean shortfall req/s"],
            [[m["mae_rps"], m["mape_pct"], m["under_rate"] * 100, m["mean_under_rps"]]],
        )


@forecast_app.command("predict")
def forecast_predict(
    forecaster: Annotated[
        str,
        typer.Option(
            "--forecaster",
            "-f",
            help="A saved forecaster's name, or last | moving-max | seasonal-naive.",
        ),
    ] = "last",
    trace: TraceOpt = None,
    model: ModelOpt = None,
    upto_minute: Annotated[
        int | None,
        typer.Option("--upto-minute", help="Use only the first N minutes of the history."),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Predict the next minute's peak request rate."""
    from greenctl.executor.control import forecasters  # numpy: not for `--help`

    with store_for(db) as store:
        out = forecasters.predict_load(
            store, forecaster=forecaster, trace=trace, model=model, upto_minute=upto_minute
        )
    if json_out:
        print_json(out)
        return
    say(
        f"{out['forecaster']}: next minute's peak {out['predicted_peak_rps']:.1f} req/s "
        f"(last minute {out['last_peak_rps']:.1f}; {out['history_minutes']} minutes of "
        f"{out['source']})"
    )


@forecast_app.command("list")
def forecast_list(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """List saved forecasters with their held-out scores."""
    from greenctl.executor.control import forecasters  # numpy: not for `--help`

    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        rows = forecasters.list_forecasters(store)
    if json_out:
        print_json(rows)
        return
    render_table(
        "Forecasters",
        ["name", "kind", "trained on", "MAE req/s", "under %", "created_at"],
        [
            [
                r["name"],
                r["kind"],
                r["trained_on"],
                r["metrics"].get("mae_rps"),
                (r["metrics"].get("under_rate") or 0) * 100 if r["metrics"] else None,
                r["created_at"],
            ]
            for r in rows
        ],
    )


@forecast_app.command("sample")
def forecast_sample(
    url: Annotated[
        str | None,
        typer.Option("--url", help="Dispatcher base URL (default: the one this store runs)."),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Record the dispatcher's arrival rate since the last sample into the load history
    (run it from cron; `replan --forecaster` does it on every run too)."""
    from greenctl.executor.control import history  # numpy: not for `--help`

    with store_for(db) as store:
        samples = history.sample_dispatcher_load(store, url=url)
    if json_out:
        print_json(samples)
        return
    if not samples:
        console.print("no sample recorded (first reading, or no dispatcher answering)")
    for s in samples:
        say(
            f"{s['model'] or '(all)'}: {s['rate_rps']:.2f} req/s over {s['interval_s']:.0f} s "
            f"from {s['time']}",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.add_typer(forecast_app, name="forecast")

"""Load forecasters: fit one on the store's load history (or a trace), look them up, and
predict the next peak with one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from greenctl.data import loop_state
from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.records import utcnow_iso
from greenctl.data.store import Store
from greenctl.data.traces import read_rps_trace
from greenctl.executor.control.history import load_history_minutes
from greenctl.planner.core import forecast as fc


def _history(store: Store, *, trace: str | None, model: str | None) -> tuple[Any, str]:

    if trace:
        return fc.minute_maxima(read_rps_trace(trace)), f"trace:{Path(trace).name}"
    minutes = load_history_minutes(store, model=model)
    if minutes.size == 0:
        raise InputError(
            "the store holds no measured load" + (f" for model '{model}'" if model else ""),
            hint="pass --trace FILE (requests per second), or run load through `greenctl apply`",
        )
    return minutes, "store" + (f":{model}" if model else "")


def fit_forecaster(
    store: Store,
    *,
    kind: str = "lstm",
    name: str | None = None,
    trace: str | None = None,
    model: str | None = None,
    train_days: float | None = None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit a forecaster on a trace or the store's load, score it on the rest, save it.

    With ``train_days`` the first days train and the remainder is scored; otherwise the
    first 80 % trains and the last 20 % is scored.

    Returns:
        ``{"name", "kind", "trained_on", "train_minutes", "test_minutes", "metrics"}``.
    """
    if name is not None and not name.strip():
        raise InputError("--name is empty", hint="name the forecaster, or leave --name out")
    minutes, source = _history(store, trace=trace, model=model)
    f = fc.make_forecaster(kind, **(params or {}))
    n = minutes.size
    train = int(train_days * 1440) if train_days else max(int(n * 0.8), 1)
    if train_days and not 1 <= train < n:
        raise InputError(
            f"--train-days {train_days:g} leaves no test minutes ({n} minutes of history)"
        )
    train = min(train, n)
    f.fit(minutes[:train])
    metrics = fc.evaluate(f, minutes, train=train).to_dict() if train < n else {}
    name = name or kind
    p, state = f.to_state()
    with store.transaction():
        loop_state.save_forecaster(
            store,
            {
                "name": name,
                "kind": kind,
                "params": json.dumps(p),
                "state": state,
                "trained_on": source,
                "metrics": json.dumps(metrics),
                "created_at": utcnow_iso(),
            },
        )
    return {
        "name": name,
        "kind": kind,
        "trained_on": source,
        "train_minutes": train,
        "test_minutes": n - train,
        "metrics": metrics,
    }


def get_forecaster(store: Store, name: str) -> Any:
    """A saved forecaster by name; the rule-based kinds work unsaved under their own name.

    Raises:
        NotFoundError: neither a saved forecaster nor a rule-based kind.
    """
    r = loop_state.forecaster_row(store, name)
    if r is not None:
        return fc.restore_forecaster(r["kind"], json.loads(r["params"]), r["state"])
    if name in ("last", "moving-max", "seasonal-naive"):
        return fc.make_forecaster(name)
    known = [r["name"] for r in loop_state.forecaster_rows(store)]
    raise NotFoundError(
        f"no forecaster named '{name}'",
        hint=(f"saved: {', '.join(known)}; " if known else "")
        + "fit one with `greenctl forecast fit`, or use last, moving-max, seasonal-naive",
    )


def list_forecasters(store: Store) -> list[dict[str, Any]]:
    """Saved forecasters (without their binary state)."""
    out = []
    for r in loop_state.forecaster_rows(store):
        out.append(
            {
                "name": r["name"],
                "kind": r["kind"],
                "trained_on": r["trained_on"],
                "created_at": r["created_at"],
                "params": json.loads(r["params"]),
                "metrics": json.loads(r["metrics"] or "{}"),
            }
        )
    return out


def predict_load(
    store: Store,
    *,
    forecaster: str = "last",
    trace: str | None = None,
    model: str | None = None,
    upto_minute: int | None = None,
) -> dict[str, Any]:
    """Predict the next minute's peak request rate after the history (or its first
    ``upto_minute`` minutes).

    Returns:
        ``{"forecaster", "source", "history_minutes", "last_peak_rps", "predicted_peak_rps"}``.
    """
    minutes, source = _history(store, trace=trace, model=model)
    if upto_minute is not None:
        if not 1 <= upto_minute <= minutes.size:
            raise InputError(f"--upto-minute must be between 1 and {minutes.size}")
        minutes = minutes[:upto_minute]
    f = get_forecaster(store, forecaster)
    return {
        "forecaster": forecaster,
        "kind": f.name,
        "source": source,
        "history_minutes": int(minutes.size),
        "last_peak_rps": float(minutes[-1]),
        "predicted_peak_rps": float(f.predict_next(minutes)),
    }

"""``apply --verify``: load the running plan at its predicted rate and record the measured
numbers beside its predictions (``store.add_run(kind="verify")``)."""

from __future__ import annotations

from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.data.records import utcnow_iso
from greenctl.data.store import Store
from greenctl.executor.runtime.energy import energy_delta, energy_snapshot
from greenctl.executor.runtime.loadgen import client_lag_note, latency_breakdown, run_load
from greenctl.planner.core.simulator import served_model_slos


def verify_plan(
    plan: Plan,
    *,
    store: Store,
    endpoint: str,
    duration_s: float = 10.0,
    rate_rps: float | None = None,
) -> dict[str, Any]:
    """Load the running plan at its predicted rate and record measured vs predicted numbers.

    Raises:
        InputError: the plan predicts no rate and none is given.
    """
    started_at = utcnow_iso()
    total, per_model = _model_rates(plan, rate_rps)
    slos = served_model_slos(plan)  # a glet plan: each model held to its own SLO
    late = 0
    lat: list[float] = []
    server: list[tuple[float, float, float]] = []
    agg = {"sent": 0, "ok": 0, "errors": 0, "rejected_503": 0}
    details = {}
    energy_before = energy_snapshot(store)  # the executors' energy counters
    for i, (model, rate) in enumerate(sorted(per_model.items())):
        res = run_load(endpoint, model, duration_s=duration_s, rate_rps=rate, seed=i)
        lat += res.latencies_ms
        server += zip(res.server_queue_ms, res.server_infer_ms, res.server_batch_rows, strict=True)
        for k in agg:
            agg[k] += getattr(res, k)
        details[model] = res.to_dict()
        if model in slos:  # late, failed or refused requests miss the SLO
            miss = sum(x > slos[model] for x in res.latencies_ms) + res.sent - res.ok
            late += miss
            details[model].update(slo_ms=slos[model], slo_violation_frac=miss / max(res.sent, 1))
    measured = _measured(lat, server, agg, duration_s, offered_rps=total)
    measured["models"] = details
    if slos:
        measured["slo_violation_frac"] = late / max(agg["sent"], 1)
    energy = energy_delta(energy_before, energy_snapshot(store))
    if energy is not None:
        measured["energy"] = energy
    lags = [r["client_lag_p95_ms"] for r in details.values() if r.get("client_lag_p95_ms")]
    measured["client_lag_p95_ms"] = max(lags) if lags else None
    note = client_lag_note(measured["client_lag_p95_ms"], measured["p95_ms"])
    if note:
        measured["note"] = note
    run_id = store.add_run(
        plan.id, kind="verify", predicted=plan.predicted, measured=measured, started_at=started_at
    )
    pred_p95 = plan.predicted.get("p95_ms")
    ratio = None
    if isinstance(pred_p95, int | float) and pred_p95 > 0 and measured["p95_ms"] is not None:
        ratio = measured["p95_ms"] / pred_p95
    return {"run_id": run_id, "predicted": plan.predicted, "measured": measured, "p95_ratio": ratio}


def _model_rates(plan: Plan, rate_rps: float | None) -> tuple[float, dict[str, float]]:
    """The total load, ``rate_rps`` (else the plan's predicted rate, else its quotas' sum),
    and each model's share of it, in proportion to the models' quotas."""
    models: dict[str, float] = {}
    for d in plan.deployments:
        models[d.model] = models.get(d.model, 0.0) + float(d.quota_rps or 0.0)
    total = rate_rps or float(plan.predicted.get("rate_rps") or 0.0) or sum(models.values())
    if total <= 0:
        raise InputError(
            "cannot verify: the plan predicts no rate", hint="pass a verification rate"
        )
    quota_sum = sum(models.values())
    return total, {
        m: (total * q / quota_sum if quota_sum > 0 else total / len(models))
        for m, q in models.items()
    }


def _measured(
    lat: list[float],
    server: list[tuple[float, float, float]],
    agg: dict[str, int],
    duration_s: float,
    *,
    offered_rps: float,
) -> dict[str, Any]:
    """The measured rate, latency percentiles and breakdown of a verification load."""
    import numpy as np

    arr = np.asarray(lat) if lat else None
    return {
        "rate_rps": round(agg["ok"] / duration_s, 3),
        "offered_rps": round(offered_rps, 3),
        "p50_ms": None if arr is None else float(np.percentile(arr, 50)),
        "p95_ms": None if arr is None else float(np.percentile(arr, 95)),
        "p99_ms": None if arr is None else float(np.percentile(arr, 99)),
        "errors": agg["errors"],
        "rejected_503": agg["rejected_503"],
        "sent": agg["sent"],
        "duration_s": duration_s,
        # where the time went: the executors' batch queue, the batch run, the rest
        "breakdown": latency_breakdown(lat, server),
    }

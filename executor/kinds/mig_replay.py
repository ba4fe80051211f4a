"""The replay step of a mig plan: the serving replay every single-family serving kind shares
(:mod:`greenctl.executor.kinds.serving_replay`), with Clover's own baselines and its SLA held.

The SLA stays what the first plan met for every replan (``replan`` would derive it again);
a MIG layout change's own time (destroying and creating GPU instances) is not modeled.
``base`` and ``co2opt`` are Clover's BASE and CO2OPT as ``plan mig --baseline`` makes them,
sized for the window's peak; the baselines that size CPU pods and variant mixes (mix's) are
left out with a note.
"""

from __future__ import annotations

from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.data.plan import Plan
from greenctl.executor.kinds.base import get_kind
from greenctl.executor.kinds.replaying import ReplayStep
from greenctl.executor.kinds.serving_replay import (
    DEFAULT_BASELINES,
    STATIC_BASELINES,
    Serving,
    ServingRun,
    replay_serving,
)

#: Clover's baselines: the static ones
BASELINES = STATIC_BASELINES


def hold_sla(first: Plan, request: dict[str, Any], notes: list[str]) -> None:
    """Hold the SLA the first plan met for every replan."""
    sla = first.request.get("sla_ms") or first.predicted.get("sla_ms")
    first.request["sla_ms"] = request["sla_ms"] = sla
    notes.append(
        f"mig: SLA p95 {sla:.1f} ms held for every replan; a MIG layout change's own "
        "time (destroying and creating GPU instances) is not modeled"
    )


def clover_static(run: ServingRun, name: str) -> Plan | None:
    """Clover's BASE or CO2OPT for the peak, as ``plan mig --baseline`` makes it; None (and
    a note) when it cannot carry the peak."""
    req = {**run.first.request, "rate_rps": run.peak, "carbon_intensity": run.carbon}
    plan = get_kind(run.inputs.kind).plan
    assert plan is not None
    try:
        return plan(run.store, req, baseline=name)[0]
    except InfeasiblePlan as exc:
        run.loop.notes.append(f"{name}: left out, it cannot carry the peak ({exc.message})")
        return None


MIG = Serving(hold=hold_sla, static=clover_static, percentile=lambda request: "p95")
#: mig's replay step (its defaults are the serving kinds': vpa is left out with a note)
STEP = ReplayStep(
    run=lambda store, inputs, loop: replay_serving(store, inputs, loop, MIG),
    baselines=BASELINES,
    default_baselines=DEFAULT_BASELINES,
)

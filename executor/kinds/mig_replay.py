"""The replay step of a mig plan: mix's replay of a single-family serving plan
(:mod:`greenctl.executor.kinds.mix_replay`), with Clover's own baselines and its SLA held.

The SLA stays what the first plan met for every replan (``replan`` would derive it again);
a MIG layout change's own time (destroying and creating GPU instances) is not modeled.
``base`` and ``co2opt`` are Clover's BASE and CO2OPT as ``plan mig --baseline`` makes them,
sized for the window's peak; mix's other baselines size CPU pods and variant mixes, and are
left out with a note.
"""

from __future__ import annotations

from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.data.plan import Plan
from greenctl.executor.kinds.base import get_kind
from greenctl.executor.kinds.mix_replay import DEFAULT_BASELINES, Serving, replay_serving
from greenctl.executor.kinds.replaying import ReplayStep

#: Clover's baselines
BASELINES = ("base", "co2opt")


def hold_sla(first: Plan, request: dict[str, Any], notes: list[str]) -> None:
    """Hold the SLA the first plan met for every replan."""
    sla = first.request.get("sla_ms") or first.predicted.get("sla_ms")
    first.request["sla_ms"] = request["sla_ms"] = sla
    notes.append(
        f"mig: SLA p95 {sla:.1f} ms held for every replan; a MIG layout change's own "
        "time (destroying and creating GPU instances) is not modeled"
    )


def clover_static(
    store: Any,
    kind: str,
    first: Plan,
    request: dict[str, Any],
    name: str,
    peak: float,
    carbon: float,
    notes: list[str],
) -> Plan | None:
    """Clover's BASE or CO2OPT for the peak, as ``plan mig --baseline`` makes it; None (and
    a note) when it cannot carry the peak."""
    req = {**first.request, "rate_rps": peak, "carbon_intensity": carbon}
    plan = get_kind(kind).plan
    assert plan is not None
    try:
        return plan(store, req, baseline=name)[0]
    except InfeasiblePlan as exc:
        notes.append(f"{name}: left out, it cannot carry the peak ({exc.message})")
        return None


MIG = Serving(hold=hold_sla, static=clover_static, percentile=lambda request: "p95")
#: mig's replay step (its defaults are mix's: vpa is left out with a note)
STEP = ReplayStep(
    run=lambda store, inputs, loop: replay_serving(store, inputs, loop, MIG),
    baselines=BASELINES,
    default_baselines=DEFAULT_BASELINES,
)

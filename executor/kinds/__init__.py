"""The registry of plan kinds: everything a command or a loop needs to know about one kind.

Each kind (:class:`PlanKind`) says in one place how its problem is planned, scored and
replanned, which objective it optimised, its default dispatch policy, how ``simulate``
predicts it and how its plans become executor instances. A kind's request is the plain dict
its plan records, validated by its typed request; :func:`plan` is the one way a plan is built
(commands, ``replan`` and the demo alike). Adding a kind is a planner module and one entry
point in the ``greenctl.kinds`` group (or :func:`register`). Geo plans route load across sites
instead of describing instances (``serves=False``); commands that need instances refuse them
with :meth:`PlanKind.refuse`. :mod:`~greenctl.executor.kinds.base` holds the record and the
registry (:data:`KINDS`, :func:`get_kind`, :func:`load_kinds`); one module per built-in kind
holds its adapters. Callers import from here. See docs/architecture.md.
"""

from __future__ import annotations

from greenctl.executor.kinds.base import (
    BUILTIN,
    KINDS,
    Objective,
    PlanKind,
    Planned,
    ReplanRequest,
    ReplanSignal,
    forecast_rates,
    get_kind,
    load_kinds,
    plan_inputs,
    plan_rates,
    predict_serving,
    predicted_objective,
    read_request,
    register,
    replan_model_rate,
    unregister,
)
from greenctl.executor.kinds.geo import geo_inputs
from greenctl.executor.kinds.glet import GLET_MIN_RATE_RPS, GLET_REPLAN_HEADROOM
from greenctl.executor.kinds.planning import plan, plan_carbon, plan_problem

__all__ = [
    "BUILTIN",
    "GLET_MIN_RATE_RPS",
    "GLET_REPLAN_HEADROOM",
    "KINDS",
    "Objective",
    "PlanKind",
    "Planned",
    "ReplanRequest",
    "ReplanSignal",
    "forecast_rates",
    "geo_inputs",
    "get_kind",
    "load_kinds",
    "plan",
    "plan_carbon",
    "plan_inputs",
    "plan_problem",
    "plan_rates",
    "predict_serving",
    "predicted_objective",
    "read_request",
    "register",
    "replan_model_rate",
    "unregister",
]

load_kinds()  # the installed kinds, built-in ones included (entry-point group greenctl.kinds)

"""The registry of plan kinds: everything a command or a loop needs to know about one kind.

Each kind (:class:`PlanKind`) says in one place

- ``plan``: how its problem is built from the store and a request, and solved;
- ``score``: how a running plan of the kind is scored in a new problem (``replan``);
- ``replan_request``: how a running plan's request is rewritten for a new carbon signal and
  load forecast (``replan``): which of its rates a forecast sets, and what it leaves alone;
- ``objective``: which figure of its plans the solver optimised, and in which direction;
- ``default_policy``: its default dispatch policy, handed to the one rule in
  :mod:`greenctl.planner.core.policy` (:meth:`PlanKind.dispatch_policy`);
- ``predict``: how ``simulate`` predicts its plans under a load;
- ``instances``: how its plan becomes executor instances (``apply``), ``time_shared``
  when several models of its plans share one partition, and ``serves`` whether its plans
  describe instances at all.

A kind's request is the plain dict its plan document records in ``request``: everything
needed to plan it again, validated by its typed request (``request_type``). ``greenctl plan
mix|mig|glet|geo`` parse their options into such a request and call :func:`plan` (the library
twin: the carbon intensity resolved and recorded, then the kind's ``plan``), and ``replan``
and the demo plan the running plan's request the same way, so a plan is built one way
whoever builds it. ``simulate``,
``apply`` (local, Ray), the Kubernetes export and ``replan`` ask the registry for the rest,
so adding a kind is a planner module and one entry point in the ``greenctl.kinds`` group
(or a :func:`register` call at run time); with no command of its own, its plans are made
through ``get_kind(name).plan``.

A geo plan allocates load across sites, not instances (``serves=False``): ``simulate``,
the backends' ``apply``, Ray, the Kubernetes export and ``replan --apply`` refuse it with
:meth:`PlanKind.refuse`. It is routed instead: ``apply --site`` starts the geo router
(:mod:`greenctl.executor.deploy.georouter`), whose fractions come from this registry's ``plan``
entry, as do ``replan``'s of a routed plan and ``export envoy``'s.

The package is laid out as the registry is: :mod:`~greenctl.executor.kinds.base` holds the
record, the registry (:data:`KINDS`, :func:`get_kind`, :func:`register`, :func:`load_kinds`)
and the helpers every kind shares; one module per built-in kind
(:mod:`~greenctl.executor.kinds.mix`, :mod:`~greenctl.executor.kinds.mig`,
:mod:`~greenctl.executor.kinds.glet`, :mod:`~greenctl.executor.kinds.geo`) holds its adapters
and its record (``KIND``), installed under the ``greenctl.kinds`` entry-point group as a third
party's kind is; this module loads the group. Callers import from here.
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
    "register",
    "replan_model_rate",
    "unregister",
]

load_kinds()  # the installed kinds, built-in ones included (entry-point group greenctl.kinds)

"""Dispatch policies: the one list, the one rule that picks a plan's, and smooth WRR.

Every consumer of a plan (``predict``, ``simulate``, ``plan mix``, ``apply``'s dispatcher,
the Ray backend, the Kubernetes export) asks :func:`plan_policy` (before a plan exists,
:func:`default_policy`), so a plan is predicted under the policy it is served with.
The rule, first match wins: an explicit ``--policy``; the plan's own ``policy`` (else
``request.policy``); ``batch`` when any deployment has ``batch > 1`` (only that model
predicts batching); the plan kind's default (``kind_default``, or the kinds registry via
:func:`use_kind_defaults`); else ``wrr``. :class:`SmoothWRR` is the stride-scheduled
weighted round robin the simulator, local dispatcher and Ray router share: its split is
proportional to within a request, the even spread ``predict`` assumes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InputError

if TYPE_CHECKING:
    from greenctl.data.plan import Plan

#: The dispatch policies, in the order help texts list them.
POLICIES = ("fifo", "wrr", "batch")

#: kind -> its default policy (rule 4), as the registry of plan kinds declares it; the
#: registry installs it (:func:`use_kind_defaults`), as the planner may not import it
_kind_defaults: Callable[[str], str | None] | None = None

_HINT = f"use one of {', '.join(POLICIES)}"


def check_policy_name(policy: object, *, field: str = "policy") -> str:
    """The policy, checked against :data:`POLICIES`.

    Raises:
        InputError: not one of them; the message names ``field``.
    """
    if not isinstance(policy, str) or policy not in POLICIES:
        shown = f"'{policy}'" if isinstance(policy, str) else repr(policy)
        raise InputError(f"unknown policy {shown} in {field}", hint=_HINT)
    return policy


def use_kind_defaults(defaults: Callable[[str], str | None]) -> None:
    """Answer rule 4 with ``defaults(kind)``: the registry of plan kinds calls this once."""
    global _kind_defaults
    _kind_defaults = defaults


def default_policy(kind: str, batches: Iterable[int], *, kind_default: str | None = None) -> str:
    """The policy a plan of ``kind`` with deployments of ``batches`` gets by default
    (``kind_default``: the kind's own, rule 4; else the registry's answer)."""
    if any(b > 1 for b in batches):
        return "batch"
    if kind_default is None and _kind_defaults is not None:
        kind_default = _kind_defaults(kind)
    if kind_default is not None:
        return check_policy_name(kind_default, field=f"the {kind} kind's default policy")
    return "wrr"


def plan_policy(plan: Plan, override: str | None = None, *, kind_default: str | None = None) -> str:
    """The dispatch policy a plan is predicted, simulated and served with (module docstring).

    Args:
        plan: the plan document.
        override: an explicit choice (``--policy``); wins over the plan's own.
        kind_default: the plan kind's default (rule 4), as its registry entry declares it.

    Raises:
        InputError: a choice that is not one of :data:`POLICIES`.
    """
    extra = plan.extra if isinstance(plan.extra, dict) else {}
    request = plan.request if isinstance(plan.request, dict) else {}
    chosen: tuple[tuple[Any, str], ...] = (
        (override, "--policy"),
        (extra.get("policy"), "the plan's 'policy'"),
        (request.get("policy"), "the plan's 'request.policy'"),
    )
    for value, field in chosen:
        if value is not None and value != "":
            return check_policy_name(value, field=field)
    return default_policy(plan.kind, (d.batch for d in plan.deployments), kind_default=kind_default)


class SmoothWRR:
    """Smooth weighted round robin (stride scheduling) over ``len(weights)`` servers.

    :meth:`pick` takes one server, optionally among some of them only (the dispatcher skips
    instances that are down or just failed a request); :meth:`take` takes ``n`` in a row.
    A server left out for a while resumes at the current virtual time instead of catching
    up with a burst.

    Raises:
        InputError: a negative weight, or weights that sum to zero.
    """

    def __init__(self, weights: Sequence[float]) -> None:
        w = [float(x) for x in weights]
        if any(not (x >= 0 and math.isfinite(x)) for x in w) or (w and not math.fsum(w) > 0):
            raise InputError("dispatch shares must be >= 0 with a positive sum")
        top = max(w, default=1.0)
        self._share = [x / top for x in w]  # relative to the largest: no overflow to inf
        self._count = [0] * len(w)
        self._base = [0.0] * len(w)  # moved forward when a server resumes after a gap
        self._now = 0.0
        self._heap = [(0.5 / p, i) for i, p in enumerate(self._share) if p > 0]
        heapq.heapify(self._heap)

    def _next_time(self, i: int) -> float:
        return self._base[i] + (self._count[i] + 0.5) / self._share[i]

    def pick(self, among: Collection[int] | None = None) -> int | None:
        """The next server (its index), among ``among`` when given; None when none can."""
        skipped = []
        found: int | None = None
        while self._heap:
            t, i = heapq.heappop(self._heap)
            if among is None or i in among:
                if t < self._now:  # left out for a while: resume now, no burst
                    self._base[i] += self._now - t
                found = i
                break
            skipped.append((t, i))
        if found is not None:
            self._now = max(self._now, self._next_time(found))
            self._count[found] += 1
            heapq.heappush(self._heap, (self._next_time(found), found))
        for item in skipped:
            heapq.heappush(self._heap, item)
        return found

    def take(self, n: int) -> list[int]:
        """The next ``n`` servers."""
        out = []
        for _ in range(n):
            i = self.pick()
            if i is None:
                raise InputError("dispatch shares must be >= 0 with a positive sum")
            out.append(i)
        return out

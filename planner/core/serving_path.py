"""A serving path's measured overhead (client, dispatcher, executor hops) and the serial CPU
stages it crosses: which path a variant's requests take, the executor front's CPU, and the
plan's dispatcher stage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from greenctl.data.errors import InputError
from greenctl.data.resources import kind_of
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.queueing import (
    WaitTime,
    front_capacity_rps,
    front_wait,
    stage_wait,
    with_stage_wait,
)


@dataclass(frozen=True)
class ServingPath:
    """The measured serving path of a model (``greenctl profile serving``).

    Attributes:
        overhead_ms: equiprobable samples of latency outside the model, added to every request.
        executor_cpu_ms: executor CPU per request (shares a CPU instance's cores; an
            accelerator's serial front, :func:`front_cpu_ms`).
        service_scale, tail_scale: served over back-to-back run time at the median and at
            p95/p99 (``None``: not measured; cold runs are then modeled).
        resource: where it was measured when not a CPU core; it then applies there only.
        dispatcher_cpu_ms: dispatcher CPU per request (``None``: no dispatcher stage).
        rate_rps: the load the samples were measured at (``None``: an idle dispatcher).
    """

    overhead_ms: tuple[float, ...]
    executor_cpu_ms: float = 0.0
    service_scale: float | None = None
    tail_scale: tuple[float, float] | None = None
    resource: str | None = None
    dispatcher_cpu_ms: float | None = None
    rate_rps: float | None = None


ServingInput = Mapping[str, "ServingPath | Sequence[float]"] | ServingPath | Sequence[float]


def as_path(value: ServingPath | Sequence[float] | None) -> ServingPath | None:
    if value is None or isinstance(value, ServingPath):
        return value
    return ServingPath(tuple(float(x) for x in value)) if len(value) else None


def serving_path(
    serving: ServingInput | None,
    model: str,
    variant: str | None = None,
    resource: str | None = None,
) -> ServingPath | None:
    """The serving path whose overhead :func:`~greenctl.planner.core.evaluate.predict` adds to
    the requests of ``variant`` of ``model`` on ``resource`` (what a model-less offer carries,
    :func:`greenctl.executor.runtime.offers.instance_offers`): measured on its own resource
    (``variant@resource``), else its own entry, else its model's, else ``"*"``."""
    if serving is None or isinstance(serving, ServingPath):
        return serving
    if isinstance(serving, Mapping):
        on = f"{variant}@{resource}" if variant and resource else None
        for key in (on, variant, model, "*"):
            if key is not None and serving.get(key) is not None:
                return as_path(serving[key])
        return None
    return as_path(serving)


def path_serves(path: ServingPath, resource: str) -> bool:
    """Whether ``path``'s served run (and executor CPU) holds on ``resource``: a path
    measured on a CPU core for CPU instances, one measured on a GPU, MIG or MPS resource for
    instances on that very resource."""
    if path.resource is not None:
        return path.resource == resource
    return kind_of(resource).pins_cores


def front_cpu_ms(path: ServingPath | Sequence[float] | None, resource: str) -> float:
    """The executor front (ms of one core per request) of an instance on ``resource``.

    An accelerator instance (GPU, MIG, MPS) is fed by one executor event loop that decodes and
    encodes each request one at a time, so its capacity is at most ``1000 / front`` req/s and
    its requests wait for the front (:func:`~greenctl.planner.core.queueing.with_front`). The
    figure is the path's ``executor_cpu_ms`` when measured on that very resource (the most the
    front can be); 0 for CPU instances, whose executor CPU shares their cores
    (:func:`served_service`), and where no executor CPU was measured on the resource.
    """
    if not isinstance(path, ServingPath) or path.resource is None:
        return 0.0
    if not path_serves(path, resource):
        return 0.0
    if not kind_of(resource).accelerator:
        return 0.0
    cpu = float(path.executor_cpu_ms or 0.0)
    return cpu if math.isfinite(cpu) and cpu > 0 else 0.0


def front_held_wait(
    path: ServingPath | Sequence[float] | None, front_ms: float, rate_rps: float
) -> WaitTime | None:
    """The executor-front wait that ``path``'s overhead samples hold: they were measured
    through that front (``profile serving --resource``, one executor) at ``path.rate_rps``,
    so they hold its wait at that rate (:func:`~greenctl.planner.core.queueing.with_front`
    adds only its growth to ``rate_rps``, the instance's rate); the wait at ``rate_rps``
    where the measured rate was past the front's capacity (the samples hold more: nothing
    is added); None without a front or a measured rate (nothing is taken as held)."""
    measured = path.rate_rps if isinstance(path, ServingPath) else None
    if front_ms <= 0 or measured is None or measured <= 0:
        return None
    then = front_wait(float(measured), front_ms)
    return front_wait(rate_rps, front_ms) if then is None else then


def dispatcher_cpu_ms(path: ServingPath | Sequence[float] | None) -> float | None:
    """The dispatcher's CPU (ms) per request measured with ``path``; None when not measured
    (bare overhead samples, a direct path, a figure that is not a number > 0)."""
    if not isinstance(path, ServingPath) or path.dispatcher_cpu_ms is None:
        return None
    cpu = float(path.dispatcher_cpu_ms)
    return cpu if math.isfinite(cpu) and cpu > 0 else None


@dataclass(frozen=True)
class DispatcherStage:
    """The dispatcher as a serial stage: one event loop on one core that every request of a
    plan crosses before its executor (:mod:`greenctl.executor.runtime.dispatcher`), whatever model
    it is for (module docstring of :mod:`~greenctl.planner.core.queueing`, "The dispatcher").

    Attributes:
        rate_rps: the plan's total rate, every model's requests.
        cpu_ms: ``(rate share, CPU ms per request)`` by model: each model's measured
            :attr:`ServingPath.dispatcher_cpu_ms`; a model whose paths have none is charged
            the measured models' rate-weighted mean (the stage is one process: its requests
            cannot pass it uncharged).
        unmeasured: the models charged that mean.
    """

    rate_rps: float
    cpu_ms: tuple[tuple[float, float], ...]
    unmeasured: tuple[str, ...] = ()

    @property
    def mean_cpu_ms(self) -> float:
        """The CPU (ms) the dispatcher spends on the plan's average request."""
        total = sum(w for w, _ in self.cpu_ms)
        return sum(w * f for w, f in self.cpu_ms) / total

    @property
    def capacity_rps(self) -> float:
        """The most requests per second the dispatcher carries for the whole plan
        (:func:`~greenctl.planner.core.queueing.front_capacity_rps` of the mean)."""
        return front_capacity_rps(self.mean_cpu_ms)

    @property
    def utilisation(self) -> float:
        """The share of its core the dispatcher is busy at the plan's rate (>= 1: overloaded)."""
        return self.rate_rps / self.capacity_rps

    @property
    def overloaded(self) -> bool:
        """Whether the plan's rate reaches what the dispatcher can carry (its queue has no
        steady state: :meth:`wait` is None)."""
        return self.wait() is None

    def wait(self) -> WaitTime | None:
        """A request's wait at the dispatcher at the plan's rate (None: overloaded)."""
        return stage_wait(self.rate_rps, self.cpu_ms)

    def held_wait(self, path: ServingPath | None) -> WaitTime | None:
        """The dispatcher wait ``path``'s overhead samples hold (they were measured through
        it): its wait at ``path.rate_rps`` with ``path``'s own CPU figure; the wait at the
        plan's rate where that rate was past its capacity (the samples hold more: nothing is
        added); None without a rate or a figure (nothing is taken as held)."""
        own = dispatcher_cpu_ms(path)
        if own is None or path is None or not path.rate_rps or path.rate_rps <= 0:
            return None
        then = stage_wait(float(path.rate_rps), ((1.0, own),))
        return self.wait() if then is None else then

    def overhead_ms(self, path: ServingPath | None) -> tuple[float, ...]:
        """The overhead samples of a request served through ``path`` with the dispatcher's
        wait at the plan's rate: the path's samples (or 0 ms without a path) plus how much
        longer a request waits there than when the path was measured
        (:func:`~greenctl.planner.core.queueing.with_stage_wait` of :meth:`held_wait`).

        Raises:
            InputError: the dispatcher is overloaded (:attr:`overloaded`).
        """
        now = self.wait()
        if now is None:
            raise InputError(
                f"the dispatcher is overloaded: {self.rate_rps:,.0f} req/s at "
                f"{self.mean_cpu_ms:.3g} ms of CPU per request (at most "
                f"{self.capacity_rps:,.0f} req/s)"
            )
        samples = path.overhead_ms if path is not None and len(path.overhead_ms) else (0.0,)
        return with_stage_wait(samples, now, self.held_wait(path))


def dispatcher_stage(
    model_rates: Mapping[str, float],
    paths: Mapping[str, Sequence[tuple[float, ServingPath | Sequence[float] | None]]],
) -> DispatcherStage | None:
    """The plan's dispatcher stage from each model's rate and the serving paths its requests
    are served through, each with its share of them (``(share, path)``, :func:`serving_path`);
    None when no path of any model has the dispatcher's CPU measured
    (:func:`dispatcher_cpu_ms`): the stage is then not modeled and every figure is as
    without it.

    A model's CPU per request is its measured paths' mean, weighted by their shares (the
    dispatcher forwards a model's requests alike, whichever instance they go to: the figures
    differ by the rate and run they were measured at; equal weights where the shares are 0).
    The models' shares of the stage are their rates (equal shares at no load).
    """
    figures: dict[str, float] = {}
    for m in model_rates:
        got = [(max(float(w), 0.0), dispatcher_cpu_ms(p)) for w, p in paths.get(m, ())]
        measured = [(w, f) for w, f in got if f is not None]
        if not measured:
            continue
        if sum(w for w, _ in measured) <= 0:
            measured = [(1.0, f) for _, f in measured]
        figures[m] = sum(w * f for w, f in measured) / sum(w for w, _ in measured)
    if not figures:
        return None
    rates = {m: max(float(r), 0.0) for m, r in model_rates.items()}
    total = sum(rates.values())
    weight = rates if total > 0 else {m: 1.0 for m in rates}
    seen = sum(weight[m] for m in figures)
    mean = (
        sum(weight[m] * f for m, f in figures.items()) / seen
        if seen > 0
        else sum(figures.values()) / len(figures)
    )
    cpu = tuple((weight[m], figures.get(m, mean)) for m in rates if weight[m] > 0)
    return DispatcherStage(total, cpu, tuple(m for m in rates if m not in figures))


def planned_dispatcher(
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
    model_rates: Mapping[str, float],
    variants: Mapping[str, Iterable[str]],
) -> DispatcherStage | None:
    """The dispatcher stage of a plan still to be made (a planner's, before it knows which
    variants serve): :func:`dispatcher_stage` over every measured path of each model, its own
    entry, its variants' and theirs measured on a resource (``variant@resource``), weighted
    alike, ``variants`` naming each model's. None without a dispatcher figure among them."""
    if not serving:
        return None
    paths: dict[str, list[tuple[float, ServingPath | Sequence[float] | None]]] = {}
    for model in model_rates:
        names = set(variants.get(model, ()))
        paths[model] = [
            (1.0, p)
            for key, p in serving.items()
            if key == model or key in names or key.split("@", 1)[0] in names
        ]
    return dispatcher_stage(model_rates, paths)


def dispatcher_note(stage: DispatcherStage | None) -> str:
    """What a plan's ``latency_includes`` says of the dispatcher stage (a clause that starts
    with ``"; "``): modeled, with its measured CPU, capacity and load, or not modeled."""
    if stage is None:
        return (
            "; the dispatcher's queueing is not modeled (no dispatcher CPU measured: "
            "`greenctl profile serving` measures it on its dispatcher path)"
        )
    note = (
        f"; the dispatcher, a serial stage on one core for all the plan's requests "
        f"({stage.mean_cpu_ms:.2g} ms of CPU per request measured, at most "
        f"{stage.capacity_rps:,.0f} req/s; modeled {100 * stage.utilisation:.0f} % busy at "
        f"{stage.rate_rps:,.0f} req/s"
    )
    if stage.overloaded:
        note += ": overloaded, the plan's rate exceeds what it can carry"
    note += ")"
    if stage.unmeasured:
        note += (
            "; no dispatcher CPU measured for "
            + ", ".join(stage.unmeasured)
            + ": charged the measured models' mean"
        )
    return note


def stretched_service(hot: ServiceTime, path: ServingPath) -> ServiceTime:
    """A back-to-back service time as served: its p50 (and p95, p99 when measured)
    stretched by the path's ratios (:class:`ServingPath`); ``hot`` without a ratio."""
    if path.service_scale is None:
        return hot
    if path.tail_scale is None:
        return hot.scaled(path.service_scale)
    vals = [
        hot.quantile(q) * r
        for q, r in zip((0.5, 0.95, 0.99), (path.service_scale, *path.tail_scale), strict=True)
    ]
    for i in range(1, 3):  # non-decreasing
        vals[i] = max(vals[i], vals[i - 1])
    return ServiceTime.from_percentiles(*vals)

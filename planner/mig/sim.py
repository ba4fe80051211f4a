"""Verify a MIG configuration with the evaluation core's discrete-event simulator.

The configuration's deployments (one per (variant, profile) class, quota = its planned
rate) are simulated with policy ``wrr``, the dispatch the plan declares: stride scheduling
over instances by quota, each instance its own FIFO queue, service times drawn from the
fitted profiles. Poisson arrivals at the plan's rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from greenctl.data.plan import Deployment
from greenctl.planner.core.simulator import simulate

if TYPE_CHECKING:
    from greenctl.planner.mig.model import Config, MigModel


def config_deployments(
    model: MigModel, config: Config, split: tuple[float, ...]
) -> list[Deployment]:
    """The deployments of a configuration (the plan's ``deployments``)."""
    return [
        Deployment(
            model=model.problem.family,
            variant=o.variant,
            resource=f"mig:{o.profile}",
            count=config.n[k],
            batch=1,
            quota_rps=round(split[k], 6),
        )
        for k, o in enumerate(model.pairs)
        if config.n[k] > 0
    ]


def simulate_p95(
    model: MigModel,
    config: Config,
    split: tuple[float, ...],
    *,
    requests: int = 60000,
    seed: int = 0,
    policy: str = "wrr",
) -> float | None:
    """The simulated p95 (ms) of a configuration at its split; None without profiles.

    ``policy="fifo"`` simulates Clover's central FIFO queue over every instance instead
    (quotas ignored, idle-quota instances serve too), for reference.
    """
    records = {
        (o.variant, f"mig:{o.profile}", 1): o.record for o in model.pairs if o.record is not None
    }
    if len(records) != len(model.pairs) or not model.problem.variant_records:
        return None
    deps = config_deployments(model, config, split)
    if policy == "wrr":
        # loaded classes only: instances with no quota receive no requests under wrr
        deps = [d for d in deps if (d.quota_rps or 0) > 0]
    if not deps:
        return None
    out = simulate(
        deps,
        records,  # type: ignore[arg-type]
        model.problem.variant_records,
        rate_rps=model.problem.rate_rps,
        n_requests=requests,
        policy=policy,
        seed=seed,
        percentile_slo_ms=model.sla_ms,
    )
    p95 = out.get("p95_ms")
    return None if p95 is None else float(p95)

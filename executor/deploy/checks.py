"""Whether a plan can run on this machine, checked before ``apply`` changes anything: its
variants can be loaded, its GPUs exist and are the models it was planned for, MPS shares
fit, and a glet plan's executors fit each GPU's memory.
"""

from __future__ import annotations

from greenctl.data.errors import HardwareError, InfeasiblePlan, NotFoundError
from greenctl.data.plan import Plan
from greenctl.data.records import Variant
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.deploy import partition
from greenctl.executor.deploy.actions import DEFAULT_LOADER
from greenctl.executor.deploy.instances import InstanceSpec
from greenctl.planner.glet.memory import check_gpu_memory, gpu_needs
from greenctl.profiler.models import builtin_variant


def resolve_variants(specs: list[InstanceSpec], store: Store, loader: str) -> dict[str, Variant]:
    """The Variant record of every planned variant, handed to its daemons (so they need not
    open the store). With the default loader a variant must be in the store or built in.

    Raises:
        NotFoundError: an unknown variant (default loader only).
    """
    out: dict[str, Variant] = {}
    for s in specs:
        if s.variant in out:
            continue
        try:
            out[s.variant] = store.get_variant(s.variant)
            continue
        except NotFoundError:
            pass
        if loader != DEFAULT_LOADER:
            out[s.variant] = Variant(name=s.variant, family=s.model)
            continue
        try:
            out[s.variant] = builtin_variant(s.variant)
        except (ImportError, NotFoundError):
            raise NotFoundError(
                f"the plan runs variant '{s.variant}', which is neither in the store nor built in",
                hint="profile it (`greenctl profile`) or import it before applying",
            ) from None
    return out


def validate_gpu(specs: list[InstanceSpec], *, time_shared: bool = False) -> None:
    """GPU/MPS resources need a GPU; MPS shares on one GPU must not exceed 100 % (except in
    glet plans, where models time-share one partition and each executor carries its cap).

    Raises:
        HardwareError: a GPU the plan uses is missing here, or is another GPU model.
        InfeasiblePlan: MPS shares on one GPU add up to more than 100 %.
    """
    gpu_specs = [s for s in specs if parse_resource(s.resource).spec.accelerator]
    if not gpu_specs:
        return
    backend = partition.gpu_backend()
    found = {g.index: g for g in backend.gpus()}
    share: dict[int, int] = {}
    for s in gpu_specs:
        r = parse_resource(s.resource)
        gpu = s.mig.gpu if s.mig is not None else s.gpu
        if gpu is not None and gpu not in found:
            raise HardwareError(
                f"the plan uses GPU {gpu} ({s.resource}) but this machine has GPUs "
                f"{sorted(found) or 'none'}",
                hint="see `greenctl hw`",
            )
        if r.spec.size_is_gpu_model and gpu is not None and not same_gpu(r.size, found[gpu].label):
            # its profile, so its predictions, are of another GPU model
            raise HardwareError(
                f"the plan puts {s.variant} on {s.resource}, but GPU {gpu} here is "
                f"gpu:{found[gpu].label}",
                hint="plan for this machine's GPUs (`greenctl hw`), or place the deployment "
                "on a GPU of that model (its `device`)",
            )
        if r.spec.thread_percentage and s.gpu is not None and not time_shared:
            share[s.gpu] = share.get(s.gpu, 0) + (r.mps_percent or 0)
    for gpu, pct in share.items():
        if pct > 100:
            raise InfeasiblePlan(f"MPS shares on GPU {gpu} add up to {pct} % (> 100 %)")


def validate_glet_memory(plan: Plan, *, others_count: bool) -> None:
    """A glet plan's executors on each GPU must fit the GPU's memory (the figures its
    planner recorded against the GPUs here; with ``others_count``, nothing of greenctl's
    running, the memory other processes use now is not available).

    Raises:
        InputError: naming the GPU, its executors and the MiB needed and available.
    """
    needs = gpu_needs(plan.extra.get("gpus"))
    if not any(n.executors for n in needs):
        return
    backend = partition.gpu_backend()
    available: dict[int, tuple[str, float, float]] = {}
    for g in backend.gpus():
        used = 0.0
        if others_count:
            try:
                used = float(backend.memory_used_mb(g.index))
            except HardwareError:
                used = 0.0  # not readable: the total only
        available[g.index] = (g.name, float(g.memory_mb), used)
    check_gpu_memory(plan.extra.get("gpus"), available)


def same_gpu(planned: str, here: str) -> bool:
    """Whether a plan's ``gpu:MODEL`` size names the GPU model here: the same label, or a
    shorter name inside it (``A100`` for ``A100-SXM4-40GB``), ignoring case."""
    a, b = planned.lower(), here.lower()
    return a == b or a in b.split("-") or b.startswith(f"{a}-")

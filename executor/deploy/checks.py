"""Whether a plan can run on this machine, checked before ``apply`` changes anything: the
options it runs with (:func:`check_apply`: the dispatcher's address can be bound, the loader
imports), its variants can be loaded, its GPUs exist and are the models it was planned for,
MPS shares fit, and a glet plan's executors fit each GPU's memory.
"""

from __future__ import annotations

import errno
import socket

from greenctl.data import deployments
from greenctl.data.errors import HardwareError, InfeasiblePlan, InputError, NotFoundError, shown
from greenctl.data.limits import bounded, number
from greenctl.data.plan import Plan
from greenctl.data.records import Variant
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store
from greenctl.executor.deploy import partition
from greenctl.executor.deploy.actions import DEFAULT_LOADER, ApplyOptions
from greenctl.executor.deploy.instances import InstanceSpec
from greenctl.executor.runtime.daemon import resolve_loader
from greenctl.planner.glet.memory import check_gpu_memory, gpu_needs
from greenctl.profiler.models import builtin_variant, check_model_file


def check_apply(plan: Plan, store: Store, options: ApplyOptions) -> None:
    """What an apply runs with, checked before it takes the lock or starts anything: the
    dispatcher's port is a port, its address can be bound now (unless the running
    dispatcher holds it), and the variant loader imports and names a function.

    Raises:
        InputError: naming the option (or the plan's field) and the fix.
    """
    option, port = "--port", options.port
    if port is None:
        option, port = (
            "the plan's dispatcher.port",
            (plan.extra.get("dispatcher") or {}).get("port"),
        )
    if port is not None:
        port = int(number(port, option, minimum=0, maximum=65535))
    if not options.dry_run:
        disp = deployments.running_dispatcher(store)
        if disp is None or disp["host"] != options.host or port not in (0, None, disp["port"]):
            check_address(options.host, port or 0, option=option)
    try:
        resolve_loader(options.loader_name)
    except Exception as exc:  # the user's module ran: whatever it raised is their mistake
        if isinstance(exc, InputError):
            why = exc.message
        else:
            why = f"importing {shown(options.loader_name)} raised {type(exc).__name__}: {exc}"
        raise InputError(
            f"--loader: {why}",
            hint="give an importable module:function or file.py:function (the folder greenctl "
            "runs in is searched), or leave --loader out for the built-in catalog",
        ) from None


def check_apply_values(*, host: str, verify_duration_s: float, http_port: int) -> None:
    """The apply options that are plain values, checked before anything is read, a dry run's
    included: a host, a verification time, the Ray router's port.

    Raises:
        InputError: naming the option and the value it takes.
    """
    if not host.strip():
        raise InputError("--host is empty", hint="give an address of this machine, e.g. 127.0.0.1")
    bounded(verify_duration_s, "--verify-duration", "duration_s")
    number(http_port, "--ray-http-port", minimum=1, maximum=65535)


def check_address(host: str, port: int, *, option: str) -> None:
    """Whether a dispatcher could listen on ``host:port`` now: bound as its supervisor
    binds it, then released (port 0: any free port of ``host``).

    Raises:
        InputError: the host is not an address of this machine, the port is taken, or it
            is privileged and this user may not bind it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        if getattr(exc, "errno", None) == errno.EACCES:
            hint = f"ports below 1024 need privileges; give {option} 1024 or above"
        elif getattr(exc, "errno", None) == errno.EADDRINUSE:
            hint = f"another program listens there; give {option} a free port or leave it out"
        else:
            hint = "give --host an address of this machine (127.0.0.1 for loopback)"
        where = f"{option} {port}: cannot bind {shown(host)}:{port}"
        if not port:
            where = f"--host {shown(host)}: cannot listen there"
        raise InputError(f"{where}: {why}", hint=hint) from None


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
            if loader == DEFAULT_LOADER:
                check_model_file(out[s.variant])  # a generated file gone: refused before a start
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

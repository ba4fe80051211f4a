"""Partitioning the machine for a plan: CPU cores, MIG layouts and the MPS control daemon.

MIG changes go through :mod:`greenctl.profiler.device` (real NVML, or the fake selected by
``GREENCTL_FAKE_NVML`` in tests); every change returns the step that undoes it, so a failed
apply can roll back in reverse order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from greenctl.data.errors import HardwareError, InfeasiblePlan
from greenctl.profiler import device, hw

MPS_CONTROL_ENV = "GREENCTL_MPS_CONTROL"

Undo = Callable[[], object]


def available_cores() -> list[int]:
    """The CPU cores this process may run on (hardware discovery's affinity mask), in order."""
    return list(hw.usable_cores())


def assign_cores(
    needs: list[int], available: list[int], taken: set[int] | None = None
) -> list[list[int]]:
    """Give each instance its own cores, preferring cores not ``taken`` by kept instances.

    Raises:
        InfeasiblePlan: the instances need more cores than ``available`` holds.
    """
    total = sum(needs)
    if total > len(available):
        raise InfeasiblePlan(
            f"the plan needs {total} CPU cores but this machine offers {len(available)} "
            f"({','.join(map(str, available))})",
            hint="plan for this machine's cores (`greenctl hw`), or lower counts/cpu sizes",
        )
    taken = taken or set()
    order = [c for c in available if c not in taken] + [c for c in available if c in taken]
    out, i = [], 0
    for n in needs:
        out.append(order[i : i + n])
        i += n
    return out


# -- MIG ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MigSlot:
    """One GPU instance of a layout: profile at a memory-slot start on a GPU."""

    gpu: int
    profile: str
    start: int


def gpu_backend() -> Any:
    """The device layer, or HardwareError saying plainly that no GPU is there."""
    backend = device.get_backend()
    if backend is None:
        raise HardwareError(
            f"the plan needs NVIDIA GPUs but none is usable: {device.no_gpu_reason()}",
            hint="apply GPU plans on a machine with the NVIDIA driver (`greenctl hw`)",
        )
    return backend


def current_layout(backend: Any, gpu: int) -> list[dict[str, Any]]:
    """The GPU instances on ``gpu`` as ``{profile, start, gi_id, uuid}``, one per GI."""
    seen: dict[int, dict[str, Any]] = {}
    for inst in backend.mig_instances(gpu):
        seen.setdefault(
            inst.gi_id,
            {
                "profile": inst.profile,
                "start": inst.placement_start,
                "gi_id": inst.gi_id,
                "uuid": inst.uuid,
            },
        )
    return sorted(seen.values(), key=lambda d: d["start"])


def check_mig_gpu(backend: Any, gpu: int) -> None:
    """Raise HardwareError unless ``gpu`` exists and has MIG mode on."""
    gpus = {g.index: g for g in backend.gpus()}
    if gpu not in gpus:
        raise HardwareError(
            f"the plan places MIG instances on GPU {gpu}, but this machine has {len(gpus)} GPU(s)",
            hint="see `greenctl hw`",
        )
    info = gpus[gpu]
    if info.mig_enabled is None:
        raise HardwareError(f"GPU {gpu} ({info.name}) does not support MIG")
    if not info.mig_enabled:
        raise HardwareError(
            f"MIG mode is off on GPU {gpu} ({info.name})",
            hint=f"enable it as root: sudo nvidia-smi -i {gpu} -mig 1 (then reset the GPU)",
        )


def check_layout(backend: Any, gpu: int, desired: list[MigSlot]) -> None:
    """Check a layout before touching the GPU: known profiles, legal placements, no overlap,
    compute slices that fit.

    Raises:
        InfeasiblePlan: naming the slot that does not fit and why.
    """
    profiles = {p.name: p for p in backend.mig_profiles(gpu)}
    used_memory: dict[int, MigSlot] = {}
    slices = 0
    for s in sorted(desired, key=lambda s: s.start):
        prof = profiles.get(s.profile)
        if prof is None:
            raise InfeasiblePlan(
                f"GPU {gpu} has no MIG profile {s.profile}",
                hint=f"its profiles: {', '.join(sorted(profiles)) or 'none'}",
            )
        sizes = [size for start, size in prof.placements if start == s.start]
        if not sizes:
            legal = ", ".join(str(start) for start, _ in prof.placements)
            raise InfeasiblePlan(
                f"MIG {s.profile} cannot start at memory slot {s.start} on GPU {gpu}",
                hint=f"legal starts for {s.profile}: {legal}",
            )
        for slot in range(s.start, s.start + sizes[0]):
            if slot in used_memory:
                other = used_memory[slot]
                raise InfeasiblePlan(
                    f"MIG {s.profile}@{s.start} overlaps {other.profile}@{other.start} on GPU {gpu}"
                )
            used_memory[slot] = s
        slices += prof.slices
    total = backend.total_compute_slices(gpu)
    if slices > total:
        raise InfeasiblePlan(
            f"the layout of GPU {gpu} needs {slices} compute slices, the GPU has {total}"
        )


def reconcile_mig(
    backend: Any, gpu: int, desired: list[MigSlot], undo: list[tuple[str, Undo]]
) -> list[dict[str, Any]]:
    """Make ``gpu``'s GPU instances exactly ``desired``: destroy the others, create the missing.

    Appends an undo step per change to ``undo``. Returns the actions taken.
    """
    actions: list[dict[str, Any]] = []
    current = current_layout(backend, gpu)
    want = {(s.profile, s.start) for s in desired}
    have = {(c["profile"], c["start"]) for c in current}
    for c in current:
        if (c["profile"], c["start"]) in want:
            continue
        backend.destroy_gpu_instance(gpu, c["gi_id"])
        actions.append(
            {"action": "mig-destroy", "gpu": gpu, "profile": c["profile"], "start": c["start"]}
        )

        def recreate(profile: str = c["profile"], start: int = c["start"]) -> None:
            gi = backend.create_gpu_instance_with_placement(gpu, profile, start)
            backend.create_compute_instance(gpu, gi)

        undo.append((f"recreate MIG {c['profile']}@{c['start']} on GPU {gpu}", recreate))
    for s in sorted(desired, key=lambda s: s.start):
        if (s.profile, s.start) in have:
            continue
        gi = backend.create_gpu_instance_with_placement(gpu, s.profile, s.start)

        def destroy(gi: int = gi) -> None:
            backend.destroy_gpu_instance(gpu, gi)

        undo.append((f"destroy MIG {s.profile}@{s.start} on GPU {gpu}", destroy))
        backend.create_compute_instance(gpu, gi)
        actions.append({"action": "mig-create", "gpu": gpu, "profile": s.profile, "start": s.start})
    return actions


def mig_uuid(backend: Any, slot: MigSlot) -> str:
    """The ``MIG-...`` UUID of the compute instance at ``slot``."""
    for inst in backend.mig_instances(slot.gpu):
        if inst.profile == slot.profile and inst.placement_start == slot.start and inst.uuid:
            uuid = str(inst.uuid)
            return uuid if uuid.startswith("MIG-") else f"MIG-{uuid}"
    raise HardwareError(
        f"no MIG instance {slot.profile} at slot {slot.start} on GPU {slot.gpu}",
        hint="create the layout first (without --mig-parted greenctl does), see `greenctl hw`",
    )


def restore_layout(backend: Any, gpu: int, layout: list[dict[str, Any]]) -> None:
    """Put back a checkpointed layout (destroying what is there now)."""
    undo: list[tuple[str, Undo]] = []
    reconcile_mig(backend, gpu, [MigSlot(gpu, d["profile"], int(d["start"])) for d in layout], undo)


# -- MPS ---------------------------------------------------------------------------------
def mps_dirs(state_dir: Path) -> dict[str, str]:
    pipe = state_dir / "mps" / "pipe"
    log = state_dir / "mps" / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}


def mps_control_command() -> str:
    """The MPS control binary (``$GREENCTL_MPS_CONTROL`` overrides, for tests)."""
    cmd = os.environ.get(MPS_CONTROL_ENV) or "nvidia-cuda-mps-control"
    if shutil.which(cmd) is None:
        raise HardwareError(
            f"the plan uses MPS shares but '{cmd}' is not installed",
            hint="install the NVIDIA CUDA toolkit's MPS tools, or plan without mps:PCT resources",
        )
    return cmd


def start_mps(state_dir: Path) -> dict[str, str]:
    """Start the MPS control daemon (``-d``) with pipe/log dirs under ``state_dir``."""
    env = dict(os.environ)
    env.update(mps_dirs(state_dir))
    proc = subprocess.run(
        [mps_control_command(), "-d"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        raise HardwareError(
            f"starting the MPS control daemon failed: {proc.stderr.strip() or proc.returncode}"
        )
    return mps_dirs(state_dir)


def stop_mps(state_dir: Path) -> None:
    """Ask the MPS control daemon to quit."""
    env = dict(os.environ)
    env.update(mps_dirs(state_dir))
    subprocess.run(
        [mps_control_command()], input="quit\n", env=env, capture_output=True, text=True, timeout=30
    )

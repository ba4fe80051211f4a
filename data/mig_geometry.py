"""MIG geometry of NVIDIA GPUs as data: profiles, placements and valid layouts.

The geometry lives in ``datasets/mig_geometry.json`` (per GPU model: memory and compute
slices, and profiles with ids, start slots and widths). A *placement* is a profile at a
start memory slice; a *layout*, a set of placements on one GPU, is valid when memory ranges
do not overlap, compute slices fit, and at most one ``+me`` instance is present. The memory
check matters: on an A100 ``3g + 3g + 1g`` fits the 7 compute slices but the two 3g
instances hold all 8 memory slices. A layout is *maximal* when nothing more fits.
:func:`mps_percentage` is the one rule of emulating a MIG slice with MPS (``profile --gpus
--emulate-mig``); :func:`emulated_slices` lists a GPU model's sizes and their profiles.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from greenctl.data.errors import FileFormatError, InputError

GEOMETRY_FILE = "mig_geometry.json"


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile (for example ``3g.20gb``) of one GPU model."""

    name: str
    id: int
    compute_slices: int
    memory_slices: int
    memory_gib: float
    starts: tuple[int, ...]
    width: int
    max_per_gpu: int | None = None

    @property
    def media_extension(self) -> bool:
        """True for the ``+me`` profiles (at most one per GPU)."""
        return self.name.endswith("+me")

    @property
    def resource(self) -> str:
        """The resource label of an instance of this profile, ``mig:<name>``."""
        return f"mig:{self.name}"


@dataclass(frozen=True, order=True)
class Placement:
    """A profile placed at a start slot (memory-slice index)."""

    start: int
    profile: str

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start}


@dataclass(frozen=True)
class GpuGeometry:
    """The MIG geometry of one GPU model."""

    name: str
    aliases: tuple[str, ...]
    nvml_names: tuple[str, ...]
    memory_gib: float
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    _by_name: dict[str, MigProfile] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.profiles})

    def profile(self, name: str) -> MigProfile:
        """The profile called ``name`` (``mig:`` prefix accepted).

        Raises:
            InputError: the GPU has no such profile; the message lists the known ones.
        """
        key = name[4:] if name.startswith("mig:") else name
        try:
            return self._by_name[key]
        except KeyError:
            raise InputError(
                f"GPU {self.name} has no MIG profile '{key}'",
                hint=f"its profiles: {', '.join(p.name for p in self.profiles)}",
            ) from None

    def has_profile(self, name: str) -> bool:
        key = name[4:] if name.startswith("mig:") else name
        return key in self._by_name

    @property
    def whole_profile(self) -> MigProfile:
        """The profile that takes the whole GPU (for example ``7g.40gb``)."""
        return max(self.profiles, key=lambda p: (p.compute_slices, p.memory_slices))

    def placements(self) -> list[Placement]:
        """Every (profile, start) pair the geometry allows, by start then profile order."""
        out = [Placement(s, p.name) for p in self.profiles for s in p.starts]
        order = {p.name: i for i, p in enumerate(self.profiles)}
        return sorted(out, key=lambda pl: (pl.start, order[pl.profile]))


# ---------------------------------------------------------------------------------------
# loading and name resolution


def _norm(name: str) -> str:
    text = name.strip().lower()
    if text.startswith("nvidia "):
        text = text[len("nvidia ") :]
    return re.sub(r"[\s_]+", "-", text)


def _parse_geometry(doc: Any, source: str) -> tuple[GpuGeometry, ...]:
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise FileFormatError(source, "expected an object with a 'gpus' list")
    gpus = []
    for i, g in enumerate(doc["gpus"]):
        where = f"gpus[{i}]"
        try:
            profiles = tuple(
                MigProfile(
                    name=str(p["name"]),
                    id=int(p["id"]),
                    compute_slices=int(p["compute_slices"]),
                    memory_slices=int(p["memory_slices"]),
                    memory_gib=float(p["memory_gib"]),
                    starts=tuple(int(s) for s in p["starts"]),
                    width=int(p["width"]),
                    max_per_gpu=None if p.get("max_per_gpu") is None else int(p["max_per_gpu"]),
                )
                for p in g["profiles"]
            )
            geo = GpuGeometry(
                name=str(g["name"]),
                aliases=tuple(str(a) for a in g.get("aliases", [])),
                nvml_names=tuple(str(a) for a in g.get("nvml_names", [])),
                memory_gib=float(g["memory_gib"]),
                memory_slices=int(g["memory_slices"]),
                compute_slices=int(g["compute_slices"]),
                profiles=profiles,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FileFormatError(source, f"{where}: bad or missing field ({exc})") from None
        for p in profiles:
            if any(s < 0 or s + p.width > geo.memory_slices for s in p.starts):
                raise FileFormatError(
                    source, f"{where}: profile {p.name} has a start slot past the memory slices"
                )
        gpus.append(geo)
    return tuple(gpus)


@cache
def load_geometry() -> tuple[GpuGeometry, ...]:
    """The bundled geometry of every MIG-capable GPU model greenctl knows."""
    path = resources.files("greenctl.data") / "datasets" / GEOMETRY_FILE
    return _parse_geometry(json.loads(path.read_text()), str(path))


@cache
def _name_index() -> dict[str, GpuGeometry]:
    index: dict[str, GpuGeometry] = {}
    for g in load_geometry():
        for n in (g.name, *g.aliases, *g.nvml_names):
            index[_norm(n)] = g
    return index


def known_gpu_names() -> list[str]:
    """The canonical names of the known GPU models."""
    return [g.name for g in load_geometry()]


def find_gpu(name: str | None) -> GpuGeometry | None:
    """The geometry for a GPU name (canonical, alias or NVML name), or None."""
    if not name:
        return None
    return _name_index().get(_norm(name))


def resolve_gpu(name: str) -> GpuGeometry:
    """The geometry for a GPU name as NVML reports it or a short alias.

    Raises:
        InputError: unknown model; the message lists the known ones.
    """
    geo = find_gpu(name)
    if geo is None:
        raise InputError(
            f"unknown MIG-capable GPU model '{name}'",
            hint=f"known models: {', '.join(known_gpu_names())} "
            "(NVML names such as 'NVIDIA A100-SXM4-40GB' work too)",
        )
    return geo


# ---------------------------------------------------------------------------------------
# layouts


Layout = tuple[Placement, ...]


def _mask(start: int, width: int) -> int:
    return ((1 << width) - 1) << start


def is_valid_layout(geo: GpuGeometry, layout: Iterable[Placement]) -> bool:
    """Whether placements form a valid layout on ``geo`` (see module docstring)."""
    used = 0
    compute = 0
    me = 0
    per_profile: Counter[str] = Counter()
    for pl in layout:
        if not geo.has_profile(pl.profile):
            return False
        p = geo.profile(pl.profile)
        if pl.start not in p.starts:
            return False
        m = _mask(pl.start, p.width)
        if used & m:
            return False
        used |= m
        compute += p.compute_slices
        per_profile[p.name] += 1
        me += int(p.media_extension)
        if p.max_per_gpu is not None and per_profile[p.name] > p.max_per_gpu:
            return False
    return compute <= geo.compute_slices and me <= 1


def enumerate_layouts(
    geo: GpuGeometry,
    *,
    profiles: Iterable[str] | None = None,
    include_me: bool = True,
    maximal: bool = True,
) -> list[Layout]:
    """Every valid layout of ``geo`` built from the allowed profiles.

    Args:
        geo: the GPU model.
        profiles: restrict to these profile names (default: all of the GPU's).
        include_me: allow ``+me`` profiles (ignored for names given in ``profiles``).
        maximal: keep only layouts to which no allowed placement can be added.

    Returns:
        Layouts as tuples of placements sorted by start slot, in a stable order (more
        instances later, then lexicographic). The empty layout is never returned.
    """
    if profiles is None:
        allowed = [p for p in geo.profiles if include_me or not p.media_extension]
    else:
        names = [n[4:] if n.startswith("mig:") else n for n in profiles]
        allowed = [geo.profile(n) for n in dict.fromkeys(names)]
    cand = [
        (s, p, _mask(s, p.width)) for p in allowed for s in p.starts
    ]  # all placements of allowed profiles
    cand.sort(key=lambda c: (c[0], c[1].name))
    out: list[Layout] = []

    def fits(used: int, compute: int, me: int, counts: Counter[str], c: Any) -> bool:
        _s, p, m = c
        if used & m or compute + p.compute_slices > geo.compute_slices:
            return False
        if p.media_extension and me >= 1:
            return False
        return not (p.max_per_gpu is not None and counts[p.name] >= p.max_per_gpu)

    def rec(i: int, chosen: list[Any], used: int, compute: int, me: int, counts: Counter[str]):
        if chosen and (not maximal or not any(fits(used, compute, me, counts, c) for c in cand)):
            out.append(tuple(Placement(s, p.name) for s, p, _ in chosen))
        for j in range(i, len(cand)):
            c = cand[j]
            if chosen and c[0] <= chosen[-1][0]:
                continue  # strictly increasing starts: each layout is generated once
            if not fits(used, compute, me, counts, c):
                continue
            _s, p, m = c
            counts[p.name] += 1
            chosen.append(c)
            rec(j + 1, chosen, used | m, compute + p.compute_slices, me + p.media_extension, counts)
            chosen.pop()
            counts[p.name] -= 1

    rec(0, [], 0, 0, 0, Counter())
    out.sort(key=lambda lay: (len(lay), [(pl.start, pl.profile) for pl in lay]))
    return out


def multiset(geo: GpuGeometry, layout: Iterable[Placement]) -> tuple[str, ...]:
    """The slice multiset of a layout: its profile names, largest first."""
    order = {p.name: i for i, p in enumerate(geo.profiles)}
    names = [pl.profile for pl in layout]
    return tuple(sorted(names, key=lambda n: (-geo.profile(n).compute_slices, -order[n], n)))


def layouts_by_multiset(
    geo: GpuGeometry, layouts: Sequence[Layout]
) -> dict[tuple[str, ...], list[Layout]]:
    """Group layouts by their slice multiset (insertion order = first occurrence)."""
    groups: dict[tuple[str, ...], list[Layout]] = {}
    for lay in layouts:
        groups.setdefault(multiset(geo, lay), []).append(lay)
    return groups


def layouts_document(
    geo: GpuGeometry, *, profiles: Iterable[str] | None = None, include_me: bool = True
) -> dict[str, Any]:
    """The ``greenctl mig layouts --json`` document for one GPU model."""
    layouts = enumerate_layouts(geo, profiles=profiles, include_me=include_me)
    groups = layouts_by_multiset(geo, layouts)
    return {
        "gpu": geo.name,
        "layouts": [{"instances": [pl.to_dict() for pl in lay]} for lay in layouts],
        "multisets": [list(m) for m in groups],
    }


# ---------------------------------------------------------------------------------------
# MIG slices emulated with MPS (MISO)


@dataclass(frozen=True)
class EmulatedSlice:
    """One compute size of a GPU model's MIG profiles and the MPS share that stands in for it.

    One measurement at ``percentage`` serves every profile in ``profiles`` (they differ only
    in memory, which MPS does not partition; the planner leaves out a variant whose memory
    exceeds a profile's, as it does for measured rows).
    """

    compute_slices: int
    percentage: int  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    share: float  # compute_slices / the GPU's compute slices (energy attribution)
    profiles: tuple[str, ...]


def mps_percentage(geo: GpuGeometry, compute_slices: int) -> int:
    """The MPS active-thread percentage that emulates a MIG slice of ``compute_slices``.

    The one rule of MPS emulation (MISO's method): NVIDIA's MIG user guide lists the SMs of a
    ``Cg`` profile as C of the GPU's compute slices (``1g`` = 1/7 of an A100's or H100's SMs),
    so a ``Cg`` slice is emulated by ``round(100 * C / compute_slices)`` percent of the whole
    GPU's threads: 14, 29, 43, 57 and 100 for 1g, 2g, 3g, 4g and 7g of a 7-slice GPU
    (halves round up). MPS limits threads, not memory bandwidth or L2, so an emulated slice
    is an estimate of a MIG slice, not a measurement of one.

    Raises:
        InputError: ``compute_slices`` is not between 1 and the GPU's compute slices.
    """
    if not 1 <= compute_slices <= geo.compute_slices:
        raise InputError(
            f"GPU {geo.name} has {geo.compute_slices} compute slices, not {compute_slices}"
        )
    return max(1, min(100, math.floor(100 * compute_slices / geo.compute_slices + 0.5)))


def emulated_slices(geo: GpuGeometry, *, include_me: bool = False) -> list[EmulatedSlice]:
    """Every distinct compute size of ``geo``'s MIG profiles with its MPS percentage, smallest
    first.

    ``+me`` (media extension) profiles are left out unless ``include_me``: they differ from
    their base profile only by the media engines (NVDEC, NVJPG, OFA), which MPS can neither
    grant nor take away, so an emulated row of one would repeat its base profile's figures
    (``greenctl mig synth`` leaves them out by default too).
    """
    sizes: dict[int, list[str]] = {}
    for p in geo.profiles:
        if p.media_extension and not include_me:
            continue
        sizes.setdefault(p.compute_slices, []).append(p.name)
    return [
        EmulatedSlice(
            compute_slices=c,
            percentage=mps_percentage(geo, c),
            share=c / geo.compute_slices,
            profiles=tuple(names),
        )
        for c, names in sorted(sizes.items())
    ]

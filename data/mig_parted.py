"""Export MIG layouts as NVIDIA mig-parted v1 configuration (YAML, written by hand).

mig-parted (github.com/NVIDIA/mig-parted) reads ``version: v1`` and ``mig-configs``: per
label, entries of ``devices``, ``mig-enabled`` and ``mig-devices`` counts per profile. GPUs
with the same layout share an entry; mig-parted places instances itself, so the planned
start slots stay in the plan document. The writer emits a small fixed YAML subset, so no
YAML library is needed; :func:`parse_mig_parted` reads exactly that subset back strictly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, InputError

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def group_layouts(
    gpus: Iterable[tuple[int, Sequence[str]]], *, order: Sequence[str] | None = None
) -> list[tuple[list[int], dict[str, int]]]:
    """Group GPU indices by their profile counts.

    Args:
        gpus: ``(index, [profile, ...])`` per GPU.
        order: profile names in the order they should be listed (default: by name).

    Returns:
        ``[(device indices, {profile: count}), ...]`` in order of first appearance.
    """
    rank = {name: i for i, name in enumerate(order or [])}
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for index, profiles in gpus:
        counts = Counter(p[4:] if p.startswith("mig:") else p for p in profiles)
        key = tuple(sorted(counts.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))
        groups.setdefault(key, []).append(int(index))
    return [(sorted(devs), dict(key)) for key, devs in groups.items()]


def to_mig_parted_yaml(
    gpus: Iterable[tuple[int, Sequence[str]]],
    *,
    label: str = "greenctl",
    order: Sequence[str] | None = None,
) -> str:
    """The mig-parted v1 document for a set of GPUs and their layouts.

    Raises:
        InputError: the label is not a plain name or no GPU is given.
    """
    if not _LABEL.match(label):
        raise InputError(
            f"mig-parted config label '{label}' is not a plain name",
            hint="use letters, digits, '.', '_' and '-'",
        )
    groups = group_layouts(gpus, order=order)
    if not groups:
        raise InputError("nothing to export: the plan has no GPUs")
    lines = ["version: v1", "mig-configs:", f"  {label}:"]
    for devices, counts in groups:
        lines.append(f"    - devices: [{', '.join(str(d) for d in devices)}]")
        lines.append("      mig-enabled: true")
        lines.append("      mig-devices:")
        for profile, count in counts.items():
            lines.append(f'        "{profile}": {count}')
    return "\n".join(lines) + "\n"


def write_mig_parted(
    path: str | Path,
    gpus: Iterable[tuple[int, Sequence[str]]],
    *,
    label: str = "greenctl",
    order: Sequence[str] | None = None,
) -> None:
    """Write :func:`to_mig_parted_yaml` to ``path``.

    Raises:
        InputError: the file cannot be written.
    """
    text = to_mig_parted_yaml(gpus, label=label, order=order)
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise InputError(f"cannot write mig-parted config {path}: {exc.strerror}") from None


_DEVICES = re.compile(r"^    - devices: \[(\d+(?:, \d+)*)\]$")
_PROFILE = re.compile(r'^        "([0-9]g\.[0-9]+gb(?:\+me)?)": ([1-9][0-9]*)$')


def parse_mig_parted(text: str, *, source: str = "<mig-parted>") -> dict[str, Any]:
    """Strictly parse the YAML subset :func:`to_mig_parted_yaml` writes.

    Returns:
        ``{"version": "v1", "mig-configs": {label: [{"devices": [...], "mig-enabled": True,
        "mig-devices": {profile: count}}]}}``, the same structure PyYAML would return.

    Raises:
        FileFormatError: any line outside the subset, naming the line.
    """
    lines = text.splitlines()
    if lines[:2] != ["version: v1", "mig-configs:"]:
        raise FileFormatError(source, "expected 'version: v1' then 'mig-configs:'", line=1)
    configs: dict[str, list[dict[str, Any]]] = {}
    label: str | None = None
    entry: dict[str, Any] | None = None
    state = "label"
    for no, line in enumerate(lines[2:], start=3):
        m_label = re.match(r"^  ([A-Za-z0-9][A-Za-z0-9._-]*):$", line)
        m_dev = _DEVICES.match(line)
        m_prof = _PROFILE.match(line)
        if m_label:
            label = m_label.group(1)
            configs[label] = []
            state = "entry"
        elif m_dev and label is not None and state in ("entry", "profiles"):
            entry = {"devices": [int(d) for d in m_dev.group(1).split(", ")]}
            configs[label].append(entry)
            state = "enabled"
        elif line == "      mig-enabled: true" and state == "enabled" and entry is not None:
            entry["mig-enabled"] = True
            state = "devices-key"
        elif line == "      mig-devices:" and state == "devices-key" and entry is not None:
            entry["mig-devices"] = {}
            state = "profiles"
        elif m_prof and state == "profiles" and entry is not None:
            if m_prof.group(1) in entry["mig-devices"]:
                raise FileFormatError(source, f"profile {m_prof.group(1)} repeated", line=no)
            entry["mig-devices"][m_prof.group(1)] = int(m_prof.group(2))
        else:
            raise FileFormatError(source, f"unexpected line {line!r}", line=no)
    if not configs or any(not v for v in configs.values()) or state != "profiles":
        raise FileFormatError(source, "incomplete mig-configs")
    return {"version": "v1", "mig-configs": configs}


def check_devices_disjoint(doc: Mapping[str, Any]) -> None:
    """Raise FileFormatError when a device index appears twice within one config label."""
    for label, entries in doc["mig-configs"].items():
        seen: set[int] = set()
        for e in entries:
            dup = seen & set(e["devices"])
            if dup:
                raise FileFormatError("<mig-parted>", f"{label}: devices {sorted(dup)} repeated")
            seen |= set(e["devices"])

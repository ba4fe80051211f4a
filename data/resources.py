"""Resource labels: ``cpu:N``, ``gpu:MODEL``, ``mig:PROFILE``, ``mps:PCT`` or any ``kind:size``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from greenctl.data.errors import InputError

_LABEL = re.compile(r"^([a-z][a-z0-9_-]*):([A-Za-z0-9][A-Za-z0-9._+-]*)$")
_MIG_PROFILE = re.compile(r"^[1-8]g\.\d+gb(\+me)?$")

#: The resource kinds greenctl can run executors on (``apply``). Plans and simulations may
#: name any other ``kind:size`` label (its figures come from the profiles).
KNOWN_KINDS = ("cpu", "gpu", "mig", "mps")


@dataclass(frozen=True, order=True)
class Resource:
    """A parsed resource label."""

    kind: str
    size: str

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.size}"

    def __str__(self) -> str:
        return self.label

    @property
    def cpu_cores(self) -> int | None:
        """Cores of a ``cpu:N`` resource, else None."""
        return int(self.size) if self.kind == "cpu" else None

    @property
    def mps_percent(self) -> int | None:
        """Active-thread percentage of an ``mps:PCT`` resource, else None."""
        return int(self.size) if self.kind == "mps" else None

    @property
    def mig_compute_slices(self) -> int | None:
        """Compute slices of a ``mig:Ng.XXgb`` resource (the N), else None."""
        return int(self.size.split("g.", 1)[0]) if self.kind == "mig" else None

    @property
    def amount(self) -> float:
        """How much of its kind this resource uses, for budgets.

        cpu: cores; mps: percent of one GPU; gpu and mig and others: one unit (budgets for
        MIG slices are stated per profile, for example ``mig:1g.10gb=7``).
        """
        if self.kind in ("cpu", "mps"):
            return float(self.size)
        try:
            return float(self.size)
        except ValueError:
            return 1.0


def parse_resource(label: str) -> Resource:
    """Parse and validate a resource label.

    Raises:
        InputError: the label is malformed; the message shows the accepted forms.
    """
    text = str(label).strip()
    m = _LABEL.match(text)
    if not m:
        raise InputError(
            f"unknown resource label '{label}'",
            hint="use cpu:N (cores), gpu:MODEL, mig:PROFILE (e.g. mig:1g.10gb), mps:PCT "
            "(1-100) or another kind:size label",
        )
    kind, size = m.group(1), m.group(2)
    if kind == "cpu" and not (size.isdigit() and int(size) >= 1):
        raise InputError(f"resource '{label}': cpu:N needs a whole number of cores >= 1")
    if kind == "mps" and not (size.isdigit() and 1 <= int(size) <= 100):
        raise InputError(f"resource '{label}': mps:PCT needs a percentage between 1 and 100")
    if kind == "mig" and not _MIG_PROFILE.match(size):
        raise InputError(
            f"resource '{label}': '{size}' is not a MIG profile name",
            hint="MIG profiles look like 1g.10gb, 3g.40gb or 7g.80gb",
        )
    return Resource(kind, size)


def runnable_resource(label: str, *, field: str) -> Resource:
    """Parse a label that an executor is to run on: one of :data:`KNOWN_KINDS`.

    Args:
        label: the resource label.
        field: where the label came from, for the message (``deployments[2].resource``).

    Raises:
        InputError: a malformed label, or a kind greenctl cannot start executors on.
    """
    try:
        r = parse_resource(label)
    except InputError as exc:
        raise InputError(f"{field}: {exc.message}", hint=exc.hint) from None
    if r.kind not in KNOWN_KINDS:
        raise InputError(
            f"{field} is '{label}': greenctl runs executors on "
            f"{', '.join(k + ':...' for k in KNOWN_KINDS)} resources, not '{r.kind}'",
            hint=f"plan for this machine's resources (`greenctl hw`); '{r.kind}' labels are "
            "for planning and `greenctl simulate` only",
        )
    return r

"""The data sets that ship with greenctl, reachable as ``bundled:NAME`` wherever a file is taken.

One registry: each name maps to a file or folder under ``greenctl/data/datasets`` (where the
copies sit with their attribution and licences) and a one-line description. Carbon traces
also carry the format and region ``carbon import`` reads them with. :func:`resolve` turns a
``bundled:NAME`` value into the installed path and leaves any other path as it is, so every
command that takes a file calls it once and needs no list of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from greenctl.data.errors import InputError, shown

PREFIX = "bundled:"


@dataclass(frozen=True)
class Dataset:
    """One bundled data set: where it lies under ``datasets/`` and what it is."""

    name: str
    path: str  # relative to the datasets folder; a file or a folder
    description: str
    carbon_format: str | None = None  # a carbon trace: the format carbon_io reads it with
    region: str | None = None  # a carbon trace: the region it is stored under by default


# eGLB's ten sites, in the authors' order ("Belguim" is their spelling).
EGLB_SITES = (
    "Texas", "Virginia", "Georgia", "Nevada", "Germany",
    "Belguim", "Netherlands", "Denmark", "Japan", "Singapore",
)  # fmt: skip

_DATASETS: tuple[Dataset, ...] = (
    Dataset(
        "gpulet",
        "gpulet",
        "gpulet (ATC'22) GPU measurements under MPS: inference.csv, mem_util.csv, "
        "interference.csv (folder; `gpulet import`)",
    ),
    Dataset(
        "twitter",
        "twitter/requests_per_second.txt.gz",
        "Twitter requests-per-second trace, ~22 days at 1 s (InfAdapter's workload; --trace)",
    ),
    Dataset(
        "infadapter",
        "infadapter/capacity_result_Feb_21.csv",
        "InfAdapter (EuroMLSys'23) CPU profiles of ResNet 18..152 on 1..20 cores",
    ),
    Dataset(
        "eglb",
        "eglb",
        "eGLB (e-Energy'24) hourly carbon, price, water and workload of ten sites "
        "(folder; `geo convert-eglb`)",
    ),
    Dataset(
        "clover-mig-partitions",
        "clover_mig/partition_code.json",
        "Clover (SC'23) A100 MIG partitions, as lists of slice sizes",
    ),
    Dataset(
        "clover-accuracy",
        "clover_accuracy.json",
        "Clover (SC'23) published accuracies of its model variants (percent)",
    ),
    Dataset(
        "clover-ciso-march",
        "carbon/clover_ciso_march.csv",
        "Clover's hourly CAISO carbon intensity, March (carbon trace, region CISO)",
        "clover",
        "CISO",
    ),
    Dataset(
        "clover-ciso-sep",
        "carbon/clover_ciso_sep.csv",
        "Clover's hourly CAISO carbon intensity, September (carbon trace, region CISO)",
        "clover",
        "CISO",
    ),
    Dataset(
        "clover-eso-march",
        "carbon/clover_eso_march.csv",
        "Clover's hourly ESO (Great Britain) carbon intensity, March (carbon trace, region ESO)",
        "clover",
        "ESO",
    ),
    *(
        Dataset(
            f"eglb-{site.lower()}",
            f"eglb/carbon/{site}_carbon.csv",
            f"eGLB's hourly carbon intensity of the {site} site (carbon trace, region {site})",
            "eglb",
            site,
        )
        for site in EGLB_SITES
    ),
)

#: Every bundled data set by name, in the order they are listed to a user.
DATASETS: dict[str, Dataset] = {d.name: d for d in _DATASETS}


def datasets_dir() -> Path:
    """The installed ``datasets`` folder of greenctl's data package."""
    return Path(str(resources.files("greenctl.data") / "datasets"))


def names() -> list[str]:
    """The bundled names, each as ``bundled:NAME``."""
    return [PREFIX + n for n in DATASETS]


def path_of(name: str) -> Path:
    """The installed path of the bundled data set ``name`` (without the prefix).

    Raises:
        InputError: no bundled data set has that name; the message lists every name.
    """
    ds = DATASETS.get(name)
    if ds is None:
        raise InputError(
            f"unknown bundled data set '{shown(PREFIX + name)}'",
            hint=f"use one of {', '.join(names())}",
        )
    return datasets_dir() / ds.path


def is_bundled(value: str | Path) -> bool:
    """Whether ``value`` names a bundled data set (``bundled:NAME``)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def resolve(value: str | Path) -> Path:
    """``bundled:NAME`` as its installed path; any other value as a plain path.

    Raises:
        InputError: an unknown bundled name (exit 2), listing every bundled name.
    """
    if is_bundled(value):
        return path_of(str(value)[len(PREFIX) :])
    return Path(value)


def carbon_trace_at(path: str | Path) -> Dataset | None:
    """The bundled carbon trace that lies at ``path``, if it is one (else None).

    Lets a reader given ``bundled:clover-ciso-march`` (already resolved to its path) pick the
    trace's own format and region instead of guessing them.
    """
    try:
        target = Path(path).resolve()
    except OSError:
        return None
    root = datasets_dir()
    for ds in DATASETS.values():
        if ds.carbon_format and (root / ds.path).resolve() == target:
            return ds
    return None

"""Convert InfAdapter's CPU profiles of ResNet 18..152 into greenctl's profile import CSV.

Source: ``bundled:infadapter`` (``data/datasets/infadapter/capacity_result_Feb_21.csv``, from
reconfigurable-ml-pipeline/InfAdapter, commit in its README; third-party measurements, used
for tests and benchmarks). TensorFlow Serving, batch 1, one replica per row, CPU cores 1..20,
latency SLAs 500/750/1000/1500 ms; per row the measured p99 latency, the capacity (req/s
sustained within the SLA) and the saturation throughput.

Mapping, one output row per input row (rows of one (variant, cores) differ only in
``capacity_rps`` + ``capacity_slo_ms``, as greenctl's import contract allows):

- ``variant`` = ``resnet<ARCH>``, ``model`` = ``resnet``, ``resource`` = ``cpu:<CPU>``,
  ``batch`` = 1, ``hardware`` = ``infadapter-cpu``;
- ``throughput_rps`` = ``saturation_tp``; ``capacity_rps`` = ``capacity``;
  ``capacity_slo_ms`` = ``SLA``; ``latency_p99_ms`` = ``p99_latency`` (empty in 16 source rows:
  those rows then carry ``latency_ms`` = 1000 / saturation_tp, a derived lower bound on the
  service time, because the import contract needs one latency column per row);
- ``accuracy`` (ImageNet top-1) and ``load_time_s`` from the InfAdapter README:
  0.69758 / 0.73314 / 0.7613 / 0.77374 / 0.78312 and 6.44 / 6.79 / 6.82 / 7.77 / 8.52 s;
- ``cost_per_hour`` = cores x ``PRICE_PER_CORE_HOUR`` (0.04 USD per vCPU-hour, in the range of
  public-cloud on-demand general-purpose vCPU prices; an assumption, not a measurement);
- ``power_w`` = cores x ``WATTS_PER_CORE`` (10 W per busy core, a modeled figure) and
  ``energy_j`` = power_w / saturation_tp, marked ``modeled`` (the source has no energy).

Usage: ``python bench/infadapter_import.py [-o resnet_infadapter.csv] [--source CSV]`` (default ``bundled:infadapter``), then
``greenctl profile import resnet_infadapter.csv``. Tests and benchmarks call
:func:`load_into_store` instead.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from greenctl.data.bundled import resolve

SOURCE = "bundled:infadapter"

ACCURACY = {18: 0.69758, 34: 0.73314, 50: 0.7613, 101: 0.77374, 152: 0.78312}
LOAD_TIME_S = {18: 6.44, 34: 6.79, 50: 6.82, 101: 7.77, 152: 8.52}
PRICE_PER_CORE_HOUR = 0.04  # USD, assumption (see module docstring)
WATTS_PER_CORE = 10.0  # modeled busy power per core

COLUMNS = [
    "variant",
    "model",
    "resource",
    "batch",
    "hardware",
    "throughput_rps",
    "latency_ms",
    "latency_p99_ms",
    "capacity_rps",
    "capacity_slo_ms",
    "accuracy",
    "load_time_s",
    "cost_per_hour",
    "power_w",
    "energy_j",
]


def convert_rows(source: str | Path = SOURCE) -> list[dict[str, Any]]:
    """Read the InfAdapter CSV and return greenctl profile-import rows (dicts)."""
    out = []
    with open(resolve(source), newline="") as fh:
        for rec in csv.DictReader(fh):
            arch = int(rec["ARCH"])
            cores = int(rec["CPU"])
            sat = float(rec["saturation_tp"])
            p99 = rec["p99_latency"].strip()
            power = cores * WATTS_PER_CORE
            out.append(
                {
                    "variant": f"resnet{arch}",
                    "model": "resnet",
                    "resource": f"cpu:{cores}",
                    "batch": int(rec["BATCH"]),
                    "hardware": "infadapter-cpu",
                    "throughput_rps": sat,
                    "latency_ms": "" if p99 else round(1000.0 / sat, 3),
                    "latency_p99_ms": float(p99) if p99 else "",
                    "capacity_rps": float(rec["capacity"]),
                    "capacity_slo_ms": float(rec["SLA"]),
                    "accuracy": ACCURACY[arch],
                    "load_time_s": LOAD_TIME_S[arch],
                    "cost_per_hour": round(cores * PRICE_PER_CORE_HOUR, 6),
                    "power_w": power,
                    "energy_j": round(power / sat, 6),
                }
            )
    return out


def write_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write rows in greenctl's profile import column order."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def to_records(rows: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """Variant and Profile records for the converted rows (no store needed)."""
    from greenctl.data.records import Profile, Variant

    variants = {}
    profiles = []
    for r in rows:
        variants[r["variant"]] = Variant(
            name=r["variant"],
            family=r["model"],
            accuracy=r["accuracy"],
            accuracy_metric="imagenet-top1",
            accuracy_source="InfAdapter README (torchvision top-1)",
            load_time_s=r["load_time_s"],
            source="imported",
        )
        profiles.append(
            Profile(
                variant=r["variant"],
                resource=r["resource"],
                batch=r["batch"],
                throughput_rps=r["throughput_rps"],
                latency_p50_ms=r["latency_ms"] or None,
                latency_p99_ms=r["latency_p99_ms"] or None,
                hardware=r["hardware"],
                power_w=r["power_w"],
                energy_j=r["energy_j"],
                energy_method="modeled",
                cost_per_hour=r["cost_per_hour"],
                capacity_rps=r["capacity_rps"],
                capacity_slo_ms=r["capacity_slo_ms"],
                source="imported",
            )
        )
    return list(variants.values()), profiles


def load_into_store(store: Any, source: str | Path = SOURCE) -> int:
    """Write the converted variants and profiles into an open greenctl store (one transaction).

    Returns:
        the number of profile rows written.
    """
    variants, profiles = to_records(convert_rows(source))
    with store.transaction():
        for v in variants:
            store.upsert_variant(v)
        store.add_profiles(profiles)
    return len(profiles)


def open_bench_store(path: str | Path) -> Any:
    """A new greenctl store at ``path`` holding InfAdapter's ResNet CPU profiles (the store
    the replay, forecast and bursty-load benches plan over)."""
    from greenctl.data.store import open_store

    store = open_store(path)
    load_into_store(store)
    return store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=str(SOURCE), help="InfAdapter capacity CSV")
    ap.add_argument("-o", "--output", default="-", help="output CSV (default stdout)")
    args = ap.parse_args(argv)
    rows = convert_rows(args.source)
    if args.output == "-":
        w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    else:
        write_csv(rows, args.output)
        print(f"wrote {len(rows)} rows to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

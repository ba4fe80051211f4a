"""Battery: hundreds of bad inputs run through the real ``greenctl``, each case classified.

Every case runs ``greenctl ARGS`` in a subprocess, in a folder of its own holding a copy of a
small seeded store (InfAdapter's ResNet profiles, a Clover carbon trace, synthetic MIG
profiles, a mix, a MIG and a geo plan) and the files the case reads. Cases are generated
systematically: each command against a bad store (read-only file or folder, zero-byte file,
absent store, a folder, random bytes, another SQLite database, an empty ``--db`` or
``GREENCTL_DB``), each output option against a bad path (a folder for a file, a file for a
folder, a missing folder, the filesystem root, an empty value), and bad option values (zero,
NaN, infinite and negative numbers, empty list items, Kubernetes names Kubernetes refuses, a
plan of another kind, an empty request, random bytes as a fake NVML file).

A case ends in one class:

- ``clean``: refused as the README promises (exit 2, an ``Error:`` line on stderr, no
  traceback, stdout empty under ``--json``, the store and every file unchanged, nothing new);
  a case that may succeed (a reader of a zero-byte store) is clean when it changed nothing
  and answered (exit 0, or 2 refusing; ``status`` exits 1 when nothing serves);
- ``traceback``, ``hang`` (30 s), ``changed`` (the store, a file, or a new file or folder),
  ``accepted`` (exit 0 on a bad input), ``wrong-exit`` (another code), ``no-error-line``
  (exit 2 without greenctl's ``Error:`` line, e.g. click's usage box), ``skipped`` (a
  read-only case where permissions do not bind).

As root, cases run as the user ``nobody`` (so that a read-only file is read-only); the cases
that write at the filesystem root run as the caller and remove what they made.

    python bench/battery.py                       # every case, 2 at a time
    python bench/battery.py --quick -j 4          # every fourth case
    python bench/battery.py --list                # also each failing case and its output
    python bench/battery.py --greenctl /other/venv/bin/greenctl   # another build
    python bench/battery.py --only plan-mix       # cases whose id contains this
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 30.0
NOBODY = 65534
CLASSES = ("clean", "traceback", "hang", "changed", "accepted", "wrong-exit", "no-error-line",
           "skipped")  # fmt: skip
STORE = "greenctl.db"
RANDOM = bytes((i * 7919 + 13) % 256 for i in range(4096))  # fixed "random" bytes


@dataclass
class Case:
    """One bad input: argv (``{w}`` is the case's folder), its store and files, expectation."""

    id: str
    argv: list[str]
    store: str = "copy"  # copy ro-file ro-folder empty random other-sqlite
    files: dict[str, bytes | Callable[[Path], bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    expect: str = "refuse"  # refuse, or any: may succeed, must change nothing
    as_caller: bool = False  # run as the caller even as root (writes at the filesystem root)
    answers: tuple[int, ...] = (0, 2)  # exit codes of an answer, for expect="any"
    watch: tuple[str, ...] = ()  # paths outside the folder that must not appear


# -- the commands ------------------------------------------------------------------------------
# (name, argv that succeeds on the seeded store, argv refused after the store opens, --json)
WRITERS = [
    ("plan-mix", ["plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
                  "--budget", "cpu=14"], ["plan", "mix", "--model", "nosuch", "--rate", "50",
                                          "--slo-ms", "750"], True),
    ("plan-mig", ["plan", "mig", "--gpu", "A100-40GB", "--gpus", "2", "--model", "efficientnet",
                  "--rate", "10", "--carbon-intensity", "200"],
     ["plan", "mig", "--gpu", "A100-40GB", "--gpus", "2", "--model", "nosuch", "--rate", "10",
      "--carbon-intensity", "200"], True),
    ("plan-geo", ["plan", "geo", "--sites", "{w}/geo/sites.csv", "--demand",
                  "{w}/geo/demand.csv"],
     ["plan", "geo", "--sites", "{w}/geo/sites.csv", "--demand", "{w}/geo/demand.csv",
      "--family", "nosuch"], True),
    ("carbon-import", ["carbon", "import", "bundled:clover-ciso-sep", "--format", "clover",
                       "--region", "CISO2"], ["carbon", "import", "{w}/bad.csv", "--region", "X"],
     True),
    ("profile-import", ["profile", "import", "{w}/resnet.csv"],
     ["profile", "import", "{w}/bad.csv"], True),
    ("mig-synth", ["mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet", "--prefix",
                   "synthetic"], ["mig", "synth", "--gpu", "A100-40GB", "--family", "nosuch"],
     True),
    ("replan", ["replan", "--plan", "1", "--region", "CISO"],
     ["replan", "--plan", "999", "--region", "CISO"], True),
    ("apply", ["apply", "{w}/small.json", "--dry-run"], ["apply", "999", "--dry-run"], True),
    ("down", ["down"], ["down", "--backend", "nope"], True),
    ("profile-measure", ["profile", "--variant", "tiny-s", "--batch", "1", "--duration", "0.2",
                         "--warmup", "0"], ["profile", "--variant", "nosuch"], True),
    ("forecast-fit", ["forecast", "fit", "--forecaster", "last", "--trace", "{w}/trace.txt"],
     ["forecast", "fit", "--forecaster", "nosuch", "--trace", "{w}/trace.txt"], True),
    ("gpulet-import", ["gpulet", "import", "bundled:gpulet"],
     ["gpulet", "import", "{w}/nosuch"], True),
]  # fmt: skip
READERS = [
    ("profile-list", ["profile", "list"], True),
    ("profile-export", ["profile", "export"], False),
    ("plan-list", ["plan", "list"], True),
    ("carbon-regions", ["carbon", "regions"], True),
    ("carbon-show", ["carbon", "show", "--region", "CISO"], True),
    ("carbon-now", ["carbon", "now", "--region", "CISO"], True),
    ("report-plans", ["report", "plans"], False),
    ("report-profiles", ["report", "profiles"], False),
    ("report-emissions", ["report", "emissions"], False),
    ("simulate", ["simulate", "{w}/mix.json", "--requests", "2000"], True),
    ("status", ["status"], True),  # exit 1: nothing serves
    ("replan-history", ["replan", "--history"], True),
    ("export-k8s", ["export", "k8s", "1", "-o", "{w}/k8s"], True),
]
# a store that is not one: every writer, and these readers, are refused
BAD_STORES = ("random", "other-sqlite", "in-missing-folder", "folder", "empty-db-flag",
              "empty-db-env")  # fmt: skip
BAD_STORE_READERS = ("profile-list", "carbon-show", "report-plans", "simulate", "export-k8s")


def store_cases() -> list[Case]:
    """Each command against each bad store."""
    cases = []
    for name, good, bad, js in WRITERS:
        j = ["--json"] if js else []
        for mode in ("ro-file", "ro-folder"):
            cases.append(Case(f"store-{mode}-{name}", good + j, store=mode))
        cases.append(Case(f"store-empty-refused-{name}", bad + j, store="empty"))
        cases.append(Case(f"store-absent-refused-{name}", ["--db", "{w}/new.db", *bad, *j]))
        cases += [Case(f"store-{m}-{name}", good + j, **_bad_store(m)) for m in BAD_STORES]
    for name, argv, js in READERS:
        j = ["--json"] if js else []
        answers = (0, 1, 2) if name == "status" else (0, 2)
        cases += [
            Case(f"store-ro-file-{name}", argv + j, store="ro-file", expect="any",
                 answers=answers),
            Case(f"store-ro-folder-{name}", argv + j, store="ro-folder", expect="any",
                 answers=answers),
            Case(f"store-empty-{name}", argv + j, store="empty", expect="any", answers=answers),
            Case(f"store-absent-{name}", ["--db", "{w}/new.db", *argv, *j], expect="any",
                 answers=answers),
        ]  # fmt: skip
        if name in BAD_STORE_READERS:
            cases += [Case(f"store-{m}-{name}", argv + j, **_bad_store(m)) for m in BAD_STORES]
    return cases


def _bad_store(mode: str) -> dict:
    """The Case fields of a store that is not one."""
    if mode in ("random", "other-sqlite"):
        return {"store": mode}
    if mode == "in-missing-folder":
        return {"env": {"GREENCTL_DB": "{w}/nofolder/g.db"}}
    if mode == "folder":
        return {"env": {"GREENCTL_DB": "{w}/adir"}}
    if mode == "empty-db-env":
        return {"env": {"GREENCTL_DB": ""}}
    return {"env": {"GREENCTL_DB": ""}, "store": "copy-db-flag"}  # --db "" below


# -- output paths ------------------------------------------------------------------------------
FILE_OUTPUTS = [
    ("report-plans", ["report", "plans", "-o"]),
    ("report-profiles", ["report", "profiles", "-o"]),
    ("report-emissions", ["report", "emissions", "-o"]),
    ("report-savings", ["report", "savings", "--plan", "1", "--baseline", "1", "--region",
                        "CISO", "-o"]),
    ("profile-export", ["profile", "export", "-o"]),
    ("plan-mix", ["plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
                  "--budget", "cpu=14", "-o"]),
    ("plan-mig", ["plan", "mig", "--gpu", "A100-40GB", "--gpus", "2", "--model",
                  "efficientnet", "--rate", "10", "--carbon-intensity", "200", "-o"]),
    ("plan-geo", ["plan", "geo", "--sites", "{w}/geo/sites.csv", "--demand",
                  "{w}/geo/demand.csv", "-o"]),
    ("plan-geo-allocations", ["plan", "geo", "--sites", "{w}/geo/sites.csv", "--demand",
                              "{w}/geo/demand.csv", "--allocations"]),
]  # fmt: skip
FOLDER_OUTPUTS = [
    ("report-charts", ["report", "charts", "--plan", "1", "--region", "CISO", "--out"]),
    ("export-k8s", ["export", "k8s", "1", "-o"]),
    ("export-envoy", ["export", "envoy", "3", "-o"]),
    ("geo-convert", ["geo", "convert-eglb", "bundled:eglb", "--steps", "2", "-o"]),
]


def output_cases() -> list[Case]:
    """Each output option against each bad path."""
    cases = []
    bad = {
        "missing-folder": "{w}/nodir/out",
        "parent-is-file": "{w}/afile/out",
        "empty": "",
    }
    for name, argv in FILE_OUTPUTS:
        for label, path in {**bad, "a-folder": "{w}/adir"}.items():
            cases.append(Case(f"out-{label}-{name}", [*argv, path]))
        cases.append(_root_case(f"out-root-{name}", argv))
    for name, argv in FOLDER_OUTPUTS:
        for label, path in {**bad, "a-file": "{w}/afile"}.items():
            cases.append(Case(f"out-{label}-{name}", [*argv, path]))
        cases.append(_root_case(f"out-root-{name}", argv))
    cases.append(Case("out-a-file-demo", ["demo", "--quick", "--out", "{w}/afile"]))
    cases.append(Case("out-missing-folder-demo", ["demo", "--quick", "--out", "{w}/nodir/x"]))
    return cases


def _root_case(cid: str, argv: list[str]) -> Case:
    """A case whose output is a new entry in the filesystem root."""
    target = f"/greenctl-battery-{cid}"
    return Case(cid, [*argv, target], as_caller=True, watch=(target,))


# -- bad option values -------------------------------------------------------------------------
def _variants(prefix: str, base: list[str], values: list[tuple[str, list[str]]]) -> list[Case]:
    return [Case(f"{prefix}-{label}", [*base, *extra]) for label, extra in values]


def _numbers(option: str, *values: str) -> list[tuple[str, list[str]]]:
    return [(f"{option.strip('-')}={v}", [option, v]) for v in values]


MIX = ["plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750", "--budget",
       "cpu=14"]  # fmt: skip
MIG = ["plan", "mig", "--gpu", "A100-40GB", "--gpus", "2", "--model", "efficientnet",
       "--carbon-intensity", "200"]  # fmt: skip
GEO = ["plan", "geo", "--sites", "{w}/geo/sites.csv", "--demand", "{w}/geo/demand.csv"]
SIM = ["simulate", "{w}/mix.json", "--requests", "2000"]
# a plan every machine can run (2 cores): what apply --dry-run is given
SMALL = ["plan", "mix", "--model", "resnet", "--rate", "5", "--slo-ms", "1000", "--budget",
         "cpu=2"]  # fmt: skip
NAN, INF = "nan", "inf"


def option_cases() -> list[Case]:
    """Bad values of the planning, simulation and replanning options."""
    cases = []
    mix_rate = ["plan", "mix", "--model", "resnet", "--slo-ms", "750", "--budget", "cpu=14"]
    cases += _variants("plan-mix", mix_rate, _numbers("--rate", "0", NAN, INF, "-1", "1e308"))
    cases += _variants("plan-mix", MIX, [
        *_numbers("--slo-ms", NAN, INF, "-5"),
        *_numbers("--min-accuracy", NAN, "-1", "2"),
        *_numbers("--alpha", NAN, "-1"), *_numbers("--beta", NAN), *_numbers("--gamma", "-1"),
        *_numbers("--headroom", "-1", NAN, INF), *_numbers("--time-limit", "0", "-1", NAN),
        *_numbers("--carbon-intensity", NAN, INF),
        ("budget-negative", ["--budget", "cpu=-1"]), ("budget-nan", ["--budget", "cpu=nan"]),
        ("budget-inf", ["--budget", "cpu=inf"]), ("budget-empty", ["--budget", ""]),
        ("current-mig-plan", ["--current", "{w}/mig.json"]),
        ("current-geo-plan", ["--current", "{w}/geo.json"]),
        ("current-empty", ["--current", ""]), ("model-empty", ["--model", ""]),
        ("percentile-empty", ["--percentile", ""]), ("region-empty", ["--region", ""]),
    ])  # fmt: skip
    mig_rate = [*MIG, "--rate"]
    cases += [Case(f"plan-mig-rate={v}", [*mig_rate, v]) for v in ("0", NAN, "-1", "1e308")]
    cases += _variants("plan-mig", [*MIG, "--rate", "10"], [
        *_numbers("--gpus", "-1", "0", "100000"), *_numbers("--lambda", NAN, "-0.1"),
        *_numbers("--sla-ms", NAN, "0", "-1"), *_numbers("--max-accuracy-loss", NAN, "-1"),
        *_numbers("--time-limit", "-1", NAN), *_numbers("--base-carbon-intensity", NAN, "-1"),
        ("current-mix-plan", ["--current", "{w}/mix.json"]),
        ("current-geo-plan", ["--current", "{w}/geo.json"]),
    ])  # fmt: skip
    cases.append(Case("plan-mig-carbon-nan", [*MIG[:-2], "--carbon-intensity", NAN,
                                              "--rate", "10"]))  # fmt: skip
    cases += _variants("plan-geo", GEO, [
        *_numbers("--mu-carbon", NAN, "-1"), *_numbers("--mu-water", NAN, "-1"),
        *_numbers("--eta", "0", "-1", NAN), *_numbers("--z-max", "-1", NAN),
        *_numbers("--horizon", "0", "-1"), *_numbers("--min-accuracy", NAN, "2"),
        *_numbers("--weight-carbon", "-1", NAN), *_numbers("--weight-water", "-1"),
    ])  # fmt: skip
    cases += _variants("simulate", SIM, [
        *_numbers("--rate", NAN, INF, "1e308"), *_numbers("--duration", "-1", NAN, "0"),
        *_numbers("--requests", "0", "-1"), *_numbers("--pue", "0.5", NAN),
        *_numbers("--wue", "-1", NAN), *_numbers("--ewif", "-1"),
        *_numbers("--device-idle-power", "-1", NAN), *_numbers("--slo-ms", NAN, "0", "-1"),
        *_numbers("--queue-limit", "-1"), *_numbers("--carbon-intensity", NAN, "-1"),
        ("scale-negative", ["--trace", "{w}/trace.txt", "--scale", "-1"]),
        ("scale-nan", ["--trace", "{w}/trace.txt", "--scale", NAN]),
    ])  # fmt: skip
    cases += _variants("replan", ["replan", "--plan", "1", "--region", "CISO"], [
        *_numbers("--threshold", NAN, "-1"), *_numbers("--margin", NAN, "-1"),
        *_numbers("--min-dwell", "-5m", ""), *_numbers("--at", "yesterday"),
        ("rate-nan", ["--rate", "resnet=nan"]), ("rate-negative", ["--rate", "resnet=-1"]),
        ("rate-no-model", ["--rate", "=5"]),
        ("rate-no-value", ["--rate", "resnet="]), ("rate-absurd", ["--rate", "resnet=1e308"]),
    ])  # fmt: skip
    # (--rate resnet=0 is a forecast of no load: planned at a trickle, a valid replan)
    cases += [
        Case("replan-plan-empty", ["replan", "--plan", ""]),
        Case("replan-history-limit", ["replan", "--history", "--limit", "-1"]),
    ]
    return cases


def apply_cases() -> list[Case]:
    """apply --dry-run: bad options and bad plan documents (nothing may start)."""
    base = ["apply", "{w}/small.json", "--dry-run"]
    cases = _variants("apply", base, [
        *_numbers("--port", "-1", "70000"), *_numbers("--verify-duration", NAN, "-1"),
        ("host-empty", ["--host", ""]), ("loader-missing", ["--loader", "nosuch_mod_x:build"]),
        ("policy", ["--policy", "nope"]), ("ray-port", ["--ray-http-port", "-1"]),
    ])  # fmt: skip
    docs = {
        "request-empty": lambda d: d.update(request={}),
        "request-rate-zero": lambda d: d["request"].update(rate_rps=0),
        "request-rate-nan": lambda d: d["request"].update(rate_rps=float("nan")),
        "request-rate-absurd": lambda d: d["request"].update(rate_rps=1e308),
        "request-slo-nan": lambda d: d["request"].update(slo_ms=float("nan")),
        "deployments-empty": lambda d: d.update(deployments=[]),
        "count-negative": lambda d: d["deployments"][0].update(count=-1),
        "batch-zero": lambda d: d["deployments"][0].update(batch=0),
        "quota-nan": lambda d: d["deployments"][0].update(quota_rps=float("nan")),
        "variant-empty": lambda d: d["deployments"][0].update(variant=""),
        "kind-other": lambda d: d.update(kind="nosuch"),
    }
    # the request is what the plan was made for; apply and simulate run its deployments, and
    # replan (which plans it again) refuses a bad request: here they may answer, changing nothing
    answered = {"request-empty", "request-rate-zero", "request-rate-absurd"}
    for label, mutate in docs.items():
        for cmd in (["apply", "{w}/p.json", "--dry-run"], ["simulate", "{w}/p.json"]):
            cases.append(Case(f"{cmd[0]}-plan-{label}", cmd, files={"p.json": _plan_doc(mutate)},
                              expect="any" if label in answered else "refuse"))  # fmt: skip
    return cases


def _plan_doc(mutate: Callable[[dict], object]) -> Callable[[Path], bytes]:
    """The seeded small mix plan with ``mutate`` applied, made with the case's folder."""

    def make(seed_dir: Path) -> bytes:
        doc = json.loads((seed_dir / "small.json").read_text())
        mutate(doc)
        return json.dumps(doc).encode()

    return make


def other_cases() -> list[Case]:
    """Export names, load generation, fake NVML, forecasts, profiling, carbon, mig, cron."""
    k8s = ["export", "k8s", "1", "-o", "{w}/k8s"]
    cases = _variants("export-k8s", k8s, [
        ("namespace-upper", ["--namespace", "Bad_NS"]), ("namespace-empty", ["--namespace", ""]),
        ("namespace-long", ["--namespace", "a" * 64]), ("namespace-dash", ["--namespace", "-x"]),
        ("image-space", ["--image", "bad image"]), ("image-empty", ["--image", ""]),
        ("image-upper", ["--image", "UPPER/Case:tag"]), ("name-space", ["--name", "Bad Name"]),
        *_numbers("--gpus-per-node", "0", "-1"),
    ])  # fmt: skip
    load = ["loadgen", "--endpoint", "http://127.0.0.1:9", "--model", "tiny"]
    cases += _variants("loadgen", load, [
        ("rate-zero", ["--rate", "0", "--duration", "1"]),
        ("rate-nan", ["--rate", NAN, "--duration", "1"]),
        ("rate-inf", ["--rate", INF, "--duration", "1"]),
        ("duration-negative", ["--rate", "5", "--duration", "-1"]),
        ("duration-nan", ["--rate", "5", "--duration", NAN]),
        ("scale-negative", ["--trace", "{w}/trace.txt", "--scale", "-1", "--duration", "1"]),
    ])  # fmt: skip
    for label, content in (("random", RANDOM), ("empty", b""), ("object", b"{}"),
                           ("list", b"[]"), ("gpus-text", b'{"gpus": "x"}')):  # fmt: skip
        for cmd in (["hw", "--json"], ["profile", "--gpus", "--cpus", "none", "--variant",
                                       "tiny-s", "--duration", "0.2"]):  # fmt: skip
            cases.append(Case(f"fake-nvml-{label}-{cmd[0]}", cmd, files={"nvml.json": content},
                              env={"GREENCTL_FAKE_NVML": "{w}/nvml.json"}))  # fmt: skip
    cases.append(Case("fake-nvml-folder-hw", ["hw"], env={"GREENCTL_FAKE_NVML": "{w}/adir"}))
    fit = ["forecast", "fit", "--forecaster", "last", "--trace", "{w}/trace.txt"]
    cases += _variants("forecast-fit", fit, [
        *_numbers("--train-days", "-1", NAN), *_numbers("--window", "0", "-1"),
        *_numbers("--quantile", "2", NAN), ("name-empty", ["--name", ""]),
    ])  # fmt: skip
    cases += _variants("forecast-fit-seasonal", [*fit[:3], "seasonal-naive", *fit[4:]],
                       _numbers("--period", "0", "-1"))  # fmt: skip
    for label, content in (("nan", b"1 2 nan 4\n"), ("negative", b"-1 -2 -3\n"),
                           ("inf", b"1 inf 2\n"), ("empty", b""), ("random", RANDOM)):  # fmt: skip
        cases.append(Case(f"forecast-trace-{label}", [*fit[:-1], "{w}/t.txt"],
                          files={"t.txt": content}))  # fmt: skip
    prof = ["profile", "--variant", "tiny-s", "--duration", "0.2", "--warmup", "0"]
    cases += _variants("profile", prof, [
        ("variant-empty-item", ["--variant", "tiny-m,,tiny-l"]),
        ("batch-empty-item", ["--batch", "1,,2"]), *_numbers("--batch", "0", "-1", "100000"),
        ("cpus-empty-item", ["--cpus", "1,,2"]), *_numbers("--cpus", "-1", "0"),
        *_numbers("--requests", "0", "-1"), ("mps-empty-item", ["--mps", "25,,50"]),
    ])  # fmt: skip
    cases.append(Case("profile-duration-nan", ["profile", "--variant", "tiny-s", "--duration",
                                               NAN]))  # fmt: skip
    cases += [
        Case("profile-model-path-accuracy-nan", ["profile", "--model-path", "{w}/m.pt",
             "--input-shape", "3", "--accuracy", NAN], files={"m.pt": RANDOM}),
        Case("profile-model-path-shape-empty-item", ["profile", "--model-path", "{w}/m.pt",
             "--input-shape", "3,,4"], files={"m.pt": RANDOM}),
    ]  # fmt: skip
    return cases + _file_cases()


def _file_cases() -> list[Case]:
    """Bad input files and names for the importers, mig synth and cron."""
    cases = []
    carbon = {"nan": b"time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,nan\n",
              "inf": b"time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,inf\n",
              "header-only": b"time,carbon_g_per_kwh\n", "empty": b"", "random": RANDOM,
              "duplicate-time": b"time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,1\n"
                                b"2021-03-01T00:00:00Z,2\n"}  # fmt: skip
    for label, content in carbon.items():
        cases.append(Case(f"carbon-import-{label}", ["carbon", "import", "{w}/c.csv",
                          "--region", "X"], files={"c.csv": content}))  # fmt: skip
    clover = ["carbon", "import", "bundled:clover-ciso-sep", "--format", "clover"]
    cases += _variants("carbon-import-clover", clover, [
        ("start-bad", ["--region", "X", "--start", "yesterday"]),
        ("kind-bad", ["--region", "X", "--kind", "nope"]), ("region-empty", ["--region", ""]),
    ])  # fmt: skip
    header = b"variant,model,resource,batch,throughput_rps,latency_ms,accuracy\n"
    profiles = {"nan-accuracy": header + b"v1,m,cpu:1,1,10,5,nan\n",
                "inf-latency": header + b"v1,m,cpu:1,1,10,inf,0.7\n",
                "zero-batch": header + b"v1,m,cpu:1,0,10,5,0.7\n",
                "header-only": header, "empty": b"", "random": RANDOM,
                "empty-resource": header + b"v1,m,,1,10,5,0.7\n"}  # fmt: skip
    for label, content in profiles.items():
        cases.append(Case(f"profile-import-{label}", ["profile", "import", "{w}/p.csv"],
                          files={"p.csv": content}))  # fmt: skip
    synth = ["mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet"]
    cases += _variants(
        "mig-synth",
        synth,
        [("prefix-empty", ["--prefix", ""]), ("prefix-space", ["--prefix", "a b"])],
    )
    cases += [Case("mig-synth-gpu-empty", ["mig", "synth", "--gpu", "", "--family", "x"])]
    cron = ["cron", "install", "--print", "--every"]
    cases += [Case(f"cron-every-{v or 'empty'}", [*cron, v, "--", "replan"])
              for v in ("0m", "", "-5m", "nan")]  # fmt: skip
    return cases


def all_cases() -> list[Case]:
    cases = store_cases() + output_cases() + option_cases() + apply_cases() + other_cases()
    seen = Counter(c.id for c in cases)
    assert not [k for k, n in seen.items() if n > 1], [k for k, n in seen.items() if n > 1]
    return cases


# -- the seeded store --------------------------------------------------------------------------
def seed(greenctl: str, folder: Path) -> None:
    """Make the store every case copies, and the files cases read, with the greenctl tested."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GREENCTL_DB": str(folder / STORE), "COLUMNS": "200"}
    subprocess.run([sys.executable, str(REPO / "bench" / "infadapter_import.py"), "-o",
                    str(folder / "resnet.csv")], check=True, capture_output=True)  # fmt: skip
    for argv in (
        ["profile", "import", str(folder / "resnet.csv")],
        ["carbon", "import", "bundled:clover-ciso-march", "--format", "clover", "--region",
         "CISO"],
        ["mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet"],
        [*MIX, "-o", str(folder / "mix.json")],
        [*MIG, "--rate", "10", "-o", str(folder / "mig.json")],
        ["geo", "convert-eglb", "bundled:eglb", "--steps", "24", "-o", str(folder / "geo")],
        [*GEO, "-o", str(folder / "geo.json")],
        [*SMALL, "-o", str(folder / "small.json")],
    ):  # fmt: skip
        argv = [a.replace("{w}", str(folder)) for a in argv]
        r = subprocess.run([greenctl, *argv], env=env, capture_output=True, text=True,
                           cwd=folder)  # fmt: skip
        if r.returncode:
            raise SystemExit(f"seeding failed: greenctl {' '.join(argv)}\n{r.stderr}")
    (folder / "trace.txt").write_text(" ".join(str(5 + i % 7) for i in range(600)) + "\n")
    (folder / "bad.csv").write_bytes(RANDOM)
    (folder / "afile").write_text("not a folder\n")
    (folder / "adir").mkdir()


def _prepare(case: Case, seed_dir: Path, w: Path) -> None:
    """The case's folder: the seeded files, its store, its own files."""
    for item in seed_dir.iterdir():
        if item.name.startswith(STORE):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, w / item.name)
    store = w / STORE
    if case.store in ("copy", "ro-file", "ro-folder", "copy-db-flag"):
        shutil.copy2(seed_dir / STORE, store)
    elif case.store == "empty":
        store.write_bytes(b"")
    elif case.store == "random":
        store.write_bytes(RANDOM)
    elif case.store == "other-sqlite":
        con = sqlite3.connect(store)
        con.execute("create table notes (body text)")
        con.commit()
        con.close()
    for name, content in case.files.items():
        (w / name).write_bytes(content if isinstance(content, bytes) else content(seed_dir))


def _demote(case: Case, w: Path) -> tuple[list[str], bool]:
    """The prefix that runs the case as nobody (as root), and whether the read-only store of
    the case is read-only for whoever runs it."""
    root = os.geteuid() == 0 and not case.as_caller
    if root:
        for dirpath, dirnames, filenames in os.walk(w):
            for name in [*dirnames, *filenames]:
                os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)
        os.chown(w, NOBODY, NOBODY)
    if case.store == "ro-file":
        os.chmod(w / STORE, 0o444)
    if case.store == "ro-folder":
        os.chmod(w, 0o555)
    binds = True
    if case.store.startswith("ro-"):
        target = w / STORE if case.store == "ro-file" else w
        binds = not _writable_as(target, NOBODY if root else None)
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return (as_nobody if root else []), binds


def _writable_as(path: Path, uid: int | None) -> bool:
    """Whether ``path`` is writable for ``uid`` (None: this process)."""
    if uid is None:
        return os.access(path, os.W_OK)
    st = path.stat()
    return bool(st.st_mode & 0o200) if st.st_uid == uid else bool(st.st_mode & 0o002)


# -- running and classifying -------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    cls: str
    code: int | None
    why: str
    stderr: str
    seconds: float = 0.0


def store_state(path: Path) -> str:
    """The store's logical content (its SQL dump), else its bytes; "absent" when missing."""
    if not path.exists():
        return "absent"
    if path.is_dir():
        return "folder"
    raw = hashlib.sha256(path.read_bytes()).hexdigest()
    if not path.stat().st_size:
        return "empty"
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            h = hashlib.sha256()
            for line in con.iterdump():
                h.update(line.encode())
            return "sql:" + h.hexdigest()
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return "bytes:" + raw


def tree(w: Path) -> dict[str, str]:
    """Every file under ``w`` (but the store and SQLite's files) and its content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(w):
        for d in dirnames:
            out[Path(dirpath, d).relative_to(w).as_posix() + "/"] = "dir"
        for name in filenames:
            if name.startswith((STORE, "new.db")):
                continue
            p = Path(dirpath, name)
            out[p.relative_to(w).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_case(case: Case, greenctl: str, seed_dir: Path, base: Path) -> Outcome:
    w = Path(tempfile.mkdtemp(prefix=f"{case.id[:40]}-", dir=base))
    os.chmod(w, 0o755)
    try:
        _prepare(case, seed_dir, w)
        before_store = _state_of_copy(w / STORE)
        before_tree = tree(w)
        user, binds = _demote(case, w)
        if not binds:
            return Outcome(case, "skipped", None, "permissions do not bind", "")
        t0 = time.monotonic()
        code, out, err, hung = _run(case, greenctl, w, user)
        seconds = time.monotonic() - t0
        os.chmod(w, 0o755)
        outcome = _classify(case, w, code, out, err, hung, before_store, before_tree)
        outcome.seconds = seconds
        return outcome
    finally:
        for target in case.watch:
            p = Path(target)
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists():
                p.unlink()
        os.chmod(w, 0o755)
        shutil.rmtree(w, ignore_errors=True)


def _state_of_copy(store: Path) -> str:
    """:func:`store_state` read from a copy, so that reading it leaves no file beside it."""
    if not store.exists():
        return "absent"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy2(store, Path(tmp) / STORE)
        return store_state(Path(tmp) / STORE)


def _run(case: Case, greenctl: str, w: Path, user: list[str]) -> tuple[int | None, str, str, bool]:
    """Run the case; (exit code, stdout, stderr, hung)."""
    sub = {"{w}": str(w)}
    argv = [_fill(a, sub) for a in case.argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENCTL_")}
    env.update(HOME=str(w), XDG_DATA_HOME=str(w / "xdg"), GREENCTL_DB=str(w / STORE),
               GREENCTL_STATE_DIR=str(w / "state"), COLUMNS="200", NO_COLOR="1",
               TMPDIR=str(w))  # fmt: skip
    env.update({k: _fill(v, sub) for k, v in case.env.items()})
    if case.store == "copy-db-flag":
        argv = ["--db", "", *argv]
    proc = subprocess.Popen([*user, greenctl, *argv], cwd=w, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err, True
    finally:
        _stop_leftovers(w, greenctl, env)


def _stop_leftovers(w: Path, greenctl: str, env: dict) -> None:
    """Stop anything a case started (an apply that went past --dry-run): greenctl down."""
    if (w / "state").exists() and any((w / "state").iterdir()):
        subprocess.run([greenctl, "down"], cwd=w, env={**env, "GREENCTL_DB": str(w / STORE)},
                       capture_output=True, timeout=60)  # fmt: skip


def _fill(text: str, sub: dict[str, str]) -> str:
    for k, v in sub.items():
        text = text.replace(k, v)
    return text


def _classify(case: Case, w: Path, code, out: str, err: str, hung: bool, before_store: str,
              before_tree: dict) -> Outcome:  # fmt: skip
    def outcome(cls: str, why: str) -> Outcome:
        return Outcome(case, cls, code, why, (err + out)[-3000:])

    if hung:
        return outcome("hang", f"no exit within {TIMEOUT_S:.0f} s")
    if "Traceback (most recent call last)" in err + out:
        return outcome("traceback", err.strip().splitlines()[-1] if err.strip() else "")
    changed = _changes(case, w, before_store, before_tree)
    if changed:
        return outcome("changed", changed)
    if case.expect == "any" and code in case.answers:
        return outcome("clean", "changed nothing")
    if code == 0:
        return outcome("accepted", "exit 0 on a bad input")
    if code != 2:
        return outcome("wrong-exit", f"exit {code}")
    if not any(line.startswith("Error:") for line in err.splitlines()):
        return outcome("no-error-line", "exit 2 without an Error: line on stderr")
    if "--json" in case.argv and out.strip():
        return outcome("wrong-exit", "stdout not empty under --json")
    return outcome("clean", "")


def _changes(case: Case, w: Path, before_store: str, before_tree: dict) -> str:
    """What the case changed: the store, a file, a new file or folder; '' when nothing."""
    after = store_state(w / STORE)
    if after != before_store:
        return f"store changed ({before_store[:12]} -> {after[:12]})"
    if (w / "new.db").exists():
        return "a new store file new.db"
    now = tree(w)
    mine = ("state/", "xdg/", "k8s/") if case.expect == "any" else ("state/", "xdg/")
    new = [n for n in sorted(set(now) - set(before_tree)) if not n.startswith(mine)]
    if new:
        return f"new files: {', '.join(new[:4])}"
    edited = sorted(k for k in before_tree if now.get(k) != before_tree[k])
    if edited:
        return f"files changed: {', '.join(edited[:4])}"
    made = [t for t in case.watch if os.path.lexists(t)]
    if made:
        return f"made {', '.join(made)}"
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--greenctl", default=shutil.which("greenctl") or "greenctl")
    ap.add_argument("-j", type=int, default=2, help="cases at a time (default 2)")
    ap.add_argument("--quick", action="store_true", help="every fourth case")
    ap.add_argument("--list", action="store_true", help="print each failing case")
    ap.add_argument("--only", default=None, help="cases whose id contains this text")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args()
    cases = all_cases()
    if args.only:
        cases = [c for c in cases if args.only in c.id]
    if args.quick:
        cases = cases[::4]
    base = Path(tempfile.mkdtemp(prefix="greenctl-battery-"))
    os.chmod(base, 0o755)
    t0 = time.monotonic()
    try:
        seed(args.greenctl, base / "seed")
        with ThreadPoolExecutor(args.j) as pool:
            outcomes = list(pool.map(lambda c: run_case(c, args.greenctl, base / "seed", base),
                                     cases))  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return report(outcomes, args, time.monotonic() - t0)


def report(outcomes: list[Outcome], args: argparse.Namespace, wall_s: float) -> int:
    counts = Counter(o.cls for o in outcomes)
    failing = [o for o in outcomes if o.cls not in ("clean", "skipped")]
    if args.json:
        print(json.dumps({"greenctl": args.greenctl, "cases": len(outcomes),
                          "counts": {c: counts.get(c, 0) for c in CLASSES},
                          "wall_s": round(wall_s, 1),
                          "failing": [{"id": o.case.id, "class": o.cls, "exit": o.code,
                                       "why": o.why} for o in failing]}, indent=2))  # fmt: skip
        return 1 if failing else 0
    print(f"greenctl battery: {len(outcomes)} cases, {args.greenctl}, {wall_s:.0f} s")
    for cls in CLASSES:
        print(f"  {cls:<14} {counts.get(cls, 0):>4}")
    if args.list:
        slow = sorted(outcomes, key=lambda o: -o.seconds)[:10]
        print("slowest: " + ", ".join(f"{o.case.id} {o.seconds:.1f} s" for o in slow))
        for o in sorted(failing, key=lambda o: (o.cls, o.case.id)):
            print(f"\n[{o.cls}] {o.case.id}: {o.why}\n  greenctl {' '.join(o.case.argv)}")
            tail = [line for line in o.stderr.strip().splitlines() if line.strip()][-3:]
            for line in tail:
                print(f"    | {line[:200]}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())

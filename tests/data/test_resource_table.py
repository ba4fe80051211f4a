"""The one table of resource kinds (data/resources.py): every kind says everything greenctl
decides by a kind, nothing else in the code switches on kind strings, and the table
reproduces what the executors, Ray and Kubernetes got before it existed."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment
from greenctl.data.resources import (
    GPU_REPLICA_CPUS,
    KNOWN_KINDS,
    PIN_CORES,
    PIN_GPU,
    PIN_MIG_INSTANCE,
    RESOURCE_KINDS,
    ResourceKind,
    kind_of,
    parse_resource,
    runnable_resource,
)
from greenctl.executor.deploy import k8s_export
from greenctl.executor.deploy.ray_backend import actor_options

REPO = Path(__file__).resolve().parents[2]
KIND_NAMES = {"cpu", "gpu", "mig", "mps"}

# Files other work owns right now: their kind switches are listed in issue 17's notes and
# move to the table in their own step. Remove a file from here once it asks the table.
OWNED_ELSEWHERE = {
    "data/resources.py",  # the table itself
}

# What remains and why: (file, the expression as ast.unparse writes it). A new comparison
# against a kind name fails the scan: ask the kind record (``parse_resource(x).spec``,
# ``kind_of(label)``) instead, or add a field to the table.
ALLOWED = {
    # the mig planner checks that the running plan it re-places is one of its own
    ("planner/mig/solve.py", "current.kind != 'mig'"),
    # a torch device name, not a resource kind
    ("profiler/runner.py", "device != 'cpu'"),
    # an energy meter's kind ("cpu" RAPL or "nvml"), not a resource kind
    ("profiler/harness.py", "kind == 'cpu'"),
    # strip the "mig:" prefix of a profile name (label parsing, not a decision by kind)
    ("data/mig_geometry.py", "name.startswith('mig:')"),
    ("data/mig_geometry.py", "n.startswith('mig:')"),
    ("data/mig_parted.py", "p.startswith('mig:')"),
}


def _kind_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in KIND_NAMES


def _names_kind(node: ast.AST) -> bool:
    if _kind_literal(node):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_kind_literal(e) for e in node.elts)
    return False


def kind_switches() -> list[tuple[str, str]]:
    """Comparisons (``==``, ``in``, subset tests, ...) against a kind name, and
    ``startswith``/``endswith`` tests of a kind prefix, in the code folders."""
    found = []
    for folder in ("data", "profiler", "planner", "executor", "cli"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in OWNED_ELSEWHERE:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                hit = False
                if isinstance(node, ast.Compare):
                    hit = any(_names_kind(x) for x in (node.left, *node.comparators))
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("startswith", "endswith")
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    hit = node.args[0].value.split(":")[0] in KIND_NAMES
                if hit:
                    found.append((rel, ast.unparse(node)))
    return found


# -- (a) every kind has every field ---------------------------------------------------------
@pytest.mark.parametrize("name", sorted(RESOURCE_KINDS))
def test_every_kind_has_every_field(name: str) -> None:
    k = RESOURCE_KINDS[name]
    assert k.name == name and name in KNOWN_KINDS
    for f in dataclasses.fields(ResourceKind):
        assert hasattr(k, f.name), f.name
    assert k.form.startswith(f"{name}:") and k.form_hint.startswith(k.form)
    assert k.runnable
    assert k.pinning in (PIN_CORES, PIN_GPU, PIN_MIG_INSTANCE)
    assert k.budget_unit
    ex = parse_resource(k.example)
    assert ex.spec is k
    assert ex.amount > 0
    assert k.ray_actor_options(ex.size)["num_cpus"] > 0
    assert k.k8s_resources(ex.size, memory="512Mi") is not None
    assert isinstance(k.pin_env(ex.size, device="0"), dict)
    if k.share_capacity is not None:  # a kind that splits a GPU says how to name all of it
        assert k.whole_share and 0 < (k.share_units(ex.size) or 0) <= k.share_capacity
    if k.size_ok is not None:
        assert k.size_ok(ex.size) and k.size_error


def test_an_unknown_kind_plans_but_does_not_run() -> None:
    r = parse_resource("tpu:4")
    assert not r.spec.runnable and r.amount == 4.0
    assert r.spec.k8s_resources(r.size, memory="1Mi") is None
    with pytest.raises(InputError, match="not 'tpu'"):
        runnable_resource("tpu:4", field="deployments[0].resource")


# -- (b) no switches on kind strings elsewhere ---------------------------------------------
def test_no_kind_switches_outside_the_table() -> None:
    found = kind_switches()
    new = sorted(set(found) - ALLOWED)
    assert not new, (
        "switches on resource-kind strings outside data/resources.py; ask the kind record "
        f"(parse_resource(x).spec / kind_of(label)) instead: {new}"
    )
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"allow-list entries no longer in the code, remove them: {stale}"


# -- (c) the old behaviour ------------------------------------------------------------------
def test_ray_actor_options_unchanged() -> None:
    assert actor_options("cpu:2") == {"num_cpus": 2.0}
    assert actor_options("gpu:H100") == {"num_cpus": GPU_REPLICA_CPUS, "num_gpus": 1.0}
    assert actor_options("mps:40") == {"num_cpus": 0.25, "num_gpus": pytest.approx(0.4)}
    assert actor_options("mig:3g.40gb") == {"num_cpus": 0.25, "resources": {"mig-3g.40gb": 1.0}}
    assert actor_options("tpu:v4") == {"num_cpus": 0.25, "resources": {"tpu-v4": 1.0}}


def _k8s(resource: str, memory_mb: float = 1000) -> tuple[dict, list]:
    dep = Deployment(model="m", variant="v", resource=resource, count=1)
    return k8s_export._resources(dep, memory_mb=memory_mb)


def test_k8s_resource_names_unchanged() -> None:
    mem = "1500Mi"
    assert _k8s("cpu:3") == (
        {"requests": {"cpu": "3", "memory": mem}, "limits": {"cpu": "3", "memory": mem}},
        [],
    )
    gpu = {
        "requests": {"cpu": "1", "memory": mem},
        "limits": {"nvidia.com/gpu": "1", "memory": mem},
    }
    assert _k8s("gpu:A100") == (gpu, [])
    assert _k8s("mps:40") == (gpu, [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "40"}])
    assert _k8s("mig:1g.10gb") == (
        {
            "requests": {"cpu": "1", "memory": mem},
            "limits": {"nvidia.com/mig-1g.10gb": "1", "memory": mem},
        },
        [],
    )
    assert _k8s("cpu:1", memory_mb=None)[0]["limits"]["memory"] == "384Mi"
    with pytest.raises(InputError, match="no Kubernetes mapping") as err:
        _k8s("tpu:4")
    assert err.value.hint == ("Kubernetes export handles cpu:N, gpu:MODEL, mig:PROFILE and mps:PCT")


def test_pinning_env_unchanged() -> None:
    """What executor/deploy/apply.py put in an executor's environment for each kind (the fake-GPU
    apply tests check the same end to end for mig and mps)."""
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    assert kind_of("cpu:2").pin_env("2", device=None) == {}
    assert RESOURCE_KINDS["gpu"].pin_env("A100", device=uuid) == {"CUDA_VISIBLE_DEVICES": uuid}
    assert RESOURCE_KINDS["mig"].pin_env("1g.10gb", device="MIG-x") == {
        "CUDA_VISIBLE_DEVICES": "MIG-x"
    }
    assert RESOURCE_KINDS["mps"].pin_env("40", device=uuid) == {
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
    }
    # which instances pin cores, which run on CUDA (the executor daemon's device)
    assert [k for k, r in RESOURCE_KINDS.items() if r.pins_cores] == ["cpu"]
    assert sorted(k for k, r in RESOURCE_KINDS.items() if r.accelerator) == ["gpu", "mig", "mps"]
    assert [k for k, r in RESOURCE_KINDS.items() if r.thread_percentage] == ["mps"]


def test_labels_and_budgets_unchanged() -> None:
    assert parse_resource("cpu:4").cpu_cores == 4 and parse_resource("gpu:A100").cpu_cores is None
    assert parse_resource("mps:30").mps_percent == 30
    assert parse_resource("mig:3g.40gb").mig_compute_slices == 3
    assert parse_resource("cpu:4").amount == 4.0
    assert parse_resource("mps:30").amount == 30.0
    assert parse_resource("gpu:A100").amount == 1.0
    for bad, field in (("cpu:0", "cores"), ("mps:101", "percentage"), ("mig:9x", "MIG profile")):
        with pytest.raises(InputError, match=field):
            parse_resource(bad)
    with pytest.raises(InputError) as err:
        parse_resource("nonsense")
    assert err.value.hint == (
        "use cpu:N (cores), gpu:MODEL, mig:PROFILE (e.g. mig:1g.10gb), mps:PCT (1-100) or "
        "another kind:size label"
    )

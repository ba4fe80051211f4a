"""One rule for a plan's dispatch policy, and one smooth weighted round robin.

predict, simulate, ``apply`` (local, dry run), the Ray backend and the Kubernetes export
must pick the same policy for every plan (issue 17): a plan is predicted under the policy it
is served with, and the plan's own choice (or ``--policy``) wins everywhere.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import PLAN_KINDS, Deployment, Plan
from greenctl.executor.deploy import ray_backend
from greenctl.executor.deploy.apply import apply_plan
from greenctl.executor.deploy.k8s_export import build_k8s_export
from greenctl.executor.kinds import get_kind
from greenctl.executor.runtime.dispatcher import ModelRoute
from greenctl.planner.core import simulator
from greenctl.planner.core.policy import POLICIES, SmoothWRR, default_policy, plan_policy
from greenctl.planner.core.simulator import evaluate_plan, stride_assign
from hypothesis import given, settings
from hypothesis import strategies as st

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
BATCHES = ((1, 1), (1, 4))


def _plan(kind: str, batches: tuple[int, ...], own: str | None = None, where: str = "") -> Plan:
    deps = [
        Deployment("m", f"v{i}", "cpu:1", count=1, batch=b, quota_rps=10.0)
        for i, b in enumerate(batches)
    ]
    request: dict[str, Any] = {"rate_rps": 20.0}
    extra: dict[str, Any] = {}
    if own is not None:
        (request if where == "request" else extra)["policy"] = own
    return Plan(kind=kind, deployments=deps, request=request, extra=extra)


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray as far as a dry run needs it: no cluster, no Serve."""
    fake = types.ModuleType("ray")
    fake.serve = types.SimpleNamespace()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_backend, "_connect", lambda address: fake)
    monkeypatch.setattr(ray_backend, "_check_cluster", lambda ray, plan: None)
    monkeypatch.setattr(ray_backend, "_active_app", lambda serve: None)


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The policy evaluate_plan hands the analytic model and the simulator."""
    seen: dict[str, str] = {}
    for name in ("predict", "simulate"):

        def spy(*args: Any, _name: str = name, **kwargs: Any) -> dict[str, Any]:
            seen[_name] = kwargs["policy"]
            return {}

        monkeypatch.setattr(simulator, name, spy)
    return seen


def _choices(plan: Plan, override: str | None, store: Any, spied: dict[str, str]) -> dict[str, str]:
    spied.clear()
    evaluate_plan(plan, [], [], policy=override, analytic=True)
    evaluate_plan(plan, [], [], policy=override, n_requests=1000)
    out = dict(spied)
    if plan.kind == "geo":  # a geo plan routes between sites: no backend runs it as instances
        with pytest.raises(InputError, match="cannot apply a geo plan"):
            apply_plan(plan, store=store, dry_run=True, loader=NOOP, policy=override)
    else:
        out["apply"] = str(
            apply_plan(plan, store=store, dry_run=True, loader=NOOP, policy=override).policy
        )
        if get_kind(plan.kind).local_engines:  # engines only the local backend starts
            with pytest.raises(InputError, match="cannot take"):
                build_k8s_export(plan, policy=override)
            return out
        mig = {"version": "v1", "mig-configs": {}} if plan.kind == "mig" else None
        docs = build_k8s_export(plan, policy=override, mig_config=mig).files["dispatcher.yaml"]
        routes = json.loads(
            next(d for d in docs if d["kind"] == "ConfigMap")["data"]["routes.json"]
        )
        out["k8s"] = routes["models"]["m"]["policy"]
        ray = ray_backend.apply_ray(
            plan, store=store, address="127.0.0.1:1", dry_run=True, policy=override
        )
        out["ray"] = str(ray.policy)
    return out


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.parametrize("kind", PLAN_KINDS)
@pytest.mark.parametrize("batches", BATCHES)
def test_every_consumer_picks_the_same_default(kind, batches, store, spied, state, no_cluster):
    plan = _plan(kind, batches)
    got = _choices(plan, None, store, spied)
    want = "batch" if max(batches) > 1 else {"glet": "batch"}.get(kind, "wrr")
    assert got == dict.fromkeys(got, want)
    assert set(got) >= {"predict", "simulate"} | ({"apply"} if kind != "geo" else set())
    # plan mix predicts (before its plan exists) with the same rule
    assert default_policy(kind, batches) == want


@pytest.mark.parametrize("kind", PLAN_KINDS)
@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("where", ["request", "extra"])
@pytest.mark.parametrize("own", POLICIES)
def test_the_plans_own_choice_wins_everywhere(
    kind, batches, where, own, store, spied, state, no_cluster
):
    plan = _plan(kind, batches, own, where)
    got = _choices(plan, None, store, spied)
    assert got == dict.fromkeys(got, own)
    # and an explicit --policy wins over the plan's
    other = next(p for p in POLICIES if p != own)
    got = _choices(plan, other, store, spied)
    assert got == dict.fromkeys(got, other)


def test_a_bad_choice_is_refused_naming_where_it_came_from(store, state):
    plan = _plan("mix", (1, 1), "random", "request")
    with pytest.raises(InputError, match=r"'random' in the plan's 'request.policy'") as err:
        plan_policy(plan)
    assert err.value.hint == "use one of fifo, wrr, batch"
    with pytest.raises(InputError, match="'rr' in --policy"):
        apply_plan(_plan("mix", (1, 1)), store=store, dry_run=True, loader=NOOP, policy="rr")
    with pytest.raises(InputError, match="in the plan's 'policy'"):
        build_k8s_export(_plan("mix", (1, 1), "lifo", "extra"))


def test_apply_dry_run_reports_the_policy(cli, tmp_path, state):
    from greenctl.data.plan import write_plan_file

    path = tmp_path / "plan.json"
    write_plan_file(_plan("mix", (1, 4)), path)
    r = cli("apply", path, "--dry-run", "--json", "--loader", NOOP)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["policy"] == "batch"  # what simulate predicts for it
    r = cli("apply", path, "--dry-run", "--json", "--loader", NOOP, "--policy", "nope")
    assert r.exit_code == 2 and "unknown policy 'nope' in --policy" in r.output


# -- one smooth weighted round robin ------------------------------------------------------
def _dispatcher_sequence(
    weights: list[float], n: int, down: dict[int, int] | None = None
) -> list[int]:
    route = ModelRoute(
        "m",
        {
            "policy": "wrr",
            "instances": [
                {"id": f"i{k}", "url": f"http://127.0.0.1:{9000 + k}", "slots": 1, "weight": w}
                for k, w in enumerate(weights)
            ],
        },
        max_queue=n,
    )
    assert isinstance(route.wrr, SmoothWRR)

    async def run() -> list[int]:
        out = []
        for step in range(n):
            for k, b in enumerate(route.backends):
                b.up = not (down and k in down and step < down[k])
            b = await route.acquire(set())
            out.append(int(b.id[1:]))
            route.release(b)
        return out

    return asyncio.run(run())


def test_dispatcher_and_simulator_share_one_sequence():
    weights = [30.0, 10.0, 5.0]
    assert _dispatcher_sequence(weights, 450) == stride_assign(weights, 450).tolist()
    # quotas 3:1 -> exactly 3:1 over every 4 requests, as predict's wrr model assumes
    seq = _dispatcher_sequence([30.0, 10.0], 400)
    assert all(seq[i : i + 4].count(0) == 3 for i in range(0, 400, 4))


def test_an_instance_back_from_down_gets_its_share_not_a_burst():
    seq = _dispatcher_sequence([1.0, 1.0], 200, down={1: 100})
    assert set(seq[:100]) == {0}
    tail = seq[100:]
    assert all(abs(tail[i : i + 10].count(1) - 5) <= 1 for i in range(0, 100, 10))


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(
        st.floats(min_value=0.0, max_value=1e3, allow_nan=False), min_size=1, max_size=6
    ).filter(lambda w: sum(w) > 0),
    n=st.integers(min_value=1, max_value=400),
)
def test_smooth_wrr_is_proportional_and_the_dispatchers(weights, n):
    seq = SmoothWRR(weights).take(n)
    total = sum(weights)
    for k, w in enumerate(weights):  # stride scheduling's bound: 1/2 + p_k * servers / 2
        assert abs(seq.count(k) - n * w / total) <= 0.5 + len(weights) * w / total / 2 + 1e-6
    if all(w > 0 for w in weights):  # the dispatcher counts a 0 weight as 1
        assert _dispatcher_sequence(weights, n) == seq


@pytest.mark.parametrize("weights", [[], [-1.0, 2.0], [0.0, 0.0], [float("nan")]])
def test_bad_weights_are_refused(weights):
    if not weights:
        assert SmoothWRR(weights).pick() is None
        return
    with pytest.raises(InputError, match="shares"):
        SmoothWRR(weights)

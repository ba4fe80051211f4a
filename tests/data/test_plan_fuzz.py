"""Fuzzing the plan-document reader: any JSON value, mutated valid plans and random bytes,
through ``load_plan_file`` and through ``greenctl simulate FILE --json`` and
``greenctl apply FILE --dry-run``. The outcome is a plan, or a GreenctlError with exit 1-3
and the store as it was; never another exception.

Inputs run per test (max_examples): 300 + 300 + 200 + 300 + 300 = 1400.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from greenctl.data.errors import GreenctlError
from greenctl.data.plan import Deployment, Plan, load_plan_file, write_plan_file
from greenctl.data.records import Profile, Variant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["cpu:1", "cpu:0", "mig:3g.40gb", "quantum:7", "resnet", "r18", "wrr"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _valid_doc() -> dict[str, Any]:
    return Plan(
        kind="mix",
        request={"slo_ms": 100.0, "rate_rps": 60.0},
        deployments=[
            Deployment("resnet", "r18", "cpu:1", count=1, quota_rps=40.0),
            Deployment("resnet", "r50", "cpu:1", count=1, quota_rps=20.0),
        ],
        predicted={"rate_rps": 60.0, "p95_ms": 50.0},
    ).to_dict()


def _valid_mig_doc() -> dict[str, Any]:
    return Plan(
        kind="mig",
        request={"rate_rps": 20.0},
        deployments=[
            Deployment(
                "resnet", "r18", "mig:1g.10gb", quota_rps=20.0, device=0, placement={"start": 0}
            )
        ],
        extra={
            "gpus": [
                {"index": 0, "layout": [{"profile": "1g.10gb", "start": 0, "variant": "r18"}]}
            ],
            "dispatcher": {"port": 0},
        },
    ).to_dict()


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON document (the document itself is ``()``)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


SEEDS = [_valid_doc(), _valid_mig_doc()]


@st.composite
def mutated_plans(draw) -> Any:
    """A valid plan with one to three places replaced by arbitrary JSON or deleted."""
    doc = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))
    paths = _paths(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        if not path:
            return draw(json_values)
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            # half the time a value of the same JSON type, to get past the type checks
            old = target[path[-1]]
            value = draw(_like(old) if draw(st.booleans()) else json_values)
            if draw(st.booleans()) and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    return doc


def _like(old: Any) -> st.SearchStrategy[Any]:
    """Values of the JSON type of ``old``."""
    if isinstance(old, bool):
        return st.booleans()
    if isinstance(old, int):
        return st.integers(-3, 12) | st.integers(-(2**40), 2**40)
    if isinstance(old, float):
        return st.floats(allow_nan=True, allow_infinity=True) | st.floats(-5, 500)
    if isinstance(old, str):
        return st.sampled_from(
            [
                "cpu:1",
                "cpu:2",
                "mps:50",
                "gpu:A100",
                "quantum:7",
                "r18",
                "r50",
                "resnet",
                "tiny",
                "tiny-s",
                "3g.40gb",
                "wrr",
                "batch",
            ]
        ) | st.text(max_size=10)
    return json_values


def _load(doc: Any) -> None:
    try:
        Plan.from_dict(doc, source="fuzz.json")
    except GreenctlError as exc:
        assert 1 <= exc.exit_code <= 3
        assert str(exc).startswith("fuzz.json")


@settings(SETTINGS, max_examples=300)
@given(doc=json_values)
def test_any_json_value(doc):
    _load(doc)


@settings(SETTINGS, max_examples=300)
@given(doc=mutated_plans())
def test_mutated_plans(doc):
    _load(doc)


@settings(SETTINGS, max_examples=200)
@given(data=st.binary(max_size=300) | mutated_plans().map(lambda d: _bytes_of(d)))
def test_random_bytes_as_files(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.json"
        path.write_bytes(data)
        try:
            load_plan_file(path)
        except GreenctlError as exc:
            assert 1 <= exc.exit_code <= 3 and str(path) in str(exc)


def _bytes_of(doc: Any) -> bytes:
    """A JSON text (NaN and Infinity as Python writes them), sometimes cut short."""
    text = json.dumps(doc).encode()
    return text[: len(text) * 3 // 4] if len(text) % 5 == 0 else text


# -- through the CLI ----------------------------------------------------------------------
@pytest.fixture
def profiled(store):
    """The variants and CPU profiles the valid plan names, so mutants reach the simulator."""
    store.upsert_variant(Variant("r18", "resnet", accuracy=0.69758))
    store.upsert_variant(Variant("r50", "resnet", accuracy=0.7613))
    store.add_profiles(
        [
            Profile("r18", "cpu:1", 1, throughput_rps=50.0, latency_p50_ms=18.0, power_w=30.0),
            Profile("r50", "cpu:1", 1, throughput_rps=25.0, latency_p50_ms=35.0, power_w=60.0),
            Profile("r18", "cpu:1", 2, throughput_rps=90.0, latency_p50_ms=22.0, power_w=35.0),
        ]
    )
    return store


@pytest.fixture
def fast_cli(cli, monkeypatch):
    """``cli`` with typer's command tree built once, not on every call (most of a call's
    time), so a fuzz test can run many commands."""
    import typer.main
    import typer.testing
    from greenctl.cli.main import app

    command = typer.main.get_command(app)
    monkeypatch.setattr(typer.testing, "_get_command", lambda _app: command)
    return cli


def _snapshot(store) -> list[str]:
    return list(store.db.conn.iterdump())


def _run_cli(cli, store, args: list[str], doc: Any) -> None:
    before = _snapshot(store)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.json"
        path.write_text(json.dumps(doc))
        r = cli(*args[:1], path, *args[1:])
    assert r.exit_code in (0, 1, 2, 3), r.output
    if r.exit_code == 0 and "--json" in args:
        json.loads(r.stdout)  # exactly one JSON document
    if r.exit_code != 0:
        assert "Error:" in r.output and "Traceback" not in r.output
        assert _snapshot(store) == before


@settings(SETTINGS, max_examples=300)
@given(doc=mutated_plans())
def test_simulate_cli_on_mutated_plans(fast_cli, profiled, doc):
    _run_cli(fast_cli, profiled, ["simulate", "--json", "--requests", "300"], doc)


@settings(SETTINGS, max_examples=300)
@given(doc=mutated_plans())
def test_apply_dry_run_cli_on_mutated_plans(fast_cli, profiled, doc, tmp_path, monkeypatch):
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "state"))
    _run_cli(fast_cli, profiled, ["apply", "--dry-run", "--json"], doc)


def test_valid_plan_passes_through_both_commands(cli, profiled, tmp_path, monkeypatch):
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "state"))
    doc = _valid_doc()
    path = tmp_path / "plan.json"
    write_plan_file(Plan.from_dict(doc), path)
    r = cli("simulate", path, "--json", "--requests", "300")
    assert r.exit_code == 0, r.output
    r = cli("apply", path, "--dry-run", "--json")
    assert r.exit_code in (0, 3), r.output  # 3: this machine has fewer than 2 cores

"""The plan document reader: every field checked in one place (``Plan.from_dict`` /
``load_plan_file``), refusals that name the file and the field (``deployments[2].count``)."""

from __future__ import annotations

import copy
import gzip
import json
import math

import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.plan import (
    MAX_INSTANCES,
    PLAN_SCHEMA,
    Deployment,
    Plan,
    check_families,
    load_plan_file,
    write_plan_file,
)
from greenctl.data.resources import runnable_resource


def _doc() -> dict:
    return Plan(
        kind="mix",
        request={"slo_ms": 100.0, "rate_rps": 70.0},
        deployments=[
            Deployment("resnet", "r18", "cpu:2", count=2, quota_rps=40.0),
            Deployment("resnet", "r50", "cpu:4", count=3, batch=2, quota_rps=30.0),
        ],
        predicted={"rate_rps": 70.0, "p95_ms": 50.0},
    ).to_dict()


def _refused(doc, field: str) -> FileFormatError:
    with pytest.raises(FileFormatError) as info:
        Plan.from_dict(doc, source="my-plan.json")
    message = str(info.value)
    assert message.startswith("my-plan.json: "), message
    assert field in message, message
    return info.value


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("request",), "fast please", "'request' must be a JSON object"),
        (("request",), [1, 2], "'request' must be a JSON object"),
        (("predicted",), 3, "'predicted' must be a JSON object"),
        (("deployments",), "r18", "'deployments' must be a list"),
        (("deployments",), {"model": "resnet"}, "'deployments' must be a list"),
        (("deployments", 1), "r50", "'deployments[1]' must be a JSON object"),
        (("deployments", 1, "count"), "two", "'deployments[1].count' must be a whole number"),
        (("deployments", 1, "count"), 2.0, "'deployments[1].count' must be a whole number"),
        (("deployments", 1, "count"), True, "'deployments[1].count' must be a whole number"),
        (("deployments", 1, "count"), 0, "'deployments[1].count' must be between 1 and"),
        (("deployments", 1, "count"), -3, "'deployments[1].count' must be between 1 and"),
        (("deployments", 1, "count"), 1_000_000, "'deployments[1].count' must be between 1"),
        (("deployments", 1, "batch"), 1.5, "'deployments[1].batch' must be a whole number"),
        (("deployments", 1, "batch"), 10**12, "'deployments[1].batch' must be between 1"),
        (("deployments", 0, "quota_rps"), -1.0, "'deployments[0].quota_rps' must be >= 0"),
        (("deployments", 0, "quota_rps"), math.nan, "'deployments[0].quota_rps' must be a finite"),
        (("deployments", 0, "quota_rps"), "40", "'deployments[0].quota_rps' must be a number"),
        (("deployments", 0, "model"), 7, "'deployments[0].model' must be a non-empty string"),
        (("deployments", 0, "model"), "", "'deployments[0].model' must be a non-empty string"),
        (("deployments", 0, "model"), "a/b", "'deployments[0].model' is 'a/b'"),
        (("deployments", 0, "variant"), "r1\n8", "'deployments[0].variant' must be printable"),
        (("deployments", 0, "resource"), "cpu:0", "'deployments[0].resource' is invalid"),
        (("deployments", 0, "resource"), "4 cores", "'deployments[0].resource' is invalid"),
        (("deployments", 0, "device"), True, "'deployments[0].device' must be a non-empty"),
        (("deployments", 0, "placement"), "gpu0", "'deployments[0].placement' must be"),
        (
            ("deployments", 0, "placement"),
            {"duty_cycle_ms": "x"},
            "'deployments[0].placement.duty_cycle_ms' must be a number",
        ),
        (
            ("deployments", 0, "placement"),
            {"start": -1},
            "'deployments[0].placement.start' must be between 0",
        ),
        (
            ("deployments", 0, "placement"),
            {"gpus": [0, "1"]},
            "'deployments[0].placement.gpus[1]' must be a whole number",
        ),
        (("deployments", 0, "placement"), [{"gpu": 1}], "'deployments[0].placement[0].start'"),
        (("predicted", "rate_rps"), -5.0, "'predicted.rate_rps' must be >= 0"),
        (("predicted", "rate_rps"), math.nan, "'predicted.rate_rps' must be a finite number"),
        (("predicted", "rate_rps"), math.inf, "'predicted.rate_rps' must be a finite number"),
        (("request", "rate_rps"), "lots", "'request.rate_rps' must be a number"),
        (("request", "slo_ms"), 0, "'request.slo_ms' must be > 0"),
        (("request", "slo_ms"), -100, "'request.slo_ms' must be > 0"),
        (("id",), "seven", "'id' must be a whole number"),
        (("created_at",), 2026, "'created_at' must be a time string"),
        (("gpus",), {"index": 0}, "'gpus' must be a list"),
        (("gpus",), [3], "'gpus[0]' must be a JSON object"),
        (("gpus",), [{"index": -1}], "'gpus[0].index' must be between 0"),
        (("gpus",), [{"layout": {}}], "'gpus[0].layout' must be a list"),
        (
            ("gpus",),
            [{"layout": [{"profile": "3g.40gb", "start": "a", "variant": "r18"}]}],
            "'gpus[0].layout[0].start' must be a whole number",
        ),
        (("gpus",), [{"layout": [{"start": 0}]}], "'gpus[0].layout[0].profile'"),
        (("dispatcher",), "localhost", "'dispatcher' must be a JSON object"),
        (("dispatcher",), {"port": 70000}, "'dispatcher.port' must be between 0 and 65535"),
        (("policy",), ["wrr"], "'policy' must be a string"),
    ],
)
def test_wrong_field_types_and_ranges_are_refused_by_path(path, value, field):
    doc = _doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    err = _refused(doc, field)
    assert err.hint  # every refusal says how to fix it


def test_too_many_instances_in_total_is_refused():
    doc = _doc()
    doc["deployments"] = [
        {"model": "resnet", "variant": "r18", "resource": "cpu:1", "count": MAX_INSTANCES // 2 + 1}
    ] * 2
    err = _refused(doc, "'deployments' add up to")
    assert str(MAX_INSTANCES) in str(err)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "a plan must be a JSON object, got list"),
        ("plan", "a plan must be a JSON object, got 'plan'"),
        (None, "a plan must be a JSON object"),
        ({"kind": "mix"}, "field 'schema' is None"),
        ({"schema": "greenctl.plan/v2", "kind": "mix"}, "field 'schema' is 'greenctl.plan/v2'"),
        ({"schema": PLAN_SCHEMA, "kind": ["mix"]}, "field 'kind' is list"),
        ({"schema": PLAN_SCHEMA, "kind": "batch"}, "field 'kind' is 'batch'"),
    ],
)
def test_not_a_plan_document(doc, message):
    with pytest.raises(FileFormatError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Plan.from_dict(doc, source="p.json")


def test_long_values_are_cut_in_messages():
    doc = _doc()
    doc["schema"] = "x" * 10_000
    with pytest.raises(FileFormatError) as info:
        Plan.from_dict(doc, source="p.json")
    assert len(str(info.value)) < 300


def test_valid_plans_of_every_kind_round_trip(tmp_path):
    plans = [
        Plan.from_dict(_doc()),
        Plan(
            kind="mig",
            deployments=[Deployment("resnet", "r50", "mig:3g.40gb", count=2, quota_rps=20.0)],
            extra={
                "gpus": [
                    {
                        "index": 0,
                        "layout": [
                            {"profile": "3g.40gb", "start": 0, "variant": "r50"},
                            {"profile": "3g.40gb", "start": 4, "variant": "r50"},
                            {"profile": "1g.10gb", "start": 6, "variant": None},
                        ],
                    }
                ],
                "dispatcher": {"port": 8080},
            },
        ),
        Plan(
            kind="glet",
            deployments=[
                Deployment(
                    "resnet",
                    "r50",
                    "mps:50",
                    count=2,
                    batch=8,
                    quota_rps=10.0,
                    placement={"gpus": [0, 1], "duty_cycle_ms": 25.0},
                )
            ],
        ),
        Plan(
            kind="geo",
            deployments=[
                Deployment("m", "v", "site:CISO", placement={"site": "CISO", "load_mwh": 3.2})
            ],
            predicted={"rate_rps": 0.0},
        ),
        Plan(kind="mix", deployments=[Deployment("m", "v", "mig:1g.10gb", placement=[0, 1])]),
    ]
    for i, plan in enumerate(plans):
        path = tmp_path / f"p{i}.json"
        write_plan_file(plan, path)
        again = load_plan_file(path)
        assert again.to_dict() == plan.to_dict()


def test_missing_optional_parts_get_defaults():
    plan = Plan.from_dict({"schema": PLAN_SCHEMA, "kind": "mix", "request": None})
    assert plan.request == {} and plan.deployments == [] and plan.predicted == {}


# -- files ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe", "not UTF-8 text"),
        # mtime=0: the same bytes, so the same test id, on every pytest-xdist worker
        (gzip.compress(b'{"schema": "greenctl.plan/v1"}', mtime=0), "gzip-compressed"),
        (b'{"schema": "greenctl.plan/v1",\n "kind": mix}', "line 2: invalid JSON"),
        (b"[" * 100_000, "nested too deeply"),
        (b"1" * 5000, "invalid JSON"),
        (b"[1, 2]", "a plan must be a JSON object"),
        (b'{"schema": "greenctl.plan/v0", "kind": "mix"}', "field 'schema'"),
        (b"", "invalid JSON"),
    ],
)
def test_plan_files_that_are_not_plans(tmp_path, content, message):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(FileFormatError) as info:
        load_plan_file(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_plan_path_that_is_a_directory_or_missing(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        load_plan_file(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        load_plan_file(tmp_path / "nope.json")


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_doc()).encode())
    assert len(load_plan_file(path).deployments) == 2


# -- checks the commands share ----------------------------------------------------------
def test_check_families_names_the_deployment():
    plan = Plan.from_dict(_doc())
    check_families(plan.deployments, {"r18": "resnet", "r50": "resnet"})
    check_families(plan.deployments, {})  # unknown variants are not checked
    bad = copy.deepcopy(plan.deployments)
    bad[1].model = "bert"
    with pytest.raises(InputError, match=r"deployments\[1\]\.model is 'bert'.*family 'resnet'"):
        check_families(bad, {"r18": "resnet", "r50": "resnet"})


def test_runnable_resource_refuses_unknown_kinds():
    assert runnable_resource("cpu:2", field="deployments[0].resource").cpu_cores == 2
    with pytest.raises(InputError, match=r"deployments\[3\]\.resource is 'quantum:7'") as info:
        runnable_resource("quantum:7", field="deployments[3].resource")
    assert "simulate" in (info.value.hint or "")
    with pytest.raises(InputError, match=r"deployments\[0\]\.resource"):
        runnable_resource("cpu:x", field="deployments[0].resource")

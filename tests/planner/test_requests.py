"""Each plan kind's typed request: validated once (the field, the bad value and the fix named),
written back as the plan document's ``request``, and named by the kind's registry entry."""

from __future__ import annotations

import pytest
from greenctl.data.errors import InputError
from greenctl.executor.kinds import KINDS
from greenctl.planner.geo.request import GeoRequest
from greenctl.planner.glet.request import GletRequest
from greenctl.planner.mig.request import MigRequest
from greenctl.planner.mix.request import MixRequest
from greenctl.planner.mix.solve import normalize_request


def test_every_builtin_kind_names_its_request_type():
    want = {"mix": MixRequest, "mig": MigRequest, "glet": GletRequest, "geo": GeoRequest}
    assert {k: KINDS[k].request_type for k in want} == want


def test_a_mix_request_round_trips_in_canonical_form():
    typed = MixRequest.from_dict(
        {"model": "m", "rate_rps": 20, "slo_ms": 60, "budgets": {"cpu": 8}, "percentile": 0.99}
    )
    doc = typed.to_dict()
    assert doc["families"] == [{"model": "m", "rate_rps": 20.0, "slo_ms": 60.0}]
    assert doc["percentile"] == "p99" and doc["budgets"] == {"cpu": 8.0}
    assert MixRequest.from_dict(doc) == typed  # the document plans the same request again
    assert normalize_request(doc) == doc


@pytest.mark.parametrize(
    ("request_doc", "words"),
    [
        ({"model": "m", "rate_rps": 1, "slo_ms": 5, "nope": 1}, "unknown request field(s): nope"),
        ({"model": "m", "rate_rps": -1, "slo_ms": 5}, "rate of 'm' (rate_rps) must be > 0"),
        ({"model": "m", "rate_rps": 1, "slo_ms": 5, "objective": "x"}, "unknown objective 'x'"),
        ({"model": "m", "rate_rps": 1, "slo_ms": 5, "alpha": -1}, "alpha must be >= 0"),
        ({"model": "m", "rate_rps": 1, "slo_ms": 5, "budgets": {"a b": 1}}, "budget 'a b'"),
        ({"model": "m", "rate_rps": 1, "slo_ms": 5, "percentile": ""}, "must be p95 or p99"),
    ],
)
def test_a_bad_mix_request_names_the_field(request_doc, words):
    with pytest.raises(InputError) as err:
        MixRequest.from_dict(request_doc)
    assert words in err.value.message


def test_a_mig_request_round_trips_with_lambda_under_its_document_name():
    doc = {
        "gpu": "A30", "gpus": 2, "model": "albert", "rate_rps": 40, "carbon_intensity": 300,
        "lambda": 0.7, "seed": 3,
    }  # fmt: skip
    typed = MigRequest.from_dict(doc)
    assert typed.lam == 0.7 and typed.gpu != "A30"  # the geometry's own name
    again = typed.to_dict()
    assert again["lambda"] == 0.7 and MigRequest.from_dict(again) == typed


@pytest.mark.parametrize(
    ("request_doc", "words"),
    [
        ({"gpu": "A30", "gpus": 1, "model": "m"}, "needs gpu, gpus, model, rate_rps"),
        (
            {
                "gpu": "A30",
                "gpus": 1,
                "model": "m",
                "rate_rps": 1,
                "carbon_intensity": 1,
                "solver": "best",
            },
            "unknown solver 'best'",
        ),
        (
            {
                "gpu": "A30",
                "gpus": 1,
                "model": "m",
                "rate_rps": 1,
                "carbon_intensity": 1,
                "seed": "x",
            },
            "request.seed",
        ),
    ],
)
def test_a_bad_mig_request_names_the_field(request_doc, words):
    with pytest.raises(InputError) as err:
        MigRequest.from_dict(request_doc)
    assert words in err.value.message


def test_a_glet_request_round_trips():
    doc = {
        "models": [{"name": "a", "rate_rps": 10, "slo_ms": 25, "variant": "a1"}],
        "partitions": [50, "mps:100"],
        "max_gpus": 2,
        "interference": None,
        "gpu_memory_mb": 16000,
    }
    typed = GletRequest.from_dict(doc)
    assert typed.partitions == ("mps:50", "mps:100") and typed.interference is None
    assert GletRequest.from_dict(typed.to_dict()) == typed


@pytest.mark.parametrize(
    ("request_doc", "words"),
    [
        ({"models": [{"name": "a", "rate_rps": 1, "slo_ms": 5}], "seed": 1.5}, "request.seed"),
        ({"models": [{"name": "a", "rate_rps": 1, "slo_ms": 5}], "interference": "x"}, "'x'"),
        (
            {"models": [{"name": "a", "rate_rps": 1, "slo_ms": 5}], "gpu_memory_mb": -1},
            "request.gpu_memory_mb",
        ),
        (
            {"models": [{"name": "a", "rate_rps": 1, "slo_ms": 5}], "replan_headroom": 11},
            "not in [0, 10]",
        ),
    ],
)
def test_a_bad_glet_request_names_the_field(request_doc, words):
    with pytest.raises(InputError) as err:
        GletRequest.from_dict(request_doc)
    assert words in err.value.message


def test_a_geo_request_maps_its_options_to_run_geo():
    typed = GeoRequest.from_dict(
        {"sites": "s.csv", "demand": "d.csv", "mu_carbon_usd_per_kg": 2.0, "horizon": 12}
    )
    assert typed.options() == {"mu_carbon": 2.0, "horizon": 12}
    assert GeoRequest.from_dict(typed.to_dict()) == typed
    with pytest.raises(InputError, match=r"request\.eta"):
        GeoRequest.from_dict({"sites": "s.csv", "demand": "d.csv", "eta": "fast"})
    # a step of 0 stops the duals moving: refused, naming the option
    for key, flag in (("eta", "--eta"), ("z_max_usd", "--z-max")):
        with pytest.raises(InputError, match=f"request\\.{key} \\({flag}\\) must be > 0"):
            GeoRequest.from_dict({"sites": "s.csv", "demand": "d.csv", key: 0})

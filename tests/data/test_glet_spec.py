"""plan glet inputs: --model arguments and --spec files (TOML / JSON)."""

from __future__ import annotations

import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.glet_spec import load_glet_spec, parse_model_arg, parse_partitions
from greenctl.planner.glet.model import ALGORITHMS


def test_model_arg():
    m = parse_model_arg("resnet50:200:25.5")
    assert m == {"name": "resnet50", "rate_rps": 200, "slo_ms": 25.5, "variant": None}
    for bad in ("resnet50:200", "resnet50:x:3", ":1:2", "a:1:0", "a:-1:5"):
        with pytest.raises(InputError, match="--model"):
            parse_model_arg(bad)


def test_partitions():
    assert parse_partitions(["20", 80, "mps:100", 20]) == ["mps:20", "mps:80", "mps:100"]
    assert parse_partitions(["mig:3g.40gb"]) == ["mig:3g.40gb"]
    with pytest.raises(InputError, match="between 1 and 100"):
        parse_partitions(["150"])
    with pytest.raises(InputError):
        parse_partitions(["gpu slice"])


def test_toml_and_json_specs(tmp_path):
    t = tmp_path / "s.toml"
    t.write_text(
        'max_gpus = 3\nrate_percentile = 95\npartitions = [50, 100]\nalgorithm = "sbp"\n'
        '[[models]]\nname = "a"\nrate_rps = 10\nslo_ms = 30\nvariant = "a1"\n'
    )
    spec = load_glet_spec(t, algorithms=ALGORITHMS)
    assert spec.max_gpus == 3 and spec.rate_percentile == 95 and spec.algorithm == "sbp"
    assert spec.partitions == ["mps:50", "mps:100"]
    assert spec.models[0]["variant"] == "a1"
    j = tmp_path / "s.json"
    j.write_text('{"models": [{"name": "b", "rate_rps": 5, "slo_ms": 10}]}')
    assert load_glet_spec(j).models[0]["name"] == "b"


@pytest.mark.parametrize(
    ("text", "suffix", "words"),
    [
        ('{"models": [}', ".json", "line 1"),
        ("models = [", ".toml", "invalid TOML"),
        ('{"models": []}', ".json", "non-empty list"),
        ('{"models": [{"name": "a", "rate_rps": -1, "slo_ms": 3}]}', ".json", "models[0].rate_rps"),
        ('{"models": [{"name": "a", "rate_rps": 1, "slo_ms": 0}]}', ".json", "models[0].slo_ms"),
        ('{"models": [{"name": "a", "rate_rps": 1, "slo_ms": 3, "x": 1}]}', ".json", "'x'"),
        ('{"modles": []}', ".json", "unknown field 'modles'"),
        (
            '{"models": [{"name": "a", "rate_rps": 1, "slo_ms": 3}], "max_gpus": 0}',
            ".json",
            "max_gpus",
        ),
        (
            '{"models": [{"name": "a", "rate_rps": 1, "slo_ms": 3}], "algorithm": "x"}',
            ".json",
            "algorithm",
        ),
    ],
)
def test_bad_specs_name_file_and_field(tmp_path, text, suffix, words):
    f = tmp_path / f"spec{suffix}"
    f.write_text(text)
    with pytest.raises(FileFormatError) as exc:
        load_glet_spec(f, algorithms=ALGORITHMS)
    assert words in str(exc.value) and str(f) in str(exc.value)


def test_missing_spec(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_glet_spec(tmp_path / "none.toml")

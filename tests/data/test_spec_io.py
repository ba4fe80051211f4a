"""`plan mix --spec` reader (data/spec_io): TOML/JSON, every field's type and range."""

from __future__ import annotations

import json

import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.spec_io import read_mix_spec

CHOICES = {"objective": ("accuracy", "balanced"), "strategy": ("ilp",), "solver": ("highs",)}


def _write(tmp_path, text: str | bytes, name: str = "spec.toml"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_toml_and_json_specs_read_alike(tmp_path):
    toml = _write(
        tmp_path,
        'slo_ms = 60\nobjective = "accuracy"\n[budget]\ncpu = 8\n'
        '[[families]]\nmodel = "m"\nrate_rps = 50\n'
        '[[current]]\nvariant = "m-big"\nresource = "cpu:2"\ncount = 2\n',
    )
    doc = {
        "slo_ms": 60,
        "objective": "accuracy",
        "budget": {"cpu": 8},
        "families": [{"model": "m", "rate_rps": 50}],
        "current": [{"variant": "m-big", "resource": "cpu:2", "count": 2, "quota_rps": None}],
    }
    js = _write(tmp_path, json.dumps(doc), "spec.json")
    want = {
        "slo_ms": 60,
        "objective": "accuracy",
        "budgets": {"cpu": 8},
        "families": [{"model": "m", "rate_rps": 50}],
        "current": [{"variant": "m-big", "resource": "cpu:2", "count": 2}],
    }
    assert read_mix_spec(toml, choices=CHOICES) == want
    assert read_mix_spec(js, choices=CHOICES) == want


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[[current]]\nvariant = "a"\nresource = "cpu:1"\ncount = "two"\n', "current[0].count"),
        ('[[current]]\nvariant = "a"\nresource = "cpu:1"\ncount = 1.5\n', "current[0].count"),
        ('[[current]]\nvariant = "a"\nresource = "cpu:1"\ncount = 0\n', "current[0].count"),
        ('[[current]]\nvariant = "a"\nresource = "cpu:1"\nbatch = true\n', "current[0].batch"),
        ('[[current]]\nvariant = "a"\nresource = "tpu"\n', "current[0].resource"),
        ('[[current]]\nresource = "cpu:1"\n', "current[0].variant"),
        ('[[families]]\nmodel = "m"\nrate_rps = -1\n', "families[0].rate_rps"),
        ("[[families]]\nmodel = 3\n", "families[0].model"),
        ('[[families]]\nmodel = "m"\nspeed = 3\n', "families[0].speed"),
        ("families = []\n", "families"),
        ('families = "m"\n', "families"),
        ("slo_ms = 0\n", "slo_ms"),
        ('slo_ms = "fast"\n', "slo_ms"),
        ("min_accuracy = 1.5\n", "min_accuracy"),
        ("pue = 0.5\n", "pue"),
        ("gamma = nan\n", "gamma"),
        ("carbon_intensity = inf\n", "carbon_intensity"),
        ('objective = "greenest"\n', "objective"),
        ("[budgets]\ncpu = -2\n", "budgets.cpu"),
        ("budgets = 3\n", "budgets"),
        ("colour = 1\n", "colour"),
    ],
)
def test_bad_field_names_file_and_field(tmp_path, text, field):
    p = _write(tmp_path, text)
    with pytest.raises(FileFormatError) as e:
        read_mix_spec(p, choices=CHOICES)
    assert e.value.exit_code == 2
    assert str(p) in str(e.value) and f"field '{field}'" in str(e.value)


def test_binary_file_is_refused_naming_it(tmp_path):
    p = _write(tmp_path, bytes(range(128, 256)) * 3)
    with pytest.raises(FileFormatError, match="not a UTF-8 text file") as e:
        read_mix_spec(p)
    assert e.value.path == str(p)
    p = _write(tmp_path, b"slo_ms = 5\x00\n", "nul.toml")
    with pytest.raises(FileFormatError, match="NUL"):
        read_mix_spec(p)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", '{"a":' * 100_000 + "1" + "}" * 100_000),
        ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ],
)
def test_deep_nesting_is_refused(tmp_path, name, text):
    p = _write(tmp_path, text, name)
    with pytest.raises(FileFormatError) as e:
        read_mix_spec(p)
    assert e.value.path == str(p)


def test_json_constants_and_syntax(tmp_path):
    with pytest.raises(FileFormatError, match="NaN"):
        read_mix_spec(_write(tmp_path, '{"slo_ms": NaN}', "n.json"))
    with pytest.raises(FileFormatError, match="line 2"):
        read_mix_spec(_write(tmp_path, '{"slo_ms": 5,\n "x" }', "s.json"))
    with pytest.raises(FileFormatError, match="table/object"):
        read_mix_spec(_write(tmp_path, "[1, 2]", "l.json"))


def test_missing_folder_and_both_budget_spellings(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_mix_spec(tmp_path / "nope.toml")
    with pytest.raises(InputError, match="folder"):
        read_mix_spec(tmp_path)
    p = _write(tmp_path, "[budget]\ncpu = 1\n[budgets]\ncpu = 2\n")
    with pytest.raises(FileFormatError, match="not both"):
        read_mix_spec(p)


def test_the_spec_reader_and_the_planner_know_the_same_fields():
    """One list of a mix request's fields: what a spec file may hold is what the planner's
    normalize_request takes (a field added to one and not the other is refused by it)."""
    from greenctl.data.spec_io import MIX_FAMILY_FIELDS, MIX_REQUEST_FIELDS, _Spec
    from greenctl.planner.mix.solve import normalize_request

    spec = _Spec("x.toml", {})
    assert tuple(spec.request_checks()) == MIX_REQUEST_FIELDS
    assert tuple(spec.family_checks()) == MIX_FAMILY_FIELDS
    with pytest.raises(InputError, match="unknown request field"):
        normalize_request({"model": "m", "rate_rps": 1, "slo_ms": 5, "nope": 1})
    with pytest.raises(InputError, match=r"families\[0\]: unknown field"):
        normalize_request({"families": [{"model": "m", "rate_rps": 1, "slo": 5}]})

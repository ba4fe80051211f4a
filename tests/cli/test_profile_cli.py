"""`greenctl profile list/show/import`: group options, literal user text, columns, order,
unknown names, idempotent imports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HEADER = "variant,model,resource,batch,throughput_rps,latency_ms"
ROWS = (
    "v1,fam,cpu:1,1,10,5\n"
    "v1,fam,cpu:10,1,80,5\n"
    "v1,fam,cpu:2,1,18,5\n"
    "v1,fam,cpu:11,1,85,5\n"
    "v2,fam,mig:3g.40gb,1,100,2\n"
    "v2,fam,mig:1g.10gb,1,40,4\n"
)


def write(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def imported(cli, tmp_path: Path) -> Path:
    path = write(tmp_path, f"{HEADER}\n{ROWS}")
    r = cli("profile", "import", path)
    assert r.exit_code == 0, r.output
    return path


@pytest.fixture
def wide(monkeypatch):
    """A wide console, so that table cells are not folded in the middle of a name."""
    from greenctl.cli import common

    monkeypatch.setattr(common.console, "width", 250)


# -- options of `profile` given before a subcommand --------------------------------------------
def test_group_json_applies_to_list(cli, imported):
    r = cli("profile", "--json", "list")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)) == 6


def test_group_variant_and_model_filter_list(cli, imported):
    r = cli("profile", "--variant", "v2", "list", "--json")
    assert r.exit_code == 0, r.output
    assert {p["variant"] for p in json.loads(r.stdout)} == {"v2"}
    r = cli("profile", "--model", "fam", "--json", "list")
    assert len(json.loads(r.stdout)) == 6
    # the subcommand's own option, given after it, wins
    r = cli("profile", "--variant", "v2", "list", "--variant", "v1", "--json")
    assert {p["variant"] for p in json.loads(r.stdout)} == {"v1"}


@pytest.mark.parametrize(
    "args",
    [
        ("--cpus", "2", "list"),
        ("--requests", "5", "import", "x.csv"),
        ("--variant", "v1", "show", "v1"),  # show takes the variant as an argument
        ("--variant", "v1", "--variant", "v2", "list"),  # list filters on one variant
    ],
)
def test_group_options_that_do_not_apply_are_refused(cli, imported, args):
    r = cli("profile", *args)
    assert r.exit_code == 2, r.output
    flag = args[0]
    assert f"`greenctl profile {flag}` does not apply to `profile" in r.output


# -- user text is printed literally ------------------------------------------------------------
def test_error_message_prints_brackets_and_emoji_codes_literally(cli, imported):
    r = cli("profile", "show", "x[red]y")
    assert r.exit_code == 2
    assert "unknown variant 'x[red]y'" in r.output
    r = cli("profile", "show", "a:smile:b")
    assert "unknown variant 'a:smile:b'" in r.output


def test_table_cells_and_titles_are_not_markup(cli, tmp_path, wide):
    path = write(tmp_path, f"{HEADER},hardware\nx[b]y,f[red]am,cpu:1,1,10,5,Xeon :smile: v4\n")
    assert cli("profile", "import", path).exit_code == 0
    r = cli("profile", "list")
    assert r.exit_code == 0, r.output
    assert "x[b]y" in r.output and "Xeon :smile: v4" in r.output
    r = cli("profile", "show", "x[b]y")
    assert r.exit_code == 0, r.output
    assert "x[b]y (f[red]am)" in r.output


# -- profile list ------------------------------------------------------------------------------
def test_list_shows_capacity_columns_of_load_tested_points(cli, tmp_path, wide):
    text = (
        f"{HEADER},capacity_rps,capacity_slo_ms\n"
        "r18,resnet,cpu:2,1,20,90,12,500\n"
        "r18,resnet,cpu:2,1,20,90,15,750\n"
    )
    assert cli("profile", "import", write(tmp_path, text)).exit_code == 0
    r = cli("profile", "list")
    assert r.exit_code == 0, r.output
    assert "cap req/s" in r.output and "cap SLO ms" in r.output
    assert "500" in r.output and "750" in r.output


def test_list_sorts_resources_naturally(cli, imported):
    r = cli("profile", "list", "--json")
    got = [(p["variant"], p["resource"]) for p in json.loads(r.stdout)]
    assert got == [
        ("v1", "cpu:1"),
        ("v1", "cpu:2"),
        ("v1", "cpu:10"),
        ("v1", "cpu:11"),
        ("v2", "mig:1g.10gb"),
        ("v2", "mig:3g.40gb"),
    ]


@pytest.mark.parametrize("command", ["list", "export"])
def test_unknown_model_is_an_error_naming_the_known_families(cli, imported, command):
    r = cli("profile", command, "--model", "nosuch")
    assert r.exit_code == 2, r.output
    assert "unknown model family 'nosuch'" in r.output
    assert "known families: fam" in r.output


def test_unknown_variant_filter_is_an_error(cli, imported):
    r = cli("profile", "list", "--variant", "nosuch")
    assert r.exit_code == 2, r.output
    assert "unknown variant 'nosuch'" in r.output and "v1, v2" in r.output


# -- import is idempotent ----------------------------------------------------------------------
def test_reimport_stores_nothing_twice_and_says_so(cli, imported, store):
    assert store.profile_count() == 6
    r = cli("profile", "import", imported)
    assert r.exit_code == 0, r.output
    assert "Imported 0 profile rows" in r.output and "6 already in the store" in r.output
    assert store.profile_count() == 6
    r = cli("profile", "import", imported, "--json")
    assert json.loads(r.stdout)["already_present"] == 6


def test_reimport_of_export_with_times_is_a_no_op(cli, imported, store, tmp_path):
    out = tmp_path / "out.csv"
    assert cli("profile", "export", "-o", out).exit_code == 0
    r = cli("profile", "import", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["profiles"], doc["already_present"]) == (0, 6)
    assert store.profile_count() == 6


def test_import_error_leaves_store_and_prints_no_traceback(cli, imported, store, tmp_path):
    for text in (
        f"{HEADER}\nv,m,cpu:1,99999999999999999999999,2,3\n",
        f"{HEADER},created_at\nv,m,cpu:1,1,2,3,yesterday\n",
    ):
        r = cli("profile", "import", write(tmp_path, text, "bad.csv"))
        assert r.exit_code == 2, r.output
        assert r.output.startswith("Error: ") and "bad.csv, line 2" in r.output
    r = cli("profile", "import", tmp_path)
    assert r.exit_code == 2 and "cannot read" in r.output
    assert store.profile_count() == 6


def test_an_import_never_merges_another_data_set_silently(cli, tmp_path: Path):
    """A file of another hardware label into an existing family: exit 2, or --merge on purpose."""
    head = f"{HEADER},hardware"
    first = write(tmp_path, f"{head}\nv1,fam,cpu:1,1,10,5,lab-a\nv2,fam,cpu:1,1,20,3,lab-a\n")
    assert cli("profile", "import", first).exit_code == 0
    before = json.loads(cli("profile", "list", "--json").stdout)
    # a new variant of the same family, measured elsewhere
    other = write(tmp_path, f"{head}\nv3,fam,cpu:1,1,30,2,lab-b\n", "other.csv")
    r = cli("profile", "import", other)
    assert r.exit_code == 2, r.output
    assert "other.csv" in r.stderr and "lab-b" in r.stderr and "--merge" in r.stderr
    assert json.loads(cli("profile", "list", "--json").stdout) == before
    # re-importing the same data set is no merge; --merge adds the other on purpose
    assert cli("profile", "import", first).exit_code == 0
    r = cli("profile", "import", other, "--merge", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["variants_created"] == ["v3"]

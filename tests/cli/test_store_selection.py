"""Which store a command uses: a --db flag (the command's, `profile`'s, the root's) beats
GREENCTL_DB, which beats the default; a named path must be in an existing folder, and a
read-only command creates no store."""

from __future__ import annotations

from pathlib import Path

import pytest
from greenctl.data.store import open_store

CSV = (
    "variant,model,resource,batch,throughput_rps,latency_ms\n"
    "v1,fam,cpu:1,1,10,5\n"
    "v1,fam,cpu:2,1,18,5.5\n"
)


@pytest.fixture
def profiles_csv(tmp_path: Path) -> Path:
    path = tmp_path / "p.csv"
    path.write_text(CSV)
    return path


def rows_in(path: Path) -> int:
    with open_store(path) as store:
        return store.profile_count()


def test_root_flag_beats_the_environment(cli, profiles_csv, tmp_path, db_path):
    chosen = tmp_path / "B.db"
    r = cli("--db", chosen, "profile", "import", profiles_csv)
    assert r.exit_code == 0, r.output
    assert rows_in(chosen) == 2
    assert not db_path.exists()  # GREENCTL_DB's store was not touched


def test_command_flag_beats_root_flag_and_environment(cli, profiles_csv, tmp_path, db_path):
    root, own = tmp_path / "root.db", tmp_path / "own.db"
    r = cli("--db", root, "profile", "import", "--db", own, profiles_csv)
    assert r.exit_code == 0, r.output
    assert rows_in(own) == 2
    assert not root.exists() and not db_path.exists()


def test_profile_group_flag_before_the_subcommand(cli, profiles_csv, tmp_path, db_path):
    chosen = tmp_path / "X.db"
    r = cli("profile", "--db", chosen, "import", profiles_csv)
    assert r.exit_code == 0, r.output
    assert rows_in(chosen) == 2
    assert not db_path.exists()
    # and it beats the root's flag, as the nearer one
    r = cli("--db", tmp_path / "root.db", "profile", "--db", chosen, "list", "--json")
    assert r.exit_code == 0, r.output
    assert '"cpu:2"' in r.stdout
    assert not (tmp_path / "root.db").exists()


def test_environment_when_no_flag(cli, profiles_csv, db_path):
    assert cli("profile", "import", profiles_csv).exit_code == 0
    assert rows_in(db_path) == 2


@pytest.mark.parametrize("how", ["root", "command", "env"])
def test_named_store_in_a_missing_folder_is_refused(cli, profiles_csv, tmp_path, monkeypatch, how):
    missing = tmp_path / "no" / "such" / "folder"
    path = missing / "s.db"
    if how == "root":
        r = cli("--db", path, "profile", "import", profiles_csv)
    elif how == "command":
        r = cli("profile", "import", "--db", path, profiles_csv)
    else:
        monkeypatch.setenv("GREENCTL_DB", str(path))
        r = cli("profile", "import", profiles_csv)
    assert r.exit_code == 2, r.output
    assert str(missing) in r.output and "does not exist" in r.output
    assert "mkdir -p" in r.output  # the fix
    assert not (tmp_path / "no").exists()


def test_store_path_that_is_a_folder_is_refused(cli, tmp_path):
    r = cli("--db", tmp_path, "profile", "list")
    assert r.exit_code == 2, r.output
    assert "is a folder" in r.output


@pytest.mark.parametrize("command", [("list",), ("show", "v1"), ("export",)])
def test_read_only_command_creates_no_store(cli, tmp_path, command):
    path = tmp_path / "typo.db"
    r = cli("--db", path, "profile", *command)
    assert r.exit_code == 2, r.output
    assert f"no greenctl store at {path}" in r.output
    assert not path.exists()


def test_default_store_read_creates_nothing_and_import_creates_it(
    cli, profiles_csv, tmp_path, monkeypatch
):
    monkeypatch.delenv("GREENCTL_DB")
    xdg = tmp_path / "xdg"  # XDG_DATA_HOME (conftest)
    r = cli("profile", "list", "--json")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "[]"
    assert not xdg.exists()
    # a write may create the user's data folder
    assert cli("profile", "import", profiles_csv).exit_code == 0
    assert rows_in(xdg / "greenctl" / "greenctl.db") == 2


def test_failed_import_creates_no_store(cli, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("variant,model,resource,batch,throughput_rps,latency_ms\nv,m,cpu:1,x,1,1\n")
    path = tmp_path / "new.db"
    r = cli("profile", "import", "--db", path, bad)
    assert r.exit_code == 2, r.output
    assert not path.exists()  # the file is checked before a store is opened

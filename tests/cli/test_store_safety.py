"""A refused command writes nothing: a store that cannot be written is refused before a
command acts, an empty ``--db`` is refused by name, a zero-byte file stays empty, a refused
command leaves no new store, and an output path that cannot be written is refused naming
its option, creating nothing.

The read-only cases run the real ``greenctl`` in a subprocess; as root (where chmod does
not bind) they run it as the user nobody through ``setpriv``, and are skipped only when the
file is still writable for whoever runs it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import greenctl.cli as greenctl_cli
import pytest
from typer.testing import CliRunner

NOBODY = 65534
PROFILES = (
    "variant,model,resource,batch,throughput_rps,latency_ms,accuracy\n"
    "v1,fam,cpu:1,1,10,5,0.7\n"
    "v2,fam,cpu:1,1,5,9,0.8\n"
)
T0, T1 = "2022-09-22T00:00:00Z", "2022-09-22T01:00:00Z"
SITES = (
    "time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw\n"
    f"{T0},a,10,100,1,5\n{T0},b,20,50,1,5\n{T1},a,10,100,1,5\n{T1},b,20,50,1,5\n"
)
DEMAND = f"time,gateway,load_mw\n{T0},g1,1\n{T1},g1,2\n"
PLAN_MIX = ["plan", "mix", "--model", "fam", "--rate", "5", "--slo-ms", "100", "--budget", "cpu=2"]

pytestmark = pytest.mark.timeout(300)


def _invoke(*args: str):
    from greenctl.cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)


def _refused(r, *needles: str) -> str:
    """Assert a clean refusal (exit 2, greenctl's Error: line, no traceback); the message."""
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == 2, r.output
    assert "Error:" in r.output and "Traceback" not in r.output, r.output
    message = " ".join(r.output.split())
    for needle in needles:
        assert needle in message, f"{needle!r} not in: {message}"
    return message


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a store (two profiles, the CISO carbon trace, plan 1) and input files."""
    folder = tmp_path_factory.mktemp("seeded")
    (folder / "p.csv").write_text(PROFILES)
    (folder / "sites.csv").write_text(SITES)
    (folder / "demand.csv").write_text(DEMAND)
    db = str(folder / "greenctl.db")
    for argv in (
        ["profile", "import", str(folder / "p.csv")],
        ["carbon", "import", "bundled:clover-ciso-march", "--format", "clover", "--region", "CISO"],
        [*PLAN_MIX, "-o", str(folder / "plan.json")],
    ):
        r = _invoke("--db", db, *argv)
        assert r.exit_code == 0, r.output
    return folder


# -- a store that cannot be written --------------------------------------------------------------
@pytest.fixture
def shared_copy(seeded: Path) -> Iterator[Path]:
    """A copy of the seeded folder that the user nobody can read (a 0755 folder under /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="greenctl-ro-"))
    try:
        for item in seeded.iterdir():
            if not item.name.startswith("greenctl.db-"):
                shutil.copy2(item, folder / item.name)
        os.chmod(folder, 0o755)
        for item in folder.iterdir():
            os.chmod(item, 0o644)
        yield folder
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def as_user() -> Iterator[list[str]]:
    """The prefix that runs greenctl as an ordinary user: none, or setpriv as nobody. As
    root, the folders above the interpreter and the package that nobody cannot enter (a
    0700 temporary folder holding the virtual environment) are opened for traversal only
    (o+x) while the tests run, and closed again after."""
    if os.geteuid() != 0:
        yield []
        return
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: read-only files do not bind")
    opened: list[tuple[Path, int]] = []
    roots = {Path(sys.prefix).resolve(), Path(greenctl_cli.__file__).resolve().parent}
    for root in roots:
        for folder in (root, *root.parents):
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & stat.S_IXOTH and all(f != folder for f, _ in opened):
                os.chmod(folder, mode | stat.S_IXOTH)
                opened.append((folder, mode))
    try:
        yield ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    finally:
        for folder, mode in reversed(opened):
            os.chmod(folder, mode)


def _greenctl(folder: Path, *args: str, prefix: list[str]) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "greenctl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "greenctl.cli.main"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENCTL_")}
    env.update(
        GREENCTL_DB=str(folder / "greenctl.db"),
        HOME=str(folder),
        XDG_DATA_HOME=str(folder / "xdg"),
        GREENCTL_STATE_DIR=str(folder / "state"),
        COLUMNS="200",
    )
    argv = [a.replace("{w}", str(folder)) for a in args]
    return subprocess.run(
        [*prefix, *cmd, *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry of the folder: its mode, mtime and bytes (a folder: no bytes)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(folder))] = (
            stat.S_IMODE(st.st_mode),
            st.st_mtime_ns,
            p.read_bytes() if p.is_file() else b"",
        )
    return out


def _make_read_only(folder: Path, how: str, prefix: list[str]) -> None:
    """chmod the store (``file``) or its folder (``folder``) read-only; skip where it does
    not bind for the user greenctl runs as."""
    target = folder / "greenctl.db" if how == "file" else folder
    os.chmod(target, 0o444 if how == "file" else 0o555)
    probe = _greenctl(folder, "--version", prefix=prefix)  # the user can run greenctl at all
    assert probe.returncode == 0, probe.stderr
    check = [*prefix, sys.executable, "-c", f"import os,sys; sys.exit(os.access({str(target)!r}, os.W_OK))"]  # fmt: skip
    if subprocess.run(check, check=False).returncode:
        pytest.skip(f"{target} is still writable after chmod for the user greenctl runs as")


WRITE_COMMANDS = {
    "plan-mix": PLAN_MIX,
    "plan-geo": ["plan", "geo", "--sites", "{w}/sites.csv", "--demand", "{w}/demand.csv"],
    "carbon-import": [
        "carbon",
        "import",
        "bundled:clover-ciso-sep",
        "--format",
        "clover",
        "--region",
        "SEP",
    ],
    "replan": ["replan", "--plan", "1", "--region", "CISO"],
    "mig-synth": ["mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet"],
    "profile": ["profile", "--variant", "tiny-s", "--batch", "1", "--duration", "0.2"],
    "profile-import": ["profile", "import", "{w}/p.csv", "--merge"],
    "apply": ["apply", "{w}/plan.json", "--dry-run"],
    "down": ["down"],
}


@pytest.mark.parametrize(
    ("how", "name"),
    [("file", name) for name in WRITE_COMMANDS]
    + [("folder", name) for name in ("plan-mix", "carbon-import", "profile-import", "down")],
)
def test_read_only_store_is_refused_before_the_command_acts(shared_copy, as_user, how, name):
    prefix = as_user
    _make_read_only(shared_copy, how, prefix)
    before = _snapshot(shared_copy)

    r = _greenctl(shared_copy, *WRITE_COMMANDS[name], "--json", prefix=prefix)

    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.stderr.startswith("Error: cannot write store"), r.stderr
    message = " ".join(r.stderr.split())
    assert str(shared_copy / "greenctl.db") in message and "read-only" in message, message
    assert "chmod" in message and "--db" in message, message
    assert r.stdout == ""  # --json: nothing on stdout
    assert _snapshot(shared_copy) == before  # store bytes, mtime, mode; no new file


@pytest.mark.parametrize("how", ["file", "folder"])
def test_read_only_store_still_reads_and_stays_as_it_was(shared_copy, as_user, how):
    prefix = as_user
    _make_read_only(shared_copy, how, prefix)
    before = _snapshot(shared_copy)

    r = _greenctl(shared_copy, "plan", "list", "--json", prefix=prefix)

    assert r.returncode == 0, r.stderr
    assert '"kind": "mix"' in r.stdout
    after = _snapshot(shared_copy)
    if how == "file":  # SQLite may leave its -shm/-wal beside a read-only file it read
        after = {k: v for k, v in after.items() if not k.startswith("greenctl.db-")}
    assert after == before


# -- an empty --db --------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["root", "command"])
def test_empty_db_option_is_refused_by_name(where, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--db", "", "profile", "list"] if where == "root" else ["plan", "list", "--db", ""]
    _refused(_invoke(*argv), "--db is empty")
    assert list(tmp_path.iterdir()) == []  # no default store made anywhere
    assert not (tmp_path / "xdg").exists()


def test_empty_greenctl_db_is_refused_by_name(tmp_path, monkeypatch, seeded):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GREENCTL_DB", "")
    _refused(_invoke("profile", "import", seeded / "p.csv"), "GREENCTL_DB is set but empty")
    assert not (tmp_path / "xdg").exists()


# -- zero-byte files, new stores, files that are not stores ---------------------------------------
READERS = [
    ["profile", "list"],
    ["plan", "list"],
    ["carbon", "regions"],
    ["report", "plans"],
    ["profile", "export"],
    ["report", "emissions"],
]


@pytest.mark.parametrize("argv", READERS, ids=[" ".join(a) for a in READERS])
def test_reader_of_a_zero_byte_file_leaves_it_empty(argv, tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = _invoke("--db", empty, *argv)
    assert r.exit_code == 0, r.output
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]  # no -wal, no -shm


def test_refused_write_leaves_no_new_store(tmp_path, seeded):
    new = tmp_path / "new.db"
    _refused(_invoke("--db", new, "plan", "mix", "--model", "nosuch", "--rate", "5"), "nosuch")
    bad = tmp_path / "bad.csv"
    bad.write_text("time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,-3\n")
    _refused(_invoke("--db", new, "carbon", "import", bad, "--region", "X"), "line 2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_refused_write_leaves_a_zero_byte_file_empty(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    bad = tmp_path / "bad.csv"
    bad.write_text("time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,-3\n")
    _refused(_invoke("--db", empty, "carbon", "import", bad, "--region", "X"), "line 2")
    _refused(_invoke("--db", empty, "replan", "--plan", "999"), "999")
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "empty.db"]


@pytest.mark.parametrize("kind", ["random-bytes", "other-sqlite"])
@pytest.mark.parametrize("argv", [["profile", "list"], ["profile", "import", "{csv}"]])
def test_a_file_that_is_not_a_store_is_refused_and_kept(kind, argv, tmp_path, seeded):
    path = tmp_path / "x.db"
    if kind == "random-bytes":
        path.write_bytes(bytes((i * 31 + 7) % 256 for i in range(4096)))
    else:
        con = sqlite3.connect(path)
        con.execute("create table notes (body text)")
        con.commit()
        con.close()
    before = path.read_bytes()
    args = [a.replace("{csv}", str(seeded / "p.csv")) for a in argv]
    _refused(_invoke("--db", path, *args), str(path), "not a greenctl store", "--db")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]


# -- output paths ---------------------------------------------------------------------------------
FILE_OUTPUTS = {
    "report-plans": (["report", "plans", "-o"], "-o"),
    "report-emissions": (["report", "emissions", "-o"], "-o"),
    "report-savings": (
        ["report", "savings", "--plan", "1", "--baseline", "1", "--region", "CISO", "-o"],
        "-o",
    ),
    "profile-export": (["profile", "export", "-o"], "-o"),
    "plan-geo-allocations": (
        ["plan", "geo", "--sites", "{w}/sites.csv", "--demand", "{w}/demand.csv", "--allocations"],
        "--allocations",
    ),
    "plan-geo-plot": (
        ["plan", "geo", "--sites", "{w}/sites.csv", "--demand", "{w}/demand.csv", "--plot"],
        "--plot",
    ),
}
FOLDER_OUTPUTS = {
    "report-charts": (["report", "charts", "--plan", "1", "--region", "CISO", "--out"], "--out"),
    "export-k8s": (["export", "k8s", "1", "-o"], "-o"),
    "export-envoy": (["export", "envoy", "{w}/plan.json", "-o"], "-o"),
    "geo-convert-eglb": (["geo", "convert-eglb", "--steps", "2", "-o"], "-o"),
    "replay": (
        ["replay", "--plan", "1", "--load-trace", "bundled:twitter", "--hours", "0.1", "-o"],
        "-o",
    ),
}
ROOT = f"/greenctl-test-{uuid.uuid4().hex[:8]}"
BAD_PATHS = {
    "missing-folder": ("{w}/nodir/out", "does not exist"),
    "parent-is-a-file": ("{w}/afile/out", "is a file, not a folder"),
    "filesystem-root": (ROOT, "filesystem root"),
    "empty": ("", "is empty"),
}


@pytest.fixture
def work(seeded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the seeded store beside a file and a folder, the command's folder."""
    shutil.copy2(seeded / "greenctl.db", tmp_path / "greenctl.db")
    for name in ("plan.json", "sites.csv", "demand.csv"):
        shutil.copy2(seeded / name, tmp_path / name)
    (tmp_path / "afile").write_text("a file\n")
    (tmp_path / "adir").mkdir()
    monkeypatch.setenv("GREENCTL_DB", str(tmp_path / "greenctl.db"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _check_output_refused(work: Path, argv: list[str], option: str, path: str, says: str):
    before = _snapshot(work)
    args = [a.replace("{w}", str(work)) for a in argv] + [path.replace("{w}", str(work))]
    try:
        message = _refused(_invoke(*args), says)
        assert message.startswith(f"Error: {option} "), message
        assert _snapshot(work) == before  # nothing made, nothing changed (store included)
        assert not os.path.lexists(ROOT)
    finally:  # a failing check must not leave an entry in the filesystem root
        if os.path.isdir(ROOT):
            shutil.rmtree(ROOT, ignore_errors=True)
        elif os.path.lexists(ROOT):
            os.unlink(ROOT)


@pytest.mark.parametrize("bad", [*BAD_PATHS, "a-folder"])
@pytest.mark.parametrize("name", FILE_OUTPUTS)
def test_file_output_that_cannot_be_written_is_refused(work, name, bad):
    argv, option = FILE_OUTPUTS[name]
    path, says = BAD_PATHS.get(bad, ("{w}/adir", "is a folder, not a file"))
    _check_output_refused(work, argv, option, path, says)


@pytest.mark.parametrize("bad", [*BAD_PATHS, "a-file"])
@pytest.mark.parametrize("name", FOLDER_OUTPUTS)
def test_folder_output_that_cannot_be_written_is_refused(work, name, bad):
    argv, option = FOLDER_OUTPUTS[name]
    path, says = BAD_PATHS.get(bad, ("{w}/afile", "is a file, not a folder"))
    _check_output_refused(work, argv, option, path, says)


def test_charts_refused_after_the_check_leave_no_folder(work):
    before = _snapshot(work)
    _refused(_invoke("report", "charts", "--plan", "99", "--region", "CISO", "--out", "new"), "99")
    assert _snapshot(work) == before


def test_good_outputs_are_written(work):
    r = _invoke("report", "plans", "-o", work / "adir" / "plans.csv")
    assert r.exit_code == 0, r.output
    assert (work / "adir" / "plans.csv").read_text().startswith("id,")
    r = _invoke("export", "k8s", "1", "-o", work / "k8s")
    assert r.exit_code == 0, r.output
    assert (work / "k8s" / "kustomization.yaml").exists()


# -- SQLite faults met while a command runs -------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "error", "says"),
    [
        ("attempt to write a readonly database", "InputError", "read-only"),
        ("database is locked", "StoreError", "locked by another process"),
        ("database or disk is full", "StoreError", "disk is full"),
        ("file is not a database", "InputError", "not a greenctl store"),
    ],
)
def test_sqlite_fault_inside_a_command_becomes_greenctl_error(tmp_path, text, error, says):
    from greenctl.data import errors
    from greenctl.data.store import open_store

    path = tmp_path / "g.db"
    with pytest.raises(getattr(errors, error)) as caught, open_store(path):
        raise sqlite3.OperationalError(text)
    assert says in str(caught.value) and str(path) in str(caught.value)
    assert path.exists() == (caught.value.exit_code != 2)  # a refused block removes its new file


def test_programming_errors_keep_their_traceback(tmp_path):
    from greenctl.data.store import open_store

    with (
        pytest.raises(sqlite3.OperationalError, match="no such table"),
        open_store(tmp_path / "g.db") as s,
    ):
        s.db.execute("select * from nosuch")


def test_a_new_store_that_another_process_filled_meanwhile_is_kept(tmp_path, seeded):
    from greenctl.data.errors import InputError
    from greenctl.data.store import open_store

    path = tmp_path / "g.db"
    with pytest.raises(InputError), open_store(path):  # this open creates the file
        r = _invoke("--db", path, "profile", "import", seeded / "p.csv")  # another writer
        assert r.exit_code == 0, r.output
        raise InputError("refused")
    with open_store(path, create=False) as store:
        assert store.profile_count() == 2

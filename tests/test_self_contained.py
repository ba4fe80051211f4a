"""A clone is self-contained: no file reaches outside the repository for data, and the
bundled data sets ship in the wheel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from greenctl.data import bundled

REPO = Path(__file__).resolve().parent.parent
# Written in pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(
        (
            re.escape("../" + "shared"),
            re.escape("shared/" + "reference"),
            r"[\"']shared[\"']\s*/\s*[\"']reference[\"']",
        )
    )
)


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, text=True
        ).stdout
        return [REPO / name for name in out.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file
        skip = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache"}
        return [
            p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO).parts)
        ]


def test_no_file_refers_to_data_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary data (the gzip trace) or a file deleted in the work tree
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not offenders, "use bundled:NAME instead:\n" + "\n".join(offenders)


@pytest.mark.slow
def test_the_wheel_ships_every_bundled_data_set(tmp_path: Path) -> None:
    """A non-editable install gets the data: build the wheel from a copy of the sources."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("cli", "data", "planner", "profiler", "executor"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "wheel"), str(src)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "wheel").glob("greenctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    root = bundled.datasets_dir()
    for ds in bundled.DATASETS.values():
        path = root / ds.path
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for f in files:
            assert f"greenctl/data/datasets/{f.relative_to(root).as_posix()}" in names, f

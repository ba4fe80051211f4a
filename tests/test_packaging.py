"""The code folders install as subpackages of `greenctl` and nothing else lands at top level."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_package_is_under_greenctl_and_every_code_folder_is_packaged():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(cfg["packages"])
    mapping = cfg["package-dir"]
    assert all(p.startswith("greenctl.") for p in packages), packages
    assert set(mapping.values()) == {"cli", "data", "planner", "profiler", "executor"}

    def folder_of(pkg: str) -> Path:
        parts = pkg.split(".")
        for depth in range(len(parts), 1, -1):
            head = ".".join(parts[:depth])
            if head in mapping:
                return REPO / mapping[head] / Path(*parts[depth:])
        raise AssertionError(f"{pkg} has no package-dir mapping")

    for pkg in packages:
        assert (folder_of(pkg) / "__init__.py").is_file(), pkg
    # every folder holding Python modules inside a code folder must be a listed package,
    # or its modules would silently be missing from a non-editable install
    for top in mapping.values():
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top)
            name = ".".join(["greenctl", top, *rel.parts]) if rel.parts else f"greenctl.{top}"
            assert name in packages, f"{init.parent} is a package missing from pyproject's packages"


def test_console_script_points_into_the_namespace():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["greenctl"] == "greenctl.cli.main:main"

"""``export k8s`` refuses a namespace or an image Kubernetes would refuse, naming the option
and the rule (exit 2), and writes nothing; the names Kubernetes takes pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan, write_plan_file
from greenctl.executor.deploy.k8s_export import check_image, check_namespace

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    plan = Plan(kind="mix", deployments=[Deployment("m", "v1", "cpu:1", quota_rps=5.0)])
    write_plan_file(plan, path)
    return path


@pytest.mark.parametrize("namespace", ["greenctl", "a", "team-7", "x" * 63])
def test_namespaces_kubernetes_takes(namespace):
    assert check_namespace(namespace) == namespace


@pytest.mark.parametrize(
    "namespace", ["", "Greenctl", "-lead", "trail-", "snake_case", "dot.ted", "x" * 64, "ns\x1b[2J"]
)
def test_namespaces_kubernetes_refuses(namespace):
    with pytest.raises(InputError, match=r"--namespace .*DNS-1123 label"):
        check_namespace(namespace)


@pytest.mark.parametrize(
    "image",
    [
        "greenctl-executor:0.1.0",
        "nginx",
        "docker.io/library/nginx:1.25",
        "localhost:5000/team/greenctl_exec:v1.0-rc1",
        f"ghcr.io/org/greenctl@{DIGEST}",
        f"registry.example.com/greenctl:0.1@{DIGEST}",
    ],
)
def test_images_kubernetes_takes(image):
    assert check_image(image) == image


@pytest.mark.parametrize(
    "image",
    ["", "Greenctl:1", "nginx:", ":latest", "a//b", "team/Greenctl", "x:has space",
     "x:-dash", "x:" + "t" * 129, "a" * 256, "x@sha256:short", "img\x1b[31m"],
)  # fmt: skip
def test_images_kubernetes_refuses(image):
    with pytest.raises(InputError, match=r"--image .*not a container image reference"):
        check_image(image)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--namespace", "Prod_NS", "DNS-1123 label"),
        ("--namespace", "n" * 64, "at most 63 characters"),
        ("--image", "Registry/Greenctl:latest", "not a container image reference"),
        ("--image", "greenctl:bad tag", "not a container image reference"),
        ("--name", "Bad Name", "not a base name Kubernetes takes"),
        ("--name", "", "DNS-1123 label"),
    ],
)
def test_the_cli_refuses_and_writes_nothing(cli, db_path, tmp_path, plan_file, option, value,
                                            says):  # fmt: skip
    out_dir = tmp_path / "manifests"
    r = cli("export", "k8s", plan_file, "-o", out_dir, option, value)
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"Error: {option} ") and says in r.output, r.output
    assert "hint:" in r.output and "Traceback" not in r.output
    assert not out_dir.exists() and not db_path.exists()


def test_an_existing_folder_is_left_as_it_was(cli, tmp_path, plan_file):
    out_dir = tmp_path / "manifests"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    r = cli("export", "k8s", plan_file, "-o", out_dir, "--namespace", "Bad")
    assert r.exit_code == 2, r.output
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep.txt"]
    r = cli("export", "k8s", plan_file, "-o", out_dir, "--namespace", "good-ns")
    assert r.exit_code == 0, r.output
    assert "name: good-ns" in (out_dir / "namespace.yaml").read_text()

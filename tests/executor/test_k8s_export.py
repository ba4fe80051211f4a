"""Kubernetes export: every document validates against the official client's models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.executor.deploy.k8s_export import build_k8s_export, dns_name, write_k8s_export

GOLDEN = Path(__file__).parent / "golden" / "k8s_mix"

KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "Deployment"): "V1Deployment",
}


def _validate(doc: dict) -> None:
    """Deserialise with the kubernetes client's models and require a lossless round trip.

    The models ignore unknown keys, so a misspelt field shows up as a difference.
    """
    kubernetes = pytest.importorskip("kubernetes")
    api = kubernetes.client.ApiClient()

    model = api.deserialize(
        json.dumps(doc), KINDS[(doc["apiVersion"], doc["kind"])], "application/json"
    )
    back = api.sanitize_for_serialization(model)

    def norm(x):  # the models turn int-or-string quantities into strings
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items()}
        if isinstance(x, list):
            return [norm(v) for v in x]
        return str(x)

    assert norm(back) == norm(doc)


def mix_plan() -> Plan:
    return Plan(
        kind="mix",
        request={"policy": "wrr"},
        deployments=[
            Deployment("resnet", "resnet18", "cpu:4", count=2, batch=1, quota_rps=40.0),
            Deployment("resnet", "resnet50", "mig:1g.10gb", count=1, batch=4, quota_rps=35.0),
            Deployment("bert", "bert-base", "mps:40", count=1, batch=8, quota_rps=10.0),
        ],
        predicted={"objective": 0.7},
        created_at="2026-11-22T10:00:00Z",
        id=7,
    )


def mig_plan() -> Plan:
    layout_a = [
        {"profile": "3g.40gb", "start": 0, "variant": "v1"},
        {"profile": "4g.40gb", "start": 4, "variant": "v2"},
    ]
    layout_b = [{"profile": "7g.80gb", "start": 0, "variant": "v1"}]
    gpus = [
        {"index": i, "model": "NVIDIA H100 80GB HBM3", "layout": layout_a if i % 2 else layout_b}
        for i in range(4)
    ]
    return Plan(
        kind="mig",
        deployments=[
            Deployment("fam", "v1", "mig:3g.40gb", count=2),
            Deployment("fam", "v2", "mig:4g.40gb", count=2),
            Deployment("fam", "v1", "mig:7g.80gb", count=2),
        ],
        extra={"gpus": gpus},
        created_at="2026-11-22T10:00:00Z",
    )


def test_every_document_validates_against_kubernetes_models():
    export = build_k8s_export(mix_plan(), memory_mb={"resnet50": 900.0})
    docs = [d for docs in export.files.values() for d in docs if d["kind"] != "Kustomization"]
    assert len(docs) == 1 + 2 * 3 + 3
    for doc in docs:
        _validate(doc)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    r18 = deployments["greenctl-plan-7-resnet18-cpu-4"]
    assert r18["spec"]["replicas"] == 2
    container = r18["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["cpu"] == "4"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    r50 = deployments["greenctl-plan-7-resnet50-mig-1g-10gb"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert r50["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    assert r50["resources"]["limits"]["memory"] == "1350Mi"
    mps = deployments["greenctl-plan-7-bert-base-mps-40"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "40"} in mps["env"]
    routes = json.loads(export.files["dispatcher.yaml"][0]["data"]["routes.json"])
    resnet = routes["models"]["resnet"]
    assert resnet["policy"] == "wrr"
    assert [(r["weight"], r["slots"]) for r in resnet["instances"]] == [(40.0, 2), (35.0, 4)]
    assert r18["spec"]["template"]["spec"]["containers"][0]["command"][3:5] == ["--model", "resnet"]
    # the dispatcher itself accepts the routing table
    from greenctl.executor.runtime.dispatcher import ModelRoute

    parsed = ModelRoute("resnet", resnet, max_queue=16)
    assert [b.slots for b in parsed.backends] == [2, 4]


def test_mig_plan_gets_mig_parted_config_and_node_labels():
    export = build_k8s_export(mig_plan(), gpus_per_node=2)
    cm = export.files["mig-config.yaml"][0]
    _validate(cm)
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["version"] == "v1"
    ((label, entries),) = config["mig-configs"].items()  # both nodes share one layout
    assert entries == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "4g.40gb": 1}},
    ]
    assert export.node_labels == [
        f"kubectl label node <node-0> nvidia.com/mig.config={label} --overwrite",
        f"kubectl label node <node-1> nvidia.com/mig.config={label} --overwrite",
    ]


def test_golden_files(tmp_path):
    written = write_k8s_export(build_k8s_export(mix_plan()), tmp_path)
    names = sorted(Path(p).name for p in written)
    assert names == sorted(p.name for p in GOLDEN.iterdir()), (
        "regenerate golden files if the change is intended"
    )
    for name in names:
        assert (tmp_path / name).read_text() == (GOLDEN / name).read_text(), name


def test_geo_and_bad_resources_are_refused():
    with pytest.raises(InputError, match="geo plan"):
        build_k8s_export(Plan(kind="geo", deployments=[Deployment("m", "v", "cpu:1")]))
    with pytest.raises(InputError, match="no Kubernetes mapping"):
        build_k8s_export(Plan(kind="mix", deployments=[Deployment("m", "v", "tpu:v5e")]))


def test_dns_names_are_valid():
    long = dns_name("Greenctl_Plan", "x" * 80, "mig:1g.10gb")
    assert len(long) <= 63 and long == long.lower() and not long.endswith("-")


def test_cli_writes_manifests(cli, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(mix_plan().to_json())
    out = tmp_path / "k8s"
    result = cli("export", "k8s", str(plan), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "kustomization.yaml").is_file()
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (out / res).is_file()
    bad = cli("export", "k8s", str(tmp_path / "missing.json"), "-o", str(out))
    assert bad.exit_code == 2


# -- energy and carbon (issue 19) ---------------------------------------------------------------
def test_pods_expose_the_energy_series_and_carry_the_grid_intensity():
    """Every pod is scraped by Prometheus's kubernetes-pods job; executors count carbon at
    the plan's intensity and PUE; the dispatcher exports the intensity and leaves the summing
    to Prometheus."""
    from greenctl.executor.runtime.daemon import build_parser
    from greenctl.executor.runtime.dispatcher import Dispatcher

    plan = mix_plan()
    plan.request.update(carbon_intensity=250.0, pue=1.2)
    export = build_k8s_export(plan)
    docs = [d for docs in export.files.values() for d in docs if d["kind"] != "Kustomization"]
    for doc in docs:
        _validate(doc)
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] == "Deployment"}
    assert len(pods) == 4
    for template in pods.values():
        notes = template["metadata"]["annotations"]
        assert notes == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "8080",
            "prometheus.io/path": "/metrics",
        }
        port = template["spec"]["containers"][0]["ports"][0]["containerPort"]
        assert str(port) == notes["prometheus.io/port"]
    r18 = pods["greenctl-plan-7-resnet18-cpu-4"]["spec"]["containers"][0]["command"]
    args = build_parser().parse_args(r18[3:])  # the executor takes its command line
    assert (args.carbon_intensity, args.pue) == (250.0, 1.2)
    dispatcher = pods["greenctl-plan-7-dispatcher"]["spec"]["containers"][0]
    assert {"name": "GREENCTL_ENERGY_SCRAPE_S", "value": "0"} in dispatcher["env"]
    routes = json.loads(export.files["dispatcher.yaml"][0]["data"]["routes.json"])
    assert routes["carbon"] == {"carbon_g_per_kwh": 250.0, "pue": 1.2}
    disp = Dispatcher(token="t", db=None, max_queue=8, state_dir=Path("."))
    disp.set_routes(routes)  # the dispatcher takes the table, and exports its intensity
    assert disp.carbon == routes["carbon"]
    # without an intensity: no carbon options, no carbon in the table
    bare = build_k8s_export(mix_plan())
    cmd = bare.files["greenctl-plan-7-resnet18-cpu-4.yaml"][0]["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    assert "--carbon-intensity" not in cmd
    assert "carbon" not in json.loads(bare.files["dispatcher.yaml"][0]["data"]["routes.json"])


def test_cli_gives_executors_the_profiles_energy_figures(cli, store, tmp_path):
    """A modeled executor in the cluster counts from the same figures a local one does."""
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant("resnet18", "resnet", accuracy=0.7))
    store.add_profiles(
        [Profile("resnet18", "cpu:4", 1, 80.0, latency_p50_ms=12.0, power_w=40.0,
                 idle_power_w=15.0, energy_j=0.5, source="imported")]
    )  # fmt: skip
    plan = mix_plan()
    plan.request["carbon_intensity"] = 310.0
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    out = tmp_path / "k8s"
    result = cli("export", "k8s", str(path), "-o", str(out))
    assert result.exit_code == 0, result.output
    (deployment, _) = yaml.safe_load_all((out / "greenctl-plan-7-resnet18-cpu-4.yaml").read_text())
    cmd = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert flags["--carbon-intensity"] == "310" and flags["--pue"] == "1"
    assert float(flags["--power-w"]) == 40.0 and float(flags["--idle-power-w"]) == 15.0
    assert float(flags["--energy-j-per-request"]) == 0.5
    (other, _) = yaml.safe_load_all((out / "greenctl-plan-7-bert-base-mps-40.yaml").read_text())
    assert "--power-w" not in other["spec"]["template"]["spec"]["containers"][0]["command"]


def test_dispatcher_energy_reads_can_be_turned_off(monkeypatch):
    import asyncio

    from greenctl.executor.runtime.dispatcher import Dispatcher, energy_scrape_s

    monkeypatch.setenv("GREENCTL_ENERGY_SCRAPE_S", "0")
    assert energy_scrape_s() == 0.0
    disp = Dispatcher(token="t", db=None, max_queue=8, state_dir=Path("."))
    asyncio.run(asyncio.wait_for(disp.energy_loop(), 1.0))  # returns at once: no reads
    for text, value in (("-1", 2.0), ("x", 2.0), ("0.5", 0.5)):
        monkeypatch.setenv("GREENCTL_ENERGY_SCRAPE_S", text)
        assert energy_scrape_s() == value

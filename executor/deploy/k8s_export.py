"""Export a plan as Kubernetes manifests for clusters run with the NVIDIA GPU operator.

One Deployment + Service per planned (variant, resource), replicas the plan's count, each
pod a greenctl executor serving the Open Inference Protocol on 8080 with health probes; a
dispatcher Deployment + Service in front, routes in a ConfigMap. MIG plans also get
mig-parted's config and ``nvidia.com/mig.config`` node labels (mixed strategy). Executors
count energy and carbon as local ones do
(:func:`greenctl.data.emissions.executor_energy_args`) and pods carry ``prometheus.io``
scrape annotations; the dispatcher does not scrape them itself (through a Service its reads
would land on any pod). A new intensity is a new export. Pure: builds plain dicts, never
talks to a cluster. See docs/apply.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from greenctl.data.emissions import routes_carbon
from greenctl.data.errors import InputError, shown
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import RESOURCE_KINDS, parse_resource
from greenctl.executor.deploy.instances import mig_layouts
from greenctl.executor.deploy.llm_plan import names_engines
from greenctl.executor.kinds import get_kind
from greenctl.executor.runtime.dispatcher import ENERGY_SCRAPE_ENV

PORT = 8080
DEFAULT_IMAGE = "greenctl-executor:0.1.0"
APP_LABEL = "app.kubernetes.io/part-of"
#: what the common Prometheus ``kubernetes-pods`` scrape job reads from a pod
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(PORT),
    "prometheus.io/path": "/metrics",
}
#: (variant, resource, batch) -> the executor's energy and carbon options
EnergyArgs = Mapping[tuple[str, str, int], Sequence[str]]


@dataclass
class K8sExport:
    """The documents of one export, as (file name, list of documents) pairs."""

    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    node_labels: list[str] = field(default_factory=list)  # kubectl commands for MIG nodes
    notes: list[str] = field(default_factory=list)


def dns_name(*parts: str) -> str:
    """A DNS-1123 label (lowercase alphanumerics and '-', at most 63 characters)."""
    text = "-".join(parts).lower()
    text = re.sub(r"[^a-z0-9-]+", "-", text).strip("-")
    text = re.sub(r"-{2,}", "-", text)
    if len(text) > 63:
        digest = hashlib.sha1(text.encode()).hexdigest()[:6]
        text = text[:56].rstrip("-") + "-" + digest
    return text or "x"


def _resources(
    dep: Deployment, *, memory_mb: float | None
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Container resources and extra env for one deployment's resource label."""
    res = parse_resource(dep.resource)
    mem = f"{int(max(memory_mb or 0, 256) * 1.5)}Mi"
    resources = res.spec.k8s_resources(res.size, memory=mem)
    if resources is not None:
        # The device plugin sets CUDA_VISIBLE_DEVICES; with MPS sharing it hands out a GPU
        # share and greenctl's executor caps its own threads with the active-thread
        # percentage on top of it.
        pin = res.spec.pin_env(res.size, device=None)
        return resources, [{"name": k, "value": v} for k, v in pin.items()]
    raise InputError(
        f"resource '{dep.resource}' of {dep.variant} has no Kubernetes mapping",
        hint=f"Kubernetes export handles {_k8s_forms()}",
    )


def _k8s_forms() -> str:
    """The resource forms with a Kubernetes mapping (``cpu:N, ... and mps:PCT``)."""
    forms = [
        k.form for k in RESOURCE_KINDS.values() if k.k8s_resources("1", memory="1Mi") is not None
    ]
    return ", ".join(forms[:-1]) + " and " + forms[-1] if len(forms) > 1 else "".join(forms)


def _probe(path: str, *, initial_s: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT},
        "initialDelaySeconds": initial_s,
        "periodSeconds": 5,
        "failureThreshold": 6,
    }


def carbon_args(plan: Plan) -> list[str]:
    """An executor's grid intensity and PUE options for ``plan`` (none without an
    intensity): what :func:`greenctl.data.emissions.executor_energy_args` starts with,
    without a store for the profile's figures."""
    carbon = routes_carbon(plan)
    if carbon is None:
        return []
    return [
        "--carbon-intensity",
        f"{carbon['carbon_g_per_kwh']:g}",
        "--pue",
        f"{carbon['pue']:g}",
    ]


def executor_command(dep: Deployment, energy: Sequence[str] = ()) -> list[str]:
    """The executor's command line inside the container (listens on all pod addresses),
    with its energy and carbon options ``energy``."""
    return [
        "python",
        "-m",
        "greenctl.executor.runtime.daemon",
        "--model",
        dep.model,
        "--variant",
        dep.variant,
        "--resource",
        dep.resource,
        "--batch",
        str(dep.batch),
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        *energy,
    ]


#: a DNS-1123 label, what Kubernetes takes as a namespace
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: an image reference (the grammar of the container image distribution spec): an optional
#: registry host[:port], lowercase path components, an optional tag and an optional digest
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}"
    rf"(?:/{_PATH_PART})*)"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def check_namespace(namespace: str) -> str:
    """``namespace`` if Kubernetes takes it (a DNS-1123 label).

    Raises:
        InputError: naming --namespace and the rule.
    """
    return check_label(namespace, "--namespace", "a Kubernetes namespace")


def check_label(value: str, option: str, what: str) -> str:
    """``value`` if it is a DNS-1123 label (what Kubernetes takes as a namespace or as the
    base of object names), else an error naming ``option`` with a label that would do."""
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise InputError(
            f"{option} {shown(value)} is not {what}: it must be a DNS-1123 label (lowercase "
            "letters, digits and '-', starting and ending with a letter or digit, at most 63 "
            "characters)",
            hint=f"for example {option} {dns_name(value)}",
        )
    return value


def check_image(image: str) -> str:
    """``image`` if it is an image reference Kubernetes can pull (``[registry[:port]/]path
    [:tag][@digest]``, the path in lowercase, at most 255 characters before the tag).

    Raises:
        InputError: naming --image and the rule.
    """
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None or len(match.group("name")) > 255:
        raise InputError(
            f"--image {shown(image)} is not a container image reference: it must be "
            "[REGISTRY[:PORT]/]PATH[:TAG][@DIGEST], the path lowercase letters and digits "
            "separated by '.', '_', '__' or '-' (and '/'), the tag at most 128 of letters, "
            "digits, '_', '.' and '-'",
            hint=f"for example --image {DEFAULT_IMAGE} or registry.example.com/greenctl:0.1",
        )
    return image


def build_k8s_export(
    plan: Plan,
    *,
    name: str | None = None,
    namespace: str = "greenctl",
    image: str = DEFAULT_IMAGE,
    gpus_per_node: int = 8,
    memory_mb: dict[str, float] | None = None,
    mig_config: dict[str, Any] | None = None,
    policy: str | None = None,
    energy_args: EnergyArgs | None = None,
) -> K8sExport:
    """Build the manifests of a plan (mix, mig or glet; geo plans have no cluster mapping).

    ``name`` defaults to ``greenctl-plan-<id>``; ``gpus_per_node`` groups a MIG plan's GPUs into
    nodes; ``memory_mb`` (per variant, from profiles) sizes memory requests; ``mig_config`` is a
    prebuilt mig-parted document, else derived from ``plan.extra["gpus"]``; ``policy`` wins
    over :meth:`~greenctl.executor.kinds.PlanKind.dispatch_policy`; ``energy_args`` default to
    the plan's grid intensity and PUE alone (:func:`carbon_args`).

    Raises:
        InputError: a geo plan, an empty plan, an unmappable resource, or a namespace or
            image Kubernetes refuses.
    """
    check_namespace(namespace)
    check_image(image)
    if name is not None:
        check_label(name, "--name", "a base name Kubernetes takes")
    kind = get_kind(plan.kind)
    if not kind.serves:
        raise kind.refuse("export")
    if kind.local_engines or names_engines(plan):
        raise kind.refuse_elsewhere("Kubernetes export")
    if not plan.deployments:
        raise InputError("the plan has no deployments to export")
    if gpus_per_node < 1:
        raise InputError("--gpus-per-node must be >= 1")
    base = dns_name(name or (f"greenctl-plan-{plan.id}" if plan.id is not None else "greenctl"))
    out = K8sExport()
    where = _Where(base, namespace, image)
    out.files["namespace.yaml"] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": where.labels},
        }
    ]
    routes: dict[str, list[dict[str, Any]]] = {}
    seen: Counter[str] = Counter()
    for dep in plan.deployments:
        obj = dns_name(base, dep.variant, dep.resource.replace(":", "-"))
        seen[obj] += 1
        if seen[obj] > 1:
            obj = dns_name(obj, str(seen[obj]))
        energy = (
            None if energy_args is None else energy_args.get((dep.variant, dep.resource, dep.batch))
        )
        command = executor_command(dep, carbon_args(plan) if energy is None else energy)
        memory = (memory_mb or {}).get(dep.variant)
        out.files[f"{obj}.yaml"] = _executor_objects(where, obj, dep, command, memory_mb=memory)
        routes.setdefault(dep.model, []).append(
            {
                "id": obj,
                "url": f"http://{obj}.{namespace}.svc:{PORT}",
                # the Service balances over the replicas; the dispatcher sees one backend
                # that can take `replicas x batch` requests at once
                "slots": dep.count * dep.batch,
                "weight": dep.quota_rps if dep.quota_rps is not None else float(dep.count),
            }
        )
    policy = kind.dispatch_policy(plan, policy)  # what simulate assumed, a local apply serves
    out.files["dispatcher.yaml"] = _dispatcher_objects(
        where, _routes_config(plan, routes, policy, base)
    )
    if mig_layouts(plan):
        _add_mig_config(out, plan, where, gpus_per_node=gpus_per_node, mig_config=mig_config)
    out.files["kustomization.yaml"] = [
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": sorted(f for f in out.files if f not in ("mig-config.yaml",)),
        }
    ]
    return out


@dataclass(frozen=True)
class _Where:
    """Where an export's objects go: their base name, namespace and image."""

    base: str
    namespace: str
    image: str

    @property
    def labels(self) -> dict[str, str]:
        """The labels every object of the export carries."""
        return {APP_LABEL: self.base}


def _executor_objects(
    where: _Where, obj: str, dep: Deployment, command: list[str], *, memory_mb: float | None
) -> list[dict[str, Any]]:
    """The Deployment and Service of one planned (variant, resource)."""
    labels = {
        **where.labels,
        "app.kubernetes.io/name": obj,
        "greenctl.io/model": dns_name(dep.model),
    }
    resources, env = _resources(dep, memory_mb=memory_mb)
    container: dict[str, Any] = {
        "name": "executor",
        "image": where.image,
        "command": command,
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": resources,
        "readinessProbe": _probe("/v2/health/ready", initial_s=5),
        "livenessProbe": _probe("/v2/health/live", initial_s=10),
    }
    if env:
        container["env"] = env
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": obj, "namespace": where.namespace, "labels": labels},
        "spec": {
            "replicas": dep.count,
            "selector": {"matchLabels": {"app.kubernetes.io/name": obj}},
            "template": {
                "metadata": {"labels": labels, "annotations": dict(SCRAPE_ANNOTATIONS)},
                "spec": {"containers": [container]},
            },
        },
    }
    return [deployment, _service(where, obj, labels)]


def _service(where: _Where, obj: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": obj, "namespace": where.namespace, "labels": labels},
        "spec": {
            "selector": {"app.kubernetes.io/name": obj},
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT}],
        },
    }


def _routes_config(
    plan: Plan, routes: dict[str, list[dict[str, Any]]], policy: str, base: str
) -> dict[str, Any]:
    """The dispatcher's routing-table document (``greenctl.executor.runtime.dispatcher
    --routes``), with the plan's grid intensity, which the dispatcher exports."""
    config_doc: dict[str, Any] = {
        "generation": f"k8s-{base}",
        "models": {model: {"policy": policy, "instances": inst} for model, inst in routes.items()},
    }
    carbon = routes_carbon(plan)
    if carbon is not None:
        config_doc["carbon"] = carbon
    return config_doc


def _dispatcher_objects(where: _Where, config_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The dispatcher's routes ConfigMap, Deployment and Service."""
    dispatcher = dns_name(where.base, "dispatcher")
    d_labels = {**where.labels, "app.kubernetes.io/name": dispatcher}
    container = {
        "name": "dispatcher",
        "image": where.image,
        "command": [
            "python",
            "-m",
            "greenctl.executor.runtime.dispatcher",
            "--routes",
            "/etc/greenctl/routes.json",
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
        ],
        "ports": [{"name": "http", "containerPort": PORT}],
        # Prometheus sums the executor pods' counters (module doc)
        "env": [{"name": ENERGY_SCRAPE_ENV, "value": "0"}],
        "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
        "readinessProbe": _probe("/v2/health/ready", initial_s=2),
        "livenessProbe": _probe("/v2/health/live", initial_s=5),
        "volumeMounts": [{"name": "routes", "mountPath": "/etc/greenctl"}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{dispatcher}-routes",
                "namespace": where.namespace,
                "labels": d_labels,
            },
            "data": {"routes.json": json.dumps(config_doc, indent=2, sort_keys=True)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": dispatcher, "namespace": where.namespace, "labels": d_labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": dispatcher}},
                "template": {
                    "metadata": {"labels": d_labels, "annotations": dict(SCRAPE_ANNOTATIONS)},
                    "spec": {
                        "containers": [container],
                        "volumes": [
                            {"name": "routes", "configMap": {"name": f"{dispatcher}-routes"}}
                        ],
                    },
                },
            },
        },
        _service(where, dispatcher, d_labels),
    ]


def _add_mig_config(
    out: K8sExport,
    plan: Plan,
    where: _Where,
    *,
    gpus_per_node: int,
    mig_config: dict[str, Any] | None,
) -> None:
    """A MIG plan's mig-parted ConfigMap (for the GPU operator's namespace), the node
    labels that select its layouts, and how to point the operator at it."""
    base = where.base
    config, node_labels = (
        mig_nodes(plan, gpus_per_node=gpus_per_node, base=base)
        if mig_config is None
        else (mig_config, [])
    )
    out.files["mig-config.yaml"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{base}-mig-parted-config",
                "namespace": "gpu-operator",
                "labels": where.labels,
            },
            "data": {"config.yaml": yaml.safe_dump(config, sort_keys=False)},
        }
    ]
    out.node_labels = node_labels
    out.notes.append(
        "Point the GPU operator at the ConfigMap (helm value migManager.config.name="
        f"{base}-mig-parted-config, mig.strategy=mixed), then label the nodes as listed."
    )


def mig_nodes(plan: Plan, *, gpus_per_node: int, base: str) -> tuple[dict[str, Any], list[str]]:
    """Group a MIG plan's GPUs into nodes; one mig-parted config label per distinct node layout.

    Returns the mig-parted v1 document and the ``kubectl label`` commands, one per node.
    """
    gpus = plan.extra.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise InputError(
            "MIG plan has no 'gpus' list", hint="write MIG plans with `greenctl plan mig`"
        )
    gpus = sorted(gpus, key=lambda g: int(g.get("index", 0)))
    configs: dict[str, list[dict[str, Any]]] = {}
    keys: dict[str, str] = {}
    commands = []
    for node_no in range(0, len(gpus), gpus_per_node):
        node = gpus[node_no : node_no + gpus_per_node]
        # group the node's GPUs (re-indexed 0..k-1) by identical profile counts
        groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
        for local, gpu in enumerate(node):
            counts = Counter(str(inst["profile"]) for inst in gpu.get("layout") or [])
            groups.setdefault(tuple(sorted(counts.items())), []).append(local)
        entries = [
            {"devices": devices, "mig-enabled": bool(key), "mig-devices": dict(key)}
            for key, devices in sorted(groups.items(), key=lambda kv: kv[1][0])
        ]
        signature = json.dumps(entries, sort_keys=True)
        if signature not in keys:
            keys[signature] = dns_name(base, f"layout-{len(keys) + 1}")
            configs[keys[signature]] = entries
        commands.append(
            f"kubectl label node <node-{node_no // gpus_per_node}> nvidia.com/mig.config={keys[signature]} --overwrite"
        )
    return {"version": "v1", "mig-configs": configs}, commands


def write_k8s_export(export: K8sExport, out_dir: Any) -> list[str]:
    """Write every file (multi-document YAML) plus a README with the node labels; returns paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, docs in export.files.items():
        path = out / fname
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        written.append(str(path))
    lines = [
        "# Applying these manifests",
        "",
        "From this directory:",
        "",
        "```",
        "kubectl apply -k .",
        "```",
        "",
    ]
    if export.node_labels:
        lines += [
            "MIG nodes: apply mig-config.yaml to the gpu-operator namespace, then label:",
            "",
            "```",
        ]
        lines += [*export.node_labels, "```", ""]
    lines += export.notes
    (out / "README.md").write_text("\n".join(lines) + "\n")
    written.append(str(out / "README.md"))
    return written

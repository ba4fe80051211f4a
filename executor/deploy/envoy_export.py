"""``greenctl export envoy``: a geo plan's slot as Envoy v3 configuration, one per gateway.

Each gateway gets a static Envoy bootstrap (``envoy -c gateway-NAME.yaml``): a listener whose
route configuration sends ``/`` to ``weighted_clusters`` with the gateway's allocation
fractions of the slot (the geo router's :func:`~greenctl.executor.deploy.georouter.routing_table`,
so Envoy and the router carry the same plan), as integer weights summing to
:data:`TOTAL_WEIGHT` (largest remainders), plus one cluster per site the gateway may use,
health-checked on ``/v2/health/ready`` (Envoy then shifts a failing site's weight to the
others, as the router drains it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from greenctl.data.carbon_io import parse_time
from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.data.store import Store
from greenctl.executor.deploy.georouter_table import gateway_fractions, routing_table, slot_index

#: what every route's weights add up to
TOTAL_WEIGHT = 1000
LISTEN_PORT = 10000
DEFAULT_SITE_PORT = 8000
_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class EnvoyExport:
    """File name -> Envoy bootstrap document, and notes for the user."""

    slot: int
    slot_time: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def integer_weights(fractions: dict[str, float], total: int = TOTAL_WEIGHT) -> dict[str, int]:
    """Integer weights summing to ``total`` by largest remainders; zero weights left out."""
    s = math.fsum(v for v in fractions.values() if v > 0)
    if s <= 0:
        return {}
    exact = {k: total * v / s for k, v in fractions.items() if v > 0}
    out = {k: math.floor(v) for k, v in exact.items()}
    short = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:short]:
        out[k] += 1
    return {k: v for k, v in sorted(out.items()) if v > 0}


def cluster_name(site: str) -> str:
    return "site-" + _NAME.sub("-", site)


def _cluster(site: str, url: str | None) -> dict[str, Any]:
    parts = urlsplit(url) if url else None
    host = (parts.hostname if parts else None) or site
    port = (parts.port if parts else None) or (
        443 if parts and parts.scheme == "https" else DEFAULT_SITE_PORT
    )
    doc: dict[str, Any] = {
        "name": cluster_name(site),
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": cluster_name(site),
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "1s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 2,
                "http_health_check": {"path": "/v2/health/ready"},
            }
        ],
    }
    if parts is not None and parts.scheme == "https":
        doc["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                "UpstreamTlsContext",
                "sni": host,
            },
        }
    return doc


def build_envoy_export(
    table: dict[str, Any], *, slot: int, sites: dict[str, str] | None = None
) -> EnvoyExport:
    """Per gateway, a bootstrap routing ``slot``'s fractions to the sites' clusters.

    Args:
        table: the geo router's routing table of the plan.
        slot: the slot to export (:func:`~greenctl.executor.deploy.georouter_table.slot_index`).
        sites: each site's endpoint URL; a site without one is addressed by its name
            on port :data:`DEFAULT_SITE_PORT` (said in ``notes``).
    """
    sites = sites or {}
    out = EnvoyExport(slot=slot, slot_time=table["times"][slot])
    unnamed = [s for s in table["sites"] if s not in sites]
    if unnamed:
        out.notes.append(
            f"no endpoint given for {', '.join(unnamed)}: addressed as NAME:{DEFAULT_SITE_PORT} "
            "(pass --site NAME=URL)"
        )
    for gw in table["gateways"]:
        weights = integer_weights(gateway_fractions(table, slot, gw))
        if not weights:
            out.notes.append(f"gateway {gw} has no planned load: no file written for it")
            continue
        used = sorted(set(weights) | set(table["allowed"].get(gw, [])))
        route_config = {
            "name": f"greenctl-geo-{_NAME.sub('-', gw)}",
            "virtual_hosts": [
                {
                    "name": "oip",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "weighted_clusters": {
                                    "clusters": [
                                        {"name": cluster_name(s), "weight": w}
                                        for s, w in weights.items()
                                    ]
                                },
                                "retry_policy": {
                                    "retry_on": "connect-failure,reset",
                                    "num_retries": 1,
                                },
                            },
                        }
                    ],
                }
            ],
        }
        hcm = {
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network."
                "http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "greenctl_geo",
                "route_config": route_config,
                "http_filters": [
                    {
                        "name": "envoy.filters.http.router",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router."
                            "v3.Router"
                        },
                    }
                ],
            },
        }
        out.files[f"gateway-{_NAME.sub('-', gw)}.yaml"] = {
            "static_resources": {
                "listeners": [
                    {
                        "name": "oip",
                        "address": {
                            "socket_address": {"address": "0.0.0.0", "port_value": LISTEN_PORT}
                        },
                        "filter_chains": [{"filters": [hcm]}],
                    }
                ],
                "clusters": [_cluster(s, sites.get(s)) for s in used],
            }
        }
    return out


def write_envoy_export(export: EnvoyExport, out_dir: str | Path) -> list[str]:
    """Write the files (YAML) under ``out_dir`` (created); their paths."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in export.files.items():
        target = path / name
        header = (
            f"# greenctl geo plan, slot {export.slot} ({export.slot_time}); "
            f"weights sum to {TOTAL_WEIGHT}\n"
        )
        target.write_text(header + yaml.safe_dump(doc, sort_keys=False))
        written.append(str(target))
    return written


def export_envoy(
    plan: Plan, *, store: Store, at: str | None = None, sites: dict[str, str] | None = None
) -> EnvoyExport:
    """The Envoy export of a geo plan at ``at`` (default now).

    Raises:
        InputError: not a geo plan, a bad time, or a site that is not the plan's.
    """
    try:
        when = parse_time(at) if at else datetime.now(UTC)
    except ValueError as exc:
        raise InputError(f"--at: {exc}") from None
    table = routing_table(plan, store)
    unknown = [s for s in sites or {} if s not in table["sites"]]
    if unknown:
        raise InputError(
            f"--site {', '.join(unknown)}: not a site of the plan",
            hint=f"its sites are {', '.join(table['sites'])}",
        )
    slot, wrapped = slot_index(table, when)
    out = build_envoy_export(table, slot=slot, sites=sites)
    if wrapped:
        out.notes.append(
            f"the time lies outside the plan's span: slot {slot} at the same offset in it"
        )
    return out

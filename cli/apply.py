"""``greenctl apply``, ``status``, ``down`` and ``loadgen``: run plans and measure them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from greenctl.cli.common import console, input_path, print_json, render_table, say, store_for
from greenctl.cli.options import AtOpt, DbOpt, JsonOpt
from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.plan import load_plan_file

RecordedBackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help="local or ray (default: the backend the last apply ran the plan on).",
    ),
]
AddressOpt = Annotated[
    str | None, typer.Option("--address", help="Ray cluster address (host:6379) for --backend ray.")
]


PlanFileArg = Annotated[
    Path, typer.Argument(help="Plan JSON (from `greenctl plan ...`).", parser=input_path)
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the actions; change nothing.")]
VerifyOpt = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="Afterwards, load it at the predicted rate and record measured vs predicted.",
    ),
]
MigPartedOpt = Annotated[
    bool,
    typer.Option(
        "--mig-parted", help="Leave the MIG layout to NVIDIA mig-parted / the GPU operator."
    ),
]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="Wait for a concurrent apply instead of failing.")
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy", help="Dispatch policy: fifo, wrr or batch (default: the plan's, as simulate)."
    ),
]
PortOpt = Annotated[
    int | None, typer.Option("--port", help="Dispatcher port (default: any free port).")
]
HostOpt = Annotated[
    str, typer.Option("--host", help="Dispatcher address; loopback unless you say otherwise.")
]
LoaderOpt = Annotated[
    str | None,
    typer.Option("--loader", help="module:function loading variants (default: built-in catalog)."),
]
VerifyDurationOpt = Annotated[
    float, typer.Option("--verify-duration", help="Seconds of verification load.")
]
RayHttpPortOpt = Annotated[
    int, typer.Option("--ray-http-port", help="HTTP port of the Ray router (--backend ray).")
]
SiteOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--site", help="A geo plan's site endpoint, NAME=URL (every site of the plan needs one)."
    ),
]
GatewayOpt = Annotated[
    str | None,
    typer.Option("--gateway", help="Geo plan: the gateway of requests without the header."),
]


def apply_cmd(
    plan_file: PlanFileArg,
    dry_run: DryRunOpt = False,
    verify: VerifyOpt = False,
    mig_parted: MigPartedOpt = False,
    wait: WaitOpt = False,
    policy: PolicyOpt = None,
    port: PortOpt = None,
    host: HostOpt = "127.0.0.1",
    loader: LoaderOpt = None,
    verify_duration: VerifyDurationOpt = 10.0,
    backend: RecordedBackendOpt = None,
    address: AddressOpt = None,
    ray_http_port: RayHttpPortOpt = 8000,
    site: SiteOpt = None,
    gateway: GatewayOpt = None,
    at: AtOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Make a plan real: partitions, executor daemons and a dispatcher, with rollback; a geo
    plan: a geo router forwarding each request to a site (--site NAME=URL)."""
    from greenctl.executor.deploy.backends import backend_for, get_backend  # numpy
    from greenctl.executor.deploy.checks import check_apply_values
    from greenctl.executor.deploy.georouter_table import plan_routes

    check_apply_values(host=host, verify_duration_s=verify_duration, http_port=ray_http_port)
    plan = load_plan_file(plan_file)
    if plan_routes(plan) or site:
        _apply_geo(plan, site, gateway=gateway, at=at, host=host, port=port, db=db,
                   dry_run=dry_run, json_out=json_out)  # fmt: skip
        return
    if backend is not None:
        get_backend(backend, address=address)  # a bad --backend: refused before the store
    with store_for(db) as store:
        # no --backend: where the running plan runs (switched in place there), else local
        runner = backend_for(store, backend, address=address)
        result = runner.apply(
            plan,
            store=store,
            dry_run=dry_run,
            verify=verify,
            verify_duration_s=verify_duration,
            policy=policy,
            mig_parted=mig_parted,  # each backend takes its own options
            wait=wait,
            port=port,
            host=host,
            loader=loader,
            http_port=ray_http_port,
        )
    if json_out:
        print_json(result.to_dict())
        return
    if runner.name == "ray":
        _print_ray_apply(result, dry_run=dry_run)
    else:
        _print_apply(result, dry_run=dry_run, openai="llm" in plan.extra)


def _print_apply(result: Any, *, dry_run: bool, openai: bool = False) -> None:
    """What a local apply did (or would do), its dispatcher (``openai``: its OpenAI API
    too, for a plan of LLM tiers), warnings and verification."""
    if not result.changed:
        console.print("Nothing to do: the plan is already running.")
    else:
        title = "Planned actions (dry run)" if dry_run else "Actions taken"
        render_table(
            title, ["action", "details"], [[a["action"], _details(a)] for a in result.actions]
        )
    if result.dispatcher_url and not dry_run:
        say(f"Dispatcher: {result.dispatcher_url}  (Open Inference Protocol v2)")
        if openai:
            say(f"OpenAI API: {result.dispatcher_url}/v1  (chat/completions, completions)")
    for w in result.warnings:
        say(("warning:", "yellow"), f" {w}", err=True)
    if result.verify:
        _print_verify(result.verify)


def _apply_geo(plan: Any, site: list[str] | None, *, db: str | None, json_out: bool,
               **options: Any) -> None:  # fmt: skip
    from greenctl.executor.deploy.georouter import apply_geo, parse_sites  # numpy

    sites = parse_sites(site)
    with store_for(db) as store:
        doc = apply_geo(plan, store=store, sites=sites, **options)
    if json_out:
        print_json(doc)
        return
    if doc.get("dry_run"):
        say(f"Would {doc['action']} the geo router for plan {doc['plan_id']} (dry run).")
        return
    say(f"Geo router: {doc['router_url']}  (Open Inference Protocol v2; {doc['action']})")
    say(
        f"Slot {doc['slot']} ({doc['slot_time']}{', wrapped' if doc['slot_wrapped'] else ''}); "
        f"gateways {', '.join(doc['gateways'])} (header Greenctl-Gateway"
        + (f", default {doc['default_gateway']})" if doc["default_gateway"] else ")")
    )


def _print_ray_apply(result: Any, *, dry_run: bool) -> None:
    title = "Planned actions (dry run, Ray)" if dry_run else "Actions taken (Ray)"
    render_table(title, ["action"], [[a] for a in result.actions])
    if not dry_run:
        say(f"Endpoint: {result.url}  (Open Inference Protocol v2) in {result.elapsed_s:.1f} s")
    if result.verify:
        _print_verify(result.verify)


def _details(action: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in action.items() if k != "action")


BREAKDOWN_CAPTION = (
    ". Measured p50/p95 of a request's wait in the executor's batch queue, its batch's run "
    "and the time outside both (client, network, dispatcher, executor receive and encode), "
    "as the executors timed them"
)


def _breakdown(b: object) -> list[tuple[str, str]]:
    """(part, "p50 / p95") of a measured latency breakdown: executor queue, batch run,
    outside (none without one)."""
    if not isinstance(b, dict):
        return []
    names = (("queue_ms", "executor queue"), ("run_ms", "batch run"), ("outside_ms", "outside"))
    return [
        (label, f"{b[k]['p50']:.3g} / {b[k]['p95']:.3g}")
        for k, label in names
        if isinstance(b.get(k), dict)
    ]


def _print_verify(v: dict[str, object]) -> None:
    pred = v.get("predicted") or {}
    meas = v.get("measured") or {}
    assert isinstance(pred, dict) and isinstance(meas, dict)
    render_table(
        "Predicted vs measured (verify run)",
        ["figure", "predicted", "measured"],
        [
            ["rate req/s", pred.get("rate_rps"), meas.get("rate_rps")],
            ["p50 ms", pred.get("p50_ms"), meas.get("p50_ms")],
            ["p95 ms", pred.get("p95_ms"), meas.get("p95_ms")],
            ["p99 ms", pred.get("p99_ms"), meas.get("p99_ms")],
            ["errors", None, meas.get("errors")],
            ["503s", None, meas.get("rejected_503")],
            ["client lag p95 ms", None, meas.get("client_lag_p95_ms")],
            *([f"{part} p50 / p95 ms", None, v] for part, v in _breakdown(meas.get("breakdown"))),
        ],
        caption=(
            f"run {v.get('run_id')} stored; see `greenctl report`. Predicted latency: "
            + str(pred.get("latency_includes") or "model only (modeled)")
            + BREAKDOWN_CAPTION
        ),
    )
    if meas.get("note"):
        say(("warning:", "yellow"), f" {meas['note']}", err=True)


def status_cmd(
    backend: RecordedBackendOpt = None,
    address: AddressOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the dispatcher and every running instance (variant, resource, pid, port, p95).
    Exits 1 unless a plan fully serves (nothing applied included), and says why."""
    # numpy: not for `--help`
    from greenctl.executor.deploy.backends import not_serving, status
    from greenctl.executor.deploy.georouter import router_status

    # read-only: a missing store is not created, except to ask a named cluster
    with store_for(db, create=backend not in (None, "local")) as store:
        doc = status(store, backend=backend, address=address)
        geo = router_status(store)
    if geo is not None:
        doc["geo"] = geo
    if json_out:
        print_json(doc)
    else:
        if geo is None or doc.get("dispatcher") or doc.get("instances"):
            _print_status(doc)
        if geo is not None:
            _print_geo(geo)
    reasons = not_serving(doc)
    if geo is not None and not doc.get("dispatcher") and not doc.get("instances"):
        reasons = []  # a geo router alone: its sites' state is what serves
    if geo is not None and geo["state"] != "serving":
        drained = [n for n, s in (geo.get("sites") or {}).items() if not s.get("healthy", True)]
        reasons.append(
            f"the geo router is {geo['state']}"
            + (f" (drained: {', '.join(drained)})" if drained else "")
        )
    if reasons:
        raise ExecutorError("not serving: " + "; ".join(reasons))


def _print_status(doc: dict[str, Any]) -> None:
    if doc.get("backend") == "ray":
        if doc["app"] is None:
            where = f"the Ray cluster at {doc['address']}" if doc["address"] else "Ray"
            say(
                f"Nothing greenctl applied runs on {where} (apply a plan with "
                "`greenctl apply PLAN.json --backend ray --address HOST:PORT`)."
            )
            return
        if not doc["running"]:
            say(
                f"Ray application {doc['app']} (plan {doc['plan_id']}) is not on the cluster at "
                f"{doc['address']}: it was deleted or the cluster restarted; apply the plan again."
            )
            return
        url = (doc.get("dispatcher") or {}).get("url")
        say(f"Ray application {doc.get('app') or '-'} at {url or '-'} (plan {doc.get('plan_id')})")
        render_table(
            "Deployments",
            ["variant", "resource", "replicas", "status"],
            [[i["variant"], i["resource"], i["replicas"], i["status"]] for i in doc["instances"]],
        )
        return
    disp = doc["dispatcher"]
    if disp is None and not doc["instances"]:
        console.print("Nothing is running (apply a plan with `greenctl apply PLAN.json`).")
        return
    if disp is not None:
        state = "ready" if disp["ready"] else ("alive, not ready" if disp["alive"] else "DOWN")
        sup = disp.get("supervisor")
        watched = ""
        if sup is not None:
            watched = f"  (supervisor pid {sup['pid']}{'' if sup['alive'] else ' GONE'})"
        say(f"Dispatcher: {disp['url']}  pid {disp['pid']}  {state}{watched}")
    render_table(
        "Instances",
        [
            "id",
            "model",
            "variant",
            "resource",
            "pid",
            "port",
            "state",
            "requests",
            "p95 ms",
            "restarts",
        ],
        [
            [
                i["id"],
                i["model"],
                i["variant"],
                i["resource"],
                i["pid"],
                i["port"],
                i["state"],
                i["requests"],
                i["p95_ms"],
                i["restarts"],
            ]
            for i in doc["instances"]
        ],
        caption="p95 over each instance's last 4096 requests, measured inside the executor",
    )
    if doc.get("llm"):
        _print_llm_tiers(doc["llm"]["tiers"])
    say(f"State: {doc['state']}", style="bold" if doc["state"] == "serving" else "bold red")


def _print_llm_tiers(tiers: list[dict[str, Any]]) -> None:
    """The LLM tiers the dispatcher routes to, with the plan's shares and predictions."""

    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    render_table(
        "LLM tiers",
        ["variant", "engine", "share", "quality", "TTFT ms (predicted)", "instances", "ready"],
        [
            [
                t["variant"], t["engine"], num(t["share"], ".2f"), num(t["quality"], ".2f"),
                f"{num(t['ttft_ms'], '.0f')} {t.get('percentile') or ''}".strip(),
                t["instances"], t["ready"],
            ]
            for t in tiers
        ],
        caption="OpenAI API at the dispatcher's /v1; requests follow the shares",
    )  # fmt: skip


def _print_geo(geo: dict[str, Any]) -> None:
    if geo["state"] == "down":
        say(f"Geo router (plan {geo.get('plan_id')}): DOWN  {geo.get('why') or ''}")
        return
    wrapped = ", wrapped" if geo["slot_wrapped"] else ""
    say(
        f"Geo router: {geo['url']}  plan {geo['plan_id']}  slot {geo['slot']} "
        f"({geo['slot_time']}{wrapped})  retries {geo['retries']}"
    )

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v * 100:.1f}"

    rows = []
    for gw, g in geo["gateways"].items():
        for site, r in g["sites"].items():
            health = "ok" if geo["sites"][site]["healthy"] else "DRAINED"
            rows.append(
                [gw, site, health, r["served"], pct(r["served_share"]), pct(r["planned_share"]),
                 pct(r["slot_fraction"])]
            )  # fmt: skip
    render_table(
        "Geo routing",
        ["gateway", "site", "health", "served", "served %", "planned %", "slot %"],
        rows,
        caption="planned %: the plan's fractions over the slots the requests came in; "
        "slot %: the current slot's",
    )
    say(f"State: {geo['state']}", style="bold" if geo["state"] == "serving" else "bold red")


def down_cmd(
    restore_mig: Annotated[
        bool,
        typer.Option(
            "--restore-mig", help="Put back the MIG layout checkpointed before the first apply."
        ),
    ] = False,
    backend: RecordedBackendOpt = None,
    address: AddressOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Stop the dispatcher and every executor greenctl started (on the backend that runs the
    plan, unless --backend names one)."""
    from greenctl.executor.deploy.backends import down  # numpy: not for `--help`

    with store_for(db) as store:
        doc = down(store, backend=backend, address=address, restore_mig=restore_mig)
    if json_out:
        print_json(doc)
        return
    if doc.get("backend") == "ray":
        console.print(f"Deleted {len(doc['deleted'])} Ray Serve application(s).")
        if doc["stopped"]:
            console.print(f"Stopped {len(doc['stopped'])} geo router process(es).")
        return
    console.print(f"Stopped {len(doc['stopped'])} process(es).")
    for r in doc["restored_mig"]:
        console.print(f"Restored the MIG layout of GPU {r['gpu']}.")


def loadgen_cmd(
    endpoint: Annotated[
        str, typer.Option("--endpoint", help="Base URL, e.g. http://127.0.0.1:8000.")
    ],
    model: Annotated[str, typer.Option("--model", help="Model name to infer.")],
    duration: Annotated[float, typer.Option("--duration", help="Seconds to send load.")] = 10.0,
    rate: Annotated[
        float | None, typer.Option("--rate", help="Poisson rate, requests per second.")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="Requests-per-second trace (whitespace-separated, .gz ok), or bundled:NAME.",
            parser=input_path,
            metavar="FILE",
        ),
    ] = None,
    scale: Annotated[
        float, typer.Option("--scale", help="Multiply the trace's rates by this.")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the arrival process.")] = 0,
    json_tensors: Annotated[
        bool,
        typer.Option("--json-tensors", help="Send tensors as JSON numbers, not binary data."),
    ] = False,
    gateway: Annotated[
        str | None,
        typer.Option("--gateway", help="Send as this gateway (Greenctl-Gateway, a geo router)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Send an open-loop Poisson load (or replay a trace) and report latency and errors."""
    from greenctl.executor.runtime.loadgen import client_lag_note, read_trace, run_load  # numpy

    if (rate is None) == (trace is None):
        raise InputError("give exactly one of --rate RPS or --trace FILE")
    res = run_load(
        endpoint,
        model,
        duration_s=duration,
        rate_rps=rate,
        trace=read_trace(trace) if trace is not None else None,
        scale=scale,
        seed=seed,
        binary=not json_tensors,
        gateway=gateway,
    )
    if json_out:
        print_json(res.to_dict())
        return
    render_table(
        f"Load on {model} at {endpoint}",
        [
            "offered req/s",
            "achieved req/s",
            "sent",
            "ok",
            "errors",
            "503s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "batch rows",
            "client lag p95 ms",
        ],
        [
            [
                res.offered_rps,
                res.achieved_rps,
                res.sent,
                res.ok,
                res.errors,
                res.rejected_503,
                res.p50_ms,
                res.p95_ms,
                res.p99_ms,
                res.mean_batch_rows,
                res.client_lag_p95_ms,
            ]
        ],
        caption=(
            "batch rows: mean rows of the batches the requests ran in (from the executors); "
            "client lag: how far this load generator ran behind its own schedule"
        ),
    )
    parts = _breakdown(res.breakdown)
    if parts:
        render_table(
            "Where the time went (measured)",
            ["part", "p50 / p95 ms"],
            [list(p) for p in parts],
            caption=BREAKDOWN_CAPTION.removeprefix(". "),
        )
    note = client_lag_note(res.client_lag_p95_ms, res.p95_ms)
    if note:
        say(("warning:", "yellow"), f" {note}", err=True)


def register(app: typer.Typer) -> None:
    app.command("apply")(apply_cmd)
    app.command("status")(status_cmd)
    app.command("down")(down_cmd)
    app.command("loadgen")(loadgen_cmd)

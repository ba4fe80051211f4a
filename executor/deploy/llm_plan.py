"""What ``apply`` reads of a plan whose tiers are served by LLM engines (the plan's ``llm``
section: ``engines``, ``shares``, ``tiers``): which engine each tier runs, how its executor
starts (:mod:`greenctl.executor.runtime.llm_executor`), and what the dispatcher is told of
each instance (its tier's share, quality, predicted TTFT and joules per token).

Which tiers run engines is one rule (:func:`engine_tiers`), the kind's name not compared; a
kind whose planner names every tier's engine says so for the other backends
(:attr:`~greenctl.executor.kinds.PlanKind.local_engines`). An engine starts from its model
folder (``llm.engines.TIER.model``); an ``openai`` tier (a server the user runs, profiled
black-box) is refused: greenctl serves only engines it starts and stops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError, shown
from greenctl.data.llm_profiles import LLM_SOURCE, latest_llm_profiles
from greenctl.data.plan import Plan
from greenctl.data.store import Store
from greenctl.profiler import llm_engines

#: the plan document's section this module reads
SECTION = "llm"


def llm_section(plan: Plan) -> dict[str, Any]:
    """The plan's ``llm`` section (empty when it has none)."""
    doc = plan.extra.get(SECTION)
    return doc if isinstance(doc, dict) else {}


def plan_engines(plan: Plan) -> dict[str, tuple[str, str]]:
    """``{tier: (engine, absolute model path)}`` of the tiers the plan names engines for
    (unchecked: :func:`check_engines` refuses bad ones)."""
    engines = llm_section(plan).get("engines")
    out: dict[str, tuple[str, str]] = {}
    if not isinstance(engines, dict):
        return out
    for tier, doc in engines.items():
        if isinstance(doc, dict) and isinstance(doc.get("model"), str):
            out[str(tier)] = (str(doc.get("engine")), str(Path(doc["model"]).resolve()))
    return out


def names_engines(plan: Plan) -> bool:
    """Whether ``plan`` names engines for its tiers (an ``llm.engines`` entry, checked by
    :func:`check_engines`): then every tier it deploys runs one."""
    return llm_section(plan).get("engines") is not None


def engine_tiers(plan: Plan, store: Store) -> list[str]:
    """The tiers of ``plan`` served by an engine greenctl starts, which only the local
    backend does: all of them when the plan :func:`names_engines`, else those that are LLM
    variants in ``store``; in deployment order."""
    every = names_engines(plan)
    llm_tiers = set() if every else {v.name for v in store.variants() if v.source == LLM_SOURCE}
    return list(
        dict.fromkeys(d.variant for d in plan.deployments if every or d.variant in llm_tiers)
    )


def check_engines(plan: Plan, store: Store) -> dict[str, tuple[str, str]]:
    """The engine of every tier the plan deploys, checked before anything starts: each of
    :func:`engine_tiers` needs an engine greenctl starts and a model it serves. Returns
    :func:`plan_engines`.

    Raises:
        InputError: naming ``llm.engines.TIER`` (or its ``model``) and the fix.
    """
    raw = llm_section(plan).get("engines")
    if raw is not None and not isinstance(raw, dict):
        raise InputError(
            f"the plan's llm.engines must be an object of tiers, not {shown(raw)}",
            hint='for example {"TIER": {"engine": "transformers", "model": "/path/to/folder"}}',
        )
    for tier in engine_tiers(plan, store):
        field = f"llm.engines.{tier}"
        doc = (raw or {}).get(tier)
        if not isinstance(doc, dict):
            raise InputError(
                f"the plan deploys LLM tier {shown(tier)} but names no engine for it ({field})",
                hint="plan it with `greenctl plan llm`, which records each tier's engine",
            )
        engine = doc.get("engine")
        if engine not in llm_engines.STARTABLE:
            raise InputError(
                f"{field}.engine is {shown(engine)}: apply starts only "
                f"{' or '.join(llm_engines.STARTABLE)} engines",
                hint="an openai tier is a server you run: profile it, but serve an engine "
                "greenctl starts (greenctl profile llm --engine transformers --model-dir DIR)",
            )
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise InputError(f"{field}.model names no model folder", hint="give its path")
        if not Path(model).exists():
            raise InputError(
                f"{field}.model: {shown(model, 200)} does not exist",
                hint="restore the model folder, or plan again from where it now is "
                "(greenctl profile llm --model-dir DIR, then greenctl plan llm)",
            )
        try:
            llm_engines.check_model(str(engine), model)
        except InputError as exc:
            raise InputError(f"{field}.model: {exc.message}", hint=exc.hint) from None
    return plan_engines(plan)


def llm_spawn(
    spawn: dict[str, Any], spec: Any, inst_id: str, cores: list[int], *, store: Store
) -> dict[str, Any]:
    """An executor's spawn document (:func:`~greenctl.executor.deploy.processes.executor_spawn`:
    its state and log files, and the environment that pins it to its GPU or slice) made to
    start the engine of an instance spec with an ``engine``, pinned to ``cores``; ``llm``
    says what it serves. On a CPU resource the engine sees no GPU."""
    from greenctl.data.resources import parse_resource
    from greenctl.executor.runtime.llm_executor import MODULE
    from greenctl.executor.runtime.procs import python_module_argv

    engine, model_path = spec.engine
    timeout_s = float(spawn["ready_timeout_s"])
    spawn["argv"] = python_module_argv(
        MODULE,
        *("--engine", engine, "--model-path", model_path, "--variant", spec.variant),
        *("--cores", ",".join(map(str, cores)), "--host", "127.0.0.1"),
        *("--state-file", spawn["state_file"], "--db", str(store.path)),
        *("--instance-id", inst_id, "--ready-timeout-s", f"{timeout_s:g}"),
    )
    if not parse_resource(spec.resource).spec.accelerator:
        spawn["env"]["CUDA_VISIBLE_DEVICES"] = ""
    spawn["llm"] = {  # what the dispatcher knows of it from its spawn alone
        "engine": engine,
        "model": model_path,
        "tier": spec.variant,
        "served_model": model_path,  # the name the engine answers to (engine_command's)
    }
    return spawn


def tier_figures(plan: Plan, store: Store) -> dict[str, dict[str, Any]]:
    """Per tier, what the dispatcher routes and counts with: its share, quality, predicted
    TTFT (``ttft_ms``, at the request's ``percentile``), and joules per prompt (prefill) and
    output (decode) token. Joules per token
    come from the tier's newest profile on its resource at the concurrency nearest the
    planned one; without them, the plan's joules per request spread evenly over the
    request's tokens. All are estimates (``energy_method`` says of what)."""
    section = llm_section(plan)
    raw_shares = section.get("shares")
    shares: dict[str, Any] = raw_shares if isinstance(raw_shares, dict) else {}
    tiers = {str(t.get("variant")): t for t in section.get("tiers") or [] if isinstance(t, dict)}
    pct = str(plan.request.get("percentile") or "p95")  # the tiers' figures are at it
    tokens = _number(plan.request.get("prompt_tokens"), 0.0) + _number(
        plan.request.get("output_tokens"), 0.0
    )
    out: dict[str, dict[str, Any]] = {}
    for d in plan.deployments:
        if d.variant in out:
            continue
        t = tiers.get(d.variant, {})
        fig: dict[str, Any] = {
            "share": _number(shares.get(d.variant), _number(t.get("share"), 1.0)),
            "quality": t.get("quality"),
            "ttft_ms": t.get(f"ttft_{pct}_ms", t.get("ttft_p95_ms")),
            "percentile": pct,
            "prefill_j_per_token": None,
            "decode_j_per_token": None,
            "energy_method": "modeled",
        }
        want = _number(t.get("concurrency"), float(d.batch))
        rows = [
            r
            for r in latest_llm_profiles(store, variant=d.variant)
            if r.resource == d.resource and r.decode_j_per_token is not None
        ]
        if rows:
            p = min(rows, key=lambda r: (abs(r.concurrency - want), r.concurrency))
            fig.update(
                prefill_j_per_token=p.prefill_j_per_token or 0.0,
                decode_j_per_token=p.decode_j_per_token,
                energy_method=p.energy_method,
            )
        elif t.get("j_per_request") is not None and tokens > 0:
            per = _number(t.get("j_per_request"), 0.0) / tokens
            fig.update(prefill_j_per_token=per, decode_j_per_token=per)
        if fig["quality"] is None:
            record = next((v for v in store.variants() if v.name == d.variant), None)
            fig["quality"] = None if record is None else record.accuracy
        out[d.variant] = fig
    return out


def _number(value: Any, default: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else default


def add_llm_routes(
    routes: dict[str, Any], rows: list[dict[str, Any]], plan: Plan, store: Store
) -> dict[str, Any]:
    """``routes`` with, for each engine instance, its tier's figures and the model name its
    engine answers to (``llm``), and a weight of its tier's share over the tier's instances
    (the dispatcher's weighted round robin then follows the plan's shares)."""
    engines = plan_engines(plan)
    if not engines:
        return routes
    figures = tier_figures(plan, store)
    by_id = {row["id"]: row for row in rows}
    for model in (routes.get("models") or {}).values():
        insts = [i for i in model["instances"] if by_id.get(i["id"], {}).get("variant") in engines]
        counts: dict[str, int] = {}
        for inst in insts:
            counts[inst["variant"]] = counts.get(inst["variant"], 0) + 1
        for inst in insts:
            tier = inst["variant"]
            fig = figures.get(tier, {})
            engine, path = engines[tier]
            inst["llm"] = {**fig, "engine": engine, "served_model": path}
            inst["weight"] = max(float(fig.get("share") or 0.0), 1e-9) / counts[tier]
    return routes


def carry_llm(previous: dict[str, Any], routes: dict[str, Any]) -> dict[str, Any]:
    """``routes`` (rebuilt from the store's rows) with each engine instance's ``llm`` figures
    and weight as ``previous`` (the table the dispatcher serves now) had them."""
    known = {
        b.get("id"): b
        for m in (previous.get("models") or {}).values()
        for b in m.get("instances") or []
    }
    for model in (routes.get("models") or {}).values():
        for inst in model["instances"]:
            before = known.get(inst["id"]) or {}
            if before.get("llm") is not None:
                inst.setdefault("llm", before["llm"])
                inst["weight"] = before.get("weight", inst["weight"])
    return routes

"""Benchmark `greenctl plan geo` on the eGLB reference case and at scale.

Prints, measured side by side in one run:
- the plain 45,700-variable formulation (one variable per step x gateway x site), built
  with pulp and solved by HiGHS, and the same plain formulation built straight into
  highspy, beside greenctl's eglb-off (gateway classes + epigraph minimax, highspy);
- the same with the authors' partial routes;
- the online eglb over the whole trace (all routes and partial routes);
- online eglb at scale: 100 sites x 100 gateways x 8,760 hourly steps (synthetic traces
  tiled from the eGLB ones, labelled as such);
- replan's online step of a plan with --variants (one step from the stored state) against
  the whole-horizon online solve;
- the comparison table of every algorithm on the reference data.

Run: ``python bench/bench_geo.py`` (about a minute) or ``--quick``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from greenctl.data.eglb_convert import convert_eglb
from greenctl.data.geo_io import GeoProblem, load_geo_problem
from greenctl.planner.core import solvers
from greenctl.planner.geo.lp import build_network, hall_cuts, solve_flow_lp, solve_site_lp
from greenctl.planner.geo.solve import (
    ALGORITHMS,
    DEFAULT_MU_CARBON,
    DEFAULT_MU_WATER,
    GeoOptions,
    allocation_violations,
    evaluate,
    solve,
)

MU_C, MU_W = DEFAULT_MU_CARBON, DEFAULT_MU_WATER


CPU: dict[str, float] = {}  # label -> best process CPU seconds (robust on a busy machine)


def timed(fn: Callable[[], Any], repeat: int, label: str = "") -> tuple[float, Any]:
    """Best wall time of ``repeat`` runs and the last result (CPU time kept in ``CPU``)."""
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    CPU[label] = best_cpu
    return best, out


def plain_pulp(p: GeoProblem) -> tuple[float, float, float]:
    """The plain formulation through pulp + HiGHS: (build s, solve s, objective)."""
    import pulp

    t0 = time.perf_counter()
    T, S = p.capacity_mw.shape
    G = len(p.gateways)
    a, b, q = p.cost_usd_per_mw, p.carbon_kg_per_mw, p.water_l_per_mw
    allowed = p.routes if p.routes is not None else np.ones((G, S), dtype=bool)
    pairs = [(g, s) for g in range(G) for s in range(S) if allowed[g, s]]
    prob = pulp.LpProblem("eglb_plain", pulp.LpMinimize)
    x = {
        (t, g, s): prob.add_variable(f"x_{t}_{g}_{s}", lowBound=0)
        for t in range(T)
        for g, s in pairs
    }
    zc = prob.add_variable("zc", lowBound=0)
    zw = prob.add_variable("zw", lowBound=0)
    prob += pulp.lpSum(float(a[t, s]) * v for (t, _, s), v in x.items()) + MU_C * zc + MU_W * zw
    for t in range(T):
        for g in range(G):
            prob += pulp.lpSum(x[t, g, s] for s in range(S) if allowed[g, s]) == float(
                p.load_mw[t, g]
            )
        for s in range(S):
            prob += pulp.lpSum(x[t, g, s] for g in range(G) if allowed[g, s]) <= float(
                p.capacity_mw[t, s]
            )
    for s in range(S):
        prob += (
            pulp.lpSum(
                float(b[t, s]) * x[t, g, s] for t in range(T) for g in range(G) if allowed[g, s]
            )
            <= zc
        )
        prob += (
            pulp.lpSum(
                float(q[t, s]) * x[t, g, s] for t in range(T) for g in range(G) if allowed[g, s]
            )
            <= zw
        )
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    prob.solve(solvers.pulp_highs())  # pulp's HiGHS adapter, on greenctl's silent Highs
    solve_s = time.perf_counter() - t0
    assert solvers.highs_outcome(prob.solverModel, what="plain pulp") == solvers.OPTIMAL
    return build, solve_s, float(pulp.value(prob.objective))


def lp_objective(p: GeoProblem, *, aggregate: bool) -> tuple[int, float]:
    """The plain flow LP (``aggregate=False``: one variable per step, gateway and site) or
    greenctl's site-load LP with Hall cuts; returns (variables, objective)."""
    net = build_network(p.load_mw, len(p.sites), p.routes, aggregate=aggregate)
    kw: dict[str, Any] = dict(
        carbon=p.carbon_kg_per_mw, water=p.water_l_per_mw, mu_carbon=MU_C, mu_water=MU_W
    )
    if aggregate:
        cuts = [] if net.full else hall_cuts(net)
        assert cuts is not None
        res = solve_site_lp(net, cuts, p.cost_usd_per_mw, p.capacity_mw, net.demand, **kw)
        assert res.status == "Optimal"
        return p.n_steps * len(p.sites) + 2, res.objective
    net.full = False  # plain: flow variables even with every route allowed
    res = solve_flow_lp(net, p.cost_usd_per_mw, p.capacity_mw, net.demand, **kw)
    assert res.status == "Optimal"
    return net.n_edges * p.n_steps + 2, res.objective


def scale_problem(
    base: GeoProblem,
    n_sites: int,
    n_gateways: int,
    n_steps: int,
    *,
    seed: int = 0,
    routes_per_gateway: int | None = None,
) -> GeoProblem:
    """Synthetic: the eGLB traces tiled to ``n_steps``, sites copied with +-20 % noise."""
    rng = np.random.default_rng(seed)
    T0, S0 = base.capacity_mw.shape
    t_idx = np.arange(n_steps) % T0
    s_idx = np.arange(n_sites) % S0

    def site_trace(x: np.ndarray) -> np.ndarray:
        return x[t_idx][:, s_idx] * rng.uniform(0.8, 1.2, size=(1, n_sites))

    total = base.load_mw.sum(axis=1)[t_idx] / S0 * n_sites  # same utilisation as eGLB
    load = np.repeat((total / n_gateways)[:, None], n_gateways, axis=1)
    routes = None
    if routes_per_gateway is not None:
        routes = np.zeros((n_gateways, n_sites), dtype=bool)
        for g in range(n_gateways):  # a regional window of nearby sites
            start = (g * n_sites) // n_gateways
            routes[g, (start + np.arange(routes_per_gateway)) % n_sites] = True
    return GeoProblem(
        times=[
            (datetime(2024, 1, 1, tzinfo=UTC) + timedelta(hours=t)).strftime("%Y-%m-%dT%H:%M:%SZ")
            for t in range(n_steps)
        ],
        step_h=1.0,
        sites=[f"site{j}" for j in range(n_sites)],
        gateways=[f"gw{g}" for g in range(n_gateways)],
        price_usd_per_mwh=site_trace(base.price_usd_per_mwh),
        carbon_g_per_kwh=site_trace(base.carbon_g_per_kwh),
        wue_l_per_kwh=site_trace(base.wue_l_per_kwh),
        ewif_l_per_kwh=np.zeros((n_steps, n_sites)),
        pue=np.ones((n_steps, n_sites)),
        capacity_mw=np.ones((n_steps, n_sites)),
        load_mw=load,
        routes=routes,
    )


def _load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def table_before(problem: GeoProblem, sol: Any) -> tuple[list[Any], dict[str, Any]]:
    """The router's per-slot, per-gateway fractions as greenctl built them before (every
    gateway flow through Python, ``gateway_flows``): the baseline of ``routed_case``."""
    index = {t: i for i, t in enumerate(problem.times)}
    loads: list[dict[str, dict[str, float]]] = [{} for _ in problem.times]
    total: dict[str, dict[str, float]] = {}
    for when, gw, site, load in sol.gateway_flows(problem):
        slot = loads[index[when]].setdefault(gw, {})
        slot[site] = slot.get(site, 0.0) + load
        total.setdefault(gw, {})
        total[gw][site] = total[gw].get(site, 0.0) + load

    def norm(v: dict[str, float]) -> dict[str, float]:
        s = math.fsum(v.values())
        return {k: x / s for k, x in sorted(v.items())} if s > 0 else {}

    return [{g: norm(v) for g, v in slot.items()} for slot in loads], {
        g: norm(v) for g, v in total.items()
    }


def routed_case(p: GeoProblem, sol: Any, solve_s: float, *, quick: bool, tmp: Path) -> None:
    """The routed case as ``apply --site`` (and ``export envoy``) run it: read the plan's
    files, the online solve, then the router's table (each slot's per-gateway fractions),
    the table built before (per-flow Python, :func:`table_before`) and now (array-wise per
    route set, ``gateway_fractions``) side by side on the same solve; then ``replan``'s
    online step at this scale: one step from a stored state (after reading the files)."""
    from greenctl.data.geo_io import load_geo_problem as load
    from greenctl.data.geo_io import problem_to_csv
    from greenctl.planner.geo.solve import OnlineState, online_replan

    print(f"\nrouted case ({p.n_steps} slots x {len(p.gateways)} gateways), {_load_text()}:")
    files = problem_to_csv(p, tmp / "routed")
    t0 = time.perf_counter()
    again = load(files["sites"], files["demand"], files.get("routes"))
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    before = table_before(p, sol)
    t_before = time.perf_counter() - t0
    load_mid = _load_text()
    t0 = time.perf_counter()
    after = sol.gateway_fractions(p)
    t_after = time.perf_counter() - t0
    worst = max(
        (abs(f - after[0][t][g].get(s, 0.0)) for t, slot in enumerate(before[0])
         for g, fr in slot.items() for s, f in fr.items()),
        default=0.0,
    )  # fmt: skip
    base = t_read + solve_s
    print(f"  read the sites/demand/routes files {t_read:8.2f} s")
    print(f"  online eglb solve                  {solve_s:8.2f} s")
    print(
        f"  router table, before               {t_before:8.2f} s  -> routed total {base + t_before:.2f} s"
    )
    print(f"  router table, now                  {t_after:8.2f} s  -> routed total {base + t_after:.2f} s"
          f"  (table {t_before / max(t_after, 1e-9):.1f}x faster; largest fraction difference "
          f"{worst:.1e})")  # fmt: skip
    print(f"  ({load_mid} between the two; {_load_text()} after)")
    k = min(p.n_steps - 2, 24)
    first = online_replan(again, "eglb", GeoOptions(), slot=k)
    state = OnlineState.from_dict(first.state.to_dict(), n_sites=len(p.sites))
    t0 = time.perf_counter()
    step = online_replan(again, "eglb", GeoOptions(), slot=k + 1, state=state)
    t_step = time.perf_counter() - t0
    assert step.warm and step.steps == 1
    print(
        f"  replan's online step at this scale: one eglb step from the stored state "
        f"{t_step * 1e3:.1f} ms (+ reading the files, {t_read:.2f} s above)"
    )


def variants_case(problems: list[tuple[str, GeoProblem]], *, repeat: int) -> None:
    """``replan`` of a plan made with ``--variants`` (three ResNet-like variants, accuracy
    floor 0.76): one online eglb step from the state stored after the slot before (the
    state as JSON, as ``replan`` reads it from the store), beside the whole-horizon online
    solve that ``replan`` of such a plan ran before; and the largest difference between
    the step's variant loads and the whole solve's at the same slot (unchanged inputs)."""
    import json

    from greenctl.data.geo_io import GeoVariants
    from greenctl.planner.geo.solve import OnlineState, online_replan

    v = GeoVariants(["resnet152", "resnet50", "resnet18"], np.array([10.0, 5.0, 2.5]),
                    np.array([0.783, 0.761, 0.698]))  # fmt: skip
    opts = GeoOptions(variants=v, min_accuracy=0.76)
    print("\nreplan of a plan with --variants (3 variants, --min-accuracy 0.76), eglb:")
    for label, p in problems:
        t_whole, whole = timed(lambda p=p: solve(p, "eglb", opts), repeat)
        k = p.n_steps // 2
        doc = json.dumps(online_replan(p, "eglb", opts, slot=k - 1).state.to_dict())
        best = math.inf
        step = None
        for _ in range(max(3, repeat)):
            t0 = time.perf_counter()
            state = OnlineState.from_dict(json.loads(doc), n_sites=len(p.sites))
            step = online_replan(p, "eglb", opts, slot=k, state=state)
            best = min(best, time.perf_counter() - t0)
        assert step is not None and step.warm and step.steps == 1
        assert step.variant_load is not None and whole.variant_load is not None
        diff = float(np.abs(step.variant_load - whole.variant_load[k]).max())
        print(
            f"  {label}: whole horizon ({p.n_steps} steps) {t_whole:.3f} s; one step from the "
            f"stored state {best * 1e3:.2f} ms ({t_whole / best:,.0f}x less); largest variant "
            f"load difference at slot {k}: {diff:.1e} MW"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller scale case")
    ap.add_argument("--no-pulp", action="store_true", help="skip the pulp plain formulation")
    args = ap.parse_args(argv)
    repeat = 1 if args.quick else 3
    tmp = Path(tempfile.mkdtemp(prefix="bench_geo_"))
    full = convert_eglb("bundled:eglb", tmp / "all")
    part = convert_eglb("bundled:eglb", tmp / "partial", routes="partial")
    p_all = load_geo_problem(full["sites"], full["demand"])
    p_part = load_geo_problem(part["sites"], part["demand"], part["routes"])
    print(
        f"eGLB reference case: {p_all.n_steps} h x {len(p_all.sites)} sites x "
        f"{len(p_all.gateways)} gateways (bundled:eglb)"
    )
    print(
        f"objective = energy cost + {MU_C} USD/kg x max-site carbon + {MU_W} USD/L x "
        "max-site water (the authors' 1500 USD/t, 60 USD/kL)\n"
    )

    rows: list[tuple[str, float, float, str, float]] = []  # name, wall, cpu, note, objective

    def row(name: str, fn: Callable[[], Any], note: str = "") -> Any:
        t, out = timed(fn, repeat, name)
        obj = (
            out[1]
            if isinstance(out, tuple)
            else evaluate(out_problem[0], out.site_load_mw, mu_carbon=MU_C, mu_water=MU_W)[1][
                "objective"
            ]
        )
        rows.append((name, t, CPU[name], note, obj))
        return out

    out_problem: list[GeoProblem] = []
    for label, p in (("all routes", p_all), ("partial routes", p_part)):
        out_problem[:] = [p]
        if not args.no_pulp:
            c0 = time.process_time()
            b, s, obj = plain_pulp(p)
            rows.append(
                (f"plain pulp+HiGHS, {label}", b + s, time.process_time() - c0,
                 f"build {b:.2f} s + solve {s:.2f} s", obj)
            )  # fmt: skip
        n = lp_objective(p, aggregate=False)[0]
        row(f"plain highspy ({n} vars), {label}", lambda p=p: lp_objective(p, aggregate=False))
        n = lp_objective(p, aggregate=True)[0]
        row(
            f"greenctl site-load LP ({n} vars), {label}",
            lambda p=p: lp_objective(p, aggregate=True),
            "build + solve",
        )
        sol = row(f"greenctl solve('eglb-off'), {label}", lambda p=p: solve(p, "eglb-off"),
                  "incl. checks")  # fmt: skip
        if p.routes is not None:
            row(f"  + gateway flows for --allocations, {label}",
                lambda sol=sol: (sol.__setattr__("_flow", None), sol.flow) and sol,
                "feasibility LP")  # fmt: skip
        row(f"greenctl eglb online, whole trace, {label}", lambda p=p: solve(p, "eglb"))
    print(f"{'timing (best of ' + str(repeat) + ')':58s} {'wall s':>8s} {'cpu s':>8s}  "
          f"{'objective USD':>14s}  note")  # fmt: skip
    for name, t, cpu, note, obj in rows:
        print(f"{name:58s} {t:8.3f} {cpu:8.3f}  {obj:14,.2f}  {note}")
    base = {r[0]: r[1] for r in rows}
    for label in ("all routes", "partial routes"):
        ours = base[f"greenctl solve('eglb-off'), {label}"]
        for key in (f"plain pulp+HiGHS, {label}",):
            if key in base:
                print(f"speed-up of eglb-off over {key}: {base[key] / ours:.1f}x")
        plain = next(v for k, v in base.items() if k.startswith("plain highspy") and label in k)
        print(f"speed-up of eglb-off over plain highspy, {label}: {plain / ours:.1f}x")

    n_steps = 8760 if not args.quick else 2190
    big = scale_problem(p_all, 100, 100, n_steps)
    c0, t0 = time.process_time(), time.perf_counter()
    sol = solve(big, "eglb")
    t_big, c_big = time.perf_counter() - t0, time.process_time() - c0
    assert allocation_violations(big, sol) == []
    print(
        f"\nscale (synthetic, tiled eGLB traces): 100 sites x 100 gateways x {n_steps} steps, "
        f"every route: online eglb {t_big:.2f} s wall, {c_big:.2f} s cpu"
    )
    r_steps = n_steps if not args.quick else 219
    bigr = scale_problem(p_all, 100, 100, r_steps, routes_per_gateway=10)
    c0, t0 = time.process_time(), time.perf_counter()
    sol = solve(bigr, "eglb")
    t_r, c_r = time.perf_counter() - t0, time.process_time() - c0
    assert allocation_violations(bigr, sol) == []
    print(
        f"scale with routes (each gateway 10 nearby sites: {sol.network.n_classes} route "
        f"sets), {r_steps} steps: online eglb {t_r:.2f} s wall, {c_r:.2f} s cpu "
        "(per-step LP, warm-started primal simplex)"
    )
    routed_case(bigr, sol, t_r, quick=args.quick, tmp=tmp)
    variants_case([("all routes", p_all), ("partial routes", p_part)], repeat=repeat)

    print(
        "\nComparison on the reference data (all routes; modeled; per-site avg/max over "
        f"{p_all.n_steps} h)"
    )
    hdr = (
        "algorithm",
        "energy USD avg",
        "CO2 kg avg",
        "CO2 kg max",
        "CO2 max/avg",
        "water L avg",
        "water L max",
        "water max/avg",
        "objective USD",
        "vs off",
        "solve s",
    )
    print(" | ".join(hdr))
    res = {}
    for name in ALGORITHMS:
        t0 = time.perf_counter()
        sol = solve(p_all, name, GeoOptions())
        dt = time.perf_counter() - t0
        s = evaluate(p_all, sol.site_load_mw, mu_carbon=MU_C, mu_water=MU_W)[1]
        res[name] = (s, dt)
    off = res["eglb-off"][0]["objective"]
    for name, (s, dt) in res.items():
        print(
            " | ".join(
                [
                    name,
                    f"{s['energy_cost_usd_avg']:,.0f}",
                    f"{s['carbon_kg_avg']:,.0f}",
                    f"{s['carbon_kg_max']:,.0f}",
                    f"{s['carbon_max_over_avg']:.3f}",
                    f"{s['water_l_avg']:,.0f}",
                    f"{s['water_l_max']:,.0f}",
                    f"{s['water_max_over_avg']:.3f}",
                    f"{s['objective']:,.0f}",
                    f"{s['objective'] / off:.3f}",
                    f"{dt:.3f}",
                ]
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

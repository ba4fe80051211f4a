"""Benchmarks of ``greenctl replay``.

Run: ``python bench/bench_replay.py [--quick] [--forecaster last]``.

(a) Speed: one day (the Twitter trace's second day, ``--from 24h --hours 24``) at one-minute
    intervals for one mix family (InfAdapter's ResNet CPU profiles, SLO 750 ms at p99, 20
    cores), with every baseline: with ``replan``'s defaults (``--min-dwell 1h``, the exact ILP),
    replanning every minute (``--min-dwell 0``), and every minute with ``--strategy greedy``.
    Wall-clock on this machine, printed beside its load average (other jobs share its cores).
(b) InfAdapter vs VPA on the same day: greenctl's replan loop with InfAdapter's objective
    (accuracy - 0.05 x cost - 0.001 x loading, no carbon term; ``--min-dwell 0``) against the
    Kubernetes VPA with one variant each (ResNet18, ResNet50, ResNet152), and beside BASE,
    CO2OPT, INFaaS-style greedy reactive scaling and InfAdapter's own loop (``infadapter``:
    its LSTM, fitted on the trace's first day, and the exact mix every minute; columns "IA
    fewer" / "IA lower" against each VPA), SLO violations and cost side by side with the
    paper's claim (up to 65 % fewer SLO violations, 33 % lower cost). Every figure is modeled: InfAdapter's measured capacities (third-party), the
    analytic queueing model, assumed prices (0.04 USD per core-hour).
(c) glet: one day of the Twitter trace (its second day) x 10 (so that the load spans one to
    several GPUs), split over three models as 4 : 3 : 2 (resnet50 25 ms, vgg16 30 ms,
    inception 40 ms SLOs), the gpulet reference MPS profiles (third-party), replanned at
    one-minute intervals through replan's glet decision with its defaults (--min-dwell 1h)
    and every minute, against the glet plan sized for each model's peak (BASE): wall time,
    GPU-hours, SLO violations. Energy rests on an ASSUMED GPU power (the profiles hold none).
(d) geo: one day of the eGLB traces (10 sites, partial routes, its second day) with eGLB's
    online step each hour, against the offline optimum of the day and the nearest site; and
    the whole 457-hour horizon. Wall time, carbon, cost, the largest site's carbon.
(e) Speed, before and after, and where a replanning round's time goes (``--only
    speed-fixes``): case (a)'s day replanned every minute and with replan's defaults, each
    step switched off by monkeypatch to measure it in the same run: (1) before: every HiGHS
    problem solved afresh, the mix ILP with its MIR rows and HiGHS's default MIP options;
    (2) + the exact solver memo (``planner.core.solvers.solve_memo``); (3) + no MIR rows and
    the mix ILP's HiGHS options (``planner.mix.model.MIR_CUTS``, ``MIP_OPTIONS``): the
    product's speed. Rows (1)-(3) hold the plan for the whole ``--min-dwell`` (the dwell never yields);
    (4) the product: the dwell yields to a load the running plan cannot carry
    (``executor.control.replan.dwell_yields``), which changes the figures. Per row: wall and CPU
    seconds, the seconds in HiGHS, in building the mix problem, in building the ILP and in
    the accounting, HiGHS runs (solved / answered from the solver memo), greenctl's modeled
    SLO violations, cost and changes, and whether its figures equal row (1)'s. (A plan memo
    keyed by the rewritten request and the running plan gained nothing here: replay's own
    memo of rounds, keyed by the running configuration, the signal and the rate, already
    answers every repeat.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from greenctl.data.bundled import path_of

HERE = Path(__file__).resolve().parent
TWITTER = path_of("twitter")
GPULET = path_of("gpulet")
PAPER = {"violations_fewer_pct": 65.0, "cost_lower_pct": 33.0}
REQUEST = {
    "model": "resnet",
    "slo_ms": 750.0,
    "percentile": "p99",
    "budgets": {"cpu": 20.0},
    "objective": "balanced",
}


def _store(folder: Path) -> Any:
    import infadapter_import  # bench/, the script's own folder

    return infadapter_import.open_bench_store(folder / "bench.db")


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def speed(store: Any, hours: float, forecaster: str) -> None:
    from greenctl.executor.control.replay import replay

    print(f"(a) one mix family, {hours:g} h of the Twitter trace at 60 s intervals, all baselines")
    print(f"    {_load()}")
    cases = [
        ("replan defaults (min-dwell 1h, ilp)", {"min_dwell_s": 3600.0}, {}),
        ("replan every minute (min-dwell 0, ilp)", {"min_dwell_s": 0.0}, {}),
        ("every minute, --strategy greedy", {"min_dwell_s": 0.0}, {"strategy": "greedy"}),
    ]
    print(f"    {'case':42} {'wall s':>7} {'solves':>7} {'memo':>6} {'held':>6} {'evals':>6}")
    for label, opts, req in cases:
        t = time.perf_counter()
        out = replay(
            store, load_trace=str(TWITTER), request={**REQUEST, **req}, start="24h",
            hours=hours, every=60, forecaster=forecaster, **opts,
        )  # fmt: skip
        wall = time.perf_counter() - t
        r = out["meta"]["replan"]
        print(
            f"    {label:42} {wall:7.2f} {r['solves']:7d} {r['cached']:6d} "
            f"{r['dwell_holds']:6d} {out['meta']['evaluations']:6d}"
        )
    print(f"    {_load()}")
    print("    target: one day at 1-min intervals in <= 10 s")


def infadapter_vs_vpa(store: Any, hours: float, forecaster: str) -> None:
    from greenctl.executor.control.replay import replay

    print(
        f"\n(b) InfAdapter vs VPA, Twitter trace ({hours:g} h from 24h), InfAdapter's ResNet "
        "profiles, SLO 750 ms at p99, 20 cores (MODELED)"
    )
    request = {**REQUEST, "alpha": 0.05, "beta": 0.001, "gamma": 0.0}
    t = time.perf_counter()
    out = replay(
        store, load_trace=str(TWITTER), request=request, start="24h", hours=hours, every=60,
        min_dwell_s=0.0, forecaster=forecaster,
        baselines=("base", "co2opt", "vpa", "infaas", "infadapter"),
        vpa_variant=("resnet18", "resnet50", "resnet152"),
    )  # fmt: skip
    wall = time.perf_counter() - t
    rows = {s["policy"]: s for s in out["summary"]}
    g = rows["greenctl"]
    ia = rows.get("infadapter")
    print(f"    greenctl loop: forecaster {out['meta']['forecaster']}, "
          f"{out['meta']['replan']['solves']} solves, {wall:.1f} s; {_load()}")  # fmt: skip
    print(f"    {'policy':16} {'SLO viol. %':>11} {'accuracy':>9} {'cost USD':>9} "
          f"{'changes':>8} {'viol. fewer':>12} {'cost lower':>11} {'IA fewer':>9} "
          f"{'IA lower':>9}")  # fmt: skip

    def vs(a: dict[str, Any] | None, b: dict[str, Any], key: str) -> str:
        return "" if a is None or b[key] <= 0 else f"{100 * (1 - a[key] / b[key]):.0f} %"

    for name, s in rows.items():
        cols = ["", "", "", ""]
        if name.startswith("vpa"):  # greenctl, then InfAdapter's own loop, against this VPA
            cols = [vs(g, s, "violations"), vs(g, s, "cost_usd"), vs(ia, s, "violations"),
                    vs(ia, s, "cost_usd")]  # fmt: skip
        acc = "-" if s["accuracy"] is None else f"{s['accuracy']:.4f}"
        print(
            f"    {name:16} {s['violation_pct']:11.2f} {acc:>9} {s['cost_usd']:9.2f} "
            f"{s['changes']:8d} {cols[0]:>12} {cols[1]:>11} {cols[2]:>9} {cols[3]:>9}"
        )
    print(
        f"    paper (InfAdapter vs VPA): up to {PAPER['violations_fewer_pct']:g} % fewer SLO "
        f"violations and {PAPER['cost_lower_pct']:g} % lower cost (measured on a cluster); "
        "the figures above are modeled"
    )
    print(f"    {out['meta']['vpa']['rule']}")
    for note in out["meta"]["notes"]:
        print(f"    note: {note}")


def _gpulet_store(folder: Path) -> Any:
    from greenctl.data.gpulet_import import import_gpulet
    from greenctl.data.store import open_store

    store = open_store(folder / "glet.db")
    import_gpulet(store, GPULET)
    return store


GLET_MODELS = [
    {"name": "resnet50", "rate_rps": 4.0, "slo_ms": 25.0},
    {"name": "vgg16", "rate_rps": 3.0, "slo_ms": 30.0},
    {"name": "inception", "rate_rps": 2.0, "slo_ms": 40.0},
]


def glet_day(folder: Path, hours: float, forecaster: str) -> None:
    import numpy as np
    from greenctl.data.traces import read_rps_trace
    from greenctl.executor.control.replay import replay

    store = _gpulet_store(folder)
    trace = folder / "twitter_x10.txt"
    rps = read_rps_trace(str(TWITTER))[: int((24 + hours) * 3600)] * 10.0
    trace.write_text(" ".join(f"{x:g}" for x in np.asarray(rps)) + "\n")
    print(
        f"\n(c) glet, {hours:g} h of the Twitter trace x 10 from 24h at 60 s intervals, three "
        "models (4 : 3 : 2), gpulet reference profiles (MODELED; energy from an ASSUMED GPU power)"
    )
    print(f"    {_load()}")
    print(f"    {'case':34} {'wall s':>7} {'loop s':>7} {'solves':>7} {'memo':>6} {'held':>6} "
          f"{'evals':>6} "
          f"{'GPU-h':>7} {'BASE GPU-h':>10} {'viol. %':>8} {'BASE viol. %':>12}")  # fmt: skip
    from greenctl.planner.core import queueing

    for label, dwell in (("replan defaults (min-dwell 1h)", 3600.0), ("every minute", 0.0)):
        queueing.dynamic_batch.cache_clear()  # each case from cold: no batching model memoised
        t = time.perf_counter()
        out = replay(
            store, kind="glet", load_trace=str(trace), request={"models": GLET_MODELS},
            start="24h", hours=hours, every=60, forecaster=forecaster, min_dwell_s=dwell,
        )  # fmt: skip
        wall = time.perf_counter() - t
        s = {x["policy"]: x for x in out["summary"]}
        r = out["meta"]["replan"]
        print(
            f"    {label:34} {wall:7.2f} {out['meta']['wall_greenctl_loop_s']:7.2f} "
            f"{r['solves']:7d} {r['cached']:6d} {r['dwell_holds']:6d} "
            f"{out['meta']['evaluations']:6d} {s['greenctl']['gpu_hours']:7.1f} "
            f"{s['base']['gpu_hours']:10.1f} {s['greenctl']['violation_pct']:8.3f} "
            f"{s['base']['violation_pct']:12.3f}"
        )
    print(f"    {_load()}")
    store.close()


def geo_day(folder: Path, hours: float) -> None:
    from greenctl.data.eglb_convert import convert_eglb
    from greenctl.data.store import open_store
    from greenctl.executor.control.replay import replay

    store = open_store(folder / "geo.db")
    files = {k: str(v) for k, v in convert_eglb(None, folder / "eglb", routes="partial").items()}
    print(
        "\n(d) geo: eGLB's traces (10 sites, partial routes), eGLB's online step per hour "
        "(MODELED from the traces)"
    )
    print(f"    {_load()}")
    print(f"    {'case':26} {'policy':9} {'wall s':>7} {'t CO2':>8} {'USD':>9} "
          f"{'max-site t':>10} {'max/avg':>8} {'objective':>10}")  # fmt: skip
    for label, start, h in ((f"{hours:g} h from 24h", "24h", hours), ("whole 457 h", None, None)):
        t = time.perf_counter()
        out = replay(
            store, kind="geo", request={**files, "algorithm": "eglb"}, start=start, hours=h,
            every="1h", baselines=("offline", "nearest"),
        )  # fmt: skip
        wall = time.perf_counter() - t
        for n, s in enumerate(out["summary"]):
            print(
                f"    {label if n == 0 else '':26} {s['policy']:9} "
                f"{f'{wall:.2f}' if n == 0 else '':>7} {s['carbon_g'] / 1e6:8.1f} "
                f"{s['cost_usd']:9.0f} {s['carbon_kg_max_site'] / 1000:10.2f} "
                f"{s['carbon_max_over_avg']:8.3f} {s['objective_usd']:10.0f}"
            )
    print(f"    {_load()}")
    store.close()


class _RunTimer:
    """A HiGHS object whose real ``run()`` calls are timed into ``acc``."""

    def __init__(self, h: Any, acc: dict[str, float]) -> None:
        self._h, self._acc = h, acc

    def run(self) -> Any:
        t = time.perf_counter()
        try:
            return self._h.run()
        finally:
            self._acc["highs_s"] += time.perf_counter() - t
            self._acc["highs_runs"] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)


def _timed(fn: Any, acc: dict[str, float], key: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - t

    return wrapper


def speed_fixes(store: Any, hours: float, forecaster: str) -> None:
    """(e): before/after of each speed step of this round, and the dwell rule."""
    import contextlib

    from greenctl.executor.control import replan as replan_mod
    from greenctl.executor.control.replay import replay
    from greenctl.executor.kinds import serving_replay
    from greenctl.planner.core import solvers
    from greenctl.planner.core.forecast import DEFAULT_FORECASTER
    from greenctl.planner.mix import model as mix_model
    from greenctl.planner.mix import solve as mix_solve

    forecaster = forecaster or DEFAULT_FORECASTER
    print(
        f"\n(e) speed before/after: one mix family, {hours:g} h of the Twitter trace at 60 s "
        f"intervals, baselines base, co2opt, vpa, forecaster {forecaster}"
    )
    old = {"memo": False, "mir": True, "options": False, "yields": False}
    variants: list[tuple[str, dict[str, bool]]] = [
        ("(1) before: no memos, MIR rows, defaults", old),
        ("(2) + exact solver memo", {**old, "memo": True}),
        ("(3) + no MIR rows, mix MIP options", {"yields": False}),
        ("(4) product: + the dwell yields", {}),
    ]  # fmt: skip
    cases = [("every minute (min-dwell 0, ilp)", 0.0), ("replan defaults (min-dwell 1h)", 3600.0)]
    keys = ("violations", "cost_usd", "accuracy", "changes", "energy_kwh")
    for case, dwell in cases:
        print(f"    {case}; {_load()}")
        print(f"      {'variant':40} {'wall s':>7} {'cpu s':>6} {'highs s':>8} {'problem s':>9} "
              f"{'ilp s':>6} {'acct s':>7} {'rounds':>7} {'solved':>7} {'memo':>5} "
              f"{'viol %':>7} {'USD':>6} {'chg':>4}  same")  # fmt: skip
        ref = None
        for label, opts in variants:
            acc = dict.fromkeys(("highs_s", "highs_runs", "problem_s", "ilp_s", "acct_s"), 0.0)
            with contextlib.ExitStack() as stack:

                def patch(obj: Any, name: str, value: Any) -> None:
                    old = getattr(obj, name)
                    setattr(obj, name, value)
                    stack.callback(setattr, obj, name, old)

                memo_cls = solvers._MemoHighs
                if opts.get("memo", True):
                    patch(solvers, "_MemoHighs",
                          lambda h, m, o, c=memo_cls, a=acc: c(_RunTimer(h, a), m, o))  # fmt: skip
                else:
                    patch(solvers, "_MemoHighs", lambda h, m, o, a=acc: _RunTimer(h, a))
                if opts.get("mir"):
                    patch(mix_model, "MIR_CUTS", True)
                if opts.get("options") is False:
                    patch(mix_model, "MIP_OPTIONS", {})
                if opts.get("yields") is False:
                    patch(replan_mod, "dwell_yields", lambda choice: False)
                patch(mix_solve, "build_mix_problem",
                      _timed(mix_solve.build_mix_problem, acc, "problem_s"))  # fmt: skip
                patch(mix_solve, "build_model", _timed(mix_solve.build_model, acc, "ilp_s"))
                patch(serving_replay, "account", _timed(serving_replay.account, acc, "acct_s"))
                t, c = time.perf_counter(), time.process_time()
                out = replay(
                    store, load_trace=str(TWITTER), request=dict(REQUEST), start="24h",
                    hours=hours, every=60, forecaster=forecaster, min_dwell_s=dwell,
                )  # fmt: skip
                wall, cpu = time.perf_counter() - t, time.process_time() - c
            g = next(s for s in out["summary"] if s["policy"] == "greenctl")
            figures = tuple(round(float(g[k] or 0.0), 9) for k in keys)
            ref = figures if ref is None else ref
            sv = out["meta"]["solver"]
            r = out["meta"]["replan"]
            print(
                f"      {label:40} {wall:7.2f} {cpu:6.2f} {acc['highs_s']:8.2f} "
                f"{acc['problem_s']:9.2f} {acc['ilp_s']:6.2f} {acc['acct_s']:7.2f} "
                f"{r['solves']:7d} {int(acc['highs_runs']):7d} {sv['highs_memo_hits']:5d} "
                f"{g['violation_pct']:7.3f} "
                f"{g['cost_usd']:6.2f} {int(g['changes']):4d}  "
                f"{'yes' if figures == ref else 'no'}"
            )
    print(
        "    rounds: replanning rounds that planned (others: repeated rounds from replay's own "
        "memo, or held by the dwell); solved: HiGHS runs that solved; memo: runs answered "
        "from the solver memo; problem s: "
        "planner.mix.solve.build_mix_problem; ilp s: build_model; acct s: the accounting of "
        "every policy; viol %, USD, chg: greenctl's SLO violations, cost and changes (all "
        "MODELED); same: greenctl's violations, cost, accuracy, changes and energy equal row "
        "(1)'s"
    )
    print(f"    target: one day at 1-min intervals in <= 10 s; {_load()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 hours instead of one day")
    ap.add_argument("--forecaster", default=None, help="replay's (default: its default)")
    ap.add_argument(
        "--only", choices=("speed", "infadapter", "glet", "geo", "speed-fixes"), default=None
    )
    args = ap.parse_args(argv)
    if not TWITTER.exists():
        print(f"the Twitter trace is not at {TWITTER}", file=sys.stderr)
        return 1
    hours = 3.0 if args.quick else 24.0
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        try:
            if args.only in (None, "speed"):
                speed(store, hours, args.forecaster)
            if args.only in (None, "infadapter"):
                infadapter_vs_vpa(store, hours, args.forecaster)
            if args.only in (None, "glet"):
                glet_day(Path(tmp), hours, args.forecaster)
            if args.only in (None, "geo"):
                geo_day(Path(tmp), hours)
            if args.only in (None, "speed-fixes"):
                speed_fixes(store, hours, args.forecaster)
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

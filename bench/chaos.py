"""Chaos: open-loop load while random kill -9s hit executors, the dispatcher and its supervisor.

Applies a plan of no-op executors (CPU only, two or more instances per model) in a scratch
store and state folder, sends open-loop Poisson load through the dispatcher with the load
generator's client (``greenctl.executor.runtime.loadgen.send_load``: a request whose connection
fails is sent once more, as a client of an idempotent inference service does), and every few
seconds kills one process of the plan with SIGKILL, picked at random: an executor instance,
the dispatcher or the supervisor. After each kill it waits until the killed process is back
(the recovery time) and the whole plan serves again, then kills the next. At the end it takes
the plan down and looks for anything left running.

It reports requests sent, answered, failed and retried, every kill with its recovery time
(and a summary per kind of process), and checks the target: no request lost (each needs at
most one retry), every process back, nothing left after ``down``. Exit 0 when met, 1 when not.

Then (unless ``--no-faults``) faults of the commands around the serving plan, each under a
few seconds of load (:data:`FAULTS`): SIGTERM and kill -9 of an ``apply`` while its executors
load, a refused plan, an apply whose port another program holds, a ``replan`` on a read-only
store, and ``apply`` and ``down`` run at once. For each it reports the requests lost, the
processes left (after the next command recovers what a killed apply left), the store rows
changed and the command's exit code, against what each must give.

    python bench/chaos.py                   # 10 minutes
    python bench/chaos.py --quick           # 20 s of kills, then the faults (about a minute)
    python bench/chaos.py --duration 120    # two minutes
    python bench/chaos.py --duration 60 --rate 80 --kill-min 1.5 --kill-max 4.5 --settle 5
                                            # the suite's minute (tests/executor/test_chaos.py)
    python bench/chaos.py --json            # one JSON document on stdout
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

KINDS = ("executor", "dispatcher", "supervisor")
NOOP = "greenctl.executor.runtime.daemon:noop_loader"


def build_plan(models: int, instances: int, rate_rps: float) -> Any:
    from greenctl.data.plan import Deployment, Plan

    per_model = rate_rps / models
    return Plan(
        kind="mix",
        deployments=[
            Deployment(f"m{k}", f"v{k}", "cpu:1", count=instances, batch=1, quota_rps=per_model)
            for k in range(models)
        ],
        predicted={"rate_rps": rate_rps},
    )


class Load:
    """Open-loop load on every model, in a thread of its own, with per-request outcomes."""

    def __init__(self, url: str, models: list[str], rate_rps: float, duration_s: float, seed: int):
        self.url = url
        self.models = models
        self.rate = rate_rps / len(models)
        self.duration_s = duration_s
        self.seed = seed
        self.outcomes: dict[str, list[Any]] = {m: [] for m in models}
        self.started = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def _run(self) -> None:
        from greenctl.executor.runtime.loadgen import (
            arrival_times,
            model_input,
            open_session,
            send_load,
        )
        from greenctl.executor.runtime.procs import run_async

        async def main() -> None:
            async with open_session(512, timeout_s=60.0) as session:
                jobs = []
                for k, model in enumerate(self.models):
                    body, headers = model_input(self.url, model)
                    times = arrival_times(
                        duration_s=self.duration_s, rate_rps=self.rate, seed=self.seed + k
                    )
                    jobs.append(
                        send_load(
                            session,
                            self.url,
                            model,
                            times,
                            body,
                            headers,
                            retry_connection_errors=True,
                            outcomes=self.outcomes[model],
                        )
                    )
                await asyncio.gather(*jobs)

        run_async(main())

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)

    def summary(self) -> dict[str, Any]:
        every = [o for outs in self.outcomes.values() for o in outs]
        codes: dict[str, int] = {}
        for o in every:
            codes[o.code] = codes.get(o.code, 0) + 1
        ok = codes.get("200", 0)
        return {
            "sent": len(every),
            "ok": ok,
            "failed": len(every) - ok,
            "retried": sum(o.retried for o in every),
            "retried_ok": sum(o.retried and o.code == "200" for o in every),
            "status_counts": codes,
            "failed_at_s": sorted(round(o.at_s, 3) for o in every if o.code != "200")[:50],
        }


def processes(store: Any) -> dict[str, Any]:
    """The plan's processes now: dispatcher, supervisor and executors, with pid and whether
    each serves (from ``status``), and whether all of them do (``all_up``: ``status`` may
    still call the plan degraded a few seconds longer, while an executor killed twice in a
    row has not yet served long enough to be out of its crash loop)."""
    from greenctl.executor.deploy.apply import status

    st = status(store, timeout_s=0.5)
    disp = st["dispatcher"] or {}
    sup = disp.get("supervisor") or {}
    out = {
        "state": st["state"],
        "problems": st["problems"],
        "dispatcher": (disp.get("pid"), bool(disp.get("alive") and disp.get("ready"))),
        "supervisor": (sup.get("pid"), bool(sup.get("alive"))),
        "executors": {
            i["id"]: (i["pid"], bool(i["ready"] and i["up"] is not False)) for i in st["instances"]
        },
    }
    out["all_up"] = (
        out["dispatcher"][1]
        and out["supervisor"][1]
        and all(up for _, up in out["executors"].values())
    )
    return out


def kill_one(store: Any, rng: random.Random, timeout_s: float) -> dict[str, Any]:
    """Kill one process at random, wait until it is back and the plan serves again."""
    now = processes(store)
    kind = rng.choice(KINDS)
    if kind == "executor":
        target = rng.choice(sorted(now["executors"]))
        pid = now["executors"][target][0]
    else:
        target = kind
        pid = now[kind][0]
    t0 = time.monotonic()
    os.kill(int(pid), signal.SIGKILL)
    back_s = serving_s = None
    while time.monotonic() - t0 < timeout_s:
        cur = processes(store)
        new_pid, up = (
            cur["executors"].get(target, (None, False)) if kind == "executor" else cur[kind]
        )
        if back_s is None and up and new_pid not in (None, pid):
            back_s = time.monotonic() - t0
        if back_s is not None and cur["all_up"]:
            serving_s = time.monotonic() - t0
            break
        time.sleep(0.01)
    return {
        "kind": kind,
        "target": target,
        "pid": pid,
        "at_s": None,
        "recovery_s": None if back_s is None else round(back_s, 3),
        "serving_again_s": None if serving_s is None else round(serving_s, 3),
    }


def summarise(kills: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        times = [k["recovery_s"] for k in kills if k["kind"] == kind]
        back = [t for t in times if t is not None]
        out[kind] = {
            "kills": len(times),
            "recovered": len(back),
            "min_s": min(back) if back else None,
            "median_s": round(statistics.median(back), 3) if back else None,
            "max_s": max(back) if back else None,
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.executor.deploy.partition import available_cores
    from greenctl.executor.runtime.procs import process_argv, stray_daemons

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="greenctl-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    state_dir = work / "state"
    os.environ["GREENCTL_STATE_DIR"] = str(state_dir)
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = str(args.service_ms)
    cores = available_cores()
    models = args.models or max(1, min(2, len(cores) // args.instances))
    if models * args.instances > len(cores):
        raise SystemExit(
            f"{models} model(s) x {args.instances} instances need {models * args.instances} "
            f"cores; this machine offers {len(cores)}"
        )
    rng = random.Random(args.seed)
    store = open_store(work / "greenctl.db")
    report: dict[str, Any] = {
        "duration_s": args.duration,
        "rate_rps": args.rate,
        "models": models,
        "instances_per_model": args.instances,
        "kill_every_s": [args.kill_min, args.kill_max],
        "seed": args.seed,
        "state_dir": str(state_dir),
    }
    kills: list[dict[str, Any]] = []
    try:
        res = apply_plan(build_plan(models, args.instances, args.rate), store=store, loader=NOOP)
        url = res.dispatcher_url or ""
        load = Load(url, [f"m{k}" for k in range(models)], args.rate, args.duration, args.seed)
        load.start()
        time.sleep(min(3.0, args.duration / 10))
        # the last kill leaves time to recover before the load ends
        last_kill = args.duration - args.settle
        while time.monotonic() - load.started < last_kill:
            wait = rng.uniform(args.kill_min, args.kill_max)
            if time.monotonic() - load.started + wait > last_kill:
                break
            time.sleep(wait)
            at = time.monotonic() - load.started
            kill = kill_one(store, rng, args.recovery_timeout)
            kill["at_s"] = round(at, 3)
            kills.append(kill)
            if not args.json:
                print(
                    f"{at:7.1f} s  kill -9 {kill['kind']:<10} {kill['target']:<10} "
                    f"pid {kill['pid']:<7}  back in {kill['recovery_s']} s, "
                    f"serving in {kill['serving_again_s']} s",
                    file=sys.stderr,
                    flush=True,
                )
        load.join(args.duration + 120)
        final = processes(store)
        deadline = time.monotonic() + 30.0  # status's crash-loop label outlives a late kill by 5 s
        while final["state"] != "serving" and time.monotonic() < deadline:
            time.sleep(0.5)
            final = processes(store)
        report["final_state"] = final["state"]
        report["final_problems"] = final["problems"]
        report["requests"] = load.summary()
        if not args.no_faults:
            models_served = [f"m{k}" for k in range(models)]
            report["faults"] = run_faults(Faults(work, store, models_served), url, args)
    finally:
        stopped = down(store)
        report["down_stopped"] = len(stopped["stopped"])
        time.sleep(0.5)
        left = stray_daemons(state_dir, str(store.path))
        report["left_after_down"] = [
            {"pid": pid, "argv": " ".join((process_argv(pid) or [])[:4])} for pid, _ in left
        ]
        store.close()
    report["kills"] = kills
    report["recovery"] = summarise(kills)
    req = report["requests"]
    report["target_met"] = bool(
        req["failed"] == 0
        and all(k["recovery_s"] is not None and k["serving_again_s"] is not None for k in kills)
        and report["final_state"] == "serving"
        and not report["left_after_down"]
        and all(f.get("as_expected", True) for f in report.get("faults", []))
    )
    return report


# -- faults of the commands around a serving plan ----------------------------------------------
#: each fault: what its command must exit with, and the store rows it may change (a failed
#: apply records its plan and a failed history row; a refusal changes nothing)
FAULTS: dict[str, dict[str, Any]] = {
    "sigterm-apply": {"exit": {1}, "rows": 2, "lossless": True},
    "kill9-apply": {"exit": {-9}, "rows": None, "lossless": True},
    "refused-plan": {"exit": {2}, "rows": 0, "lossless": True},
    "port-in-use": {"exit": {2}, "rows": 0, "lossless": True},
    "readonly-replan": {"exit": {2}, "rows": 0, "lossless": True},
    "apply-and-down": {"exit": {0}, "rows": None, "lossless": False},
}
SLOW_LOADER = """
import os, time


def slow_loader(variant, *, device="cpu"):
    time.sleep(float(os.environ.get("CHAOS_LOAD_S", "30")))
    from greenctl.executor.runtime.daemon import noop_loader

    return noop_loader(variant, device=device)
"""


class Faults:
    """The commands of the faults, run as a user runs them (``greenctl`` in a subprocess)
    against the chaos store and state folder."""

    def __init__(self, work: Path, store: Any, models: list[str]) -> None:
        from greenctl.data.plan import Deployment, Plan, write_plan_file

        self.work, self.store, self.models = work, store, models
        self.state_dir = Path(os.environ["GREENCTL_STATE_DIR"])
        (work / "chaos_loaders.py").write_text(SLOW_LOADER)
        self.slow = f"{work / 'chaos_loaders.py'}:slow_loader"
        self.other = work / "other-plan.json"  # the same models on other variants
        deps = [Deployment(m, f"w{k}", "cpu:1", count=1, batch=1) for k, m in enumerate(models)]
        write_plan_file(Plan(kind="mix", deployments=deps), self.other)
        self.unknown = work / "unknown-variant.json"  # refused: no such variant anywhere
        write_plan_file(
            Plan(kind="mix", deployments=[Deployment(models[0], "no-such-variant", "cpu:1")]),
            self.unknown,
        )

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "greenctl.cli.main", "--db", str(self.store.path), *args]

    def env(self, load_s: float) -> dict[str, str]:
        return {**os.environ, "CHAOS_LOAD_S": str(load_s), "COLUMNS": "200"}

    def run(self, *args: str, timeout_s: float = 120.0) -> tuple[int, str]:
        proc = subprocess.run(self.argv(*args), env=self.env(30), capture_output=True,
                              text=True, timeout=timeout_s)  # fmt: skip
        return proc.returncode, error_line(proc.stderr)

    def daemons(self) -> set[int]:
        from greenctl.executor.runtime.procs import stray_daemons

        return {pid for pid, _ in stray_daemons(self.state_dir, str(self.store.path))}

    def rows(self) -> set[str]:
        """Every row of the store, as SQL (read-only, beside the running daemons)."""
        import sqlite3

        conn = sqlite3.connect(f"file:{self.store.path}?mode=ro", uri=True)
        try:
            return {line for line in conn.iterdump() if line.startswith("INSERT")}
        finally:
            conn.close()

    def signal_apply(self, sig: int) -> tuple[int, str]:
        """Start applying the other plan with a slow loader; once its executors run, send
        ``sig`` to the apply and wait for it."""
        before = self.daemons()
        proc = subprocess.Popen(self.argv("apply", str(self.other), "--loader", self.slow),
                                env=self.env(30), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60.0
        while len(self.daemons() - before) < len(self.models) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        return proc.returncode, error_line(err)

    def sigterm_apply(self) -> tuple[int, str]:
        return self.signal_apply(signal.SIGTERM)

    def kill9_apply(self) -> tuple[int, str]:
        return self.signal_apply(signal.SIGKILL)

    def refused_plan(self) -> tuple[int, str]:
        return self.run("apply", str(self.unknown))

    def port_in_use(self) -> tuple[int, str]:
        import socket

        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen(1)
            port = str(squatter.getsockname()[1])
            return self.run("apply", str(self.other), "--loader", NOOP, "--port", port)

    def readonly_replan(self) -> tuple[int, str] | None:
        """``replan`` on the store made read-only (None: it cannot be, for this user)."""
        path = Path(self.store.path)
        mode = path.stat().st_mode & 0o777
        path.chmod(0o444)
        try:
            if os.access(path, os.W_OK):  # root: a read-only file is still writable
                return None
            return self.run("replan", "--plan", "1", "--region", "CISO")
        finally:
            path.chmod(mode)

    def apply_and_down(self) -> tuple[int, str]:
        """Apply the other plan and, while its executors load, ``down``: down waits for the
        apply, then stops everything."""
        proc = subprocess.Popen(self.argv("apply", str(self.other), "--loader", self.slow),
                                env=self.env(3), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(1.0)
        rc_down, last = self.run("down")
        _, err = proc.communicate(timeout=120)
        notes = [f"apply exit {proc.returncode}, down exit {rc_down}", error_line(err), last]
        return max(abs(proc.returncode), abs(rc_down)), "; ".join(n for n in notes if n)


def error_line(stderr: str) -> str:
    """The ``Error:`` line of a command's stderr (else its last line)."""
    lines = stderr.strip().splitlines()
    return next((ln for ln in lines if ln.startswith("Error:")), lines[-1] if lines else "")


def run_faults(faults: Faults, url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each fault under ``args.fault_load`` seconds of load on the serving plan: requests
    lost, processes left (after a ``status`` that recovers a killed apply's leftovers),
    store rows changed, exit code, and whether each is what the fault must give."""
    out = []
    for n, (name, want) in enumerate(FAULTS.items()):
        rows, pids = faults.rows(), faults.daemons()
        load = Load(url, faults.models, args.rate, args.fault_load, args.seed + 100 + n)
        load.start()
        time.sleep(0.5)
        got = getattr(faults, name.replace("-", "_"))()
        load.join(args.fault_load + 120)
        if got is None:
            out.append({"fault": name, "skipped": "the store stays writable for this user"})
            continue
        code, last = got
        orphans = len(faults.daemons() - pids)
        faults.run("status")  # the next command finishes what a killed apply left
        left = sorted(faults.daemons() - pids)
        changed = len(faults.rows() ^ rows)
        req = load.summary()
        doc = {
            "fault": name,
            "exit_code": code,
            "requests_sent": req["sent"],
            "requests_lost": req["failed"],
            "processes_left": len(left),
            "orphans_before_recovery": orphans,
            "store_rows_changed": changed,
            "message": last[:300],
        }
        doc["as_expected"] = bool(
            code in want["exit"]
            and (not want["lossless"] or req["failed"] == 0)
            and not left
            and (want["rows"] is None or changed == want["rows"])
        )
        out.append(doc)
    return out


def print_report(report: dict[str, Any]) -> None:
    req = report["requests"]
    print(
        f"chaos: {report['duration_s']:.0f} s of {report['rate_rps']:.0f} req/s open-loop load on "
        f"{report['models']} model(s) x {report['instances_per_model']} no-op instances, "
        f"{len(report['kills'])} kill -9s"
    )
    print(
        f"requests: {req['sent']} sent, {req['ok']} ok, {req['failed']} failed, "
        f"{req['retried']} retried once ({req['retried_ok']} of them then ok); "
        f"status counts {req['status_counts']}"
    )
    if req["failed"]:
        near = []
        for at in req["failed_at_s"]:
            before = [k for k in report["kills"] if k["at_s"] is not None and k["at_s"] <= at + 1]
            k = before[-1] if before else None
            near.append(
                f"{at:.1f} s"
                + (f" ({at - k['at_s']:+.2f} s after killing the {k['kind']})" if k else "")
            )
        print("failed requests were due at: " + ", ".join(near))
    print("recovery (kill -9 until the process is back and serving), per kind:")
    for kind, s in report["recovery"].items():
        print(
            f"  {kind:<10} {s['kills']:>3} kills, {s['recovered']:>3} back; "
            f"min {s['min_s']} s, median {s['median_s']} s, max {s['max_s']} s"
        )
    print("every kill:")
    for k in report["kills"]:
        print(
            f"  {k['at_s']:7.1f} s  {k['kind']:<10} {k['target']:<10} pid {k['pid']:<7} "
            f"back {k['recovery_s']} s, plan serving {k['serving_again_s']} s"
        )
    print(
        f"after the load: {report['final_state']}; down stopped {report['down_stopped']} "
        f"process(es); left running after down: {len(report['left_after_down'])}"
    )
    if report.get("faults"):
        print("faults (requests lost / processes left / store rows changed / exit code):")
    for f in report.get("faults", []):
        if "skipped" in f:
            print(f"  {f['fault']:<16} skipped: {f['skipped']}")
            continue
        print(
            f"  {f['fault']:<16} lost {f['requests_lost']:>3} of {f['requests_sent']:<5} "
            f"left {f['processes_left']} (orphans {f['orphans_before_recovery']} before "
            f"recovery)  rows {f['store_rows_changed']:>2}  exit {f['exit_code']:>3}  "
            + ("as expected" if f["as_expected"] else "NOT AS EXPECTED")
            + (f"  [{f['message']}]" if f["message"] else "")
        )
    print(
        "target (no request lost beyond one retry, every process back, nothing left, every "
        "fault as expected): " + ("MET" if report["target_met"] else "MISSED")
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--rate", type=float, default=40.0, help="req/s over all models (default 40)")
    p.add_argument("--instances", type=int, default=2, help="instances per model (default 2)")
    p.add_argument("--models", type=int, default=0, help="models (default: what the cores fit)")
    p.add_argument("--kill-min", type=float, default=3.0, help="shortest gap between kills, s")
    p.add_argument("--kill-max", type=float, default=9.0, help="longest gap between kills, s")
    p.add_argument("--settle", type=float, default=10.0, help="no kill in the last S seconds")
    p.add_argument("--recovery-timeout", type=float, default=60.0, help="give a kill up after S")
    p.add_argument("--service-ms", type=float, default=2.0, help="no-op model's time per batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="folder for the scratch store and state")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--no-faults", action="store_true", help="only the kill -9s")
    p.add_argument("--fault-load", type=float, default=4.0, help="seconds of load per fault")
    p.add_argument(
        "--quick", action="store_true", help="20 s of kills (every 1.5-4 s), then the faults"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.kill_min, args.kill_max, args.settle = 20.0, 1.5, 4.0, 5.0
    if args.instances < 2:
        print("warning: the target assumes two or more instances per model", file=sys.stderr)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())

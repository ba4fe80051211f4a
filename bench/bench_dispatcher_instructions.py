"""Instructions per forwarded request: the dispatcher against nginx and a bytes-only relay,
counted by valgrind's callgrind (user-space instructions, repeatable to ~0.1 % whatever else
the machine does).

CPU time per request at a given load (``bench_dispatcher.py``) is what a user pays, but on a
shared 2-core machine it moves by +-5 % between runs, so a change of a few microseconds is
lost in it. The instruction count is the same for the same code and inputs: it shows what a
change to the request path saves, and what separates the dispatcher from nginx in work done
(it leaves out the kernel's share: system calls, wake-ups, cache misses).

It applies the no-op plan (a real executor), then runs each arm under callgrind in turn:
a copy of the plan's dispatcher (same routing table, energy scraping off), nginx with one
process (``master_process off``) proxying to the executor with keep-alive, and the relay of
``bench_dispatcher.py``. For each it sends ``--warmup`` requests, zeroes the counters, sends
``--requests`` sequential keep-alive requests (the no-op model's binary input, as
tritonclient sends it), and dumps the counts.

    python bench/bench_dispatcher_instructions.py               # 2,000 requests per arm
    python bench/bench_dispatcher_instructions.py --requests 500
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dispatcher import NGINX_CONF, free_port

#: the nginx arm as one process: what callgrind follows without tracing children
ONE_PROCESS = {"master_process on;": "master_process off;"}


def callgrind(
    argv: list[str], out: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` under callgrind, counting into ``out`` (dumps go to ``out.N``)."""
    with open(f"{out}.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
             *argv],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    """Until ``port`` accepts (valgrind starts a Python process in tens of seconds)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the arm exited ({proc.returncode}) before listening")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s:g} s")


def count(
    proc: subprocess.Popen[bytes], out: Path, port: int, body: bytes, headers: dict[str, str],
    warmup: int, requests: int,
) -> float:  # fmt: skip
    """Instructions per request over ``requests`` sequential keep-alive requests."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def one() -> None:
        conn.request("POST", "/v2/models/noop/infer", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"the arm answered {resp.status}")

    for _ in range(warmup):
        one()
    subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
    for _ in range(requests):
        one()
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    conn.close()
    dumps = sorted(glob.glob(f"{out}.*[0-9]"), key=os.path.getmtime)
    text = Path(dumps[-1]).read_text(errors="replace")
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if found is None:
        raise RuntimeError(f"no instruction total in {dumps[-1]}")
    return int(found.group(1)) / requests


def arms(direct: str, routes: Path, work: Path) -> dict[str, tuple[list[str], int, dict[str, str]]]:
    """Each arm's command line, port and environment."""
    env = dict(os.environ, PYTHONHASHSEED="0", GREENCTL_ENERGY_SCRAPE_S="0")
    target = direct.split("//", 1)[1]
    out: dict[str, tuple[list[str], int, dict[str, str]]] = {}
    port = free_port()
    out["dispatcher"] = (
        [sys.executable, "-m", "greenctl.executor.runtime.dispatcher", "--port", str(port),
         "--state-file", str(work / "dispatcher.json"), "--routes", str(routes),
         "--max-queue", "4096"],
        port, env,
    )  # fmt: skip
    port = free_port()
    bench = str(Path(__file__).resolve().parent / "bench_dispatcher.py")
    out["relay"] = ([sys.executable, bench, "--relay-serve", str(port), target], port, env)
    exe = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None
    )
    if exe is None:
        print("# nginx arm skipped: nginx is not installed (Debian: apt-get install nginx)")
        return out
    port = free_port()
    conf_text = NGINX_CONF.format(
        user="user root;\n" if os.geteuid() == 0 else "", dir=work, target=target, port=port
    )
    for old, new in ONE_PROCESS.items():
        conf_text = conf_text.replace(old, new)
    conf = work / "nginx.conf"
    conf.write_text(conf_text)
    out["nginx"] = (
        [exe, "-p", str(work), "-c", str(conf), "-e", str(work / "error.log")],
        port,
        env,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=2000, help="requests counted per arm")
    ap.add_argument("--warmup", type=int, default=100, help="requests before counting")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)")
        return 2
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.executor.runtime.loadgen import model_input

    work = Path(tempfile.mkdtemp(prefix="greenctl-bench-instr-"))
    os.environ["GREENCTL_DB"] = str(work / "bench.db")
    os.environ["GREENCTL_STATE_DIR"] = str(work / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    store = open_store()
    deployment = Deployment(
        model="noop", variant="noop", resource="cpu:1", count=1, batch=1, quota_rps=1000
    )
    apply_plan(
        Plan(kind="mix", deployments=[deployment]),
        store=store,
        loader="greenctl.executor.runtime.daemon:noop_loader",
        policy="wrr",
        max_queue=4096,
        max_wait_ms=0.0,
    )
    got: dict[str, float] = {}
    try:
        st = status(store)
        direct = st["instances"][0]["url"]
        cmdline = Path(f"/proc/{st['dispatcher']['pid']}/cmdline").read_text().split("\0")
        routes = work / "routes.json"  # the plan's routing table, for the counted copy
        routes.write_text(Path(cmdline[cmdline.index("--routes-state") + 1]).read_text())
        body, headers = model_input(direct, "noop")
        for name, (argv, port, env) in arms(direct, routes, work).items():
            out = work / f"callgrind.{name}"
            proc = callgrind(argv, out, env)
            try:
                wait_port(port, proc)
                got[name] = count(proc, out, port, body, headers, args.warmup, args.requests)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    finally:
        down(store)
    print(f"# instructions per request (callgrind, user space), {args.requests} sequential "
          f"keep-alive requests per arm after {args.warmup}; python {sys.version.split()[0]}")  # fmt: skip
    for name, value in got.items():
        ratio = f"  {value / got['nginx']:.2f}x nginx" if "nginx" in got else ""
        print(f"{name:<11} {value:>10,.0f}{ratio}")
    json.dump(got, sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

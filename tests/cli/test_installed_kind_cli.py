"""A plan kind installed from outside greenctl (a package with a ``greenctl.kinds`` entry
point, as tests/executor/test_toy_kind.py installs one) is reachable from the command line
without touching another file: ``plan run --kind K --request FILE`` plans, saves and prints
it, and ``replay K`` / ``replay --kind K`` replays it on the shared options. Its typed request
checks the request file, naming the field; a kind that is not installed is refused with the
installed kinds listed."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
from greenctl.data.plan import load_plan_file
from greenctl.data.records import Profile, Variant
from greenctl.executor.kinds import KINDS, load_kinds

#: the toy kind's module: one variant of the tiny family on cpu:1, as many instances as the
#: rate needs at 70 % of their throughput; its typed request names a bad field
TOY_MODULE = """
import math
from dataclasses import dataclass

from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.executor.kinds import PlanKind, get_kind
from greenctl.executor.kinds.serving_replay import Serving, replay_serving
from greenctl.executor.kinds.replaying import ReplayStep


@dataclass(frozen=True)
class ToyRequest:
    model: str
    rate_rps: float

    @classmethod
    def from_dict(cls, doc):
        model, rate = doc.get("model"), doc.get("rate_rps")
        if not isinstance(model, str) or not model:
            raise InputError(f"request.model must be a model family, got {model!r}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise InputError(
                f"request.rate_rps must be a number > 0, got {rate!r}", hint="e.g. 40"
            )
        return cls(model, float(rate))

    def to_dict(self):
        return {"model": self.model, "rate_rps": self.rate_rps}


def capacity(store):
    profiles = [
        p for p in store.latest_profiles(family="tiny") if p.resource == "cpu:1" and p.batch == 1
    ]
    return max(profiles, key=lambda p: p.throughput_rps)


def plan(store, request, *, current=None):
    rate = float(request["rate_rps"])
    best = capacity(store)
    count = max(1, math.ceil(rate / (0.7 * best.throughput_rps)))
    deployment = Deployment("tiny", best.variant, "cpu:1", count=count, quota_rps=rate)
    out = Plan(kind="toy", request=dict(request), deployments=[deployment])
    out.predicted = get_kind("toy").predict(store, out, rate_rps=rate, analytic=True)
    out.predicted.update(objective=float(count), objective_name="instances")
    return out, (rate, best.throughput_rps)


def score(problem, running):
    rate, per_instance = problem
    count = sum(d.count for d in running.deployments)
    if rate > 0.7 * per_instance * count:
        return None, f"{count} instances cannot carry {rate:.0f} req/s"
    return float(count), None


SERVING = Serving(
    hold=lambda first, request, notes: None,
    static=lambda *args: None,
    percentile=lambda request: "p95",
)
STEP = ReplayStep(
    run=lambda store, inputs, loop: replay_serving(store, inputs, loop, SERVING),
    baselines=(),
    default_baselines=(),
)
KIND = PlanKind(
    "toy", plan=plan, score=score, default_policy="fifo", carbon_signal=False, replay=STEP,
    request_type=ToyRequest,
)
"""


@pytest.fixture
def installed(tmp_path: Path):
    """The toy kind's package, installed on the path (module and dist-info) for the test."""
    site = tmp_path / "site"
    info = site / "greenctl_clitoy-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "greenctl_clitoy.py").write_text(textwrap.dedent(TOY_MODULE))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greenctl-clitoy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[greenctl.kinds]\ntoy = greenctl_clitoy:KIND\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    load_kinds()
    yield site
    if str(site) in sys.path:
        sys.path.remove(str(site))
    sys.modules.pop("greenctl_clitoy", None)
    load_kinds()


@pytest.fixture
def tiny(store):
    """The tiny family: two variants measured on one core."""
    for name, lat, acc in (("tiny-s", 3.0, 0.70), ("tiny-m", 8.0, 0.76)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc))
        store.add_profiles(
            [
                Profile(
                    name, "cpu:1", 1, 1000 / lat, latency_p50_ms=lat, latency_p95_ms=1.5 * lat,
                    latency_p99_ms=2 * lat, power_w=10.0, energy_j=lat / 100,
                    energy_method="modeled", source="synthetic",
                )
            ]
        )  # fmt: skip
    return store


def _request(tmp_path: Path, doc: object, name: str = "request.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _refused(r, *words: str) -> str:
    """The one Error: line of a refusal (exit 2, no traceback) that says ``words``."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    out = " ".join(r.output.split())
    assert out.startswith("Error:"), r.output
    assert all(w in out for w in words), r.output
    return out


def test_plan_run_plans_saves_and_writes_an_installed_kind(installed, tiny, cli, tmp_path):
    req = _request(tmp_path, {"model": "tiny", "rate_rps": 500.0, "carbon_intensity": 200.0})
    out = tmp_path / "toy.json"
    r = cli("plan", "run", "--kind", "toy", "--request", req, "-o", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "toy" and doc["request"]["rate_rps"] == 500.0
    assert [(d["variant"], d["count"]) for d in doc["deployments"]] == [("tiny-s", 3)]
    assert [p["kind"] for p in tiny.plans()] == ["toy"]
    written = load_plan_file(out)  # the file carries the saved plan's id
    assert written.kind == "toy" and written.id == tiny.plans()[0]["id"]
    r = cli("plan", "run", "--kind", "toy", "--request", req)  # the tables
    assert r.exit_code == 0, r.output
    assert "plan toy #2" in r.output and "tiny-s" in r.output
    assert len(tiny.plans("toy")) == 2


def test_plan_run_takes_a_built_in_kind_too(installed, tiny, cli, tmp_path):
    """The same command plans a kind with its own subcommand, through the same twin."""
    req = _request(tmp_path, {"model": "tiny", "rate_rps": 100.0, "slo_ms": 200.0})
    r = cli("plan", "run", "--kind", "mix", "--request", req, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kind"] == "mix"


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"model": "tiny", "rate_rps": -5}, ["request.rate_rps must be a number > 0", "-5"]),
        ({"model": "tiny"}, ["request.rate_rps", "None"]),
        ({"model": "", "rate_rps": 5}, ["request.model must be a model family"]),
        (["tiny", 5], ["request.json", "a request is a JSON object"]),
    ],
)
def test_a_bad_request_file_is_refused_naming_the_field(installed, tiny, cli, tmp_path, doc, words):
    req = _request(tmp_path, doc)
    out = tmp_path / "toy.json"
    before = tiny.plans()
    r = cli("plan", "run", "--kind", "toy", "--request", req, "-o", out)
    _refused(r, *words)
    assert tiny.plans() == before and not out.exists()


def test_a_request_file_that_is_no_json_is_refused_naming_the_line(installed, cli, tmp_path):
    req = tmp_path / "request.json"
    req.write_text('{\n  "model": "tiny",\n  "rate_rps": NaN\n}\n')
    _refused(cli("plan", "run", "--kind", "toy", "--request", req), "request.json", "NaN")
    req.write_text('{\n  "model": "tiny",\n  "rate_rps": 5,\n}\n')
    _refused(cli("plan", "run", "--kind", "toy", "--request", req), "request.json, line 4")
    missing = tmp_path / "nowhere.json"
    _refused(cli("plan", "run", "--kind", "toy", "--request", missing), "does not exist")


def test_a_kind_that_is_not_installed_is_refused_listing_the_installed(
    installed, cli, tmp_path, db_path
):
    req = _request(tmp_path, {"model": "tiny", "rate_rps": 5})
    out = _refused(cli("plan", "run", "--kind", "nope", "--request", req), "unknown plan kind")
    assert all(k in out for k in ("mix", "mig", "glet", "geo", "toy"))
    for argv in (["nope"], ["--kind", "nope"]):
        out = _refused(cli("replay", *argv, "--request", req), "replay takes", "(the installed")
        assert all(k in out for k in ("mix", "mig", "glet", "geo", "toy"))
    assert not db_path.exists()


def test_the_kind_is_gone_from_the_commands_with_its_package(installed, cli, tmp_path):
    req = _request(tmp_path, {"model": "tiny", "rate_rps": 5})
    sys.path.remove(str(installed))
    load_kinds()
    assert "toy" not in KINDS
    out = _refused(cli("plan", "run", "--kind", "toy", "--request", req), "unknown plan kind")
    assert "toy" not in out.partition("hint:")[2]
    _refused(cli("replay", "toy", "--request", req), "replay toy: replay takes mix")


def test_replay_runs_an_installed_kind_on_the_shared_options(installed, tiny, cli, tmp_path):
    """``replay toy`` and ``replay --kind toy`` run the one loop with the toy's step."""
    trace = tmp_path / "load.txt"
    trace.write_text(" ".join(["100"] * 120 + ["900"] * 120 + ["100"] * 120))
    req = _request(tmp_path, {"model": "tiny", "rate_rps": 100.0, "slo_ms": 100.0})
    common = ["--load-trace", trace, "--every", "60s", "--min-dwell", "0s"]
    results = []
    for argv in (
        ["replay", "toy", "--request", req, *common, "--json"],
        ["replay", *common, "--kind", "toy", "--carbon-intensity", "250", "--request", req,
         "--json"],
    ):  # fmt: skip
        r = cli(*argv)
        assert r.exit_code == 0, r.output
        results.append(json.loads(r.stdout))
    for result in results:
        meta = result["meta"]
        assert meta["kind"] == "toy" and meta["layout"] == "serving"
        rows = result["intervals"]["greenctl"]
        assert len(rows) == 6 and {r["action"] for r in rows} >= {"start", "change"}
        assert [s["policy"] for s in result["summary"]] == ["greenctl"]
    assert {r["carbon_g_per_kwh"] for r in results[1]["intervals"]["greenctl"]} == {250.0}
    r = cli("replay", "toy", "--request", req, *common, "-o", tmp_path / "out")  # the tables
    assert r.exit_code == 0, r.output
    assert "Replay of" in r.output and (tmp_path / "out" / "replay.png").is_file()


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"model": "tiny", "rate_rps": -3}, "request.rate_rps must be a number > 0, got -3"),
        ({"model": "", "rate_rps": 3}, "request.model must be a model family"),
    ],
)
def test_replay_refuses_a_bad_request_file_naming_the_field(
    installed, tiny, cli, tmp_path, doc, words
):
    trace = tmp_path / "load.txt"
    trace.write_text(" ".join(["100"] * 240))
    req = _request(tmp_path, doc)
    out = tmp_path / "out"
    r = cli("replay", "toy", "--request", req, "--load-trace", trace, "-o", out, "--json")
    _refused(r, words)
    assert r.stdout == "" and not out.exists() and tiny.plans() == []


def test_replay_help_lists_the_installed_kind(installed, cli):
    r = cli("replay", "--help")
    assert r.exit_code == 0 and "toy" in r.output, r.output
    r = cli("replay", "toy", "--help")
    assert r.exit_code == 0, r.output
    assert "--request" in r.output and "--vpa-variant" not in r.output


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["toy", "--vpa-variant", "tiny-s"], ["--vpa-variant is an option of replay mix"]),
        (["--kind", "toy", "--sites", "s.csv"], ["--sites is an option of replay geo"]),
        (["toy"], ["replay toy needs --request FILE or --plan ID"]),
        (["toy", "--plan", "1", "--request", "r.json"], ["--plan cannot be combined"]),
    ],
)
def test_replay_of_an_installed_kind_refuses_what_it_does_not_take(
    installed, cli, db_path, argv, words
):
    _refused(cli("replay", *argv, "--load-trace", "x.txt"), *words)

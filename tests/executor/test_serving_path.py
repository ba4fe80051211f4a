"""``greenctl profile serving``: the measured serving path, stored and used by plan mix."""

from __future__ import annotations

import json

import pytest
from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.plan import Deployment, Plan
from greenctl.executor.deploy.serving_measure import measure_serving
from greenctl.executor.runtime.serving import (
    QUANTILE_POINTS,
    ServingMeasurement,
    save_serving,
    serving_overheads,
    serving_rows,
)
from greenctl.planner.core.evaluate import ServingPath
from greenctl.planner.core.latency import ServiceTime

pytestmark = pytest.mark.timeout(180)


def _row(rate: float, stamp: str, *, family="tiny", variant="tiny-s", path="dispatcher", base=1.0):
    q = [base + i / 100 for i in range(QUANTILE_POINTS)]
    return ServingMeasurement(
        family=family,
        variant=variant,
        path=path,
        stand_in="model",
        policy="wrr",
        rate_rps=rate,
        input_bytes=100,
        output_elements=10,
        p50_ms=q[50],
        p95_ms=q[95],
        p99_ms=q[99],
        quantiles_ms=q,
        executor_cpu_ms_per_request=0.5 * base,
        dispatcher_cpu_ms_per_request=0.4,
        samples=100,
        created_at=stamp,
    )


def _tiny_s_profile(store, **fields):
    """The tiny-s variant and one cpu:1 batch-1 profile of it with ``fields``."""
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.6, input_shape="3,32,32"))
    store.add_profiles([Profile("tiny-s", "cpu:1", 1, **fields)])


def test_measure_serving_leaves_the_running_plan_alone(run_store, leftovers):
    from greenctl.executor.deploy.apply import apply_plan, status

    plan = Plan(
        kind="mix",
        deployments=[Deployment("tiny", "tiny-s", "cpu:1", 1, 1, quota_rps=10.0)],
    )
    apply_plan(plan, store=run_store, loader="greenctl.executor.runtime.daemon:noop_loader")
    before = status(run_store)
    rows = measure_serving(
        run_store,
        variant="tiny-s",
        rates=(20.0,),
        duration_s=0.5,
        min_requests=30,  # 0.5 s at 20 req/s is 10 requests: it runs 1.5 s instead
        output_elements=10,
        stand_in="noop",
    )
    assert [(r.path, r.rate_rps) for r in rows] == [("dispatcher", 20.0), ("direct", 20.0)]
    for r in rows:
        assert len(r.quantiles_ms) == QUANTILE_POINTS and r.samples >= 20  # seeded arrivals
        assert r.quantiles_ms == sorted(r.quantiles_ms) and r.quantiles_ms[0] > 0
        assert r.p50_ms <= r.p95_ms <= r.p99_ms
        assert r.input_bytes > 3 * 32 * 32 * 4 and r.output_elements == 10
        assert r.family == "tiny" and r.source == "measured"
    assert rows[0].dispatcher_cpu_ms_per_request is not None  # dispatcher path only
    assert rows[1].dispatcher_cpu_ms_per_request is None
    after = status(run_store)  # same dispatcher and executor, still serving
    assert after["dispatcher"]["pid"] == before["dispatcher"]["pid"]
    assert [i["pid"] for i in after["instances"]] == [i["pid"] for i in before["instances"]]
    assert run_store.db.table("serving_profiles").count == 0  # measuring stores nothing
    from greenctl.executor.deploy.apply import down

    down(run_store)
    assert leftovers() == []  # the scratch daemons are gone too


def test_model_stand_in_subtracts_the_executors_own_queue_and_run(run_store):
    from greenctl.executor.runtime.loadgen import run_load

    (row,) = measure_serving(
        run_store,
        variant="tiny-m",
        rates=(30.0,),
        duration_s=1.0,
        min_requests=30,
        paths=("direct",),
    )
    assert row.stand_in == "model" and row.output_elements == 10  # from the metadata
    assert row.executor_cpu_ms_per_request is not None and row.executor_cpu_ms_per_request >= 0
    assert row.quantiles_ms[0] >= 0 and row.quantiles_ms == sorted(row.quantiles_ms)
    # every answer carries the executor's timing, also through the dispatcher
    from greenctl.executor.deploy.apply import apply_plan

    plan = Plan(kind="mix", deployments=[Deployment("tiny", "tiny-m", "cpu:1", 1, 1, 10.0)])
    url = apply_plan(plan, store=run_store).dispatcher_url or ""
    out = run_load(url, "tiny", duration_s=0.5, rate_rps=20.0)
    assert out.ok == len(out.server_infer_ms) == len(out.server_queue_ms) > 0
    assert all(0 < i < lat for i, lat in zip(out.server_infer_ms, out.latencies_ms, strict=True))
    assert all(q >= 0 for q in out.server_queue_ms)
    assert out.server_batch_rows == [1.0] * out.ok and out.mean_batch_rows == 1.0  # batch 1


def test_the_serving_path_is_measured_with_the_batch_wait_apply_serves(store, monkeypatch):
    """Measured without the wait, resnet50 at batch 32 on the H200 ran batches of 3 rows at
    1,500 req/s and its executor spent 0.61 ms per request (as the front: p95 20.7 ms
    predicted, 9.2-10.1 measured); with apply's wait, 5 rows and 0.47 ms (p95 9.25)."""
    import greenctl.executor.deploy.apply as apply_mod
    from greenctl.data.batching import DEFAULT_MAX_WAIT_MS

    seen: list[float] = []

    class Stop(Exception):
        pass

    def fake_apply(plan, **kw):
        seen.append(kw["max_wait_ms"])
        raise Stop

    monkeypatch.setattr(apply_mod, "apply_plan", fake_apply)
    for wait in (None, 0.0, 5.0):
        kw = {} if wait is None else {"max_wait_ms": wait}
        with pytest.raises(Stop):
            measure_serving(store, variant="tiny-s", rates=(10,), resource="cpu:1", batch=4, **kw)
    assert seen == [DEFAULT_MAX_WAIT_MS, 0.0, 5.0]


def test_bad_requests_fail_before_starting_anything(store):
    with pytest.raises(NotFoundError):
        measure_serving(store, variant="no-such-variant", rates=(10,))
    with pytest.raises(InputError, match="> 0"):
        measure_serving(store, variant="tiny-s", rates=(0,))
    with pytest.raises(InputError, match="path"):
        measure_serving(store, variant="tiny-s", paths=("sideways",))
    with pytest.raises(InputError, match="stand-in"):
        measure_serving(store, variant="tiny-s", stand_in="ghost")
    for wait in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="max-wait-ms"):
            measure_serving(store, variant="tiny-s", rates=(10,), max_wait_ms=wait)


def test_overheads_pick_the_newest_run_and_the_nearest_rate(store):
    save_serving(store, [_row(10, "2026-01-01T00:00:00Z", base=9.0)])  # older run
    save_serving(
        store,
        [
            _row(10, "2026-02-01T00:00:00Z", base=1.0),
            _row(100, "2026-02-01T00:00:00Z", base=2.0),
            _row(100, "2026-02-01T00:00:00Z", base=3.0, path="direct"),
        ],
    )
    save_serving(store, [_row(10, "2026-01-15T00:00:00Z", variant="tiny-m", base=5.0)])
    got = serving_overheads(store, {"tiny": 25.0, "other": 10.0})
    assert set(got) == {"tiny", "tiny-s", "tiny-m"}  # never-measured families are left out
    assert got["tiny-m"].overhead_ms[0] == 5.0  # each variant its own newest run
    assert got["tiny"] == got["tiny-s"]  # the family: the newest run of any variant
    assert isinstance(got["tiny"], ServingPath)
    assert got["tiny"].overhead_ms[0] == 1.0  # 25 is nearer 10 than 100 (in ratio)
    assert serving_overheads(store, {"tiny": 60.0})["tiny"].overhead_ms[0] == 2.0
    assert serving_overheads(store, {"tiny": 60.0}, path="direct")["tiny"].executor_cpu_ms == 1.5
    assert serving_overheads(store, {"tiny": 60.0}, stand_in="noop") == {}
    assert serving_rows(store)[0].created_at == "2026-02-01T00:00:00Z"


def test_plan_mix_adds_the_stored_serving_path(cli, store):
    _tiny_s_profile(
        store, throughput_rps=2000.0, latency_p50_ms=0.5, latency_p95_ms=0.6, latency_p99_ms=0.7
    )
    args = ["plan", "mix", "--model", "tiny", "--rate", "50", "--slo-ms", "50", "--json"]
    r = cli(*args)
    assert r.exit_code == 0, r.output
    plain = json.loads(r.stdout)["predicted"]
    assert plain["latency_includes"].startswith("model only")
    save_serving(store, [_row(50, "2026-02-01T00:00:00Z", base=2.0)])
    r = cli(*args)
    assert r.exit_code == 0, r.output
    served = json.loads(r.stdout)["predicted"]
    assert served["latency_includes"].startswith("model + measured serving path")
    assert served["p50_ms"] == pytest.approx(plain["p50_ms"] + 2.5, abs=0.3)
    assert served["p95_ms"] > plain["p95_ms"] + 2.0


def test_cli_profile_serving_bad_input_exits_2_and_stores_nothing(cli, store):
    r = cli("profile", "serving", "--variant", "tiny-s", "--rate", "-5")
    assert r.exit_code == 2 and "rates must be > 0" in r.output
    r = cli("profile", "serving", "--variant", "nope")
    assert r.exit_code == 2 and "nope" in r.output
    assert store.db.table("serving_profiles").count == 0


def test_plan_mix_budgets_the_serving_path_within_the_slo(cli, store):
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.6, input_shape="3,32,32"))
    store.add_profiles(
        [
            Profile(
                "tiny-s", "cpu:1", 1, throughput_rps=500.0, latency_p50_ms=2.0, latency_p95_ms=2.4
            )
        ]
    )
    args = ["plan", "mix", "--model", "tiny", "--rate", "50", "--slo-ms", "4", "--json"]
    assert cli(*args).exit_code == 0  # the model alone meets 4 ms
    save_serving(store, [_row(50, "2026-02-01T00:00:00Z", base=2.0)])  # p95 of the path ~2.95
    r = cli(*args)
    assert r.exit_code == 3, r.output  # model + path no longer fit 4 ms
    assert "serving path" in r.output


def test_served_runs_slower_than_the_profile_stretch_the_service(store):
    from dataclasses import replace

    _tiny_s_profile(store, throughput_rps=500.0, latency_p50_ms=2.0, isolated_p50_ms=4.0)
    row = replace(_row(40, "2026-02-01T00:00:00Z"), infer_p50_ms=5.0)
    save_serving(store, [row])  # against the back-to-back median, not the isolated one
    assert serving_overheads(store, {"tiny": 40})["tiny-s"].service_scale == pytest.approx(2.5)
    faster = replace(_row(40, "2026-03-01T00:00:00Z"), infer_p50_ms=1.5)
    save_serving(store, [faster])  # never below the profile: no speed-up is assumed
    assert serving_overheads(store, {"tiny": 40})["tiny-s"].service_scale == 1.0
    tailed = replace(
        _row(40, "2026-03-15T00:00:00Z"), infer_p50_ms=5.0, infer_p95_ms=9.0, infer_p99_ms=12.0
    )
    save_serving(store, [tailed])  # the served runs' own tail, against the profile's fit
    path = serving_overheads(store, {"tiny": 40})["tiny-s"]
    hot = ServiceTime.from_profile(store.latest_profiles(variant="tiny-s")[0])
    assert path.service_scale == pytest.approx(2.5)
    assert path.tail_scale == pytest.approx((9.0 / hot.quantile(0.95), 12.0 / hot.quantile(0.99)))
    (stored,) = [r for r in serving_rows(store) if r.created_at == "2026-03-15T00:00:00Z"]
    assert (stored.infer_p95_ms, stored.infer_p99_ms) == (9.0, 12.0)
    untimed = replace(_row(40, "2026-04-01T00:00:00Z"), infer_p50_ms=None)
    save_serving(store, [untimed])  # a noop stand-in times no model run: not measured
    assert serving_overheads(store, {"tiny": 40})["tiny-s"].service_scale is None
    assert serving_overheads(store, {"tiny": 40})["tiny-s"].tail_scale is None


def test_one_stalled_rate_cannot_drag_the_served_tail(store):
    """The device run that found it: tiny-l's served p99 at 40 req/s was 19.3 ms against
    4.4-13.4 ms at the other rates; fitted alone, that tail put a 0.21-utilisation plan at a
    629 ms p95. The tail ratios are the median over the run's rates."""
    from dataclasses import replace

    from greenctl.data.records import Variant
    from greenctl.planner.core.evaluate import predict, profiles_by_key

    _tiny_s_profile(
        store, throughput_rps=380.0, latency_p50_ms=2.59, latency_p95_ms=3.19, latency_p99_ms=3.25
    )
    stamp = "2026-11-22T15:00:00Z"
    measured = {  # rate: served infer p50, p95, p99 (ms), as measured on the H100 host
        20.0: (3.64, 5.03, 7.86),
        40.0: (3.53, 5.85, 19.31),
        80.0: (3.41, 4.05, 4.41),
        100.0: (3.41, 5.30, 13.42),
        160.0: (3.38, 5.04, 9.87),
    }
    save_serving(
        store,
        [
            replace(_row(rate, stamp), infer_p50_ms=a, infer_p95_ms=b, infer_p99_ms=c)
            for rate, (a, b, c) in measured.items()
        ],
    )
    hot = ServiceTime.from_profile(store.latest_profiles(variant="tiny-s")[0])
    paths = {rate: serving_overheads(store, {"tiny": rate})["tiny-s"] for rate in measured}
    pooled = (5.04 / hot.quantile(0.95), 9.87 / hot.quantile(0.99))  # the medians
    for rate, path in paths.items():
        assert path.service_scale == pytest.approx(measured[rate][0] / 2.59)  # the rate's own
        assert path.tail_scale == pytest.approx(pooled)
    profiles = profiles_by_key(store.latest_profiles(variant="tiny-s"))
    variants = {"tiny-s": Variant("tiny-s", "tiny", accuracy=0.6, input_shape="3,32,32")}
    dep = [Deployment("tiny", "tiny-s", "cpu:1", 1, 1, quota_rps=40.0)]
    p95 = {
        rate: predict(dep, profiles, variants, rate_rps=rate, policy="wrr", serving=paths[rate])[
            "p95_ms"
        ]
        for rate in (20.0, 40.0)
    }
    assert p95[40.0] < 2 * p95[20.0] < 60.0  # was 629 ms at 40 with the rate's own tail


def test_plan_mix_says_gpu_latency_is_the_profiled_run_time(cli, store):
    """Served GPU runs are not measured (an H100 plan predicted at 15.6 ms p95 measured
    67-98 ms): the plan says so where it says what its latency includes."""
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.6, input_shape="3,32,32"))
    store.add_profiles(
        [
            Profile(
                "tiny-s",
                "gpu:A100",
                1,
                throughput_rps=2000.0,
                latency_p50_ms=0.5,
                latency_p95_ms=0.6,
                latency_p99_ms=0.7,
            )
        ]
    )
    args = ["plan", "mix", "--model", "tiny", "--rate", "50", "--slo-ms", "50", "--json"]
    r = cli(*args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["deployments"][0]["resource"] == "gpu:A100"
    assert (
        "GPU, MIG and MPS instances at their profiled run time"
        in doc["predicted"]["latency_includes"]
    )
    _tiny_s_profile(store, throughput_rps=500.0, latency_p50_ms=2.0, latency_p95_ms=2.4)
    r = cli(*args, "--budget", "gpu=0")  # CPU only: nothing to say about GPUs
    assert r.exit_code == 0, r.output
    assert "GPU" not in json.loads(r.stdout)["predicted"]["latency_includes"]


def _gpu_profiles(store):
    """tiny-s on an A100 (batches 1 and 8) and an H100 (batch 8)."""
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.6, input_shape="3,32,32"))
    store.add_profiles(
        [
            Profile("tiny-s", "gpu:A100", 1, throughput_rps=1000.0, latency_p50_ms=1.0),
            Profile("tiny-s", "gpu:A100", 8, throughput_rps=2667.0, latency_p50_ms=3.0),
            Profile("tiny-s", "gpu:H100", 8, throughput_rps=4000.0, latency_p50_ms=2.0),
        ]
    )


def test_served_runs_measured_on_a_gpu_apply_to_that_gpu_only(store):
    """The H100 host served resnet50 at batch 8 in 5.2-9.4 ms runs against 3.6 ms profiled:
    a path measured on a GPU stretches instances on that GPU, compared at the rows its
    batches carried (here 4, between the profiled 1 and 8: 1.857 ms)."""
    from dataclasses import replace

    from greenctl.planner.core.evaluate import build_instances, served_service

    _gpu_profiles(store)
    row = replace(
        _row(300, "2026-11-22T16:00:00Z"),
        resource="gpu:A100",
        batch=8,
        infer_rows_p50=4.0,
        infer_p50_ms=4.0,
    )
    save_serving(store, [row])
    (back,) = serving_rows(store)
    assert (back.resource, back.batch, back.infer_rows_p50) == ("gpu:A100", 8, 4.0)
    paths = serving_overheads(store, {"tiny": 300})
    path = paths["tiny-s@gpu:A100"]
    assert "tiny-s" not in paths  # no CPU run of the variant
    assert path.resource == "gpu:A100"
    assert path.service_scale == pytest.approx(4.0 / (1.0 + 2.0 * 3 / 7))
    profiles = {(p.variant, p.resource, p.batch): p for p in store.latest_profiles()}
    a100, h100 = build_instances(
        [
            Deployment("tiny", "tiny-s", "gpu:A100", 1, 8, quota_rps=150.0),
            Deployment("tiny", "tiny-s", "gpu:H100", 1, 8, quota_rps=150.0),
        ],
        profiles,
    )
    served, cpu_ms = served_service(a100, 150.0, 0.3, path)
    assert served.quantile(0.5) == pytest.approx(3.0 * path.service_scale, rel=1e-6)
    assert cpu_ms == 0.0  # the executor's CPU is not the GPU's
    plain, _ = served_service(h100, 150.0, 0.3, None)
    other, _ = served_service(h100, 150.0, 0.3, path)  # measured on another GPU: no stretch
    assert other.quantile(0.5) == pytest.approx(plain.quantile(0.5))


def test_a_variant_never_served_on_a_gpu_borrows_only_the_path_not_the_executor(store):
    """On the H200, resnet152's served path (executor CPU 1.2-1.6 ms per request in batches
    of one) was lent to resnet50 at batch 32 as its executor front: the plan was refused
    at half its load. A family's entry lends a GPU path's overhead samples, rate and
    dispatcher figure; its executor CPU and served-run ratios stay the measured variant's."""
    from dataclasses import replace

    from greenctl.planner.core.evaluate import build_instances as build
    from greenctl.planner.core.evaluate import front_cpu_ms, served_service

    _gpu_profiles(store)
    gpu_row = replace(
        _row(300, "2026-11-22T16:00:00Z", base=3.0),
        resource="gpu:A100",
        batch=8,
        infer_rows_p50=1.0,
        infer_p50_ms=2.0,
        infer_p95_ms=2.5,
        infer_p99_ms=3.0,
    )
    save_serving(store, [gpu_row])
    paths = serving_overheads(store, {"tiny": 300})
    own, family = paths["tiny-s@gpu:A100"], paths["tiny"]
    assert own.executor_cpu_ms == 1.5 and own.service_scale == pytest.approx(2.0)
    assert front_cpu_ms(own, "gpu:A100") == 1.5
    # the family's entry: the same samples, rate and dispatcher figure, no executor figures
    assert family.overhead_ms == own.overhead_ms and family.rate_rps == 300.0
    assert family.dispatcher_cpu_ms == own.dispatcher_cpu_ms == 0.4
    assert family.executor_cpu_ms == 0.0 and family.service_scale is None
    assert family.tail_scale is None and front_cpu_ms(family, "gpu:A100") == 0.0
    profiles = {(p.variant, p.resource, p.batch): p for p in store.latest_profiles()}
    (inst,) = build([Deployment("tiny", "tiny-s", "gpu:A100", 1, 8, quota_rps=150.0)], profiles)
    plain, _ = served_service(inst, 150.0, 0.3, None)
    lent, cpu_ms = served_service(inst, 150.0, 0.3, family)
    assert lent.quantile(0.5) == pytest.approx(plain.quantile(0.5)) and cpu_ms == 0.0
    # a CPU path is lent whole (its executor CPU shares any CPU instance's cores)
    save_serving(store, [_row(300, "2026-11-23T16:00:00Z", base=2.0)])
    cpu = serving_overheads(store, {"tiny": 300})
    assert cpu["tiny"] == cpu["tiny-s"] and cpu["tiny"].executor_cpu_ms == 1.0


def _a100_batch8(store):
    """tiny-s profiled on an A100 at batch 8 only (3 ms a batch)."""
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.6, input_shape="3,32,32"))
    store.add_profiles(
        [Profile("tiny-s", "gpu:A100", 8, throughput_rps=2667.0, latency_p50_ms=3.0)]
    )


def _served_on_a100(store):
    """A serving path of tiny-s measured on the A100 at batch 8: full batches, 6 ms runs."""
    from dataclasses import replace

    row = _row(300, "2026-11-22T16:00:00Z")
    gpu = replace(row, resource="gpu:A100", batch=8, infer_rows_p50=8.0, infer_p50_ms=6.0)
    save_serving(store, [gpu])


def test_plan_mix_sizes_gpu_options_on_their_served_runs(cli, store):
    _a100_batch8(store)
    args = ["plan", "mix", "--model", "tiny", "--rate", "300", "--slo-ms", "60", "--json"]
    before = json.loads(cli(*args).stdout)
    (cap,) = before["capacity"]
    assert cap["source"] == "queueing"
    assert (
        "GPU, MIG and MPS instances at their profiled run time"
        in (before["predicted"]["latency_includes"])
    )
    _served_on_a100(store)
    r = cli(*args)
    assert r.exit_code == 0, r.output
    after = json.loads(r.stdout)
    (dep,) = after["deployments"]
    assert (dep["resource"], dep["batch"]) == ("gpu:A100", 8)
    (cap_after,) = after["capacity"]
    assert cap_after["source"] == "queueing, served x2.00"  # 6.0 ms served against 3.0
    assert cap_after["capacity_rps_per_instance"] < cap["capacity_rps_per_instance"]
    includes = after["predicted"]["latency_includes"]
    assert "at their profiled run time" not in includes  # measured on that GPU
    # its executor's CPU per request was measured with it: the front is modeled
    assert "executor front" in includes and "tiny-s@gpu:A100" in includes
    assert after["predicted"]["p50_ms"] > before["predicted"]["p50_ms"] + 3.0


def test_simulate_predicts_a_plan_with_the_serving_path_plan_mix_used(cli, store, tmp_path):
    """`greenctl simulate` took no serving path: a plan predicted at p95 10.8 ms with it (the
    H200's resnet50 at batch 32) read 4.6 ms there. It now evaluates the plan with the paths
    `profile serving` stored, at the plan's rates scaled to the load asked for."""
    _a100_batch8(store)
    plan_file = tmp_path / "plan.json"
    args = ["plan", "mix", "--model", "tiny", "--rate", "300", "--slo-ms", "60", "--json"]
    sim = ["simulate", str(plan_file), "--analytic", "--json"]
    r = cli(*args, "-o", str(plan_file))
    assert r.exit_code == 0, r.output
    bare = json.loads(cli(*sim).stdout)
    assert bare["latency_includes"].startswith("model only")
    _served_on_a100(store)
    planned = json.loads(cli(*args, "-o", str(plan_file)).stdout)["predicted"]
    got = json.loads(cli(*sim).stdout)
    assert got["latency_includes"].startswith("model + measured serving path")
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        assert got[key] == pytest.approx(planned[key], rel=1e-9), key
    assert got["p95_ms"] > bare["p95_ms"] + 1.0
    r = cli("simulate", str(plan_file), "--analytic")
    assert r.exit_code == 0 and "measured serving path" in r.output
    # another load: the path measured nearest it, the plan's figures no more
    other = json.loads(cli(*sim, "--rate", "200").stdout)
    assert other["p95_ms"] != got["p95_ms"]


def test_measure_serving_on_a_resource_and_batch(run_store):
    """A batching executor (here cpu:1 at batch 2, the same code path as a GPU's) records
    where it ran, its batch and the median rows its batches carried."""
    (row,) = measure_serving(
        run_store,
        variant="tiny-s",
        rates=(40.0,),
        duration_s=0.5,
        min_requests=30,
        paths=("direct",),
        resource="cpu:1",
        batch=2,
    )
    assert (row.resource, row.batch) == ("cpu:1", 2)
    assert row.infer_rows_p50 is not None and 1.0 <= row.infer_rows_p50 <= 2.0
    assert row.infer_p50_ms is not None and row.infer_p50_ms > 0
    with pytest.raises(InputError, match="batch"):
        measure_serving(run_store, variant="tiny-s", batch=0)
    with pytest.raises(InputError, match="resource"):
        measure_serving(run_store, variant="tiny-s", resource="tpu")

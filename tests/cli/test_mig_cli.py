"""greenctl mig layouts / mig synth / plan mig through the CLI."""

from __future__ import annotations

import json

from greenctl.data.mig_parted import parse_mig_parted


def test_mig_layouts_json_for_an_nvml_name(cli):
    r = cli("mig", "layouts", "--gpu", "NVIDIA A100-SXM4-40GB", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert list(doc) == ["gpu", "layouts", "multisets"]
    assert doc["gpu"] == "A100-40GB"
    assert len(doc["layouts"]) == 78 and len(doc["multisets"]) == 38
    assert {"instances": [{"profile": "3g.20gb", "start": 0}, {"profile": "3g.20gb", "start": 4}]} in doc["layouts"]  # fmt: skip
    r = cli("mig", "layouts", "--gpu", "A30")
    assert r.exit_code == 0 and "2g.12gb@0" in r.output
    r = cli("mig", "layouts", "--gpu", "A30", "--me", "--json")
    assert any("+me" in i["profile"] for lay in json.loads(r.stdout)["layouts"] for i in lay["instances"])  # fmt: skip


def test_unknown_gpu_model_exits_2_listing_known_models(cli):
    r = cli("mig", "layouts", "--gpu", "RTX 4090")
    assert r.exit_code == 2
    assert "unknown MIG-capable GPU model" in r.output and "H100-80GB" in r.output
    r = cli("plan", "mig", "--gpu", "V100", "--gpus", "1", "--model", "x", "--rate", "1",
            "--carbon-intensity", "100")  # fmt: skip
    assert r.exit_code == 2 and "A100-40GB" in r.output


def test_synth_then_plan_mig_with_export_and_output(cli, tmp_path, store):
    r = cli("mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet")
    assert r.exit_code == 0, r.output
    assert "SYNTHETIC" in r.output
    parted = tmp_path / "mig.yaml"
    out = tmp_path / "plan.json"
    r = cli(
        "plan", "mig", "--gpu", "NVIDIA A100-SXM4-40GB", "--gpus", "4", "--model",
        "efficientnet", "--rate", "120", "--carbon-intensity", "250", "--lambda", "0.5",
        "--export", "mig-parted", str(parted), "-o", str(out), "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["kind"] == "mig" and plan["schema"] == "greenctl.plan/v1"
    assert len(plan["gpus"]) == 4
    assert set(plan["baselines"]) == {"base", "co2opt"}
    assert plan["predicted"]["sla_met"] and plan["predicted"]["source"] == "synthetic"
    assert all(d["resource"].startswith("mig:") for d in plan["deployments"])
    assert json.loads(out.read_text())["gpus"] == plan["gpus"]
    doc = parse_mig_parted(parted.read_text())
    devices = sorted(d for e in doc["mig-configs"]["greenctl-mig"] for d in e["devices"])
    assert devices == [0, 1, 2, 3]
    for entry in doc["mig-configs"]["greenctl-mig"]:
        for dev in entry["devices"]:
            profiles = [i["profile"] for i in plan["gpus"][dev]["layout"]]
            assert entry["mig-devices"] == {p: profiles.count(p) for p in set(profiles)}
    assert store.plans("mig")[0]["id"] == plan["id"]
    # a table for people, then an annealed re-plan warm-started from this one
    r = cli("plan", "mig", "--gpu", "A100-40GB", "--gpus", "4", "--model", "efficientnet",
            "--rate", "120", "--carbon-intensity", "100", "--solver", "anneal",
            "--current", str(out), "--seed", "1")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "BASE" in r.output and "CO2OPT" in r.output and "SYNTHETIC" in r.output


def test_plan_mig_errors(cli, tmp_path):
    assert cli("mig", "synth", "--gpu", "A30", "--family", "albert").exit_code == 0
    base = ["plan", "mig", "--gpu", "A30", "--gpus", "1", "--model", "albert",
            "--carbon-intensity", "100"]  # fmt: skip
    r = cli(*base, "--rate", "5", "--sla-ms", "1")
    assert r.exit_code == 3 and "SLA" in r.output
    r = cli(*base, "--rate", "5", "--solver", "magic")
    assert r.exit_code == 2 and "unknown solver" in r.output
    r = cli("plan", "mig", "--gpu", "A30", "--gpus", "1", "--model", "gpt",
            "--carbon-intensity", "100", "--rate", "5")  # fmt: skip
    assert r.exit_code == 2 and "no variants" in r.output
    r = cli(*base, "--rate", "5", "--export", "k8s", str(tmp_path / "x"))
    assert r.exit_code == 2 and "mig-parted" in r.output
    r = cli(*base, "--rate", "5", "--current", str(tmp_path / "missing.json"))
    assert r.exit_code == 2 and "does not exist" in r.output
    r = cli("mig", "synth", "--gpu", "A30", "--family", "resnet")
    assert r.exit_code == 2 and "known families" in r.output


def test_plan_mig_reads_imported_profiles_of_that_gpu_only(cli, store):
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant(name="small", family="det", accuracy=0.40, memory_mb=3000))
    store.upsert_variant(Variant(name="large", family="det", accuracy=0.50, memory_mb=9000))
    rows = []
    for variant, profile, lat, power, idle in [
        ("small", "1g.6gb", 20.0, 60.0, 30.0),
        ("small", "2g.12gb", 12.0, 90.0, 60.0),
        ("small", "4g.24gb", 9.0, 150.0, 120.0),
        ("large", "2g.12gb", 40.0, 110.0, 60.0),
        ("large", "4g.24gb", 25.0, 165.0, 120.0),
        ("large", "1g.6gb", 80.0, 70.0, 30.0),  # 9 GB does not fit 6 GB: excluded
    ]:
        rows.append(
            Profile(variant=variant, resource=f"mig:{profile}", batch=1,
                    throughput_rps=1000.0 / lat, latency_p50_ms=lat, latency_p95_ms=lat * 1.1,
                    hardware="NVIDIA A30", power_w=power, idle_power_w=idle,
                    energy_method="imported", source="imported")
        )  # fmt: skip
    # the same variant measured on another GPU model must be ignored
    rows.append(
        Profile(variant="large", resource="mig:1g.10gb", batch=1, throughput_rps=500.0,
                latency_p50_ms=2.0, hardware="NVIDIA A100-SXM4-40GB", power_w=1.0,
                idle_power_w=0.5, energy_method="imported", source="imported")
    )  # fmt: skip
    store.add_profiles(rows)
    r = cli("plan", "mig", "--gpu", "A30", "--gpus", "3", "--model", "det", "--rate", "60",
            "--carbon-intensity", "400", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["predicted"]["energy_method"] == "imported"
    assert plan["predicted"]["source"] == "imported"
    assert "synthetic" not in json.dumps(plan["extra"] if "extra" in plan else plan["model"])
    used = {(d["variant"], d["resource"]) for d in plan["deployments"]}
    assert ("large", "mig:1g.6gb") not in used and ("large", "mig:1g.10gb") not in used
    assert any("does not fit" in n for n in plan["model"]["notes"])
    assert plan["predicted"]["p95_ms"] <= plan["predicted"]["sla_ms"] * 1.001


def test_plan_mig_unwritable_output_saves_nothing(cli, tmp_path, monkeypatch):
    assert cli("mig", "synth", "--gpu", "A30", "--family", "albert").exit_code == 0
    base = ["plan", "mig", "--gpu", "A30", "--gpus", "2", "--model", "albert", "--rate", "1",
            "--sla-ms", "5000", "--carbon-intensity", "100"]  # fmt: skip
    missing = tmp_path / "missing"
    r = cli(*base, "-o", missing / "plan.json")
    assert r.exit_code == 2 and "does not exist" in r.output
    r = cli(*base, "--export", "mig-parted", missing / "mig.yaml")
    assert r.exit_code == 2 and "--export mig-parted" in r.output
    import greenctl.data.plan as plan_mod

    def fail(plan, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan_mod, "write_plan_file", fail)
    r = cli(*base, "-o", tmp_path / "plan.json")
    assert r.exit_code == 2 and "No space left" in r.output
    assert cli("plan", "list", "--json").stdout.strip() == "[]"


# -- synthetic rows beside real ones ---------------------------------------------------------
PLAN_H200 = ["plan", "mig", "--gpu", "H200", "--gpus", "2", "--model", "efficientnet",
             "--rate", "60", "--carbon-intensity", "250", "--json"]  # fmt: skip


def _real_efficientnet(store, source: str, created_at: str) -> dict:
    """Built-in efficientnet records and real (or emulated) rows on every H200 slice, as
    `greenctl profile --gpus [--emulate-mig]` stores them: the same points `mig synth`
    writes. Returns the variant records."""
    from dataclasses import replace

    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.core.synthetic import synthetic_family
    from greenctl.profiler.models import builtin_variants

    _, rows = synthetic_family(resolve_gpu("H200"), "efficientnet")
    with store.transaction():
        for v in builtin_variants("efficientnet"):
            store.upsert_variant(replace(v, memory_mb=1000.0))
        store.add_profiles(
            [
                replace(p, source=source, energy_method="nvml-attributed", created_at=created_at)
                for p in rows
            ]
        )
    return {v.name: v for v in store.variants("efficientnet")}


def _sources(cli, *args: str) -> set[str]:
    r = cli(*args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    return {p["source"] for p in doc}


def test_synth_refuses_a_family_of_real_variants_and_names_the_fixes(cli, store):
    records = _real_efficientnet(store, "measured", "2026-01-01T00:00:00Z")
    count = store.profile_count()
    r = cli("mig", "synth", "--gpu", "H200", "--family", "efficientnet")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "efficientnet-b0" in text and "--merge" in text
    assert "--prefix synthetic" in text and "synthetic-efficientnet-b0" in text
    assert store.profile_count() == count
    assert {v.name: v for v in store.variants("efficientnet")} == records


def test_synth_merge_keeps_records_and_measured_rows_in_use(cli, store):
    records = _real_efficientnet(store, "measured", "2026-01-01T00:00:00Z")
    before = cli(*PLAN_H200)
    assert before.exit_code == 0, before.output
    r = cli("mig", "synth", "--gpu", "H200", "--family", "efficientnet", "--merge", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert sorted(doc["kept_variants"]) == sorted(records) and doc["variants"] == []
    assert "merged on purpose" in r.stderr
    # the built-in records are untouched (params, memory_mb, source)
    assert {v.name: v for v in store.variants("efficientnet")} == records
    # the synthetic rows are stored, newer, but neither `profile list` nor `plan mig` use them
    assert _sources(cli, "profile", "list", "--model", "efficientnet", "--json") == {"measured"}
    everything = json.loads(
        cli("profile", "list", "--model", "efficientnet", "--all", "--json").stdout
    )
    assert {(p["source"], p["used"]) for p in everything} == {
        ("measured", True),
        ("synthetic", False),
    }
    after = cli(*PLAN_H200)
    assert after.exit_code == 0, after.output
    plan, plan_before = json.loads(after.stdout), json.loads(before.stdout)
    assert plan["predicted"]["source"] == "measured" and "label" not in plan["model"]
    assert plan["deployments"] == plan_before["deployments"]
    r = cli("profile", "list", "--model", "efficientnet", "--all")
    assert r.exit_code == 0 and "used" in r.output and "synthetic" in r.output


def test_synthetic_after_emulated_and_emulated_after_real_do_not_shadow(cli, store):
    _real_efficientnet(store, "mps-emulated", "2026-01-01T00:00:00Z")
    r = cli("mig", "synth", "--gpu", "H200", "--family", "efficientnet", "--merge")
    assert r.exit_code == 0, r.output
    listed = ("profile", "list", "--model", "efficientnet", "--json")
    assert _sources(cli, *listed) == {"mps-emulated"}
    plan = json.loads(cli(*PLAN_H200).stdout)
    assert plan["model"]["label"] == "mps-emulated profiles"
    # a real MIG measurement replaces the emulated rows; a later emulated run does not
    _real_efficientnet(store, "measured", "2026-02-01T00:00:00Z")
    _real_efficientnet(store, "mps-emulated", "2026-03-01T00:00:00Z")
    assert _sources(cli, *listed) == {"measured"}
    plan = json.loads(cli(*PLAN_H200).stdout)
    assert plan["predicted"]["source"] == "measured" and "label" not in plan["model"]


def test_synth_prefix_writes_a_separate_family(cli, store):
    records = _real_efficientnet(store, "measured", "2026-01-01T00:00:00Z")
    r = cli("mig", "synth", "--gpu", "H200", "--family", "efficientnet", "--prefix", "synthetic")
    assert r.exit_code == 0, r.output
    assert "synthetic-efficientnet" in r.output
    assert {v.name: v for v in store.variants("efficientnet")} == records
    assert [v.name for v in store.variants("synthetic-efficientnet")][:2] == [
        "synthetic-efficientnet-b0",
        "synthetic-efficientnet-b1",
    ]
    r = cli("plan", "mig", "--gpu", "H200", "--gpus", "2", "--model", "synthetic-efficientnet",
            "--rate", "60", "--carbon-intensity", "250", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["predicted"]["source"] == "synthetic"
    # the family it writes now holds synthetic variants: running it again needs no flag
    r = cli(
        "mig", "synth", "--gpu", "H100-80GB", "--family", "efficientnet", "--prefix", "synthetic"
    )
    assert r.exit_code == 0, r.output
    r = cli("mig", "synth", "--gpu", "H200", "--family", "efficientnet", "--prefix", "no good")
    assert r.exit_code == 2 and "not a name" in r.output


def test_an_export_of_synthetic_rows_re_imports_as_a_no_op(cli, tmp_path, store):
    assert cli("mig", "synth", "--gpu", "A30", "--family", "albert").exit_code == 0
    count = store.profile_count()
    out = tmp_path / "albert.csv"
    assert cli("profile", "export", "--format", "csv", "-o", out).exit_code == 0
    r = cli("profile", "import", out)
    assert r.exit_code == 0, r.output
    assert store.profile_count() == count
    # and mig synth again into its own (synthetic) family needs no flag
    assert cli("mig", "synth", "--gpu", "A30", "--family", "albert").exit_code == 0


def test_layouts_refuses_an_empty_profile_item(cli):
    r = cli("mig", "layouts", "--gpu", "A100-40GB", "--profiles", "1g.5gb,,2g.10gb")
    assert r.exit_code == 2 and "holds an empty item" in r.output and "Traceback" not in r.output

"""Property-based fuzzing of the `plan mix --spec` reader and the gpulet reference reader.

For any input the outcome is success or a GreenctlError with exit code 2, never another
exception, and a refused import leaves the store as it was. Example counts are bounded
(see ``max_examples``); ``pytest --hypothesis-show-statistics`` prints how many ran.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from greenctl.data.errors import GreenctlError
from greenctl.data.spec_io import read_mix_spec
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SPEC_FIELDS = [
    "model", "rate_rps", "families", "slo_ms", "percentile", "budgets", "budget", "objective",
    "min_accuracy", "alpha", "beta", "gamma", "carbon_intensity", "reference_carbon_intensity",
    "pue", "headroom", "current", "strategy", "solver", "time_limit_s",
]  # fmt: skip
ROW_FIELDS = ["model", "rate_rps", "slo_ms", "min_accuracy", "variant", "resource", "count",
              "batch", "quota_rps", "device", "placement", "cpu", "mig:1g.10gb"]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["p95", "p99", "ilp", "highs", "balanced", "cpu:2", "mig:1g.10gb", "m"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(ROW_FIELDS) | st.text(max_size=6), inner, max_size=5),
    ),
    max_leaves=20,
)
spec_docs = st.dictionaries(
    st.sampled_from(SPEC_FIELDS) | st.text(max_size=8), json_values, max_size=8
)


def _outcome(path: Path) -> Any:
    try:
        out = read_mix_spec(path, choices={"objective": ("balanced",), "strategy": ("ilp",)})
        event("read")
        return out
    except GreenctlError as exc:
        event(f"refused: {type(exc).__name__}")
        assert exc.exit_code == 2, exc
        assert str(path) in str(exc), exc  # names the file
        return exc


@FUZZ
@given(doc=spec_docs)
def test_spec_reader_json_documents(doc):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "spec.json"
        p.write_text(json.dumps(doc, allow_nan=True))
        out = _outcome(p)
        if isinstance(out, dict):
            json.dumps(out, allow_nan=False)  # a read spec holds finite plain data only


@FUZZ
@given(raw=st.binary(max_size=400), suffix=st.sampled_from([".toml", ".json"]))
def test_spec_reader_arbitrary_bytes(raw, suffix):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"spec{suffix}"
        p.write_bytes(raw)
        _outcome(p)


TOML_BASE = (
    'slo_ms = 60\nobjective = "balanced"\n[budgets]\ncpu = 8\n'
    '[[families]]\nmodel = "m"\nrate_rps = 50\n'
    '[[current]]\nvariant = "m-big"\nresource = "cpu:2"\ncount = 2\n'
)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(TOML_BASE)),
            st.integers(min_value=0, max_value=4),
            st.text(alphabet='[]{}"=.,\n -+eE0123456789abcinfnatrue', max_size=6),
        ),
        max_size=4,
    )
)
def test_spec_reader_mutated_toml(edits):
    text = TOML_BASE
    for at, cut, insert in edits:
        text = text[:at] + insert + text[at + cut :]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "spec.toml"
        p.write_text(text)
        _outcome(p)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=spec_docs)
def test_plan_mix_spec_never_tracebacks_and_saves_nothing(cli, store, doc):
    before = store.db.table("plans").count
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "spec.json"
        p.write_text(json.dumps(doc, allow_nan=True))
        r = cli("plan", "mix", "--spec", p)  # any other exception propagates
    assert r.exit_code == 2, r.output  # the store has no family: never a plan
    assert store.db.table("plans").count == before


# -- the gpulet reader ----------------------------------------------------------------------

models = st.sampled_from(["m1", "m2", "resnet50", "x", "9bad", "", "m 1"])
ints = st.sampled_from(["1", "2", "50", "100", "0", "101", "-1", "1.5", "x", "", "999999999"])
nums = st.sampled_from(["0.01", "100", "0", "-1", "nan", "inf", "1e400", "x", "", "1e-9"])


def _row(kind: str) -> st.SearchStrategy[str]:
    label = {
        "inference": st.sampled_from(["throughput", "latency", "x"]),
        "mem": st.sampled_from(["mem_util", "l2_util", "x"]),
    }
    if kind == "inference":
        cells = st.tuples(
            models, ints, ints, label["inference"], nums, label["inference"], nums, ints
        )
    elif kind == "mem":
        cells = st.tuples(models, ints, ints, label["mem"], nums, label["mem"], nums, ints)
    else:
        cells = st.tuples(
            models, ints, ints, models, ints, label["inference"], nums, label["inference"],
            nums, ints,
        )  # fmt: skip
    return st.one_of(
        _valid_row(kind),
        cells.map(",".join),
        st.lists(st.text(alphabet=',"\n\r x01.m', max_size=8), max_size=10).map(",".join),
    )


def _valid_row(kind: str) -> st.SearchStrategy[str]:
    """A well-formed row (so that imports also succeed, and merge or not)."""
    model = st.sampled_from(["m1", "m2", "resnet50"])
    batch = st.sampled_from(["1", "2", "4"])
    part = st.sampled_from(["20", "50", "80"])
    val = st.sampled_from(["0.01", "0.5", "12"])
    if kind == "inference":
        return st.tuples(model, batch, part, val, val, st.sampled_from(["0", "1"])).map(
            lambda c: f"{c[0]},{c[1]},{c[2]},throughput,{c[3]},latency,{c[4]},{c[5]}"
        )
    if kind == "mem":
        return st.tuples(model, batch, part, val, val).map(
            lambda c: f"{c[0]},{c[1]},{c[2]},mem_util,{c[3]},l2_util,{c[4]},0"
        )
    return st.tuples(model, batch, part, model, batch, val).map(
        lambda c: f"{c[0]},{c[1]},{c[2]},{c[3]},{c[4]},throughput,{c[5]},latency,{c[5]},1"
    )


def _file(kind: str) -> st.SearchStrategy[str | bytes | None]:
    return st.one_of(
        st.none(),
        st.lists(_valid_row(kind), min_size=1, max_size=6).map(lambda r: "\n".join(r) + "\n"),
        st.lists(_row(kind), max_size=6).map(lambda rows: "\n".join(rows) + "\n"),
        st.binary(max_size=60),
    )


_TEMPLATE: list[Path] = []


def _template_store() -> Path:
    """One migrated store holding another data set's family 'm', copied per example."""
    if not _TEMPLATE:
        from greenctl.data.records import Profile, Variant
        from greenctl.data.store import open_store

        path = Path(tempfile.mkdtemp(prefix="greenctl-fuzz-")) / "template.db"
        with open_store(path) as store:
            store.upsert_variant(Variant("m1", "m", accuracy=0.7, source="imported"))
            store.add_profiles([Profile("m1", "cpu:1", 1, 10.0, latency_p50_ms=5.0, hardware="c")])
            store.db.execute("pragma wal_checkpoint(truncate)")
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


@FUZZ
@given(
    inference=_file("inference"),
    mem=_file("mem"),
    inter=_file("inter"),
    prefix=st.sampled_from([None, None, "gpulet", "", "9x"]),
    merge=st.booleans(),
)
def test_gpulet_reader_never_crashes_and_keeps_the_store_on_error(
    inference, mem, inter, prefix, merge
):
    import shutil

    from greenctl.data.gpulet_import import import_gpulet
    from greenctl.data.store import open_store

    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "gp"
        folder.mkdir()
        for name, content in (
            ("inference.csv", inference),
            ("mem_util.csv", mem),
            ("interference.csv", inter),
        ):
            if isinstance(content, bytes):
                (folder / name).write_bytes(content)
            elif content is not None:
                (folder / name).write_text(content)
        shutil.copy(_template_store(), Path(d) / "s.db")
        with open_store(Path(d) / "s.db") as store:  # another data set's family 'm' is in it
            before = list(store.db.conn.iterdump())
            try:
                import_gpulet(store, folder, prefix=prefix, merge=merge)
                event("imported")
            except GreenctlError as exc:
                event(f"refused: {type(exc).__name__}")
                assert exc.exit_code == 2, exc
                assert list(store.db.conn.iterdump()) == before

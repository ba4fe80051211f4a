"""``greenctl variants generate``: torch, ONNX Runtime and int8 variants of a user's model,
each with its accuracy measured on the user's data, its file beside the store and its
profile stored; bad input refused in one line with the store and its folder untouched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

USER_MODELS = """
import numpy as np
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 5),
    )


def _inputs(n=32):
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def evaluate():
    # the first half labelled with the model's own answer, the second half with another
    # class: the fp32 model scores exactly 0.5
    x = _inputs()
    with torch.no_grad():
        top = build()(x).argmax(1)
    y = torch.cat([top[:16], (top[16:] + 1) % 5])
    return [(x[:16], y[:16]), (x[16:].numpy(), y[16:].tolist())]


def first_class_share(outputs, labels):
    return float((np.asarray(labels) == 0).mean())


def wrong_shape():
    return [(torch.rand(4, 3, 9, 9), torch.zeros(4, dtype=torch.long))]


def out_of_range():
    return [(torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 99]))]


def not_iterable():
    return 42


def not_pairs():
    return [torch.rand(4, 3, 8, 8)]


def too_few_labels():
    return [(torch.rand(4, 3, 8, 8), torch.tensor([0, 1]))]


def metric_junk(outputs, labels):
    return "high"


class Erfcx(torch.nn.Module):
    # an operator ONNX has no counterpart for
    def forward(self, x):
        return torch.special.erfcx(x).flatten(1)[:, :5]


def unexportable():
    return Erfcx()


def raises():
    raise ValueError("no weights file here")
"""

OPTS = ("--input-shape", "3,8,8", "--batch", "1,2", "--requests", "4", "--warmup", "1")


@pytest.fixture
def mod(tmp_path, monkeypatch):
    """A module of user models and evaluation functions on the import path."""
    (tmp_path / "greenctl_test_variant_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "greenctl_test_variant_models"


def _state(store, db_path: Path) -> tuple[int, int, list[str]]:
    """Variant rows, profile rows, and every file beside the store."""
    files = sorted(str(p) for p in db_path.parent.rglob("*") if "models" in str(p))
    return store.db.table("variants").count, store.profile_count(), files


def test_generates_torch_onnx_and_int8_measured_and_profiled(cli, store, db_path, mod):
    r = cli(
        "variants", "generate", "--model-path", f"{mod}:build", "--eval", f"{mod}:evaluate",
        "--name", "tnet", *OPTS, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    made = {v["name"]: v for v in doc["variants"]}
    assert set(made) == {"tnet-torch", "tnet-onnx", "tnet-int8"}
    assert doc["skipped"] == []
    # the same fp32 model in ONNX Runtime answers as torch does; int8 is close to it
    assert made["tnet-torch"]["accuracy"] == 0.5
    assert made["tnet-onnx"]["accuracy"] == 0.5
    assert 0.25 <= made["tnet-int8"]["accuracy"] <= 0.75
    assert made["tnet-torch"]["source"] == f"module:{mod}:build"
    folder = db_path.parent / "greenctl-models"
    for name in ("tnet-onnx", "tnet-int8"):
        path = Path(made[name]["file"])
        assert made[name]["source"] == f"onnx:{path}"
        assert path.parent == folder.resolve()
        data = path.read_bytes()
        assert path.name == f"{hashlib.sha256(data).hexdigest()}.onnx"
        assert made[name]["size_bytes"] == len(data)
    assert made["tnet-int8"]["file"] != made["tnet-onnx"]["file"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        Path(made[n]["file"]).name for n in ("tnet-onnx", "tnet-int8")
    )  # no partial file left
    # stored: the family's variants with their accuracy, a profile of every point
    stored = {v.name: v for v in store.variants("tnet")}
    assert {n: v.accuracy for n, v in stored.items()} == {n: made[n]["accuracy"] for n in made}
    points = {(p.variant, p.resource, p.batch) for p in store.latest_profiles(family="tnet")}
    assert points == {(n, "cpu:1", b) for n in made for b in (1, 2)}
    # profile show names the file the variant runs
    shown = json.loads(cli("profile", "show", "tnet-int8", "--json").stdout)
    assert shown["file"] == made["tnet-int8"]["file"]
    assert cli("profile", "show", "tnet-torch", "--json").exit_code == 0


def test_onnx_variant_answers_as_the_torch_model(store, mod, tmp_path):
    import numpy as np
    import torch
    from greenctl.profiler.models import load_model
    from greenctl.profiler.options import ProfileOptions
    from greenctl.profiler.variants_gen import generate, prepare_generate

    plan = prepare_generate(
        name="eq", model_path=f"{mod}:build", input_shape="3,8,8", eval_spec=f"{mod}:evaluate",
        options=ProfileOptions.of(batches=[1], requests=3, duration_s=None, warmup=0),
        formats="onnx",
    )  # fmt: skip
    result = generate(store, plan, folder=tmp_path / "files")
    assert [g.variant.name for g in result.made] == ["eq-onnx"]
    loaded = load_model(store.get_variant("eq-onnx"))
    assert loaded.numpy_native and loaded.platform == "onnxruntime_onnx"
    x = np.random.default_rng(3).random((5, 3, 8, 8), dtype=np.float32)
    with torch.no_grad():
        expected = plan.module(torch.from_numpy(x)).numpy()
    assert np.allclose(loaded.run(x), expected, atol=1e-5)
    assert sum(p.numel() for p in loaded.module.parameters()) == plan.params


def test_custom_metric_scores_all_outputs(cli, store, mod):
    r = cli(
        "variants", "generate", "--model-path", f"{mod}:build", "--eval", f"{mod}:evaluate",
        "--metric", f"{mod}:first_class_share", "--name", "mnet", "--formats", "torch",
        *OPTS, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    (v,) = json.loads(r.stdout)["variants"]
    labels = [int(y) for _x, ys in _evaluate(mod) for y in ys]
    assert v["accuracy"] == pytest.approx(labels.count(0) / len(labels), abs=1e-6)
    assert v["accuracy_metric"] == f"{mod}:first_class_share"


def _evaluate(mod: str):
    import importlib

    return importlib.import_module(mod).evaluate()


def test_a_format_that_cannot_be_made_is_skipped_with_its_reason(cli, store, db_path, mod):
    r = cli(
        "variants", "generate", "--model-path", f"{mod}:unexportable",
        "--eval", f"{mod}:evaluate", "--metric", f"{mod}:first_class_share",
        "--name", "unx", *OPTS, "--formats", "torch,onnx,int8",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    skipped = [line for line in r.output.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 2 and all("special_erfcx" in line for line in skipped)
    assert [v.name for v in store.variants("unx")] == ["unx-torch"]
    folder = db_path.parent / "greenctl-models"
    assert not folder.exists() or list(folder.iterdir()) == []


def test_none_made_is_exit_2_with_the_reasons_and_nothing_stored(cli, store, db_path, mod):
    before = _state(store, db_path)
    r = cli(
        "variants", "generate", "--model-path", f"{mod}:unexportable",
        "--eval", f"{mod}:evaluate", "--metric", f"{mod}:first_class_share",
        "--name", "unx", *OPTS, "--formats", "onnx",
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert "no variant of unx could be made" in line and "unx-onnx" in line
    assert "special_erfcx" in line and "Traceback" not in r.output
    assert _state(store, db_path) == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--model-path", "greenctl_no_such_mod:build"), "cannot import module"),
        (("--model-path", "{mod}:raises"), "no weights file here"),
        (("--input-shape", "3,x,8"), "--input-shape"),
        (("--eval", "{mod}:wrong_shape"), "do not match --input-shape 3,8,8"),
        (("--eval", "{mod}:out_of_range"), "label 99 is not a class of the model's 5"),
        (("--eval", "{mod}:not_iterable"), "no iterable of (inputs, labels)"),
        (("--eval", "{mod}:not_pairs"), "not an (inputs, labels) pair"),
        (("--eval", "{mod}:too_few_labels"), "4 inputs but labels of shape (2,)"),
        (("--metric", "{mod}:metric_junk"), "--metric"),
        (("--formats", "fp16"), "--formats fp16: this machine cannot run it"),
        (("--formats", "onnx,tflite"), "'tflite' is not a format"),
        (("--name", "tiny"), "built in"),
        (("--name", "a b"), "--name"),
        (("--cpus", "999"), "--cpus 999"),
    ],
)
def test_bad_input_is_one_error_line_and_changes_nothing(cli, store, db_path, mod, args, said):
    base = {
        "--model-path": f"{mod}:build",
        "--eval": f"{mod}:evaluate",
        "--name": "bad",
        "--input-shape": "3,8,8",
    }
    base.update(dict(zip(args[::2], (a.format(mod=mod) for a in args[1::2]), strict=True)))
    flags = [x for k, v in base.items() for x in (k, v)]
    before = _state(store, db_path)
    r = cli("variants", "generate", *flags, "--batch", "1", "--requests", "3")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert said in line
    assert _state(store, db_path) == before


def test_a_models_folder_that_cannot_be_made_is_refused_before_work(cli, tmp_path, mod):
    db = tmp_path / "other.db"
    (tmp_path / "other-models").write_text("a file where the folder goes")
    r = cli(
        "variants", "generate", "--model-path", f"{mod}:build", "--eval", f"{mod}:evaluate",
        "--name", "nf", *OPTS, "--db", str(db),
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert "other-models" in line and "is a file, not a folder" in line
    assert not db.exists()  # the store it would have created is not left behind


def test_a_store_in_a_missing_folder_is_refused(cli, tmp_path, mod):
    db = tmp_path / "nowhere" / "g.db"
    r = cli(
        "variants", "generate", "--model-path", f"{mod}:build", "--eval", f"{mod}:evaluate",
        "--name", "nf", *OPTS, "--db", str(db),
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert "nowhere" in line and "does not exist" in line
    assert not (tmp_path / "nowhere").exists()


def test_a_missing_generated_file_names_the_variant_and_the_fix(tmp_path):
    from greenctl.data.errors import InputError
    from greenctl.data.records import Variant
    from greenctl.profiler.models import check_model_file, load_model

    gone = Variant(
        name="x-onnx", family="x", source=f"onnx:{tmp_path / 'gone.onnx'}", input_shape="3"
    )
    with pytest.raises(InputError, match="variant 'x-onnx' runs the file") as info:
        load_model(gone)
    assert "greenctl variants generate --name x" in (info.value.hint or "")
    with pytest.raises(InputError, match="variant 'x-onnx' runs the file"):
        check_model_file(gone)
    check_model_file(Variant(name="tiny-s", family="tiny"))  # built in: no file to check


def test_a_half_precision_source_takes_and_answers_float32(mod):
    """``;dtype=bfloat16`` (what NAME-bf16 runs on a GPU) on the CPU: weights in bfloat16,
    requests and answers in float32, close to the fp32 model's."""
    import torch
    from greenctl.data.errors import InputError
    from greenctl.data.records import Variant
    from greenctl.profiler.models import build_module, load_model, model_file, with_dtype

    fp32 = Variant(name="h", family="h", source=f"module:{mod}:build", input_shape="3,8,8")
    half = Variant(**{**fp32.__dict__, "source": with_dtype(fp32.source, "bfloat16")})
    loaded = load_model(half)
    x = loaded.example(4)
    out = loaded.run(x)
    assert out.dtype == torch.float32 and out.shape == (4, 5)
    assert next(loaded.module.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        ref = build_module(fp32).eval()(x)
    assert torch.allclose(out, ref, atol=0.05)
    assert model_file(half) is None
    bad = Variant(**{**fp32.__dict__, "name": "h8", "source": f"{fp32.source};dtype=int3"})
    with pytest.raises(InputError, match="dtype 'int3' is not one of float16, bfloat16"):
        load_model(bad)


def test_a_torchscript_file_generates_the_same_onnx_file(cli, store, mod, tmp_path):
    """A TorchScript file exports to the ONNX bytes the module does: one content-addressed
    file serves both families."""
    import importlib

    import torch

    ts = tmp_path / "model.pt"
    torch.jit.script(importlib.import_module(mod).build().eval()).save(str(ts))
    files = {}
    for name, path in (("fromts", str(ts)), ("frommod", f"{mod}:build")):
        r = cli(
            "variants", "generate", "--model-path", path, "--eval", f"{mod}:evaluate",
            "--name", name, *OPTS, "--formats", "torch,onnx", "--json",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        made = {v["name"]: v for v in json.loads(r.stdout)["variants"]}
        assert made[f"{name}-onnx"]["accuracy"] == 0.5
        files[name] = made[f"{name}-onnx"]["file"]
    assert made["frommod-torch"]["source"].startswith("module:")
    assert files["fromts"] == files["frommod"]
    assert store.get_variant("fromts-torch").source == f"torchscript:{ts.resolve()}"
    assert store.get_variant("fromts-onnx").source == store.get_variant("frommod-onnx").source

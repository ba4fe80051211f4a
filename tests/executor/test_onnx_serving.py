"""A generated ONNX Runtime variant served by ``apply``: the local backend starts its executor,
the dispatcher routes Open Inference Protocol requests to it, and it answers as the torch
model does; a generated file that is gone is refused naming the variant and the fix."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.plan import Deployment, Plan

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)

USER_MODEL = """
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 7),
    )


def evaluate():
    x = torch.rand(8, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    return [(x, torch.arange(8) % 7)]
"""


@pytest.fixture
def generated(run_store, tmp_path, monkeypatch):
    """``gen-onnx`` and ``gen-int8`` generated into the test's store; the fp32 torch module."""
    from greenctl.profiler.options import ProfileOptions
    from greenctl.profiler.variants_gen import generate, prepare_generate

    (tmp_path / "greenctl_test_onnx_serving.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = prepare_generate(
        name="gen", model_path="greenctl_test_onnx_serving:build", input_shape="3,6,6",
        eval_spec="greenctl_test_onnx_serving:evaluate", formats="onnx,int8",
        options=ProfileOptions.of(batches=[1], requests=3, duration_s=None, warmup=0),
    )  # fmt: skip
    result = generate(run_store, plan)
    assert [g.variant.name for g in result.made] == ["gen-onnx", "gen-int8"]
    return plan.module


def _plan(variant: str) -> Plan:
    return Plan(
        kind="mix",
        deployments=[
            Deployment(
                model="gen", variant=variant, resource="cpu:1", count=1, batch=4, quota_rps=20.0
            )
        ],
        predicted={"rate_rps": 20.0, "p95_ms": 20.0},
    )


def _infer(url: str, x: np.ndarray, **fields: str) -> tuple[dict, np.ndarray]:
    """An OIP JSON request of ``x`` through urllib: the answer and its first output."""
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    doc = {**fields, "inputs": [{**tensor, "data": x.ravel().tolist()}]}
    req = urllib.request.Request(
        f"{url}/v2/models/gen/infer",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        answer = json.loads(resp.read())
    out = answer["outputs"][0]
    return answer, np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def test_apply_serves_a_generated_onnx_variant(run_store, generated, leftovers):
    import torch
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.executor.runtime.loadgen import run_load

    result = apply_plan(_plan("gen-onnx"), store=run_store, policy="fifo")
    url = result.dispatcher_url
    assert url
    x = np.random.default_rng(2).random((3, 3, 6, 6), dtype=np.float32)
    doc, out = _infer(url, x, id="r1")
    assert doc["model_name"] == "gen" and doc["id"] == "r1"
    with torch.no_grad():
        expected = generated(torch.from_numpy(x)).numpy()
    assert out.shape == (3, 7)
    assert np.allclose(out, expected, atol=1e-4)

    # batched under load like any variant; the executor reports the variant it runs
    load = run_load(url, "gen", duration_s=1.0, rate_rps=30, seed=1)
    assert load.sent > 10 and load.ok == load.sent and load.errors == 0
    (inst,) = status(run_store)["instances"]
    assert inst["variant"] == "gen-onnx" and inst["ready"]
    assert inst["requests"] >= load.ok

    # switched to the int8 variant: the same front answers, with close numbers
    apply_plan(_plan("gen-int8"), store=run_store, policy="fifo")
    (inst,) = status(run_store)["instances"]
    assert inst["variant"] == "gen-int8"
    _doc, out8 = _infer(url, x)
    assert np.abs(out8 - expected).max() < 0.1 * max(np.abs(expected).max(), 1.0)
    down(run_store)
    assert leftovers() == []


def test_apply_refuses_a_variant_whose_file_is_gone(run_store, generated, leftovers):
    from greenctl.data.errors import GreenctlError
    from greenctl.executor.deploy.apply import apply_plan, status
    from greenctl.profiler.models import model_file

    path = Path(model_file(run_store.get_variant("gen-onnx")) or "")
    path.unlink()
    with pytest.raises(GreenctlError) as info:
        apply_plan(_plan("gen-onnx"), store=run_store, policy="fifo")
    text = f"{info.value} {info.value.hint or ''}"
    assert "gen-onnx" in text and str(path) in text
    assert "greenctl variants generate" in text
    assert status(run_store)["instances"] == []
    assert leftovers() == []

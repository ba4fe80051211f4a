"""tritonclient's HTTP client works unchanged against the dispatcher (skipped when absent)."""

from __future__ import annotations

import numpy as np
import pytest
from greenctl.data.plan import Deployment, Plan

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)


def test_tritonclient_http(run_store, loaders):
    httpclient = pytest.importorskip("tritonclient.http")
    from greenctl.executor.deploy.apply import apply_plan

    plan = Plan(
        kind="mix",
        deployments=[Deployment(model="m", variant="v", resource="cpu:1", count=1, batch=4)],
    )
    url = apply_plan(plan, store=run_store, loader=loaders["noop"]).dispatcher_url or ""
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("m")
        meta = client.get_model_metadata("m")
        assert meta["inputs"][0]["shape"] == [-1, 4]
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        for binary in (True, False):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("output", binary_data=binary)
            result = client.infer("m", [inp], outputs=[out], request_id="t1")
            assert np.array_equal(result.as_numpy("output"), x)
            assert result.get_response()["id"] == "t1"
    finally:
        client.close()

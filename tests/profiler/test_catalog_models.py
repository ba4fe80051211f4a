"""The built-in catalog and model loading (built-in, module:callable, TorchScript)."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch
from greenctl.data.errors import InputError, NotFoundError
from greenctl.profiler import models
from greenctl.profiler.models import (
    builtin_variants,
    ensure_builtin_variant,
    load_model,
    user_variant,
)

PUBLISHED = {
    "resnet18": 0.69758,
    "resnet34": 0.73314,
    "resnet50": 0.7613,
    "resnet101": 0.77374,
    "resnet152": 0.78312,
}


def test_catalog_is_package_data_with_its_families():
    text = (resources.files("greenctl.data") / "datasets" / "catalog.json").read_text()
    doc = json.loads(text)
    assert set(doc["families"]) == {"resnet", "efficientnet", "tiny"}
    byname = {v.name: v for v in builtin_variants()}
    assert {n: byname[n].accuracy for n in PUBLISHED} == PUBLISHED
    assert all(byname[n].accuracy_metric == "imagenet-top1" for n in PUBLISHED)
    tiny = builtin_variants("tiny")
    assert [v.name for v in tiny] == ["tiny-s", "tiny-m", "tiny-l"]
    assert all("illustrative, not measured" in v.accuracy_source for v in tiny)


@pytest.mark.parametrize("name", [*PUBLISHED, "tiny-s", "tiny-m", "tiny-l"])
def test_architectures_match_catalog_parameter_counts(name):
    # the catalog's ResNet counts are torchvision's: the layout is the published one
    with torch.device("meta"):  # shapes only: no memory, no slow random init
        module = models.build_builtin(name)
    assert sum(p.numel() for p in module.parameters()) == models.builtin_variant(name).params


def test_tiny_variants_grow_in_size():
    sizes = [v.params for v in builtin_variants("tiny")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3


def test_loaded_model_runs_in_eval_mode():
    m = load_model(models.builtin_variant("tiny-m"))
    assert m.input_shape == (3, 32, 32) and not m.module.training
    x = m.example(4)
    assert x.shape == (4, 3, 32, 32)
    y = m.run(x)
    assert y.shape == (4, 10) and not y.requires_grad
    assert m.load_time_s is not None and m.load_time_s >= 0


def test_ensure_builtin_variant_upserts_the_catalog_record(store):
    v = ensure_builtin_variant(store, "resnet50")
    assert store.get_variant("resnet50") == v
    with pytest.raises(NotFoundError, match="built-in variants"):
        ensure_builtin_variant(store, "resnet9000")


def test_cuda_device_without_cuda_is_a_hardware_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from greenctl.data.errors import HardwareError

    with pytest.raises(HardwareError, match="no CUDA"):
        load_model(models.builtin_variant("tiny-s"), device="cuda:0")


MODULE = """
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 3))

def not_a_module():
    return 42
"""


def test_user_module_callable_with_weights(tmp_path, monkeypatch):
    (tmp_path / "usermod_a.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    from torch import nn

    ref = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    torch.save(ref.state_dict(), tmp_path / "w.pt")
    v = user_variant(
        "usermod_a:build", input_shape="3,2,2", accuracy=0.5, weights=str(tmp_path / "w.pt")
    )
    assert v.name == "build" and v.family == "custom" and v.source.endswith("w.pt")
    m = load_model(v)
    x = m.example(2)
    assert torch.allclose(m.run(x), ref(x))


def test_user_module_errors_are_input_errors(tmp_path, monkeypatch):
    (tmp_path / "usermod_b.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="--input-shape is required"):
        user_variant("usermod_b:build", input_shape=None)
    with pytest.raises(InputError, match="not a list of positive whole numbers"):
        user_variant("usermod_b:build", input_shape="3,x")
    with pytest.raises(InputError, match="cannot import module 'nosuchmod'"):
        user_variant("nosuchmod:build", input_shape="3")
    with pytest.raises(InputError, match="has no attribute 'nope'"):
        user_variant("usermod_b:nope", input_shape="3")
    with pytest.raises(InputError, match="between 0 and 1"):
        user_variant("usermod_b:build", input_shape="12", accuracy=76.0)
    with pytest.raises(InputError, match="built-in variant"):
        user_variant("usermod_b:build", input_shape="12", name="resnet18")
    v = user_variant("usermod_b:not_a_module", input_shape="12")
    with pytest.raises(InputError, match=r"not a torch nn\.Module"):
        load_model(v)


def test_torchscript_file(tmp_path):
    from torch import nn

    scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 4), nn.ReLU()))
    path = tmp_path / "small.pt"
    scripted.save(str(path))
    v = user_variant(str(path), input_shape="8", family="mine")
    assert v.name == "small" and v.family == "mine" and v.source.startswith("torchscript:")
    m = load_model(v)
    assert m.run(m.example(3)).shape == (3, 4)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot load TorchScript file"):
        load_model(user_variant(str(bad), input_shape="8"))


def test_weights_are_loaded_without_unpickling_objects(tmp_path, monkeypatch):
    (tmp_path / "usermod_c.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"0.weight": Evil()}, tmp_path / "evil.pt")
    v = user_variant("usermod_c:build", input_shape="12", weights=str(tmp_path / "evil.pt"))
    with pytest.raises(InputError, match="cannot load weights"):
        load_model(v)

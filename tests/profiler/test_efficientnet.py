"""The built-in EfficientNet family (Clover's): architecture, catalog figures, input shapes."""

from __future__ import annotations

import pytest
import torch
from greenctl.planner.core.synthetic import clover_accuracy
from greenctl.profiler import models
from greenctl.profiler.models import builtin_variants, load_model

# torchvision's efficientnet_b0..b7 parameter counts (the same layout, 1000 classes)
TORCHVISION_PARAMS = {
    "efficientnet-b0": 5_288_548,
    "efficientnet-b1": 7_794_184,
    "efficientnet-b2": 9_109_994,
    "efficientnet-b3": 12_233_232,
    "efficientnet-b4": 19_341_616,
    "efficientnet-b5": 30_389_784,
    "efficientnet-b6": 43_040_704,
    "efficientnet-b7": 66_347_960,
}
NATIVE_RESOLUTION = {
    "efficientnet-b0": 224,
    "efficientnet-b1": 240,
    "efficientnet-b2": 260,
    "efficientnet-b3": 300,
    "efficientnet-b4": 380,
    "efficientnet-b5": 456,
    "efficientnet-b6": 528,
    "efficientnet-b7": 600,
}


@pytest.mark.parametrize("name", list(TORCHVISION_PARAMS))
def test_parameter_counts_are_torchvisions_and_the_catalogs(name):
    with torch.device("meta"):  # shapes only: no memory, no slow random init
        module = models.build_builtin(name)
    n = sum(p.numel() for p in module.parameters())
    assert n == TORCHVISION_PARAMS[name]
    assert models.builtin_variant(name).params == n


def test_builtin_variants_have_native_input_shapes():
    variants = builtin_variants("efficientnet")
    assert [v.name for v in variants] == list(TORCHVISION_PARAMS)
    for v in variants:
        r = NATIVE_RESOLUTION[v.name]
        assert v.input_shape == f"3,{r},{r}"
        assert v.family == "efficientnet" and v.source == "builtin"
        assert v.accuracy_metric == "imagenet-top1"
        assert "boringlee24/sc23-clover" in v.accuracy_source
        assert v.load_time_s is not None and v.load_time_s > 0
    # the other families still take the family's shape
    assert {v.input_shape for v in builtin_variants("resnet")} == {"3,224,224"}
    assert {v.input_shape for v in builtin_variants("tiny")} == {"3,32,32"}


def test_load_times_are_labelled_estimates_and_grow_with_size():
    fam = models.catalog()["families"]["efficientnet"]
    assert fam["load_time_source"].startswith("estimate, not measured")
    times = [v.load_time_s for v in builtin_variants("efficientnet")]
    assert times == sorted(times)


def test_accuracies_are_clovers_figures():
    # one source of truth: the catalog's fractions are clover_accuracy.json's percent / 100
    pct = clover_accuracy()["families"]["efficientnet"]["variants"]
    got = {v.name: v.accuracy for v in builtin_variants("efficientnet")}
    assert got == {f"efficientnet-{k}": pytest.approx(p / 100, abs=1e-12) for k, p in pct.items()}
    accs = list(got.values())
    assert accs == sorted(accs)


def test_b0_forward_pass_on_cpu():
    m = load_model(models.builtin_variant("efficientnet-b0"))
    assert m.input_shape == (3, 224, 224) and not m.module.training
    y = m.run(m.example(1))
    assert y.shape == (1, 1000) and torch.isfinite(y).all()


def test_b1_runs_at_its_native_resolution_deterministically_in_eval_mode():
    torch.manual_seed(0)
    module = models.build_builtin("efficientnet-b1").eval()
    with torch.inference_mode():
        y = module(torch.rand(2, 3, 240, 240))
    assert y.shape == (2, 1000)
    # eval mode: dropout off, so the same input gives the same output
    with torch.inference_mode():
        assert torch.equal(module(torch.ones(1, 3, 240, 240)), module(torch.ones(1, 3, 240, 240)))

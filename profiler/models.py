"""The built-in model catalog and loading of user models.

Built-in families (metadata in ``data/datasets/catalog.json``), written in plain torch with
random weights, carry the published ImageNet top-1 accuracy of trained weights: ``resnet``
(ResNet-18..152) and ``efficientnet`` (B0..B7, Clover's family, at native resolutions);
``tiny`` has three small 3x32x32 classifiers for tests and demos, with illustrative
accuracies. User models (``Variant.source``): ``module:pkg.mod:callable`` returning an
``nn.Module`` (optional ``;weights=PATH``, loaded with ``weights_only=True``) or
``torchscript:PATH``, either with an optional ``;dtype=float16|bfloat16`` (run in that
precision, float32 in and out), or ``onnx:PATH`` (run by ONNX Runtime,
:mod:`greenctl.profiler.onnx_engine`). torch is imported lazily, inside functions.
"""

from __future__ import annotations

import json
import math
import pickle
import time
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from greenctl.data.errors import HardwareError, InputError, NotFoundError
from greenctl.data.records import Variant
from greenctl.profiler.onnx_engine import PLATFORM, onnx_path, open_session, require_file
from greenctl.profiler.user_code import import_user_module

if TYPE_CHECKING:
    import torch
    from greenctl.data.store import Store


@cache
def catalog() -> dict[str, Any]:
    """The catalog document (``data/datasets/catalog.json``)."""
    text = (resources.files("greenctl.data") / "datasets" / "catalog.json").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


def _entries() -> dict[str, tuple[str, dict[str, Any], dict[str, Any]]]:
    out = {}
    for family, fam in catalog()["families"].items():
        for v in fam["variants"]:
            out[v["name"]] = (family, fam, v)
    return out


def builtin_families() -> list[str]:
    """Names of the built-in families (``resnet``, ``efficientnet``, ``tiny``)."""
    return list(catalog()["families"])


def builtin_variants(family: str | None = None) -> list[Variant]:
    """The built-in variants as records (optionally one family)."""
    out = []
    for name, (fam_name, fam, v) in _entries().items():
        if family is not None and fam_name != family:
            continue
        out.append(
            Variant(
                name=name,
                family=fam_name,
                accuracy=v["accuracy"],
                accuracy_metric=fam["accuracy_metric"],
                accuracy_source=fam["accuracy_source"],
                params=v["params"],
                memory_mb=round(v["params"] * 4 / 2**20, 2),
                load_time_s=v["load_time_s"],
                source="builtin",
                input_shape=",".join(str(d) for d in v.get("input_shape", fam["input_shape"])),
            )
        )
    return out


def builtin_variant(name: str) -> Variant:
    """One built-in variant; NotFoundError lists the known names."""
    for v in builtin_variants():
        if v.name == name:
            return v
    raise NotFoundError(
        f"'{name}' is not a built-in variant",
        hint=f"built-in variants: {', '.join(_entries())}; or give --model-path module:callable",
    )


def ensure_builtin_variant(store: Store, name: str) -> Variant:
    """Upsert the catalog record of a built-in variant into ``store``; returns it."""
    variant = builtin_variant(name)
    store.upsert_variant(variant)
    return variant


# -- architectures ----------------------------------------------------------------------------
def _resnet(block: str, layers: list[int], num_classes: int = 1000) -> torch.nn.Module:
    from torch import nn

    def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
        return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin: int, planes: int, stride: int, down: nn.Module | None) -> None:
            super().__init__()
            self.conv1 = conv3x3(cin, planes, stride)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = down

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + idt)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, planes: int, stride: int, down: nn.Module | None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = conv3x3(planes, planes, stride)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = down

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + idt)

    blk: Any = BasicBlock if block == "basic" else Bottleneck

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            self.layer1 = self._layer(64, layers[0], 1)
            self.layer2 = self._layer(128, layers[1], 2)
            self.layer3 = self._layer(256, layers[2], 2)
            self.layer4 = self._layer(512, layers[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * blk.expansion, num_classes)

        def _layer(self, planes: int, n: int, stride: int) -> nn.Sequential:
            down = None
            if stride != 1 or self.inplanes != planes * blk.expansion:
                down = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * blk.expansion, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes * blk.expansion),
                )
            mods = [blk(self.inplanes, planes, stride, down)]
            self.inplanes = planes * blk.expansion
            mods += [blk(self.inplanes, planes, 1, None) for _ in range(1, n)]
            return nn.Sequential(*mods)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def _tiny(arch: dict[str, Any], shape: tuple[int, ...], num_classes: int = 10) -> torch.nn.Module:
    from torch import nn

    c, h, w = shape
    mods: list[nn.Module] = []
    if arch["kind"] == "mlp":
        width = c * h * w
        mods.append(nn.Flatten())
        for hidden in arch["hidden"]:
            mods += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        mods.append(nn.Linear(width, num_classes))
        return nn.Sequential(*mods)
    cin = c
    for cout in arch["channels"]:
        mods += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        cin, h, w = cout, h // 2, w // 2
    mods += [
        nn.Flatten(),
        nn.Linear(cin * h * w, arch["hidden"]),
        nn.ReLU(),
        nn.Linear(arch["hidden"], num_classes),
    ]
    return nn.Sequential(*mods)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round a scaled channel count to a multiple of ``divisor``, never more than 10 % down."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


# EfficientNet-B0's stages: (expand ratio, kernel, stride, in channels, out channels, repeats)
_EFFICIENTNET_STAGES = (
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
)


def _efficientnet(
    width: float,
    depth: float,
    dropout: float,
    *,
    bn_eps: float = 1e-5,
    num_classes: int = 1000,
) -> torch.nn.Module:
    """EfficientNet (Tan & Le 2019) in torchvision's layout (same parameter counts).

    Width ``width`` scales channels (rounded to multiples of 8), depth ``depth`` scales the
    repeats of each stage (``ceil``). MBConv blocks: 1x1 expansion, kxk depthwise,
    squeeze-excitation (a quarter of the block's input channels), 1x1 projection, residual
    when stride 1 and in == out. Stochastic depth is an identity at inference: left out.
    """
    from torch import nn

    def ch(c: int) -> int:
        return _make_divisible(c * width)

    def conv_bn(
        cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True
    ) -> nn.Sequential:
        mods: list[nn.Module] = [
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=bn_eps),
        ]
        if act:
            mods.append(nn.SiLU(inplace=True))
        return nn.Sequential(*mods)

    class SqueezeExcitation(nn.Module):
        def __init__(self, channels: int, squeeze: int) -> None:
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(channels, squeeze, 1)
            self.fc2 = nn.Conv2d(squeeze, channels, 1)
            self.act = nn.SiLU(inplace=True)
            self.gate = nn.Sigmoid()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = self.gate(self.fc2(self.act(self.fc1(self.avgpool(x)))))
            return x * s

    class MBConv(nn.Module):
        def __init__(self, expand: int, k: int, stride: int, cin: int, cout: int) -> None:
            super().__init__()
            self.use_res = stride == 1 and cin == cout
            hidden = _make_divisible(cin * expand)
            mods: list[nn.Module] = []
            if hidden != cin:
                mods.append(conv_bn(cin, hidden, 1))
            mods += [
                conv_bn(hidden, hidden, k, stride, groups=hidden),
                SqueezeExcitation(hidden, max(1, cin // 4)),
                conv_bn(hidden, cout, 1, act=False),
            ]
            self.block = nn.Sequential(*mods)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.block(x)
            return out + x if self.use_res else out

    class EfficientNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = [conv_bn(3, ch(_EFFICIENTNET_STAGES[0][3]), 3, 2)]
            for expand, k, stride, cin, cout, repeats in _EFFICIENTNET_STAGES:
                cin, cout = ch(cin), ch(cout)
                stage = []
                for i in range(math.ceil(repeats * depth)):
                    stage.append(MBConv(expand, k, stride if i == 0 else 1, cin, cout))
                    cin = cout
                layers.append(nn.Sequential(*stage))
            last_in = ch(_EFFICIENTNET_STAGES[-1][4])
            layers.append(conv_bn(last_in, 4 * last_in, 1))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(
                nn.Dropout(p=dropout, inplace=True), nn.Linear(4 * last_in, num_classes)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    return EfficientNet()


def build_builtin(name: str) -> torch.nn.Module:
    """A freshly initialised (random-weight) module of a built-in variant."""
    entries = _entries()
    if name not in entries:
        builtin_variant(name)  # raises NotFoundError with the known names
    family, fam, v = entries[name]
    arch = v["arch"]
    if family == "resnet":
        return _resnet(arch["block"], arch["layers"])
    if family == "efficientnet":
        return _efficientnet(
            arch["width"], arch["depth"], arch["dropout"], bn_eps=arch.get("bn_eps", 1e-5)
        )
    return _tiny(arch, tuple(v.get("input_shape", fam["input_shape"])))


# -- loading ----------------------------------------------------------------------------------
def parse_input_shape(text: str | None, *, option: str = "--input-shape") -> tuple[int, ...]:
    """``"3,224,224"`` -> ``(3, 224, 224)`` (per request, without the batch dimension)."""
    if not text:
        raise InputError(
            f"{option} is required for this model", hint=f"for example {option} 3,224,224"
        )
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise InputError(
            f"{option}: '{text}' is not a list of positive whole numbers",
            hint=f"for example {option} 3,224,224",
        )
    return tuple(int(p) for p in parts)


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, on its device, with an example-input factory."""

    variant: Variant
    module: Any  # torch.nn.Module or torch.jit.ScriptModule
    input_shape: tuple[int, ...]
    device: str = "cpu"
    load_time_s: float | None = None

    def example(self, batch: int) -> torch.Tensor:
        """A random input batch of ``batch`` requests on the model's device."""
        import torch

        gen = torch.Generator().manual_seed(0)
        return torch.rand((batch, *self.input_shape), generator=gen).to(self.device)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """One forward pass under ``torch.inference_mode``; waits for the GPU to finish."""
        import torch

        with torch.inference_mode():
            out = self.module(x)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        return out  # type: ignore[no-any-return]


@dataclass
class OnnxModel(LoadedModel):
    """An ONNX Runtime session as a loaded model: numpy arrays in and out; ``module`` holds
    the graph's weights (``parameters()``), as a torch module's would."""

    session: Any = None
    input_name: str = "input"
    numpy_native: ClassVar[bool] = True
    platform: ClassVar[str] = PLATFORM

    def example(self, batch: int) -> Any:
        """A random float32 input batch of ``batch`` requests (seeded: the same every call)."""
        import numpy as np

        rng = np.random.default_rng(0)
        return rng.random((batch, *self.input_shape), dtype=np.float32)

    def run(self, x: Any) -> Any:
        """One batch through the session; its first output, on the host."""
        import numpy as np

        if hasattr(x, "detach"):
            x = x.detach().to("cpu").numpy()
        arr = np.ascontiguousarray(x, dtype=np.float32)
        return np.asarray(self.session.run(None, {self.input_name: arr})[0])


def load_onnx(variant: Variant, shape: tuple[int, ...], *, device: str = "cpu") -> OnnxModel:
    """``variant``'s ONNX file in an ONNX Runtime session on ``device``.

    Raises:
        InputError: the file is missing (names the variant and how to regenerate it) or
            cannot be loaded.
        HardwareError: a CUDA device without CUDA support in onnxruntime.
    """
    t0 = time.perf_counter()
    session, input_name, weights = open_session(variant, device=device)
    loaded = OnnxModel(variant, weights, shape, device, session=session, input_name=input_name)
    loaded.load_time_s = time.perf_counter() - t0
    return loaded


def import_callable(spec: str, *, option: str = "--model-path") -> Any:
    """The callable ``module:attr`` names, imported from the user's folder (see
    :func:`~greenctl.profiler.user_code.import_user_module`).

    Raises:
        InputError: not ``module:callable``, the module cannot be imported (or raised while
            importing), it has no such attribute, or the attribute is not callable; the
            message names ``option``.
    """
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise InputError(
            f"{option} '{spec}' is not module:callable",
            hint=f"for example {option} mypkg.models:build",
        )
    try:
        # a module in the folder greenctl runs in (a daemon's caller's, given explicitly)
        mod = import_user_module(mod_name)
    except ImportError as exc:
        raise InputError(
            f"{option}: cannot import module '{mod_name}': {exc}",
            hint="run greenctl from the folder holding the module, or install it",
        ) from None
    except Exception as exc:  # the user's module failed while importing (SyntaxError, ...)
        raise InputError(
            f"{option}: importing module '{mod_name}' failed: {one_line_error(exc)}",
            hint=f"fix the module so that `python -c 'import {mod_name}'` works",
        ) from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{option}: module '{mod_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(f"{option}: '{spec}' is not callable")
    return obj


def one_line_error(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception from the user's code."""
    detail = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def user_model_source(path: str, *, weights: str | None = None) -> str:
    """The ``Variant.source`` for a ``--model-path`` value (TorchScript file or module:callable)."""
    p = Path(path)
    if p.suffix in (".pt", ".pts", ".ts", ".torchscript", ".jit") or p.is_file():
        if not p.is_file():
            raise InputError(f"TorchScript file '{path}' does not exist")
        if weights:
            raise InputError("--weights applies to module:callable models, not TorchScript files")
        return f"torchscript:{p.resolve()}"
    import_callable(path)  # fail early with a clear message
    if weights:
        if not Path(weights).is_file():
            raise InputError(f"weights file '{weights}' does not exist")
        return f"module:{path};weights={Path(weights).resolve()}"
    return f"module:{path}"


#: precisions a torch variant may run in (``;dtype=NAME`` of its source), by their names
DTYPES = ("float16", "bfloat16")


def source_options(source: str) -> tuple[str, dict[str, str]]:
    """``module:m:f;weights=W;dtype=float16`` -> (``module:m:f``, {weights: W, dtype: ...})."""
    head, *parts = source.split(";")
    opts = {}
    for part in parts:
        key, _, value = part.partition("=")
        opts[key.strip()] = value
    return head, opts


def with_dtype(source: str, dtype: str) -> str:
    """``source`` run in precision ``dtype`` (one of :data:`DTYPES`)."""
    return f"{source};dtype={dtype}"


def model_file(variant: Variant) -> str | None:
    """The file a variant runs: its ONNX or TorchScript file, else its weights file; None
    for built-in variants and models without one."""
    head, opts = source_options(variant.source or "builtin")
    for prefix in ("onnx:", "torchscript:"):
        if head.startswith(prefix):
            return head.removeprefix(prefix)
    return opts.get("weights")


def check_model_file(variant: Variant) -> None:
    """Refuse a variant whose ONNX or TorchScript file is gone, before anything starts it.

    Raises:
        InputError: names the variant, the file and how to make it again.
    """
    if onnx_path(variant.source) is not None:
        require_file(variant)
        return
    head, _opts = source_options(variant.source or "builtin")
    path = head.removeprefix("torchscript:")
    if head.startswith("torchscript:") and not Path(path).is_file():
        raise InputError(
            f"variant '{variant.name}' runs the TorchScript file {path}, which does not exist",
            hint="restore the file, or profile the model again from where it now is "
            "(greenctl profile --model-path FILE)",
        )


def build_module(variant: Variant) -> Any:
    """The torch module of a built-in, ``module:`` or ``torchscript:`` variant (on the CPU,
    in its ``;dtype=`` precision).

    Raises:
        InputError: the model cannot be built or loaded (names which and why).
    """
    head, opts = source_options(variant.source or "builtin")
    module = _build(variant.name, head, opts.get("weights"))
    dtype = opts.get("dtype")
    if dtype is None:
        return module
    if dtype not in DTYPES:
        raise InputError(
            f"variant '{variant.name}': dtype '{dtype}' is not one of {', '.join(DTYPES)}"
        )
    return _in_precision(module, dtype)


def _in_precision(module: Any, dtype: str) -> Any:
    """``module`` with weights in ``dtype``, taking and answering float32 (as requests do)."""
    import torch

    kind = getattr(torch, dtype)

    class InPrecision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module.to(kind)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.inner(x.to(kind))
            if isinstance(out, list | tuple):
                out = out[0]
            return out.float()  # type: ignore[no-any-return]

    return InPrecision()


def _build(name: str, src: str, weights: str | None) -> Any:
    import torch

    if src == "builtin":
        return build_builtin(name)
    if src.startswith("torchscript:"):
        path = src.removeprefix("torchscript:")
        try:
            return torch.jit.load(path, map_location="cpu")
        except (RuntimeError, ValueError, OSError) as exc:
            raise InputError(
                f"cannot load TorchScript file '{path}': {str(exc).splitlines()[0]}",
                hint="save it with torch.jit.script(model).save(PATH) or torch.jit.trace",
            ) from None
    if src.startswith("module:"):
        spec = src.removeprefix("module:")
        builder = import_callable(spec)
        try:
            module = builder()
        except Exception as exc:  # the user's code: any error is theirs to fix
            raise InputError(
                f"calling '{spec}' to build the model failed: {one_line_error(exc)}",
                hint="the callable must take no arguments and return a torch nn.Module",
            ) from None
        if not isinstance(module, torch.nn.Module):
            raise InputError(f"'{spec}' returned {type(module).__name__}, not a torch nn.Module")
        if weights is not None:
            try:
                state = torch.load(weights, map_location="cpu", weights_only=True)
                module.load_state_dict(state)
            except (RuntimeError, OSError, ValueError, pickle.UnpicklingError) as exc:
                raise InputError(
                    f"cannot load weights '{weights}': {str(exc).splitlines()[0]}",
                    hint="save a state dict with torch.save(model.state_dict(), PATH)",
                ) from None
        return module
    raise InputError(
        f"variant '{name}' has source '{src}', which greenctl cannot load",
        hint="imported variants have no model; profile a built-in or --model-path model",
    )


def load_model(variant: Variant, *, device: str = "cpu") -> LoadedModel:
    """Build or load ``variant``'s model in eval mode on ``device``: a torch module, or an
    ONNX Runtime session for an ``onnx:`` source (same ``example()``/``run()`` interface).

    Raises:
        InputError: the model cannot be built/loaded (message says which and why).
        HardwareError: ``device`` is a CUDA device but torch (or onnxruntime) has no CUDA.
    """
    import torch

    shape = parse_input_shape(variant.input_shape, option="input_shape")
    if onnx_path(variant.source) is not None:
        return load_onnx(variant, shape, device=device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HardwareError(
            f"cannot use {device}: this torch build has no CUDA or no GPU is visible",
            hint="install a CUDA build of torch (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu124)",
        )
    t0 = time.perf_counter()
    module = build_module(variant).eval().to(device)
    loaded = LoadedModel(variant, module, shape, device)
    loaded.load_time_s = time.perf_counter() - t0
    return loaded


def user_variant(
    model_path: str,
    *,
    input_shape: str | None,
    accuracy: float | None = None,
    name: str | None = None,
    family: str | None = None,
    weights: str | None = None,
    accuracy_metric: str | None = None,
) -> Variant:
    """A variant record for the user's model (``--model-path``), validated before measuring.

    Raises:
        InputError: missing/invalid input shape or accuracy, unimportable module, missing file.
    """
    shape = parse_input_shape(input_shape)
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise InputError(
            f"--accuracy {accuracy}: give a fraction between 0 and 1",
            hint="for example --accuracy 0.76 for 76 %",
        )
    source = user_model_source(model_path, weights=weights)
    if not name:
        if source.startswith("torchscript:"):
            name = Path(model_path).stem
        else:
            name = model_path.partition(":")[2].rsplit(".", 1)[-1]
    builtin = {v.name for v in builtin_variants()}
    if name in builtin:
        raise InputError(
            f"--name {name} is a built-in variant", hint="choose another --name for your model"
        )
    return Variant(
        name=name,
        family=family or "custom",
        accuracy=accuracy,
        accuracy_metric=accuracy_metric if accuracy is not None else None,
        accuracy_source="given by the user (--accuracy)" if accuracy is not None else None,
        source=source,
        input_shape=",".join(map(str, shape)),
    )

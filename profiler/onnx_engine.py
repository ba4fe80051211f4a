"""ONNX Runtime as an engine: export a torch model, quantize it, open a session on it.

A variant whose source is ``onnx:PATH`` loads (:func:`greenctl.profiler.models.load_model`)
as an ``OnnxModel``: a ``LoadedModel`` that runs the session opened here on numpy arrays
(``numpy_native``), so the profiler's harness and the executor daemons run it as they run
any variant. CPUExecutionProvider always; CUDAExecutionProvider for a ``cuda`` device
when the installed onnxruntime has it. onnxruntime and torch are imported inside functions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import HardwareError, InputError
from greenctl.data.records import Variant

if TYPE_CHECKING:  # numpy loads with the engine, not with `greenctl --help`
    import numpy as np

#: the prefix of an ONNX variant's source (``onnx:/path/to/sha.onnx``)
ONNX_PREFIX = "onnx:"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
#: the ONNX opset exports target (ONNX Runtime 1.16+ runs it)
OPSET = 17
#: OIP's ``platform`` of a model ONNX Runtime serves (Triton's name for it)
PLATFORM = "onnxruntime_onnx"


@dataclass
class _Weights:
    """One initializer's element count, shaped like a torch parameter for ``numel()``."""

    count: int

    def numel(self) -> int:
        return self.count


@dataclass
class OnnxGraph:
    """The loaded graph's weights, standing where a torch model's module would
    (``parameters()`` lets the profiler count them as it counts a module's)."""

    weights: list[_Weights] = field(default_factory=list)

    def parameters(self) -> Iterator[_Weights]:
        return iter(self.weights)


def onnx_path(source: str | None) -> Path | None:
    """The file of an ``onnx:PATH`` source; None for any other source."""
    if not source or not source.startswith(ONNX_PREFIX):
        return None
    return Path(source.removeprefix(ONNX_PREFIX))


def _threads() -> int:
    """Threads for a session: torch's pool size as the caller set it (the profiler's CPU
    slice, the executor's pinned cores), else the cores this process may use."""
    try:
        import torch

        return max(1, int(torch.get_num_threads()))
    except ImportError:
        return max(1, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else 1


def _providers(device: str) -> list[Any]:
    """ONNX Runtime's providers for ``device``.

    Raises:
        HardwareError: a CUDA device, but this onnxruntime has no CUDAExecutionProvider.
    """
    import onnxruntime as ort

    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise HardwareError(
            f"cannot run an ONNX variant on {device}: this onnxruntime has no "
            "CUDAExecutionProvider",
            hint="pip install onnxruntime-gpu (in place of onnxruntime), or run it on CPUs",
        )
    index = int(device.partition(":")[2] or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def require_file(variant: Variant) -> Path:
    """The ONNX file an ``onnx:`` variant runs, which must exist.

    Raises:
        InputError: it is gone; names the variant, the file and how to make it again.
    """
    path = onnx_path(variant.source)
    assert path is not None
    if not path.is_file():
        raise InputError(
            f"variant '{variant.name}' runs the file {path}, which does not exist",
            hint=f"generate the variants of family '{variant.family}' again: greenctl variants "
            f"generate --name {variant.family} --model-path ... --input-shape ... --eval ...",
        )
    return path


def open_session(variant: Variant, *, device: str = "cpu") -> tuple[Any, str, OnnxGraph]:
    """Open ``variant``'s ONNX file in an ONNX Runtime session on ``device``; returns the
    session, its input's name and the graph's weights.

    Raises:
        InputError: the file is missing (names the variant and how to regenerate it) or is
            not a model ONNX Runtime can load.
        HardwareError: a CUDA device without CUDA support in onnxruntime.
    """
    import onnxruntime as ort

    path = require_file(variant)
    options = ort.SessionOptions()
    options.intra_op_num_threads = _threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: no optimiser warnings on the daemon's stderr
    try:
        session = ort.InferenceSession(str(path), options, providers=_providers(device))
    except HardwareError:
        raise
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InputError(
            f"ONNX Runtime cannot load {path} (variant '{variant.name}'): {detail}",
            hint="generate the variant again with greenctl variants generate",
        ) from None
    return session, session.get_inputs()[0].name, OnnxGraph(_initializer_sizes(path))


def _initializer_sizes(path: Path) -> list[_Weights]:
    """The element count of each weight (initializer) of the graph at ``path``."""
    import numpy as np
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [_Weights(int(np.prod(t.dims, dtype=np.int64))) for t in graph.initializer]


def export_onnx(module: Any, input_shape: tuple[int, ...], path: Path) -> None:
    """Export a torch module (eager or TorchScript) to ONNX at ``path``, batch axis dynamic.

    Uses the TorchScript-based exporter (``dynamo=False``): it needs no onnxscript.
    Exceptions are the exporter's (an operator ONNX has no counterpart for, ...).
    """
    import torch

    example = torch.rand((1, *input_shape))
    with _quiet(), torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            module,
            (example,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


def quantize_int8(src: Path, dst: Path, calibration: Iterable[np.ndarray]) -> None:
    """Static int8 quantization (QDQ: int8 weights, uint8 activations) of the ONNX model at
    ``src`` into ``dst``, its activation ranges calibrated on ``calibration`` batches.

    Static rather than dynamic: dynamic quantization computes activation ranges at run time
    for every batch, and ONNX Runtime's CPU ConvInteger kernels ran a small CNN slower than
    fp32; QDQ lets the graph run fused int8 kernels.
    """
    import numpy as np
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    batches = iter(calibration)

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def get_next(self) -> dict[str, np.ndarray] | None:
            arr = next(batches, None)
            if arr is None:
                return None
            return {INPUT_NAME: np.ascontiguousarray(arr, dtype=np.float32)}

    with _quiet():
        quantize_static(
            str(src),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
        )


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporter's and quantizer's advice on the root logger and warnings (a
    command prints its own outcome; their advice is for their developers)."""
    import warnings

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def onnxruntime_available() -> bool:
    """Whether onnxruntime (and onnx, which export writes with) can be imported here."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def onnxruntime_cuda() -> bool:
    """Whether the installed onnxruntime has the CUDAExecutionProvider."""
    if not onnxruntime_available():
        return False
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()

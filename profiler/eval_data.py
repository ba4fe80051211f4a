"""The user's evaluation data and accuracy metric (``--eval MOD:eval``, ``--metric MOD:fn``).

``MOD:eval`` is called with no arguments and returns an iterable of ``(inputs, labels)``
batches (torch tensors, numpy arrays or nested lists); :func:`load_eval` reads them once into
float32 input arrays, checked against the variant's input shape. :func:`accuracy` runs a loaded
variant over them: the share of ``argmax(outputs) == labels``, or the user's metric over all
outputs and labels. Every fault of the user's data is an ``InputError`` naming the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InputError, shown
from greenctl.profiler.models import import_callable, one_line_error

if TYPE_CHECKING:
    import numpy as np

#: the most evaluation samples read (a bound on memory and on each variant's evaluation time)
MAX_EVAL_SAMPLES = 100_000


@dataclass
class EvalData:
    """Evaluation batches: float32 inputs and their labels, as the user's function gave them."""

    spec: str
    inputs: list[np.ndarray]
    labels: list[np.ndarray]

    @property
    def samples(self) -> int:
        return sum(int(x.shape[0]) for x in self.inputs)


def _array(value: Any) -> np.ndarray:
    """A tensor, array or nested list as a numpy array (tensors copied to the host)."""
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().to("cpu")
        if str(value.dtype) in ("torch.bfloat16", "torch.float16"):
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def load_eval(spec: str, input_shape: tuple[int, ...]) -> EvalData:
    """Call ``MOD:eval`` and read its batches, each checked against ``input_shape``.

    Raises:
        InputError: the function cannot be imported or raises; it returns no iterable, a
            batch that is not an ``(inputs, labels)`` pair, inputs that are not numbers of
            shape ``(batch, *input_shape)``, labels that are not one per input, no batch, or
            more than :data:`MAX_EVAL_SAMPLES` samples.
    """
    import numpy as np

    fn = import_callable(spec, option="--eval")
    shape_text = ",".join(map(str, input_shape))
    try:
        batches = iter(fn())
    except TypeError as exc:
        raise InputError(
            f"--eval {spec} returned no iterable of (inputs, labels) batches: "
            f"{one_line_error(exc)}",
            hint="return a list (or generator) of (inputs, labels) pairs",
        ) from None
    except Exception as exc:  # the user's code
        raise InputError(f"calling --eval {spec} failed: {one_line_error(exc)}") from None
    inputs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    n = 0
    while True:
        where = f"--eval {spec}: batch {len(inputs) + 1}"
        try:
            item = next(batches)
        except StopIteration:
            break
        except Exception as exc:  # the user's generator
            raise InputError(f"{where} failed: {one_line_error(exc)}") from None
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise InputError(
                f"{where} is {shown(type(item).__name__)}, not an (inputs, labels) pair",
                hint="yield pairs such as (torch.rand(8, 3, 32, 32), torch.tensor([...]))",
            )
        try:
            x = _array(item[0]).astype(np.float32)
            y = _array(item[1])
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: not numbers: {one_line_error(exc)}") from None
        if x.ndim != len(input_shape) + 1 or tuple(x.shape[1:]) != input_shape:
            raise InputError(
                f"{where}: inputs of shape {tuple(x.shape)} do not match --input-shape "
                f"{shape_text} (expected (batch, {shape_text}))",
                hint="give --input-shape as one request's shape, and batches with the batch "
                "dimension first",
            )
        if y.ndim < 1 or y.shape[0] != x.shape[0]:
            raise InputError(
                f"{where}: {x.shape[0]} inputs but labels of shape {tuple(y.shape)}",
                hint="give one label per input (labels of shape (batch,))",
            )
        n += int(x.shape[0])
        if n > MAX_EVAL_SAMPLES:
            raise InputError(
                f"--eval {spec}: more than {MAX_EVAL_SAMPLES:,} samples",
                hint="evaluate on a held-out sample of at most that many",
            )
        inputs.append(np.ascontiguousarray(x))
        labels.append(y)
    if not inputs or n == 0:
        raise InputError(f"--eval {spec} gave no samples", hint="return at least one batch")
    return EvalData(spec, inputs, labels)


def outputs_of(loaded: Any, data: EvalData) -> list[np.ndarray]:
    """The loaded variant's outputs for every evaluation batch, on the host as float arrays
    (run as the executors run a batch: :func:`greenctl.profiler.runner.run_eager`)."""
    from greenctl.profiler.runner import run_eager

    numpy_native = bool(getattr(loaded, "numpy_native", False))
    return [_array(run_eager(loaded, x, numpy_native=numpy_native)) for x in data.inputs]


def check_labels(outputs: list[np.ndarray], data: EvalData) -> None:
    """Refuse data the argmax accuracy cannot score: outputs that are not (batch, classes),
    labels that are not whole numbers of those classes.

    Raises:
        InputError: names the batch, the shapes or the label out of range.
    """
    import numpy as np

    for k, (out, y) in enumerate(zip(outputs, data.labels, strict=True), start=1):
        where = f"--eval {data.spec}: batch {k}"
        if out.ndim != 2:
            raise InputError(
                f"{where}: the model's outputs have shape {tuple(out.shape)}; the argmax "
                "accuracy needs (batch, classes)",
                hint="give --metric MOD:fn(outputs, labels) -> float for other outputs",
            )
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.number):
            raise InputError(
                f"{where}: labels of shape {tuple(y.shape)} and type {y.dtype}: the argmax "
                "accuracy needs one class number per input",
                hint="give labels of shape (batch,), or --metric MOD:fn for other labels",
            )
        classes = int(out.shape[1])
        bad = (y < 0) | (y >= classes) | (y != np.round(y))
        if bad.any():
            label = y[bad][0]
            raise InputError(
                f"{where}: label {shown(label.item())} is not a class of the model's {classes} "
                f"outputs (0 to {classes - 1})",
                hint="labels are class indices; check the evaluation data matches the model",
            )


def metric_function(spec: str | None) -> Callable[[Any, Any], Any] | None:
    """The user's ``--metric MOD:fn``; None without one.

    Raises:
        InputError: the function cannot be imported.
    """
    return None if spec is None else import_callable(spec, option="--metric")


def accuracy(
    outputs: list[np.ndarray], data: EvalData, metric: Callable[[Any, Any], Any] | None = None
) -> float:
    """The share of ``argmax(outputs) == labels`` over all batches, or ``metric(outputs,
    labels)`` on all of them at once (concatenated).

    Raises:
        InputError: the metric raises or answers something other than a number in [0, 1].
    """
    import numpy as np

    if metric is None:
        pairs = zip(outputs, data.labels, strict=True)
        hits = sum(int((out.argmax(axis=1) == y).sum()) for out, y in pairs)
        return hits / data.samples
    try:
        value = metric(np.concatenate(outputs), np.concatenate(data.labels))
        score = float(value)
    except Exception as exc:  # the user's code (TypeError: not a number)
        raise InputError(f"--metric failed: {one_line_error(exc)}") from None
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise InputError(
            f"--metric answered {shown(value)}: an accuracy is a number from 0 to 1",
            hint="return the share of correct answers, e.g. 0.76",
        )
    return score

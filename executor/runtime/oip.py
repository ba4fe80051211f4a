"""Open Inference Protocol (KServe v2 REST) tensors: JSON and Triton's binary extension.

Requests and responses are JSON objects (``{"inputs": [{name, shape, datatype, data}]}``,
``{"model_name", "outputs": [...]}``); with the binary tensor data extension the JSON is
followed by raw little-endian tensor bytes, its length given in the
``Inference-Header-Content-Length`` header and each tensor's size in
``parameters.binary_data_size``. That is what tritonclient's HTTP client sends by default.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InputError, shown

if TYPE_CHECKING:  # numpy loads with the first tensor: `greenctl status` needs none
    import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
#: greenctl's executors answer with their own timing of a request (ms): time queued for a
#: batch to start, and the run time of the batch it rode in; the dispatcher passes them on.
QUEUE_MS_HEADER = "Greenctl-Queue-Ms"
INFER_MS_HEADER = "Greenctl-Infer-Ms"
#: rows of the batch the request ran in (what dynamic batching achieved)
BATCH_ROWS_HEADER = "Greenctl-Batch-Rows"
TIMING_HEADERS = (QUEUE_MS_HEADER, INFER_MS_HEADER, BATCH_ROWS_HEADER)
#: the gateway a request enters by, which a geo router routes on (``greenctl.executor.deploy.georouter``)
GATEWAY_HEADER = "Greenctl-Gateway"

DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
_NAME_TO_OIP = {v: k for k, v in DTYPES.items()}


def oip_datatype(arr: np.ndarray) -> str:
    """The OIP datatype name of a numpy array (``float32`` -> ``FP32``)."""
    key = arr.dtype.name  # either byte order
    if key not in _NAME_TO_OIP:
        raise InputError(f"tensor dtype {arr.dtype} has no Open Inference Protocol datatype")
    return _NAME_TO_OIP[key]


#: the most dimensions a tensor may have (numpy's portable limit)
MAX_DIMS = 32


class TensorTooLarge(InputError):
    """A tensor with more elements than the server takes in one request."""

    def __init__(self, message: str, *, shape: list[int], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.shape = shape


def _load_json(text: bytes | str, what: str) -> Any:
    """``json.loads`` whose every failure is an :class:`InputError` (deep nesting included)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InputError(f"{what} is nested too deeply") from None
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise InputError(f"{what} is not valid JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _whole(value: Any) -> bool:
    """A JSON whole number (``true`` is an int to Python, not to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value: Any, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object, ``{}`` when absent or null."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{what} must be an object")
    return value


def _check_head(doc: Any) -> None:
    """The request's fields other than the input tensors: types a handler relies on."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise InputError("request needs a non-empty 'inputs' list")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str) and not _whole(rid):
        raise InputError("'id' must be a string")
    _object(doc.get("parameters"), "'parameters'")
    outputs = doc.get("outputs")
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise InputError("'outputs' must be a list")
    for i, out in enumerate(outputs):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise InputError(f"outputs[{i}] must be an object with a string 'name'")
        _object(out.get("parameters"), f"outputs[{i}].parameters")


def _has_bool(data: list[Any]) -> bool:
    """Whether nested lists hold a JSON ``true``/``false`` (numpy reads them as 1 and 0)."""
    stack = [data]
    while stack:
        for v in stack.pop():
            if v is True or v is False:
                return True
            if isinstance(v, list):
                stack.append(v)
    return False


def _json_tensor(data: Any, dtype_name: str, label: str, bools: bool) -> np.ndarray:
    """The flat array of a JSON tensor's ``data``, refusing values its datatype cannot hold:
    strings, nulls, booleans for a number type (``bools``: the JSON names ``true`` or
    ``false`` somewhere) or numbers for ``BOOL``, fractions for a whole type, numbers out of
    range (JSON's ``1e400`` parses as infinity). ``label`` names the input in messages."""
    import numpy as np

    if not isinstance(data, list):
        raise InputError(f"{label}.data must be a list of {dtype_name} values")
    try:
        raw = np.asarray(data).reshape(-1)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InputError(f"{label}.data: {exc}") from None
    target = np.dtype(DTYPES[dtype_name])
    if raw.size and target.kind == "b" and raw.dtype.kind != "b":
        raise InputError(
            f"{label}.data holds values that are not BOOL", hint="BOOL data are true or false"
        )
    if raw.size and target.kind != "b" and (raw.dtype.kind == "b" or (bools and _has_bool(data))):
        raise InputError(f"{label}.data holds true/false, which are not {dtype_name} numbers")
    if raw.size and raw.dtype.kind not in "biuf":
        raise InputError(
            f"{label}.data holds values that are not {dtype_name} numbers "
            "(strings, nulls, objects, or whole numbers too large)"
        )
    bad = ""
    with np.errstate(all="ignore"):
        if target.kind in "iu" and raw.size:
            if raw.dtype.kind == "f":
                if not bool(np.all(np.isfinite(raw))):
                    bad = f"values out of range for {dtype_name}"
                elif not bool(np.all(raw == np.floor(raw))):
                    bad = (
                        f"values out of range for {dtype_name} (fractions: it holds whole numbers)"
                    )
            if not bad:
                info = np.iinfo(target)
                if raw.min() < info.min or raw.max() > info.max:
                    bad = f"values out of range for {dtype_name}"
        arr = raw.astype(target)
        if target.kind == "f" and arr.size and not bool(np.all(np.isfinite(arr))):
            bad = f"values out of range for {dtype_name}"
    if bad:
        raise InputError(f"{label}.data holds {bad}")
    return arr


def _input_spec(
    item: Any, i: int, max_elements: int | None, limit_hint: str | None
) -> tuple[str, str, list[int], int]:
    """An input's name, datatype and shape, checked, and its number of elements.

    Raises:
        InputError: a field is missing or malformed; :class:`TensorTooLarge` when the
            shape holds more than ``max_elements``.
    """
    if not isinstance(item, dict):
        raise InputError(f"inputs[{i}] must be an object")
    name = item.get("name")
    dtype_name = item.get("datatype")
    shape = item.get("shape")
    if not isinstance(name, str):
        raise InputError(f"inputs[{i}] needs a string 'name'")
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise InputError(
            f"inputs[{i}].datatype {shown(dtype_name)} is not supported",
            hint=f"use one of {', '.join(DTYPES)}",
        )
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(_whole(d) and d >= 0 for d in shape)
    ):
        raise InputError(
            f"inputs[{i}].shape must be a list of at most {MAX_DIMS} whole numbers >= 0"
        )
    count = math.prod(shape)
    if max_elements is not None and count > max_elements:
        raise TensorTooLarge(
            f"inputs[{i}]: shape {shape} has {count} elements, over the limit of "
            f"{max_elements} per request",
            shape=shape,
            hint=limit_hint,
        )
    return name, dtype_name, shape, count


def _input_tensor(
    item: Any,
    i: int,
    blob: memoryview,
    offset: int,
    *,
    max_elements: int | None,
    limit_hint: str | None,
    bools: bool = True,
) -> tuple[str, np.ndarray, int]:
    """One input of a request: its name, its array in its shape, and how many bytes of the
    binary part (from ``offset``) it took.

    Raises:
        InputError: the input is malformed (see :func:`decode_request`).
    """
    import numpy as np

    name, dtype_name, shape, count = _input_spec(item, i, max_elements, limit_hint)
    dtype = np.dtype(DTYPES[dtype_name]).newbyteorder("<")
    size = _object(item.get("parameters"), f"inputs[{i}].parameters").get("binary_data_size")
    used = 0
    if size is not None:
        need = count * dtype.itemsize
        if not _whole(size) or size != need:
            raise InputError(
                f"inputs[{i}].parameters.binary_data_size {shown(size)} does not match shape "
                f"{shape} of {dtype_name} ({need} bytes)"
            )
        if offset + need > len(blob):
            raise InputError(
                f"inputs[{i}]: {max(0, len(blob) - offset)} binary bytes left, shape "
                f"{shape} of {dtype_name} needs {need}"
            )
        arr = np.frombuffer(blob[offset : offset + need], dtype=dtype)
        used = need
        if not arr.dtype.isnative:  # big-endian hosts only: a native copy
            arr = arr.astype(dtype.newbyteorder("="))
        # else a read-only view of the request body: the runner copies it into its batch
    else:
        data = item.get("data")
        if data is None:
            raise InputError(f"inputs[{i}] has neither 'data' nor binary_data_size")
        label = f"inputs[{i}] '{shown(name)}'"
        arr = _json_tensor(data, dtype_name, label, bools)
        if arr.size != count:
            raise InputError(
                f"{label}: {arr.size} values do not fill shape {shape} of {dtype_name}",
                hint="data holds the tensor flattened in row-major order",
            )
    try:
        arr = arr.reshape(shape)
    except (ValueError, OverflowError) as exc:  # e.g. [0, 2**70]: no elements, no array
        raise InputError(f"inputs[{i}].shape {shape}: {exc}") from None
    return name, arr, used


def header_length(text: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header as a byte count (None when absent).

    Raises:
        InputError: the header is not a plain decimal count.
    """
    if text is None:
        return None
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise InputError(f"{HEADER_LENGTH} {shown(text)} is not a byte count")
    return int(digits)


def decode_request(
    body: bytes,
    header_length: int | None = None,
    *,
    max_elements: int | None = None,
    limit_hint: str | None = None,
) -> tuple[dict[str, Any], list[tuple[str, np.ndarray]]]:
    """Parse an inference request (``body``; ``header_length``: the binary tensor extension's
    ``Inference-Header-Content-Length``) into its JSON header and named numpy inputs.
    ``max_elements`` refuses a tensor with more elements before any data is converted
    (``limit_hint`` says where the limit comes from).

    Raises:
        InputError: the request is malformed (a server answers 400): the JSON, a field's
            type, a shape not of whole numbers, data not filling the shape with in-range values
            of its datatype (``true``/``false`` for ``BOOL`` only, whole numbers for integer
            types), or binary parts whose ``binary_data_size`` is not exactly what the shape
            needs or that do not fill the bytes after the header. Its subclass
            :class:`TensorTooLarge`: a tensor over ``max_elements``."""
    # views, not copies: a 224x224 image is 600 KB, and every copy of it is CPU per request
    view = memoryview(body)
    if header_length is not None:
        if not 0 < header_length <= len(body):
            raise InputError(
                f"{HEADER_LENGTH} {header_length} is not within the body's {len(body)} bytes"
            )
        head_bytes, blob = bytes(view[:header_length]), view[header_length:]
    else:
        head_bytes, blob = body, memoryview(b"")
    doc = _load_json(head_bytes, "request body" if header_length is None else "request header")
    _check_head(doc)
    tensors: list[tuple[str, np.ndarray]] = []
    offset = 0
    bools = b"true" in head_bytes or b"false" in head_bytes  # a scan for them only then
    for i, item in enumerate(doc["inputs"]):
        name, arr, used = _input_tensor(
            item, i, blob, offset, max_elements=max_elements, limit_hint=limit_hint, bools=bools
        )
        offset += used
        tensors.append((name, arr))
    if offset != len(blob):
        raise InputError(
            f"{len(blob) - offset} bytes after the JSON header belong to no input "
            "(binary_data_size of each binary input must add up to them)"
        )
    return doc, tensors


def wants_binary(doc: dict[str, Any], name: str) -> bool:
    """Whether the request asked for output ``name`` as binary data."""
    for out in doc.get("outputs") or []:
        if isinstance(out, dict) and out.get("name") == name:
            return bool((out.get("parameters") or {}).get("binary_data", False))
    return bool((doc.get("parameters") or {}).get("binary_data_output", False))


def encode_response(
    model_name: str,
    outputs: list[tuple[str, np.ndarray]],
    *,
    request: dict[str, Any] | None = None,
    model_version: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Build an inference response body and its extra headers."""
    import numpy as np

    request = request or {}
    wanted = {o.get("name") for o in request.get("outputs") or [] if isinstance(o, dict)}
    doc: dict[str, Any] = {"model_name": model_name}
    if model_version:
        doc["model_version"] = model_version
    if request.get("id") is not None:
        doc["id"] = request["id"]
    blobs: list[bytes] = []
    out_docs = []
    for name, arr in outputs:
        if wanted and name not in wanted:
            continue
        entry: dict[str, Any] = {
            "name": name,
            "datatype": oip_datatype(arr),
            "shape": list(arr.shape),
        }
        if wants_binary(request, name):
            raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        out_docs.append(entry)
    doc["outputs"] = out_docs
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(head)),
    }


def encode_request(
    inputs: list[tuple[str, np.ndarray]],
    *,
    binary: bool = False,
    binary_outputs: bool = False,
    request_id: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Build an inference request (what an OIP client sends)."""
    import numpy as np

    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    items = []
    blobs = []
    for name, arr in inputs:
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(arr.shape),
            "datatype": oip_datatype(arr),
        }
        if binary:
            raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        items.append(entry)
    doc["inputs"] = items
    if binary_outputs:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not binary:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(head)),
    }


def decode_response(body: bytes, header_length: int | None = None) -> dict[str, np.ndarray]:
    """Parse an inference response into named numpy outputs.

    Raises:
        InputError: the response is an OIP error object or malformed.
    """
    head = body if header_length is None else body[:header_length]
    blob = b"" if header_length is None else body[header_length:]
    try:
        doc = json.loads(head)
    except ValueError as exc:
        raise InputError(f"response is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "error" in doc:
        raise InputError(f"inference failed: {doc.get('error') if isinstance(doc, dict) else doc}")
    doc["inputs"] = doc.pop("outputs", [])
    new_head = json.dumps(doc).encode()
    _, tensors = decode_request(new_head + blob, None if header_length is None else len(new_head))
    return dict(tensors)


def add_protocol_routes(
    router: Any, *, server_meta: Any, live: Any, ready: Any, model_meta: Any, model_ready: Any,
    infer: Any, metrics: Any,
) -> None:  # fmt: skip
    """Register the KServe v2 REST endpoints (and ``/metrics``) on a router.

    ``router`` has aiohttp's ``add_get``/``add_post`` (greenctl's own servers use
    :class:`greenctl.executor.runtime.httpserver.Router`).

    The executor daemon and the dispatcher speak the same protocol; this keeps their
    endpoint tables identical.
    """
    router.add_get("/v2", server_meta)
    router.add_get("/v2/health/live", live)
    router.add_get("/v2/health/ready", ready)
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_get(base, model_meta)
        router.add_get(base + "/ready", model_ready)
        router.add_post(base + "/infer", infer)
    router.add_get("/metrics", metrics)

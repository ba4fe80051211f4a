"""Open Inference Protocol (KServe v2 REST) tensors: JSON and Triton's binary extension.

Requests and responses are JSON objects (``{"inputs": [{name, shape, datatype, data}]}``,
``{"model_name", "outputs": [...]}``); with the binary tensor data extension the JSON is
followed by raw little-endian tensor bytes, its length given in the
``Inference-Header-Content-Length`` header and each tensor's size in
``parameters.binary_data_size``. That is what tritonclient's HTTP client sends by default.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from greenctl.data.errors import InputError

HEADER_LENGTH = "Inference-Header-Content-Length"
#: greenctl's executors answer with their own timing of a request (ms): time queued for a
#: batch to start, and the run time of the batch it rode in; the dispatcher passes them on.
QUEUE_MS_HEADER = "Greenctl-Queue-Ms"
INFER_MS_HEADER = "Greenctl-Infer-Ms"
#: rows of the batch the request ran in (what dynamic batching achieved)
BATCH_ROWS_HEADER = "Greenctl-Batch-Rows"
TIMING_HEADERS = (QUEUE_MS_HEADER, INFER_MS_HEADER, BATCH_ROWS_HEADER)

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
_NP_TO_OIP = {np.dtype(v).str.lstrip("<>|="): k for k, v in DTYPES.items()}


def oip_datatype(arr: np.ndarray) -> str:
    """The OIP datatype name of a numpy array (``float32`` -> ``FP32``)."""
    key = arr.dtype.str.lstrip("<>|=")
    if key not in _NP_TO_OIP:
        raise InputError(f"tensor dtype {arr.dtype} has no Open Inference Protocol datatype")
    return _NP_TO_OIP[key]


def decode_request(
    body: bytes, header_length: int | None = None
) -> tuple[dict[str, Any], list[tuple[str, np.ndarray]]]:
    """Parse an inference request into its JSON header and named numpy inputs.

    Raises:
        InputError: malformed JSON, an unknown datatype, or data that does not fill the shape.
    """
    # views, not copies: a 224x224 image is 600 KB, and every copy of it is CPU per request
    view = memoryview(body)
    if header_length is not None:
        head_bytes, blob = bytes(view[:header_length]), view[header_length:]
    else:
        head_bytes, blob = body, memoryview(b"")
    try:
        doc = json.loads(head_bytes)
    except ValueError as exc:
        raise InputError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise InputError("request needs a non-empty 'inputs' list")
    tensors: list[tuple[str, np.ndarray]] = []
    offset = 0
    for i, item in enumerate(doc["inputs"]):
        if not isinstance(item, dict):
            raise InputError(f"inputs[{i}] must be an object")
        name = str(item.get("name", f"input{i}"))
        dtype_name = item.get("datatype")
        shape = item.get("shape")
        if dtype_name not in DTYPES:
            raise InputError(
                f"inputs[{i}].datatype {dtype_name!r} is not supported",
                hint=f"use one of {', '.join(DTYPES)}",
            )
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InputError(f"inputs[{i}].shape must be a list of whole numbers")
        dtype = np.dtype(DTYPES[dtype_name]).newbyteorder("<")
        count = int(np.prod(shape)) if shape else 1
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            chunk = blob[offset : offset + int(size)]
            offset += int(size)
            if len(chunk) != count * dtype.itemsize:
                raise InputError(
                    f"inputs[{i}]: {len(chunk)} binary bytes do not fill shape {shape} "
                    f"of {dtype_name}"
                )
            arr = np.frombuffer(chunk, dtype=dtype)
            if not arr.dtype.isnative:  # big-endian hosts only: a native copy
                arr = arr.astype(dtype.newbyteorder("="))
            # else a read-only view of the request body: the runner copies it into its batch
        else:
            data = item.get("data")
            if data is None:
                raise InputError(f"inputs[{i}] has neither 'data' nor binary_data_size")
            try:
                arr = np.asarray(data, dtype=DTYPES[dtype_name]).reshape(-1)
            except (TypeError, ValueError) as exc:
                raise InputError(f"inputs[{i}].data: {exc}") from None
            if arr.size != count:
                raise InputError(
                    f"inputs[{i}]: {arr.size} values do not fill shape {shape}",
                    hint="data holds the tensor flattened in row-major order",
                )
        tensors.append((name, arr.reshape(shape)))
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
    :class:`greenctl.executor.httpserver.Router`).

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

"""What the dispatcher relays as bytes: plain inference requests and plain answers.

Most requests a dispatcher forwards are alike: ``POST /v2/models/{model}/infer`` over
HTTP/1.1 keep-alive with a ``Content-Length`` body and ordinary headers, answered 200 by the
executor with its usual headers. Parsing each into a request object and building each answer
anew costs more CPU than the forwarding itself; these the dispatcher relays as the bytes
they came as, the answer with the serving variant's header added
(:meth:`~greenctl.executor.runtime.dispatch_forward.Forwarding.relay`). This module decides
what is plain, strictly (a head the parser would read otherwise, or refuse, is not plain);
everything else goes the parsed way, which answers it the same.
"""

from __future__ import annotations

import functools
import re

from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime.oip import HEADER_LENGTH, TIMING_HEADERS

#: a plain request's head (with its closing blank line): an inference request line whose
#: model name is visible ASCII (no query), then header lines of a token, a colon and a value
#: of visible bytes, spaces and tabs
_PLAIN_REQUEST = re.compile(
    rb"POST /v2/models/([^/?#\x00-\x20\x7f-\xff]+)/infer HTTP/1\.1\r\n"
    rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r\n)*\r\n"
)
#: headers that make a request not plain (lower-cased, as they start a line)
_NOT_PLAIN = (b"\r\ntransfer-encoding:", b"\r\nexpect:", b"\r\nupgrade:")
_CONNECTION = b"\r\nconnection:"
_LENGTH = b"\r\ncontent-length:"
_TENSOR_HEAD = b"\r\n" + HEADER_LENGTH.lower().encode() + b":"

#: the executor headers a plain answer holds, named as executors write them: its length,
#: and what the dispatcher passes on
PASSED_ON = ("Content-Type", HEADER_LENGTH, *TIMING_HEADERS)
_PLAIN_ANSWER = re.compile(
    rb"HTTP/1\.1 200 OK\r\nContent-Length: \d+(?:\r\n(?:"
    + b"|".join(re.escape(h.encode()) for h in PASSED_ON)
    + rb"): [\x20-\x7e]*)*"
)
_CONTENT_TYPE = b"\r\nContent-Type: "


#: heads of up to this many bytes are remembered (the last 256 of them): a client sends the
#: same head with every tensor of one shape
_REMEMBERED_BYTES = 4096


def plain_request(head: bytes) -> tuple[str, int, str | None] | None:
    """A plain request's model name, body length and ``Inference-Header-Content-Length``
    (None when absent), from its head (with its closing blank line); None when the request
    is not plain: not an inference request over HTTP/1.1, a header the parser would refuse,
    a transfer coding, ``Expect``, an upgrade, ``Connection`` other than ``keep-alive``, or
    a ``Content-Length`` that is missing, repeated or not digits."""
    if len(head) <= _REMEMBERED_BYTES:
        return _remembered(head)
    return _plain_request(head)


def _plain_request(head: bytes) -> tuple[str, int, str | None] | None:
    match = _PLAIN_REQUEST.fullmatch(head)
    if match is None:
        return None
    low = head.lower()
    for name in _NOT_PLAIN:
        if low.find(name) >= 0:
            return None
    at = low.find(_CONNECTION)
    if at >= 0 and (
        _value(low, at + len(_CONNECTION)) != b"keep-alive" or _again(low, _CONNECTION, at)
    ):
        return None
    at = low.find(_LENGTH)
    if at < 0 or _again(low, _LENGTH, at):
        return None
    length = _value(low, at + len(_LENGTH))
    if not (length.isdigit() and len(length) <= 18):
        return None
    at = low.find(_TENSOR_HEAD)
    if at < 0:
        return match.group(1).decode("latin-1"), int(length), None
    if _again(low, _TENSOR_HEAD, at):
        return None
    tensor_head = _value(head, at + len(_TENSOR_HEAD)).decode("latin-1")
    return match.group(1).decode("latin-1"), int(length), tensor_head


_remembered = functools.lru_cache(maxsize=256)(_plain_request)


def plain_answer(head: bytes) -> bool:
    """Whether an executor's answer head (no closing blank line) is plain: ``200 OK``, its
    ``Content-Length`` first, a ``Content-Type``, and none but the headers passed on, as
    executors write them (any other spelling goes the parsed way)."""
    return _PLAIN_ANSWER.fullmatch(head) is not None and head.find(_CONTENT_TYPE) >= 0


def parsed_request(head: bytes, body: bytes) -> hs.Request:
    """A plain request as the parsed way sees it (for what the relay hands over to it)."""
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ")
    headers = hs.Headers()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.add(name.lower(), value.strip(" \t"))
    return hs.Request(method, target, "", headers, body, None)


def _value(head: bytes, start: int) -> bytes:
    """A header's value: from ``start`` to the end of its line, without surrounding blanks."""
    return head[start : head.find(b"\r\n", start)].strip(b" \t")


def _again(low: bytes, name: bytes, at: int) -> bool:
    """Whether header ``name``, found at ``at``, comes again."""
    return low.find(name, at + len(name)) >= 0

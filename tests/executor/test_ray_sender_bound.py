"""The Ray router's sender holds a bounded number of waiting requests: past the bound a
request is refused (503 with Retry-After at the router), as the local dispatcher's queue
refuses, instead of waiting without end (plain asyncio, no Ray)."""

from __future__ import annotations

import asyncio

import pytest
from greenctl.executor.deploy.ray_serve import Sender
from greenctl.executor.runtime.dispatcher import MAX_QUEUE, QueueFull, busy_response


class _Replica:
    """A deployment handle whose calls finish when ``gate`` opens."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.answer_all = self
        self.calls = 0

    def remote(self, requests: list[tuple]):
        self.calls += 1

        async def answer() -> list:
            await self.gate.wait()
            return [("ok", r) for r in requests]

        return answer()


def test_past_the_bound_a_request_is_refused_and_the_waiting_ones_are_answered() -> None:
    async def main() -> tuple[list, str, int]:
        replica = _Replica()
        sender = Sender(replica, calls=1, most=1, limit=2)
        inflight = asyncio.ensure_future(sender.send("a"))
        for _ in range(5):
            await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(sender.send(x)) for x in "bc"]
        for _ in range(5):
            await asyncio.sleep(0)
        with pytest.raises(QueueFull) as refused:
            await sender.send("d")
        replica.gate.set()
        answers = await asyncio.gather(inflight, *waiting)
        after = await sender.send("e")  # room again once the queue drained
        return [*answers, after], refused.value.reason, replica.calls

    answers, reason, calls = asyncio.run(main())
    assert answers == [("ok", (x,)) for x in "abce"]
    assert "2 requests wait" in reason
    assert calls == 4


def test_the_refusal_is_a_503_with_retry_after_and_the_default_bound_is_the_dispatchers() -> None:
    response = busy_response(QueueFull("full"), "tiny")
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    assert b"full" in response.body
    assert Sender(_Replica()).limit == MAX_QUEUE

"""The front's connections: a deadline on each request's head and on its body.

aiohttp's server waits for the rest of a head, and for a body, as long as the connection lives:
two half-sent requests were still open after 65 s (issue 38). Here a head must be whole within
its deadline from its first byte (else the connection is closed), and a body must arrive within
its own and never pause too long (else 408). Idle connections are left to aiohttp's keep-alive
timeout: Runpod's proxy keeps its connections to the worker open between requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .routes import MAX_BODY_BYTES

JOIN_ON_LOOP_BYTES = 1 << 20  # a larger body is joined on a thread (read_body)


class TooLarge(Exception):
    pass


class BodyLate(Exception):
    pass


def too_large(size: int) -> str:
    return f"the request body is {size} bytes; this worker forwards at most {MAX_BODY_BYTES}"


async def read_body(request: web.BaseRequest, total_s: float, idle_s: float) -> bytes:
    """The whole body, refused past MAX_BODY_BYTES (as it arrives), or when it takes longer than
    `total_s` or pauses for `idle_s`."""
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + total_s
    try:
        async with asyncio.timeout(min(end, loop.time() + idle_s)) as deadline:
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise TooLarge(
                        f"the request body is over {MAX_BODY_BYTES} bytes; this worker forwards at most that"
                    )
                chunks.append(chunk)
                deadline.reschedule(min(end, loop.time() + idle_s))
    except TimeoutError:
        raise BodyLate(f"the request body did not arrive within {total_s:g} s (or paused for {idle_s:g} s)") from None
    if size > JOIN_ON_LOOP_BYTES:
        # bytes.join lets go of the GIL past 1 MiB (CPython Objects/stringlib/join.h, GIL_THRESHOLD), and
        # the first touch of 20 MiB of fresh memory took 15 ms here: on a thread, /ping goes on meanwhile.
        return await asyncio.to_thread(b"".join, chunks)
    return b"".join(chunks)


class _TimedHead(RequestHandler):
    """aiohttp's connection handler with a deadline on a request's head: from its first byte, the
    head must be whole within `head_timeout_s`, else the connection is closed (aiohttp waits for
    the rest of a head as long as the connection lives). Idle connections are left to aiohttp's
    keep-alive timeout: Runpod's proxy keeps its connections to the worker open between requests."""

    head_timeout_s = 30.0  # set by Server
    _head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if data and self._head_timer is None and not self._request_in_progress:
            self._head_timer = self._loop.call_later(self.head_timeout_s, self._head_late)
        super().data_received(data)

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._request_in_progress:
            self.force_close()

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any) -> Any:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        return await super()._handle_request(request, start_time, request_handler)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


class Server(web.Server):
    """aiohttp's low-level server whose connections time their heads (`_TimedHead`)."""

    def __init__(self, *args: Any, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s

    def __call__(self) -> RequestHandler:
        handler = _TimedHead(self, loop=self._loop, **self._kwargs)
        handler.head_timeout_s = self.head_timeout_s
        return handler

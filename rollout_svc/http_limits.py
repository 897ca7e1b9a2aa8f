"""ASGI middleware that refuses a request body over a size limit before any of it is parsed:
a JSON body is held in memory whole and its strings tokenized after, so a 10 MB chat message
would cost far more than its 10 MB by the time a model's limits could refuse it."""

from __future__ import annotations

import json
from collections.abc import Callable

# what is read (and dropped) of a refused body, so that a client still writing it reads the
# 413 instead of a reset connection; a longer body is cut off
DRAIN_LIMIT_BYTES = 64 << 20


def detail_error(message: str) -> bytes:
    """FastAPI's shape of an error."""
    return json.dumps({"detail": message}).encode()


class BodyLimit:
    """413 naming `field` and the limit for a body over `limit` bytes: at once when its
    Content-Length says so, else as soon as the bytes read pass it."""

    def __init__(self, app, limit: int, field: str,
                 render: Callable[[str], bytes] = detail_error):
        assert limit > 0, limit
        self.app = app
        self.limit = limit
        self.field = field
        self.render = render

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(receive, send, f"{int(declared)} bytes")
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                await self._refuse(receive, send, f"over {self.limit} bytes", more)
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:  # later calls wait for the client's disconnect, as Starlette expects
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, receive, send, size: str, more: bool = True) -> None:
        drained = 0
        while more and drained < DRAIN_LIMIT_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                break
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)
        body = self.render(f"request body: {size}, more than {self.field} ({self.limit})")
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

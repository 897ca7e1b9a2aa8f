"""An ASGI app served by uvicorn (over TLS when the run has certificates) on a background
thread of a service process, and the ASGI middleware every RelayRL HTTP API puts in front of
its app: the token check (BearerGuard) and the body limit (BodyLimit), both before any of a
request's body is read."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from relayrl.runtime import auth
from relayrl.runtime.roles import OPENAI_API, TokenBook

# what is read (and dropped) of a body refused for its size, so that a client still writing
# it reads the 413 instead of a reset connection; a longer body is cut off
DRAIN_LIMIT_BYTES = 64 << 20


def _openai_error(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()


def detail_error(message: str, _code: str = "") -> bytes:
    """FastAPI's shape of an error."""
    return json.dumps({"detail": message}).encode()


def token_book(token: str | TokenBook) -> TokenBook:
    """A bare token (a test's, a schema's) may do everything."""
    return token if isinstance(token, TokenBook) else TokenBook.single(token, "RELAYRL_TOKEN")


class BearerGuard:
    """ASGI middleware in front of an API open to `roles`: 401 for a request without a known
    `Authorization: Bearer <token>` (what the openai client sends as its api_key), 403 for
    a token of another role, before routing or reading the body, so a refused request
    reaches no handler. Paths in `public` (a health check, the API's schema) need no token;
    `render(message, code)` writes the refusal's body (OpenAI's error shape by default)."""

    def __init__(self, app, token: str | TokenBook, roles: frozenset[str] = OPENAI_API,
                 public: frozenset[str] = frozenset(),
                 render: Callable[[str, str], bytes] = _openai_error):
        assert token, "an empty token would let anyone in"
        self.app = app
        self.book = token_book(token)
        self.roles = roles
        self.public = public
        self.render = render

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.public:
            header = dict(scope["headers"]).get(b"authorization")
            refused = self.book.check(header, self.roles, f"{scope['method']} {scope['path']}")
            if refused is not None:
                authenticated, message = refused
                status, code = (403, "permission_denied") if authenticated else \
                    (401, "invalid_api_key")
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": self.render(message, code)})
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware that answers 413, naming `field` and the limit, for a request body over
    `limit` bytes before any of it is parsed: at once when its Content-Length says so, else
    (a chunked body) as soon as the bytes read pass it, reading no further. A JSON body is
    held in memory whole and parsed after, so an unbounded one costs the server far more
    than its size."""

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


class BackgroundHTTPServer:
    """HTTPS with the certificate of `credentials` (default: the process's, auth.current())
    when it has one, else plaintext, which it refuses beyond loopback unless
    auth.plaintext_beyond_loopback."""

    def __init__(self, app, host: str, port: int, name: str,
                 credentials: auth.Credentials | None = None):
        import uvicorn

        creds = credentials or auth.current()
        auth.check_bind(host, creds, f"{name} server {host}:{port}")
        tls = creds.tls
        ssl = {} if tls is None else {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
        config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                access_log=False, **ssl)
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # the service owns the signals
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)
        self.name = name
        self.address = f"{'http' if tls is None else 'https'}://{host}:{port}"

    def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} server did not start on {self.address}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

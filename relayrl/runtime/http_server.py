"""An ASGI app served by uvicorn (over TLS when the run has certificates) on a background
thread of a service process."""

from __future__ import annotations

import json
import threading
import time

from relayrl.runtime import auth
from relayrl.runtime.roles import OPENAI_API, TokenBook


def _openai_error(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()


def token_book(token: str | TokenBook) -> TokenBook:
    """A bare token (a test's, a schema's) may do everything."""
    return token if isinstance(token, TokenBook) else TokenBook.single(token, "RELAYRL_TOKEN")


class BearerGuard:
    """ASGI middleware in front of an API open to `roles`: 401 for a request without a known
    `Authorization: Bearer <token>` (what the openai client sends as its api_key), 403 for
    a token of another role, before routing or reading the body, so a refused request
    reaches no handler."""

    def __init__(self, app, token: str | TokenBook, roles: frozenset[str] = OPENAI_API):
        assert token, "an empty token would let anyone in"
        self.app = app
        self.book = token_book(token)
        self.roles = roles

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization")
            refused = self.book.check(header, self.roles, f"{scope['method']} {scope['path']}")
            if refused is not None:
                authenticated, message = refused
                status, code = (403, "permission_denied") if authenticated else \
                    (401, "invalid_api_key")
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": _openai_error(message, code)})
                return
        await self.app(scope, receive, send)


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

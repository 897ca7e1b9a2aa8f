"""An ASGI app served by uvicorn on a background thread of a service process."""

from __future__ import annotations

import json
import threading
import time

from relayrl.auth import bearer_matches

UNAUTHORIZED = json.dumps({"error": {
    "message": "missing or invalid bearer token: send 'Authorization: Bearer <the run's "
               "token>' (what the openai client sends as its api_key)",
    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()


class BearerGuard:
    """ASGI middleware: 401 for any HTTP request without `Authorization: Bearer <token>`,
    before routing or reading the body, so a refused request reaches no handler."""

    def __init__(self, app, token: str):
        assert token, "an empty token would let anyone in"
        self.app = app
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            if not bearer_matches(dict(scope["headers"]).get(b"authorization"), self.token):
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": UNAUTHORIZED})
                return
        await self.app(scope, receive, send)


class BackgroundHTTPServer:
    def __init__(self, app, host: str, port: int, name: str):
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # the service owns the signals
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)
        self.name = name
        self.address = f"http://{host}:{port}"

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

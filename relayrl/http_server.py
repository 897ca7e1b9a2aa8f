"""An ASGI app served by uvicorn on a background thread of a service process."""

from __future__ import annotations

import threading
import time


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

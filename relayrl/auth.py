"""The run's credentials: the shared token (from the environment) and TLS material.

A process installs its credentials once, at start-up, from its run config (`install`);
every gRPC server and channel made afterwards uses them (relayrl.grpc_util). A process that
installed none (a script, an agent, a test) uses the token in $RELAYRL_TOKEN if it is set,
so a client run beside `relayrl up` with that variable exported works unchanged.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from relayrl.config.security import AuthConfig, TlsConfig

DEFAULT_TOKEN_ENV = AuthConfig.model_fields["token_env"].default
BEARER = "Bearer "


@dataclass(frozen=True)
class TlsMaterial:
    cert: bytes
    key: bytes
    ca: bytes | None


@dataclass(frozen=True)
class Credentials:
    token: str | None = None  # None: nothing is sent and nothing is checked
    tls: TlsMaterial | None = None
    token_env: str = DEFAULT_TOKEN_ENV  # named in refusals, so a caller knows what to set
    redis_password: str | None = None

    @property
    def header(self) -> str | None:
        return None if self.token is None else BEARER + self.token


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{field}: cannot read {path}: {err.strerror}") from None


_installed: Credentials | None = None


def load_tls(cfg: TlsConfig) -> TlsMaterial | None:
    if not cfg.enabled:
        return None
    return TlsMaterial(cert=_read(cfg.cert, "auth.tls.cert"), key=_read(cfg.key, "auth.tls.key"),
                       ca=_read(cfg.ca, "auth.tls.ca") if cfg.ca else None)


def load_credentials(cfg: AuthConfig) -> Credentials:
    """The credentials `cfg` describes; ValueError when the token is required but unset."""
    token = os.environ.get(cfg.token_env) or None
    if cfg.required and token is None:
        raise ValueError(
            f"auth.required is true but ${cfg.token_env} (auth.token_env) is unset or empty: "
            "export the run's token there, or set auth.required=false for local use only")
    if not cfg.required:
        token = None
    redis_password = None
    if cfg.redis_password_env:
        redis_password = os.environ.get(cfg.redis_password_env) or None
        if redis_password is None:
            raise ValueError(f"auth.redis_password_env names ${cfg.redis_password_env}, "
                             "which is unset or empty")
    return Credentials(token=token, tls=load_tls(cfg.tls), token_env=cfg.token_env,
                       redis_password=redis_password)


def install_launcher_credentials(cfg: AuthConfig) -> None:
    """For `relayrl up`: when the token is required and unset, make a random one for this
    run and put it in this process's environment, which every child inherits (never on a
    command line, where `ps` shows it to every user); then install it here too."""
    if cfg.required and not os.environ.get(cfg.token_env):
        os.environ[cfg.token_env] = secrets.token_urlsafe(32)
    install(load_credentials(cfg))


def install(creds: Credentials | None) -> None:
    """Make `creds` this process's; None goes back to the environment's token."""
    global _installed
    _installed = creds


def current() -> Credentials:
    if _installed is not None:
        return _installed
    return Credentials(token=os.environ.get(DEFAULT_TOKEN_ENV) or None)


def bearer_matches(header: str | bytes | None, token: str) -> bool:
    """Constant-time check of an `authorization` value against `Bearer <token>`."""
    given = header if isinstance(header, bytes) else (header or "").encode("utf-8", "replace")
    return hmac.compare_digest(given, (BEARER + token).encode("utf-8", "replace"))


def mask_url(url: str) -> str:
    """`url` with its password (if any) replaced by ***, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))

"""Access control settings every service shares: the run token and optional gRPC TLS.

The token itself is never part of a config: a config names the environment variable that
holds it, so config files, run directories and command lines stay free of secrets.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from relayrl.config.base import StrictModel

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class TlsConfig(StrictModel):
    cert: str | None = Field(
        None, description="PEM certificate chain every gRPC server presents; unset: plaintext.")
    key: str | None = Field(None, description="PEM private key of `cert`.")
    ca: str | None = Field(
        None, description="PEM root certificate(s) clients verify servers against; unset uses "
        "the system's roots (for a self-signed `cert`, point it at the certificate itself).")

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TlsConfig:
        if bool(self.cert) != bool(self.key):
            raise ValueError("auth.tls.cert and auth.tls.key must be set together")
        if self.ca and not self.cert:
            raise ValueError("auth.tls.ca is set but auth.tls.cert is not: clients would "
                             "expect TLS from servers that serve plaintext")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


class AuthConfig(StrictModel):
    token_env: str = Field(
        "RELAYRL_TOKEN", min_length=1, max_length=128, pattern=ENV_NAME,
        description="Environment variable holding the run's shared token, sent as "
        "`authorization: Bearer <token>` on every gRPC call and HTTP request.")
    required: bool = Field(
        True, description="Refuse calls without the token; false opens every endpoint (local "
        "use only) and starts services even when the variable is unset.")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="gRPC TLS certificates.")
    redis_password_env: str = Field(
        "", max_length=128, pattern=rf"{ENV_NAME}|^$",
        description="Environment variable holding the Redis password: sent when redis.url "
        "carries none, and the embedded server's requirepass; empty: none (a URL like "
        "redis://:password@host:6379/0 works too).")

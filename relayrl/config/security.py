"""Access control settings every service shares: the role tokens and optional TLS.

A token itself is never part of a config: a config names the environment variable that
holds it, so config files and command lines stay free of secrets. Who may call what is
relayrl.runtime.roles.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from relayrl.config.base import StrictModel

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class TlsConfig(StrictModel):
    cert: str | None = Field(
        None, description="PEM certificate chain every gRPC and HTTP server presents; unset: "
        "plaintext.")
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


def _env_field(default: str, description: str):
    return Field(default, min_length=1, max_length=128, pattern=ENV_NAME,
                 description=description)


class AuthConfig(StrictModel):
    token_env: str = _env_field(
        "RELAYRL_TOKEN", "Environment variable holding the service token, the run's own "
        "(its processes send it as `authorization: Bearer <token>`); it may also do what an "
        "agent or an operator may.")
    agent_token_env: str = _env_field(
        "RELAYRL_AGENT_TOKEN", "Environment variable holding the agent token: Generate, the "
        "OpenAI-compatible API, Buffer.Submit; unset: only the service token does these.")
    operator_token_env: str = _env_field(
        "RELAYRL_OPERATOR_TOKEN", "Environment variable holding the operator token: the REST "
        "control API and status methods; unset: only the service token does these.")
    trainer_token_env: str = _env_field(
        "RELAYRL_TRAINER_TOKEN", "Environment variable holding the trainer token, the only "
        "one a relay takes a Publish from; unset: the service token publishes.")
    required: bool = Field(
        True, description="Refuse calls without the token; false opens every endpoint (local "
        "use only) and starts services even when the variable is unset.")
    tls: TlsConfig = Field(
        default_factory=TlsConfig,
        description="TLS certificates of every gRPC and HTTP server and client of the run.")
    plaintext_beyond_loopback: bool = Field(
        False, description="Let services bind or be dialled beyond loopback (another host, "
        "0.0.0.0) without `tls`: only on a network no one else reaches (a compose network, "
        "a cluster's pod network); false refuses such a config.")
    reward_token_env: str = _env_field(
        "RELAYRL_REWARD_TOKEN", "Environment variable holding the token sent to remote reward "
        "servers (`remote:HOST:PORT` rewards), theirs alone: the run's tokens never go to "
        "them; unset: none is sent.")
    redis_password_env: str = Field(
        "", max_length=128, pattern=rf"{ENV_NAME}|^$",
        description="Environment variable holding the Redis password: sent when redis.url "
        "carries none, and the embedded server's requirepass; empty: none (a URL like "
        "redis://:password@host:6379/0 works too).")
    signing_key_env: str = _env_field(
        "RELAYRL_SIGNING_KEY", "Environment variable holding the trainer's Ed25519 private "
        "key (base64 of its raw 32 bytes), which signs every version's manifest; only the "
        "trainer holds it. `relayrl up` makes a key pair when it is unset and auth.required.")
    verify_key_env: str = _env_field(
        "RELAYRL_VERIFY_KEY", "Environment variable holding the trainer's Ed25519 public key "
        "(base64 of its raw 32 bytes): set, relays take and workers and the evaluator apply "
        "only versions whose manifest it verifies; unset: versions go unsigned.")

    @model_validator(mode="after")
    def _distinct_variables(self) -> AuthConfig:
        names = [self.token_env, self.agent_token_env, self.operator_token_env,
                 self.trainer_token_env, self.reward_token_env, self.signing_key_env,
                 self.verify_key_env]
        if len(set(names)) != len(names):
            raise ValueError(f"auth: the token and key variables must differ, got {names}")
        return self

    @property
    def role_envs(self) -> dict[str, str]:
        """Role name -> the variable its token is in (relayrl.runtime.roles)."""
        return {"service": self.token_env, "agent": self.agent_token_env,
                "operator": self.operator_token_env, "trainer": self.trainer_token_env}

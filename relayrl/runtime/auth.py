"""The run's credentials: the role tokens (from the environment) and TLS material.

A process installs its credentials once, at start-up, from its run config (`install`);
every gRPC server and channel made afterwards uses them (relayrl.runtime.grpc_util): a server takes
the tokens of every role (relayrl.runtime.roles), a client sends the service token, and a trainer
sends its own on Relay.Publish. A process that installed none (a script, an agent, a test)
sends the token in $RELAYRL_TOKEN if it is set, so a client run beside `relayrl up` with
that variable exported works unchanged. Remote reward servers are no part of the run: they
are dialled with a token of their own and never the run's (`reward_credentials`).
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from relayrl.config.base import is_loopback
from relayrl.config.security import AuthConfig, TlsConfig
from relayrl.runtime.roles import AGENT, BEARER, OPERATOR, SERVICE, TRAINER, Holder, TokenBook
from relayrl.runtime.signing import install_key_pair

DEFAULT_TOKEN_ENV = AuthConfig.model_fields["token_env"].default
DEFAULT_REWARD_TOKEN_ENV = AuthConfig.model_fields["reward_token_env"].default
PUBLISH_METHOD = "/relayrl.v1.Relay/Publish"
TOKENS_FILE = "tokens.env"  # in the run directory: the agent and operator tokens `up` made


@dataclass(frozen=True)
class TlsMaterial:
    cert: bytes
    key: bytes
    ca: bytes | None
    # the files they were read from, for the HTTP servers and clients, which take paths
    cert_file: str = ""
    key_file: str = ""
    ca_file: str | None = None


@dataclass(frozen=True)
class Credentials:
    token: str | None = None  # None: nothing is sent and nothing is checked
    tls: TlsMaterial | None = None
    token_env: str = DEFAULT_TOKEN_ENV  # named in refusals, so a caller knows what to set
    redis_password: str | None = None
    accepted: TokenBook | None = None  # what servers take; None: `token` alone, any role
    publish_token: str | None = None  # sent on Relay.Publish (the trainer's); None: `token`
    reward_token: str | None = None  # sent to remote reward servers, and only to them
    reward_token_env: str = DEFAULT_REWARD_TOKEN_ENV
    plaintext_beyond_loopback: bool = False  # auth.plaintext_beyond_loopback

    @property
    def header(self) -> str | None:
        return None if self.token is None else BEARER + self.token

    @property
    def method_headers(self) -> dict[str, str]:
        """Methods a client calls with another token than `token`: Relay.Publish with the
        trainer's, when this process holds it."""
        if self.publish_token is None:
            return {}
        return {PUBLISH_METHOD: BEARER + self.publish_token}

    @property
    def book(self) -> TokenBook | None:
        """The tokens this process's servers take; None: everything is open."""
        if self.accepted is not None or self.token is None:
            return self.accepted
        return TokenBook.single(self.token, self.token_env)


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
                       ca=_read(cfg.ca, "auth.tls.ca") if cfg.ca else None,
                       cert_file=cfg.cert, key_file=cfg.key, ca_file=cfg.ca or None)


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
    book, publish_token = _role_book(cfg, token) if token else (None, None)
    if cfg.redis_password_env:
        redis_password = os.environ.get(cfg.redis_password_env) or None
        if redis_password is None:
            raise ValueError(f"auth.redis_password_env names ${cfg.redis_password_env}, "
                             "which is unset or empty")
    return Credentials(token=token, tls=load_tls(cfg.tls), token_env=cfg.token_env,
                       redis_password=redis_password, accepted=book,
                       publish_token=publish_token,
                       reward_token=_reward_token(cfg.reward_token_env, cfg.role_envs),
                       reward_token_env=cfg.reward_token_env,
                       plaintext_beyond_loopback=cfg.plaintext_beyond_loopback)


def _reward_token(env: str, role_envs: dict[str, str]) -> str | None:
    """The reward servers' token from $`env`; refused when it is one of the run's, which
    would hand whoever runs a reward server that role."""
    token = os.environ.get(env) or None
    for role_env in role_envs.values():
        if token is not None and os.environ.get(role_env) == token:
            raise ValueError(f"${env} (auth.reward_token_env) holds the same token as "
                             f"${role_env}: a reward server would hold a run token; give "
                             "reward servers a token of their own")
    return token


def reward_credentials(creds: Credentials | None = None) -> Credentials:
    """What a remote reward server is dialled with, and what a reward server takes: the
    reward token alone (none when unset) and the TLS of `creds` (default: the process's),
    never a token of the run."""
    creds = creds or current()
    return Credentials(token=creds.reward_token, tls=creds.tls,
                       token_env=creds.reward_token_env, reward_token=creds.reward_token,
                       reward_token_env=creds.reward_token_env,
                       plaintext_beyond_loopback=creds.plaintext_beyond_loopback)


def check_bind(host: str, creds: Credentials, what: str) -> None:
    """Refuse to serve plaintext beyond loopback (a last guard behind the run config's
    check, for servers started without one): ValueError naming the fix."""
    if creds.tls is None and not creds.plaintext_beyond_loopback and not is_loopback(host):
        raise ValueError(f"{what} would bind {host!r}, beyond loopback, without TLS: set "
                         "auth.tls, or auth.plaintext_beyond_loopback: true on a network only "
                         "the run reaches")


def require_trainer_token(cfg: AuthConfig, what: str) -> None:
    """With tokens required, a trainer or a relay that takes publishes, reachable beyond
    loopback, needs the trainer token: without it the service token, which every process of
    the run holds, may publish weights. ValueError naming the variable."""
    if cfg.required and not os.environ.get(cfg.trainer_token_env):
        raise ValueError(
            f"{what} is reachable beyond loopback and ${cfg.trainer_token_env} "
            "(auth.trainer_token_env) is unset or empty: any holder of the service token "
            "could publish weights; export the trainer's own token there, in the trainer's "
            "and the root relay's environment only (`relayrl up` makes one)")


def _role_book(cfg: AuthConfig, service: str) -> tuple[TokenBook, str | None]:
    """Every role's token from the environment, and the trainer's (None when unset). The
    service token carries the agent and operator roles, and the trainer's while no trainer
    token is set; the same token in two variables is refused (an agent would hold more)."""
    tokens = {role: os.environ.get(env) or None for role, env in cfg.role_envs.items()}
    tokens[SERVICE] = service
    envs = {role: env for role, env in cfg.role_envs.items() if tokens[role]}
    seen: dict[str, str] = {}
    for role, token in tokens.items():
        if token is not None and token in seen:
            raise ValueError(f"${envs[role]} holds the same token as ${envs[seen[token]]}: "
                             "each role needs its own (unset a variable to let the service "
                             "token do that role's calls)")
        if token is not None:
            seen[token] = role
    service_roles = {SERVICE, AGENT, OPERATOR} | ({TRAINER} if not tokens[TRAINER] else set())
    roles = {SERVICE: frozenset(service_roles), AGENT: frozenset({AGENT}),
             OPERATOR: frozenset({OPERATOR}), TRAINER: frozenset({TRAINER})}
    holders = tuple(Holder((BEARER + tokens[r]).encode(), roles[r], envs[r])
                    for r in (SERVICE, TRAINER, OPERATOR, AGENT) if tokens[r])
    return TokenBook(holders), tokens[TRAINER]


def control_api_book(creds: Credentials, api_token_env: str) -> TokenBook | None:
    """The tokens the scheduler's REST API takes: the process's, plus the one in
    $`api_token_env` (scheduler.rest_token_env, the API's own token before there were
    roles) as an operator's. None: no token at all."""
    book, api_token = creds.book, os.environ.get(api_token_env) or None
    if api_token is None:
        return book
    extra = Holder((BEARER + api_token).encode(), frozenset({OPERATOR}), api_token_env)
    return TokenBook((*(book.holders if book else ()), extra))


def install_launcher_credentials(cfg: AuthConfig, run_dir: Path | None = None) -> Path | None:
    """For `relayrl up`: when tokens are required, make a random one for each role whose
    variable is unset and put it in this process's environment, which the children inherit
    (never on a command line, where `ps` shows it to every user); then install them here
    too. With `run_dir`, the agent and operator tokens made here are written to
    run_dir/tokens.env (mode 0600, shell syntax) for the user's clients: its path, or None
    when none was made."""
    made = {}
    if cfg.required:
        for role, env in cfg.role_envs.items():
            if not os.environ.get(env):
                os.environ[env] = made[role] = secrets.token_urlsafe(32)
        install_key_pair(cfg)  # the manifests' signing key: the launcher gives it the trainer
    install(load_credentials(cfg))
    handed = [cfg.role_envs[r] for r in (AGENT, OPERATOR) if r in made]
    if run_dir is None or not handed:
        return None
    path = Path(run_dir) / TOKENS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier run may have other bits
    with os.fdopen(fd, "w") as f:
        f.write("# Tokens `relayrl up` made for this run: `source` this file, or copy a value.\n")
        f.writelines(f"export {env}={os.environ[env]}\n" for env in handed)
    return path


def install(creds: Credentials | None) -> None:
    """Make `creds` this process's; None goes back to the environment's token."""
    global _installed
    _installed = creds


@contextmanager
def using(creds: Credentials) -> Iterator[None]:
    """`creds` this process's for the length of a `with`, then those before again."""
    global _installed
    previous, _installed = _installed, creds
    try:
        yield
    finally:
        _installed = previous


def current() -> Credentials:
    """The installed credentials, else those of the default variables ($RELAYRL_TOKEN and
    the role tokens beside it), so a script beside `relayrl up` speaks as its children do."""
    if _installed is not None:
        return _installed
    defaults = AuthConfig()
    reward_token = _reward_token(DEFAULT_REWARD_TOKEN_ENV, defaults.role_envs)
    token = os.environ.get(DEFAULT_TOKEN_ENV) or None
    if token is None:
        return Credentials(reward_token=reward_token)
    book, publish_token = _role_book(defaults, token)
    return Credentials(token=token, accepted=book, publish_token=publish_token,
                       reward_token=reward_token)


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

"""Who may call what: four roles, one token each, and the table of every gRPC method and HTTP
API to the roles that may call it, declared once here.

    agent     a custom rollout: Generate, GenerateStream and RewardEpisode, the OpenAI API,
              Buffer.Submit, and the read-only Rollout.Status and Buffer.Stats
    operator  a person or script running the run: the scheduler's REST control API
              (`relayrl status|pause|resume|stop|...`) and every read-only status method
    service   the run's own processes: leases, heartbeats, weight pulls, every internal call
    trainer   Relay.Publish: the only identity whose versions a relay takes

The service token also carries the agent and operator roles (it is the run's own credential,
held only by its processes; clients written against $RELAYRL_TOKEN keep working). A role
whose token is unset falls to the service token: with $RELAYRL_TOKEN alone, that one token
does everything, as it always did. A missing or unknown token is UNAUTHENTICATED (401); a
valid token of a role the method does not admit is PERMISSION_DENIED (403).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

AGENT, OPERATOR, SERVICE, TRAINER = "agent", "operator", "service", "trainer"
BEARER = "Bearer "

_STATUS = frozenset({AGENT, OPERATOR})
METHOD_ROLES: dict[str, frozenset[str]] = {
    "/relayrl.v1.Rollout/Generate": frozenset({AGENT}),
    "/relayrl.v1.Rollout/GenerateStream": frozenset({AGENT}),
    "/relayrl.v1.Rollout/RewardEpisode": frozenset({AGENT}),
    "/relayrl.v1.Rollout/Status": _STATUS,
    "/relayrl.v1.Buffer/Submit": frozenset({AGENT}),
    "/relayrl.v1.Buffer/Stats": _STATUS,
    "/relayrl.v1.Scheduler/Status": frozenset({OPERATOR}),
    "/relayrl.v1.Trainer/Status": frozenset({OPERATOR}),
    "/relayrl.v1.Relay/ListVersions": frozenset({OPERATOR}),
    "/relayrl.v1.Relay/Publish": frozenset({TRAINER}),
}
# Everything else (Scheduler leases and heartbeats, Relay pulls, Reward.Score, ...): services.
SERVICE_ONLY = frozenset({SERVICE})
OPENAI_API = frozenset({AGENT})    # the rollout workers' OpenAI-compatible HTTP API
CONTROL_API = frozenset({OPERATOR})  # the scheduler's REST control API


def method_roles(method: str) -> frozenset[str]:
    """The roles that may call the gRPC method `method` (its full name, /pkg.Service/Name)."""
    return METHOD_ROLES.get(method, SERVICE_ONLY)


@dataclass(frozen=True)
class Holder:
    header: bytes      # b"Bearer <token>"
    roles: frozenset[str]
    env: str           # the variable it was read from, named in refusals


@dataclass(frozen=True)
class TokenBook:
    """The tokens a server accepts and the roles each carries."""
    holders: tuple[Holder, ...]

    @classmethod
    def single(cls, token: str, env: str) -> TokenBook:
        """One token that may do everything (auth installed from a token alone)."""
        return cls((Holder((BEARER + token).encode(), frozenset({AGENT, OPERATOR, SERVICE,
                                                                 TRAINER}), env),))

    def roles(self, header: str | bytes | None) -> frozenset[str] | None:
        """The roles of the token in an `authorization` value; None if it is no token here.
        Every holder is compared, in constant time, whatever matches first."""
        given = header if isinstance(header, bytes) else (header or "").encode("utf-8",
                                                                                "replace")
        found: frozenset[str] | None = None
        for h in self.holders:
            if hmac.compare_digest(given, h.header):
                found = (found or frozenset()) | h.roles
        return found

    def envs(self, allowed: frozenset[str]) -> list[str]:
        """Variables holding a token that may call a method open to `allowed`."""
        return [h.env for h in self.holders if h.roles & allowed]

    def hint(self, allowed: frozenset[str]) -> str:
        """What to send: the role(s) and the variable(s) their token is in."""
        envs = " or ".join(f"${e}" for e in self.envs(allowed)) or "none is configured"
        return f"send 'authorization: Bearer <token>' with the {_named(allowed)} token ({envs})"

    def check(self, header: str | bytes | None, allowed: frozenset[str], what: str
              ) -> tuple[bool, str] | None:
        """None when `header` may call `what`; else (authenticated, message): False for a
        missing or unknown token, True for a valid token of a role `allowed` does not hold."""
        if not header:
            return False, f"missing bearer token: {self.hint(allowed)}"
        roles = self.roles(header)
        if roles is None:
            return False, f"invalid bearer token: {self.hint(allowed)}"
        if roles & allowed:
            return None
        return True, (f"{what} needs the {_named(allowed)} role; this is the "
                      f"{_named(roles).split(' or ')[0]} token ({self.hint(allowed)})")


def _named(roles: frozenset[str]) -> str:
    """`roles` in a fixed order, most privileged first: 'service or operator'."""
    return " or ".join(r for r in (TRAINER, SERVICE, OPERATOR, AGENT) if r in roles)

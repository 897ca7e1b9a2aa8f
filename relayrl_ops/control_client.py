"""A client of the scheduler's REST control API, for the `relayrl status|pause|resume|stop|
workers` commands and for scripts.

Where the API is: --url, else $RELAYRL_API_URL, else the run config's scheduler.rest_host
and rest_port (https, verified against auth.tls.ca, when auth.tls is set). The bearer
token: --token, else the variable named by the config's scheduler.rest_token_env
($RELAYRL_API_TOKEN by default), else the operator token
($RELAYRL_OPERATOR_TOKEN, auth.operator_token_env: `relayrl up` writes the one it made to
<run_dir>/tokens.env), else $RELAYRL_TOKEN (the service token, which may operate too).
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

URL_ENV = "RELAYRL_API_URL"
DEFAULT_TOKEN_ENV = "RELAYRL_API_TOKEN"
RUN_TOKEN_ENV = "RELAYRL_TOKEN"
OPERATOR_TOKEN_ENV = "RELAYRL_OPERATOR_TOKEN"


class ControlError(Exception):
    """The API could not be reached or refused the request; the message says what to do."""


@dataclass(frozen=True)
class Endpoint:
    """Where the REST control API is and the token that opens it."""
    url: str
    token: str
    token_env: str  # named in a refusal, so the operator knows what to set
    ca: str | None = None  # auth.tls.ca: what an https URL is verified against; None: system


def resolve_endpoint(url: str | None, token: str | None, cfg=None) -> Endpoint:
    """The API's address and token from flags, the environment and a run config."""
    token_env = cfg.scheduler.rest_token_env if cfg is not None else DEFAULT_TOKEN_ENV
    if not url:
        url = os.environ.get(URL_ENV, "")
    if not url and cfg is not None and cfg.scheduler.rest_port:
        scheme = "https" if cfg.auth.tls.enabled else "http"
        url = f"{scheme}://{cfg.scheduler.rest_host}:{cfg.scheduler.rest_port}"
    if not url:
        raise ControlError(f"no control API address: pass --url, set ${URL_ENV}, or pass "
                           "--config with a run config whose scheduler.rest_port is set")
    operator_env = cfg.auth.operator_token_env if cfg is not None else OPERATOR_TOKEN_ENV
    token = (token or os.environ.get(token_env) or os.environ.get(operator_env)
             or os.environ.get(RUN_TOKEN_ENV, ""))
    if not token:
        raise ControlError(f"no API token: pass --token or set ${operator_env}")
    ca = cfg.auth.tls.ca if cfg is not None and cfg.auth.tls.enabled else None
    return Endpoint(url.rstrip("/"), token, token_env, ca or None)


class ControlClient:
    """A client of the scheduler's REST control API, one method per route."""
    def __init__(self, endpoint: Endpoint, timeout_s: float = 10.0):
        self.endpoint = endpoint
        verify = ssl.create_default_context(cafile=endpoint.ca) if endpoint.ca else True
        self._http = httpx.Client(base_url=endpoint.url, timeout=timeout_s, verify=verify,
                                  headers={"Authorization": f"Bearer {endpoint.token}"})

    def close(self) -> None:
        """Close the HTTP connection."""
        self._http.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        url = self.endpoint.url + path
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as err:
            raise ControlError(f"cannot reach the control API at {url}: {err} (is the "
                               "scheduler running, with scheduler.rest_port set?)") from None
        except httpx.TimeoutException:
            raise ControlError(f"the control API at {url} did not answer in time") from None
        if resp.status_code == 401:
            raise ControlError(f"the control API refused the token (401); set "
                               f"${self.endpoint.token_env} or pass --token") from None
        if resp.status_code >= 400:
            raise ControlError(f"{method} {url}: {resp.status_code} {_detail(resp)}")
        return resp.json()

    def status(self) -> dict:
        """GET /v1/status: the run's state, step, reward, throughput and prompt counts."""
        return self._call("GET", "/v1/status")

    def workers(self) -> list[dict]:
        """GET /v1/workers: the registered rollout workers."""
        return self._call("GET", "/v1/workers")

    def pause(self) -> dict:
        """POST /v1/pause: hand out no lease until resumed."""
        return self._call("POST", "/v1/pause")

    def resume(self) -> dict:
        """POST /v1/resume: hand out leases again."""
        return self._call("POST", "/v1/resume")

    def stop(self) -> dict:
        """POST /v1/stop: finish and train what is out, checkpoint, end."""
        return self._call("POST", "/v1/stop")

    def settings(self) -> dict:
        """GET /v1/settings: the settings that can change while the run goes."""
        return self._call("GET", "/v1/settings")

    def change_settings(self, **change) -> dict:
        """PATCH /v1/settings: change live settings, given as keyword arguments."""
        return self._call("PATCH", "/v1/settings", json=change)

    def metrics(self, last: int = 20) -> list[dict]:
        """GET /v1/metrics: the last `last` steps' metrics records."""
        return self._call("GET", "/v1/metrics", params={"last": last})


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except (ValueError, AttributeError):
        return resp.text
    if isinstance(detail, list):  # a 422: name each field
        return "; ".join(f"{'.'.join(map(str, e.get('loc', [])[1:]))}: {e.get('msg')}"
                         for e in detail)
    return str(detail)


def render_status(status: dict) -> str:
    """The status answer as the lines `relayrl status` prints."""
    run = status["run"]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = [
        f"state          {run['state']}" + ("  (done)" if status["done"] else ""),
        f"trainer step   {run['trainer_step']}",
        f"reward         {fmt(run['reward_mean'], '.3f')}",
        f"throughput     {fmt(run['samples_per_s'], '.1f')} samples/s, "
        f"{fmt(run['tokens_per_s'], '.0f')} tokens/s",
        f"buffer         {run['buffer']['samples_waiting']} samples, "
        f"{run['buffer']['batches_waiting']} batches waiting",
        f"prompts        {status['handed_out']} handed out, {status['inflight']} in flight, "
        f"{status['finished']} finished, {status['failed']} failed",
        "settings       " + ", ".join(f"{k}={v}" for k, v in run["settings"].items()),
        "workers        " + (", ".join(f"{w}@v{v}" for w, v in run["worker_versions"].items())
                             or "none registered"),
    ]
    if run["stop_target"] is not None:
        lines.append(f"stop target    {run['stop_target']} prompts finished by the trainer")
    return "\n".join(lines)


def render_workers(workers: list[dict]) -> str:
    """The workers answer as the table `relayrl workers` prints."""
    if not workers:
        return "no worker has registered"
    rows = [f"{'worker':<20} {'version':>7} {'leases':>6} {'seen':>8}  state"]
    rows += [f"{w['worker_id']:<20} {w['policy_version']:>7} {w['active_leases']:>6} "
             f"{w['last_seen_s_ago']:>7.1f}s  {'draining' if w['draining'] else 'active'}"
             for w in workers]
    return "\n".join(rows)


def run_command(command: str, endpoint: Endpoint, as_json: bool) -> int:
    """One CLI command against the API; prints the answer, returns the exit code."""
    client = ControlClient(endpoint)
    try:
        answer = getattr(client, command)()
    finally:
        client.close()
    if as_json:
        print(json.dumps(answer, indent=2))
    elif command == "status":
        print(render_status(answer))
    elif command == "workers":
        print(render_workers(answer))
    else:
        print(f"run {answer['state']}")
    return 0

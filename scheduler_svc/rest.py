"""The scheduler's REST control API: see workers and leases, drain a worker and bring it
back, trigger a repack of long-tail sequences; the run's status, pause, resume, graceful
stop, live settings and recent metrics (scheduler_svc.rest_run). Every route but the health
check and the docs needs `Authorization: Bearer <token>`, checked before any of the body is
read; a body over scheduler.rest_max_body_bytes is refused (413) before it is parsed. The
schema is at /openapi.json (checked in as docs/openapi.json) and the interactive docs at
/docs."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer

from relayrl.config.scheduler import SchedulerConfig
from relayrl.runtime.http_server import BearerGuard, BodyLimit, detail_error
from relayrl.runtime.roles import CONTROL_API, TokenBook
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest_models import (
    DrainRequest,
    LeaseView,
    MoveView,
    RepackRequest,
    WorkerView,
    refusals,
)
from scheduler_svc.rest_run import run_routes

# declares the token in the schema; BearerGuard checks it, before the body is read
_BEARER = HTTPBearer(auto_error=False)
PUBLIC = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def json_safe(value: Any) -> Any:
    """`value` as JSON can carry it: a refusal echoes what was sent, and a NaN or an infinity
    sent (Python's JSON parser takes them) cannot be written back as JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def invalid_request(_request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, naming each field, with the values sent made JSON-safe."""
    return JSONResponse(status_code=422, content={"detail": json_safe(list(exc.errors()))})


def build_rest_app(core: SchedulerCore | None, token: str | TokenBook):
    """The app in front of `core`; None builds it for its OpenAPI schema alone. `token`: the
    tokens it takes (operator, service: relayrl.runtime.roles), or one that may do everything."""
    if not token:
        raise ValueError("scheduler REST API: an empty token would let anyone in")
    limit = (core.cfg.scheduler if core is not None else SchedulerConfig()).rest_max_body_bytes

    app = FastAPI(title="RelayRL scheduler control", version="1")
    app.add_exception_handler(RequestValidationError, invalid_request)
    # added last, the token check runs first: an unauthorised body is never read
    app.add_middleware(BodyLimit, limit=limit, field="scheduler.rest_max_body_bytes")
    app.add_middleware(BearerGuard, token=token, roles=CONTROL_API, public=PUBLIC,
                       render=detail_error)
    api = APIRouter(prefix="/v1", dependencies=[Depends(_BEARER)], responses=refusals(401))

    def worker_view(worker_id: str, counts: dict[str, int], now: float) -> WorkerView:
        w = core.policy.workers[worker_id]
        return WorkerView(worker_id=worker_id, policy_version=w.policy_version,
                          last_seen_s_ago=round(now - w.last_seen, 3),
                          active_leases=counts.get(worker_id, 0),
                          draining=worker_id in core.policy.draining)

    def one_worker(worker_id: str) -> WorkerView:
        with core.lock:
            if worker_id not in core.policy.workers:
                raise HTTPException(404, f"worker_id: no worker {worker_id!r} has registered")
            return worker_view(worker_id, core.policy.leases_by_worker(), core.clock())

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict:
        return {"ok": True}

    @api.get("/workers", response_model=list[WorkerView])
    def workers():
        with core.lock:
            counts, now = core.policy.leases_by_worker(), core.clock()
            return [worker_view(w, counts, now) for w in sorted(core.policy.workers)]

    @api.get("/leases", response_model=list[LeaseView])
    def leases():
        with core.lock:
            now = core.clock()
            return [LeaseView(lease_id=lease.lease_id, prompt_id=lease.prompt_id,
                              worker_id=lease.worker_id, attempt=lease.attempt,
                              expires_in_s=round(lease.deadline - now, 3),
                              has_saved_tokens=lease.prompt_id in core.saved.partials,
                              unfinished_sequences=(
                                  None if lease.unfinished < 0 else lease.unfinished),
                              recalled_to=lease.recall_to or None)
                    for lease in core.policy.leases.values()]

    @api.post("/workers/{worker_id}/drain", response_model=WorkerView,
              responses=refusals(400, 404))
    def drain(worker_id: str, body: DrainRequest | None = None):
        with core.lock:
            try:
                core.policy.drain(worker_id, body is not None and body.lapse_leases, core.clock())
            except KeyError:
                raise HTTPException(404, f"worker_id: no worker {worker_id!r} has registered"
                                    ) from None
        return one_worker(worker_id)

    @api.post("/workers/{worker_id}/resume", response_model=WorkerView,
              responses=refusals(404))
    def resume(worker_id: str):
        with core.lock:
            try:
                core.policy.undrain(worker_id)
            except KeyError:
                raise HTTPException(404, f"worker_id: no worker {worker_id!r} has registered"
                                    ) from None
        return one_worker(worker_id)

    @api.post("/repack", response_model=list[MoveView], responses=refusals(400, 409))
    def repack(body: RepackRequest | None = None):
        """Plan a repack now: workers left with a few long sequences hand them, with their
        token state, to the fullest workers with room. Needs scheduler.repack."""
        if not core.policy.worker_capacity:
            raise HTTPException(409, "scheduler.repack is off in this run's config")
        moves = core.repack(force=body is None or body.force)
        return [MoveView(lease_id=m.item, sequences=m.size, from_worker=m.source,
                         to_worker=m.target) for m in moves]

    run_routes(api, core)
    app.include_router(api)
    return app

"""The prompt scheduler: leases, in-flight bound, REST API and repacking."""

from __future__ import annotations

from pydantic import Field

from relayrl.config.base import Endpoint, GrpcLimits, MiB, StrictModel, grpc_limits


class SchedulerConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50552))
    lease_ttl_s: float = Field(
        30.0, gt=0, le=86_400, description="A lease not completed in time is re-issued."
    )
    heartbeat_interval_s: float = Field(1.0, gt=0, le=600, description="Worker heartbeat.")
    call_timeout_s: float = Field(
        10.0, gt=0, le=600,
        description="Deadline of every call a worker makes to the scheduler; one that hangs "
        "longer is treated as down (the worker retries later, its leases may lapse).",
    )
    max_attempts: int = Field(3, ge=1, le=100, description="Leases per prompt before failing it.")
    max_inflight_prompts: int = Field(
        0, ge=0, le=1_000_000,
        description="Prompts handed out but not yet consumed; 0 derives it from the trainer's "
        "batch size and staleness bound (max(2, max_staleness) batches; one at staleness 0).",
    )
    max_start_lag: int = Field(
        1, ge=0, le=1_000_000,
        description="New prompts start only on weights at most this many versions behind the "
        "trainer (the lease's min_version; never older than trainer.max_staleness allows): a "
        "prompt started further behind has fewer steps left to finish in before it is too "
        "stale to train.",
    )
    max_prompts: int = Field(
        0, ge=0, description="Distinct prompts to hand out in total; 0 means unlimited."
    )
    max_partial_state_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 30,
        description="Largest saved token state of a partially generated prompt accepted.",
    )
    grpc: GrpcLimits = Field(
        default_factory=grpc_limits(1024),
        description="The gRPC server's limits. Its largest message is a saved token state "
        "(SaveProgress, Release), so max_receive_bytes None is max_partial_state_bytes + 1 "
        "MiB; 1024 calls at once (each worker makes at most a few).",
    )
    rest_port: int = Field(
        0, ge=0, le=65535,
        description="Port of the REST control API (workers, leases, drain; OpenAPI at "
        "/docs); 0 serves none. It needs a bearer token in the rest_token_env variable.",
    )
    rest_host: str = Field("127.0.0.1", description="Interface the REST API binds.")
    rest_max_body_bytes: int = Field(
        64 << 10, ge=1024, le=16 << 20,
        description="Largest REST API request body read (its bodies are a few small fields); "
        "a larger one is refused (413) before it is parsed, and only after its token is "
        "checked.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )
    rest_token_env: str = Field(
        "RELAYRL_API_TOKEN", min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the REST API's bearer token.",
    )
    repack: bool = Field(
        False,
        description="Move a worker's last few long sequences (with their token state) onto "
        "the fullest worker with room, when no new prompt can be handed out; needs "
        "rollout.segment_tokens.",
    )
    repack_below: float = Field(
        0.25, gt=0, le=1,
        description="A worker holding at most this share of its capacity (rollout."
        "max_active_groups x buffer.group_size sequences) has its sequences repacked.",
    )
    repack_reservation_s: float = Field(
        5.0, gt=0, le=3600,
        description="How long a repacked prompt waits for the worker chosen to continue it "
        "before any worker may take it.",
    )
    repack_interval_s: float = Field(
        0.5, ge=0, le=3600,
        description="Seconds between automatic repack plans; 0 plans only when asked "
        "(POST /v1/repack).",
    )
    start_after_workers: int = Field(
        0, ge=0, le=100_000,
        description="Hand out the first lease only once this many workers have registered, "
        "so the first worker up does not take the whole start of the run; 0 starts at once.",
    )

    @property
    def grpc_receive_bytes(self) -> int:
        return self.grpc.receive_bytes(self.max_partial_state_bytes + MiB)

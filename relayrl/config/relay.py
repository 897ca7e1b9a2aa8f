"""The weight relay: versions kept, data planes served, the relay tree."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.base import (
    DEVICE_HELP,
    DEVICE_PATTERN,
    Endpoint,
    GrpcLimits,
    MiB,
    StrictModel,
    grpc_limits,
)

# room in a Publish message besides a chunk: the version's manifest (about 100 bytes a
# tensor) comes first, on its own
MANIFEST_BYTES = 16 * MiB


class RelayConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50551))
    keep_versions: int = Field(4, ge=1, le=1024, description="Versions kept in memory.")
    chunk_bytes: int = Field(
        1 << 20, ge=1024, le=32 << 20, description="Bytes per streamed chunk."
    )
    delta_cache_bytes: int = Field(
        1 << 30, ge=0, le=1 << 40,
        description="Memory for deltas: a worker that holds a version this relay still keeps "
        "pulls a newer one over gRPC as the changes since it, each (base, target) encoded "
        "once and kept, least recently used dropped first, within this many bytes. A delta "
        "larger than this, or than its version, is sent whole instead; 0 sends no deltas.",
    )
    grpc: GrpcLimits = Field(
        default_factory=grpc_limits(512),
        description="The gRPC server's limits. Its largest messages are the trainer's: "
        "Publish chunks of chunk_bytes and the version's manifest, so max_receive_bytes None "
        "is chunk_bytes + 16 MiB; 512 calls at once (each worker's pull holds a stream open).",
    )
    data_planes: list[Literal["grpc", "shm", "torch_dist", "nixl", "nccl", "vllm"]] = Field(
        default_factory=lambda: ["grpc", "torch_dist"], min_length=1,
        description="Data planes this relay serves versions through; gRPC carries the "
        "control for all of them. shm needs shm_dir; nixl needs the nixl-cu12 package; nccl "
        "needs CUDA (device) and workers on other GPUs than the relay's; vllm (vLLM's "
        "weight-transfer engines, into vLLM workers' parameters) needs CUDA and vLLM.",
    )
    device: str = Field(
        "auto", pattern=DEVICE_PATTERN,
        description=f"The nccl plane's GPU: each version is copied there once, on its first "
        f"nccl pull, and freed when the version is dropped. {DEVICE_HELP}; it must resolve to "
        "CUDA when data_planes has nccl (checked at start), and is unused otherwise.",
    )
    shm_dir: str | None = Field(
        None, description="Keep versions as files in this shared-memory directory (e.g. "
        "/dev/shm) so workers on the same host map them without a copy; unset keeps them in "
        "process memory.",
    )
    max_version_gap: int = Field(
        1000, ge=1, le=1_000_000,
        description="How far past the newest version held a publish may go (1: only the "
        "next); room for the versions the trainer skips when it cannot send them in time or "
        "reach the relay. Further is refused; an empty relay takes any version.",
    )
    upstream: list[str] = Field(
        default_factory=list, max_length=64,
        description="host:port of relays to follow, in order of preference: this relay "
        "re-serves their versions while they arrive (a relay tree). Empty: a root relay that "
        "the trainer publishes to.",
    )
    children: int = Field(
        0, ge=0, le=64,
        description="Child relays `relayrl up` starts beside this one (the root): child k "
        "follows it on children_base_port + k, and worker i pulls from child i mod children, "
        "the root as its fallback (unless rollout.relays names the relays). 0: none.",
    )
    children_base_port: int = Field(
        50540, ge=1, le=65000, description="Child relay k of `children` listens on base+k.",
    )
    follow_poll_s: float = Field(
        0.02, gt=0, le=60, description="How often a follower asks its upstream for news."
    )
    timeout_s: float = Field(
        60.0, gt=0, le=3600,
        description="Deadline of every relay call and transfer; a version that stops "
        "arriving for this long is dropped.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )

    @property
    def grpc_receive_bytes(self) -> int:
        return self.grpc.receive_bytes(self.chunk_bytes + MANIFEST_BYTES)

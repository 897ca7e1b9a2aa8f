"""The trajectory buffer: group and batch sizes and its backpressure bounds."""

from __future__ import annotations

from pydantic import Field

from relayrl.config.base import Endpoint, StrictModel


class BufferConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50553))
    group_size: int = Field(8, ge=1, le=1024, description="Samples per prompt group.")
    groups_per_batch: int = Field(8, ge=1, le=4096, description="Groups per trainer batch.")
    read_block_ms: int = Field(200, ge=1, le=60_000, description="Blocking stream read.")
    max_pending_samples: int = Field(
        4096, ge=1, le=10_000_000,
        description="Most samples waiting on the trajectory stream to be batched; a producer "
        "that finds no room waits (a worker then stops taking prompts) until the trainer "
        "catches up. At least groups_per_batch x group_size.",
    )
    max_pending_batches: int = Field(
        8, ge=1, le=100_000,
        description="Most batches waiting on the batch stream that the trainer has not read "
        "yet; beyond it the buffer holds complete groups back, and the trajectory stream fills.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )

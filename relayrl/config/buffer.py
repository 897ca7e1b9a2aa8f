"""The trajectory buffer: group and batch sizes, its backpressure bounds, and what a sample
entering it may carry."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from relayrl.config.base import Endpoint, GrpcLimits, MiB, StrictModel, grpc_limits

# Rewards a range may admit: a group's squared deviations from its mean, summed in float32
# by the trainer, stay far below float32's largest value (3.4e38) for any group size.
MAX_REWARD_MAGNITUDE = 1e12
RewardBound = Annotated[float, Field(ge=-MAX_REWARD_MAGNITUDE, le=MAX_REWARD_MAGNITUDE)]
# a Submit's room for one trajectory: about 20 bytes a token, so over 100k tokens
TRAJECTORY_BYTES = 2 * MiB


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
    reward_range: tuple[RewardBound, RewardBound] = Field(
        (-1e4, 1e4),
        description="[lowest, highest] reward a sample may carry, from a worker's reward "
        "function (outside: a reward error on that sample, scored 0) or from Submit (outside: "
        "refused). Every built-in reward lies in [0, 1]; the default leaves room for weighted "
        "sums and shaped rewards.",
    )
    submit_dedup_ttl_s: int = Field(
        3600, ge=1, le=7 * 86400,
        description="How long Submit remembers a request_id: a retry with the same id within "
        "it returns the first prompt id and appends nothing.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )
    grpc: GrpcLimits = Field(
        default_factory=grpc_limits(256),
        description="The gRPC server's limits. Its largest message is a Submit of one group, so "
        "max_receive_bytes None is group_size x 2 MiB (over 100k tokens a trajectory) + 1 MiB; "
        "256 calls at once.",
    )

    @property
    def grpc_receive_bytes(self) -> int:
        return self.grpc.receive_bytes(self.group_size * TRAJECTORY_BYTES + MiB)

    @model_validator(mode="after")
    def _range_ordered(self) -> BufferConfig:
        low, high = self.reward_range
        if not low < high:
            raise ValueError(f"buffer.reward_range: lowest ({low:g}) must be below highest "
                             f"({high:g})")
        return self

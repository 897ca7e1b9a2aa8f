"""Config models: one per service, composed and cross-checked by RunConfig."""

from relayrl.config.base import ConfigError, Endpoint
from relayrl.config.run import RunConfig, load_run_config
from relayrl.config.security import AuthConfig, TlsConfig
from relayrl.config.services import (
    BufferConfig,
    ModelConfig,
    RedisConfig,
    RelayConfig,
    RolloutConfig,
    SchedulerConfig,
    TaskConfig,
    TrainerConfig,
)

__all__ = [
    "AuthConfig",
    "BufferConfig",
    "ConfigError",
    "Endpoint",
    "ModelConfig",
    "RedisConfig",
    "RelayConfig",
    "RolloutConfig",
    "RunConfig",
    "SchedulerConfig",
    "TaskConfig",
    "TlsConfig",
    "TrainerConfig",
    "load_run_config",
]

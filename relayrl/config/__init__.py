"""Config models: one per service, composed and cross-checked by RunConfig."""

from relayrl.config.base import ConfigError, Endpoint
from relayrl.config.buffer import BufferConfig
from relayrl.config.eval import EvalConfig, EvalSetConfig
from relayrl.config.loss import LossConfig, loss_config
from relayrl.config.model import (
    HfModel,
    ModelConfig,
    ModelLimits,
    PretrainedModel,
    TinyModel,
    read_model_limits,
)
from relayrl.config.redis import RedisConfig
from relayrl.config.relay import RelayConfig
from relayrl.config.rollout import RolloutConfig, TorchEngineConfig, VllmEngineConfig
from relayrl.config.run import PromptWindow, RunConfig, load_run_config
from relayrl.config.scheduler import SchedulerConfig
from relayrl.config.security import AuthConfig, TlsConfig
from relayrl.config.services import (
    BufferRun,
    EvalRun,
    EvaluatesSets,
    GroupTerms,
    LeaseTerms,
    LiveDefaults,
    MetricSinks,
    PromptTerms,
    RelayLink,
    RelayRun,
    RolloutRun,
    RunCommon,
    RunsTask,
    SchedulerRun,
    SubmitTerms,
    TrainerRun,
    TrainerTerms,
    WritesMetrics,
)
from relayrl.config.task import (
    AdditionTaskConfig,
    DatasetTaskConfig,
    ReasoningGymTaskConfig,
    TaskConfig,
    VerifiersTaskConfig,
)
from relayrl.config.trainer import (
    AdafactorConfig,
    AdamWConfig,
    CheckpointConfig,
    LoraConfig,
    OptimizerConfig,
    TrainerConfig,
    WandbConfig,
)

__all__ = [
    "BufferRun",
    "EvalRun",
    "EvaluatesSets",
    "MetricSinks",
    "RelayLink",
    "RunsTask",
    "TrainerTerms",
    "WritesMetrics",
    "GroupTerms",
    "LiveDefaults",
    "PromptTerms",
    "RelayRun",
    "RolloutRun",
    "LeaseTerms",
    "SubmitTerms",
    "RunCommon",
    "SchedulerRun",
    "TrainerRun",
    "AdafactorConfig",
    "AdamWConfig",
    "OptimizerConfig",
    "CheckpointConfig",
    "LoraConfig",
    "VllmEngineConfig",
    "TorchEngineConfig",
    "read_model_limits",
    "TinyModel",
    "PretrainedModel",
    "ModelLimits",
    "HfModel",
    "AdditionTaskConfig",
    "DatasetTaskConfig",
    "ReasoningGymTaskConfig",
    "VerifiersTaskConfig",
    "AuthConfig",
    "BufferConfig",
    "ConfigError",
    "Endpoint",
    "EvalConfig",
    "EvalSetConfig",
    "LossConfig",
    "ModelConfig",
    "RedisConfig",
    "RelayConfig",
    "RolloutConfig",
    "PromptWindow",
    "RunConfig",
    "SchedulerConfig",
    "TaskConfig",
    "TlsConfig",
    "TrainerConfig",
    "WandbConfig",
    "load_run_config",
    "loss_config",
]

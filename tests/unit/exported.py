"""Every metric the services can export, taken from their Stats classes."""

from buffer_svc.telemetry import BufferStats, StreamStats
from relay_svc.telemetry import RelayStats
from relayrl.runtime.exporter import RunnerStats
from relayrl.runtime.stats import specs_of
from rollout_svc.telemetry import EpisodeStats, PullStats, RolloutStats
from scheduler_svc.telemetry import SchedulerStats
from trainer_svc.telemetry import TRAINER_KINDS

ALL_SPECS = specs_of((RunnerStats, RelayStats, SchedulerStats, BufferStats, StreamStats,
                      RolloutStats, PullStats, EpisodeStats, *TRAINER_KINDS))
SAMPLE_NAMES = frozenset(s.sample_name for s in ALL_SPECS)

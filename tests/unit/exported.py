"""Every metric the services can export, taken from their exporter tables."""

from buffer_svc.telemetry import BUFFER_METRICS
from relay_svc.telemetry import RELAY_METRICS
from relayrl.exporter import RUNNER_METRICS
from rollout_svc.telemetry import ROLLOUT_METRICS
from scheduler_svc.telemetry import SCHEDULER_METRICS
from trainer_svc.telemetry import TRAINER_METRICS

ALL_SPECS = (*RUNNER_METRICS, *RELAY_METRICS, *SCHEDULER_METRICS, *BUFFER_METRICS,
             *ROLLOUT_METRICS, *TRAINER_METRICS)
SAMPLE_NAMES = frozenset(s.sample_name for s in ALL_SPECS)

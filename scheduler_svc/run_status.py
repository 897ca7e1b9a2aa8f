"""The run's figures for the control API, read where they live: the scheduler's own state,
and in Redis the trainer's version and latest metrics and the streams' depths. Nothing here
calls another service, so the status answers while any of them is down."""

from __future__ import annotations

from redis.exceptions import ResponseError

from relayrl.contracts import control
from relayrl.contracts.keys import TRAINER_GROUP
from relayrl.runtime.metrics import StepFigures, StepRecord
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest_models import BufferDepth, RunStatusView


def buffer_depth(core: SchedulerCore) -> BufferDepth:
    pipe = core.redis.pipeline(transaction=False)
    pipe.xlen(core.keys.trajectories)
    pipe.xlen(core.keys.batches)
    groups, batches = pipe.execute()
    samples = groups * core.cfg.groups.group_size  # one entry per group (relayrl.contracts.streams)
    try:
        read = core.redis.xpending(core.keys.batches, TRAINER_GROUP)["pending"]
    except ResponseError:  # no batch stream, or no trainer yet
        read = 0
    return BufferDepth(samples_waiting=samples, batches_waiting=max(0, batches - read))


def run_status(core: SchedulerCore) -> RunStatusView:
    step = int(core.redis.get(core.keys.trainer_version) or 0)
    latest = control.read_recent_metrics(core.redis, core.keys, 1)
    figures = StepRecord.from_json(latest[-1]).figures if latest else StepFigures()
    with core.lock:
        policy = core.policy
        versions = {w: s.policy_version for w, s in sorted(policy.workers.items())}
        state, settings = policy.control.state, core.settings
    stopping = control.read_stop_target(core.redis, core.keys)
    return RunStatusView(
        state=state, trainer_step=step, worker_versions=versions, buffer=buffer_depth(core),
        reward_mean=figures.reward_mean, samples_per_s=figures.samples_per_s,
        tokens_per_s=figures.tokens_per_s, settings=settings,
        stop_target=stopping)

"""`rollout.environment`: a multi-turn environment each sample of a group plays an episode in.

    rollout:
      segment_tokens: 0                      # episodes run whole (no partial rollouts)
      max_new_tokens: 256                    # the model's tokens over all turns of an episode
      environment:
        cls: calculator                      # or package.module:Class (protocol.py)
        max_turns: 4
        options: {reward: math_verify}       # keyword arguments of the class
        max_observation_chars: 32768         # what one reset or step may return
        max_env_tokens: 8192                 # environment tokens an episode may append
        reset_timeout_s: 60                  # the constructor and reset, together
        step_timeout_s: 60
        max_stuck_calls: 64                  # abandoned calls still running, at most

It lives under `rollout` because the rollout worker runs it; the task still supplies the
problems (and the reward when the environment gives none).

The bounds keep a user's environment from slowing the run beyond its own episode: a call or
an output past one ends that episode with an error naming the field and the limit
(relayrl_tasks/episodes/play.py lists the errors), and the other episodes go on.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from relayrl.config.base import StrictModel


class EnvironmentConfig(StrictModel):
    cls: str = Field(
        min_length=1, max_length=512, pattern=r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$",
        description="The environment class, `package.module:Class`, or a built-in name "
        "(calculator, openenv; verifiers is set by task.source verifiers); imported by the "
        "rollout workers.")
    max_turns: int = Field(
        4, ge=1, le=1024,
        description="Model turns per episode at most; the episode ends after the last.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the class is built with.")
    max_observation_chars: int = Field(
        32768, ge=1, le=16 << 20,
        description="Characters of message content one reset or step may return, counted "
        "before any tokenizing; more ends the episode with an error.")
    max_env_tokens: int = Field(
        8192, ge=1, le=1 << 20,
        description="Environment tokens (the template's glue around observations, masked "
        "out of the loss) one episode may append over all its turns; more ends it.")
    reset_timeout_s: float = Field(
        60.0, gt=0, le=3600,
        description="Seconds the constructor and reset of one episode may take; past them "
        "the episode ends with an error (the call is left running on its thread).")
    step_timeout_s: float = Field(
        60.0, gt=0, le=3600,
        description="Seconds one step may take; past them the episode ends with an error. "
        "A turn's steps run at once, so slow steps do not add up.")
    max_stuck_calls: int = Field(
        64, ge=1, le=4096,
        description="Calls past their deadline still running (each holds a thread) at "
        "most; while this many are, new resets and steps are refused with an error.")

"""`rollout.environment`: a multi-turn environment each sample of a group plays an episode in.

    rollout:
      segment_tokens: 0                      # episodes run whole (no partial rollouts)
      max_new_tokens: 256                    # the model's tokens over all turns of an episode
      environment:
        cls: calculator                      # or package.module:Class
        (relayrl.plugins.envs.protocol) max_turns: 4
        options: {reward: math_verify}       # keyword arguments of the class

It lives under `rollout` because the rollout worker runs it; the task still supplies the
problems (and the reward when the environment gives none).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from relayrl.config.base import StrictModel


class EnvironmentConfig(StrictModel):
    cls: str = Field(
        min_length=1, max_length=512, pattern=r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$",
        description="The environment class, `package.module:Class`, or a built-in name "
        "(calculator); imported by the rollout workers.")
    max_turns: int = Field(
        4, ge=1, le=1024,
        description="Model turns per episode at most; the episode ends after the last.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the class is built with.")

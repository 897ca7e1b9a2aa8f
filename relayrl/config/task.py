"""The synthetic task: its prompts, held-out split and reward."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.base import StrictModel


class TaskConfig(StrictModel):
    name: Literal["addition"] = Field("addition", description="Synthetic task with a checker.")
    digits: int = Field(2, ge=1, le=9, description="Digits per operand.")
    eval_size: int = Field(256, ge=0, le=100_000, description="Held-out problems for eval.")
    seed: int = Field(1234, ge=0, description="Seed of the prompt stream and held-out split.")
    prompt_format: Literal["raw", "chat"] = Field(
        "raw", description="raw: the model continues `12+34=`; chat: the question is one user "
        "message laid out by the model's chat template, answered in words.",
    )
    reward: str | None = Field(
        None, min_length=1, max_length=512,
        description="Reward spec (see relayrl.rewards), e.g. `math_verify+0.1*format_boxed`; "
        "unset: exact_match for raw prompts, math_verify for chat.",
    )

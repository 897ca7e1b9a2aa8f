"""The trainer's loss recipes: `trainer.loss` is one of these models, picked by its `name`.

Every recipe shares the off-policy correction, the regularisers and DAPO's length shaping
(LossBase); each adds only the fields its objective reads, so a field of another recipe is
refused by name. trainer_svc/losses holds the code each name runs. In YAML:

    trainer:
      loss: {name: dapo, clip_eps_high: 0.28}

`loss: dapo` is short for `loss: {name: dapo}`, and a mapping without a name is grpo's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from relayrl.config.base import StrictModel, foreign_fields, tagged_shorthand


class LossBase(StrictModel):
    """What every recipe has: the off-policy correction, KL and entropy terms, and DAPO's
    overlong reward shaping."""

    name: str = Field(description="The recipe: trainer_svc/losses' registry key.")
    correction: Literal["none", "tis_token", "tis_seq", "aipo", "decoupled"] = Field(
        "tis_token", description="Off-policy correction against the behaviour policy that "
        "sampled the tokens (trainer_svc/losses/corrections.py).",
    )
    tis_cap: float = Field(
        2.0, ge=1.0, le=1e6, description="Importance-weight cap: pi_old/mu above it is capped "
        "(tis_token, tis_seq) or dropped (decoupled); aipo truncates pi/mu at it.",
    )
    kl_coef: float = Field(
        0.0, ge=0, le=100, description="Weight of the KL penalty to the frozen initial "
        "policy; 0 keeps no reference copy and reports no train/kl_ref.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token KL estimator (Schulman): k1 = log pi/ref, k2 = half its "
        "square, k3 = ref/pi - 1 - log ref/pi.",
    )
    entropy_coef: float = Field(
        0.0, ge=0, le=10, description="Weight of the entropy bonus; the entropy is reported "
        "as train/entropy either way.",
    )
    overlong_buffer: int = Field(
        0, ge=0, le=1_048_576, description="Overlong reward shaping (DAPO): the last this many "
        "tokens before rollout.max_new_tokens ramp a penalty up to overlong_penalty; 0 is off.",
    )
    overlong_penalty: float = Field(
        1.0, ge=0, le=1000, description="Reward subtracted from a response of full length "
        "when overlong_buffer is set.",
    )

    @property
    def scales_by_group_std(self) -> bool:
        """Whether group advantages are divided by the group's std."""
        return False

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """A key this recipe lacks is refused naming the recipes that have it, so a clip
        setting left behind after a change of `name` does not pass silently."""
        return foreign_fields(data, cls, RECIPES, "name", "loss")


class GroupScaled(LossBase):
    scale_rewards: bool = Field(
        True, description="Divide group advantages by the group std.",
    )

    @property
    def scales_by_group_std(self) -> bool:
        return self.scale_rewards


CLIP_EPS = Field(0.2, gt=0, lt=1, description="Ratio clip [1 - eps, 1 + eps].")


class GrpoLoss(GroupScaled):
    name: Literal["grpo"] = "grpo"
    clip_eps: float = CLIP_EPS


class DrGrpoLoss(LossBase):
    """Group mean without the std; token sums over rollout.max_new_tokens."""

    name: Literal["dr_grpo"] = "dr_grpo"
    clip_eps: float = CLIP_EPS


class DapoLoss(GroupScaled):
    """Clip-higher, token mean over the batch; groups whose rewards all agree left out."""

    name: Literal["dapo"] = "dapo"
    clip_eps_low: float = Field(0.2, gt=0, lt=1, description="Ratio clip below, 1 - eps.")
    clip_eps_high: float = Field(
        0.28, gt=0, le=10, description="Ratio clip above, 1 + eps (clip-higher)."
    )


class RlooLoss(LossBase):
    name: Literal["rloo"] = "rloo"
    clip_eps: float = CLIP_EPS


class ReinforcePPLoss(LossBase):
    name: Literal["reinforce_pp"] = "reinforce_pp"
    clip_eps: float = CLIP_EPS


class GspoLoss(GroupScaled):
    name: Literal["gspo"] = "gspo"
    clip_eps: float = Field(
        4e-4, gt=0, lt=1, description="Clip of the sequence-level ratio, which sits much "
        "closer to 1 than token ratios.",
    )


class PpoLoss(LossBase):
    """GAE on a value head trained beside the policy."""

    name: Literal["ppo"] = "ppo"
    clip_eps: float = CLIP_EPS
    gamma: float = Field(1.0, ge=0, le=1, description="Discount per token in GAE.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    value_coef: float = Field(0.5, ge=0, le=100, description="Weight of the value loss.")
    value_clip: float = Field(
        0.2, gt=0, le=1e6, description="A value moves at most this far from its value "
        "before the batch's first update in the clipped value loss.",
    )


RECIPES: dict[str, type[LossBase]] = {
    c.model_fields["name"].default: c
    for c in (GrpoLoss, DrGrpoLoss, DapoLoss, RlooLoss, ReinforcePPLoss, GspoLoss, PpoLoss)
}
LossConfig = Annotated[
    GrpoLoss | DrGrpoLoss | DapoLoss | RlooLoss | ReinforcePPLoss | GspoLoss | PpoLoss,
    Field(discriminator="name"),
]
DEFAULT_LOSS = "grpo"
_ADAPTER: TypeAdapter[LossConfig] = TypeAdapter(LossConfig)


def shorthand(value: Any) -> Any:
    """`dapo` -> {name: dapo}; a mapping without a name gets the default recipe's."""
    return tagged_shorthand(value, "name", DEFAULT_LOSS)


def loss_config(name: str = DEFAULT_LOSS, **fields: Any) -> LossConfig:
    """The recipe `name` with `fields` set, validated as the config would be."""
    return _ADAPTER.validate_python({"name": name, **fields})

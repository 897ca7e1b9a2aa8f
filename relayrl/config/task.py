"""What the run trains on: `task` is one of these sources, picked by its `source`.

    task: {source: addition, digits: 2}                       # the tiny synthetic example
    task:                                                     # your own problems
      source: dataset
      path: data/train.jsonl          # JSONL, JSON, Parquet, CSV, or a save_to_disk directory
      prompt: {field: question}       # or {messages_field: messages}, a template, a system
      answer_field: answer
      reward: my_rewards:score        # a registered name, module:function or remote:HOST:PORT
    task: {source: reasoning_gym, generator: basic_arithmetic}
    task: {source: verifiers, env_id: my_env}                 # a verifiers environment

A mapping without a `source` is the addition task's. relayrl/plugins/tasks builds each source.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from relayrl.config.base import StrictModel, foreign_fields
from relayrl.config.buffer import RewardBound

_REWARD = dict(min_length=1, max_length=512, description=(
    "Reward spec (relayrl.plugins.rewards): a registered name, `package.module:function`, "
    "`remote:HOST:PORT`, or a weighted sum such as `math_verify+0.1*format_boxed`."))


class TaskBase(StrictModel):
    source: str = Field(description="Where the problems come from: relayrl/plugins/tasks' key.")
    seed: int = Field(1234, ge=0, le=2**63 - 1,
                      description="Seed of the prompt order and the held-out split.")
    eval_size: int = Field(256, ge=0, le=100_000, description="Held-out problems for eval.")
    reward_range: tuple[RewardBound, RewardBound] = Field(
        (0.0, 1.0), description="[lowest, highest] reward of this task: an external group "
        "(Buffer.Submit) with a reward outside it is refused, so an agent's rewards are on "
        "the scale of the task's own. Every built-in reward lies in [0, 1]; declare the "
        "range of a weighted sum, a custom or a remote reward here. Inside "
        "buffer.reward_range.")

    @model_validator(mode="after")
    def _reward_range_ordered(self) -> TaskBase:
        low, high = self.reward_range
        if not low < high:
            raise ValueError(f"task.reward_range: lowest ({low:g}) must be below highest "
                             f"({high:g})")
        return self

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """A key this source lacks is refused naming the sources that have it."""
        return foreign_fields(data, cls, SOURCE_MODELS, "source", "task source")


class AdditionTaskConfig(TaskBase):
    # every character a problem or answer holds (the tiny model's tokenizer is built on it)
    ALPHABET: ClassVar[str] = "0123456789+="

    source: Literal["addition"] = "addition"
    digits: int = Field(2, ge=1, le=9, description="Digits per operand.")
    prompt_format: Literal["raw", "chat"] = Field(
        "raw", description="raw: the model continues `12+34=`; chat: the question is one user "
        "message laid out by the model's chat template, answered in words.",
    )
    reward: str | None = Field(
        None, **{**_REWARD, "description": _REWARD["description"]
                 + " Unset: exact_match for raw prompts, math_verify for chat."})


class FewShot(StrictModel):
    prompt: str = Field(min_length=1, max_length=65_536)
    answer: str = Field(min_length=1, max_length=65_536)


class PromptConfig(StrictModel):
    """How a record becomes the model's prompt."""

    field: str | None = Field(
        "prompt", min_length=1, description="The record's prompt text column.")
    messages_field: str | None = Field(
        None, min_length=1, description="A column of chat messages ([{role, content}]) used as "
        "the prompt instead of `field`.")
    template: str | None = Field(
        None, min_length=1, max_length=65_536, description="A Python format string over the "
        "record's columns, e.g. 'Question: {question}\\nAnswer:'; replaces `field`.")
    system: str | None = Field(None, min_length=1, max_length=65_536,
                               description="A system message put before the prompt (chat).")
    few_shot: list[FewShot] = Field(
        default_factory=list, max_length=64,
        description="Worked examples before the prompt: user/assistant turns (chat) or "
        "prompt-answer pairs separated by blank lines (raw).")
    format: Literal["chat", "raw"] = Field(
        "chat", description="chat: user messages laid out by the model's chat template; raw: "
        "the text as it is.")

    @model_validator(mode="after")
    def _one_source_of_prompt(self) -> PromptConfig:
        if self.messages_field and self.template:
            raise ValueError("task.prompt: messages_field and template exclude each other")
        if self.messages_field and self.format == "raw":
            raise ValueError("task.prompt: messages_field needs format 'chat'")
        return self


class DatasetTaskConfig(TaskBase):
    source: Literal["dataset"] = "dataset"
    path: str | None = Field(None, min_length=1, description="A local file (.jsonl, .json, "
                             ".parquet, .csv) or a directory written by save_to_disk.")
    hub: str | None = Field(None, min_length=1, description="A Hugging Face hub dataset id.")
    hub_config: str | None = Field(None, min_length=1, description="The hub dataset's config.")
    format: Literal["auto", "json", "parquet", "csv", "arrow"] = Field(
        "auto", description="File format; auto: from the suffix (a directory is arrow).")
    split: str = Field("train", min_length=1, description="The training split's name.")
    eval_path: str | None = Field(None, min_length=1, description="A file of held-out rows.")
    eval_split: str | None = Field(None, min_length=1, description="The held-out split's name.")
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Without eval_path or eval_split: this seeded share "
        "of the training rows (at most eval_size) is held out instead.")
    streaming: bool = Field(False, description="Read rows as a stream (hub datasets too "
                            "large for the disk); prompt order is then the file's, reshuffled "
                            "through a buffer per epoch.")
    shuffle_buffer: int = Field(10_000, ge=1, le=10_000_000,
                                description="Rows in the streaming shuffle buffer.")
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    answer_field: str = Field("answer", min_length=1, description="The reference answer column.")
    long_prompts: Literal["skip", "error"] = Field(
        "skip", description="A row whose prompt is longer than the rollout can take "
        "(rollout.max_prompt_tokens, or the model's context less max_new_tokens): skip and "
        "count it, or refuse to start naming the row.")
    reward: str = Field("math_verify", **_REWARD)

    @model_validator(mode="after")
    def _one_place(self) -> DatasetTaskConfig:
        if bool(self.path) == bool(self.hub):
            raise ValueError("task: set exactly one of path (a local file or directory) and "
                             "hub (a hub dataset id)")
        if sum(map(bool, (self.eval_path, self.eval_split, self.eval_fraction))) > 1:
            raise ValueError("task: eval_path, eval_split and eval_fraction exclude each other")
        return self


class ReasoningGymTaskConfig(TaskBase):
    source: Literal["reasoning_gym"] = "reasoning_gym"
    generator: str = Field(min_length=1, description="A reasoning-gym dataset name, e.g. "
                           "basic_arithmetic, chain_sum, leg_counting.")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="The generator's own options.")
    size: int = Field(100_000, ge=1, le=100_000_000,
                      description="Training problems per epoch.")
    prompt: PromptConfig = Field(default_factory=lambda: PromptConfig(field="question"))
    reward: str | None = Field(None, **{**_REWARD, "description": _REWARD["description"]
                               + " Unset: the generator's own scorer."})


class VerifiersTaskConfig(TaskBase):
    source: Literal["verifiers"] = "verifiers"
    env_id: str = Field(min_length=1, max_length=256, pattern=r"^[\w.\-/]+$", description=(
        "The environment `verifiers.load_environment` loads: an installed environment "
        "package or a module on the path (dashes read as underscores). Its dataset gives the "
        "problems and its rubric the reward; the episodes run in the rollout workers "
        "(rollout.environment is set to the `verifiers` adapter)."))
    env_args: dict[str, Any] = Field(default_factory=dict,
                                     description="Keyword arguments of its load_environment.")
    eval_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="When the environment has no eval dataset: this "
        "seeded share of its rows (at most eval_size) is held out.")
    reward: str = Field("exact_match", **{**_REWARD, "description": _REWARD["description"]
                        + " Scores only an episode the rubric did not (one ended by "
                        "rollout.max_new_tokens before the environment finished)."})


TaskConfig = Annotated[
    AdditionTaskConfig | DatasetTaskConfig | ReasoningGymTaskConfig | VerifiersTaskConfig,
    Field(discriminator="source"),
]
SOURCE_MODELS: dict[str, type[TaskBase]] = {
    c.model_fields["source"].default: c
    for c in (AdditionTaskConfig, DatasetTaskConfig, ReasoningGymTaskConfig,
              VerifiersTaskConfig)
}
SOURCES = tuple(SOURCE_MODELS)


def task_shorthand(value: Any) -> Any:
    """A mapping without a source is the addition task's."""
    if isinstance(value, dict) and "name" in value and "source" not in value:
        raise ValueError(f"task.name {value['name']!r}: the task is now picked by task.source "
                         f"(one of {', '.join(SOURCES)})")
    if isinstance(value, dict) and "source" not in value:
        return {"source": "addition", **value}
    return value

"""Held-out evaluation: how often, where it runs, and on which sets (eval_svc runs it).

    eval:
      every: 10                    # trainer steps (policy versions) per eval; 0: never
      at_start: true               # also the starting weights (version 0)
      mode: inline                 # inline: the trainer, between steps; separate: its own
                                   # process following the relay, so training never waits
      device: auto                 # separate, and `relayrl eval`: where the model decodes
      sets:
        - name: heldout            # the run task's held-out problems (the default set)
          samples: 8               # pass@1 and pass@8 from 8 samples per problem
        - name: gsm
          task: {source: dataset, path: data/gsm_test.jsonl, answer_field: answer}
          reward: math_verify

Each set writes eval/<name>/pass@1, eval/<name>/pass@k (k = samples > 1),
eval/<name>/accuracy_greedy and eval/<name>/response_len_mean; the first set also writes
eval/accuracy_sampled and eval/accuracy_greedy as before.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from relayrl.config.base import DEVICE_HELP, DEVICE_PATTERN, StrictModel
from relayrl.config.task import TaskConfig, task_shorthand


class EvalSetConfig(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="Names the set's metrics: eval/<name>/...")
    task: TaskConfig | None = Field(
        None, description="Where the set's problems come from (any task source, "
        "relayrl/config/task.py); its held-out problems are evaluated. Unset: the run task's.")
    reward: str | None = Field(
        None, min_length=1, max_length=512, description="The set's reward spec, as "
        "task.reward takes it (relayrl.plugins.rewards). Unset: the set's task's reward.")
    samples: int = Field(1, ge=1, le=1024, description="Samples per problem, k of pass@k; "
                         "1 reports pass@1 only.")
    temperature: float | None = Field(None, ge=0.0, le=10.0,
                                      description="Sampling temperature; unset: "
                                      "rollout.temperature.")
    max_new_tokens: int | None = Field(None, ge=1, le=1_000_000,
                                       description="Response cap; unset: "
                                       "rollout.max_new_tokens.")
    greedy: bool = Field(True, description="Also decode each problem greedily once.")
    pass_threshold: float = Field(
        1.0, description="A sample counts as solved for pass@k when its reward is at least "
        "this (pass@1 is then the solved share; accuracy_sampled stays the mean reward).")
    environment: bool = Field(
        True, description="With rollout.environment set, play each problem as an episode of "
        "it (the tool the run trains with); false: one turn, scored by the set's reward.")
    max_problems: int = Field(0, ge=0, le=10_000_000,
                              description="Evaluate at most this many of the set's problems; "
                              "0: all.")

    @field_validator("task", mode="before")
    @classmethod
    def _task_shorthand(cls, value: Any) -> Any:
        return task_shorthand(value)


class EvalConfig(StrictModel):
    every: int = Field(10, ge=0, le=1_000_000,
                       description="Steps per eval (a version that is a multiple of it, the "
                       "first and the last); 0 disables.")
    at_start: bool = Field(
        True, description="Also evaluate the starting weights (version 0), before the first "
        "step with eval.mode inline; false: the first eval is at step `every`.")
    mode: Literal["inline", "separate"] = Field(
        "inline", description="inline: the trainer evaluates between steps; separate: an "
        "evaluator process follows the relay and writes <run_dir>/eval.jsonl, so evaluation "
        "never stalls training.")
    device: str = Field(
        "auto", pattern=DEVICE_PATTERN,
        description=f"Where the evaluator (eval.mode separate) and `relayrl eval` hold the "
        f"model and decode: {DEVICE_HELP}; with rollout.weight_plane nccl the evaluator "
        "receives each version there. eval.mode inline runs on trainer.device.")
    sets: list[EvalSetConfig] = Field(
        default_factory=lambda: [EvalSetConfig(name="heldout")], min_length=1, max_length=64,
        description="The held-out sets; the first also writes eval/accuracy_sampled and "
        "eval/accuracy_greedy.")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of the sampled answers.")
    batch_size: int = Field(256, ge=1, le=65_536, description="Sequences decoded at once.")
    poll_s: float = Field(2.0, gt=0, le=3600,
                          description="separate: seconds between the evaluator's looks at "
                          "the relay's newest version.")

    @model_validator(mode="after")
    def _names_are_distinct(self) -> EvalConfig:
        names = [s.name for s in self.sets]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"eval.sets: names must be distinct; {', '.join(dupes)} repeats")
        return self

    def set_named(self, name: str) -> EvalSetConfig:
        for s in self.sets:
            if s.name == name:
                return s
        raise ValueError(f"eval: no set named {name!r} (the sets are "
                         f"{', '.join(s.name for s in self.sets)})")

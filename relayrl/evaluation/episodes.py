"""Held-out problems played as episodes of the run's environment (rollout.environment), so a
run that trains with a tool is evaluated with it.

Turns are batched across episodes: each round samples one turn of every unfinished episode
(relayrl.sampling.sampler), then steps their environments through relayrl.plugins.envs.play, the
rule the rollout worker follows: the same opening, the same end (done, max_turns, the
max_new_tokens budget over all turns, the model's context) and the same reward (the sum of
the environment's rewards, else the set's reward on the final message, 0 on an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from relayrl.config.environment import EnvironmentConfig
from relayrl.models.loading import LoadedModel
from relayrl.plugins.envs import Environment, TurnGlue, load_environment
from relayrl.plugins.envs.play import answer, environment_total, goes_on, open_episode
from relayrl.plugins.rewards import RewardFn, score
from relayrl.plugins.tasks.problem import Problem
from relayrl.sampling.sampler import sample


@dataclass
class EvalEpisode:
    problem: Problem
    env: Environment | None
    messages: list[dict[str, str]]
    context: list[int]
    error: str = ""
    policy_tokens: int = 0
    turns: int = 0
    rewards: list[float] = field(default_factory=list)
    last_reply: str = ""
    done: bool = False

    def reward(self, reward_fn: RewardFn) -> float:
        if self.error:
            return 0.0
        if self.rewards:
            return environment_total(self.rewards)[0]
        value, _ = score(reward_fn, self.last_reply, self.problem.reference,
                         metadata=self.problem.metadata)
        return value


def play(lm: LoadedModel, env_cfg: EnvironmentConfig, problems: list[Problem],
         reward_fn: RewardFn, *, max_new_tokens: int, temperature: float, greedy: bool,
         generator: torch.Generator, batch_size: int) -> tuple[list[float], list[int]]:
    """One episode per entry of `problems`: its reward and the model's tokens over all its
    turns."""
    env_cls = load_environment(env_cfg.cls)
    glue = TurnGlue(lm.tokenizer, lm.eos_id)
    context_length = int(getattr(lm.model.config, "max_position_embeddings", 0) or 1 << 30)
    episodes = []
    for p in problems:
        o = open_episode(env_cls, env_cfg.options, p, glue, lm.encode_problem)
        episodes.append(EvalEpisode(p, o.env, o.messages, o.tokens, o.error))
    while todo := [e for e in episodes if not e.done]:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            rooms = [max(1, min(max_new_tokens - e.policy_tokens,
                                context_length - len(e.context))) for e in chunk]
            outs = sample(lm.model, [e.context for e in chunk], max_new_tokens=max(rooms),
                          eos_id=lm.eos_id, pad_id=lm.pad_id, temperature=temperature,
                          greedy=greedy, generator=generator)
            for e, room, out in zip(chunk, rooms, outs, strict=True):
                _take_turn(e, out.tokens[:room], out.finish_reason == "stop"
                           and len(out.tokens) <= room, lm, glue, env_cfg, max_new_tokens,
                           context_length)
    return [e.reward(reward_fn) for e in episodes], [e.policy_tokens for e in episodes]


def _take_turn(e: EvalEpisode, tokens: list[int], stopped: bool, lm: LoadedModel,
               glue: TurnGlue, env_cfg: EnvironmentConfig, max_new_tokens: int,
               context_length: int) -> None:
    e.context += tokens
    e.policy_tokens += len(tokens)
    e.turns += 1
    e.last_reply = reply = lm.decode(tokens)
    if not stopped or e.env is None:  # a cut reply gets no step
        e.done = True
        return
    move = answer(e.env, glue, e.messages, reply)
    e.error = move.error
    if move.step is not None and move.step.reward is not None:
        e.rewards.append(move.step.reward)
    if not goes_on(move, turns=e.turns, max_turns=env_cfg.max_turns,
                   policy_tokens=e.policy_tokens, max_new_tokens=max_new_tokens,
                   context=len(e.context), context_length=context_length):
        e.done = True
        return
    e.context += move.glue
    e.messages += [{"role": "assistant", "content": reply}, *move.step.messages]

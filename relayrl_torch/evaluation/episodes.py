"""Held-out problems played as episodes of the run's environment (rollout.environment), so a
run that trains with a tool is evaluated with it.

Turns are batched across episodes: each round samples one turn of every unfinished episode
(relayrl_torch.sampling.sampler), then steps their environments through
relayrl_tasks.episodes.play, the rules the rollout worker follows: the same opening, the same
end (done, max_turns, the max_new_tokens budget over all turns, the model's context,
rollout.environment's bounds) and the same reward (relayrl_tasks.episodes.reward: the sum of
the environment's rewards, else the set's reward on the final message, 0 on an error).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from relayrl.config.environment import EnvironmentConfig
from relayrl.plugins.envs import Environment
from relayrl.plugins.envs.calls import EnvCalls
from relayrl.plugins.envs.tools import declared_tools
from relayrl.plugins.rewards import RewardFn
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.envs import load_environment
from relayrl_tasks.episodes.play import Move, Turn, answer_all, goes_on, open_episodes
from relayrl_tasks.episodes.reward import episode_rewards
from relayrl_tasks.episodes.sequence import PolicyMask
from relayrl_tasks.episodes.turns import TurnGlue
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.sampling.sampler import sample


@dataclass
class EvalEpisode:
    problem: Problem
    env: Environment | None
    messages: list[dict[str, str]]
    context: list[int]
    error: str = ""
    mask: PolicyMask = field(default_factory=PolicyMask)  # of the tokens after the opening
    turns: int = 0
    rewards: list[float] = field(default_factory=list)
    last_reply: str = ""
    done: bool = False

    def reward(self, reward_fn: RewardFn) -> float:
        p = self.problem
        return episode_rewards([self], reward_fn, p.reference, p.metadata,
                               prompt=p.messages or p.text)[0][0]


def play(lm: LoadedModel, env_cfg: EnvironmentConfig, problems: list[Problem],
         reward_fn: RewardFn, *, max_new_tokens: int, temperature: float, greedy: bool,
         generator: torch.Generator, batch_size: int, stop: threading.Event | None = None
         ) -> tuple[list[float], list[int]]:
    """One episode per entry of `problems`: its reward and the model's tokens over all its
    turns."""
    env_cls = load_environment(env_cfg.cls)
    glue = TurnGlue(lm.tokenizer, lm.eos_ids, declared_tools(env_cls))
    context_length = int(getattr(lm.model.config, "max_position_embeddings", 0) or 1 << 30)
    calls = _calls(env_cfg.max_stuck_calls)
    episodes = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        for p, o in zip(chunk, open_episodes(env_cls, env_cfg, chunk, glue, lm.encode_problem,
                                             calls), strict=True):
            episodes.append(EvalEpisode(p, o.env, o.messages, o.tokens, o.error))
    while todo := [e for e in episodes if not e.done]:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            rooms = [max(1, min(max_new_tokens - e.mask.policy_tokens,
                                context_length - len(e.context))) for e in chunk]
            outs = sample(lm.model, [e.context for e in chunk], max_new_tokens=max(rooms),
                          eos_ids=lm.eos_ids, pad_id=lm.pad_id, temperature=temperature,
                          greedy=greedy, generator=generator, stop=stop)
            stepped = []
            for e, room, out in zip(chunk, rooms, outs, strict=True):
                tokens = out.tokens[:room]
                e.context += tokens
                e.mask.add_model(len(tokens))
                e.turns += 1
                e.last_reply = lm.decode(tokens)
                if out.finish_reason == "stop" and len(tokens) == len(out.tokens) \
                        and e.env is not None:
                    stepped.append(e)
                else:  # a cut reply gets no step
                    e.done = True
            moves = answer_all([Turn(e.env, e.messages, e.last_reply, e.mask.env_tokens)
                                for e in stepped], glue, env_cfg, calls)
            for e, move in zip(stepped, moves, strict=True):
                _after_step(e, move, env_cfg, max_new_tokens, context_length)
    return [e.reward(reward_fn) for e in episodes], [e.mask.policy_tokens for e in episodes]


_CALLS: dict[int, EnvCalls] = {}


def _calls(max_stuck: int) -> EnvCalls:
    """The process's environment calls: a call abandoned in one evaluation still counts
    against the next."""
    return _CALLS.setdefault(max_stuck, EnvCalls(max_stuck))


def _after_step(e: EvalEpisode, move: Move, env_cfg: EnvironmentConfig, max_new_tokens: int,
                context_length: int) -> None:
    reply = e.last_reply
    e.error = move.error
    if move.step is not None and move.step.reward is not None:
        e.rewards.append(move.step.reward)
    if not goes_on(move, turns=e.turns, max_turns=env_cfg.max_turns,
                   policy_tokens=e.mask.policy_tokens, max_new_tokens=max_new_tokens,
                   context=len(e.context), context_length=context_length):
        e.done = True
        return
    e.context += move.glue
    e.mask.add_env(len(move.glue))
    e.messages += [{"role": "assistant", "content": reply}, *move.step.messages]

"""The eval section's held-out sets, resolved: each set's problems, reward and decoding.

A set without its own task takes the run task's held-out problems (task.eval_size of them);
a set with one builds that task (any source of relayrl/config/task.py) and takes its
held-out problems. A set's reward is its own `reward`, else its task's. Everything that can
be wrong with a set (a missing file, an unknown reward) fails here, at start-up, naming the
set, with a ConfigError: the service that evaluates stops as on a bad file, and
`relayrl check` builds the sets with this code to fail as it would. A run with
rollout.environment evaluates each problem as an episode of it, as it trains, unless the
set says `environment: false`.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.config import ConfigError, EvaluatesSets
from relayrl.config.environment import EnvironmentConfig
from relayrl.config.eval import EvalSetConfig
from relayrl.plugins.rewards import RewardFn
from relayrl.plugins.tasks import Problem, Task
from relayrl_tasks.envs import load_environment, make_environment
from relayrl_tasks.rewards import get_reward
from relayrl_tasks.tasks import load_run_task
from relayrl_torch.models import pretrained_dir


@dataclass(frozen=True)
class EvalSet:
    name: str
    problems: list[Problem]
    reward: RewardFn
    reward_name: str
    samples: int  # k of pass@k: sampled answers per problem
    temperature: float
    max_new_tokens: int
    greedy: bool
    pass_threshold: float
    environment: EnvironmentConfig | None = None  # play episodes (evaluation.episodes)
    default: bool = False  # the first set: also writes eval/accuracy_sampled and _greedy


def build_sets(cfg: EvaluatesSets, run_task: Task | None = None,
               names: list[str] | None = None) -> list[EvalSet]:
    """cfg.eval.sets (only those in `names`, when given), in order. `cfg`: a RunConfig (the
    trainer) or the evaluator's EvalRun. `run_task`: the run's task where the caller has
    built it already (the trainer)."""
    wanted = [cfg.eval.set_named(n) for n in names] if names else list(cfg.eval.sets)
    first = cfg.eval.sets[0].name
    out = []
    for s in wanted:
        if s.task is None and run_task is None:
            run_task = load_run_task(cfg, pretrained_dir)
        task = run_task if s.task is None else _own_task(cfg, s)
        out.append(_resolve(cfg, s, task, default=s.name == first))
    return out


def _own_task(cfg: EvaluatesSets, s: EvalSetConfig) -> Task:
    try:  # the run's model and rollout limits, the set's task
        return load_run_task(cfg.model_copy(update={"task": s.task}), pretrained_dir)
    except ValueError as err:
        raise ConfigError(f"eval.sets {s.name!r}: {err}") from None


def _resolve(cfg: EvaluatesSets, s: EvalSetConfig, task: Task, default: bool) -> EvalSet:
    reward_name = s.reward or task.reward_name
    try:
        reward = get_reward(reward_name)
    except ValueError as err:
        raise ConfigError(f"eval.sets {s.name!r}: reward: {err}") from None
    problems = task.eval_problems()
    if s.max_problems:
        problems = problems[:s.max_problems]
    if not problems:
        raise ConfigError(f"eval.sets {s.name!r}: its task holds no held-out problems (set "
                          "the task's eval_size, eval_path, eval_split or eval_fraction)")
    environment = cfg.generation.environment if s.environment else None
    if environment is not None:  # importable here too (the trainer, the evaluator)
        try:
            make_environment(load_environment(environment.cls), environment.options)
        except ValueError as err:
            raise ConfigError(f"eval.sets {s.name!r}: {err}") from None
    temperature = cfg.generation.temperature if s.temperature is None else s.temperature
    return EvalSet(
        name=s.name, problems=problems, reward=reward, reward_name=reward_name,
        samples=s.samples, temperature=temperature,
        max_new_tokens=s.max_new_tokens or cfg.generation.max_new_tokens, greedy=s.greedy,
        pass_threshold=s.pass_threshold, default=default,
        environment=environment)

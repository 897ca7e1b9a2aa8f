"""Problems from a `verifiers` environment's dataset (`task.source: verifiers`).

    task: {source: verifiers, env_id: my_env, env_args: {difficulty: 2}}

`verifiers.load_environment(env_id, **env_args)` builds the environment once per process
(load_env); its dataset's rows are the training problems, read as a dataset task reads a file
(relayrl_tasks.tasks.dataset: every row checked once, shuffled per epoch by task.seed), and
its eval dataset, or a seeded share of the rows, the held-out ones. A row's `prompt` messages
are the problem's prompt, its `answer` the reference, and the whole row (info, task,
example_id) its metadata, which the episode hands back to the environment
(relayrl_tasks.envs.verifiers_env plays the episodes and scores them with the rubric).

Needs the verifiers extra: `pip install 'relayrl[verifiers]'` (the classic API of verifiers
0.3: `vf.load_environment`, `vf.SingleTurnEnv`, `vf.MultiTurnEnv`, `vf.Rubric`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from relayrl.config import ConfigError
from relayrl.config.task import DatasetTaskConfig, PromptConfig, VerifiersTaskConfig
from relayrl_tasks.rewards.imported import import_user_module
from relayrl_tasks.tasks.dataset import DatasetTask, PromptLimit

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def load_env(env_id: str, env_args: Mapping[str, Any]) -> Any:
    """The verifiers environment `env_id` built with `env_args`, once per process.

    verifiers' Environment installs SIGINT and SIGTERM handlers when it is built (to tear
    itself down in its own processes); here the service's own handlers stay, so those calls
    are left out, which also lets an episode's thread build it."""
    key = json.dumps([env_id, env_args], sort_keys=True, default=str)
    with _lock:
        if key not in _loaded:
            _loaded[key] = _build(env_id, dict(env_args))
        return _loaded[key]


class _NoSignals:
    """What verifiers' environment module sees as `signal`: installs nothing."""
    SIGINT = SIGTERM = 0

    @staticmethod
    def signal(*_args: Any) -> None:
        return None

    @staticmethod
    def default_int_handler(*_args: Any) -> None:
        return None


def _build(env_id: str, env_args: dict[str, Any]) -> Any:
    try:
        import verifiers as vf
        from verifiers.legacy.envs import environment as vf_environment
    except ImportError:
        raise ConfigError("task.source 'verifiers' needs the verifiers package: "
                          "pip install 'relayrl[verifiers]'") from None
    vf_environment.signal = _NoSignals
    module = env_id.replace("-", "_").split("/")[-1]
    try:
        import_user_module(module)  # the working directory searched too, as for rewards
    except ImportError as err:
        raise ConfigError(f"task.env_id {env_id!r}: cannot import module {module!r} ({err}); "
                          "install the environment or put it on PYTHONPATH") from None
    try:
        env = vf.load_environment(env_id, **env_args)
    except Exception as err:  # a user's load_environment may raise anything
        raise ConfigError(f"task.env_id {env_id!r}: load_environment({env_args}) raised "
                          f"{type(err).__name__}: {err}") from None
    if not isinstance(env, vf.MultiTurnEnv):
        raise ConfigError(f"task.env_id {env_id!r}: {type(env).__name__} is not a "
                          "vf.MultiTurnEnv (SingleTurnEnv and MultiTurnEnv subclasses are "
                          "supported)")
    if env.tool_defs:
        raise ConfigError(f"task.env_id {env_id!r}: verifiers environments with tools are "
                          "not supported; declare the tools in a RelayRL ToolEnvironment "
                          "(relayrl.plugins.envs.tools)")
    return env


def verifiers_task(cfg: VerifiersTaskConfig, limit: PromptLimit | None = None) -> DatasetTask:
    """The environment's dataset as a dataset task: rows checked, shuffled and held out the
    same way."""
    env = load_env(cfg.env_id, cfg.env_args)
    try:
        rows = env.get_dataset()
    except ValueError as err:
        raise ConfigError(f"task.env_id {cfg.env_id!r}: {err}") from None
    eval_rows = env.build_eval_dataset()
    as_dataset = DatasetTaskConfig(
        path=f"verifiers environment {cfg.env_id}", seed=cfg.seed, eval_size=cfg.eval_size,
        eval_fraction=0.0 if eval_rows is not None else cfg.eval_fraction,
        prompt=PromptConfig(messages_field="prompt"), reward=cfg.reward)
    return DatasetTask(as_dataset, limit, _with_answer(rows), _with_answer(eval_rows))


def _with_answer(rows: Any) -> Any:
    """Rows with an `answer` column ("" where the environment's dataset has none)."""
    if rows is None or "answer" in rows.column_names:
        return rows
    return rows.add_column("answer", [""] * len(rows))

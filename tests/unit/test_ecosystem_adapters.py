"""The adapters that play other libraries' environments as RelayRL environments: a
`verifiers` environment's dataset becomes the task and its rollout loop and rubric play and
score each episode; an OpenEnv environment's observations and rewards become an episode's
turns, in process or on a pool of HTTP servers. Bad settings are refused naming the field."""

import asyncio
import gc
import signal
import time
from dataclasses import dataclass

import pytest

from relayrl.config import ConfigError, RunConfig
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.envs.loading import load_environment, make_environment
from relayrl_tasks.tasks import make_task

pytest.importorskip("verifiers")
openenv = pytest.importorskip("openenv_core")

MODEL = {"kind": "pretrained", "name": "smollm2-135m-instruct"}


def verifiers_config(**task):
    return RunConfig.model_validate({
        "model": MODEL, "rollout": {"segment_tokens": 0},
        "task": {"source": "verifiers", "env_id": "tests.unit.vf_cases", **task}})


def episode(cfg):
    return make_environment(load_environment(cfg.rollout.environment.cls),
                            cfg.rollout.environment.options)


# verifiers --------------------------------------------------------------------------------

def test_a_verifiers_task_sets_its_environment_and_survives_a_round_trip():
    cfg = verifiers_config(env_args={"case": "echo"})
    env = cfg.rollout.environment
    assert env.cls == "verifiers"
    assert env.options == {"env_id": "tests.unit.vf_cases", "env_args": {"case": "echo"},
                           "max_turns": 4}
    assert RunConfig.model_validate(cfg.model_dump()).rollout.environment == env


def test_a_verifiers_task_refuses_another_environment_or_options():
    base = {"model": MODEL, "task": {"source": "verifiers", "env_id": "x"}}
    with pytest.raises(ValueError, match="rollout.environment.cls 'calculator'"):
        RunConfig.model_validate({**base, "rollout": {
            "segment_tokens": 0, "environment": {"cls": "calculator"}}})
    with pytest.raises(ValueError, match="rollout.environment.options"):
        RunConfig.model_validate({**base, "rollout": {
            "segment_tokens": 0, "environment": {"cls": "verifiers", "options": {"a": 1}}}})
    with pytest.raises(ValueError, match="env_id"):
        RunConfig.model_validate({**base, "task": {"source": "verifiers", "env_id": "a b"}})


def test_the_environment_dataset_is_the_task_with_a_held_out_share():
    cfg = verifiers_config(env_args={"case": "echo"}, eval_size=4, eval_fraction=0.2)
    task = make_task(cfg.task)
    held = task.eval_problems()
    assert len(held) == 4 and all(p.prompt_id < 0 for p in held)
    seen = {task.problem(i).reference for i in range(16)}
    assert len(seen) == 16 and not seen & {p.reference for p in held}
    problem = task.problem(0)
    assert problem.messages[-1]["role"] == "user" and "+ 1?" in problem.messages[-1]["content"]
    assert problem.metadata["answer"] == problem.reference
    assert "example_id" in problem.metadata


def test_an_eval_dataset_is_the_held_out_set_and_a_missing_answer_is_empty():
    held = make_task(verifiers_config(env_args={"case": "with_eval"}).task).eval_problems()
    assert [p.reference for p in held] == ["1", "2", "3"]
    task = make_task(verifiers_config(env_args={"case": "no_answer"}).task)
    assert task.problem(0).reference == ""


def test_an_episode_is_played_by_the_rollout_loop_and_scored_by_the_rubric():
    cfg = verifiers_config(env_args={"case": "echo"})
    problem = make_task(cfg.task).problem(0)
    env = episode(cfg)
    opening = env.reset(problem)
    assert opening == [dict(m) for m in problem.messages]
    step = env.step("wrong")
    assert step.messages == [{"role": "user", "content": "again: wrong"}]
    assert step.reward is None and not step.done
    assert env.step(problem.reference) == ([], 1.0, True)


def test_the_environment_ends_an_episode_at_relayrl_max_turns():
    cfg = verifiers_config(env_args={"case": "echo"})  # the environment's own limit is 5
    env = episode(cfg)
    env.reset(make_task(cfg.task).problem(0))
    steps = [env.step("no") for _ in range(cfg.rollout.environment.max_turns)]
    assert [s.done for s in steps] == [False, False, False, True]
    assert steps[-1].reward == 0.0


def test_an_environment_error_fails_the_step_naming_it():
    cfg = verifiers_config(env_args={"case": "raises"})
    env = episode(cfg)
    env.reset(make_task(cfg.task).problem(0))
    with pytest.raises(RuntimeError, match="the environment's own bug"):
        env.step("no")


def test_a_left_episode_has_its_rollout_cancelled():
    from relayrl_tasks.envs.verifiers_env import event_loop

    cfg = verifiers_config(env_args={"case": "echo"})
    env = episode(cfg)
    env.reset(make_task(cfg.task).problem(0))
    del env
    gc.collect()
    deadline = time.monotonic() + 10
    while asyncio.run_coroutine_threadsafe(_pending(), event_loop()).result() \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert asyncio.run_coroutine_threadsafe(_pending(), event_loop()).result() == 0


async def _pending() -> int:
    return len(asyncio.all_tasks()) - 1  # less this one


@pytest.mark.parametrize("case,match", [
    ("broken", "raised RuntimeError: .*cannot build"),
    ("other", "not a vf.MultiTurnEnv"),
    ("tools", "with tools are not supported"),
])
def test_an_environment_that_cannot_serve_is_refused_naming_env_id(case, match):
    with pytest.raises(ConfigError, match=f"task.env_id .*{match}"):
        make_task(verifiers_config(env_args={"case": case}).task)


def test_an_unknown_environment_module_is_refused():
    with pytest.raises(ConfigError, match="task.env_id 'no-such-env'.*no_such_env"):
        make_task(verifiers_config(env_id="no-such-env").task)


def test_loading_leaves_the_service_signal_handlers_alone():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    make_task(verifiers_config(env_args={"case": "echo", "max_turns": 2}).task)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


# OpenEnv ----------------------------------------------------------------------------------

Action, Observation = openenv.env_server.Action, openenv.env_server.Observation


@dataclass(kw_only=True)
class Say(Action):
    text: str


@dataclass(kw_only=True)
class TwoTexts(Action):
    a: str
    b: str


@dataclass(kw_only=True)
class Heard(Observation):
    echo: str = ""
    count: int = 0


class Parrot(openenv.env_server.Environment):
    """Repeats the reply; done, with reward 1, after `turns` steps."""
    def __init__(self, turns: int = 2):
        super().__init__()
        self.turns, self.n = turns, 0

    def reset(self):
        self.n = 0
        return Heard(echo="start")

    def step(self, action):
        self.n += 1
        return Heard(echo=action.text, count=self.n, done=self.n >= self.turns,
                     reward=float(self.n >= self.turns))

    @property
    def state(self):
        return openenv.env_server.State(step_count=self.n)


class ParrotClient:
    """An HTTPEnvClient's surface (reset and step return StepResults), served in process."""
    opened: list[str] = []

    def __init__(self, base_url: str, request_timeout_s: float):
        self.env, self.url = Parrot(), base_url
        ParrotClient.opened.append(base_url)

    def reset(self):
        from openenv_core.client_types import StepResult
        return StepResult(self.env.reset())

    def step(self, action):
        from openenv_core.client_types import StepResult
        obs = self.env.step(action)
        return StepResult(obs, obs.reward, obs.done)


HERE = "tests.unit.test_ecosystem_adapters"
PROBLEM = Problem(0, "", "", ({"role": "user", "content": "Play."},))


def openenv_episode(**options):
    return make_environment(load_environment("openenv"), {"action": f"{HERE}:Say", **options})


def test_an_openenv_episode_turns_observations_into_messages_and_rewards():
    env = openenv_episode(env=f"{HERE}:Parrot", env_args={"turns": 2},
                          observation_field="echo")
    assert env.reset(PROBLEM) == [{"role": "user", "content": "Play.\n\nstart"}]
    assert env.step("hello") == ([{"role": "user", "content": "hello"}], 0.0, False)
    assert env.step("bye") == ([], 1.0, True)


def test_an_observation_without_one_text_field_is_shown_whole():
    env = openenv_episode(env=f"{HERE}:Parrot", env_args={"turns": 3})
    env.reset(PROBLEM)
    assert env.step("hi").messages == [{"role": "user", "content": "hi"}]  # the one str field
    env = openenv_episode(env=f"{HERE}:Parrot", observation_field="count")
    with pytest.raises(ValueError, match="observation_field 'count'.*int, not text"):
        env.reset(PROBLEM)


@pytest.mark.parametrize("options,match", [
    ({}, "exactly one of env"),
    ({"env": f"{HERE}:Parrot", "client": f"{HERE}:ParrotClient"}, "exactly one of env"),
    ({"client": f"{HERE}:ParrotClient"}, "base_urls"),
    ({"env": f"{HERE}:Parrot", "action": f"{HERE}:Parrot"}, "options.action: .*not an OpenEnv"),
    ({"env": f"{HERE}:Parrot", "action": f"{HERE}:TwoTexts"}, r"text fields \['a', 'b'\]"),
    ({"env": f"{HERE}:Nope"}, "options.env: cannot import"),
])
def test_bad_openenv_options_are_refused_naming_the_option(options, match):
    with pytest.raises(ConfigError, match=match):
        openenv_episode(**options)


def test_an_http_episode_holds_its_server_until_it_ends_or_is_dropped():
    urls = ["http://env-a", "http://env-b"]
    ParrotClient.opened.clear()
    first = openenv_episode(client=f"{HERE}:ParrotClient", base_urls=urls)
    second = openenv_episode(client=f"{HERE}:ParrotClient", base_urls=urls)
    assert sorted(ParrotClient.opened) == urls  # one server each
    first.reset(PROBLEM)
    first.step("a")
    assert first.step("b").done  # ended: its server is free again
    third = openenv_episode(client=f"{HERE}:ParrotClient", base_urls=urls)
    assert ParrotClient.opened[-1] == ParrotClient.opened[0]
    del second, third
    gc.collect()  # dropped episodes hand theirs back too
    again = [openenv_episode(client=f"{HERE}:ParrotClient", base_urls=urls) for _ in urls]
    assert sorted(ParrotClient.opened[-2:]) == urls
    del again

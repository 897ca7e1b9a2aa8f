"""Multi-turn token bookkeeping: turn N+1's context extends turn N's exactly, environment tokens
are masked, the model's log-probabilities and versions stay aligned with its tokens across
turns, and the reward rule. On the tiny model, whose tokenizer is given a chat template here;
SmolLM2's real template too when its converted copy is cached. Run:
pytest tests/unit/test_episodes.py"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from transformers import AutoTokenizer

from relayrl.config import RunConfig
from relayrl.contracts.leases import LeasedPrompt
from relayrl.contracts.messages import validate_sample
from relayrl.plugins.envs import Environment, Step
from relayrl_tasks.episodes.play import error_kind
from relayrl_tasks.episodes.turns import TurnGlue
from relayrl_tasks.rewards import get_reward
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.episode_generator import EpisodeGenerator
from rollout_svc.episodes import episode_samples

SMOLLM2 = Path(__file__).resolve().parents[2] / ".cache/relayrl/models/smollm2-135m-instruct"
USER = [{"role": "user", "content": "1+2"}]


def ids(lm, text):
    return lm.tokenizer.encode(text, add_special_tokens=False)


def test_the_glue_is_what_the_template_adds(chat_lm):
    glue, eos = TurnGlue(chat_lm.tokenizer, chat_lm.eos_ids), chat_lm.eos_id
    assert glue.prompt(USER) == [chat_lm.tokenizer.bos_token_id] + ids(chat_lm, "1+2=+")
    obs = [{"role": "user", "content": "4"}]
    # the model's own <eos> closed its turn: the template's copy is left out
    assert glue.between(USER, "3", True, obs) == ids(chat_lm, "4=+")
    # cut before its <eos>: the template's closing is added, as an environment token
    assert glue.between(USER, "3", False, obs) == [eos] + ids(chat_lm, "4=+")


@pytest.mark.parametrize("stopped", [True, False])
def test_turns_extend_to_the_whole_conversation_rendered(chat_lm, stopped):
    glue, eos = TurnGlue(chat_lm.tokenizer, chat_lm.eos_ids), chat_lm.eos_id
    reply = ids(chat_lm, "3") + ([eos] if stopped else [])
    obs = [{"role": "user", "content": "4+4"}, {"role": "system", "content": "5"}]
    seq = glue.prompt(USER) + reply + glue.between(USER, "3", stopped, obs)
    assert seq == glue.prompt([*USER, {"role": "assistant", "content": "3"}, *obs])


def test_a_template_that_rewrites_earlier_turns_is_refused(chat_lm):
    tokenizer = AutoTokenizer.from_pretrained(chat_lm.path)
    tokenizer.chat_template = "{{ messages[-1]['content'] }}="  # the last message only
    with pytest.raises(ValueError, match="changes the tokens before it"):
        TurnGlue(tokenizer, chat_lm.eos_ids).check()


def test_no_template_lays_messages_end_to_end(tiny_lm):
    glue = TurnGlue(tiny_lm.tokenizer, tiny_lm.eos_ids)
    assert glue.between(USER, "3", True, [{"role": "user", "content": "4="}]) == ids(tiny_lm,
                                                                                     "4=")


def test_smollm2_template_extends_exactly():
    if not SMOLLM2.is_dir():  # checked when it runs: the integration tier converts it first
        pytest.skip("SmolLM2 not converted in .cache (tests/integration/test_smollm2.py does)")
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    glue = TurnGlue(tokenizer, [tokenizer.eos_token_id])
    glue.check()
    reply = "Let me use <calc>12*7</calc>."
    model = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    obs = [{"role": "user", "content": "<result>84</result>"}]
    seq = glue.prompt(USER) + model + glue.between(USER, reply, True, obs)
    assert seq == glue.prompt([*USER, {"role": "assistant", "content": reply}, *obs])


class Twice(Environment):
    """Two observations, rewarded 0.25 each, then done on the third reply."""

    def __init__(self, bonus: float = 0.5):
        self.bonus, self.steps = bonus, 0

    def step(self, message):
        self.steps += 1
        if self.steps == 3:
            return Step([], self.bonus, True)
        return [{"role": "user", "content": "1+1"}], 0.25, False


class NoRedis:
    def __getattr__(self, name):
        raise redis.ConnectionError("no redis in this test")


def generator(lm, max_new_tokens=12, max_turns=4, env="tests.unit.test_episodes:Twice",
              options=None, samples=3, **bounds):
    cfg = RunConfig.model_validate({
        "buffer": {"group_size": samples}, "rollout": {
            "max_new_tokens": max_new_tokens,
            "segment_tokens": 0, "environment": {"cls": env, "max_turns": max_turns,
                                                 "options": options or {}, **bounds}}})
    # keeping KV states as a worker does: each turn resumes from the turn before
    engine = TorchEngine(lm, seed=3, version=7, kv_cache_tokens=4096)
    writer = type("Writer", (), {"r": NoRedis()})()
    return cfg, EpisodeGenerator(cfg.rollout_part(), engine, lm, writer)


def run(gen, lease):
    group = gen.start(lease)
    while not group.finished:
        gen.generate_segment([group])
        gen.engine._version += 1  # every turn under newer weights
    return group


LEASE = LeasedPrompt("l1", 5, "", "3", 0, messages=tuple(USER))


def rescored(lm, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(ids).logits[0, :-1].float(), -1)
    return logp[len(prompt) - 1:, :].gather(1, torch.tensor(response)[:, None])[:, 0]


def test_an_episode_keeps_the_models_tokens_logprobs_and_versions(chat_lm):
    cfg, gen = generator(chat_lm)
    group = run(gen, LEASE)
    if any(e.turns > 1 for e in group.episodes):  # later turns resumed the earlier's KV
        assert gen.engine.tokens_resumed > 0
    samples = episode_samples(LEASE, group, "w", get_reward("exact_match"), None)
    glue = TurnGlue(chat_lm.tokenizer, chat_lm.eos_ids)
    for e, s in zip(group.episodes, samples, strict=True):
        validate_sample(s)
        mask = s.policy_token_mask
        assert sum(mask) <= cfg.rollout.max_new_tokens and e.turns <= 3
        # the environment's tokens: log-probability 0, the version of the turn before them
        assert (s.logprobs[~mask] == 0).all()
        # the model's: log-probabilities of the model on exactly this context
        torch.testing.assert_close(rescored(chat_lm, e.prompt_tokens, s.response_tokens.tolist()
                                            )[torch.from_numpy(mask)],
                                   torch.from_numpy(s.logprobs[mask]), atol=1e-4, rtol=0)
        # one version per model turn, 7 first; the glue after a turn carries its version
        runs = [int(v) for v in s.versions]
        assert runs[0] == 7 and runs == sorted(runs) and len(set(runs)) == e.turns
        specials = set(chat_lm.tokenizer.all_special_ids) - {chat_lm.eos_id}
        if not specials & set(s.response_tokens.tolist()):
            # the response is the whole conversation as the template renders it (a model's
            # <pad> would decode to nothing: then only the tokens are the truth)
            whole = glue.render([*e.messages, {"role": "assistant", "content": e.last_reply}],
                                False)
            seq = s.prompt_tokens.tolist() + s.response_tokens.tolist()
            assert seq == whole if e.seq.finish_reason == "stop" else whole[:len(seq)] == seq
        if e.seq.finish_reason == "stop" and e.turns == 3:
            assert s.reward == 0.25 + 0.25 + 0.5


def test_the_token_budget_spans_turns_and_a_cut_reply_is_not_stepped(chat_lm):
    _, gen = generator(chat_lm, max_new_tokens=2, max_turns=8)
    group = run(gen, LEASE)
    for e in group.episodes:
        assert e.policy_tokens <= 2
        assert e.seq.finish_reason == "length" or e.turns <= 2


class Broken(Environment):
    def step(self, message):
        raise RuntimeError("boom")


def test_an_environment_that_raises_scores_zero_with_the_error(chat_lm):
    _, gen = generator(chat_lm, env="tests.unit.test_episodes:Broken")
    group = run(gen, LEASE)
    samples = episode_samples(LEASE, group, "w", get_reward("exact_match"), None)
    failed = [s for s in samples if s.reward_error]  # a reply cut by the budget is not stepped
    assert len(failed) == gen.env_errors >= 1
    assert all(s.reward == 0 and "environment: Broken.step: raised: RuntimeError: boom"
               == s.reward_error for s in failed)
    assert gen.env_error_kinds == {"raised": gen.env_errors}


class LongOpening(Environment):
    """Opens with a conversation of `chars` characters."""

    def __init__(self, chars: int):
        self.chars = chars

    def reset(self, problem):
        return [{"role": "user", "content": "1" * self.chars}]

    def step(self, message):
        return Step([], 1.0, True)


def test_an_opening_longer_than_the_window_is_never_cut(chat_lm):
    _, gen = generator(chat_lm, env="tests.unit.test_episodes:LongOpening",
                       options={"chars": 1000})
    assert gen.prompt_limit < 1000  # one character a token or more on this tokenizer
    group = run(gen, LEASE)
    samples = episode_samples(LEASE, group, "w", get_reward("exact_match"), None)
    assert gen.env_error_kinds == {"prompt_window": 3}
    for e, s in zip(group.episodes, samples, strict=True):
        assert e.prompt_tokens == chat_lm.encode_problem("", USER)  # the task's own prompt
        assert s.reward == 0 and s.reward_error.startswith(
            "environment: LongOpening.reset: prompt_window: its opening is ")


class Silent(Environment):
    def step(self, message):
        return Step([], None, True)


def test_no_environment_reward_falls_back_to_the_task_reward(chat_lm):
    _, gen = generator(chat_lm, env="tests.unit.test_episodes:Silent")
    group = run(gen, LEASE)
    for e in group.episodes:
        e.last_reply = "3"
    samples = episode_samples(LEASE, group, "w", get_reward("exact_match"), (0.0, 1.0))
    assert [s.reward for s in samples] == [1.0] * 3 and all(s.loss_mask is None
                                                           for s in samples)


def test_environment_rewards_sum_and_are_checked_against_the_range():
    from rollout_svc.episodes import Episode, EpisodeGroup

    episodes = [Episode(None, [], [1], rewards=r) for r in ([0.25, 0.5], [5.0])]
    for e in episodes:
        e.add_model_turn([4], [-0.1], 2)
        e.end("stop")
    samples = episode_samples(LEASE, EpisodeGroup(LEASE, episodes), "w",
                              get_reward("exact_match"), (0.0, 1.0))
    assert samples[0].reward == 0.75 and not samples[0].reward_error
    assert samples[1].reward == 0 and "outside buffer.reward_range" in samples[1].reward_error


def test_a_failed_environment_scores_zero_and_only_the_others_ask_the_task():
    from relayrl_tasks.episodes.reward import episode_rewards
    from rollout_svc.episodes import Episode

    asked = []

    def reward(completions, conversations):
        asked.append([c[-1]["content"] for c in conversations])
        return [float(c == "3") for c in completions]

    error = "environment: E.step: raised: RuntimeError: boom"
    failed = Episode(None, USER, [1], rewards=[1.0], last_reply="3", error=error)
    failed_plain = Episode(None, USER, [1], last_reply="3", error=error)
    stepped = Episode(None, USER, [1], rewards=[0.5], last_reply="7")
    plain = Episode(None, USER, [1], last_reply="4")
    assert episode_rewards([failed, failed_plain, stepped, plain], reward, "3",
                           prompt=USER) == [(0.0, error), (0.0, error), (0.5, ""), (0.0, "")]
    assert asked == [["4"]]  # once for the group, with the whole conversation


def test_a_non_finite_step_reward_is_refused_by_name():
    from relayrl.plugins.envs import as_step

    with pytest.raises(ValueError, match="Env.step: reward is nan, not a finite number"):
        as_step(([], float("nan"), True), "Env.step")
    assert as_step(([], 1e300, True), "Env.step").reward == 1e300  # finite: range is score's


@pytest.mark.parametrize("reward, kind", [(True, "bool"), ("1.0", "str"), ([1.0], "list")])
def test_a_step_reward_follows_the_task_rewards_rule(reward, kind):
    from relayrl.plugins.envs import as_step

    with pytest.raises(ValueError, match=f"Env.step: reward is a {kind}, not a number or None"):
        as_step(([], reward, True), "Env.step")
    assert as_step(([], np.float32(0.5), True), "Env.step").reward == 0.5


# Bounded environments: each failure below is what a user's environment did to a run (a huge
# observation, a slow step or reset, an episode that floods its context); each must end its
# own episode with an error naming the limit, be logged and counted by kind, and leave the
# other episodes of the turn to finish.

class Unruly(Environment):
    """Episode i (its reset is the i-th of the class) misbehaves as `plan[i]` says: "huge" (an
    observation of `chars` characters), "slow_step" (step blocks until released), "slow_reset",
    "flood" (many small observations), "together" (step returns once the steps of all the
    episodes run) or "" (answers once, then done)."""

    opened = 0
    release = threading.Event()  # lets blocked calls return when the test ends

    def __init__(self, plan=(), chars=5_000_000):
        self.kind = plan[Unruly.opened % len(plan)] if plan else ""
        Unruly.opened += 1
        self.chars, self.steps = chars, 0

    def reset(self, problem):
        if self.kind == "slow_reset":
            Unruly.release.wait(30)
        return None

    def step(self, message):
        self.steps += 1
        if self.kind == "slow_step":
            Unruly.release.wait(30)
        if self.kind == "together":
            Unruly.together.wait(20)
            return Step([], 1.0, True)
        if self.kind == "huge":
            return Step([{"role": "user", "content": "1" * self.chars}])
        if self.kind == "flood":
            return Step([{"role": "user", "content": "1+1"}])
        return Step([], 1.0, self.steps >= 2)


@pytest.fixture
def unruly():
    Unruly.opened = 0
    Unruly.release.clear()
    yield Unruly
    Unruly.release.set()


def play_bounded(lm, plan, caplog, max_new_tokens=12, max_turns=4, **bounds):
    """A group of len(plan) episodes of Unruly, played to the end; its samples."""
    _, gen = generator(lm, max_new_tokens=max_new_tokens, max_turns=max_turns,
                       env="tests.unit.test_episodes:Unruly", options={"plan": list(plan)},
                       samples=len(plan), **bounds)
    gen.engine.generate = stopping(gen.engine.generate)
    with caplog.at_level(logging.WARNING):
        group = run(gen, LEASE)
    return gen, episode_samples(LEASE, group, "w", get_reward("exact_match"), None)


def stopping(generate):
    """The engine's replies, cut to 2 tokens and ended as if the model stopped: every episode
    is stepped, every turn."""
    def wrapped(prompts, spec):
        outs = generate(prompts, spec)
        for o in outs:
            o.tokens, o.logprobs, o.finish_reason = o.tokens[:2], o.logprobs[:2], "stop"
        return outs
    return wrapped


def assert_only(gen, samples, failed, kind, caplog):
    """`failed` episodes (the misbehaving ones: the environments are built at once, in no set
    order) ended with a `kind` error, logged and counted; the others finished without one,
    rewarded by their environment."""
    errors = [s.reward_error for s in samples if s.reward_error]
    method = "reset" if "reset" in kind else "step"
    assert len(errors) == failed and all(
        e.startswith(f"environment: Unruly.{method}: {kind}: ") and error_kind(e) == kind
        for e in errors), errors
    assert all(s.reward == 0 for s in samples if s.reward_error)
    assert all(s.reward == 1.0 for s in samples if not s.reward_error)  # played to the end
    assert gen.env_error_kinds == {kind: failed} and gen.env_errors == failed
    logged = [r.getMessage() for r in caplog.records if f": {kind}: " in r.getMessage()]
    assert len(logged) == failed
    return errors


def test_a_huge_observation_ends_its_episode_before_it_is_tokenized(chat_lm, unruly, caplog,
                                                                     monkeypatch):
    tokenized = []
    between = TurnGlue.between
    monkeypatch.setattr(TurnGlue, "between", lambda self, m, r, s, obs: tokenized.append(
        sum(len(o["content"]) for o in obs)) or between(self, m, r, s, obs))
    gen, samples = play_bounded(chat_lm, ["", "huge", ""], caplog, max_observation_chars=1000)
    [error] = assert_only(gen, samples, 1, "max_observation_chars", caplog)
    assert error.endswith("returned 5000000 characters of messages (rollout.environment."
                          "max_observation_chars 1000)")
    assert all(n <= 1000 for n in tokenized)  # the 5 MB never reached the tokenizer


def test_a_slow_step_ends_its_own_episode_and_the_others_finish(chat_lm, unruly, caplog):
    gen, samples = play_bounded(chat_lm, ["", "slow_step", "slow_step", ""], caplog,
                                step_timeout_s=0.2)
    errors = assert_only(gen, samples, 2, "step_timeout_s", caplog)
    assert all(e.endswith("no answer within 0.2 s (rollout.environment.step_timeout_s 0.2)")
               for e in errors)
    assert gen.calls.stuck == 2  # still running on their threads, counted
    Unruly.release.set()
    deadline = time.monotonic() + 30  # the released calls return at once, on a busy machine later
    while gen.calls.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gen.calls.stuck == 0  # and uncounted once they return


def test_the_steps_of_a_turn_run_at_once(chat_lm, unruly, caplog):
    """Eight steps that each return only once all eight are running: one after another, each
    would wait for the others until its deadline."""
    Unruly.together = threading.Barrier(8)
    gen, samples = play_bounded(chat_lm, ["together"] * 8, caplog, step_timeout_s=20)
    assert gen.env_errors == 0 and all(s.reward == 1.0 for s in samples)


def test_a_slow_step_holds_up_its_own_episode_alone(chat_lm, unruly):
    """While one episode's environment has not answered, the others take all their turns;
    the waiting one goes on once its answer comes, with no error."""
    _, gen = generator(chat_lm, max_turns=3, env="tests.unit.test_episodes:Unruly",
                       options={"plan": ["slow_step", "flood", "flood"]}, samples=3,
                       step_timeout_s=30)
    gen.engine.generate = stopping(gen.engine.generate)
    group = gen.start(LEASE)
    others = [e for e in group.episodes if e.env.kind == "flood"]
    [waiting] = [e for e in group.episodes if e.env.kind == "slow_step"]
    # segments until done, not a fixed count: a segment with no episode ready returns after
    # a short wait, and on a busy machine the others' steps take many such waits to answer
    deadline = time.monotonic() + 30
    while not all(e.finished for e in others) and time.monotonic() < deadline:
        gen.generate_segment([group])
    assert all(e.finished and e.turns == 3 for e in others)
    assert not waiting.finished and waiting.step is not None and waiting.turns == 1
    Unruly.release.set()
    deadline = time.monotonic() + 30
    while not group.finished and time.monotonic() < deadline:
        gen.generate_segment([group])
    assert waiting.finished and waiting.turns == 1 and waiting.rewards == [1.0]
    assert gen.env_errors == 0 and not any(e.error for e in group.episodes)


def test_a_step_still_running_when_its_group_is_dropped_counts_as_stuck(chat_lm, unruly):
    """A group let go while its environment is answering (handed back, restarted as stale)
    leaves that call running with nobody to wait for it: it counts against max_stuck_calls
    until it returns, like a call past its deadline, and is not counted as an overrun."""
    _, gen = generator(chat_lm, max_turns=3, env="tests.unit.test_episodes:Unruly",
                       options={"plan": ["slow_step", ""]}, samples=2, step_timeout_s=30)
    gen.engine.generate = stopping(gen.engine.generate)
    group = gen.start(LEASE)
    gen.generate_segment([group])
    [waiting] = [e for e in group.episodes if e.step is not None]
    gen.drop([group])
    assert waiting.step is None and gen.calls.stuck == 1 and gen.calls.overruns == 0
    gen.drop([group])  # dropping again counts nothing more
    assert gen.calls.stuck == 1
    Unruly.release.set()
    deadline = time.monotonic() + 30  # the released call returns at once; a busy machine
    while gen.calls.stuck and time.monotonic() < deadline:  # may be slow to run its thread
        time.sleep(0.01)
    assert gen.calls.stuck == 0


def test_a_slow_reset_ends_its_own_episode(chat_lm, unruly, caplog):
    gen, samples = play_bounded(chat_lm, ["slow_reset", "", ""], caplog, reset_timeout_s=0.2)
    [error] = assert_only(gen, samples, 1, "reset_timeout_s", caplog)
    assert error.endswith("(rollout.environment.reset_timeout_s 0.2)")


def test_an_episode_past_its_environment_token_budget_ends(chat_lm, unruly, caplog):
    gen, samples = play_bounded(chat_lm, ["flood", ""], caplog, max_new_tokens=40,
                                max_turns=40, max_env_tokens=10)
    [error] = assert_only(gen, samples, 1, "max_env_tokens", caplog)
    assert error.endswith("(rollout.environment.max_env_tokens 10)")
    assert all((~s.policy_token_mask).sum() <= 10 for s in samples)


def test_stuck_calls_are_bounded_then_refused(chat_lm, unruly, caplog):
    gen, samples = play_bounded(chat_lm, ["slow_step"] * 3 + [""] * 2, caplog,
                                step_timeout_s=0.2, max_stuck_calls=2)
    # the first two stuck calls fill the bound at the first turn; the third overruns too
    assert gen.calls.stuck == 3 and gen.env_error_kinds["step_timeout_s"] == 3
    assert any("max_stuck_calls 2" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)
    # a new episode now: refused, without starting a thread
    threads = threading.active_count()
    group = gen.start(LEASE)
    assert threading.active_count() == threads
    assert all(e.error.startswith("environment: Unruly.reset: max_stuck_calls: not called: 3 "
                                  "calls are still running") for e in group.episodes)
    assert gen.env_error_kinds["max_stuck_calls"] == 5


def test_the_limits_are_refused_out_of_bounds():
    from relayrl.config import ConfigError

    for field, value in [("max_observation_chars", 0), ("step_timeout_s", 0),
                         ("reset_timeout_s", -1), ("max_env_tokens", 0),
                         ("max_stuck_calls", 0)]:
        with pytest.raises((ConfigError, ValueError), match=field):
            RunConfig.model_validate({"rollout": {"segment_tokens": 0, "environment": {
                "cls": "calculator", field: value}}})

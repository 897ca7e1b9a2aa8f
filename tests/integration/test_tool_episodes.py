"""Function calling in a rollout worker's episodes, on a real model and tokenizer (a tiny
Llama with SmolLM2's tokenizer and chat template, and the same model under a template that
renders tools itself): the tools are declared in the prompt, the model's call runs, its
result comes back as a `tool` turn whose tokens are masked, turn N+1 extends turn N's
tokens exactly, the answer is scored by the task's reward, and a bad call is answered and
counted while the episode goes on. The model's replies are scripted (a random model writes
no calls); everything else is the worker's own path."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from relayrl.config import RunConfig
from relayrl.contracts.leases import LeasedPrompt
from relayrl.contracts.messages import validate_sample
from relayrl.plugins.chat import ToolCall, hermes_text
from relayrl.plugins.envs import ToolEnvironment
from relayrl.plugins.envs.tools import declared_tools
from relayrl_tasks.episodes.turns import TurnGlue
from relayrl_tasks.rewards import get_reward
from relayrl_testkit.families import build_family
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import ensure_smollm2
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.episode_generator import EpisodeGenerator
from rollout_svc.episodes import episode_samples
from tests.unit.test_episodes import NoRedis
from tests.unit.test_tools import HERMES

ROOT = Path(__file__).resolve().parents[2]
QUESTION = ({"role": "user", "content": "What is 2+3?"},)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


class Adder(ToolEnvironment):
    tools = [add]


@pytest.fixture(scope="module", params=["smollm2", "hermes"])
def lm(request, tmp_path_factory):
    tokenizer_dir = ensure_smollm2(ROOT / ".cache/relayrl/models")
    lm = load_model(build_family("llama", tmp_path_factory.mktemp("tools") / "llama",
                                 tokenizer_dir))
    if request.param == "hermes":  # a template that renders the tools itself
        lm.tokenizer = AutoTokenizer.from_pretrained(lm.path)
        lm.tokenizer.chat_template = HERMES
    return lm


def scripted(gen: EpisodeGenerator, replies: list[str]) -> None:
    """The engine's n-th turn of every episode is replies[n] (then its end of turn); its
    log-probabilities stay the engine's own."""
    generate, turn = gen.engine.generate, [0]
    eos = gen.lm.eos_ids[0]

    def wrapped(prompts, spec):
        outs = generate(prompts, spec)
        tokens = gen.lm.tokenizer.encode(replies[turn[0]], add_special_tokens=False) + [eos]
        turn[0] += 1
        for o in outs:
            o.tokens, o.finish_reason = tokens, "stop"
            o.logprobs = (o.logprobs * len(tokens))[:len(tokens)]
        return outs

    gen.engine.generate = wrapped


def play(lm, replies: list[str], samples: int = 2):
    cfg = RunConfig.model_validate({
        "buffer": {"group_size": samples}, "rollout": {
            "max_new_tokens": 200, "segment_tokens": 0,
            "environment": {"cls": "tests.integration.test_tool_episodes:Adder",
                            "max_turns": 4, "options": {"tool_timeout_s": 5}}}})
    engine = TorchEngine(lm, seed=3, version=1, kv_cache_tokens=8192)
    gen = EpisodeGenerator(cfg.rollout_part(), engine, lm, type("Writer", (), {"r": NoRedis()})())
    scripted(gen, replies)
    lease = LeasedPrompt("l1", 5, "", "5", 0, messages=QUESTION)
    group = gen.start(lease)
    while not group.finished:
        gen.generate_segment([group])
    return gen, group, episode_samples(lease, group, "w", get_reward("exact_match"), None)


def test_a_tool_call_runs_and_its_result_is_a_masked_tool_turn(lm):
    call = hermes_text([ToolCall("add", {"a": 2, "b": 3})])
    gen, group, samples = play(lm, [call, "5"])
    glue = TurnGlue(lm.tokenizer, lm.eos_ids, declared_tools(Adder))
    assert gen.tool_calls == 2 and not gen.tool_error_kinds and gen.env_errors == 0
    for e, s in zip(group.episodes, samples, strict=True):
        validate_sample(s)
        prompt = lm.tokenizer.decode(s.prompt_tokens)
        assert '"name": "add"' in prompt and "<tools>" in prompt  # declared to the model
        assert e.messages[-1] == {"role": "tool", "content": "5"}
        # the whole episode is the conversation as the template renders it, with the tools,
        # up to the model's end of turn (the template may add a newline after it)
        whole = glue.render([*e.messages, {"role": "assistant", "content": "5"}], False)
        seq = s.prompt_tokens.tolist() + s.response_tokens.tolist()
        assert seq == whole[:len(seq)] and seq[-1] in lm.eos_ids
        assert lm.tokenizer.decode(whole[len(seq):]).strip() == ""
        # the model's tokens: its two replies; everything between them is masked
        mask = s.policy_token_mask
        policy = s.response_tokens[mask].tolist()
        assert lm.tokenizer.decode(policy, skip_special_tokens=True) == call + "5"
        env_text = lm.tokenizer.decode(s.response_tokens[~mask])
        assert "5" in env_text and (s.logprobs[~mask] == 0).all()
        assert s.reward == 1.0 and not s.reward_error  # the answer, scored by the task


def test_a_bad_call_is_answered_and_counted_and_the_episode_goes_on(lm):
    unknown = hermes_text([ToolCall("multiply", {"a": 2, "b": 3})])
    gen, group, samples = play(lm, [unknown, "<tool_call>{oops</tool_call>", "5"])
    assert gen.tool_error_kinds == {"unknown_tool": 2, "malformed": 2} and gen.env_errors == 0
    for e, s in zip(group.episodes, samples, strict=True):
        told = [m["content"] for m in e.messages if m["role"] == "tool"]
        assert told[0].startswith("error: no tool is named 'multiply'; the tools are add")
        assert told[1].startswith("error: the call is not JSON")
        assert e.turns == 3 and s.reward == 1.0

"""A judge reward against a real judge model: SmolLM2-135M-Instruct served by RelayRL's own
OpenAI-compatible server scores completions concurrently, with a cache; and a judge that is
down, too slow or replies with garbage scores 0 with a JudgeError (counted per kind), within
its deadline, never stalling the caller."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from relayrl.config import RolloutConfig
from relayrl.runtime.auth import Credentials
from relayrl_tasks.rewards import score_group
from relayrl_tasks.rewards.judge import JudgeError, JudgeReward, parse_score, parse_verdict
from relayrl_tasks.rewards.scoring import reward_error_kind
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import ensure_smollm2
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.serving.openai_server import OpenAIServer
from tests.conftest import free_ports

ROOT = Path(__file__).resolve().parents[2]
RUBRIC = ("Question: {prompt}\nAnswer: {completion}\nIs the answer correct? Give a score "
          "from 0 to 10. Reply with 'Score: N'.")
VERDICT = "Question: {prompt}\nProposed answer: {completion}\nIs the proposed answer correct?"


@pytest.fixture(scope="module")
def judge_url():
    torch.manual_seed(0)
    lm = load_model(ensure_smollm2(ROOT / ".cache/relayrl/models"))
    gen = CustomGenerator(TorchEngine(lm), lm, RolloutConfig())
    (port,) = free_ports(1)
    server = OpenAIServer(gen, "127.0.0.1", port, "smollm2", credentials=Credentials())
    server.start()
    yield f"http://127.0.0.1:{port}/v1"
    server.stop()


def test_a_real_judge_model_scores_a_group_concurrently_and_caches(judge_url):
    judge = JudgeReward(judge_url, "smollm2", VERDICT, parse=parse_verdict, scale=(0, 1),
                        max_concurrency=4, max_tokens=4)
    completions = ["5", "4", "2+3 is 5", "seven"]
    first = score_group(judge, completions, "5", prompt="What is 2+3?")
    assert len(first) == 4 and judge.calls >= 4
    for reward, error in first:  # a score in range, or the judge's reply named as garbage
        assert (0.0 <= reward <= 1.0 and not error) or error.startswith("JudgeError:")
    assert any(not error for _, error in first), first  # the model does say yes or no
    calls = judge.calls
    again = score_group(judge, completions, "5", prompt="What is 2+3?")
    assert again == first or all(e for _, e in first if e)  # answered from the cache
    assert judge.calls == calls + sum(1 for _, e in first if e)  # only failures are asked again
    assert judge.cache_hits == sum(1 for _, e in first if not e)


class Peer(BaseHTTPRequestHandler):
    """A judge that misbehaves as the test asks: slow, or not a chat completion."""

    mode = "garbage"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.mode == "slow":
            time.sleep(2.0)
        body = json.dumps({"choices": [{"message": {"content": "I like this answer"}}]}
                          if self.mode == "no_score" else {"oops": True}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def peer():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Peer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@pytest.mark.parametrize("mode,message", [
    ("garbage", "not a chat completion"),
    ("no_score", "no score in the reply 'I like this answer'"),
    ("slow", "no answer within 0.3 s (2 tries)"),
])
def test_a_misbehaving_judge_scores_0_with_the_error_named(peer, mode, message):
    Peer.mode = mode
    judge = JudgeReward(f"http://127.0.0.1:{peer.server_port}/v1", "m", RUBRIC,
                        timeout_s=0.3, retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    (reward, error), = score_group(judge, ["5"], "5", prompt="What is 2+3?")
    assert reward == 0.0 and message in error and reward_error_kind(error) == "judge"
    assert time.monotonic() - t0 < 5
    assert judge.failures == 1


def test_a_judge_that_is_down_is_retried_then_given_up():
    (port,) = free_ports(1)  # nothing listens there
    judge = JudgeReward(f"http://127.0.0.1:{port}/v1", "m", RUBRIC, retries=2,
                        backoff_s=0.01)
    (reward, error), = score_group(judge, ["5"], "5", prompt="q")
    assert reward == 0.0 and "(3 tries)" in error and judge.calls == 3


def test_scores_are_parsed_and_scaled_and_bad_settings_refused():
    assert parse_score("Score: 7") == 7.0 and parse_score("I'd say 3.5") == 3.5
    assert parse_verdict("Yes, it is.") == 1.0 and parse_verdict("That is wrong") == 0.0
    with pytest.raises(JudgeError, match="no score"):
        parse_score("between 2 and 3")
    judge = JudgeReward("http://127.0.0.1:1/v1", "m", "{prompt} {completion} {level}")
    assert judge._reward(5) == 0.5
    with pytest.raises(JudgeError, match="outside the scale"):
        judge._reward(11)
    with pytest.raises(JudgeError, match=r"the rubric names \['level'\]"):
        judge.question("c", "r", {}, "p", [])
    assert judge.question("c", "r", {"level": 2}, "p", []) == "p c 2"
    for kwargs, message in (({"url": "ftp://x"}, "not an http"),
                            ({"scale": (10, 0)}, "lowest first"),
                            ({"max_concurrency": 0}, "max_concurrency: 0 is below 1")):
        with pytest.raises(ValueError, match=message):
            JudgeReward(**{"url": "http://x/v1", "model": "m", **kwargs})

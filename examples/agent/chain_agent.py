"""A custom rollout: an agent that runs outside RelayRL's services, plays multi-turn episodes
against a rollout worker through the official `openai` client, and submits them for training.

The task is chained addition with an environment turn: the environment asks `a+b=`, the
policy answers; the environment then appends `+c=` (its tokens are masked out of the loss)
and the policy answers again. Reward: 0.5 for each correct answer. Every policy token keeps
the log-probability and policy version the server reported, so the trainer corrects for
staleness exactly as for its own workers.

    source runs/tiny/tokens.env   # the agent token `relayrl up` made for the run
    python examples/agent/chain_agent.py \\
        --http 127.0.0.1:50580 --buffer 127.0.0.1:50553 --groups 4 --group-size 8

Both servers want the run's agent token ($RELAYRL_AGENT_TOKEN, --token-env names another
variable) as `Authorization: Bearer <token>`: the openai client sends its api_key that way,
and the gRPC call carries it as metadata. An agent holds that token and never the service
token: it may generate and submit, not lease, publish or control. Each group is submitted
with its own request_id and retried with it when the buffer is unreachable or slow
(relayrl.plugins.buffer_client), so a lost reply never trains a group twice. A group the buffer
refuses as too stale (FAILED_PRECONDITION: the trainer moved past the bound while it was
played) is played again with the current weights, up to STALE_TRIES times.
"""

from __future__ import annotations

import argparse
import os
import random

import grpc
import httpx
import openai

from relayrl.contracts.proto.v1 import buffer_pb2, buffer_pb2_grpc
from relayrl.plugins.buffer_client import buffer_channel, submit_group

STALE_TRIES = 5


class ChainEpisodes:
    def __init__(self, http: str, model: str, max_tokens: int, temperature: float,
                 token: str, ca: str | None = None):
        self.base = f"{'https' if ca else 'http'}://{http}"
        self.verify = ca or True  # the run's CA (auth.tls.ca) when it serves TLS
        self.client = openai.OpenAI(base_url=f"{self.base}/v1", api_key=token,
                                    http_client=httpx.Client(verify=self.verify))
        self.headers = {"Authorization": f"Bearer {token}"}
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature

    def tokenize(self, text: str, special: bool) -> list[int]:
        resp = httpx.post(f"{self.base}/tokenize",
                          json={"prompt": text, "add_special_tokens": special},
                          headers=self.headers, timeout=30, verify=self.verify)
        resp.raise_for_status()
        return resp.json()["tokens"]

    def _complete(self, prompt: list[int], n: int):
        resp = self.client.completions.create(
            model=self.model, prompt=prompt, n=n, max_tokens=self.max_tokens,
            temperature=self.temperature, logprobs=0)
        version = resp.model_extra["policy_version"]
        return [(c.model_extra["token_ids"], c.logprobs.token_logprobs, version, c.text,
                 c.finish_reason) for c in resp.choices]

    def group(self, a: int, b: int, c: int, size: int) -> list[buffer_pb2.Trajectory]:
        """`size` episodes of one task instance: one GRPO group."""
        first_prompt = self.tokenize(f"{a}+{b}=", special=True)
        env = self.tokenize(f"+{c}=", special=False)
        out = []
        for t1, lp1, v1, text1, _ in self._complete(first_prompt, size):
            (t2, lp2, v2, text2, finish), = self._complete(first_prompt + t1 + env, 1)
            reward = 0.5 * (text1.strip() == str(a + b)) + 0.5 * (text2.strip() == str(a + b + c))
            out.append(buffer_pb2.Trajectory(
                prompt_tokens=first_prompt, response_tokens=t1 + env + t2,
                logprobs=lp1 + [0.0] * len(env) + lp2,
                versions=[v1] * len(t1) + [v2] * len(env) + [v2] * len(t2),
                loss_mask=[1] * len(t1) + [0] * len(env) + [1] * len(t2),
                reward=reward, finish_reason=finish))
        return out


def play_and_submit(episodes: ChainEpisodes, buffer, auth, a: int, b: int, c: int,
                    size: int) -> tuple[list[buffer_pb2.Trajectory], buffer_pb2.SubmitResponse]:
    """One group played and submitted; played again while the buffer refuses it as stale."""
    for attempt in range(STALE_TRIES):
        trajs = episodes.group(a, b, c, size)
        try:
            return trajs, submit_group(buffer, trajs, source="chain-agent", metadata=auth,
                                       timeout_s=30)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION or attempt == STALE_TRIES - 1:
                raise
            print(f"{a}+{b}, +{c}: {err.details()}; playing it again", flush=True)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--http", required=True, help="host:port of a worker's OpenAI server")
    ap.add_argument("--buffer", required=True, help="host:port of the buffer service")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8, help="= the run's buffer.group_size")
    ap.add_argument("--digits", type=int, default=1)
    ap.add_argument("--model", default="relayrl-policy")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-env", default="RELAYRL_AGENT_TOKEN",
                    help="environment variable holding the run's agent token "
                    "(= auth.agent_token_env; `relayrl up` writes it to <run_dir>/tokens.env)")
    ap.add_argument("--ca", default=None,
                    help="the run's CA certificate (auth.tls.ca): speak TLS and verify with it")
    args = ap.parse_args(argv)
    token = os.environ.get(args.token_env, "")  # empty: a run with auth.required false

    rng = random.Random(args.seed)
    episodes = ChainEpisodes(args.http, args.model, args.max_tokens, args.temperature, token,
                             args.ca)
    buffer = buffer_pb2_grpc.BufferStub(buffer_channel(args.buffer, args.ca))
    auth = [("authorization", f"Bearer {token}")] if token else []
    hi = 10 ** args.digits - 1
    for g in range(args.groups):
        a, b, c = (rng.randint(0, hi) for _ in range(3))
        trajs, resp = play_and_submit(episodes, buffer, auth, a, b, c, args.group_size)
        mean = sum(t.reward for t in trajs) / len(trajs)
        print(f"group {g}: {a}+{b}, +{c}: mean reward {mean:.2f} -> prompt {resp.prompt_id}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

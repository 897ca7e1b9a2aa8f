"""Play groups of episodes with a framework's agent against a rollout worker's OpenAI-compatible
server, and report each episode's reward; the worker records the turns and submits each group
for training. Runs where the framework is installed (bench/.agents-venv), needing nothing of
RelayRL: an episode is a header on the agent's requests and one POST of its reward.

    RELAYRL_AGENT_TOKEN=... python examples/agent/frameworks/play.py langchain \\
        --http 127.0.0.1:50580 --groups 4 --group-size 4
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import random
import re
import sys
import uuid
from pathlib import Path

import httpx

STALE_TRIES = 5  # plays of a group the buffer refuses as too stale


def reward_of(reply: str, numbers: list[int]) -> float:
    found = re.findall(r"-?\d+(?:\.\d+)?", reply)
    return float(bool(found) and float(found[-1]) == sum(numbers))


async def play_group(answer, base: str, token: str, numbers: list[int], size: int,
                     max_tokens: int) -> tuple[str, list[float]]:
    """`size` episodes of one question, one task; the last reward's status and the rewards."""
    question = f"What is {' + '.join(map(str, numbers))}?"
    task, rewards, status = f"sum-{uuid.uuid4().hex[:12]}", [], ""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                 timeout=120) as http:
        for _ in range(size):
            tag = {"X-RelayRL-Episode": uuid.uuid4().hex, "X-RelayRL-Task": task}
            reply = await answer(f"{base}/v1", token, tag, question, max_tokens)
            rewards.append(reward_of(reply, numbers))
            resp = await http.post(f"{base}/v1/episodes/{tag['X-RelayRL-Episode']}/reward",
                                   json={"reward": rewards[-1]})
            resp.raise_for_status()
            status = resp.json()["status"]
    return status, rewards


async def play_all(args, answer, token: str) -> int:
    rng = random.Random(args.seed)
    for g in range(args.groups):
        numbers = [rng.randint(1, 50) for _ in range(3)]
        for _ in range(STALE_TRIES):
            status, rewards = await play_group(answer, f"http://{args.http}", token, numbers,
                                               args.group_size, args.max_tokens)
            if status != "stale":  # too stale: the trainer moved on while it played
                break
        print(f"{args.framework} group {g}: {numbers}: {status}, mean reward "
              f"{sum(rewards) / len(rewards):.2f}", flush=True)
        if status not in ("submitted", "queued"):
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=["agents_sdk", "langchain"])
    ap.add_argument("--http", required=True, help="host:port of a worker's OpenAI server")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4, help="= the run's buffer.group_size")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-env", default="RELAYRL_AGENT_TOKEN")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    answer = importlib.import_module(f"{args.framework}_agent").answer
    token = os.environ.get(args.token_env, "") or "none"  # none: auth.required false
    return asyncio.run(play_all(args, answer, token))  # one loop: clients outlive a group


if __name__ == "__main__":
    raise SystemExit(main())

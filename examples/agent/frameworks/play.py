"""Play groups of episodes with a framework's agent against a rollout worker's OpenAI-compatible
server, and report each episode's reward; the worker records the turns and submits each group
for training. Runs where the framework is installed (bench/.agents-venv), needing nothing of
RelayRL: an episode is a header on the agent's requests and one POST of its reward.

    RELAYRL_AGENT_TOKEN=... python examples/agent/frameworks/play.py langchain \\
        --http 127.0.0.1:50580 --groups 4 --group-size 4

The questions are sums of three numbers, or with `--problems FILE` the rows of a JSON-lines
file of {"question", "answer"} (every tenth row held out). `--minutes M` plays training groups
until M minutes have passed instead of a count; `--eval` plays each held-out problem once,
untagged (nothing recorded) and greedy, and prints its success and tool use as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import random
import re
import sys
import time
import uuid
from pathlib import Path

import httpx

STALE_TRIES = 5  # plays of a group the buffer refuses as too stale
HELD_OUT_EVERY = 10  # of the problems file's rows, one is held out


def reward_of(reply: str, answer: float) -> float:
    found = re.findall(r"-?\d+(?:\.\d+)?", reply)
    return float(bool(found) and abs(float(found[-1]) - answer) < 1e-6)


def sums(rng: random.Random) -> tuple[str, float]:
    numbers = [rng.randint(1, 50) for _ in range(3)]
    return f"What is {' + '.join(map(str, numbers))}?", float(sum(numbers))


def problems(path: Path, held_out: bool) -> list[tuple[str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(row["question"], float(row["answer"])) for i, row in enumerate(rows)
            if (i % HELD_OUT_EVERY == 0) == held_out]


async def play_group(answer, base: str, token: str, question: str, value: float, size: int,
                     max_tokens: int) -> tuple[str, list[float]]:
    """`size` episodes of one question, one task, played at once; the last reward's status
    and the rewards."""
    task = f"q-{uuid.uuid4().hex[:12]}"
    tags = [{"X-RelayRL-Episode": uuid.uuid4().hex, "X-RelayRL-Task": task}
            for _ in range(size)]
    replies = await asyncio.gather(*(answer(f"{base}/v1", token, tag, question, max_tokens)
                                     for tag in tags))
    rewards, status = [reward_of(text, value) for text, _ in replies], ""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                 timeout=120) as http:
        for tag, reward in zip(tags, rewards, strict=True):
            resp = await http.post(f"{base}/v1/episodes/{tag['X-RelayRL-Episode']}/reward",
                                   json={"reward": reward})
            resp.raise_for_status()
            status = resp.json()["status"]
    return status, rewards


async def play_until(args, answer, token: str, ask, deadline: float, lane: int) -> int:
    """Groups one after another until `args.groups` are played (all lanes) or the deadline."""
    played = 0
    while time.monotonic() < deadline and (args.minutes or played < args.groups):
        question, value = ask()
        for _ in range(STALE_TRIES):
            status, rewards = await play_group(answer, f"http://{args.http}", token, question,
                                               value, args.group_size, args.max_tokens)
            if status != "stale":  # too stale: the trainer moved on while it played
                break
        print(f"{args.framework} group {lane}.{played}: {question!r}: {status}, mean reward "
              f"{sum(rewards) / len(rewards):.2f}", flush=True)
        if status not in ("submitted", "queued"):
            return 1
        played += 1
    return 0


async def evaluate(args, answer, token: str, held_out: list[tuple[str, float]]) -> int:
    """Each held-out problem once, greedy and untagged; one JSON line of the results."""
    gate = asyncio.Semaphore(args.parallel)

    async def one(question: str, value: float) -> tuple[float, int]:
        async with gate:
            text, calls = await answer(f"http://{args.http}/v1", token, {}, question,
                                       args.max_tokens, temperature=0.0)
        return reward_of(text, value), calls

    start = time.monotonic()
    results = await asyncio.gather(*(one(q, v) for q, v in held_out))
    print(json.dumps({"framework": args.framework, "problems": len(results),
                      "success": sum(r for r, _ in results) / len(results),
                      "tool_use": sum(c > 0 for _, c in results) / len(results),
                      "seconds": round(time.monotonic() - start, 1)}), flush=True)
    return 0


async def play_all(args, answer, token: str) -> int:
    rng = random.Random(args.seed)
    if args.problems and args.eval:
        return await evaluate(args, answer, token,
                              problems(args.problems, held_out=True)[:args.eval_size])
    train = problems(args.problems, held_out=False) if args.problems else []
    ask = (lambda: rng.choice(train)) if train else (lambda: sums(rng))
    deadline = time.monotonic() + (args.minutes * 60 if args.minutes else float("inf"))
    lanes = args.parallel if args.minutes else 1
    codes = await asyncio.gather(*(play_until(args, answer, token, ask, deadline, lane)
                                   for lane in range(lanes)))
    return max(codes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=["agents_sdk", "langchain", "calculator"])
    ap.add_argument("--http", required=True, help="host:port of a worker's OpenAI server")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4, help="= the run's buffer.group_size")
    ap.add_argument("--max-tokens", type=int, default=48, help="of one turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-env", default="RELAYRL_AGENT_TOKEN")
    ap.add_argument("--problems", type=Path, help="JSON lines of question and answer")
    ap.add_argument("--minutes", type=float, default=0.0, help="play until then, not --groups")
    ap.add_argument("--parallel", type=int, default=2, help="groups (or --eval problems) at once")
    ap.add_argument("--eval", action="store_true", help="score the held-out problems instead")
    ap.add_argument("--eval-size", type=int, default=64)
    args = ap.parse_args(argv)
    if args.eval and not args.problems:
        ap.error("--eval scores the held-out rows of --problems")
    sys.path.insert(0, str(Path(__file__).parent))
    answer = importlib.import_module(f"{args.framework}_agent").answer
    token = os.environ.get(args.token_env, "") or "none"  # none: auth.required false
    return asyncio.run(play_all(args, answer, token))  # one loop: clients outlive a group


if __name__ == "__main__":
    raise SystemExit(main())

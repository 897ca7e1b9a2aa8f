"""A function-calling agent that knows nothing of training: it tags its requests with an episode
and reports one reward, and the rollout worker's OpenAI-compatible server records the turns as
the tokens the model wrote, groups the episodes of one task and submits them for training.

The agent is any OpenAI agent loop (the `openai` client here; a framework's agent the same way:
only base_url, the api key and the X-RelayRL-Episode header change). Each episode asks for a
sum of three numbers and offers an `add` tool; the final reply scores 1 when it holds the sum.
Episodes of one question carry one X-RelayRL-Task, so they make one group.

    RELAYRL_AGENT_TOKEN=<the run's agent token> python examples/agent/tagged_agent.py \\
        --http 127.0.0.1:50580 --groups 4 --group-size 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import uuid

import httpx
import openai

STALE_TRIES = 5  # plays of a group the buffer refuses as too stale
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}


def add(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(args["a"] + args["b"])
    except (ValueError, KeyError, TypeError) as err:
        return f"error: {type(err).__name__}: {err}"


def episode(client: openai.OpenAI, model: str, numbers: list[int], max_turns: int,
            max_tokens: int) -> float:
    """One conversation played to its answer; its reward."""
    messages = [{"role": "user", "content": f"What is {' + '.join(map(str, numbers))}? "
                 "Use the add tool."}]
    for _ in range(max_turns):
        message = client.chat.completions.create(
            model=model, messages=messages, tools=[ADD], max_tokens=max_tokens
        ).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = re.findall(r"-?\d+", message.content or "")
            return float(bool(answer) and int(answer[-1]) == sum(numbers))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": add(call.function.arguments)})
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--http", required=True, help="host:port of a worker's OpenAI server")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4, help="= the run's buffer.group_size")
    ap.add_argument("--model", default="relayrl-policy")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-env", default="RELAYRL_AGENT_TOKEN",
                    help="environment variable holding the run's agent token")
    args = ap.parse_args(argv)
    token = os.environ.get(args.token_env, "") or "none"  # none: auth.required false
    base = f"http://{args.http}"
    rng = random.Random(args.seed)
    for g in range(args.groups):
        numbers = [rng.randint(1, 50) for _ in range(3)]
        task = f"sum-{g}-{uuid.uuid4().hex[:8]}"
        for _ in range(STALE_TRIES):
            rewards, status = [], ""
            for _ in range(args.group_size):
                tag = {"X-RelayRL-Episode": uuid.uuid4().hex, "X-RelayRL-Task": task}
                client = openai.OpenAI(base_url=f"{base}/v1", api_key=token,
                                       default_headers=tag)
                rewards.append(episode(client, args.model, numbers, args.max_turns,
                                       args.max_tokens))
                resp = httpx.post(f"{base}/v1/episodes/{tag['X-RelayRL-Episode']}/reward",
                                  json={"reward": rewards[-1]}, timeout=60,
                                  headers={"Authorization": f"Bearer {token}"})
                resp.raise_for_status()
                status = resp.json()["status"]
            if status != "stale":  # too stale: the trainer moved on while it played
                break
        print(f"group {g}: {numbers}: {status}, mean reward {sum(rewards) / len(rewards):.2f}")
        if status not in ("submitted", "queued"):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

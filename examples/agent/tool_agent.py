"""A function-calling agent written with the official `openai` client alone, trained through a
rollout worker's OpenAI-compatible server.

Each episode asks for a sum of three numbers and offers an `add` tool. The loop is the one
any OpenAI agent runs: send the conversation with `tools`, run the calls the reply makes,
append their results as `tool` messages, and stop at a reply without calls; that reply is
scored 1 when it holds the sum. The server returns with every completion its token ids,
log-probabilities and policy versions (`model_extra`), and renders each assistant turn
sent back as the tokens the model wrote, so the turns make one trajectory
(relayrl.plugins.buffer_client.trajectory_from_turns) whose tool results are masked.

    source runs/smollm2/tokens.env   # the agent token `relayrl up` made for the run
    python examples/agent/tool_agent.py --http 127.0.0.1:50580 --buffer 127.0.0.1:50553 \\
        --groups 1 --group-size 4 --max-turns 2

It needs a model with a chat template and room for the tool's schema in its context:
examples/smollm2_cpu.yaml (SmolLM2-135M-Instruct) with buffer.group_size 4, as in
docs/guides/environments.md; the tiny model's 256 characters hold no such prompt. Its
token is the run's agent token ($RELAYRL_AGENT_TOKEN, --token-env names another variable).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re

import grpc
import httpx
import openai

from relayrl.contracts.proto.v1 import buffer_pb2_grpc
from relayrl.plugins.buffer_client import (
    ChatTurn,
    buffer_channel,
    submit_group,
    trajectory_from_turns,
)

STALE_TRIES = 5  # plays of a group the buffer refuses as too stale
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}


def add(arguments: str) -> str:
    """The tool: its result, or the error the model is told."""
    try:
        args = json.loads(arguments)
        return str(args["a"] + args["b"])
    except (ValueError, KeyError, TypeError) as err:
        return f"error: {type(err).__name__}: {err}"


def episode(client: openai.OpenAI, model: str, numbers: list[int], max_turns: int,
            max_tokens: int, temperature: float):
    """One conversation played to its answer: its turns and its reward."""
    messages = [{"role": "user", "content": f"What is {' + '.join(map(str, numbers))}? "
                 "Use the add tool."}]
    turns, reward, finish = [], 0.0, "stop"
    for _ in range(max_turns):
        resp = client.chat.completions.create(
            model=model, messages=messages, tools=[ADD], max_tokens=max_tokens,
            temperature=temperature, logprobs=True)
        choice = resp.choices[0]
        turns.append(ChatTurn(resp.model_extra["prompt_token_ids"],
                              choice.model_extra["token_ids"],
                              [t.logprob for t in choice.logprobs.content],
                              choice.model_extra["policy_versions"]))
        finish = "length" if choice.finish_reason == "length" else "stop"
        message = choice.message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = re.findall(r"-?\d+", message.content or "")
            reward = float(bool(answer) and int(answer[-1]) == sum(numbers))
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": add(call.function.arguments)})
    return turns, reward, finish


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--http", required=True, help="host:port of a worker's OpenAI server")
    ap.add_argument("--buffer", required=True, help="host:port of the buffer service")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4, help="= the run's buffer.group_size")
    ap.add_argument("--model", default="relayrl-policy")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16,
                    help="per turn; at most the run's rollout.max_new_tokens")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-env", default="RELAYRL_AGENT_TOKEN",
                    help="environment variable holding the run's agent token "
                    "(= auth.agent_token_env; `relayrl up` writes it to <run_dir>/tokens.env)")
    ap.add_argument("--ca", default=None,
                    help="the run's CA certificate (auth.tls.ca): speak TLS and verify with it")
    args = ap.parse_args(argv)
    token = os.environ.get(args.token_env, "")  # empty: a run with auth.required false
    client = openai.OpenAI(base_url=f"{'https' if args.ca else 'http'}://{args.http}/v1",
                           api_key=token or "none",
                           http_client=httpx.Client(verify=args.ca or True))
    buffer = buffer_pb2_grpc.BufferStub(buffer_channel(args.buffer, args.ca))
    auth = [("authorization", f"Bearer {token}")] if token else []
    rng = random.Random(args.seed)
    for g in range(args.groups):
        numbers = [rng.randint(1, 50) for _ in range(3)]
        for attempt in range(STALE_TRIES):
            trajectories, turns, rewards = [], 0, []
            for _ in range(args.group_size):
                played, reward, finish = episode(client, args.model, numbers, args.max_turns,
                                                 args.max_tokens, args.temperature)
                trajectories.append(trajectory_from_turns(played, reward, finish))
                turns += len(played)
                rewards.append(reward)
            try:
                resp = submit_group(buffer, trajectories, source="tool-agent", metadata=auth)
                break
            except grpc.RpcError as err:  # too stale: the trainer moved on while it played
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION \
                        or attempt == STALE_TRIES - 1:
                    raise
        print(f"group {g}: {numbers}: {turns} turns, mean reward "
              f"{sum(rewards) / len(rewards):.2f} -> prompt {resp.prompt_id}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

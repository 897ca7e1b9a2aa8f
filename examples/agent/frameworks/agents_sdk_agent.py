"""An OpenAI Agents SDK agent with a tool, trained unchanged: only its client's base_url, api
key and the episode tag are RelayRL's. The worker records each episode's turns; the agent
reports the episode's reward (examples/agent/frameworks/play.py runs it).

    python examples/agent/frameworks/play.py agents_sdk --http 127.0.0.1:50580
"""

from __future__ import annotations

from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallItem,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


async def answer(base_url: str, api_key: str, tag: dict[str, str], question: str,
                 max_tokens: int, temperature: float | None = None) -> tuple[str, int]:
    """The agent's final answer to `question` ('' when it never gives one) and its calls."""
    set_tracing_disabled(True)  # no traces sent to OpenAI
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, default_headers=tag)
    agent = Agent(name="adder", instructions="Use the add tool, then give the sum.",
                  tools=[add], model=OpenAIChatCompletionsModel("relayrl-policy", client),
                  model_settings=ModelSettings(max_tokens=max_tokens, temperature=temperature))
    try:
        result = await Runner.run(agent, question, max_turns=3)
    except AgentsException:  # past max_turns, or a malformed tool call
        return "", 0
    return str(result.final_output), sum(isinstance(i, ToolCallItem) for i in result.new_items)

"""A LangChain agent with a tool, trained unchanged: only its model's base_url, api key and the
episode tag are RelayRL's. The worker records each episode's turns; the agent reports the
episode's reward (examples/agent/frameworks/play.py runs it).

    python examples/agent/frameworks/play.py langchain --http 127.0.0.1:50580
"""

from __future__ import annotations

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


async def answer(base_url: str, api_key: str, tag: dict[str, str], question: str,
                 max_tokens: int, temperature: float | None = None) -> tuple[str, int]:
    """The agent's final answer to `question` ('' when it never gives one) and its calls."""
    model = ChatOpenAI(model="relayrl-policy", base_url=base_url, api_key=api_key,
                       default_headers=tag, max_tokens=max_tokens,
                       temperature=temperature).bind_tools([add])
    messages = [HumanMessage(f"{question} Use the add tool.")]
    calls = 0
    for _ in range(3):
        reply = await model.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return str(reply.content), calls
        for call in reply.tool_calls:
            calls += 1
            try:
                result = str(add.invoke(call["args"])) if call["name"] == "add" else "no tool"
            except ValueError as err:  # arguments the tool's schema refuses
                result = f"error: {err}"
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    return "", calls

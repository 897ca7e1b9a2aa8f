"""A LangChain agent with a calculator tool, opened with three worked calls (a 135M model seldom
calls a tool from its declaration alone): the function-calling task of
bench/framework_tool_task.py, trained unchanged but for its model's base_url, api key and the
episode tag.

    python examples/agent/frameworks/play.py calculator --http 127.0.0.1:50580 \\
        --problems examples/own_task/problems.jsonl
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from simpleeval import simple_eval

INSTRUCTIONS = "Use the calculate tool, then reply with the number only."
WORKED = [("17 * 3 - 5", "46"), ("-( 8 + -3 ) * 6", "-30"), ("91 - 12 * 4", "43")]


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "17 * 3 - 5"."""
    try:
        value = float(simple_eval(expression))
    except Exception as err:  # the model is told why its expression failed
        return f"error: {err}"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def worked_calls() -> list:
    messages = []
    for i, (expression, value) in enumerate(WORKED):
        call = {"name": "calculate", "args": {"expression": expression}, "id": f"worked-{i}"}
        messages += [HumanMessage(f"Calculate {expression}."), AIMessage("", tool_calls=[call]),
                     ToolMessage(value, tool_call_id=call["id"]), AIMessage(value)]
    return messages


async def answer(base_url: str, api_key: str, tag: dict[str, str], question: str,
                 max_tokens: int, temperature: float | None = None) -> tuple[str, int]:
    """The agent's final answer to `question` ('' when it never gives one) and its calls."""
    model = ChatOpenAI(model="relayrl-policy", base_url=base_url, api_key=api_key,
                       default_headers=tag, max_tokens=max_tokens,
                       temperature=temperature).bind_tools([calculate])
    messages = [SystemMessage(INSTRUCTIONS), *worked_calls(), HumanMessage(question)]
    calls = 0
    for _ in range(4):
        reply = await model.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return str(reply.content), calls
        for call in reply.tool_calls:
            calls += 1
            try:
                result = (calculate.invoke(call["args"]) if call["name"] == "calculate"
                          else f"error: no tool {call['name']!r}")
            except ValueError as err:  # arguments the tool's schema refuses
                result = f"error: {err}"
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    return "", calls

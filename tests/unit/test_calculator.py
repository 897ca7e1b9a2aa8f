"""The calculator environment's expression parser (hostile input included) and its episode
steps. Run: pytest tests/unit/test_calculator.py"""

from __future__ import annotations

import time

import pytest

from relayrl.plugins.envs import Step, as_step
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.envs import load_environment, make_environment
from relayrl_tasks.envs.calculator import INSTRUCTIONS, CalcError, Calculator, evaluate, show


@pytest.mark.parametrize("text,value", [
    ("12*7", 84), ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("-4 + +2", -2), ("7 / 2", 3.5),
    ("7 // 2", 3), ("7 % 4", 3), ("2 ** 10", 1024), ("2^10", 1024), ("3 × 4 ÷ 2", 6),
    ("1,000 * 3", 3000), ("0.1 + 0.2", 0.1 + 0.2), ("2 ** -1", 0.5), (" 42 ", 42),
])
def test_arithmetic(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize("text,error", [
    ("9**9**9", "too large"), ("2 ** 100000", "too large"), ("10 ** 400", "too large"),
    ("(10 ** 300) * (10 ** 300)", "too large"), ("1e308 * 10", "too large"),
    ("1 / 0", "division by zero"), ("5 % 0", "division by zero"), ("5 // 0.0", "division by zero"),
    ("0 ** -1", "division by zero"), ("(-8) ** 0.5", "negative"),
    ("__import__('os').system('true')", "only numbers"), ("x + 1", "only numbers"),
    ("(1).real", "only numbers"), ("abs(-1)", "only numbers"), ("lambda: 1", "only numbers"),
    ("True + 1", "only numbers"), ("'a' * 3", "only numbers"), ("[1] * 3", "only numbers"),
    ("1 if 1 else 2", "only numbers"), ("1 < 2", "only numbers"), ("1 +", "not an arithmetic"),
    ("", "empty"), ("1+" * 150 + "1", "longer than"), ("(" * 99 + "1" + ")" * 99, None),
])
def test_hostile_input_is_refused_quickly(text, error):
    start = time.perf_counter()
    if error is None:  # deep but short: fine
        assert evaluate(text) == 1
    else:
        with pytest.raises(CalcError, match=error):
            evaluate(text)
    assert time.perf_counter() - start < 0.1


def test_results_read_as_a_person_writes_them():
    assert [show(42.0), show(1 / 3), show(7), show(2.5)] == ["42", "0.3333333333", "7", "2.5"]


def problem(**kw) -> Problem:
    return Problem(1, kw.pop("text", "What is 12 times 7?"), kw.pop("reference", "84"), **kw)


def test_an_episode_calls_the_tool_then_answers():
    env = Calculator(reward="exact_match")
    opening = env.reset(problem())
    assert opening == [{"role": "system", "content": INSTRUCTIONS},
                       {"role": "user", "content": "What is 12 times 7?"}]
    step = env.step("Let me compute <calc>12*7</calc> and <calc>1/0</calc>")
    assert step == Step(({"role": "user", "content":
                          "<result>84</result>\n<result>error: division by zero</result>"},),
                        None, False)
    assert env.step("84") == Step((), 1.0, True)
    assert env.step("85").reward == 0.0


def test_instructions_join_a_system_message_or_can_be_left_out():
    chat = problem(text="", messages=({"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "12*7?"}))
    assert Calculator().reset(chat)[0]["content"] == f"Be brief.\n\n{INSTRUCTIONS}"
    assert Calculator(instructions=False).reset(chat) is None


def test_the_builtin_loads_by_name_and_options_are_checked():
    cls = load_environment("calculator")
    assert cls is Calculator
    assert make_environment(cls, {"role": "tool"}).role == "tool"
    with pytest.raises(ValueError, match="options do not fit Calculator"):
        make_environment(cls, {"colour": "red"})
    for spec, msg in [("nowhere.at.all:Env", "cannot import"),
                      ("relayrl.plugins.envs:Nope", "not a class"),
                      ("relayrl", "not 'package.module:Class'")]:
        with pytest.raises(ValueError, match=msg):
            load_environment(spec)


def test_steps_are_checked():
    assert as_step(([{"role": "user", "content": "x"}], 1, True), "s") == Step(
        ({"role": "user", "content": "x"},), 1.0, True)
    for bad, msg in [("text", "not a Step"), (("hi", None, False), "list of"),
                     (([{"role": "robot", "content": "x"}], None, False), "message 0"),
                     (([], "1", False), "reward is a str")]:
        with pytest.raises(ValueError, match=msg):
            as_step(bad, "s")

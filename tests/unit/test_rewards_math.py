"""math_verify (Hugging Face's math-verify behind relayrl_tasks.rewards.answers) beyond plain
numbers, and from the worker threads rewards are scored in."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from relayrl_tasks.rewards import get_reward, math_verify, score, score_group
from relayrl_tasks.rewards.answers import after_thinking, answer_text, too_large

GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


@pytest.mark.parametrize("completion, reference, expected", [
    ("\\frac{2}{4}", "1/2", 1.0),  # fractions, reduced or not
    ("so 2/4 of them", "0.5", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),  # LaTeX, bare reference
    ("The answer is $\\pi$", "\\pi", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),  # symbolic equality
    ("the answer is 3.14", "\\pi", 0.0),
    ("$x = 5$", "5", 1.0),
    ("The answer is \\boxed{72}.", GSM8K_SOLUTION, 1.0),  # a GSM8K solution as reference
    ("The answer is 24.", GSM8K_SOLUTION, 0.0),
    ("#### 72\nThat took 3 steps", "72", 1.0),  # the line after #### is the answer
    ("#### 1,234", "1234", 1.0),
    ("#### 9 but \\boxed{8}", "8", 1.0),  # a box wins over the marker
    ("so</think> 9", "9", 1.0),  # the chat template opened the block in the prompt
    ("<think>the answer is 9", "9", 0.0),  # cut off while reasoning: no answer
    ("<think>9</think><think>9</think>8", "9", 0.0),
    ("\\boxed{5} then \\boxed{6}", "6", 0.0),  # two boxes are a set {5, 6}, not 6
    ("\\boxed{9^{9^{9}}}", "9", 0.0),  # too large to evaluate: never handed to sympy
    ("9^9^9", "9", 0.0),
])
def test_math_verify_beyond_numbers(completion, reference, expected):
    assert math_verify(completion, reference) == expected


@pytest.mark.parametrize("reference, error", [
    ("forty-two", "holds no answer math-verify can read"),
    ("<think>42</think>", "holds no answer"),
    ("2^{10^{100}}", "is too large to evaluate"),
])
def test_a_reference_with_no_answer_is_an_error_on_the_sample(reference, error):
    reward, message = score(math_verify, "42", reference)
    assert reward == 0.0
    assert message.startswith(f"ValueError: math_verify: reference {reference!r}")
    assert error in message


@pytest.mark.parametrize("text, large", [
    ("9^{9^{9}}", True), ("9^9^9", True), ("2**3**4", True), ("2^{100000}", True),
    ("(10^{10})!", True), ("123456!", True), ("{3!}!", True),
    ("x^2 + y^2 = 25", False), ("2^{10}", False), ("10!", False), ("e^{i\\pi}", False),
    ("1,000,000", False),
])
def test_too_large(text, large):
    assert too_large(text) is large


def test_the_thin_layer():
    assert after_thinking("<think>a</think>b<think>c") == "b"
    assert answer_text("x = +7 and 3+5") == "x = 7 and 3+5"
    assert answer_text("work\n####\n\n 72 \nmore 3") == " 72 "


def test_math_verify_scores_from_worker_threads():
    """math-verify's default timeouts use signal.alarm, which raises outside the main thread;
    rollout workers score in threads."""
    cases = [("\\boxed{\\frac{3}{4}}", "0.75", 1.0), ("#### 72", GSM8K_SOLUTION, 1.0),
             ("41", "42", 0.0), ("The answer is $\\sqrt{2}$", "\\sqrt{2}", 1.0)] * 4
    fn = get_reward("math_verify+0.1*format_boxed")

    def run(case):
        assert threading.current_thread() is not threading.main_thread()
        completion, reference, expected = case
        return (math_verify(completion, reference) == expected,
                score_group(fn, [completion], reference)[0][1])

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, cases))
    assert results == [(True, "")] * len(cases)


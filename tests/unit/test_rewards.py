"""Reward functions, specs and the registry, on hand-checked cases."""

import re

import pytest

from relayrl.plugins.rewards import REWARDS, register
from relayrl_tasks.rewards import (
    RemoteReward,
    WeightedReward,
    exact_match,
    format_boxed,
    format_think,
    get_reward,
    math_verify,
    score,
    weighted,
)


@pytest.mark.parametrize("completion, reference, expected", [
    ("The answer is 42.", "42", 1.0),
    ("\\boxed{3/4}", "0.75", 1.0),
    ("1,234", "1234", 1.0),
    ("41", "42", 0.0),
    ("I do not know", "42", 0.0),
    ("so x = +7", "7", 1.0),
    ("-\\frac{3}{4}", "-0.75", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
    ("It costs $1,234.50 in total", "1234.5", 1.0),
    ("half: 50%", "50", 1.0),
    ("half: 50%", "0.5", 1.0),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72", 1.0),
    ("she has 5 then 3 more", "#### 8\n", 0.0),
    ("step 1 gives 7, so \\boxed{9} and later 12", "9", 1.0),
    ("\\boxed{\\text{no}} but 9", "9", 0.0),  # a boxed non-number is the committed answer
    ("<think>maybe 9?</think>It is 10", "10", 1.0),
    ("<think>it is 9</think>I refuse", "9", 0.0),  # reasoning is not the answer
    ("3-5", "-2", 1.0),  # math-verify reads an expression whole
    ("so 8-3 = 5", "5", 1.0),  # the right side of an equation is the answer
    ("0.3333333333", "1/3", 1.0),  # non-integers compare within a relative tolerance
    ("1000001", "1000000", 0.0),  # integers compare exactly
    ("1/0", "0", 0.0),
])
def test_math_verify(completion, reference, expected):
    assert math_verify(completion, reference) == expected


def test_math_verify_reference_with_no_number_is_reported_not_scored_zero():
    reward, error = score(math_verify, "42", "forty-two")
    assert reward == 0.0 and error.startswith("ValueError: math_verify: reference 'forty-two'")


@pytest.mark.parametrize("completion, expected", [
    ("so \\boxed{5}", 1.0),
    ("\\boxed{\\frac{1}{2}} done", 1.0),
    ("no box, 5", 0.0),
    ("\\boxed{5} or \\boxed{6}", 0.0),
    ("\\boxed{}", 0.0),
    ("\\boxed{5", 0.0),
])
def test_format_boxed(completion, expected):
    assert format_boxed(completion, "") == expected


@pytest.mark.parametrize("completion, expected", [
    ("<think>add them</think>The answer is 5", 1.0),
    ("  <think>\nadd\n</think>\n5", 1.0),
    ("<think>add them</think>", 0.0),  # no answer
    ("<think> </think>5", 0.0),  # no reasoning
    ("5 <think>add</think>5", 0.0),  # something before the reasoning
    ("<think>a</think><think>b</think>5", 0.0),
    ("<think>add them", 0.0),
    ("5", 0.0),
])
def test_format_think(completion, expected):
    assert format_think(completion, "") == expected


def test_plain_names_return_the_registered_function():
    assert get_reward("exact_match") is exact_match
    assert get_reward("math_verify") is math_verify
    assert exact_match(" 46 ", "46") == 1.0 and exact_match("45", "46") == 0.0


def test_spec_sums_weighted_terms():
    fn = get_reward("math_verify+0.1*format_boxed")
    assert isinstance(fn, WeightedReward)
    assert fn("\\boxed{3/4}", "0.75") == pytest.approx(1.1)
    assert fn("\\boxed{1}", "0.75") == pytest.approx(0.1)
    assert fn("0.75", "0.75") == pytest.approx(1.0)
    spaced = get_reward(" 2 * math_verify + -0.5*format_think ")
    assert spaced("<think>x</think>7", "7") == pytest.approx(1.5)


def test_weighted_helper_matches_the_spec():
    fn = weighted((1.0, math_verify), (0.1, format_boxed))
    assert fn("\\boxed{2}", "2") == pytest.approx(1.1)
    assert fn.name == "1*math_verify+0.1*format_boxed"


@pytest.mark.parametrize("terms, message", [
    ((), "at least one"),
    (((float("nan"), math_verify),), "terms[0] weight must be a finite number"),
    (((1.0, math_verify), ("0.1", format_boxed)), "terms[1] weight"),
    (((1.0, "math_verify"),), "terms[0] reward must be callable"),
])
def test_weighted_refuses_bad_terms(terms, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        weighted(*terms)


@pytest.mark.parametrize("spec, message", [
    ("nope", "reward 'nope': unknown reward function 'nope'; known: .*math_verify"),
    ("math_verify+0.1*nope", "term '0.1\\*nope': unknown reward function 'nope'"),
    ("math_verify+", "empty term"),
    ("math_verify++format_boxed", "empty term"),
    ("abc*math_verify", "weight 'abc' is not a number"),
    ("math_verify+nan*format_boxed", "weight 'nan' must be finite"),
    ("0.1*", "missing reward name"),
    ("1*2*math_verify", "more than one '\\*'"),
    ("remote:localhost", "address 'localhost' must be HOST:PORT"),
    ("math_verify+0.5*remote:localhost:99999", "term '0.5\\*remote:localhost:99999'.*port"),
    ("", "non-empty string"),
])
def test_bad_specs_are_refused_naming_the_bad_part(spec, message):
    with pytest.raises(ValueError, match=message):
        get_reward(spec)


def test_remote_spec_builds_a_client_without_connecting():
    fn = get_reward("remote:127.0.0.1:50570")
    assert isinstance(fn, RemoteReward) and fn.address == "127.0.0.1:50570"
    fn.close()
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        RemoteReward("127.0.0.1:50570", timeout_s=0)


def test_score_turns_an_exception_into_an_error():
    def broken(completion, reference):
        raise ValueError("bad input")

    assert score(broken, "a", "b") == (0.0, "ValueError: bad input")
    assert score(exact_match, "a", "a") == (1.0, "")
    assert score(lambda c, r: float("nan"), "a", "b") == (
        0.0, "ValueError: reward is not finite: nan")


@pytest.mark.parametrize("value, error", [
    (3e38, "ValueError: reward 3e+38 is outside buffer.reward_range [-10000, 10000]"),
    (1e308, "ValueError: reward 1e+308 is outside buffer.reward_range [-10000, 10000]"),
    (-10000.5, "ValueError: reward -10000.5 is outside buffer.reward_range [-10000, 10000]"),
    (float("inf"), "ValueError: reward is not finite: inf"),
    (10000.0, ""),
])
def test_score_keeps_rewards_inside_the_range(value, error):
    """What a worker scores with (buffer.reward_range): a huge reward is an error on its
    sample, scored 0, instead of overflowing its group's float32 mean."""
    assert score(lambda c, r: value, "a", "b", (-1e4, 1e4)) == (
        (0.0, error) if error else (value, ""))


def test_a_reward_whose_library_is_missing_is_refused_when_its_spec_resolves():
    """Not at the first sample, where every score would quietly be 0 (it happened on a
    machine without math-verify)."""
    from relayrl.config import RunConfig
    from relayrl.plugins.rewards.registry import REQUIRES
    from relayrl_tasks.tasks import check_reward

    register("test_needs_a_library", requires=(("relayrl_no_such_module", "no-such==1.0"),))(
        lambda c, r: 1.0)
    try:
        with pytest.raises(ValueError, match=r"term '0.5\*test_needs_a_library': needs the Python "
                           r"package 'no-such==1.0' \(module 'relayrl_no_such_module'\)"):
            get_reward("exact_match+0.5*test_needs_a_library")
        with pytest.raises(ValueError, match="^task.reward: .*no-such==1.0"):
            task = RunConfig.model_validate({"task": {"reward": "test_needs_a_library"}}).task
            check_reward(task)
    finally:
        del REWARDS["test_needs_a_library"], REQUIRES["test_needs_a_library"]
    assert get_reward("math_verify") is math_verify  # installed here: resolves as before


def test_register_adds_a_name_and_refuses_bad_ones():
    @register("test_always_half")
    def half(completion, reference):
        return 0.5

    try:
        assert get_reward("2*test_always_half")("x", "y") == 1.0
        with pytest.raises(ValueError, match="unknown reward function '0.5'"):
            get_reward("0.5+test_always_half")  # a constant is no reward
        with pytest.raises(ValueError, match="'test_always_half' is already registered"):
            register("test_always_half")(lambda c, r: 0.0)
    finally:
        del REWARDS["test_always_half"]
    for bad in ("a+b", "2x", "remote", "with space"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            register(bad)

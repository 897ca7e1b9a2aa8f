"""`package.module:function` rewards, metadata, and score_group's failure rules.

The reward modules are written into tmp_path and imported from there, as a user's would be.
"""

import math
import re
import sys
import textwrap
import uuid

import pytest

from relayrl_tasks.rewards import ImportedReward, WeightedReward, get_reward, score, score_group

REWARDS_SOURCE = '''
import math

calls = []

def per_completion(completion, reference):
    return 1.0 if completion == reference else 0.0

def only_completion(completion):
    return float(len(completion))

def with_metadata(completion, reference, metadata):
    return metadata["bonus"] + (1.0 if completion == reference else 0.0)

def metadata_only(completion, *, metadata):
    return float(metadata.get("level", 0))

def batched(completions, reference):
    calls.append(list(completions))
    return [1.0 if c == reference else 0.0 for c in completions]

def batched_with_metadata(completions, metadata):
    return [metadata["weight"] * len(c) for c in completions]

def trl_style(completions, **kwargs):
    return [1.0 if c == kwargs["reference"] else 0.5 for c in completions]

def raises(completion, reference):
    if completion == "boom":
        raise RuntimeError("cannot score " + completion)
    return 1.0

def returns_nan(completion):
    return math.nan

def batched_raises(completions):
    raise KeyError("no such column")

def batched_short(completions):
    return [1.0] * (len(completions) - 1)

def batched_text(completions):
    return ["1.0"] * len(completions)

def batched_bools(completions):
    return [c == "a" for c in completions]

def returns_text(completion):
    return "1.0"

def returns_bool(completion):
    return completion == "a"

def returns_numpy(completion):
    import numpy as np
    return np.float32(0.5)

def batched_one_nan(completions):
    return [math.nan if c == "bad" else 1.0 for c in completions]

def mutates(completion, metadata):
    metadata["seen"] = True
    return 1.0

class Scorer:
    def __call__(self, completions, reference):
        return [0.25] * len(completions)

scorer = Scorer()
not_a_function = 42

def bad_signature(text, answer):
    return 0.0

def extra_required(completion, reference, tolerance):
    return 0.0
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Writes a module with a fresh name into tmp_path, importable for this test only."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def write(source: str) -> str:
        names.append(f"user_rewards_{uuid.uuid4().hex[:8]}")
        (tmp_path / f"{names[-1]}.py").write_text(textwrap.dedent(source))
        return names[-1]

    yield write
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def mod(module):
    return module(REWARDS_SOURCE)


def test_per_completion_functions_get_only_what_they_declare(mod):
    fn = get_reward(f"{mod}:per_completion")
    assert isinstance(fn, ImportedReward) and fn.name == f"{mod}:per_completion"
    assert score_group(fn, ["4", "5"], "4") == [(1.0, ""), (0.0, "")]
    assert score_group(get_reward(f"{mod}:only_completion"), ["abc"], "x") == [(3.0, "")]
    assert score(fn, "4", "4") == (1.0, "")  # the single-completion entry point too
    assert fn("4", "4") == 1.0


def test_metadata_reaches_functions_that_declare_it(mod):
    fn = get_reward(f"{mod}:with_metadata")
    assert score_group(fn, ["4", "5"], "4", {"bonus": 0.5}) == [(1.5, ""), (0.5, "")]
    assert score(fn, "4", "4", metadata={"bonus": 2.0}) == (3.0, "")
    only = get_reward(f"{mod}:metadata_only")
    assert score_group(only, ["a"], "", {"level": 3}) == [(3.0, "")]
    assert score_group(only, ["a"], "") == [(0.0, "")]  # no metadata: an empty mapping


def test_metadata_is_read_only(mod):
    meta = {"level": 1}
    reward, error = score(get_reward(f"{mod}:mutates"), "a", "", metadata=meta)
    assert reward == 0.0 and error.startswith("TypeError:") and "does not support item" in error
    assert meta == {"level": 1}


def test_registered_rewards_ignore_metadata_they_do_not_declare():
    assert score_group(get_reward("math_verify"), ["4", "5"], "4", {"source": "gsm8k"}) == [
        (1.0, ""), (0.0, "")]
    assert score(lambda c, r: 0.5, "a", "b", metadata={"x": 1}) == (0.5, "")
    assert score(lambda c, r, metadata: metadata["x"], "a", "b", metadata={"x": 2}) == (2.0, "")


def test_batched_functions_are_called_once_per_group(mod):
    fn = get_reward(f"{mod}:batched")
    assert fn.plan.batched
    assert score_group(fn, ["4", "5", "4"], "4") == [(1.0, ""), (0.0, ""), (1.0, "")]
    assert sys.modules[mod].calls == [["4", "5", "4"]]
    assert score(fn, "4", "4") == (1.0, "")  # a group of one
    meta = get_reward(f"{mod}:batched_with_metadata")
    assert score_group(meta, ["ab", "abc"], "", {"weight": 2}) == [(4.0, ""), (6.0, "")]
    assert score_group(get_reward(f"{mod}:trl_style"), ["4", "5"], "4") == [
        (1.0, ""), (0.5, "")]
    assert score_group(get_reward(f"{mod}:scorer"), ["a"], "") == [(0.25, "")]
    assert score_group(fn, [], "4") == []


def test_a_function_that_raises_fails_only_its_completion(mod):
    fn = get_reward(f"{mod}:raises")
    assert score_group(fn, ["ok", "boom", "ok"], "") == [
        (1.0, ""), (0.0, "RuntimeError: cannot score boom"), (1.0, "")]


def test_a_nan_reward_is_an_error_on_its_sample(mod):
    fn = get_reward(f"{mod}:returns_nan")
    assert score_group(fn, ["a"], "") == [(0.0, "ValueError: reward is not finite: nan")]
    one_nan = get_reward(f"{mod}:batched_one_nan")
    assert score_group(one_nan, ["ok", "bad", "ok"], "") == [
        (1.0, ""), (0.0, "ValueError: reward is not finite: nan"), (1.0, "")]


@pytest.mark.parametrize("attr, error", [
    ("batched_raises", "KeyError: 'no such column'"),
    ("batched_short", "ValueError: batched reward returned 2 values for 3 completions"),
    ("batched_text", "ValueError: batched reward returned a non-number at [0]: str '1.0'"),
    ("batched_bools", "ValueError: batched reward returned a non-number at [0]: bool True"),
])
def test_a_failing_batch_marks_its_whole_group(mod, attr, error):
    assert score_group(get_reward(f"{mod}:{attr}"), ["a", "b", "c"], "") == [(0.0, error)] * 3


@pytest.mark.parametrize("attr, error", [
    ("returns_text", "TypeError: reward returned str '1.0', not a number"),
    ("returns_bool", "TypeError: reward returned bool True, not a number"),
])
def test_a_bool_or_a_string_is_refused_not_read_as_a_number(mod, attr, error):
    assert score_group(get_reward(f"{mod}:{attr}"), ["a"], "") == [(0.0, error)]


def test_numpy_numbers_are_rewards(mod):
    assert score_group(get_reward(f"{mod}:returns_numpy"), ["a"], "") == [(0.5, "")]


def test_reward_range_applies_to_imported_rewards(mod):
    fn = get_reward(f"{mod}:only_completion")
    assert score_group(fn, ["a" * 20, "a"], "", reward_range=(-10, 10)) == [
        (0.0, "ValueError: reward 20 is outside buffer.reward_range [-10, 10]"), (1.0, "")]


def test_weighted_sums_mix_batched_and_per_completion_terms(mod):
    fn = get_reward(f"{mod}:batched+0.5*{mod}:with_metadata + 0.1*format_boxed")
    assert isinstance(fn, WeightedReward)
    results = score_group(fn, ["4", "\\boxed{4}"], "4", {"bonus": 1.0})
    assert [r for r, _ in results] == pytest.approx([1.0 + 1.0, 0.5 + 0.1])
    assert fn("4", "4", {"bonus": 1.0}) == pytest.approx(2.0)
    failing = get_reward(f"{mod}:raises+{mod}:batched")
    assert score_group(failing, ["4", "boom"], "4") == [
        (2.0, ""), (0.0, "RuntimeError: cannot score boom")]
    whole = get_reward(f"math_verify+{mod}:batched_short")
    assert score_group(whole, ["4", "4"], "4") == [
        (0.0, "ValueError: batched reward returned 1 values for 2 completions")] * 2


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_xyz:fn", "module 'no_such_module_xyz' not found"),
    ("{mod}:missing", "module '{mod}' has no attribute 'missing'"),
    ("{mod}:not_a_function", "{mod}:not_a_function is not callable (it is a int)"),
    ("{mod}:Scorer", "{mod}:Scorer is a class"),
    ("{mod}:bad_signature", "parameters (text, answer) fit no calling convention; expected "
                            "(completion[, reference][, metadata][, prompt][, conversation]) "
                            "per completion or (completions[, reference][, metadata][, prompt]"
                            "[, prompts][, conversations]) per group"),
    ("{mod}:extra_required", "parameters (completion, reference, tolerance) fit no calling"),
    ("{mod}:", "'{mod}:' is not package.module:function"),
    ("my-mod:fn", "'my-mod:fn' is not package.module:function"),
])
def test_bad_specs_fail_at_resolve_time_saying_why(mod, ref, message):
    ref, message = ref.format(mod=mod), message.format(mod=mod)
    with pytest.raises(ValueError, match=re.escape(f"reward {ref!r}: {message}")):
        get_reward(ref)
    with pytest.raises(ValueError, match=re.escape(f"term {ref!r}: {message}")):
        get_reward(f"math_verify+{ref}")


def test_a_module_that_raises_on_import_is_reported_with_the_exception(module):
    name = module("raise RuntimeError('no GPU here')\n")
    with pytest.raises(ValueError, match=re.escape(
            f"reward '{name}:fn': importing module '{name}' raised RuntimeError: no GPU here")):
        get_reward(f"{name}:fn")
    missing_dep = module("import no_such_dependency_xyz\n")
    with pytest.raises(ValueError, match=re.escape(
            f"importing module '{missing_dep}' raised ModuleNotFoundError: No module named "
            "'no_such_dependency_xyz'")):
        get_reward(f"{missing_dep}:fn")


def test_remote_is_checked_before_module_function():
    with pytest.raises(ValueError, match="address 'score' must be HOST:PORT"):
        get_reward("remote:score")


def test_a_registered_function_no_form_fits_fails_at_resolve_time():
    from relayrl.plugins.rewards import REWARDS, register

    register("test_one_arg")(lambda completion_text: 0.0)
    try:
        with pytest.raises(ValueError, match=re.escape(
                "reward 'test_one_arg': parameters (completion_text) fit no calling")):
            get_reward("test_one_arg")
    finally:
        del REWARDS["test_one_arg"]


def test_a_dotted_module_path_and_attribute_path(tmp_path, monkeypatch):
    package = tmp_path / f"pkg_{uuid.uuid4().hex[:8]}"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "checks.py").write_text(textwrap.dedent('''
        class Holder:
            @staticmethod
            def score(completion, reference):
                return 0.75
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        fn = get_reward(f"{package.name}.sub.checks:Holder.score")
        assert score(fn, "a", "b") == (0.75, "")
        assert math.isclose(get_reward(f"2*{package.name}.sub.checks:Holder.score")("a", "b"),
                            1.5)
    finally:
        for name in [package.name, f"{package.name}.sub", f"{package.name}.sub.checks"]:
            sys.modules.pop(name, None)

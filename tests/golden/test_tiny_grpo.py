"""The golden-loss guard (issue 18, must-show 7): the deterministic tiny GRPO run of
tests/golden/tiny_grpo.py must reproduce its checked-in per-step loss, mean reward, gradient
norm and entropy within the tolerance stated there (RTOL, ATOL). If this fails after a
refactor, the refactor changed the numerics; see that module for when regenerating the
reference (`python -m tests.golden.tiny_grpo --update`) is legitimate."""

import json

from tests.golden.tiny_grpo import ATOL, REFERENCE, RTOL, STEPS, drift, run


def test_the_tiny_grpo_run_reproduces_its_reference():
    want = json.loads(REFERENCE.read_text())["steps"]
    assert len(want) == STEPS
    bad = drift(run(), want)
    assert not bad, (f"{len(bad)} figures drifted beyond rtol {RTOL} / atol {ATOL}:\n"
                     + "\n".join(bad[:20]))

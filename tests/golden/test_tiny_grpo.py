"""The golden-loss guard: the deterministic tiny GRPO run of
tests/golden/tiny_grpo.py must reproduce the checked-in per-step loss, mean reward,
gradient norm and entropy of its machine kind within the tolerance stated there (RTOL,
ATOL). If this fails after a refactor, the refactor changed the numerics; see that module
for when regenerating a reference is legitimate."""

import json

from tests.golden.tiny_grpo import ATOL, RTOL, STEPS, closest_drift, references, run


def test_the_tiny_grpo_run_reproduces_its_reference():
    for path in references():
        assert len(json.loads(path.read_text())["steps"]) == STEPS, path
    path, bad = closest_drift(run())
    assert not bad, (f"{len(bad)} figures drifted beyond rtol {RTOL} / atol {ATOL} from the "
                     f"closest reference, {path.name}:\n" + "\n".join(bad[:20]))


def test_activation_checkpointing_reproduces_the_reference():
    """Recomputing each layer's activations in the backward pass gives the same run."""
    path, bad = closest_drift(run(activation_checkpointing=True))
    assert not bad, (f"{len(bad)} figures drifted with trainer.activation_checkpointing from "
                     f"{path.name}:\n" + "\n".join(bad[:20]))


def test_packed_rows_reproduce_the_reference():
    """Rows run whole with their sequences packed end to end (trainer.packing, the
    shared-prefix pass off) give the same run."""
    path, bad = closest_drift(run(shared_prefix=False, packing=True))
    assert not bad, (f"{len(bad)} figures drifted with trainer.packing from "
                     f"{path.name}:\n" + "\n".join(bad[:20]))

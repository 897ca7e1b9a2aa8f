"""A worker starts over a group the trainer could no longer train (a token older than the
trainer's version minus the staleness bound), and only once its own weights are recent
enough to produce trainable tokens."""

from types import SimpleNamespace

import pytest

from relayrl.config import RunConfig
from relayrl.contracts.partial import PartialGroup, PartialSequence
from rollout_svc.group_generator import GroupGenerator


def group(*versions_per_sequence: list[int]) -> PartialGroup:
    seqs = [PartialSequence(tokens=[7] * len(v), logprobs=[-1.0] * len(v), versions=list(v))
            for v in versions_per_sequence]
    return PartialGroup(prompt_id=3, prompt_tokens=[1, 2], sequences=seqs)


def generator(engine_version: int, trainer_version: int, max_staleness: int) -> GroupGenerator:
    gen = GroupGenerator(RunConfig().rollout_part(),
                         SimpleNamespace(version=engine_version, context_length=256),
                         lm=None, writer=None)
    gen.trainer_version, gen.max_staleness = trainer_version, max_staleness
    return gen


@pytest.mark.parametrize("oldest, restarted", [(5, True), (6, False), (9, False)])
def test_a_group_past_the_bound_starts_over(oldest, restarted):
    gen = generator(engine_version=8, trainer_version=8, max_staleness=2)  # floor 6
    g = group([oldest, 8, 8], [8], [])
    gen.restart_stale([g])
    assert gen.groups_restarted_stale == int(restarted)
    assert gen.tokens_restarted_stale == (4 if restarted else 0)  # decoded in vain
    if restarted:
        assert [s.tokens for s in g.sequences] == [[], [], []]
        assert all(not s.versions and not s.finish_reason for s in g.sequences)
        assert g.prompt_tokens == [1, 2] and g.prompt_id == 3
    else:
        assert g.sequences[0].versions == [oldest, 8, 8]


def test_a_finished_sequence_counts_too():
    gen = generator(engine_version=8, trainer_version=8, max_staleness=2)
    done = PartialSequence(tokens=[7], logprobs=[-1.0], versions=[4], finish_reason="stop")
    g = PartialGroup(3, [1, 2], [done, PartialSequence()])
    gen.restart_stale([g])
    assert gen.groups_restarted_stale == 1 and not g.sequences[0].finished


def test_an_engine_behind_the_floor_restarts_nothing():
    """Its new tokens would be as untrainable: the worker is catching up on weights."""
    gen = generator(engine_version=5, trainer_version=8, max_staleness=2)
    g = group([4, 5])
    gen.restart_stale([g])
    assert gen.groups_restarted_stale == 0 and g.sequences[0].versions == [4, 5]


def test_a_fresh_group_is_left_alone():
    gen = generator(engine_version=8, trainer_version=8, max_staleness=0)
    g = group([], [])
    gen.restart_stale([g])
    assert gen.groups_restarted_stale == 0

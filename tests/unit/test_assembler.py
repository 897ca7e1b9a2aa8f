from buffer_svc.assembler import GroupAssembler
from relayrl.messages import Sample


def sample(prompt_id, lease="L1"):
    return Sample(prompt_id=prompt_id, lease_id=lease, worker_id="w", prompt_tokens=[1],
                  response_tokens=[2], logprobs=[-1.0], versions=[0], reward=0.0)


def never(_):
    return False


def test_groups_complete_and_pack_into_batches():
    asm = GroupAssembler(group_size=2, groups_per_batch=2)
    assert asm.add(b"1", sample(0), never) == "partial"
    assert asm.add(b"2", sample(1), never) == "partial"
    assert asm.add(b"3", sample(0), never) == "complete"
    assert asm.take_batch() is None
    assert asm.add(b"4", sample(1), never) == "complete"
    ready = asm.take_batch()
    assert [g.prompt_id for g in ready.batch.groups] == [0, 1]
    assert sorted(ready.entry_ids) == [b"1", b"2", b"3", b"4"]
    assert asm.take_batch() is None


def test_first_complete_lease_wins_and_the_rest_are_discarded():
    asm = GroupAssembler(group_size=2, groups_per_batch=1)
    asm.add(b"1", sample(0, "old"), never)
    asm.add(b"2", sample(0, "new"), never)
    assert asm.add(b"3", sample(0, "new"), never) == "complete"
    assert asm.take_discard() == [b"1"]  # the old lease's partial group
    asm.add(b"4", sample(0, "old"), never)
    assert asm.add(b"5", sample(0, "old"), never) == "duplicate"
    assert asm.take_discard() == [b"4", b"5"]
    assert asm.groups_assembled == 1 and asm.groups_duplicate == 1


def test_prompt_batched_before_a_restart_is_a_duplicate():
    asm = GroupAssembler(group_size=1, groups_per_batch=1)
    assert asm.add(b"1", sample(7), lambda pid: pid == 7) == "duplicate"
    assert asm.take_batch() is None

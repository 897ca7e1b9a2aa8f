from buffer_svc.assembler import GroupAssembler
from relayrl.contracts.messages import Group, Sample


def group(prompt_id, lease="L1"):
    return Group(prompt_id, [Sample(prompt_id=prompt_id, lease_id=lease, worker_id="w",
                                    prompt_tokens=[1], response_tokens=[2], logprobs=[-1.0],
                                    versions=[0], reward=0.0) for _ in range(2)])


def never(_):
    return False


def test_groups_pack_into_batches():
    asm = GroupAssembler(groups_per_batch=2)
    assert asm.add(b"1", group(0), never) == "ready"
    assert asm.take_batch() is None
    assert asm.add(b"2", group(1), never) == "ready"
    ready = asm.take_batch()
    assert [g.prompt_id for g in ready.batch.groups] == [0, 1]
    assert ready.entry_ids == [b"1", b"2"]
    assert asm.take_batch() is None


def test_a_second_group_of_a_prompt_is_discarded():
    asm = GroupAssembler(groups_per_batch=2)
    assert asm.add(b"1", group(0, "new"), never) == "ready"
    assert asm.add(b"2", group(0, "old"), never) == "duplicate"  # e.g. a repeated append
    assert asm.take_discard() == [b"2"]
    assert asm.groups_assembled == 1 and asm.groups_duplicate == 1


def test_prompt_batched_before_a_restart_is_a_duplicate():
    asm = GroupAssembler(groups_per_batch=1)
    assert asm.add(b"1", group(7), lambda pid: pid == 7) == "duplicate"
    assert asm.take_batch() is None
    assert asm.take_discard() == [b"1"]


def test_a_stopping_run_takes_a_short_batch():
    asm = GroupAssembler(groups_per_batch=2)
    asm.add(b"1", group(0), never)
    assert asm.take_batch() is None and asm.take_batch(short_ok=True).entry_ids == [b"1"]

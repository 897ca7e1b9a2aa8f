import threading
import time

import pytest
import torch

from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engines.api import Engine, SamplingSpec
from rollout_svc.serving.batcher import RequestBatcher

pytestmark = pytest.mark.unit


class RecordingEngine(Engine):
    """Echoes each context's last token; records every call's batch; the first call blocks
    until released, so requests pile up behind it."""

    name = "recording"

    def __init__(self):
        super().__init__()
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.fail_next = False

    @property
    def version(self) -> int:
        return 3

    def generate(self, contexts, spec):
        if not self.calls:
            self.gate.wait(5)
        self.calls.append(len(contexts))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("engine fell over")
        return [Completion(tokens=[c[-1]], logprobs=[-0.5], finish_reason="length")
                for c in contexts]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        raise NotImplementedError


def run_concurrently(batcher, requests):
    results = [None] * len(requests)

    def call(i, contexts, spec):
        try:
            results[i] = batcher.generate(contexts, spec)
        except RuntimeError as err:
            results[i] = err

    threads = [threading.Thread(target=call, args=(i, *r)) for i, r in enumerate(requests)]
    threads[0].start()
    time.sleep(0.1)  # the first request holds the engine
    for t in threads[1:]:
        t.start()
    time.sleep(0.2)
    return threads, results


def test_waiting_requests_share_one_engine_call_and_get_their_own_outputs():
    engine = RecordingEngine()
    batcher = RequestBatcher(engine, max_batch_seqs=64)
    spec = SamplingSpec(max_new_tokens=4)
    requests = [([[i, 10 + i]] * 2, spec) for i in range(6)]
    threads, results = run_concurrently(batcher, requests)
    engine.gate.set()
    for t in threads:
        t.join(5)
    assert engine.calls == [2, 10]  # the first alone, then the five that waited
    for i, (version, outs) in enumerate(results):
        assert version == 3 and [o.tokens for o in outs] == [[10 + i]] * 2


def test_different_settings_seeds_and_the_budget_split_batches():
    engine = RecordingEngine()
    batcher = RequestBatcher(engine, max_batch_seqs=3)
    a, b = SamplingSpec(max_new_tokens=4), SamplingSpec(max_new_tokens=8)
    seeded = SamplingSpec(max_new_tokens=4, seed=7)
    requests = [([[0]], a), ([[1]], a), ([[2]], b), ([[3]], a), ([[4]], seeded), ([[5]], a),
                ([[6]], a)]
    threads, results = run_concurrently(batcher, requests)
    engine.gate.set()
    for t in threads:
        t.join(5)
    assert sum(engine.calls) == 7 and max(engine.calls) <= 3
    assert len(engine.calls) >= 4  # a-batches capped at 3, b alone, the seeded one alone
    assert [r[1][0].tokens for r in results] == [[i] for i in range(7)]


def test_an_engine_error_reaches_every_waiter_and_the_batcher_goes_on():
    engine = RecordingEngine()
    engine.fail_next = True
    batcher = RequestBatcher(engine)
    spec = SamplingSpec(max_new_tokens=4)
    engine.gate.set()
    with pytest.raises(RuntimeError, match="fell over"):
        batcher.generate([[1]], spec)
    assert batcher.generate([[2]], spec)[1][0].tokens == [2]

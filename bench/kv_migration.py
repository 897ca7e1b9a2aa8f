"""Moving a half-generated sequence between two vLLM engines with its KV cache (NIXL, as
`rollout.kv_transfer_base_port` does on a repack) against what the next engine does
without it: prefill the whole context again. Two engines in two processes on this machine,
the model of a config; per context length, the median of --rounds moves and prefills.

    python bench/kv_migration.py --config examples/smollm2_cpu.yaml --lengths 128,256,480

A move is the source parking the context (a one-token request that keeps its blocks; mostly
a prefix-cache hit, since the source has just generated it) plus the destination's first
token with the blocks pulled; the prefill is the destination's first token computed from
scratch (its prefix cache emptied first). Prints one line per length, the ratio prefill
time / move time (above 1: moving is faster), and a JSON line. The first move between two
engines also pays NIXL's handshake, reported on its own. Last, what the connector costs
generation itself: a batch of 32 x 16 tokens on the destination, against the same batch on
an engine without the connector, started alone afterwards (above 1: slower with it).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from relayrl.config import load_run_config  # noqa: E402
from relayrl.runtime.grpc_util import free_ports  # noqa: E402

ONE_TOKEN = dict(max_new_tokens=1, greedy=True, temperature=1.0)
BATCH, BATCH_TOKENS = 32, 16  # the SmolLM2 example's batch: what generation costs meanwhile
BATCH_CONTEXT = list(range(1000, 1040))


def context_of(i: int, n: int, vocab: int) -> list[int]:
    """Distinct contexts, so no move or prefill finds another's blocks cached."""
    return [(1000 + 7919 * i + 31 * j) % (vocab - 1000) + 1000 for j in range(n)]


def engine(model: str, max_len: int, port: int):
    from rollout_svc.engines.vllm import VllmEngine

    return VllmEngine(model, max_model_len=max_len, kv_cache_gib=1.0, kv_transfer_port=port)


def source(model: str, max_len: int, port: int, jobs: mp.Queue, out: mp.Queue) -> None:
    from rollout_svc.engines.api import SamplingSpec

    eng = engine(model, max_len, port)
    while (job := jobs.get()) is not None:
        eng.generate([job], SamplingSpec(**ONE_TOKEN))  # the context the source just ran
        t = time.perf_counter()
        ticket = eng.export_state(job)
        out.put((ticket.encode(), time.perf_counter() - t))


def batch_s(eng, context: list[int]) -> float:
    """Seconds to sample BATCH sequences of BATCH_TOKENS tokens after `context`."""
    from rollout_svc.engines.api import SamplingSpec

    t = time.perf_counter()
    eng.generate([context] * BATCH, SamplingSpec(max_new_tokens=BATCH_TOKENS, temperature=1.0))
    return time.perf_counter() - t


def plain(model: str, max_len: int, context: list[int], out: mp.Queue) -> None:
    out.put(batch_s(engine(model, max_len, 0), context))


def destination(model: str, max_len: int, port: int, jobs: mp.Queue, out: mp.Queue) -> None:
    from rollout_svc.engines.api import SamplingSpec

    eng = engine(model, max_len, port)
    while (job := jobs.get()) is not None:
        if job == "batch":
            out.put(batch_s(eng, BATCH_CONTEXT))
            continue
        payload, context = job
        eng.llm.reset_prefix_cache()
        if payload is not None:
            eng.import_state(eng.decode_state(payload))
        t = time.perf_counter()
        eng.generate([context], SamplingSpec(**ONE_TOKEN))
        out.put(time.perf_counter() - t)


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("kv_migration", __doc__.splitlines()[0], rounds=3,
                            rounds_help="moves and prefills per context length",
                            rounds_aliases=("--repeats",))
    parser.add_argument("--config", default="examples/smollm2_cpu.yaml")
    parser.add_argument("--lengths", default="128,256,480")
    args = parser.parse_args(argv)
    if args.smoke:
        import torch

        if not torch.cuda.is_available():
            harness.skip(args, "vLLM engines with NIXL need a CUDA GPU")
        args.lengths, args.rounds = "128", 1
    from transformers import AutoConfig

    from relayrl_torch.models.cache import resolve_model_path

    cfg = load_run_config(args.config)
    model = str(resolve_model_path(cfg.model, cfg.task))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    lengths = [int(x) for x in args.lengths.split(",")]
    max_len = max(lengths) + 32
    ctx = mp.get_context("spawn")
    src_jobs, src_out, dst_jobs, dst_out = (ctx.Queue() for _ in range(4))
    ports = free_ports(2)
    procs = [ctx.Process(target=source, args=(model, max_len, ports[0], src_jobs, src_out)),
             ctx.Process(target=destination, args=(model, max_len, ports[1], dst_jobs, dst_out))]
    for p in procs:
        p.start()

    def move(context: list[int]) -> tuple[float, float]:
        """(seconds to park on the source, seconds to the first token on the destination)"""
        src_jobs.put(context)
        payload, park_s = src_out.get(timeout=600)
        dst_jobs.put((payload, context))
        return park_s, dst_out.get(timeout=600)

    def prefill(context: list[int]) -> float:
        dst_jobs.put((None, context))
        return dst_out.get(timeout=600)

    try:
        first_move_s = sum(move(context_of(0, lengths[0], vocab)))  # with NIXL's handshake
        rows, k = [], 1
        for n in lengths:
            parks, pulls, prefills = [], [], []
            for _ in range(args.rounds):
                park_s, pull_s = move(context_of(k, n, vocab))
                parks.append(park_s)
                pulls.append(pull_s)
                prefills.append(prefill(context_of(k + 1, n, vocab)))
                k += 2
            ms = {name: round(1e3 * statistics.median(xs), 1)
                  for name, xs in (("park_ms", parks), ("pull_ms", pulls),
                                   ("prefill_ms", prefills))}
            row = {"tokens": n, **ms, "move_ms": round(ms["park_ms"] + ms["pull_ms"], 1)}
            row["prefill_over_move"] = round(row["prefill_ms"] / row["move_ms"], 2)
            rows.append(row)
            print(f"{n:>6} tokens: move {row['move_ms']:8.1f} ms (park {row['park_ms']:.1f}, "
                  f"pull and first token {row['pull_ms']:.1f}), prefill {row['prefill_ms']:8.1f}"
                  f" ms: prefill / move {row['prefill_over_move']:.2f}", flush=True)
        src_jobs.put(None)  # the destination's batch has the machine to itself
        procs[0].join(60)
        dst_jobs.put("batch")
        with_nixl_s = dst_out.get(timeout=600)
    finally:
        src_jobs.put(None)
        dst_jobs.put(None)
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    out = ctx.Queue()  # the same batch on an engine without the connector, alone
    alone = ctx.Process(target=plain, args=(model, max_len, BATCH_CONTEXT, out))
    alone.start()
    without_s = out.get(timeout=600)
    alone.join(60)
    slowdown = round(with_nixl_s / without_s, 2)
    print(f"first move (NIXL handshake included): {1e3 * first_move_s:.0f} ms")
    print(f"{BATCH} x {BATCH_TOKENS} tokens: {with_nixl_s:.1f} s with the connector, "
          f"{without_s:.1f} s without: {slowdown:.2f}x the time")
    harness.report(args, {"bench": "kv_migration", "model": model, "repeats": args.rounds,
                          "first_move_ms": round(1e3 * first_move_s, 1), "rows": rows,
                          "generation_with_connector_over_without": slowdown})


if __name__ == "__main__":
    main()

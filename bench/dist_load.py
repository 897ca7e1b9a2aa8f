"""Peak memory of each trainer rank under torchrun as it builds its model: every rank
reading only its own shard of the weights, as the service does, against every rank loading
the whole model first and sharding it after (the peer, measured in the same run).

    python bench/dist_load.py [--model DIR] [--bf16-copy] [--ranks 2] [--no-fsdp] [--kl]

Runs `torchrun --nproc-per-node RANKS` twice on the CPU (gloo), once each way. Each rank
builds the trainer's modules as the service's Learner does (the policy, and with --kl the
frozen reference of trainer.loss.kl_coef). Its baseline is its resident memory once what
loading imports is imported and the tokenizer read (a model built on the meta device first,
which holds no weights). Reported per rank and way, as growth over that baseline: the peak
RSS (ru_maxrss), which counts the pages of the safetensors it maps as it reads them (page
cache, shared between the ranks and given back under pressure); the peak of its anonymous
memory, its own (sampled every 5 ms); and the anonymous memory it holds once built. Then
each rank's peaks reading its shard as ratios to its peaks loading the whole model. The
default model is the converted SmolLM2-135M (relayrl_torch.models.smollm2, float32 on disk);
--bf16-copy measures a bfloat16 copy of it, as most published checkpoints are, which a whole
load must convert to float32 in memory; --smoke builds a small random Llama in a temporary
directory. Ends with one JSON line (bench/results/dist_load.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from relayrl.runtime.grpc_util import free_ports  # noqa: E402

MIB = 2**20
WAYS = ("shard", "whole")


def resident() -> tuple[int, int]:
    """This process's resident memory now: (anonymous, file-backed) bytes. File-backed pages
    are those of files it maps (the safetensors it reads), shared with every other process
    that maps them and given back under pressure; anonymous ones are its own."""
    fields = {row.split(":")[0]: int(row.split()[1]) * 1024
              for row in Path("/proc/self/status").read_text().splitlines()
              if row.startswith(("RssAnon", "RssFile"))}
    return fields["RssAnon"], fields["RssFile"]


class Peaks:
    """The peaks of resident() and of its sum, sampled every SAMPLE_S on a thread."""

    SAMPLE_S = 0.005

    def __init__(self) -> None:
        self.anon = self.total = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            anon, file = resident()
            self.anon, self.total = max(self.anon, anon), max(self.total, anon + file)
            time.sleep(self.SAMPLE_S)


def rank_side(way: str, model_dir: str, fsdp: bool, kl: bool, out: str) -> None:
    """One rank of one way: its figures, gathered onto rank 0, written to `out` as JSON."""
    import torch
    import torch.distributed as dist

    from relayrl.config import RunConfig
    from relayrl_torch.models.loading import load_model
    from trainer_svc.distributed import Parallel, init_world, leave_world
    from trainer_svc.learner import Learner

    torch.set_num_threads(1)
    world = init_world("cpu")
    # what loading imports, and the tokenizer, before the baseline: a model on the meta
    # device holds no weights
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401

    load_model(model_dir, meta=True)
    anon, file = resident()
    peaks = Peaks()
    loss = {"name": "grpo", "kl_coef": 0.05 if kl else 0.0}
    cfg = RunConfig.model_validate({"trainer": {"loss": loss, "fsdp": fsdp}})
    lm = load_model(model_dir, meta=way == "shard")
    learner = Learner(cfg.trainer_part(), lm, Parallel(world, fsdp))
    time.sleep(10 * Peaks.SAMPLE_S)  # the sampler's last look
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    held, _ = resident()
    if world.is_main:
        learner.stop_followers()
    else:
        learner.follow()
    figures = [None] * world.size
    dist.all_gather_object(figures, {
        "rank": world.rank, "imports_rss_mib": round((anon + file) / MIB, 1),
        "peak_rss_mib": round(maxrss / MIB, 1),
        "peak_rss_growth_mib": round((maxrss - anon - file) / MIB, 1),
        "peak_anon_growth_mib": round((peaks.anon - anon) / MIB, 1),
        "held_anon_growth_mib": round((held - anon) / MIB, 1)})
    if world.is_main:
        Path(out).write_text(json.dumps(figures))
    leave_world(world)


def run_way(way: str, model_dir: Path, ranks: int, fsdp: bool, kl: bool, tmp: Path) -> list:
    out = tmp / f"{way}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(free_ports(1)[0]), str(Path(__file__).resolve()),
           "--rank-side", way, str(model_dir), str(int(fsdp)), str(int(kl)), str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=1800)
    return json.loads(out.read_text())


def small_model(out: Path) -> Path:
    """A random Llama of the tests' size with the addition tokenizer, saved in `out`."""
    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer

    build_tokenizer(AdditionTask.alphabet, out)
    cfg = TinyModel(hidden_size=32, num_layers=2, num_heads=2)
    build_model(cfg, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    return out


def bf16_copy(model_dir: Path, out: Path) -> Path:
    """`model_dir` again in `out`, its safetensors in bfloat16."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir()
    for f in Path(model_dir).iterdir():
        if f.suffix == ".safetensors":
            save_file({k: v.to(torch.bfloat16) for k, v in load_file(f).items()},
                      out / f.name, metadata={"format": "pt"})
        elif f.is_file() and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-side"]:
        way, model_dir, fsdp, kl, out = argv[1:]
        rank_side(way, model_dir, fsdp == "1", kl == "1", out)
        return
    parser = harness.parser("dist_load", __doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="a Hugging Face model directory (default: the converted SmolLM2)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--fsdp", action=argparse.BooleanOptionalAction,
                        default=True, help="shard with FSDP2 (--no-fsdp: replicated)")
    parser.add_argument("--kl", action="store_true",
                        help="also build the frozen KL reference (trainer.loss.kl_coef > 0)")
    parser.add_argument("--bf16-copy", action="store_true",
                        help="measure on a copy of the model saved in bfloat16, as most "
                        "published checkpoints are (the trainer holds float32)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="relayrl-dist-load-") as tmp:
        tmp = Path(tmp)
        if args.smoke:
            model_dir = small_model(tmp)
        elif args.model is not None:
            model_dir = args.model
        else:
            from relayrl_torch.models.smollm2 import ensure_smollm2

            model_dir = ensure_smollm2(ROOT / ".cache" / "relayrl" / "models")
        if args.bf16_copy:
            model_dir = bf16_copy(model_dir, tmp / "bf16")
        ways = {way: run_way(way, model_dir, args.ranks, args.fsdp, args.kl, tmp)
                for way in WAYS}
    for way, ranks in ways.items():
        for r in ranks:
            print(f"{way:6s} rank {r['rank']}: after imports {r['imports_rss_mib']:7.1f} MiB; "
                  f"peak RSS +{r['peak_rss_growth_mib']:.1f}, peak anonymous "
                  f"+{r['peak_anon_growth_mib']:.1f}, held anonymous "
                  f"+{r['held_anon_growth_mib']:.1f} MiB")
    ratios = {key: [round(s[key] / max(w[key], 1e-9), 3)
                    for s, w in zip(ways["shard"], ways["whole"], strict=True)]
              for key in ("peak_rss_growth_mib", "peak_anon_growth_mib")}
    harness.report(args, {
        "model": "small random Llama" if args.smoke else str(model_dir),
        "bf16_copy": args.bf16_copy, "ranks": args.ranks, "fsdp": args.fsdp, "kl": args.kl,
        "smoke": args.smoke, **{f"{way}_per_rank": ranks for way, ranks in ways.items()},
        "peak_rss_growth_ratio_shard_to_whole": ratios["peak_rss_growth_mib"],
        "peak_anon_growth_ratio_shard_to_whole": ratios["peak_anon_growth_mib"]})


if __name__ == "__main__":
    main()
